//! Growth history: live device bytes of the whole process and per allocation site, sampled at
//! step boundaries, so a dump can tell a leak (the process grows with the steps) from a working
//! set that is merely large.
//!
//! Where step boundaries come from, strongest first:
//! - [`StepSource::Program`]: the program marks them (`oomshim_step()`, `oomshim.step()`);
//! - [`StepSource::Optimizer`], [`StepSource::Forward`]: oomshim's Python hook marks every
//!   `torch.optim` step and every forward pass of the program's outermost module (training and
//!   evaluation loops need no change);
//! - detected steps ([`detect`]): a repeating allocation pattern, for programs without either;
//! - otherwise one sample per second (time buckets), evidence only: growth per second is not
//!   growth per step.
//!
//! Each marked source keeps its own history, so an evaluation phase (forward passes, no optimizer
//! steps) is measured even inside a training run; [`analyse`] picks the one that describes the
//! phase the failure happened in.
//!
//! A *site* is what the growth is attributed to ([`SiteKey`]): the program's own Python line
//! (innermost frame outside installed packages and the standard library) when the allocation has
//! a Python stack, every Python-less allocation of a Python process together (autograd's backward
//! threads), or the native stack; native stacks are grouped by name when a dump is written.
//!
//! The hot path ([`Tracker::on_alloc`]) pays one relaxed store (the request size into its ring
//! slot) and two relaxed loads with compares (the detector's anchor, its deadline), plus, while
//! no step is marked or detected, one relaxed load to see whether a time bucket passed.
//! Everything else runs on cold paths: samples walk the ledger's shards (each under its own lock,
//! as a snapshot does), then name the stacks they found with no ledger lock held.
//!
//! Memory is bounded: at most [`MAX_SITES`] sites per history (those with the most live bytes),
//! each with a ring of the last [`RING`] samples; [`sizes::SIZE_RING`] request sizes.
//!
//! One job a file: `model.rs` names sources, sites and bounds; `tracker.rs` holds the tracker's
//! state and the hot path; `steps.rs` takes samples when a
//! step is marked or detected or a time bucket ends; `history.rs` holds the samples and takes
//! one; `detect.rs` is the step detector (a pure state machine); `analyse.rs` turns a history
//! into the dump's `growth`, with the fit from `dump::fit`; `sizes.rs` summarises request sizes.

mod analyse;
pub(crate) mod detect;
mod grouping;
mod history;
mod model;
mod sizes;
mod steps;
mod timeline;
mod tracker;

pub(crate) use analyse::Frozen;
pub use model::{FrameworkLive, SiteKey, SiteKeyer, StackPair, StepSource};
pub(crate) use tracker::Tracker;

#[cfg(test)]
mod tests;
