//! The unit tests of the dump format crate (`dump`, src/format), compiled into this one test
//! binary instead of a test harness of their own: the crate's API is public, and a harness of
//! its own compiled the whole crate a second time for them (the test build's time).

mod fit;
mod model;
mod read;
mod signals;
mod time;
mod units;
mod view;
mod write;
