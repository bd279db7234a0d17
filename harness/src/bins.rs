//! The binaries under test, from the same target directory and profile as the running
//! executable, built on demand when missing or older than its crates' sources (a package
//! tested alone builds only its own binaries, and its tests would otherwise run another
//! package's binary as it was yesterday).

use std::collections::HashMap;
use std::io;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, OnceLock};
use std::time::SystemTime;

/// The workspace crates (directories) whose sources go into each package's binaries.
fn sources_of(package: &str) -> &'static [&'static str] {
    match package {
        "mdrelay-publisher" => &["iex", "codec", "proto", "runtime", "client", "telemetry", "buildinfo", "publisher"],
        "mdrelay-subscriber" => &["iex", "codec", "proto", "runtime", "client", "telemetry", "buildinfo", "subscriber"],
        "mdrelay-bench" => &["iex", "codec", "proto", "runtime", "client", "buildinfo", "harness", "bench"],
        _ => &[],
    }
}

/// `mdrelay-pub`; panics when it cannot be found or built.
pub fn publisher_bin() -> PathBuf {
    expect_binary("mdrelay-publisher", "mdrelay-pub")
}

/// `mdrelay-sub`; panics when it cannot be found or built.
pub fn subscriber_bin() -> PathBuf {
    expect_binary("mdrelay-subscriber", "mdrelay-sub")
}

/// `mdrelay-bench`; panics when it cannot be found or built.
pub fn bench_bin() -> PathBuf {
    expect_binary("mdrelay-bench", "mdrelay-bench")
}

/// The example `name` of `package` (`<target>/<profile>/examples/name`), built when missing;
/// panics when it cannot be found or built.
pub fn example_bin(package: &str, name: &str) -> PathBuf {
    let found = profile_dir().and_then(|dir| {
        let path = dir.join("examples").join(name);
        if !path.is_file() {
            build_target(&dir, package, "--example", name)?;
        }
        if path.is_file() {
            Ok(path)
        } else {
            Err(io::Error::new(io::ErrorKind::NotFound, format!("{} missing after building it", path.display())))
        }
    });
    found.unwrap_or_else(|e| panic!("example {name}: {e}"))
}

fn expect_binary(package: &str, name: &str) -> PathBuf {
    binary(package, name).unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// The binaries found (or built) by this process, by name.
fn found() -> std::sync::MutexGuard<'static, HashMap<String, PathBuf>> {
    static FOUND: OnceLock<Mutex<HashMap<String, PathBuf>>> = OnceLock::new();
    FOUND.get_or_init(Default::default).lock().unwrap_or_else(|e| e.into_inner())
}

/// The binary `name` of `package` beside the running executable (a test's `deps/` counts as
/// beside), built with `cargo build --quiet` in the same profile and target directory when
/// missing. Looked up once per process.
pub fn binary(package: &str, name: &str) -> io::Result<PathBuf> {
    binaries(&[(package, name)], Build::Quiet).map(|mut paths| paths.remove(0))
}

/// How [`binaries`] builds what is missing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Build<'a> {
    /// `cargo build --quiet`: only cargo's errors (the tests).
    Quiet,
    /// A line on stderr naming what is built, why, and `purpose`, then cargo's progress (a
    /// program whose user would otherwise wait without a word, such as a benchmark).
    Shown {
        /// Why the caller needs the binaries ("the benchmark runs them as separate processes").
        purpose: &'a str,
    },
}

/// The binaries `wanted` (package, binary name) beside the running executable, in that order;
/// those missing or older than their crates' sources are built first, all in one `cargo build`
/// in the same profile and target directory (one invocation: the crates they share are built
/// once, with the features of both). Looked up once per process.
pub fn binaries(wanted: &[(&str, &str)], build: Build) -> io::Result<Vec<PathBuf>> {
    if let Some(paths) = copies_beside_this_one(wanted) {
        return Ok(paths);
    }
    // Held while building, so two threads do not run cargo for the same binary at once.
    let mut found = found();
    let dir = profile_dir()?;
    let mut to_build: Vec<(&str, &str, &str)> = Vec::new();
    for &(package, name) in wanted {
        if found.contains_key(name) {
            continue;
        }
        let path = dir.join(name);
        if !path.is_file() {
            to_build.push((package, name, "missing"));
        } else if stale(&path, package) {
            to_build.push((package, name, "older than its sources"));
        }
    }
    if !to_build.is_empty() {
        let targets: Vec<(&str, &str)> = to_build.iter().map(|&(package, name, _)| (package, name)).collect();
        if let Build::Shown { purpose } = build {
            let what =
                to_build.iter().map(|(_, name, why)| format!("{name} ({why})")).collect::<Vec<_>>().join(" and ");
            let profile = dir.file_name().and_then(|n| n.to_str()).unwrap_or("?");
            eprintln!(
                "building {what} with cargo, profile {profile}, into {}: {purpose}; cargo's progress follows \
                 (minutes the first time, seconds afterwards)",
                dir.display()
            );
        }
        build_targets(&dir, &targets, "--bin", build == Build::Quiet)?;
    }
    let mut paths = Vec::with_capacity(wanted.len());
    for &(_, name) in wanted {
        let path = dir.join(name);
        if !path.is_file() {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("{} missing after building it", path.display()),
            ));
        }
        found.insert(name.to_string(), path.clone());
        paths.push(path);
    }
    Ok(paths)
}

/// Whether a Rust source of `package`'s crates changed after `binary` was built (cargo then
/// builds and links it again, so it does not stay stale).
fn stale(binary: &Path, package: &str) -> bool {
    let Ok(built) = binary.metadata().and_then(|m| m.modified()) else { return true };
    let Some(workspace) = Path::new(env!("CARGO_MANIFEST_DIR")).parent() else { return false };
    sources_of(package).iter().filter_map(|krate| newest_source(&workspace.join(krate).join("src"))).any(|t| t > built)
}

/// The binaries `wanted` beside the running executable when it runs outside a target directory
/// (no `deps/` beside it: copies of two builds side by side, to compare them) and they are all
/// there: used as they are, never rebuilt or judged stale. Without this, a copied benchmark would
/// quietly run the binaries of the target directory it was built in.
fn copies_beside_this_one(wanted: &[(&str, &str)]) -> Option<Vec<PathBuf>> {
    let exe = std::env::current_exe().ok()?;
    let dir = exe.parent()?;
    if dir.ends_with("deps") || dir.join("deps").is_dir() {
        return None;
    }
    wanted.iter().map(|(_, name)| Some(dir.join(name)).filter(|path| path.is_file())).collect()
}

/// When the most recently modified Rust source under `path` (or `path` itself) was.
fn newest_source(path: &Path) -> Option<SystemTime> {
    let meta = path.metadata().ok()?;
    if !meta.is_dir() {
        // Sources only: an editor's or a tool's other files do not go into the binary.
        return if path.extension().is_some_and(|e| e == "rs") { meta.modified().ok() } else { None };
    }
    std::fs::read_dir(path).ok()?.filter_map(|entry| entry.ok()).filter_map(|entry| newest_source(&entry.path())).max()
}

/// `<target>/<profile>`: where cargo puts binaries, and test executables under `deps/`. A
/// program that runs from elsewhere (a doctest, which rustdoc builds in a temporary directory)
/// gets the one this harness was built in.
fn profile_dir() -> io::Result<PathBuf> {
    let exe = std::env::current_exe()?;
    let mut dir = exe.parent().map(Path::to_path_buf).unwrap_or_default();
    if dir.ends_with("deps") {
        dir.pop();
    }
    if !dir.join("deps").is_dir() {
        return Ok(PathBuf::from(env!("MDRELAY_HARNESS_PROFILE_DIR")));
    }
    Ok(dir)
}

/// `cargo build -p package KIND name` (`--bin`, `--example`) into `dir`'s target directory and
/// profile.
fn build_target(dir: &Path, package: &str, kind: &str, name: &str) -> io::Result<()> {
    build_targets(dir, &[(package, name)], kind, true)
}

/// One `cargo build` of every (package, name) in `targets`, all of `kind` (`--bin`,
/// `--example`), into `dir`'s target directory and profile; `--quiet` when `quiet`, else with
/// cargo's progress on stderr.
fn build_targets(dir: &Path, targets: &[(&str, &str)], kind: &str, quiet: bool) -> io::Result<()> {
    let cargo = std::env::var_os("CARGO").or_else(|| option_env!("CARGO").map(Into::into)).unwrap_or("cargo".into());
    let mut command = Command::new(cargo);
    command.arg("build");
    if quiet {
        command.arg("--quiet");
    }
    for (package, name) in targets {
        command.args(["-p", package, kind, name]);
    }
    let names = targets.iter().map(|(_, name)| *name).collect::<Vec<_>>().join(" and ");
    match dir.file_name().and_then(|n| n.to_str()) {
        Some("debug") => {}
        Some("release") => {
            command.arg("--release");
        }
        Some(profile) => {
            command.args(["--profile", profile]);
        }
        None => return Err(io::Error::other(format!("{} is not a cargo profile directory", dir.display()))),
    }
    if let Some(target) = dir.parent() {
        command.arg("--target-dir").arg(target);
    }
    // From the workspace, whatever the current directory of the caller.
    command.current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/.."));
    let status = command.status().map_err(|e| io::Error::other(format!("running cargo to build {names}: {e}")))?;
    if !status.success() {
        return Err(io::Error::other(format!("building {names} failed ({status})")));
    }
    Ok(())
}

/// `mdrelay-sub` joined to the multicast `group` on the loopback interface, recovering lost
/// datagrams from the retransmission service at `recovery`, reporting only at its end, into
/// `json`. Read its [`Process::listening_on`] before anything is sent to the group.
pub fn loopback_group_subscriber(group: &str, recovery: &str, json: &str) -> crate::Process {
    crate::Process::start(
        subscriber_bin(),
        [
            "--group",
            group,
            "--interface",
            "127.0.0.1",
            "--recovery",
            recovery,
            "--report-interval",
            "0",
            "--json",
            json,
        ],
    )
}
