//! The publisher's ring on loopback, from a client the test writes with proto's types: the
//! retransmission service (frames identical to those sent over UDP, GONE, the range and rate
//! limits, refusals), TCP resume and `from start` (no gap, no duplicate, every message), a
//! version-1 subscriber served live, and the ring's memory bound under continuous requests.
//!
//! What the answers are checked against is what the test itself received over UDP (or the
//! publisher's END totals), never the service's own say.

use mdrelay_harness::process::field;
use mdrelay_harness::{Process, STEP, json_file, publisher_bin, serial};
use mdrelay_proto::codec::{Codec, Format, Limits};
use mdrelay_proto::relay::{
    DatagramHeader, DatagramKind, Hello, Purpose, RecordHeader, RecordTag, Resume, RetransmitRequest, Subscribe,
    Totals, parse_gone,
};
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream, UdpSocket};
use std::path::Path;
use std::time::{Duration, Instant};

/// The longest one of these runs may take.
const RUN: Duration = Duration::from_secs(90);

/// Starts a publisher and returns it with the retransmission service's address.
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
        let body = &buf[DatagramHeader::LEN..n];
        match header.kind {
            DatagramKind::Data => {
                for (i, f) in frames(header.format, body, usize::from(header.frame_count)).into_iter().enumerate() {
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
fn retransmissions_are_the_frames_sent_and_frames_no_longer_held_are_gone() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("pub.json").display().to_string();
    let (socket, target) = receiver();
    let (publisher, service) = publisher_with_service(&[
        "run",
        "--synthetic",
        "--messages",
        "30000",
        "--format",
        "capnp",
        "--udp",
        &target,
        "--pacing",
        "rate",
        "--rate",
        "100000",
        "--ring-bytes",
        "262144",
        "--retransmit-max-range",
        "50",
        "--retransmit-linger",
        "20",
        "--json",
        &json,
    ]);
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
    assert_eq!(r["frames_ahead"].as_u64(), Some(10));
    assert_eq!(r["requests"].as_u64(), Some(8));
}

#[test]
fn a_range_across_the_rings_start_is_gone_up_to_the_oldest_frame_then_served() {
    let _serial = serial();
    let (socket, target) = receiver();
    let (publisher, service) = publisher_with_service(&[
        "run",
        "--synthetic",
        "--messages",
        "20000",
        "--format",
        "sbe",
        "--udp",
        &target,
        "--pacing",
        "rate",
        "--rate",
        "100000",
        "--ring-bytes",
        "131072",
        "--retransmit-linger",
        "20",
    ]);
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
fn requests_over_the_rate_are_told_busy_and_bad_clients_are_refused_with_a_reason() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("pub.json").display().to_string();
    let (socket, target) = receiver();
    let (publisher, service) = publisher_with_service(&[
        "run",
        "--synthetic",
        "--messages",
        "20000",
        "--udp",
        &target,
        "--pacing",
        "rate",
        "--rate",
        "100000",
        "--retransmit-rate",
        "5",
        "--retransmit-linger",
        "20",
        "--json",
        &json,
    ]);
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
    // A client that sends anything but requests is cut off; the service goes on.
    let (mut s, _) = greeted(service, &recovery_answer());
    s.write_all(
        &RecordHeader { tag: RecordTag::Echo, format: Format::Raw, frame_count: 0, length: 16, sequence: 1 }.to_bytes(),
    )
    .unwrap();
    s.write_all(&[0u8; 16]).unwrap();
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
    let _serial = serial();
    let (publisher, addr) = tcp_publisher(&[
        "run",
        "--synthetic",
        "--messages",
        "60000",
        "--format",
        "flatbuffers",
        "--pacing",
        "rate",
        "--rate",
        "40000",
        "--wait-subscribers",
        "1",
    ]);
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
    let _serial = serial();
    let (publisher, addr) = tcp_publisher(&[
        "run",
        "--synthetic",
        "--messages",
        "40000",
        "--pacing",
        "rate",
        "--rate",
        "40000",
        "--wait-subscribers",
        "1",
    ]);
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
fn memory_stays_within_the_ring_bound_while_a_client_requests_all_the_time() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("pub.json").display().to_string();
    let ring: u64 = 32 << 20;
    let (socket, target) = receiver();
    let ring_arg = ring.to_string();
    let (mut publisher, service) = publisher_with_service(&[
        "run",
        "--synthetic",
        "--messages",
        "200000",
        "--loops",
        "0",
        "--duration",
        "8",
        "--format",
        "capnp",
        "--udp",
        &target,
        "--ring-bytes",
        &ring_arg,
        "--retransmit-linger",
        "1",
        "--json",
        &json,
    ]);
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
fn a_client_that_stops_reading_is_cut_off_and_others_are_served_meanwhile() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("pub.json").display().to_string();
    let (socket, target) = receiver();
    let (publisher, service) = publisher_with_service(&[
        "run",
        "--synthetic",
        "--messages",
        "200000",
        "--format",
        "capnp",
        "--udp",
        &target,
        "--retransmit-linger",
        "30",
        "--json",
        &json,
    ]);
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
    // Within the write timeout (5 s) and a little, the stalled client's connection is gone: what
    // it reads now ends in a close or a reset, after whatever was in its socket.
    std::thread::sleep(Duration::from_secs(7));
    stalled.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut sink = vec![0u8; 1 << 20];
    loop {
        match stalled.read(&mut sink) {
            Ok(0) => break,
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => break,
            Err(e) => panic!("the stalled client's connection is still open: {e}"),
        }
    }
    drop((healthy, stalled));
    publisher.signal(mdrelay_harness::Signal::SIGINT);
    publisher.finish(RUN).assert_success();
}

#[test]
fn connections_over_the_limit_are_told_busy_and_a_one_byte_ring_says_everything_is_gone() {
    let _serial = serial();
    let (socket, target) = receiver();
    let dir = tempfile::tempdir().unwrap();
    let toml = dir.path().join("pub.toml");
    std::fs::write(&toml, "[retransmit]\nmax_connections = 2\nring_bytes = 1\n").unwrap();
    let toml = toml.display().to_string();
    let (publisher, service) = publisher_with_service(&[
        "run",
        "--config",
        &toml,
        "--synthetic",
        "--messages",
        "20000",
        "--udp",
        &target,
        "--retransmit-linger",
        "20",
    ]);
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
