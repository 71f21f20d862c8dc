/*
 * retry_after_oom: behaves like a framework's caching allocator. It fills a cache with 256 MiB
 * blocks until cudaMalloc fails with cudaErrorMemoryAllocation, then releases half of the cache
 * (every second block, as a cache frees its unused segments) and retries the same size, which
 * succeeds. The shim's dump for the first failure should say the failure was later retried
 * successfully.
 *
 * Output (stdout): "cached <n> blocks", "cudaMalloc returned 2", "released <m> blocks",
 * "recovered 1". Exit 0; exit 1 if any step behaves otherwise.
 */
#include "cuda_sim.h"

#include <stdio.h>

#define BLOCK_BYTES ((size_t)256 << 20)
#define MAX_BLOCKS 4096

static void *g_cache[MAX_BLOCKS];
static int g_cached;

/* Allocates blocks until cudaMalloc fails; returns the failing call's code. */
__attribute__((noinline)) int cache_fill(void) {
    for (;;) {
        void *p = NULL;
        cudaError_t rc = cudaMalloc(&p, BLOCK_BYTES);
        if (rc != cudaSuccess) return (int)rc;
        if (g_cached == MAX_BLOCKS) return -1;
        g_cache[g_cached++] = p;
    }
}

/* Frees every second cached block; returns how many were freed, or -1 on a failed free. */
__attribute__((noinline)) int cache_release_half(void) {
    int released = 0;
    for (int i = 0; i < g_cached; i += 2) {
        if (g_cache[i] == NULL) continue;
        if (cudaFree(g_cache[i]) != cudaSuccess) return -1;
        g_cache[i] = NULL;
        released++;
    }
    return released;
}

/* Retries the allocation that failed; returns cudaMalloc's code. */
__attribute__((noinline)) int cache_alloc_retry(void **out) {
    cudaError_t rc = cudaMalloc(out, BLOCK_BYTES);
    return (int)rc;
}

int main(void) {
    int rc = cache_fill();
    printf("cached %d blocks\n", g_cached);
    printf("cudaMalloc returned %d\n", rc);
    if (rc != cudaErrorMemoryAllocation) return 1;
    int released = cache_release_half();
    printf("released %d blocks\n", released);
    if (released <= 0) return 1;
    void *p = NULL;
    rc = cache_alloc_retry(&p);
    printf("recovered %d\n", rc == cudaSuccess && p != NULL ? 1 : 0);
    return rc == cudaSuccess ? 0 : 1;
}
