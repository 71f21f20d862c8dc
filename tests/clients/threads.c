/*
 * threads: 16 threads churn allocations concurrently through cudaMalloc, cudaMallocAsync and
 * cudaMallocManaged (freed with cudaFree / cudaFreeAsync), with sizes drawn from a per-thread
 * deterministic sequence. Thread i keeps a ring of its last k = i % 4 + 1 allocations; those stay
 * alive at the end. With several simulated devices thread i works on device i % device_count.
 * Then, if the process contains oomshim (found with dlsym(RTLD_DEFAULT, "oomshim_dump")), main asks
 * it for a dump with reason "threads-end".
 *
 * Usage: threads [ITERS]   (iterations per thread, default 20000)
 * Output (stdout): "held_bytes <sum of requested bytes still live>", "held_count <n>",
 * "dump_rc <rc>" or "dump_rc none". Both numbers depend only on ITERS. Exit 0; exit 1 (with a
 * message on stderr) if any CUDA call fails.
 */
#define _GNU_SOURCE
#include "cuda_sim.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#define THREADS 16
#define MAX_KEEP 4

enum api { API_MALLOC = 0, API_ASYNC = 1, API_MANAGED = 2 };

struct slot {
    void *ptr;
    size_t size;
    int api;
};

struct worker {
    int index;
    long iters;
    int device;
    int failures;
    struct slot ring[MAX_KEEP];
    int keep;
};

static const size_t g_sizes[] = {
    256, 512, 1000, 4096, 65536, 300000, (size_t)1 << 20, ((size_t)1 << 20) + 1,
    (size_t)3 << 20, (size_t)8 << 20,
};

static uint64_t next_random(uint64_t *state) {
    uint64_t x = *state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    *state = x;
    return x;
}

/* Frees one slot with the free call matching how it was allocated. */
__attribute__((noinline)) int churn_release(struct slot *s, cudaStream_t stream) {
    cudaError_t rc = s->api == API_ASYNC ? cudaFreeAsync(s->ptr, stream) : cudaFree(s->ptr);
    s->ptr = NULL;
    s->size = 0;
    return (int)rc;
}

/* Allocates `size` bytes into a slot through the API chosen by `api`. */
__attribute__((noinline)) int churn_allocate(struct slot *s, size_t size, int api,
                                             cudaStream_t stream) {
    void *p = NULL;
    cudaError_t rc;
    switch (api) {
    case API_ASYNC: rc = cudaMallocAsync(&p, size, stream); break;
    case API_MANAGED: rc = cudaMallocManaged(&p, size, cudaMemAttachGlobal); break;
    default: rc = cudaMalloc(&p, size); break;
    }
    if (rc == cudaSuccess) {
        s->ptr = p;
        s->size = size;
        s->api = api;
    }
    return (int)rc;
}

__attribute__((noinline)) void *churn_worker(void *arg) {
    struct worker *w = arg;
    uint64_t state = 0x9e3779b97f4a7c15ULL * (uint64_t)(w->index + 1);
    cudaStream_t stream = NULL;
    if (cudaSetDevice(w->device) != cudaSuccess || cudaStreamCreate(&stream) != cudaSuccess) {
        w->failures++;
        return NULL;
    }
    for (long i = 0; i < w->iters; i++) {
        struct slot *s = &w->ring[i % w->keep];
        if (s->ptr != NULL && churn_release(s, stream) != cudaSuccess) w->failures++;
        uint64_t r = next_random(&state);
        size_t size = g_sizes[r % (sizeof g_sizes / sizeof g_sizes[0])];
        int api = (int)((r >> 32) % 3);
        if (churn_allocate(s, size, api, stream) != cudaSuccess) w->failures++;
    }
    if (cudaStreamSynchronize(stream) != cudaSuccess) w->failures++;
    return NULL;
}

int main(int argc, char **argv) {
    long iters = argc > 1 ? strtol(argv[1], NULL, 10) : 20000;
    if (iters < 0) iters = 0;
    int devices = 0;
    if (cudaGetDeviceCount(&devices) != cudaSuccess || devices <= 0) {
        fprintf(stderr, "threads: no device\n");
        return 1;
    }
    static struct worker workers[THREADS];
    pthread_t tids[THREADS];
    for (int i = 0; i < THREADS; i++) {
        workers[i].index = i;
        workers[i].iters = iters;
        workers[i].device = i % devices;
        workers[i].keep = i % MAX_KEEP + 1;
        if (pthread_create(&tids[i], NULL, churn_worker, &workers[i]) != 0) {
            fprintf(stderr, "threads: pthread_create failed\n");
            return 1;
        }
    }
    size_t held_bytes = 0, held_count = 0;
    int failures = 0;
    for (int i = 0; i < THREADS; i++) {
        pthread_join(tids[i], NULL);
        failures += workers[i].failures;
        for (int k = 0; k < workers[i].keep; k++) {
            if (workers[i].ring[k].ptr == NULL) continue;
            held_bytes += workers[i].ring[k].size;
            held_count++;
        }
    }
    printf("held_bytes %zu\n", held_bytes);
    printf("held_count %zu\n", held_count);
    int (*dump)(const char *) = (int (*)(const char *))dlsym(RTLD_DEFAULT, "oomshim_dump");
    if (dump != NULL) printf("dump_rc %d\n", dump("threads-end"));
    else printf("dump_rc none\n");
    fflush(stdout);
    if (failures != 0) {
        fprintf(stderr, "threads: %d CUDA calls failed\n", failures);
        return 1;
    }
    return 0;
}
