/*
 * closes_stderr: a program that lets go of its stderr while it keeps running, as a program that
 * detaches from its launcher does. It allocates (the shim's live summary starts), waits for a
 * few publishes, closes fd 2, prints "closed" on stdout and runs 3 s more. Its parent reads its
 * stderr to the end: the end must come when the program closes it, not when it exits.
 */
#include "cuda_sim.h"

#include <stdio.h>
#include <time.h>
#include <unistd.h>

static void nap_ms(long ms) {
    struct timespec t = {ms / 1000, (ms % 1000) * 1000 * 1000};
    nanosleep(&t, NULL);
}

int main(void) {
    void *p = NULL;
    if (cudaMalloc(&p, (size_t)64 << 20) != cudaSuccess) {
        fprintf(stderr, "cudaMalloc failed\n");
        return 2;
    }
    nap_ms(500); /* the region is created and published (OOMSHIM_LIVE_INTERVAL=100ms) */
    close(2);
    printf("closed\n");
    fflush(stdout);
    nap_ms(3000);
    cudaFree(p);
    return 0;
}
