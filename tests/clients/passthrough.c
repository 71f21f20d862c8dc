/*
 * passthrough: calls every runtime entry point the simulation provides, with valid and invalid
 * arguments, and checks each result against the simulation's documented behaviour (see the rules
 * at the top of tests/sim/cudart_sim.c). An interposer that forwards faithfully must not change a
 * single byte of the output.
 *
 * Output (stdout): one line per call: "<call> -> <code> <name>[ <out-parameters>]". A result that
 * differs from the documented one adds a line starting with "MISMATCH". The last line is
 * "mismatches <n>". Pinned host pointers and stack addresses vary between runs and are printed as
 * "host"/"NULL" only; device addresses and handles are deterministic and printed in full.
 * Exit code: the number of mismatches (capped at 125).
 */
#include "cuda_sim.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#define SENTINEL ((void *)(uintptr_t)0xdeadbeefULL)
#define MiB ((size_t)1 << 20)
#define HUGE_REQUEST ((size_t)1 << 50)

static int g_mismatches;

static const char *ptr_text(const void *p, char *buf, size_t n) {
    if (p == NULL) snprintf(buf, n, "NULL");
    else snprintf(buf, n, "0x%012llx", (unsigned long long)(uintptr_t)p);
    return buf;
}
#define PTR(p) ptr_text((p), (char[32]){0}, 32)
#define HOST(p) ((p) == NULL ? "NULL" : ((p) == SENTINEL ? "unwritten" : "host"))

/* Prints one call's line and counts a mismatch when rc differs from expected. */
__attribute__((format(printf, 4, 5))) static void report_line(const char *call, cudaError_t rc,
                                                         cudaError_t expected, const char *fmt,
                                                         ...) {
    printf("%s -> %d %s", call, (int)rc, cudaGetErrorName(rc));
    if (fmt != NULL && fmt[0] != '\0') {
        va_list ap;
        va_start(ap, fmt);
        putchar(' ');
        vprintf(fmt, ap);
        va_end(ap);
    }
    putchar('\n');
    if (rc != expected) {
        printf("MISMATCH %s: expected %d %s\n", call, (int)expected, cudaGetErrorName(expected));
        g_mismatches++;
    }
}

/* Runs the call first, then prints: out-parameters in the format arguments are read after it. */
#define report(call, expr, expected, ...)                                                      \
    do {                                                                                       \
        cudaError_t rc_ = (expr);                                                              \
        report_line((call), rc_, (expected), __VA_ARGS__);                                     \
    } while (0)

static void expect(int ok, const char *what) {
    if (!ok) {
        printf("MISMATCH %s\n", what);
        g_mismatches++;
    }
}

static int g_devices;
static cudaStream_t g_stream;
static cudaMemPool_t g_pool;

__attribute__((noinline)) static void check_devices(void) {
    int n = -1, d = -1;
    cudaError_t rc = cudaGetDeviceCount(&n);
    report("cudaGetDeviceCount(&n)", rc, cudaSuccess, "n=%d", n);
    g_devices = n;
    report("cudaGetDeviceCount(NULL)", cudaGetDeviceCount(NULL), cudaErrorInvalidValue, NULL);
    rc = cudaGetDevice(&d);
    report("cudaGetDevice(&d)", rc, cudaSuccess, "d=%d", d);
    expect(d == 0, "initial device is 0");
    report("cudaGetDevice(NULL)", cudaGetDevice(NULL), cudaErrorInvalidValue, NULL);
    report("cudaSetDevice(-1)", cudaSetDevice(-1), cudaErrorInvalidDevice, NULL);
    report("cudaSetDevice(count)", cudaSetDevice(n), cudaErrorInvalidDevice, NULL);
    report("cudaSetDevice(0)", cudaSetDevice(0), cudaSuccess, NULL);

    struct cudaDeviceProp prop;
    memset(&prop, 0, sizeof prop);
    rc = cudaGetDeviceProperties(&prop, 0);
    report("cudaGetDeviceProperties(&prop, 0)", rc, cudaSuccess, "name=\"%s\"", prop.name);
    expect(strcmp(prop.name, "oomshim simulated device") == 0, "device name");
    memset(&prop, 0, sizeof prop);
    rc = cudaGetDeviceProperties_v2(&prop, 0);
    report("cudaGetDeviceProperties_v2(&prop, 0)", rc, cudaSuccess, "name=\"%s\"", prop.name);
    report("cudaGetDeviceProperties(NULL, 0)", cudaGetDeviceProperties(NULL, 0),
           cudaErrorInvalidValue, NULL);
    report("cudaGetDeviceProperties_v2(NULL, 0)", cudaGetDeviceProperties_v2(NULL, 0),
           cudaErrorInvalidValue, NULL);
    report("cudaGetDeviceProperties(&prop, count)", cudaGetDeviceProperties(&prop, n),
           cudaErrorInvalidDevice, NULL);
    report("cudaGetDeviceProperties_v2(&prop, -1)", cudaGetDeviceProperties_v2(&prop, -1),
           cudaErrorInvalidDevice, NULL);

    size_t free_b = 0, total_b = 0;
    rc = cudaMemGetInfo(&free_b, &total_b);
    report("cudaMemGetInfo(&free, &total)", rc, cudaSuccess, "free=%zu total=%zu", free_b, total_b);
    expect(free_b <= total_b && total_b > 0, "free <= total");
    report("cudaMemGetInfo(NULL, &total)", cudaMemGetInfo(NULL, &total_b), cudaErrorInvalidValue,
           NULL);
    report("cudaMemGetInfo(&free, NULL)", cudaMemGetInfo(&free_b, NULL), cudaErrorInvalidValue,
           NULL);
    report("cudaDeviceSynchronize()", cudaDeviceSynchronize(), cudaSuccess, NULL);
}

__attribute__((noinline)) static void check_errors(void) {
    static const int codes[] = {0, 1, 2, 3, 100, 101, 400, 801, 999, 12345};
    for (size_t i = 0; i < sizeof codes / sizeof codes[0]; i++)
        printf("cudaGetErrorName(%d)=%s cudaGetErrorString(%d)=%s\n", codes[i],
               cudaGetErrorName((cudaError_t)codes[i]), codes[i],
               cudaGetErrorString((cudaError_t)codes[i]));
    cudaGetLastError();
    report("cudaSetDevice(-1)", cudaSetDevice(-1), cudaErrorInvalidDevice, NULL);
    report("cudaPeekAtLastError()", cudaPeekAtLastError(), cudaErrorInvalidDevice, NULL);
    report("cudaGetLastError()", cudaGetLastError(), cudaErrorInvalidDevice, NULL);
    report("cudaGetLastError()", cudaGetLastError(), cudaSuccess, NULL);
}

__attribute__((noinline)) static void check_streams(void) {
    cudaStream_t s = NULL;
    cudaError_t rc = cudaStreamCreate(&s);
    report("cudaStreamCreate(&s)", rc, cudaSuccess, "s=%s", PTR(s));
    expect(s != NULL, "stream handle non-null");
    report("cudaStreamCreate(NULL)", cudaStreamCreate(NULL), cudaErrorInvalidValue, NULL);
    report("cudaStreamSynchronize(s)", cudaStreamSynchronize(s), cudaSuccess, NULL);
    report("cudaStreamSynchronize(NULL)", cudaStreamSynchronize(NULL), cudaSuccess, NULL);
    report("cudaStreamDestroy(s)", cudaStreamDestroy(s), cudaSuccess, NULL);
    report("cudaStreamDestroy(s) again", cudaStreamDestroy(s), cudaErrorInvalidResourceHandle,
           NULL);
    report("cudaStreamSynchronize(destroyed s)", cudaStreamSynchronize(s),
           cudaErrorInvalidResourceHandle, NULL);
    report("cudaStreamDestroy(NULL)", cudaStreamDestroy(NULL), cudaErrorInvalidResourceHandle,
           NULL);
    rc = cudaStreamCreate(&g_stream);
    report("cudaStreamCreate(&work)", rc, cudaSuccess, "s=%s", PTR(g_stream));
    cudaGetLastError();
}

__attribute__((noinline)) static void check_malloc(void) {
    int stack_var = 0;
    void *p = SENTINEL, *q = SENTINEL, *r = SENTINEL;
    size_t used0 = simcuda_used_bytes(0);

    report("cudaMalloc(NULL, 16)", cudaMalloc(NULL, 16), cudaErrorInvalidValue, NULL);
    report("cudaMalloc(&p, 0)", cudaMalloc(&p, 0), cudaSuccess, "p=%s", PTR(p));
    expect(p == NULL, "cudaMalloc size 0 gives NULL");

    report("cudaMalloc(&p, 1000)", cudaMalloc(&p, 1000), cudaSuccess, "p=%s", PTR(p));
    expect(p != NULL && ((uintptr_t)p & 511) == 0, "cudaMalloc pointer 512-aligned");
    expect(simcuda_used_bytes(0) - used0 == 1024, "1000 bytes charged as 1024");
    report("cudaFree(p)", cudaFree(p), cudaSuccess, NULL);
    expect(simcuda_used_bytes(0) == used0, "free uncharges");
    report("cudaFree(p) again", cudaFree(p), cudaErrorInvalidValue, NULL);
    report("cudaMalloc(&q, 1000)", cudaMalloc(&q, 1000), cudaSuccess, "q=%s", PTR(q));
    expect(q == p, "freed address reused");

    report("cudaMalloc(&r, 3 MiB)", cudaMalloc(&r, 3 * MiB), cudaSuccess, "r=%s", PTR(r));
    expect(((uintptr_t)r & (2 * MiB - 1)) == 0, "large allocation 2 MiB-aligned");
    expect(simcuda_used_bytes(0) - used0 == 1024 + 4 * MiB, "3 MiB charged as 4 MiB");
    report("cudaFree(r + 512)", cudaFree((char *)r + 512), cudaErrorInvalidValue, NULL);
    report("cudaFree(r)", cudaFree(r), cudaSuccess, NULL);
    report("cudaFree(q)", cudaFree(q), cudaSuccess, NULL);
    report("cudaFree(NULL)", cudaFree(NULL), cudaSuccess, NULL);
    report("cudaFree(stack address)", cudaFree(&stack_var), cudaErrorInvalidValue, NULL);

    p = SENTINEL;
    report("cudaMalloc(&p, 2^50)", cudaMalloc(&p, HUGE_REQUEST), cudaErrorMemoryAllocation,
           "p=%s", PTR(p));
    expect(p == NULL, "failed cudaMalloc writes NULL");
    p = SENTINEL;
    report("cudaMalloc(&p, SIZE_MAX)", cudaMalloc(&p, SIZE_MAX), cudaErrorMemoryAllocation,
           "p=%s", PTR(p));
    expect(p == NULL, "failed cudaMalloc writes NULL");
    expect(simcuda_used_bytes(0) == used0, "nothing left charged");
    cudaGetLastError();
}

typedef cudaError_t (*malloc_async_fn)(void **, size_t, cudaStream_t);
typedef cudaError_t (*free_async_fn)(void *, cudaStream_t);

__attribute__((noinline)) static void check_async_pair(const char *m, malloc_async_fn ma,
                                                       const char *f, free_async_fn fa) {
    char call[128];
    int stack_var = 0;
    void *p = SENTINEL;
    snprintf(call, sizeof call, "%s(NULL, 16, s)", m);
    report(call, ma(NULL, 16, g_stream), cudaErrorInvalidValue, NULL);
    snprintf(call, sizeof call, "%s(&p, 0, s)", m);
    report(call, ma(&p, 0, g_stream), cudaSuccess, "p=%s", PTR(p));
    expect(p == NULL, "async size 0 gives NULL");
    snprintf(call, sizeof call, "%s(&p, 4096, s)", m);
    report(call, ma(&p, 4096, g_stream), cudaSuccess, "p=%s", PTR(p));
    snprintf(call, sizeof call, "%s(p, s)", f);
    report(call, fa(p, g_stream), cudaSuccess, NULL);
    snprintf(call, sizeof call, "%s(p, s) again", f);
    report(call, fa(p, g_stream), cudaErrorInvalidValue, NULL);
    snprintf(call, sizeof call, "%s(NULL, s)", f);
    report(call, fa(NULL, g_stream), cudaSuccess, NULL);
    snprintf(call, sizeof call, "%s(stack address, s)", f);
    report(call, fa(&stack_var, g_stream), cudaErrorInvalidValue, NULL);
    snprintf(call, sizeof call, "%s(&p, 4096, NULL)", m);
    report(call, ma(&p, 4096, NULL), cudaSuccess, "p=%s", PTR(p));
    report("cudaFree(async p)", cudaFree(p), cudaSuccess, NULL);
    p = SENTINEL;
    snprintf(call, sizeof call, "%s(&p, 2^50, s)", m);
    report(call, ma(&p, HUGE_REQUEST, g_stream), cudaErrorMemoryAllocation, "p=%s", PTR(p));
    expect(p == NULL, "failed async allocation writes NULL");
    cudaGetLastError();
}

typedef cudaError_t (*pool_fn)(void **, size_t, cudaMemPool_t, cudaStream_t);

__attribute__((noinline)) static void check_pool(const char *m, pool_fn pa, const char *f,
                                                 free_async_fn fa) {
    char call[128];
    void *p = SENTINEL;
    snprintf(call, sizeof call, "%s(NULL, 16, pool, s)", m);
    report(call, pa(NULL, 16, g_pool, g_stream), cudaErrorInvalidValue, NULL);
    snprintf(call, sizeof call, "%s(&p, 16, NULL pool, s)", m);
    report(call, pa(&p, 16, NULL, g_stream), cudaErrorInvalidValue, "p=%s", PTR(p));
    expect(p == NULL, "pool failure writes NULL");
    p = SENTINEL;
    snprintf(call, sizeof call, "%s(&p, 0, pool, s)", m);
    report(call, pa(&p, 0, g_pool, g_stream), cudaSuccess, "p=%s", PTR(p));
    expect(p == NULL, "pool size 0 gives NULL");
    snprintf(call, sizeof call, "%s(&p, 2 MiB, pool, s)", m);
    report(call, pa(&p, 2 * MiB, g_pool, g_stream), cudaSuccess, "p=%s", PTR(p));
    snprintf(call, sizeof call, "%s(pool p, s)", f);
    report(call, fa(p, g_stream), cudaSuccess, NULL);
    p = SENTINEL;
    snprintf(call, sizeof call, "%s(&p, 2^50, pool, s)", m);
    report(call, pa(&p, HUGE_REQUEST, g_pool, g_stream), cudaErrorMemoryAllocation, "p=%s",
           PTR(p));
    cudaGetLastError();
}

__attribute__((noinline)) static void check_stream_ordered(void) {
    check_async_pair("cudaMallocAsync", cudaMallocAsync, "cudaFreeAsync", cudaFreeAsync);
    check_async_pair("cudaMallocAsync_ptsz", cudaMallocAsync_ptsz, "cudaFreeAsync_ptsz",
                     cudaFreeAsync_ptsz);
    cudaMemPool_t pool = NULL;
    report("cudaDeviceGetDefaultMemPool(&pool, 0)", cudaDeviceGetDefaultMemPool(&pool, 0),
           cudaSuccess, "pool=%s", PTR(pool));
    g_pool = pool;
    report("cudaDeviceGetDefaultMemPool(NULL, 0)", cudaDeviceGetDefaultMemPool(NULL, 0),
           cudaErrorInvalidValue, NULL);
    report("cudaDeviceGetDefaultMemPool(&pool, count)",
           cudaDeviceGetDefaultMemPool(&pool, g_devices), cudaErrorInvalidDevice, NULL);
    check_pool("cudaMallocFromPoolAsync", cudaMallocFromPoolAsync, "cudaFreeAsync", cudaFreeAsync);
    check_pool("cudaMallocFromPoolAsync_ptsz", cudaMallocFromPoolAsync_ptsz,
               "cudaFreeAsync_ptsz", cudaFreeAsync_ptsz);
}

__attribute__((noinline)) static void check_managed(void) {
    void *a = SENTINEL, *b = SENTINEL, *c = SENTINEL;
    report("cudaMallocManaged(&a, 4096, Global)", cudaMallocManaged(&a, 4096, cudaMemAttachGlobal),
           cudaSuccess, "a=%s", PTR(a));
    report("cudaMallocManaged(&b, 4096, Host)", cudaMallocManaged(&b, 4096, cudaMemAttachHost),
           cudaSuccess, "b=%s", PTR(b));
    report("cudaMallocManaged(&c, 4096, 0)", cudaMallocManaged(&c, 4096, 0),
           cudaErrorInvalidValue, "c=%s", PTR(c));
    expect(c == NULL, "bad managed flags writes NULL");
    c = SENTINEL;
    report("cudaMallocManaged(&c, 4096, 3)", cudaMallocManaged(&c, 4096, 3),
           cudaErrorInvalidValue, "c=%s", PTR(c));
    c = SENTINEL;
    report("cudaMallocManaged(&c, 0, Global)", cudaMallocManaged(&c, 0, cudaMemAttachGlobal),
           cudaErrorInvalidValue, "c=%s", PTR(c));
    expect(c == NULL, "managed size 0 writes NULL");
    report("cudaMallocManaged(NULL, 4096, Global)",
           cudaMallocManaged(NULL, 4096, cudaMemAttachGlobal), cudaErrorInvalidValue, NULL);
    c = SENTINEL;
    report("cudaMallocManaged(&c, 2^50, Global)",
           cudaMallocManaged(&c, HUGE_REQUEST, cudaMemAttachGlobal), cudaErrorMemoryAllocation,
           "c=%s", PTR(c));
    report("cudaFree(a)", cudaFree(a), cudaSuccess, NULL);
    report("cudaFreeAsync(b, s)", cudaFreeAsync(b, g_stream), cudaSuccess, NULL);
    report("cudaFree(a) again", cudaFree(a), cudaErrorInvalidValue, NULL);
    cudaGetLastError();
}

__attribute__((noinline)) static void check_pitched(void) {
    size_t used0 = simcuda_used_bytes(0);
    void *p = SENTINEL, *q = SENTINEL;
    size_t pitch = 7;
    report("cudaMallocPitch(&p, &pitch, 1000, 10)", cudaMallocPitch(&p, &pitch, 1000, 10),
           cudaSuccess, "p=%s pitch=%zu", PTR(p), pitch);
    expect(pitch == 1024, "pitch is width rounded to 512");
    expect(simcuda_used_bytes(0) - used0 == 10240, "pitched bytes charged");
    pitch = 7;
    report("cudaMallocPitch(&q, &pitch, 512, 4)", cudaMallocPitch(&q, &pitch, 512, 4),
           cudaSuccess, "q=%s pitch=%zu", PTR(q), pitch);
    report("cudaMallocPitch(NULL, &pitch, 16, 16)", cudaMallocPitch(NULL, &pitch, 16, 16),
           cudaErrorInvalidValue, NULL);
    void *r = SENTINEL;
    report("cudaMallocPitch(&r, NULL, 16, 16)", cudaMallocPitch(&r, NULL, 16, 16),
           cudaErrorInvalidValue, "r=%s", PTR(r));
    expect(r == NULL, "pitch failure writes NULL");
    r = SENTINEL;
    pitch = 7;
    report("cudaMallocPitch(&r, &pitch, 0, 10)", cudaMallocPitch(&r, &pitch, 0, 10), cudaSuccess,
           "r=%s pitch=%zu", PTR(r), pitch);
    r = SENTINEL;
    pitch = 7;
    report("cudaMallocPitch(&r, &pitch, 2^40, 2^20)",
           cudaMallocPitch(&r, &pitch, (size_t)1 << 40, (size_t)1 << 20),
           cudaErrorMemoryAllocation, "r=%s pitch=%zu", PTR(r), pitch);
    report("cudaFree(p)", cudaFree(p), cudaSuccess, NULL);
    report("cudaFree(q)", cudaFree(q), cudaSuccess, NULL);

    struct cudaPitchedPtr pp = {SENTINEL, 7, 7, 7};
    struct cudaExtent ext = {1000, 10, 4};
    report("cudaMalloc3D(&pp, {1000, 10, 4})", cudaMalloc3D(&pp, ext), cudaSuccess,
           "ptr=%s pitch=%zu xsize=%zu ysize=%zu", PTR(pp.ptr), pp.pitch, pp.xsize, pp.ysize);
    expect(pp.pitch == 1024 && pp.xsize == 1000 && pp.ysize == 10, "3D pitched pointer fields");
    expect(simcuda_used_bytes(0) - used0 == 40960, "3D bytes charged");
    void *keep = pp.ptr;
    report("cudaMalloc3D(NULL, {1000, 10, 4})", cudaMalloc3D(NULL, ext), cudaErrorInvalidValue,
           NULL);
    struct cudaPitchedPtr z = {SENTINEL, 7, 7, 7};
    struct cudaExtent zero = {0, 10, 4};
    report("cudaMalloc3D(&z, {0, 10, 4})", cudaMalloc3D(&z, zero), cudaSuccess,
           "ptr=%s pitch=%zu xsize=%zu ysize=%zu", PTR(z.ptr), z.pitch, z.xsize, z.ysize);
    struct cudaPitchedPtr h = {SENTINEL, 7, 7, 7};
    struct cudaExtent huge = {(size_t)1 << 30, (size_t)1 << 10, (size_t)1 << 10};
    report("cudaMalloc3D(&h, {2^30, 2^10, 2^10})", cudaMalloc3D(&h, huge),
           cudaErrorMemoryAllocation, "ptr=%s pitch=%zu", PTR(h.ptr), h.pitch);
    expect(h.ptr == NULL, "3D failure writes NULL");
    report("cudaFree(3D ptr)", cudaFree(keep), cudaSuccess, NULL);
    expect(simcuda_used_bytes(0) == used0, "pitched frees uncharge");
    cudaGetLastError();
}

__attribute__((noinline)) static void check_pinned(void) {
    int stack_var = 0;
    size_t pinned0 = simcuda_pinned_used_bytes();
    void *h = SENTINEL, *d = SENTINEL;
    report("cudaMallocHost(&h, 4096)", cudaMallocHost(&h, 4096), cudaSuccess, "h=%s", HOST(h));
    if (h != NULL && h != SENTINEL) {
        memset(h, 0xab, 4096);
        expect(((unsigned char *)h)[4095] == 0xab, "pinned memory is writable");
    }
    expect(simcuda_pinned_used_bytes() - pinned0 == 4096, "pinned bytes charged");
    report("cudaFree(pinned h)", cudaFree(h), cudaErrorInvalidValue, NULL);
    report("cudaFreeAsync(pinned h, s)", cudaFreeAsync(h, g_stream), cudaErrorInvalidValue, NULL);
    report("cudaFreeHost(h)", cudaFreeHost(h), cudaSuccess, NULL);
    report("cudaFreeHost(h) again", cudaFreeHost(h), cudaErrorInvalidValue, NULL);
    report("cudaFreeHost(NULL)", cudaFreeHost(NULL), cudaSuccess, NULL);
    report("cudaFreeHost(stack address)", cudaFreeHost(&stack_var), cudaErrorInvalidValue, NULL);
    report("cudaMalloc(&d, 512)", cudaMalloc(&d, 512), cudaSuccess, "d=%s", PTR(d));
    report("cudaFreeHost(device d)", cudaFreeHost(d), cudaErrorInvalidValue, NULL);
    report("cudaFree(d)", cudaFree(d), cudaSuccess, NULL);
    report("cudaMallocHost(NULL, 16)", cudaMallocHost(NULL, 16), cudaErrorInvalidValue, NULL);
    h = SENTINEL;
    report("cudaMallocHost(&h, 0)", cudaMallocHost(&h, 0), cudaSuccess, "h=%s", HOST(h));
    h = SENTINEL;
    report("cudaMallocHost(&h, 2^50)", cudaMallocHost(&h, HUGE_REQUEST),
           cudaErrorMemoryAllocation, "h=%s", HOST(h));

    void *a = SENTINEL, *b = SENTINEL, *c = SENTINEL;
    report("cudaHostAlloc(&a, 4096, Default)", cudaHostAlloc(&a, 4096, cudaHostAllocDefault),
           cudaSuccess, "a=%s", HOST(a));
    report("cudaHostAlloc(&b, 100, Portable|Mapped|WriteCombined)",
           cudaHostAlloc(&b, 100,
                         cudaHostAllocPortable | cudaHostAllocMapped | cudaHostAllocWriteCombined),
           cudaSuccess, "b=%s", HOST(b));
    report("cudaHostAlloc(&c, 4096, 8)", cudaHostAlloc(&c, 4096, 8), cudaErrorInvalidValue,
           "c=%s", HOST(c));
    report("cudaHostAlloc(NULL, 16, Default)", cudaHostAlloc(NULL, 16, 0), cudaErrorInvalidValue,
           NULL);
    report("cudaFreeHost(a)", cudaFreeHost(a), cudaSuccess, NULL);
    report("cudaFreeHost(b)", cudaFreeHost(b), cudaSuccess, NULL);
    expect(simcuda_pinned_used_bytes() == pinned0, "pinned frees uncharge");
    cudaGetLastError();
}

/* ---------- injected errors ---------- */

enum alloc_api {
    A_MALLOC,
    A_ASYNC,
    A_ASYNC_PTSZ,
    A_POOL,
    A_POOL_PTSZ,
    A_MANAGED,
    A_PITCH,
    A_3D,
    A_HOST,
    A_HOSTALLOC,
    A_COUNT
};

static const char *const g_alloc_names[A_COUNT] = {
    "cudaMalloc",   "cudaMallocAsync", "cudaMallocAsync_ptsz", "cudaMallocFromPoolAsync",
    "cudaMallocFromPoolAsync_ptsz", "cudaMallocManaged", "cudaMallocPitch", "cudaMalloc3D",
    "cudaMallocHost", "cudaHostAlloc",
};

static cudaError_t call_alloc(int api, void **out) {
    size_t pitch = 0;
    struct cudaPitchedPtr pp = {SENTINEL, 0, 0, 0};
    struct cudaExtent ext = {256, 2, 2};
    cudaError_t rc;
    switch (api) {
    case A_MALLOC: return cudaMalloc(out, 4096);
    case A_ASYNC: return cudaMallocAsync(out, 4096, g_stream);
    case A_ASYNC_PTSZ: return cudaMallocAsync_ptsz(out, 4096, g_stream);
    case A_POOL: return cudaMallocFromPoolAsync(out, 4096, g_pool, g_stream);
    case A_POOL_PTSZ: return cudaMallocFromPoolAsync_ptsz(out, 4096, g_pool, g_stream);
    case A_MANAGED: return cudaMallocManaged(out, 4096, cudaMemAttachGlobal);
    case A_PITCH: return cudaMallocPitch(out, &pitch, 256, 8);
    case A_3D:
        rc = cudaMalloc3D(&pp, ext);
        *out = pp.ptr;
        return rc;
    case A_HOST: return cudaMallocHost(out, 4096);
    default: return cudaHostAlloc(out, 4096, cudaHostAllocDefault);
    }
}

static cudaError_t call_release(int api, void *p) {
    if (api == A_HOST || api == A_HOSTALLOC) return cudaFreeHost(p);
    return cudaFree(p);
}

__attribute__((noinline)) static void check_injection(void) {
    static const int codes[] = {1, 2, 3, 100, 101, 801, 999};
    const int ncodes = (int)(sizeof codes / sizeof codes[0]);
    char call[160];
    for (int api = 0; api < A_COUNT; api++) {
        for (int i = 0; i < ncodes; i++) {
            size_t used0 = simcuda_used_bytes(0), pinned0 = simcuda_pinned_used_bytes();
            size_t live0 = simcuda_live_allocations();
            void *p = SENTINEL;
            simcuda_inject_error(codes[i], 1);
            cudaError_t rc = call_alloc(api, &p);
            snprintf(call, sizeof call, "inject %d: %s", codes[i], g_alloc_names[api]);
            report(call, rc, (cudaError_t)codes[i], "p=%s", PTR(p));
            expect(p == NULL, "injected failure writes NULL");
            expect(simcuda_used_bytes(0) == used0 && simcuda_pinned_used_bytes() == pinned0 &&
                       simcuda_live_allocations() == live0,
                   "injected failure has no side effect");
            cudaError_t last = cudaGetLastError();
            expect(last == (cudaError_t)codes[i], "injected failure sets the last error");
        }
        /* The injection is used up: the same call now succeeds. */
        void *p = SENTINEL;
        cudaError_t rc = call_alloc(api, &p);
        snprintf(call, sizeof call, "after injection: %s", g_alloc_names[api]);
        int host = api == A_HOST || api == A_HOSTALLOC;
        report(call, rc, cudaSuccess, "p=%s", host ? HOST(p) : PTR(p));
        snprintf(call, sizeof call, "after injection: free %s", g_alloc_names[api]);
        report(call, call_release(api, p), cudaSuccess, NULL);
    }

    /* Free calls: an injected failure leaves the allocation live. */
    static const char *const free_names[] = {"cudaFree", "cudaFreeAsync", "cudaFreeAsync_ptsz",
                                             "cudaFreeHost"};
    for (int f = 0; f < 4; f++) {
        for (int i = 0; i < ncodes; i++) {
            void *p = NULL;
            cudaError_t rc = f == 3 ? cudaMallocHost(&p, 4096) : cudaMalloc(&p, 4096);
            expect(rc == cudaSuccess, "allocation before injected free");
            simcuda_inject_error(codes[i], 1);
            switch (f) {
            case 0: rc = cudaFree(p); break;
            case 1: rc = cudaFreeAsync(p, g_stream); break;
            case 2: rc = cudaFreeAsync_ptsz(p, g_stream); break;
            default: rc = cudaFreeHost(p); break;
            }
            snprintf(call, sizeof call, "inject %d: %s(p)", codes[i], free_names[f]);
            report(call, rc, (cudaError_t)codes[i], NULL);
            snprintf(call, sizeof call, "after injection: %s(p)", free_names[f]);
            rc = f == 3 ? cudaFreeHost(p) : cudaFree(p);
            report(call, rc, cudaSuccess, NULL);
            cudaGetLastError();
        }
    }

    /* Count and cancellation. */
    void *p = SENTINEL, *q = SENTINEL, *r = SENTINEL;
    report("simcuda_inject_error(2, 2)", (cudaError_t)simcuda_inject_error(2, 2), cudaSuccess,
           NULL);
    report("inject 2 x2: cudaMalloc(&p) #1", cudaMalloc(&p, 512), cudaErrorMemoryAllocation,
           "p=%s", PTR(p));
    report("inject 2 x2: cudaMalloc(&q) #2", cudaMalloc(&q, 512), cudaErrorMemoryAllocation,
           "q=%s", PTR(q));
    report("inject 2 x2: cudaMalloc(&r) #3", cudaMalloc(&r, 512), cudaSuccess, "r=%s", PTR(r));
    report("cudaFree(r)", cudaFree(r), cudaSuccess, NULL);
    simcuda_inject_error(999, 5);
    int pending = simcuda_inject_error(0, 0);
    printf("simcuda_inject_error(0, 0) cancelled %d pending\n", pending);
    expect(pending == 5, "cancel reports pending injections");
    r = SENTINEL;
    report("after cancel: cudaMalloc(&r, 512)", cudaMalloc(&r, 512), cudaSuccess, "r=%s",
           PTR(r));
    report("cudaFree(r)", cudaFree(r), cudaSuccess, NULL);
    cudaGetLastError();
}

int main(void) {
    check_devices();
    check_errors();
    check_streams();
    check_malloc();
    check_stream_ordered();
    check_managed();
    check_pitched();
    check_pinned();
    check_injection();
    report("cudaStreamDestroy(work)", cudaStreamDestroy(g_stream), cudaSuccess, NULL);
    printf("used_bytes %zu pinned_used_bytes %zu live_allocations %zu\n", simcuda_used_bytes(0),
           simcuda_pinned_used_bytes(), simcuda_live_allocations());
    expect(simcuda_used_bytes(0) == 0 && simcuda_pinned_used_bytes() == 0 &&
               simcuda_live_allocations() == 0,
           "everything freed at the end");
    printf("mismatches %d\n", g_mismatches);
    return g_mismatches > 125 ? 125 : g_mismatches;
}
