// Processes that share device memory the ways real jobs do, for tests/gpu/ipc-probe.sh (issue 29): what the driver's
// checkpoint API does to them, and whether anything outside the process shows the sharing before a checkpoint.
//
//   ipc_probe plain MIB                       a CUDA process with MIB of its own device memory
//   ipc_probe managed MIB                     the same memory as managed (UVM) memory (cuMemAllocManaged)
//   ipc_probe export-legacy SOCK MIB          exports its memory with cuIpcGetMemHandle (torch.multiprocessing,
//                                             vLLM/SGLang custom all-reduce) to the one importer that connects to SOCK
//   ipc_probe export-cumem SOCK MIB           exports a cuMemCreate allocation as a POSIX fd
//                                             (cuMemExportToShareableHandle; NCCL's P2P transport), sent by SCM_RIGHTS
//   ipc_probe import-legacy SOCK DELAY_S      a CUDA process that opens the exporter's memory after DELAY_S seconds
//   ipc_probe import-cumem SOCK DELAY_S       the same through the POSIX fd (cuMemImportFromShareableHandle + map)
//
// Every process prints `ready` once its own memory is set, `opened` once it maps the peer's, and then one line
// every 250 ms: `ok own=V peer=V` while its reads see the values written, or the failing call's error name. Driver
// errors never end the loop: what a process does after a failed restore is what the probe looks at.
// Build (GPU machine): gcc -O1 -o ipc_probe ipc_probe.c -I/usr/local/cuda/include -L/usr/local/cuda/lib64/stubs -lcuda
#define _GNU_SOURCE
#include <cuda.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#define OWN_VALUE 0x5eed0001u
#define PEER_VALUE 0x5eed0002u

static const char *role = "?";

static int check(CUresult rc, const char *call) {
    if (rc == CUDA_SUCCESS) return 0;
    const char *name = NULL;
    cuGetErrorName(rc, &name);
    printf("%s: %s failed: %s (%d)\n", role, call, name ? name : "?", (int)rc);
    fflush(stdout);
    return -1;
}

#define CK(call) check((call), #call)
#define MUST(call) \
    do { \
        if (CK(call)) exit(1); \
    } while (0)

static void say(const char *what) {
    printf("%s: %s\n", role, what);
    fflush(stdout);
}

static void context(void) {
    CUdevice dev;
    CUcontext ctx;
    MUST(cuInit(0));
    MUST(cuDeviceGet(&dev, 0));
    MUST(cuDevicePrimaryCtxRetain(&ctx, dev));
    MUST(cuCtxSetCurrent(ctx));
}

static int listen_on(const char *path) {
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    snprintf(addr.sun_path, sizeof addr.sun_path, "%s", path);
    unlink(path);
    int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (s < 0 || bind(s, (struct sockaddr *)&addr, sizeof addr) || listen(s, 1)) {
        perror("listen");
        exit(1);
    }
    return s;
}

static int connect_to(const char *path) {
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    snprintf(addr.sun_path, sizeof addr.sun_path, "%s", path);
    for (int i = 0; i < 200; i++) {
        int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (s >= 0 && connect(s, (struct sockaddr *)&addr, sizeof addr) == 0) return s;
        if (s >= 0) close(s);
        usleep(50000);
    }
    perror("connect");
    exit(1);
}

static void send_all(int s, const void *buf, size_t len, int fd) {
    struct iovec iov = {.iov_base = (void *)buf, .iov_len = len};
    char ctl[CMSG_SPACE(sizeof(int))];
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1};
    if (fd >= 0) {
        memset(ctl, 0, sizeof ctl);
        msg.msg_control = ctl;
        msg.msg_controllen = sizeof ctl;
        struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(sizeof(int));
        memcpy(CMSG_DATA(c), &fd, sizeof fd);
    }
    if (sendmsg(s, &msg, 0) != (ssize_t)len) {
        perror("sendmsg");
        exit(1);
    }
}

static int recv_all(int s, void *buf, size_t len) {
    struct iovec iov = {.iov_base = buf, .iov_len = len};
    char ctl[CMSG_SPACE(sizeof(int))];
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl, .msg_controllen = sizeof ctl};
    if (recvmsg(s, &msg, MSG_WAITALL) != (ssize_t)len) {
        perror("recvmsg");
        exit(1);
    }
    struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
    int fd = -1;
    if (c && c->cmsg_type == SCM_RIGHTS) memcpy(&fd, CMSG_DATA(c), sizeof fd);
    return fd;
}

static CUdeviceptr own_memory(size_t bytes) {
    CUdeviceptr p;
    MUST(cuMemAlloc(&p, bytes));
    MUST(cuMemsetD32(p, OWN_VALUE, bytes / 4));
    MUST(cuCtxSynchronize());
    return p;
}

// A cuMemCreate allocation that can be exported as a POSIX fd, mapped read-write at a fresh address.
static CUdeviceptr cumem_allocation(size_t *bytes, CUmemGenericAllocationHandle *handle) {
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 0;
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    size_t gran = 0;
    MUST(cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    *bytes = (*bytes + gran - 1) / gran * gran;
    MUST(cuMemCreate(handle, *bytes, &prop, 0));
    return 0;
}

static CUdeviceptr map_handle(CUmemGenericAllocationHandle handle, size_t bytes) {
    CUdeviceptr p;
    CUmemAccessDesc access;
    memset(&access, 0, sizeof access);
    access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    access.location.id = 0;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    MUST(cuMemAddressReserve(&p, bytes, 0, 0, 0));
    MUST(cuMemMap(p, bytes, 0, handle, 0));
    MUST(cuMemSetAccess(p, bytes, &access, 1));
    return p;
}

// One line every 250 ms for ever: what this process reads from its own and its peer's memory now.
static void report_forever(CUdeviceptr own, size_t own_bytes, CUdeviceptr peer, size_t peer_bytes, void *host) {
    for (unsigned long round = 0;; round++) {
        uint32_t a = 0, b = 0, c = 0;
        char line[256];
        int bad = 0;
        if (host) {
            if (CK(cuCtxSynchronize())) bad = 1;
            a = ((volatile uint32_t *)host)[0];
            b = ((volatile uint32_t *)host)[own_bytes / 4 - 1];
        } else if (own) {
            if (CK(cuMemcpyDtoH(&a, own, 4)) || CK(cuMemcpyDtoH(&b, own + own_bytes - 4, 4))) bad = 1;
        }
        if (peer && CK(cuMemcpyDtoH(&c, peer + peer_bytes - 4, 4))) bad = 1;
        if (!bad) {
            snprintf(line, sizeof line, "%s ok round=%lu own=%08x,%08x peer=%08x", role, round, a, b, c);
            puts(line);
            fflush(stdout);
        }
        usleep(250000);
    }
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc < 3) {
        fprintf(stderr, "usage: see the comment at the top of ipc_probe.c\n");
        return 2;
    }
    const char *mode = argv[1];
    role = mode;
    if (!strcmp(mode, "plain") || !strcmp(mode, "managed")) {
        size_t bytes = (size_t)atoi(argv[2]) << 20;
        context();
        if (!strcmp(mode, "plain")) {
            CUdeviceptr own = own_memory(bytes);
            say("ready");
            report_forever(own, bytes, 0, 0, NULL);
        }
        CUdeviceptr m;
        MUST(cuMemAllocManaged(&m, bytes, CU_MEM_ATTACH_GLOBAL));
        MUST(cuMemsetD32(m, OWN_VALUE, bytes / 4));
        MUST(cuCtxSynchronize());
        say("ready");
        report_forever(m, bytes, 0, 0, (void *)(uintptr_t)m);
    }
    if (argc < 4) return 2;
    const char *sock = argv[2];
    if (!strcmp(mode, "export-legacy")) {
        size_t bytes = (size_t)atoi(argv[3]) << 20;
        context();
        int ls = listen_on(sock);
        CUdeviceptr own;
        MUST(cuMemAlloc(&own, bytes));
        MUST(cuMemsetD32(own, PEER_VALUE, bytes / 4));
        MUST(cuCtxSynchronize());
        CUipcMemHandle h;
        MUST(cuIpcGetMemHandle(&h, own));
        printf("%s: handle ", role);
        for (size_t i = 0; i < sizeof h.reserved; i++) printf("%02x", (unsigned char)h.reserved[i]);
        printf(" pid %d (%08x)\n", (int)getpid(), (unsigned)getpid());
        say("ready");
        int s = accept(ls, NULL, NULL);
        uint64_t len = bytes;
        send_all(s, &len, sizeof len, -1);
        send_all(s, &h, sizeof h, -1);
        // No socket stays open: a CRIU dump of the pair then holds only the shared device memory.
        close(s);
        close(ls);
        unlink(sock);
        say("exported");
        report_forever(own, bytes, 0, 0, NULL);
    }
    if (!strcmp(mode, "export-cumem")) {
        size_t bytes = (size_t)atoi(argv[3]) << 20;
        context();
        int ls = listen_on(sock);
        CUmemGenericAllocationHandle handle;
        cumem_allocation(&bytes, &handle);
        CUdeviceptr own = map_handle(handle, bytes);
        MUST(cuMemsetD32(own, PEER_VALUE, bytes / 4));
        MUST(cuCtxSynchronize());
        int fd = -1;
        MUST(cuMemExportToShareableHandle(&fd, handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
        printf("%s: exported fd %d\n", role, fd);
        say("ready");
        int s = accept(ls, NULL, NULL);
        uint64_t len = bytes;
        send_all(s, &len, sizeof len, fd);
        close(fd);
        close(s);
        close(ls);
        unlink(sock);
        say("exported");
        report_forever(own, bytes, 0, 0, NULL);
    }
    if (!strcmp(mode, "import-legacy") || !strcmp(mode, "import-cumem")) {
        int delay = atoi(argv[3]);
        context();
        size_t own_bytes = 1 << 20;
        CUdeviceptr own = own_memory(own_bytes);
        say("ready");
        sleep((unsigned)delay);
        int s = connect_to(sock);
        uint64_t len = 0;
        int fd = recv_all(s, &len, sizeof len);
        CUdeviceptr peer = 0;
        if (!strcmp(mode, "import-legacy")) {
            CUipcMemHandle h;
            recv_all(s, &h, sizeof h);
            MUST(cuIpcOpenMemHandle(&peer, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS));
        } else {
            CUmemGenericAllocationHandle handle;
            if (fd < 0) {
                say("no fd received");
                return 1;
            }
            MUST(cuMemImportFromShareableHandle(&handle, (void *)(uintptr_t)fd,
                                                CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
            close(fd);
            peer = map_handle(handle, len);
        }
        close(s);
        say("opened");
        report_forever(own, own_bytes, peer, len, NULL);
    }
    fprintf(stderr, "unknown mode %s\n", mode);
    return 2;
}
