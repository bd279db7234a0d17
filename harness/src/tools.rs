//! Programs the tests run that a fresh machine may lack. The pinned NATS tools (`nats-server`, natscli `nats`, `nats-creds`), built on
//! first use by the repository's own `.ci/nats.sh` (so the pins are written down once) into a
//! cache outside the clone, and reused afterwards.
//!
//! Several test binaries, each with many test threads, may ask for them at once on a fresh
//! machine: an exclusive lock on a file beside the tools lets exactly one build while the others
//! wait, then find them built. `.ci/nats.sh` records what it built them from (a SHA-256 of the
//! script and `harness/nats-creds`'s sources) in `bin/.nats-inputs`; the tools are up to date
//! when that record matches this build of the harness and every program is there. A build that
//! fails fails the test that asked, with the script's output: a NATS test never skips itself.
//!
//! Other programs from the distribution (`python3` for the reference reader) are installed with
//! apt-get when missing, as `.ci/run` does ([`system_program`]).

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

use sha2::{Digest, Sha256};

/// The programs `.ci/nats.sh` builds, all needed for the tools to count as built.
pub const NATS_PROGRAMS: [&str; 3] = ["nats-server", "nats", "nats-creds"];

/// Where `.ci/nats.sh` records the SHA-256 of what it built the tools from, under `bin/`.
const INPUTS_RECORD: &str = ".nats-inputs";

/// The lock file, beside `bin/`, held while the tools are built.
const BUILD_LOCK: &str = ".nats-build.lock";

/// The tools cache: `MDRELAY_TOOLS`, else `~/.cache/mdrelay-tools` (as `.ci/nats.sh` has it).
pub fn tools_dir() -> PathBuf {
    match std::env::var_os("MDRELAY_TOOLS") {
        Some(dir) => PathBuf::from(dir),
        None => PathBuf::from(std::env::var_os("HOME").unwrap_or_else(|| "/root".into())).join(".cache/mdrelay-tools"),
    }
}

/// The SHA-256 (lower-case hex) of `.ci/nats.sh` and `harness/nats-creds`'s sources, in the
/// order `.ci/nats.sh` hashes them: what the tools this harness expects are built from.
pub fn nats_inputs_digest() -> String {
    let mut hash = Sha256::new();
    hash.update(include_bytes!("../../.ci/nats.sh"));
    hash.update(include_bytes!("../nats-creds/go.mod"));
    hash.update(include_bytes!("../nats-creds/go.sum"));
    hash.update(include_bytes!("../nats-creds/main.go"));
    format!("{:x}", hash.finalize())
}

/// The directory holding the pinned NATS tools, built by `.ci/nats.sh` first when they are
/// missing or were built from other inputs. Checked once per process; panics with the script's
/// output when the build fails.
pub fn nats_tools_bin() -> PathBuf {
    static BUILT: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    let built = BUILT.get_or_init(|| {
        let tools = tools_dir();
        let script = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../.ci/nats.sh"));
        build_once(&tools, script, &nats_inputs_digest()).map(|_| tools.join("bin"))
    });
    match built {
        Ok(bin) => bin.clone(),
        Err(why) => panic!("the NATS tools the test needs could not be built: {why}"),
    }
}

/// Whether the tools in `tools/bin` were built from `digest` and are all there.
fn up_to_date(tools: &Path, digest: &str) -> bool {
    let bin = tools.join("bin");
    std::fs::read_to_string(bin.join(INPUTS_RECORD)).is_ok_and(|recorded| recorded.trim() == digest)
        && NATS_PROGRAMS.iter().all(|program| bin.join(program).is_file())
}

/// Creates `dir` and holds an exclusive lock on its file `name` (made if missing) until the
/// returned file is dropped, so that one process or thread at a time installs into `dir`.
fn lock_in(dir: &Path, name: &str) -> Result<File, String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    let lock_path = dir.join(name);
    let lock = File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .map_err(|e| format!("opening {}: {e}", lock_path.display()))?;
    lock.lock().map_err(|e| format!("locking {}: {e}", lock_path.display()))?;
    Ok(lock)
}

/// Runs `script` (bash, with `MDRELAY_TOOLS=tools`) unless the tools in `tools/bin` are up to
/// date for `digest`, holding an exclusive lock on `tools/.nats-build.lock` meanwhile, so that
/// of the threads and processes asking at once exactly one builds and the others wait for it.
/// Says on stderr what it builds, where and why. `Ok(true)` when this call built them,
/// `Ok(false)` when they were there; the script's output when it failed or did not record
/// `digest`.
pub fn build_once(tools: &Path, script: &Path, digest: &str) -> Result<bool, String> {
    if up_to_date(tools, digest) {
        return Ok(false);
    }
    let _lock = lock_in(tools, BUILD_LOCK)?;
    // Another thread or process may have built them while this one waited for the lock.
    if up_to_date(tools, digest) {
        return Ok(false);
    }
    let why = match std::fs::read_to_string(tools.join("bin").join(INPUTS_RECORD)) {
        Err(_) => "they are missing",
        Ok(recorded) if recorded.trim() != digest => "they were built from another version of it or of nats-creds",
        Ok(_) => "one of them is missing",
    };
    // Straight to the process's stderr: the test harness captures `eprintln!` from test threads,
    // and this line is for whoever waits for the tests.
    let _ = writeln!(
        std::io::stderr(),
        "mdrelay-harness: building the pinned NATS tools ({}) for the NATS tests into {} with {}, as {why}: \
         about a minute, once",
        NATS_PROGRAMS.join(", "),
        tools.join("bin").display(),
        script.display(),
    );
    let output = Command::new("bash")
        .arg(script)
        .env("MDRELAY_TOOLS", tools)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("running bash {}: {e}", script.display()))?;
    let printed = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    if !output.status.success() {
        return Err(format!("bash {} failed ({}):\n{printed}", script.display(), output.status));
    }
    if !up_to_date(tools, digest) {
        return Err(format!(
            "bash {} succeeded but {} does not hold {digest} or a program is missing from it:\n{printed}",
            script.display(),
            tools.join("bin").join(INPUTS_RECORD).display()
        ));
    }
    Ok(true)
}

/// `program` as found on `PATH`; when it is not there, the Debian package `package` is
/// installed first with apt-get (as `.ci/run` does for CI's machine), saying so on stderr, once
/// for every thread and process that asks at once (apt takes one install at a time: the others
/// wait on a lock beside the tools). Panics with apt's output when that fails.
pub fn system_program(program: &str, package: &str) -> PathBuf {
    if let Some(found) = on_path(program) {
        return found;
    }
    let tools = tools_dir();
    let installed = (|| {
        let _lock = lock_in(&tools, ".apt.lock")?;
        if let Some(found) = on_path(program) {
            return Ok(found);
        }
        let _ = writeln!(
            std::io::stderr(),
            "mdrelay-harness: installing {package} with apt-get, as the tests run {program} and it is not on PATH: once"
        );
        let output = Command::new("sh")
            .arg("-c")
            .arg(format!("apt-get update -q && apt-get install -y -q {package}"))
            .env("DEBIAN_FRONTEND", "noninteractive")
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("running apt-get: {e}"))?;
        let printed = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
        if !output.status.success() {
            return Err(format!("apt-get install {package} failed ({}):\n{printed}", output.status));
        }
        on_path(program).ok_or_else(|| format!("apt-get installed {package} but {program} is not on PATH:\n{printed}"))
    })();
    installed.unwrap_or_else(|why| panic!("{program}, which the test needs: {why}"))
}

/// The first executable file `program` in the directories of `PATH`.
fn on_path(program: &str) -> Option<PathBuf> {
    let paths = std::env::var_os("PATH")?;
    std::env::split_paths(&paths).map(|dir| dir.join(program)).find(|candidate| candidate.is_file())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stand-in for `.ci/nats.sh` that counts its runs in `runs`, takes a while (so callers
    /// overlap), then records `digest` and the programs, or fails when `fail` is set.
    /// A scratch folder holding a stub build script (see [`stub_script`]), and where it builds.
    fn scratch_with_stub(digest: &str, fail: bool) -> (tempfile::TempDir, PathBuf, PathBuf) {
        let scratch = tempfile::tempdir().unwrap();
        let tools = scratch.path().join("tools");
        let script = stub_script(scratch.path(), digest, fail);
        (scratch, tools, script)
    }

    fn stub_script(dir: &Path, digest: &str, fail: bool) -> PathBuf {
        let script = dir.join("stub.sh");
        let body = if fail {
            "echo 'go: no network' >&2; exit 3\n".to_string()
        } else {
            format!(
                "sleep 0.3\nmkdir -p \"$MDRELAY_TOOLS/bin\"\nfor p in {}; do : > \"$MDRELAY_TOOLS/bin/$p\"; done\n\
                 echo {digest} > \"$MDRELAY_TOOLS/bin/{INPUTS_RECORD}\"\n",
                NATS_PROGRAMS.join(" ")
            )
        };
        std::fs::write(&script, format!("set -e\necho run >> \"{}\"\n{body}", dir.join("runs").display())).unwrap();
        script
    }

    fn runs(dir: &Path) -> usize {
        std::fs::read_to_string(dir.join("runs")).map_or(0, |text| text.lines().count())
    }

    #[test]
    fn of_many_callers_at_once_exactly_one_builds_and_later_ones_reuse() {
        let (scratch, tools, script) = scratch_with_stub("abc", false);
        let built: Vec<bool> = std::thread::scope(|s| {
            let callers: Vec<_> = (0..8).map(|_| s.spawn(|| build_once(&tools, &script, "abc").unwrap())).collect();
            callers.into_iter().map(|caller| caller.join().unwrap()).collect()
        });
        assert_eq!(built.iter().filter(|&&b| b).count(), 1, "exactly one caller builds: {built:?}");
        assert_eq!(runs(scratch.path()), 1);
        assert!(!build_once(&tools, &script, "abc").unwrap(), "built tools are reused");
        assert_eq!(runs(scratch.path()), 1);
    }

    #[test]
    fn tools_built_from_other_inputs_or_incomplete_are_built_again() {
        let (scratch, tools, script) = scratch_with_stub("new", false);
        std::fs::create_dir_all(tools.join("bin")).unwrap();
        std::fs::write(tools.join("bin").join(INPUTS_RECORD), "old\n").unwrap();
        for program in NATS_PROGRAMS {
            std::fs::write(tools.join("bin").join(program), "").unwrap();
        }
        assert!(build_once(&tools, &script, "new").unwrap(), "another script's tools are rebuilt");
        std::fs::remove_file(tools.join("bin/nats-creds")).unwrap();
        assert!(build_once(&tools, &script, "new").unwrap(), "a missing program is rebuilt");
        assert_eq!(runs(scratch.path()), 2);
    }

    #[test]
    fn a_failed_build_is_an_error_with_the_scripts_output_and_the_next_caller_tries_again() {
        let (scratch, tools, script) = scratch_with_stub("abc", true);
        let err = build_once(&tools, &script, "abc").unwrap_err();
        assert!(err.contains("go: no network") && err.contains("exit status: 3"), "{err}");
        assert!(build_once(&tools, &script, "abc").is_err());
        assert_eq!(runs(scratch.path()), 2);
    }

    #[test]
    fn a_program_on_path_is_found_there_without_installing_anything() {
        let sh = system_program("sh", "dash");
        assert!(sh.is_absolute() && sh.ends_with("sh"), "{}", sh.display());
        assert_eq!(Command::new(&sh).args(["-c", "exit 7"]).status().unwrap().code(), Some(7));
    }

    #[test]
    fn a_script_that_records_other_inputs_is_an_error() {
        let scratch = tempfile::tempdir().unwrap();
        let script = stub_script(scratch.path(), "other", false);
        let err = build_once(&scratch.path().join("tools"), &script, "abc").unwrap_err();
        assert!(err.contains("does not hold abc"), "{err}");
    }

    /// `.ci/nats.sh` and this harness agree on what the tools are built from: the digest the
    /// script computes with `sha256sum` is the one the harness expects.
    #[test]
    fn the_script_hashes_its_inputs_as_the_harness_does() {
        let root = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."));
        let script = std::fs::read_to_string(root.join(".ci/nats.sh")).unwrap();
        let line = script.lines().find(|line| line.starts_with("inputs=")).expect("nats.sh sets inputs=");
        let output = Command::new("bash")
            .arg("-c")
            .arg(format!("set -euo pipefail; here={}; {line}; echo \"$inputs\"", root.display()))
            .output()
            .unwrap();
        assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
        assert_eq!(String::from_utf8_lossy(&output.stdout).trim(), nats_inputs_digest());
    }
}
