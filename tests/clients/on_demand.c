/*
 * On-demand dumps: allocates three buffers in `keep_three_buffers`, then, by argv[1]:
 *   signal - sends itself SIGUSR2 (the shim's OOMSHIM_SIGNAL, when asked for); with OOMSHIM_DIR
 *            set, waits until a dump is in it (the shim writes it on a thread of its own),
 *            otherwise a moment;
 *   dumps  - waits until argv[2] dumps are in OOMSHIM_DIR (for OOMSHIM_INTERVAL) and prints
 *            "waited_ms MS", the milliseconds it waited;
 *   sleep  - sleeps argv[2] milliseconds;
 *   exit   - frees one buffer and exits (OOMSHIM_AT_EXIT: the other two are still live).
 * A wait for dumps polls every 10 ms, as long as a loaded machine needs, and gives up after 60 s
 * (exit status 3).
 */
#include "cuda_sim.h"
#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static void *g_buffers[3];

__attribute__((noinline)) static int keep_three_buffers(void) {
    for (int i = 0; i < 3; i++)
        if (cudaMalloc(&g_buffers[i], (size_t)(i + 1) << 20) != cudaSuccess) return 1;
    return 0;
}

static long now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000L + t.tv_nsec / 1000000L;
}

/* Dumps in `dir`: finished files only (a dump is written to a dot-named temporary first). */
static int count_dumps(const char *dir) {
    DIR *d = opendir(dir);
    if (d == NULL) return 0;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        size_t len = strlen(e->d_name);
        if (e->d_name[0] != '.' && len > 5 && strcmp(e->d_name + len - 5, ".json") == 0) n++;
    }
    closedir(d);
    return n;
}

/* Waits until `want` dumps are in $OOMSHIM_DIR; returns the milliseconds waited, -1 after 60 s. */
static long wait_for_dumps(int want) {
    const char *dir = getenv("OOMSHIM_DIR");
    long start = now_ms();
    while (dir == NULL || count_dumps(dir) < want) {
        if (now_ms() - start > 60000) return -1;
        usleep(10 * 1000);
    }
    return now_ms() - start;
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "exit";
    if (keep_three_buffers() != 0) return 1;
    if (strcmp(mode, "signal") == 0) {
        raise(SIGUSR2);
        if (getenv("OOMSHIM_DIR") == NULL) usleep(800 * 1000);
        else if (wait_for_dumps(1) < 0) return 3;
    } else if (strcmp(mode, "dumps") == 0) {
        long waited = wait_for_dumps(argc > 2 ? atoi(argv[2]) : 1);
        if (waited < 0) return 3;
        printf("waited_ms %ld\n", waited);
    } else if (strcmp(mode, "sleep") == 0) {
        usleep((useconds_t)(argc > 2 ? atoi(argv[2]) : 1000) * 1000);
    } else {
        cudaFree(g_buffers[0]);
    }
    printf("done\n");
    return 0;
}
