/*
 * rel_fork: fork() from a multithreaded CUDA program while its other threads allocate.
 *
 * 8 worker threads allocate and free small buffers (cudaMalloc/cudaFree, cudaMallocAsync/
 * cudaFreeAsync) in a loop. Meanwhile main first runs out of memory once itself (so the shim has
 * a burst open when the children are forked), then forks, in turn:
 *   - LOADERS children that only dlopen/dlsym, as PyTorch DataLoader workers do, and _exit(0);
 *   - FILLERS children that allocate 64 MiB buffers in `child_fill` until cudaMalloc fails,
 *     print "child_fill PID N" and exit (the shim, if loaded, writes the OOM dump at exit);
 *   - EXECS children that exec this program as "rel_fork exec-child", which allocates three
 *     buffers, asks the shim for a dump ("exec-child") and prints "exec_child PID dump_rc RC".
 *   - LOCKERS children that start a thread that allocates, run a VMM cycle, allocate and free
 *     once, and _exit(0): each meets, in the child, every lock the parent's busy threads take.
 * Besides the workers, three threads keep the shim's other locks busy while main forks: one
 * starts short-lived threads that each allocate once (the thread-name cache), one makes 1 TiB
 * cudaMalloc calls fail (the OOM tracker, the device-name cache), one cycles the driver's VMM
 * calls (the VMM state). A filler child first does the same once each (a new thread that
 * allocates, a VMM cycle) before it fills the device.
 * Every child arms alarm(30) (REL_FORK_ALARM seconds, when set: the test scales it to how fast
 * the machine is now): a child that deadlocks dies of SIGALRM and main reports it.
 * Main prints "forks_ok N" and exits 0 when every child exited 0.
 *
 * Usage: rel_fork [LOADERS FILLERS EXECS [LOCKERS]]   (default 40 3 2 20)
 */
#define _GNU_SOURCE
#include "cuda_driver_sim.h"
#include "cuda_sim.h"

#include <dlfcn.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define WORKERS 8
#define KEEP 4

static atomic_int g_stop;
static atomic_long g_ops;

static void *worker(void *arg) {
    uintptr_t index = (uintptr_t)arg;
    uint64_t state = 0x9e3779b97f4a7c15ULL * (index + 1);
    void *ring[KEEP] = {0};
    int async[KEEP] = {0};
    long i = 0;
    while (!atomic_load_explicit(&g_stop, memory_order_relaxed)) {
        int k = (int)(i++ % KEEP);
        if (ring[k] != NULL) {
            if (async[k]) cudaFreeAsync(ring[k], NULL);
            else cudaFree(ring[k]);
            ring[k] = NULL;
        }
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        size_t size = (size_t)4096 << (state % 8);
        async[k] = (int)((state >> 32) & 1);
        cudaError_t rc = async[k] ? cudaMallocAsync(&ring[k], size, NULL) : cudaMalloc(&ring[k], size);
        if (rc != cudaSuccess) ring[k] = NULL;
        atomic_fetch_add_explicit(&g_ops, 1, memory_order_relaxed);
    }
    for (int k = 0; k < KEEP; k++)
        if (ring[k] != NULL) cudaFree(ring[k]);
    return NULL;
}

static void *one_alloc(void *arg) {
    (void)arg;
    void *p = NULL;
    if (cudaMalloc(&p, 4096) == cudaSuccess) cudaFree(p);
    return NULL;
}

/* A new thread whose first allocation notes its name. */
static int new_thread_allocates(void) {
    pthread_t t;
    if (pthread_create(&t, NULL, one_alloc, NULL) != 0) return 1;
    return pthread_join(t, NULL);
}

/* One VMM cycle: create, reserve, map, release while mapped, unmap, free the range. */
static int vmm_cycle(void) {
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    CUmemGenericAllocationHandle h = 0;
    CUdeviceptr va = 0;
    size_t size = (size_t)2 << 20;
    if (cuMemCreate(&h, size, &prop, 0) != CUDA_SUCCESS) return 1;
    if (cuMemAddressReserve(&va, size, 0, 0, 0) != CUDA_SUCCESS) return 2;
    if (cuMemMap(va, size, 0, h, 0) != CUDA_SUCCESS) return 3;
    if (cuMemRelease(h) != CUDA_SUCCESS) return 4;
    if (cuMemUnmap(va, size) != CUDA_SUCCESS) return 5;
    return cuMemAddressFree(va, size) != CUDA_SUCCESS ? 6 : 0;
}

static void *namer(void *arg) {
    (void)arg;
    while (!atomic_load(&g_stop)) new_thread_allocates();
    return NULL;
}

static void *oomer(void *arg) {
    (void)arg;
    while (!atomic_load(&g_stop)) {
        void *p = NULL;
        cudaMalloc(&p, (size_t)1 << 40);
        usleep(200);
    }
    return NULL;
}

static atomic_int g_vmm_failed;

static void *vmmer(void *arg) {
    (void)arg;
    while (!atomic_load(&g_stop))
        if (vmm_cycle() != 0) atomic_fetch_add(&g_vmm_failed, 1);
    return NULL;
}

/* What a DataLoader worker does: load libraries, look symbols up, never touch CUDA. */
__attribute__((noinline)) static int loader_child(void) {
    void *h = dlopen("libm.so.6", RTLD_NOW | RTLD_LOCAL);
    if (h == NULL) return 1;
    if (dlsym(h, "cos") == NULL) return 2;
    if (dlsym(RTLD_DEFAULT, "malloc") == NULL) return 3;
    if (dlsym(RTLD_NEXT, "free") == NULL) return 4;
    (void)dlsym(RTLD_DEFAULT, "oomshim_dump");
    dlclose(h);
    void *p = malloc(1 << 20);
    memset(p, 1, 1 << 20);
    free(p);
    return 0;
}

/* Allocates until the simulated device is full; returns how many 64 MiB buffers it got. */
__attribute__((noinline)) static int child_fill(void) {
    int n = 0;
    for (;;) {
        void *p = NULL;
        if (cudaMalloc(&p, (size_t)64 << 20) != cudaSuccess) break;
        n++;
    }
    return n;
}

static int exec_child(void) {
    void *bufs[3];
    for (int i = 0; i < 3; i++)
        if (cudaMalloc(&bufs[i], (size_t)(i + 1) << 20) != cudaSuccess) return 1;
    int (*dump)(const char *) = (int (*)(const char *))dlsym(RTLD_DEFAULT, "oomshim_dump");
    printf("exec_child %d dump_rc %d\n", (int)getpid(), dump ? dump("exec-child") : -100);
    fflush(stdout);
    return 0;
}

static int wait_child(pid_t pid, const char *what) {
    int status = 0;
    if (waitpid(pid, &status, 0) != pid) {
        perror("waitpid");
        return 1;
    }
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return 0;
    if (WIFSIGNALED(status))
        fprintf(stderr, "rel_fork: %s child %d killed by signal %d%s\n", what, (int)pid,
                WTERMSIG(status), WTERMSIG(status) == SIGALRM ? " (deadlocked?)" : "");
    else
        fprintf(stderr, "rel_fork: %s child %d exited %d\n", what, (int)pid, WEXITSTATUS(status));
    return 1;
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "exec-child") == 0) return exec_child();
    int loaders = argc > 3 ? atoi(argv[1]) : 40;
    int fillers = argc > 3 ? atoi(argv[2]) : 3;
    int execs = argc > 3 ? atoi(argv[3]) : 2;
    int lockers = argc > 4 ? atoi(argv[4]) : 20;

    pthread_t tids[WORKERS], busy[3];
    if (cuInit(0) != CUDA_SUCCESS) return 1;
    for (uintptr_t i = 0; i < WORKERS; i++)
        if (pthread_create(&tids[i], NULL, worker, (void *)i) != 0) return 1;
    void *(*busy_fn[3])(void *) = {namer, oomer, vmmer};
    for (int i = 0; i < 3; i++)
        if (pthread_create(&busy[i], NULL, busy_fn[i], NULL) != 0) return 1;
    while (atomic_load(&g_ops) < 1000) usleep(1000);

    /* An OOM in the parent first: its burst is open (OOMSHIM_MIN_INTERVAL) when children fork. */
    void *huge = NULL;
    if (cudaMalloc(&huge, (size_t)1 << 40) == cudaSuccess) return 1;

    const char *alarm_env = getenv("REL_FORK_ALARM");
    unsigned alarm_s = alarm_env != NULL && atoi(alarm_env) > 0 ? (unsigned)atoi(alarm_env) : 30;
    int failed = 0, forks = 0;
    int total = loaders + fillers + execs + lockers;
    for (int f = 0; f < total; f++) {
        const char *what = f < loaders                    ? "loader"
                           : f < loaders + fillers         ? "filler"
                           : f < loaders + fillers + execs ? "exec"
                                                           : "locker";
        fflush(stdout);
        fflush(stderr);
        pid_t pid = fork();
        if (pid < 0) {
            perror("fork");
            failed++;
            continue;
        }
        if (pid == 0) {
            alarm(alarm_s);
            if (f < loaders) _exit(loader_child());
            if (f < loaders + fillers) {
                if (new_thread_allocates() != 0 || vmm_cycle() != 0) _exit(2);
                int n = child_fill();
                printf("child_fill %d %d\n", (int)getpid(), n);
                fflush(stdout);
                exit(n > 0 ? 0 : 1);
            }
            if (f >= loaders + fillers + execs) {
                void *p = NULL;
                if (new_thread_allocates() != 0 || vmm_cycle() != 0) _exit(2);
                if (cudaMalloc(&p, 4096) != cudaSuccess || cudaFree(p) != cudaSuccess) _exit(3);
                _exit(0);
            }
            char *args[] = {argv[0], "exec-child", NULL};
            execv(argv[0], args);
            _exit(127);
        }
        forks++;
        failed += wait_child(pid, what);
        usleep(2000); /* let the workers run between forks */
    }
    atomic_store(&g_stop, 1);
    for (int i = 0; i < WORKERS; i++) pthread_join(tids[i], NULL);
    for (int i = 0; i < 3; i++) pthread_join(busy[i], NULL);
    if (atomic_load(&g_vmm_failed) != 0) {
        fprintf(stderr, "rel_fork: %d VMM cycles failed\n", atomic_load(&g_vmm_failed));
        failed++;
    }
    printf("forks_ok %d\n", forks - failed);
    printf("worker_ops %ld\n", atomic_load(&g_ops));
    fflush(stdout);
    return failed == 0 ? 0 : 1;
}
