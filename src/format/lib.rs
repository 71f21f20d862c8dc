//! oomshim-format (`dump` where used): the dump file, the lowest layer, importing nothing of
//! ours. Dump files: the schema ([`model`]), reading them back ([`read`]) and writing them atomically
//! ([`write`]).

pub mod api;
pub mod checksum;
pub mod fit;
/// Hand-built dumps for the tests of every crate. Always compiled (a few small functions): a
/// feature for them would give `cargo test` another build of every crate above.
#[doc(hidden)]
pub mod fixtures;
pub mod model;
pub mod read;
/// Holding off a signal one of the writer's own writes could raise in the host program.
pub mod signals;
pub mod time;
pub mod units;
pub mod view;
pub mod write;
