/*
 * steps_leak: a training loop that marks each step with oomshim_step() (found with
 * dlsym(RTLD_DEFAULT, ...): absent, and skipped, without the shim). Every step,
 * keep_activations keeps 96 MiB alive (the leak) and transient_work allocates and frees 32 MiB,
 * until a cudaMalloc fails.
 *
 *   steps_leak          - the loop. Output: "step <i>: <function> failed with <code>", "kept <n>".
 *   steps_leak big <N>  - a single cudaMalloc of N bytes. Output: "cudaMalloc returned <code>".
 */
#include "cuda_sim.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define LEAK_BYTES ((size_t)96 << 20)
#define TRANSIENT_BYTES ((size_t)32 << 20)
#define MAX_KEPT 4096

static void *g_kept[MAX_KEPT];
static int g_nkept;

/* The leak: one buffer per step that is never freed. */
__attribute__((noinline)) int keep_activations(void) {
    void *p = NULL;
    cudaError_t rc = cudaMalloc(&p, LEAK_BYTES);
    if (rc != cudaSuccess) return (int)rc;
    if (g_nkept < MAX_KEPT) g_kept[g_nkept++] = p;
    return 0;
}

/* Working memory of a step: freed before the step ends. */
__attribute__((noinline)) int transient_work(void) {
    void *p = NULL;
    cudaError_t rc = cudaMalloc(&p, TRANSIENT_BYTES);
    if (rc != cudaSuccess) return (int)rc;
    cudaFree(p);
    return 0;
}

int main(int argc, char **argv) {
    if (argc > 2 && strcmp(argv[1], "big") == 0) {
        void *p = NULL;
        size_t bytes = (size_t)strtoull(argv[2], NULL, 10);
        printf("cudaMalloc returned %d\n", (int)cudaMalloc(&p, bytes));
        return 0;
    }
    void (*step)(void) = (void (*)(void))dlsym(RTLD_DEFAULT, "oomshim_step");
    for (int i = 1; i < 100000; i++) {
        if (step) step();
        int rc = keep_activations();
        if (rc != 0) {
            printf("step %d: keep_activations failed with %d\n", i, rc);
            break;
        }
        rc = transient_work();
        if (rc != 0) {
            printf("step %d: transient_work failed with %d\n", i, rc);
            break;
        }
    }
    printf("kept %d\n", g_nkept);
    return 0;
}
