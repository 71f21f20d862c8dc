/*
 * hostile_host: a host program that does unusual but legal things to its own descriptors and
 * working directory while the shim is loaded. Every mode allocates 3 MiB first, so
 * the shim has started, and prints "done" on stdout at the end; none writes to stderr itself
 * except where said.
 *
 *   closed-stderr FILE [oom]  closes fd 2, opens FILE (which gets fd 2), writes "program
 *                         line\n" there, asks for a dump (`oomshim_dump`) and, with `oom`, runs
 *                         out of memory once. The program's file must hold its own line only.
 *   closed-stderr-early FILE  the same, but fd 2 is replaced before the first CUDA call.
 *   dump                  asks for a dump (its stderr line) and runs out of memory once.
 *   oom                   runs out of memory once (the OOM summary on stderr), no dump request.
 *   closefrom PREFIX      the program closes every descriptor above 2 (closefrom(3)), as
 *                         daemons and job runners do, then opens PREFIX.N files on exactly the
 *                         numbers where pipes were open before (and a few more), and raises
 *                         SIGUSR2 (OOMSHIM_SIGNAL). Prints each file's size after a while.
 *   chdir DIR             allocates, then chdir(DIR), then runs out of memory.
 *   chdir-early DIR       chdir(DIR) before the first CUDA call, then the same.
 *   reason BYTES          asks for a dump with a reason of BYTES bytes (with control bytes in it).
 */
#define _GNU_SOURCE
#include "cuda_sim.h"
#include <dirent.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static void *g_keep;

__attribute__((noinline)) static int hold_three_mib(void) {
    return cudaMalloc(&g_keep, (size_t)3 << 20) == cudaSuccess ? 0 : 1;
}

__attribute__((noinline)) static int ask_one_tib(void) {
    void *p = NULL;
    return (int)cudaMalloc(&p, (size_t)1 << 40);
}

static int ask_dump(const char *reason) {
    int (*dump)(const char *) = (int (*)(const char *))dlsym(RTLD_DEFAULT, "oomshim_dump");
    return dump ? dump(reason) : -2;
}

static int replace_stderr(const char *path) {
    close(2);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd != 2) return 1;
    const char line[] = "program line\n";
    return write(2, line, sizeof line - 1) == (ssize_t)(sizeof line - 1) ? 0 : 1;
}

/* Descriptors above 2 that are pipes, before closefrom. */
static int pipe_fds(int *out, int max) {
    int n = 0;
    DIR *d = opendir("/proc/self/fd");
    if (!d) return 0;
    int self = dirfd(d);
    struct dirent *e;
    while ((e = readdir(d)) && n < max) {
        int fd = atoi(e->d_name);
        if (e->d_name[0] == '.' || fd <= 2 || fd == self) continue;
        char link[64], target[256];
        snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
        ssize_t len = readlink(link, target, sizeof target - 1);
        if (len > 0) {
            target[len] = 0;
            if (strncmp(target, "pipe:", 5) == 0) out[n++] = fd;
        }
    }
    closedir(d);
    return n;
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "dump";
    const char *arg = argc > 2 ? argv[2] : "";
    if (strcmp(mode, "closed-stderr-early") == 0 && replace_stderr(arg) != 0) return 10;
    if (strcmp(mode, "chdir-early") == 0 && chdir(arg) != 0) return 11;
    if (hold_three_mib() != 0) return 12;

    if (strcmp(mode, "closed-stderr") == 0 || strcmp(mode, "closed-stderr-early") == 0) {
        if (strcmp(mode, "closed-stderr") == 0 && replace_stderr(arg) != 0) return 13;
        printf("dump %d\n", ask_dump("closed-stderr"));
        if (argc > 3 && strcmp(argv[3], "oom") == 0) printf("oom %d\n", ask_one_tib());
    } else if (strcmp(mode, "dump") == 0) {
        printf("dump %d\n", ask_dump("dead-stderr"));
    } else if (strcmp(mode, "oom") == 0) {
        printf("oom %d\n", ask_one_tib());
    } else if (strcmp(mode, "closefrom") == 0) {
        int fds[16];
        int n = pipe_fds(fds, 16);
        printf("pipes_before %d\n", n);
        closefrom(3);
        int files[24], nfiles = 0;
        for (int i = 0; i < n; i++) {
            char path[4096];
            snprintf(path, sizeof path, "%s.%d", arg, nfiles);
            int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
            if (fd < 0) return 14;
            if (fd != fds[i]) {
                if (dup2(fd, fds[i]) < 0) return 15;
                close(fd);
            }
            files[nfiles++] = fds[i];
        }
        for (int i = 0; i < 4; i++) {
            char path[4096];
            snprintf(path, sizeof path, "%s.%d", arg, nfiles);
            int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
            if (fd < 0) return 16;
            files[nfiles++] = fd;
        }
        raise(SIGUSR2);
        usleep(600 * 1000);
        for (int i = 0; i < nfiles; i++) {
            struct stat st;
            if (fstat(files[i], &st) != 0) return 17;
            printf("file %d size %lld\n", i, (long long)st.st_size);
        }
    } else if (strcmp(mode, "chdir") == 0 || strcmp(mode, "chdir-early") == 0) {
        if (strcmp(mode, "chdir") == 0 && chdir(arg) != 0) return 18;
        printf("oom %d\n", ask_one_tib());
    } else if (strcmp(mode, "reason") == 0) {
        size_t n = (size_t)atol(arg);
        char *reason = malloc(n + 1);
        if (!reason) return 19;
        for (size_t i = 0; i < n; i++) reason[i] = (i % 7 == 0) ? '\x1b' : (i % 11 == 0 ? '\n' : 'r');
        reason[n] = 0;
        printf("dump %d\n", ask_dump(reason));
        free(reason);
    } else {
        return 2;
    }
    printf("done\n");
    fflush(stdout);
    return 0;
}
