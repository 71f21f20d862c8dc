//! Dump files: the schema ([`model`]), reading them back ([`read`]) and writing them atomically
//! ([`write`]).

pub mod fit;
pub mod model;
pub mod read;
pub mod units;
pub mod view;
pub mod write;
