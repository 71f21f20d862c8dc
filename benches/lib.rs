//! Nothing: the package holds only the benches beside this file (Cargo.toml).
