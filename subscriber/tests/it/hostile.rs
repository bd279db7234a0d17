//! The subscriber's UDP port against what a network or a hostile sender delivers: datagrams
//! lost at the tail, swapped, duplicated beyond the window, carrying more frames than declared,
//! with a wild sequence number or session, of other programs, formats and versions, truncated
//! and bit-flipped, and wide (header version 2) ones that declare more frames than they carry or
//! are malformed. A real `mdrelay-sub` process receives; the test sends crafted datagrams.
//! Expected figures are computed here from the synthetic feed with mdrelay-iex's aggregator and
//! message parser, independently of the subscriber.

use crate::common::{charge, udp_subscriber};
use mdrelay_codec::FormatCodec;
use mdrelay_codec::{BatchHeader, Codec, Format, Limits, collect_segment};
use mdrelay_harness::{Process, serial, subscriber_bin};
use mdrelay_iex::iextp::Segment;
use mdrelay_iex::synth::{SynthConfig, SyntheticDay};
use mdrelay_proto::relay::{DATAGRAM_VERSION, DatagramHeader, DatagramKind, Totals, WIDE_DATAGRAM_VERSION};
use serde_json::Value;
use std::net::{SocketAddr, UdpSocket};
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(30);
const SESSION: u64 = 0x5eed;

/// The segments of a small synthetic day.
fn segments(messages: u64) -> Vec<Vec<u8>> {
    let mut day = SyntheticDay::new(SynthConfig { messages, symbols: 20, seed: 9, ..SynthConfig::default() }).unwrap();
    let mut out = Vec::new();
    while let Some(s) = day.next_segment() {
        out.push(s.bytes.to_vec());
    }
    out
}

/// Messages in a segment, as mdrelay-iex's parser counts them.
fn messages_in(segment: &[u8]) -> u64 {
    let mut list = Vec::new();
    collect_segment(&Segment::parse(segment).unwrap(), &mut list);
    list.len() as u64
}

/// One SBE frame of `segment`, stamped now.
fn frame(codec: &mut Codec, segment: &[u8]) -> Vec<u8> {
    let parsed = Segment::parse(segment).unwrap();
    let mut list = Vec::new();
    collect_segment(&parsed, &mut list);
    let now = mdrelay_runtime::clock::wall_clock_ns();
    let mut out = Vec::new();
    codec
        .encode(&BatchHeader { publish_time: now, ..BatchHeader::from_segment(&parsed.header) }, &list, &mut out)
        .unwrap();
    out
}

fn header(kind: DatagramKind, frames: u8, session: u64, sequence: u64) -> Vec<u8> {
    DatagramHeader {
        version: DATAGRAM_VERSION,
        format: Format::Sbe,
        kind,
        frame_count: frames.into(),
        protection: Default::default(),
        session,
        sequence,
    }
    .to_bytes()
    .to_vec()
}

/// A data datagram of one frame per segment, frames numbered from `sequence`.
fn data(frames: &[Vec<u8>], session: u64, sequence: u64) -> Vec<u8> {
    let mut d = header(DatagramKind::Data, frames.len() as u8, session, sequence);
    for f in frames {
        d.extend_from_slice(f);
    }
    d
}

/// Frame `i` alone in a data datagram of `SESSION`, numbered `i + 1`.
fn numbered(frames: &[Vec<u8>], i: usize) -> Vec<u8> {
    data(&frames[i..=i], SESSION, i as u64 + 1)
}

/// A data datagram of `SESSION` for each frame, numbered from 1.
fn one_per_datagram(frames: &[Vec<u8>]) -> Vec<Vec<u8>> {
    (0..frames.len()).map(|i| numbered(frames, i)).collect()
}

/// The END datagram for `frames` frames of these segments.
fn end(segments: &[Vec<u8>], next: u64) -> Vec<u8> {
    let mut totals = Totals { frames: segments.len() as u64, ..Totals::default() };
    for s in segments {
        let mut list = Vec::new();
        collect_segment(&Segment::parse(s).unwrap(), &mut list);
        for m in &list {
            totals.messages += 1;
            *totals.by_type.entry(m.kind()).or_default() += 1;
        }
    }
    let mut d = header(DatagramKind::End, 0, SESSION, next);
    totals.write(&mut d);
    d
}

/// A subscriber on a UDP port of its choosing, a socket to send to it, and how far ahead of it
/// the sender may be.
struct Receiver {
    process: Process,
    addr: SocketAddr,
    sender: UdpSocket,
    /// A quarter of the receive buffer the kernel granted the subscriber, in bytes.
    budget: usize,
}

impl Receiver {
    fn start() -> Receiver {
        let (process, addrs, budget) = udp_subscriber(&["--listen", "127.0.0.1:0"], 1);
        let sender = UdpSocket::bind("127.0.0.1:0").unwrap();
        Receiver { process, addr: addrs[0], sender, budget }
    }

    /// Sends datagrams, each with whether the subscriber counts it as a frame, never more than
    /// the budget ahead of what its interval lines say it has counted: loopback drops a
    /// datagram only when the receiver's buffer is full, so however long a loaded machine keeps
    /// the subscriber off the CPU, nothing is lost that the test did not mean to lose.
    fn send(&mut self, datagrams: &[(Vec<u8>, bool)]) {
        let mut counted = 0u64;
        let mut in_flight = 0;
        for (d, counts) in datagrams {
            if in_flight + charge(d.len()) > self.budget {
                // All but the last frame sent must be in; the last may be waiting for its
                // interval line.
                self.process.wait_for_frames(counted.saturating_sub(1));
                in_flight = 0;
            }
            self.sender.send_to(d, self.addr).unwrap();
            in_flight += charge(d.len());
            counted += u64::from(*counts);
        }
    }

    /// Sends the END and returns the subscriber's report, after checking its exit status says
    /// what the report does: 5 (stream incomplete) when its verdict on the stream is false,
    /// else 0.
    fn end(self, end: &[u8]) -> Value {
        self.sender.send_to(end, self.addr).unwrap();
        let finished = self.process.finish(LIMIT);
        let report = finished.json();
        let status = if report["stream_complete"] == false { 5 } else { 0 };
        assert_eq!(finished.code(), Some(status), "{finished:?}");
        report
    }
}

/// Every datagram counted as a frame.
fn all_counted(datagrams: Vec<Vec<u8>>) -> Vec<(Vec<u8>, bool)> {
    datagrams.into_iter().map(|d| (d, true)).collect()
}

/// The frames of a synthetic day, one datagram each.
fn day(messages: u64) -> (Vec<Vec<u8>>, Vec<Vec<u8>>) {
    let segments = segments(messages);
    let mut codec = Codec::new(Format::Sbe, Limits::default());
    let frames = segments.iter().map(|s| frame(&mut codec, s)).collect();
    (segments, frames)
}

#[test]
fn frames_lost_after_the_last_received_are_counted_from_the_end() {
    let _serial = serial();
    let (segments, frames) = day(5_000);
    let mut rx = Receiver::start();
    let n = frames.len();
    let datagrams = one_per_datagram(&frames[..n - 7]);
    rx.send(&all_counted(datagrams));
    let r = rx.end(&end(&segments, n as u64 + 1));
    assert_eq!(r["gaps"], 7, "the 7 frames after the last one received were sent and lost: {r}");
    assert_eq!(r["frames"], n as u64 - 7);
    assert_eq!(r["totals_match"], false);
}

#[test]
fn a_datagram_with_more_frames_than_declared_costs_no_genuine_frame() {
    let _serial = serial();
    let (segments, frames) = day(5_000);
    let mut rx = Receiver::start();
    let n = frames.len();
    let mut datagrams = one_per_datagram(&frames);
    // Datagram 10 declares one frame and carries the next one too.
    let mut padded = data(&frames[9..=9], SESSION, 10);
    padded.extend_from_slice(&frames[10]);
    datagrams[9] = padded;
    rx.send(&all_counted(datagrams));
    let r = rx.end(&end(&segments, n as u64 + 1));
    let messages: u64 = segments.iter().map(|s| messages_in(s)).sum();
    assert_eq!((r["duplicates"].as_u64(), r["gaps"].as_u64()), (Some(0), Some(0)), "{r}");
    assert_eq!(r["messages"], messages, "every message once, the genuine frame 11 included");
    assert_eq!(r["excess_payloads"], 1);
    assert_eq!(r["totals_match"], true);
}

#[test]
fn the_first_two_datagrams_swapped_are_reordering_not_a_late_join() {
    let _serial = serial();
    let (segments, frames) = day(5_000);
    let mut rx = Receiver::start();
    let n = frames.len();
    let mut datagrams = one_per_datagram(&frames);
    datagrams.swap(0, 1);
    rx.send(&all_counted(datagrams));
    let r = rx.end(&end(&segments, n as u64 + 1));
    assert_eq!(r["late_join_sequence"], Value::Null, "{r}");
    assert_eq!((r["reordered"].as_u64(), r["gaps"].as_u64()), (Some(1), Some(0)));
    assert_eq!(r["totals_match"], true);
}

#[test]
fn a_wild_sequence_number_or_a_flipped_session_bit_costs_one_datagram_not_the_session() {
    let _serial = serial();
    let (segments, frames) = day(5_000);
    let mut rx = Receiver::start();
    let n = frames.len();
    let mut datagrams = one_per_datagram(&frames);
    datagrams[100] = data(&frames[100..=100], SESSION, 101 + 1_000_000_000_000);
    datagrams[200] = data(&frames[200..=200], SESSION ^ (1 << 33), 201);
    let datagrams: Vec<_> = datagrams.into_iter().enumerate().map(|(i, d)| (d, i != 100 && i != 200)).collect();
    rx.send(&datagrams);
    let r = rx.end(&end(&segments, n as u64 + 1));
    let all: u64 = segments.iter().map(|s| messages_in(s)).sum();
    let lost = messages_in(&segments[100]) + messages_in(&segments[200]);
    assert_eq!(r["gaps"], 2, "the two bad datagrams' frames, nothing more: {r}");
    assert_eq!(r["unconfirmed_datagrams"], 2);
    assert_eq!(r["publisher_restarts"], 0);
    assert_eq!(r["messages"], all - lost);
}

#[test]
fn a_duplicate_older_than_the_window_is_not_aggregated_twice() {
    let _serial = serial();
    // Longer than the window of 65,536 frames.
    let (segments, frames) = day(120_000);
    let window = mdrelay_proto::relay::window::WINDOW as usize;
    // Within two windows, so even the first frame's copy is not out of line with the stream
    // (that is a wild sequence number, held and dropped unconfirmed: tested above).
    assert!(frames.len() > window + 100 && frames.len() < 2 * window, "a day of 1 to 2 windows: {}", frames.len());
    let mut rx = Receiver::start();
    let n = frames.len();
    let mut datagrams = one_per_datagram(&frames);
    // A copy of a frame just older than the window, and one of the very first frame: both too
    // late to tell from duplicates.
    let old = n - window - 100;
    datagrams.push(data(&frames[old..=old], SESSION, old as u64 + 1));
    datagrams.push(data(&frames[0..=0], SESSION, 1));
    let datagrams: Vec<_> = datagrams.into_iter().enumerate().map(|(i, d)| (d, i < n)).collect();
    rx.send(&datagrams);
    let r = rx.end(&end(&segments, n as u64 + 1));
    let all: u64 = segments.iter().map(|s| messages_in(s)).sum();
    assert_eq!(r["messages"], all, "each frame counted once: {r}");
    assert_eq!(r["beyond_window"], 2);
    assert_eq!(r["unconfirmed_datagrams"], 0);
    assert_eq!(r["totals_match"], true);
}

#[test]
fn foreign_corrupt_and_future_datagrams_beside_a_healthy_stream() {
    let _serial = serial();
    let (segments, frames) = day(5_000);
    let mut rx = Receiver::start();
    let n = frames.len();
    let mut datagrams = Vec::new();
    let mut invalid = 0u64;
    for i in 0..n {
        datagrams.push((numbered(&frames, i), true));
        if i % 50 != 10 {
            continue;
        }
        // Another program's datagram, garbage that starts like ours, a header cut short.
        datagrams.push((b"\x12\x34\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00\x07example\x03com\x00".to_vec(), false));
        datagrams.push((b"MDRU garbage".to_vec(), false));
        datagrams.push((numbered(&frames, i)[..20].to_vec(), false));
        // Another format id, a future version.
        let mut other_format = numbered(&frames, i);
        other_format[5] = 200;
        let mut future = numbered(&frames, i);
        future[4] = 3;
        datagrams.push((other_format, false));
        datagrams.push((future, false));
        invalid += 5;
        // Wide headers: one cut short of its 32 bytes, one with a frame count in byte 7 too.
        let wide = DatagramHeader {
            version: WIDE_DATAGRAM_VERSION,
            format: Format::Sbe,
            kind: DatagramKind::Data,
            frame_count: 1,
            protection: Default::default(),
            session: SESSION,
            sequence: i as u64 + 1,
        };
        datagrams.push((wide.to_bytes()[..28].to_vec(), false));
        let mut both_counts = wide.to_bytes().to_vec();
        both_counts[7] = 1;
        both_counts.extend_from_slice(&frames[i]);
        datagrams.push((both_counts, false));
        invalid += 2;
        // A wide copy of the frame just sent that declares 4 billion frames: a duplicate, and
        // nothing counted or expected beyond the one frame it carries.
        let mut boastful = DatagramHeader { frame_count: u32::MAX, ..wide }.to_bytes().to_vec();
        boastful.extend_from_slice(&frames[i]);
        datagrams.push((boastful, false));
        // A truncated and a bit-flipped copy of the frame just sent: duplicates, never decoded.
        let mut cut = numbered(&frames, i);
        cut.truncate(cut.len() - 5);
        let mut flipped = numbered(&frames, i);
        let last = flipped.len() - 3;
        flipped[last] ^= 0x10;
        datagrams.push((cut, false));
        datagrams.push((flipped, false));
    }
    rx.send(&datagrams);
    let r = rx.end(&end(&segments, n as u64 + 1));
    let all: u64 = segments.iter().map(|s| messages_in(s)).sum();
    assert_eq!(r["messages"], all, "{r}");
    assert_eq!(r["frames"], n as u64, "each frame once, whatever a header declares");
    assert_eq!(r["gaps"], 0);
    assert_eq!(r["decode_errors"], 0, "corrupt copies are duplicates, never decoded");
    assert_eq!(r["invalid_packets"], invalid);
    assert_eq!(r["totals_match"], true);
}

#[test]
fn a_second_subscriber_on_the_same_unicast_port_is_refused() {
    let _serial = serial();
    let first = Receiver::start();
    let second = Process::start(subscriber_bin(), ["--listen", &first.addr.to_string(), "--report-interval", "0"]);
    let finished = second.finish(LIMIT);
    assert_eq!(finished.code(), Some(1), "{finished:?}");
    assert!(finished.stderr.contains("in use by another program"), "{finished:?}");
    first.process.signal(mdrelay_harness::Signal::SIGTERM);
    let report = first.process.finish(LIMIT);
    assert_eq!(report.assert_success().json()["stop_reason"], "signal");
}

#[test]
fn an_unresolvable_host_fails_at_once() {
    let _shared = mdrelay_harness::shared();
    let finished =
        Process::start(subscriber_bin(), ["--connect", "no-such-host.invalid:9100", "--report-interval", "0"])
            .finish(LIMIT);
    assert_eq!(finished.code(), Some(1), "{finished:?}");
    assert!(finished.stderr.contains("cannot resolve"), "{finished:?}");
}
