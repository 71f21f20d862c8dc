/*
 * drv_plt.c — calls the driver API directly, linked to libcuda.so.1 (PLT calls).
 *
 *   drv_plt roundtrip      every tracked allocation kind once, an on-demand dump, frees
 *   drv_plt leak           512 MiB at a time in leak_through_driver() until out of memory
 */
#define _GNU_SOURCE
#include "cuda_driver_sim.h"

#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

static void dump_if_shimmed(const char *why) {
    int (*dump)(const char *) = (int (*)(const char *))dlsym(RTLD_DEFAULT, "oomshim_dump");
    if (dump != NULL) dump(why);
}

__attribute__((noinline)) static CUresult leak_through_driver(CUdeviceptr *p) {
    return cuMemAlloc_v2(p, (size_t)512 << 20);
}

__attribute__((noinline)) static CUresult allocate_everything(CUdeviceptr *d, void **h) {
    size_t pitch = 0;
    CUresult rc = cuMemAlloc_v2(&d[0], (size_t)64 << 20);
    if (rc == CUDA_SUCCESS) rc = cuMemAllocPitch_v2(&d[1], &pitch, 1000, 1000, 4);
    if (rc == CUDA_SUCCESS) rc = cuMemAllocManaged(&d[2], (size_t)32 << 20, CU_MEM_ATTACH_GLOBAL);
    if (rc == CUDA_SUCCESS) rc = cuMemAllocHost_v2(&h[0], (size_t)1 << 20);
    if (rc == CUDA_SUCCESS) rc = cuMemHostAlloc(&h[1], (size_t)2 << 20, CU_MEMHOSTALLOC_PORTABLE);
    printf("pitch=%zu\n", pitch);
    return rc;
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "roundtrip";
    if (cuInit(0) != CUDA_SUCCESS) return 3;
    if (strcmp(mode, "leak") == 0) {
        CUdeviceptr p;
        int n = 0;
        CUresult rc;
        while ((rc = leak_through_driver(&p)) == CUDA_SUCCESS) n++;
        printf("leaked %d x 512 MiB, then rc=%d\n", n, (int)rc);
        return rc == CUDA_ERROR_OUT_OF_MEMORY ? 2 : 1;
    }
    if (strcmp(mode, "roundtrip") == 0) {
        CUdeviceptr d[3] = {0, 0, 0};
        void *h[2] = {NULL, NULL};
        CUresult rc = allocate_everything(d, h);
        printf("allocate: rc=%d\n", (int)rc);
        dump_if_shimmed("allocated");
        int ok = 1;
        for (int i = 0; i < 3; i++) ok &= cuMemFree_v2(d[i]) == CUDA_SUCCESS;
        for (int i = 0; i < 2; i++) ok &= cuMemFreeHost(h[i]) == CUDA_SUCCESS;
        printf("double free: rc=%d\n", (int)cuMemFree_v2(d[0]));
        printf("freed: %s\n", ok ? "ok" : "failed");
        dump_if_shimmed("freed");
        return 0;
    }
    printf("unknown mode %s\n", mode);
    return 64;
}
