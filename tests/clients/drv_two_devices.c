/*
 * drv_two_devices.c — two devices failing close together (run with SIMCUDA_DEVICES=2). One thread
 * per device, each on its device's primary context (cuDevicePrimaryCtxRetain + cuCtxSetCurrent):
 *
 *   1. cuMemAllocAsync of (device + 1) GiB from its device's default pool, freed again: the pool
 *      keeps it cached, so each device has its own pool figures;
 *   2. both threads meet, then cuMemAlloc_v2 chunks of (512 + 256 * device) MiB in
 *      leak_on_device() until out of memory;
 *   3. both threads meet again and ask for an on-demand dump at the same moment
 *      (oomshim_dump("device-D"), when the shim is loaded).
 *
 * Prints, in device order: "device D: leaked N x M MiB, then rc=R".
 */
#define _GNU_SOURCE
#include "cuda_driver_sim.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>

#define MiB ((size_t)1 << 20)
#define GiB ((size_t)1 << 30)
#define MAX_CHUNKS 64

static pthread_barrier_t g_meet;

struct worker {
    int device;
    int leaked;
    size_t chunk;
    CUresult rc;
};

__attribute__((noinline)) static CUresult leak_on_device(CUdeviceptr *p, size_t bytes) {
    return cuMemAlloc_v2(p, bytes);
}

static void *run(void *arg) {
    struct worker *w = arg;
    CUcontext ctx;
    w->rc = cuDevicePrimaryCtxRetain(&ctx, w->device);
    if (w->rc == CUDA_SUCCESS) w->rc = cuCtxSetCurrent(ctx);
    CUdeviceptr cached = 0;
    if (w->rc == CUDA_SUCCESS)
        w->rc = cuMemAllocAsync(&cached, (size_t)(w->device + 1) * GiB, (CUstream)0);
    if (w->rc == CUDA_SUCCESS) w->rc = cuMemFreeAsync(cached, (CUstream)0);
    pthread_barrier_wait(&g_meet);
    CUdeviceptr held[MAX_CHUNKS];
    w->chunk = 512 * MiB + (size_t)w->device * 256 * MiB;
    if (w->rc == CUDA_SUCCESS) {
        while (w->leaked < MAX_CHUNKS &&
               (w->rc = leak_on_device(&held[w->leaked], w->chunk)) == CUDA_SUCCESS)
            w->leaked++;
    }
    pthread_barrier_wait(&g_meet);
    int (*dump)(const char *) = (int (*)(const char *))dlsym(RTLD_DEFAULT, "oomshim_dump");
    if (dump != NULL) {
        char reason[32];
        snprintf(reason, sizeof reason, "device-%d", w->device);
        dump(reason);
    }
    return NULL;
}

int main(void) {
    if (cuInit(0) != CUDA_SUCCESS) return 3;
    pthread_barrier_init(&g_meet, NULL, 2);
    struct worker w[2] = {{.device = 0}, {.device = 1}};
    pthread_t t[2];
    for (int i = 0; i < 2; i++)
        if (pthread_create(&t[i], NULL, run, &w[i]) != 0) return 3;
    for (int i = 0; i < 2; i++) pthread_join(t[i], NULL);
    for (int i = 0; i < 2; i++)
        printf("device %d: leaked %d x %zu MiB, then rc=%d\n", w[i].device, w[i].leaked,
               w[i].chunk / MiB, (int)w[i].rc);
    return 0;
}
