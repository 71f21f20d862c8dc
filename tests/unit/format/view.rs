//! Unit tests of `dump::view` (src/format/view.rs): the words of memory by kind that the verdict,
//! the stderr line and the report share.

use dump::model::{DuplicateModel, Kinds, ModelKind};
use dump::view::*;

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

fn copies(class: &str, copies: u64, bytes_each: u64) -> DuplicateModel {
    DuplicateModel {
        class: class.into(),
        copies,
        bytes_each,
        ..Default::default()
    }
}

#[test]
fn a_model_held_more_than_once_is_named_by_its_copies() {
    let mut k = Kinds::default();
    assert_eq!(
        held_phrase(&k, &copies("Sequential", 4, 16 * GIB)),
        "the Sequential model is held 4 times (4 × 16.00 GiB, identical parameter shapes)"
    );
    assert_eq!(
        held_phrase(&k, &copies("Net", 2, 768 * MIB)),
        "the Net model is held twice (2 × 768.00 MiB, identical parameter shapes)"
    );
    // Copies the walk did not reach may exist.
    k.short_kinds = vec!["parameters".into()];
    k.complete = false;
    assert_eq!(
        held_head(&k, &copies("Net", 3, MIB)),
        "the Net model is held at least 3 times"
    );
    // A class name from a hostile program cannot drive the terminal.
    assert!(!held_phrase(&k, &copies("A\x1b[2J", 2, 1)).contains('\x1b'));
}

#[test]
fn an_earlier_dumps_marks_are_grouped_into_copies() {
    let model = |class: &str, bytes, duplicate_of| ModelKind {
        class: class.into(),
        bytes,
        duplicate_of,
        ..Default::default()
    };
    let k = Kinds {
        models: vec![
            model("A", MIB, None),
            model("B", GIB, None),
            model("A", MIB, Some(0)),
            model("B", GIB, Some(1)),
            model("B", GIB, Some(1)),
            model("C", 1, Some(9)), // an index past the list: no copy of anything
        ],
        ..Default::default()
    };
    let d = duplicates(&k);
    assert_eq!(d.len(), 2, "{d:#?}");
    assert_eq!(
        (d[0].class.as_str(), d[0].copies, d[0].bytes_each),
        ("B", 3, GIB)
    );
    assert_eq!((d[1].class.as_str(), d[1].copies), ("A", 2));
}

#[test]
fn models_and_optimizers_not_listed_are_said() {
    let mut k = Kinds {
        more_models: 24,
        more_models_bytes: 12 * GIB,
        ..Default::default()
    };
    assert_eq!(
        more_phrases(&k),
        ["24 more models not listed: 12.00 GiB of parameters"]
    );
    k.more_models = 1;
    k.more_optimizers = 1;
    k.more_optimizers_bytes = MIB;
    assert_eq!(
        more_phrases(&k),
        [
            "1 more model not listed: 12.00 GiB of parameters",
            "1 more optimizer not listed: 1.00 MiB of state"
        ]
    );
    assert!(more_phrases(&Kinds::default()).is_empty());
}

#[test]
fn a_count_out_of_time_says_which_kinds_it_did_not_finish() {
    let mut k = Kinds::default();
    assert!(k.complete, "a count is complete unless it says otherwise");
    assert_eq!(short_phrase(&k), None);
    k.complete = false;
    k.short_kinds = vec!["optimizer_state".into()];
    assert_eq!(
        short_phrase(&k).unwrap(),
        "counted in part: the time budget ran out before optimizer state was all counted; it may \
         be short, and activations (the rest) long"
    );
    // A dump of an earlier version that only says "not complete": any kind may be short.
    k.short_kinds.clear();
    assert_eq!(short_kinds(&k), COUNTED_KINDS);
    assert!(short_phrase(&k)
        .unwrap()
        .contains("before parameters, gradients and optimizer state were all counted; they"));
}
