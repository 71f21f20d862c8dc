//! Recording allocations as they happen: the recording mode ([`recording`]), the growth of live
//! bytes per site over steps or time ([`growth`]) and the VMM layout ([`vmm`]).

pub mod growth;
pub mod recording;
pub mod vmm;
