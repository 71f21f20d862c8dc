//! The C ABI of liboomshim.so and nothing else: the hooked CUDA runtime and driver functions
//! (one table each, [`runtime`] and [`driver`]), the exported `oomshim_*` API, finding the real
//! functions, and the boundary that keeps the shim's own failures (panics, re-entry) from ever
//! reaching the host program. Bookkeeping lives in [`crate::shim`]; this module only translates
//! between C and it. The real functions and the device queries are `crate::cuda`'s.

mod boundary;
mod cxx_throw;
mod dl;
mod driver;
mod hooks;
mod process_exit;
mod runtime;
mod torch_alloc;

pub use driver::exported_names as driver_exported_names;
pub use hooks::PROGRAM_API as PROGRAM_API_EXPORTS;
pub use runtime::exported_names as runtime_exported_names;
pub use torch_alloc::EXPORTED_NAMES as TORCH_ALLOCATOR_EXPORTS;

pub use process_exit::EXPORTED_NAMES as PROCESS_EXIT_EXPORTS;

use std::panic::catch_unwind;

/// What the shim notes the moment it is loaded, before the program's `main` can change it:
/// the identity of fd 2 (so the shim never writes into a file that later took that number,
/// `oomshim_host::sys::say`) and the working directory (a relative `OOMSHIM_DIR` is relative to where
/// the program started, not to where it has moved by its first CUDA call). One `fstat` and one
/// `getcwd` into a static buffer: nothing is allocated, nothing can fail loudly.
extern "C" fn note_load_time_facts() {
    let _ = catch_unwind(|| {
        oomshim_host::sys::say::note_stderr_at_load();
        crate::state::note_start_dir();
    });
}

#[used]
#[unsafe(link_section = ".init_array")]
static NOTE_LOAD_TIME_FACTS: extern "C" fn() = note_load_time_facts;

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
