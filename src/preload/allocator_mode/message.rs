//! What an allocator-mode failure tells the program and how its dump judges the device: the
//! exception's message, and the capacity under a memory-fraction cap.

use dump::units::human_bytes;
use oomshim_host::alloc::{OomCause, OutOfMemory};

/// Room for the exception message (torch's own OOM text is about 600 bytes).
pub const MESSAGE_BYTES: usize = 2048;

/// The exception's message for `oom` (torch's wording where it has one): the device's own
/// (free, total) `mem_info`, the cache's state, the verdict's (kind, summary) when a dump was
/// assembled now, and the dump's path (`dump`, none when none could be written).
pub fn out_of_memory_text(
    oom: &OutOfMemory,
    mem_info: Option<(u64, u64)>,
    verdict: Option<&(String, String)>,
    dump: Option<&std::path::Path>,
) -> String {
    let fb = &oom.free_blocks;
    let mut text = format!(
        "CUDA out of memory. Tried to allocate {}.",
        human_bytes(oom.requested)
    );
    if let Some((free, total)) = mem_info {
        text.push_str(&format!(
            " GPU {} has a total capacity of {} of which {} is free.",
            oom.device,
            human_bytes(total),
            human_bytes(free)
        ));
    }
    if let OomCause::FractionCap { limit } = oom.cause {
        text.push_str(&format!(" {} allowed;", human_bytes(limit)));
    }
    text.push_str(&format!(
        " Of the allocated memory {} is allocated by PyTorch (oomshim allocator), and {} is reserved but unallocated (largest free block {}).",
        human_bytes(fb.allocated_bytes),
        human_bytes(fb.total_free_bytes),
        human_bytes(fb.largest_free_bytes),
    ));
    match (verdict, dump) {
        (Some((kind, summary)), _) => text.push_str(&format!(" oomshim: {kind}: {summary}")),
        (None, Some(_)) => text.push_str(" oomshim: same burst as the dump below."),
        _ => {}
    }
    match dump {
        Some(p) => text.push_str(&format!(
            " Dump: {} (oomshim report {})",
            dump::units::clean_path(p),
            dump::units::clean_path(p)
        )),
        None => text.push_str(" (no oomshim dump was written; see stderr)"),
    }
    text
}

/// The device's (free, total) as the dump is judged: under a memory-fraction cap the cap is the
/// capacity and what the cache reserves is what is in use (free = cap - reserved), as torch's
/// own fraction-limited OOM reports the allowed maximum to its observers. Judged against the
/// whole device instead, a cap far below it looked like memory held by someone else (a near
/// empty device, a few tracked bytes: `untracked_memory`). The exception's message keeps the
/// device's own numbers.
pub fn judged_mem_info(oom: &OutOfMemory, device: Option<(u64, u64)>) -> Option<(u64, u64)> {
    match oom.cause {
        OomCause::FractionCap { limit } => {
            Some((limit.saturating_sub(oom.free_blocks.reserved_bytes), limit))
        }
        _ => device,
    }
}

/// The cap a fraction-capped failure was judged against, for the dump's device entry: its
/// bytes, the fraction of the device's capacity (`device`: the device's own (free, total)).
pub fn memory_cap(oom: &OutOfMemory, device: Option<(u64, u64)>) -> Option<dump::model::MemoryCap> {
    let OomCause::FractionCap { limit } = oom.cause else {
        return None;
    };
    let total = device?.1;
    Some(dump::model::MemoryCap {
        bytes: limit,
        fraction: limit as f64 / total.max(1) as f64,
        device_total_bytes: total,
        set_by: "set_per_process_memory_fraction".to_string(),
    })
}

/// `text` as a NUL-terminated buffer, cut at a character boundary when too long.
pub fn c_message(text: &str) -> [u8; MESSAGE_BYTES] {
    let mut buf = [0u8; MESSAGE_BYTES];
    let bytes = text.as_bytes();
    let mut n = bytes.len().min(MESSAGE_BYTES - 1);
    while n > 0 && !text.is_char_boundary(n) {
        n -= 1;
    }
    buf[..n].copy_from_slice(&bytes[..n]);
    buf
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_message_is_cut_at_a_character_and_stays_terminated() {
        let short = c_message("out of memory");
        assert_eq!(&short[..14], b"out of memory\0");
        // 'é' is two bytes: 1,023 of them end at byte 2,046, the next would cross the last
        // byte kept for the NUL.
        let long = "é".repeat(MESSAGE_BYTES);
        let buf = c_message(&long);
        let end = buf.iter().position(|&b| b == 0).unwrap();
        assert_eq!(end, MESSAGE_BYTES - 2);
        assert!(std::str::from_utf8(&buf[..end]).is_ok());
    }

    fn oom(cause: OomCause) -> OutOfMemory {
        OutOfMemory {
            device: 0,
            requested: 3 << 30,
            rounded: 3 << 30,
            segment_bytes: 3 << 30,
            cause,
            released_before_failing: 0,
            free_blocks: oomshim_host::alloc::FreeBlockSummary {
                reserved_bytes: 6 << 30,
                ..Default::default()
            },
            stats: Default::default(),
        }
    }

    #[test]
    fn a_fraction_cap_is_the_capacity_the_failure_is_judged_against() {
        let device = Some((70 << 30, 80 << 30));
        let capped = oom(OomCause::FractionCap { limit: 8 << 30 });
        assert_eq!(judged_mem_info(&capped, device), Some((2 << 30, 8 << 30)));
        let cap = memory_cap(&capped, device).unwrap();
        assert_eq!((cap.bytes, cap.device_total_bytes), (8 << 30, 80 << 30));
        assert_eq!(cap.fraction, 0.1);
        let refused = oom(OomCause::DeviceExhausted { cuda_error: 2 });
        assert_eq!(judged_mem_info(&refused, device), device);
        assert_eq!(memory_cap(&refused, device), None);
    }
}
