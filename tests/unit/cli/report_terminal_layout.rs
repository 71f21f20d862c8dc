//! Unit tests of `oomshim_cli::report::terminal::layout` (src/cli/report/terminal/layout.rs).

use oomshim_cli::report::terminal::layout::*;

#[test]
fn wrap_and_table_alignment() {
    assert_eq!(wrap("a b c", 3, "", ""), vec!["a b", "c"]);
    assert_eq!(wrap("", 10, "  ", "  "), vec!["  "]);
    // A word longer than a line is cut where the line ends: no line passes the width.
    assert_eq!(
        wrap("averyveryverylongword x", 8, "- ", "  "),
        vec!["- averyv", "  eryver", "  ylongw", "  ord x"]
    );
    assert_eq!(wrap("ab cdefghij", 6, "", ""), vec!["ab", "cdefgh", "ij"]);
    assert_eq!(
        at_most(vec!["one two".into(), "three".into()], 1, 8),
        vec!["one two…"]
    );
    assert_eq!(fit("abcdef", 4), "abc…");
    let mut t = Table::new(&[
        ("N", Align::Right),
        ("NAME", Align::Left),
        ("TEXT", Align::Left),
    ]);
    t.row(
        vec!["1".into(), "a".into(), "first".into()],
        vec!["second".into()],
    );
    t.row(vec!["100".into(), "abcdef".into(), "x".into()], vec![]);
    let mut out = String::new();
    t.render(&mut out, &Style { color: false });
    assert_eq!(
        out,
        "    N  NAME    TEXT\n    1  a       first\n               second\n  100  abcdef  x\n"
    );
}
