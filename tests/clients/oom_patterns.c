/*
 * oom_patterns: the out-of-memory patterns of real programs, against the simulated device, one
 * per mode (argv[1]). Each prints what it did, so runs with and without the shim compare.
 *
 *   cache recover   a caching allocator (like PyTorch's): blocks freed by the program stay in
 *                   its cache; a failed cudaMalloc releases the cache (cudaFree of every cached
 *                   block) and retries the same size on the same thread. Here the retry
 *                   succeeds and the loop goes on to its end.
 *   cache raise     the same, but the cache is too small: the retry fails too and the
 *                   "framework" raises (prints OutOfMemoryError and exits 1).
 *   cache twice     two requests of the same size back to back, as an op's output and the next
 *                   op's (attention scores, then their softmax): the first fails, the cache is
 *                   released and its retry succeeds; the second fails with nothing left to
 *                   release, its retry fails too and the "framework" raises (exits 1).
 *   cache twice-dumped  as `twice`, but the cache is released only once a dump is in
 *                   $OOMSHIM_DIR (at most 5 s; at once without the shim): the first request's
 *                   provisional dump is on disk before it recovers.
 *   two             two distinct failures 3 ms apart on one thread: 256 MiB (caught: the
 *                   program allocates 4 KiB and goes on), then 96 MiB; then the 96 MiB failure
 *                   again after another success (a repeat).
 *   spread          a leak spread over many stacks: each step, `leak_level` recurses 1..24
 *                   frames deep and keeps 1 MiB at the bottom (24 distinct stacks); working
 *                   memory is freed; steps are marked as oomshim's Python hook marks optimizer
 *                   steps (`oomshim_mark_step(1)`).
 *   nofree MARK     each step keeps three blocks and frees nothing (a cache warm in steady
 *                   state); MARK=1 marks steps (`oomshim_mark_step(1)`), MARK=0 marks none.
 *   layers          a training step of 6 layers (a kept 1 MiB activation and a freed 4 MiB
 *                   gradient each) plus a loss and an update, never marked: steps must be
 *                   detected as the whole cycle, not the layer.
 *   load            loading a model too big for the device: a weight and a bias per layer,
 *                   never freed, no steps. Not a leak.
 *   late N          N healthy steps (marked with oomshim_step), then a leak of 64 MiB a step.
 *   static          a static-runtime-style client: the allocation goes through an internal
 *                   function named like static cudart's (`libcudart_static_…`), called from
 *                   `grow_static_buffers`, which leaks until a cudaMalloc fails.
 *   grow            inputs of growing shape: 256 MiB of weights, then each marked step computes
 *                   an activation 32 MiB larger than the last (`forward_activations`), which
 *                   stays live until the next step's replaces it, as a Python variable holds a
 *                   tensor; nothing accumulates. Not a leak.
 *   abort MS        fills the device, then aborts MS milliseconds after the first failure
 *                   (CUDA_CHECK style, after logging).
 *   abort-dumped MS as `abort`, but aborts as soon as a finished dump (`*.json`) is in
 *                   $OOMSHIM_DIR, or after MS milliseconds without one (a program that logs
 *                   for as long as the dump takes, however loaded the machine).
 */
#include "cuda_sim.h"

#include <dirent.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MiB ((size_t)1 << 20)

/* Functions whose names the tests assert: never inlined, and never folded by GCC's identical
 * code folding into a twin with the same body (which would lend them its name). */
#if defined(__GNUC__) && !defined(__clang__)
#define NAMED __attribute__((noinline, noipa))
#else
#define NAMED __attribute__((noinline))
#endif
#define MAX_HELD 65536

static void *g_held[MAX_HELD];
static int g_nheld;

static void hold(void *p) {
    if (g_nheld < MAX_HELD) g_held[g_nheld++] = p;
}

static void sleep_ms(long ms) {
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Allocates 64 MiB blocks (held) until at most `leave` + 64 MiB is free, without ever failing. */
NAMED static void fill_leaving(size_t leave) {
    for (;;) {
        size_t free_b = 0, total = 0;
        if (cudaMemGetInfo(&free_b, &total) != cudaSuccess || free_b < leave + 64 * MiB) return;
        void *p = NULL;
        if (cudaMalloc(&p, 64 * MiB) != cudaSuccess) return;
        hold(p);
    }
}

/* The shim's step marks, as its Python hook calls them (absent without the shim). */
static void mark(int source) {
    void (*f)(int) = (void (*)(int))dlsym(RTLD_DEFAULT, "oomshim_mark_step");
    if (f) f(source);
}
static void program_step(void) {
    void (*f)(void) = (void (*)(void))dlsym(RTLD_DEFAULT, "oomshim_step");
    if (f) f();
}

/* ---------------- cache ---------------- */

#define CACHE_MAX 4096
static void *g_cache[CACHE_MAX];
static int g_ncache;
/* `cache twice-dumped`: a failure waits for a dump on disk before the cache is released. */
static int g_wait_dump;
static int has_dump(const char *dir);

/* Waits (at most `ms`) for a finished dump in $OOMSHIM_DIR; at once without the shim. */
static void wait_for_dump(long ms) {
    if (!dlsym(RTLD_DEFAULT, "oomshim_step")) return;
    const char *dir = getenv("OOMSHIM_DIR");
    for (long waited = 0; waited < ms && !has_dump(dir); waited += 10) sleep_ms(10);
}

NAMED static int cache_release_all(void) {
    int n = g_ncache;
    for (int i = 0; i < g_ncache; i++) cudaFree(g_cache[i]);
    g_ncache = 0;
    return n;
}

/* A caching allocator's malloc: a cached block of the size if there is one, else cudaMalloc;
 * on failure, release the cache and retry once on this thread. */
NAMED static void *cache_malloc(size_t n, int *failures) {
    if (g_ncache > 0 && n == 64 * MiB) return g_cache[--g_ncache];
    void *p = NULL;
    if (cudaMalloc(&p, n) == cudaSuccess) return p;
    (*failures)++;
    if (g_wait_dump) wait_for_dump(5000);
    cache_release_all();
    if (cudaMalloc(&p, n) == cudaSuccess) return p;
    (*failures)++;
    return NULL;
}

NAMED static void cache_free(void *p) {
    if (g_ncache < CACHE_MAX) g_cache[g_ncache++] = p;
    else cudaFree(p);
}

NAMED static int train_with_cache(int recover, int twice) {
    /* Warm the cache: 64 MiB blocks used once and "freed" into the cache. */
    int failures = 0;
    int warm = recover || twice ? 8 : 1;
    void *tmp[8];
    for (int i = 0; i < warm; i++) tmp[i] = cache_malloc(64 * MiB, &failures);
    for (int i = 0; i < warm; i++) cache_free(tmp[i]);
    /* The model: fills the device up to 256 MiB short. */
    fill_leaving(256 * MiB);
    /* A large activation: no room, until the cache is released. */
    void *big = cache_malloc(recover || twice ? 512 * MiB : 768 * MiB, &failures);
    printf("activation %s after %d failure(s)\n", big ? "allocated" : "refused", failures);
    if (big && twice) {
        /* The next op's output, of the same size: the cache was released for the first. */
        failures = 0;
        big = cache_malloc(512 * MiB, &failures);
        printf("next activation %s after %d failure(s)\n", big ? "allocated" : "refused", failures);
    }
    if (!big) {
        printf("OutOfMemoryError\n");
        return 1;
    }
    printf("trained\n");
    return 0;
}

/* ---------------- two ---------------- */

NAMED static int try_alloc(size_t n) {
    void *p = NULL;
    int rc = (int)cudaMalloc(&p, n);
    if (rc == cudaSuccess) hold(p);
    return rc;
}

NAMED static int two_failures(void) {
    /* Leave exactly 80 MiB free: 96 MiB fails, 4 KiB fits. */
    fill_leaving(128 * MiB);
    size_t free_b = 0, total = 0;
    cudaMemGetInfo(&free_b, &total);
    if (free_b > 80 * MiB) try_alloc(free_b - 80 * MiB);
    printf("first %d\n", try_alloc(256 * MiB));
    printf("small %d\n", try_alloc(4096));
    sleep_ms(3);
    for (int i = 0; i < 2; i++) {
        /* The same call twice: the second, after a success in between, repeats the first. */
        printf("96 MiB %d\n", try_alloc(96 * MiB));
        printf("small %d\n", try_alloc(4096));
    }
    return 0;
}

/* ---------------- spread ---------------- */

NAMED static int leak_level(int depth) {
    if (depth > 1) {
        int rc = leak_level(depth - 1);
        __asm__ volatile("" ::: "memory"); /* keep the frame: no tail call */
        return rc;
    }
    void *p = NULL;
    int rc = (int)cudaMalloc(&p, MiB);
    if (rc == cudaSuccess) hold(p);
    return rc;
}

NAMED static int working_memory(size_t n) {
    void *p = NULL;
    int rc = (int)cudaMalloc(&p, n);
    if (rc == cudaSuccess) cudaFree(p);
    return rc;
}

NAMED static int spread_leak(void) {
    for (int step = 1; step < 100000; step++) {
        for (int d = 1; d <= 24; d++) {
            int rc = leak_level(d);
            if (rc != 0) {
                printf("step %d: leak_level failed with %d\n", step, rc);
                return 0;
            }
        }
        if (working_memory(32 * MiB) != 0) {
            printf("step %d: working_memory failed\n", step);
            return 0;
        }
        mark(1);
    }
    return 0;
}

/* ---------------- nofree ---------------- */

NAMED static int keep_step_state(size_t n) {
    void *p = NULL;
    int rc = (int)cudaMalloc(&p, n);
    if (rc == cudaSuccess) hold(p);
    return rc;
}

NAMED static int never_free(int marks) {
    for (int step = 1; step < 100000; step++) {
        for (int k = 0; k < 3; k++) {
            int rc = keep_step_state((16 + 8 * (size_t)k) * MiB);
            if (rc != 0) {
                printf("step %d: keep_step_state failed with %d\n", step, rc);
                return 0;
            }
        }
        if (marks) mark(1);
    }
    return 0;
}

/* ---------------- layers ---------------- */

NAMED static int layer_forward(void) {
    void *p = NULL;
    int rc = (int)cudaMalloc(&p, MiB);
    if (rc == cudaSuccess) hold(p);
    return rc;
}
NAMED static int layer_backward(void) { return working_memory(4 * MiB); }
NAMED static int loss_and_update(void) {
    int rc = working_memory(2 * MiB);
    return rc ? rc : working_memory(3 * MiB);
}

NAMED static int detected_layers(void) {
    for (int step = 1; step < 100000; step++) {
        for (int l = 0; l < 6; l++) {
            int rc = layer_forward();
            if (rc == 0) rc = layer_backward();
            if (rc != 0) {
                printf("step %d: layer %d failed with %d\n", step, l, rc);
                return 0;
            }
        }
        if (loss_and_update() != 0) {
            printf("step %d: update failed\n", step);
            return 0;
        }
    }
    return 0;
}

/* ---------------- load ---------------- */

NAMED static int load_weight(size_t n) {
    void *p = NULL;
    int rc = (int)cudaMalloc(&p, n);
    if (rc == cudaSuccess) hold(p);
    return rc;
}
NAMED static int load_bias(size_t n) {
    void *p = NULL;
    int rc = (int)cudaMalloc(&p, n);
    if (rc == cudaSuccess) hold(p);
    return rc;
}

NAMED static int load_model(void) {
    for (int layer = 0; layer < 100000; layer++) {
        int rc = load_weight(48 * MiB);
        if (rc == 0) rc = load_bias(MiB);
        if (rc != 0) {
            printf("layer %d: loading failed with %d\n", layer, rc);
            return 0;
        }
    }
    return 0;
}

/* ---------------- late ---------------- */

NAMED static int keep_late(void) {
    void *p = NULL;
    int rc = (int)cudaMalloc(&p, 64 * MiB);
    if (rc == cudaSuccess) hold(p);
    return rc;
}

NAMED static int late_leak(int healthy) {
    for (int step = 1; step < 100000; step++) {
        if (working_memory(128 * MiB) != 0) {
            printf("step %d: working memory failed\n", step);
            return 0;
        }
        if (step > healthy && keep_late() != 0) {
            printf("step %d: keep_late failed\n", step);
            return 0;
        }
        program_step();
    }
    return 0;
}

/* ---------------- static ---------------- */

/* Named like static cudart's internal functions: the site must be named by its caller. */
NAMED int libcudart_static_3f2a9c01d8e4b7a6c5d2e1f0a9b8c7d6e5f4a3b2(void **p, size_t n) {
    int rc = (int)cudaMalloc(p, n);
    __asm__ volatile("" ::: "memory");
    return rc;
}

NAMED static int grow_static_buffers(void) {
    for (int i = 0; i < 100000; i++) {
        void *p = NULL;
        int rc = libcudart_static_3f2a9c01d8e4b7a6c5d2e1f0a9b8c7d6e5f4a3b2(&p, 128 * MiB);
        if (rc != 0) {
            printf("buffer %d: failed with %d\n", i, rc);
            return 0;
        }
        hold(p);
    }
    return 0;
}

/* ---------------- grow ---------------- */

NAMED static int forward_activations(void **p, size_t n) { return (int)cudaMalloc(p, n); }

NAMED static int growing_inputs(void) {
    void *weights = NULL;
    if (cudaMalloc(&weights, 256 * MiB) != cudaSuccess) return 1;
    void *out = NULL;
    for (int step = 1; step < 100000; step++) {
        void *next = NULL;
        int rc = forward_activations(&next, (size_t)step * 32 * MiB);
        if (rc != 0) {
            printf("step %d: forward_activations failed with %d\n", step, rc);
            return 0;
        }
        if (working_memory(16 * MiB) != 0) {
            printf("step %d: working_memory failed\n", step);
            return 0;
        }
        if (out) cudaFree(out);
        out = next;
        mark(1);
    }
    return 0;
}

/* ---------------- abort ---------------- */

/* Whether `dir` holds a finished dump (written under a temporary name, then renamed). */
static int has_dump(const char *dir) {
    DIR *d = dir ? opendir(dir) : NULL;
    if (!d) return 0;
    int found = 0;
    struct dirent *e;
    while (!found && (e = readdir(d)) != NULL) {
        size_t n = strlen(e->d_name);
        found = n > 5 && strcmp(e->d_name + n - 5, ".json") == 0;
    }
    closedir(d);
    return found;
}

NAMED static int fill_then_abort(long ms, int until_dumped) {
    int rc;
    while ((rc = try_alloc(256 * MiB)) == cudaSuccess) {
    }
    printf("failed with %d\n", rc);
    fflush(stdout);
    if (until_dumped) {
        const char *dir = getenv("OOMSHIM_DIR");
        for (long waited = 0; waited < ms && !has_dump(dir); waited += 10) sleep_ms(10);
    } else {
        sleep_ms(ms);
    }
    abort();
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "";
    const char *arg = argc > 2 ? argv[2] : "";
    if (!strcmp(mode, "cache")) {
        g_wait_dump = !strcmp(arg, "twice-dumped");
        return train_with_cache(!strcmp(arg, "recover"), !strcmp(arg, "twice") || g_wait_dump);
    }
    if (!strcmp(mode, "two")) return two_failures();
    if (!strcmp(mode, "spread")) return spread_leak();
    if (!strcmp(mode, "nofree")) return never_free(atoi(arg));
    if (!strcmp(mode, "layers")) return detected_layers();
    if (!strcmp(mode, "load")) return load_model();
    if (!strcmp(mode, "late")) return late_leak(atoi(arg));
    if (!strcmp(mode, "static")) return grow_static_buffers();
    if (!strcmp(mode, "grow")) return growing_inputs();
    if (!strcmp(mode, "abort")) return fill_then_abort(atol(arg), 0);
    if (!strcmp(mode, "abort-dumped")) return fill_then_abort(atol(arg), 1);
    fprintf(stderr, "usage: oom_patterns cache recover|raise|twice|twice-dumped | two | spread | nofree 0|1 | layers | load | late N | static | abort MS | abort-dumped MS\n");
    return 2;
}
