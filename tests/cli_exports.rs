//! The CLI links the library crate, which carries the hooks: its dynamic symbol table must not
//! offer them, or every library the CLI loads (and anything it dlopens) would resolve `dlsym`
//! or a CUDA function to the shim's copy inside the CLI.

use crate::common;

use std::process::Command;

fn defined_dynamic_symbols(path: &std::path::Path) -> Vec<String> {
    let out = Command::new("nm")
        .args(["-D", "--defined-only"])
        .arg(path)
        .output()
        .expect("run nm");
    assert!(
        out.status.success(),
        "nm {}: {}",
        path.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().last().map(str::to_string))
        .collect()
}

#[test]
fn the_cli_exports_none_of_the_hooked_functions() {
    // What the shim interposes: every name its library exports (the hooks, by
    // tests/shim.rs's exact list), and the library's own tables of them.
    if !common::require("nm") {
        return;
    }
    let mut hooked: Vec<String> = defined_dynamic_symbols(&common::shim_lib());
    hooked.extend(
        oomshim::ffi::PROGRAM_API_EXPORTS
            .iter()
            .map(|s| s.to_string()),
    );
    hooked.extend(
        oomshim::ffi::driver_exported_names()
            .iter()
            .map(|s| s.to_string()),
    );
    hooked.extend(
        oomshim::ffi::runtime_exported_names()
            .iter()
            .map(|s| s.to_string()),
    );
    hooked.extend(
        oomshim::ffi::TORCH_ALLOCATOR_EXPORTS
            .iter()
            .map(|s| s.to_string()),
    );
    assert!(hooked.iter().any(|n| n == "dlsym") && hooked.iter().any(|n| n == "cudaMalloc"));

    let cli = std::path::Path::new(env!("CARGO_BIN_EXE_oomshim"));
    let exported = defined_dynamic_symbols(cli);
    let leaked: Vec<&String> = exported.iter().filter(|n| hooked.contains(n)).collect();
    assert!(
        leaked.is_empty(),
        "{} exports interposed symbols: {leaked:?}",
        cli.display()
    );
}
