/*
 * cuda_sim.h — the subset of the CUDA runtime API that oomshim's simulated libcudart.so.13
 * implements and its test clients call. Written for this project from the documented ABI
 * (type layouts, error-code values and prototypes are those of the real runtime); it is not a
 * copy of NVIDIA's headers and declares nothing beyond what the simulation provides.
 *
 * Also declares the simulation's control functions (simcuda_*), which exist only in the sim.
 */
#ifndef OOMSHIM_CUDA_SIM_H
#define OOMSHIM_CUDA_SIM_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Error codes: numeric values are the real runtime's. */
enum cudaError {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorInitializationError = 3,
    cudaErrorNoDevice = 100,
    cudaErrorInvalidDevice = 101,
    cudaErrorInvalidResourceHandle = 400,
    cudaErrorIllegalState = 401,
    cudaErrorNotReady = 600,
    cudaErrorSymbolNotFound = 500,
    cudaErrorNotSupported = 801,
    cudaErrorStreamCaptureUnsupported = 900,
    cudaErrorStreamCaptureInvalidated = 901,
    cudaErrorUnknown = 999
};
typedef enum cudaError cudaError_t;

/* Opaque handles, as in the real runtime. */
typedef struct CUstream_st *cudaStream_t;
typedef struct CUmemPoolHandle_st *cudaMemPool_t;
typedef struct CUevent_st *cudaEvent_t;
typedef struct CUgraph_st *cudaGraph_t;

/* Special stream handles. */
#define cudaStreamLegacy ((cudaStream_t)0x1)
#define cudaStreamPerThread ((cudaStream_t)0x2)

/* cudaMallocManaged flags. */
#define cudaMemAttachGlobal 0x01
#define cudaMemAttachHost 0x02

/* cudaHostAlloc flags. */
#define cudaHostAllocDefault 0x00
#define cudaHostAllocPortable 0x01
#define cudaHostAllocMapped 0x02
#define cudaHostAllocWriteCombined 0x04

struct cudaExtent {
    size_t width;  /* bytes */
    size_t height; /* rows */
    size_t depth;  /* slices */
};

struct cudaPitchedPtr {
    void *ptr;
    size_t pitch;
    size_t xsize;
    size_t ysize;
};

/*
 * Device properties. The real struct begins with `char name[256]`; the simulation writes only
 * that field. The rest is reserved space, at least as large as the real struct, so a caller's
 * buffer is always big enough.
 */
struct cudaDeviceProp {
    char name[256];
    unsigned char reserved_[4096];
};

/* Device management */
cudaError_t cudaGetDeviceCount(int *count);
cudaError_t cudaSetDevice(int device);
cudaError_t cudaGetDevice(int *device);
cudaError_t cudaDeviceSynchronize(void);
cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *prop, int device);
cudaError_t cudaGetDeviceProperties_v2(struct cudaDeviceProp *prop, int device);
cudaError_t cudaMemGetInfo(size_t *free, size_t *total);

/* Errors */
cudaError_t cudaGetLastError(void);
cudaError_t cudaPeekAtLastError(void);
const char *cudaGetErrorString(cudaError_t error);
const char *cudaGetErrorName(cudaError_t error);

/* Streams */
cudaError_t cudaStreamCreate(cudaStream_t *stream);
cudaError_t cudaStreamDestroy(cudaStream_t stream);
cudaError_t cudaStreamSynchronize(cudaStream_t stream);

/* Events and stream capture (mode: 0 global, 1 thread-local, 2 relaxed; capture status:
   0 none, 1 active, 2 invalidated) */
cudaError_t cudaEventCreate(cudaEvent_t *event);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned int flags);
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream);
cudaError_t cudaEventQuery(cudaEvent_t event);
cudaError_t cudaEventSynchronize(cudaEvent_t event);
cudaError_t cudaEventDestroy(cudaEvent_t event);
cudaError_t cudaStreamBeginCapture(cudaStream_t stream, int mode);
cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t *graph);
cudaError_t cudaStreamIsCapturing(cudaStream_t stream, int *status);
cudaError_t cudaStreamGetCaptureInfo(cudaStream_t stream, int *status, unsigned long long *id,
                                     void *graph, void *deps, void *edges, size_t *count);
cudaError_t cudaThreadExchangeStreamCaptureMode(int *mode);

/* Device memory */
cudaError_t cudaMalloc(void **devPtr, size_t size);
cudaError_t cudaFree(void *devPtr);
cudaError_t cudaMallocManaged(void **devPtr, size_t size, unsigned int flags);
cudaError_t cudaMallocPitch(void **devPtr, size_t *pitch, size_t width, size_t height);
cudaError_t cudaMalloc3D(struct cudaPitchedPtr *pitchedDevPtr, struct cudaExtent extent);

/* Stream-ordered allocator */
cudaError_t cudaMallocAsync(void **devPtr, size_t size, cudaStream_t stream);
cudaError_t cudaFreeAsync(void *devPtr, cudaStream_t stream);
cudaError_t cudaMallocFromPoolAsync(void **ptr, size_t size, cudaMemPool_t memPool,
                                    cudaStream_t stream);
cudaError_t cudaMallocAsync_ptsz(void **devPtr, size_t size, cudaStream_t stream);
cudaError_t cudaFreeAsync_ptsz(void *devPtr, cudaStream_t stream);
cudaError_t cudaMallocFromPoolAsync_ptsz(void **ptr, size_t size, cudaMemPool_t memPool,
                                         cudaStream_t stream);
cudaError_t cudaDeviceGetDefaultMemPool(cudaMemPool_t *memPool, int device);

/* Driver entry points (driverStatus: cudaDriverEntryPointQueryResult; 0 = success) */
cudaError_t cudaGetDriverEntryPoint(const char *symbol, void **funcPtr, unsigned long long flags,
                                    int *driverStatus);
cudaError_t cudaGetDriverEntryPointByVersion(const char *symbol, void **funcPtr,
                                             unsigned int cudaVersion, unsigned long long flags,
                                             int *driverStatus);

/* Pinned host memory */
cudaError_t cudaMallocHost(void **ptr, size_t size);
cudaError_t cudaHostAlloc(void **pHost, size_t size, unsigned int flags);
cudaError_t cudaFreeHost(void *ptr);

/*
 * Simulation control (not part of CUDA).
 *
 * simcuda_inject_error(code, count): the next `count` allocation or free calls (any API above
 *   that allocates or frees device, managed or pinned memory) return `code` with no side effect
 *   other than writing NULL to the allocation's pointer out-parameter when it is non-NULL.
 *   Replaces any pending injection; code 0 or count <= 0 cancels it. Returns the number of
 *   injected failures that were still pending.
 * simcuda_used_bytes(device): bytes charged to live allocations on `device` (excluding the
 *   context overhead and other-process bytes); 0 for a bad device index.
 * simcuda_pinned_used_bytes(): bytes charged to live pinned host allocations.
 * simcuda_live_allocations(): number of live device + managed + pinned allocations.
 * simcuda_device_queries(): number of cudaMemGetInfo and cudaGetDeviceProperties[_v2] calls so
 *   far, whoever made them (the program or an interposer).
 */
int simcuda_inject_error(int code, int count);
/* simcuda_stream_launch(stream): queues one unit of simulated work (a kernel) on the stream; it
 *   completes at the next cudaStreamSynchronize/cudaDeviceSynchronize/cudaEventSynchronize of an
 *   event after it, or simcuda_stream_complete(stream). 0, or -1 for an unknown stream. */
int simcuda_stream_launch(cudaStream_t stream);
int simcuda_stream_complete(cudaStream_t stream);
size_t simcuda_used_bytes(int device);
size_t simcuda_pinned_used_bytes(void);
size_t simcuda_live_allocations(void);
unsigned long simcuda_device_queries(void);

#ifdef __cplusplus
}
#endif

#endif /* OOMSHIM_CUDA_SIM_H */
