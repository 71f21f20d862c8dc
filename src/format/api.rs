//! The names a dump's `api` fields hold, spelled once for every crate: the shim records
//! `Api::name` (oomshim_core's ledger, which returns these constants), the reports recognise
//! allocation frames by [`CUDA_ALLOCATION_FUNCTIONS`] and the verdict matches on them. This
//! crate is the lowest layer, so the list lives here; the shim's hook tables are checked against
//! it by a test (src/preload/ffi/mod.rs).

/// Declares each name as a constant and [`CUDA_ALLOCATION_FUNCTIONS`] as the list of them, so
/// a name is written exactly once.
macro_rules! cuda_allocation_functions {
    ($( $(#[$doc:meta])* $konst:ident = $name:literal, )*) => {
        $( $(#[$doc])* pub const $konst: &str = $name; )*

        /// CUDA allocation entry points as programs write them, without the `_v2`-style and
        /// per-thread (`_ptsz`, `_ptds`) suffixes of the exported symbols.
        pub const CUDA_ALLOCATION_FUNCTIONS: &[&str] = &[$($konst),*];
    };
}

cuda_allocation_functions! {
    CUDA_MALLOC = "cudaMalloc",
    CUDA_MALLOC_ASYNC = "cudaMallocAsync",
    CUDA_MALLOC_FROM_POOL_ASYNC = "cudaMallocFromPoolAsync",
    CUDA_MALLOC_MANAGED = "cudaMallocManaged",
    CUDA_MALLOC_PITCH = "cudaMallocPitch",
    CUDA_MALLOC_3D = "cudaMalloc3D",
    CUDA_MALLOC_HOST = "cudaMallocHost",
    CUDA_HOST_ALLOC = "cudaHostAlloc",
    CU_MEM_ALLOC = "cuMemAlloc",
    CU_MEM_ALLOC_ASYNC = "cuMemAllocAsync",
    CU_MEM_ALLOC_FROM_POOL_ASYNC = "cuMemAllocFromPoolAsync",
    CU_MEM_ALLOC_MANAGED = "cuMemAllocManaged",
    CU_MEM_ALLOC_PITCH = "cuMemAllocPitch",
    CU_MEM_ALLOC_HOST = "cuMemAllocHost",
    CU_MEM_HOST_ALLOC = "cuMemHostAlloc",
    /// Physical memory of a VMM handle, on a device or in host memory.
    CU_MEM_CREATE = "cuMemCreate",
    /// Not recorded as an allocation (the handle's `cuMemCreate` is), but a frame of it only
    /// repeats how memory was allocated.
    CU_MEM_MAP = "cuMemMap",
    /// As [`CU_MEM_MAP`]: address space, not memory.
    CU_MEM_ADDRESS_RESERVE = "cuMemAddressReserve",
}

/// A tensor handed to PyTorch by oomshim's own caching allocator (allocator mode).
pub const TORCH_ALLOC: &str = "oomshim_torch_alloc";

/// The failing "call" of an out-of-memory error a framework raised without any CUDA call
/// failing (never an allocation).
pub const FRAMEWORK_ALLOCATOR: &str = "framework_allocator";
