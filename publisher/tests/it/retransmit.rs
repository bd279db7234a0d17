//! The publisher's ring on loopback, from a client the test writes with proto's types: the
//! retransmission service (frames identical to those sent over UDP, GONE, the range and rate
//! limits, refusals), TCP resume and `from start` (no gap, no duplicate, every message), a
//! version-1 subscriber served live, and the ring's memory bound under continuous requests.
//!
//! Hostile clients of the service: connections that take every slot and then ask nothing (or
//! half a request) while a real subscriber behind a lossy link recovers DEEP10 exactly; idle
//! and half-sent requests timed out; requests for absurd ranges counted once each; a greeting
//! answer followed by a flood of bytes; a client that half-closes.
//!
//! What the answers are checked against is what the test itself received over UDP (or the
//! publisher's END totals, or the independent reference output of DEEP10), never the service's
//! own say.

use crate::common::beside_others_in_tempdir;
use mdrelay_codec::FormatCodec;
use mdrelay_codec::{Codec, Format, Limits};
use mdrelay_harness::cli_args::{NO_INTERVAL_REPORTS, PACED_40K, PACED_100K, RETRANSMIT_ON_LOOPBACK, words};
use mdrelay_harness::process::field;
use mdrelay_harness::{
    Process, STEP, assert_aggregates, expected, iex_data, json_file, publisher_bin, scrape, shared, subscriber_bin,
};
use mdrelay_proto::relay::{
    DatagramHeader, DatagramKind, Hello, Purpose, RecordHeader, RecordTag, Resume, RetransmitRequest, Subscribe,
    Totals, parse_gone,
};
use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream, UdpSocket};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The longest one of these runs may take.
const RUN: Duration = Duration::from_secs(90);

/// Starts a publisher and returns it with the retransmission service's address.
///
/// The tests' lingers are a few seconds beyond what each asks after END: the publisher sleeps
/// the whole linger before it exits, and the questions take milliseconds.
fn publisher_with_service(args: &[&str]) -> (Process, SocketAddr) {
    let mut p = Process::start(publisher_bin(), args.iter().copied().chain(["--retransmit-listen", "127.0.0.1:0"]));
    let line = p.wait_until("\"serving retransmissions over TCP\"", |l| l.contains("serving retransmissions"));
    let addr = field(&line, "listen").unwrap_or_default().parse().unwrap_or_else(|e| panic!("{line}: {e}"));
    (p, addr)
}

/// Connects and greets; `answer` is sent as the subscriber's answer.
fn greeted(addr: SocketAddr, answer: &Subscribe) -> (TcpStream, Hello) {
    let mut s = TcpStream::connect(addr).unwrap_or_else(|e| panic!("connecting to {addr}: {e}"));
    s.set_read_timeout(Some(STEP)).unwrap();
    let mut hello = [0u8; Hello::LEN];
    s.read_exact(&mut hello).unwrap();
    let hello = Hello::parse(&hello).unwrap();
    s.write_all(&answer.to_bytes()).unwrap();
    (s, hello)
}

fn recovery_answer() -> Subscribe {
    Subscribe { purpose: Purpose::Recovery, ..Subscribe::new(false) }
}

/// Waits for the publisher's log to say a retransmission client that read nothing was cut off
/// (its write timeout, 5 s), well within the service's linger.
fn cut_off(publisher: &mut Process) {
    publisher
        .try_wait_until("a client cut off", Duration::from_secs(10), |l| l.contains("cut off"))
        .unwrap_or_else(|f| panic!("{f}"));
}

/// Reads what `stalled` still holds: it must end in a close or a reset, within 2 s a read.
fn assert_closed(stalled: &mut TcpStream) {
    stalled.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    let mut sink = vec![0u8; 1 << 20];
    loop {
        match stalled.read(&mut sink) {
            Ok(0) => break,
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => break,
            Err(e) => panic!("the stalled client's connection is still open: {e}"),
        }
    }
}

/// Reads one record; `None` when the peer closed.
fn record(s: &mut TcpStream) -> Option<(RecordHeader, Vec<u8>)> {
    let mut header = [0u8; RecordHeader::LEN];
    if let Err(e) = s.read_exact(&mut header) {
        // Closed, or reset (closed with bytes of ours unread, as after a protocol violation).
        let closed = matches!(e.kind(), std::io::ErrorKind::UnexpectedEof | std::io::ErrorKind::ConnectionReset);
        assert!(closed, "reading a record: {e}");
        return None;
    }
    let header = RecordHeader::parse(&header, 64 << 20).unwrap();
    let mut payload = vec![0u8; header.length as usize];
    s.read_exact(&mut payload).unwrap();
    Some((header, payload))
}

/// The frames of a payload, delimited by the format's own framing.
fn frames(format: Format, payload: &[u8], count: usize) -> Vec<Vec<u8>> {
    let codec = Codec::new(format, Limits::default());
    let mut out = Vec::new();
    let mut at = 0;
    while out.len() < count {
        let len = codec.frame_len(&payload[at..]).unwrap().unwrap();
        out.push(payload[at..at + len].to_vec());
        at += len;
    }
    assert_eq!(at, payload.len(), "bytes after the declared frames");
    out
}

/// Receives a publisher's datagrams until END: its frames by sequence, and its totals.
fn receive_all(socket: &UdpSocket) -> (BTreeMap<u64, Vec<u8>>, Totals, u64) {
    socket.set_read_timeout(Some(STEP)).unwrap();
    let mut buf = vec![0u8; 65_536];
    let mut got = BTreeMap::new();
    loop {
        let n = socket.recv(&mut buf).expect("datagrams until END");
        let header = DatagramHeader::parse(&buf[..n]).unwrap();
        let body = &buf[header.len_on_wire()..n];
        match header.kind {
            DatagramKind::Data => {
                for (i, f) in frames(header.format, body, header.frame_count as usize).into_iter().enumerate() {
                    got.insert(header.sequence + i as u64, f);
                }
            }
            DatagramKind::End => return (got, Totals::parse(body).unwrap(), header.sequence),
            DatagramKind::Echo => {}
        }
    }
}

fn receiver() -> (UdpSocket, String) {
    let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
    socket2::SockRef::from(&socket).set_recv_buffer_size(16 << 20).unwrap();
    let addr = socket.local_addr().unwrap().to_string();
    (socket, addr)
}

/// What a request got back: frames by sequence, frames said gone (first, count), BUSY answers.
#[derive(Default, Debug)]
struct Answer {
    frames: BTreeMap<u64, Vec<u8>>,
    gone: Vec<(u64, u64)>,
    busy: u64,
}

/// Sends `requests`, then one request for `marker` (a frame known to be held), and reads until
/// the marker's answer: answers come in order, so everything before it answers `requests`.
fn ask(s: &mut TcpStream, requests: &[RetransmitRequest], marker: u64) -> Answer {
    for r in requests {
        s.write_all(&r.to_record()).unwrap();
    }
    s.write_all(&RetransmitRequest { first: marker, count: 1 }.to_record()).unwrap();
    let mut answer = Answer::default();
    loop {
        let (header, payload) = record(s).expect("an answer");
        match header.tag {
            RecordTag::Data => {
                let got = frames(header.format, &payload, usize::from(header.frame_count));
                if header.sequence == marker && got.len() == 1 {
                    return answer;
                }
                for (i, f) in got.into_iter().enumerate() {
                    answer.frames.insert(header.sequence + i as u64, f);
                }
            }
            RecordTag::Gone => answer.gone.push((header.sequence, parse_gone(&payload).unwrap())),
            RecordTag::Busy => answer.busy += 1,
            other => panic!("unexpected {other:?} record in an answer"),
        }
    }
}

#[test]
#[ignore = "long (over 3 s here): .ci/run runs it with --ignored"]
fn retransmissions_are_the_frames_sent_and_frames_no_longer_held_are_gone() {
    let (_shared, dir) = beside_others_in_tempdir();
    let json = dir.path().join("pub.json").display().to_string();
    let (socket, target) = receiver();
    let (publisher, service) = publisher_with_service(&words(&format!(
        "run --synthetic --messages 30000 --format capnp --udp {target} {PACED_100K} --ring-bytes 262144 \
         --retransmit-max-range 50 --retransmit-linger 5 --json {json}"
    )));
    let (sent, totals, next) = receive_all(&socket);
    assert_eq!(sent.len() as u64, totals.frames, "loopback UDP at this rate loses nothing");
    assert_eq!(next, totals.frames + 1);
    let (mut s, hello) = greeted(service, &recovery_answer());
    assert_eq!(hello.next_sequence, next, "the greeting says where the stream is");
    let last = next - 1;
    // The last 50 frames: byte for byte what went out over UDP.
    let answer = ask(&mut s, &[RetransmitRequest { first: last - 49, count: 50 }], last);
    assert!(answer.gone.is_empty() && answer.busy == 0, "{answer:?}");
    assert_eq!(answer.frames.len(), 50);
    for (seq, frame) in &answer.frames {
        assert_eq!(Some(frame), sent.get(seq), "frame {seq} retransmitted differs from the one sent");
    }
    // More than the range limit: the first 50 only.
    let answer = ask(&mut s, &[RetransmitRequest { first: last - 199, count: 200 }], last);
    assert_eq!(answer.frames.keys().copied().collect::<Vec<_>>(), (last - 199..last - 149).collect::<Vec<_>>());
    // The first frames left a 256 KiB ring long ago: gone, all of them, said so.
    let answer = ask(&mut s, &[RetransmitRequest { first: 1, count: 10 }], last);
    assert_eq!((answer.gone.clone(), answer.frames.len()), (vec![(1, 10)], 0));
    // Frames not sent yet are not answered (the marker's answer comes next).
    let answer = ask(&mut s, &[RetransmitRequest { first: next + 5, count: 10 }], last);
    assert!(answer.frames.is_empty() && answer.gone.is_empty());
    drop(s);
    let finished = publisher.finish(RUN);
    finished.assert_success();
    let summary = json_file(Path::new(&json));
    let r = &summary["retransmit"];
    // A range across the ring's start: gone up to the oldest frame held, the rest retransmitted.
    let first_held = r["ring_first"].as_u64().unwrap();
    assert!(first_held > 60 && first_held < last - 200, "the ring held {first_held}..{next}: {r}");
    assert!(r["ring_next"].as_u64() == Some(next), "{r}");
    assert_eq!(r["frames_gone"].as_u64(), Some(10));
    assert_eq!(r["requests_ahead"].as_u64(), Some(1), "one request named frames not sent yet: {r}");
    assert_eq!(r["requests"].as_u64(), Some(8));
}

#[test]
#[ignore = "long (over 3 s here): .ci/run runs it with --ignored"]
fn a_range_across_the_rings_start_is_gone_up_to_the_oldest_frame_then_served() {
    let _shared = shared();
    let (socket, target) = receiver();
    let (publisher, service) = publisher_with_service(&words(&format!(
        "run --synthetic --messages 20000 --format sbe --udp {target} {PACED_100K} --ring-bytes 131072 \
         --retransmit-linger 5"
    )));
    let (sent, _, next) = receive_all(&socket);
    let (mut s, _) = greeted(service, &recovery_answer());
    let last = next - 1;
    let answer = ask(&mut s, &[RetransmitRequest { first: 1, count: 65_535 }], last);
    assert_eq!(answer.gone.len(), 1, "{:?}", answer.gone);
    let (gone_from, gone) = answer.gone[0];
    assert_eq!(gone_from, 1);
    // Gone up to the oldest frame held, and from there every frame (up to the range limit),
    // identical to what was sent.
    let first_held = 1 + gone;
    assert_eq!(answer.frames.keys().next().copied(), Some(first_held));
    let expected_end = (first_held + 1024).min(next);
    assert_eq!(answer.frames.len() as u64, expected_end - first_held);
    for (seq, frame) in &answer.frames {
        assert_eq!(Some(frame), sent.get(seq));
    }
    drop(s);
    publisher.finish(RUN).assert_success();
}

#[test]
#[ignore = "long (over 3 s here): .ci/run runs it with --ignored"]
fn requests_over_the_rate_are_told_busy_and_bad_clients_are_refused_with_a_reason() {
    let (_shared, dir) = beside_others_in_tempdir();
    let json = dir.path().join("pub.json").display().to_string();
    let (socket, target) = receiver();
    let (publisher, service) = publisher_with_service(&words(&format!(
        "run --synthetic --messages 20000 --udp {target} {PACED_100K} --retransmit-rate 5 --retransmit-linger 6 \
         --json {json}"
    )));
    let (_, _, next) = receive_all(&socket);
    let last = next - 1;
    // A burst of 30 requests against 5 per second: a second's burst is served, the rest BUSY.
    let (mut s, _) = greeted(service, &recovery_answer());
    let burst: Vec<RetransmitRequest> = (0..30).map(|i| RetransmitRequest { first: last - i, count: 1 }).collect();
    for r in &burst {
        s.write_all(&r.to_record()).unwrap();
    }
    let (mut served, mut busy) = (0, 0);
    while served + busy < 30 {
        let (header, _) = record(&mut s).unwrap();
        match header.tag {
            RecordTag::Data => served += 1,
            RecordTag::Busy => busy += 1,
            other => panic!("{other:?}"),
        }
    }
    assert!((5..=7).contains(&served) && busy == 30 - served, "served {served}, busy {busy}");
    drop(s);
    // A version-1 subscriber (which cannot ask) and a stream subscriber are refused with why.
    for (answer, why) in [
        (Subscribe { protocol_version: 1, ..Subscribe::new(false) }, "retransmission port"),
        (Subscribe::new(false), "retransmission port"),
    ] {
        let (mut s, _) = greeted(service, &answer);
        let (header, reason) = record(&mut s).unwrap();
        let reason = String::from_utf8_lossy(&reason).to_string();
        assert_eq!(header.tag, RecordTag::Refuse);
        assert!(reason.contains(why), "{reason}");
    }
    // A client that sends anything but requests is told why and cut off; the service goes on.
    let (mut s, _) = greeted(service, &recovery_answer());
    s.write_all(
        &RecordHeader { tag: RecordTag::Echo, format: Format::Raw, frame_count: 0, length: 16, sequence: 1 }.to_bytes(),
    )
    .unwrap();
    s.write_all(&[0u8; 16]).unwrap();
    let (header, reason) = record(&mut s).expect("the reason before the close");
    let reason = String::from_utf8_lossy(&reason).to_string();
    assert_eq!(header.tag, RecordTag::Refuse, "{reason}");
    assert!(reason.contains("REQUEST") && reason.contains("byte 32"), "names what and where: {reason}");
    assert!(record(&mut s).is_none(), "the connection closes");
    std::thread::sleep(Duration::from_millis(1100));
    let (mut s, _) = greeted(service, &recovery_answer());
    let answer = ask(&mut s, &[], last);
    assert!(answer.frames.is_empty());
    drop(s);
    publisher.finish(RUN).assert_success();
    let r = &json_file(Path::new(&json))["retransmit"];
    assert_eq!(r["throttled"].as_u64(), Some(busy), "{r}");
    assert_eq!(r["refused"].as_u64(), Some(3), "{r}");
}

/// Reads a TCP stream's records until END or until `stop_after` frames: frames by sequence
/// (each frame's message count, decoded), the first FORMAT's sequence, and END's totals.
struct Stream {
    messages: BTreeMap<u64, u64>,
    anchor: Option<u64>,
    end: Option<(u64, Totals)>,
    duplicates: u64,
}

fn read_stream(s: &mut TcpStream, stop_after: Option<usize>, into: &mut Stream) {
    let mut codecs: BTreeMap<u8, Codec> = BTreeMap::new();
    let mut taken = 0;
    while let Some((header, payload)) = record(s) {
        match header.tag {
            RecordTag::Format => {
                into.anchor.get_or_insert(header.sequence);
            }
            RecordTag::Data => {
                let codec =
                    codecs.entry(header.format.id()).or_insert_with(|| Codec::new(header.format, Limits::default()));
                for (i, f) in frames(header.format, &payload, usize::from(header.frame_count)).iter().enumerate() {
                    let mut n = 0;
                    codec.decode(f, |_| n += 1).unwrap();
                    if into.messages.insert(header.sequence + i as u64, n).is_some() {
                        into.duplicates += 1;
                    }
                    taken += 1;
                }
                if stop_after.is_some_and(|n| taken >= n) {
                    return;
                }
            }
            RecordTag::End => {
                into.end = Some((header.sequence, Totals::parse(&payload).unwrap()));
                return;
            }
            other => panic!("unexpected {other:?}"),
        }
    }
}

fn tcp_publisher(args: &[&str]) -> (Process, SocketAddr) {
    let mut p = Process::start(publisher_bin(), args.iter().copied().chain(["--tcp", "127.0.0.1:0"]));
    let addr = p.serving_on();
    (p, addr)
}

#[test]
fn a_subscriber_that_resumes_sees_no_gap_and_no_duplicate() {
    let _shared = shared();
    let (publisher, addr) = tcp_publisher(&words(&format!(
        "run --synthetic --messages 60000 --format flatbuffers {PACED_40K} --wait-subscribers 1"
    )));
    let mut stream = Stream { messages: BTreeMap::new(), anchor: None, end: None, duplicates: 0 };
    let (mut s, first_hello) = greeted(addr, &Subscribe::new(false));
    read_stream(&mut s, Some(3000), &mut stream);
    // Cut off mid-stream; the stream goes on without us for a while.
    drop(s);
    std::thread::sleep(Duration::from_millis(300));
    let next = stream.messages.keys().last().copied().unwrap() + 1;
    let (mut s, hello) = greeted(addr, &Subscribe { resume: Resume::From(next), ..Subscribe::new(false) });
    assert_eq!(hello.session, first_hello.session);
    assert!(hello.next_sequence > next + 100, "the stream went on while we were away");
    let mut resumed = Stream { messages: BTreeMap::new(), anchor: None, end: None, duplicates: 0 };
    read_stream(&mut s, None, &mut resumed);
    assert_eq!(resumed.anchor, Some(next), "the replay starts where we asked");
    stream.messages.extend(resumed.messages);
    let (end, totals) = resumed.end.expect("END");
    assert_eq!(stream.duplicates + resumed.duplicates, 0);
    // Every frame of the stream, once: 1 ..= END's last, and all its messages.
    assert_eq!(stream.messages.len() as u64, end - 1);
    assert_eq!(stream.messages.keys().next(), Some(&1));
    assert_eq!(stream.messages.values().sum::<u64>(), totals.messages);
    drop(s);
    publisher.finish(RUN).assert_success();
}

#[test]
fn from_start_gets_the_whole_session_and_a_version_one_subscriber_is_served_live() {
    let _shared = shared();
    let (publisher, addr) =
        tcp_publisher(&words(&format!("run --synthetic --messages 40000 {PACED_40K} --wait-subscribers 1")));
    // The first subscriber starts the stream and reads along.
    let (mut first, _) = greeted(addr, &Subscribe::new(false));
    let mut seen = Stream { messages: BTreeMap::new(), anchor: None, end: None, duplicates: 0 };
    read_stream(&mut first, Some(2000), &mut seen);
    // A version-1 subscriber joins late: live, from the next record, no replay.
    let (mut old, hello) = greeted(addr, &Subscribe { protocol_version: 1, ..Subscribe::new(false) });
    let mut live = Stream { messages: BTreeMap::new(), anchor: None, end: None, duplicates: 0 };
    read_stream(&mut old, Some(100), &mut live);
    assert!(
        live.anchor.unwrap() >= hello.next_sequence.saturating_sub(1) && live.anchor.unwrap() > 1000,
        "{:?}",
        live.anchor
    );
    drop(old);
    // A late joiner asking for the session from its first frame gets all of it.
    let (mut late, _) = greeted(addr, &Subscribe { resume: Resume::From(1), ..Subscribe::new(false) });
    let mut whole = Stream { messages: BTreeMap::new(), anchor: None, end: None, duplicates: 0 };
    read_stream(&mut late, None, &mut whole);
    let (end, totals) = whole.end.expect("END");
    assert_eq!(whole.anchor, Some(1));
    assert_eq!((whole.messages.len() as u64, whole.duplicates), (end - 1, 0));
    assert_eq!(whole.messages.values().sum::<u64>(), totals.messages);
    read_stream(&mut first, None, &mut seen);
    drop((first, late));
    publisher.finish(RUN).assert_success();
}

/// The resident set of `pid`, bytes.
fn rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let kb = status.lines().find_map(|l| l.strip_prefix("VmRSS:")).and_then(|v| v.split_whitespace().next());
    kb.and_then(|k| k.parse::<u64>().ok()).unwrap_or(0) * 1024
}

/// What the publisher may hold beyond the ring's bound: two 1 MiB chunks the bound does not
/// count, an answer buffer per connection, the runtime, and the allocator's slack.
const MARGIN: u64 = 24 << 20;

#[test]
#[ignore = "long (over 3 s here): .ci/run runs it with --ignored"]
fn memory_stays_within_the_ring_bound_while_a_client_requests_all_the_time() {
    let (_shared, dir) = beside_others_in_tempdir();
    let json = dir.path().join("pub.json").display().to_string();
    let ring: u64 = 32 << 20;
    let (socket, target) = receiver();
    let ring_arg = ring.to_string();
    let (mut publisher, service) = publisher_with_service(&words(&format!(
        "run --synthetic --messages 200000 --loops 0 --duration 8 --format capnp --udp {target} --ring-bytes \
         {ring_arg} --retransmit-linger 1 --json {json}"
    )));
    publisher.wait_for("publishing");
    let before = rss(publisher.pid());
    let pid = publisher.pid();
    // The receiver drains the socket (so sends never fail) and learns the newest sequence.
    let newest = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(1));
    let seen = newest.clone();
    std::thread::spawn(move || {
        let mut buf = vec![0u8; 65_536];
        socket.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        while let Ok(n) = socket.recv(&mut buf) {
            if let Ok(h) = DatagramHeader::parse(&buf[..n]) {
                seen.fetch_max(h.sequence, std::sync::atomic::Ordering::Relaxed);
            }
        }
    });
    let (mut s, _) = greeted(service, &recovery_answer());
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let started = Instant::now();
    let mut peak = before;
    let mut answered = 0u64;
    // Ask for the newest 1024 frames again and again, reading every answer, for 6 s.
    while started.elapsed() < Duration::from_secs(6) {
        let top = newest.load(std::sync::atomic::Ordering::Relaxed);
        let request = RetransmitRequest { first: top.saturating_sub(2000).max(1), count: 1024 };
        s.write_all(&request.to_record()).unwrap();
        s.write_all(&RetransmitRequest { first: 0, count: 1 }.to_record()).unwrap();
        loop {
            let (header, _) = record(&mut s).expect("answers while the stream runs");
            // The marker's answer (GONE, or BUSY when over the rate) ends the request's.
            if matches!(header.tag, RecordTag::Gone | RecordTag::Busy) && header.sequence == 0 {
                break;
            }
            if header.tag == RecordTag::Data {
                answered += u64::from(header.frame_count);
            }
        }
        peak = peak.max(rss(pid));
    }
    drop(s);
    publisher.finish(RUN).assert_success();
    let r = &json_file(Path::new(&json))["retransmit"];
    assert!(r["ring_first"].as_u64().unwrap() > 1, "the ring wrapped, so its bound was in play: {r}");
    assert!(answered > 100_000, "the client was answered all along: {answered} frames");
    let grown = peak.saturating_sub(before);
    eprintln!(
        "publisher RSS {} MiB before, peak {} MiB: grew {} MiB with a {} MiB ring",
        before >> 20,
        peak >> 20,
        grown >> 20,
        ring >> 20
    );
    assert!(grown <= ring + MARGIN, "grew {grown} bytes, over the ring's {ring} plus {MARGIN}");
}

#[test]
#[ignore = "long (over 3 s here): .ci/run runs it with --ignored"]
fn a_client_that_stops_reading_is_cut_off_and_others_are_served_meanwhile() {
    let (_shared, dir) = beside_others_in_tempdir();
    let json = dir.path().join("pub.json").display().to_string();
    let (socket, target) = receiver();
    let (mut publisher, service) = publisher_with_service(&words(&format!(
        "run --synthetic --messages 200000 --format capnp --udp {target} --retransmit-linger 12 --json {json}"
    )));
    let (_, _, next) = receive_all(&socket);
    let last = next - 1;
    // Asks for the newest 1,024 frames over and over and never reads: the answers fill its
    // socket, and the publisher's write waits, then gives up on it.
    let (mut stalled, _) = greeted(service, &recovery_answer());
    socket2::SockRef::from(&stalled).set_recv_buffer_size(4096).unwrap();
    stalled.set_write_timeout(Some(Duration::from_secs(2))).unwrap();
    let request = RetransmitRequest { first: last - 1023, count: 1024 }.to_record();
    for _ in 0..200 {
        if stalled.write_all(&request).is_err() {
            break;
        }
    }
    // Meanwhile another client is answered at once.
    let started = Instant::now();
    let (mut healthy, _) = greeted(service, &recovery_answer());
    let answer = ask(&mut healthy, &[RetransmitRequest { first: last - 9, count: 10 }], last);
    assert_eq!(answer.frames.len(), 10);
    assert!(started.elapsed() < Duration::from_secs(2), "served in {:?} beside a stalled client", started.elapsed());
    // Within the write timeout (5 s), the publisher cuts the stalled client off and says so: what
    // it reads then ends in a close or a reset, after whatever was in its socket. Reading earlier
    // would unstall it. The wait ends well before the linger (12 s), so a close that only came
    // with the end of the service fails.
    cut_off(&mut publisher);
    assert_closed(&mut stalled);
    drop((healthy, stalled));
    publisher.signal(mdrelay_harness::Signal::SIGINT);
    publisher.finish(RUN).assert_success();
}

#[test]
#[ignore = "long (over 3 s here): .ci/run runs it with --ignored"]
fn connections_over_the_limit_are_told_busy_and_a_one_byte_ring_says_everything_is_gone() {
    let _shared = shared();
    let (socket, target) = receiver();
    let dir = tempfile::tempdir().unwrap();
    let toml = dir.path().join("pub.toml");
    std::fs::write(&toml, "[retransmit]\nmax_connections = 2\nring_bytes = 1\n").unwrap();
    let toml = toml.display().to_string();
    let (publisher, service) = publisher_with_service(&words(&format!(
        "run --config {toml} --synthetic --messages 20000 --udp {target} --retransmit-linger 5"
    )));
    let (_, _, next) = receive_all(&socket);
    let (mut first, _) = greeted(service, &recovery_answer());
    let (_second, _) = greeted(service, &recovery_answer());
    // The third is told at once, without a greeting.
    let mut third = TcpStream::connect(service).unwrap();
    third.set_read_timeout(Some(STEP)).unwrap();
    let (header, reason) = record(&mut third).unwrap();
    assert_eq!(header.tag, RecordTag::Busy);
    assert!(String::from_utf8_lossy(&reason).contains("retransmit.max_connections"));
    // A ring too small for any frame holds none: every frame asked for is gone.
    first.write_all(&RetransmitRequest { first: next - 10, count: 10 }.to_record()).unwrap();
    let (header, payload) = record(&mut first).unwrap();
    assert_eq!((header.tag, header.sequence, parse_gone(&payload).unwrap()), (RecordTag::Gone, next - 10, 10));
    drop(first);
    publisher.finish(RUN).assert_success();
}

/// A splitmix64 step: the loss rule's hash of a frame number, so the frames dropped are spread
/// like random loss and the same on every run.
fn mix(seq: u64) -> u64 {
    let mut z = seq.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A lossy link on loopback: forwards every datagram to the address given on `to` (sent once
/// the subscriber has bound), except the DATA datagrams of about one frame in a hundred, picked
/// by [`mix`]; END always passes. Runs until `stop` is set, and returns the frames it dropped.
struct LossyLink {
    addr: SocketAddr,
    to: mpsc::Sender<SocketAddr>,
    stop: Arc<AtomicBool>,
    thread: JoinHandle<BTreeSet<u64>>,
}

impl LossyLink {
    fn start() -> LossyLink {
        let (socket, addr) = receiver();
        let addr: SocketAddr = addr.parse().unwrap();
        let (to, target) = mpsc::channel::<SocketAddr>();
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut dropped = BTreeSet::new();
            let Ok(target) = target.recv_timeout(RUN) else { return dropped };
            socket.set_read_timeout(Some(Duration::from_millis(100))).unwrap();
            let mut buf = vec![0u8; 65_536];
            while !stopped.load(Ordering::Relaxed) {
                let Ok(n) = socket.recv(&mut buf) else { continue };
                if let Ok(h) = DatagramHeader::parse(&buf[..n])
                    && h.kind == DatagramKind::Data
                    && mix(h.sequence).is_multiple_of(100)
                {
                    dropped.extend(h.sequence..h.sequence + u64::from(h.frame_count));
                    continue;
                }
                let _ = socket.send_to(&buf[..n], target);
            }
            dropped
        });
        LossyLink { addr, to, stop, thread }
    }

    /// Stops forwarding; the frames dropped.
    fn dropped(self) -> BTreeSet<u64> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().unwrap()
    }
}

/// `count` clients that take the service's slots and ask nothing: each answers the greeting
/// (as a subscriber asking for recovery would); the last `half` of them then send half a request
/// and nothing more.
fn hoarders(service: SocketAddr, count: usize, half: usize) -> Vec<TcpStream> {
    (0..count)
        .map(|i| {
            let (mut s, _) = greeted(service, &recovery_answer());
            if i >= count - half {
                s.write_all(&RetransmitRequest { first: 1, count: 1 }.to_record()[..10]).unwrap();
            }
            s
        })
        .collect()
}

/// Reads a TCP stream's records until END, discarding them: the subscriber that releases a
/// publisher waiting for one.
fn drain_stream(addr: SocketAddr) -> JoinHandle<()> {
    std::thread::spawn(move || {
        let (mut s, _) = greeted(addr, &Subscribe::new(false));
        while let Some((header, _)) = record(&mut s) {
            if header.tag == RecordTag::End {
                return;
            }
        }
    })
}

fn n(v: &serde_json::Value, key: &str) -> u64 {
    v[key].as_u64().unwrap_or_else(|| panic!("no {key} in {v}"))
}

#[test]
#[ignore = "long (over 3 s here): .ci/run runs it with --ignored"]
fn connections_that_take_every_slot_and_ask_nothing_keep_no_subscriber_from_its_frames() {
    let (_shared, dir) = beside_others_in_tempdir();
    let pub_json = dir.path().join("pub.json").display().to_string();
    let sub_json = dir.path().join("sub.json").display().to_string();
    let link = LossyLink::start();
    let link_addr = link.addr.to_string();
    let deep10 = iex_data().join("DEEP10.pcap.gz").display().to_string();
    // DEEP10, one frame per datagram, paced; it starts once a TCP subscriber joins, so every
    // slot of the service is taken first.
    let mut publisher = Process::start(
        publisher_bin(),
        words(&format!(
            "run --capture {deep10} --format sbe --coalesce-bytes 0 --udp {link_addr} --tcp 127.0.0.1:0 \
             --wait-subscribers 1 {PACED_100K} {RETRANSMIT_ON_LOOPBACK} --json {pub_json}"
        )),
    );
    let line = publisher.wait_until("\"serving retransmissions over TCP\"", |l| l.contains("serving retransmissions"));
    let service: SocketAddr = field(&line, "listen").unwrap().parse().unwrap();
    let stream = publisher.serving_on();
    // Every one of the 64 slots (the default retransmit.max_connections), held silently; 8 of
    // them sent half a request.
    let held = hoarders(service, 64, 8);
    // Long enough for each to count as idle.
    std::thread::sleep(Duration::from_millis(1500));
    let recovery = service.to_string();
    let mut sub = Process::start(
        subscriber_bin(),
        words(&format!(
            "--listen 127.0.0.1:0 --recovery {recovery} --from-start --json {sub_json} {NO_INTERVAL_REPORTS} \
             --duration 120"
        )),
    );
    link.to.send(sub.listening_on()).unwrap();
    let trigger = drain_stream(stream);
    let finished = sub.finish(RUN);
    trigger.join().unwrap();
    let dropped = link.dropped();
    publisher.finish(RUN).assert_success();
    assert_eq!(finished.code(), Some(0), "{}", finished.stderr);
    let sub = json_file(Path::new(&sub_json));
    let publ = json_file(Path::new(&pub_json));
    let r = &sub["recovery"];
    let s = &publ["retransmit"];
    eprintln!(
        "1 % loss behind 64 idle connections: {} frames dropped, {} recovered, {} unrecoverable, gaps {}, busy answers {}; service: {s}",
        dropped.len(),
        r["frames_recovered"],
        r["frames_unrecoverable"],
        sub["gaps"],
        r["busy_answers"]
    );
    let frames = n(&publ["totals"], "frames");
    assert!(dropped.len() as u64 > frames / 200, "about 1 % dropped: {} of {frames}", dropped.len());
    // Every frame the link dropped was recovered (the kernel may have lost a few more, which
    // are recovered too); nothing was given up.
    assert!(n(r, "frames_recovered") >= dropped.len() as u64, "{r}");
    assert_eq!(n(r, "frames_unrecoverable"), 0, "{r}");
    let reference = expected("DEEP10.json");
    assert_aggregates(&sub, &reference, "DEEP10 recovered past idle connections");
    assert_eq!(sub["messages"], reference["messages"]);
    assert_eq!(sub["frames"], publ["totals"]["frames"], "every frame, each once");
    assert_eq!((n(&sub, "gaps"), n(&sub, "duplicates")), (0, 0));
    assert_eq!(sub["totals_match"], true);
    // The slots were freed by evicting idle connections, or by timing out the half requests.
    assert!(n(s, "evicted") + n(s, "request_timeouts") >= 1, "{s}");
    drop(held);
}

#[test]
#[ignore = "long (over 3 s here): .ci/run runs it with --ignored"]
fn idle_connections_and_half_sent_requests_are_closed_and_a_full_service_evicts_the_longest_idle() {
    let (_shared, dir) = beside_others_in_tempdir();
    let json = dir.path().join("pub.json").display().to_string();
    let toml = dir.path().join("pub.toml");
    std::fs::write(&toml, "[retransmit]\nmax_connections = 3\nidle_timeout = 5\n").unwrap();
    let toml = toml.display().to_string();
    let (socket, target) = receiver();
    let (publisher, service) = publisher_with_service(&words(&format!(
        "run --config {toml} --synthetic --messages 20000 --udp {target} --retransmit-linger 12 --json {json}"
    )));
    let (_, _, next) = receive_all(&socket);
    let last = next - 1;
    let started = Instant::now();
    // The oldest: asks once (so the service has its answer before the others connect), then
    // says nothing.
    let (mut oldest, _) = greeted(service, &recovery_answer());
    assert!(ask(&mut oldest, &[], last).frames.is_empty());
    // Sends half a request, and nothing more.
    let (mut half, _) = greeted(service, &recovery_answer());
    half.write_all(&RetransmitRequest { first: last, count: 1 }.to_record()[..9]).unwrap();
    let half_sent = Instant::now();
    // Greets and says nothing: closed when idle for idle_timeout.
    let (mut quiet, _) = greeted(service, &recovery_answer());
    let quiet_greeted = Instant::now();
    for s in [&mut oldest, &mut half, &mut quiet] {
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    }
    // The service is full. Once the three have been idle for a moment, a newcomer is let in and
    // the one idle longest makes way, told why.
    std::thread::sleep(Duration::from_millis(1300));
    let (mut newcomer, _) = greeted(service, &recovery_answer());
    let answer = ask(&mut newcomer, &[RetransmitRequest { first: last - 4, count: 5 }], last);
    assert_eq!(answer.frames.len(), 5, "the newcomer is served: {answer:?}");
    drop(newcomer);
    let (header, reason) = record(&mut oldest).expect("the oldest is told why");
    let reason = String::from_utf8_lossy(&reason).to_string();
    assert_eq!(header.tag, RecordTag::Busy, "{reason}");
    assert!(reason.contains("idle") && reason.contains("retransmit.max_connections"), "{reason}");
    assert!(record(&mut oldest).is_none(), "then closed");
    // The half request: closed a short bound after it began, long before the idle timeout.
    assert!(record(&mut half).is_none(), "the half request's connection closes");
    let half_closed = half_sent.elapsed();
    assert!(half_closed < Duration::from_millis(4500), "closed {half_closed:?} after half a request");
    // The quiet one: closed at the idle timeout, not before.
    assert!(record(&mut quiet).is_none(), "the idle connection closes");
    let quiet_closed = quiet_greeted.elapsed();
    assert!(
        quiet_closed >= Duration::from_millis(4800) && quiet_closed < Duration::from_secs(9),
        "closed {quiet_closed:?} after its greeting, with idle_timeout = 5"
    );
    assert!(started.elapsed() < Duration::from_secs(11), "all within the service's linger");
    publisher.finish(RUN).assert_success();
    let s = &json_file(Path::new(&json))["retransmit"];
    assert_eq!((n(s, "evicted"), n(s, "request_timeouts"), n(s, "idle_timeouts")), (1, 1, 1), "{s}");
}

#[test]
#[ignore = "long (over 3 s here): .ci/run runs it with --ignored"]
fn requests_for_absurd_ranges_are_counted_once_each() {
    let (_shared, dir) = beside_others_in_tempdir();
    let json = dir.path().join("pub.json").display().to_string();
    let (socket, target) = receiver();
    let metrics = format!("127.0.0.1:{}", mdrelay_harness::free_tcp_port());
    let (mut publisher, service) = publisher_with_service(&words(&format!(
        "run --synthetic --messages 20000 --udp {target} --retransmit-linger 3 --metrics-listen {metrics} \
         --metrics-hold 20 --json {json}"
    )));
    let (_, _, next) = receive_all(&socket);
    let last = next - 1;
    let (mut s, _) = greeted(service, &recovery_answer());
    // Far in the future, as large as a request can be; at the very top of the numbering (the
    // range runs past u64::MAX); and a range that starts held and runs into the future.
    let absurd = [
        RetransmitRequest { first: next + 1_000_000_000_000, count: u32::MAX },
        RetransmitRequest { first: u64::MAX - 3, count: u32::MAX },
        RetransmitRequest { first: u64::MAX, count: 1 },
        RetransmitRequest { first: last, count: u32::MAX },
    ];
    let requests: Vec<RetransmitRequest> = absurd.iter().copied().cycle().take(400).collect();
    let answer = ask(&mut s, &requests, last - 1);
    // The held frame of the last kind is served each time it is asked; nothing else is.
    assert!(answer.gone.is_empty(), "{answer:?}");
    assert_eq!(answer.frames.keys().copied().collect::<Vec<_>>(), vec![last]);
    drop(s);
    // The final counts, served after the run.
    publisher.wait_for("metrics endpoint stays up");
    let scraped = scrape(metrics.parse().unwrap()).unwrap();
    publisher.signal(mdrelay_harness::Signal::SIGINT);
    publisher.finish(RUN).assert_success();
    let r = &json_file(Path::new(&json))["retransmit"];
    assert_eq!(n(r, "requests_ahead"), 400, "each request for frames not sent yet, once: {r}");
    assert_eq!(n(r, "requests"), 401, "{r}");
    assert_eq!(scraped.get("mdrelay_pub_retransmit_requests_ahead_total", ""), Some(400.0), "{}", scraped.text);
}

#[test]
#[ignore = "long (over 3 s here): .ci/run runs it with --ignored"]
fn a_flood_after_the_greeting_answer_is_refused_with_where_and_a_half_closed_client_gets_every_answer() {
    let (_shared, dir) = beside_others_in_tempdir();
    let json = dir.path().join("pub.json").display().to_string();
    let (socket, target) = receiver();
    let (publisher, service) = publisher_with_service(&words(&format!(
        "run --synthetic --messages 20000 --udp {target} {PACED_100K} --retransmit-linger 5 --json {json}"
    )));
    let (sent, totals, next) = receive_all(&socket);
    assert_eq!(sent.len() as u64, totals.frames, "loopback UDP at this rate loses nothing");
    let last = next - 1;
    // A greeting answer followed by a megabyte of bytes that are no request.
    let (mut flood, _) = greeted(service, &recovery_answer());
    flood.set_write_timeout(Some(STEP)).unwrap();
    let junk = vec![0xa5u8; 1 << 20];
    // The service may stop reading (and close) before all of it is written.
    let _ = flood.write_all(&junk);
    let (header, reason) = record(&mut flood).expect("the reason");
    let reason = String::from_utf8_lossy(&reason).to_string();
    assert_eq!(header.tag, RecordTag::Refuse, "{reason}");
    assert!(reason.contains("byte 32") && reason.contains("unknown record tag 165"), "{reason}");
    drop(flood);
    // A client that asks, then closes its sending side: every answer still comes, then the close.
    let (mut half_closed, _) = greeted(service, &recovery_answer());
    for seq in [last - 2, last - 1, last] {
        half_closed.write_all(&RetransmitRequest { first: seq, count: 1 }.to_record()).unwrap();
    }
    // Requests with nothing to answer: an empty range, and one running past the numbering's end.
    half_closed.write_all(&RetransmitRequest { first: last, count: 0 }.to_record()).unwrap();
    half_closed.write_all(&RetransmitRequest { first: u64::MAX - 1, count: 5 }.to_record()).unwrap();
    half_closed.shutdown(Shutdown::Write).unwrap();
    let mut got = BTreeMap::new();
    while let Some((header, payload)) = record(&mut half_closed) {
        assert_eq!(header.tag, RecordTag::Data);
        for (i, f) in frames(header.format, &payload, usize::from(header.frame_count)).into_iter().enumerate() {
            got.insert(header.sequence + i as u64, f);
        }
    }
    assert_eq!(got.keys().copied().collect::<Vec<_>>(), vec![last - 2, last - 1, last]);
    for (seq, frame) in &got {
        assert_eq!(Some(frame), sent.get(seq));
    }
    publisher.finish(RUN).assert_success();
    let r = &json_file(Path::new(&json))["retransmit"];
    assert_eq!((n(r, "refused"), n(r, "requests"), n(r, "frames_sent")), (1, 5, 3), "{r}");
}

/// Reads the answers to `asked` snapshot requests: (snapshots read whole and checked, refusals
/// with their reasons).
fn snapshot_answers(
    s: &mut TcpStream,
    asked: usize,
    session: u64,
) -> (Vec<mdrelay_proto::relay::snapshot::Snapshot>, Vec<String>) {
    use mdrelay_proto::relay::snapshot::SnapshotReader;
    let (mut snapshots, mut refused) = (Vec::new(), Vec::new());
    let mut reader = SnapshotReader::new();
    let mut opener = mdrelay_proto::relay::Protector::new(false, None, 1 << 20);
    while snapshots.len() + refused.len() < asked {
        let (header, payload) = record(s).expect("an answer to every snapshot request");
        match header.tag {
            RecordTag::Busy => {
                assert_eq!(header.sequence, 0, "a refused snapshot is a BUSY for frame 0");
                refused.push(String::from_utf8_lossy(&payload).into_owned());
            }
            RecordTag::Snapshot => {
                if let Some(snapshot) =
                    reader.record(&header, &payload, &mut opener, session, Limits::default()).unwrap()
                {
                    snapshots.push(snapshot);
                }
            }
            tag => panic!("a {tag:?} record among snapshot answers"),
        }
    }
    (snapshots, refused)
}

#[test]
#[ignore = "long (over 3 s here): .ci/run runs it with --ignored"]
fn snapshot_requests_over_the_rate_are_refused_and_counted_and_a_client_that_does_not_read_is_cut_off() {
    let (_shared, dir) = beside_others_in_tempdir();
    let json = dir.path().join("pub.json").display().to_string();
    let (socket, target) = receiver();
    // 10,000 symbols: a snapshot of a few megabytes, more than a socket holds.
    let (mut publisher, service) = publisher_with_service(&words(&format!(
        "run --synthetic --synthetic-messages 300000 --synthetic-symbols 10000 --format sbe --udp {target} \
         --retransmit-rate 4 --retransmit-linger 12 --json {json}"
    )));
    let (_, totals, next) = receive_all(&socket);
    // A client that asks for three snapshots and never reads: its writes wait, then it is cut.
    let (mut stalled, _) = greeted(service, &recovery_answer());
    socket2::SockRef::from(&stalled).set_recv_buffer_size(4096).unwrap();
    for _ in 0..3 {
        stalled.write_all(&RetransmitRequest::snapshot_record()).unwrap();
    }
    // Meanwhile another asks twelve at once: the rate (4 a second, with a burst of as many)
    // admits about four, the rest are refused with the reason.
    let (mut flood, hello) = greeted(service, &recovery_answer());
    let asked = 12;
    for _ in 0..asked {
        flood.write_all(&RetransmitRequest::snapshot_record()).unwrap();
    }
    flood.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let (snapshots, refused) = snapshot_answers(&mut flood, asked, hello.session);
    assert!(
        (4..=6).contains(&snapshots.len()),
        "{} snapshots, {} refused: {refused:?}",
        snapshots.len(),
        refused.len()
    );
    assert!(refused.iter().all(|r| r.contains("rate limit")), "{refused:?}");
    // Each snapshot is of the whole stream, which ended: as of its last frame, with its totals.
    for snapshot in &snapshots {
        assert_eq!(snapshot.state.as_of, next - 1);
        assert_eq!(snapshot.totals, totals);
        assert!(snapshot.frames > 1, "a snapshot of many frames: {}", snapshot.frames);
    }
    // Within the write timeout (5 s), the stalled client's connection is cut off.
    cut_off(&mut publisher);
    assert_closed(&mut stalled);
    drop((flood, stalled));
    publisher.signal(mdrelay_harness::Signal::SIGINT);
    publisher.finish(RUN).assert_success();
    let summary = json_file(Path::new(&json));
    let r = &summary["retransmit"];
    assert!(n(r, "snapshots_sent") >= snapshots.len() as u64, "{r}");
    assert_eq!(n(r, "snapshots_refused"), refused.len() as u64, "{r}");
}
