// A plain CUDA program (shared cudart) that caches results on the device without bound and
// never frees them: no steps, one site.
#include <cuda_runtime.h>
#include <stdio.h>

static void* results[8192];

__attribute__((noinline)) cudaError_t cache_result(int i) {
    cudaError_t rc = cudaMalloc(&results[i], 512ull << 20);  // EXPECT-LINE
    if (rc == cudaSuccess) cudaMemset(results[i], 0, 4096);
    return rc;
}

int main(void) {
    int n = 0;
    cudaError_t rc;
    while ((rc = cache_result(n)) == cudaSuccess) n++;
    printf("stopped: %s\n", cudaGetErrorName(rc));
    return 2;
}
