/*
 * verdict_autosteps: a training loop that never calls oomshim_step(). Every step,
 * keep_activations keeps 64 MiB alive (the leak) and transient_work allocates and frees 32 MiB
 * of working memory, until a cudaMalloc fails. The shim must detect the steps from the repeating
 * allocation pattern.
 *
 *   verdict_autosteps          - the loop. Output: "step <i>: <function> failed with <code>".
 *   verdict_autosteps shapes   - dynamic shapes: 40 working buffers of 40 distinct sizes
 *                                (8 MiB + i * 2 MiB, allocated and freed), then 64 MiB blocks kept
 *                                until a cudaMalloc fails. Output: "kept <n>, failed with <code>".
 */
#include "cuda_sim.h"

#include <stdio.h>
#include <string.h>

#define MiB ((size_t)1 << 20)
#define MAX_KEPT 4096

static void *g_kept[MAX_KEPT];
static int g_nkept;

/* The leak: one buffer per step that is never freed. */
__attribute__((noinline)) int keep_activations(void) {
    void *p = NULL;
    cudaError_t rc = cudaMalloc(&p, 64 * MiB);
    if (rc != cudaSuccess) return (int)rc;
    if (g_nkept < MAX_KEPT) g_kept[g_nkept++] = p;
    return 0;
}

/* Working memory of a step: freed before the step ends. */
__attribute__((noinline)) int transient_work(size_t bytes) {
    void *p = NULL;
    cudaError_t rc = cudaMalloc(&p, bytes);
    if (rc != cudaSuccess) return (int)rc;
    cudaFree(p);
    return 0;
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "shapes") == 0) {
        for (size_t i = 0; i < 40; i++) transient_work(8 * MiB + i * 2 * MiB);
        int rc;
        while ((rc = keep_activations()) == 0) {
        }
        printf("kept %d, failed with %d\n", g_nkept, rc);
        return 0;
    }
    for (int i = 1; i < 100000; i++) {
        int rc = keep_activations();
        if (rc != 0) {
            printf("step %d: keep_activations failed with %d\n", i, rc);
            break;
        }
        rc = transient_work(32 * MiB);
        if (rc != 0) {
            printf("step %d: transient_work failed with %d\n", i, rc);
            break;
        }
    }
    return 0;
}
