/*
 * drv_static.c — shaped like a program with the CUDA runtime linked statically (nvcc's default,
 * CuPy, RAPIDS): it reaches the driver only by dlopen("libcuda.so.1") + dlsym(handle,
 * "cuGetProcAddress_v2") + cuGetProcAddress_v2 per function. It names no cu* symbol, so it is
 * not linked to libcuda. Output is identical with and without the shim.
 *
 *   drv_static leak        leaks 1 GiB at a time in leak_one_gib() until out of memory
 *   drv_static hold        three 100 MiB in hold_three(), an on-demand dump, frees them
 *   drv_static lookups     lookups the shim must leave alone or keep consistent
 *   drv_static where       which module each lookup landed in (differs under the shim)
 *   drv_static nodriver    never opens the driver; calls whatever cuMemAlloc_v2 the process
 *                          has (under the shim: its wrapper, with no real function behind it)
 */
#define _GNU_SOURCE
#include "cuda_driver_sim.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void *drvnext_lookup(const char *name);

static void *g_lib;
static PFN_cuGetProcAddress_v2 g_getproc;

static void *proc(const char *name, int version, unsigned long long flags) {
    void *p = NULL;
    CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    if (g_getproc(name, &p, version, flags, &st) != CUDA_SUCCESS) return NULL;
    return p;
}

static void open_driver(void) {
    g_lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (g_lib == NULL) {
        printf("no driver: %s\n", dlerror());
        exit(3);
    }
    g_getproc = (PFN_cuGetProcAddress_v2)dlsym(g_lib, "cuGetProcAddress_v2");
    if (g_getproc == NULL) {
        printf("no cuGetProcAddress_v2\n");
        exit(3);
    }
    PFN_cuInit init = (PFN_cuInit)proc("cuInit", 13000, 0);
    if (init == NULL || init(0) != CUDA_SUCCESS) {
        printf("cuInit failed\n");
        exit(3);
    }
}

static PFN_cuMemAlloc_v2 g_alloc;

__attribute__((noinline)) static CUresult leak_one_gib(CUdeviceptr *p) {
    return g_alloc(p, (size_t)1 << 30);
}

__attribute__((noinline)) static CUresult hold_three(CUdeviceptr *p) {
    for (int i = 0; i < 3; i++) {
        CUresult rc = g_alloc(&p[i], (size_t)100 << 20);
        if (rc != CUDA_SUCCESS) return rc;
    }
    return CUDA_SUCCESS;
}

static void dump_if_shimmed(const char *why) {
    int (*dump)(const char *) = (int (*)(const char *))dlsym(RTLD_DEFAULT, "oomshim_dump");
    if (dump != NULL) dump(why);
}

static const char *module_of(void *p) {
    Dl_info info;
    if (p == NULL) return "null";
    if (dladdr(p, &info) == 0 || info.dli_fname == NULL) return "?";
    const char *slash = strrchr(info.dli_fname, '/');
    return slash ? slash + 1 : info.dli_fname;
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "leak";
    if (strcmp(mode, "nodriver") == 0) {
        PFN_cuMemAlloc_v2 f = (PFN_cuMemAlloc_v2)dlsym(RTLD_DEFAULT, "cuMemAlloc_v2");
        if (f == NULL) {
            printf("no cuMemAlloc_v2\n");
            return 0;
        }
        CUdeviceptr p = 0;
        printf("first: rc=%d\n", (int)f(&p, 4096));
        printf("second: rc=%d\n", (int)f(&p, 4096));
        return 0;
    }
    open_driver();
    g_alloc = (PFN_cuMemAlloc_v2)proc("cuMemAlloc", 13000, 0);
    PFN_cuMemFree_v2 release = (PFN_cuMemFree_v2)proc("cuMemFree", 13000, 0);
    if (strcmp(mode, "leak") == 0) {
        CUdeviceptr p;
        int n = 0;
        CUresult rc;
        while ((rc = leak_one_gib(&p)) == CUDA_SUCCESS) n++;
        printf("leaked %d GiB, then rc=%d\n", n, (int)rc);
        return rc == CUDA_ERROR_OUT_OF_MEMORY ? 2 : 1;
    }
    if (strcmp(mode, "hold") == 0) {
        CUdeviceptr p[3];
        CUresult rc = hold_three(p);
        printf("hold: rc=%d\n", (int)rc);
        dump_if_shimmed("hold");
        for (int i = 0; i < 3; i++) release(p[i]);
        dump_if_shimmed("released");
        printf("freed\n");
        return 0;
    }
    if (strcmp(mode, "lookups") == 0) {
        printf("dlsym missing: %s\n", dlsym(g_lib, "cuNoSuchFunction") == NULL ? "null" : "found");
        void *p = (void *)1;
        CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SUCCESS;
        CUresult rc = g_getproc("cuNoSuchFunction", &p, 13000, 0, &st);
        printf("getproc missing: rc=%d status=%d pfn=%s\n", (int)rc, (int)st, p ? "set" : "null");
        rc = g_getproc("cuMemCreate", &p, 9000, 0, &st);
        printf("getproc too old: rc=%d status=%d\n", (int)rc, (int)st);
        rc = g_getproc("cuMemAlloc", &p, 13000, 0, NULL);
        printf("getproc NULL status: rc=%d\n", (int)rc);
        printf("cuMemAlloc@13000 == dlsym cuMemAlloc_v2: %d\n",
               proc("cuMemAlloc", 13000, 0) == dlsym(g_lib, "cuMemAlloc_v2"));
        printf("cuMemAlloc@3000 == dlsym cuMemAlloc: %d\n",
               proc("cuMemAlloc", 3000, 0) == dlsym(g_lib, "cuMemAlloc"));
        printf("cuMemAlloc@3000 != cuMemAlloc@13000: %d\n",
               proc("cuMemAlloc", 3000, 0) != proc("cuMemAlloc", 13000, 0));
        printf("cuGetProcAddress@13000 == dlsym cuGetProcAddress_v2: %d\n",
               proc("cuGetProcAddress", 13000, 0) == dlsym(g_lib, "cuGetProcAddress_v2"));
        printf("ptsz cuMemAllocAsync == dlsym _ptsz: %d\n",
               proc("cuMemAllocAsync", 13000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) ==
                   dlsym(g_lib, "cuMemAllocAsync_ptsz"));
        printf("ptsz != legacy: %d\n",
               proc("cuMemAllocAsync", 13000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) !=
                   proc("cuMemAllocAsync", 13000, 0));
        /* The legacy 32-bit ABI still works through its own pointer. */
        CUresult (*alloc32)(unsigned int *, unsigned int) =
            (CUresult(*)(unsigned int *, unsigned int))proc("cuMemAlloc", 3000, 0);
        unsigned int p32 = 0;
        printf("legacy alloc: rc=%d\n", (int)alloc32(&p32, 4096));
        int count = -1;
        CUresult (*getcount)(int *) = (CUresult(*)(int *))dlsym(g_lib, "cuDeviceGetCount");
        CUresult count_rc = getcount(&count);
        printf("cuDeviceGetCount: rc=%d count=%d\n", (int)count_rc, count);
        /* Caller identity of RTLD_NEXT / RTLD_DEFAULT. */
        printf("RTLD_NEXT from helper: %s\n", drvnext_lookup("drvnext_target") ? "found" : "null");
        int (*t)(void) = (int (*)(void))dlsym(RTLD_NEXT, "drvnext_target");
        printf("RTLD_NEXT from main: %d\n", t ? t() : -1);
        t = (int (*)(void))dlsym(RTLD_DEFAULT, "drvnext_target");
        printf("RTLD_DEFAULT: %d\n", t ? t() : -1);
        printf("RTLD_DEFAULT missing: %s\n",
               dlsym(RTLD_DEFAULT, "no_such_symbol_anywhere") ? "found" : "null");
        printf("RTLD_NEXT malloc: %s\n", module_of(dlsym(RTLD_NEXT, "malloc")));
        return 0;
    }
    if (strcmp(mode, "where") == 0) {
        printf("dlsym cuMemAlloc_v2: %s\n", module_of(dlsym(g_lib, "cuMemAlloc_v2")));
        printf("dlsym cuGetProcAddress_v2: %s\n", module_of(dlsym(g_lib, "cuGetProcAddress_v2")));
        printf("dlsym cuDeviceGetCount: %s\n", module_of(dlsym(g_lib, "cuDeviceGetCount")));
        printf("getproc cuMemAlloc@13000: %s\n", module_of(proc("cuMemAlloc", 13000, 0)));
        printf("getproc cuMemAlloc@3000: %s\n", module_of(proc("cuMemAlloc", 3000, 0)));
        printf("getproc cuMemCreate: %s\n", module_of(proc("cuMemCreate", 13000, 0)));
        printf("getproc cuGetProcAddress: %s\n", module_of(proc("cuGetProcAddress", 13000, 0)));
        printf("getproc cuGetProcAddress@11030: %s\n", module_of(proc("cuGetProcAddress", 11030, 0)));
        printf("getproc cuMemFreeAsync ptsz: %s\n",
               module_of(proc("cuMemFreeAsync", 13000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM)));
        printf("getproc cuMemGetInfo: %s\n", module_of(proc("cuMemGetInfo", 13000, 0)));
        return 0;
    }
    printf("unknown mode %s\n", mode);
    return 64;
}
