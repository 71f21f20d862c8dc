/*
 * drv_once.c — exactly-once accounting: run with SIMCUDA_RUNTIME_VIA_DRIVER=1, each cudaMalloc
 * of the simulated runtime is served by the driver's cuMemAlloc_v2 through the pointer the
 * runtime got from cuGetProcAddress_v2 (the shim's wrapper under the shim).
 *
 *   drv_once hold          three 64 MiB cudaMallocs in hold_via_runtime(), a dump, frees, a dump
 *   drv_once leak          1 GiB cudaMallocs in leak_via_runtime() until out of memory
 */
#define _GNU_SOURCE
#include "cuda_sim.h"

#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

static void dump_if_shimmed(const char *why) {
    int (*dump)(const char *) = (int (*)(const char *))dlsym(RTLD_DEFAULT, "oomshim_dump");
    if (dump != NULL) dump(why);
}

__attribute__((noinline)) static cudaError_t hold_via_runtime(void **p) {
    for (int i = 0; i < 3; i++) {
        cudaError_t rc = cudaMalloc(&p[i], (size_t)64 << 20);
        if (rc != cudaSuccess) return rc;
    }
    return cudaSuccess;
}

__attribute__((noinline)) static cudaError_t leak_via_runtime(void **p) {
    return cudaMalloc(p, (size_t)1 << 30);
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "hold";
    if (strcmp(mode, "leak") == 0) {
        void *p;
        int n = 0;
        cudaError_t rc;
        while ((rc = leak_via_runtime(&p)) == cudaSuccess) n++;
        printf("leaked %d GiB, then rc=%d\n", n, (int)rc);
        return rc == cudaErrorMemoryAllocation ? 2 : 1;
    }
    void *p[3] = {NULL, NULL, NULL};
    printf("hold: rc=%d\n", (int)hold_via_runtime(p));
    size_t free_b = 0, total = 0;
    printf("meminfo: rc=%d\n", (int)cudaMemGetInfo(&free_b, &total));
    printf("free+used: %zu MiB of %zu MiB\n", free_b >> 20, total >> 20);
    dump_if_shimmed("once");
    for (int i = 0; i < 3; i++) cudaFree(p[i]);
    dump_if_shimmed("once-freed");
    printf("freed\n");
    return 0;
}
