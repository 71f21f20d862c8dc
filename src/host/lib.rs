//! oomshim-host: the shim's machinery inside the host program, which only liboomshim.so links:
//! process plumbing ([`sys`]: the boundary's guard, the real `dlsym`, `atexit`/`atfork`/signal
//! registration, the shim's own stderr), descriptors of its own ([`own_fd`]), native stacks
//! captured and symbolised ([`stacks`]), Python frames read without the GIL ([`pystack`]), the
//! live allocations ([`ledger`]) and torch's caching allocator reimplemented for allocator mode
//! ([`alloc`]). Above the model it records into (`oomshim_core`, `dump`), below the hooks
//! (`oomshim`, src/preload). The CLI never links it: it reads dumps.

pub mod alloc;
pub mod ledger;
pub mod own_fd;
pub mod pystack;
pub mod stacks;
pub mod sys;
