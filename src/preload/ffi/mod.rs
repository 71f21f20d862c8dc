//! The C ABI of liboomshim.so and nothing else: the hooked CUDA runtime and driver functions
//! (one table each, [`runtime`] and [`driver`]), the exported `oomshim_*` API, finding the real
//! functions, and the boundary that keeps the shim's own failures (panics, re-entry) from ever
//! reaching the host program. Bookkeeping lives in [`crate::live`]; this module only translates
//! between C and it.

mod cxx_throw;
mod dl;
mod driver;
mod hooks;
mod pools;
mod process_exit;
mod real;
mod runtime;
mod torch_alloc;

pub use driver::exported_names as driver_exported_names;
pub use hooks::PROGRAM_API as PROGRAM_API_EXPORTS;
pub use runtime::exported_names as runtime_exported_names;
pub use torch_alloc::EXPORTED_NAMES as TORCH_ALLOCATOR_EXPORTS;

pub use process_exit::EXPORTED_NAMES as PROCESS_EXIT_EXPORTS;
pub use real::RealFn;

// The boundary and the real `dlsym` live in `oomshim_host::sys`, below both this module and `live`.
pub use oomshim_host::sys::cuda_error;
pub(crate) use oomshim_host::sys::Guard;

use std::ffi::CStr;
use std::panic::catch_unwind;

/// `s` (which ends in NUL) as a C string, at compile time: the exported names of the hook
/// tables are generated as `concat!(name, "\0")`.
pub(crate) const fn cstr(s: &'static str) -> &'static CStr {
    match CStr::from_bytes_with_nul(s.as_bytes()) {
        Ok(c) => c,
        Err(_) => panic!("not NUL-terminated"),
    }
}

/// What the shim notes the moment it is loaded, before the program's `main` can change it:
/// the identity of fd 2 (so the shim never writes into a file that later took that number,
/// `oomshim_host::sys::say`) and the working directory (a relative `OOMSHIM_DIR` is relative to where
/// the program started, not to where it has moved by its first CUDA call). One `fstat` and one
/// `getcwd` into a static buffer: nothing is allocated, nothing can fail loudly.
extern "C" fn note_load_time_facts() {
    let _ = catch_unwind(|| {
        oomshim_host::sys::say::note_stderr_at_load();
        crate::live::note_start_dir();
    });
}

#[used]
#[unsafe(link_section = ".init_array")]
static NOTE_LOAD_TIME_FACTS: extern "C" fn() = note_load_time_facts;

/// What the bookkeeping shared by the runtime hooks and the driver hooks asks of its layer.
/// Both layers report success as 0 and out-of-memory as 2 (`cudaErrorMemoryAllocation`,
/// `CUDA_ERROR_OUT_OF_MEMORY`), so only these queries differ.
pub(crate) struct Layer {
    /// The calling thread's current device (no context is created by asking).
    pub current_device: fn() -> i32,
    /// (free, total) of the calling thread's current device.
    pub mem_info: fn() -> Option<(u64, u64)>,
    pub device_name: fn(i32) -> Option<String>,
    /// The runtime's version, where this layer can tell it.
    pub runtime_version: fn() -> Option<i32>,
}

// The shared code compares with the runtime's codes; the driver's are the same numbers.
const _: () = assert!(
    driver::CUDA_SUCCESS == cuda_error::SUCCESS
        && driver::CUDA_ERROR_OUT_OF_MEMORY == cuda_error::MEMORY_ALLOCATION
);

/// A device allocation failed for lack of memory: asks the layer about the device on the
/// failing thread (the one place that may ask CUDA safely) and hands the failure on with all it
/// learnt. Asks nothing when the failure would be dropped (pass-through, the shim off).
pub(crate) fn record_oom(
    layer: &Layer,
    api: oomshim_host::ledger::Api,
    bytes: u64,
    device: i32,
    rc: i32,
    stream: usize,
) {
    if !crate::live::records_failures() {
        return;
    }
    crate::live::record_oom(crate::live::OomEvent {
        api,
        bytes,
        device,
        error_code: rc,
        stream,
        context: failure_context(layer, device),
    });
}

/// What a failure on `device` knows, asked on the failing thread: its pools and the VMM layout,
/// the CUDA versions (asked once per process), free/total of the current device, its name and
/// UUID (asked once per device), and in allocator mode the allocator's free blocks.
fn failure_context(layer: &Layer, device: i32) -> crate::live::FailureContext {
    let pools = pools::snapshot(device);
    let vmm = crate::live::vmm_summary();
    let (driver_version, runtime_version) =
        crate::live::context::note_cuda_versions(driver::driver_version, layer.runtime_version);
    let mem_info = (layer.mem_info)();
    let (device_name, device_uuid) = crate::live::context::cached_device_identity(
        device,
        layer.device_name,
        driver::device_uuid,
    );
    crate::live::FailureContext {
        device: Some(device),
        mem_info,
        device_name,
        device_uuid,
        driver_version,
        runtime_version,
        pools,
        vmm,
        free_blocks: crate::live::allocator_mode::free_blocks_if_active(device),
        memory_cap: None,
    }
}

/// What an on-demand dump (`oomshim_dump`) knows, asked on the calling thread: about `device`
/// (the caller's current device, when the process allocated there: asking about another could
/// create a context) its pools, free/total (`mem_info` asks the current device) and name; the
/// CUDA versions as far as a failure asked them; in allocator mode the allocator's free blocks.
pub(crate) fn on_demand_context(
    device: Option<i32>,
    mem_info: fn() -> Option<(u64, u64)>,
    device_name: fn(i32) -> Option<String>,
) -> crate::live::FailureContext {
    let pools = device.map(pools::snapshot).unwrap_or_default();
    let vmm = crate::live::vmm_summary();
    let mem_info = device.and_then(|_| mem_info());
    let (device_name, device_uuid) = device
        .map(|d| crate::live::context::cached_device_identity(d, device_name, driver::device_uuid))
        .unwrap_or_default();
    let (driver_version, runtime_version) = crate::live::context::cuda_versions();
    crate::live::FailureContext {
        device,
        mem_info,
        device_name,
        device_uuid,
        driver_version,
        runtime_version,
        pools,
        vmm,
        free_blocks: crate::live::allocator_mode::free_blocks_if_active(device.unwrap_or(0)),
        memory_cap: None,
    }
}

/// `OOMSHIM_FAULT=panic-in-alloc[:N]` (a test hook, see RELIABILITY.md section 7): a panic in
/// the hook path of the Nth successful allocation, caught by [`Guard::run`] like any other.
fn inject_alloc_fault() {
    if let oomshim_core::config::Fault::PanicInAlloc(n) = oomshim_host::sys::fault() {
        static SEEN: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        if SEEN.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1 == n {
            panic!("injected fault, OOMSHIM_FAULT=panic-in-alloc:{n}");
        }
    }
}

/// Bookkeeping after an allocation call of either layer returned `rc`.
pub(crate) fn after_alloc(
    layer: &Layer,
    guard: &Guard,
    api: oomshim_host::ledger::Api,
    rc: std::ffi::c_int,
    addr: usize,
    bytes: u64,
    stream: usize,
) {
    guard.run(|| {
        if rc == cuda_error::SUCCESS {
            if addr != 0 {
                inject_alloc_fault();
                if crate::live::recording::current() == crate::live::Recording::PassThrough {
                    // Nothing is recorded: not even the device is asked.
                    crate::live::record_alloc(api, addr, bytes, -1, stream);
                    return;
                }
                let device = if api.is_pinned_host() {
                    -1
                } else {
                    (layer.current_device)()
                };
                if api.has_stream() {
                    pools::note(device, None);
                }
                crate::live::record_alloc(api, addr, bytes, device, stream);
            }
        } else if rc == cuda_error::MEMORY_ALLOCATION {
            if api.is_pinned_host() {
                crate::live::record_pinned_failure(api, bytes);
            } else if crate::live::records_failures() {
                // (Not even the device is asked in pass-through.)
                record_oom(layer, api, bytes, (layer.current_device)(), rc, stream);
            }
        }
    });
}

/// Removes `ptr` from the ledger before the real free runs (the runtime may hand the address
/// to another thread the moment it is freed; see `Ledger::take`); puts it back if the free fails.
pub(crate) fn free_with(
    guard: Option<&Guard>,
    ptr: usize,
    real_free: impl FnOnce() -> std::ffi::c_int,
) -> std::ffi::c_int {
    let taken = match guard {
        Some(g) if ptr != 0 => g.run(|| crate::live::take(ptr)).flatten(),
        _ => None,
    };
    let rc = real_free();
    if rc != cuda_error::SUCCESS {
        if let (Some(g), Some(a)) = (guard, taken) {
            g.run(|| crate::live::reinstate(ptr, a));
        }
    }
    rc
}

#[cfg(test)]
mod tests {
    use super::{driver, runtime};
    use oomshim_host::ledger::Api;

    /// Every row of both hook tables, as (exported name, the `Api` it records).
    fn rows() -> Vec<(&'static str, Option<Api>)> {
        let names = runtime::NAMES.iter().chain(driver::NAMES);
        let apis: Vec<Option<Api>> = runtime::apis().into_iter().chain(driver::apis()).collect();
        assert_eq!(runtime::NAMES.len() + driver::NAMES.len(), apis.len());
        names
            .zip(apis)
            .map(|(n, a)| (n.to_str().unwrap(), a))
            .collect()
    }

    #[test]
    fn each_row_records_the_api_of_its_own_name() {
        for (name, api) in rows() {
            let Some(api) = api else { continue };
            // The exported symbol carries the `_v2` version and `_ptsz` per-thread-stream
            // suffixes; the recorded name is the function as programs write it.
            let base = name.strip_suffix("_ptsz").unwrap_or(name);
            let base = base.strip_suffix("_v2").unwrap_or(base);
            assert_eq!(api.name(), base, "{name} records {api:?}");
        }
    }

    #[test]
    fn every_recorded_api_is_one_the_reports_know() {
        // The reports drop allocation frames by this list (dump::view::is_cuda_api_frame);
        // a hooked function missing from it would show up as the program's own frame.
        for (name, api) in rows() {
            if let Some(api) = api {
                assert!(
                    dump::api::CUDA_ALLOCATION_FUNCTIONS.contains(&api.name()),
                    "{name}: {} is not in dump::api",
                    api.name()
                );
            }
        }
        assert!(dump::api::CUDA_ALLOCATION_FUNCTIONS.contains(&Api::CuMemCreateHost.name()));
    }

    #[test]
    fn the_tables_name_each_export_once() {
        let mut names: Vec<&str> = rows().into_iter().map(|(n, _)| n).collect();
        let all = names.len();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), all, "a name in two rows");
    }

    #[test]
    fn every_allocating_hook_records_an_api() {
        for (name, api) in rows() {
            let allocates =
                name.contains("Malloc") || name.contains("Alloc") || name == "cuMemCreate";
            assert_eq!(api.is_some(), allocates, "{name}");
        }
    }
}
