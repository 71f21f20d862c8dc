/*
 * hook_pairs: the client `benches/hook_instructions.rs` counts under valgrind. Built by that
 * bench with gcc -O2, once without frame pointers and once with them.
 *
 * Usage: hook_pairs pairs FRAMES N
 *   The thread's first cudaMalloc(512)+cudaFree pair is made from main (a shallow frame), then
 *   N pairs from a stack of exactly FRAMES return addresses (counting main and the C library's
 *   start frames, __libc_start_call_main, __libc_start_main and _start: FRAMES >= 4).
 *
 * Usage: hook_pairs live N [dump]
 *   Holds N live cudaMalloc(512) allocations, then prints "rss-kib <VmRSS> hwm-kib <VmHWM>"
 *   (from /proc/self/status); with `dump`, then calls oomshim_dump (when the shim is loaded)
 *   and prints the line again: the peak while a dump reads the ledger.
 *
 * Exit 0; 1 with a message on stderr when a CUDA call fails or the arguments are wrong.
 */
#define _GNU_SOURCE
#include "cuda_sim.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static volatile int g_sink;

static void must(cudaError_t rc, const char *what) {
    if (rc != cudaSuccess) {
        fprintf(stderr, "hook_pairs: %s failed (%d)\n", what, (int)rc);
        exit(1);
    }
}

/* Inlined into its caller: the pair's frame is the caller's. */
static inline __attribute__((always_inline)) void one_pair(void) {
    void *p = NULL;
    must(cudaMalloc(&p, 512), "cudaMalloc");
    must(cudaFree(p), "cudaFree");
}

/* Adds `levels` frames, then makes `n` pairs. Not a tail call (the store after it). */
__attribute__((noinline)) static void pairs_below(int levels, long n) {
    if (levels > 0) {
        pairs_below(levels - 1, n);
        g_sink += levels;
        return;
    }
    for (long i = 0; i < n; i++) {
        one_pair();
    }
    g_sink += 1;
}

static void print_memory(void) {
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) {
        fprintf(stderr, "hook_pairs: /proc/self/status: cannot read\n");
        exit(1);
    }
    char line[256];
    long rss = -1, hwm = -1;
    while (fgets(line, sizeof line, f)) {
        sscanf(line, "VmRSS: %ld", &rss);
        sscanf(line, "VmHWM: %ld", &hwm);
    }
    fclose(f);
    printf("rss-kib %ld hwm-kib %ld\n", rss, hwm);
    fflush(stdout);
}

static int live(long n, int dump) {
    void **ptrs = malloc((size_t)n * sizeof *ptrs);
    if (!ptrs) {
        fprintf(stderr, "hook_pairs: out of host memory\n");
        return 1;
    }
    /* Touch the array first: its pages count the same in both runs. */
    memset(ptrs, 0, (size_t)n * sizeof *ptrs);
    for (long i = 0; i < n; i++) {
        must(cudaMalloc(&ptrs[i], 512), "cudaMalloc");
    }
    print_memory();
    if (dump) {
        int (*oomshim_dump)(const char *) =
            (int (*)(const char *))dlsym(RTLD_DEFAULT, "oomshim_dump");
        if (oomshim_dump && oomshim_dump("memory-bench") != 0) {
            fprintf(stderr, "hook_pairs: oomshim_dump failed\n");
            return 1;
        }
        print_memory();
    }
    for (long i = 0; i < n; i++) {
        must(cudaFree(ptrs[i]), "cudaFree");
    }
    free(ptrs);
    return 0;
}

int main(int argc, char **argv) {
    if (argc >= 3 && strcmp(argv[1], "live") == 0) {
        return live(atol(argv[2]), argc >= 4 && strcmp(argv[3], "dump") == 0);
    }
    if (argc != 4 || strcmp(argv[1], "pairs") != 0) {
        fprintf(stderr, "usage: hook_pairs pairs FRAMES N | hook_pairs live N [dump]\n");
        return 1;
    }
    int frames = atoi(argv[2]);
    long n = atol(argv[3]);
    if (frames < 4 || n < 0) {
        fprintf(stderr, "hook_pairs: FRAMES must be at least 4, N at least 0\n");
        return 1;
    }
    /* The thread's first allocation, from main: the shallowest stack this program has. */
    one_pair();
    if (frames == 4) {
        /* main, __libc_start_call_main, __libc_start_main, _start. */
        for (long i = 0; i < n; i++) {
            one_pair();
        }
    } else {
        /* pairs_below itself and `frames - 5` more levels above main's four. */
        pairs_below(frames - 5, n);
    }
    g_sink += 1;
    return 0;
}
