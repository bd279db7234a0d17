//! `mdrelay-sub --record`: real `mdrelay-pub` and `mdrelay-sub` processes on loopback relay
//! DEEP10 from ../shared in every format, the subscriber records what it takes, and the
//! recording is read back by `mdrelay-pub inspect`, by the independent reference reader and by
//! a publisher replaying it, each compared with the reference output. Then the careless and
//! hostile cases: a path that cannot be written, a stop mid-stream (signal,
//! `--count`, `--duration`), a format switch mid-stream, a symbolic link or an existing file at
//! the path. Rotation by size (with and without a cap on the files kept) and by time: every file
//! complete and read by `inspect` and the reference reader, and all of them together exactly
//! DEEP10. A disk that fills, and a path that is a FIFO or a device, are in `files.rs`.
//!
//! No test sleeps to let a process get ready: each waits for the line the process prints once
//! it is, and every wait is bounded.

use flate2::read::MultiGzDecoder;
use mdrelay_codec::Format;
use mdrelay_harness::{
    Finished, Process, STEP, Signal, deep10_tcp_config, expected, formats, free_tcp_port, iex_data, json_file,
    publisher_bin, reference_output, scrape, serial, subscriber_bin,
};
use serde_json::{Map, Value, json};
use std::io::Read;
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
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
#[ignore = "long (over 3 s here): .ci/run runs it with --ignored"]
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
#[ignore = "long (over 3 s here): .ci/run runs it with --ignored"]
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
#[ignore = "long (over 3 s here): .ci/run runs it with --ignored"]
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
    let finished = subscriber.finish(STEP);
    let report = json_file(&json);
    // Frames lost on a loaded machine make the stream incomplete (5), and only then.
    let status = if report["gaps"] == 0 { 0 } else { 5 };
    assert_eq!(finished.code(), Some(status), "{finished:?}");
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
#[ignore = "long (over 3 s here): .ci/run runs it with --ignored"]
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
#[ignore = "long (over 3 s here): .ci/run runs it with --ignored"]
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
    let _shared = mdrelay_harness::shared();
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
    assert!(done.stderr.contains("record (") && done.stderr.contains("line 2): empty file name"), "{}", done.stderr);
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
    let _shared = mdrelay_harness::shared();
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
    let _shared = mdrelay_harness::shared();
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

/// The numbered files of a recording at `path` rotated as docs/recording.md names them (`day.pcap.gz`:
/// `day.000001.pcap.gz`, ...), by number; `stem` and `extension` split the name.
fn rotated_files(dir: &Path, stem: &str, extension: &str) -> Vec<PathBuf> {
    let mut files: Vec<(u64, PathBuf)> = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|entry| {
            let name = entry.unwrap().file_name().into_string().ok()?;
            let number = name.strip_prefix(stem)?.strip_prefix('.')?.strip_suffix(extension)?;
            (number.len() >= 6 && number.bytes().all(|b| b.is_ascii_digit()))
                .then(|| (number.parse().unwrap(), dir.join(&name)))
        })
        .collect();
    files.sort();
    files.into_iter().map(|(_, path)| path).collect()
}

/// The number in a rotated file's name.
fn number_of(path: &Path) -> u64 {
    let name = path.file_name().unwrap().to_str().unwrap();
    name.split('.').find(|part| part.len() >= 6 && part.bytes().all(|b| b.is_ascii_digit())).unwrap().parse().unwrap()
}

/// Looks at a directory every few milliseconds while a recording runs, and keeps the most
/// rotated files seen there at once.
struct Watch {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<usize>,
}

impl Watch {
    fn start(dir: &Path, stem: &'static str, extension: &'static str) -> Watch {
        let (stop, dir) = (Arc::new(AtomicBool::new(false)), dir.to_path_buf());
        let stopped = Arc::clone(&stop);
        let thread = std::thread::spawn(move || {
            let mut most = 0;
            while !stopped.load(Ordering::Relaxed) {
                most = most.max(rotated_files(&dir, stem, extension).len());
                std::thread::sleep(Duration::from_millis(2));
            }
            most
        });
        Watch { stop, thread }
    }

    /// The most files seen at once.
    fn most(self) -> usize {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().unwrap()
    }
}

/// Classic pcap files, gzipped or not, made one: the first file's header, then every file's
/// records in order. A capture split into files gives the capture again.
fn concatenated_pcap(files: &[PathBuf], out: &Path) {
    let mut whole = Vec::new();
    for (i, file) in files.iter().enumerate() {
        let bytes =
            if file.extension().is_some_and(|e| e == "gz") { gunzip(file) } else { std::fs::read(file).unwrap() };
        assert!(bytes.len() >= 24, "{}: no pcap header", file.display());
        whole.extend_from_slice(if i == 0 { &bytes } else { &bytes[24..] });
    }
    std::fs::write(out, whole).unwrap();
}

/// Receive times of the records of a classic pcap with nanosecond stamps (gzipped or not):
/// the first and the last, in ns.
fn pcap_time_span(file: &Path) -> (u64, u64) {
    let bytes = if file.extension().is_some_and(|e| e == "gz") { gunzip(file) } else { std::fs::read(file).unwrap() };
    assert_eq!(&bytes[..4], &0xa1b2_3c4d_u32.to_le_bytes(), "{}: a nanosecond pcap", file.display());
    let (mut at, mut first, mut last) = (24, None, 0);
    while at + 16 <= bytes.len() {
        let field = |i: usize| u64::from(u32::from_le_bytes(bytes[at + i..at + i + 4].try_into().unwrap()));
        let time = field(0) * 1_000_000_000 + field(4);
        first.get_or_insert(time);
        last = time;
        at += 16 + field(8) as usize;
    }
    assert_eq!(at, bytes.len(), "{}: ends with a whole record", file.display());
    (first.expect("a file holds packets"), last)
}

/// Readings of the parts of a capture by the reference reader, their counts added: packets,
/// segments, heartbeats, messages, messages by type and the total trade volume. (Per-symbol
/// figures are compared on the parts made one again: the reader lists only the symbols with a
/// trade or a quote in each part.)
fn added_counts(readings: &[Value]) -> Value {
    let mut sums = Map::new();
    let mut types: Map<String, Value> = Map::new();
    for reading in readings {
        for key in ["packets", "segments", "heartbeats", "messages", "total_trade_volume"] {
            let sum = sums.get(key).and_then(Value::as_u64).unwrap_or(0) + reading[key].as_u64().unwrap_or(0);
            sums.insert(key.into(), json!(sum));
        }
        for (kind, n) in reading["message_types"].as_object().unwrap() {
            let sum = types.get(kind).and_then(Value::as_u64).unwrap_or(0) + n.as_u64().unwrap();
            types.insert(kind.clone(), json!(sum));
        }
    }
    sums.insert("message_types".into(), Value::Object(types));
    Value::Object(sums)
}

/// Asserts the rotated files of a whole relay of DEEP10, every one kept, are exactly DEEP10:
/// their counts added up, and the files made one (as inspected and read by the reference
/// reader, with DEEP10's 11 restarts and no gap, so the segments' sequence numbers run on from
/// one file to the next).
fn assert_files_are_deep10(files: &[PathBuf], dir: &Path, context: &str) {
    let reference = expected("DEEP10.json");
    let readings: Vec<Value> = files.iter().map(|file| reference_output(file)).collect();
    let added = added_counts(&readings);
    for (key, value) in added.as_object().unwrap() {
        assert_eq!(value, &reference[key], "{context}: {key} of the files added up");
    }
    let whole = dir.join("whole.pcap");
    concatenated_pcap(files, &whole);
    let inspected = inspect(&whole);
    assert_is_deep10(&inspected, &reference, context);
    assert_sound(&inspected, context);
    assert_eq!((&inspected["restarts"], &inspected["gaps"]), (&json!(11), &json!(0)), "{context}: the files made one");
    assert_is_deep10(&reference_output(&whole), &reference, context);
    std::fs::remove_file(whole).unwrap();
}

#[test]
#[ignore = "long (over 3 s here): .ci/run runs it with --ignored"]
fn size_rotation_with_a_cap_keeps_at_most_that_many_complete_files() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let (json, record) = (dir.path().join("sub.json"), dir.path().join("day.pcap.gz"));
    let metrics: SocketAddr = format!("127.0.0.1:{}", free_tcp_port()).parse().unwrap();
    let (limit, cap) = (256 << 10, 3);
    let watch = Watch::start(dir.path(), "day", ".pcap.gz");
    let (publisher, addr) = tcp_publisher(&deep10(), "sbe", &[]);
    let metrics_arg = metrics.to_string();
    let extra = [
        "--record-rotate-size",
        "256KiB",
        "--record-max-files",
        "3",
        "--metrics-listen",
        &metrics_arg,
        "--metrics-hold",
        "60",
    ];
    let mut subscriber = tcp_subscriber(addr, &json, &record, &extra);
    publisher.finish(RUN).assert_success();
    subscriber.wait_for_within("metrics endpoint stays up", RUN);
    let most = watch.most();
    let report = json_file(&json);
    let scraped = scrape(metrics).unwrap();
    let kept = Path::new(env!("CARGO_TARGET_TMPDIR")).join("metrics");
    std::fs::create_dir_all(&kept).unwrap();
    std::fs::write(kept.join("sub-recording.prom"), &scraped.text).unwrap();
    subscriber.signal(Signal::SIGTERM);
    subscriber.finish(STEP).assert_success();

    assert_recorded_all(&report, "rotated by size");
    assert_eq!(report["record"]["segments"], expected("DEEP10.json")["segments"]);
    let r = &report["record"];
    let written = r["files_written"].as_u64().unwrap();
    // DEEP10 gzipped is about 5.6 MB: some twenty files of 256 KiB.
    assert!(written >= 2 * cap, "several files: {r}");
    assert_eq!(r["files_removed"].as_u64().unwrap(), written - cap, "{r}");
    // The last file is closed by the end of the run, unless its last segment filled it.
    let rotated = r["files_rotated"].as_u64().unwrap();
    assert!(rotated == written - 1 || rotated == written, "{r}");
    assert_eq!(most as u64, cap, "the most files seen at once: never over the cap, which was reached");

    let files = rotated_files(dir.path(), "day", ".pcap.gz");
    let numbers: Vec<u64> = files.iter().map(|f| number_of(f)).collect();
    assert_eq!(numbers, ((written - cap + 1)..=written).collect::<Vec<_>>(), "the newest files are kept");
    assert_eq!(r["last_file"], text(files.last().unwrap()), "{r}");
    assert!(!record.exists(), "with rotation only numbered files are written");
    let mut bytes_kept = 0;
    for (i, file) in files.iter().enumerate() {
        let context = text(file);
        let size = std::fs::metadata(file).unwrap().len();
        bytes_kept += size;
        // A file closes once the compressed bytes reaching it pass the size; the compressor
        // holds up to its buffers' worth (64 KiB in, 32 KiB out) that have not reached it yet.
        assert!(size <= limit + (96 << 10), "{context}: {size} bytes, over {limit} by more than the compressor holds");
        if i + 1 < files.len() {
            assert!(size >= limit, "{context}: {size} bytes, closed before it was full");
        }
        gunzip(file);
        let inspected = inspect(file);
        assert_sound(&inspected, &context);
        assert!(inspected["segments"].as_u64().unwrap() > 0, "{context}");
        let reading = reference_output(file);
        assert_eq!(reading["messages"], inspected["messages"], "{context}");
        assert_eq!(reading["message_types"], inspected["message_types"], "{context}");
    }

    // The endpoint's counters are the report's.
    for (metric, key) in [
        ("mdrelay_sub_record_segments_total", "segments"),
        ("mdrelay_sub_record_bytes_total", "bytes"),
        ("mdrelay_sub_record_dropped_segments_total", "dropped_segments"),
        ("mdrelay_sub_record_files_written_total", "files_written"),
        ("mdrelay_sub_record_files_rotated_total", "files_rotated"),
        ("mdrelay_sub_record_files_removed_total", "files_removed"),
    ] {
        assert_eq!(scraped.get(metric, ""), r[key].as_f64(), "{metric} against the report's {key}");
    }
    assert!(r["bytes"].as_u64().unwrap() >= bytes_kept, "every byte written is counted: {r}");
    eprintln!("rotated by size with a cap: {r}; kept {} files, {bytes_kept} bytes", files.len());
}

#[test]
#[ignore = "long (over 3 s here): .ci/run runs it with --ignored"]
fn size_rotation_keeps_every_file_and_together_they_are_exactly_deep10() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let record = dir.path().join("day.pcap");
    let limit = 2 << 20;
    let json = dir.path().join("sub.json");
    let (publisher, addr) = tcp_publisher(&deep10(), "capnp", &[]);
    let subscriber = tcp_subscriber(addr, &json, &record, &["--record-rotate-size", "2MiB"]);
    publisher.finish(RUN).assert_success();
    subscriber.finish(STEP).assert_success();
    let report = json_file(&json);
    assert_recorded_all(&report, "rotated by size, every file kept");
    let r = &report["record"];
    let files = rotated_files(dir.path(), "day", ".pcap");
    let written = r["files_written"].as_u64().unwrap();
    assert!(written >= 5, "DEEP10 as pcap is over 20 MB: {r}");
    assert_eq!(files.iter().map(|f| number_of(f)).collect::<Vec<_>>(), (1..=written).collect::<Vec<_>>());
    assert_eq!(r["files_removed"], 0, "{r}");
    let mut total = 0;
    for (i, file) in files.iter().enumerate() {
        let size = std::fs::metadata(file).unwrap().len();
        total += size;
        // Uncompressed, a file closes at the first whole record that takes it to the size.
        if i + 1 < files.len() {
            assert!((limit..limit + 65_536 + 16).contains(&size), "{}: {size} bytes", file.display());
        }
        assert_sound(&inspect(file), &text(file));
    }
    assert_eq!(r["bytes"], total, "{r}");
    assert_files_are_deep10(&files, dir.path(), "the files rotated by size");
    eprintln!("rotated by size, every file kept: {r}");
}

#[test]
#[ignore = "long (over 3 s here): .ci/run runs it with --ignored"]
fn time_rotation_closes_complete_files_while_the_relay_goes_on() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let record = dir.path().join("day.pcap.gz");
    let json = dir.path().join("sub.json");
    // Paced to about 8 s: several one-second files.
    let (publisher, addr) = tcp_publisher(&deep10(), "flatbuffers", &["--pacing", "rate", "--rate", "50000"]);
    let extra = ["--record-rotate-interval", "1", "--report-interval", "0.1"];
    let mut subscriber = tcp_subscriber(addr, &json, &record, &extra);
    // While the relay goes on, a file whose second is over is complete on disk: the second
    // file is begun once the first is finished.
    let second = dir.path().join("day.000002.pcap.gz");
    subscriber.wait_for_within(&format!("recording to a new file file={}", second.display()), RUN);
    let first = dir.path().join("day.000001.pcap.gz");
    gunzip(&first);
    let inspected = inspect(&first);
    // The report's file is created at start and written at the end.
    assert_eq!(std::fs::metadata(&json).unwrap().len(), 0, "the relay still goes on: no report yet");
    assert_sound(&inspected, "the first file, read while the relay goes on");
    assert!(inspected["segments"].as_u64().unwrap() > 0, "{inspected}");
    publisher.finish(RUN).assert_success();
    let finished = subscriber.finish(STEP);
    finished.assert_success();
    let report = json_file(&json);
    assert_recorded_all(&report, "rotated by time");
    let r = &report["record"];
    let files = rotated_files(dir.path(), "day", ".pcap.gz");
    let written = r["files_written"].as_u64().unwrap();
    assert!(written >= 4, "an 8 s relay in one-second files: {r}");
    assert_eq!(files.len() as u64, written, "{r}");
    // Every file but the last was closed because its second was up; the last one too when its
    // second ran out before the stream ended.
    let rotated = r["files_rotated"].as_u64().unwrap();
    assert!(rotated == written - 1 || rotated == written, "{r}");
    let mut previous_last = 0;
    for file in &files {
        let (first, last) = pcap_time_span(file);
        assert!(last - first < 1_000_000_000, "{}: spans {} ns, a second or more", file.display(), last - first);
        assert!(first >= previous_last, "{}: files follow each other in time", file.display());
        previous_last = last;
        assert_sound(&inspect(file), &text(file));
    }
    assert_files_are_deep10(&files, dir.path(), "the files rotated by time");
    eprintln!("rotated by time: {r}");
}

#[test]
fn an_earlier_rotated_recording_is_kept_unless_overwrite_is_asked_and_never_through_a_link() {
    let _shared = mdrelay_harness::shared();
    let dir = tempfile::tempdir().unwrap();
    let (listener, addr) = silent_port();
    let record = dir.path().join("day.pcap");
    let rotate = ["--record-rotate-size", "1MiB"];
    let (earlier_first, earlier_last) = (dir.path().join("day.000001.pcap"), dir.path().join("day.000007.pcap"));
    // Files of other names beside it: the unnumbered path, and numbers too short to be ours.
    let others = [dir.path().join("day.pcap"), dir.path().join("day.notes.pcap"), dir.path().join("day.01.pcap")];
    for file in [&earlier_first, &earlier_last].into_iter().chain(&others) {
        std::fs::write(file, b"earlier").unwrap();
    }
    let done = record_to(&addr, &record, &rotate);
    assert_refused(&done, &earlier_first, "2 of an earlier recording");
    assert!(done.stderr.contains("--record-overwrite"), "{done:?}");
    assert_eq!(std::fs::read(&earlier_last).unwrap(), b"earlier");
    assert!(listener.accept().is_err(), "refused before connecting");

    // A symbolic link among them is not followed, nor removed, even when overwriting.
    let victim = dir.path().join("victim");
    std::fs::write(&victim, b"precious").unwrap();
    let link = dir.path().join("day.000002.pcap");
    std::os::unix::fs::symlink(&victim, &link).unwrap();
    let done = record_to(&addr, &record, &[&rotate[..], &["--record-overwrite"]].concat());
    assert_eq!(done.code(), Some(2), "{done:?}");
    assert!(done.stderr.contains(&format!("cannot remove {}", link.display())), "{done:?}");
    assert_eq!(std::fs::read(&victim).unwrap(), b"precious");
    assert!(listener.accept().is_err(), "refused before connecting");
    std::fs::remove_file(&link).unwrap();

    let done = record_to(&addr, &record, &[&rotate[..], &["--record-overwrite"]].concat());
    assert_eq!(done.code(), Some(0), "{done:?}");
    assert!(!earlier_last.exists(), "the earlier recording's files are removed");
    assert_eq!(inspect(&earlier_first)["packets"], 0, "the first file is the new recording's (empty) capture");
    for file in &others {
        assert_eq!(std::fs::read(file).unwrap(), b"earlier", "{} is not the recording's", file.display());
    }
}

#[test]
fn absurd_rotation_settings_are_refused_naming_the_setting() {
    let _shared = mdrelay_harness::shared();
    let dir = tempfile::tempdir().unwrap();
    let record = text(&dir.path().join("day.pcap"));
    let config = dir.path().join("sub.toml");
    let base = ["--connect", "127.0.0.1:9", "--record", &record];
    let cases: [(&[&str], &str); 8] = [
        (
            &["--record-rotate-size", "1KiB"],
            "record_rotate_size (--record-rotate-size): 1024 bytes is out of range (64KiB to 1TiB)",
        ),
        (
            &["--record-rotate-size", "2TiB"],
            "record_rotate_size (--record-rotate-size): 2199023255552 bytes is out of range",
        ),
        // Read as the flag is parsed, as every size and duration flag is.
        (
            &["--record-rotate-size", "lots"],
            "invalid value 'lots' for '--record-rotate-size <SIZE>': \"lots\" is not a size",
        ),
        (
            &["--record-rotate-interval", "0.5"],
            "record_rotate_interval (--record-rotate-interval): 0.5 seconds is out of range",
        ),
        (
            &["--record-rotate-interval", "1e9"],
            "record_rotate_interval (--record-rotate-interval): 1000000000 seconds is out of range",
        ),
        (
            &["--record-rotate-size", "1MiB", "--record-max-files", "0"],
            "record_max_files (--record-max-files): 0 is out of range",
        ),
        (&["--record-max-files", "3"], "record_max_files (--record-max-files): only used with rotation"),
        (
            &["--record-rotate-interval", "60", "--record-max-files", "2000000"],
            "record_max_files (--record-max-files): 2000000",
        ),
    ];
    for (extra, message) in cases {
        let done = Process::start(subscriber_bin(), base.iter().chain(extra)).finish(STEP);
        assert_eq!(done.code(), Some(2), "{extra:?}: {done:?}");
        assert!(done.stderr.contains(message), "{extra:?}: wanted {message:?}: {}", done.stderr);
    }
    // Without a recording, its settings mean nothing.
    let done =
        Process::start(subscriber_bin(), ["--connect", "127.0.0.1:9", "--record-rotate-size", "1MiB"]).finish(STEP);
    assert_eq!(done.code(), Some(2), "{done:?}");
    assert!(
        done.stderr.contains("record_rotate_size (--record-rotate-size): only used with record"),
        "{}",
        done.stderr
    );
    // In a file, the file and line are named.
    std::fs::write(&config, format!("connect = \"127.0.0.1:9\"\nrecord = \"{record}\"\nrecord_rotate_size = 1000\n"))
        .unwrap();
    let done = Process::start(subscriber_bin(), ["--config", &text(&config)]).finish(STEP);
    assert_eq!(done.code(), Some(2), "{done:?}");
    assert!(
        done.stderr.contains(&format!("record_rotate_size ({}, line 3): 1000 bytes is out of range", text(&config))),
        "{}",
        done.stderr
    );
    assert!(!dir.path().join("day.000001.pcap").exists() && !Path::new(&record).exists(), "nothing created");
}

/// Whether a file is one whole gzip stream, its trailer included.
fn is_whole_gzip(path: &Path) -> bool {
    let Ok(file) = std::fs::File::open(path) else { return false };
    MultiGzDecoder::new(file).read_to_end(&mut Vec::new()).is_ok()
}

#[test]
#[ignore = "long (over 3 s here): .ci/run runs it with --ignored"]
fn a_file_whose_time_is_up_is_finished_even_when_the_stream_goes_quiet() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let (record, json) = (dir.path().join("quiet.pcap.gz"), dir.path().join("sub.json"));
    let (publisher, addr) = tcp_publisher(&deep10(), "sbe", &["--pacing", "rate", "--rate", "50000"]);
    let extra = ["--record-rotate-interval", "3", "--report-interval", "0.1"];
    let mut subscriber = tcp_subscriber(addr, &json, &record, &extra);
    subscriber.wait_for_frames(1_000);
    // The publisher stops sending mid-stream, its connection open: nothing more arrives.
    publisher.signal(Signal::SIGSTOP);
    let first = dir.path().join("quiet.000001.pcap.gz");
    let stopped = std::time::Instant::now();
    // Every chunk reaches the file as a whole gzip member, so the file reads whole before it is
    // finished too: its finish is the writer's log line.
    subscriber.wait_for(&format!("recording file finished file={}", first.display()));
    let waited = stopped.elapsed();
    assert!(is_whole_gzip(&first), "{}: a whole gzip stream", first.display());
    assert_sound(&inspect(&first), "the file finished while the stream is quiet");
    assert!(!dir.path().join("quiet.000002.pcap.gz").exists(), "no file is begun without a segment for it");
    assert_eq!(std::fs::metadata(&json).unwrap().len(), 0, "the run goes on: no report yet");
    publisher.signal(Signal::SIGCONT);
    publisher.finish(RUN).assert_success();
    subscriber.finish(STEP).assert_success();
    let report = json_file(&json);
    assert_recorded_all(&report, "a quiet stream rotated by time");
    let files = rotated_files(dir.path(), "quiet", ".pcap.gz");
    assert!(files.len() >= 2, "{}", report["record"]);
    assert_files_are_deep10(&files, dir.path(), "rotated by time across a quiet stream");
    eprintln!("finished {waited:?} after the stream went quiet (interval 3 s): {}", report["record"]);
}
