//! `--version` as the binaries print it, checked against git itself.

use crate::process::{Process, STEP};
use std::path::Path;
use std::process::Command;

/// The short hash of HEAD from git, run in this repository, or `unknown` outside a checkout or
/// without git (the build prints that too: buildinfo asks the same git).
pub fn expected_commit() -> String {
    match Command::new("git").args(["rev-parse", "--short", "HEAD"]).current_dir(env!("CARGO_MANIFEST_DIR")).output() {
        Ok(output) if output.status.success() => {
            String::from_utf8(output.stdout).expect("git prints UTF-8").trim().to_string()
        }
        _ => "unknown".to_string(),
    }
}

/// Runs `bin --version` (at most [`STEP`]) and checks it prints `NAME VERSION (git HASH…`: the
/// workspace version, and the hash git gives for HEAD.
pub fn assert_version(bin: &Path, name: &str) {
    let done = Process::start(bin, ["--version"]).finish(STEP);
    done.assert_success();
    let printed = done.stdout.trim();
    let prefix = format!("{name} {} (git ", env!("CARGO_PKG_VERSION"));
    let rest = printed.strip_prefix(&prefix).unwrap_or_else(|| panic!("expected {prefix:?}..., got {printed:?}"));
    // The hash ends at `-dirty`, at the date's comma, or at the closing parenthesis.
    let hash = rest.split(['-', ',', ')']).next().unwrap_or_default();
    assert_eq!(hash, expected_commit(), "the commit in {printed:?}");
}
