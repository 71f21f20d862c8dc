//! The one place a [`Capture`] is built: the ledger and the device as they are at the moment a
//! dump describes, taken on the thread where that moment is. Every dump goes through it: a
//! failure's (with its growth up to the failure) and an on-demand one's (the signal, the
//! interval, the exit, `oomshim_dump`, the live summary).

use super::assemble::{Capture, Failing};
use super::recorder::Recorder;
use crate::cuda::context::FailureContext;
use std::time::SystemTime;

/// The state now, about `failing` (None for an on-demand dump), with the `context` gathered
/// for it. A failure's growth is copied now: a program that keeps stepping after its error
/// would fill the rings with flat samples before a settled dump is written. An on-demand dump's
/// is analysed when it is assembled.
pub fn take(s: &dyn Recorder, failing: Option<Failing>, context: FailureContext) -> Capture {
    let snapshot = s.snapshot();
    let time = SystemTime::now();
    let now_ns = s.now_ns();
    let growth = if failing.is_some() {
        s.frozen_growth()
    } else {
        None
    };
    Capture {
        snapshot,
        time,
        now_ns,
        failing,
        context,
        growth,
    }
}
