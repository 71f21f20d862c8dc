/*
 * demo_train: the program behind `oomshim demo`. A mock training loop with the classic leak:
 * every step's activation is kept alive for "logging" (like `loss_history.append(loss)` instead
 * of `loss.item()`), so memory grows each step until cudaMalloc fails.
 *
 *   load_model_weights()           1 GiB, once
 *   alloc_staging_buffer()         64 MiB pinned host staging buffer (cudaMallocHost), once
 *   train_step(step)
 *     forward_layer()              ACT_MB MiB activation (default 96)
 *     save_activation_for_logging()  keeps it in a global history: the leak
 *     matmul_workspace()           512 MiB workspace, allocated and freed every step
 *
 * With SIMCUDA_CAPACITY=8G (what `oomshim demo` sets) and the sim's 256 MiB context, the
 * workspace allocation of step 67 fails. Knobs (environment): DEMO_ACT_MB, DEMO_WORKSPACE_MB.
 *
 * After step SNAPSHOT_STEP (20) it asks the shim for a dump (`oomshim_dump`, reason
 * "snapshot at step 20"), so `oomshim diff` can compare that early state with the OOM dump.
 *
 * Output: progress every 10 steps on stdout; on the failure, a PyTorch-style
 * "RuntimeError: CUDA out of memory at step N (cudaMalloc returned 2: out of memory). ..." on
 * stderr and exit 1. Exit 0 if no allocation fails within MAX_STEPS.
 */
#include "cuda_sim.h"
#include <dlfcn.h>

#include <stdio.h>
#include <stdlib.h>

#define MiB ((size_t)1 << 20)
#define ACT_MB 96
#define WORKSPACE_MB 512
#define WEIGHTS_BYTES ((size_t)1 << 30)
#define STAGING_BYTES (64 * MiB)
#define MAX_STEPS 100000
#define SNAPSHOT_STEP 20

static void *g_weights;
static void *g_staging;
static void *g_history[MAX_STEPS];
static int g_history_len;
static size_t g_act_bytes = ACT_MB * MiB;
static size_t g_workspace_bytes = WORKSPACE_MB * MiB;

/* The failure, for the error message. */
static const char *g_failed_call = "cudaMalloc";
static size_t g_failed_bytes;

static size_t env_mb(const char *name, size_t dflt) {
    const char *s = getenv(name);
    if (s == NULL || *s == '\0') return dflt;
    char *end;
    unsigned long v = strtoul(s, &end, 10);
    if (*end != '\0' || v == 0) return dflt;
    return (size_t)v * MiB;
}

static cudaError_t note_failure(cudaError_t rc, const char *call, size_t bytes) {
    if (rc != cudaSuccess) {
        g_failed_call = call;
        g_failed_bytes = bytes;
    }
    return rc;
}

__attribute__((noinline)) cudaError_t load_model_weights(void) {
    cudaError_t rc = cudaMalloc(&g_weights, WEIGHTS_BYTES);
    return note_failure(rc, "cudaMalloc", WEIGHTS_BYTES);
}

__attribute__((noinline)) cudaError_t alloc_staging_buffer(void) {
    cudaError_t rc = cudaMallocHost(&g_staging, STAGING_BYTES);
    return note_failure(rc, "cudaMallocHost", STAGING_BYTES);
}

__attribute__((noinline)) cudaError_t forward_layer(void **activation) {
    cudaError_t rc = cudaMalloc(activation, g_act_bytes);
    return note_failure(rc, "cudaMalloc", g_act_bytes);
}

/* The bug: the activation should be reduced to a host scalar, not kept on the device. */
__attribute__((noinline)) void save_activation_for_logging(void *activation) {
    if (g_history_len < MAX_STEPS) g_history[g_history_len++] = activation;
}

__attribute__((noinline)) cudaError_t matmul_workspace(void) {
    void *workspace = NULL;
    cudaError_t rc = cudaMalloc(&workspace, g_workspace_bytes);
    if (rc != cudaSuccess) return note_failure(rc, "cudaMalloc", g_workspace_bytes);
    rc = cudaFree(workspace);
    return note_failure(rc, "cudaFree", 0);
}

__attribute__((noinline)) cudaError_t train_step(int step) {
    (void)step;
    void *activation = NULL;
    cudaError_t rc = forward_layer(&activation);
    if (rc != cudaSuccess) return rc;
    save_activation_for_logging(activation);
    rc = matmul_workspace();
    return rc;
}

static void report_oom(int step, cudaError_t rc) {
    size_t free_b = 0, total_b = 0;
    int device = 0;
    cudaGetDevice(&device);
    if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) free_b = total_b = 0;
    fprintf(stderr,
            "RuntimeError: CUDA out of memory at step %d (%s returned %d: %s). Tried to allocate "
            "%.2f MiB; GPU %d has a total capacity of %.2f GiB of which %.2f MiB is free.\n",
            step, g_failed_call, (int)rc, cudaGetErrorString(rc),
            (double)g_failed_bytes / (double)MiB, device,
            (double)total_b / (double)(1024 * MiB), (double)free_b / (double)MiB);
}

int main(void) {
    g_act_bytes = env_mb("DEMO_ACT_MB", g_act_bytes);
    g_workspace_bytes = env_mb("DEMO_WORKSPACE_MB", g_workspace_bytes);
    cudaError_t rc = load_model_weights();
    if (rc == cudaSuccess) rc = alloc_staging_buffer();
    if (rc != cudaSuccess) {
        report_oom(0, rc);
        return 1;
    }
    printf("model loaded: %.2f GiB of weights\n", (double)WEIGHTS_BYTES / (double)(1024 * MiB));
    fflush(stdout);
    /* Like `oomshim.step()` in a Python loop: marks each step when oomshim is loaded. */
    void (*mark_step)(void) = (void (*)(void))dlsym(RTLD_DEFAULT, "oomshim_step");
    /* Like `oomshim.dump("...")`: an on-demand snapshot, when oomshim is loaded. */
    int (*dump_now)(const char *) = (int (*)(const char *))dlsym(RTLD_DEFAULT, "oomshim_dump");
    for (int step = 1; step <= MAX_STEPS; step++) {
        rc = train_step(step);
        if (rc == cudaSuccess && mark_step != NULL) mark_step();
        if (rc != cudaSuccess) {
            fflush(stdout);
            report_oom(step, rc);
            return 1;
        }
        if (step == SNAPSHOT_STEP && dump_now != NULL) dump_now("snapshot at step 20");
        if (step % 10 == 0) {
            printf("step %d: loss %.4f\n", step, 2.3 / (1.0 + 0.05 * step));
            fflush(stdout);
        }
    }
    printf("finished %d steps without running out of memory\n", MAX_STEPS);
    return 0;
}
