//! liboomshim.so: the preload shim. Its C ABI lives in [`ffi`] alone; [`live`] is the shim's
//! state inside the host program (the ledger it fills, the out-of-memory path, growth, the
//! recording switch); [`publish`] keeps the flight recorder's live summary. Everything it
//! decides with comes from `oomshim_core`, and everything it writes is in the `dump` format.

mod cuda;
pub mod ffi;
pub mod live;
pub mod publish;
