//! Helpers shared by the integration tests: the `../shared` data beside the project root.
#![allow(dead_code)]

use std::path::PathBuf;

/// `../shared/data/iex` beside the project root. Panics with what to do when it is missing:
/// these tests compare against the independent reference outputs kept there.
pub fn iex_data() -> PathBuf {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let dir = root.join("../shared/data/iex");
    assert!(
        dir.join("README.md").is_file(),
        "missing {}: the tests need the shared IEX captures and reference outputs beside the project \
         root (clone the project next to its `shared` folder, as CI does)",
        dir.display()
    );
    dir
}

/// The reference reader's script.
pub fn reference_reader() -> PathBuf {
    iex_data().join("../../tools/iexref.py")
}

/// The reference JSON for a capture in `iex_data()`.
pub fn expected(name: &str) -> serde_json::Value {
    let path = iex_data().join("expected").join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap()
}

/// Asserts that `ours` carries every field of the reference output with the same value, and that
/// counters the reference leaves out (it omits zero counts) are zero in ours.
pub fn assert_matches_reference(ours: &serde_json::Value, reference: &serde_json::Value) {
    let ours = ours.as_object().expect("report is an object");
    let reference = reference.as_object().expect("reference is an object");
    for (key, value) in reference {
        if key == "file" {
            continue;
        }
        assert_eq!(ours.get(key), Some(value), "field {key} differs from the reference");
    }
    for key in ["packets", "segments", "heartbeats", "messages", "truncated_records", "non_iex_packets"] {
        if !reference.contains_key(key) {
            assert_eq!(ours.get(key), Some(&serde_json::json!(0)), "reference omits {key}, so it must be 0");
        }
    }
}
