//! Loss on the live input, counted: a real `mdrelay-pub` relaying a live feed that the test sends
//! on loopback as bare IEX-TP datagrams (DEEP10's segments, as the exchange sends them), with a
//! known set of datagrams dropped, some sent twice (as the A and B lines of an exchange do), two
//! pairs swapped, and then a new session.
//!
//! Every expected figure comes from what the test sent, worked out from the segment headers it
//! sent, never from the code under test; the subscriber's aggregates are checked against the
//! reference reader (`../shared/tools/iexref.py`) run over a capture the test writes of the
//! datagrams that reached the relay, each once.
//!
//! Loopback loses nothing unless the relay's receive buffer overflows (16 MiB, forced as root;
//! capped at twice `net.core.rmem_max` otherwise, 8 MiB here). The test sends about 50,000
//! datagrams a second in bursts of 256, a few milliseconds of work for the relay per burst, and
//! reads the kernel's count of datagrams dropped on the relay's socket (`/proc/net/udp`) before
//! it trusts its own expectations: a run that lost any is repeated at a quarter of the rate.

use mdrelay_harness::cli_args::{TCP_LOSSLESS_ONE_SUBSCRIBER, words};
use mdrelay_harness::{
    Process, STEP, Scrape, assert_aggregates, expected, free_tcp_port, free_udp_port, iex_data, json_file,
    publisher_bin, reference_output, scrape, serial, subscriber_bin,
};
use mdrelay_iex::capture::CaptureReader;
use mdrelay_iex::capture_writer::{CaptureWriter, WriterOptions};
use mdrelay_iex::iextp::{HEADER_LEN, Segment, SegmentHeader};
use serde_json::Value;
use std::collections::BTreeSet;
use std::net::{SocketAddr, SocketAddrV4, UdpSocket};
use std::path::Path;
use std::time::Duration;

/// The longest a run may take (the sending is about 3 s; far longer only if something hangs).
const RUN: Duration = Duration::from_secs(180);

/// The session id the feed moves to after DEEP10 (DEEP10's own plus one).
const NEXT_SESSION_OFFSET: u32 = 1;

/// Datagrams of the new session sent after DEEP10: its first segments, renumbered as its own.
const NEW_SESSION_DATAGRAMS: usize = 2_000;

/// One datagram of the feed: its capture time and bytes, and its header.
#[derive(Clone)]
struct Datagram {
    time_ns: i64,
    bytes: Vec<u8>,
    header: SegmentHeader,
}

/// DEEP10's IEX-TP segments in capture order.
fn deep10_segments() -> Vec<Datagram> {
    let mut reader = CaptureReader::open(iex_data().join("DEEP10.pcap.gz")).unwrap();
    let mut segments = Vec::new();
    while let Ok(Some(packet)) = reader.next_packet() {
        let Ok(datagram) = mdrelay_iex::link::udp_datagram(packet.link_type, packet.data) else { continue };
        let Ok(segment) = Segment::parse(datagram.payload) else { continue };
        segments.push(Datagram {
            time_ns: packet.timestamp_ns,
            bytes: datagram.payload.to_vec(),
            header: segment.header,
        });
    }
    assert_eq!(segments.len() as u64, expected("DEEP10.json")["segments"].as_u64().unwrap());
    segments
}

/// Times the numbering starts again at 1 after a datagram that had numbered beyond it.
fn restarts(datagrams: &[Datagram]) -> u64 {
    let mut last_after = 1;
    let mut restarts = 0;
    for d in datagrams {
        if d.header.first_sequence == 1 && last_after > 1 {
            restarts += 1;
        }
        last_after = d.header.first_sequence + i64::from(d.header.message_count);
    }
    restarts
}

/// What the test does to the feed, and what it therefore expects the relay to count.
struct Plan {
    /// The datagrams in the order they are sent (copies and swaps included, drops left out).
    sent: Vec<Datagram>,
    /// The datagrams that reach the relay, each once, in the order sent: what the subscriber
    /// must receive.
    unique: Vec<Datagram>,
    expect: Expected,
}

/// The counts the test expects, from the headers of what it sent and dropped.
#[derive(Debug, Default, PartialEq)]
struct Expected {
    segments: u64,
    dropped_segments: u64,
    gaps: u64,
    gap_messages: u64,
    duplicate_segments: u64,
    reordered_segments: u64,
    late_messages: u64,
    restarts: u64,
}

/// Drops, copies and swaps at fixed positions of DEEP10, then a new session.
fn plan(deep10: &[Datagram]) -> Plan {
    let n = deep10.len();
    // Where the numbering goes back (DEEP10's restarts): nothing is dropped, copied late or
    // swapped near them, so each drop is a plain gap of the numbering it belongs to.
    let mut restart_at = Vec::new();
    let mut next = None;
    for (i, d) in deep10.iter().enumerate() {
        let h = &d.header;
        if next.is_some_and(|next| h.first_sequence < next) {
            restart_at.push(i);
        }
        next = Some(h.first_sequence + i64::from(h.message_count));
    }
    assert!(!restart_at.is_empty(), "DEEP10 numbers again from 1 several times");
    let eligible = |i: usize| i >= 100 && i + 100 < n && restart_at.iter().all(|&r| i.abs_diff(r) > 10);
    let messages = |i: usize| u64::from(deep10[i].header.message_count);

    let mut dropped = vec![false; n];
    for i in 0..n {
        if eligible(i) && i % 997 == 13 {
            dropped[i] = true;
        }
        // Runs of seven datagrams in a row.
        if i % 9973 == 5000 && (i..i + 7).all(eligible) {
            dropped[i..i + 7].iter_mut().for_each(|d| *d = true);
        }
    }
    // A swap: i + 1 (data) before i (data), neither dropped nor beside a drop.
    let swapped: BTreeSet<usize> = (0..n - 2)
        .filter(|&i| i % 15013 == 7000 && eligible(i))
        .filter(|&i| messages(i) > 0 && messages(i + 1) > 0)
        .filter(|&i| !dropped[i - 1..=i + 2].iter().any(|&d| d))
        .collect();
    let clear = |i: usize| !dropped[i] && !swapped.contains(&i) && !swapped.contains(&(i.wrapping_sub(1)));
    // Copies sent right behind the original (as line B's copy), and copies sent three datagrams
    // late; and a copy of every restart's first heartbeat.
    let copy_now: BTreeSet<usize> =
        (0..n).filter(|&i| (eligible(i) && i % 1013 == 400 && clear(i)) || restart_at.contains(&i)).collect();
    let copy_late: BTreeSet<usize> =
        (0..n - 4).filter(|&i| eligible(i) && i % 4999 == 2000 && (i..i + 4).all(clear)).collect();

    let mut sent = Vec::new();
    let mut unique = Vec::new();
    let mut expect = Expected::default();
    let mut late_copies: Vec<(usize, &Datagram)> = Vec::new();
    let mut i = 0;
    while i < n {
        if dropped[i] {
            expect.dropped_segments += 1;
            i += 1;
            continue;
        }
        let order: &[usize] = if swapped.contains(&i) { &[i + 1, i] } else { &[i] };
        for &k in order {
            sent.push(deep10[k].clone());
            unique.push(deep10[k].clone());
            if copy_now.contains(&k) {
                sent.push(deep10[k].clone());
                expect.duplicate_segments += 1;
            }
            if copy_late.contains(&k) {
                late_copies.push((k + 3, &deep10[k]));
            }
            while let Some(pos) = late_copies.iter().position(|&(due, _)| due == k) {
                sent.push(late_copies.swap_remove(pos).1.clone());
                expect.duplicate_segments += 1;
            }
        }
        if swapped.contains(&i) {
            // The later one first opens a gap of the earlier one's messages; the earlier one
            // then fills it.
            expect.gaps += 1;
            expect.reordered_segments += 1;
            expect.late_messages += messages(i);
        }
        i += order.len();
    }
    assert!(late_copies.is_empty());

    // Gaps: each run of consecutive drops that holds messages, revealed by the next datagram
    // that arrives (data or heartbeat: a heartbeat carries the next number).
    let mut pending = 0;
    for (i, &lost) in dropped.iter().enumerate() {
        if lost {
            pending += messages(i);
        } else if pending > 0 {
            expect.gaps += 1;
            expect.gap_messages += pending;
            pending = 0;
        }
    }
    expect.restarts = restarts(&unique);
    assert_eq!(expect.restarts as usize, restart_at.len(), "each restart arrives");

    // Then the feed moves to a new session, numbered from 1 (DEEP10's first segments again).
    let session = deep10[0].header.session_id + NEXT_SESSION_OFFSET;
    for d in &deep10[..NEW_SESSION_DATAGRAMS] {
        let mut d = d.clone();
        d.header.session_id = session;
        d.bytes[..HEADER_LEN].copy_from_slice(&d.header.to_bytes());
        sent.push(d.clone());
        unique.push(d);
    }
    expect.restarts += 1;
    expect.segments = sent.len() as u64;
    assert!(expect.gaps >= 100 && expect.duplicate_segments >= 100 && expect.reordered_segments >= 2, "{expect:?}");
    Plan { sent, unique, expect }
}

/// Datagrams the kernel dropped on the UDP socket bound to `port` (`/proc/net/udp`'s last
/// column), for as long as the socket exists.
fn kernel_drops(port: u16) -> u64 {
    let table = std::fs::read_to_string("/proc/net/udp").expect("reading /proc/net/udp");
    let local = format!(":{port:04X}");
    table
        .lines()
        .skip(1)
        .filter(|line| line.split_whitespace().nth(1).is_some_and(|a| a.ends_with(&local)))
        .filter_map(|line| line.split_whitespace().last()?.parse::<u64>().ok())
        .sum()
}

/// Writes the datagrams as a pcap, as a capture of the feed would hold them.
fn write_capture(path: &Path, datagrams: &[Datagram]) {
    let file = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    let mut writer = CaptureWriter::new(file, WriterOptions::default()).unwrap();
    let (from, to) = ("10.0.0.1:10000".parse().unwrap(), "224.2.3.10:16648".parse::<SocketAddrV4>().unwrap());
    for d in datagrams {
        writer.write_udp(d.time_ns, from, to, &d.bytes).unwrap();
    }
    writer.finish().unwrap();
}

/// What one run left: the publisher's summary, its stdout, the subscriber's report, a scrape
/// of the publisher's metrics after the run, and the datagrams the kernel dropped.
struct Run {
    summary: Value,
    stdout: String,
    stderr: String,
    report: Value,
    metrics: Scrape,
    kernel_drops: u64,
}

/// Sends `sent` to a relay on loopback, `burst` datagrams every 5 ms, with a subscriber behind it.
fn run(dir: &Path, sent: &[Datagram], burst: usize) -> Run {
    let port = free_udp_port();
    let live = format!("127.0.0.1:{port}");
    let metrics: SocketAddr = format!("127.0.0.1:{}", free_tcp_port()).parse().unwrap();
    let pub_json = dir.join("pub.json").display().to_string();
    let sub_json = dir.join("sub.json").display().to_string();
    let mut relay = Process::start(
        publisher_bin(),
        words(&format!(
            "run --live {live} --idle-timeout 3 --format sbe {TCP_LOSSLESS_ONE_SUBSCRIBER} --metrics-listen \
             {metrics} --metrics-hold 10 --json {pub_json}"
        )),
    );
    let addr = relay.serving_on();
    let subscriber = Process::start(
        subscriber_bin(),
        ["--connect", &addr.to_string(), "--json", &sub_json, "--report-interval", "0"],
    );
    // Printed once the live socket is bound: from then on it queues what is sent, while the
    // relay waits for its subscriber.
    relay.wait_for("publishing");
    let sender = UdpSocket::bind("127.0.0.1:0").unwrap();
    for chunk in sent.chunks(burst) {
        for d in chunk {
            sender.send_to(&d.bytes, &live).unwrap();
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    // Drops are counted as datagrams are queued, so the count is complete once all are sent.
    let kernel_drops = kernel_drops(port);
    relay.wait_for_within("metrics endpoint stays up", RUN);
    // Within the hold, which then ends by itself.
    let metrics = scrape(metrics).unwrap();
    let finished = relay.finish(STEP);
    finished.assert_success();
    let subscribed = subscriber.finish(RUN);
    assert_eq!(subscribed.code(), Some(0), "{}", subscribed.stderr);
    Run {
        summary: json_file(Path::new(&pub_json)),
        stdout: finished.stdout,
        stderr: finished.stderr,
        report: json_file(Path::new(&sub_json)),
        metrics,
        kernel_drops,
    }
}

#[test]
#[ignore = "long (over 3 s here): .ci/run runs it with --ignored"]
fn loss_copies_swaps_and_restarts_of_a_live_feed_are_counted_and_copies_not_relayed() {
    let _serial = serial();
    let deep10 = deep10_segments();
    let plan = plan(&deep10);
    let dir = tempfile::tempdir().unwrap();
    let capture = dir.path().join("reached-the-relay.pcap");
    write_capture(&capture, &plan.unique);
    let reference = reference_output(&capture);
    let e = &plan.expect;
    eprintln!("sending {} datagrams: {e:?}", plan.sent.len());

    let mut outcome = None;
    for burst in [256, 64] {
        let run = run(dir.path(), &plan.sent, burst);
        if run.kernel_drops == 0 {
            outcome = Some(run);
            break;
        }
        eprintln!("the kernel dropped {} datagrams on the relay's socket at bursts of {burst}", run.kernel_drops);
    }
    let run = outcome.expect("the relay's socket lost datagrams at every rate: is net.core.rmem_max tiny?");

    // The subscriber got every message that reached the relay, once: copies were not relayed.
    let report = &run.report;
    assert_eq!(
        report["messages"], reference["messages"],
        "messages relayed against those that reached the relay; the relay's feed: {}\n{}",
        run.summary["feed"], run.stderr
    );
    assert_aggregates(report, &reference, "the subscriber behind a lossy, duplicating feed");
    assert_eq!(report["totals_match"], true);
    assert_eq!(run.summary["totals"]["frames"].as_u64(), Some(plan.unique.len() as u64));

    // The relay's summary counts exactly what the test did to the feed.
    let feed = &run.summary["feed"];
    let got = |key: &str| feed[key].as_u64().unwrap_or_else(|| panic!("feed.{key} in {}", run.summary));
    let counted = Expected {
        segments: got("segments"),
        dropped_segments: e.dropped_segments,
        gaps: got("gaps"),
        gap_messages: got("gap_messages"),
        duplicate_segments: got("duplicate_segments"),
        reordered_segments: got("reordered_segments"),
        late_messages: got("late_messages"),
        restarts: got("restarts"),
    };
    assert_eq!(&counted, e, "the relay's feed counts against what the test sent");
    assert_eq!((got("overlapping_segments"), got("repeated_messages")), (0, 0));

    // The printed summary says it in a line.
    let line = run.stdout.lines().find(|l| l.contains("live feed")).unwrap_or_else(|| panic!("{}", run.stdout));
    eprintln!("{line}");
    for part in [
        format!("gaps {} ({} messages missing", e.gaps, e.gap_messages),
        format!("duplicates {}", e.duplicate_segments),
        format!("restarts {}", e.restarts),
    ] {
        assert!(line.contains(&part), "{part:?} not in {line:?}");
    }

    // And so do the metrics, scraped after the run.
    let m = &run.metrics;
    for (metric, want) in [
        ("mdrelay_pub_feed_segments_total", e.segments),
        ("mdrelay_pub_feed_gaps_total", e.gaps),
        ("mdrelay_pub_feed_gap_messages_total", e.gap_messages),
        ("mdrelay_pub_feed_late_messages_total", e.late_messages),
        ("mdrelay_pub_feed_duplicate_segments_total", e.duplicate_segments),
        ("mdrelay_pub_feed_reordered_segments_total", e.reordered_segments),
        ("mdrelay_pub_feed_overlapping_segments_total", 0),
        ("mdrelay_pub_feed_restarts_total", e.restarts),
    ] {
        assert_eq!(m.get(metric, ""), Some(want as f64), "{metric}:\n{}", m.text);
    }
    let kept = Path::new(env!("CARGO_TARGET_TMPDIR")).join("metrics");
    std::fs::create_dir_all(&kept).unwrap();
    std::fs::write(kept.join("publisher-live-feed.prom"), &m.text).unwrap();
}

/// Without loss or copies, the feed counts nothing but DEEP10's own restarts, and the
/// subscriber gets exactly the reference.
#[test]
#[ignore = "long (over 3 s here): .ci/run runs it with --ignored"]
fn a_clean_live_feed_counts_only_its_restarts_and_relays_the_reference() {
    let _serial = serial();
    let deep10 = deep10_segments();
    let dir = tempfile::tempdir().unwrap();
    let reference = expected("DEEP10.json");
    let mut outcome = None;
    for burst in [256, 64] {
        let run = run(dir.path(), &deep10, burst);
        if run.kernel_drops == 0 {
            outcome = Some(run);
            break;
        }
    }
    let run = outcome.expect("the relay's socket lost datagrams at every rate: is net.core.rmem_max tiny?");
    let feed = &run.summary["feed"];
    assert_eq!(feed["segments"], reference["segments"], "{}", run.summary);
    for key in ["gaps", "gap_messages", "duplicate_segments", "reordered_segments", "overlapping_segments"] {
        assert_eq!(feed[key], 0, "{key}: {}", run.summary);
    }
    assert_eq!(feed["restarts"], restarts(&deep10), "{}", run.summary);
    assert_eq!(run.report["messages"], reference["messages"]);
    assert_aggregates(&run.report, &reference, "the subscriber behind a clean live feed");
}
