//! The live side of torch's memory history in allocator mode (the trace itself is kept by the
//! allocator, `oomshim_host::alloc`): the Python stack an allocation or free passes to it, and the
//! JSON the Python package turns into `_snapshot()`'s `device_traces` and `frames`.
//!
//! A stack id here is the shim's interned Python stack (the same table the ledger's stacks
//! use), captured without the GIL like every stack of the shim; it is resolved to
//! `{filename, line, name}` frames, innermost first as torch lists them, only when a snapshot
//! asks for it.

use super::host::Host;
use oomshim_host::alloc::{SegmentView, TraceEntry};
use oomshim_host::ledger::StackId;
use serde_json::{json, Map, Value};
use std::collections::BTreeSet;

/// `{"trace": [...], "blocks": [[address, stack], ...], "stacks": {"id": [frame, ...]}}` for one
/// device: its trace, oldest first (`action`, `addr` or `device_free`, `size`, `stream`,
/// `time_us`, `stack`), the stacks its live blocks were allocated with (non-zero only), and
/// every stack named, resolved. (Segments get no frames: torch 2.11's snapshot gives none.)
pub fn history_json(host: &dyn Host, trace: &[TraceEntry], segments: &[SegmentView]) -> String {
    let mut named = BTreeSet::new();
    let entries: Vec<Value> = trace
        .iter()
        .map(|e| {
            named.insert(e.context);
            let place = if e.action == oomshim_host::alloc::TraceAction::Oom {
                "device_free"
            } else {
                "addr"
            };
            json!({
                "action": e.action.torch_name(),
                place: e.addr,
                "size": e.size,
                "stream": e.stream,
                "time_us": e.time_us,
                "stack": e.context,
            })
        })
        .collect();
    let mut blocks = Vec::new();
    for seg in segments {
        for b in seg.blocks.iter().filter(|b| b.context != 0) {
            named.insert(b.context);
            blocks.push(json!([b.addr, b.context]));
        }
    }
    named.remove(&0);
    let mut stacks = Map::new();
    for id in named {
        let Some(packed) = host.python_frames(StackId(id)) else {
            break; // the shim is off: no stack is named
        };
        let frames: Vec<Value> = oomshim_host::pystack::resolve(&packed)
            .into_iter()
            .map(|f| json!({"filename": f.file, "line": f.line.unwrap_or(0), "name": f.function}))
            .collect();
        stacks.insert(id.to_string(), Value::Array(frames));
    }
    json!({"trace": entries, "blocks": blocks, "stacks": stacks}).to_string()
}
