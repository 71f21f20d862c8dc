/*
 * py_pairs: one cudaMalloc(bytes)+cudaFree pair, called from Python through ctypes by
 * benches/py_pairs.py, so that the shim records the Python stack of its caller. Built by
 * benches/hook_instructions.rs with gcc -O2 as a shared library, linked against the simulated
 * runtime. Returns the first CUDA error, 0 on success.
 */
#include "cuda_sim.h"

int py_pair(size_t bytes) {
    void *p = NULL;
    cudaError_t rc = cudaMalloc(&p, bytes);
    if (rc == cudaSuccess) rc = cudaFree(p);
    return (int)rc;
}
