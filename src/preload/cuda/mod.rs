//! CUDA as the shim itself calls it: the real functions behind the hooks ([`real`]), the device
//! queries of each layer ([`queries`]), the stream-ordered pools asked at a failure ([`pools`]) and
//! the one gathering of what a dump learns about the device ([`context`]). Imports nothing of the
//! rest of the shim: everything above reaches CUDA through here.

pub mod context;
pub mod pools;
pub mod queries;
pub mod real;
