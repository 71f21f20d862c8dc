//! Human-readable numbers for reports and verdicts: binary sizes, thousands separators,
//! percentages, ages, and text made safe and short for a terminal.

/// Binary units after bytes; `u64::MAX` is just under 16 EiB.
const UNITS: [&str; 6] = ["KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];

/// `1 allocation`, `2 allocations`, `1,024 allocations`: a count with the word that agrees
/// with it (thousands separated).
pub fn plural(n: u64, one: &str, many: &str) -> String {
    format!("{} {}", thousands(n), if n == 1 { one } else { many })
}

/// `512 B`, `1.50 MiB`, `2.00 GiB`: binary units, two decimals, never `1024.00` of a unit.
pub fn human_bytes(bytes: u64) -> String {
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut value = bytes as f64 / 1024.0;
    let mut unit = 0;
    // Move up while the value, rounded to two decimals, would print as 1024.00 or more.
    while unit + 1 < UNITS.len() && (value * 100.0).round() >= 102_400.0 {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.2} {}", UNITS[unit])
}

/// `4,812`: thousands separated by commas.
pub fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// `2.00 GiB (2,147,483,648 bytes)`; bytes below 1 KiB print once: `512 B`.
pub fn bytes_with_exact(bytes: u64) -> String {
    if bytes < 1024 {
        human_bytes(bytes)
    } else {
        format!("{} ({} bytes)", human_bytes(bytes), thousands(bytes))
    }
}

/// `part` as a share of `whole` in percent; `None` when `whole` is zero.
pub fn share(part: u64, whole: u64) -> Option<f64> {
    if whole == 0 {
        None
    } else {
        Some(part as f64 * 100.0 / whole as f64)
    }
}

/// `99.6%`, one decimal; `n/a` for an undefined share.
pub fn percent(share: Option<f64>) -> String {
    match share {
        Some(p) if p.is_finite() => format!("{p:.1}%"),
        _ => "n/a".to_string(),
    }
}

/// Age of an allocation: `850 ms`, `12.3 s`, `4.5 min`, `2.1 h`, `3.0 d`; `?` when not a sane
/// number of seconds (negative, NaN, infinite).
pub fn human_age(seconds: f64) -> String {
    if !seconds.is_finite() || seconds < 0.0 {
        return "?".to_string();
    }
    if seconds < 1.0 {
        format!("{:.0} ms", seconds * 1000.0)
    } else if seconds < 60.0 {
        format!("{seconds:.1} s")
    } else if seconds < 3600.0 {
        format!("{:.1} min", seconds / 60.0)
    } else if seconds < 86_400.0 {
        format!("{:.1} h", seconds / 3600.0)
    } else {
        format!("{:.1} d", seconds / 86_400.0)
    }
}

/// Text from a dump made safe for a terminal: control characters (newlines, escape sequences a
/// hostile or corrupted dump might carry) are shown escaped instead of being interpreted.
pub fn clean(text: &str) -> String {
    if !text.chars().any(char::is_control) {
        return text.to_string();
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

/// A file name for a message: [`clean`] of its display form, so a name holding newlines or
/// escape sequences (which file names may) keeps a message on one line and off the terminal's
/// controls.
pub fn clean_path(path: &std::path::Path) -> String {
    clean(&path.display().to_string())
}

/// Display width used for alignment: characters, not bytes.
pub fn width(text: &str) -> usize {
    text.chars().count()
}

/// Shortens `text` to at most `max` characters, keeping its start and end around `...`
/// (the end of a function name or path is usually the telling part).
pub fn truncate_middle(text: &str, max: usize) -> String {
    let len = width(text);
    if len <= max {
        return text.to_string();
    }
    if max <= 3 {
        return text.chars().take(max).collect();
    }
    let keep = max - 3;
    let head = keep.div_ceil(2);
    let tail = keep - head;
    let mut out: String = text.chars().take(head).collect();
    out.push_str("...");
    out.extend(text.chars().skip(len - tail));
    out
}

/// Shortens `text` to at most `max` characters, keeping its end after `...` (for paths).
pub fn truncate_left(text: &str, max: usize) -> String {
    let len = width(text);
    if len <= max {
        return text.to_string();
    }
    if max <= 3 {
        return text.chars().skip(len - max).collect();
    }
    let mut out = String::from("...");
    out.extend(text.chars().skip(len - (max - 3)));
    out
}

/// Shortens a (demangled) function name to at most `max` characters. First drops what is
/// least telling: the parameter list of a C++ signature (`f(at::Tensor const&, ...)` → `f(...)`),
/// then template arguments (`g<float, 4>` → `g<...>`); only then cuts the middle.
pub fn truncate_function(name: &str, max: usize) -> String {
    if width(name) <= max {
        return name.to_string();
    }
    let mut short = collapse_trailing_group(name, '(', ')');
    if width(&short) > max {
        short = collapse_groups(&short, '<', '>');
    }
    if width(&short) > max {
        // Drop leading namespaces, keeping as many trailing `::` components as fit.
        for pos in top_level_separators(&short) {
            let candidate = format!("...{}", &short[pos..]);
            if width(&candidate) <= max {
                return candidate;
            }
        }
    }
    truncate_middle(&short, max)
}

/// Byte offsets of the `::` separators outside `<>`, `()` and `[]`, first to last.
fn top_level_separators(text: &str) -> Vec<usize> {
    let mut out = Vec::new();
    let mut depth = 0usize;
    let bytes = text.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'<' | b'(' | b'[' => depth += 1,
            b'>' | b')' | b']' => depth = depth.saturating_sub(1),
            b':' if depth == 0 && bytes.get(i + 1) == Some(&b':') => {
                out.push(i);
                i += 1;
            }
            _ => {}
        }
        i += 1;
    }
    out
}

/// Replaces the contents of a balanced group that ends the string (ignoring trailing
/// qualifiers such as ` const`) with `...`.
fn collapse_trailing_group(text: &str, open: char, close: char) -> String {
    let Some(end) = text.rfind(close) else {
        return text.to_string();
    };
    let mut depth = 0usize;
    for (i, c) in text[..=end].char_indices().rev() {
        if c == close {
            depth += 1;
        } else if c == open {
            depth = depth.saturating_sub(1);
            if depth == 0 {
                if end - i <= 4 {
                    return text.to_string();
                }
                return format!(
                    "{}{open}...{close}{}",
                    &text[..i],
                    &text[end + close.len_utf8()..]
                );
            }
        }
    }
    text.to_string()
}

/// Replaces the contents of every outermost balanced group with `...` (`a<b<c>>::d<e>` →
/// `a<...>::d<...>`). Unbalanced text (e.g. `operator<`) is left alone.
fn collapse_groups(text: &str, open: char, close: char) -> String {
    let mut out = String::with_capacity(text.len());
    let mut depth = 0usize;
    for c in text.chars() {
        if c == open {
            if depth == 0 {
                out.push(open);
                out.push_str("...");
            }
            depth += 1;
        } else if c == close && depth > 0 {
            depth -= 1;
            if depth == 0 {
                out.push(close);
            }
        } else if depth == 0 {
            out.push(c);
        }
    }
    if depth > 0 {
        return text.to_string();
    }
    out
}
