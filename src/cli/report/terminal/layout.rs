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

/// Greedy word wrap; words longer than a line stand alone.
pub fn wrap(text: &str, max: usize, first: &str, rest: &str) -> Vec<String> {
    let mut lines = Vec::new();
    let mut line = first.to_string();
    let mut empty = true;
    for word in text.split_whitespace() {
        if !empty && width(&line) + 1 + width(word) > max {
            lines.push(std::mem::replace(&mut line, rest.to_string()));
            empty = true;
        }
        if !empty {
            line.push(' ');
        }
        line.push_str(word);
        empty = false;
    }
    lines.push(line);
    lines
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
}

impl Table {
    pub fn new(headers: &[(&str, Align)]) -> Table {
        Table {
            headers: headers.iter().map(|(h, a)| (h.to_string(), *a)).collect(),
            rows: Vec::new(),
        }
    }

    pub fn row(&mut self, cells: Vec<String>, more: Vec<String>) {
        debug_assert_eq!(cells.len(), self.headers.len());
        self.rows.push((cells, more));
    }

    pub fn render(&self, out: &mut String, s: &Style) {
        let n = self.headers.len();
        let mut widths: Vec<usize> = self.headers.iter().map(|(h, _)| width(h)).collect();
        for (cells, _) in &self.rows {
            for (w, c) in widths.iter_mut().zip(cells) {
                *w = (*w).max(width(c));
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
        let _ = writeln!(out, "{}", s.dim(&header));
        let continuation: usize = 2 + widths[..n - 1].iter().map(|w| w + 2).sum::<usize>();
        for (cells, more) in &self.rows {
            let _ = writeln!(out, "{}", line(cells.iter().map(String::as_str).collect()));
            for extra in more {
                let _ = writeln!(out, "{}{extra}", " ".repeat(continuation));
            }
        }
    }
}
