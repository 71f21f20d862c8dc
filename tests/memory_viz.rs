//! `oomshim export`: the memory_viz pickle read back by a faithful model of PyTorch's viewer
//! (tests/memory_viz_check.py: the opcodes its JavaScript unpickler knows, 53-bit integers, the
//! block tiling `segsum` asserts, a replay of the trace as the Allocator State History does),
//! for an LD_PRELOAD dump, VMM addresses with bit 63 set and a real allocator-mode dump; and
//! folded stacks. torch's own viewer code runs on the GPU machine (tests/gpu/check_memory_viz.py).

use crate::common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

fn export(dump: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_oomshim"))
        .arg("export")
        .arg(dump)
        .args(args)
        .output()
        .unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// The viewer model's verdict on `pickle`: its counts, or None without python3.
fn viewer_check(pickle: &Path) -> Option<serde_json::Value> {
    let checker = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/memory_viz_check.py");
    let out = match Command::new("python3").arg(checker).arg(pickle).output() {
        Ok(o) => o,
        Err(_) => {
            common::skip("python3");
            return None;
        }
    };
    assert!(out.status.success(), "{}", text(&out.stderr));
    Some(serde_json::from_slice(&out.stdout).unwrap())
}

#[test]
fn an_ld_preload_dump_exports_every_tracked_byte_with_a_warning_for_the_rest() {
    let t = tempfile::tempdir().unwrap();
    let pk = t.path().join("snap.pickle");
    let out = export(
        &fixture("oom_own_allocations.json"),
        &["--memory-viz", pk.to_str().unwrap()],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let err = text(&out.stderr);
    assert!(
        err.contains("warning: device 0: the dump lists 7 of 2,046 allocations (104.50 GiB of 128.50 GiB); the other 24.00 GiB"),
        "{err}"
    );
    let Some(v) = viewer_check(&pk) else { return };
    assert_eq!(v["segments"], 8, "7 holders and one remainder");
    assert_eq!(
        v["events"],
        7 * 2 + 1,
        "segment_alloc + alloc per holder, then the oom"
    );
}

#[test]
fn vmm_addresses_with_bit_63_become_addresses_the_viewer_can_hold() {
    let t = tempfile::tempdir().unwrap();
    let mut dump: serde_json::Value =
        serde_json::from_slice(&std::fs::read(fixture("oom_own_allocations.json")).unwrap())
            .unwrap();
    for (i, h) in dump["largest_holders"]
        .as_array_mut()
        .unwrap()
        .iter_mut()
        .enumerate()
    {
        h["address"] = format!("{:#x}", (1u64 << 63) | ((i as u64 + 1) << 32)).into();
        h["api"] = "cuMemCreate".into();
    }
    let path = t.path().join("vmm.json");
    std::fs::write(&path, serde_json::to_vec(&dump).unwrap()).unwrap();
    let pk = t.path().join("vmm.pickle");
    let out = export(&path, &["--memory-viz", pk.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let Some(v) = viewer_check(&pk) else { return };
    assert!(v["max_address"].as_u64().unwrap() < 1 << 53);
    // The real address is kept beside the synthetic one.
    let raw = std::fs::read(&pk).unwrap();
    let real = format!("{:#x}", (1u64 << 63) | (1 << 32));
    assert!(
        raw.windows(real.len()).any(|w| w == real.as_bytes()),
        "{real} kept"
    );
}

#[test]
fn an_allocator_mode_dump_exports_the_real_segments_and_free_blocks() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    let cap = (6 * GIB + 256 * MIB).to_string();
    let lib = common::shim_lib();
    let out = common::run_client(
        "torch_alloc_client",
        &[lib.to_str().unwrap(), "fragmentation", "6"],
        &[("OOMSHIM_DIR", d), ("SIMCUDA_CAPACITY", &cap)],
        false,
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let dumps: Vec<PathBuf> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    assert_eq!(dumps.len(), 1);
    // The dump carries the allocator's segments: six 1 GiB segments, each split by a 600 MiB
    // tensor with 424 MiB free behind it.
    let dump = dump::read::read_dump(&dumps[0]).unwrap();
    let map = &dump.free_blocks.segment_map;
    assert_eq!(map.len(), 6);
    for seg in map {
        assert_eq!(seg.bytes, GIB);
        let blocks: Vec<(u64, &str)> = seg
            .blocks
            .iter()
            .map(|b| (b.bytes, b.state.as_str()))
            .collect();
        assert_eq!(
            blocks,
            [(600 * MIB, "active_allocated"), (424 * MIB, "inactive")]
        );
    }
    let pk = dir.path().join("alloc.pickle");
    let out = export(&dumps[0], &["--memory-viz", pk.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        !text(&out.stderr).contains("warning"),
        "{}",
        text(&out.stderr)
    );
    let Some(v) = viewer_check(&pk) else { return };
    assert_eq!(v["segments"], 6, "the real segments, not one per tensor");
    assert_eq!(v["blocks"], 12, "the free blocks are there");
    assert_eq!(v["events"], 6 * 2 + 1);
}

#[test]
fn folded_stacks_go_to_stdout_for_flamegraph_tools() {
    let out = export(&fixture("oom_own_allocations.json"), &["--folded", "-"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    let total: u64 = stdout
        .lines()
        .map(|l| l.rsplit_once(' ').unwrap().1.parse::<u64>().unwrap())
        .sum();
    assert_eq!(total, 128 * GIB + 512 * MIB, "every tracked byte");
    assert!(stdout
        .lines()
        .next()
        .unwrap()
        .starts_with("main (/home/ada/proj/train.py:120);train_step"));
    // The fixture's sites cover every tracked byte: nothing to warn about, stdout only.
    assert!(out.stderr.is_empty(), "{}", text(&out.stderr));
    // Neither output: a usage error, exit 2, nothing written.
    let out = Command::new(env!("CARGO_BIN_EXE_oomshim"))
        .arg("export")
        .arg(fixture("oom_own_allocations.json"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
}
