//! Memory by kind counted over real PyTorch objects on the CPU: the hook's walk at a failure
//! (shim/python/oomshim_hook/_oomshim_hook/kinds.py) finds real `nn.Module` trees, parameters
//! and storages through the garbage collector, and its totals must equal the program's own count
//! under plain LD_PRELOAD and under `oomshim run`. A machine without a GPU has no CUDA tensor and
//! no CUDA failure: torch's out-of-memory path is tests/real_torch/support/_oomsim.py (torch's
//! observers, then its error), and the program has the walk count the CPU's tensors, which
//! here stand where the failing device's would (`_DEVICE_TYPE`, set only under the shim).
//! Allocator mode needs CUDA: the stand-in torch of tests/torch_kinds.rs covers it.
//!
//! Needs a Python with torch: `OOMSHIM_TEST_TORCH_PYTHON`, else `python3` (a machine without it
//! skips, CI fails).

use crate::common;
use common::torch_python;

use crate::torch_kinds::{flat, printed, OWN_PARAMETERS};
use dump::model::{Dump, Kinds};
use std::path::Path;
use std::process::Command;

const MIB: u64 = 1 << 20;

/// Every program's start: torch's failure path without a GPU, and the walk pointed at the CPU.
const PRELUDE: &str = r#"
import torch
from torch import nn
from _oomsim import fail
try:
    import _oomshim_hook.kinds as _hook_kinds   # only under the shim
    _hook_kinds._DEVICE_TYPE = "cpu"
except ImportError:
    pass
torch.manual_seed(0)
"#;

#[derive(Clone, Copy, Debug, PartialEq)]
enum Launcher {
    Preload,
    Run,
}

/// Runs PRELUDE + `body` under `launcher`; returns its stdout, its stderr, the report of its
/// one dump (every run of whitespace one space) and the dump.
fn run(python: &str, launcher: Launcher, body: &str) -> (String, String, String, Dump) {
    let tmp = tempfile::tempdir().unwrap();
    let program = tmp.path().join("prog.py");
    std::fs::write(&program, format!("{PRELUDE}{OWN_PARAMETERS}{body}")).unwrap();
    let dumps = tmp.path().join("dumps");
    let support = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/real_torch/support");
    let side = common::python_side();
    let mut cmd = match launcher {
        Launcher::Preload => {
            let mut c = Command::new(python);
            c.env("LD_PRELOAD", &side.lib).env("OOMSHIM_DIR", &dumps);
            c
        }
        Launcher::Run => {
            let mut c = Command::new(&side.cli);
            c.arg("run").arg("--dir").arg(&dumps).arg("--").arg(python);
            c.env_remove("LD_PRELOAD");
            c
        }
    };
    cmd.arg(&program)
        .current_dir(tmp.path())
        .env("PYTHONPATH", &support)
        .env("OMP_NUM_THREADS", "1")
        .env_remove("OOMSHIM_TORCH_HOOK")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let out = common::wait_with_watchdog(cmd, std::time::Duration::from_secs(180));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{launcher:?}: {stdout}\n{stderr}");
    assert!(!stderr.contains("python hook"), "{stderr}");
    let found = common::dump_files(&dumps);
    assert_eq!(found.len(), 1, "{launcher:?}: {found:?} {stderr}");
    let report = Command::new(&side.cli)
        .arg("report")
        .arg(&found[0])
        .output()
        .unwrap();
    let report = flat(&String::from_utf8_lossy(&report.stdout));
    let d = dump::read::read_dump(&found[0]).unwrap();
    (stdout, stderr, report, d)
}

fn kinds(d: &Dump) -> &Kinds {
    d.framework
        .as_ref()
        .and_then(|f| f.kinds.as_ref())
        .unwrap_or_else(|| panic!("no kinds: {:#?}", d.framework))
}

#[test]
fn forty_real_models_are_all_counted_and_sixteen_listed() {
    let Some(python) = torch_python() else { return };
    let body = r#"
models = [nn.Sequential(nn.Linear(32 + i, 64), nn.ReLU(), nn.Linear(64, 8)) for i in range(40)]
print("own parameters", own_parameters(models))
try:
    fail(1 << 30)   # loading the data set's first batch
except torch.OutOfMemoryError:
    print("oom")
"#;
    for launcher in [Launcher::Preload, Launcher::Run] {
        let (out, err, report, d) = run(&python, launcher, body);
        let k = kinds(&d);
        let own = printed(&out, "own parameters");
        assert!(own > 0);
        assert_eq!(k.parameters_bytes, own, "{launcher:?} {k:#?}\n{err}");
        assert_eq!(k.models.len(), 16, "{k:#?}");
        assert_eq!(k.more_models, 24, "{k:#?}");
        let listed: u64 = k.models.iter().map(|m| m.bytes).sum();
        assert_eq!(listed + k.more_models_bytes, own);
        assert!(k.complete && k.duplicates.is_empty(), "{k:#?}");
        assert!(report.contains("24 more models"), "{report}");
    }
}

#[test]
fn real_models_loaded_without_any_step_are_counted_and_named_by_the_copies() {
    let Some(python) = torch_python() else { return };
    // Four copies of a 10 MiB model kept, the fifth built layer by layer when its 21st layer's
    // weights do not fit (torch raises from inside the layer's constructor).
    let body = r#"
copies, building = [], []

class Layer(nn.Module):
    def __init__(self):
        super().__init__()
        if len(copies) == 4 and len(building) == 20:
            fail(256 * 256 * 4)
        self.weight = nn.Parameter(torch.randn(256, 256))   # 256 KiB

def load():
    building.clear()
    for _ in range(40):
        building.append(Layer())
    model = nn.Sequential(*building)
    building.clear()
    return model

try:
    for _ in range(8):
        copies.append(load())
except torch.OutOfMemoryError:
    print("own parameters", own_parameters(copies + building))
"#;
    for launcher in [Launcher::Preload, Launcher::Run] {
        let (out, err, report, d) = run(&python, launcher, body);
        let k = kinds(&d);
        assert_eq!(
            k.parameters_bytes,
            printed(&out, "own parameters"),
            "{launcher:?} {k:#?}\n{err}"
        );
        assert_eq!(k.parameters_bytes, (4 * 40 + 20) * 256 * 1024);
        assert_eq!(k.phase.as_deref(), Some("outside"));
        assert_eq!(k.duplicates.len(), 1, "{:#?}", k.duplicates);
        assert_eq!(
            (
                k.duplicates[0].class.as_str(),
                k.duplicates[0].copies,
                k.duplicates[0].bytes_each
            ),
            ("Sequential", 4, 10 * MIB)
        );
        // No device memory is tracked on a machine without a GPU, so the verdict is not about
        // the weights here (tests/torch_kinds.rs checks the headline): the report's account is.
        let words =
            "the Sequential model is held 4 times (4 × 10.00 MiB, identical parameter shapes)";
        assert!(report.contains(words), "{report}");
    }
}

/// A forward pass that fails part of the way through: the dump says how far it came by the
/// model's leaf modules in their registration order (the batch advice scales the activations held
/// to the whole pass by it), and says nothing under activation checkpointing, where what is held
/// is no share of a pass.
#[test]
fn a_forward_that_fails_part_way_says_how_far_it_came() {
    let Some(python) = torch_python() else { return };
    // The same model and failure, called plainly or under activation checkpointing.
    let program = |call: &str| {
        r#"
from torch.utils.checkpoint import checkpoint

class Boom(nn.Module):
    def forward(self, x):
        fail(1 << 30)

def block():
    return nn.Sequential(nn.Linear(8, 8), nn.GELU())

model = nn.Sequential(*[block() for _ in range(3)], nn.Sequential(Boom(), nn.Linear(8, 8)),
                      *[block() for _ in range(2)])
x = torch.randn(4, 8)
try:
    CALL
except torch.OutOfMemoryError:
    print("oom")
"#
        .replace("CALL", call)
    };
    for launcher in [Launcher::Preload, Launcher::Run] {
        let (_, err, _, d) = run(&python, launcher, &program("model(x)"));
        let k = kinds(&d);
        assert_eq!(k.phase.as_deref(), Some("forward"), "{err}");
        assert_eq!(
            k.module.as_ref().and_then(|m| m.path.as_deref()),
            Some("3.0")
        );
        // 3 blocks of 2 leaves before it; 12 leaves in all.
        assert_eq!(
            k.forward_progress,
            Some(dump::model::ForwardProgress {
                leaves_before: 6,
                leaves_in_module: 1,
                leaves: 12,
                // Every leaf's output is 8 wide a sample (a leaf of unknown kind keeps its input's
                // shape); the failing leaf reads 8 and writes 8.
                elements_before: Some(48),
                elements_in_module: Some(8),
                elements: Some(96),
                failing_leaf_io: Some(16),
                largest_leaf_io: Some(16),
                widest_leaf_elements: Some(8),
                last_leaf_elements: Some(8),
            }),
            "{launcher:?} {k:#?}"
        );
    }
    let checkpointed = program("checkpoint(model, x, use_reentrant=False)");
    let (_, err, _, d) = run(&python, Launcher::Preload, &checkpointed);
    let k = kinds(&d);
    assert_eq!(k.phase.as_deref(), Some("forward"), "{err}");
    assert_eq!(k.forward_progress, None, "{k:#?}");
}

/// Where a forward runs inside another frame that is no forward of a module: a loss function
/// that calls the model (HF Trainer's `compute_loss`), an optimizer step that runs the forward in
/// its closure (as Lightning runs every training step), and torch.compile's generated code, which
/// runs the whole graph with no module's forward on the stack. Each is the forward pass of the
/// model, with the batch and (where the modules ran) how far it came; a loss that runs after the
/// model is the loss.
#[test]
fn a_forward_inside_a_loss_function_a_step_closure_or_compiled_code_is_the_forward() {
    let Some(python) = torch_python() else { return };
    let program = |call: &str| {
        r#"
class Boom(nn.Module):
    def forward(self, x):
        fail(1 << 30)

model = nn.Sequential(nn.Linear(8, 8), nn.GELU(), Boom(), nn.Linear(8, 8))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x = torch.randn(4, 8)

def compute_loss(model, x):
    return model(x).sum()

def closure():
    opt.zero_grad()
    loss = compute_loss(model, x)
    loss.backward()
    return loss

try:
    CALL
except torch.OutOfMemoryError:
    print("oom")
"#
        .replace("CALL", call)
    };
    let progress = Some(dump::model::ForwardProgress {
        leaves_before: 2,
        leaves_in_module: 1,
        leaves: 4,
        elements_before: Some(16),
        elements_in_module: Some(8),
        elements: Some(32),
        failing_leaf_io: Some(16),
        largest_leaf_io: Some(16),
        widest_leaf_elements: Some(8),
        last_leaf_elements: Some(8),
    });
    for call in ["compute_loss(model, x)", "opt.step(closure)"] {
        let (_, err, report, d) = run(&python, Launcher::Preload, &program(call));
        let k = kinds(&d);
        assert_eq!(k.phase.as_deref(), Some("forward"), "{call}: {err}");
        assert!(!k.in_loss, "{call}: {k:#?}");
        assert_eq!(k.forward_progress, progress, "{call}: {k:#?}");
        assert_eq!(k.batch, Some(4), "{call}");
        assert!(
            report.contains("phase: forward, module Boom at 2, batch 4"),
            "{call}: {report}"
        );
    }
    // The loss itself failing, after the model ran: in the loss, and no share of a pass.
    let after = r#"
model = nn.Sequential(nn.Linear(8, 8), nn.GELU())
x = torch.randn(4, 8)

def my_loss(out):
    fail(1 << 30)

def compute_loss(model, x):
    return my_loss(model(x))

try:
    compute_loss(model, x)
except torch.OutOfMemoryError:
    print("oom")
"#;
    let (_, err, _, d) = run(&python, Launcher::Preload, after);
    let k = kinds(&d);
    assert!(k.in_loss, "{err} {k:#?}");
    assert_eq!(k.forward_progress, None);

    let compiled = r#"
import os, sys
import _oomsim
sys.path.insert(0, os.path.join(os.path.dirname(_oomsim.__file__), "site-packages"))
import failop
# Inductor's code cache where a user may put it: no `torchinductor_` in its path.
os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.abspath("compiled")

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(8, 8)
        self.b = nn.Linear(8, 8)

    def forward(self, x):
        return self.b(torch.ops.oomshim_test.allocate(self.a(x)))

model = Net()
compiled = torch.compile(model)
x = torch.randn(6, 8)
try:
    compiled(x)  # THE-LINE
except torch.OutOfMemoryError:
    print("oom")
"#;
    for launcher in [Launcher::Preload, Launcher::Run] {
        let (out, err, report, d) = run(&python, launcher, compiled);
        assert!(out.contains("oom"), "{out}\n{err}");
        let k = kinds(&d);
        assert_eq!(k.phase.as_deref(), Some("forward"), "{launcher:?}: {err}");
        assert_eq!(
            k.outer_module.as_ref().map(|m| m.class.as_str()),
            Some("Net"),
            "{k:#?}"
        );
        assert_eq!(k.batch, Some(6), "{k:#?}");
        // The program's line, not the generated module that ran the graph.
        let own = k.program_frame.as_ref().expect("a program frame");
        assert!(own.file.ends_with("prog.py"), "{own:?}");
        let line = compiled
            .lines()
            .position(|l| l.contains("THE-LINE"))
            .unwrap();
        assert!(own.line as usize > line, "{own:?}");
        // (dynamo runs the graph from the model's own forward's frame)
        assert!(
            report.contains("stack Net.forward (prog.py:"),
            "{launcher:?}: {report}"
        );
    }
}

/// The share of a forward pass the batch advice scales a failure's activations by is the hook's
/// estimate of where the pass's memory is: each leaf module weighed by its output's size, read
/// from the modules' attributes without running them. Measured on six real architectures on the
/// CPU (tests/real_torch/share/measure_share.py: what autograd saved by the end of each fifth of
/// the pass, the loss's included) it must stay within 30% under and 15% over the truth: over, the
/// advice says a batch that fails again. Counting every leaf alike, as the hook did before, is
/// 2.5 times over for Llama (its output layer is as wide as its vocabulary) and half the truth for
/// ResNet-50 and ConvNeXt (their first layers hold the largest images): the test must tell.
#[test]
fn the_hooks_share_of_a_forward_pass_is_where_real_models_keep_their_activations() {
    let Some(python) = torch_python() else { return };
    let has = Command::new(&python)
        .args(["-c", "import transformers, timm"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !has {
        common::skip("transformers and timm");
        return;
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = Command::new(&python)
        .arg(root.join("tests/real_torch/share/measure_share.py"))
        .arg(root.join("shim/python/oomshim_hook"))
        .output()
        .unwrap();
    let stdout = common::succeeded(&out);
    let rows: Vec<serde_json::Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    let models: Vec<&str> = rows.iter().filter_map(|r| r["model"].as_str()).collect();
    assert_eq!(
        models,
        ["gpt2", "bert", "llama", "resnet50", "vit", "convnext"],
        "{stdout}"
    );
    let ratios = |r: &serde_json::Value, key: &str| -> Vec<f64> {
        r[key]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_f64().unwrap())
            .collect()
    };
    for r in &rows {
        assert_eq!(r["sized"], true, "{r}");
        for q in ratios(r, "ratios") {
            assert!((0.70..=1.15).contains(&q), "{}: {q} in {r}", r["model"]);
        }
    }
    let outside = |name: &str| {
        let r = rows.iter().find(|r| r["model"] == name).unwrap();
        ratios(r, "leaf_ratios")
            .into_iter()
            .any(|q| !(0.70..=1.15).contains(&q))
    };
    for name in ["llama", "resnet50", "convnext"] {
        assert!(
            outside(name),
            "leaves alike would pass for {name}: {stdout}"
        );
    }
    // Convolutions, pools and their downsampling branches are sized exactly.
    for name in ["resnet50", "convnext"] {
        let r = rows.iter().find(|r| r["model"] == name).unwrap();
        assert!(r["exact"].as_f64().unwrap() > 0.7, "{r}");
    }
}
