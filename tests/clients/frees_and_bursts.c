/*
 * Two behaviours a framework shows around frees and failures, chosen by argv[1]:
 *   frees  - frees the shim never saw: a stack address, a double free, an async free of a
 *            made-up device address; cudaFree(NULL) (a no-op, not unknown). Then asks for a dump.
 *   burst  - fills the device, then fails `N` (argv[2], default 5) more times in a row, the way
 *            a framework retries after emptying its cache.
 * Every return code is printed so runs with and without the shim can be compared.
 */
#include "cuda_sim.h"
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void *g_chunks[4096];

__attribute__((noinline)) static int free_foreign_pointers(void) {
    int local = 0;
    void *p = NULL;
    printf("cudaMalloc -> %d\n", (int)cudaMalloc(&p, 4096));
    printf("cudaFree(p) -> %d\n", (int)cudaFree(p));
    printf("cudaFree(p) again -> %d\n", (int)cudaFree(p));
    printf("cudaFree(stack) -> %d\n", (int)cudaFree(&local));
    printf("cudaFreeAsync(made-up) -> %d\n", (int)cudaFreeAsync((void *)0x7e0012345600ull, 0));
    printf("cudaFree(NULL) -> %d\n", (int)cudaFree(NULL));
    return 0;
}

__attribute__((noinline)) static int fill_then_retry(int retries) {
    int n = 0;
    while (n < 4096 && cudaMalloc(&g_chunks[n], 64ull << 20) == cudaSuccess) n++;
    printf("held %d chunks\n", n);
    for (int i = 0; i < retries; i++) {
        void *p = NULL;
        printf("retry %d -> %d\n", i, (int)cudaMalloc(&p, 64ull << 20));
    }
    return 0;
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "frees";
    if (strcmp(mode, "frees") == 0) {
        free_foreign_pointers();
        int (*dump)(const char *) = (int (*)(const char *))dlsym(RTLD_DEFAULT, "oomshim_dump");
        if (dump != NULL && dump("frees-end") != 0) return 1;
        return 0;
    }
    if (strcmp(mode, "burst") == 0) return fill_then_retry(argc > 2 ? atoi(argv[2]) : 5);
    fprintf(stderr, "usage: frees_and_bursts frees|burst [N]\n");
    return 2;
}
