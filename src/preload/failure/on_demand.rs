//! The dumps no failure asked for: the shim's signal, interval and exit triggers,
//! `oomshim_dump`, and the live summary the flight recorder publishes. They take the same steps
//! as a failure's dump (the one capture, gather, assemble, write), without a request to track.

use super::assemble::Facts;
use super::recorder::Recorder;
use super::{capture, gather, writer};
use crate::cuda::context::FailureContext;
use crate::state::room_for_dump;

/// Writes an on-demand dump on the calling thread, about what `context` gathered there, and
/// says where it went. True when a dump file was written.
pub fn write(s: &dyn Recorder, reason: &str, context: FailureContext) -> bool {
    if !room_for_dump(s.live_count()) {
        return false;
    }
    let capture = capture::take(s, None, context);
    let facts = Facts::read(capture.context.device);
    let dump = gather::assemble_now(s, reason, &capture, None, None, facts);
    match writer::write(s, &dump) {
        Ok(w) => {
            oomshim_host::say!(
                "oomshim: dump ({reason}) written: {}",
                dump::units::clean_path(&w.path)
            );
            true
        }
        Err(e) => {
            oomshim_host::say!("oomshim: could not write the dump ({reason}): {e}");
            false
        }
    }
}

/// The live summary's dump (reason `live`), asked of nothing but the ledger and /proc (no CUDA,
/// no NVML): assembled, never written.
pub fn live(s: &dyn Recorder, context: FailureContext) -> Option<dump::model::Dump> {
    if !room_for_dump(s.live_count()) {
        return None;
    }
    let capture = capture::take(s, None, context);
    let facts = Facts {
        gpu_processes: None,
        host: oomshim_core::facts::host::read(),
        device_uuids: crate::cuda::context::known_device_uuids(),
    };
    Some(gather::assemble_now(s, "live", &capture, None, None, facts))
}
