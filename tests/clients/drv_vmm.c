/*
 * drv_vmm.c — CUDA virtual memory management, as PyTorch's expandable segments and XLA use it:
 * reserve a range, create physical handles, map them, release a handle while it is still
 * mapped, unmap, free the range. On-demand dumps (under the shim) mark each stage.
 *
 *   drv_vmm plt            the functions called directly (linked to libcuda.so.1)
 *   drv_vmm runtime        the functions from cudaGetDriverEntryPointByVersion(…, 12000), as
 *                          PyTorch gets them
 *   drv_vmm oom            1 GiB handles created in grow_segment() until out of memory
 */
#define _GNU_SOURCE
#include "cuda_driver_sim.h"
#include "cuda_sim.h"

#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

#define MiB ((size_t)1 << 20)

static CUresult (*p_create)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *,
                            unsigned long long) = cuMemCreate;
static CUresult (*p_release)(CUmemGenericAllocationHandle) = cuMemRelease;
static CUresult (*p_map)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle,
                         unsigned long long) = cuMemMap;
static CUresult (*p_unmap)(CUdeviceptr, size_t) = cuMemUnmap;
static CUresult (*p_reserve)(CUdeviceptr *, size_t, size_t, CUdeviceptr,
                             unsigned long long) = cuMemAddressReserve;
static CUresult (*p_addr_free)(CUdeviceptr, size_t) = cuMemAddressFree;

static void dump_if_shimmed(const char *why) {
    int (*dump)(const char *) = (int (*)(const char *))dlsym(RTLD_DEFAULT, "oomshim_dump");
    if (dump != NULL) dump(why);
}

static void *entry(const char *name) {
    void *p = NULL;
    int status = -1;
    cudaError_t rc = cudaGetDriverEntryPointByVersion(name, &p, 12000, 0, &status);
    if (rc != cudaSuccess || status != 0) printf("entry point %s: rc=%d status=%d\n", name, rc, status);
    return p;
}

static CUmemAllocationProp device_prop(int host) {
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = host ? CU_MEM_LOCATION_TYPE_HOST_NUMA : CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 0;
    return prop;
}

__attribute__((noinline)) static CUresult create_physical(CUmemGenericAllocationHandle *h,
                                                           size_t size) {
    CUmemAllocationProp prop = device_prop(0);
    return p_create(h, size, &prop, 0);
}

__attribute__((noinline)) static CUresult grow_segment(CUmemGenericAllocationHandle *h) {
    CUmemAllocationProp prop = device_prop(0);
    return p_create(h, (size_t)1 << 30, &prop, 0);
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "plt";
    if (cuInit(0) != CUDA_SUCCESS) return 3;
    if (strcmp(mode, "runtime") == 0) {
        p_create = entry("cuMemCreate");
        p_release = entry("cuMemRelease");
        p_map = entry("cuMemMap");
        p_unmap = entry("cuMemUnmap");
        p_reserve = entry("cuMemAddressReserve");
        p_addr_free = entry("cuMemAddressFree");
        if (!p_create || !p_release || !p_map || !p_unmap || !p_reserve || !p_addr_free) return 4;
    } else if (strcmp(mode, "oom") == 0) {
        CUmemGenericAllocationHandle h;
        int n = 0;
        CUresult rc;
        while ((rc = grow_segment(&h)) == CUDA_SUCCESS) n++;
        printf("created %d x 1 GiB, then rc=%d\n", n, (int)rc);
        return rc == CUDA_ERROR_OUT_OF_MEMORY ? 2 : 1;
    } else if (strcmp(mode, "plt") != 0) {
        printf("unknown mode %s\n", mode);
        return 64;
    }
    CUdeviceptr va = 0;
    CUmemGenericAllocationHandle a = 0, b = 0, host = 0;
    printf("reserve: rc=%d\n", (int)p_reserve(&va, 256 * MiB, 0, 0, 0));
    printf("create a: rc=%d\n", (int)create_physical(&a, 64 * MiB));
    printf("create b: rc=%d\n", (int)create_physical(&b, 32 * MiB));
    CUmemAllocationProp hp = device_prop(1);
    printf("create host: rc=%d\n", (int)p_create(&host, 2 * MiB, &hp, 0));
    printf("map a: rc=%d\n", (int)p_map(va, 64 * MiB, 0, a, 0));
    printf("map b: rc=%d\n", (int)p_map(va + 64 * MiB, 32 * MiB, 0, b, 0));
    dump_if_shimmed("mapped");
    printf("release a while mapped: rc=%d\n", (int)p_release(a));
    dump_if_shimmed("released-mapped");
    printf("unmap a: rc=%d\n", (int)p_unmap(va, 64 * MiB));
    dump_if_shimmed("unmapped-a");
    printf("unmap bad: rc=%d\n", (int)p_unmap(va + 200 * MiB, 2 * MiB));
    printf("unmap b: rc=%d\n", (int)p_unmap(va + 64 * MiB, 32 * MiB));
    printf("release b: rc=%d\n", (int)p_release(b));
    printf("release b again: rc=%d\n", (int)p_release(b));
    printf("release host: rc=%d\n", (int)p_release(host));
    printf("free range: rc=%d\n", (int)p_addr_free(va, 256 * MiB));
    dump_if_shimmed("end");
    return 0;
}
