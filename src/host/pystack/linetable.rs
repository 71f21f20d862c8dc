//! Bytecode offset → source line, from a copy of a code object's line table. Pure functions over
//! bytes: the table was copied when the code object was first seen, so a code object freed since
//! cannot change the answer.

/// Which encoding a line table uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LineFormat {
    /// CPython ≤ 3.9 `co_lnotab`: (byte-offset increment, signed line increment) pairs.
    Lnotab,
    /// CPython 3.10 `co_linetable`: (byte-offset delta, signed line delta; -128 = no line) pairs.
    Linetable310,
    /// CPython ≥ 3.11 location table (`Objects/locations.md`): variable-length entries in code
    /// units of 2 bytes.
    Locations,
}

/// The line of the instruction at `byte_offset` (bytes from the start of the bytecode), or
/// `None` when the table gives none or is malformed.
pub fn line_for(
    format: LineFormat,
    table: &[u8],
    first_line: i32,
    byte_offset: u32,
) -> Option<u32> {
    let line = match format {
        LineFormat::Lnotab => lnotab(table, first_line, byte_offset),
        LineFormat::Linetable310 => linetable310(table, first_line, byte_offset),
        LineFormat::Locations => locations(table, first_line, byte_offset / 2),
    }?;
    u32::try_from(line).ok().filter(|&l| l > 0)
}

fn lnotab(table: &[u8], first_line: i32, target: u32) -> Option<i32> {
    let mut line = first_line;
    let mut addr: u32 = 0;
    for pair in table.chunks_exact(2) {
        addr += pair[0] as u32;
        if addr > target {
            break;
        }
        line += pair[1] as i8 as i32;
    }
    Some(line)
}

fn linetable310(table: &[u8], first_line: i32, target: u32) -> Option<i32> {
    // As CPython 3.10's `advance()`: each pair is a new range [end, end + sdelta) whose line is
    // the running line plus ldelta (-128: no line). Empty ranges only move the running line.
    let mut line = first_line;
    let mut end: u32 = 0;
    for pair in table.chunks_exact(2) {
        let (sdelta, ldelta) = (pair[0] as u32, pair[1] as i8);
        let start = end;
        end += sdelta;
        let current = if ldelta == -128 {
            None
        } else {
            line += ldelta as i32;
            Some(line)
        };
        if start <= target && target < end {
            return current;
        }
    }
    None
}

/// 3.11+ location table. Each entry: a first byte with bit 7 set, code = bits 3–6, length in
/// code units = bits 0–2 plus one, then code-dependent varints.
fn locations(table: &[u8], first_line: i32, target_unit: u32) -> Option<i32> {
    let mut pos = 0usize;
    let mut line = first_line;
    let mut addr: u32 = 0;
    let byte = |pos: &mut usize| -> Option<u8> {
        let b = *table.get(*pos)?;
        *pos += 1;
        Some(b)
    };
    let varint = |pos: &mut usize| -> Option<u32> {
        let mut read = byte(pos)? as u32;
        let mut val = read & 63;
        let mut shift = 0;
        while read & 64 != 0 {
            shift += 6;
            if shift > 30 {
                return None;
            }
            read = byte(pos)? as u32;
            val |= (read & 63) << shift;
        }
        Some(val)
    };
    while pos < table.len() {
        let first = byte(&mut pos)?;
        if first & 0x80 == 0 {
            return None; // not at an entry start: malformed
        }
        let code = (first >> 3) & 15;
        let length = (first & 7) as u32 + 1;
        let entry_line: Option<i32> = match code {
            15 => None, // no location
            14 => {
                // long form: line delta (signed varint), end line delta, column, end column
                let delta = svarint(varint(&mut pos)?);
                line += delta;
                varint(&mut pos)?;
                varint(&mut pos)?;
                varint(&mut pos)?;
                Some(line)
            }
            13 => {
                // no column: line delta only
                line += svarint(varint(&mut pos)?);
                Some(line)
            }
            10..=12 => {
                // one-line forms: line delta = code - 10, then two column bytes
                line += code as i32 - 10;
                byte(&mut pos)?;
                byte(&mut pos)?;
                Some(line)
            }
            _ => {
                // short form (0–9): same line, one column byte
                byte(&mut pos)?;
                Some(line)
            }
        };
        if addr <= target_unit && target_unit < addr + length {
            return entry_line;
        }
        addr += length;
    }
    None
}

fn svarint(v: u32) -> i32 {
    if v & 1 != 0 {
        -((v >> 1) as i32)
    } else {
        (v >> 1) as i32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lnotab_pairs() {
        // addr 0 → line 10, addr 6 → 11, addr 20 → 13
        let t = [6u8, 1, 14, 2];
        assert_eq!(line_for(LineFormat::Lnotab, &t, 10, 0), Some(10));
        assert_eq!(line_for(LineFormat::Lnotab, &t, 10, 8), Some(11));
        assert_eq!(line_for(LineFormat::Lnotab, &t, 10, 30), Some(13));
    }

    #[test]
    fn linetable_310_ranges() {
        // [0,4) line 11 (first+1), [4,10) line 12, [10,12) no line, [12,14) line 14
        let t = [4u8, 1, 6, 1, 2, 0x80, 0, 1, 2, 1];
        let f = |o| line_for(LineFormat::Linetable310, &t, 10, o);
        assert_eq!(f(0), Some(11));
        assert_eq!(f(5), Some(12));
        assert_eq!(f(10), None);
        assert_eq!(f(13), Some(14));
        assert_eq!(f(40), None);
    }

    #[test]
    fn location_table_forms() {
        let t = [
            0x80 | (13 << 3),     // no-column form, 1 unit
            2,                    // line delta +1
            0x80 | (11 << 3) | 1, // one-line form: +1, 2 units
            0,
            4,
            0x80 | (14 << 3), // long form, 1 unit
            5,                // line delta -2
            0,
            1,
            1,
            0x80 | (15 << 3), // no location, 1 unit
            0x80 | (2 << 3),  // short form, same line
            0,
        ];
        let f = |unit: u32| line_for(LineFormat::Locations, &t, 20, unit * 2);
        assert_eq!(f(0), Some(21));
        assert_eq!(f(1), Some(22));
        assert_eq!(f(2), Some(22));
        assert_eq!(f(3), Some(20));
        assert_eq!(f(4), None);
        assert_eq!(f(5), Some(20));
        assert_eq!(f(6), None);
        // Truncated or malformed tables give no line, never a panic.
        assert_eq!(
            line_for(LineFormat::Locations, &[0x80 | (14 << 3), 0x41], 1, 0),
            None
        );
        assert_eq!(line_for(LineFormat::Locations, &[0x01], 1, 0), None);
    }
}
