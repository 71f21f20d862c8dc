//! [`OWN_ALLOCATIONS`](super::OWN_ALLOCATIONS): the residual account, and which line to name
//! after the largest holder. Its sentences are in `words/own_allocations.rs`.

use super::context::Ctx;
use super::found::{Framework, NextHolder, OwnAllocations};
use super::sites::Line;
use dump::api;
use dump::model::{Dump, FailedRequest, FrameKind};
use dump::view::{free_blocks_available, is_cuda_api_frame, is_library_python_frame, named_frames};

/// This process's tracked allocations are most of the memory in use and no more specific account
/// of them (leak, fragmentation, framework cache) holds; or no other finding holds at all.
pub(super) fn holds(mostly_untracked: bool, specific: bool, found_any: bool) -> bool {
    (!mostly_untracked && !specific) || !found_any
}

/// What the finding names besides the numbers: the failing line, the lines that alone hold the
/// request, XLA's pool, and whether fragmentation can only be hinted at.
pub(super) fn find<'a>(c: &Ctx<'a>) -> OwnAllocations<'a> {
    let (dump, request) = (c.dump, c.request);
    let failing_line = failing_line(dump, request);
    let largest = c.top.as_ref().and_then(|t| t.line);
    let fw = c.readings.framework;
    OwnAllocations {
        failing_line,
        // A request whose stack holds only torch's own Python code (a thread of the
        // framework's, not the program's) is named at the program's line the hook found
        // instead: the line that called the backward pass, say, rather than a frame inside
        // torch.
        failing_inside_framework: matches!(failing_line, Some(Line::Frame(f)) if is_library_python_frame(f)),
        next_holder: next_holder(dump, request.bytes, largest, failing_line),
        // Any line but the failing one, the largest holder included: when the headline does
        // not name it as the largest holder, it may still hold the request's size alone.
        room: next_holder(dump, request.bytes, None, failing_line),
        xla_refused: request.api == api::FRAMEWORK_ALLOCATOR
            && dump.framework.as_ref().is_some_and(|f| f.name == "xla"),
        xla_pool: fw == Framework::Jax && request.api == api::FRAMEWORK_ALLOCATOR,
        fragmentation_unseen: fw == Framework::Torch
            && !free_blocks_available(dump)
            && !c.readings.expandable_segments,
    }
}

/// The line of the failing call, when the finding names it: the program's line, not a frame of
/// the CUDA API; in a Python program only a Python line (a backward thread's native frames name
/// the framework's internals).
fn failing_line<'a>(dump: &Dump, request: &'a FailedRequest) -> Option<Line<'a>> {
    let frame = named_frames(&request.stack).next()?;
    let python_program = dump.recording.python.is_some();
    ((!python_program || frame.kind == FrameKind::Python) && !is_cuda_api_frame(frame))
        .then_some(Line::Frame(frame))
}

/// The line holding the most after the largest holder, when it alone holds at least the request
/// (freeing it would have made room): with the weights as the largest holder, this is usually
/// the activations or caches the program grew, the line a user can change. Sites are summed by
/// the line they are ([`Line`]); the largest holder's line and the failing line are not
/// repeated, and memory allocated without Python frames is no such line (autograd's buffers in
/// a backward pass: no line of the program frees them).
fn next_holder<'a>(
    dump: &'a Dump,
    request: u64,
    largest: Option<Line<'_>>,
    failing: Option<Line<'_>>,
) -> Option<NextHolder<'a>> {
    if request == 0 {
        return None;
    }
    let python_program = dump.recording.python.is_some();
    let mut by_line: Vec<NextHolder<'a>> = Vec::new();
    for s in &dump.sites {
        let Some(line @ Line::Frame(_)) = Line::of_site(s, python_program) else {
            continue;
        };
        match by_line.iter_mut().find(|h| h.line == line) {
            Some(h) => {
                h.bytes = h.bytes.saturating_add(s.bytes);
                h.count = h.count.saturating_add(s.count);
            }
            None => by_line.push(NextHolder {
                line,
                bytes: s.bytes,
                count: s.count,
            }),
        }
    }
    by_line
        .into_iter()
        .filter(|h| Some(h.line) != largest && Some(h.line) != failing)
        .filter(|h| h.bytes >= request)
        .max_by_key(|h| h.bytes)
}

#[cfg(test)]
mod tests {
    use crate::verdict::judge;
    use crate::verdict::tests::{frame, oom_dump, GIB, MIB};
    use dump::model::*;

    /// A Python program's dump: 100 GiB of weights loaded at `_zoo.py:12`, the forward pass at
    /// `train.py:34` holding `forward` bytes in two sites, 200 MiB from backward threads, and a
    /// 516 MiB request that failed on a backward thread (no Python frames).
    fn weights_then_forward(forward: [u64; 2]) -> Dump {
        let py = |function: &str, file: &str, line: u32| Frame {
            kind: FrameKind::Python,
            ..frame(Some(function), Some(file), Some(line))
        };
        let weights = vec![
            py("load_weights", "/w/_zoo.py", 12),
            py("<module>", "/w/train.py", 30),
        ];
        let forward_stack = |inner: u32| {
            vec![
                py(
                    "forward",
                    "/site-packages/torch/nn/modules/linear.py",
                    inner,
                ),
                py("<module>", "/w/train.py", 34),
            ]
        };
        let mut d = oom_dump(516 * MIB, Some(140 * GIB), Some(400 * MIB), 139 * GIB);
        d.recording.python = Some("all".into());
        d.failed_request.as_mut().unwrap().stack = vec![];
        d.sites = vec![
            Site {
                bytes: 100 * GIB,
                count: 1,
                stack: weights,
            },
            Site {
                bytes: forward[0],
                count: 3,
                stack: forward_stack(125),
            },
            Site {
                bytes: 200 * MIB,
                count: 9,
                stack: vec![],
            },
            Site {
                bytes: forward[1],
                count: 2,
                stack: forward_stack(130),
            },
        ];
        d
    }

    /// The top finding's kind and headline (the stderr summary's first line).
    fn headline(dump: &Dump) -> (String, String) {
        let v = judge(dump);
        let top = v.findings.first().expect("a finding");
        (top.kind.clone(), top.headline.clone())
    }

    #[test]
    fn own_allocations_names_the_next_holder_that_alone_would_make_room() {
        let v = headline(&weights_then_forward([400 * MIB, 300 * MIB]));
        assert_eq!(v.0, "own_allocations", "{}", v.1);
        assert!(
            v.1.contains("largest: 100.00 GiB at load_weights (_zoo.py:12)"),
            "{}",
            v.1
        );
        // The two forward sites are one line: 700 MiB in 5 allocations, more than the request.
        assert!(v.1.contains("next: 700.00 MiB (×5) at"), "{}", v.1);
        assert!(v.1.contains("train.py:34"), "{}", v.1);
        // The request had no Python frame: no failing line is invented.
        assert!(!v.1.contains("request at"), "{}", v.1);
    }

    #[test]
    fn own_allocations_does_not_name_a_next_holder_too_small_to_make_room() {
        let v = headline(&weights_then_forward([200 * MIB, 100 * MIB]));
        assert_eq!(v.0, "own_allocations", "{}", v.1);
        assert!(!v.1.contains("next:"), "{}", v.1);
    }

    #[test]
    fn own_allocations_names_the_failing_python_line_once() {
        let mut d = weights_then_forward([400 * MIB, 300 * MIB]);
        d.failed_request.as_mut().unwrap().stack = d.sites[1].stack.clone();
        let v = headline(&d);
        assert!(v.1.contains("the 516.00 MiB request at"), "{}", v.1);
        // The failing line is the forward line: it is not repeated as the next holder.
        assert!(!v.1.contains("next:"), "{}", v.1);
    }

    /// Sites are summed by the line they are, not by how a label shortens it: two scripts of one
    /// base name are two lines, neither of which alone would have made room.
    #[test]
    fn own_allocations_does_not_sum_two_files_that_share_a_label() {
        let mut d = weights_then_forward([400 * MIB, 300 * MIB]);
        for (i, dir) in [(1, "/w/a"), (3, "/w/b")] {
            d.sites[i].stack[1].file = Some(format!("{dir}/train.py"));
        }
        let v = headline(&d);
        assert_eq!(v.0, "own_allocations", "{}", v.1);
        assert!(!v.1.contains("next:"), "{}", v.1);
    }

    /// A batch finder under allocator mode, as the H200 showed it: the input (line 10) and the
    /// output (line 11) hold 32 GiB each, the failing line (12, `out.float()`) 64 GiB, and the
    /// 32 GiB request of the backward pass fails. No line holds half of the activations, and the
    /// one holding the most is the failing line: the headline still names a line whose tensors
    /// alone are as large as the request.
    #[test]
    fn the_kinds_headline_names_a_line_holding_the_request_when_no_largest_holder_is_named() {
        let py = |line: u32| {
            vec![Frame {
                kind: FrameKind::Python,
                ..frame(Some("<module>"), Some("/w/batch_finder.py"), Some(line))
            }]
        };
        let mut d = oom_dump(32 * GIB, Some(140 * GIB), Some(11 * GIB), 128 * GIB);
        d.recording.python = Some("all".into());
        d.failed_request.as_mut().unwrap().stack = py(12);
        d.sites = vec![
            Site {
                bytes: 64 * GIB,
                count: 1,
                stack: py(12),
            },
            Site {
                bytes: 32 * GIB,
                count: 1,
                stack: py(10),
            },
            Site {
                bytes: 32 * GIB,
                count: 1,
                stack: py(11),
            },
        ];
        d.framework = Some(FrameworkOom {
            kinds: Some(Kinds {
                parameters_bytes: 128 * MIB,
                activations_bytes: Some(128 * GIB),
                phase: Some("backward".into()),
                ..Default::default()
            }),
            ..Default::default()
        });
        let v = headline(&d);
        assert_eq!(v.0, "own_allocations", "{}", v.1);
        assert!(
            v.1.starts_with("activations and other live tensors fill"),
            "{}",
            v.1
        );
        // Lines 10 and 11 hold as much: either is named.
        assert!(
            [10, 11].iter().any(|l| v.1.contains(&format!(
                "32.00 GiB at <module> (batch_finder.py:{l}) alone holds as much as the 32.00 GiB request"
            ))),
            "{}",
            v.1
        );
        assert!(
            v.1.contains("request at <module> (batch_finder.py:12) failed"),
            "{}",
            v.1
        );

        // As it failed on the H200 under allocator mode: the request on autograd's thread (no
        // Python frames) and the mean's 64 GiB gradient made there. That gradient is no line a
        // user can free: lines 10 and 11 are still the ones named.
        let mut backward = d.clone();
        backward.failed_request.as_mut().unwrap().stack = Vec::new();
        backward.sites[0].stack = Vec::new();
        // 128.03 GiB of activations there: the gradient holds less than half, so it is not
        // named as the largest holder.
        let k = backward.framework.as_mut().unwrap().kinds.as_mut().unwrap();
        k.activations_bytes = Some(128 * GIB + 32 * MIB);
        let v = headline(&backward);
        assert!(
            [10, 11].iter().any(|l| v.1.contains(&format!(
                "32.00 GiB at <module> (batch_finder.py:{l}) alone holds as much as the 32.00 GiB request"
            ))),
            "{}",
            v.1
        );

        // Parameters dominating: no line is named for the request's size (the weights are
        // named by the kinds' own words).
        let k = d.framework.as_mut().unwrap().kinds.as_mut().unwrap();
        k.parameters_bytes = 200 * GIB;
        let v = headline(&d);
        assert!(!v.1.contains("alone holds"), "{}", v.1);
    }

    /// float32 weights under autocast (accelerate's and Lightning's mixed precision keep them so):
    /// the activations are already bf16, and autocast is no advice; without it, it is.
    #[test]
    fn autocast_is_advised_only_to_a_program_not_under_it() {
        let mut d = oom_dump(8 * GIB, Some(80 * GIB), Some(GIB), 70 * GIB);
        let model = ModelKind {
            class: "Net".into(),
            bytes: GIB,
            dtypes: [("float32".to_string(), GIB)].into_iter().collect(),
            training: true,
            ..Default::default()
        };
        d.framework = Some(FrameworkOom {
            kinds: Some(Kinds {
                parameters_bytes: GIB,
                activations_bytes: Some(60 * GIB),
                phase: Some("forward".into()),
                models: vec![model],
                complete: true,
                ..Default::default()
            }),
            ..Default::default()
        });
        let advice = |d: &Dump| judge(d).suggestions.join("\n");
        assert!(
            advice(&d).contains("The weights are float32"),
            "{}",
            advice(&d)
        );
        d.framework
            .as_mut()
            .unwrap()
            .kinds
            .as_mut()
            .unwrap()
            .autocast = true;
        assert!(
            !advice(&d).contains("The weights are float32"),
            "{}",
            advice(&d)
        );
    }

    #[test]
    fn fragmentation_is_only_a_possibility_when_free_blocks_unavailable() {
        let v = judge(&oom_dump(2 * GIB, Some(80 * GIB), Some(GIB), 78 * GIB));
        assert!(!v.suggestions.join(" ").contains("fragmentation"), "{v:#?}");
    }
}
