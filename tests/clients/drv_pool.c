/*
 * drv_pool.c — the stream-ordered allocator of the driver (cuMemAllocAsync, its _ptsz form,
 * cuMemAllocFromPoolAsync, cuMemFreeAsync), called directly.
 *
 *   drv_pool roundtrip     three async allocations in pool_work(), a dump, frees, a dump
 *   drv_pool leak          256 MiB at a time in pool_leak() until out of memory
 *   drv_pool cache         2 GiB allocated and freed through the pool (it stays cached there),
 *                          then 512 MiB cuMemAlloc_v2 in plain_leak() until out of memory,
 *                          then an on-demand dump
 */
#define _GNU_SOURCE
#include "cuda_driver_sim.h"

#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream stream);
CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream stream);

static void dump_if_shimmed(const char *why) {
    int (*dump)(const char *) = (int (*)(const char *))dlsym(RTLD_DEFAULT, "oomshim_dump");
    if (dump != NULL) dump(why);
}

__attribute__((noinline)) static CUresult pool_work(CUdeviceptr *p, CUmemoryPool pool) {
    CUresult rc = cuMemAllocAsync(&p[0], (size_t)64 << 20, (CUstream)0);
    if (rc == CUDA_SUCCESS) rc = cuMemAllocAsync_ptsz(&p[1], (size_t)16 << 20, (CUstream)0);
    if (rc == CUDA_SUCCESS) rc = cuMemAllocFromPoolAsync(&p[2], (size_t)8 << 20, pool, (CUstream)0);
    return rc;
}

__attribute__((noinline)) static CUresult pool_leak(CUdeviceptr *p) {
    return cuMemAllocAsync(p, (size_t)256 << 20, (CUstream)0);
}

__attribute__((noinline)) static CUresult plain_leak(CUdeviceptr *p) {
    return cuMemAlloc_v2(p, (size_t)512 << 20);
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "roundtrip";
    if (cuInit(0) != CUDA_SUCCESS) return 3;
    CUmemoryPool pool;
    if (cuDeviceGetDefaultMemPool(&pool, 0) != CUDA_SUCCESS) return 3;
    if (strcmp(mode, "leak") == 0) {
        CUdeviceptr p;
        int n = 0;
        CUresult rc;
        while ((rc = pool_leak(&p)) == CUDA_SUCCESS) n++;
        printf("leaked %d x 256 MiB, then rc=%d\n", n, (int)rc);
        return rc == CUDA_ERROR_OUT_OF_MEMORY ? 2 : 1;
    }
    if (strcmp(mode, "cache") == 0) {
        CUdeviceptr p;
        printf("pool alloc: rc=%d\n", (int)cuMemAllocAsync(&p, (size_t)2 << 30, (CUstream)0));
        printf("pool free: rc=%d\n", (int)cuMemFreeAsync(p, (CUstream)0));
        int n = 0;
        CUresult rc;
        while ((rc = plain_leak(&p)) == CUDA_SUCCESS) n++;
        printf("leaked %d x 512 MiB, then rc=%d\n", n, (int)rc);
        dump_if_shimmed("after-oom");
        return rc == CUDA_ERROR_OUT_OF_MEMORY ? 2 : 1;
    }
    if (strcmp(mode, "roundtrip") == 0) {
        CUdeviceptr p[3] = {0, 0, 0};
        printf("alloc: rc=%d\n", (int)pool_work(p, pool));
        dump_if_shimmed("pool-allocated");
        printf("free: rc=%d %d %d\n", (int)cuMemFreeAsync(p[0], (CUstream)0),
               (int)cuMemFreeAsync_ptsz(p[1], (CUstream)0), (int)cuMemFreeAsync(p[2], (CUstream)0));
        cuuint64_t reserved = 0, used = 0;
        cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &reserved);
        cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, &used);
        printf("pool: reserved=%llu used=%llu\n", reserved, used);
        dump_if_shimmed("pool-freed");
        return 0;
    }
    printf("unknown mode %s\n", mode);
    return 64;
}
