/*
 * cudart_sim.c — a simulated CUDA runtime, built as libcudart.so.13, for testing oomshim on
 * machines without a GPU. It exports the runtime entry points the shim hooks (versioned
 * `libcudart.so.13` by libcudart.map, as the real library's are) and behaves like the real
 * runtime where the shim can tell: real signatures and error codes, per-thread current device,
 * context memory charged at first use, address reuse after free, thread safety.
 *
 * Simulation rules (tests rely on these; keep this list in sync with the code):
 *   - Devices: SIMCUDA_DEVICES (default 1, at most 64). Every device has SIMCUDA_CAPACITY bytes
 *     (default 8 GiB). Sizes accept a plain integer or a K/M/G/T suffix (binary: 512M, 2G,
 *     optionally followed by "B" or "iB").
 *   - Context: the first call that needs a context on a device (allocation, free, cudaSetDevice,
 *     cudaMemGetInfo, cudaStreamCreate, cudaDeviceSynchronize, pinned allocation on the current
 *     device) charges SIMCUDA_CONTEXT_BYTES (default 256 MiB) that no allocation accounts for.
 *     If it does not fit, the call fails with cudaErrorMemoryAllocation.
 *   - SIMCUDA_OTHER_PROCESS_BYTES (default 0) is held on device 0 by "another process" from the
 *     start.
 *   - Charging: a request is rounded up to 512 bytes; a request larger than 1 MiB is rounded up to
 *     2 MiB granularity instead. Allocation fails with cudaErrorMemoryAllocation when
 *     used + context + other + charged > capacity.
 *   - Addresses: fake, never dereferenceable: device d allocates from 0x7e0000000000 + (d << 40)
 *     upward, 512-byte aligned (2 MiB aligned for requests > 1 MiB). A freed block goes onto a
 *     LIFO free list for its (device, charged size) and the next allocation of the same charged
 *     size on that device gets it back, so addresses are reused and single-threaded programs see
 *     deterministic addresses. Plain, async, pool, managed, pitched and 3D allocations share this
 *     space and these rules; managed memory is charged to the current device.
 *   - Pinned host memory (cudaMallocHost, cudaHostAlloc) is real host memory (posix_memalign,
 *     4 KiB aligned) so programs can write it, charged in 4 KiB pages against a separate
 *     SIMCUDA_PINNED_CAPACITY (default 4 GiB).
 *   - Edge cases: NULL out-parameter -> cudaErrorInvalidValue, never dereferenced; size 0 ->
 *     cudaSuccess with a NULL pointer (cudaMalloc, cudaMallocAsync, cudaMallocFromPoolAsync,
 *     cudaMallocHost, cudaHostAlloc, pitched/3D with a zero extent) except cudaMallocManaged
 *     (size 0 -> cudaErrorInvalidValue); every failing allocation writes NULL to a non-NULL
 *     pointer out-parameter (other out-parameters are left alone); free of NULL -> success; free
 *     of an unknown, interior, foreign or already-freed pointer -> cudaErrorInvalidValue; device
 *     pointer to cudaFreeHost or host pointer to cudaFree/cudaFreeAsync -> cudaErrorInvalidValue;
 *     bad device index -> cudaErrorInvalidDevice; no devices -> cudaErrorNoDevice. Stream
 *     arguments of the async allocation calls are not validated. Any failing call sets the
 *     calling thread's last error (cudaGetLastError/cudaPeekAtLastError).
 *   - Error injection: simcuda_inject_error(code, count) makes the next `count` allocation or
 *     free calls (cudaFree(NULL) included) return `code` without side effects except the NULL
 *     written to an allocation's pointer out-parameter.
 *   - The driver: at start-up the runtime reaches the driver the way the real runtime does,
 *     dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL) (found next to this library through its
 *     $ORIGIN run path) + dlsym(handle, "cuGetProcAddress_v2") + one cuGetProcAddress_v2 per
 *     driver function, keeping the pointers. Without a driver everything above still holds.
 *     cudaGetDriverEntryPoint[ByVersion][_ptsz] answer through that cuGetProcAddress_v2
 *     pointer (cudaErrorSymbolNotFound when the driver has no such function or there is no
 *     driver).
 *   - SIMCUDA_RUNTIME_VIA_DRIVER=1 (and a driver found): cudaMalloc, cudaFree and
 *     cudaMemGetInfo are served by the driver's cuMemAlloc_v2, cuMemFree_v2 and
 *     cuMemGetInfo_v2 through those pointers (the driver's memory and rules, not the ones
 *     above; driver error codes pass through, they share the runtime's numbers for the codes
 *     used here). Off by default, so the runtime's own rules and counters apply.
 *
 * Internal calls never go through an exported function (that would be a PLT call an interposer
 * sees twice); every export is a thin wrapper around static helpers.
 */
#define _GNU_SOURCE
#include "cuda_sim.h"

#include <ctype.h>
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define KiB ((size_t)1024)
#define MiB (KiB * 1024)
#define GiB (MiB * 1024)

#define MAX_DEVICES 64
#define DEVICE_BASE ((uintptr_t)0x7e0000000000ULL)
#define DEVICE_SHIFT 40
#define STREAM_BASE ((uintptr_t)0x5e0000001000ULL)
#define STREAM_STRIDE ((uintptr_t)0x40)
#define POOL_BASE ((uintptr_t)0x5d0000001000ULL)
#define POOL_STRIDE ((uintptr_t)0x1000)
#define PAGE ((size_t)4096)
/* Requests above this are refused outright, so rounding can never overflow. */
#define MAX_REQUEST ((size_t)1 << 60)

enum block_kind { KIND_DEVICE = 0, KIND_MANAGED = 1, KIND_PINNED = 2 };

struct block {
    uintptr_t addr;
    size_t charged;
    int device; /* -1 for pinned */
    int kind;
    struct block *next; /* hash chain while live, free-list link while free */
};

struct size_class {
    size_t charged;
    int device;
    struct block *free_top;
    struct size_class *next;
};

struct config {
    int devices;
    size_t capacity;
    size_t context_bytes;
    size_t other_process_bytes;
    size_t pinned_capacity;
};

static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static struct config g_cfg;

/* Everything below is guarded by g_lock. */
static size_t g_used[MAX_DEVICES];
static int g_context[MAX_DEVICES];
static uintptr_t g_bump[MAX_DEVICES];
static size_t g_pinned_used;
static size_t g_live_count;
static struct block **g_live;
static size_t g_live_buckets;
#define CLASS_BUCKETS 1024
static struct size_class *g_classes[CLASS_BUCKETS];
static unsigned char *g_streams; /* 1 = live, indexed by stream id */
static size_t g_stream_count, g_stream_cap;
static int g_inject_code, g_inject_count;
/* Calls that ask about a device (cudaMemGetInfo, cudaGetDeviceProperties[_v2]): see
 * simcuda_device_queries(). Atomic: counted outside g_lock. */
static unsigned long g_device_queries;

static __thread int t_device;
static __thread cudaError_t t_last_error;

/* ---------- configuration ---------- */

static size_t parse_size(const char *name, size_t dflt) {
    const char *s = getenv(name);
    if (s == NULL || *s == '\0') return dflt;
    const char *p = s;
    while (isspace((unsigned char)*p)) p++;
    if (!isdigit((unsigned char)*p)) goto bad;
    errno = 0;
    char *end;
    unsigned long long v = strtoull(p, &end, 10);
    if (errno != 0) goto bad;
    unsigned shift = 0;
    switch (*end) {
    case 'k': case 'K': shift = 10; end++; break;
    case 'm': case 'M': shift = 20; end++; break;
    case 'g': case 'G': shift = 30; end++; break;
    case 't': case 'T': shift = 40; end++; break;
    default: break;
    }
    if (shift != 0) {
        if (*end == 'i' && (end[1] == 'B' || end[1] == 'b')) end += 2;
        else if (*end == 'B' || *end == 'b') end++;
    } else if (*end == 'B' || *end == 'b') {
        end++;
    }
    while (isspace((unsigned char)*end)) end++;
    if (*end != '\0') goto bad;
    if (shift != 0 && v > (MAX_REQUEST >> shift)) goto bad;
    return (size_t)v << shift;
bad:
    fprintf(stderr, "simcuda: ignoring %s=%s (not a size); using %zu\n", name, s, dflt);
    return dflt;
}

static void init_config(void) {
    size_t devices = parse_size("SIMCUDA_DEVICES", 1);
    if (devices > MAX_DEVICES) {
        fprintf(stderr, "simcuda: SIMCUDA_DEVICES=%zu exceeds %d; using %d\n", devices,
                MAX_DEVICES, MAX_DEVICES);
        devices = MAX_DEVICES;
    }
    g_cfg.devices = (int)devices;
    g_cfg.capacity = parse_size("SIMCUDA_CAPACITY", 8 * GiB);
    g_cfg.context_bytes = parse_size("SIMCUDA_CONTEXT_BYTES", 256 * MiB);
    g_cfg.other_process_bytes = parse_size("SIMCUDA_OTHER_PROCESS_BYTES", 0);
    g_cfg.pinned_capacity = parse_size("SIMCUDA_PINNED_CAPACITY", 4 * GiB);
    for (int d = 0; d < MAX_DEVICES; d++) g_bump[d] = DEVICE_BASE + ((uintptr_t)d << DEVICE_SHIFT);
    g_live_buckets = 4096;
    g_live = calloc(g_live_buckets, sizeof *g_live);
    if (g_live == NULL) {
        fprintf(stderr, "simcuda: out of host memory at start-up\n");
        abort();
    }
}

/* ---------- the driver, reached as the real runtime reaches it ---------- */

typedef int (*drv_getproc_fn)(const char *, void **, int, unsigned long long, int *);
typedef int (*drv_alloc_fn)(unsigned long long *, size_t);
typedef int (*drv_free_fn)(unsigned long long);
typedef int (*drv_meminfo_fn)(size_t *, size_t *);

static drv_getproc_fn g_drv_getproc;
static drv_alloc_fn g_drv_alloc;
static drv_free_fn g_drv_free;
static drv_meminfo_fn g_drv_meminfo;
static int g_via_driver;

static void *drv_proc(const char *name) {
    void *p = NULL;
    int status = 0;
    if (g_drv_getproc == NULL || g_drv_getproc(name, &p, 13000, 0, &status) != 0) return NULL;
    return p;
}

static void init_driver(void) {
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (h == NULL) return;
    g_drv_getproc = (drv_getproc_fn)dlsym(h, "cuGetProcAddress_v2");
    if (g_drv_getproc == NULL) return;
    g_drv_alloc = (drv_alloc_fn)drv_proc("cuMemAlloc");
    g_drv_free = (drv_free_fn)drv_proc("cuMemFree");
    g_drv_meminfo = (drv_meminfo_fn)drv_proc("cuMemGetInfo");
    const char *v = getenv("SIMCUDA_RUNTIME_VIA_DRIVER");
    g_via_driver = v != NULL && strcmp(v, "1") == 0 && g_drv_alloc != NULL && g_drv_free != NULL &&
                   g_drv_meminfo != NULL;
}

/* fork() from a multithreaded program: the child must not inherit g_lock held by a thread that
 * does not exist there (tests/clients/rel_fork.c allocates in forked children). */
static void fork_prepare(void) { pthread_mutex_lock(&g_lock); }
static void fork_release(void) { pthread_mutex_unlock(&g_lock); }

static void init_all(void) {
    init_config();
    init_driver();
    pthread_atfork(fork_prepare, fork_release, fork_release);
}

static void ensure_init(void) { pthread_once(&g_once, init_all); }

/* ---------- helpers (call with g_lock held unless noted) ---------- */

static cudaError_t fail(cudaError_t rc) {
    if (rc != cudaSuccess) t_last_error = rc;
    return rc;
}

static size_t round_up(size_t v, size_t to) { return (v + to - 1) / to * to; }

/* The sim's charging rule: 512 B granularity, 2 MiB granularity above 1 MiB. */
static size_t charged_size(size_t request) {
    return request > MiB ? round_up(request, 2 * MiB) : round_up(request, 512);
}

static size_t other_bytes(int device) { return device == 0 ? g_cfg.other_process_bytes : 0; }

static size_t device_in_use(int device) {
    return g_used[device] + (g_context[device] ? g_cfg.context_bytes : 0) + other_bytes(device);
}

/* Returns cudaSuccess, or cudaErrorMemoryAllocation when the context does not fit. */
static cudaError_t ensure_context(int device) {
    if (g_context[device]) return cudaSuccess;
    size_t in_use = device_in_use(device);
    if (in_use > g_cfg.capacity || g_cfg.context_bytes > g_cfg.capacity - in_use)
        return cudaErrorMemoryAllocation;
    g_context[device] = 1;
    return cudaSuccess;
}

/* Device check for the calling thread's current device. */
static cudaError_t check_device(int device) {
    if (g_cfg.devices == 0) return cudaErrorNoDevice;
    if (device < 0 || device >= g_cfg.devices) return cudaErrorInvalidDevice;
    return cudaSuccess;
}

/* Takes one injected failure if any is pending; returns its code or cudaSuccess. */
static cudaError_t take_injection(void) {
    if (g_inject_count <= 0) return cudaSuccess;
    g_inject_count--;
    return (cudaError_t)g_inject_code;
}

static size_t live_bucket(uintptr_t addr) {
    uint64_t h = (uint64_t)addr * 0x9e3779b97f4a7c15ULL;
    return (size_t)(h >> 20) & (g_live_buckets - 1);
}

static void live_grow(void) {
    size_t n = g_live_buckets * 2;
    struct block **t = calloc(n, sizeof *t);
    if (t == NULL) return; /* keep the longer chains */
    struct block **old = g_live;
    size_t old_n = g_live_buckets;
    g_live = t;
    g_live_buckets = n;
    for (size_t i = 0; i < old_n; i++) {
        struct block *b = old[i];
        while (b != NULL) {
            struct block *next = b->next;
            size_t k = live_bucket(b->addr);
            b->next = g_live[k];
            g_live[k] = b;
            b = next;
        }
    }
    free(old);
}

static void live_insert(struct block *b) {
    if (g_live_count + 1 > g_live_buckets) live_grow();
    size_t k = live_bucket(b->addr);
    b->next = g_live[k];
    g_live[k] = b;
    g_live_count++;
}

/* Unlinks and returns the live block starting at addr, or NULL. */
static struct block *live_remove(uintptr_t addr, int pinned) {
    struct block **pp = &g_live[live_bucket(addr)];
    for (; *pp != NULL; pp = &(*pp)->next) {
        struct block *b = *pp;
        if (b->addr != addr) continue;
        if ((b->kind == KIND_PINNED) != pinned) return NULL;
        *pp = b->next;
        b->next = NULL;
        g_live_count--;
        return b;
    }
    return NULL;
}

static struct size_class *size_class_for(int device, size_t charged, int create) {
    size_t k = (size_t)((charged / 512) * 31 + (size_t)device) & (CLASS_BUCKETS - 1);
    for (struct size_class *c = g_classes[k]; c != NULL; c = c->next)
        if (c->charged == charged && c->device == device) return c;
    if (!create) return NULL;
    struct size_class *c = calloc(1, sizeof *c);
    if (c == NULL) return NULL;
    c->charged = charged;
    c->device = device;
    c->next = g_classes[k];
    g_classes[k] = c;
    return c;
}

/* Charges and hands out a device/managed block of `request` bytes (> 0) on `device`. */
static cudaError_t device_alloc(int device, size_t request, int kind, void **out) {
    cudaError_t rc = check_device(device);
    if (rc != cudaSuccess) return rc;
    rc = ensure_context(device);
    if (rc != cudaSuccess) return rc;
    if (request > MAX_REQUEST) return cudaErrorMemoryAllocation;
    size_t charged = charged_size(request);
    size_t in_use = device_in_use(device);
    if (in_use > g_cfg.capacity || charged > g_cfg.capacity - in_use)
        return cudaErrorMemoryAllocation;
    struct size_class *c = size_class_for(device, charged, 1);
    if (c == NULL) return cudaErrorMemoryAllocation;
    struct block *b = c->free_top;
    if (b != NULL) {
        c->free_top = b->next;
    } else {
        b = calloc(1, sizeof *b);
        if (b == NULL) return cudaErrorMemoryAllocation;
        uintptr_t at = g_bump[device];
        if (charged > MiB) at = (at + 2 * MiB - 1) & ~(uintptr_t)(2 * MiB - 1);
        b->addr = at;
        b->charged = charged;
        b->device = device;
        g_bump[device] = at + charged;
    }
    b->kind = kind;
    live_insert(b);
    g_used[device] += charged;
    *out = (void *)b->addr;
    return cudaSuccess;
}

static cudaError_t device_free(void *ptr) {
    if (ptr == NULL) {
        if (g_cfg.devices == 0) return cudaErrorNoDevice;
        int d = t_device;
        return check_device(d) == cudaSuccess ? ensure_context(d) : cudaSuccess;
    }
    struct block *b = live_remove((uintptr_t)ptr, 0);
    if (b == NULL) return cudaErrorInvalidValue;
    g_used[b->device] -= b->charged;
    struct size_class *c = size_class_for(b->device, b->charged, 0);
    /* The class exists: it was created when the block was first handed out. */
    b->next = c->free_top;
    c->free_top = b;
    return cudaSuccess;
}

static cudaError_t pinned_alloc(size_t size, void **out) {
    cudaError_t rc = check_device(t_device);
    if (rc != cudaSuccess) return rc;
    rc = ensure_context(t_device);
    if (rc != cudaSuccess) return rc;
    if (size > MAX_REQUEST) return cudaErrorMemoryAllocation;
    size_t charged = round_up(size, PAGE);
    if (charged > g_cfg.pinned_capacity - g_pinned_used) return cudaErrorMemoryAllocation;
    struct block *b = calloc(1, sizeof *b);
    if (b == NULL) return cudaErrorMemoryAllocation;
    void *p = NULL;
    if (posix_memalign(&p, PAGE, charged) != 0) {
        free(b);
        return cudaErrorMemoryAllocation;
    }
    b->addr = (uintptr_t)p;
    b->charged = charged;
    b->device = -1;
    b->kind = KIND_PINNED;
    live_insert(b);
    g_pinned_used += charged;
    *out = p;
    return cudaSuccess;
}

static cudaError_t pinned_free(void *ptr) {
    if (ptr == NULL) return cudaSuccess;
    struct block *b = live_remove((uintptr_t)ptr, 1);
    if (b == NULL) return cudaErrorInvalidValue;
    g_pinned_used -= b->charged;
    free((void *)b->addr);
    free(b);
    return cudaSuccess;
}

/* ---------- shared bodies of the allocation entry points ---------- */

static void set_null(void **out) {
    if (out != NULL) *out = NULL;
}

/* Common path for plain, async, pool and managed allocations. */
static cudaError_t alloc_common(void **out, size_t size, int device, int kind, int zero_ok) {
    ensure_init();
    pthread_mutex_lock(&g_lock);
    cudaError_t rc = take_injection();
    if (rc == cudaSuccess) {
        if (out == NULL) {
            rc = cudaErrorInvalidValue;
        } else if (size == 0) {
            rc = zero_ok ? check_device(device) : cudaErrorInvalidValue;
            if (rc == cudaSuccess) rc = ensure_context(device);
            *out = NULL;
        } else {
            rc = device_alloc(device, size, kind, out);
        }
    }
    pthread_mutex_unlock(&g_lock);
    if (rc != cudaSuccess) set_null(out);
    return fail(rc);
}

static cudaError_t free_common(void *ptr) {
    ensure_init();
    pthread_mutex_lock(&g_lock);
    cudaError_t rc = take_injection();
    if (rc == cudaSuccess) rc = device_free(ptr);
    pthread_mutex_unlock(&g_lock);
    return fail(rc);
}

static cudaError_t pool_device(cudaMemPool_t pool, int *device) {
    uintptr_t h = (uintptr_t)pool;
    if (h < POOL_BASE || (h - POOL_BASE) % POOL_STRIDE != 0) return cudaErrorInvalidValue;
    uintptr_t d = (h - POOL_BASE) / POOL_STRIDE;
    if (d >= (uintptr_t)g_cfg.devices) return cudaErrorInvalidValue;
    *device = (int)d;
    return cudaSuccess;
}

static cudaError_t pool_alloc_common(void **out, size_t size, cudaMemPool_t pool) {
    ensure_init();
    int device = 0;
    pthread_mutex_lock(&g_lock);
    cudaError_t rc = take_injection();
    if (rc == cudaSuccess) {
        if (out == NULL) rc = cudaErrorInvalidValue;
        else rc = pool_device(pool, &device);
    }
    if (rc == cudaSuccess) {
        if (size == 0) {
            rc = ensure_context(device);
            *out = NULL;
        } else {
            rc = device_alloc(device, size, KIND_DEVICE, out);
        }
    }
    pthread_mutex_unlock(&g_lock);
    if (rc != cudaSuccess) set_null(out);
    return fail(rc);
}

static cudaError_t host_alloc_common(void **out, size_t size, unsigned int flags,
                                     unsigned int valid_flags) {
    ensure_init();
    pthread_mutex_lock(&g_lock);
    cudaError_t rc = take_injection();
    if (rc == cudaSuccess) {
        if (out == NULL || (flags & ~valid_flags) != 0) {
            rc = cudaErrorInvalidValue;
        } else if (size == 0) {
            rc = check_device(t_device);
            if (rc == cudaSuccess) rc = ensure_context(t_device);
            *out = NULL;
        } else {
            rc = pinned_alloc(size, out);
        }
    }
    pthread_mutex_unlock(&g_lock);
    if (rc != cudaSuccess) set_null(out);
    return fail(rc);
}

/* ---------- exported: device management ---------- */

cudaError_t cudaGetDeviceCount(int *count) {
    ensure_init();
    if (count == NULL) return fail(cudaErrorInvalidValue);
    *count = g_cfg.devices;
    return fail(g_cfg.devices == 0 ? cudaErrorNoDevice : cudaSuccess);
}

cudaError_t cudaSetDevice(int device) {
    ensure_init();
    pthread_mutex_lock(&g_lock);
    cudaError_t rc = check_device(device);
    if (rc == cudaSuccess) rc = ensure_context(device);
    pthread_mutex_unlock(&g_lock);
    if (rc == cudaSuccess) t_device = device;
    return fail(rc);
}

cudaError_t cudaGetDevice(int *device) {
    ensure_init();
    if (device == NULL) return fail(cudaErrorInvalidValue);
    if (g_cfg.devices == 0) return fail(cudaErrorNoDevice);
    *device = t_device;
    return cudaSuccess;
}

static void complete_all_work(void);

cudaError_t cudaDeviceSynchronize(void) {
    ensure_init();
    pthread_mutex_lock(&g_lock);
    cudaError_t rc = check_device(t_device);
    if (rc == cudaSuccess) rc = ensure_context(t_device);
    if (rc == cudaSuccess) complete_all_work();
    pthread_mutex_unlock(&g_lock);
    return fail(rc);
}

static cudaError_t get_properties(struct cudaDeviceProp *prop, int device) {
    ensure_init();
    __atomic_fetch_add(&g_device_queries, 1, __ATOMIC_RELAXED);
    if (prop == NULL) return fail(cudaErrorInvalidValue);
    cudaError_t rc = check_device(device);
    if (rc != cudaSuccess) return fail(rc);
    static const char name[] = "oomshim simulated device";
    memset(prop->name, 0, sizeof prop->name);
    memcpy(prop->name, name, sizeof name);
    return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *prop, int device) {
    return get_properties(prop, device);
}

cudaError_t cudaGetDeviceProperties_v2(struct cudaDeviceProp *prop, int device) {
    return get_properties(prop, device);
}

cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes) {
    ensure_init();
    __atomic_fetch_add(&g_device_queries, 1, __ATOMIC_RELAXED);
    if (free_bytes == NULL || total_bytes == NULL) return fail(cudaErrorInvalidValue);
    if (g_via_driver) return fail((cudaError_t)g_drv_meminfo(free_bytes, total_bytes));
    pthread_mutex_lock(&g_lock);
    int d = t_device;
    cudaError_t rc = check_device(d);
    if (rc == cudaSuccess) rc = ensure_context(d);
    if (rc == cudaSuccess) {
        size_t in_use = device_in_use(d);
        *free_bytes = in_use >= g_cfg.capacity ? 0 : g_cfg.capacity - in_use;
        *total_bytes = g_cfg.capacity;
    }
    pthread_mutex_unlock(&g_lock);
    return fail(rc);
}

/* ---------- exported: errors ---------- */

struct error_entry {
    int code;
    const char *name;
    const char *text;
};

static const struct error_entry g_errors[] = {
    {cudaSuccess, "cudaSuccess", "no error"},
    {cudaErrorInvalidValue, "cudaErrorInvalidValue", "invalid argument"},
    {cudaErrorMemoryAllocation, "cudaErrorMemoryAllocation", "out of memory"},
    {cudaErrorInitializationError, "cudaErrorInitializationError", "initialization error"},
    {cudaErrorNoDevice, "cudaErrorNoDevice", "no CUDA-capable device is detected"},
    {cudaErrorInvalidDevice, "cudaErrorInvalidDevice", "invalid device ordinal"},
    {cudaErrorInvalidResourceHandle, "cudaErrorInvalidResourceHandle", "invalid resource handle"},
    {cudaErrorSymbolNotFound, "cudaErrorSymbolNotFound", "named symbol not found"},
    {cudaErrorIllegalState, "cudaErrorIllegalState", "the operation cannot be performed in the present state"},
    {cudaErrorNotReady, "cudaErrorNotReady", "device not ready"},
    {cudaErrorNotSupported, "cudaErrorNotSupported", "operation not supported"},
    {cudaErrorStreamCaptureUnsupported, "cudaErrorStreamCaptureUnsupported", "operation not permitted when stream is capturing"},
    {cudaErrorStreamCaptureInvalidated, "cudaErrorStreamCaptureInvalidated", "operation failed due to a previous error during capture"},
    {cudaErrorUnknown, "cudaErrorUnknown", "unknown error"},
};

static const struct error_entry *find_error(cudaError_t code) {
    for (size_t i = 0; i < sizeof g_errors / sizeof g_errors[0]; i++)
        if (g_errors[i].code == (int)code) return &g_errors[i];
    return NULL;
}

const char *cudaGetErrorString(cudaError_t error) {
    const struct error_entry *e = find_error(error);
    return e != NULL ? e->text : "unrecognized error code";
}

const char *cudaGetErrorName(cudaError_t error) {
    const struct error_entry *e = find_error(error);
    return e != NULL ? e->name : "unrecognized error code";
}

cudaError_t cudaGetLastError(void) {
    cudaError_t rc = t_last_error;
    t_last_error = cudaSuccess;
    return rc;
}

cudaError_t cudaPeekAtLastError(void) { return t_last_error; }

/* ---------- exported: streams ---------- */

static int stream_id(cudaStream_t s, size_t *id) {
    uintptr_t h = (uintptr_t)s;
    if (h < STREAM_BASE || (h - STREAM_BASE) % STREAM_STRIDE != 0) return 0;
    size_t i = (size_t)((h - STREAM_BASE) / STREAM_STRIDE);
    if (i >= g_stream_count || !g_streams[i]) return 0;
    *id = i;
    return 1;
}

cudaError_t cudaStreamCreate(cudaStream_t *stream) {
    ensure_init();
    if (stream == NULL) return fail(cudaErrorInvalidValue);
    pthread_mutex_lock(&g_lock);
    cudaError_t rc = check_device(t_device);
    if (rc == cudaSuccess) rc = ensure_context(t_device);
    if (rc == cudaSuccess && g_stream_count == g_stream_cap) {
        size_t cap = g_stream_cap ? g_stream_cap * 2 : 64;
        unsigned char *n = realloc(g_streams, cap);
        if (n == NULL) {
            rc = cudaErrorMemoryAllocation;
        } else {
            g_streams = n;
            g_stream_cap = cap;
        }
    }
    if (rc == cudaSuccess) {
        size_t id = g_stream_count++;
        g_streams[id] = 1;
        *stream = (cudaStream_t)(STREAM_BASE + id * STREAM_STRIDE);
    }
    pthread_mutex_unlock(&g_lock);
    return fail(rc);
}

cudaError_t cudaStreamDestroy(cudaStream_t stream) {
    ensure_init();
    pthread_mutex_lock(&g_lock);
    size_t id;
    cudaError_t rc = cudaErrorInvalidResourceHandle;
    if (stream_id(stream, &id)) {
        g_streams[id] = 0;
        rc = cudaSuccess;
    }
    pthread_mutex_unlock(&g_lock);
    return fail(rc);
}

static void complete_slot_work(cudaStream_t stream);

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
    ensure_init();
    pthread_mutex_lock(&g_lock);
    size_t id;
    cudaError_t rc = cudaSuccess;
    if (stream != NULL && stream != cudaStreamLegacy && stream != cudaStreamPerThread &&
        !stream_id(stream, &id))
        rc = cudaErrorInvalidResourceHandle;
    if (rc == cudaSuccess) complete_slot_work(stream);
    pthread_mutex_unlock(&g_lock);
    return fail(rc);
}

/* ---------- exported: events and stream capture (allocator mode, src/host/alloc) ----------
 *
 * Streams get simulated work: simcuda_stream_launch() queues one unit of work on a stream, which
 * completes only when the stream (or the device) is synchronised or simcuda_stream_complete() is
 * called. An event recorded on a stream is done once the work queued before it completed, so
 * cudaEventQuery answers cudaErrorNotReady (600) until then, as the real runtime does for a
 * stream still running kernels. Capture follows the real mode rules closely enough for an
 * allocator: while a stream captures in global mode, cudaMalloc from a thread whose capture mode
 * is not relaxed fails with cudaErrorStreamCaptureUnsupported (900) and invalidates the capture.
 */

#define TRACKED_STREAMS 4096
#define DEFAULT_STREAM_SLOT TRACKED_STREAMS /* the legacy / per-thread default stream */
#define EVENT_BASE ((uintptr_t)0x5c0000001000ULL)
#define EVENT_STRIDE ((uintptr_t)0x40)
#define MAX_EVENTS 65536

static unsigned long long g_work_submitted[TRACKED_STREAMS + 1];
static unsigned long long g_work_completed[TRACKED_STREAMS + 1];
/* Capture state per stream: 0 none, 1 active, 2 invalidated; with its id and mode. */
static int g_capture_status[TRACKED_STREAMS + 1];
static unsigned long long g_capture_id[TRACKED_STREAMS + 1];
static int g_capture_mode[TRACKED_STREAMS + 1];
static unsigned long long g_next_capture_id = 1;
static int g_global_captures; /* active captures begun in global mode */

struct sim_event {
    int live;
    int slot;                  /* stream slot it was recorded on; -1 = never recorded */
    unsigned long long target; /* work count of that stream at the record */
};
static struct sim_event g_events[MAX_EVENTS];
static size_t g_event_count;

static __thread int t_capture_mode; /* 0 global, 1 thread-local, 2 relaxed */

/* The slot of a stream handle, or -1 when it is not a live stream (g_lock held). */
static int work_slot(cudaStream_t s) {
    if (s == NULL || s == cudaStreamLegacy || s == cudaStreamPerThread) return DEFAULT_STREAM_SLOT;
    size_t id;
    if (!stream_id(s, &id) || id >= TRACKED_STREAMS) return -1;
    return (int)id;
}

static struct sim_event *find_event(cudaEvent_t e) {
    uintptr_t h = (uintptr_t)e;
    if (h < EVENT_BASE || (h - EVENT_BASE) % EVENT_STRIDE != 0) return NULL;
    size_t i = (size_t)((h - EVENT_BASE) / EVENT_STRIDE);
    if (i >= g_event_count || !g_events[i].live) return NULL;
    return &g_events[i];
}

static void complete_slot_work(cudaStream_t stream) {
    int slot = work_slot(stream);
    if (slot >= 0) g_work_completed[slot] = g_work_submitted[slot];
}

static void complete_all_work(void) {
    for (size_t i = 0; i <= TRACKED_STREAMS; i++) g_work_completed[i] = g_work_submitted[i];
}

/* True when cudaMalloc from this thread is prohibited by an ongoing capture (g_lock held);
 * invalidates the captures it would break, as the real runtime does. */
static int capture_forbids_malloc(void) {
    if (t_capture_mode == 2 || g_global_captures == 0) return 0;
    for (size_t i = 0; i <= TRACKED_STREAMS; i++) {
        if (g_capture_status[i] == 1 && g_capture_mode[i] == 0) {
            g_capture_status[i] = 2;
            g_global_captures--;
        }
    }
    return 1;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned int flags) {
    (void)flags;
    ensure_init();
    if (event == NULL) return fail(cudaErrorInvalidValue);
    pthread_mutex_lock(&g_lock);
    cudaError_t rc = cudaSuccess;
    size_t i = 0;
    while (i < g_event_count && g_events[i].live) i++;
    if (i == g_event_count) {
        if (g_event_count == MAX_EVENTS) rc = cudaErrorMemoryAllocation;
        else g_event_count++;
    }
    if (rc == cudaSuccess) {
        g_events[i].live = 1;
        g_events[i].slot = -1;
        g_events[i].target = 0;
        *event = (cudaEvent_t)(EVENT_BASE + i * EVENT_STRIDE);
    }
    pthread_mutex_unlock(&g_lock);
    return fail(rc);
}

cudaError_t cudaEventCreate(cudaEvent_t *event) { return cudaEventCreateWithFlags(event, 0); }

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
    ensure_init();
    pthread_mutex_lock(&g_lock);
    struct sim_event *e = find_event(event);
    int slot = work_slot(stream);
    cudaError_t rc = cudaSuccess;
    if (e == NULL || slot < 0) {
        rc = cudaErrorInvalidResourceHandle;
    } else {
        e->slot = slot;
        e->target = g_work_submitted[slot];
    }
    pthread_mutex_unlock(&g_lock);
    return fail(rc);
}

cudaError_t cudaEventRecord_ptsz(cudaEvent_t event, cudaStream_t stream) {
    return cudaEventRecord(event, stream);
}

cudaError_t cudaEventQuery(cudaEvent_t event) {
    ensure_init();
    pthread_mutex_lock(&g_lock);
    struct sim_event *e = find_event(event);
    cudaError_t rc;
    if (e == NULL) rc = cudaErrorInvalidResourceHandle;
    else if (e->slot < 0 || g_work_completed[e->slot] >= e->target) rc = cudaSuccess;
    else rc = cudaErrorNotReady;
    pthread_mutex_unlock(&g_lock);
    /* Not-ready is a status, not an error: the real runtime does not make it sticky either. */
    return rc == cudaErrorNotReady ? rc : fail(rc);
}

cudaError_t cudaEventSynchronize(cudaEvent_t event) {
    ensure_init();
    pthread_mutex_lock(&g_lock);
    struct sim_event *e = find_event(event);
    cudaError_t rc = cudaErrorInvalidResourceHandle;
    if (e != NULL) {
        if (e->slot >= 0 && g_work_completed[e->slot] < e->target)
            g_work_completed[e->slot] = e->target;
        rc = cudaSuccess;
    }
    pthread_mutex_unlock(&g_lock);
    return fail(rc);
}

cudaError_t cudaEventDestroy(cudaEvent_t event) {
    ensure_init();
    pthread_mutex_lock(&g_lock);
    struct sim_event *e = find_event(event);
    cudaError_t rc = cudaErrorInvalidResourceHandle;
    if (e != NULL) {
        e->live = 0;
        rc = cudaSuccess;
    }
    pthread_mutex_unlock(&g_lock);
    return fail(rc);
}

cudaError_t cudaStreamBeginCapture(cudaStream_t stream, int mode) {
    ensure_init();
    if (mode < 0 || mode > 2) return fail(cudaErrorInvalidValue);
    pthread_mutex_lock(&g_lock);
    int slot = work_slot(stream);
    cudaError_t rc = cudaSuccess;
    if (slot < 0 || slot == DEFAULT_STREAM_SLOT) {
        rc = slot < 0 ? cudaErrorInvalidResourceHandle : cudaErrorStreamCaptureUnsupported;
    } else if (g_capture_status[slot] != 0) {
        rc = cudaErrorIllegalState;
    } else {
        g_capture_status[slot] = 1;
        g_capture_id[slot] = g_next_capture_id++;
        g_capture_mode[slot] = mode;
        if (mode == 0) g_global_captures++;
    }
    pthread_mutex_unlock(&g_lock);
    return fail(rc);
}

cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t *graph) {
    ensure_init();
    if (graph == NULL) return fail(cudaErrorInvalidValue);
    pthread_mutex_lock(&g_lock);
    int slot = work_slot(stream);
    cudaError_t rc = cudaSuccess;
    if (slot < 0 || slot == DEFAULT_STREAM_SLOT || g_capture_status[slot] == 0) {
        rc = cudaErrorIllegalState;
        *graph = NULL;
    } else {
        if (g_capture_status[slot] == 1 && g_capture_mode[slot] == 0) g_global_captures--;
        rc = g_capture_status[slot] == 1 ? cudaSuccess : cudaErrorStreamCaptureInvalidated;
        *graph = rc == cudaSuccess ? (cudaGraph_t)(uintptr_t)(0x5b0000000000ULL + g_capture_id[slot])
                                   : NULL;
        g_capture_status[slot] = 0;
    }
    pthread_mutex_unlock(&g_lock);
    return fail(rc);
}

cudaError_t cudaStreamIsCapturing(cudaStream_t stream, int *status) {
    ensure_init();
    if (status == NULL) return fail(cudaErrorInvalidValue);
    pthread_mutex_lock(&g_lock);
    int slot = work_slot(stream);
    cudaError_t rc = cudaSuccess;
    if (slot < 0) rc = cudaErrorInvalidResourceHandle;
    else *status = g_capture_status[slot];
    pthread_mutex_unlock(&g_lock);
    return fail(rc);
}

/* CUDA 13's form; callers of the older 3-argument form pass the same leading arguments. The
 * trailing out-parameters (graph, dependencies, edge data, count) are optional: NULL is left. */
cudaError_t cudaStreamGetCaptureInfo(cudaStream_t stream, int *status, unsigned long long *id,
                                     void *graph, void *deps, void *edges, size_t *count) {
    (void)graph, (void)deps, (void)edges;
    ensure_init();
    if (status == NULL) return fail(cudaErrorInvalidValue);
    pthread_mutex_lock(&g_lock);
    int slot = work_slot(stream);
    cudaError_t rc = cudaSuccess;
    if (slot < 0) {
        rc = cudaErrorInvalidResourceHandle;
    } else {
        *status = g_capture_status[slot];
        if (id != NULL && g_capture_status[slot] != 0) *id = g_capture_id[slot];
        if (count != NULL) *count = 0;
    }
    pthread_mutex_unlock(&g_lock);
    return fail(rc);
}

cudaError_t cudaThreadExchangeStreamCaptureMode(int *mode) {
    if (mode == NULL || *mode < 0 || *mode > 2) return fail(cudaErrorInvalidValue);
    int old = t_capture_mode;
    t_capture_mode = *mode;
    *mode = old;
    return cudaSuccess;
}

int simcuda_stream_launch(cudaStream_t stream) {
    ensure_init();
    pthread_mutex_lock(&g_lock);
    int slot = work_slot(stream);
    if (slot >= 0) g_work_submitted[slot]++;
    pthread_mutex_unlock(&g_lock);
    return slot >= 0 ? 0 : -1;
}

int simcuda_stream_complete(cudaStream_t stream) {
    ensure_init();
    pthread_mutex_lock(&g_lock);
    int slot = work_slot(stream);
    if (slot >= 0) g_work_completed[slot] = g_work_submitted[slot];
    pthread_mutex_unlock(&g_lock);
    return slot >= 0 ? 0 : -1;
}

/* ---------- exported: device memory ---------- */

static cudaError_t via_driver_malloc(void **devPtr, size_t size) {
    if (devPtr == NULL) return fail(cudaErrorInvalidValue);
    if (size == 0) {
        *devPtr = NULL;
        return cudaSuccess;
    }
    unsigned long long p = 0;
    cudaError_t rc = (cudaError_t)g_drv_alloc(&p, size);
    *devPtr = rc == cudaSuccess ? (void *)(uintptr_t)p : NULL;
    return fail(rc);
}

cudaError_t cudaMalloc(void **devPtr, size_t size) {
    ensure_init();
    pthread_mutex_lock(&g_lock);
    int forbidden = capture_forbids_malloc();
    pthread_mutex_unlock(&g_lock);
    if (forbidden) {
        set_null(devPtr);
        return fail(cudaErrorStreamCaptureUnsupported);
    }
    if (g_via_driver) return via_driver_malloc(devPtr, size);
    return alloc_common(devPtr, size, t_device, KIND_DEVICE, 1);
}

cudaError_t cudaFree(void *devPtr) {
    ensure_init();
    if (g_via_driver) return fail((cudaError_t)g_drv_free((unsigned long long)(uintptr_t)devPtr));
    return free_common(devPtr);
}

/* ---------- exported: driver entry points ---------- */

static cudaError_t entry_point(const char *symbol, void **funcPtr, unsigned int version,
                               unsigned long long flags, int *status) {
    ensure_init();
    if (symbol == NULL || funcPtr == NULL) return fail(cudaErrorInvalidValue);
    *funcPtr = NULL;
    int st = 1; /* cudaDriverEntryPointSymbolNotFound */
    int rc = g_drv_getproc != NULL ? g_drv_getproc(symbol, funcPtr, (int)version, flags, &st) : 500;
    if (status != NULL) *status = st;
    return rc == 0 ? cudaSuccess : fail(cudaErrorSymbolNotFound);
}

cudaError_t cudaGetDriverEntryPoint(const char *symbol, void **funcPtr, unsigned long long flags,
                                    int *driverStatus) {
    return entry_point(symbol, funcPtr, 13000, flags, driverStatus);
}

cudaError_t cudaGetDriverEntryPoint_ptsz(const char *symbol, void **funcPtr,
                                         unsigned long long flags, int *driverStatus) {
    return entry_point(symbol, funcPtr, 13000, flags, driverStatus);
}

cudaError_t cudaGetDriverEntryPointByVersion(const char *symbol, void **funcPtr,
                                             unsigned int cudaVersion, unsigned long long flags,
                                             int *driverStatus) {
    return entry_point(symbol, funcPtr, cudaVersion, flags, driverStatus);
}

cudaError_t cudaGetDriverEntryPointByVersion_ptsz(const char *symbol, void **funcPtr,
                                                  unsigned int cudaVersion,
                                                  unsigned long long flags, int *driverStatus) {
    return entry_point(symbol, funcPtr, cudaVersion, flags, driverStatus);
}

cudaError_t cudaMallocManaged(void **devPtr, size_t size, unsigned int flags) {
    if (flags != cudaMemAttachGlobal && flags != cudaMemAttachHost) {
        /* Still an allocation call: a pending injection takes precedence. */
        ensure_init();
        pthread_mutex_lock(&g_lock);
        cudaError_t rc = take_injection();
        pthread_mutex_unlock(&g_lock);
        set_null(devPtr);
        return fail(rc != cudaSuccess ? rc : cudaErrorInvalidValue);
    }
    return alloc_common(devPtr, size, t_device, KIND_MANAGED, 0);
}

cudaError_t cudaMallocPitch(void **devPtr, size_t *pitch, size_t width, size_t height) {
    ensure_init();
    pthread_mutex_lock(&g_lock);
    cudaError_t rc = take_injection();
    if (rc == cudaSuccess) {
        if (devPtr == NULL || pitch == NULL) {
            rc = cudaErrorInvalidValue;
        } else if (width > MAX_REQUEST || height > MAX_REQUEST) {
            rc = cudaErrorMemoryAllocation;
        } else {
            size_t p = round_up(width, 512);
            if (width == 0 || height == 0) {
                rc = check_device(t_device);
                if (rc == cudaSuccess) rc = ensure_context(t_device);
                if (rc == cudaSuccess) {
                    *devPtr = NULL;
                    *pitch = p;
                }
            } else if (height > MAX_REQUEST / p) {
                rc = cudaErrorMemoryAllocation;
            } else {
                rc = device_alloc(t_device, p * height, KIND_DEVICE, devPtr);
                if (rc == cudaSuccess) *pitch = p;
            }
        }
    }
    pthread_mutex_unlock(&g_lock);
    if (rc != cudaSuccess) set_null(devPtr);
    return fail(rc);
}

cudaError_t cudaMalloc3D(struct cudaPitchedPtr *pitchedDevPtr, struct cudaExtent extent) {
    ensure_init();
    pthread_mutex_lock(&g_lock);
    cudaError_t rc = take_injection();
    void *ptr = NULL;
    size_t p = 0;
    if (rc == cudaSuccess) {
        if (pitchedDevPtr == NULL) {
            rc = cudaErrorInvalidValue;
        } else if (extent.width > MAX_REQUEST || extent.height > MAX_REQUEST ||
                   extent.depth > MAX_REQUEST) {
            rc = cudaErrorMemoryAllocation;
        } else {
            p = round_up(extent.width, 512);
            if (p == 0 || extent.height == 0 || extent.depth == 0) {
                rc = check_device(t_device);
                if (rc == cudaSuccess) rc = ensure_context(t_device);
            } else if (extent.height > MAX_REQUEST / p ||
                       extent.depth > MAX_REQUEST / (p * extent.height)) {
                rc = cudaErrorMemoryAllocation;
            } else {
                rc = device_alloc(t_device, p * extent.height * extent.depth, KIND_DEVICE, &ptr);
            }
        }
    }
    pthread_mutex_unlock(&g_lock);
    if (pitchedDevPtr != NULL) {
        if (rc == cudaSuccess) {
            pitchedDevPtr->ptr = ptr;
            pitchedDevPtr->pitch = p;
            pitchedDevPtr->xsize = extent.width;
            pitchedDevPtr->ysize = extent.height;
        } else {
            pitchedDevPtr->ptr = NULL;
        }
    }
    return fail(rc);
}

/* ---------- exported: stream-ordered allocator ---------- */

cudaError_t cudaMallocAsync(void **devPtr, size_t size, cudaStream_t stream) {
    (void)stream;
    return alloc_common(devPtr, size, t_device, KIND_DEVICE, 1);
}

cudaError_t cudaMallocAsync_ptsz(void **devPtr, size_t size, cudaStream_t stream) {
    (void)stream;
    return alloc_common(devPtr, size, t_device, KIND_DEVICE, 1);
}

cudaError_t cudaFreeAsync(void *devPtr, cudaStream_t stream) {
    (void)stream;
    return free_common(devPtr);
}

cudaError_t cudaFreeAsync_ptsz(void *devPtr, cudaStream_t stream) {
    (void)stream;
    return free_common(devPtr);
}

cudaError_t cudaMallocFromPoolAsync(void **ptr, size_t size, cudaMemPool_t memPool,
                                    cudaStream_t stream) {
    (void)stream;
    return pool_alloc_common(ptr, size, memPool);
}

cudaError_t cudaMallocFromPoolAsync_ptsz(void **ptr, size_t size, cudaMemPool_t memPool,
                                         cudaStream_t stream) {
    (void)stream;
    return pool_alloc_common(ptr, size, memPool);
}

cudaError_t cudaDeviceGetDefaultMemPool(cudaMemPool_t *memPool, int device) {
    ensure_init();
    if (memPool == NULL) return fail(cudaErrorInvalidValue);
    cudaError_t rc = check_device(device);
    if (rc != cudaSuccess) return fail(rc);
    *memPool = (cudaMemPool_t)(POOL_BASE + (uintptr_t)device * POOL_STRIDE);
    return cudaSuccess;
}

/* ---------- exported: pinned host memory ---------- */

cudaError_t cudaMallocHost(void **ptr, size_t size) {
    return host_alloc_common(ptr, size, 0, 0);
}

cudaError_t cudaHostAlloc(void **pHost, size_t size, unsigned int flags) {
    return host_alloc_common(pHost, size, flags,
                             cudaHostAllocPortable | cudaHostAllocMapped |
                                 cudaHostAllocWriteCombined);
}

cudaError_t cudaFreeHost(void *ptr) {
    ensure_init();
    pthread_mutex_lock(&g_lock);
    cudaError_t rc = take_injection();
    if (rc == cudaSuccess) rc = pinned_free(ptr);
    pthread_mutex_unlock(&g_lock);
    return fail(rc);
}

/* ---------- simulation control ---------- */

int simcuda_inject_error(int code, int count) {
    ensure_init();
    pthread_mutex_lock(&g_lock);
    int pending = g_inject_count > 0 ? g_inject_count : 0;
    if (code == 0 || count <= 0) {
        g_inject_code = 0;
        g_inject_count = 0;
    } else {
        g_inject_code = code;
        g_inject_count = count;
    }
    pthread_mutex_unlock(&g_lock);
    return pending;
}

size_t simcuda_used_bytes(int device) {
    ensure_init();
    if (device < 0 || device >= g_cfg.devices) return 0;
    pthread_mutex_lock(&g_lock);
    size_t v = g_used[device];
    pthread_mutex_unlock(&g_lock);
    return v;
}

size_t simcuda_pinned_used_bytes(void) {
    ensure_init();
    pthread_mutex_lock(&g_lock);
    size_t v = g_pinned_used;
    pthread_mutex_unlock(&g_lock);
    return v;
}

size_t simcuda_live_allocations(void) {
    ensure_init();
    pthread_mutex_lock(&g_lock);
    size_t v = g_live_count;
    pthread_mutex_unlock(&g_lock);
    return v;
}

unsigned long simcuda_device_queries(void) {
    return __atomic_load_n(&g_device_queries, __ATOMIC_RELAXED);
}
