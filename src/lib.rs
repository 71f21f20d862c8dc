//! oomshim: explains CUDA out-of-memory errors.
//!
//! The crate builds two things from one core: `liboomshim.so` (the preload shim; its C ABI lives
//! in [`ffi`] alone) and the `oomshim` CLI. Everything outside `ffi` is plain Rust, testable
//! without CUDA.

pub mod alloc;
pub mod cli;
pub mod config;
pub mod dump;
pub mod facts;
pub mod ffi;
pub mod flight;
pub mod ledger;
mod own_fd;
pub mod pyhook;
pub mod pystack;
pub mod report;
pub mod runtime;
mod signals;
pub mod stacks;
pub mod sys;
pub mod testbed;
pub mod verdict;
