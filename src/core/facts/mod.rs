//! Facts about the machine gathered when a dump is written, outside the ledger: which processes
//! hold memory on the GPU ([`gpu_processes`], through NVML) and how much host memory is left
//! ([`host`]), which rank of which job the process is ([`ranks`]), which Kubernetes pod it runs in
//! ([`kubernetes`]) and which libraries hold the
//! device memory ([`libraries`]). Each is best-effort: a missing NVML or an unreadable /proc file is reported as
//! such in the dump, never a failure.

pub mod env;
pub mod gpu_processes;
pub mod host;
pub mod kubernetes;
pub mod libraries;
pub mod ranks;
