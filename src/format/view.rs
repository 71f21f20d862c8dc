//! Shared views of a dump's contents that every reader needs the same way (the verdict, the
//! reporters and the live shim naming a site): which frames name a stack, frame labels, the
//! order of sites, used bytes. Pure functions of the dump model.

use super::model::{Dump, DuplicateModel, Frame, FrameKind, Kinds, Site};
use super::units::{self, clean};

/// oomshim's own Python hook: its frames are on the stack when a framework's word arrives
/// (torch's observer, the XLA excepthook after the program's frames have unwound).
pub fn is_hook_file(path: &str) -> bool {
    path.contains("/python-hook-") || path.contains("/oomshim_hook/")
}

/// Python code that is not the program's own: installed packages (`site-packages`,
/// `dist-packages`), the standard library (`…/lib/python3.N/…`), frozen modules and the code
/// torch.compile generated ([`is_compiled_graph_file`]).
pub fn is_library_file(path: &str) -> bool {
    path.contains("/site-packages/")
        || path.contains("/dist-packages/")
        || path.starts_with("<frozen")
        || is_hook_file(path)
        || is_compiled_graph_file(path)
        || path
            .split('/')
            .any(|c| c.starts_with("python3.") || c.starts_with("python2."))
}

/// A module torch.compile's inductor wrote to its code cache: under its default cache
/// (`/tmp/torchinductor_<user>/`), or anywhere as `XY/cXY<hash>.py` (`c` and 51 characters
/// of base32), the folder named by the hash's 2nd and 3rd characters (a cache moved by
/// `TORCHINDUCTOR_CACHE_DIR`). Its frames run the compiled graph; the program's line is further
/// out. The hook's `_inductor_output` says the same.
pub fn is_compiled_graph_file(path: &str) -> bool {
    if path.split('/').any(|c| c.starts_with("torchinductor_")) {
        return true;
    }
    let mut parts = path.rsplit('/');
    let (Some(name), Some(folder)) = (parts.next(), parts.next()) else {
        return false;
    };
    let Some(stem) = name.strip_suffix(".py") else {
        return false;
    };
    stem.len() == 52
        && stem.starts_with('c')
        && stem.get(1..3) == Some(folder)
        && stem
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
}

/// Frames that carry a function name, innermost first. Frames without one (addresses the
/// symboliser could not name) are skipped in every report. So are the CUDA allocation call
/// itself and frames inside the CUDA runtime/driver or the shim (see [`is_cuda_api_frame`]),
/// which only repeat the API column, unless no other named frame is left.
///
/// A stack with Python frames is named by them alone: the innermost Python frame is the site
/// (`forward (train.py:57)`), its callers follow; the native frames between them are the
/// interpreter's and the framework's. Innermost Python frames of installed packages and the
/// standard library (`relu (torch/nn/functional.py)`) are passed over when the program's own
/// code is further out: the site is the user's line that called into the library.
pub fn named_frames(stack: &[Frame]) -> impl Iterator<Item = &Frame> {
    let python = stack.iter().any(|f| f.kind == FrameKind::Python);
    let user_code = python
        && stack
            .iter()
            .any(|f| f.kind == FrameKind::Python && !is_library_python_frame(f));
    let named = move || {
        stack.iter().filter(move |f| {
            (!python || f.kind == FrameKind::Python)
                // oomshim's hook only relays a framework's word: never the failing call.
                && !(f.kind == FrameKind::Python
                    && f.file.as_deref().is_some_and(is_hook_file))
                && f.function
                    .as_deref()
                    .is_some_and(|name| !name.trim().is_empty())
        })
    };
    let has_caller = named().any(|f| !is_cuda_api_frame(f));
    named()
        .filter(move |f| !(has_caller && is_cuda_api_frame(f)))
        .skip_while(move |f| user_code && is_library_python_frame(f))
}

/// Python code that is not the program's own: installed packages (`site-packages`,
/// `dist-packages`), the standard library (`…/lib/python3.N/…`) and frozen modules.
pub fn is_library_python_frame(f: &Frame) -> bool {
    f.kind == FrameKind::Python && f.file.as_deref().is_some_and(is_library_file)
}

/// Frames that only repeat how memory was allocated, never who wanted it: the CUDA runtime or
/// driver library (`libcudart.so*`, `libcuda.so*`) and the shim (`liboomshim*`); a statically
/// linked runtime's internals (`libcudart_static_*`, `cudart::*`, `__cudart*`) and CUDA
/// allocation functions by name; a framework's allocator (torch's `libc10*`, XLA's
/// `BFCAllocator` and `stream_executor`, CuPy's memory pool); and libc.
pub fn is_cuda_api_frame(frame: &Frame) -> bool {
    let module = frame.module.as_deref().unwrap_or("");
    let module = module.rsplit('/').next().unwrap_or(module);
    if module.starts_with("libcudart.so")
        || module.starts_with("libcuda.so")
        || module.starts_with("liboomshim")
        || module.starts_with("libc10")
        || module.starts_with("libc.so")
        || module.starts_with("ld-linux")
    {
        return true;
    }
    let Some(function) = frame.function.as_deref() else {
        return false;
    };
    if function.starts_with("libcudart_static_")
        || function.starts_with("cudart::")
        || function.starts_with("__cudart")
        || function.starts_with("c10::cuda::")
        || function.contains("CUDACachingAllocator")
        || function.contains("BFCAllocator")
        || function.starts_with("stream_executor::")
        || function.contains("cupy::memory")
    {
        return true;
    }
    let mut base = function;
    for suffix in ["_ptsz", "_ptds", "_v2", "_v3"] {
        base = base.strip_suffix(suffix).unwrap_or(base);
    }
    crate::api::CUDA_ALLOCATION_FUNCTIONS.contains(&base)
}

/// `function (file:line)`, `function (file)`, or `function [module file name]` when only the
/// module is known; the function name is shortened to `max_function` characters and control
/// characters are escaped.
pub fn frame_label(frame: &Frame, max_function: usize) -> String {
    let function = units::truncate_function(
        &clean(frame.function.as_deref().unwrap_or("?")),
        max_function,
    );
    match (&frame.file, frame.line) {
        (Some(file), Some(line)) if !file.is_empty() => {
            format!("{function} ({}:{line})", clean(file))
        }
        (Some(file), None) if !file.is_empty() => format!("{function} ({})", clean(file)),
        _ => match frame.module.as_deref().filter(|m| !m.is_empty()) {
            Some(module) => {
                let base = module.rsplit('/').next().unwrap_or(module);
                format!("{function} [{}]", clean(base))
            }
            None => function,
        },
    }
}

/// Sites largest first (stable for equal sizes).
pub fn sorted_sites(dump: &Dump) -> Vec<&Site> {
    let mut sites: Vec<&Site> = dump.sites.iter().collect();
    sites.sort_by_key(|s| std::cmp::Reverse(s.bytes));
    sites
}

/// Torch's memory by kind, by the names metrics and JSON use (`parameters`, `gradients`,
/// `optimizer_state`, `activations`, `cache`), each `None` when not counted.
pub fn kinds_by_name(k: &Kinds) -> [(&'static str, Option<u64>); 5] {
    [
        ("parameters", Some(k.parameters_bytes)),
        ("gradients", Some(k.gradients_bytes)),
        ("optimizer_state", Some(k.optimizer_state_bytes)),
        ("activations", k.activations_bytes),
        ("cache", k.cache_bytes),
    ]
}

/// Torch's memory by kind in words: `parameters 1.00 GiB, gradients …, optimizer state …,
/// activations …, torch's cache …` (the last two when counted).
pub fn kinds_in_words(k: &Kinds) -> String {
    kinds_by_name(k)
        .iter()
        .filter_map(|(name, bytes)| {
            let word = match *name {
                "optimizer_state" => "optimizer state",
                "cache" => "torch's cache",
                n => n,
            };
            bytes.map(|b| format!("{word} {}", units::human_bytes(b)))
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// The kinds the hook counts one by one (activations are what is left of torch's allocated
/// bytes), by the names `short_kinds` uses.
pub const COUNTED_KINDS: [&str; 3] = ["parameters", "gradients", "optimizer_state"];

/// The counted kinds that may be short of the truth: the hook's walk ran out of its time budget
/// before it finished them (`short_kinds`); in a dump of an earlier version that says it is not
/// `complete` without saying which, any of them.
pub fn short_kinds(k: &Kinds) -> Vec<&'static str> {
    if k.short_kinds.is_empty() {
        return if k.complete {
            Vec::new()
        } else {
            COUNTED_KINDS.to_vec()
        };
    }
    COUNTED_KINDS
        .into_iter()
        .filter(|kind| k.short_kinds.iter().any(|s| s == kind))
        .collect()
}

/// The kind holding the most, by name and bytes, when the count can tell: with every kind
/// counted, the largest (ties to the first of `parameters`, `gradients`, `optimizer_state`,
/// `activations`); with some short, the largest finished kind that is at least what any other
/// kind can be (a short kind may be short by as much as activations holds; activations, the
/// rest, may then be long, so it is never named). `None` when nothing was counted, or the count
/// cannot tell.
pub fn named_dominant(k: &Kinds) -> Option<(&'static str, u64)> {
    let act = k.activations_bytes;
    let all = [
        ("parameters", k.parameters_bytes),
        ("gradients", k.gradients_bytes),
        ("optimizer_state", k.optimizer_state_bytes),
        ("activations", act.unwrap_or(0)),
    ];
    let (name, bytes) = all.into_iter().fold(None, |best: Option<(&str, u64)>, x| {
        if x.1 > best.map_or(0, |b| b.1) {
            Some(x)
        } else {
            best
        }
    })?;
    let short = short_kinds(k);
    if short.is_empty() {
        return Some((name, bytes));
    }
    let act = act?;
    if name == "activations" || short.contains(&name) {
        return None;
    }
    let most = |(other, b): (&str, u64)| {
        if short.contains(&other) {
            b.saturating_add(act)
        } else {
            b
        }
    };
    all.into_iter()
        .filter(|&(other, _)| other != name && other != "activations")
        .all(|x| most(x) <= bytes)
        .then_some((name, bytes))
}

/// `parameters, gradients and optimizer state`.
fn kinds_list(names: &[&str]) -> String {
    let words: Vec<String> = names.iter().map(|n| n.replace('_', " ")).collect();
    match words.split_last() {
        Some((last, rest)) if !rest.is_empty() => format!("{} and {last}", rest.join(", ")),
        Some((last, _)) => last.clone(),
        None => String::new(),
    }
}

/// What a count out of time says, the same in the verdict and the report: "counted in part: the
/// time budget ran out before gradients and optimizer state were all counted; they may be short,
/// and activations (the rest) long"; `None` when every kind was counted.
pub fn short_phrase(k: &Kinds) -> Option<String> {
    let short = short_kinds(k);
    let (verb, pronoun) = if short.len() > 1 {
        ("were", "they")
    } else {
        ("was", "it")
    };
    (!short.is_empty()).then(|| {
        format!(
            "counted in part: the time budget ran out before {} {verb} all counted; {pronoun} may be \
             short, and activations (the rest) long",
            kinds_list(&short)
        )
    })
}

/// The models held more than once: the hook's `duplicates`; in a dump of an earlier version, the
/// listed models marked `duplicate_of` an earlier one, grouped by it.
pub fn duplicates(k: &Kinds) -> Vec<DuplicateModel> {
    if !k.duplicates.is_empty() {
        return k.duplicates.clone();
    }
    let mut out: Vec<(usize, DuplicateModel)> = Vec::new();
    for m in &k.models {
        let Some(first) = m.duplicate_of.and_then(|j| k.models.get(j).map(|f| (j, f))) else {
            continue;
        };
        match out.iter_mut().find(|(j, _)| *j == first.0) {
            Some((_, d)) => d.copies += 1,
            None => out.push((
                first.0,
                DuplicateModel {
                    class: first.1.class.clone(),
                    qualified_class: first.1.qualified_class.clone(),
                    copies: 2,
                    bytes_each: first.1.bytes,
                },
            )),
        }
    }
    let mut out: Vec<DuplicateModel> = out.into_iter().map(|(_, d)| d).collect();
    out.sort_by_key(|d| std::cmp::Reverse(d.copies.saturating_mul(d.bytes_each)));
    out
}

/// "twice", "4 times".
fn times(n: u64) -> String {
    if n == 2 {
        "twice".to_string()
    } else {
        format!("{n} times")
    }
}

/// A model held more than once in words, the same in the stderr line, the verdict and the
/// report: "the Sequential model is held 4 times (4 × 16.00 GiB, identical parameter shapes)";
/// "at least" when the parameters may be short (copies the walk did not reach).
pub fn held_phrase(k: &Kinds, d: &DuplicateModel) -> String {
    format!(
        "{} ({} × {}, identical parameter shapes)",
        held_head(k, d),
        d.copies,
        units::human_bytes(d.bytes_each)
    )
}

/// "the Sequential model is held 4 times" ([`held_phrase`] without the numbers).
pub fn held_head(k: &Kinds, d: &DuplicateModel) -> String {
    let at_least = if short_kinds(k).contains(&"parameters") {
        "at least "
    } else {
        ""
    };
    format!(
        "the {} model is held {at_least}{}",
        clean(&d.class),
        times(d.copies)
    )
}

/// The models and optimizers counted but not listed: "24 more models not listed: 12.00 GiB of
/// parameters", "2 more optimizers not listed: 1.00 GiB of state".
pub fn more_phrases(k: &Kinds) -> Vec<String> {
    [
        (k.more_models, k.more_models_bytes, "model", "parameters"),
        (
            k.more_optimizers,
            k.more_optimizers_bytes,
            "optimizer",
            "state",
        ),
    ]
    .into_iter()
    .filter(|&(n, ..)| n > 0)
    .map(|(n, bytes, what, of)| {
        format!(
            "{n} more {what}{} not listed: {} of {of}",
            if n == 1 { "" } else { "s" },
            units::human_bytes(bytes)
        )
    })
    .collect()
}

/// A device's per-process cap in words: "the 2.00 GiB cap set by
/// set_per_process_memory_fraction(0.25) of device 0's 8.00 GiB" (verdicts and reports say it
/// where they would say "device 0").
pub fn cap_phrase(device: i32, cap: &crate::model::MemoryCap) -> String {
    let fraction = format!("{:.4}", cap.fraction);
    let fraction = fraction.trim_end_matches('0').trim_end_matches('.');
    format!(
        "the {} cap set by {}({fraction}) of device {device}'s {}",
        crate::units::human_bytes(cap.bytes),
        cap.set_by,
        crate::units::human_bytes(cap.device_total_bytes)
    )
}

/// Used bytes of a device (`total - free`) when both are known.
pub fn used_bytes(total: Option<u64>, free: Option<u64>) -> Option<u64> {
    Some(total?.saturating_sub(free?))
}

/// One kind of memory on the failing device, for every reader's "By kind" (report, JSON, HTML,
/// exporter): `key` is machine-readable, `label` as people say it.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct KindRow {
    pub key: &'static str,
    pub label: &'static str,
    pub bytes: u64,
}

/// The device's memory by kind when the framework counted its kinds (`framework.kinds`): the
/// framework's parameters, gradients, optimizer state, activations and cache, then what is
/// outside it (this process's CUDA context and other libraries: used − the framework's reserved
/// − other processes), other processes (NVML), and free. The rows sum to the device's total when
/// its numbers are known; `None` without kinds.
pub fn kind_rows(dump: &Dump) -> Option<(i32, Vec<KindRow>)> {
    let k = dump.framework.as_ref()?.kinds.as_ref()?;
    let device = dump
        .failed_request
        .as_ref()
        .map(|r| r.device)
        .or_else(|| dump.framework.as_ref().map(|_| 0))?;
    let info = dump.devices.iter().find(|d| d.index == device);
    let used = info.and_then(|d| used_bytes(d.total_bytes, d.free_bytes));
    let others = dump
        .library_memory
        .as_ref()
        .and_then(|l| l.untracked.iter().find(|u| u.device == device))
        .and_then(|u| u.other_processes_bytes)
        .unwrap_or(0);
    let row = |key, label, bytes| KindRow { key, label, bytes };
    let mut rows = vec![
        row("parameters", "parameters", k.parameters_bytes),
        row("gradients", "gradients", k.gradients_bytes),
        row(
            "optimizer_state",
            "optimizer state",
            k.optimizer_state_bytes,
        ),
        row(
            "activations",
            "activations and other live tensors",
            k.activations_bytes.unwrap_or(0),
        ),
    ];
    if let Some(c) = k.cache_bytes {
        rows.push(row(
            "framework_cache",
            "torch's cache (reserved, unallocated)",
            c,
        ));
    }
    if let (Some(u), Some(r)) = (used, k.torch_reserved_bytes) {
        rows.push(row(
            "outside_framework",
            "outside torch (CUDA context, libraries)",
            u.saturating_sub(r).saturating_sub(others),
        ));
    }
    if others > 0 {
        rows.push(row("other_processes", "other processes", others));
    }
    if let Some(free) = info.and_then(|d| d.free_bytes) {
        rows.push(row("free", "free", free));
    }
    Some((device, rows))
}

/// Whether the dump has a free-block histogram at all.
pub fn free_blocks_available(dump: &Dump) -> bool {
    dump.free_blocks.source != "unavailable"
}
