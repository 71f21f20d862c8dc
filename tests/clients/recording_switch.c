/*
 * recording_switch: allocations made in one recording mode and freed in another
 * (oomshim_set_recording, found with dlsym), then a dump.
 *
 * Usage: recording_switch [sequence|stress|bad]
 *   sequence - one allocation per mode, each freed in a later, different mode; kept alive at
 *              the end: one buffer of each mode (1, 2, 3, 4 MiB made in all, pass-through,
 *              totals, native). Prints "before <mode before each switch>" lines and
 *              "now <oomshim_recording()>", then dumps with reason "switch-end".
 *   stress   - 4 threads churn cudaMalloc/cudaFree (all freed at the end) while main switches
 *              the mode 2000 times; then dumps with reason "stress-end".
 *   bad      - asks for modes -1 and 5: prints "bad <rc>" for each and "now <mode>".
 *   oom MODE - switches to MODE after one allocation, then asks for more than the device has:
 *              prints "rc <code of that cudaMalloc>" and "queries <n>", the calls asking about
 *              the device (simcuda_device_queries) made while it failed.
 * Exit 0; 1 (with a message on stderr) if a CUDA call fails or the shim is absent.
 */
#define _GNU_SOURCE
#include "cuda_sim.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MIB ((size_t)1 << 20)

static int (*set_recording)(int);
static int (*recording)(void);
static int (*dump)(const char *);

static void *must_alloc(size_t n) {
    void *p = NULL;
    if (cudaMalloc(&p, n) != cudaSuccess) {
        fprintf(stderr, "cudaMalloc(%zu) failed\n", n);
        exit(1);
    }
    return p;
}

static void must_free(void *p) {
    if (cudaFree(p) != cudaSuccess) {
        fprintf(stderr, "cudaFree failed\n");
        exit(1);
    }
}

static void switch_to(int mode) { printf("before %d\n", set_recording(mode)); }

/* Distinct bodies (a store after the call): neither merged by the compiler nor tail calls, so
 * each shows in the stacks of what it allocated. */
static volatile int g_mark;
#define ALLOC_IN(name, mark)                                                                    \
    __attribute__((noinline)) static void *name(size_t n) {                                     \
        void *p = must_alloc(n);                                                                \
        g_mark = mark;                                                                          \
        return p;                                                                               \
    }
ALLOC_IN(alloc_in_all_mode, 1)
ALLOC_IN(alloc_in_pass_through, 2)
ALLOC_IN(alloc_in_totals_mode, 3)
ALLOC_IN(alloc_in_native_mode, 4)

static int sequence(void) {
    /* Starts in the mode OOMSHIM_STACKS gives (all). */
    void *all_freed_later = alloc_in_all_mode(10 * MIB);
    void *all_kept = alloc_in_all_mode(1 * MIB);
    switch_to(0);
    void *pass_freed_later = alloc_in_pass_through(20 * MIB);
    void *pass_kept = alloc_in_pass_through(2 * MIB);
    must_free(all_freed_later); /* recorded in all, freed in pass-through */
    switch_to(1);
    void *totals_freed_later = alloc_in_totals_mode(30 * MIB);
    void *totals_kept = alloc_in_totals_mode(3 * MIB);
    must_free(pass_freed_later); /* passed through, freed in totals */
    switch_to(2);
    void *native_kept = alloc_in_native_mode(4 * MIB);
    must_free(totals_freed_later); /* recorded without a stack, freed in native */
    switch_to(3);
    printf("now %d\n", recording());
    (void)all_kept, (void)pass_kept, (void)totals_kept, (void)native_kept;
    return dump("switch-end") == 0 ? 0 : 1;
}

static volatile int g_stop;

static void *churn(void *arg) {
    size_t base = (size_t)(long)arg + 1;
    void *ring[8] = {0};
    for (unsigned i = 0; !g_stop || i < 4000; i++) {
        unsigned k = i % 8;
        if (ring[k]) must_free(ring[k]);
        ring[k] = must_alloc(base * 4096 + (i % 13) * 256);
    }
    for (int k = 0; k < 8; k++)
        if (ring[k]) must_free(ring[k]);
    return NULL;
}

static int stress(void) {
    pthread_t t[4];
    for (long i = 0; i < 4; i++) pthread_create(&t[i], NULL, churn, (void *)i);
    for (int i = 0; i < 2000; i++) set_recording(i % 4);
    g_stop = 1;
    for (int i = 0; i < 4; i++) pthread_join(t[i], NULL);
    set_recording(3);
    return dump("stress-end") == 0 ? 0 : 1;
}

static int oom_in(int mode) {
    must_free(must_alloc(MIB)); /* the shim started and knows the device */
    switch_to(mode);
    unsigned long before = simcuda_device_queries();
    void *p = NULL;
    cudaError_t rc = cudaMalloc(&p, (size_t)1 << 50);
    unsigned long after = simcuda_device_queries();
    printf("rc %d\nqueries %lu\n", (int)rc, after - before);
    return 0;
}

int main(int argc, char **argv) {
    set_recording = (int (*)(int))dlsym(RTLD_DEFAULT, "oomshim_set_recording");
    recording = (int (*)(void))dlsym(RTLD_DEFAULT, "oomshim_recording");
    dump = (int (*)(const char *))dlsym(RTLD_DEFAULT, "oomshim_dump");
    if (!set_recording || !recording || !dump) {
        fprintf(stderr, "oomshim is not in this process\n");
        return 1;
    }
    const char *what = argc > 1 ? argv[1] : "sequence";
    if (strcmp(what, "stress") == 0) return stress();
    if (strcmp(what, "oom") == 0 && argc > 2) return oom_in(atoi(argv[2]));
    if (strcmp(what, "bad") == 0) {
        printf("bad %d\n", set_recording(-1));
        printf("bad %d\n", set_recording(5));
        printf("now %d\n", recording());
        return 0;
    }
    return sequence();
}
