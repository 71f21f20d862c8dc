/* A C program (no C++ runtime of its own) that loads a C++ library RTLD_LOCAL, as Python loads
 * torch: the allocation that cannot be served must still raise a C++ exception in that library,
 * not return NULL.  usage: torch_alloc_local LIBCXXCATCH LIBOOMSHIM */
#include "cuda_sim.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

typedef int (*catch_fn)(const char *, size_t, char *, size_t);

int main(int argc, char **argv) {
    if (argc < 3) return 2;
    void *h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (h == NULL) {
        fprintf(stderr, "dlopen: %s\n", dlerror());
        return 2;
    }
    catch_fn alloc = (catch_fn)dlsym(h, "cxxcatch_alloc");
    cudaSetDevice(0); /* the CUDA runtime is loaded, as torch's libraries load it */
    static char what[4096];
    int small = alloc(argv[2], 1 << 20, what, sizeof what);
    int huge = alloc(argv[2], (size_t)1 << 50, what, sizeof what);
    printf("small %d huge %d: %s\n", small, huge, what);
    return 0;
}
