//! Dump files: the schema ([`model`]), reading them back ([`read`]) and writing them atomically
//! ([`write`]).

pub mod checksum;
pub mod fit;
pub mod model;
pub mod read;
pub mod time;
pub mod units;
pub mod view;
pub mod write;
