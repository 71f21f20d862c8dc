/*
 * flight_leak: a training loop that leaks 8 MiB of device memory a step in keep_activations
 * (marked steps, 20 ms each), prints "ready" after 40 steps, and runs until it is killed. It
 * never runs out of memory by itself: what it leaves behind depends on the live summary.
 *
 *   flight_leak [chdir DIR] - device leak only (moved to DIR before its first CUDA call).
 *   flight_leak host   - also keeps 4 MiB of host memory a step (resident); _exit: ends by _exit(0) at step 80.
 */
#include "cuda_sim.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define LEAK_BYTES ((size_t)8 << 20)
#define HOST_BYTES ((size_t)4 << 20)

__attribute__((noinline)) int keep_activations(void) {
    void *p = NULL;
    return (int)cudaMalloc(&p, LEAK_BYTES);
}

__attribute__((noinline)) void transient_work(void) {
    void *p = NULL;
    if (cudaMalloc(&p, LEAK_BYTES) == cudaSuccess) cudaFree(p);
}

#include <unistd.h> /* below the functions whose lines the tests name */

int main(int argc, char **argv) {
    int host = argc > 1 && strcmp(argv[1], "host") == 0;
    int quick_exit = argc > 1 && strcmp(argv[1], "_exit") == 0;
    if (argc > 2 && strcmp(argv[1], "chdir") == 0 && chdir(argv[2]) != 0) return 2;
    void (*step)(void) = (void (*)(void))dlsym(RTLD_DEFAULT, "oomshim_step");
    struct timespec nap = {0, 20 * 1000 * 1000};
    for (int i = 1;; i++) {
        if (step) step();
        keep_activations();
        transient_work();
        if (host) {
            char *h = malloc(HOST_BYTES);
            if (h) memset(h, i, HOST_BYTES);
        }
        if (quick_exit && i == 80) _exit(0);
        if (i == 40) {
            printf("ready\n");
            fflush(stdout);
        }
        nanosleep(&nap, NULL);
    }
}
