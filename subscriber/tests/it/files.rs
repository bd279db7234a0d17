//! Files the subscriber is pointed at, as a careless or hostile user would: a configuration
//! that is a device, a huge file or a pipe (read by the loader both programs share, so the
//! publisher is run beside it); a recording path that is a FIFO, a device or a socket; and a
//! recording that fills its disk (a real 3 MiB tmpfs), whose report must count what the files
//! hold, as the independent reference reader finds it.
//!
//! Every wait is bounded; a program reading a device without end is run under an address-space
//! limit, so a regression fails the test instead of exhausting the host's memory.

use mdrelay_harness::{
    Finished, Process, STEP, Signal, alert_queries, expected, free_tcp_port, iex_data, json_file, publisher_bin,
    reference_output, scrape, serial, shared, subscriber_bin,
};
use serde_json::Value;
use std::io::Write;
use std::net::{SocketAddr, TcpListener};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The configuration loader's bound, as docs/operations.md states it (1 MiB).
const CONFIG_BOUND: u64 = 1 << 20;

/// The address space a program reading its configuration may use here: far more than a start
/// needs, far less than a read without end would take before the test's limit.
const ADDRESS_SPACE: &str = "--as=1073741824";

/// The longest a relay of DEEP10 may take (about 3 s; far longer only if something hangs).
const RUN: Duration = Duration::from_secs(120);

fn text(path: &Path) -> String {
    path.display().to_string()
}

/// `program` with `args` under [`ADDRESS_SPACE`], run to its exit within [`STEP`].
fn run_bounded(program: &Path, args: &[&str]) -> Finished {
    let program = text(program);
    let args = [ADDRESS_SPACE, "--", program.as_str()].into_iter().chain(args.iter().copied());
    Process::start("prlimit", args).finish(STEP)
}

/// Asserts a configuration refused with exit code 2 and a message naming `path` and saying
/// each of `says`.
fn assert_config_refused(done: &Finished, path: &Path, says: &[&str], context: &str) {
    assert_eq!(done.code(), Some(2), "{context}: {done:?}");
    let line = done.stderr.lines().find(|l| l.contains(&text(path))).unwrap_or_else(|| {
        panic!("{context}: no line names {}: {done:?}", path.display());
    });
    for word in says {
        assert!(line.contains(word), "{context}: wanted {word:?} in {line:?}");
    }
}

/// The three ways a configuration is read at start: the subscriber's `--check` and run, and
/// the publisher's `run --check`.
fn readers(config: &Path) -> [(PathBuf, Vec<String>); 3] {
    let config = text(config);
    [
        (subscriber_bin(), vec!["--config".into(), config.clone(), "--check".into()]),
        // A run checks the file before anything else: it ends at the refusal.
        (subscriber_bin(), vec!["--config".into(), config.clone(), "--report-interval".into(), "0".into()]),
        (publisher_bin(), vec!["run".into(), "--check".into(), "--config".into(), config]),
    ]
}

#[test]
fn a_configuration_past_the_bound_is_refused_by_both_programs_naming_the_file() {
    let _shared = shared();
    let dir = tempfile::tempdir().unwrap();
    let bound = CONFIG_BOUND.to_string();
    // A device with no end: refused once the bound is read, not read without end.
    for (program, args) in readers(Path::new("/dev/zero")) {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let started = Instant::now();
        let done = run_bounded(&program, &args);
        let context = format!("{} {args:?}", program.display());
        assert_config_refused(&done, Path::new("/dev/zero"), &["more than a configuration file may", &bound], &context);
        eprintln!("{context}: refused in {:?}", started.elapsed());
    }
    // A valid configuration padded with comments to 50 MiB: refused by its size, unread.
    let huge = dir.path().join("huge.toml");
    let valid = "connect = \"127.0.0.1:9\"\n";
    let mut file = std::fs::File::create(&huge).unwrap();
    file.write_all(valid.as_bytes()).unwrap();
    file.write_all(&b"# padding\n".repeat(5 << 20)).unwrap();
    drop(file);
    let size = std::fs::metadata(&huge).unwrap().len();
    for (program, args) in readers(&huge) {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let done = run_bounded(&program, &args);
        let context = format!("{} {args:?}", program.display());
        assert_config_refused(&done, &huge, &[&size.to_string(), &bound], &context);
    }
    // At the bound exactly it is read; a byte more and it is not.
    let at_bound = dir.path().join("at-bound.toml");
    let padding = CONFIG_BOUND as usize - valid.len();
    std::fs::write(&at_bound, format!("{valid}{}", "#".repeat(padding - 1) + "\n")).unwrap();
    assert_eq!(std::fs::metadata(&at_bound).unwrap().len(), CONFIG_BOUND);
    let done = Process::start(subscriber_bin(), ["--config", &text(&at_bound), "--check"]).finish(STEP);
    done.assert_success();
    assert!(done.stdout.contains("tcp = \"127.0.0.1:9\""), "{done:?}");
    let over = dir.path().join("over.toml");
    std::fs::write(&over, format!("{valid}{}", "#".repeat(padding) + "\n")).unwrap();
    let done = Process::start(subscriber_bin(), ["--config", &text(&over), "--check"]).finish(STEP);
    assert_config_refused(&done, &over, &[&(CONFIG_BOUND + 1).to_string(), &bound], "a byte over the bound");
    // A directory, and bytes that are not UTF-8, are named for what they are.
    let done = Process::start(subscriber_bin(), ["--config", &text(dir.path()), "--check"]).finish(STEP);
    assert_config_refused(&done, dir.path(), &["a directory"], "a directory");
    let binary = dir.path().join("binary.toml");
    std::fs::write(&binary, b"connect = \"127.0.0.1:9\"\n# \xff\n").unwrap();
    let done = Process::start(subscriber_bin(), ["--config", &text(&binary), "--check"]).finish(STEP);
    assert_config_refused(&done, &binary, &["not UTF-8", "byte 26"], "not UTF-8");
}

/// Creates a FIFO at `path`.
fn fifo_at(path: &Path) {
    nix::unistd::mkfifo(path, nix::sys::stat::Mode::S_IRUSR | nix::sys::stat::Mode::S_IWUSR).unwrap();
}

/// A thread writing `bytes` into the FIFO at `path` once a reader opens it (waiting at most
/// [`STEP`] for one), until the reader closes it; how many bytes the reader took.
fn feed_fifo(path: &Path, bytes: Vec<u8>) -> JoinHandle<usize> {
    let path = path.to_path_buf();
    std::thread::spawn(move || {
        let deadline = Instant::now() + STEP;
        // Opened non-blocking, which fails (ENXIO) while there is no reader: the thread never
        // hangs in open() waiting for one.
        let file = loop {
            match std::fs::OpenOptions::new().write(true).custom_flags(nix::fcntl::OFlag::O_NONBLOCK.bits()).open(&path)
            {
                Ok(file) => break file,
                Err(e) if e.raw_os_error() == Some(nix::libc::ENXIO) && Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(10));
                }
                Err(e) => panic!("{}: no reader opened it: {e}", path.display()),
            }
        };
        nix::fcntl::fcntl(&file, nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::empty())).unwrap();
        let mut written = 0;
        let mut file = file;
        for piece in bytes.chunks(4096) {
            // The reader closing its end (having refused the rest) ends the feed.
            if file.write_all(piece).is_err() {
                break;
            }
            written += piece.len();
        }
        written
    })
}

#[test]
fn a_pipe_at_start_is_read_within_the_same_bound() {
    let _shared = shared();
    let dir = tempfile::tempdir().unwrap();
    // `--config <(...)`: a pipe with a configuration in it is read as the file would be.
    let fifo = dir.path().join("sub.toml");
    fifo_at(&fifo);
    let configuration = b"connect = \"127.0.0.1:9\"\nreport_interval = 7\n".to_vec();
    let feeder = feed_fifo(&fifo, configuration.clone());
    let done = Process::start(subscriber_bin(), ["--config", &text(&fifo), "--check"]).finish(STEP);
    done.assert_success();
    assert!(done.stdout.contains("report_interval = 7.0"), "{done:?}");
    assert_eq!(feeder.join().unwrap(), configuration.len(), "the whole configuration was read");
    // A pipe that goes on past the bound is refused once the bound is read, not read to its end.
    let endless = 8 * CONFIG_BOUND as usize;
    for (program, args) in readers(&fifo) {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let context = format!("{} {args:?}", program.display());
        let mut padded = b"connect = \"127.0.0.1:9\"\n".to_vec();
        padded.resize(endless, b'\n');
        let feeder = feed_fifo(&fifo, padded);
        let done = run_bounded(&program, &args);
        assert_config_refused(&done, &fifo, &["more than a configuration file may", "1048576"], &context);
        let taken = feeder.join().unwrap();
        assert!(taken < endless / 2, "{context}: the reader stopped at the bound, {taken} bytes taken");
    }
}

/// A TCP port nobody answers on (bound, never accepted), so a subscriber that got past its
/// start would show up as a connection; and its address.
fn silent_port() -> (TcpListener, String) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    (listener, addr)
}

#[test]
fn a_recording_path_that_is_not_a_regular_file_is_refused_at_start_without_waiting() {
    let _shared = shared();
    let dir = tempfile::tempdir().unwrap();
    let (listener, addr) = silent_port();
    let fifo = dir.path().join("live.pcap");
    fifo_at(&fifo);
    let socket_path = dir.path().join("sock.pcap");
    let _socket = std::os::unix::net::UnixListener::bind(&socket_path).unwrap();
    let cases = [
        // No reader: opening it to write would wait for one, before connecting.
        (fifo.clone(), "is a FIFO"),
        (PathBuf::from("/dev/null"), "is a character device"),
        (socket_path.clone(), "is a socket"),
        (dir.path().to_path_buf(), "is a directory"),
    ];
    for (path, what) in cases {
        for extra in [&[][..], &["--record-overwrite"][..]] {
            let record = text(&path);
            let args = ["--connect", &addr, "--record", &record, "--report-interval", "0", "--duration", "1"];
            let started = Instant::now();
            let done = Process::start(subscriber_bin(), args.iter().chain(extra)).finish(Duration::from_secs(10));
            let context = format!("{} {extra:?}", path.display());
            assert_eq!(done.code(), Some(2), "{context}: {done:?}");
            let message = format!("configuration error: record: cannot create {}: it {what}", path.display());
            assert!(done.stderr.contains(&message), "{context}: wanted {message:?}: {done:?}");
            eprintln!("{context}: refused in {:?}", started.elapsed());
        }
    }
    assert!(listener.accept().is_err(), "refused before connecting");
    assert!(std::fs::symlink_metadata(&fifo).unwrap().file_type().is_fifo(), "the FIFO is left as it was");
}

/// A tmpfs of `size` mounted on a new directory, unmounted when dropped: a disk that fills.
struct Tmpfs {
    dir: tempfile::TempDir,
}

impl Tmpfs {
    fn mount(size: &str) -> Tmpfs {
        let dir = tempfile::tempdir().unwrap();
        let done = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size},mode=0700"), "tmpfs"])
            .arg(dir.path())
            .output()
            .expect("mount runs");
        assert!(
            done.status.success(),
            "mounting a {size} tmpfs on {} (the tests run as root): {}",
            dir.path().display(),
            String::from_utf8_lossy(&done.stderr)
        );
        Tmpfs { dir }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        // Lazily, should a process still hold a file there: the mount goes once it lets go.
        let _ = std::process::Command::new("umount").arg("-l").arg(self.dir.path()).status();
    }
}

/// The files in `dir`, by name.
fn files_in(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()).collect();
    files.sort();
    files
}

/// `mdrelay-pub inspect --json` of a capture, which must read it without error.
fn inspect(capture: &Path) -> Value {
    let done = Process::start(publisher_bin(), ["inspect", "--json", &text(capture)]).finish(STEP);
    done.assert_success();
    done.json()
}

/// What a reader of the recording finds, file by file: segments, messages and bytes; each file
/// must read to its end (no record cut short, a whole gzip stream) with the reference reader.
fn what_the_files_hold(dir: &Path, context: &str) -> (u64, u64, u64) {
    let (mut segments, mut messages, mut bytes) = (0, 0, 0);
    for file in files_in(dir) {
        let size = std::fs::metadata(&file).unwrap().len();
        let reading = reference_output(&file);
        let name = text(&file);
        assert_eq!(reading["truncated_records"].as_u64().unwrap_or(0), 0, "{context}: {name} ends inside a record");
        assert_eq!(reading["non_iex_packets"].as_u64().unwrap_or(0), 0, "{context}: {name}");
        let inspected = inspect(&file);
        assert_eq!(inspected["segments"], reading["segments"], "{context}: {name}: inspect and the reference reader");
        for key in ["truncated_records", "malformed_messages", "length_overruns", "message_count_mismatches"] {
            assert_eq!(inspected[key], 0, "{context}: {name}: {key}");
        }
        eprintln!(
            "{context}: {name}: {size} bytes, {} segments, {} messages",
            reading["segments"], reading["messages"]
        );
        segments += reading["segments"].as_u64().unwrap_or(0);
        messages += reading["messages"].as_u64().unwrap_or(0);
        bytes += size;
    }
    (segments, messages, bytes)
}

#[test]
#[ignore = "long (over 3 s here): .ci/run runs it with --ignored"]
fn a_full_disk_leaves_recordings_that_hold_exactly_what_the_report_counts() {
    let _serial = serial();
    let deep10 = text(&iex_data().join("DEEP10.pcap.gz"));
    let reference = expected("DEEP10.json");
    // DEEP10 recorded is over 20 MB plain and about 6 MB gzipped: each fills 3 MiB mid-stream.
    let cases: [(&str, &[&str]); 3] =
        [("day.pcap", &[]), ("day.pcapng.gz", &[]), ("day.pcap.gz", &["--record-rotate-size", "512KiB"])];
    for (name, rotation) in cases {
        let disk = Tmpfs::mount("3m");
        let scratch = tempfile::tempdir().unwrap();
        let json = scratch.path().join("sub.json");
        let record = disk.path().join(name);
        let context = format!("{name} {rotation:?} on a 3 MiB tmpfs");
        let args = ["run", "--capture", &deep10, "--format", "sbe", "--wait-subscribers", "1"];
        let args = args.iter().chain(&["--slow-subscriber", "block", "--tcp", "127.0.0.1:0"]);
        let mut publisher = Process::start(publisher_bin(), args);
        let addr = publisher.serving_on().to_string();
        let metrics: SocketAddr = format!("127.0.0.1:{}", free_tcp_port()).parse().unwrap();
        let metrics_arg = metrics.to_string();
        let (json_arg, record_arg) = (text(&json), text(&record));
        let sub_args = ["--connect", &addr, "--json", &json_arg, "--record", &record_arg, "--report-interval", "0"];
        let served = ["--metrics-listen", &metrics_arg, "--metrics-hold", "60"];
        let mut subscriber = Process::start(subscriber_bin(), sub_args.iter().chain(rotation).chain(&served));
        publisher.finish(RUN).assert_success();
        subscriber.wait_for_within("metrics endpoint stays up", RUN);
        let scraped = scrape(metrics).unwrap();
        subscriber.signal(Signal::SIGTERM);
        let finished = subscriber.finish(STEP);
        assert_eq!(finished.code(), Some(1), "{context}: the exit code says the recording failed: {finished:?}");
        let report = json_file(&json);
        let r = &report["record"];
        let error = r["error"].as_str().unwrap_or_else(|| panic!("{context}: no record error: {r}"));
        assert!(error.contains("No space left on device"), "{context}: {error}");
        // The run went on to the end, whole.
        assert_eq!((&report["stop_reason"], &report["totals_match"]), (&"end".into(), &true.into()), "{context}");
        for key in ["messages", "message_types", "total_trade_volume", "symbols"] {
            assert_eq!(report[key], reference[key], "{context}: {key}");
        }

        let (segments, messages, bytes) = what_the_files_hold(disk.path(), &context);
        eprintln!("{context}: report {r}; files: {segments} segments, {messages} messages, {bytes} bytes");
        assert!(segments > 0, "{context}: the disk held some of the stream");
        assert_eq!(r["segments"], segments, "{context}: segments counted against those in the files");
        assert_eq!(r["messages"], messages, "{context}: messages counted against those in the files");
        assert_eq!(r["bytes"], bytes, "{context}: bytes counted against the files' sizes");
        // Every frame taken is accounted for: in the files, dropped, unrecordable, or not
        // written because the recording had stopped.
        let accounted: u64 = ["segments", "dropped_segments", "unrecordable_segments", "unwritten_segments"]
            .iter()
            .map(|key| r[key].as_u64().unwrap_or_else(|| panic!("{context}: no {key}: {r}")))
            .sum();
        assert_eq!(report["frames"], accounted, "{context}: {r}");
        assert!(r["unwritten_segments"].as_u64().unwrap() > 0, "{context}: {r}");
        if !rotation.is_empty() {
            assert_eq!(r["files_written"], files_in(disk.path()).len(), "{context}: {r}");
        }
        // The endpoint's counters are the report's.
        for (metric, key) in [
            ("mdrelay_sub_record_segments_total", "segments"),
            ("mdrelay_sub_record_bytes_total", "bytes"),
            ("mdrelay_sub_record_unwritten_segments_total", "unwritten_segments"),
        ] {
            assert_eq!(scraped.get(metric, ""), r[key].as_f64(), "{context}: {metric} against the report's {key}");
        }
        // Every recording series an alert reads is served (publisher/tests/it/metrics.rs checks
        // the others, from subscribers that do not record).
        let served = scraped.names();
        for name in alert_queries().iter().filter(|n| n.starts_with("mdrelay_sub_record_")) {
            assert!(served.contains(name), "{context}: an alert reads {name}, which is not served: {served:?}");
        }
        assert!(finished.stdout.contains("STOPPED: cannot write"), "{context}: {}", finished.stdout);
    }
}
