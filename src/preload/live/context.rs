//! What a dump learns about the device at the moment it describes, gathered into one value on
//! the thread where that moment is (a failing hook, the thread that called `oomshim_dump`, the
//! allocator's failing thread) and carried with the failure to whoever assembles the dump.
//! Assembly reads it from the value only: two failures close together, on two devices, each keep
//! their own device's answers, whichever is written first.

use dump::model::{FreeBlocks, MemoryCap, PoolInfo, VmmInfo};

/// Everything a dump knows from CUDA (and from the allocator, in allocator mode) about one
/// failure or one on-demand dump. Gathered once; never read back from anywhere else.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FailureContext {
    /// The device asked about: the failing one, or an on-demand dump's caller's current device
    /// when the process already allocated there; `None` when no device was asked.
    pub device: Option<i32>,
    /// (free, total) bytes of `device`, asked on the gathering thread.
    pub mem_info: Option<(u64, u64)>,
    pub device_name: Option<String>,
    /// The GPU UUID of `device` (`cuDeviceGetUuid`), when known.
    pub device_uuid: Option<String>,
    /// `cuDriverGetVersion` and `cudaRuntimeGetVersion`, as far as the process has asked them.
    pub driver_version: Option<i32>,
    pub runtime_version: Option<i32>,
    /// The stream-ordered pools of `device` (empty when it has none, or none were asked).
    pub pools: Vec<PoolInfo>,
    /// The VMM layout of the process at that moment (`None`: nothing reserved or mapped, or not
    /// taken).
    pub vmm: Option<VmmInfo>,
    /// Allocator mode: the allocator's exact free-block state of `device` (of device 0 when no
    /// device was asked).
    pub free_blocks: Option<FreeBlocks>,
    /// A per-process cap (torch's `set_per_process_memory_fraction`) the failure was judged
    /// against: `mem_info` is then the cap's (free, total).
    pub memory_cap: Option<MemoryCap>,
}

impl FailureContext {
    /// What the process learnt about `device` before now, without asking CUDA: its UUID if
    /// asked already, the CUDA versions if a failure asked them. `mem_info` is the caller's own
    /// figure, if it has one. Nothing else is filled in.
    pub fn learnt_before(device: Option<i32>, mem_info: Option<(u64, u64)>) -> FailureContext {
        let (driver_version, runtime_version) = super::cuda_versions();
        FailureContext {
            device,
            mem_info,
            device_uuid: device.and_then(super::cached_device_uuid),
            driver_version,
            runtime_version,
            ..FailureContext::default()
        }
    }

    /// The context of a dump taken where CUDA must not be asked (the shim's own signal, interval,
    /// exit and live-summary threads, which could create a context; a framework's word, which
    /// carries its own numbers): what the process learnt before, and in allocator mode the
    /// allocator's free blocks.
    pub fn without_cuda(device: Option<i32>, mem_info: Option<(u64, u64)>) -> FailureContext {
        FailureContext {
            free_blocks: super::allocator_mode::free_blocks(device),
            ..FailureContext::learnt_before(device, mem_info)
        }
    }
}
