//! `mdrelay-sub`'s loss recovery, A/B lines and TCP resume, against fakes written here with
//! proto's relay types: a UDP publisher that withholds datagrams on purpose, a retransmission
//! service that serves some frames, answers GONE for others and BUSY once, two lines that lose
//! different frames, and TCP publishers that cut the connection, replay from their ring or speak
//! protocol version 1. Expected aggregates are computed here from the frames that should arrive,
//! with mdrelay-iex's aggregator, independently of the subscriber.
//!
//! As in udp.rs, the sender never has more than a quarter of the subscriber's receive buffer in
//! flight, so loopback loses nothing the test did not withhold.

use crate::common;
use mdrelay_codec::FormatCodec;

use common::*;
use mdrelay_codec::{Codec, Format, Limits};
use mdrelay_harness::{Finished, Process, STEP, accept_within};
use mdrelay_proto::relay::{
    DatagramHeader, DatagramKind, Echo, Hello, Purpose, RecordHeader, RecordTag, Resume, RetransmitRequest, Subscribe,
    control_record, gone_payload,
};
use serde_json::Value;
use socket2::{Domain, Protocol, Socket, Type};
use std::collections::BTreeSet;
use std::io::{ErrorKind, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

const SESSION: u64 = 0x7e57;

/// Frames of a synthetic day, one per segment: raw for the first half, SBE after, as a
/// publisher that switches formats mid-stream sends them. Frame `seq` is `frames[seq - 1]`.
#[derive(Clone)]
struct Feed {
    segments: Vec<Vec<u8>>,
    frames: Vec<(Format, Vec<u8>)>,
}

impl Feed {
    fn new(messages: u64, seed: u64) -> Feed {
        let segments = synthetic(messages, 8, seed);
        let half = segments.len() / 2;
        let mut raw = Codec::new(Format::Raw, Limits::default());
        let mut sbe = Codec::new(Format::Sbe, Limits::default());
        let frames = segments
            .iter()
            .enumerate()
            .map(|(i, s)| {
                let codec = if i < half { &mut raw } else { &mut sbe };
                let mut frame = Vec::new();
                encode(codec, s, &mut frame);
                (codec.format(), frame)
            })
            .collect();
        Feed { segments, frames }
    }

    /// Frames in the feed; sequences run from 1 to this.
    fn len(&self) -> u64 {
        self.frames.len() as u64
    }

    /// The datagram of frame `seq`.
    fn datagram(&self, seq: u64) -> Vec<u8> {
        let (format, frame) = &self.frames[seq as usize - 1];
        data_datagram(*format, SESSION, seq, std::slice::from_ref(frame))
    }

    /// The END datagram, for every frame.
    fn end(&self) -> Vec<u8> {
        end_datagram(&totals(&refs(&self.segments)), SESSION, self.len() + 1)
    }

    /// The report fields for every frame but `missing`.
    fn expected_without(&self, missing: &BTreeSet<u64>) -> Value {
        let received: Vec<&[u8]> = self
            .segments
            .iter()
            .enumerate()
            .filter(|(i, _)| !missing.contains(&(*i as u64 + 1)))
            .map(|(_, s)| s.as_slice())
            .collect();
        expected_report(&received, None)
    }
}

/// A subscriber under test, the addresses of its lines and what may be in flight to it.
struct Receiver {
    process: Process,
    /// Line A's address, and line B's when there is one.
    lines: Vec<SocketAddr>,
    /// A quarter of the smallest receive buffer the kernel granted, shared by both lines.
    budget: usize,
    /// Frames sent (distinct sequence numbers, whatever the line).
    sent: BTreeSet<u64>,
    in_flight: usize,
    /// Charge of the last datagram sent, which is not waited for.
    last: usize,
    /// Called with the frames counted after each wait, before more are sent.
    settle: Option<Box<dyn FnMut(u64)>>,
}

impl Receiver {
    /// Starts `mdrelay-sub` with `args` over `lines` lines; waits until each has bound.
    fn start(args: &[&str], lines: usize) -> Receiver {
        let (process, addrs, budget) = udp_subscriber(args, lines);
        Receiver { process, lines: addrs, budget, sent: BTreeSet::new(), in_flight: 0, last: 0, settle: None }
    }

    /// Sends `datagram` of frame `seq` (0: no frame) to line `line`, first waiting, when the
    /// budget is spent, until the subscriber has counted the frames sent before the last.
    fn send(&mut self, socket: &UdpSocket, line: usize, datagram: &[u8], seq: u64) {
        if self.in_flight + charge(datagram.len()) > self.budget && self.in_flight > self.last {
            let before_last = self.sent.len().saturating_sub(1) as u64;
            self.process.wait_for_frames(before_last);
            if let Some(settle) = &mut self.settle {
                settle(before_last);
            }
            self.in_flight = self.last;
        }
        socket.send_to(datagram, self.lines[line]).unwrap();
        if seq > 0 {
            self.sent.insert(seq);
        }
        self.last = charge(datagram.len());
        self.in_flight += self.last;
    }

    /// Starts `mdrelay-sub` on one loopback line, recovering from the service at `service` and
    /// waiting up to `linger` seconds at the end for what is still missing; `extra` arguments
    /// after those.
    fn recovering(service: &str, linger: &str, extra: &[&str]) -> Receiver {
        let args = ["--listen", "127.0.0.1:0", "--recovery", service, "--recovery-linger", linger];
        Receiver::start(&[&args[..], extra].concat(), 1)
    }

    /// Sends the frames `seqs` of `feed` on line A.
    fn send_frames(&mut self, socket: &UdpSocket, feed: &Feed, seqs: impl IntoIterator<Item = u64>) {
        for seq in seqs {
            self.send(socket, 0, &feed.datagram(seq), seq);
        }
    }

    /// Sends `feed`'s END on line A three times: one may be lost.
    fn send_end(&mut self, socket: &UdpSocket, feed: &Feed) {
        for _ in 0..3 {
            self.send(socket, 0, &feed.end(), 0);
        }
    }

    /// Sends every frame of `feed` but the `withheld`, then its END, from a new sender.
    fn send_all_but(&mut self, feed: &Feed, withheld: &BTreeSet<u64>) {
        let socket = sender();
        self.send_frames(&socket, feed, (1..=feed.len()).filter(|s| !withheld.contains(s)));
        self.send_end(&socket, feed);
    }

    /// Waits for the run to end, then for the fake service's thread: the run's output, what the
    /// service returned, and how long the two took.
    fn finish_with<T>(self, service: JoinHandle<T>) -> (Finished, T, Duration) {
        let started = Instant::now();
        let done = self.process.finish(STEP);
        let served = service.join().unwrap();
        (done, served, started.elapsed())
    }
}

/// A loopback sender; multicast goes out on the loopback interface.
fn sender() -> UdpSocket {
    let socket = Socket::new(Domain::IPV4, Type::DGRAM, Some(Protocol::UDP)).unwrap();
    socket.set_multicast_if_v4(&Ipv4Addr::LOCALHOST).unwrap();
    socket.set_multicast_loop_v4(true).unwrap();
    socket.bind(&SocketAddr::from((Ipv4Addr::LOCALHOST, 0)).into()).unwrap();
    socket.into()
}

/// How the fake retransmission service answers a request for one frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Serve {
    /// A `DATA` record of the frame, in its original format.
    Frame,
    /// `GONE`: no longer held.
    Gone,
    /// No answer (a frame not sent yet, say).
    Ignore,
}

/// What the fake service saw and did.
#[derive(Debug, Default)]
struct ServiceLog {
    answer: Vec<u8>,
    requests: Vec<RetransmitRequest>,
    served: BTreeSet<u64>,
    gone: BTreeSet<u64>,
    busy: u64,
}

/// A fake retransmission service on 127.0.0.1: greets with protocol `version` for `session`,
/// reads the answer, then answers each request by `serve` frame by frame, except the first request that
/// asks for `busy_for`, which it answers BUSY. Ends when the subscriber closes the connection.
fn service(
    feed: &Feed,
    version: u16,
    session: u64,
    serve: impl Fn(u64) -> Serve + Send + 'static,
    busy_for: Option<u64>,
) -> (String, JoinHandle<ServiceLog>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let frames = feed.frames.clone();
    let handle = thread::spawn(move || {
        let mut log = ServiceLog::default();
        let mut s = accept_within(&listener, STEP);
        // Answers go out at once, as a publisher's do.
        s.set_nodelay(true).unwrap();
        let hello = Hello { protocol_version: version, ..Hello::new(Format::Raw, session, 1, 1) };
        s.write_all(&hello.to_bytes()).unwrap();
        let mut busy_for = busy_for;
        loop {
            // The answer first (its length is in its version), then requests.
            if log.answer.len() < Subscribe::V2_LEN {
                let mut b = [0u8; 1];
                match s.read(&mut b) {
                    Ok(0) => return log,
                    Ok(_) => log.answer.push(b[0]),
                    Err(e) => panic!("reading the answer: {e}"),
                }
                continue;
            }
            let mut request = [0u8; RecordHeader::LEN + RetransmitRequest::PAYLOAD];
            match s.read_exact(&mut request) {
                Ok(()) => {}
                Err(e) if e.kind() == ErrorKind::UnexpectedEof => return log,
                Err(e) => panic!("reading a request: {e}"),
            }
            let header = RecordHeader::parse(&request, RetransmitRequest::PAYLOAD).unwrap();
            let asked = RetransmitRequest::parse(&header, &request[RecordHeader::LEN..]).unwrap();
            log.requests.push(asked);
            let range = asked.first..asked.first + u64::from(asked.count);
            if busy_for.is_some_and(|b| range.contains(&b)) {
                busy_for = None;
                log.busy += 1;
                s.write_all(&control_record(RecordTag::Busy, Format::Raw, asked.first, b"over 1 request per second"))
                    .unwrap();
                continue;
            }
            for seq in range.filter(|&q| q >= 1 && q <= frames.len() as u64) {
                let (format, frame) = &frames[seq as usize - 1];
                match serve(seq) {
                    Serve::Frame => {
                        s.write_all(&data_record(*format, seq, std::slice::from_ref(frame))).unwrap();
                        log.served.insert(seq);
                    }
                    Serve::Gone => {
                        s.write_all(&control_record(RecordTag::Gone, Format::Raw, seq, &gone_payload(1))).unwrap();
                        log.gone.insert(seq);
                    }
                    Serve::Ignore => {}
                }
            }
        }
    });
    (addr, handle)
}

#[test]
fn withheld_frames_are_recovered_or_counted_unrecoverable_exactly() {
    let _shared = mdrelay_harness::shared();
    let feed = Feed::new(3_000, 41);
    let n = feed.len();
    let half = n / 2;
    // Served by the service: short gaps and a long one, in both formats (the BUSY one too).
    let mut served: BTreeSet<u64> = [11, 12, 13, 40, half + 20, half + 21].into_iter().collect();
    served.extend(200..230);
    let busy = 40;
    // Gone from the publisher's ring.
    let gone: BTreeSet<u64> = [700, 701].into_iter().collect();
    // The tail: after the last datagram sent, before the END.
    let tail: BTreeSet<u64> = (n - 4..=n).collect();
    // Originals that come late (the service ignores them): one mid-stream, one after the END.
    let (late, after_end) = (900, half + 300);
    let withheld: BTreeSet<u64> = served.iter().chain(&gone).chain(&tail).copied().chain([late, after_end]).collect();
    let service_serves = served.clone();
    let service_tail = tail.clone();
    let gone_set = gone.clone();
    let (addr, log) = service(
        &feed,
        2,
        SESSION,
        move |seq| {
            if service_serves.contains(&seq) || service_tail.contains(&seq) {
                Serve::Frame
            } else if gone_set.contains(&seq) {
                Serve::Gone
            } else {
                Serve::Ignore
            }
        },
        Some(busy),
    );
    // Retries far apart: an answer on a loaded machine is never overtaken by its retry, so
    // nothing is asked twice; attempts enough that no gap runs out of them during the test.
    let mut sub = Receiver::recovering(&addr, "20", &["--recovery-retry-ms", "1000", "--recovery-attempts", "1000"]);
    let socket = sender();
    for seq in 1..=n {
        if !withheld.contains(&seq) {
            sub.send(&socket, 0, &feed.datagram(seq), seq);
        }
        if seq == late + 300 {
            sub.send(&socket, 0, &feed.datagram(late), late);
        }
    }
    sub.send_end(&socket, &feed);
    // While the subscriber waits for what is still missing.
    sub.send(&socket, 0, &feed.datagram(after_end), after_end);
    let started = Instant::now();
    let done = sub.process.finish(STEP);
    let log = log.join().unwrap();
    let r = done.json();
    assert!(started.elapsed() < Duration::from_secs(15), "it stopped once nothing was missing: {}", done.stderr);

    // The service was asked for recovery, in version 2, without resume.
    assert_eq!(log.answer.len(), Subscribe::V2_LEN);
    let answer = Subscribe::parse(&log.answer).unwrap();
    assert_eq!((answer.purpose, answer.resume, answer.echo), (Purpose::Recovery, Resume::Live, false));
    let recovered: BTreeSet<u64> = served.union(&tail).copied().collect();
    assert_eq!(log.served, recovered, "every frame the service holds was asked for");
    assert_eq!(log.gone, gone);
    assert_eq!(log.busy, 1);

    // Everything but the gone frames was decoded, once: aggregates as the stream without them.
    assert_fields(&r, &feed.expected_without(&gone));
    assert_eq!(r["gaps"], gone.len(), "{}", done.stderr);
    assert_eq!(r["duplicates"], 0);
    assert_eq!(r["reordered"], 2, "the two late originals");
    assert_eq!(r["format_switches"], 1, "retransmitted raw frames are not switches: {}", done.stderr);
    assert_eq!(r["formats_seen"], serde_json::json!(["raw", "sbe"]));
    assert_eq!(r["stop_reason"], "end");
    assert_eq!(r["totals_match"], false);
    assert_eq!(r["latency_ns"]["count"], n - withheld.len() as u64 + 2, "stream frames only");
    let rec = &r["recovery"];
    assert_eq!(rec["enabled"], true);
    assert_eq!(rec["server"], addr.as_str());
    assert_eq!(rec["frames_missing"], withheld.len());
    assert_eq!(rec["frames_recovered"], recovered.len());
    assert_eq!(rec["frames_filled_late"], 2);
    assert_eq!(rec["frames_unrecoverable"], gone.len());
    assert_eq!(rec["frames_unrecoverable"], r["gaps"], "lost frames are the unrecoverable ones");
    let causes = serde_json::json!({"gone": 2, "too_old": 0, "out_of_attempts": 0, "other_session": 0, "refused": 0, "at_end": 0});
    assert_eq!(rec["unrecoverable_causes"], causes);
    assert_eq!(rec["frames_still_missing"], 0);
    assert_eq!(rec["gone_frames"], gone.len());
    assert_eq!(rec["busy_answers"], 1);
    assert_eq!(rec["connections"], 1);
    assert_eq!(rec["refused"], false);
    // A retry may leave just before the subscriber stops, and never reach the service.
    assert!(rec["requests"].as_u64().unwrap() >= log.requests.len() as u64);
    assert_eq!(rec["latency_ns"]["count"], recovered.len());
    // Runs of consecutive withheld frames: one gap each.
    let runs = withheld.iter().filter(|&&s| !withheld.contains(&(s - 1))).count();
    assert_eq!(rec["gaps_detected"], runs);
    assert!(done.stderr.contains("recovery: gaps"), "{}", done.stderr);
}

#[test]
fn a_version_1_service_turns_recovery_off_and_the_run_ends_at_once() {
    let _shared = mdrelay_harness::shared();
    let feed = Feed::new(600, 42);
    let n = feed.len();
    let withheld: BTreeSet<u64> = [5, 6, 50].into_iter().chain(n - 1..=n).collect();
    let (addr, log) = service(&feed, 1, SESSION, |_| Serve::Frame, None);
    let mut sub = Receiver::recovering(&addr, "30", &[]);
    sub.send_all_but(&feed, &withheld);
    let (done, log, took) = sub.finish_with(log);
    assert!(took < Duration::from_secs(10), "no linger once recovery is off: {}", done.stderr);
    // A version-1 greeting is not answered: that version cannot ask.
    assert!(log.answer.is_empty() && log.requests.is_empty(), "{log:?}");
    let r = done.json();
    assert_fields(&r, &feed.expected_without(&withheld));
    assert_eq!(r["gaps"], withheld.len());
    let rec = &r["recovery"];
    assert_eq!(rec["refused"], true);
    assert_eq!(rec["frames_unrecoverable"], withheld.len());
    assert_eq!(rec["unrecoverable_causes"]["refused"], withheld.len());
    assert_eq!(rec["frames_recovered"], 0);
    assert!(
        done.stderr.contains("recovery is off") && done.stderr.contains("no retransmission service"),
        "{}",
        done.stderr
    );
}

#[test]
fn a_service_of_another_session_is_not_asked_and_the_gaps_are_given_up() {
    let _shared = mdrelay_harness::shared();
    let feed = Feed::new(600, 49);
    let withheld: BTreeSet<u64> = [20, 21, 300].into_iter().collect();
    let (addr, log) = service(&feed, 2, SESSION + 1, |_| Serve::Frame, None);
    let mut sub = Receiver::recovering(&addr, "30", &[]);
    sub.send_all_but(&feed, &withheld);
    let (done, log, took) = sub.finish_with(log);
    assert!(took < Duration::from_secs(10), "nothing left to wait for: {}", done.stderr);
    assert!(log.requests.is_empty(), "frames of another session are never asked for: {log:?}");
    let r = done.json();
    assert_fields(&r, &feed.expected_without(&withheld));
    let rec = &r["recovery"];
    assert_eq!((r["gaps"].as_u64(), rec["frames_unrecoverable"].as_u64()), (Some(3), Some(3)));
    assert_eq!(rec["unrecoverable_causes"]["other_session"], 3);
    assert!(done.stderr.contains("serves another publisher session"), "{}", done.stderr);
}

#[test]
fn from_the_start_over_udp_the_frames_before_the_first_received_are_asked_for() {
    let _shared = mdrelay_harness::shared();
    let feed = Feed::new(600, 47);
    let head: BTreeSet<u64> = (1..=3).collect();
    let (addr, log) = service(&feed, 2, SESSION, |_| Serve::Frame, None);
    let mut sub = Receiver::recovering(&addr, "20", &["--from-start"]);
    sub.send_all_but(&feed, &head);
    let (done, log, _) = sub.finish_with(log);
    assert_eq!(log.served, head);
    let r = done.json();
    assert_fields(&r, &feed.expected_without(&BTreeSet::new()));
    assert_eq!(r["from_start"], serde_json::json!({"requested": true, "complete": true, "first_frame": 1}));
    assert_eq!((r["gaps"].as_u64(), r["late_join_sequence"].as_u64()), (Some(0), None));
    assert_eq!(r["totals_match"], true);
    assert_eq!(r["recovery"]["frames_recovered"], head.len());
}

#[test]
fn a_service_sending_a_record_too_large_is_left_and_connected_to_again() {
    let _shared = mdrelay_harness::shared();
    let feed = Feed::new(600, 48);
    let withheld: BTreeSet<u64> = [10, 11].into_iter().collect();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let frames = feed.frames.clone();
    let service = thread::spawn(move || {
        let greet = |s: &mut TcpStream| {
            s.write_all(&Hello::new(Format::Raw, SESSION, 1, 1).to_bytes()).unwrap();
            let mut answer = [0u8; Subscribe::V2_LEN];
            s.read_exact(&mut answer).unwrap();
            let mut request = [0u8; RecordHeader::LEN + RetransmitRequest::PAYLOAD];
            s.read_exact(&mut request).unwrap();
            let header = RecordHeader::parse(&request, RetransmitRequest::PAYLOAD).unwrap();
            RetransmitRequest::parse(&header, &request[RecordHeader::LEN..]).unwrap()
        };
        // First: a DATA record claiming 2 GiB. Nothing is allocated for it; the connection is
        // given up and the subscriber's side closed.
        let mut s = accept_within(&listener, STEP);
        greet(&mut s);
        let mut huge =
            RecordHeader { tag: RecordTag::Data, format: Format::Raw, frame_count: 1, length: 0, sequence: 10 }
                .to_bytes();
        huge[4..8].copy_from_slice(&0x8000_0000u32.to_le_bytes());
        s.write_all(&huge).unwrap();
        drain(&mut s);
        // Then a good connection.
        let mut s = accept_within(&listener, STEP);
        let mut asked = greet(&mut s);
        loop {
            for seq in asked.first..asked.first + u64::from(asked.count) {
                let (format, frame) = &frames[seq as usize - 1];
                s.write_all(&data_record(*format, seq, std::slice::from_ref(frame))).unwrap();
            }
            let mut request = [0u8; RecordHeader::LEN + RetransmitRequest::PAYLOAD];
            if s.read_exact(&mut request).is_err() {
                return;
            }
            let header = RecordHeader::parse(&request, RetransmitRequest::PAYLOAD).unwrap();
            asked = RetransmitRequest::parse(&header, &request[RecordHeader::LEN..]).unwrap();
        }
    });
    let mut sub = Receiver::recovering(&addr, "20", &[]);
    sub.send_all_but(&feed, &withheld);
    let (done, (), _) = sub.finish_with(service);
    let r = done.json();
    assert_fields(&r, &feed.expected_without(&BTreeSet::new()));
    assert_eq!(r["gaps"], 0);
    assert_eq!((r["recovery"]["connections"].as_u64(), r["recovery"]["frames_recovered"].as_u64()), (Some(2), Some(2)));
    assert!(
        done.stderr.contains("bad record header from 127.0.0.1:")
            && done.stderr.contains("exceeds the 1048576-byte limit"),
        "{}",
        done.stderr
    );
}

#[test]
fn a_service_at_its_connection_limit_is_counted_busy_and_asked_again_with_backoff() {
    let _shared = mdrelay_harness::shared();
    let feed = Feed::new(600, 50);
    let withheld: BTreeSet<u64> = [30, 31, 400].into_iter().collect();
    let (listener, addr) = listen();
    let frames = feed.frames.clone();
    let busy_connections = 3;
    let service = thread::spawn(move || {
        let mut attempts = Vec::new();
        // Full, as a publisher at retransmit.max_connections is: BUSY at once, no greeting.
        for _ in 0..busy_connections {
            let mut s = accept_within(&listener, STEP);
            attempts.push(Instant::now());
            let reason = b"the retransmission service is at its limit of 64 connections (retransmit.max_connections)";
            s.write_all(&control_record(RecordTag::Busy, Format::Raw, 0, reason)).unwrap();
            s.shutdown(std::net::Shutdown::Write).unwrap();
            drain(&mut s);
        }
        // Then a place: every frame asked for is served.
        let mut s = accept_within(&listener, STEP);
        attempts.push(Instant::now());
        s.write_all(&Hello::new(Format::Raw, SESSION, 1, 1).to_bytes()).unwrap();
        let mut answer = [0u8; Subscribe::V2_LEN];
        s.read_exact(&mut answer).unwrap();
        let mut request = [0u8; RecordHeader::LEN + RetransmitRequest::PAYLOAD];
        while s.read_exact(&mut request).is_ok() {
            let header = RecordHeader::parse(&request, RetransmitRequest::PAYLOAD).unwrap();
            let asked = RetransmitRequest::parse(&header, &request[RecordHeader::LEN..]).unwrap();
            for seq in asked.first..asked.first + u64::from(asked.count) {
                let (format, frame) = &frames[seq as usize - 1];
                // A retry's answer may come after the subscriber has all it needs and has gone.
                if s.write_all(&data_record(*format, seq, std::slice::from_ref(frame))).is_err() {
                    return attempts;
                }
            }
        }
        attempts
    });
    let mut sub = Receiver::recovering(&addr, "20", &["--recovery-attempts", "1000"]);
    sub.send_all_but(&feed, &withheld);
    let (done, attempts, _) = sub.finish_with(service);
    let r = done.json();
    assert_fields(&r, &feed.expected_without(&BTreeSet::new()));
    assert_eq!(r["gaps"], 0, "{}", done.stderr);
    let rec = &r["recovery"];
    assert_eq!(rec["frames_recovered"], withheld.len());
    // Each BUSY at connect counted, and the connection set up after them.
    assert_eq!(rec["busy_answers"], busy_connections, "{rec}");
    assert_eq!(rec["busy_at_connect"], busy_connections, "{rec}");
    assert_eq!(rec["connections"], 1, "{rec}");
    // Asked again with backoff: each wait after a BUSY at least as long as the one before
    // (50 ms, doubling).
    let waits: Vec<Duration> = attempts.windows(2).map(|w| w[1] - w[0]).collect();
    for (i, wait) in waits.iter().enumerate() {
        assert!(*wait >= Duration::from_millis(45 << i), "waits between attempts {waits:?}");
    }
    assert!(done.stderr.contains("is busy") && done.stderr.contains("retransmit.max_connections"), "{}", done.stderr);
}

#[test]
fn a_connection_the_service_closes_for_idling_is_made_again_at_the_next_gap_without_a_warning() {
    let _shared = mdrelay_harness::shared();
    let feed = Feed::new(1_200, 51);
    let n = feed.len();
    let half = n / 2;
    let (first_gaps, later_gaps): (BTreeSet<u64>, BTreeSet<u64>) = ([10, 11].into(), [half + 10].into());
    let (listener, addr) = listen();
    let frames = feed.frames.clone();
    let (closed_tx, closed) = std::sync::mpsc::channel();
    let service = thread::spawn(move || {
        let mut served = BTreeSet::new();
        for round in 0..2 {
            let mut s = accept_within(&listener, STEP);
            s.write_all(&Hello::new(Format::Raw, SESSION, 1, 1).to_bytes()).unwrap();
            let mut answer = [0u8; Subscribe::V2_LEN];
            s.read_exact(&mut answer).unwrap();
            // The first connection is closed once it has asked nothing for a while, as a
            // publisher closes one idle for retransmit.idle_timeout.
            if round == 0 {
                s.set_read_timeout(Some(Duration::from_millis(300))).unwrap();
            }
            let mut request = [0u8; RecordHeader::LEN + RetransmitRequest::PAYLOAD];
            loop {
                match s.read_exact(&mut request) {
                    Ok(()) => {}
                    Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) && !served.is_empty() => {
                        break;
                    }
                    Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => continue,
                    Err(_) => return served,
                }
                let header = RecordHeader::parse(&request, RetransmitRequest::PAYLOAD).unwrap();
                let asked = RetransmitRequest::parse(&header, &request[RecordHeader::LEN..]).unwrap();
                for seq in asked.first..asked.first + u64::from(asked.count) {
                    let (format, frame) = &frames[seq as usize - 1];
                    // A retry's answer may come after the subscriber has all it needs and has gone.
                    if s.write_all(&data_record(*format, seq, std::slice::from_ref(frame))).is_err() {
                        return served;
                    }
                    served.insert(seq);
                }
            }
            drop(s);
            closed_tx.send(()).unwrap();
        }
        served
    });
    let mut sub = Receiver::recovering(&addr, "20", &[]);
    let socket = sender();
    sub.send_frames(&socket, &feed, (1..=half).filter(|s| !first_gaps.contains(s)));
    closed.recv_timeout(STEP).expect("the service closes the idle connection");
    sub.send_frames(&socket, &feed, (half + 1..=n).filter(|s| !later_gaps.contains(s)));
    sub.send_end(&socket, &feed);
    let (done, served, _) = sub.finish_with(service);
    let r = done.json();
    assert_fields(&r, &feed.expected_without(&BTreeSet::new()));
    assert_eq!(r["gaps"], 0, "{}", done.stderr);
    assert_eq!(served, [10, 11, half + 10].into());
    let rec = &r["recovery"];
    assert_eq!((rec["connections"].as_u64(), rec["frames_recovered"].as_u64()), (Some(2), Some(3)), "{rec}");
    assert!(!done.stderr.contains("recovery connection:"), "an idle close is no trouble: {}", done.stderr);
}

/// Sends every frame of `feed` to both lines of `sub`, except `not_a` on line A and `not_b` on
/// line B; line B delivers `twice_on_b` twice, and every 7th frame goes to line B first.
fn send_both_lines(
    sub: &mut Receiver,
    socket: &UdpSocket,
    feed: &Feed,
    not_a: &BTreeSet<u64>,
    not_b: &BTreeSet<u64>,
    twice_on_b: u64,
) {
    for seq in 1..=feed.len() {
        let d = feed.datagram(seq);
        let order = if seq % 7 == 0 { [1, 0] } else { [0, 1] };
        for line in order {
            let withheld = if line == 0 { not_a } else { not_b };
            if !withheld.contains(&seq) {
                sub.send(socket, line, &d, seq);
            }
        }
        if seq == twice_on_b + 20 {
            sub.send(socket, 1, &feed.datagram(twice_on_b), twice_on_b);
        }
    }
    // Every line ends its stream.
    for _ in 0..3 {
        sub.send(socket, 0, &feed.end(), 0);
        sub.send(socket, 1, &feed.end(), 0);
    }
}

/// Two lines losing overlapping sets of frames: only frames both lost are lost, each copy from
/// the other line is arbitrated, and each line's own loss is counted.
fn a_b_lines(args: &[&str], round_trip: bool) {
    let feed = Feed::new(2_000, 43);
    let n = feed.len();
    let not_a: BTreeSet<u64> = [5, 6, 7, 400].into_iter().chain(100..=110).collect();
    let not_b: BTreeSet<u64> = [7, 8, 401, 402].into_iter().chain(105..=120).chain([n]).collect();
    let both: BTreeSet<u64> = not_a.intersection(&not_b).copied().collect();
    let either: BTreeSet<u64> = not_a.union(&not_b).copied().collect();
    let twice_on_b = 50;
    let mut all = args.to_vec();
    if round_trip {
        all.extend_from_slice(&["--latency", "round-trip"]);
    }
    let mut sub = Receiver::start(&all, 2);
    let sub_lines = sub.lines.clone();
    let socket = sender();
    // Echoes come back to the sender, one per frame taken: no more frames are in flight than
    // its buffer holds echoes of, and the echoes of the frames counted are read before more
    // are sent, so none is lost on the way back.
    let socket_ref = socket2::SockRef::from(&socket);
    socket_ref.set_recv_buffer_size(4 << 20).unwrap();
    sub.budget = sub.budget.min(socket_ref.recv_buffer_size().unwrap() / 4);
    let back = socket.try_clone().unwrap();
    back.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
    let taken = n - both.len() as u64;
    let echoes_read = Arc::new(AtomicU64::new(0));
    let reader = {
        let echoes_read = echoes_read.clone();
        thread::spawn(move || {
            let mut echoed = Vec::new();
            let mut buf = [0u8; 256];
            let deadline = Instant::now() + STEP;
            while round_trip && (echoed.len() as u64) < taken && Instant::now() < deadline {
                if let Ok((len, _)) = back.recv_from(&mut buf) {
                    let header = DatagramHeader::parse(&buf[..len]).unwrap();
                    assert_eq!(header.kind, DatagramKind::Echo);
                    echoed.push(Echo::parse(&buf[DatagramHeader::LEN..len]).unwrap().sequence);
                    echoes_read.store(echoed.len() as u64, Ordering::Relaxed);
                }
            }
            echoed
        })
    };
    if round_trip {
        sub.settle = Some(Box::new(move |counted| {
            let deadline = Instant::now() + STEP;
            while echoes_read.load(Ordering::Relaxed) < counted {
                assert!(Instant::now() < deadline, "echoes of {counted} frames within {STEP:?}");
                thread::sleep(Duration::from_millis(1));
            }
        }));
    }
    // Line B delivers one frame a second time: a duplicate, not an arbitration.
    send_both_lines(&mut sub, &socket, &feed, &not_a, &not_b, twice_on_b);
    let done = sub.process.finish(STEP);
    let echoed = reader.join().unwrap();
    let r = done.json();
    assert_fields(&r, &feed.expected_without(&both));
    assert_eq!(r["gaps"], both.len(), "only frames both lines lost: {}", done.stderr);
    assert_eq!(r["arbitrated"], n - either.len() as u64, "every frame both lines delivered");
    assert_eq!(r["duplicates"], 1);
    assert_eq!(r["stop_reason"], "end");
    let lines = &r["lines"];
    for (name, lost) in [("a", &not_a), ("b", &not_b)] {
        assert_eq!(lines[name]["lost"], lost.len(), "line {name}: {lines}");
        assert_eq!(lines[name]["frames"], n - lost.len() as u64, "line {name}: {lines}");
        assert_eq!(lines[name]["address"], sub_lines[usize::from(name == "b")].to_string());
    }
    assert_eq!(lines["a"]["duplicates"], 0);
    assert_eq!(lines["b"]["duplicates"], 1);
    // Each line's data, B's duplicate, and the END (its repetitions may come after the stop).
    assert!(lines["a"]["datagrams"].as_u64().unwrap() > n - not_a.len() as u64);
    assert!(lines["b"]["datagrams"].as_u64().unwrap() > n - not_b.len() as u64 + 1);
    assert!(done.stderr.contains("arbitrated"), "{}", done.stderr);
    if round_trip {
        assert_eq!(r["echoes_sent"], taken, "only the first copy of a frame is echoed");
        let distinct: BTreeSet<u64> = echoed.iter().copied().collect();
        assert_eq!((echoed.len(), distinct.len()), (taken as usize, taken as usize));
    }
}

#[test]
#[ignore = "long (over 3 s here): .ci/run runs it with --ignored"]
fn a_b_unicast_lines_lose_only_what_both_lost_and_echo_each_frame_once() {
    let _shared = mdrelay_harness::shared();
    a_b_lines(&["--listen", "127.0.0.1:0", "--listen-b", "127.0.0.1:0"], true);
}

#[test]
#[ignore = "long (over 3 s here): .ci/run runs it with --ignored"]
fn a_b_multicast_lines_on_loopback() {
    let _shared = mdrelay_harness::shared();
    a_b_lines(
        &[
            "--group",
            "239.255.77.41:0",
            "--interface",
            "127.0.0.1",
            "--group-b",
            "239.255.77.42:0",
            "--interface-b",
            "127.0.0.1",
        ],
        false,
    );
}

/// Greets with `hello`, reads the subscriber's whole answer (its length from its version) and
/// names the first frame offered.
fn handshake(stream: &mut TcpStream, hello: Hello, first: u64) -> (Subscribe, usize) {
    stream.write_all(&hello.to_bytes()).unwrap();
    let mut answer = vec![0u8; Subscribe::LEN];
    stream.read_exact(&mut answer).unwrap();
    let version = Subscribe::parse_version(&answer).unwrap();
    answer.resize(Subscribe::len_of(version), 0);
    stream.read_exact(&mut answer[Subscribe::LEN..]).unwrap();
    stream.write_all(&control_record(RecordTag::Format, hello.format, first, &[])).unwrap();
    (Subscribe::parse(&answer).unwrap(), answer.len())
}

/// Sends frames `from..=to` of `feed` as DATA records of up to 5 frames.
fn send_records(stream: &mut TcpStream, feed: &Feed, from: u64, to: u64) {
    let format_of = |s: u64| feed.frames[s as usize - 1].0;
    let mut seq = from;
    while seq <= to {
        // A record holds frames of one format: it ends where the format changes.
        let mut last = seq;
        while last < to && last < seq + 4 && format_of(last + 1) == format_of(seq) {
            last += 1;
        }
        let chunk: Vec<Vec<u8>> = (seq..=last).map(|s| feed.frames[s as usize - 1].1.clone()).collect();
        stream.write_all(&data_record(format_of(seq), seq, &chunk)).unwrap();
        seq = last + 1;
    }
}

/// The END record for the whole feed.
fn end(feed: &Feed) -> Vec<u8> {
    end_record(&totals(&refs(&feed.segments)), Format::Sbe, feed.len() + 1)
}

/// Reads until the subscriber closes its side.
fn drain(stream: &mut TcpStream) {
    let _ = stream.read_to_end(&mut Vec::new());
}

#[test]
fn a_reconnection_resumes_after_the_last_frame_received() {
    let _shared = mdrelay_harness::shared();
    let feed = Feed::new(3_000, 44);
    let n = feed.len();
    let cut = n / 3;
    let (listener, addr) = listen();
    let publisher = {
        let feed = feed.clone();
        thread::spawn(move || {
            let mut answers = Vec::new();
            {
                let mut s = accept_within(&listener, STEP);
                answers.push(handshake(&mut s, Hello::new(Format::Raw, SESSION, 1, 1), 1));
                send_records(&mut s, &feed, 1, cut);
                // Dropped here: cut mid-stream, without an END.
            }
            // The publisher went on meanwhile; its ring still holds the frames after the cut.
            let mut s = accept_within(&listener, STEP);
            let (subscribe, len) = handshake(&mut s, Hello::new(Format::Raw, SESSION, 1, cut + 50), cut + 1);
            answers.push((subscribe, len));
            send_records(&mut s, &feed, cut + 1, n);
            s.write_all(&end(&feed)).unwrap();
            drain(&mut s);
            answers
        })
    };
    let done = subscriber(&["--connect", &addr, "--json", "-", "--reconnect-max-seconds", "0.2", "--duration", "60"])
        .finish(STEP);
    let answers = publisher.join().unwrap();
    assert_eq!(answers[0], (Subscribe::new(false), Subscribe::V2_LEN), "the first connection starts live");
    assert_eq!(answers[1].0.resume, Resume::From(cut + 1), "the reconnection resumes after the last frame");
    let r = done.json();
    assert_fields(&r, &feed.expected_without(&BTreeSet::new()));
    assert_eq!(r["gaps"], 0, "the replay left no gap: {}", done.stderr);
    assert_eq!((r["reconnects"].as_u64(), r["resumes"].as_u64()), (Some(1), Some(1)));
    assert_eq!(r["totals_match"], true);
    assert_eq!(r["from_start"], Value::Null);
    assert!(done.stderr.contains("resuming after the last frame received"), "{}", done.stderr);
}

#[test]
fn from_start_asks_for_the_whole_session_and_says_whether_it_came() {
    let _shared = mdrelay_harness::shared();
    let feed = Feed::new(1_500, 45);
    let n = feed.len();
    // The ring holds the whole session, then only from frame 40 on.
    for first in [1, 40] {
        let (listener, addr) = listen();
        let f = feed.clone();
        let publisher = thread::spawn(move || {
            let mut s = accept_within(&listener, STEP);
            // Greeted well into the session: only resume asks for what came before.
            let (subscribe, _) = handshake(&mut s, Hello::new(Format::Raw, SESSION, 1, 500), first);
            send_records(&mut s, &f, first, n);
            s.write_all(&end(&f)).unwrap();
            drain(&mut s);
            subscribe
        });
        let done = subscriber(&["--connect", &addr, "--from-start", "--json", "-"]).finish(STEP);
        let subscribe = publisher.join().unwrap();
        assert_eq!(subscribe.resume, Resume::From(1));
        let r = done.json();
        let head: BTreeSet<u64> = (1..first).collect();
        assert_fields(&r, &feed.expected_without(&head));
        let complete = first == 1;
        assert_eq!(r["from_start"], serde_json::json!({"requested": true, "complete": complete, "first_frame": first}));
        assert_eq!(r["totals_match"], complete);
        if complete {
            assert!(done.stderr.contains("from start: complete"), "{}", done.stderr);
        } else {
            assert_eq!(r["late_join_sequence"], first);
            assert!(done.stderr.contains("from start: INCOMPLETE: the first frame received was 40"), "{}", done.stderr);
        }
    }
}

#[test]
fn a_version_1_publisher_is_followed_without_resume_and_warned_about_once() {
    let _shared = mdrelay_harness::shared();
    let feed = Feed::new(2_000, 46);
    let n = feed.len();
    let (cut1, cut2) = (n / 3, 2 * n / 3);
    let (listener, addr) = listen();
    let f = feed.clone();
    let publisher = thread::spawn(move || {
        let v1 = |next| Hello { protocol_version: 1, ..Hello::new(Format::Raw, SESSION, 1, next) };
        let mut answers = Vec::new();
        // Three connections; 5 frames go by while the subscriber is away each time.
        for (from, to, last) in [(1, cut1, false), (cut1 + 6, cut2, false), (cut2 + 6, n, true)] {
            let mut s = accept_within(&listener, STEP);
            let answer = handshake(&mut s, v1(from), from);
            // Nothing follows a version-1 answer.
            s.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
            let mut more = [0u8; 1];
            assert!(s.read(&mut more).is_err(), "bytes after a version-1 answer");
            s.set_read_timeout(Some(STEP)).unwrap();
            answers.push(answer);
            send_records(&mut s, &f, from, to);
            if last {
                s.write_all(&end(&f)).unwrap();
                drain(&mut s);
            }
        }
        answers
    });
    let done = subscriber(&["--connect", &addr, "--json", "-", "--reconnect-max-seconds", "0.2", "--duration", "60"])
        .finish(STEP);
    let answers = publisher.join().unwrap();
    for (answer, len) in &answers {
        assert_eq!((answer.protocol_version, answer.resume, *len), (1, Resume::Live, Subscribe::LEN));
    }
    let r = done.json();
    let away: BTreeSet<u64> = (cut1 + 1..cut1 + 6).chain(cut2 + 1..cut2 + 6).collect();
    assert_fields(&r, &feed.expected_without(&away));
    assert_eq!(r["gaps"], 10);
    assert_eq!((r["reconnects"].as_u64(), r["resumes"].as_u64()), (Some(2), Some(0)));
    assert_eq!(done.stderr.matches("cannot resume a stream").count(), 1, "{}", done.stderr);
}
