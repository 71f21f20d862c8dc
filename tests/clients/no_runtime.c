/*
 * A program with no CUDA runtime at all that still calls cudaMalloc, found by name at run time:
 * under the shim the name resolves to the shim's hook, which has no real function to forward to.
 * It must answer with the runtime's own error code, once say why on stderr, and never crash.
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stddef.h>

typedef int (*cuda_malloc_fn)(void **, size_t);
typedef int (*cuda_free_fn)(void *);

int main(void) {
    cuda_malloc_fn cuda_malloc = (cuda_malloc_fn)dlsym(RTLD_DEFAULT, "cudaMalloc");
    cuda_free_fn cuda_free = (cuda_free_fn)dlsym(RTLD_DEFAULT, "cudaFree");
    if (cuda_malloc == NULL || cuda_free == NULL) {
        printf("no cudaMalloc in this process\n");
        return 0;
    }
    void *p = (void *)0x1;
    int rc = cuda_malloc(&p, 1024);
    printf("cudaMalloc -> %d, out %s\n", rc, p == (void *)0x1 ? "untouched" : "written");
    printf("cudaFree -> %d\n", cuda_free(NULL));
    return 0;
}
