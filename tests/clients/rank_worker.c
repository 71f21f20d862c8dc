/*
 * rank_worker: one rank of a simulated data-parallel job, for the multi-rank tests
 * (tests/ranks.rs). Its rank comes from the launcher's variables (RANK, else SLURM_PROCID).
 * Every rank creates a simulated NCCL communicator (libnccl.so.2: a 64 MiB cudaMalloc and a
 * 32 MiB cuMemCreate), loads 1 GiB of weights, then runs steps that allocate and free 256 MiB
 * of activations.
 *
 *   SIM_LEAK_RANK=N       rank N keeps each step's activations (the leak) until cudaMalloc
 *                         fails; it then prints "rank N: out of memory at step S" and exits 3.
 *   SIM_LATE_OOM_RANK=M   rank M waits SIM_LATE_OOM_MS (default 300) after its steps and then
 *                         asks for 64 GiB at once, which fails; it prints and exits 3 too.
 *   SIM_STEPS             steps of the other ranks (default 8).
 *   SIM_RAW_EXIT=1        the leaking rank ends by _exit(3) instead (no exit handlers run), as
 *                         a signal handler or a forked worker would.
 *
 * Other ranks print "rank N: done" and exit 0.
 */
#define _GNU_SOURCE
#include "cuda_sim.h"

#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#define MiB ((size_t)1 << 20)

int simnccl_comm_init(size_t buffer_bytes, size_t vmm_bytes);

static int env_int(const char *name, int dflt) {
    const char *s = getenv(name);
    return s != NULL && *s != '\0' ? atoi(s) : dflt;
}

static void *g_kept[4096];

__attribute__((noinline)) void *load_weights(void) {
    void *p = NULL;
    return cudaMalloc(&p, 1024 * MiB) == cudaSuccess ? p : NULL;
}

/* One step; returns the cudaMalloc code. `keep`: the activations are never freed. */
__attribute__((noinline)) int train_step(int step, int keep) {
    void *act = NULL;
    cudaError_t rc = cudaMalloc(&act, 256 * MiB);
    if (rc != cudaSuccess) return (int)rc;
    if (keep && step < 4096)
        g_kept[step] = act;
    else
        cudaFree(act);
    return 0;
}

__attribute__((noinline)) int gather_everything(void) {
    void *p = NULL;
    return (int)cudaMalloc(&p, (size_t)64 << 30);
}

int main(void) {
    int rank = env_int("RANK", env_int("SLURM_PROCID", -1));
    int leak = env_int("SIM_LEAK_RANK", -1);
    int late = env_int("SIM_LATE_OOM_RANK", -1);
    int steps = env_int("SIM_STEPS", 8);
    int rc = simnccl_comm_init(64 * MiB, 32 * MiB);
    if (rc != 0) {
        printf("rank %d: communicator failed (%d)\n", rank, rc);
        return 2;
    }
    if (load_weights() == NULL) return 2;
    if (rank == leak) {
        for (int step = 0;; step++) {
            if (train_step(step, 1) != 0) {
                printf("rank %d: out of memory at step %d\n", rank, step);
                fflush(stdout);
                if (getenv("SIM_RAW_EXIT") != NULL) _exit(3);
                return 3;
            }
        }
    }
    for (int step = 0; step < steps; step++)
        if (train_step(step, 0) != 0) return 2;
    if (rank == late) {
        long ms = env_int("SIM_LATE_OOM_MS", 300);
        struct timespec t = {ms / 1000, (ms % 1000) * 1000000L};
        nanosleep(&t, NULL);
        if (gather_everything() != 0) {
            printf("rank %d: out of memory gathering\n", rank);
            return 3;
        }
    }
    printf("rank %d: done\n", rank);
    return 0;
}
