/*
 * leak_until_oom: a cache that grows by 64 MiB chunks and never gives anything back, until
 * cudaMalloc fails. The OOM dump should name leaky_cache_grow as the holder of almost all memory.
 *
 * Output (stdout): "held <n> chunks", "cudaMalloc returned <code>". Exit 0.
 * With the sim's defaults (8 GiB, 256 MiB context) n is 124 and the code is 2.
 */
#include "cuda_sim.h"

#include <stdio.h>

#define CHUNK_BYTES ((size_t)64 << 20)
#define MAX_CHUNKS 65536

static void *g_chunks[MAX_CHUNKS];
static int g_held;

/* Grows the cache until cudaMalloc fails; returns the failing call's code. */
__attribute__((noinline)) int leaky_cache_grow(void) {
    for (;;) {
        void *p = NULL;
        cudaError_t rc = cudaMalloc(&p, CHUNK_BYTES);
        if (rc != cudaSuccess) return (int)rc;
        if (g_held == MAX_CHUNKS) return -1;
        g_chunks[g_held++] = p;
    }
}

int main(void) {
    int rc = leaky_cache_grow();
    printf("held %d chunks\n", g_held);
    printf("cudaMalloc returned %d\n", rc);
    return 0;
}
