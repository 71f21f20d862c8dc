/*
 * rel_drv_churn: rel_churn's sibling for the driver API, mixed with the runtime. 16 threads each
 * run ITERS allocate/free steps, every step through one of nine paths picked at random:
 *   runtime: cudaMalloc, cudaMallocAsync/cudaFreeAsync, cudaMallocHost/cudaFreeHost;
 *   driver:  cuMemAlloc_v2/cuMemFree_v2, cuMemAllocAsync/cuMemFreeAsync,
 *            cuMemAllocFromPoolAsync (the default pool)/cuMemFreeAsync, cuMemAllocManaged,
 *            cuMemAllocHost_v2/cuMemFreeHost, and VMM: cuMemCreate + cuMemAddressReserve +
 *            cuMemMap + cuMemRelease (while mapped), freed by cuMemUnmap + cuMemAddressFree.
 * Each thread keeps a ring of its last k = i % 4 + 1 allocations. Meanwhile one thread asks for
 * on-demand dumps and another makes out-of-memory failures through both layers (a 1 TiB
 * cudaMalloc and cuMemAlloc_v2), until the workers finish. Then main asks for a dump
 * "churn-end" and prints what the program still holds, as rel_churn does:
 *   "held_bytes N", "held_count N", "pinned_bytes N", "pinned_count N", "mid_dumps N",
 *   "ooms N", "dump_rc RC". A VMM allocation counts as its handle's bytes (the ledger's view).
 *
 * Usage: rel_drv_churn [ITERS]   (per thread; default 20000)
 */
#define _GNU_SOURCE
#include "cuda_driver_sim.h"
#include "cuda_sim.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define THREADS 16
#define MAX_KEEP 4
#define MiB ((size_t)1 << 20)

enum api { R_MALLOC, R_ASYNC, R_HOST, D_ALLOC, D_ASYNC, D_POOL, D_MANAGED, D_HOST, D_VMM, APIS };

struct slot {
    uint64_t ptr; /* device pointer, host pointer, or mapped VA */
    uint64_t handle;
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
static CUmemoryPool g_pool;

static int release(struct slot *s) {
    int rc;
    void *p = (void *)(uintptr_t)s->ptr;
    switch (s->api) {
    case R_MALLOC: rc = cudaFree(p); break;
    case R_ASYNC: rc = cudaFreeAsync(p, NULL); break;
    case R_HOST: rc = cudaFreeHost(p); break;
    case D_ASYNC:
    case D_POOL: rc = cuMemFreeAsync(s->ptr, NULL); break;
    case D_HOST: rc = cuMemFreeHost(p); break;
    case D_VMM:
        rc = cuMemUnmap(s->ptr, s->bytes);
        if (rc == 0) rc = cuMemAddressFree(s->ptr, s->bytes);
        break;
    default: rc = cuMemFree_v2(s->ptr); break;
    }
    s->ptr = 0;
    s->bytes = 0;
    return rc != 0;
}

static int allocate(struct slot *s, uint64_t r) {
    size_t size = (size_t)256 << (r % 12); /* 256 B .. 512 KiB */
    int api = (int)((r >> 32) % APIS);
    void *p = NULL;
    CUdeviceptr d = 0;
    int rc;
    s->handle = 0;
    switch (api) {
    case R_MALLOC: rc = cudaMalloc(&p, size); d = (uintptr_t)p; break;
    case R_ASYNC: rc = cudaMallocAsync(&p, size, NULL); d = (uintptr_t)p; break;
    case R_HOST: rc = cudaMallocHost(&p, size); d = (uintptr_t)p; break;
    case D_ALLOC: rc = cuMemAlloc_v2(&d, size); break;
    case D_ASYNC: rc = cuMemAllocAsync(&d, size, NULL); break;
    case D_POOL: rc = cuMemAllocFromPoolAsync(&d, size, g_pool, NULL); break;
    case D_MANAGED: rc = cuMemAllocManaged(&d, size, CU_MEM_ATTACH_GLOBAL); break;
    case D_HOST: rc = cuMemAllocHost_v2(&p, size); d = (uintptr_t)p; break;
    default: {
        CUmemAllocationProp prop;
        memset(&prop, 0, sizeof prop);
        prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
        prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        prop.location.id = 0;
        size = 2 * MiB;
        CUmemGenericAllocationHandle h = 0;
        rc = cuMemCreate(&h, size, &prop, 0);
        if (rc != 0) break;
        rc = cuMemAddressReserve(&d, size, 0, 0, 0);
        if (rc == 0) rc = cuMemMap(d, size, 0, h, 0);
        /* Released while mapped: the memory stays held until the unmap. */
        if (rc == 0) rc = cuMemRelease(h);
        s->handle = h;
        break;
    }
    }
    if (rc != 0) return 1;
    s->ptr = d;
    s->bytes = size;
    s->api = api;
    return 0;
}

static void *churn(void *arg) {
    struct worker *w = arg;
    uint64_t state = 0x9e3779b97f4a7c15ULL * (uint64_t)(w->index + 1);
    for (long i = 0; i < w->iters; i++) {
        struct slot *s = &w->ring[i % w->keep];
        if (s->ptr != 0) w->failures += release(s);
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
    for (int i = 0; !atomic_load(&g_done); i++) {
        void *p = NULL;
        CUdeviceptr d = 0;
        int rc = i % 2 ? cuMemAlloc_v2(&d, (size_t)1 << 40) : cudaMalloc(&p, (size_t)1 << 40);
        if (rc != 0) atomic_fetch_add(&g_ooms, 1);
        usleep(5 * 1000);
    }
    return NULL;
}

int main(int argc, char **argv) {
    long iters = argc > 1 ? strtol(argv[1], NULL, 10) : 20000;
    g_dump = (int (*)(const char *))dlsym(RTLD_DEFAULT, "oomshim_dump");
    if (cuInit(0) != 0 || cuDeviceGetDefaultMemPool(&g_pool, 0) != 0) return 2;
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
            if (s->ptr == 0) continue;
            if (s->api == R_HOST || s->api == D_HOST) {
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
        fprintf(stderr, "rel_drv_churn: %ld CUDA calls failed\n", failures);
        return 1;
    }
    return 0;
}
