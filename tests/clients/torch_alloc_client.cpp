// Plays PyTorch's CUDAPluggableAllocator against liboomshim.so's allocator mode: loads the
// library the way ctypes.CDLL does (dlopen RTLD_LOCAL, symbols by name), then calls
// alloc(size, device, stream) / free(ptr, size, device, stream) and the optional hooks as torch
// does, catching the C++ exception an unservable request raises (torch's binding layer turns it
// into a Python exception).
//
// usage: torch_alloc_client LIB SCENARIO
//   leak           256 MiB per "step" kept in a list until the allocation fails
//   fragmentation  N x 1 GiB cached, each split by a 600 MiB tensor, then 2 GiB
//   record_stream  a block used on a side stream is not reused before that stream's work ends
//   capture        blocks of a graph capture are never reused after the capture
//   stats          memory_stats after a known sequence
//   churn          many sizes on 4 threads, everything freed, then empty_cache
//   cuda_error     a segment's cudaMalloc fails with an error other than out-of-memory
//   bench          ns per alloc+free pair of 4 KiB on a warm cache
//   fraction       a 0.25 memory-fraction cap (2 GiB of 8), 64 MiB kept, then 2000 MiB

#include "cuda_sim.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <exception>
#include <vector>

typedef void *(*alloc_fn)(size_t, int, cudaStream_t);
typedef void (*free_fn)(void *, size_t, int, cudaStream_t);
typedef void (*record_stream_fn)(void *, cudaStream_t);
typedef void (*empty_cache_fn)(void);
typedef size_t (*json_fn)(int, char *, size_t);
typedef void (*step_fn)(void);

static alloc_fn t_alloc;
static free_fn t_free;
static record_stream_fn t_record_stream;
static empty_cache_fn t_empty_cache;
static json_fn t_stats, t_free_blocks;
static step_fn t_step;

static const size_t MiB = 1024 * 1024;
static const size_t GiB = 1024 * MiB;

static void *need(void *h, const char *name) {
    void *p = dlsym(h, name);
    if (p == NULL) {
        fprintf(stderr, "missing %s: %s\n", name, dlerror());
        exit(2);
    }
    return p;
}

static void print_json(const char *what, json_fn fn) {
    static char buf[1 << 16];
    size_t n = fn(0, buf, sizeof buf);
    if (n >= sizeof buf) {
        fprintf(stderr, "%s too long\n", what);
        exit(2);
    }
    printf("%s %s\n", what, buf);
}

// A recognisable frame for the holders: the "training step" that keeps its activations.
__attribute__((noinline)) static void *keep_activations(size_t bytes) {
    return t_alloc(bytes, 0, NULL);
}

static int leak(void) {
    std::vector<void *> kept;
    for (int step = 0; step < 1000; step++) {
        try {
            void *p = keep_activations(256 * MiB);
            if (p == NULL) {
                printf("NULL at step %d\n", step);
                return 1;
            }
            kept.push_back(p);
            t_step();
        } catch (const std::exception &e) {
            printf("caught at step %d: %s\n", step, e.what());
            // The program goes on after catching: freeing works and memory is usable again.
            for (void *p : kept) t_free(p, 256 * MiB, 0, NULL);
            void *again = keep_activations(256 * MiB);
            printf("after free: %s\n", again ? "ok" : "NULL");
            t_free(again, 256 * MiB, 0, NULL);
            print_json("stats", t_stats);
            return 0;
        }
    }
    printf("never failed\n");
    return 1;
}

__attribute__((noinline)) static void *split_segment(size_t bytes) { return t_alloc(bytes, 0, NULL); }

static int fragmentation(int segments) {
    std::vector<void *> big, small;
    for (int i = 0; i < segments; i++) big.push_back(t_alloc(GiB, 0, NULL));
    for (void *p : big) t_free(p, GiB, 0, NULL);
    for (int i = 0; i < segments; i++) small.push_back(split_segment(600 * MiB));
    print_json("free_blocks", t_free_blocks);
    try {
        void *p = t_alloc(2 * GiB, 0, NULL);
        printf("2 GiB succeeded: %p\n", p);
        return 1;
    } catch (const std::exception &e) {
        printf("caught: %s\n", e.what());
    }
    for (void *p : small) t_free(p, 600 * MiB, 0, NULL);
    return 0;
}

static int record_stream(void) {
    cudaStream_t side;
    if (cudaStreamCreate(&side) != cudaSuccess) return 2;
    void *a = t_alloc(4 * MiB, 0, NULL);
    t_record_stream(a, side);
    simcuda_stream_launch(side);  // a kernel on the side stream still reads `a`
    t_free(a, 4 * MiB, 0, NULL);
    void *b = t_alloc(4 * MiB, 0, NULL);
    printf("reused while side stream busy: %s\n", a == b ? "yes" : "no");
    cudaStreamSynchronize(side);
    void *c = t_alloc(4 * MiB, 0, NULL);
    printf("reused after side stream done: %s\n", a == c ? "yes" : "no");
    t_free(b, 4 * MiB, 0, NULL);
    t_free(c, 4 * MiB, 0, NULL);
    printf("last error: %d\n", (int)cudaGetLastError());
    return 0;
}

static int capture(void) {
    cudaStream_t s;
    if (cudaStreamCreate(&s) != cudaSuccess) return 2;
    if (cudaStreamBeginCapture(s, 0) != cudaSuccess) return 2;
    void *g = t_alloc(64 * MiB, 0, s);  // a new segment: cudaMalloc during capture
    t_free(g, 64 * MiB, 0, s);
    void *g2 = t_alloc(64 * MiB, 0, s);  // same capture: may reuse
    printf("reused within capture: %s\n", g == g2 ? "yes" : "no");
    t_free(g2, 64 * MiB, 0, s);
    cudaGraph_t graph;
    int rc = cudaStreamEndCapture(s, &graph);
    printf("capture ended: %d\n", rc);
    void *after = t_alloc(64 * MiB, 0, s);
    printf("captured block reused after capture: %s\n", (after == g || after == g2) ? "yes" : "no");
    t_free(after, 64 * MiB, 0, s);
    printf("last error: %d\n", (int)cudaGetLastError());
    return 0;
}

static int stats(void) {
    void *a = t_alloc(1000, 0, NULL);        // small pool: 1024 B block in a 2 MiB segment
    void *b = t_alloc(5 * MiB, 0, NULL);     // large pool: 20 MiB segment
    void *c = t_alloc(100 * MiB, 0, NULL);   // large pool: own 100 MiB segment
    print_json("stats", t_stats);
    t_free(a, 1000, 0, NULL);
    t_free(b, 5 * MiB, 0, NULL);
    t_free(c, 100 * MiB, 0, NULL);
    print_json("after_free", t_stats);
    t_empty_cache();
    print_json("after_empty", t_stats);
    return 0;
}

static int cuda_error(void) {
    simcuda_inject_error(cudaErrorUnknown, 1);  // the next segment's cudaMalloc fails
    try {
        void *p = t_alloc(64 * MiB, 0, NULL);
        printf("no error: %p\n", p);
        return 1;
    } catch (const std::exception &e) {
        printf("caught: %s\n", e.what());
    }
    void *p = t_alloc(64 * MiB, 0, NULL);
    printf("next allocation: %s\n", p ? "ok" : "NULL");
    t_free(p, 64 * MiB, 0, NULL);
    print_json("stats", t_stats);
    return 0;
}

// ns per alloc+free pair of 4 KiB on a warm cache (what torch.empty + del costs oomshim).
static int bench(void) {
    for (int i = 0; i < 10000; i++) t_free(t_alloc(4096, 0, NULL), 4096, 0, NULL);
    struct timespec a, b;
    const int n = 1000000;
    clock_gettime(CLOCK_MONOTONIC, &a);
    for (int i = 0; i < n; i++) t_free(t_alloc(4096, 0, NULL), 4096, 0, NULL);
    clock_gettime(CLOCK_MONOTONIC, &b);
    printf("pair_ns %.1f\n", ((b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec)) / n);
    return 0;
}

static void *churn_thread(void *arg) {
    unsigned seed = (unsigned)(uintptr_t)arg;
    std::vector<std::pair<void *, size_t>> live;
    for (int i = 0; i < 20000; i++) {
        seed = seed * 1103515245u + 12345u;
        size_t size = (size_t)1 << (9 + (seed >> 16) % 16);  // 512 B .. 16 MiB
        if (live.size() < 64 && (seed & 1)) {
            live.push_back({t_alloc(size, 0, NULL), size});
        } else if (!live.empty()) {
            auto e = live.back();
            live.pop_back();
            t_free(e.first, e.second, 0, NULL);
        }
    }
    for (auto &e : live) t_free(e.first, e.second, 0, NULL);
    return NULL;
}

static int churn(void) {
    pthread_t th[4];
    for (int i = 0; i < 4; i++) pthread_create(&th[i], NULL, churn_thread, (void *)(uintptr_t)(i + 1));
    for (int i = 0; i < 4; i++) pthread_join(th[i], NULL);
    print_json("after_churn", t_stats);
    t_empty_cache();
    print_json("after_empty", t_stats);
    printf("sim used: %zu\n", simcuda_used_bytes(0));
    return 0;
}

typedef void (*fraction_fn)(double, int);
static fraction_fn t_fraction;

// torch.cuda.set_per_process_memory_fraction(0.25): the device is mostly free, yet a request
// within the device but over the cap fails.
static int fraction(void) {
    t_fraction(0.25, 0);
    void *kept = keep_activations(64 * MiB);
    try {
        void *p = t_alloc(2000 * MiB, 0, NULL);
        printf("over the cap succeeded: %p\n", p);
        return 1;
    } catch (const std::exception &e) {
        printf("caught: %s\n", e.what());
    }
    t_free(kept, 64 * MiB, 0, NULL);
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s LIB SCENARIO\n", argv[0]);
        return 2;
    }
    void *h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (h == NULL) {
        fprintf(stderr, "dlopen: %s\n", dlerror());
        return 2;
    }
    t_alloc = (alloc_fn)need(h, "oomshim_torch_alloc");
    t_free = (free_fn)need(h, "oomshim_torch_free");
    t_record_stream = (record_stream_fn)need(h, "oomshim_torch_record_stream");
    t_empty_cache = (empty_cache_fn)need(h, "oomshim_torch_empty_cache");
    t_stats = (json_fn)need(h, "oomshim_torch_memory_stats");
    t_free_blocks = (json_fn)need(h, "oomshim_torch_free_blocks");
    t_step = (step_fn)need(h, "oomshim_step");
    t_fraction = (fraction_fn)need(h, "oomshim_torch_set_memory_fraction");
    // torch initialises CUDA before its first allocation.
    int dev = 0;
    cudaSetDevice(0);
    cudaGetDevice(&dev);
    const char *s = argv[2];
    int rc;
    if (!strcmp(s, "leak")) rc = leak();
    else if (!strcmp(s, "fragmentation")) rc = fragmentation(argc > 3 ? atoi(argv[3]) : 6);
    else if (!strcmp(s, "record_stream")) rc = record_stream();
    else if (!strcmp(s, "capture")) rc = capture();
    else if (!strcmp(s, "stats")) rc = stats();
    else if (!strcmp(s, "churn")) rc = churn();
    else if (!strcmp(s, "cuda_error")) rc = cuda_error();
    else if (!strcmp(s, "bench")) rc = bench();
    else if (!strcmp(s, "fraction")) rc = fraction();
    else {
        fprintf(stderr, "unknown scenario %s\n", s);
        rc = 2;
    }
    fflush(stdout);
    return rc;
}
