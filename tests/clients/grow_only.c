/*
 * grow_only: programs whose growth has no steps to be measured by, or whose steps go on after
 * their failure (C programs that ignore errors).
 *
 *   grow_only            - marks no steps and repeats no pattern: grow_forever keeps 48 MiB every
 *                          100 ms and never frees, until cudaMalloc fails. Output: "failed after
 *                          <n> chunks with <code>". Exit 0.
 *   grow_only killme     - the same growth, never failing (run it on a large device): prints
 *                          "ready" after 50 chunks (5 s) and keeps growing until it is killed.
 *   grow_only early      - one allocation, "ready", then sleeps until it is killed (a program
 *                          killed in its first second).
 *   grow_only keep-going - marked steps (oomshim_step): keep_activations keeps 96 MiB a step and
 *                          transient_work uses 32 MiB; after the first failure it goes on
 *                          stepping (200 more steps, each failing), as C programs that ignore
 *                          errors do. Output: "first failure at step <i>", "stepped <n>". Exit 0.
 */
#include "cuda_sim.h"

#include <dlfcn.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#define CHUNK_BYTES ((size_t)48 << 20)
#define LEAK_BYTES ((size_t)96 << 20)
#define TRANSIENT_BYTES ((size_t)32 << 20)

__attribute__((noinline)) int grow_forever(void) {
    void *p = NULL;
    return (int)cudaMalloc(&p, CHUNK_BYTES);
}

__attribute__((noinline)) int keep_activations(void) {
    void *p = NULL;
    return (int)cudaMalloc(&p, LEAK_BYTES);
}

__attribute__((noinline)) int transient_work(void) {
    void *p = NULL;
    cudaError_t rc = cudaMalloc(&p, TRANSIENT_BYTES);
    if (rc == cudaSuccess) cudaFree(p);
    return (int)rc;
}

#include <unistd.h> /* below the functions whose lines the tests name */

static void nap_ms(long ms) {
    struct timespec t = {ms / 1000, (ms % 1000) * 1000 * 1000};
    nanosleep(&t, NULL);
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "";
    if (strcmp(mode, "early") == 0) {
        void *p = NULL;
        cudaMalloc(&p, CHUNK_BYTES);
        printf("ready\n");
        fflush(stdout);
        for (;;) pause();
    }
    if (strcmp(mode, "keep-going") == 0) {
        void (*step)(void) = (void (*)(void))dlsym(RTLD_DEFAULT, "oomshim_step");
        int failed_at = 0, i;
        for (i = 1; i < 100000 && (!failed_at || i < failed_at + 200); i++) {
            if (step) step();
            if (keep_activations() != 0 && !failed_at) {
                failed_at = i;
                printf("first failure at step %d\n", i);
            }
            transient_work();
        }
        printf("stepped %d\n", i - 1);
        return 0;
    }
    int killme = strcmp(mode, "killme") == 0;
    for (int n = 0;; n++) {
        int rc = grow_forever();
        if (rc != 0) {
            printf("failed after %d chunks with %d\n", n, rc);
            return 0;
        }
        if (killme && n + 1 == 50) {
            printf("ready\n");
            fflush(stdout);
        }
        nap_ms(100);
    }
}
