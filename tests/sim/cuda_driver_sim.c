/*
 * cuda_driver_sim.c — a simulated CUDA driver, built as libcuda.so.1, for testing oomshim's
 * driver hooks on machines without a GPU. Like the real libcuda it exports unversioned symbols
 * whose names carry the ABI version (cuMemAlloc_v2 next to the legacy 32-bit cuMemAlloc), and
 * hands out functions by base name and version through cuGetProcAddress_v2.
 *
 * Simulation rules (tests rely on these):
 *   - Devices, capacity, context and other-process bytes: the same SIMCUDA_DEVICES,
 *     SIMCUDA_CAPACITY, SIMCUDA_CONTEXT_BYTES (charged at the first allocation on a device),
 *     SIMCUDA_OTHER_PROCESS_BYTES and SIMCUDA_PINNED_CAPACITY as the simulated runtime, with its
 *     defaults (1 device, 8 GiB, 256 MiB, 0, 4 GiB).
 *   - Contexts: each device has one (primary) context, cuDevicePrimaryCtxRetain's handle; the
 *     calling thread's current context is set by cuCtxSetCurrent and is device 0's until then
 *     (and after cuCtxSetCurrent(NULL)). cuCtxGetDevice, cuMemGetInfo, cuMemAlloc* and
 *     cuMemAllocAsync act on the current context's device.
 *   - SIMCUDA_MEMINFO_DELAY_MS (default 0): cuMemGetInfo takes that long (a busy device), with no
 *     lock of the driver held; tests use it to hold a caller inside its on-demand dump.
 *   - Charging: 512 B granularity, 2 MiB above 1 MiB. CUDA_ERROR_OUT_OF_MEMORY when the device
 *     is full. Addresses are fake, bump-allocated from 0x6e0000000000 + (device << 36), never
 *     reused.
 *   - Stream-ordered allocations come from the device's default pool (or the given pool, which
 *     must be a default pool). A free returns the bytes to the pool, which keeps them reserved
 *     (still charged to the device) and reuses them for later pool allocations;
 *     cuMemPoolTrimTo releases them. cuMemPoolGetAttribute reports RESERVED/USED_MEM_CURRENT.
 *   - VMM: cuMemCreate charges the device of prop->location (host locations charge pinned
 *     memory); cuMemRelease of a mapped handle keeps the memory until its last cuMemUnmap;
 *     cuMemAddressReserve hands out ranges from 0x500000000000 upward; cuMemMap needs a
 *     reserved range and a live handle.
 *   - cuGetProcAddress_v2(symbol, pfn, version, flags, status): the newest entry of `symbol`
 *     whose version is <= `version` ("cuMemAlloc" below 3020 is the legacy cuMemAlloc, from
 *     3020 cuMemAlloc_v2); with CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM the _ptsz entry
 *     where one exists. Unknown symbol: CUDA_ERROR_NOT_FOUND, *pfn = NULL, status
 *     SYMBOL_NOT_FOUND; too new: status VERSION_NOT_SUFFICIENT.
 *   - simcu_inject_error(code, count): the next `count` allocation calls return `code`.
 *   - cuDeviceGetUuid[_v2]: 5e 1d DEVICE 13 14 … 1f (GPU-5e1d0013-… for device 0).
 *
 * Internal calls never go through an exported function.
 */
#define _GNU_SOURCE
#include "cuda_driver_sim.h"

#include <ctype.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define KiB ((size_t)1024)
#define MiB (KiB * 1024)
#define GiB (MiB * 1024)
#define MAX_DEVICES 64
#define VA_BASE ((uintptr_t)0x6e0000000000ULL)
#define RESERVE_BASE ((uintptr_t)0x500000000000ULL)
#define POOL_BASE ((uintptr_t)0x4d0000001000ULL)
#define POOL_STRIDE ((uintptr_t)0x1000)
#define CTX_BASE ((uintptr_t)0x3c0000001000ULL)
#define CTX_STRIDE ((uintptr_t)0x1000)

enum kind { K_DEVICE, K_MANAGED, K_POOL, K_PINNED };

struct block {
    uintptr_t addr;
    size_t charged;
    int device;
    int kind;
    struct block *next;
};

struct handle {
    CUmemGenericAllocationHandle id;
    size_t size;
    int device; /* -1: host */
    int maps;
    int released;
    struct handle *next;
};

struct mapping {
    uintptr_t va;
    size_t size;
    struct handle *h;
    struct mapping *next;
};

struct reserve {
    uintptr_t va;
    size_t size;
    struct reserve *next;
};

static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static int g_devices;
static size_t g_capacity, g_context_bytes, g_other, g_pinned_capacity;
static size_t g_used[MAX_DEVICES], g_pool_reserved[MAX_DEVICES], g_pool_used[MAX_DEVICES];
static int g_context[MAX_DEVICES];
static uintptr_t g_bump[MAX_DEVICES];
static uintptr_t g_reserve_bump = RESERVE_BASE;
static size_t g_pinned_used;
static struct block *g_blocks;
static struct handle *g_handles;
static struct mapping *g_mappings;
static struct reserve *g_reserves;
static CUmemGenericAllocationHandle g_next_handle = 0x1001;
static int g_inject_code, g_inject_count;
static size_t g_meminfo_delay_ms;
/* The device of the calling thread's current context. */
static __thread int t_device;

static size_t env_size(const char *name, size_t dflt) {
    const char *s = getenv(name);
    if (s == NULL || !isdigit((unsigned char)*s)) return dflt;
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    switch (*end) {
    case 'k': case 'K': v <<= 10; break;
    case 'm': case 'M': v <<= 20; break;
    case 'g': case 'G': v <<= 30; break;
    case 't': case 'T': v <<= 40; break;
    default: break;
    }
    return (size_t)v;
}

static void init(void) {
    g_devices = (int)env_size("SIMCUDA_DEVICES", 1);
    if (g_devices > MAX_DEVICES) g_devices = MAX_DEVICES;
    g_capacity = env_size("SIMCUDA_CAPACITY", 8 * GiB);
    g_context_bytes = env_size("SIMCUDA_CONTEXT_BYTES", 256 * MiB);
    g_other = env_size("SIMCUDA_OTHER_PROCESS_BYTES", 0);
    g_pinned_capacity = env_size("SIMCUDA_PINNED_CAPACITY", 4 * GiB);
    g_meminfo_delay_ms = env_size("SIMCUDA_MEMINFO_DELAY_MS", 0);
    for (int d = 0; d < MAX_DEVICES; d++) g_bump[d] = VA_BASE + ((uintptr_t)d << 36);
}

static void lock(void) {
    pthread_once(&g_once, init);
    pthread_mutex_lock(&g_lock);
}
static void unlock(void) { pthread_mutex_unlock(&g_lock); }

static size_t round_up(size_t v, size_t to) { return (v + to - 1) / to * to; }
static size_t charged_size(size_t r) { return r > MiB ? round_up(r, 2 * MiB) : round_up(r, 512); }

static size_t in_use(int d) {
    return g_used[d] + (g_context[d] ? g_context_bytes : 0) + (d == 0 ? g_other : 0);
}

/* Charges `bytes` to device d (context first); CUDA_ERROR_OUT_OF_MEMORY when it does not fit. */
static CUresult charge(int d, size_t bytes) {
    if (g_devices == 0) return CUDA_ERROR_NO_DEVICE;
    if (d < 0 || d >= g_devices) return CUDA_ERROR_INVALID_DEVICE;
    size_t ctx = g_context[d] ? 0 : g_context_bytes;
    size_t used = in_use(d);
    if (used > g_capacity || bytes > g_capacity - used || ctx > g_capacity - used - bytes)
        return CUDA_ERROR_OUT_OF_MEMORY;
    g_context[d] = 1;
    g_used[d] += bytes;
    return CUDA_SUCCESS;
}

static CUresult injected(void) {
    if (g_inject_count <= 0) return CUDA_SUCCESS;
    g_inject_count--;
    return (CUresult)g_inject_code;
}

static struct block *new_block(int d, size_t charged, int kind) {
    struct block *b = calloc(1, sizeof *b);
    if (b == NULL) return NULL;
    uintptr_t at = g_bump[d];
    if (charged > MiB) at = (at + 2 * MiB - 1) & ~(uintptr_t)(2 * MiB - 1);
    g_bump[d] = at + charged;
    b->addr = at;
    b->charged = charged;
    b->device = d;
    b->kind = kind;
    b->next = g_blocks;
    g_blocks = b;
    return b;
}

static struct block *unlink_block(uintptr_t addr, int pinned) {
    for (struct block **pp = &g_blocks; *pp != NULL; pp = &(*pp)->next) {
        struct block *b = *pp;
        if (b->addr == addr && (b->kind == K_PINNED) == pinned) {
            *pp = b->next;
            return b;
        }
    }
    return NULL;
}

static CUresult device_alloc(CUdeviceptr *dptr, size_t size, int kind) {
    if (dptr == NULL) return CUDA_ERROR_INVALID_VALUE;
    *dptr = 0;
    if (size == 0) return CUDA_ERROR_INVALID_VALUE;
    lock();
    CUresult rc = injected();
    int d = t_device;
    size_t c = charged_size(size);
    if (rc == CUDA_SUCCESS) rc = charge(d, c);
    if (rc == CUDA_SUCCESS) {
        struct block *b = new_block(d, c, kind);
        if (b == NULL) {
            g_used[d] -= c;
            rc = CUDA_ERROR_OUT_OF_MEMORY;
        } else {
            *dptr = b->addr;
        }
    }
    unlock();
    return rc;
}

static CUresult device_free(CUdeviceptr p) {
    if (p == 0) return CUDA_SUCCESS;
    lock();
    struct block *b = unlink_block((uintptr_t)p, 0);
    CUresult rc = CUDA_ERROR_INVALID_VALUE;
    if (b != NULL) {
        if (b->kind == K_POOL) {
            g_pool_used[b->device] -= b->charged; /* stays reserved in the pool */
        } else {
            g_used[b->device] -= b->charged;
        }
        free(b);
        rc = CUDA_SUCCESS;
    }
    unlock();
    return rc;
}

static CUresult pool_device(CUmemoryPool pool, int *d) {
    uintptr_t h = (uintptr_t)pool;
    if (h < POOL_BASE || (h - POOL_BASE) % POOL_STRIDE != 0) return CUDA_ERROR_INVALID_VALUE;
    uintptr_t i = (h - POOL_BASE) / POOL_STRIDE;
    if (i >= (uintptr_t)g_devices) return CUDA_ERROR_INVALID_VALUE;
    *d = (int)i;
    return CUDA_SUCCESS;
}

static CUresult pool_alloc(CUdeviceptr *dptr, size_t size, int d) {
    if (dptr == NULL) return CUDA_ERROR_INVALID_VALUE;
    *dptr = 0;
    if (size == 0) return CUDA_ERROR_INVALID_VALUE;
    size_t c = charged_size(size);
    CUresult rc = injected();
    if (rc != CUDA_SUCCESS) return rc;
    if (g_pool_reserved[d] - g_pool_used[d] < c) {
        rc = charge(d, c);
        if (rc != CUDA_SUCCESS) return rc;
        g_pool_reserved[d] += c;
    }
    struct block *b = new_block(d, c, K_POOL);
    if (b == NULL) return CUDA_ERROR_OUT_OF_MEMORY;
    g_pool_used[d] += c;
    *dptr = b->addr;
    return CUDA_SUCCESS;
}

static CUresult host_alloc(void **pp, size_t size) {
    if (pp == NULL) return CUDA_ERROR_INVALID_VALUE;
    *pp = NULL;
    if (size == 0) return CUDA_ERROR_INVALID_VALUE;
    lock();
    CUresult rc = injected();
    size_t c = round_up(size, 4096);
    if (rc == CUDA_SUCCESS && c > g_pinned_capacity - g_pinned_used) rc = CUDA_ERROR_OUT_OF_MEMORY;
    void *p = NULL;
    if (rc == CUDA_SUCCESS && posix_memalign(&p, 4096, c) != 0) rc = CUDA_ERROR_OUT_OF_MEMORY;
    if (rc == CUDA_SUCCESS) {
        struct block *b = calloc(1, sizeof *b);
        b->addr = (uintptr_t)p;
        b->charged = c;
        b->device = -1;
        b->kind = K_PINNED;
        b->next = g_blocks;
        g_blocks = b;
        g_pinned_used += c;
        *pp = p;
    }
    unlock();
    return rc;
}

/* ---------- exported: init and devices ---------- */

CUresult cuInit(unsigned int flags) {
    pthread_once(&g_once, init);
    return flags == 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult cuDriverGetVersion(int *version) {
    if (version == NULL) return CUDA_ERROR_INVALID_VALUE;
    *version = 13000;
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetCount(int *count) {
    pthread_once(&g_once, init);
    if (count == NULL) return CUDA_ERROR_INVALID_VALUE;
    *count = g_devices;
    return CUDA_SUCCESS;
}

CUresult cuDeviceGet(CUdevice *device, int ordinal) {
    pthread_once(&g_once, init);
    if (device == NULL) return CUDA_ERROR_INVALID_VALUE;
    if (ordinal < 0 || ordinal >= g_devices) return CUDA_ERROR_INVALID_DEVICE;
    *device = ordinal;
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetName(char *name, int len, CUdevice dev) {
    pthread_once(&g_once, init);
    if (name == NULL || len <= 0) return CUDA_ERROR_INVALID_VALUE;
    if (dev < 0 || dev >= g_devices) return CUDA_ERROR_INVALID_DEVICE;
    snprintf(name, (size_t)len, "oomshim simulated driver device");
    return CUDA_SUCCESS;
}

/* UUID bytes: 0x5e 0x1d, then the device ordinal, then a fixed pattern (GPU-5e1d00… for
 * device 0): stable across processes, distinct across devices, as real UUIDs are. */
CUresult cuDeviceGetUuid_v2(CUuuid *uuid, CUdevice dev) {
    pthread_once(&g_once, init);
    if (uuid == NULL) return CUDA_ERROR_INVALID_VALUE;
    if (dev < 0 || dev >= g_devices) return CUDA_ERROR_INVALID_DEVICE;
    uuid->bytes[0] = 0x5e;
    uuid->bytes[1] = 0x1d;
    uuid->bytes[2] = (char)dev;
    for (int i = 3; i < 16; i++) uuid->bytes[i] = (char)(0x10 + i);
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetUuid(CUuuid *uuid, CUdevice dev) { return cuDeviceGetUuid_v2(uuid, dev); }

CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev) {
    pthread_once(&g_once, init);
    if (pctx == NULL) return CUDA_ERROR_INVALID_VALUE;
    if (dev < 0 || dev >= g_devices) return CUDA_ERROR_INVALID_DEVICE;
    *pctx = (CUcontext)(CTX_BASE + (uintptr_t)dev * CTX_STRIDE);
    return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev) {
    pthread_once(&g_once, init);
    return dev < 0 || dev >= g_devices ? CUDA_ERROR_INVALID_DEVICE : CUDA_SUCCESS;
}

CUresult cuCtxSetCurrent(CUcontext ctx) {
    pthread_once(&g_once, init);
    if (ctx == NULL) {
        t_device = 0;
        return CUDA_SUCCESS;
    }
    uintptr_t h = (uintptr_t)ctx;
    if (h < CTX_BASE || (h - CTX_BASE) % CTX_STRIDE != 0 ||
        (h - CTX_BASE) / CTX_STRIDE >= (uintptr_t)g_devices)
        return CUDA_ERROR_INVALID_CONTEXT;
    t_device = (int)((h - CTX_BASE) / CTX_STRIDE);
    return CUDA_SUCCESS;
}

CUresult cuCtxGetCurrent(CUcontext *pctx) {
    if (pctx == NULL) return CUDA_ERROR_INVALID_VALUE;
    *pctx = (CUcontext)(CTX_BASE + (uintptr_t)t_device * CTX_STRIDE);
    return CUDA_SUCCESS;
}

CUresult cuCtxGetDevice(CUdevice *device) {
    if (device == NULL) return CUDA_ERROR_INVALID_VALUE;
    *device = t_device;
    return CUDA_SUCCESS;
}

CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total_bytes) {
    if (free_bytes == NULL || total_bytes == NULL) return CUDA_ERROR_INVALID_VALUE;
    pthread_once(&g_once, init);
    if (g_meminfo_delay_ms > 0) {
        struct timespec ts = {(time_t)(g_meminfo_delay_ms / 1000),
                              (long)(g_meminfo_delay_ms % 1000) * 1000000L};
        while (nanosleep(&ts, &ts) != 0) {
        }
    }
    int d = t_device;
    lock();
    CUresult rc = charge(d, 0); /* creates the context, as the real call does */
    if (rc == CUDA_SUCCESS) {
        size_t u = in_use(d);
        *free_bytes = u >= g_capacity ? 0 : g_capacity - u;
        *total_bytes = g_capacity;
    }
    unlock();
    return rc;
}

/* ---------- exported: device memory ---------- */

CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize) {
    return device_alloc(dptr, bytesize, K_DEVICE);
}

/* The legacy 32-bit ABI (CUDA < 3.2): a different function, never tracked by the shim. */
CUresult cuMemAlloc(unsigned int *dptr, unsigned int bytesize) {
    if (dptr == NULL) return CUDA_ERROR_INVALID_VALUE;
    CUdeviceptr p = 0;
    CUresult rc = device_alloc(&p, bytesize, K_DEVICE);
    *dptr = (unsigned int)p;
    return rc;
}

CUresult cuMemFree_v2(CUdeviceptr dptr) { return device_free(dptr); }

CUresult cuMemFree(unsigned int dptr) { return device_free(dptr); }

CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pitch, size_t width, size_t height,
                            unsigned int elementSizeBytes) {
    if (dptr == NULL || pitch == NULL || width == 0 || height == 0 ||
        (elementSizeBytes != 4 && elementSizeBytes != 8 && elementSizeBytes != 16))
        return CUDA_ERROR_INVALID_VALUE;
    size_t p = round_up(width, 512);
    CUresult rc = device_alloc(dptr, p * height, K_DEVICE);
    if (rc == CUDA_SUCCESS) *pitch = p;
    return rc;
}

CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags) {
    if (flags != 1 && flags != 2) return CUDA_ERROR_INVALID_VALUE;
    return device_alloc(dptr, bytesize, K_MANAGED);
}

/* ---------- exported: stream-ordered allocator ---------- */

static CUresult alloc_async(CUdeviceptr *dptr, size_t size) {
    lock();
    CUresult rc = pool_alloc(dptr, size, t_device);
    unlock();
    return rc;
}

static CUresult alloc_from_pool(CUdeviceptr *dptr, size_t size, CUmemoryPool pool) {
    lock();
    int d = 0;
    CUresult rc = pool_device(pool, &d);
    if (rc == CUDA_SUCCESS) rc = pool_alloc(dptr, size, d);
    else if (dptr != NULL) *dptr = 0;
    unlock();
    return rc;
}

CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream stream) {
    (void)stream;
    return alloc_async(dptr, bytesize);
}

CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream stream) {
    (void)stream;
    return alloc_async(dptr, bytesize);
}

CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
                                 CUstream stream) {
    (void)stream;
    return alloc_from_pool(dptr, bytesize, pool);
}

CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
                                      CUstream stream) {
    (void)stream;
    return alloc_from_pool(dptr, bytesize, pool);
}

CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream stream) {
    (void)stream;
    return device_free(dptr);
}

CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream stream) {
    (void)stream;
    return device_free(dptr);
}

CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *pool, CUdevice dev) {
    pthread_once(&g_once, init);
    if (pool == NULL) return CUDA_ERROR_INVALID_VALUE;
    if (dev < 0 || dev >= g_devices) return CUDA_ERROR_INVALID_DEVICE;
    *pool = (CUmemoryPool)(POOL_BASE + (uintptr_t)dev * POOL_STRIDE);
    return CUDA_SUCCESS;
}

/* The current pool of a device: always its default pool here. */
CUresult cuDeviceGetMemPool(CUmemoryPool *pool, CUdevice dev) {
    return cuDeviceGetDefaultMemPool(pool, dev);
}

CUresult cuMemPoolGetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value) {
    if (value == NULL) return CUDA_ERROR_INVALID_VALUE;
    lock();
    int d = 0;
    CUresult rc = pool_device(pool, &d);
    if (rc == CUDA_SUCCESS) {
        switch (attr) {
        case CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT: *(cuuint64_t *)value = g_pool_reserved[d]; break;
        case CU_MEMPOOL_ATTR_USED_MEM_CURRENT: *(cuuint64_t *)value = g_pool_used[d]; break;
        case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD: *(cuuint64_t *)value = 0; break;
        default: rc = CUDA_ERROR_INVALID_VALUE; break;
        }
    }
    unlock();
    return rc;
}

CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t keep) {
    lock();
    int d = 0;
    CUresult rc = pool_device(pool, &d);
    if (rc == CUDA_SUCCESS) {
        size_t target = g_pool_used[d] > keep ? g_pool_used[d] : keep;
        if (g_pool_reserved[d] > target) {
            g_used[d] -= g_pool_reserved[d] - target;
            g_pool_reserved[d] = target;
        }
    }
    unlock();
    return rc;
}

/* ---------- exported: pinned host memory ---------- */

CUresult cuMemAllocHost_v2(void **pp, size_t bytesize) { return host_alloc(pp, bytesize); }

CUresult cuMemHostAlloc(void **pp, size_t bytesize, unsigned int flags) {
    if (flags & ~0x7u) return CUDA_ERROR_INVALID_VALUE;
    return host_alloc(pp, bytesize);
}

CUresult cuMemFreeHost(void *p) {
    lock();
    struct block *b = unlink_block((uintptr_t)p, 1);
    CUresult rc = CUDA_ERROR_INVALID_VALUE;
    if (b != NULL) {
        g_pinned_used -= b->charged;
        free(p);
        free(b);
        rc = CUDA_SUCCESS;
    }
    unlock();
    return rc;
}

/* ---------- exported: virtual memory management ---------- */

static struct handle *find_handle(CUmemGenericAllocationHandle id) {
    for (struct handle *h = g_handles; h != NULL; h = h->next)
        if (h->id == id) return h;
    return NULL;
}

static void drop_handle(struct handle *h) {
    for (struct handle **pp = &g_handles; *pp != NULL; pp = &(*pp)->next) {
        if (*pp == h) {
            *pp = h->next;
            break;
        }
    }
    if (h->device >= 0) g_used[h->device] -= h->size;
    else g_pinned_used -= h->size;
    free(h);
}

CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size,
                     const CUmemAllocationProp *prop, unsigned long long flags) {
    if (handle == NULL || prop == NULL || flags != 0 || size == 0 || size % (2 * MiB) != 0)
        return CUDA_ERROR_INVALID_VALUE;
    CUmemLocationType t = prop->location.type;
    int host = t == CU_MEM_LOCATION_TYPE_HOST || t == CU_MEM_LOCATION_TYPE_HOST_NUMA ||
               t == CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT;
    if (!host && t != CU_MEM_LOCATION_TYPE_DEVICE) return CUDA_ERROR_INVALID_VALUE;
    lock();
    CUresult rc = injected();
    int d = host ? -1 : prop->location.id;
    if (rc == CUDA_SUCCESS) {
        if (host) rc = size > g_pinned_capacity - g_pinned_used ? CUDA_ERROR_OUT_OF_MEMORY : CUDA_SUCCESS;
        else rc = charge(d, size);
    }
    if (rc == CUDA_SUCCESS) {
        struct handle *h = calloc(1, sizeof *h);
        if (host) g_pinned_used += size;
        h->id = g_next_handle++;
        h->size = size;
        h->device = d;
        h->next = g_handles;
        g_handles = h;
        *handle = h->id;
    }
    unlock();
    return rc;
}

CUresult cuMemRelease(CUmemGenericAllocationHandle id) {
    lock();
    struct handle *h = find_handle(id);
    CUresult rc = CUDA_ERROR_INVALID_VALUE;
    if (h != NULL && !h->released) {
        h->released = 1;
        if (h->maps == 0) drop_handle(h);
        rc = CUDA_SUCCESS;
    }
    unlock();
    return rc;
}

static struct reserve *reserve_containing(uintptr_t va, size_t size) {
    for (struct reserve *r = g_reserves; r != NULL; r = r->next)
        if (va >= r->va && va + size <= r->va + r->size) return r;
    return NULL;
}

CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr,
                             unsigned long long flags) {
    (void)addr;
    if (ptr == NULL || size == 0 || size % (2 * MiB) != 0 || flags != 0) return CUDA_ERROR_INVALID_VALUE;
    lock();
    size_t align = alignment > 2 * MiB ? alignment : 2 * MiB;
    uintptr_t at = (g_reserve_bump + align - 1) & ~(uintptr_t)(align - 1);
    g_reserve_bump = at + size;
    struct reserve *r = calloc(1, sizeof *r);
    r->va = at;
    r->size = size;
    r->next = g_reserves;
    g_reserves = r;
    *ptr = at;
    unlock();
    return CUDA_SUCCESS;
}

CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size) {
    lock();
    CUresult rc = CUDA_ERROR_INVALID_VALUE;
    for (struct reserve **pp = &g_reserves; *pp != NULL; pp = &(*pp)->next) {
        struct reserve *r = *pp;
        if (r->va == ptr && r->size == size) {
            *pp = r->next;
            free(r);
            rc = CUDA_SUCCESS;
            break;
        }
    }
    unlock();
    return rc;
}

CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle id,
                  unsigned long long flags) {
    lock();
    struct handle *h = find_handle(id);
    CUresult rc = CUDA_SUCCESS;
    if (h == NULL || h->released || flags != 0 || offset + size > h->size ||
        reserve_containing((uintptr_t)ptr, size) == NULL)
        rc = CUDA_ERROR_INVALID_VALUE;
    for (struct mapping *m = g_mappings; rc == CUDA_SUCCESS && m != NULL; m = m->next)
        if (ptr < m->va + m->size && m->va < ptr + size) rc = CUDA_ERROR_INVALID_VALUE;
    if (rc == CUDA_SUCCESS) {
        struct mapping *m = calloc(1, sizeof *m);
        m->va = (uintptr_t)ptr;
        m->size = size;
        m->h = h;
        m->next = g_mappings;
        g_mappings = m;
        h->maps++;
    }
    unlock();
    return rc;
}

CUresult cuMemUnmap(CUdeviceptr ptr, size_t size) {
    lock();
    CUresult rc = CUDA_ERROR_INVALID_VALUE;
    for (struct mapping **pp = &g_mappings; *pp != NULL; pp = &(*pp)->next) {
        struct mapping *m = *pp;
        if (m->va == ptr && m->size == size) {
            *pp = m->next;
            struct handle *h = m->h;
            free(m);
            if (--h->maps == 0 && h->released) drop_handle(h);
            rc = CUDA_SUCCESS;
            break;
        }
    }
    unlock();
    return rc;
}

CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const void *desc, size_t count) {
    (void)ptr;
    (void)size;
    return desc == NULL || count == 0 ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
}

/* ---------- exported: entry points ---------- */

CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags);

struct entry {
    const char *name;
    int version;
    int ptsz;
    void *fn;
};

static const struct entry g_entries[] = {
    {"cuInit", 2000, 0, (void *)cuInit},
    {"cuDriverGetVersion", 2020, 0, (void *)cuDriverGetVersion},
    {"cuDeviceGetCount", 2000, 0, (void *)cuDeviceGetCount},
    {"cuDeviceGet", 2000, 0, (void *)cuDeviceGet},
    {"cuDeviceGetName", 2000, 0, (void *)cuDeviceGetName},
    {"cuDeviceGetUuid", 9020, 0, (void *)cuDeviceGetUuid},
    {"cuDeviceGetUuid", 11040, 0, (void *)cuDeviceGetUuid_v2},
    {"cuCtxGetDevice", 2000, 0, (void *)cuCtxGetDevice},
    {"cuCtxSetCurrent", 4000, 0, (void *)cuCtxSetCurrent},
    {"cuCtxGetCurrent", 4000, 0, (void *)cuCtxGetCurrent},
    {"cuDevicePrimaryCtxRetain", 7000, 0, (void *)cuDevicePrimaryCtxRetain},
    {"cuDevicePrimaryCtxRelease", 11000, 0, (void *)cuDevicePrimaryCtxRelease_v2},
    {"cuMemGetInfo", 3020, 0, (void *)cuMemGetInfo_v2},
    {"cuMemAlloc", 2000, 0, (void *)cuMemAlloc},
    {"cuMemAlloc", 3020, 0, (void *)cuMemAlloc_v2},
    {"cuMemFree", 2000, 0, (void *)cuMemFree},
    {"cuMemFree", 3020, 0, (void *)cuMemFree_v2},
    {"cuMemAllocPitch", 3020, 0, (void *)cuMemAllocPitch_v2},
    {"cuMemAllocManaged", 6000, 0, (void *)cuMemAllocManaged},
    {"cuMemAllocAsync", 11020, 0, (void *)cuMemAllocAsync},
    {"cuMemAllocAsync", 11020, 1, (void *)cuMemAllocAsync_ptsz},
    {"cuMemAllocFromPoolAsync", 11020, 0, (void *)cuMemAllocFromPoolAsync},
    {"cuMemAllocFromPoolAsync", 11020, 1, (void *)cuMemAllocFromPoolAsync_ptsz},
    {"cuMemFreeAsync", 11020, 0, (void *)cuMemFreeAsync},
    {"cuMemFreeAsync", 11020, 1, (void *)cuMemFreeAsync_ptsz},
    {"cuDeviceGetDefaultMemPool", 11020, 0, (void *)cuDeviceGetDefaultMemPool},
    {"cuDeviceGetMemPool", 11020, 0, (void *)cuDeviceGetMemPool},
    {"cuMemPoolGetAttribute", 11020, 0, (void *)cuMemPoolGetAttribute},
    {"cuMemPoolTrimTo", 11020, 0, (void *)cuMemPoolTrimTo},
    {"cuMemAllocHost", 3020, 0, (void *)cuMemAllocHost_v2},
    {"cuMemHostAlloc", 2020, 0, (void *)cuMemHostAlloc},
    {"cuMemFreeHost", 2000, 0, (void *)cuMemFreeHost},
    {"cuMemCreate", 10020, 0, (void *)cuMemCreate},
    {"cuMemRelease", 10020, 0, (void *)cuMemRelease},
    {"cuMemMap", 10020, 0, (void *)cuMemMap},
    {"cuMemUnmap", 10020, 0, (void *)cuMemUnmap},
    {"cuMemSetAccess", 10020, 0, (void *)cuMemSetAccess},
    {"cuMemAddressReserve", 10020, 0, (void *)cuMemAddressReserve},
    {"cuMemAddressFree", 10020, 0, (void *)cuMemAddressFree},
    {"cuGetProcAddress", 11030, 0, (void *)cuGetProcAddress},
    {"cuGetProcAddress", 12000, 0, (void *)cuGetProcAddress_v2},
};

static CUresult lookup(const char *symbol, void **pfn, int version, cuuint64_t flags,
                       CUdriverProcAddressQueryResult *status) {
    if (symbol == NULL || pfn == NULL) return CUDA_ERROR_INVALID_VALUE;
    *pfn = NULL;
    const struct entry *best = NULL;
    int known = 0;
    int want_ptsz = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0;
    for (size_t i = 0; i < sizeof g_entries / sizeof g_entries[0]; i++) {
        const struct entry *e = &g_entries[i];
        if (strcmp(e->name, symbol) != 0) continue;
        known = 1;
        if (e->version > version) continue;
        if (e->ptsz && !want_ptsz) continue;
        if (best == NULL || e->version > best->version || (e->version == best->version && e->ptsz))
            best = e;
    }
    if (best == NULL) {
        if (status != NULL)
            *status = known ? CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT
                            : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
        return CUDA_ERROR_NOT_FOUND;
    }
    *pfn = best->fn;
    if (status != NULL) *status = CU_GET_PROC_ADDRESS_SUCCESS;
    return CUDA_SUCCESS;
}

CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags) {
    return lookup(symbol, pfn, cudaVersion, flags, NULL);
}

CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                             CUdriverProcAddressQueryResult *symbolStatus) {
    return lookup(symbol, pfn, cudaVersion, flags, symbolStatus);
}

/* ---------- simulation control ---------- */

size_t simcu_used_bytes(int device) {
    lock();
    size_t v = device >= 0 && device < g_devices ? g_used[device] : 0;
    unlock();
    return v;
}

size_t simcu_live_allocations(void) {
    lock();
    size_t n = 0;
    for (struct block *b = g_blocks; b != NULL; b = b->next) n++;
    for (struct handle *h = g_handles; h != NULL; h = h->next) n++;
    unlock();
    return n;
}

int simcu_inject_error(int code, int count) {
    lock();
    int pending = g_inject_count;
    g_inject_code = code;
    g_inject_count = count;
    unlock();
    return pending;
}

/* ---------- fork safety (for tests/clients/rel_fork.c) ----------
 *
 * Like the simulated runtime, the driver's lock is taken around fork(), so a child forked while
 * another thread is inside the driver does not start with the lock held by a thread it lacks
 * (which would deadlock the child in the simulation, not in the shim under test).
 */
static void fork_prepare_driver(void) { lock(); }
static void fork_release_driver(void) { unlock(); }

__attribute__((constructor)) static void register_fork_handlers_driver(void) {
    pthread_atfork(fork_prepare_driver, fork_release_driver, fork_release_driver);
}
