/* A small libcudart program for the framework-cache rewrite on the GPU (tests/gpu/props-faults.sh).
 *
 * It keeps a cudaDeviceProp of device 0 on its heap from its start, as PyTorch and other
 * frameworks do, and holds MIB MiB of device memory filled with a known byte. Each round it reports
 * every view of the GPU's identity: its own heap copy, a fresh cudaGetDeviceProperties (the
 * runtime's own cache), cudaDeviceGetPCIBusId, libcuda's cuDeviceGetUuid and NVML by that bus id.
 *
 * Protocol in DIR (no fd into DIR stays open, so CRIU can dump it between rounds):
 *   DIR/ready (its pid), then per round k: waits for DIR/go<k>, writes DIR/report<k>.json, DIR/done<k>.
 * Build there: gcc -I/usr/local/cuda/include props_probe.c -o props_probe -ldl LIBCUDART -Wl,-rpath,DIR
 * Usage: props_probe DIR ROUNDS MIB
 */
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define FILL 0x5a

static struct cudaDeviceProp *framework_copy; /* a framework's cache: never refreshed */

static void uuid_text(const unsigned char *b, char *out)
{
    sprintf(out, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0], b[1], b[2], b[3],
            b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
}

static int exists(const char *dir, const char *name)
{
    char p[4096];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    return access(p, F_OK) == 0;
}

static void write_file(const char *dir, const char *name, const char *text)
{
    char p[4096], tmp[4200];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    snprintf(tmp, sizeof tmp, "%s.tmp", p);
    FILE *f = fopen(tmp, "w");
    if (!f) return;
    fputs(text, f);
    fclose(f);
    rename(tmp, p);
}

/* NVML's GPU at BUS, by its UUID (NVML is opened and shut down here: no fd stays open). */
static void nvml_uuid_at(const char *bus, char *out, size_t len)
{
    snprintf(out, len, "error: no NVML");
    void *nv = dlopen("libnvidia-ml.so.1", RTLD_NOW);
    if (!nv) return;
    int (*init)(void) = (int (*)(void))dlsym(nv, "nvmlInit_v2");
    int (*shutdown)(void) = (int (*)(void))dlsym(nv, "nvmlShutdown");
    int (*by_bus)(const char *, void **) = (int (*)(const char *, void **))dlsym(nv, "nvmlDeviceGetHandleByPciBusId_v2");
    int (*get_uuid)(void *, char *, unsigned) = (int (*)(void *, char *, unsigned))dlsym(nv, "nvmlDeviceGetUUID");
    if (!init || !shutdown || !by_bus || !get_uuid || init() != 0) return;
    void *h = NULL;
    int r = by_bus(bus, &h);
    if (r != 0)
        snprintf(out, len, "error: nvmlDeviceGetHandleByPciBusId_v2 %d%s", r, r == 6 ? " (Not Found)" : "");
    else if (get_uuid(h, out, (unsigned)len) != 0)
        snprintf(out, len, "error: nvmlDeviceGetUUID");
    shutdown();
}

static void driver_uuid(char *out)
{
    strcpy(out, "error");
    void *cu = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (!cu) return;
    int (*get)(int *, int) = (int (*)(int *, int))dlsym(cu, "cuDeviceGet");
    int (*uuid)(unsigned char *, int) = (int (*)(unsigned char *, int))dlsym(cu, "cuDeviceGetUuid_v2");
    int dev;
    unsigned char b[16];
    if (get && uuid && get(&dev, 0) == 0 && uuid(b, dev) == 0) uuid_text(b, out);
}

int main(int argc, char **argv)
{
    if (argc != 4) {
        fprintf(stderr, "usage: props_probe DIR ROUNDS MIB\n");
        return 2;
    }
    const char *dir = argv[1];
    int rounds = atoi(argv[2]);
    size_t bytes = (size_t)atoi(argv[3]) << 20;
    framework_copy = malloc(sizeof *framework_copy);
    if (cudaGetDeviceProperties(framework_copy, 0) != cudaSuccess) return 1;
    unsigned char *data = NULL;
    if (cudaMalloc((void **)&data, bytes) != cudaSuccess || cudaMemset(data, FILL, bytes) != cudaSuccess ||
        cudaDeviceSynchronize() != cudaSuccess)
        return 1;
    char text[8192];
    snprintf(text, sizeof text, "%d\n", getpid());
    write_file(dir, "ready", text);
    for (int k = 1; k <= rounds; k++) {
        char name[64];
        snprintf(name, sizeof name, "go%d", k);
        while (!exists(dir, name)) usleep(20000);
        struct cudaDeviceProp fresh;
        int fresh_rc = cudaGetDeviceProperties(&fresh, 0);
        char bus[64] = "";
        cudaDeviceGetPCIBusId(bus, sizeof bus, 0);
        char app_uuid[64], cudart_uuid[64], drv_uuid[64], nvml_uuid[128];
        uuid_text((const unsigned char *)framework_copy->uuid.bytes, app_uuid);
        uuid_text((const unsigned char *)fresh.uuid.bytes, cudart_uuid);
        driver_uuid(drv_uuid);
        nvml_uuid_at(bus, nvml_uuid, sizeof nvml_uuid);
        /* The device data, 1 MiB at a time, and new work on the GPU. */
        int data_ok = 1, work_ok = 0;
        static unsigned char chunk[1 << 20];
        for (size_t at = 0; at < bytes && data_ok; at += sizeof chunk) {
            size_t n = bytes - at < sizeof chunk ? bytes - at : sizeof chunk;
            if (cudaMemcpy(chunk, data + at, n, cudaMemcpyDeviceToHost) != cudaSuccess) { data_ok = 0; break; }
            for (size_t i = 0; i < n; i++)
                if (chunk[i] != FILL) { data_ok = 0; break; }
        }
        void *scratch = NULL;
        unsigned char back[256];
        if (cudaMalloc(&scratch, sizeof back) == cudaSuccess && cudaMemset(scratch, 0x33, sizeof back) == cudaSuccess &&
            cudaMemcpy(back, scratch, sizeof back, cudaMemcpyDeviceToHost) == cudaSuccess)
            work_ok = back[0] == 0x33 && back[255] == 0x33;
        if (scratch) cudaFree(scratch);
        snprintf(text, sizeof text,
                 "{\"pid\": %d, \"round\": %d, \"name\": \"%s\",\n"
                 " \"app_uuid\": \"%s\", \"app_pci\": \"%04x:%02x:%02x.0\",\n"
                 " \"cudart_rc\": %d, \"cudart_uuid\": \"%s\", \"cudart_pci\": \"%04x:%02x:%02x.0\",\n"
                 " \"cuda_bus_id\": \"%s\", \"driver_uuid\": \"%s\", \"nvml_uuid_at_bus\": \"%s\",\n"
                 " \"data_ok\": %s, \"work_ok\": %s, \"mib\": %zu}\n",
                 getpid(), k, framework_copy->name, app_uuid, framework_copy->pciDomainID, framework_copy->pciBusID,
                 framework_copy->pciDeviceID, fresh_rc, cudart_uuid, fresh.pciDomainID, fresh.pciBusID,
                 fresh.pciDeviceID, bus, drv_uuid, nvml_uuid, data_ok ? "true" : "false", work_ok ? "true" : "false",
                 bytes >> 20);
        snprintf(name, sizeof name, "report%d.json", k);
        write_file(dir, name, text);
        snprintf(name, sizeof name, "done%d", k);
        write_file(dir, name, "");
    }
    return 0;
}
