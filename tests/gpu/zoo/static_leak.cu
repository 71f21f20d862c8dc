// nvcc's default static cudart: a loop whose step allocates working memory (freed) and keeps a
// 1 GiB buffer through a named function, until cudaMalloc fails.
#include <cuda_runtime.h>
#include <stdio.h>

static void* kept[4096];

__attribute__((noinline)) cudaError_t grow_leaky_buffer(int i) {
    cudaError_t rc = cudaMalloc(&kept[i], 1ull << 30);  // EXPECT-LINE
    if (rc == cudaSuccess) cudaMemset(kept[i], 0, 4096);
    return rc;
}

__attribute__((noinline)) cudaError_t step_work(void) {
    void* work = 0;
    cudaError_t rc = cudaMalloc(&work, 256ull << 20);
    if (rc == cudaSuccess) rc = cudaFree(work);
    return rc;
}

int main(void) {
    int step = 0;
    cudaError_t rc = cudaSuccess;
    for (; step < 4096; step++) {
        if ((rc = step_work()) != cudaSuccess) break;
        if ((rc = grow_leaky_buffer(step)) != cudaSuccess) break;
    }
    printf("stopped: %s\n", cudaGetErrorName(rc));
    return rc == cudaErrorMemoryAllocation ? 3 : 1;
}
