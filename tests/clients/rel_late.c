/*
 * rel_late: load order. Not linked against the CUDA runtime: it dlopens it.
 *
 *   late-local | late-global
 *       dlopen("libcudart.so.13", RTLD_NOW | RTLD_LOCAL or RTLD_GLOBAL), look up cudaMalloc and
 *       cudaFree on that handle, allocate A (1 MiB) and B (2 MiB); then, when OOMSHIM_LATE_LIB
 *       names the shim, dlopen it RTLD_NOW | RTLD_GLOBAL (the shim loaded after CUDA). Then:
 *       allocate C (3 MiB) through the old handle pointers, and D (4 MiB) and E (5 MiB) through
 *       dlsym(RTLD_DEFAULT, "cudaMalloc") (falling back to the handle's when the global scope
 *       has none); free A through RTLD_DEFAULT's cudaFree (a pointer the shim never saw) and D
 *       through the handle's cudaFree (a free the shim never sees). Prints every result and
 *       whether RTLD_DEFAULT resolved to the shim ("default_is_shim"). Asks the shim for a dump
 *       ("late-end") through the shim's own handle and prints nothing about it on stdout.
 *   reload N
 *       N times: dlopen the runtime (RTLD_LOCAL on even rounds, RTLD_GLOBAL on odd), allocate
 *       three buffers through dlsym(RTLD_DEFAULT) (else the handle), free them, dlclose it.
 *       Interposed calls keep working across dlclose/dlopen (the shim pins the object its
 *       cached pointers point into).
 *
 * stdout must be the same with and without the shim (which is loaded by OOMSHIM_LATE_LIB in the
 * late modes and preloaded for reload).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int (*malloc_fn)(void **, size_t);
typedef int (*free_fn)(void *);

#define MiB ((size_t)1 << 20)

static void *must(void *h, const char *name) {
    void *p = dlsym(h, name);
    if (p == NULL) {
        fprintf(stderr, "rel_late: %s: %s\n", name, dlerror());
        exit(3);
    }
    return p;
}

/* The global scope's definition of `name`, else the handle's. */
static void *global_or(void *h, const char *name, int *is_global) {
    void *p = dlsym(RTLD_DEFAULT, name);
    *is_global = p != NULL;
    return p != NULL ? p : must(h, name);
}

static int late(int global) {
    void *rt = dlopen("libcudart.so.13", RTLD_NOW | (global ? RTLD_GLOBAL : RTLD_LOCAL));
    if (rt == NULL) {
        fprintf(stderr, "rel_late: %s\n", dlerror());
        return 3;
    }
    malloc_fn h_malloc = (malloc_fn)must(rt, "cudaMalloc");
    free_fn h_free = (free_fn)must(rt, "cudaFree");
    void *a = NULL, *b = NULL, *c = NULL, *d = NULL, *e = NULL;
    int rc;
    rc = h_malloc(&a, 1 * MiB);
    printf("A before the shim: %d %p\n", rc, a);
    rc = h_malloc(&b, 2 * MiB);
    printf("B before the shim: %d %p\n", rc, b);

    const char *lib = getenv("OOMSHIM_LATE_LIB");
    void *shim = NULL;
    if (lib != NULL && *lib != '\0') {
        shim = dlopen(lib, RTLD_NOW | RTLD_GLOBAL);
        if (shim == NULL) {
            fprintf(stderr, "rel_late: %s\n", dlerror());
            return 3;
        }
    }
    int g1 = 0, g2 = 0;
    malloc_fn d_malloc = (malloc_fn)global_or(rt, "cudaMalloc", &g1);
    free_fn d_free = (free_fn)global_or(rt, "cudaFree", &g2);
    Dl_info info;
    int default_is_shim = g1 && dladdr((void *)d_malloc, &info) && info.dli_fname != NULL &&
                          strstr(info.dli_fname, "liboomshim") != NULL;
    fprintf(stderr, "default_is_shim %d\n", default_is_shim);

    rc = h_malloc(&c, 3 * MiB);
    printf("C through the old pointer: %d %p\n", rc, c);
    rc = d_malloc(&d, 4 * MiB);
    printf("D through the global scope: %d %p\n", rc, d);
    rc = d_malloc(&e, 5 * MiB);
    printf("E through the global scope: %d %p\n", rc, e);
    printf("free A through the global scope: %d\n", d_free(a));
    printf("free D through the old pointer: %d\n", h_free(d));
    fflush(stdout);
    if (shim != NULL) {
        int (*dump)(const char *) = (int (*)(const char *))dlsym(shim, "oomshim_dump");
        fprintf(stderr, "dump_rc %d\n", dump ? dump("late-end") : -100);
    }
    return 0;
}

static int reload(int rounds) {
    long ok = 0;
    for (int i = 0; i < rounds; i++) {
        void *rt = dlopen("libcudart.so.13", RTLD_NOW | (i % 2 ? RTLD_GLOBAL : RTLD_LOCAL));
        if (rt == NULL) {
            fprintf(stderr, "rel_late: %s\n", dlerror());
            return 3;
        }
        int g = 0;
        malloc_fn m = (malloc_fn)global_or(rt, "cudaMalloc", &g);
        free_fn f = (free_fn)global_or(rt, "cudaFree", &g);
        void *p[3] = {0};
        int rc = 0;
        for (int k = 0; k < 3; k++) rc |= m(&p[k], (size_t)(k + 1) * 4096);
        for (int k = 2; k >= 0; k--) rc |= f(p[k]);
        if (rc == 0) ok++;
        if (dlclose(rt) != 0) {
            fprintf(stderr, "rel_late: dlclose: %s\n", dlerror());
            return 3;
        }
    }
    printf("reload: %d rounds, %ld clean\n", rounds, ok);
    printf("held_bytes 0\nheld_count 0\n");
    fflush(stdout);
    int (*dump)(const char *) = (int (*)(const char *))dlsym(RTLD_DEFAULT, "oomshim_dump");
    if (dump != NULL) fprintf(stderr, "dump_rc %d\n", dump("late-end"));
    return ok == rounds ? 0 : 1;
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "";
    if (!strcmp(mode, "late-local")) return late(0);
    if (!strcmp(mode, "late-global")) return late(1);
    if (!strcmp(mode, "reload")) return reload(argc > 2 ? atoi(argv[2]) : 200);
    fprintf(stderr, "usage: rel_late late-local|late-global|reload [N]\n");
    return 2;
}
