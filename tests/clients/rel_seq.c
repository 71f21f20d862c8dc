/*
 * rel_seq: runs a sequence of CUDA runtime and driver calls read from stdin, one call a line, and
 * prints every result code and out-parameter. tests/reliability.rs generates random sequences
 * (valid and invalid calls, NULL out-parameters, double frees, foreign and interior pointers,
 * zero sizes, injected errors, async/pool/pitched/3D/managed/pinned, VMM) and compares this
 * output byte for byte with and without the shim.
 *
 * Input: "<op> <a> <b> <c> <d>" (missing numbers are 0). Slots: 16 pointer slots (any layer,
 * so frees through the other layer are foreign pointers), 4 VMM handle slots, 4 reserved ranges.
 * Output (stdout): "<n> <op> a b c d -> <rc>[ out-parameters]". Device addresses and handles are
 * the simulation's (deterministic); page-locked host pointers vary between runs and print as
 * "host". At the end, what the program still holds by its own accounting (requested bytes, as
 * the shim's ledger counts them): "held device D bytes B count C" and "held pinned bytes B count
 * C". On stderr, "dump_rc R" from oomshim_dump("seq-end") when the shim is loaded.
 */
#define _GNU_SOURCE
#include "cuda_driver_sim.h"
#include "cuda_sim.h"

#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NSLOT 16
#define NHANDLE 4
#define NRESERVE 4
#define MAXLIVE 8192
#define MAXMAP 64

static uint64_t g_slot[NSLOT];
static int g_slot_host[NSLOT]; /* the slot was last given a page-locked host pointer */
static CUmemGenericAllocationHandle g_handle[NHANDLE];
static struct {
    uint64_t va;
    size_t size;
} g_reserve[NRESERVE];

/* The program's own accounting of what it holds (keyed by address, as the ledger is). */
struct live {
    uint64_t addr;
    uint64_t bytes;
    int device; /* -1: page-locked host */
    int handle; /* a VMM handle (addr = its id) */
    int maps;
    int released;
};
static struct live g_live[MAXLIVE];
static int g_nlive;
static struct {
    uint64_t va;
    size_t size;
    uint64_t handle;
} g_map[MAXMAP];
static int g_nmap;
static int g_dev; /* the runtime's current device, as this thread set it */

static void live_add(uint64_t addr, uint64_t bytes, int device, int handle) {
    if (addr == 0 || g_nlive == MAXLIVE) return;
    g_live[g_nlive++] = (struct live){addr, bytes, device, handle, 0, 0};
}

static int live_find(uint64_t addr, int handle) {
    for (int i = 0; i < g_nlive; i++)
        if (g_live[i].addr == addr && g_live[i].handle == handle) return i;
    return -1;
}

static void live_drop(int i) {
    if (i >= 0) g_live[i] = g_live[--g_nlive];
}


static const char *hp(const void *p) { return p == NULL ? "NULL" : "host"; }

/* A freed pointer as printed: host and stack addresses vary between runs. */
static void pr_freed(int which, int s, uint64_t v) {
    if (which == 2) printf(" of=stack");
    else if (which >= 3 || !g_slot_host[s]) printf(" of=0x%llx", (unsigned long long)v);
    else printf(" of=%s", v == 0 ? "NULL" : which == 1 ? "host+512" : "host");
}

static void pr_ptr(const char *name, uint64_t v, int host) {
    if (host) printf(" %s=%s", name, v == 0 ? "NULL" : "host");
    else printf(" %s=0x%llx", name, (unsigned long long)v);
}

/* A successful free. A freed page-locked host address may come back from the heap for a later
   allocation or not, depending on the heap's layout (which the shim changes), so a second free
   of it is not deterministic: the slots holding it get a made-up address instead (a second free
   then fails both ways, still testing the ledger's unknown-free path). Device addresses are the
   simulation's and deterministic: their double frees are kept as they are. */
static void drop_freed(uint64_t v) {
    int i = live_find(v, 0);
    int host = i >= 0 && g_live[i].device < 0;
    live_drop(i);
    if (host)
        for (int k = 0; k < NSLOT; k++)
            if (g_slot[k] == v) g_slot[k] = 0xdead0000ULL + (uint64_t)k * 0x10;
}

static int stack_var;

/* A pointer argument: slot contents, or a foreign one. */
static uint64_t arg_ptr(int which, int s) {
    switch (which) {
    case 0: return g_slot[s % NSLOT];
    case 1: return g_slot[s % NSLOT] + 512; /* interior */
    case 2: return (uint64_t)(uintptr_t)&stack_var;
    case 3: return 0x1234;
    default: return 0;
    }
}

static PFN_cuMemAlloc_v2 g_gp_alloc;

int main(void) {
    char line[256], op[32];
    int n = 0;
    cudaStream_t stream = NULL;
    cudaMemPool_t pool = NULL;
    int setup = cudaStreamCreate(&stream);
    printf("setup stream -> %d\n", setup);
    printf("setup pool -> %d pool=%p\n", cudaDeviceGetDefaultMemPool(&pool, 0), (void *)pool);
    CUmemoryPool dpool = NULL;
    printf("setup cuInit -> %d\n", cuInit(0));
    printf("setup dpool -> %d pool=%p\n", cuDeviceGetDefaultMemPool(&dpool, 0), (void *)dpool);
    {
        void *fn = NULL;
        CUdriverProcAddressQueryResult st = 0;
        CUresult rc = cuGetProcAddress_v2("cuMemAlloc", &fn, 13000, 0, &st);
        /* The pointer itself is the shim's wrapper under the shim: print only that it is set. */
        printf("setup getproc -> %d status=%d fn=%s\n", rc, (int)st, fn ? "set" : "NULL");
        g_gp_alloc = (PFN_cuMemAlloc_v2)fn;
    }

    while (fgets(line, sizeof line, stdin) != NULL) {
        long long a = 0, b = 0, c = 0, d = 0;
        if (sscanf(line, "%31s %lld %lld %lld %lld", op, &a, &b, &c, &d) < 1) continue;
        n++;
        printf("%d %s %lld %lld %lld %lld ->", n, op, a, b, c, d);
        int s = (int)(a % NSLOT);
        int rc = -1;
        void *p = (void *)(uintptr_t)0xdeadbeef;
        CUdeviceptr dp = 0xdeadbeef;
        size_t pitch = 7;
        int host_op = 0;
        /* ---------------- runtime allocations ---------------- */
        if (!strcmp(op, "malloc")) {
            rc = cudaMalloc(c ? NULL : &p, (size_t)b);
            if (!c) goto rt_alloc_done_plain;
            printf(" %d", rc);
        } else if (!strcmp(op, "async")) {
            cudaStream_t st = c == 0 ? NULL : c == 1 ? stream : cudaStreamPerThread;
            rc = d ? cudaMallocAsync_ptsz(&p, (size_t)b, st) : cudaMallocAsync(&p, (size_t)b, st);
            goto rt_alloc_done_plain;
        } else if (!strcmp(op, "pool")) {
            cudaMemPool_t pl = c ? NULL : pool;
            rc = d ? cudaMallocFromPoolAsync_ptsz(&p, (size_t)b, pl, stream)
                   : cudaMallocFromPoolAsync(&p, (size_t)b, pl, stream);
            goto rt_alloc_done_plain;
        } else if (!strcmp(op, "managed")) {
            rc = cudaMallocManaged(&p, (size_t)b, (unsigned)c);
            goto rt_alloc_done_plain;
        } else if (!strcmp(op, "pitch")) {
            rc = cudaMallocPitch(&p, d ? NULL : &pitch, (size_t)b, (size_t)c);
            printf(" %d", rc);
            pr_ptr("p", (uint64_t)(uintptr_t)p, 0);
            printf(" pitch=%zu", pitch);
            if (rc == 0) {
                g_slot[s] = (uint64_t)(uintptr_t)p;
                g_slot_host[s] = 0;
                live_add(g_slot[s], (uint64_t)pitch * (uint64_t)c, g_dev, 0);
            }
        } else if (!strcmp(op, "3d")) {
            struct cudaPitchedPtr pp = {(void *)(uintptr_t)0xdeadbeef, 7, 7, 7};
            struct cudaExtent ext = {(size_t)b, (size_t)c, (size_t)d};
            rc = cudaMalloc3D(&pp, ext);
            printf(" %d", rc);
            pr_ptr("p", (uint64_t)(uintptr_t)pp.ptr, 0);
            printf(" pitch=%zu xsize=%zu ysize=%zu", pp.pitch, pp.xsize, pp.ysize);
            if (rc == 0) {
                g_slot[s] = (uint64_t)(uintptr_t)pp.ptr;
                g_slot_host[s] = 0;
                live_add(g_slot[s], (uint64_t)pp.pitch * (uint64_t)c * (uint64_t)d, g_dev, 0);
            }
        } else if (!strcmp(op, "3dnull")) {
            struct cudaExtent ext = {(size_t)b, (size_t)c, (size_t)d};
            rc = cudaMalloc3D(NULL, ext);
            printf(" %d", rc);
        } else if (!strcmp(op, "host") || !strcmp(op, "hostalloc")) {
            host_op = 1;
            rc = op[4] ? cudaHostAlloc(c == 9 ? NULL : &p, (size_t)b, (unsigned)d)
                       : cudaMallocHost(c == 9 ? NULL : &p, (size_t)b);
            printf(" %d p=%s", rc, c == 9 ? "-" : hp(p));
            if (rc == 0 && c != 9) {
                g_slot[s] = (uint64_t)(uintptr_t)p;
                g_slot_host[s] = 1;
                live_add(g_slot[s], (uint64_t)b, -1, 0);
            }
        }
        /* ---------------- runtime frees ---------------- */
        else if (!strcmp(op, "free") || !strcmp(op, "freeasync") || !strcmp(op, "freehost")) {
            uint64_t v = arg_ptr((int)b, s);
            if (op[4] == 0) rc = cudaFree((void *)(uintptr_t)v);
            else if (op[4] == 'a') rc = c ? cudaFreeAsync_ptsz((void *)(uintptr_t)v, stream)
                                          : cudaFreeAsync((void *)(uintptr_t)v, c ? stream : NULL);
            else rc = cudaFreeHost((void *)(uintptr_t)v);
            printf(" %d", rc);
            pr_freed((int)b, s, v);
            if (rc == 0) drop_freed(v);
        }
        /* ---------------- runtime state ---------------- */
        else if (!strcmp(op, "setdev")) {
            rc = cudaSetDevice((int)a - 1);
            printf(" %d", rc);
            if (rc == 0) g_dev = (int)a - 1;
        } else if (!strcmp(op, "getdev")) {
            int dv = -5;
            rc = cudaGetDevice(a ? NULL : &dv);
            printf(" %d d=%d", rc, dv);
        } else if (!strcmp(op, "getlast")) {
            printf(" %d", cudaGetLastError());
        } else if (!strcmp(op, "peek")) {
            printf(" %d", cudaPeekAtLastError());
        } else if (!strcmp(op, "meminfo")) {
            size_t f = 1, t = 1;
            rc = cudaMemGetInfo(a == 1 ? NULL : &f, a == 2 ? NULL : &t);
            printf(" %d free=%zu total=%zu", rc, f, t);
        } else if (!strcmp(op, "props")) {
            struct cudaDeviceProp prop;
            memset(&prop, 0, sizeof prop);
            rc = cudaGetDeviceProperties_v2(b ? NULL : &prop, (int)a - 1);
            printf(" %d name=\"%s\"", rc, prop.name);
        } else if (!strcmp(op, "inject")) {
            printf(" pending=%d", simcuda_inject_error((int)a, (int)b));
        } else if (!strcmp(op, "live")) {
            printf(" used0=%zu used1=%zu pinned=%zu live=%zu", simcuda_used_bytes(0),
                   simcuda_used_bytes(1), simcuda_pinned_used_bytes(), simcuda_live_allocations());
        }
        /* ---------------- driver allocations ---------------- */
        else if (!strcmp(op, "cualloc") || !strcmp(op, "cuasync") || !strcmp(op, "cupool") ||
                 !strcmp(op, "cumanaged") || !strcmp(op, "gpalloc")) {
            CUdeviceptr *out = c == 9 ? NULL : &dp;
            if (!strcmp(op, "cualloc")) rc = cuMemAlloc_v2(out, (size_t)b);
            else if (!strcmp(op, "gpalloc")) rc = g_gp_alloc ? (int)g_gp_alloc(out, (size_t)b) : -2;
            else if (!strcmp(op, "cuasync")) rc = cuMemAllocAsync(out, (size_t)b, NULL);
            else if (!strcmp(op, "cupool")) rc = cuMemAllocFromPoolAsync(out, (size_t)b, d ? NULL : dpool, NULL);
            else rc = cuMemAllocManaged(out, (size_t)b, (unsigned)d);
            printf(" %d", rc);
            if (out) pr_ptr("p", dp, 0);
            if (rc == 0 && out) {
                g_slot[s] = dp;
                g_slot_host[s] = 0;
                live_add(dp, (uint64_t)b, 0, 0);
            }
        } else if (!strcmp(op, "cupitch")) {
            rc = cuMemAllocPitch_v2(&dp, d ? NULL : &pitch, (size_t)b, (size_t)c, 4);
            printf(" %d", rc);
            pr_ptr("p", dp, 0);
            printf(" pitch=%zu", pitch);
            if (rc == 0) {
                g_slot[s] = dp;
                g_slot_host[s] = 0;
                live_add(dp, (uint64_t)pitch * (uint64_t)c, 0, 0);
            }
        } else if (!strcmp(op, "cuhost") || !strcmp(op, "cuhostalloc")) {
            host_op = 1;
            void **out = c == 9 ? NULL : &p;
            rc = op[6] ? cuMemHostAlloc(out, (size_t)b, (unsigned)d) : cuMemAllocHost_v2(out, (size_t)b);
            printf(" %d p=%s", rc, out ? hp(p) : "-");
            if (rc == 0 && out) {
                g_slot[s] = (uint64_t)(uintptr_t)p;
                g_slot_host[s] = 1;
                live_add(g_slot[s], (uint64_t)b, -1, 0);
            }
        }
        /* ---------------- driver frees ---------------- */
        else if (!strcmp(op, "cufree") || !strcmp(op, "cufreeasync") || !strcmp(op, "cufreehost")) {
            uint64_t v = arg_ptr((int)b, s);
            if (op[6] == 0) rc = cuMemFree_v2(v);
            else if (op[6] == 'a') rc = cuMemFreeAsync(v, NULL);
            else rc = cuMemFreeHost((void *)(uintptr_t)v);
            printf(" %d", rc);
            pr_freed((int)b, s, v);
            if (rc == 0) drop_freed(v);
        } else if (!strcmp(op, "cuinject")) {
            printf(" pending=%d", simcu_inject_error((int)a, (int)b));
        } else if (!strcmp(op, "cumeminfo")) {
            size_t f = 1, t = 1;
            rc = cuMemGetInfo_v2(&f, &t);
            printf(" %d free=%zu total=%zu", rc, f, t);
        } else if (!strcmp(op, "trim")) {
            printf(" %d", cuMemPoolTrimTo(dpool, 0));
        }
        /* ---------------- VMM ---------------- */
        else if (!strcmp(op, "create")) {
            int h = (int)(a % NHANDLE);
            CUmemAllocationProp prop;
            memset(&prop, 0, sizeof prop);
            prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
            prop.location.type = c == 2 ? CU_MEM_LOCATION_TYPE_HOST : CU_MEM_LOCATION_TYPE_DEVICE;
            prop.location.id = c == 1 ? 1 : 0;
            CUmemGenericAllocationHandle id = 0xdead;
            rc = cuMemCreate(d == 9 ? NULL : &id, (size_t)b, d == 8 ? NULL : &prop, 0);
            printf(" %d h=0x%llx", rc, (unsigned long long)id);
            if (rc == 0 && d != 9) {
                g_handle[h] = id;
                live_add(id, (uint64_t)b, c == 2 ? -1 : prop.location.id, 1);
            }
        } else if (!strcmp(op, "release")) {
            uint64_t id = b ? 0x7777 : g_handle[a % NHANDLE];
            rc = cuMemRelease(id);
            printf(" %d", rc);
            int i = live_find(id, 1);
            if (rc == 0 && i >= 0) {
                g_live[i].released = 1;
                if (g_live[i].maps == 0) live_drop(i);
            }
        } else if (!strcmp(op, "reserve")) {
            int r = (int)(a % NRESERVE);
            CUdeviceptr va = 0;
            rc = cuMemAddressReserve(&va, (size_t)b, 0, 0, 0);
            printf(" %d va=0x%llx", rc, (unsigned long long)va);
            if (rc == 0) {
                g_reserve[r].va = va;
                g_reserve[r].size = (size_t)b;
            }
        } else if (!strcmp(op, "addrfree")) {
            int r = (int)(a % NRESERVE);
            rc = cuMemAddressFree(g_reserve[r].va, g_reserve[r].size);
            printf(" %d", rc);
        } else if (!strcmp(op, "map") || !strcmp(op, "unmap")) {
            /* map R H OFFSET_MB SIZE_MB: at the reserve's start + offset */
            int r = (int)(a % NRESERVE);
            uint64_t id = g_handle[b % NHANDLE];
            uint64_t va = g_reserve[r].va + (uint64_t)c * 2 * 1024 * 1024;
            size_t size = (size_t)d * 2 * 1024 * 1024;
            if (op[0] == 'm') {
                rc = cuMemMap(va, size, 0, id, 0);
                printf(" %d", rc);
                int i = live_find(id, 1);
                if (rc == 0 && g_nmap < MAXMAP) {
                    g_map[g_nmap].va = va;
                    g_map[g_nmap].size = size;
                    g_map[g_nmap].handle = id;
                    g_nmap++;
                    if (i >= 0) g_live[i].maps++;
                }
            } else {
                rc = cuMemUnmap(va, size);
                printf(" %d", rc);
                if (rc == 0) {
                    for (int m = 0; m < g_nmap; m++) {
                        if (g_map[m].va == va && g_map[m].size == size) {
                            int i = live_find(g_map[m].handle, 1);
                            if (i >= 0 && --g_live[i].maps == 0 && g_live[i].released) live_drop(i);
                            g_map[m] = g_map[--g_nmap];
                            break;
                        }
                    }
                }
            }
        } else {
            printf(" unknown op");
        }
        (void)host_op;
        goto next;
    rt_alloc_done_plain:
        printf(" %d", rc);
        pr_ptr("p", (uint64_t)(uintptr_t)p, 0);
        if (rc == 0 && p != NULL) {
            g_slot[s] = (uint64_t)(uintptr_t)p;
                g_slot_host[s] = 0;
            live_add(g_slot[s], (uint64_t)b, g_dev, 0);
        }
    next:
        putchar('\n');
    }

    /* What the program still holds, by its own accounting. */
    for (int dv = -1; dv < 2; dv++) {
        unsigned long long bytes = 0, count = 0;
        for (int i = 0; i < g_nlive; i++) {
            if (g_live[i].device == dv) {
                bytes += g_live[i].bytes;
                count++;
            }
        }
        if (dv < 0) printf("held pinned bytes %llu count %llu\n", bytes, count);
        else printf("held device %d bytes %llu count %llu\n", dv, bytes, count);
    }
    fflush(stdout);
    int (*dump)(const char *) = (int (*)(const char *))dlsym(RTLD_DEFAULT, "oomshim_dump");
    if (dump != NULL) fprintf(stderr, "dump_rc %d\n", dump("seq-end"));
    return 0;
}
