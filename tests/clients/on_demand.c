/*
 * On-demand dumps: allocates three buffers in `keep_three_buffers`, then, by argv[1]:
 *   signal - sends itself SIGUSR2 (the shim's OOMSHIM_SIGNAL, when asked for) and waits a moment;
 *   sleep  - sleeps argv[2] milliseconds (for OOMSHIM_INTERVAL);
 *   exit   - frees one buffer and exits (OOMSHIM_AT_EXIT: the other two are still live).
 */
#include "cuda_sim.h"
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void *g_buffers[3];

__attribute__((noinline)) static int keep_three_buffers(void) {
    for (int i = 0; i < 3; i++)
        if (cudaMalloc(&g_buffers[i], (size_t)(i + 1) << 20) != cudaSuccess) return 1;
    return 0;
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "exit";
    if (keep_three_buffers() != 0) return 1;
    if (strcmp(mode, "signal") == 0) {
        raise(SIGUSR2);
        usleep(800 * 1000);
    } else if (strcmp(mode, "sleep") == 0) {
        usleep((useconds_t)(argc > 2 ? atoi(argv[2]) : 1000) * 1000);
    } else {
        cudaFree(g_buffers[0]);
    }
    printf("done\n");
    return 0;
}
