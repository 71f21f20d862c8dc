//! `oomshim merge --html OUT`: the merge as one self-contained page, rendered here (no script):
//! why this rank first, then the ranks side by side by kind (a kind far above its median
//! marked), the table of dumps, the balance findings and what could not be read. Every text
//! from a dump is escaped.

use super::merge::{Merged, RankKinds};
use super::why_rank::{median, EDGE_ACTIVATIONS_FACTOR};
use dump::units::{clean, human_bytes};
use std::fmt::Write as _;

/// `&`, `<`, `>`, `"` and `'` as entities.
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in clean(s).chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

const STYLE: &str = "body{font:14px/1.45 system-ui,sans-serif;margin:2em;color:#222}\
h1{font-size:1.4em}h2{font-size:1.1em;margin-top:1.6em}\
table{border-collapse:collapse}td,th{padding:2px 10px;border-bottom:1px solid #ddd;text-align:right}\
td:first-child,th:first-child,td.t,th.t{text-align:left}\
td.far{background:#fde2c8;font-weight:600}tr.median td{color:#666;font-style:italic}\
ul.why li{margin:.3em 0}li.no{color:#777}";

/// The page.
pub fn merge_page(m: &Merged) -> String {
    let mut p = String::new();
    p.push_str(
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
         <meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'\">\n\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n\
         <title>oomshim merge</title>\n<style>",
    );
    p.push_str(STYLE);
    let _ = write!(
        p,
        "</style>\n</head>\n<body>\n<h1>oomshim merge: {} dumps</h1>\n",
        m.rows.len()
    );
    if !m.why.is_empty() {
        p.push_str("<section id=\"why\"><h2>Why this rank</h2>\n<ul class=\"why\">\n");
        let mut applying = m.why.iter().filter(|w| w.applies).peekable();
        if applying.peek().is_none() {
            p.push_str("<li>No known structural cause applies.</li>\n");
        }
        for w in applying {
            let _ = writeln!(p, "<li data-rule=\"{}\">{}</li>", w.rule, escape(&w.text));
        }
        for w in m.why.iter().filter(|w| !w.applies) {
            let _ = writeln!(
                p,
                "<li class=\"no\" data-rule=\"{}\">{}: does not apply: {}</li>",
                w.rule,
                w.rule,
                escape(&w.text)
            );
        }
        p.push_str("</ul></section>\n");
    }
    by_kind(&mut p, m);
    p.push_str("<section id=\"dumps\"><h2>Dumps</h2>\n<table>\n<tr><th>rank</th><th class=\"t\">host</th><th>pid</th><th>device</th><th class=\"t\">reason</th><th>tracked</th><th>peak</th><th>free</th><th>total</th><th class=\"t\">verdict</th><th class=\"t\">retry</th></tr>\n");
    let opt = |b: Option<u64>| b.map(human_bytes).unwrap_or_else(|| "-".into());
    for r in &m.rows {
        let _ = writeln!(
            p,
            "<tr><td>{}</td><td class=\"t\">{}</td><td>{}</td><td>{}</td><td class=\"t\">{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td class=\"t\">{}</td><td class=\"t\">{}</td></tr>",
            r.rank.map_or("-".into(), |x| x.to_string()),
            escape(&r.host),
            r.pid,
            r.device.map_or("-".into(), |x| x.to_string()),
            escape(&r.reason),
            human_bytes(r.tracked_bytes),
            human_bytes(r.peak_tracked_bytes),
            opt(r.free_bytes),
            opt(r.total_bytes),
            escape(&r.verdict),
            escape(r.retry.as_deref().unwrap_or("-")),
        );
    }
    p.push_str("</table></section>\n");
    if !m.findings.is_empty() {
        p.push_str("<section id=\"balance\"><h2>Balance</h2>\n<ul>\n");
        for f in &m.findings {
            let _ = writeln!(p, "<li>{}</li>", escape(f));
        }
        p.push_str("</ul></section>\n");
    }
    if !m.problems.is_empty() {
        p.push_str("<section id=\"problems\"><h2>Not read</h2>\n<ul>\n");
        for f in &m.problems {
            let _ = writeln!(p, "<li>{}</li>", escape(f));
        }
        p.push_str("</ul></section>\n");
    }
    p.push_str("</body>\n</html>\n");
    p
}

/// The ranks side by side by kind, with the median, and each amount at or above
/// [`EDGE_ACTIVATIONS_FACTOR`]× its kind's median marked.
fn by_kind(p: &mut String, m: &Merged) {
    let rows: Vec<_> = m.rows.iter().filter(|r| r.kinds.is_some()).collect();
    if rows.is_empty() {
        return;
    }
    type KindOf = fn(&RankKinds) -> Option<u64>;
    let kinds: [(&str, KindOf); 4] = [
        ("parameters", |k| Some(k.parameters_bytes)),
        ("gradients", |k| Some(k.gradients_bytes)),
        ("optimizer state", |k| Some(k.optimizer_state_bytes)),
        ("activations", |k| k.activations_bytes),
    ];
    let medians: Vec<u64> = kinds
        .iter()
        .map(|(_, f)| median(rows.iter().filter_map(|r| f(r.kinds.as_ref()?)).collect()))
        .collect();
    p.push_str("<section id=\"by-kind\"><h2>By kind</h2>\n<table>\n<tr><th>rank</th><th class=\"t\">host</th><th>pid</th>");
    for (name, _) in &kinds {
        let _ = write!(p, "<th>{name}</th>");
    }
    p.push_str("</tr>\n");
    for r in &rows {
        let k = r.kinds.as_ref().expect("filtered");
        let _ = write!(
            p,
            "<tr><td>{}</td><td class=\"t\">{}</td><td>{}</td>",
            r.rank.map_or("-".into(), |x| x.to_string()),
            escape(&r.host),
            r.pid
        );
        for ((_, f), med) in kinds.iter().zip(&medians) {
            match f(k) {
                Some(b) => {
                    let far = rows.len() > 1
                        && *med > 0
                        && b as f64 >= EDGE_ACTIVATIONS_FACTOR * *med as f64;
                    if far {
                        let _ = write!(
                            p,
                            "<td class=\"far\">{} ({:.1}×)</td>",
                            human_bytes(b),
                            b as f64 / *med as f64
                        );
                    } else {
                        let _ = write!(p, "<td>{}</td>", human_bytes(b));
                    }
                }
                None => p.push_str("<td>-</td>"),
            }
        }
        p.push_str("</tr>\n");
    }
    if rows.len() > 1 {
        p.push_str("<tr class=\"median\"><td></td><td class=\"t\">median</td><td></td>");
        for med in &medians {
            let _ = write!(p, "<td>{}</td>", human_bytes(*med));
        }
        p.push_str("</tr>\n");
    }
    p.push_str("</table></section>\n");
}
