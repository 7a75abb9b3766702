// rm_fbinfo: a GPU's free memory as the kernel driver's resource manager reports it
// (NV2080_CTRL_CMD_FB_GET_INFO_V2: HEAP_FREE, HEAP_SIZE, TOTAL_RAM_SIZE, in KiB) beside NVML's
// (nvmlDeviceGetMemoryInfo and _v2), with what each costs from nothing (open or init) to the answer, for
// issue 34 part 5 (tests/gpu/ipc-refuse.sh runs it idle and with other processes holding memory).
//
// NV2080_CTRL_FB_GET_INFO_V2_PARAMS embeds a list whose length (NV2080_CTRL_FB_INFO_MAX_LIST_SIZE) differs between
// driver branches in the public headers (0x36, 0x39, 0x80); the RM refuses a parameter size that is not its own, so
// the probe tries each and says which this driver takes. The handshake is the one of ccm_driver::rm (and
// shared/reference/rm_pidinfo.c); layouts from the open kernel modules' public headers, written for this probe.
//
//   rm_fbinfo [LABEL]      prints one `fbinfo` line per GPU: LABEL, RM's and NVML's figures (MiB) and times (ms)
// Build: gcc -O1 -Wall -o rm_fbinfo rm_fbinfo.c -ldl        (no CUDA headers: ioctls, and NVML by dlopen)
#include <dlfcn.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <time.h>
#include <unistd.h>

#define IOWR(nr, sz) ((unsigned long)((3UL << 30) | ((unsigned long)(sz) << 16) | ((unsigned long)'F' << 8) | (nr)))
enum { ESC_RM_FREE = 0x29, ESC_RM_CONTROL = 0x2A, ESC_RM_ALLOC = 0x2B, ESC_CARD_INFO = 200, ESC_CHECK_VERSION_STR = 210 };
enum { FB_HEAP_SIZE = 0x09, FB_TOTAL_RAM = 0x08, FB_HEAP_FREE = 0x16 };
#define CTRL_FB_GET_INFO_V2 0x20801303u

struct api_version { uint32_t cmd, reply; char version[64]; };
struct nvos00 { uint32_t root, parent, obj, status; };
struct nvos21 { uint32_t root, parent, obj, cls; uint64_t params; uint32_t size, status; };
struct nvos54 { uint32_t client, obj, cmd, flags; uint64_t params; uint32_t size, status; };
struct alloc0000 { uint32_t client, pid; char name[100]; uint64_t os_pid_info; };
struct alloc0080 { uint32_t device_id, share, target_client, target_device, flags; uint64_t va_size, va_start, va_limit; uint32_t va_mode; };
struct card_info { uint8_t valid; uint32_t domain; uint8_t bus, slot, function; uint16_t vendor, device; uint32_t gpu_id; uint16_t irq;
                   uint64_t reg_addr, reg_size, fb_addr, fb_size; uint32_t minor; char name[10]; };
struct fb_info { uint32_t index, data; };
struct fb_get_info_v2 { uint32_t count; struct fb_info list[0x80]; };
_Static_assert(sizeof(struct card_info) == 72 && sizeof(struct nvos21) == 32 && sizeof(struct alloc0080) == 56, "layouts");

typedef struct { unsigned long long total, free, used; } nvml_memory_t;
typedef struct { unsigned int version; unsigned long long total, reserved, free, used; } nvml_memory_v2_t;

static int ctl = -1;
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec / 1e9; }

static int rm_alloc(uint32_t root, uint32_t parent, uint32_t obj, uint32_t cls, void *p, uint32_t size, uint32_t *out) {
    struct nvos21 a = {root, parent, obj, cls, (uint64_t)(uintptr_t)p, size, 0};
    if (ioctl(ctl, IOWR(ESC_RM_ALLOC, sizeof a), &a) < 0 || a.status) return -1;
    *out = a.obj;
    return 0;
}

int main(int argc, char **argv) {
    const char *label = argc > 1 ? argv[1] : "now";
    double t0 = now();
    char buf[512] = {0}, ver[64] = {0};
    FILE *f = fopen("/proc/driver/nvidia/version", "r");
    if (!f || !fgets(buf, sizeof buf, f)) { perror("/proc/driver/nvidia/version"); return 2; }
    fclose(f);
    for (char *t = strtok(buf, " \t\n"); t; t = strtok(NULL, " \t\n"))
        if (t[0] >= '0' && t[0] <= '9' && strchr(t, '.')) { snprintf(ver, sizeof ver, "%s", t); break; }
    ctl = open("/dev/nvidiactl", O_RDWR | O_CLOEXEC);
    if (ctl < 0) { perror("/dev/nvidiactl"); return 2; }
    struct api_version v = {0};
    memcpy(v.version, ver, strlen(ver));
    if (ioctl(ctl, IOWR(ESC_CHECK_VERSION_STR, sizeof v), &v) < 0) { fprintf(stderr, "version check failed\n"); return 2; }
    static struct card_info cards[32];
    if (ioctl(ctl, IOWR(ESC_CARD_INFO, sizeof cards), cards) < 0) { perror("CARD_INFO"); return 2; }
    struct alloc0000 ra = {0};
    ra.pid = (uint32_t)getpid();
    strcpy(ra.name, "rm_fbinfo");
    uint32_t client;
    if (rm_alloc(0, 0, 0, 0x0, &ra, sizeof ra, &client)) { fprintf(stderr, "client alloc failed\n"); return 2; }
    struct { int devno, card; unsigned took; uint32_t status, free_kib, heap_kib, total_kib; double rm_ms, gpu_ms; } got[32];
    int ngot = 0, devno = 0;
    for (int i = 0; i < 32; i++) {
        if (!cards[i].valid) continue;
        double g0 = now();
        char path[32];
        snprintf(path, sizeof path, "/dev/nvidia%u", cards[i].minor);
        int gfd = open(path, O_RDWR | O_CLOEXEC);
        if (gfd < 0) { perror(path); continue; }
        uint32_t dev, sub, sub_id = 0;
        struct alloc0080 da = {0};
        da.device_id = (uint32_t)devno;
        if (rm_alloc(client, client, 0xf0b00100u + devno, 0x80, &da, sizeof da, &dev) ||
            rm_alloc(client, dev, 0xf0b00200u + devno, 0x2080, &sub_id, sizeof sub_id, &sub)) { devno++; close(gfd); continue; }
        // The list size this driver takes.
        static const unsigned sizes[] = {0x36, 0x39, 0x3a, 0x40, 0x80};
        static struct fb_get_info_v2 q;
        unsigned took = 0;
        uint32_t status = 0;
        for (unsigned s = 0; s < sizeof sizes / sizeof *sizes && !took; s++) {
            memset(&q, 0, sizeof q);
            q.count = 3;
            q.list[0].index = FB_HEAP_FREE;
            q.list[1].index = FB_HEAP_SIZE;
            q.list[2].index = FB_TOTAL_RAM;
            struct nvos54 c = {client, sub, CTRL_FB_GET_INFO_V2, 0, (uint64_t)(uintptr_t)&q, 4 + 8 * sizes[s], 0};
            if (ioctl(ctl, IOWR(ESC_RM_CONTROL, sizeof c), &c) == 0 && c.status == 0) took = sizes[s];
            else status = c.status;
        }
        got[ngot].devno = devno; got[ngot].card = i; got[ngot].took = took; got[ngot].status = status;
        got[ngot].free_kib = q.list[0].data; got[ngot].heap_kib = q.list[1].data; got[ngot].total_kib = q.list[2].data;
        got[ngot].rm_ms = (now() - t0) * 1e3; got[ngot].gpu_ms = (now() - g0) * 1e3;
        ngot++;
        close(gfd);
        devno++;
    }
    // NVML, as the plugin's agent starts it (dlopen + init), timed from nothing, after the RM's answer.
    double n0 = now();
    void *nv = dlopen("libnvidia-ml.so.1", RTLD_NOW);
    int (*init)(void) = nv ? (int (*)(void))dlsym(nv, "nvmlInit_v2") : NULL;
    int (*by_index)(unsigned, void **) = nv ? (int (*)(unsigned, void **))dlsym(nv, "nvmlDeviceGetHandleByIndex_v2") : NULL;
    int (*mem)(void *, nvml_memory_t *) = nv ? (int (*)(void *, nvml_memory_t *))dlsym(nv, "nvmlDeviceGetMemoryInfo") : NULL;
    int (*mem2)(void *, nvml_memory_v2_t *) = nv ? (int (*)(void *, nvml_memory_v2_t *))dlsym(nv, "nvmlDeviceGetMemoryInfo_v2") : NULL;
    int nvml_ok = init && init() == 0;
    double nvml_init_ms = (now() - n0) * 1e3;
    for (int k = 0; k < ngot; k++) {
        struct card_info *c = &cards[got[k].card];
        nvml_memory_t m = {0};
        nvml_memory_v2_t m2 = {0};
        m2.version = (unsigned)(sizeof m2 | (2u << 24));
        void *h = NULL;
        double q0 = now();
        int m_ok = nvml_ok && by_index && mem && by_index((unsigned)got[k].devno, &h) == 0 && mem(h, &m) == 0;
        double nvml_query_ms = (now() - q0) * 1e3;
        int m2_ok = m_ok && mem2 && mem2(h, &m2) == 0;
        if (!got[k].took)
            printf("fbinfo %s gpu=%d FB_GET_INFO_V2 refused at every list size (last status %#x)\n", label, got[k].devno, got[k].status);
        printf("fbinfo %s gpu=%d %04x:%02x:%02x.%x list=%#x rm_heap_free_mib=%.1f rm_heap_size_mib=%.1f rm_total_ram_mib=%.1f "
               "nvml_free_mib=%.1f nvml_total_mib=%.1f nvml_used_mib=%.1f nvml2_free_mib=%.1f nvml2_reserved_mib=%.1f "
               "diff_free_mib=%.1f rm_ms_from_open=%.2f rm_gpu_ms=%.2f nvml_init_ms=%.2f nvml_query_ms=%.2f\n",
               label, got[k].devno, c->domain, c->bus, c->slot, c->function, got[k].took,
               got[k].free_kib / 1024.0, got[k].heap_kib / 1024.0, got[k].total_kib / 1024.0,
               m_ok ? m.free / 1048576.0 : -1, m_ok ? m.total / 1048576.0 : -1, m_ok ? m.used / 1048576.0 : -1,
               m2_ok ? m2.free / 1048576.0 : -1, m2_ok ? m2.reserved / 1048576.0 : -1,
               m_ok ? got[k].free_kib / 1024.0 - m.free / 1048576.0 : 0, got[k].rm_ms, got[k].gpu_ms, nvml_init_ms, nvml_query_ms);
    }
    struct nvos00 fr = {client, 0, client, 0};
    ioctl(ctl, IOWR(ESC_RM_FREE, sizeof fr), &fr);
    return 0;
}
