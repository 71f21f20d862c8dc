//! oomshim-core: what the shim and the CLI share, as plain Rust testable without CUDA: the
//! settings ([`config`]), facts about the process and its machine ([`facts`]), the live
//! region's format and reader ([`flight`]), the files a job leaves for its scheduler
//! ([`jobfiles`]), the Python hook's files that both launchers install ([`pyhook`]) and the
//! verdict ([`verdict`]). Above the dump format (`dump`), below the shim's machinery
//! (`oomshim_host`, src/host), the hooks (`oomshim`, src/preload) and the CLI (src/cli).

pub mod config;
pub mod facts;
pub mod flight;
pub mod jobfiles;
pub mod pyhook;
pub mod verdict;
