//! A checksum for payloads the shim writes and reads back (the flight region, the symbol cache).

/// FNV-1a, 64 bits: enough to tell a torn or scribbled payload from the one written (not a
/// defence against a forger, who owns the file anyway).
pub fn checksum(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= b as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}
