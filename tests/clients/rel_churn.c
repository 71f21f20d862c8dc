/*
 * rel_churn: concurrency at scale. 16 threads each run ITERS allocate/free steps through six
 * hooked APIs (cudaMalloc, cudaMallocAsync, cudaMallocManaged, cudaMallocPitch, cudaMalloc3D,
 * cudaMallocHost), each keeping a ring of its last k = i % 4 + 1 allocations. Meanwhile one
 * thread asks the shim for on-demand dumps (oomshim_dump("churn-mid")) and another makes
 * out-of-memory failures (a 1 TiB cudaMalloc), until the workers finish. Then main asks for a
 * dump "churn-end" and prints what the program still holds:
 *   "held_bytes N" (device bytes, pitched ones as pitch*height*depth), "held_count N",
 *   "pinned_bytes N", "pinned_count N", "mid_dumps N", "ooms N", "dump_rc RC".
 *
 * Usage: rel_churn [ITERS]   (per thread; default 20000)
 */
#define _GNU_SOURCE
#include "cuda_sim.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#define THREADS 16
#define MAX_KEEP 4
#define APIS 6

enum api { A_MALLOC, A_ASYNC, A_MANAGED, A_PITCH, A_3D, A_HOST };

struct slot {
    void *ptr;
    size_t bytes;
    int api;
};

struct worker {
    int index;
    long iters;
    int keep;
    long failures;
    struct slot ring[MAX_KEEP];
};

static atomic_int g_done;
static int (*g_dump)(const char *);

static int release(struct slot *s) {
    cudaError_t rc;
    switch (s->api) {
    case A_ASYNC: rc = cudaFreeAsync(s->ptr, NULL); break;
    case A_HOST: rc = cudaFreeHost(s->ptr); break;
    default: rc = cudaFree(s->ptr); break;
    }
    s->ptr = NULL;
    s->bytes = 0;
    return rc != cudaSuccess;
}

static int allocate(struct slot *s, uint64_t r) {
    size_t size = (size_t)256 << (r % 12); /* 256 B .. 512 KiB */
    int api = (int)((r >> 32) % APIS);
    void *p = NULL;
    size_t bytes = size;
    cudaError_t rc;
    switch (api) {
    case A_ASYNC: rc = cudaMallocAsync(&p, size, NULL); break;
    case A_MANAGED: rc = cudaMallocManaged(&p, size, cudaMemAttachGlobal); break;
    case A_PITCH: {
        size_t pitch = 0;
        rc = cudaMallocPitch(&p, &pitch, size, 3);
        bytes = pitch * 3;
        break;
    }
    case A_3D: {
        struct cudaPitchedPtr pp;
        struct cudaExtent ext = {size, 2, 2};
        rc = cudaMalloc3D(&pp, ext);
        p = pp.ptr;
        bytes = pp.pitch * 2 * 2;
        break;
    }
    case A_HOST: rc = cudaMallocHost(&p, size); break;
    default: rc = cudaMalloc(&p, size); break;
    }
    if (rc != cudaSuccess) return 1;
    s->ptr = p;
    s->bytes = bytes;
    s->api = api;
    return 0;
}

static void *churn(void *arg) {
    struct worker *w = arg;
    uint64_t state = 0x9e3779b97f4a7c15ULL * (uint64_t)(w->index + 1);
    for (long i = 0; i < w->iters; i++) {
        struct slot *s = &w->ring[i % w->keep];
        if (s->ptr != NULL) w->failures += release(s);
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        w->failures += allocate(s, state);
    }
    return NULL;
}

static atomic_long g_mid_dumps, g_ooms;

static void *dumper(void *arg) {
    (void)arg;
    while (!atomic_load(&g_done)) {
        if (g_dump != NULL && g_dump("churn-mid") == 0) atomic_fetch_add(&g_mid_dumps, 1);
        usleep(50 * 1000);
    }
    return NULL;
}

static void *oomer(void *arg) {
    (void)arg;
    while (!atomic_load(&g_done)) {
        void *p = NULL;
        if (cudaMalloc(&p, (size_t)1 << 40) != cudaSuccess) atomic_fetch_add(&g_ooms, 1);
        usleep(5 * 1000);
    }
    return NULL;
}

int main(int argc, char **argv) {
    long iters = argc > 1 ? strtol(argv[1], NULL, 10) : 20000;
    g_dump = (int (*)(const char *))dlsym(RTLD_DEFAULT, "oomshim_dump");
    static struct worker workers[THREADS];
    pthread_t tids[THREADS], dump_tid, oom_tid;
    pthread_create(&dump_tid, NULL, dumper, NULL);
    pthread_create(&oom_tid, NULL, oomer, NULL);
    for (int i = 0; i < THREADS; i++) {
        workers[i].index = i;
        workers[i].iters = iters;
        workers[i].keep = i % MAX_KEEP + 1;
        if (pthread_create(&tids[i], NULL, churn, &workers[i]) != 0) return 1;
    }
    long failures = 0;
    size_t held = 0, count = 0, pinned = 0, pinned_count = 0;
    for (int i = 0; i < THREADS; i++) {
        pthread_join(tids[i], NULL);
        failures += workers[i].failures;
        for (int k = 0; k < workers[i].keep; k++) {
            struct slot *s = &workers[i].ring[k];
            if (s->ptr == NULL) continue;
            if (s->api == A_HOST) {
                pinned += s->bytes;
                pinned_count++;
            } else {
                held += s->bytes;
                count++;
            }
        }
    }
    atomic_store(&g_done, 1);
    pthread_join(dump_tid, NULL);
    pthread_join(oom_tid, NULL);
    printf("held_bytes %zu\nheld_count %zu\n", held, count);
    printf("pinned_bytes %zu\npinned_count %zu\n", pinned, pinned_count);
    printf("mid_dumps %ld\nooms %ld\n", atomic_load(&g_mid_dumps), atomic_load(&g_ooms));
    printf("dump_rc %d\n", g_dump ? g_dump("churn-end") : -100);
    fflush(stdout);
    if (failures != 0) {
        fprintf(stderr, "rel_churn: %ld CUDA calls failed\n", failures);
        return 1;
    }
    return 0;
}
