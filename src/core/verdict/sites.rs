//! Which line of the program a site is, and how that line is named: the identity the rules
//! compare ([`Line`]) and the labels the words print, in one place, so that rewording a label
//! changes no rule's outcome.

use dump::model::{Frame, GrowthSite, Site};
use dump::units::clean;
use dump::view::{frame_label, named_frames};

/// Longest function name quoted in a verdict.
pub(super) const MAX_FUNCTION: usize = 100;

/// What allocations without Python frames in a Python process are.
pub(super) const NO_PYTHON_FRAMES: &str =
    "allocations without Python frames (autograd's backward threads, C++ code)";

/// The line of the program a site (or a request) names: what the rules group and compare.
/// Two lines are the same when their frames are the same function at the same place, whatever
/// their instruction addresses and however a label would shorten them.
#[derive(Clone, Copy, Debug)]
pub(super) enum Line<'a> {
    /// In a Python program, a site without a stack: a thread without Python frames (autograd's
    /// backward threads, C++ code) allocated it.
    NoPythonFrames,
    /// The innermost named frame of the stack ([`named_frames`]).
    Frame(&'a Frame),
}

impl<'a> Line<'a> {
    /// The line of a stack: its innermost named frame; `None` when no frame has a name.
    pub(super) fn of_stack(stack: &'a [Frame]) -> Option<Line<'a>> {
        named_frames(stack).next().map(Line::Frame)
    }

    /// The line of a site: in a Python program (`python_program`) an empty stack is
    /// [`Line::NoPythonFrames`]; else as [`Line::of_stack`].
    pub(super) fn of_site(site: &'a Site, python_program: bool) -> Option<Line<'a>> {
        if site.stack.is_empty() && python_program {
            Some(Line::NoPythonFrames)
        } else {
            Line::of_stack(&site.stack)
        }
    }

    /// The line as one-liners name it: [`NO_PYTHON_FRAMES`], or the frame as [`short_label`]
    /// names it.
    pub(super) fn short_label(&self) -> String {
        match self {
            Line::NoPythonFrames => NO_PYTHON_FRAMES.to_string(),
            Line::Frame(frame) => short_frame_label(frame),
        }
    }
}

impl Line<'_> {
    /// This line is the one torch's records name: the same function in a file of the same name
    /// at the same line (the records carry torch's full path, a stack the interpreter's).
    pub(super) fn is_recorded(&self, recorded: &dump::model::AttributedLine) -> bool {
        let base = |f: &str| f.rsplit('/').next().unwrap_or(f).to_string();
        match self {
            Line::NoPythonFrames => false,
            Line::Frame(f) => {
                f.line == Some(recorded.line)
                    && f.function.as_deref() == Some(recorded.function.as_str())
                    && f.file.as_deref().map(base) == Some(base(&recorded.file))
            }
        }
    }
}

impl PartialEq for Line<'_> {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (Line::NoPythonFrames, Line::NoPythonFrames) => true,
            (Line::Frame(a), Line::Frame(b)) => {
                a.function == b.function
                    && a.file == b.file
                    && a.line == b.line
                    && a.module == b.module
            }
            _ => false,
        }
    }
}

impl Eq for Line<'_> {}

/// The innermost named frame of a stack, `function (file:line)`; a plain description when no
/// frame has a name.
pub(super) fn site_label(stack: &[Frame]) -> String {
    match named_frames(stack).next() {
        Some(frame) => frame_label(frame, MAX_FUNCTION),
        None => match stack.first() {
            Some(frame) => format!(
                "an unnamed site (innermost address {})",
                clean(&frame.address)
            ),
            None => "a site without a recorded stack".to_string(),
        },
    }
}

/// A frame with its file's base name: `forward (model.py:42)`.
fn short_frame_label(frame: &Frame) -> String {
    let mut f = frame.clone();
    if let Some(file) = &f.file {
        f.file = Some(file.rsplit('/').next().unwrap_or(file).to_string());
    }
    frame_label(&f, 60)
}

/// The innermost named frame with its file's base name: `forward (model.py:42)` (one-liners).
pub fn short_label(stack: &[Frame]) -> String {
    match named_frames(stack).next() {
        Some(frame) => short_frame_label(frame),
        None => site_label(stack),
    }
}

/// A growth site's name: its frame, or what its allocations have in common.
pub(super) fn site_name(site: &GrowthSite) -> String {
    match site.grouped_by.as_deref() {
        Some("no_python") => NO_PYTHON_FRAMES.to_string(),
        _ => short_label(&site.stack),
    }
}

#[cfg(test)]
mod tests {
    use super::{site_label, Line};
    use crate::verdict::tests::{frame, site};
    use dump::model::Site;

    #[test]
    fn site_labels() {
        assert_eq!(site_label(&[]), "a site without a recorded stack");
        assert_eq!(
            site_label(&[frame(None, None, None)]),
            "an unnamed site (innermost address 0x7f00deadbeef)"
        );
        assert_eq!(site_label(&site(1, 1).stack), "forward (model.py:42)");
    }

    /// Lines are told apart by what their frames are, not by their shortened labels: two files
    /// of one base name are two lines, one function at two addresses is one.
    #[test]
    fn lines_compare_frames_not_labels() {
        let at = |file: &str, address: &str| Site {
            bytes: 1,
            count: 1,
            stack: vec![dump::model::Frame {
                address: address.to_string(),
                ..frame(Some("forward"), Some(file), Some(42))
            }],
        };
        let (a, b, c) = (
            at("/a/model.py", "0x1"),
            at("/b/model.py", "0x1"),
            at("/a/model.py", "0x2"),
        );
        fn line(s: &Site) -> Line<'_> {
            Line::of_site(s, false).expect("a named frame")
        }
        assert_eq!(line(&a).short_label(), line(&b).short_label());
        assert_ne!(line(&a), line(&b));
        assert_eq!(line(&a), line(&c));
        let empty = Site {
            bytes: 1,
            count: 1,
            stack: vec![],
        };
        assert_eq!(Line::of_site(&empty, true), Some(Line::NoPythonFrames));
        assert_eq!(Line::of_site(&empty, false), None);
    }
}
