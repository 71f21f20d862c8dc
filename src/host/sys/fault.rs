//! The fault this process injects on purpose (`OOMSHIM_FAULT`, see
//! [`oomshim_core::config::Fault`]), read once from the environment: the reliability tests'
//! hook, here beside the guard it exercises, since only the shim ever injects one.

use oomshim_core::config::{parse_fault, Fault};

/// The injected fault of this process, read from the environment on the first call.
pub fn fault() -> Fault {
    static FAULT: std::sync::OnceLock<Fault> = std::sync::OnceLock::new();
    *FAULT.get_or_init(|| match std::env::var("OOMSHIM_FAULT") {
        Err(_) => Fault::None,
        Ok(v) => parse_fault(&v).unwrap_or_else(|| {
            crate::say!(
                "oomshim: ignoring OOMSHIM_FAULT={v:?}: expected `panic-in-alloc[:N]` or \
                 `symbolize` (a test hook); using none"
            );
            Fault::None
        }),
    })
}
