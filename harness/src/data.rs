//! The shared IEX captures beside the project (`../shared/data/iex`, read in place, never
//! copied) and the outputs of the independent reference reader kept with them.

use std::path::{Path, PathBuf};
use std::process::Command;

/// `../shared/data/iex` beside the project root; panics saying what is missing otherwise.
pub fn iex_data() -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/data/iex");
    assert!(
        dir.join("README.md").is_file(),
        "missing {}: the tests need the shared IEX captures and reference outputs beside the project \
         root (clone the project next to its `shared` folder, as CI does)",
        dir.display()
    );
    dir
}

/// The reference output `iex_data()/expected/<name>` (e.g. `DEEP10.json`).
pub fn expected(name: &str) -> serde_json::Value {
    crate::report::json_file(&iex_data().join("expected").join(name))
}

/// The independent reference reader's script (Python).
pub fn reference_reader() -> PathBuf {
    iex_data().join("../../tools/iexref.py")
}

/// What the reference reader says about `capture`; panics when it fails.
pub fn reference_output(capture: &Path) -> serde_json::Value {
    let output = Command::new(crate::tools::system_program("python3", "python3"))
        .arg(reference_reader())
        .arg(capture)
        .output()
        .unwrap_or_else(|e| panic!("python3 runs the reference reader: {e}"));
    assert!(
        output.status.success(),
        "the reference reader failed on {}: {}",
        capture.display(),
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).expect("the reference reader prints JSON")
}

/// A publisher configuration for a SIGHUP test: DEEP10 in `format` at 120,000 msg/s over TCP on
/// a port of the publisher's choosing, waiting for one subscriber and lossless
/// (`slow_subscriber = "block"`), with `extra` TOML (whole sections) after it. The test rewrites
/// the file with another format and signals the publisher.
pub fn deep10_tcp_config(format: &str, extra: &str) -> String {
    format!(
        "format = \"{format}\"\n[source]\ncapture = \"{}\"\n[pacing]\nmode = \"rate\"\nrate = 120000\n\
         [tcp]\nlisten = \"127.0.0.1:0\"\nwait_subscribers = 1\nslow_subscriber = \"block\"\n{extra}",
        iex_data().join("DEEP10.pcap.gz").display()
    )
}
