/*
 * nccl_sim.c — a simulated NCCL, built as libnccl.so.2 (its real SONAME), so tests can prove that
 * device memory allocated inside NCCL is named NCCL in dumps. Like the real library it allocates
 * its communication buffers itself when a communicator is created: here one cudaMalloc (the
 * runtime, through the PLT) and one cuMemCreate (the driver's VMM, as NCCL's cuMem path does).
 *
 *   int simnccl_comm_init(size_t buffer_bytes, size_t vmm_bytes)
 *       returns 0, or the failing call's error code; the buffers stay until simnccl_comm_destroy.
 *   void simnccl_comm_destroy(void)
 */
#define _GNU_SOURCE
#include "cuda_driver_sim.h"
#include "cuda_sim.h"

#include <string.h>

static void *g_buffer;
static CUmemGenericAllocationHandle g_handle;

/* noinline: its frames are the library's own, as NCCL's init path is. */
__attribute__((noinline)) static int alloc_buffers(size_t buffer_bytes, size_t vmm_bytes) {
    cudaError_t rc = cudaMalloc(&g_buffer, buffer_bytes);
    if (rc != cudaSuccess) return (int)rc;
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 0;
    CUresult cr = cuMemCreate(&g_handle, vmm_bytes, &prop, 0);
    return (int)cr;
}

int simnccl_comm_init(size_t buffer_bytes, size_t vmm_bytes) {
    int rc = alloc_buffers(buffer_bytes, vmm_bytes);
    __asm__ volatile("" ::: "memory"); /* keep the call a call, not a tail jump */
    return rc;
}

void simnccl_comm_destroy(void) {
    if (g_buffer != NULL) cudaFree(g_buffer);
    if (g_handle != 0) cuMemRelease(g_handle);
    g_buffer = NULL;
    g_handle = 0;
}
