//! Build script: compiles the simulated CUDA runtime (`tests/sim`) and the C test clients
//! (`tests/clients/*.c`) into `$OUT_DIR/sim/`, where `src/cli/testbed.rs` finds and embeds them.

use std::env;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Flags shared by the sim and the clients: optimised, no frame pointers (like the PyTorch wheels
/// the shim must unwind through), full debug info for symbolisation.
const COMMON_FLAGS: &[&str] = &["-O2", "-fomit-frame-pointer", "-g", "-Wall", "-Wextra"];

/// Clients keep every call frame: without this, `return f();` compiles to a jump and the caller
/// vanishes from the stacks the tests assert on.
const CLIENT_FLAGS: &[&str] = &["-fno-optimize-sibling-calls"];

fn main() {
    let root = PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
    let sim_src = root.join("tests/sim");
    let clients_src = root.join("tests/clients");
    let out = PathBuf::from(env::var("OUT_DIR").expect("OUT_DIR")).join("sim");
    fs::create_dir_all(&out).unwrap_or_else(|e| panic!("cannot create {}: {e}", out.display()));

    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=CC");
    println!("cargo:rerun-if-env-changed=CXX");
    println!("cargo:rerun-if-changed={}", sim_src.display());
    println!("cargo:rerun-if-changed={}", clients_src.display());
    for dir in [&sim_src, &clients_src] {
        for file in list_files(dir, None) {
            println!("cargo:rerun-if-changed={}", file.display());
        }
    }

    hide_exports_of_bins(&PathBuf::from(env::var("OUT_DIR").expect("OUT_DIR")));

    let compiler = Compiler::find();

    // The simulated driver: SONAME libcuda.so.1, unversioned cu* exports (as NVIDIA's).
    let mut cmd = compiler.command();
    cmd.args(COMMON_FLAGS)
        .args(["-fPIC", "-shared", "-Wl,-soname,libcuda.so.1"])
        .arg(format!(
            "-Wl,--version-script={}",
            sim_src.join("libcuda.map").display()
        ))
        .arg("-o")
        .arg(out.join("libcuda.so.1"))
        .arg(sim_src.join("cuda_driver_sim.c"))
        .arg("-lpthread");
    compiler.run(cmd, "the simulated libcuda.so.1");

    // A helper library for the dlsym(RTLD_NEXT, …) caller-identity test (drv_static.c).
    let mut cmd = compiler.command();
    cmd.args(COMMON_FLAGS)
        .args(CLIENT_FLAGS) // its dlsym call must not become a tail jump: the caller matters
        .args(["-fPIC", "-shared", "-Wl,-soname,libdrvnext.so"])
        .arg("-o")
        .arg(out.join("libdrvnext.so"))
        .arg(sim_src.join("drv_next_helper.c"))
        .arg("-ldl");
    compiler.run(cmd, "the helper libdrvnext.so");

    // The simulated runtime: SONAME libcudart.so.13, every cuda* symbol versioned by the map.
    // It dlopens libcuda.so.1 from its own directory ($ORIGIN), as the real one finds the driver.
    let lib = out.join("libcudart.so.13");
    let mut cmd = compiler.command();
    cmd.args(COMMON_FLAGS)
        .args(["-fPIC", "-shared", "-Wl,-soname,libcudart.so.13"])
        .arg(format!(
            "-Wl,--version-script={}",
            sim_src.join("libcudart.map").display()
        ))
        .arg("-Wl,-rpath,$ORIGIN")
        .arg("-o")
        .arg(&lib)
        .arg(sim_src.join("cudart_sim.c"))
        .args(["-ldl", "-lpthread"]);
    compiler.run(cmd, "the simulated libcudart.so.13");

    // The simulated NCCL: SONAME libnccl.so.2, allocating through the sim's runtime and driver
    // by the PLT, found next to them through $ORIGIN (tests/clients/rank_worker.c uses it).
    let mut cmd = compiler.command();
    cmd.args(COMMON_FLAGS)
        .args(CLIENT_FLAGS)
        .args(["-fPIC", "-shared", "-Wl,-soname,libnccl.so.2"])
        .arg("-Wl,-rpath,$ORIGIN")
        .arg("-o")
        .arg(out.join("libnccl.so.2"))
        .arg(sim_src.join("nccl_sim.c"))
        .arg("-L")
        .arg(&out)
        .args(["-l:libcudart.so.13", "-l:libcuda.so.1"]);
    compiler.run(cmd, "the simulated libnccl.so.2");

    // Clients: linked against the sim by its SONAME, found next to them through $ORIGIN.
    // C++ clients (`*.cpp`): the ones that must catch a C++ exception, as torch does.
    let cxx = Compiler::find_cxx();
    // A C++ library that catches the allocator's exception, loaded RTLD_LOCAL by a C client.
    let mut cmd = cxx.command();
    cmd.args(COMMON_FLAGS)
        .args(["-fPIC", "-shared", "-Wl,-soname,libcxxcatch.so"])
        .arg("-o")
        .arg(out.join("libcxxcatch.so"))
        .arg(sim_src.join("cxx_catcher.cpp"))
        .arg("-ldl");
    cxx.run(cmd, "the helper libcxxcatch.so");
    let mut clients: Vec<(PathBuf, &Compiler)> = list_files(&clients_src, Some("c"))
        .into_iter()
        .map(|p| (p, &compiler))
        .collect();
    clients.extend(
        list_files(&clients_src, Some("cpp"))
            .into_iter()
            .map(|p| (p, &cxx)),
    );
    if clients.is_empty() {
        panic!("no test clients found in {}", clients_src.display());
    }
    for (src, compiler) in clients {
        let name = src
            .file_stem()
            .and_then(|s| s.to_str())
            .expect("client file name")
            .to_owned();
        let mut cmd = compiler.command();
        cmd.args(COMMON_FLAGS)
            .args(CLIENT_FLAGS)
            .arg("-I")
            .arg(&sim_src)
            .arg("-o")
            .arg(out.join(&name))
            .arg(&src)
            .arg("-L")
            .arg(&out)
            // --as-needed: a client that names no CUDA function (no_runtime.c) gets no runtime.
            .arg("-Wl,--as-needed")
            .arg("-l:libcudart.so.13")
            // The driver, the helper and the NCCL sim only where a client names them
            // (tests/clients/drv_*.c, rank_worker.c).
            .arg("-l:libcuda.so.1")
            .arg("-l:libdrvnext.so")
            .arg("-l:libnccl.so.2")
            .arg("-Wl,--no-as-needed")
            .arg("-Wl,-rpath,$ORIGIN")
            .args(["-ldl", "-lpthread"]);
        compiler.run(cmd, &format!("test client {name}"));
    }
}

/// Regular files directly in `dir` (optionally with extension `ext`), sorted.
fn list_files(dir: &Path, ext: Option<&str>) -> Vec<PathBuf> {
    let entries =
        fs::read_dir(dir).unwrap_or_else(|e| panic!("cannot read {}: {e}", dir.display()));
    let mut files: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_file())
        .filter(|p| ext.is_none_or(|x| p.extension().and_then(|e| e.to_str()) == Some(x)))
        .collect();
    files.sort();
    files
}

struct Compiler {
    tool: cc::Tool,
}

impl Compiler {
    fn find() -> Self {
        let tool = cc::Build::new()
            .cargo_metadata(false)
            .try_get_compiler()
            .unwrap_or_else(|e| {
                panic!(
                    "oomshim's build needs a C compiler for the simulated CUDA runtime and the \
                     test clients (tests/sim, tests/clients), and none was found: {e}. Install \
                     gcc or clang, or point CC at one."
                )
            });
        Compiler { tool }
    }

    fn find_cxx() -> Self {
        let tool = cc::Build::new()
            .cpp(true)
            .cargo_metadata(false)
            .try_get_compiler()
            .unwrap_or_else(|e| {
                panic!(
                    "oomshim's build needs a C++ compiler for the C++ test clients \
                     (tests/clients/*.cpp), and none was found: {e}. Install g++ or clang++, or \
                     point CXX at one."
                )
            });
        Compiler { tool }
    }

    /// The bare compiler with its environment, without cc's default flags: the artifacts'
    /// flags are fixed here, whatever the cargo profile.
    fn command(&self) -> Command {
        let mut cmd = Command::new(self.tool.path());
        for (k, v) in self.tool.get_envs() {
            cmd.env(k, v);
        }
        cmd
    }

    fn run(&self, mut cmd: Command, what: &str) {
        let output = cmd.output().unwrap_or_else(|e| {
            panic!(
                "oomshim's build needs a C compiler to build {what}, but `{}` could not be run: \
                 {e}. Install gcc or clang, or point CC at one.",
                self.tool.path().display()
            )
        });
        if !output.status.success() {
            panic!(
                "building {what} failed ({}):\n{:?}\n{}{}",
                output.status,
                cmd,
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            );
        }
        // Warnings are the sim's and clients' bugs: show them in cargo's output.
        for line in String::from_utf8_lossy(&output.stderr).lines() {
            println!("cargo:warning={what}: {line}");
        }
    }
}

/// The CLI links the library crate, hooks and all, and an executable exports its `#[no_mangle]`
/// functions: the CLI would offer its own `dlsym` to every library it loads. A version script that
/// makes every symbol local keeps the binaries' dynamic symbol table free of them (tests/cli_exports.rs).
fn hide_exports_of_bins(out_dir: &Path) {
    let script = out_dir.join("bins.ver");
    fs::write(&script, "{ local: *; };\n")
        .unwrap_or_else(|e| panic!("cannot write {}: {e}", script.display()));
    println!(
        "cargo:rustc-link-arg-bins=-Wl,--version-script={}",
        script.display()
    );
}
