//! The terminal report's layout: styling that is a no-op without colour, `key  value` lines,
//! word wrap and aligned tables. Knows nothing of dumps.

use std::fmt::Write as _;

use dump::units::width;
use oomshim_core::verdict::{
    FRAGMENTATION, FRAMEWORK_CACHE, LEAK, OTHER_PROCESSES, OWN_ALLOCATIONS, REQUEST_EXCEEDS_DEVICE,
    SNAPSHOT, UNTRACKED_MEMORY,
};

/// ANSI styling that is a no-op without colour.
pub struct Style {
    pub color: bool,
}

impl Style {
    pub(super) fn paint(&self, code: &str, text: &str) -> String {
        if self.color && !text.is_empty() {
            format!("\x1b[{code}m{text}\x1b[0m")
        } else {
            text.to_string()
        }
    }
    pub(super) fn title(&self, text: &str) -> String {
        self.paint("1", text)
    }
    pub(super) fn dim(&self, text: &str) -> String {
        self.paint("2", text)
    }
    pub(super) fn kind(&self, kind: &str) -> String {
        let code = match kind {
            REQUEST_EXCEEDS_DEVICE | UNTRACKED_MEMORY | OTHER_PROCESSES => "1;31",
            OWN_ALLOCATIONS | FRAGMENTATION | LEAK | FRAMEWORK_CACHE => "1;33",
            SNAPSHOT => "1;36",
            _ => "1",
        };
        self.paint(code, kind)
    }
}

/// One `  key      value` line of a section.
pub(super) fn kv(out: &mut String, s: &Style, key: &str, value: &str) {
    let _ = writeln!(
        out,
        "  {}{}  {value}",
        s.dim(key),
        " ".repeat(8usize.saturating_sub(width(key)))
    );
}

pub(super) use dump::units::plural;

/// Greedy word wrap to `max` columns; a word longer than a whole line is cut into pieces that
/// fill lines (a long path must not push a line past the terminal's edge).
pub fn wrap(text: &str, max: usize, first: &str, rest: &str) -> Vec<String> {
    let mut lines = Vec::new();
    let mut line = first.to_string();
    let mut empty = true;
    for word in text.split_whitespace() {
        let mut word = word;
        loop {
            let room = max.saturating_sub(width(&line) + usize::from(!empty));
            if width(word) <= room {
                if !empty {
                    line.push(' ');
                }
                line.push_str(word);
                empty = false;
                break;
            }
            if empty {
                // Not even a line of its own holds the word: cut it where the line ends.
                let cut = word
                    .char_indices()
                    .nth(room.max(1))
                    .map_or(word.len(), |(i, _)| i);
                line.push_str(&word[..cut]);
                word = &word[cut..];
            }
            lines.push(std::mem::replace(&mut line, rest.to_string()));
            empty = true;
            if word.is_empty() {
                break;
            }
        }
    }
    lines.push(line);
    lines
}

/// `lines` cut to at most `keep` lines, the last one ending in `…` when something was cut (and
/// still within `max` columns).
pub fn at_most(mut lines: Vec<String>, keep: usize, max: usize) -> Vec<String> {
    if lines.len() <= keep {
        return lines;
    }
    lines.truncate(keep);
    if let Some(last) = lines.last_mut() {
        let mut chars: Vec<char> = last.trim_end().chars().collect();
        while chars.len() + 1 > max {
            chars.pop();
        }
        *last = chars.into_iter().collect::<String>() + "…";
    }
    lines
}

/// `text` cut to `max` columns, ending in `…` when cut.
pub fn fit(text: &str, max: usize) -> String {
    if width(text) <= max {
        return text.to_string();
    }
    let mut out: String = text.chars().take(max.saturating_sub(1)).collect();
    out.push('…');
    out
}

#[derive(Clone, Copy, PartialEq)]
pub enum Align {
    Left,
    Right,
}

/// A table whose last column is free text (not padded) and may carry continuation lines.
pub struct Table {
    headers: Vec<(String, Align)>,
    rows: Vec<(Vec<String>, Vec<String>)>,
    /// Lines printed as they are after each row (by row index), cut at `width`.
    after: Vec<Vec<String>>,
    /// The column whose cells are shortened (in the middle) when a row would be wider than
    /// `width`; continuation lines are cut at `width` too.
    shrink: Option<usize>,
    width: usize,
}

impl Table {
    pub fn new(headers: &[(&str, Align)]) -> Table {
        Table {
            headers: headers.iter().map(|(h, a)| (h.to_string(), *a)).collect(),
            rows: Vec::new(),
            after: Vec::new(),
            shrink: None,
            width: usize::MAX,
        }
    }

    /// Keeps every line within `width` columns by shortening column `column`'s cells.
    pub fn within(mut self, width: usize, column: usize) -> Table {
        self.width = width;
        self.shrink = Some(column);
        self
    }

    pub fn row(&mut self, cells: Vec<String>, more: Vec<String>) {
        debug_assert_eq!(cells.len(), self.headers.len());
        self.rows.push((cells, more));
        self.after.push(Vec::new());
    }

    /// A line printed as it is (its own indent) after the last row.
    pub fn more(&mut self, line: String) {
        if let Some(after) = self.after.last_mut() {
            after.push(line);
        }
    }

    pub fn render(&self, out: &mut String, s: &Style) {
        let n = self.headers.len();
        let mut widths: Vec<usize> = self.headers.iter().map(|(h, _)| width(h)).collect();
        for (cells, _) in &self.rows {
            for (w, c) in widths.iter_mut().zip(cells) {
                *w = (*w).max(width(c));
            }
        }
        let total = 2 + widths.iter().sum::<usize>() + 2 * (n - 1);
        let mut rows = self.rows.clone();
        if let Some(col) = self.shrink.filter(|_| total > self.width) {
            let over = total - self.width;
            let floor = width(&self.headers[col].0).max(8);
            widths[col] = widths[col].saturating_sub(over).max(floor);
            for (cells, _) in rows.iter_mut() {
                cells[col] = dump::units::truncate_middle(&cells[col], widths[col]);
            }
        }
        let line = |cells: Vec<&str>| -> String {
            let mut text = String::from("  ");
            for (i, cell) in cells.iter().enumerate() {
                if i > 0 {
                    text.push_str("  ");
                }
                let pad = widths[i].saturating_sub(width(cell));
                if i + 1 == n {
                    if self.headers[i].1 == Align::Right {
                        text.push_str(&" ".repeat(pad));
                    }
                    text.push_str(cell);
                } else if self.headers[i].1 == Align::Right {
                    text.push_str(&" ".repeat(pad));
                    text.push_str(cell);
                } else {
                    text.push_str(cell);
                    text.push_str(&" ".repeat(pad));
                }
            }
            text.trim_end().to_string()
        };
        let header = line(self.headers.iter().map(|(h, _)| h.as_str()).collect());
        let _ = writeln!(out, "{}", s.dim(&fit(&header, self.width)));
        let continuation: usize = 2 + widths[..n - 1].iter().map(|w| w + 2).sum::<usize>();
        for ((cells, more), after) in rows.iter().zip(&self.after) {
            let _ = writeln!(
                out,
                "{}",
                fit(
                    &line(cells.iter().map(String::as_str).collect()),
                    self.width
                )
            );
            for extra in more {
                let _ = writeln!(
                    out,
                    "{}",
                    fit(&format!("{}{extra}", " ".repeat(continuation)), self.width)
                );
            }
            for line in after {
                let _ = writeln!(out, "{}", fit(line, self.width));
            }
        }
    }
}
