//! What the benches beside this file (Cargo.toml lists them) share: the shape of the large
//! process whose dump they write and render.

/// Live allocations of the large process.
pub const ALLOCATIONS: usize = 100_000;
/// Its distinct native stacks.
pub const STACKS: usize = 10_000;
/// Frames in each stack.
pub const FRAMES: usize = 32;

/// Return addresses of a real stack of this process, cycled to [`FRAMES`]: every address lies
/// inside a real function of the bench binary, so symbolisation does real work.
pub fn stack_pool() -> Vec<usize> {
    let mut buf = [0usize; 64];
    let n = oomshim_host::stacks::capture(&mut buf, false);
    assert!(n >= 3, "a real stack to vary");
    (0..FRAMES).map(|i| buf[i % n]).collect()
}
