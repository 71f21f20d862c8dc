/*
 * rel_reenter: hooks called at awkward moments. One mode per run:
 *
 *   tls      8 threads each allocate, then exit; a pthread_key destructor frees their last
 *            allocation, allocates a new one (kept) and frees a third, at thread exit, after
 *            the C++-style thread_local destructors (the shim's own thread-locals among them).
 *   atexit   an atexit handler registered before the first CUDA call, so it runs after every
 *            handler the shim registers (the exit dump, the flush of pending OOM dumps): it
 *            allocates, frees, and makes a 1 TiB cudaMalloc fail.
 *   signal   a SIGALRM handler (every 200 us) calls hooked driver functions (an out-of-memory
 *            cuMemAlloc_v2, a free of an unknown pointer, a NULL out-parameter) while the
 *            interrupted thread allocates and frees through the runtime's hooks. The handler
 *            uses only calls that neither the simulation nor the shim's pass-through path
 *            malloc in, so a bare run cannot deadlock in malloc either (see RELIABILITY.md).
 *   initrace 32 threads released at once by a barrier make the process's first hooked calls
 *            (cudaMalloc, cuMemAlloc_v2, cudaMallocHost), while the shim starts.
 *
 * Output (stdout): deterministic lines, then "held_bytes N", "held_count N", "pinned_bytes N",
 * "pinned_count N" (what the program holds by its own accounting, requested bytes) after the
 * mode's work. The dump "reenter-end" is asked for on stderr ("dump_rc R") where the shim is
 * loaded. Exit status 0 unless a call gave an unexpected result.
 */
#define _GNU_SOURCE
#include "cuda_driver_sim.h"
#include "cuda_sim.h"

#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <unistd.h>

static atomic_size_t g_held, g_count, g_pinned, g_pinned_count;
static atomic_int g_bad;

static void check(int ok, const char *what) {
    if (!ok) {
        printf("UNEXPECTED %s\n", what);
        atomic_fetch_add(&g_bad, 1);
    }
}

static int ask_dump(const char *reason) {
    int (*dump)(const char *) = (int (*)(const char *))dlsym(RTLD_DEFAULT, "oomshim_dump");
    if (dump == NULL) return -100;
    int rc = dump(reason);
    fprintf(stderr, "dump_rc %d\n", rc);
    return rc;
}

static void print_held(void) {
    printf("held_bytes %zu\nheld_count %zu\npinned_bytes %zu\npinned_count %zu\n",
           atomic_load(&g_held), atomic_load(&g_count), atomic_load(&g_pinned),
           atomic_load(&g_pinned_count));
    fflush(stdout);
}

/* ---------------- tls ---------------- */

static pthread_key_t g_key;

static void tls_destructor(void *v) {
    /* Runs at thread exit, after the thread_local destructors. */
    cudaError_t rc = cudaFree(v);
    check(rc == cudaSuccess, "cudaFree in a TLS destructor");
    if (rc == cudaSuccess) {
        atomic_fetch_sub(&g_held, 4096);
        atomic_fetch_sub(&g_count, 1);
    }
    void *keep = NULL, *tmp = NULL;
    rc = cudaMalloc(&keep, 8192);
    check(rc == cudaSuccess, "cudaMalloc in a TLS destructor");
    if (rc == cudaSuccess) {
        atomic_fetch_add(&g_held, 8192);
        atomic_fetch_add(&g_count, 1);
    }
    check(cudaMalloc(&tmp, 512) == cudaSuccess && cudaFree(tmp) == cudaSuccess,
          "allocate and free in a TLS destructor");
}

static void *tls_thread(void *arg) {
    (void)arg;
    void *p = NULL;
    check(cudaMalloc(&p, 4096) == cudaSuccess, "cudaMalloc in a thread");
    atomic_fetch_add(&g_held, 4096);
    atomic_fetch_add(&g_count, 1);
    pthread_setspecific(g_key, p);
    return NULL;
}

static int mode_tls(void) {
    pthread_key_create(&g_key, tls_destructor);
    for (int round = 0; round < 4; round++) {
        pthread_t t[8];
        for (int i = 0; i < 8; i++) pthread_create(&t[i], NULL, tls_thread, NULL);
        for (int i = 0; i < 8; i++) pthread_join(t[i], NULL);
    }
    printf("tls: 32 threads exited\n");
    print_held();
    ask_dump("reenter-end");
    return 0;
}

/* ---------------- atexit ---------------- */

static void late_exit_handler(void) {
    void *p = NULL, *q = NULL;
    cudaError_t a = cudaMalloc(&p, 1 << 20);
    cudaError_t b = cudaFree(p);
    cudaError_t c = cudaMalloc(&q, (size_t)1 << 40);
    cudaError_t d = cudaMallocHost(&p, 4096);
    cudaError_t e = cudaFreeHost(p);
    printf("atexit handler: malloc %d free %d oom %d host %d freehost %d\n", a, b, c, d, e);
    fflush(stdout);
}

static int mode_atexit(void) {
    atexit(late_exit_handler); /* before any CUDA call: runs after the shim's handlers */
    void *p = NULL;
    check(cudaMalloc(&p, 3 << 20) == cudaSuccess, "cudaMalloc");
    void *q = NULL;
    printf("oom before exit: %d\n", cudaMalloc(&q, (size_t)1 << 41)); /* a pending OOM dump */
    atomic_fetch_add(&g_held, 3 << 20);
    atomic_fetch_add(&g_count, 1);
    print_held();
    return 0;
}

/* ---------------- signal ---------------- */

static volatile sig_atomic_t g_sig_runs, g_sig_bad;

static void on_alarm(int sig) {
    (void)sig;
    int saved = errno;
    CUdeviceptr d = 1;
    /* Out of memory: the driver fails before allocating anything. */
    if (cuMemAlloc_v2(&d, (size_t)1 << 50) != CUDA_ERROR_OUT_OF_MEMORY || d != 0) g_sig_bad++;
    /* A free of a pointer nobody allocated: invalid, nothing is freed. */
    if (cuMemFree_v2(0x1234000) != CUDA_ERROR_INVALID_VALUE) g_sig_bad++;
    /* A NULL out-parameter. */
    if (cuMemAlloc_v2(NULL, 16) != CUDA_ERROR_INVALID_VALUE) g_sig_bad++;
    g_sig_runs++;
    errno = saved;
}

static int mode_signal(void) {
    cuInit(0);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_alarm;
    sa.sa_flags = SA_RESTART;
    sigaction(SIGALRM, &sa, NULL);
    struct itimerval it = {{0, 200}, {0, 200}};
    setitimer(ITIMER_REAL, &it, NULL);
    void *ring[8] = {0};
    for (long i = 0; i < 400000 || g_sig_runs < 50; i++) {
        void **slot = &ring[i % 8];
        if (*slot != NULL && cudaFree(*slot) != cudaSuccess) atomic_fetch_add(&g_bad, 1);
        *slot = NULL;
        if (cudaMalloc(slot, 512 + (size_t)(i % 7) * 512) != cudaSuccess) atomic_fetch_add(&g_bad, 1);
        if (i > 50000000) break;
    }
    struct itimerval off = {{0, 0}, {0, 0}};
    setitimer(ITIMER_REAL, &off, NULL);
    /* Free everything: the end state is then exact whatever the signals interrupted. */
    for (int i = 0; i < 8; i++)
        if (ring[i] != NULL && cudaFree(ring[i]) != cudaSuccess) atomic_fetch_add(&g_bad, 1);
    printf("signal: handler ran: %s, handler results as documented: %s\n",
           g_sig_runs > 0 ? "yes" : "no", g_sig_bad == 0 ? "yes" : "no");
    fprintf(stderr, "signal handler runs %d\n", (int)g_sig_runs);
    check(g_sig_bad == 0, "handler results");
    print_held();
    ask_dump("reenter-end");
    return 0;
}

/* ---------------- initrace ---------------- */

#define RACERS 32
static pthread_barrier_t g_barrier;

static void *racer(void *arg) {
    long i = (long)arg;
    pthread_barrier_wait(&g_barrier);
    void *p = NULL, *h = NULL;
    CUdeviceptr d = 0;
    size_t n = 4096 * (size_t)(i + 1);
    int kind = (int)(i % 3);
    if (kind == 0) {
        check(cudaMalloc(&p, n) == cudaSuccess, "racing cudaMalloc");
        atomic_fetch_add(&g_held, n);
        atomic_fetch_add(&g_count, 1);
    } else if (kind == 1) {
        check(cuMemAlloc_v2(&d, n) == CUDA_SUCCESS, "racing cuMemAlloc_v2");
        atomic_fetch_add(&g_held, n);
        atomic_fetch_add(&g_count, 1);
    } else {
        check(cudaMallocHost(&h, n) == cudaSuccess, "racing cudaMallocHost");
        atomic_fetch_add(&g_pinned, n);
        atomic_fetch_add(&g_pinned_count, 1);
    }
    /* And a second call each, with an allocation and a free. */
    void *t = NULL;
    check(cudaMalloc(&t, 512) == cudaSuccess && cudaFree(t) == cudaSuccess, "racing pair");
    return NULL;
}

static int mode_initrace(void) {
    cuInit(0);
    pthread_barrier_init(&g_barrier, NULL, RACERS);
    pthread_t t[RACERS];
    for (long i = 0; i < RACERS; i++) pthread_create(&t[i], NULL, racer, (void *)i);
    for (int i = 0; i < RACERS; i++) pthread_join(t[i], NULL);
    printf("initrace: %d threads\n", RACERS);
    print_held();
    ask_dump("reenter-end");
    return 0;
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "";
    int rc;
    if (!strcmp(mode, "tls")) rc = mode_tls();
    else if (!strcmp(mode, "atexit")) rc = mode_atexit();
    else if (!strcmp(mode, "signal")) rc = mode_signal();
    else if (!strcmp(mode, "initrace")) rc = mode_initrace();
    else {
        fprintf(stderr, "usage: rel_reenter tls|atexit|signal|initrace\n");
        return 2;
    }
    fflush(stdout);
    return rc != 0 ? rc : atomic_load(&g_bad) != 0;
}
