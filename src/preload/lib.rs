//! liboomshim.so: the preload shim, a one-way pipeline. [`ffi`] is its C ABI alone: each hook
//! converts its arguments and calls one entry point of [`shim`], the one place that knows every
//! subsystem: allocator mode (`allocator_mode`), the out-of-memory path from a failure to its
//! dump and summary (`failure`), the recording of allocations and their growth (`record`). Below
//! them, CUDA as the shim calls it (`cuda`), and [`publish`], the flight recorder's live summary.
//! Everything it decides with comes from `oomshim_core`, and everything it writes is in the
//! `dump` format.

mod allocator_mode;
mod cuda;
mod failure;
pub mod ffi;
mod fork;
pub mod publish;
mod record;
pub mod shim;
mod state;
