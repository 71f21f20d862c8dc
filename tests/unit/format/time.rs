//! Unit tests of `dump::time` (src/format/time.rs).

use dump::time::*;
use std::time::Duration;
use std::time::UNIX_EPOCH;

#[test]
fn rfc3339_matches_known_instants() {
    assert_eq!(rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00.000Z");
    let t = UNIX_EPOCH + Duration::from_millis(1_795_966_991_123);
    assert_eq!(rfc3339(t), "2026-11-29T15:43:11.123Z");
    let leap = UNIX_EPOCH + Duration::from_secs(951_782_400); // 2000-02-29
    assert_eq!(rfc3339(leap), "2000-02-29T00:00:00.000Z");
}
