//! The dump schema `oomshim.dump/1`: the one definition shared by the shim that writes dumps and
//! every reader (reports, tests). Key names are the public contract; new keys may be added.

use serde::{Deserialize, Serialize};

/// Value of the `schema` key; readers reject anything else.
pub const SCHEMA: &str = "oomshim.dump/1";

/// One dump file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Dump {
    /// Always [`SCHEMA`].
    pub schema: String,
    /// `"oom"` for an out-of-memory failure, otherwise the reason given to an on-demand dump.
    pub reason: String,
    /// When the state was captured, RFC 3339 in UTC (`2026-11-29T15:43:11.123Z`).
    pub time: String,
    /// The same instant as milliseconds since the Unix epoch.
    pub time_unix_ms: u64,
    pub process: ProcessInfo,
    /// The allocation that failed; present for `reason == "oom"` only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failed_request: Option<FailedRequest>,
    /// Every device the process touched, plus the failing one.
    pub devices: Vec<DeviceInfo>,
    /// Page-locked host memory from cudaMallocHost/cudaHostAlloc. Never counted as device memory.
    pub pinned_host: PinnedHost,
    /// Live allocations, largest first, at most `OOMSHIM_TOP` of them.
    pub largest_holders: Vec<Holder>,
    /// Live bytes aggregated by identical allocation stack, largest first.
    pub sites: Vec<Site>,
    pub free_blocks: FreeBlocks,
    pub verdict: Verdict,
    /// Counters about the recording itself.
    pub recording: Recording,
    /// Stream-ordered memory pools the process allocated from (`cuMemPoolGetAttribute`), asked on
    /// the failing thread at the failure (or the caller's, on demand); absent when none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pools: Vec<PoolInfo>,
    /// CUDA virtual memory management (`cuMemAddressReserve`/`cuMemMap`), as recorded at the
    /// same moment; absent when the process used none. The physical handles themselves are
    /// holders (`api: "cuMemCreate"`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vmm: Option<VmmInfo>,
    /// Host memory when the dump was written (a CPU-side OOM starts here; pinned memory counts
    /// against it). Absent in dumps of older versions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<HostMemory>,
    /// Processes holding memory on the failing (or current) device, from NVML.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_processes: Option<GpuProcesses>,
    /// Live device bytes per allocation site over steps (or seconds): the sites that grow.
    /// Absent before two samples were taken.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub growth: Option<Growth>,
    /// The allocator-relevant configuration: allowlisted environment variables and CUDA
    /// versions. Never the whole environment.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config: Option<ConfigSnapshot>,
    /// The distribution of recent device request sizes (dynamic shapes show as many distinct
    /// large sizes). Absent in dumps of older versions and before any allocation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_sizes: Option<RequestSizes>,
    /// What the framework (PyTorch, XLA) reported about this out-of-memory failure, through
    /// oomshim's Python hook: whether it raised its out-of-memory error and the state of its
    /// cache then. Absent when no framework spoke (plain CUDA programs, dumps of older versions).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub framework: Option<FrameworkOom>,
    /// Live device memory named by the library that allocated it (NCCL, cuBLAS, cuDNN, CUDA
    /// graph pools) and the CUDA context's share of what the tracked allocations do not explain
    /// (src/core/facts/libraries.rs). Absent in dumps of older versions and when nothing was named.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub library_memory: Option<LibraryMemory>,
    /// Present in dumps that `oomshim run` reconstructed after its program died without a dump
    /// of its last state (`reason: "post_mortem"`): how it died, and the host's memory then.
    /// Everything else in such a dump is the program's live summary as last published.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub post_mortem: Option<PostMortem>,
}

/// Device memory attributed to libraries and to the CUDA context (see [`Dump::library_memory`]).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LibraryMemory {
    /// How allocations were attributed: `"stack_modules"` (the loaded object of each native
    /// frame of the allocation's stack, innermost known library first), or `"no_native_stacks"`
    /// (`OOMSHIM_STACKS=python`/`off`: only CUDA graph pools and the context can be named).
    pub source: String,
    /// Live tracked bytes by library and device, largest first. Every live device allocation
    /// is counted, not only the largest holders.
    pub libraries: Vec<LibraryBytes>,
    /// Per device: the CUDA context and other memory of this process that no hooked API
    /// allocated, and what is left unexplained.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub untracked: Vec<UntrackedSplit>,
}

/// One library's live allocations on one device.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LibraryBytes {
    /// Machine-readable: `nccl`, `cublas`, `cudnn`, `cufft`, `cusparse`, `cusolver`, `curand`,
    /// `cuda_graph_pool`.
    pub library: String,
    /// As people write it: `NCCL`, `cuBLAS`, `cuDNN`, `CUDA graph pool`, ...
    pub name: String,
    pub device: i32,
    pub bytes: u64,
    pub count: u64,
    /// The loaded objects that matched (paths from /proc/self/maps), at most 4.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub modules: Vec<String>,
    /// The allocation APIs those allocations came through (`cudaMalloc`, `cuMemCreate`, ...).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub apis: Vec<String>,
}

/// What a device's used memory is made of beyond this process's tracked allocations.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct UntrackedSplit {
    pub device: i32,
    /// Used bytes on the device (total − free) when the dump was written.
    pub used_bytes: u64,
    /// This process's tracked allocations on it.
    pub tracked_bytes: u64,
    /// NVML's figure for this process less its tracked bytes: the CUDA context, and library
    /// memory allocated through paths the shim does not hook. Absent without NVML.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context_bytes: Option<u64>,
    /// What NVML lists for the other processes on the device. Absent without NVML.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub other_processes_bytes: Option<u64>,
    /// Used − tracked − context − other processes: what no API shows (absent without NVML).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unexplained_bytes: Option<u64>,
}

/// How a program died, for a dump reconstructed after its death (see [`Dump::post_mortem`]).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PostMortem {
    /// Always true: the dump was not written by the program but rebuilt from what it last
    /// published.
    pub reconstructed: bool,
    /// The signal that ended it (number and name, e.g. 9 and `SIGKILL`), or its exit status.
    #[serde(default)]
    pub signal: Option<i32>,
    #[serde(default)]
    pub signal_name: Option<String>,
    #[serde(default)]
    pub core_dumped: bool,
    #[serde(default)]
    pub exit_code: Option<i32>,
    /// When the death was seen, and when the state in this dump had been published (the
    /// program's state may have moved on for up to one publish interval).
    pub died_unix_ms: u64,
    pub published_unix_ms: u64,
    /// The publish this dump is built from; `from_previous` when the newest was torn.
    pub generation: u64,
    #[serde(default)]
    pub from_previous: bool,
    /// The program's resident host memory at its last publishes.
    #[serde(default)]
    pub rss: Vec<RssSample>,
    /// The last failed device allocation, when there was one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_failure: Option<LiveFailure>,
    /// The host's memory and the cgroup's OOM kills, read right after the death.
    #[serde(default)]
    pub host: HostKill,
    /// The process that reaped it when that was not `oomshim run` (its parent: a wrapper, a
    /// launcher such as torchrun). With neither `signal` nor `exit_code`, that parent reaped it
    /// before oomshim could read how it ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reaped_by: Option<u32>,
    /// When `oomshim run` started the program. With `generation` 0 (nothing published: it died
    /// before its first live summary), all that is known besides how it died.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_unix_ms: Option<u64>,
}

/// One sample of the program's resident host memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RssSample {
    pub unix_ms: u64,
    /// The step count then (the dump's growth steps), when steps are known.
    #[serde(default)]
    pub step: Option<u64>,
    pub bytes: u64,
}

/// A failed device allocation as the live summary records it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LiveFailure {
    pub unix_ms: u64,
    pub device: i32,
    pub bytes: u64,
    pub api: String,
    /// The device's free and total bytes right after the failure, when the runtime said.
    #[serde(default)]
    pub free_bytes: Option<u64>,
    #[serde(default)]
    pub total_bytes: Option<u64>,
    /// The dump written for it, once written, with its verdict's headline.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dump: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub headline: Option<String>,
    /// The verdict's top kind and its retry hint ([`RetryHint::hint`]), with the headline.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry: Option<String>,
}

/// Host memory and the cgroup's OOM-killer count around a death.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct HostKill {
    /// The program's memory cgroup (its path in the cgroup filesystem), when found.
    #[serde(default)]
    pub cgroup: Option<String>,
    /// `oom_kill` of the cgroup's `memory.events` when the program started and after it died.
    #[serde(default)]
    pub oom_kill_before: Option<u64>,
    #[serde(default)]
    pub oom_kill_after: Option<u64>,
    /// `memory.max` (`None`: unlimited or unknown), `memory.current` and `memory.peak` after
    /// the death.
    #[serde(default)]
    pub memory_max: Option<u64>,
    #[serde(default)]
    pub memory_current: Option<u64>,
    #[serde(default)]
    pub memory_peak: Option<u64>,
    /// `MemTotal` and `MemAvailable` of /proc/meminfo after the death.
    #[serde(default)]
    pub mem_total: Option<u64>,
    #[serde(default)]
    pub mem_available: Option<u64>,
}

/// The framework's own account of an out-of-memory failure (see [`Dump::framework`]).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct FrameworkOom {
    /// `"torch"` or `"xla"`.
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// The framework raised its out-of-memory error to the program (`torch.OutOfMemoryError`,
    /// XLA's `RESOURCE_EXHAUSTED`): the failure stood.
    pub raised: bool,
    /// The request as the framework saw it (torch: the rounded block size, before the segment
    /// rounding that reaches `cudaMalloc`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_bytes: Option<u64>,
    /// The device's total (or, under `set_per_process_memory_fraction`, the allowed maximum) and
    /// free bytes as the framework reported them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_total_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_free_bytes: Option<u64>,
    /// `PYTORCH_CUDA_ALLOC_CONF` (torch) in force, when set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alloc_conf: Option<String>,
    /// Selected counters of the framework (torch: `num_alloc_retries`, `num_ooms`, …).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub stats: std::collections::BTreeMap<String, u64>,
    /// The framework's cache at the failure (its free blocks are in the dump's `free_blocks`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache: Option<CacheSummary>,
    /// The file beside the dump holding the framework's full snapshot (torch:
    /// `torch.cuda.memory._snapshot()` as a pickle, for pytorch.org/memory_viz).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot_file: Option<String>,
    /// The framework's error message, when it gave one (XLA), cut to 1 KiB.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Where the live tensors come from, by the framework's own records (torch's
    /// `_record_memory_history`, which oomshim's Python hook turns on once the process grows
    /// step after step under plain preload): absent when it kept none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attribution: Option<Attribution>,
    /// The framework's live memory by kind at the failure (torch: parameters, gradients,
    /// optimizer state, activations, cache), the phase and the batch, from oomshim's Python
    /// hook. Absent for other frameworks and in dumps of older versions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kinds: Option<Kinds>,
}

/// Torch's live memory on the failing device by kind, computed once at the failure by oomshim's
/// Python hook (shim/python/oomshim_hook/kinds.py). Tensors sharing a storage count once.
/// `activations_bytes` is torch's allocated bytes less the parameters, gradients and optimizer
/// state: activations, temporaries, inputs and any other live tensor.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Kinds {
    /// Torch's `allocated_bytes.all.current` and `reserved_bytes.all.current` on the device.
    #[serde(default)]
    pub torch_allocated_bytes: Option<u64>,
    #[serde(default)]
    pub torch_reserved_bytes: Option<u64>,
    #[serde(default)]
    pub parameters_bytes: u64,
    #[serde(default)]
    pub gradients_bytes: u64,
    #[serde(default)]
    pub optimizer_state_bytes: u64,
    #[serde(default)]
    pub activations_bytes: Option<u64>,
    /// Reserved by torch's cache but not allocated to a tensor.
    #[serde(default)]
    pub cache_bytes: Option<u64>,
    /// The top-level models whose parameters are on the device, at most 16: the one running
    /// first, then the largest. The totals count every model found, listed or not.
    #[serde(default)]
    pub models: Vec<ModelKind>,
    /// Top-level models counted in the totals but not listed in `models`, and their parameter
    /// bytes (0 in dumps of earlier versions, which counted only the models they listed).
    #[serde(default)]
    pub more_models: u64,
    #[serde(default)]
    pub more_models_bytes: u64,
    /// The optimizers found, at most 16, the largest state first.
    #[serde(default)]
    pub optimizers: Vec<OptimizerKind>,
    /// Optimizers counted in the totals but not listed in `optimizers`, and their state bytes.
    #[serde(default)]
    pub more_optimizers: u64,
    #[serde(default)]
    pub more_optimizers_bytes: u64,
    /// Top-level models held more than once: copies of one class with the same parameter
    /// shapes, each with storages of its own; the most bytes first, at most 8.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub duplicates: Vec<DuplicateModel>,
    /// The kinds the walk could not finish before its time budget ran out (`parameters`,
    /// `gradients`, `optimizer_state`): each may be short of the truth, and activations (the
    /// rest of torch's allocated bytes) may be long by as much. Empty when `complete`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub short_kinds: Vec<String>,
    /// `forward`, `backward`, `optimizer`, `inference` (a forward without autograd), `outside`
    /// (no step on the stack), `unknown`.
    #[serde(default)]
    pub phase: Option<String>,
    /// The innermost module whose forward was running, and the outermost one.
    #[serde(default)]
    pub module: Option<ModuleAt>,
    #[serde(default)]
    pub outer_module: Option<ModuleAt>,
    /// The shape of the outermost module's first tensor input; `batch` is its leading dimension.
    #[serde(default)]
    pub input_shape: Vec<u64>,
    #[serde(default)]
    pub batch: Option<u64>,
    /// A loss function was on the failing stack (the request is likely the logits' loss).
    #[serde(default)]
    pub in_loss: bool,
    /// Autocast was on for the failing device at the failure (mixed precision).
    #[serde(default)]
    pub autocast: bool,
    /// How far a forward pass had come at the failure, by the model's leaf modules; absent
    /// outside a forward, in the loss, under activation checkpointing and in older dumps.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub forward_progress: Option<ForwardProgress>,
    /// The innermost frame of installed code (the framework) and of the program's own code.
    #[serde(default)]
    pub framework_frame: Option<PyFrame>,
    #[serde(default)]
    pub program_frame: Option<PyFrame>,
    /// Forward hooks of the program's own code on the models' modules, at most 8.
    #[serde(default)]
    pub forward_hooks: Vec<ForwardHook>,
    /// The containers bound to a name (a list or dict of the program's) that hold the most
    /// device tensors beyond parameters, gradients and optimizer state, largest first, at most 4.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub keepers: Vec<Keeper>,
    /// `hooks` (the step hooks saw a model or optimizer) or `gc` (found at the failure only).
    #[serde(default)]
    pub found_by: Option<String>,
    /// False when the time budget ran out before every model and optimizer was counted
    /// (`short_kinds` says which kinds; dumps of earlier versions also said false for more than
    /// 16 models, of which they counted 16).
    #[serde(default = "yes")]
    pub complete: bool,
    #[serde(default)]
    pub elapsed_ms: Option<f64>,
}

/// Counted in full unless said otherwise, as a dump without `complete` reads.
impl Default for Kinds {
    fn default() -> Kinds {
        Kinds {
            torch_allocated_bytes: Default::default(),
            torch_reserved_bytes: Default::default(),
            parameters_bytes: Default::default(),
            gradients_bytes: Default::default(),
            optimizer_state_bytes: Default::default(),
            activations_bytes: Default::default(),
            cache_bytes: Default::default(),
            models: Default::default(),
            more_models: Default::default(),
            more_models_bytes: Default::default(),
            optimizers: Default::default(),
            more_optimizers: Default::default(),
            more_optimizers_bytes: Default::default(),
            duplicates: Default::default(),
            short_kinds: Default::default(),
            phase: Default::default(),
            module: Default::default(),
            outer_module: Default::default(),
            input_shape: Default::default(),
            batch: Default::default(),
            in_loss: Default::default(),
            autocast: Default::default(),
            forward_progress: Default::default(),
            framework_frame: Default::default(),
            program_frame: Default::default(),
            forward_hooks: Default::default(),
            keepers: Default::default(),
            found_by: Default::default(),
            complete: true,
            elapsed_ms: Default::default(),
        }
    }
}

fn yes() -> bool {
    true
}

/// One top-level model's parameters on the device.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ModelKind {
    /// The class (`GPT2LMHeadModel`) and with its module.
    pub class: String,
    #[serde(default)]
    pub qualified_class: String,
    /// Parameter bytes not counted under an earlier model (shared storages count once).
    pub bytes: u64,
    #[serde(default)]
    pub tensors: u64,
    /// Bytes by dtype (`float32`, `bfloat16`, ...).
    #[serde(default)]
    pub dtypes: std::collections::BTreeMap<String, u64>,
    #[serde(default)]
    pub grad_bytes: u64,
    #[serde(default)]
    pub training: bool,
    /// Index in `models` of an earlier model with the same parameter shapes: a second copy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duplicate_of: Option<usize>,
}

/// A model held more than once: `copies` top-level models of one class with the same
/// parameter shapes and dtypes, none sharing a storage with another.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct DuplicateModel {
    pub class: String,
    #[serde(default)]
    pub qualified_class: String,
    pub copies: u64,
    /// The parameter bytes of one copy on the device.
    pub bytes_each: u64,
}

/// One optimizer's state on the device, against the parameters it steps.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct OptimizerKind {
    pub class: String,
    #[serde(default)]
    pub qualified_class: String,
    pub bytes: u64,
    #[serde(default)]
    pub param_bytes: u64,
}

/// A module whose forward was on the failing stack: class and path in the model
/// (`transformer.h.7.attn`; empty for the model itself).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ModuleAt {
    pub class: String,
    #[serde(default)]
    pub qualified_class: String,
    #[serde(default)]
    pub path: Option<String>,
    /// Where its forward was when the failure happened.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub line: Option<u32>,
}

/// The failing module's place in the forward pass, counted in the model's leaf modules (those
/// with no children) in the order they were registered, which is the order most models run them
/// in: `leaves_before` came before it, `leaves_in_module` are its own (1 for a leaf), `leaves` in
/// all. The `elements` fields weigh each leaf by its output's elements per sample, as the hook
/// estimates them from the model input's shape and each leaf's own sizes without running
/// anything (absent when it could not): the outputs of the leaves before the failing module,
/// those inside it, and all; `failing_leaf_io` and `largest_leaf_io` are the input and output
/// elements per sample of the failing module's largest leaf and of the model's,
/// `widest_leaf_elements` the largest output's and `last_leaf_elements` the last leaf's.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ForwardProgress {
    pub leaves_before: u64,
    pub leaves_in_module: u64,
    pub leaves: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub elements_before: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub elements_in_module: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub elements: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failing_leaf_io: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub largest_leaf_io: Option<u64>,
    /// The largest leaf output's elements per sample.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub widest_leaf_elements: Option<u64>,
    /// The last leaf's output elements per sample (a language model's logits).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_leaf_elements: Option<u64>,
}

/// A Python frame (function, file, line).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PyFrame {
    pub function: String,
    pub file: String,
    pub line: u32,
}

/// A forward hook of the program's own code.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ForwardHook {
    pub function: String,
    pub file: String,
    pub line: u32,
    /// The module's path in the model (its class for the model itself).
    pub module: String,
}

/// A container of the program's bound to a name that holds device tensors at the failure: what
/// keeps a leak alive. Found by oomshim's Python hook in the failing thread's own frames, their
/// modules' globals, and the attributes of `self` there and of the models' modules.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Keeper {
    /// `list`, `dict`, `tuple`, `set`, `deque`.
    pub container: String,
    /// The name it is bound to.
    pub name: String,
    /// Where the name is: `a global of __main__`, `a local of train`, `an attribute of Trainer`.
    pub scope: String,
    /// Device bytes of the tensors it holds (itself and one level of nested containers; each
    /// storage once), and how many tensors.
    pub bytes: u64,
    #[serde(default)]
    pub tensors: u64,
    /// The first line that grows it (`name.append(...)`, `name[key] = ...`), read from the
    /// bytecode, when found.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub line: Option<u32>,
}

/// Live tensors by the program's line that allocated them, from the framework's records.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Attribution {
    /// Live bytes the records cover (tensors allocated since recording began) ...
    pub recorded_bytes: u64,
    /// ... and those they do not (allocated before).
    pub unrecorded_bytes: u64,
    /// Largest first, at most 10: the innermost frame of the program's own code of each tensor.
    pub lines: Vec<AttributedLine>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct AttributedLine {
    pub file: String,
    pub line: u32,
    pub function: String,
    pub bytes: u64,
    pub blocks: u64,
}

/// A caching allocator's segments and free blocks on one device, as the framework reports them.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CacheSummary {
    pub segments: u64,
    pub reserved_bytes: u64,
    pub allocated_bytes: u64,
    pub total_free_bytes: u64,
    pub largest_free_bytes: u64,
    pub inactive_split_bytes: u64,
    #[serde(default)]
    pub fragmentation: Option<f64>,
    #[serde(default)]
    pub histogram: Vec<HistogramBin>,
}

impl CacheSummary {
    /// The dump's `free_blocks` from this account (`source`: `torch-snapshot`, ...). A largest
    /// free block above the total free is cut to it, a non-finite fragmentation dropped: the
    /// account comes from a file or another library, not from oomshim.
    pub fn free_blocks(&self, source: String) -> FreeBlocks {
        FreeBlocks {
            source,
            reason: None,
            total_free_bytes: Some(self.total_free_bytes),
            largest_free_bytes: Some(self.largest_free_bytes.min(self.total_free_bytes)),
            fragmentation: self.fragmentation.filter(|f| f.is_finite()),
            histogram: self.histogram.clone(),
            reserved_bytes: Some(self.reserved_bytes),
            allocated_bytes: Some(self.allocated_bytes),
            inactive_split_bytes: Some(self.inactive_split_bytes),
            segments: Some(self.segments),
            ..Default::default()
        }
    }
}

/// Sizes of the most recent device allocation requests (src/preload/record/growth): a ring of the
/// last `window` requests.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RequestSizes {
    /// Requests in the ring (at most 4096; fewer early in a run).
    pub window: u64,
    /// Distinct sizes among them.
    pub distinct: u64,
    /// Requests of at least `large_bytes`, and the distinct sizes among those.
    pub large: u64,
    pub distinct_large: u64,
    /// The size from which a request counts as large (1 MiB).
    pub large_bytes: u64,
    /// The most frequent sizes, most frequent first (ties: larger first), at most 10.
    pub top: Vec<SizeCount>,
    /// Requests per power-of-two bin `[lo, hi)`, non-empty bins only, ascending.
    pub bins: Vec<SizeBin>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SizeCount {
    pub bytes: u64,
    pub count: u64,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SizeBin {
    pub lo: u64,
    pub hi: u64,
    pub count: u64,
    pub distinct: u64,
}

/// History of live device bytes per allocation site (src/preload/record/growth).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Growth {
    /// `"step"` when steps are marked or detected, else `"second"` (growth over time).
    pub unit: String,
    /// Where the steps came from: `"marked"` (the program calls `oomshim_step()`),
    /// `"optimizer"` (every `torch.optim` optimizer step, marked by oomshim's Python hook),
    /// `"forward"` (every forward pass of the program's outermost `torch.nn.Module`, marked by
    /// the hook), `"detected"` (a repeating allocation pattern, see `detected`), `"timeline"` (no
    /// steps: growth over time fitted from the live allocations' own timestamps, see `timeline`)
    /// or `"time"` (no steps, in dumps of older versions: one sample per second). Absent in
    /// dumps of older versions still (`unit` tells marked from time).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub steps: Option<String>,
    /// How the steps were detected, when `steps` is `"detected"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detected: Option<DetectedSteps>,
    /// Samples taken since start (or since the first step mark).
    pub samples: u64,
    /// The step (or second since start) of the last sample.
    pub current: u64,
    /// Free device bytes used for the projections (the failing or current device).
    #[serde(default)]
    pub free_bytes: Option<u64>,
    /// The step in which the growth exhausts `free_bytes` at its fitted rate (the step in
    /// progress is `current + 1`).
    #[serde(default)]
    pub projected_oom_step: Option<u64>,
    /// Sites whose live bytes grow, largest growth first, at most 10. With `fit`: each site's
    /// slope over the fitted stretch, with its `share` of the fitted growth. Without (older
    /// dumps): sites whose own samples grow steadily (R² ≥ 0.9, ≥ 4 samples).
    pub sites: Vec<GrowthSite>,
    /// Tracked device bytes (all sites) at each of the last 64 samples.
    #[serde(default)]
    pub tracked: Vec<GrowthPoint>,
    /// The framework's own count of its live tensors at the same samples (torch's
    /// `memory_allocated()`, given by the Python hook with each mark); absent without it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub framework_live: Vec<GrowthPoint>,
    /// The growth of all tracked bytes: the longest stretch of samples, ending at the newest,
    /// that grows steadily (positive slope, R² ≥ 0.9, ≥ 4 samples); absent when there is none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fit: Option<GrowthFit>,
    /// How growth over time was measured, when `steps` is `"timeline"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeline: Option<Timeline>,
}

/// Growth over time from the allocation timeline (see [`Growth::timeline`]): the device bytes
/// the process still holds, summed by when each live allocation was made. A series of that
/// kind never falls; what it shows is what was kept. `tracked` and `fit` are in seconds since
/// the shim started, fitted from `samples` points over the span from the oldest live allocation
/// to the dump.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Timeline {
    /// Milliseconds from the first device allocation to the dump.
    pub age_ms: u64,
    /// Milliseconds the fitted growth lasted (from its first sample to the dump); 0 without a fit.
    pub span_ms: u64,
    /// Live allocations made during the fitted growth.
    pub allocations: u64,
    /// Allocations made during the fitted growth that were freed since (at least this many:
    /// counted from allocation sequence numbers, those made before its oldest live one are
    /// not seen).
    pub freed: u64,
    /// Allocations freed since the first one, of every kind: a program that frees nothing
    /// keeps all it allocated, and its timeline is its whole history.
    pub freed_all: u64,
    /// Milliseconds since the newest live allocation of the growing sites: growth that stopped
    /// long before the dump is not growing now.
    pub quiet_ms: u64,
    /// What the process's tracked bytes did over (most of) the fitted growth, as sampled once a
    /// second with frees counted: `actual_bytes` grown against `kept_bytes` that the live
    /// allocations made then add up to, over `over_ms`. Absent when fewer than two samples fall
    /// into the growth (a program younger than two seconds). Far less actual than kept growth
    /// means memory was freed meanwhile (a cache that evicts as it adds): no leak.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kept_check: Option<KeptCheck>,
}

/// See [`Timeline::kept_check`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeptCheck {
    pub over_ms: u64,
    pub actual_bytes: i64,
    pub kept_bytes: u64,
}

/// Steady growth of the whole process's tracked bytes (see [`Growth::fit`]).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct GrowthFit {
    pub bytes_per_step: u64,
    pub r_squared: f64,
    pub samples: u64,
    pub first: GrowthPoint,
    pub last: GrowthPoint,
    /// The series fitted: `"tracked"` (the process's tracked bytes) or `"framework_live"`
    /// (the framework's live tensors, when the marks carried them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub of: Option<String>,
    /// Live allocations (of the same series: the framework's tensors for `framework_live`) at
    /// the first and last fitted sample. A leak accumulates them; inputs of growing shape grow
    /// the bytes while their number stays. Absent in older dumps.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub live_allocations: Option<AllocationSpan>,
}

impl GrowthFit {
    /// What the tracked bytes grew by from the first fitted sample to the last (0 if they fell).
    pub fn grew_bytes(&self) -> u64 {
        self.last.bytes.saturating_sub(self.first.bytes)
    }
}

/// A count at the first and last sample of a stretch.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AllocationSpan {
    pub first: u64,
    pub last: u64,
}

/// Steps found without marks: one allocation site (the anchor) recurs every `period`
/// allocations; each recurrence ends a step.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct DetectedSteps {
    /// Allocations per step when the pattern was confirmed.
    pub period: u64,
    /// Steps counted since the pattern was confirmed.
    pub steps: u64,
    /// Allocations since the last step boundary when the dump was taken (a pattern that stopped
    /// long ago describes an earlier phase of the run).
    pub allocations_since_last_step: u64,
    /// Intervals between samples, and how many of them freed memory (a training step frees
    /// its working memory; a loop that only accumulates, like loading weights, frees nothing).
    pub intervals: u64,
    pub freeing_intervals: u64,
    /// The anchor site's stack.
    #[serde(default)]
    pub anchor: Vec<Frame>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct GrowthSite {
    /// Slope of the fit: live bytes added per step (per second when `unit` is `"second"`).
    pub bytes_per_step: u64,
    pub r_squared: f64,
    /// Samples fitted (at most 64).
    pub samples: u64,
    pub first: GrowthPoint,
    pub last: GrowthPoint,
    /// The step at which this site alone exhausts the free bytes.
    #[serde(default)]
    pub projected_oom_step: Option<u64>,
    pub stack: Vec<Frame>,
    /// This site's part of the process's fitted growth (0–1), when the dump has a `fit`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub share: Option<f64>,
    /// How allocations were grouped into this site: `"python_line"` (the program's own Python
    /// line, library frames passed over), `"python_stack"` (a Python stack with no frame of the
    /// program's own), `"no_python"` (allocations without Python frames in a Python process:
    /// autograd's backward threads, C++ code), `"native"` (the first frame outside CUDA, the
    /// framework's allocator and libc).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grouped_by: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct GrowthPoint {
    /// Step number (or second since start).
    pub step: u64,
    pub bytes: u64,
}

/// Configuration at dump time.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ConfigSnapshot {
    /// Allowlisted variables that are set, by name (values cut at 1024 bytes).
    pub env: std::collections::BTreeMap<String, String>,
    /// `cuDriverGetVersion` (e.g. 13000 for 13.0), asked on the failing thread.
    #[serde(default)]
    pub cuda_driver_version: Option<i32>,
    /// `cudaRuntimeGetVersion` of the dynamically linked runtime, when it has one.
    #[serde(default)]
    pub cuda_runtime_version: Option<i32>,
    /// `torch.__version__` when a torch library is loaded in the process (read from the
    /// package's `version.py` at dump time; nothing is imported).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub torch_version: Option<String>,
    /// Frameworks loaded in the process (`torch`, `jax`, `cupy`, `tensorflow`), from the
    /// libraries mapped at dump time; what the verdict's advice is written for.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub frameworks: Vec<String>,
}

/// Who else uses the device, as NVML sees it when the dump is written.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuProcesses {
    /// The CUDA device ordinal these processes are on.
    pub device: i32,
    /// How the CUDA device was found in NVML: `"uuid"` (from CUDA_VISIBLE_DEVICES) or
    /// `"index"` (CUDA's ordinal taken as NVML's; true unless devices are reordered).
    pub matched_by: String,
    /// Largest first; empty when NVML could not be asked (see `error`).
    pub processes: Vec<GpuProcess>,
    /// Why NVML could not answer (no driver, no NVML library, no permission).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// Reserved address ranges and mappings: how a VMM allocator (PyTorch's expandable segments,
/// XLA) lays out its physical handles.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct VmmInfo {
    pub reserved_ranges: u64,
    pub reserved_bytes: u64,
    pub mappings: u64,
    pub mapped_bytes: u64,
    /// Handles released while still mapped: held until their last unmap.
    pub released_but_mapped: u64,
    /// Reserved ranges with the most bytes mapped, at most 20.
    pub ranges: Vec<VmmRange>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VmmRange {
    /// Start of the reserved range (hex).
    pub address: String,
    pub reserved_bytes: u64,
    pub mapped_bytes: u64,
    pub mappings: u64,
}

/// One stream-ordered memory pool: what it holds on its device. Bytes freed with
/// `cudaFreeAsync`/`cuMemFreeAsync` leave the ledger but stay reserved by the pool
/// (`cached_bytes`) until it is trimmed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolInfo {
    pub device: i32,
    /// The pool handle (hex).
    pub pool: String,
    /// `CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT`: device memory the pool holds.
    pub reserved_bytes: u64,
    /// `CU_MEMPOOL_ATTR_USED_MEM_CURRENT`: of that, in live allocations.
    pub used_bytes: u64,
    /// reserved − used: freed memory the pool keeps cached.
    pub cached_bytes: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProcessInfo {
    pub pid: u32,
    pub host: String,
    /// argv as the process received it (from /proc/self/cmdline), unmodified.
    pub command_line: Vec<String>,
    /// The process's rank, local rank and world size from its launcher's variables, when set
    /// (src/core/facts/ranks.rs): torchrun's `RANK`/`LOCAL_RANK`/`WORLD_SIZE`, Slurm's
    /// `SLURM_PROCID`/`SLURM_LOCALID`/`SLURM_NTASKS`, Open MPI's `OMPI_COMM_WORLD_*`, PMI's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rank: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub local_rank: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub world_size: Option<u32>,
    /// Which launcher's variables gave the rank: `torchrun`, `slurm`, `openmpi`, `pmi`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub launcher: Option<String>,
    /// The job: `SLURM_JOB_ID`, else torchrun's `TORCHELASTIC_RUN_ID`, else `PBS_JOBID`/`LSB_JOBID`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job_id: Option<String>,
    /// The Kubernetes pod the process ran in, from the variables a pod spec sets with the
    /// downward API (src/core/facts/kubernetes.rs); absent outside one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubernetes: Option<Kubernetes>,
}

/// Where in a Kubernetes cluster a process ran: each field from its variable, when set.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Kubernetes {
    /// `POD_NAME` (`fieldRef: metadata.name`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<String>,
    /// `POD_NAMESPACE` (`fieldRef: metadata.namespace`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// `CONTAINER_NAME` (a literal `value`: the downward API has no field for it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container: Option<String>,
    /// `NODE_NAME` (`fieldRef: spec.nodeName`): the node, which DCGM-exporter calls `Hostname`
    /// (a pod's own host name is the pod's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FailedRequest {
    /// Bytes as the caller asked for them (before any rounding by CUDA).
    pub bytes: u64,
    /// The hooked function that failed, e.g. `cudaMalloc`.
    pub api: String,
    pub device: i32,
    /// The error code the runtime returned (2 = cudaErrorMemoryAllocation).
    pub error_code: i32,
    /// Allocation stack of the failing call, innermost frame first.
    pub stack: Vec<Frame>,
    /// How Python frames were merged into `stack` (see [`StackMerge`]); absent without any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stack_merge: Option<StackMerge>,
    /// Failures on this device inside the de-duplication interval that began with this one
    /// (1 = only this one). Frameworks free their caches and retry, so bursts are normal.
    pub failures_in_burst: u32,
    /// `Some(true)`: the retry of this request (the same thread asking again for at least
    /// `bytes`, with only frees in between) succeeded: the program did not see this failure.
    /// `Some(false)`: the failure stood (see `resolution`). `None`: the dump was written before
    /// that was known.
    pub recovered: Option<bool>,
    /// How `recovered` was learnt: `retry_succeeded`, `framework_raised` (torch raised
    /// OutOfMemoryError), `next_request_failed` (the same thread's next request failed too),
    /// `settle_expired` (no retry succeeded within `OOMSHIM_SETTLE`), `process_exit`,
    /// `allocator` (oomshim's own allocator gave up after emptying its cache), `unknown`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resolution: Option<String>,
    /// State at the last failure of the burst (after the framework freed what it could).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_failure: Option<LastFailure>,
    /// Failed requests on this device whose retry succeeded just before this one failed (within
    /// `OOMSHIM_SETTLE` of their recovery): the same running out of memory, told in this dump
    /// instead of dumps of their own. 0 (absent) when none.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub recovered_before: u32,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LastFailure {
    pub bytes: u64,
    pub api: String,
    pub time_unix_ms: u64,
    pub tracked_bytes: u64,
    #[serde(default)]
    pub free_bytes: Option<u64>,
    #[serde(default)]
    pub total_bytes: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeviceInfo {
    pub index: i32,
    #[serde(default)]
    pub name: Option<String>,
    /// From cudaMemGetInfo at capture time; null when it could not be asked safely.
    #[serde(default)]
    pub total_bytes: Option<u64>,
    #[serde(default)]
    pub free_bytes: Option<u64>,
    /// Live device bytes in the ledger, as requested by callers.
    pub tracked_bytes: u64,
    pub tracked_count: u64,
    pub peak_tracked_bytes: u64,
    /// The GPU's UUID (`GPU-xxxxxxxx-…`, as nvidia-smi prints it), asked of the driver where the
    /// name is asked; absent when it was not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uuid: Option<String>,
    /// A per-process cap below the device's capacity that the failing allocator enforced
    /// (torch's `set_per_process_memory_fraction`): `total_bytes` and `free_bytes` are then the
    /// cap's (what the failure is judged against). Absent without a cap, and in dumps of older
    /// versions (older readers ignore it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_cap: Option<MemoryCap>,
}

/// A per-process memory cap on a device (see [`DeviceInfo::memory_cap`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MemoryCap {
    /// The cap in bytes.
    pub bytes: u64,
    /// The fraction of the device it was set as (`bytes / device_total_bytes`, as asked).
    pub fraction: f64,
    /// The device's own capacity.
    pub device_total_bytes: u64,
    /// What set it: `set_per_process_memory_fraction` (torch).
    pub set_by: String,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PinnedHost {
    pub bytes: u64,
    pub count: u64,
    pub peak_bytes: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Holder {
    pub bytes: u64,
    /// Hex, `0x7f...`.
    pub address: String,
    pub api: String,
    pub device: i32,
    /// Hex stream handle; null for APIs without a stream.
    #[serde(default)]
    pub stream: Option<String>,
    /// Kernel thread id of the allocating thread.
    pub thread: u64,
    /// The allocating thread's name (`/proc/self/task/TID/comm`: read at dump time while the
    /// thread lives, else as seen at its first allocation); absent when unknown.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thread_name: Option<String>,
    /// Seconds between the allocation and the capture.
    pub age_s: f64,
    /// Allocation sequence number (1 = first tracked allocation of the process).
    pub seq: u64,
    pub stack: Vec<Frame>,
    /// How Python frames were merged into `stack`; absent when it has none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stack_merge: Option<StackMerge>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Site {
    pub bytes: u64,
    pub count: u64,
    pub stack: Vec<Frame>,
}

/// How a stack's Python frames were placed among its native frames.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StackMerge {
    /// Each group of Python frames run by one native `_PyEval_EvalFrameDefault` call replaced
    /// that eval frame (innermost group at the innermost eval frame; groups beyond the eval
    /// frames found, e.g. in a truncated native stack, all at the outermost one).
    EvalFrames,
    /// No eval frame was found in the native stack (not symbolised, or cut by the depth
    /// limit): the Python frames follow the native frames, i.e. they are placed as the callers
    /// of everything native.
    Outer,
    /// No native stack was captured (`OOMSHIM_STACKS=python`): Python frames only.
    PythonOnly,
}

/// Stacks with Python frames, by [`StackMerge`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MergeCounts {
    pub eval_frames: u64,
    pub outer: u64,
    pub python_only: u64,
}

/// What a frame is.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FrameKind {
    /// Machine code: `address` is an instruction address.
    #[default]
    Native,
    /// A Python frame: `function` is the code object's qualified name, `file`/`line` the
    /// executing line, `address` the code object's address when it was seen.
    Python,
}

impl FrameKind {
    pub fn is_native(&self) -> bool {
        *self == FrameKind::Native
    }
}

/// One stack frame. Fields are null where the symboliser did not know them.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Frame {
    /// Instruction address in the process, hex.
    pub address: String,
    #[serde(default)]
    pub function: Option<String>,
    #[serde(default)]
    pub file: Option<String>,
    #[serde(default)]
    pub line: Option<u32>,
    /// Path of the loaded object that holds the address.
    #[serde(default)]
    pub module: Option<String>,
    /// True for a frame inlined into the next one out.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub inlined: bool,
    /// `"python"` for a Python frame; absent (`"native"`) otherwise.
    #[serde(default, skip_serializing_if = "FrameKind::is_native")]
    pub kind: FrameKind,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct FreeBlocks {
    /// `"unavailable"` when the shim cannot see free blocks (under LD_PRELOAD the framework's
    /// cache hides them); later sources: `"oomshim-allocator"`, `"torch-snapshot"`.
    pub source: String,
    #[serde(default)]
    pub reason: Option<String>,
    #[serde(default)]
    pub total_free_bytes: Option<u64>,
    #[serde(default)]
    pub largest_free_bytes: Option<u64>,
    /// 1 - largest_free / total_free.
    #[serde(default)]
    pub fragmentation: Option<f64>,
    #[serde(default)]
    pub histogram: Vec<HistogramBin>,
    /// Bytes the framework's cache holds from the device (segments), when the source knows.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reserved_bytes: Option<u64>,
    /// Bytes of those segments handed out to live tensors (rounded block sizes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allocated_bytes: Option<u64>,
    /// Free bytes in segments that also hold a live block: the part `empty_cache` cannot return
    /// (torch's `inactive_split_bytes`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inactive_split_bytes: Option<u64>,
    /// Number of segments the cache holds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub segments: Option<u64>,
    /// Allocator mode: the failing (or current) device's segments with every block, in address
    /// order, as the allocator holds them (what `export --memory-viz` lays out). At most
    /// [`SEGMENT_MAP_MAX_BLOCKS`] blocks; `segment_map_omitted` counts the segments left out.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub segment_map: Vec<SegmentEntry>,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub segment_map_omitted: u64,
}

/// Blocks a dump's `segment_map` holds at most (about 100 bytes of JSON each).
pub const SEGMENT_MAP_MAX_BLOCKS: usize = 100_000;

fn is_zero<T: Default + PartialEq>(n: &T) -> bool {
    *n == T::default()
}

/// One segment the allocator got from CUDA, with its blocks in address order.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SegmentEntry {
    /// Hex.
    pub address: String,
    pub bytes: u64,
    /// Hex stream handle the segment serves.
    pub stream: String,
    /// `"small"` (2 MiB segments for requests up to 1 MiB) or `"large"`.
    pub pool: String,
    /// The CUDA graph capture (torch's private pool) the segment belongs to, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capture: Option<u64>,
    pub blocks: Vec<SegmentBlock>,
}

/// One block of a segment.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SegmentBlock {
    /// Hex.
    pub address: String,
    /// The block's (rounded) size.
    pub bytes: u64,
    /// The size asked for; 0 for a free block.
    pub requested_bytes: u64,
    /// torch's snapshot states: `active_allocated`, `active_pending_free` (freed, waiting for a
    /// `record_stream` event), `inactive` (free).
    pub state: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HistogramBin {
    pub lo: u64,
    pub hi: u64,
    pub count: u64,
    pub bytes: u64,
}

/// The verdict: `kind`/`summary`/`suggestions` are those of the top finding (for readers of
/// older versions); `evidence` holds the dump's general numbers; `findings` every finding that
/// holds, ranked by the bytes each explains (src/core/verdict/).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Verdict {
    /// Machine-readable finding, e.g. `own_allocations`, `untracked_memory`.
    pub kind: String,
    /// One paragraph in plain words.
    pub summary: String,
    pub evidence: Vec<String>,
    pub suggestions: Vec<String>,
    /// Ranked findings, top first; absent in dumps of older versions.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub findings: Vec<Finding>,
    /// Whether running the same job again can succeed (src/core/verdict/retry.rs): present in
    /// every dump of a failure (an out-of-memory dump, a post-mortem); absent in on-demand
    /// dumps, which record no failure, and in dumps of older versions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry: Option<RetryHint>,
}

/// The retry hint of a failure, for a scheduler's restart policy.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RetryHint {
    /// `elsewhere`: the memory was held by someone else (another process, a quota) and the same
    /// program fits on a free device; `after_change`: the program's own memory filled the device,
    /// so the same configuration fails again, whatever device it gets; `unknown`: the dump cannot
    /// tell.
    pub hint: String,
    /// Why, in one sentence with the numbers.
    pub reason: String,
}

impl Verdict {
    /// The verdict in one line: the top finding's headline, or the summary when there are no
    /// findings (dumps of older versions).
    pub fn headline(&self) -> &str {
        self.findings
            .first()
            .map_or(self.summary.as_str(), |f| f.headline.as_str())
    }
}

/// One cause that holds, with the bytes it explains.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Finding {
    /// `request_exceeds_device`, `other_processes`, `leak`, `fragmentation`,
    /// `framework_cache`, `untracked_memory`, `own_allocations`, `host_memory`, `snapshot`.
    pub kind: String,
    /// The bytes this finding explains (what ranks it).
    pub bytes: u64,
    /// One line with the key numbers (the stderr summary's first line).
    pub headline: String,
    /// One paragraph in plain words.
    pub summary: String,
    /// The numbers behind it.
    pub evidence: Vec<String>,
    /// What to change, only what the evidence supports.
    pub suggestions: Vec<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Recording {
    /// oomshim version that wrote the dump.
    pub version: String,
    /// `all`, `native`, `python` or `off`.
    pub stacks: String,
    /// The interpreter whose Python stacks were read (`CPython 3.11`); absent when none was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub python: Option<String>,
    /// How many of the dump's distinct stacks (holders, sites, failed request) had Python frames
    /// merged each way; absent when none had Python frames.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub python_merge: Option<MergeCounts>,
    pub depth: u32,
    /// Frees (and async frees) of pointers the ledger did not know: passed through, counted here.
    pub unknown_frees: u64,
    /// Live allocations in the ledger at capture time (all devices).
    pub live_allocations: u64,
    /// Allocations recorded since start.
    pub total_allocations: u64,
    /// Out-of-memory failures seen since start (all devices, including de-duplicated ones).
    pub oom_failures: u64,
    /// Out-of-memory failures before this dump that got no dump of their own: repeats of a
    /// dumped failure (same device, size and stack within `OOMSHIM_MIN_INTERVAL`) ...
    #[serde(default, skip_serializing_if = "is_zero")]
    pub repeated_failures: u64,
    /// ... and failures over the `OOMSHIM_MAX_DUMPS` per-minute cap.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub suppressed_dumps: u64,
}

/// Host memory at dump time (read by the `facts::host` module).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct HostMemory {
    /// `MemTotal` of /proc/meminfo.
    pub total_bytes: Option<u64>,
    /// `MemAvailable` of /proc/meminfo: what can be had without swapping.
    pub available_bytes: Option<u64>,
    /// The memory limit of the process's cgroup; `None` when unlimited or unknown.
    pub cgroup_limit_bytes: Option<u64>,
    pub cgroup_usage_bytes: Option<u64>,
    /// `VmRSS` of /proc/self/status.
    pub rss_bytes: Option<u64>,
}

/// How a process on the GPU relates to the one that wrote the dump.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Relation {
    /// The process that wrote the dump.
    This,
    /// A child of it (a DataLoader worker, a launcher's rank).
    Child,
    /// Its parent (a launcher such as torchrun).
    Parent,
    /// Another process of the same user.
    SameUser,
    /// Another user's process.
    OtherUser,
    /// Not visible from here (another pid namespace, e.g. another container).
    Unknown,
}

impl Relation {
    /// In words, as reports say it ("another user's").
    pub fn words(self) -> &'static str {
        match self {
            Relation::This => "this process",
            Relation::Child => "a child of this process",
            Relation::Parent => "this process's parent",
            Relation::SameUser => "yours",
            Relation::OtherUser => "another user's",
            Relation::Unknown => "not visible from here",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuProcess {
    pub pid: u32,
    /// `/proc/PID/comm`, when visible.
    pub name: Option<String>,
    /// Device memory NVML attributes to the process; `None` where the driver does not say.
    pub used_bytes: Option<u64>,
    pub relation: Relation,
}
