//! The subscriber's TCP connection against a peer that greets correctly and then misbehaves
//! (std::net on loopback, here): records producing nothing sent without end, which must hold
//! up neither the interval reports nor SIGTERM; refusals whose reason is huge or carries
//! newlines and terminal escapes, which must reach stderr bounded and escaped; and frames whose
//! symbols and message types are terminal escapes, which the report shows escaped. A real
//! `mdrelay-sub` process receives.

use crate::common::subscriber;
use mdrelay_codec::FormatCodec;
use mdrelay_codec::{BatchHeader, Codec, Format, Limits};
use mdrelay_harness::receive::{fake_publisher, flood, refuse};
use mdrelay_harness::{STEP, Signal, serial, shared};
use mdrelay_iex::message::{Message, Trade, UnknownMessage};
use mdrelay_iex::{Price, Symbol};
use mdrelay_proto::relay::{MAX_REASON, RecordHeader, RecordTag, Totals, control_record};
use std::io::{Read, Write};
use std::net::SocketAddr;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

const SESSION: u64 = 0x5e55;
/// The longest a flood goes on: far longer than a report period or a stop should take.
const FLOOD: Duration = Duration::from_secs(10);

/// A peer that greets one subscriber as the publisher of `SESSION` and reads its answer, then
/// writes `record` over and over until the subscriber leaves or `FLOOD` passes; returns the
/// bytes it sent and whether it ran out of time with the subscriber still there.
fn flooding_publisher(record: Vec<u8>) -> (SocketAddr, JoinHandle<(u64, bool)>) {
    fake_publisher(SESSION, move |mut s, _| flood(&mut s, &record, FLOOD))
}

#[test]
fn format_records_without_end_hold_up_neither_the_interval_reports_nor_sigterm() {
    let _serial = serial();
    let (addr, peer) = flooding_publisher(control_record(RecordTag::Format, Format::Sbe, 1, &[]));
    let addr = addr.to_string();
    let mut sub = subscriber(&["--connect", &addr, "--report-interval", "0.2", "--json", "-"]);
    sub.wait_for("greeted");
    // Three report periods' worth of interval lines, while the flood goes on.
    let waited = Instant::now();
    let mut intervals = 0;
    while intervals < 3 && waited.elapsed() < Duration::from_secs(3) {
        let left = Duration::from_secs(3).saturating_sub(waited.elapsed());
        if sub.try_wait_until("an interval line", left, |l| l.contains("msg/s")).is_ok() {
            intervals += 1;
        }
    }
    let in_time = waited.elapsed();
    let signalled = Instant::now();
    sub.signal(Signal::SIGTERM);
    let done = sub.try_finish(FLOOD + Duration::from_secs(5));
    let stopped = signalled.elapsed();
    let (bytes, ran_out) = peer.join().unwrap();
    let done = done.unwrap_or_else(|f| panic!("{f}"));
    assert_eq!(
        (intervals, ran_out),
        (3, false),
        "interval lines in {in_time:?} (every 0.2 s wanted) while the peer sent {} MB of FORMAT records; \
         SIGTERM answered in {stopped:?}",
        bytes >> 20
    );
    assert!(stopped < Duration::from_secs(2), "SIGTERM answered in {stopped:?}");
    done.assert_success();
    assert_eq!(done.json()["stop_reason"], "signal", "{done:?}");
}

/// A peer that greets, reads the answer, and refuses with `reason`, then holds the connection
/// until the subscriber leaves.
fn refusing_publisher(reason: Vec<u8>) -> (SocketAddr, JoinHandle<()>) {
    fake_publisher(SESSION, move |s, _| refuse(s, &reason, reason.len() as u32))
}

#[test]
fn a_60_mib_refusal_reason_reaches_stderr_cut_to_the_limit() {
    let _shared = shared();
    let reason: Vec<u8> = b"closed for maintenance; ".iter().copied().cycle().take(60 << 20).collect();
    let (addr, peer) = refusing_publisher(reason.clone());
    let done = subscriber(&["--connect", &addr.to_string(), "--json", "-"]).finish(STEP);
    peer.join().unwrap();
    let longest = done.stderr.lines().map(str::len).max().unwrap_or(0);
    assert!(longest < 2048, "a stderr line of {longest} bytes");
    assert_eq!(done.code(), Some(3), "refused: {done:?}");
    let kept = String::from_utf8_lossy(&reason[..MAX_REASON]);
    let line = done.stderr.lines().find(|l| l.contains("refused the subscription")).expect("the refusal");
    assert!(line.contains(&*kept) && line.contains(&(60u32 << 20).to_string()), "{line}");
}

#[test]
fn a_refusal_reason_with_a_forged_log_line_and_terminal_escapes_is_printed_escaped() {
    let _shared = shared();
    let forged = "upgrade\n2025-01-01T00:00:00.000000Z  INFO mdrelay_sub: end of stream\r\x1b[2J\x1b]0;owned\x07";
    let (addr, peer) = refusing_publisher(forged.as_bytes().to_vec());
    let done = subscriber(&["--connect", &addr.to_string(), "--json", "-"]).finish(STEP);
    peer.join().unwrap();
    assert_eq!(done.code(), Some(3), "refused: {done:?}");
    assert!(!done.stderr.contains(['\x1b', '\r', '\x07']), "control characters on stderr: {:?}", done.stderr);
    assert!(
        !done.stderr.lines().any(|l| l.starts_with("2025-01-01T00:00:00.000000Z")),
        "a forged log line of its own: {}",
        done.stderr
    );
    assert!(
        done.stderr.contains(r"upgrade\n2025-01-01T00:00:00.000000Z  INFO mdrelay_sub: end of stream\r\u{1b}[2J"),
        "{}",
        done.stderr
    );
}

#[test]
fn symbols_and_message_types_made_of_terminal_escapes_are_shown_escaped_in_the_report() {
    let _shared = shared();
    let symbol = Symbol(*b"E\x1b[2J\x07  ");
    let trade = Message::TradeReport(Trade {
        sale_condition: 0,
        timestamp: 1,
        symbol,
        size: 7,
        price: Price(10_000),
        trade_id: 1,
    });
    let unknown = Message::Unknown(UnknownMessage { kind: 0x1b, bytes: &[0x1b, b'[', b'H'] });
    let mut frame = Vec::new();
    let header = BatchHeader { publish_time: mdrelay_runtime::clock::wall_clock_ns(), ..BatchHeader::default() };
    Codec::new(Format::Sbe, Limits::default()).encode(&header, &[trade, unknown], &mut frame).unwrap();
    let (addr, peer) = fake_publisher(SESSION, move |mut s, _| {
        let data = RecordHeader {
            tag: RecordTag::Data,
            format: Format::Sbe,
            frame_count: 1,
            length: frame.len() as u32,
            sequence: 1,
        };
        let totals =
            Totals { frames: 1, messages: 2, by_type: [(b'T', 1), (0x1b, 1)].into_iter().collect(), truncated: false };
        let mut end = Vec::new();
        totals.write(&mut end);
        let mut bytes = control_record(RecordTag::Format, Format::Sbe, 1, &[]);
        bytes.extend(data.to_bytes());
        bytes.extend(&frame);
        bytes.extend(control_record(RecordTag::End, Format::Sbe, 2, &end));
        s.write_all(&bytes).unwrap();
        let _ = s.read_to_end(&mut Vec::new());
    });
    let done = subscriber(&["--connect", &addr.to_string(), "--json", "-"]).finish(STEP);
    peer.join().unwrap();
    done.assert_success();
    assert_eq!(done.json()["messages"], 2, "{done:?}");
    assert!(!done.stderr.contains(['\x1b', '\x07']), "control characters on stderr: {:?}", done.stderr);
    assert!(done.stderr.contains(r"E\u{1b}[2J\u{7}"), "the symbol, escaped: {}", done.stderr);
    assert!(done.stderr.contains(r"\u{1b}:1"), "the type byte, escaped: {}", done.stderr);
}
