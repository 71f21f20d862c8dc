// Issue 26, item 3: allocator mode's serving path against torch's native caching allocator, in
// ONE process (allocator_ab.py can only compare them across processes: torch swaps its allocator
// only before its first allocation). Both allocators live side by side here: torch's native one
// (the process's current allocator, never replaced) and a CUDAPluggableAllocator over
// liboomshim.so's oomshim_torch_alloc/free, built the way torch.cuda.memory.CUDAPluggableAllocator
// builds it, each called through raw_alloc_with_stream/raw_delete as a tensor's storage is. Blocks
// of each kind alternate with native blocks; each block is one pass over the same sequence of
// sizes and lifetimes (a ring of live tensors, sizes as a training step makes them). Also timed:
// oomshim's entry points called directly (without torch's wrapper), and the CUDA runtime calls the
// serving path makes per tensor. No Python here, so the recording modes are pass-through (the
// allocator alone) and totals (every tensor in the ledger, no stack); Python stacks are
// allocator_modes.py's.
//
//   build: g++ -O2 -std=c++17 serve_ab.cpp $(torch includes and libs) -ldl    (run_all.py does it)
//   usage: serve_ab LIBOOMSHIM [ROUNDS]      prints figures and one JSON line, never a pass
#include <c10/cuda/CUDACachingAllocator.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <torch/csrc/cuda/CUDAPluggableAllocator.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

using AllocFn = void *(*)(size_t, int, cudaStream_t);
using FreeFn = void (*)(void *, size_t, int, cudaStream_t);
using SetRecordingFn = int (*)(int);

// oomshim.RECORDING_MODES
enum { PASS_THROUGH = 0, TOTALS = 1 };

static const int LIVE = 256;     // tensors alive at once
static const int PAIRS = 20000;  // alloc+free pairs a block

// The sizes of one block: log-uniform 512 B .. 32 MiB, rounded to 512 as torch rounds.
static std::vector<size_t> sizes() {
    std::vector<size_t> v(PAIRS);
    uint64_t s = 0x9E3779B97F4A7C15ULL;
    for (auto &x : v) {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        double e = 9.0 + (double)(s % 1000) / 1000.0 * 16.0;  // 2^9 .. 2^25
        x = ((size_t)std::exp2(e) + 511) / 512 * 512;
    }
    return v;
}

// ns per pair of one block: `alloc(size)` for each size, each freed LIVE allocations later.
template <class A, class F>
static double block(const std::vector<size_t> &sz, A alloc, F release) {
    std::vector<void *> ring(LIVE, nullptr);
    std::vector<size_t> ring_size(LIVE, 0);
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < PAIRS; i++) {
        int k = i % LIVE;
        if (ring[k]) release(ring[k], ring_size[k]);
        ring[k] = alloc(sz[i]);
        ring_size[k] = sz[i];
    }
    for (int k = 0; k < LIVE; k++)
        if (ring[k]) release(ring[k], ring_size[k]);
    auto t1 = std::chrono::steady_clock::now();
    return std::chrono::duration<double, std::nano>(t1 - t0).count() / PAIRS;
}

static double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    size_t n = v.size();
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static double quantile(std::vector<double> v, double q) {
    std::sort(v.begin(), v.end());
    return v[(size_t)(q * (v.size() - 1) + 0.5)];
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: serve_ab LIBOOMSHIM [ROUNDS]\n");
        return 2;
    }
    int rounds = argc > 2 ? atoi(argv[2]) : 15;
    cudaFree(nullptr);  // the context, before either allocator asks for memory
    // As ctypes.CDLL loads it (torch.cuda.memory.CUDAPluggableAllocator).
    void *lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        fprintf(stderr, "dlopen %s: %s\n", argv[1], dlerror());
        return 2;
    }
    auto oom_alloc = (AllocFn)dlsym(lib, "oomshim_torch_alloc");
    auto oom_free = (FreeFn)dlsym(lib, "oomshim_torch_free");
    auto set_recording = (SetRecordingFn)dlsym(lib, "oomshim_set_recording");
    if (!oom_alloc || !oom_free || !set_recording) {
        fprintf(stderr, "liboomshim.so lacks the allocator entry points\n");
        return 2;
    }
    auto plug = torch::cuda::CUDAPluggableAllocator::createCustomAllocator(
        [oom_alloc](size_t n, auto device, cudaStream_t s) { return oom_alloc(n, (int)device, s); },
        [oom_free](void *p, size_t n, auto device, cudaStream_t s) { oom_free(p, n, (int)device, s); });
    auto native = c10::cuda::CUDACachingAllocator::get();
    int devices = 0;
    cudaGetDeviceCount(&devices);
    native->init(devices);  // what torch.cuda's lazy init does for the native allocator
    plug->init(devices);
    cudaStream_t stream = nullptr;
    auto sz = sizes();

    auto native_block = [&] {
        return block(sz, [&](size_t n) { return native->raw_alloc_with_stream(n, stream); },
                     [&](void *p, size_t) { native->raw_delete(p); });
    };
    auto plug_block = [&](int mode) {
        set_recording(mode);
        return block(sz, [&](size_t n) { return plug->raw_alloc_with_stream(n, stream); },
                     [&](void *p, size_t) { plug->raw_delete(p); });
    };
    auto direct_block = [&](int mode) {
        set_recording(mode);
        return block(sz, [&](size_t n) { return oom_alloc(n, 0, stream); },
                     [&](void *p, size_t n) { oom_free(p, n, 0, stream); });
    };
    // Warm both caches (their segments come from cudaMalloc once).
    native_block();
    plug_block(TOTALS);
    direct_block(TOTALS);

    struct Arm {
        const char *name;
        std::function<double()> run;
        std::vector<double> ns, ratio;
    };
    std::vector<Arm> arms;
    arms.push_back({"allocator_pass_through", [&] { return plug_block(PASS_THROUGH); }, {}, {}});
    arms.push_back({"allocator_totals", [&] { return plug_block(TOTALS); }, {}, {}});
    arms.push_back({"direct_totals", [&] { return direct_block(TOTALS); }, {}, {}});
    std::vector<double> native_ns;
    double prev = native_block();
    native_ns.push_back(prev);
    for (int r = 0; r < rounds; r++) {
        for (auto &a : arms) {
            double t = a.run();
            double next = native_block();
            native_ns.push_back(next);
            a.ns.push_back(t);
            a.ratio.push_back(t / ((prev + next) / 2));
            prev = next;
        }
    }

    // The runtime calls the serving path makes per tensor, alone.
    auto per_call = [](auto f) {
        const int n = 200000;
        auto t0 = std::chrono::steady_clock::now();
        for (int i = 0; i < n; i++) f();
        auto t1 = std::chrono::steady_clock::now();
        return std::chrono::duration<double, std::nano>(t1 - t0).count() / n;
    };
    cudaStreamCaptureStatus status;
    unsigned long long id;
    double capture_info_ns = per_call([&] { cudaStreamGetCaptureInfo(stream, &status, &id); });
    int dev;
    double get_device_ns = per_call([&] { cudaGetDevice(&dev); });

    printf("serving path, one process, blocks of %d alloc+free pairs, %d live, %d rounds\n", PAIRS, LIVE,
           rounds);
    printf("  torch native: %.0f ns a pair (median of %zu blocks)\n", median(native_ns), native_ns.size());
    std::string json = "{\"case\": \"serve_ab\", \"native_ns\": " + std::to_string(median(native_ns));
    for (auto &a : arms) {
        double lo = quantile(a.ratio, 0.25), hi = quantile(a.ratio, 0.75), m = median(a.ratio);
        printf("  %-22s %.0f ns a pair, %.3fx native (middle half %.3f-%.3f)\n", a.name, median(a.ns), m, lo, hi);
        json += std::string(", \"") + a.name + "\": {\"ns\": " + std::to_string(median(a.ns)) +
                ", \"over_native\": " + std::to_string(m) + ", \"q1\": " + std::to_string(lo) +
                ", \"q3\": " + std::to_string(hi) + "}";
    }
    printf("  cudaStreamGetCaptureInfo %.0f ns a call, cudaGetDevice %.0f ns a call\n", capture_info_ns,
           get_device_ns);
    json += ", \"capture_info_ns\": " + std::to_string(capture_info_ns) +
            ", \"get_device_ns\": " + std::to_string(get_device_ns) + "}";
    printf("%s\n", json.c_str());
    return 0;
}
