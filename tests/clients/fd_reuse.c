/*
 * fd_reuse: a program that owns its descriptor table, as daemons and job runners do. Its
 * descriptor limit is 64 (so the shim cannot move its own descriptors to high numbers), it lets
 * the shim publish its live summary, closes every descriptor from 3 up (closefrom(3)), opens a
 * file of its own (argv[1]), which takes the lowest free number, and writes a line to it every
 * 20 ms for 1.5 s while the shim goes on publishing. Output: "wrote <n> of <n> lines, <bytes>
 * bytes in the file" and exit 0, or the first write that failed and exit 1.
 */
#include "cuda_sim.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static void nap_ms(long ms) {
    struct timespec t = {ms / 1000, (ms % 1000) * 1000 * 1000};
    nanosleep(&t, NULL);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: fd_reuse FILE\n");
        return 2;
    }
    struct rlimit lim = {64, 64};
    if (setrlimit(RLIMIT_NOFILE, &lim) != 0) {
        perror("setrlimit");
        return 2;
    }
    void *p = NULL;
    if (cudaMalloc(&p, (size_t)64 << 20) != cudaSuccess) {
        fprintf(stderr, "cudaMalloc failed\n");
        return 2;
    }
    nap_ms(600); /* several publishes at OOMSHIM_LIVE_INTERVAL=100ms */
    for (int fd = 3; fd < 64; fd++) close(fd);
    int own = open(argv[1], O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (own < 0) {
        perror("open");
        return 2;
    }
    char second_path[4096];
    snprintf(second_path, sizeof second_path, "%s.2", argv[1]);
    int second = open(second_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (second < 0) {
        perror("open");
        return 2;
    }
    struct stat mine, mine2;
    fstat(own, &mine);
    fstat(second, &mine2);
    int lines = 75;
    for (int i = 0; i < lines; i++) {
        char line[32];
        int n = snprintf(line, sizeof line, "line %d\n", i);
        struct stat now;
        if (fstat(own, &now) != 0 || now.st_ino != mine.st_ino || now.st_dev != mine.st_dev) {
            printf("descriptor %d no longer names my file at line %d\n", own, i);
            return 1;
        }
        if (fstat(second, &now) != 0 || now.st_ino != mine2.st_ino || now.st_dev != mine2.st_dev) {
            printf("descriptor %d no longer names my second file at line %d\n", second, i);
            return 1;
        }
        if (write(own, line, (size_t)n) != n) {
            printf("write of line %d to descriptor %d failed: %s\n", i, own, strerror(errno));
            return 1;
        }
        nap_ms(20);
    }
    struct stat end;
    stat(argv[1], &end);
    printf("wrote %d of %d lines, %lld bytes in the file\n", lines, lines, (long long)end.st_size);
    return 0;
}
