//! The version string of mdrelay's binaries, computed in their build scripts.
//!
//! `mdrelay-pub --version` prints `mdrelay-pub 0.1.0 (git 4e0a74f, 2026-11-22)`: the workspace
//! version, the short hash of the commit built, `-dirty` when tracked files differed from it, and
//! the commit's date. Built from a tree that is not a git checkout (a source tarball, a copy for
//! `cargo install`), or where git is missing, it prints `(git unknown)` instead of failing.
//!
//! Each binary's `build.rs` calls [`emit`], which sets `MDRELAY_VERSION` and `MDRELAY_REVISION`
//! (the commit alone) for `env!`.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The environment variable [`emit`] sets for the package being built.
pub const VARIABLE: &str = "MDRELAY_VERSION";

/// The environment variable [`emit`] sets to the commit alone: `4e0a74f`, `4e0a74f-dirty`, or
/// `unknown` (the `revision` label of `mdrelay_build_info`, as Prometheus exporters name it).
pub const REVISION_VARIABLE: &str = "MDRELAY_REVISION";

/// Prints the `cargo:` lines of a build script: `MDRELAY_VERSION`, and what to rerun it on.
pub fn emit() {
    let manifest_dir = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").unwrap_or_default());
    let version = std::env::var("CARGO_PKG_VERSION").unwrap_or_default();
    let commit = Commit::find(&manifest_dir);
    println!("cargo:rustc-env={VARIABLE}={}", version_string(&version, commit.as_ref()));
    println!("cargo:rustc-env={REVISION_VARIABLE}={}", revision(commit.as_ref()));
    // Listing any path turns off cargo's default of rerunning on every change in the package, so
    // the package's own files are listed too: an edit there can change the dirty flag.
    println!("cargo:rerun-if-changed=Cargo.toml");
    println!("cargo:rerun-if-changed=src");
    println!("cargo:rerun-if-changed=build.rs");
    if let Some(commit) = &commit {
        for path in &commit.watch {
            println!("cargo:rerun-if-changed={}", path.display());
        }
    }
}

/// `0.1.0 (git 4e0a74f-dirty, 2026-11-22)`, or `0.1.0 (git unknown)` without a commit.
pub fn version_string(version: &str, commit: Option<&Commit>) -> String {
    match commit {
        Some(c) => {
            let dirty = if c.dirty { "-dirty" } else { "" };
            match &c.date {
                Some(date) => format!("{version} (git {}{dirty}, {date})", c.hash),
                None => format!("{version} (git {}{dirty})", c.hash),
            }
        }
        None => format!("{version} (git unknown)"),
    }
}

/// `4e0a74f`, `4e0a74f-dirty`, or `unknown` without a commit.
pub fn revision(commit: Option<&Commit>) -> String {
    match commit {
        Some(c) if c.dirty => format!("{}-dirty", c.hash),
        Some(c) => c.hash.clone(),
        None => "unknown".to_string(),
    }
}

/// The commit a package is built from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Commit {
    /// `git rev-parse --short HEAD`.
    pub hash: String,
    /// True when tracked files differ from the commit (untracked files do not count).
    pub dirty: bool,
    /// The commit date, `YYYY-MM-DD`.
    pub date: Option<String>,
    /// Git's files that change with a commit, a checkout or staging: the build script reruns on them.
    pub watch: Vec<PathBuf>,
}

impl Commit {
    /// The commit checked out around `dir`, or `None` when `dir` is not in a git checkout that
    /// tracks it (a tarball unpacked inside some other repository must not take that one's hash).
    pub fn find(dir: &Path) -> Option<Commit> {
        // The package's own manifest must be tracked by the repository git finds.
        git(dir, &["ls-files", "--error-unmatch", "Cargo.toml"])?;
        let hash = git(dir, &["rev-parse", "--short", "HEAD"])?;
        let date = git(dir, &["show", "-s", "--format=%cs", "HEAD"]);
        let dirty = git(dir, &["status", "--porcelain", "--untracked-files=no"]).is_some_and(|s| !s.is_empty());
        let mut watch = Vec::new();
        let mut paths = vec!["HEAD".to_string(), "index".to_string(), "packed-refs".to_string()];
        // The branch HEAD points to moves on a commit while HEAD itself stays the same.
        if let Some(branch) = git(dir, &["symbolic-ref", "-q", "HEAD"]) {
            paths.push(branch);
        }
        for path in paths {
            if let Some(file) = git(dir, &["rev-parse", "--path-format=absolute", "--git-path", &path]) {
                let file = PathBuf::from(file);
                // Cargo reruns on every build for a listed path that does not exist.
                if file.exists() {
                    watch.push(file);
                }
            }
        }
        Some(Commit { hash, dirty, date, watch })
    }
}

/// Git's trimmed output, or `None` when git is missing or fails.
fn git(dir: &Path, args: &[&str]) -> Option<String> {
    let output = Command::new("git")
        .args(args)
        .current_dir(dir)
        // `git status` would otherwise refresh and rewrite the index, which the build script
        // watches (a rerun on every build), and could race a git command the user runs.
        .env("GIT_OPTIONAL_LOCKS", "0")
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .ok()?;
    if !output.status.success() {
        return None;
    }
    Some(String::from_utf8(output.stdout).ok()?.trim().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_version_string_names_the_commit_or_says_unknown() {
        let commit = Commit { hash: "4e0a74f".into(), dirty: true, date: Some("2026-11-22".into()), watch: Vec::new() };
        assert_eq!(version_string("0.1.0", Some(&commit)), "0.1.0 (git 4e0a74f-dirty, 2026-11-22)");
        assert_eq!(version_string("0.1.0", None), "0.1.0 (git unknown)");
        assert_eq!(revision(Some(&commit)), "4e0a74f-dirty");
        assert_eq!(revision(None), "unknown");
    }

    #[test]
    fn a_directory_outside_any_checkout_has_no_commit() {
        let dir = std::env::temp_dir().join(format!("mdrelay-buildinfo-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("Cargo.toml"), "").unwrap();
        let found = Commit::find(&dir);
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(found, None);
    }
}
