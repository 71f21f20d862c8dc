/*
 * flight_growth: programs the flight recorder must describe however early or however plainly
 * they grow. Neither marks steps.
 *
 *   flight_growth spike          - a start-up spike: grow_cache keeps 20 x 32 MiB, 20 ms apart
 *                                  (0.4 s), then "ready", then sleeps until it is killed.
 *   flight_growth slow           - a service loop: session_cache keeps 8 MiB per request, 30 ms
 *                                  apart, never freed; "ready" after the first request, runs
 *                                  until it is killed.
 *   flight_growth slow-scratch   - the same with a scratch_buffer of 4 MiB allocated and freed in
 *                                  each request.
 *   flight_growth evict          - a bounded cache: bounded_cache keeps 8 MiB per request, 30 ms
 *                                  apart, and frees the oldest once it holds 16 (steady at
 *                                  128 MiB); "ready", runs until it is killed.
 *   flight_growth nothing        - prints "ready" and sleeps until it is killed: no CUDA at all.
 */
#include "cuda_sim.h"

#include <stdio.h>
#include <string.h>
#include <time.h>

#define SPIKE_BYTES ((size_t)32 << 20)
#define SESSION_BYTES ((size_t)8 << 20)
#define SCRATCH_BYTES ((size_t)4 << 20)
#define CACHE_SLOTS 16

__attribute__((noinline)) int grow_cache(void) {
    void *p = NULL;
    return (int)cudaMalloc(&p, SPIKE_BYTES);
}

__attribute__((noinline)) int session_cache(void) {
    void *p = NULL;
    return (int)cudaMalloc(&p, SESSION_BYTES);
}

__attribute__((noinline)) void scratch_buffer(void) {
    void *p = NULL;
    if (cudaMalloc(&p, SCRATCH_BYTES) == cudaSuccess) cudaFree(p);
}

static void *g_cache[CACHE_SLOTS];

__attribute__((noinline)) void bounded_cache(int i) {
    int slot = i % CACHE_SLOTS;
    if (g_cache[slot]) cudaFree(g_cache[slot]);
    g_cache[slot] = NULL;
    cudaMalloc(&g_cache[slot], SESSION_BYTES);
}

#include <unistd.h> /* below the functions whose lines the tests name */

static void nap_ms(long ms) {
    struct timespec t = {ms / 1000, (ms % 1000) * 1000 * 1000};
    nanosleep(&t, NULL);
}

static void ready(void) {
    printf("ready\n");
    fflush(stdout);
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "";
    if (strcmp(mode, "spike") == 0) {
        for (int i = 0; i < 20; i++) {
            grow_cache();
            nap_ms(20);
        }
        ready();
        for (;;) pause();
    }
    if (strcmp(mode, "nothing") == 0) {
        ready();
        for (;;) pause();
    }
    int scratch = strcmp(mode, "slow-scratch") == 0;
    int evict = strcmp(mode, "evict") == 0;
    if (!scratch && !evict && strcmp(mode, "slow") != 0) {
        fprintf(stderr, "usage: flight_growth spike|slow|slow-scratch|evict|nothing\n");
        return 2;
    }
    for (int i = 0;; i++) {
        if (evict)
            bounded_cache(i);
        else
            session_cache();
        if (scratch) scratch_buffer();
        if (i == 0) ready();
        nap_ms(30);
    }
}
