//! `mdrelay-bench --version`: the workspace version and the git commit built, as git itself says.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

/// The short hash of HEAD from git, run in the repository, or `unknown` outside a checkout (a
/// build from a source tarball prints that too).
fn expected_commit() -> String {
    let output = Command::new("git")
        .args(["rev-parse", "--short", "HEAD"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("git runs (install git, or build from a tree without .git)");
    if output.status.success() {
        String::from_utf8(output.stdout).expect("git prints UTF-8").trim().to_string()
    } else {
        "unknown".to_string()
    }
}

/// Runs `bin --version` with a deadline; returns its stdout.
fn version_of(bin: &Path) -> String {
    let mut child = Command::new(bin)
        .arg("--version")
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("starting {}: {e}", bin.display()));
    let deadline = Instant::now() + Duration::from_secs(30);
    while child.try_wait().expect("waiting for --version").is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("{} --version still running after 30 s", bin.display());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let output = child.wait_with_output().expect("reading --version's output");
    assert!(output.status.success(), "{} --version failed: {}", bin.display(), output.status);
    String::from_utf8(output.stdout).expect("--version prints UTF-8")
}

#[test]
fn version_prints_the_name_the_workspace_version_and_the_commit_built() {
    let printed = version_of(Path::new(env!("CARGO_BIN_EXE_mdrelay-bench")));
    let prefix = format!("mdrelay-bench {} (git ", env!("CARGO_PKG_VERSION"));
    let rest = printed.strip_prefix(&prefix).unwrap_or_else(|| panic!("expected {prefix:?}..., got {printed:?}"));
    // The hash ends at `-dirty`, at the date's comma, or at the closing parenthesis.
    let hash = rest.split(['-', ',', ')']).next().unwrap_or_default();
    assert_eq!(hash, expected_commit(), "the commit in {printed:?}");
}
