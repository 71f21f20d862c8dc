// GPU check: cost of one cudaMalloc(512 B) + cudaFree pair, median over batches. Run with and
// without LD_PRELOAD=liboomshim.so in the same script to get the shim's added cost.
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e9 + t.tv_nsec;
}

static int cmp(const void* a, const void* b) {
    double x = *(const double*)a, y = *(const double*)b;
    return x < y ? -1 : x > y;
}

// n allocations timed together, then their n frees timed together.
__attribute__((noinline)) int timed_split(int n, void** ptrs, double* alloc_ns, double* free_ns) {
    double t0 = now_ns();
    for (int i = 0; i < n; i++)
        if (cudaMalloc(&ptrs[i], 512) != cudaSuccess) return 1;
    double t1 = now_ns();
    for (int i = 0; i < n; i++)
        if (cudaFree(ptrs[i]) != cudaSuccess) return 1;
    *alloc_ns = (t1 - t0) / n;
    *free_ns = (now_ns() - t1) / n;
    return 0;
}

__attribute__((noinline)) int timed_batch(int n, double* out) {
    double t0 = now_ns();
    for (int i = 0; i < n; i++) {
        void* p = NULL;
        if (cudaMalloc(&p, 512) != cudaSuccess) return 1;
        if (cudaFree(p) != cudaSuccess) return 1;
    }
    *out = (now_ns() - t0) / n;
    return 0;
}

int main(int argc, char** argv) {
    int batches = argc > 1 ? atoi(argv[1]) : 31, per = argc > 2 ? atoi(argv[2]) : 500;
    double* r = (double*)calloc(batches, sizeof(double));
    cudaFree(0);  // create the context outside the timing
    double warm;
    if (timed_batch(per, &warm)) return 1;
    for (int b = 0; b < batches; b++)
        if (timed_batch(per, &r[b])) return 1;
    qsort(r, batches, sizeof(double), cmp);
    printf("pair_ns_median %.1f\n", r[batches / 2]);
    void** ptrs = (void**)calloc(per, sizeof(void*));
    double* a = (double*)calloc(batches, sizeof(double));
    double* f = (double*)calloc(batches, sizeof(double));
    for (int b = 0; b < batches; b++)
        if (timed_split(per, ptrs, &a[b], &f[b])) return 1;
    qsort(a, batches, sizeof(double), cmp);
    qsort(f, batches, sizeof(double), cmp);
    printf("malloc_ns_median %.1f\n", a[batches / 2]);
    printf("free_ns_median %.1f\n", f[batches / 2]);
    return 0;
}
