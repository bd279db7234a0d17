//! The shared IEX captures and their reference outputs, for the core's own tests: found beside
//! the project root as CI places them. The test harness has the same helpers for the tests of
//! every crate above this one; the core does not depend on it, so that its layers point one way.

use std::path::{Path, PathBuf};

/// The folder of the shared IEX captures (`../shared/data/iex` beside the project root).
pub(crate) fn iex_data() -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/data/iex");
    assert!(dir.join("README.md").is_file(), "missing {}: clone the project beside its `shared` folder", dir.display());
    dir
}

/// The reference output `expected/<name>` (e.g. `DEEP10.json`) of the independent reader.
pub(crate) fn expected(name: &str) -> serde_json::Value {
    let path = iex_data().join("expected").join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}
