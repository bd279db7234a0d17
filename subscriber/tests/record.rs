//! `mdrelay-sub --record`: real `mdrelay-pub` and `mdrelay-sub` processes on loopback relay
//! DEEP10 from ../shared in every format, the subscriber records what it takes, and the
//! recording is read back by `mdrelay-pub inspect`, by the independent reference reader and by
//! a publisher replaying it, each compared with the reference output. Then the careless and
//! hostile cases: a path that cannot be written, a disk that fills, a stop mid-stream (signal,
//! `--count`, `--duration`), a format switch mid-stream.
//!
//! No test sleeps to let a process get ready: each waits for the line the process prints once
//! it is, and every wait is bounded.

use flate2::read::MultiGzDecoder;
use mdrelay_harness::{
    Finished, Process, STEP, Signal, deep10_tcp_config, expected, formats, iex_data, json_file, publisher_bin,
    reference_output, serial, subscriber_bin,
};
use mdrelay_proto::codec::Format;
use serde_json::{Value, json};
use std::io::Read;
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The longest a relay of DEEP10 may take (about 3 s; far longer only if something hangs).
const RUN: Duration = Duration::from_secs(120);

fn deep10() -> String {
    iex_data().join("DEEP10.pcap.gz").display().to_string()
}

fn text(path: &Path) -> String {
    path.display().to_string()
}

/// A publisher of `capture` in `format` serving TCP on a port of its choosing, waiting for one
/// subscriber and never dropping it; and the address it serves on.
fn tcp_publisher(capture: &str, format: &str, extra: &[&str]) -> (Process, SocketAddr) {
    let args = ["run", "--capture", capture, "--format", format, "--wait-subscribers", "1"];
    let args = args.iter().chain(&["--slow-subscriber", "block", "--tcp", "127.0.0.1:0"]).chain(extra);
    let mut publisher = Process::start(publisher_bin(), args);
    let addr = publisher.serving_on();
    (publisher, addr)
}

/// A subscriber of `addr` recording to `record`, its report in `json`; no interval lines unless
/// `extra` asks for them.
fn tcp_subscriber(addr: SocketAddr, json: &Path, record: &Path, extra: &[&str]) -> Process {
    let (addr, json, record) = (addr.to_string(), text(json), text(record));
    let mut args = vec!["--connect", &addr, "--json", &json, "--record", &record];
    if !extra.contains(&"--report-interval") {
        args.extend(["--report-interval", "0"]);
    }
    Process::start(subscriber_bin(), args.iter().chain(extra))
}

/// Relays DEEP10 in `format` over TCP to a subscriber recording to `record`; its report.
fn record_over_tcp(format: &str, record: &Path, dir: &Path) -> (Value, Finished) {
    let json = dir.join(format!("sub-{format}.json"));
    let (publisher, addr) = tcp_publisher(&deep10(), format, &[]);
    let subscriber = tcp_subscriber(addr, &json, record, &[]);
    publisher.finish(RUN).assert_success();
    let finished = subscriber.finish(STEP);
    (json_file(&json), finished)
}

/// `mdrelay-pub inspect --json` of a capture, which must read it without error.
fn inspect(capture: &Path) -> Value {
    let done = Process::start(publisher_bin(), ["inspect", "--json", &text(capture)]).finish(STEP);
    done.assert_success();
    done.json()
}

/// Asserts a reading of a recording of the whole of DEEP10 (by `inspect` or the reference
/// reader) has every figure of the reference: packet, segment, heartbeat and message counts,
/// messages by type, and every aggregate. DEEP10 carries only message types every format
/// carries (S, H, O, P, E, 8, 5, T, B), so nothing may be missing, whatever the format relayed.
/// Two reference fields are left out: `file`, the name; and `truncated_records`, DEEP10's last
/// record cut short, which the publisher cannot read and so never sends: the recording instead
/// must end with a whole record, so it has none.
fn assert_is_deep10(reading: &Value, reference: &Value, context: &str) {
    let reference = reference.as_object().expect("the reference is an object");
    for (key, value) in reference {
        if key != "file" && key != "truncated_records" {
            assert_eq!(&reading[key], value, "{context}: {key} differs from the reference");
        }
    }
    assert_eq!(reading["truncated_records"].as_u64().unwrap_or(0), 0, "{context}: the file ends inside a record");
}

/// Asserts `inspect` found nothing wrong in a recording: every record whole and every segment
/// as its header says (counters the reference reader does not have).
fn assert_sound(inspected: &Value, context: &str) {
    for key in [
        "truncated_records",
        "non_iex_packets",
        "malformed_messages",
        "length_overruns",
        "message_count_mismatches",
        "skipped_records",
    ] {
        assert_eq!(inspected[key], 0, "{context}: {key}");
    }
}

/// Asserts the report's `record` says every frame taken was written and nothing went wrong.
fn assert_recorded_all(report: &Value, context: &str) {
    let r = &report["record"];
    assert_eq!(r["segments"], report["frames"], "{context}: every frame taken is recorded: {r}");
    assert_eq!(r["messages"], report["messages"], "{context}: {r}");
    assert_eq!((&r["dropped_segments"], &r["unrecordable_segments"]), (&json!(0), &json!(0)), "{context}: {r}");
    assert_eq!(r["error"], Value::Null, "{context}: {r}");
}

/// The whole of a gzipped file, which must inflate to its end (the trailer included).
fn gunzip(path: &Path) -> Vec<u8> {
    let mut bytes = Vec::new();
    MultiGzDecoder::new(std::fs::File::open(path).unwrap())
        .read_to_end(&mut bytes)
        .unwrap_or_else(|e| panic!("{}: not a whole gzip stream: {e}", path.display()));
    bytes
}

/// The file name each format is recorded to: every container, gzipped and not.
fn recording_name(format: Format) -> &'static str {
    match format {
        Format::Raw => "raw.pcap",
        Format::Sbe => "sbe.pcapng.gz",
        Format::FlatBuffers => "flatbuffers.pcap.gz",
        Format::Capnp => "capnp.pcapng",
        Format::CapnpPacked => "capnp-packed.pcap",
        Format::Json => "json.pcapng.gz",
        Format::Protobuf => "protobuf.pcap.gz",
        Format::Brec => "brec.pcapng",
    }
}

#[test]
fn every_format_over_tcp_records_deep10_as_the_reference_reads_it() {
    let _serial = serial();
    let reference = expected("DEEP10.json");
    let dir = tempfile::tempdir().unwrap();
    for format in formats() {
        let record = dir.path().join(recording_name(format));
        let context = format!("{format} recorded to {}", record.file_name().unwrap().to_string_lossy());
        let (report, finished) = record_over_tcp(format.name(), &record, dir.path());
        assert_eq!(finished.code(), Some(0), "{context}: {finished:?}");
        assert_eq!(report["formats_seen"], json!([format.name()]), "{context}");
        assert_eq!(report["totals_match"], true, "{context}: the subscriber took the whole stream");
        assert_recorded_all(&report, &context);
        assert_eq!(report["record"]["segments"], reference["segments"], "{context}");
        let inspected = inspect(&record);
        assert_is_deep10(&inspected, &reference, &context);
        assert_sound(&inspected, &context);
        // The sessions' sequence numbers are carried as they were: DEEP10's 11 restarts, no gap.
        assert_eq!((&inspected["restarts"], &inspected["gaps"]), (&json!(11), &json!(0)), "{context}");
    }
}

#[test]
fn a_gzipped_pcapng_recording_reads_in_the_reference_reader_and_replays() {
    let _serial = serial();
    let reference = expected("DEEP10.json");
    let dir = tempfile::tempdir().unwrap();
    let record = dir.path().join("deep10.pcapng.gz");
    let (report, finished) = record_over_tcp("sbe", &record, dir.path());
    finished.assert_success();
    assert_recorded_all(&report, "sbe to pcapng.gz");
    assert!(gunzip(&record).starts_with(&[0x0a, 0x0d, 0x0d, 0x0a]), "a pcapng section header block comes first");
    assert_is_deep10(&reference_output(&record), &reference, "the reference reader on the recording");

    // The recording as a publisher's source, relayed in another format: the reference again.
    let json = dir.path().join("replayed.json");
    let (publisher, addr) = tcp_publisher(&text(&record), "flatbuffers", &[]);
    let subscriber = tcp_subscriber(addr, &json, &dir.path().join("again.pcap"), &[]);
    publisher.finish(RUN).assert_success();
    subscriber.finish(STEP).assert_success();
    let replayed = json_file(&json);
    for key in ["messages", "message_types", "total_trade_volume", "symbols_with_trades_or_quotes", "symbols"] {
        assert_eq!(replayed[key], reference[key], "the recording replayed: {key}");
    }
    assert_eq!(replayed["frames"], reference["segments"], "the recording replayed: one frame per segment");
}

#[test]
fn over_udp_the_recording_holds_exactly_the_frames_taken() {
    let _serial = serial();
    let reference = expected("DEEP10.json");
    let dir = tempfile::tempdir().unwrap();
    let (json, pub_json, record) =
        (dir.path().join("sub.json"), dir.path().join("pub.json"), dir.path().join("udp.pcap.gz"));
    let (json_arg, record_arg) = (text(&json), text(&record));
    let mut subscriber = Process::start(
        subscriber_bin(),
        ["--listen", "127.0.0.1:0", "--report-interval", "0", "--json", &json_arg, "--record", &record_arg],
    );
    // Bound: nothing sent from now on is lost to a socket not there yet.
    let target = subscriber.listening_on().to_string();
    let deep10 = deep10();
    // The rate and datagram size publisher/tests/relay.rs states its loopback margin for.
    let publisher = Process::start(
        publisher_bin(),
        [
            "run",
            "--capture",
            &deep10,
            "--format",
            "capnp",
            "--udp",
            &target,
            "--pacing",
            "rate",
            "--rate",
            "150000",
            "--coalesce-bytes",
            "8192",
            "--json",
            &text(&pub_json),
        ],
    );
    publisher.finish(RUN).assert_success();
    subscriber.finish(STEP).assert_success();
    let report = json_file(&json);
    assert_recorded_all(&report, "over UDP");
    let inspected = inspect(&record);
    assert_sound(&inspected, "over UDP");
    if report["gaps"] == 0 {
        assert_is_deep10(&inspected, &reference, "over UDP");
    } else {
        // A receive buffer overflowed on a loaded machine: the recording holds exactly what
        // arrived, which with what was lost is what the publisher sent.
        let sent = &json_file(&pub_json)["totals"];
        let (frames, gaps) = (report["frames"].as_u64().unwrap(), report["gaps"].as_u64().unwrap());
        assert_eq!(frames + gaps, sent["frames"].as_u64().unwrap(), "frames received + lost = sent");
        eprintln!(
            "{gaps} frames lost on loopback (a receive buffer overflowed); the recording checked against the report"
        );
        assert_eq!(inspected["segments"], report["frames"]);
        assert_eq!(inspected["messages"], report["messages"]);
        assert_eq!(inspected["message_types"], report["message_types"]);
    }
}

#[test]
fn a_format_switch_mid_stream_is_recorded_with_exact_aggregates() {
    let _serial = serial();
    let reference = expected("DEEP10.json");
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("pub.toml");
    let write = |format: &str| {
        let text = deep10_tcp_config(format, "");
        std::fs::write(&config, text).unwrap();
    };
    // Raw first: its segments are recorded as they came; SBE's are built again, and their
    // stream offsets go on from the last raw segment's.
    write("raw");
    let mut publisher = Process::start(publisher_bin(), ["run", "--config", &text(&config)]);
    let addr = publisher.serving_on();
    let (json, record) = (dir.path().join("sub.json"), dir.path().join("switch.pcap"));
    let mut subscriber = tcp_subscriber(addr, &json, &record, &["--report-interval", "0.1"]);
    // Raw frames have arrived: the switch comes mid-stream (the stream takes 3.3 s).
    subscriber.wait_for_frames(1);
    write("sbe");
    publisher.signal(Signal::SIGHUP);
    publisher.wait_for("SIGHUP: format changes at the next frame");
    publisher.finish(RUN).assert_success();
    subscriber.finish(STEP).assert_success();
    let report = json_file(&json);
    assert_eq!(report["formats_seen"], json!(["raw", "sbe"]), "{report}");
    assert_recorded_all(&report, "across a format switch");
    let inspected = inspect(&record);
    assert_is_deep10(&inspected, &reference, "across a format switch");
    assert_sound(&inspected, "across a format switch");
}

#[test]
fn sigterm_mid_stream_leaves_a_finished_recording() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    // Paced to about 8 s, so the signal comes mid-stream.
    let (_publisher, addr) = tcp_publisher(&deep10(), "capnp-packed", &["--pacing", "rate", "--rate", "50000"]);
    let (json, record) = (dir.path().join("sub.json"), dir.path().join("cut.pcap.gz"));
    let mut subscriber = tcp_subscriber(addr, &json, &record, &["--report-interval", "0.1"]);
    subscriber.wait_for_frames(2_000);
    subscriber.signal(Signal::SIGTERM);
    let finished = subscriber.finish(STEP);
    assert_eq!(finished.code(), Some(0), "{finished:?}");
    let report = json_file(&json);
    assert_eq!(report["stop_reason"], "signal");
    assert!(report["messages"].as_u64().unwrap() < expected("DEEP10.json")["messages"].as_u64().unwrap());
    assert_recorded_all(&report, "stopped by SIGTERM");
    gunzip(&record);
    let inspected = inspect(&record);
    assert_sound(&inspected, "stopped by SIGTERM");
    assert_eq!(inspected["segments"], report["frames"]);
    assert_eq!(inspected["messages"], report["messages"]);
    assert_eq!(inspected["message_types"], report["message_types"]);
    // `_publisher` is killed when dropped: its subscriber is gone.
}

#[test]
fn count_and_duration_stops_leave_finished_recordings() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    for (stop, extra, file) in [
        ("count", ["--count", "100000"], "count.pcapng.gz"),
        // Paced to about 8 s: the deadline comes mid-stream.
        ("duration", ["--duration", "1"], "duration.pcap.gz"),
    ] {
        let pacing: &[&str] = if stop == "duration" { &["--pacing", "rate", "--rate", "50000"] } else { &[] };
        let (_publisher, addr) = tcp_publisher(&deep10(), "sbe", pacing);
        let (json, record) = (dir.path().join(format!("{stop}.json")), dir.path().join(file));
        let finished = tcp_subscriber(addr, &json, &record, &extra).finish(STEP);
        assert_eq!(finished.code(), Some(0), "{stop}: {finished:?}");
        let report = json_file(&json);
        assert_eq!(report["stop_reason"], stop);
        assert!(report["frames"].as_u64().unwrap() > 0, "{stop}: {report}");
        assert_recorded_all(&report, stop);
        gunzip(&record);
        let inspected = inspect(&record);
        assert_sound(&inspected, stop);
        assert_eq!(inspected["segments"], report["frames"], "{stop}");
        assert_eq!(inspected["messages"], report["messages"], "{stop}");
        assert_eq!(inspected["symbols"], report["symbols"], "{stop}");
    }
}

#[test]
fn a_path_that_cannot_be_written_is_refused_before_connecting_with_exit_code_2() {
    let dir = tempfile::tempdir().unwrap();
    // A publisher's port that nobody answers on: the subscriber must not even connect.
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let missing = dir.path().join("no-such-dir").join("day.pcap.gz");
    let config = dir.path().join("sub.toml");
    std::fs::write(&config, format!("connect = \"{addr}\"\nrecord = \"{}\"\n", text(&missing))).unwrap();
    let cases: [(Vec<String>, PathBuf); 3] = [
        (vec!["--connect".into(), addr.clone(), "--record".into(), text(&missing)], missing.clone()),
        // A directory is no file.
        (vec!["--connect".into(), addr.clone(), "--record".into(), text(dir.path())], dir.path().to_path_buf()),
        // The key in a configuration file.
        (vec!["--config".into(), text(&config)], missing.clone()),
    ];
    for (args, path) in cases {
        let done = Process::start(subscriber_bin(), &args).finish(STEP);
        assert_eq!(done.code(), Some(2), "{args:?}: {done:?}");
        let message = format!("configuration error: record: cannot create {}", path.display());
        assert!(done.stderr.contains(&message), "{args:?}: {}", done.stderr);
    }
    assert!(listener.accept().is_err(), "refused before connecting");
    assert!(!missing.exists());
    // An empty name (which the flag's parser refuses before it gets here) in the file.
    std::fs::write(&config, format!("connect = \"{addr}\"\nrecord = \"\"\n")).unwrap();
    let done = Process::start(subscriber_bin(), ["--config", &text(&config)]).finish(STEP);
    assert_eq!(done.code(), Some(2), "{done:?}");
    assert!(done.stderr.contains("record: empty file name"), "{}", done.stderr);
}

#[test]
fn a_full_disk_stops_the_recording_not_the_run() {
    let _serial = serial();
    let reference = expected("DEEP10.json");
    let dir = tempfile::tempdir().unwrap();
    // Every write to /dev/full fails with ENOSPC, as on a full disk.
    let full = Path::new("/dev/full");
    assert!(full.exists(), "the test needs /dev/full (Linux)");
    let (report, finished) = record_over_tcp("sbe", full, dir.path());
    assert_eq!(finished.code(), Some(1), "the exit code says the recording failed: {finished:?}");
    assert!(finished.stderr.contains("cannot write /dev/full"), "{}", finished.stderr);
    let error = report["record"]["error"].as_str().unwrap_or_else(|| panic!("no record error: {report}"));
    assert!(error.starts_with("cannot write /dev/full: "), "{error}");
    // The run went on to the end, whole.
    assert_eq!(report["stop_reason"], "end");
    assert_eq!(report["totals_match"], true);
    for key in ["messages", "message_types", "total_trade_volume", "symbols"] {
        assert_eq!(report[key], reference[key], "{key}");
    }
    assert!(finished.stdout.contains("STOPPED: cannot write /dev/full"), "{}", finished.stdout);
}

/// A TCP port nobody answers on (bound, never accepted), so a subscriber that got past its
/// start would show up as a connection; and its address.
fn silent_port() -> (TcpListener, String) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    (listener, addr)
}

/// A subscriber of `addr` recording to `record` with `extra` flags, stopped after a second at
/// the latest (the port never answers): its exit.
fn record_to(addr: &str, record: &Path, extra: &[&str]) -> Finished {
    let record = text(record);
    let args = ["--connect", addr, "--record", &record, "--report-interval", "0", "--duration", "1"];
    Process::start(subscriber_bin(), args.iter().chain(extra)).finish(STEP)
}

/// Asserts a start refused with exit code 2, naming `path` and saying `why`.
fn assert_refused(done: &Finished, path: &Path, why: &str) {
    assert_eq!(done.code(), Some(2), "{}: {done:?}", path.display());
    let message = format!("configuration error: record: cannot create {}: ", path.display());
    assert!(done.stderr.contains(&message) && done.stderr.contains(why), "wanted {message:?} and {why:?}: {done:?}");
}

#[test]
fn a_symlink_at_the_recording_path_is_refused_and_its_target_left_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let (listener, addr) = silent_port();
    let victim = dir.path().join("victim.conf");
    let contents = b"an operator's file that a symlink at the recording path points to\n".repeat(100);
    std::fs::write(&victim, &contents).unwrap();
    let link = dir.path().join("day.pcap.gz");
    std::os::unix::fs::symlink(&victim, &link).unwrap();
    for extra in [&[][..], &["--record-overwrite"][..]] {
        let done = record_to(&addr, &link, extra);
        assert_refused(&done, &link, "is a symbolic link");
        assert_eq!(std::fs::read(&victim).unwrap(), contents, "{extra:?}: the link's target is byte-identical");
        assert!(std::fs::symlink_metadata(&link).unwrap().file_type().is_symlink(), "{extra:?}: the link stays");
    }
    // A dangling link: following it would create a file wherever it points.
    let nowhere = dir.path().join("elsewhere").join("created-through-a-link.pcap");
    std::fs::create_dir(dir.path().join("elsewhere")).unwrap();
    let dangling = dir.path().join("dangling.pcapng");
    std::os::unix::fs::symlink(&nowhere, &dangling).unwrap();
    let done = record_to(&addr, &dangling, &[]);
    assert_refused(&done, &dangling, "is a symbolic link");
    assert!(!nowhere.exists(), "nothing was created where the dangling link points");
    assert!(listener.accept().is_err(), "refused before connecting");
}

#[test]
fn an_existing_recording_is_kept_unless_overwrite_is_asked() {
    let dir = tempfile::tempdir().unwrap();
    let (listener, addr) = silent_port();
    let old = dir.path().join("yesterday.pcap");
    let contents = b"yesterday's recording".to_vec();
    std::fs::write(&old, &contents).unwrap();
    let done = record_to(&addr, &old, &[]);
    assert_refused(&done, &old, "exists");
    assert!(done.stderr.contains("--record-overwrite"), "the refusal says how to replace it: {done:?}");
    assert_eq!(std::fs::read(&old).unwrap(), contents, "the existing file is byte-identical");
    assert!(listener.accept().is_err(), "refused before connecting");

    // Asked for, the file is replaced: by a capture of nothing (the port never answers), which
    // `inspect` reads.
    let done = record_to(&addr, &old, &["--record-overwrite"]);
    assert_eq!(done.code(), Some(0), "{done:?}");
    let inspected = inspect(&old);
    assert_eq!((&inspected["packets"], &inspected["truncated_records"]), (&json!(0), &json!(0)), "{inspected}");
    // `--force` says the same.
    let done = record_to(&addr, &old, &["--force"]);
    assert_eq!(done.code(), Some(0), "{done:?}");
}
