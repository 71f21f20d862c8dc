// GPU check: a CUDA program (nvcc, -cudart shared) that leaks device memory through a named
// function until cudaMalloc fails. Its stdout and exit code must be the same with and without
// the shim, and the shim's dump must name grow_leaky_buffer as the holder.
#include <cuda_runtime.h>
#include <stdio.h>

#define CHUNK (1ull << 30)
static void* chunks[4096];

static unsigned long long g_leaked;

__attribute__((noinline)) cudaError_t grow_leaky_buffer(int i) {
    cudaError_t rc = cudaMalloc(&chunks[i], CHUNK);  // the leak: never freed
    if (rc == cudaSuccess) g_leaked += CHUNK;  // work after the call: no tail call, a real frame
    return rc;
}

int main(void) {
    int n = 0;
    cudaError_t rc = cudaSuccess;
    while (n < 4096 && (rc = grow_leaky_buffer(n)) == cudaSuccess) n++;
    printf("held %d chunks of 1 GiB\n", n);
    printf("cudaMalloc returned %d (%s)\n", (int)rc, cudaGetErrorName(rc));
    return rc == cudaErrorMemoryAllocation ? 3 : 1;
}
