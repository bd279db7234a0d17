//! Resuming TCP subscribers under load, on real processes over loopback.
//!
//! - Hundreds of connections that ask for the session from its first frame and then never read
//!   hold no more than the replay budget (`tcp.replay_bytes`) between them, and are cut off as
//!   slow once a replay chunk has waited `tcp.replay_timeout` for them.
//! - Dozens of replays at once neither hold back nor cut off a live subscriber beside them.
//!
//! Each case checks a healthy subscriber against the reference outputs in ../shared, and every
//! replay that reaches the live stream is checked for a gap or a duplicate where it hands over.

use crate::common::{StatusPeak, assert_exact_deep10};
use mdrelay_harness::{Process, iex_data, json_file, publisher_bin, serial, subscriber_bin};
use mdrelay_proto::relay::{Hello, RecordHeader, RecordTag, Resume, Subscribe};
use serde_json::Value;
use std::io::{BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// Every process step in these tests is bounded by this.
const LIMIT: Duration = Duration::from_secs(90);

/// The replay budget the first test configures: 8 MiB.
const BUDGET: u64 = 8 << 20;

/// Connections that resume and never read, in the first test.
const STALLED: usize = 500;

/// Replays at once, in the second test.
const REPLAYS: usize = 60;

/// Frames past the greeting's next frame a replaying client reads: the publisher joins it to the
/// live stream a moment after the greeting, a few frames later (the stream sends about 15 a
/// millisecond).
const HAND_OVER_MARGIN: u64 = 2_000;

/// Raises this process's soft limit of open files to `wanted` (within the hard limit), and says
/// whether the limit now allows that many: the first test holds hundreds of connections, and the
/// publisher, its child, inherits the limit.
fn raise_open_files(wanted: u64) -> bool {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).expect("the limit of open files");
    if soft < wanted {
        setrlimit(Resource::RLIMIT_NOFILE, wanted.min(hard), hard).expect("raising the soft limit of open files");
    }
    getrlimit(Resource::RLIMIT_NOFILE).expect("the limit of open files").0 >= wanted
}

/// A publisher configuration: DEEP10 in SBE at `rate` messages/s (it has 391,999) over TCP on a
/// port of the publisher's choosing, waiting for one subscriber, with `tcp` lines added to
/// `[tcp]`.
fn config(dir: &Path, rate: u32, tcp: &str) -> String {
    let text = format!(
        "format = \"sbe\"\n[source]\ncapture = \"{}\"\n[pacing]\nmode = \"rate\"\nrate = {rate}\n\
         [tcp]\nlisten = \"127.0.0.1:0\"\nwait_subscribers = 1\n{tcp}\n",
        iex_data().join("DEEP10.pcap.gz").display()
    );
    let path = dir.join("pub.toml");
    std::fs::write(&path, text).unwrap();
    path.display().to_string()
}

/// The healthy subscriber: reads everything, reports to `json`, says how many frames it has
/// every 0.1 s.
fn healthy(addr: SocketAddr, json: &str) -> Process {
    let connect = addr.to_string();
    Process::start(subscriber_bin(), ["--connect", &connect, "--json", json, "--report-interval", "0.1"])
}

/// Asserts a subscriber report is the whole of DEEP10, exactly, received over one connection.
fn assert_exact_deep10_on_one_connection(report: &Value, context: &str) {
    assert_exact_deep10(report, context);
    assert_eq!(report["reconnects"], 0, "{context}: reconnects (it was never cut off)");
}

/// Connects with a small receive buffer (set before connecting: afterwards the window is already
/// negotiated), and answers the greeting with `answer`. The client never reads again, so its side
/// is full after a few kilobytes.
fn stalled(addr: SocketAddr, answer: &Subscribe) -> TcpStream {
    let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    socket.connect(&addr.into()).unwrap_or_else(|e| panic!("connecting to {addr}: {e}"));
    let mut s: TcpStream = socket.into();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s.set_write_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut hello = [0u8; Hello::LEN];
    s.read_exact(&mut hello).unwrap_or_else(|e| panic!("reading the greeting from {addr}: {e}"));
    Hello::parse(&hello).unwrap();
    s.write_all(&answer.to_bytes()).unwrap_or_else(|e| panic!("answering {addr}: {e}"));
    s
}

/// What one run with stalled connections showed.
struct StalledRun {
    /// The publisher's peak resident set, bytes.
    peak: u64,
    /// The publisher's summary.
    publisher: Value,
}

/// DEEP10 to a healthy subscriber, with [`STALLED`] connections that answer `answer` once the
/// stream runs and never read; the healthy subscriber must end exact.
fn run_with_stalled(answer: Subscribe, context: &str) -> StalledRun {
    let dir = tempfile::tempdir().unwrap();
    // 16 s of stream: time enough, on a loaded machine, for the connections to be made while it
    // runs.
    let config = config(
        dir.path(),
        25_000,
        &format!("max_connections = 600\ndrain_timeout = 1\nreplay_bytes = {BUDGET}\nreplay_timeout = 1"),
    );
    let pub_json = dir.path().join("pub.json").display().to_string();
    let mut publisher = Process::start(publisher_bin(), ["run", "--config", &config, "--json", &pub_json]);
    let addr = publisher.serving_on();
    let peak = StatusPeak::start(publisher.pid(), "VmHWM:");
    let sub_json = dir.path().join("sub.json").display().to_string();
    let mut sub = healthy(addr, &sub_json);
    // A fifth of DEEP10 in the ring: each replay has megabytes to send.
    sub.wait_for_frames(25_000);
    // Made from a few threads at once: one after the other, each waits for the publisher.
    let makers: Vec<_> = (0..10)
        .map(|_| std::thread::spawn(move || (0..STALLED / 10).map(|_| stalled(addr, &answer)).collect::<Vec<_>>()))
        .collect();
    let stalled: Vec<TcpStream> = makers.into_iter().flat_map(|m| m.join().expect("connections made")).collect();
    publisher.finish(LIMIT).assert_success();
    let peak = peak.max_kb() * 1024;
    sub.finish(LIMIT).assert_success();
    drop(stalled);
    assert_exact_deep10_on_one_connection(
        &json_file(Path::new(&sub_json)),
        &format!("the healthy subscriber beside {context}"),
    );
    StalledRun { peak, publisher: json_file(Path::new(&pub_json)) }
}

#[test]
#[ignore = "long (over 3 s here): .ci/run runs it with --ignored"]
fn resuming_connections_that_never_read_hold_no_more_than_the_replay_budget() {
    let _serial = serial();
    assert!(
        raise_open_files(STALLED as u64 + 256),
        "the hard limit of open files is below the {} this test needs",
        STALLED + 256
    );
    // The same run twice: the stalled connections join live, then they resume from the first
    // frame. What the second run holds beyond the first is the replays' memory.
    let live = run_with_stalled(Subscribe::new(false), "500 stalled live connections");
    let resumed = run_with_stalled(
        Subscribe { resume: Resume::From(1), ..Subscribe::new(false) },
        "500 stalled resuming connections",
    );
    let mib = |b: u64| b as f64 / f64::from(1 << 20);
    eprintln!(
        "publisher peak RSS: {:.1} MiB with {STALLED} stalled live connections, {:.1} MiB with {STALLED} \
         stalled resuming ones",
        mib(live.peak),
        mib(resumed.peak)
    );
    // The budget, and as much again for the allocator's slack.
    let bound = live.peak + 2 * BUDGET;
    assert!(
        resumed.peak <= bound,
        "{STALLED} resuming connections that never read hold {:.1} MiB over the same run with live ones; \
         the replay budget is {:.1} MiB",
        mib(resumed.peak.saturating_sub(live.peak)),
        mib(BUDGET)
    );
    // A replay chunk they never took cut them off, one budget's worth at a time, as slow.
    let slow = resumed.publisher["connections"]["disconnects_slow"].as_u64().unwrap();
    assert!(slow > 0, "resuming connections that never read are cut off as slow: {}", resumed.publisher);
    assert_eq!(live.publisher["connections"]["disconnects_slow"], 0, "live ones are dropped for, not cut off");
}

/// What one replaying client saw.
#[derive(Default)]
struct Replays {
    /// Replays that reached the live stream, the hand-over checked.
    handed_over: u64,
    /// Bytes received over all its connections.
    bytes: u64,
    /// Connections that ended early (cut off, or refused at the end of the stream).
    cut: u64,
}

/// Reads one record header, and the payload into `scratch`; `None` when the connection ended.
fn next_record(s: &mut impl Read, scratch: &mut Vec<u8>) -> Option<RecordHeader> {
    let mut header = [0u8; RecordHeader::LEN];
    s.read_exact(&mut header).ok()?;
    let header = RecordHeader::parse(&header, 64 << 20).expect("a record header from the publisher");
    scratch.resize(header.length as usize, 0);
    s.read_exact(scratch).ok()?;
    Some(header)
}

/// Resumes from the first frame, over and over until `stop`, reading each replay until it has
/// gone past where the stream was at the greeting (into the live stream), and checking that
/// every frame comes once and in order.
fn replay_until(addr: SocketAddr, stop: &AtomicBool) -> Replays {
    let mut seen = Replays::default();
    let mut scratch = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        let Ok(mut s) = TcpStream::connect(addr) else {
            // The stream has ended: no new connections.
            seen.cut += 1;
            std::thread::sleep(Duration::from_millis(50));
            continue;
        };
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let mut hello = [0u8; Hello::LEN];
        if s.read_exact(&mut hello).is_err() {
            seen.cut += 1;
            continue;
        }
        let live_from = Hello::parse(&hello).unwrap().next_sequence;
        let answer = Subscribe { resume: Resume::From(1), ..Subscribe::new(false) };
        if s.write_all(&answer.to_bytes()).is_err() {
            seen.cut += 1;
            continue;
        }
        let mut s = BufReader::with_capacity(256 << 10, s);
        let mut next: Option<u64> = None;
        let handed_over = loop {
            let Some(header) = next_record(&mut s, &mut scratch) else { break false };
            seen.bytes += (RecordHeader::LEN + scratch.len()) as u64;
            match header.tag {
                RecordTag::Format => {
                    let expected = next.unwrap_or(1);
                    assert_eq!(header.sequence, expected, "a FORMAT record names the next frame");
                    next = Some(header.sequence);
                }
                RecordTag::Data => {
                    let expected = next.expect("a FORMAT record first");
                    assert_eq!(header.sequence, expected, "a gap or a duplicate (resumed from frame 1)");
                    next = Some(header.sequence + u64::from(header.frame_count));
                    // Well past where the stream was at the greeting: the hand-over from the
                    // replay to the live records (a little later than the greeting) is behind.
                    if header.sequence > live_from + HAND_OVER_MARGIN {
                        break true;
                    }
                }
                RecordTag::End => break false,
                _ => {}
            }
            if stop.load(Ordering::Relaxed) {
                break false;
            }
        };
        if handed_over {
            seen.handed_over += 1;
        } else if !stop.load(Ordering::Relaxed) {
            seen.cut += 1;
        }
    }
    seen
}

#[test]
#[ignore = "long (over 3 s here): .ci/run runs it with --ignored"]
fn many_replays_at_once_hold_back_no_live_subscriber() {
    let _serial = serial();
    assert!(raise_open_files(REPLAYS as u64 + 256), "the hard limit of open files is too low");
    let dir = tempfile::tempdir().unwrap();
    // A live subscriber a whole queue behind would be cut off, and would have to resume.
    let config =
        config(dir.path(), 50_000, "max_connections = 100\nslow_subscriber = \"disconnect\"\ndrain_timeout = 5");
    let pub_json = dir.path().join("pub.json").display().to_string();
    let mut publisher = Process::start(publisher_bin(), ["run", "--config", &config, "--json", &pub_json]);
    let addr = publisher.serving_on();
    let sub_json = dir.path().join("sub.json").display().to_string();
    let mut sub = healthy(addr, &sub_json);
    sub.wait_for_frames(10_000);
    let stop = Arc::new(AtomicBool::new(false));
    let clients: Vec<_> = (0..REPLAYS)
        .map(|_| {
            let stop = stop.clone();
            std::thread::spawn(move || replay_until(addr, &stop))
        })
        .collect();
    sub.finish(LIMIT).assert_success();
    stop.store(true, Ordering::Relaxed);
    let replays: Vec<Replays> = clients.into_iter().map(|c| c.join().expect("a replaying client")).collect();
    publisher.finish(LIMIT).assert_success();
    let report = json_file(Path::new(&sub_json));
    let latency = &report["latency_ns"];
    let handed_over: u64 = replays.iter().map(|r| r.handed_over).sum();
    let gib = replays.iter().map(|r| r.bytes).sum::<u64>() as f64 / f64::from(1 << 30);
    eprintln!(
        "healthy subscriber beside {REPLAYS} replaying clients ({handed_over} replays, {gib:.2} GiB): p50 {} \
         us, p99 {} us, max {} us",
        latency["p50"].as_u64().unwrap_or(0) / 1000,
        latency["p99"].as_u64().unwrap_or(0) / 1000,
        latency["max"].as_u64().unwrap_or(0) / 1000,
    );
    assert_exact_deep10_on_one_connection(&report, &format!("the live subscriber beside {REPLAYS} replays"));
    for (i, r) in replays.iter().enumerate() {
        assert!(r.handed_over >= 1, "client {i} finished no replay into the live stream ({} cut)", r.cut);
    }
    let publ = json_file(Path::new(&pub_json));
    assert_eq!(publ["connections"]["protocol_violations"], 0, "{publ}");
}
