//! Helpers the areas' tests share: DEEP10's path, paths in a test's directory, JSON reports read
//! after their process's exit status is checked, a sampler of a process's memory, the session a
//! program logs, key files and a forged datagram.

use mdrelay_codec::Format;
use mdrelay_harness::netns::Hosts;
use mdrelay_harness::process::field;
use mdrelay_harness::serial::{Serial, Shared, serial, shared};
use mdrelay_harness::{Finished, Process, STEP, assert_aggregates, expected, iex_data, json_file, publisher_bin};
use mdrelay_proto::relay::{DATAGRAM_VERSION, DatagramHeader, DatagramKind, Protector, WireKey};
use serde_json::Value;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;
use tempfile::TempDir;

/// The path of the shared DEEP10 capture.
pub fn deep10() -> String {
    iex_data().join("DEEP10.pcap.gz").display().to_string()
}

/// The path of `name` in `dir`, as an argument.
pub fn path(dir: &Path, name: &str) -> String {
    dir.join(name).display().to_string()
}

/// The paths of `NAME.json` in `dir`, one for each of `names`, as arguments.
pub fn json_paths<const N: usize>(dir: &Path, names: [&str; N]) -> [String; N] {
    names.map(|name| path(dir, &format!("{name}.json")))
}

/// Writes `toml` to `name` in `dir` and runs `mdrelay-pub run` with it, writing its summary to
/// `json`.
pub fn publisher_with_config(dir: &Path, name: &str, toml: &str, json: &str) -> Process {
    let config = path(dir, name);
    std::fs::write(&config, toml).unwrap();
    Process::start(publisher_bin(), ["run", "--config", config.as_str(), "--json", json])
}

/// `mdrelay-pub run` with the configuration `toml` (in a file of its own) and `extra` flags, to
/// its exit (at most [`STEP`]).
pub fn run_with_config(toml: &str, extra: &[&str]) -> Finished {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("pub.toml");
    std::fs::write(&path, toml).unwrap();
    let mut args = vec!["run", "--config", path.to_str().unwrap()];
    args.extend_from_slice(extra);
    Process::start(publisher_bin(), &args).finish(STEP)
}

/// The JSON report `json` of a subscriber, after checking its exit status says what the report
/// does: 5 (stream incomplete) when its verdict on the stream is false, else 0.
pub fn report(finished: &Finished, json: &str, context: &str) -> Value {
    let report = json_file(Path::new(json));
    let status = if report["stream_complete"] == false { 5 } else { 0 };
    assert_eq!(finished.code(), Some(status), "{context}: {finished:?}");
    report
}

/// Asserts a subscriber report is the whole of DEEP10, exactly: the reference's aggregates, its
/// totals matched and no gap (no frame dropped for it).
pub fn assert_exact_deep10(report: &Value, context: &str) {
    let reference = expected("DEEP10.json");
    for key in ["total_trade_volume", "symbols_with_trades_or_quotes", "symbols", "messages"] {
        assert_eq!(report[key], reference[key], "{context}: {key}");
    }
    assert_eq!(report["totals_match"], true, "{context}: totals match");
    assert_eq!(report["gaps"], 0, "{context}: gaps (frames dropped for it)");
}

/// Asserts a leaf's report is all of DEEP10: the reference's aggregates and counts, nothing
/// missing, its counts equal to the totals the last relay's END carried (the origin's).
pub fn assert_leaf_exact(leaf: &Value, reference: &Value, context: &str) {
    assert_aggregates(leaf, reference, context);
    assert_eq!(leaf["messages"], reference["messages"], "{context}: every message arrives");
    assert_eq!(leaf["message_types"], reference["message_types"], "{context}");
    assert_eq!(leaf["gaps"], 0, "{context}: {leaf}");
    assert_eq!(leaf["decode_errors"], 0, "{context}");
    assert!(leaf["late_join_sequence"].is_null(), "{context}: the leaf starts at the origin's first frame: {leaf}");
    assert_eq!(leaf["totals_match"], true, "{context}: the leaf's counts equal the origin's totals: {leaf}");
    assert_eq!(leaf["stop_reason"], "end", "{context}");
}

/// The unsigned number `key` of a JSON object; panics naming it when there is none.
pub fn n(v: &Value, key: &str) -> u64 {
    v[key].as_u64().unwrap_or_else(|| panic!("no {key} in {v}"))
}

/// The largest value of one kB line of `/proc/PID/status` (`VmRSS:`, `VmHWM:`) while this runs,
/// read every 20 ms.
pub struct StatusPeak {
    stop: Arc<AtomicBool>,
    max_kb: Arc<AtomicU64>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl StatusPeak {
    /// Starts sampling the line that begins with `field` (with its colon) for process `pid`.
    pub fn start(pid: u32, field: &'static str) -> StatusPeak {
        let stop = Arc::new(AtomicBool::new(false));
        let max_kb = Arc::new(AtomicU64::new(0));
        let (s, m) = (stop.clone(), max_kb.clone());
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else { return };
                let kb = status
                    .lines()
                    .find_map(|l| l.strip_prefix(field))
                    .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok());
                if let Some(kb) = kb {
                    m.fetch_max(kb, Ordering::Relaxed);
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        });
        StatusPeak { stop, max_kb, thread: Some(thread) }
    }

    /// Stops sampling; the largest value seen, in kB.
    pub fn max_kb(mut self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        self.max_kb.load(Ordering::Relaxed)
    }
}

/// The session a program logs (`session=0x...`) in its next line containing `needle`, waiting up
/// to `limit` for it.
pub fn logged_session(process: &mut Process, needle: &str, limit: Duration) -> u64 {
    let line = process.wait_for_within(needle, limit);
    let hex = field(&line, "session").unwrap_or_else(|| panic!("no session= in {line:?}"));
    u64::from_str_radix(hex.trim_start_matches("0x"), 16).unwrap_or_else(|e| panic!("{hex}: {e}"))
}

/// Writes a key file `name` in `dir` of `byte` repeated, readable by its owner only.
pub fn key_file(dir: &Path, name: &str, byte: u8) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, format!("{byte:02x}").repeat(32) + "\n").unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    path
}

/// The sequence of [`forged_datagram`]: far ahead of any stream here, so a gap if believed.
pub const FORGED_SEQUENCE: u64 = 1_000_000;

/// A DATA datagram of `session` numbered [`FORGED_SEQUENCE`], sealed under a key no one else
/// holds; with its header, for variants of it.
pub fn forged_datagram(session: u64) -> (Vec<u8>, DatagramHeader) {
    let forged_key = WireKey::new([0x77; 32]);
    let mut forger = Protector::new(true, Some(&forged_key), 1 << 20);
    let header = DatagramHeader {
        version: DATAGRAM_VERSION,
        format: Format::Sbe,
        kind: DatagramKind::Data,
        frame_count: 1,
        protection: forger.protection(),
        session,
        sequence: FORGED_SEQUENCE,
    };
    let mut forged = header.to_bytes().to_vec();
    forger.seal(session, FORGED_SEQUENCE, Format::Sbe, b"not a frame", &mut forged);
    (forged, header)
}

/// A test that runs alone on the machine ([`serial`]), with a temporary directory for its files.
pub fn alone_in_tempdir() -> (Serial, TempDir) {
    let serial = serial();
    (serial, tempfile::tempdir().unwrap())
}

/// A test that runs beside others ([`shared`]), with a temporary directory for its files.
pub fn beside_others_in_tempdir() -> (Shared, TempDir) {
    let shared = shared();
    (shared, tempfile::tempdir().unwrap())
}

/// A test that runs alone on the machine on emulated hosts of its own, with a temporary
/// directory for its files.
pub fn alone_on_emulated_hosts() -> (Serial, Hosts, TempDir) {
    let serial = serial();
    let hosts = Hosts::unique();
    (serial, hosts, tempfile::tempdir().unwrap())
}
