//! The simulated CUDA testbed built by `build.rs`: where its artifacts live, and the pieces
//! `oomshim demo` embeds. Owns no behaviour; the simulation's rules are in `tests/sim/cudart_sim.c`.

use std::path::{Path, PathBuf};

/// Directory holding the simulated libcudart.so.13 and the compiled test clients (built by build.rs).
pub fn artifact_dir() -> &'static Path {
    Path::new(concat!(env!("OUT_DIR"), "/sim"))
}

/// Path of the simulated `libcudart.so.13` in [`artifact_dir`].
pub fn sim_cudart() -> PathBuf {
    artifact_dir().join("libcudart.so.13")
}

/// Path of a compiled test client (`tests/clients/<name>.c`) in [`artifact_dir`].
pub fn client(name: &str) -> PathBuf {
    artifact_dir().join(name)
}

/// The simulated runtime and the demo client, embedded so `oomshim demo` works from any directory.
/// Written side by side into one directory, the client finds the runtime through its `$ORIGIN`
/// rpath.
pub const SIM_CUDART_SO: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/sim/libcudart.so.13"));
pub const DEMO_CLIENT: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/sim/demo_train"));

/// File name the embedded runtime must have next to the demo client.
pub const SIM_CUDART_NAME: &str = "libcudart.so.13";
/// File name of the demo client.
pub const DEMO_CLIENT_NAME: &str = "demo_train";
