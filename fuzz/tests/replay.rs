//! Replays the committed fuzz corpus and every crash input found so far through the target bodies,
//! on stable Rust, so a regression fails the ordinary test suite without libFuzzer.
//!
//! A target without a corpus fails the test: the corpus must not disappear unnoticed. Crash inputs
//! whose bug is not fixed yet are listed in [`KNOWN`]: the main test skips them, and each has an
//! ignored test of its own whose reason names the bug, so every test run shows them.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};

/// Crash inputs whose bug is not fixed yet: (target, file in `fuzz/artifacts/<target>/`).
const KNOWN: &[(&str, &str)] = &[];

fn fuzz_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The files of `dir`, sorted; empty when it does not exist.
fn files(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
    let mut files: Vec<PathBuf> = entries.flatten().map(|e| e.path()).filter(|p| p.is_file()).collect();
    files.sort();
    files
}

fn is_known(target: &str, path: &Path) -> bool {
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default();
    KNOWN.iter().any(|&(t, file)| t == target && file == name)
}

/// Runs `path` through `target`, the panic message if it panics.
fn replay(target: mdrelay_fuzz::Target, path: &Path) -> Result<(), String> {
    let data = std::fs::read(path).map_err(|e| format!("cannot read: {e}"))?;
    catch_unwind(AssertUnwindSafe(|| target(&data))).map_err(|payload| {
        payload
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_else(|| "a panic without a message".into())
    })
}

#[test]
fn every_target_has_a_corpus_and_every_input_passes() {
    let mut failures = Vec::new();
    let mut replayed = 0;
    for &(name, target) in mdrelay_fuzz::TARGETS {
        let corpus = files(&fuzz_dir().join("corpus").join(name));
        if corpus.is_empty() {
            failures.push(format!("fuzz/corpus/{name}/ is missing or empty"));
        }
        let artifacts = files(&fuzz_dir().join("artifacts").join(name));
        for path in corpus.iter().chain(&artifacts) {
            if is_known(name, path) {
                continue;
            }
            replayed += 1;
            if let Err(why) = replay(target, path) {
                failures.push(format!("{name}: {}: {why}", path.display()));
            }
        }
    }
    assert!(failures.is_empty(), "{} of {replayed} inputs failed:\n{}", failures.len(), failures.join("\n"));
}

#[test]
fn every_target_has_a_libfuzzer_harness() {
    for &(name, _) in mdrelay_fuzz::TARGETS {
        let harness = fuzz_dir().join("libfuzzer/fuzz_targets").join(format!("{name}.rs"));
        let text = std::fs::read_to_string(&harness).unwrap_or_else(|e| panic!("{}: {e}", harness.display()));
        assert!(text.contains(&format!("mdrelay_fuzz::{name}(")), "{} does not call its body", harness.display());
    }
}

#[test]
fn every_known_crash_input_exists() {
    for &(target, file) in KNOWN {
        assert!(mdrelay_fuzz::target(target).is_some(), "{target} is not a target");
        let path = fuzz_dir().join("artifacts").join(target).join(file);
        assert!(path.is_file(), "{} is listed as a known crash but does not exist", path.display());
    }
}
