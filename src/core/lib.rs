//! oomshim-core: what the shim knows and concludes, as plain Rust testable without CUDA. Above
//! the dump format (`dump`), below the hooks (`oomshim`, src/preload) and the CLI (src/cli).

pub mod alloc;
pub mod config;
pub mod facts;
pub mod flight;
pub mod jobfiles;
pub mod ledger;
pub mod own_fd;
pub mod pyhook;
pub mod pystack;
pub mod stacks;
pub mod sys;
pub mod verdict;
