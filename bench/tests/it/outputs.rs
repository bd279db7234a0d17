//! What the bench's runs write and how they fail, shared by the loopback and scale tests.

use std::path::{Path, PathBuf};

/// A fresh directory for a run's outputs: its JSON report and its plots' folder.
pub struct Outputs {
    /// Kept (and so not removed) while the test reads what the run wrote.
    _dir: tempfile::TempDir,
    /// Where `--json` writes the report.
    pub json: PathBuf,
    /// Where `--plots` writes the table and the plots.
    pub plots: PathBuf,
}

impl Outputs {
    /// A new directory, with the report named `json`.
    pub fn new(json: &str) -> Outputs {
        let dir = tempfile::tempdir().unwrap();
        let (json, plots) = (dir.path().join(json), dir.path().join("plots"));
        Outputs { _dir: dir, json, plots }
    }

    /// `args` followed by `--json` and `--plots` naming this directory's files.
    pub fn args<'a>(&'a self, args: &[&'a str]) -> Vec<&'a str> {
        [args, &["--json", self.json.to_str().unwrap(), "--plots", self.plots.to_str().unwrap()]].concat()
    }
}

/// The JSON at `path`, panicking with the path when it cannot be read or parsed.
pub fn read_json(path: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display())))
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Runs each of `cases` through `run` and checks that it fails with a message naming its word.
pub fn assert_each_fails_naming(run: impl Fn(&[&str]) -> mdrelay_harness::Finished, cases: &[(&[&str], &str)]) {
    for &(args, says) in cases {
        let done = run(args);
        assert_ne!(done.code(), Some(0), "{args:?} succeeded: {done:?}");
        assert!(done.stderr.contains(says), "{args:?}: the message does not name {says:?}: {done:?}");
    }
}

/// Checks that the `--help` run `help` succeeded and names each of `flags`.
pub fn assert_help_lists(help: &mdrelay_harness::Finished, flags: &[&str]) {
    help.assert_success();
    for flag in flags {
        assert!(help.stdout.contains(flag), "--help lacks {flag}: {help:?}");
    }
}
