//! What a dump learns about the device at the moment it describes, gathered into one value on
//! the thread where that moment is (a failing hook, the thread that called `oomshim_dump`, the
//! allocator's failing thread) and carried with the failure to whoever assembles the dump.
//! Assembly reads it from the value only: two failures close together, on two devices, each keep
//! their own device's answers, whichever is written first.

use super::pools;
use super::queries::{driver, Layer};
use dump::model::{FreeBlocks, MemoryCap, PoolInfo, VmmInfo};
use std::sync::{Mutex, MutexGuard, OnceLock};

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
        let (driver_version, runtime_version) = cuda_versions();
        FailureContext {
            device,
            mem_info,
            device_uuid: device.and_then(cached_device_uuid),
            driver_version,
            runtime_version,
            ..FailureContext::default()
        }
    }
}

/// When a context is gathered: at a failure, on the failing thread, which already calls CUDA
/// (the CUDA versions are asked there the first time), or for an on-demand dump (`oomshim_dump`,
/// the versions as far as a failure asked them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Moment {
    Failure,
    OnDemand,
}

/// What a dump knows from CUDA about `device`, asked of `layer` on the calling thread: the
/// device's stream-ordered pools, the CUDA versions, free/total (`layer.mem_info` asks the
/// current device) and the device's name and UUID (asked once per device). `None`: no device may
/// be asked (an on-demand dump of a process that never allocated there: asking could create a
/// context); then only the versions are known. The VMM layout and the allocator's free blocks
/// are the shim's own state, not CUDA's: the caller adds them.
pub fn gather(layer: &Layer, device: Option<i32>, moment: Moment) -> FailureContext {
    let pools = device.map(pools::snapshot).unwrap_or_default();
    let (driver_version, runtime_version) = match moment {
        Moment::Failure => note_cuda_versions(driver::driver_version, layer.runtime_version),
        Moment::OnDemand => cuda_versions(),
    };
    let mem_info = device.and_then(|_| (layer.mem_info)());
    let (device_name, device_uuid) = device
        .map(|d| cached_device_identity(d, layer.device_name, driver::device_uuid))
        .unwrap_or_default();
    FailureContext {
        device,
        mem_info,
        device_name,
        device_uuid,
        driver_version,
        runtime_version,
        pools,
        ..FailureContext::default()
    }
}

// What the process asked CUDA once and remembers: the versions and each device's name and UUID.
// A failure asks ([`gather`], on the failing thread); the contexts above read what was asked.

/// `cuDriverGetVersion` (context-free), asked once on a failing thread: a cache, so that CUDA is
/// asked once per process; each dump carries the versions in its [`FailureContext`].
static DRIVER_VERSION: OnceLock<Option<i32>> = OnceLock::new();
/// `cudaRuntimeGetVersion` of the dynamically linked runtime, asked once the same way.
static RUNTIME_VERSION: OnceLock<Option<i32>> = OnceLock::new();

/// The CUDA versions, asked on the failing thread (which already calls CUDA there) the first
/// time, remembered after.
pub fn note_cuda_versions(
    driver: fn() -> Option<i32>,
    runtime: fn() -> Option<i32>,
) -> (Option<i32>, Option<i32>) {
    (
        *DRIVER_VERSION.get_or_init(driver),
        *RUNTIME_VERSION.get_or_init(runtime),
    )
}

/// The CUDA versions if a failure asked them already; never calls CUDA.
pub fn cuda_versions() -> (Option<i32>, Option<i32>) {
    (
        DRIVER_VERSION.get().copied().flatten(),
        RUNTIME_VERSION.get().copied().flatten(),
    )
}

/// The device's name, asked of the runtime once per device, and with it the GPU's UUID, asked of
/// the driver (`cuDeviceGetUuid`, context-free) at the same safe moment: (name, UUID).
pub fn cached_device_identity(
    device: i32,
    ask: fn(i32) -> Option<String>,
    ask_uuid: fn(i32) -> Option<String>,
) -> (Option<String>, Option<String>) {
    let names = || DEVICE_NAMES.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(n) = names().iter().find(|n| n.device == device) {
        return (n.name.clone(), n.uuid.clone());
    }
    // Asked without the lock held: this calls into CUDA.
    let name = ask(device);
    let uuid = ask_uuid(device);
    names().push(DeviceNames {
        device,
        name: name.clone(),
        uuid: uuid.clone(),
    });
    (name, uuid)
}

/// The GPU UUID of `device` if [`cached_device_identity`] asked it already; never calls CUDA.
pub fn cached_device_uuid(device: i32) -> Option<String> {
    let names = DEVICE_NAMES.lock().unwrap_or_else(|e| e.into_inner());
    names
        .iter()
        .find(|n| n.device == device)
        .and_then(|n| n.uuid.clone())
}

/// Every GPU UUID learnt so far (a device's identity never changes): read when a dump is
/// assembled, for the devices other than the one its context asked about.
pub fn known_device_uuids() -> Vec<(i32, String)> {
    let names = DEVICE_NAMES.lock().unwrap_or_else(|e| e.into_inner());
    names
        .iter()
        .filter_map(|n| n.uuid.clone().map(|u| (n.device, u)))
        .collect()
}

struct DeviceNames {
    device: i32,
    name: Option<String>,
    uuid: Option<String>,
}

/// Device names and UUIDs asked so far ([`cached_device_identity`]).
static DEVICE_NAMES: Mutex<Vec<DeviceNames>> = Mutex::new(Vec::new());

oomshim_host::fork_held! {
    static DEVICE_NAMES_HELD: MutexGuard<'static, Vec<DeviceNames>>;
}

/// `fork` prepare: holds the device-name cache (lock 5 of the shim's `fork` handlers).
pub fn fork_prepare() {
    DEVICE_NAMES_HELD.hold(DEVICE_NAMES.lock().unwrap_or_else(|e| e.into_inner()));
}

/// `fork` parent and child: lets go of it.
pub fn fork_release() {
    DEVICE_NAMES_HELD.release();
}
