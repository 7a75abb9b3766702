/* Drives the plugin exactly as CRIU does (dlopen, CR_PLUGIN_DESC, init/hooks/exit), many times over, so
 * valgrind can check the FFI layer: no invalid access, no definite leak on repeated init/exit. No CRIU and no
 * NVIDIA driver here: the plugin must disable itself, answer -ENOTSUP, and never crash. */
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

struct desc {
    const char *name;
    int (*init)(int stage);
    void (*exit)(int stage, int ret);
    unsigned int version;
    unsigned int max_hooks;
    void *hooks[];
};

enum { STAGE_DUMP = 0, STAGE_PRE_DUMP = 1, STAGE_RESTORE = 2 };
enum { HOOK_RESUME_DEVICES_LATE = 9, HOOK_PAUSE_DEVICES = 10, HOOK_CHECKPOINT_DEVICES = 11 };

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: init_exit PLUGIN.so ROUNDS\n");
        return 2;
    }
    void *h = dlopen(argv[1], RTLD_LAZY);
    if (!h) {
        fprintf(stderr, "dlopen: %s\n", dlerror());
        return 2;
    }
    struct desc *d = dlsym(h, "CR_PLUGIN_DESC");
    if (!d || d->max_hooks < 12) {
        fprintf(stderr, "no usable CR_PLUGIN_DESC\n");
        return 3;
    }
    int (*hook[3])(int) = {d->hooks[HOOK_PAUSE_DEVICES], d->hooks[HOOK_CHECKPOINT_DEVICES],
                           d->hooks[HOOK_RESUME_DEVICES_LATE]};
    int rounds = atoi(argv[2]);
    for (int i = 0; i < rounds; i++) {
        int stage = i % 3;
        if (d->init(stage) != 0) {
            fprintf(stderr, "round %d: init(%d) failed\n", i, stage);
            return 4;
        }
        for (int k = 0; k < 3; k++) {
            int r = hook[k](getpid());
            if (r != -ENOTSUP) {
                fprintf(stderr, "round %d: hook %d answered %d, expected -ENOTSUP\n", i, k, r);
                return 5;
            }
        }
        d->exit(stage, i % 2 ? -1 : 0);
    }
    dlclose(h);
    printf("init_exit: %d rounds ok\n", rounds);
    return 0;
}
