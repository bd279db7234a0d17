//! `mdrelay-sub` over TCP against a fake publisher on 127.0.0.1 written here with proto's relay
//! and codec modules: aggregates, totals, format switches, refusals, reconnection, late join,
//! bad frames, echoes and the histogram log.

use crate::common;
use mdrelay_codec::FormatCodec;

use common::*;
use mdrelay_codec::{Codec, Format, Limits};
use mdrelay_harness::receive::base64_decode;
use mdrelay_harness::{STEP, accept_within, free_tcp_port};
use mdrelay_proto::relay::{
    Echo, Hello, MIN_PROTOCOL_VERSION, PROTOCOL_VERSION, RecordHeader, RecordTag, Subscribe, control_record,
};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

/// Accepts the subscriber's connection (within [`STEP`], with read and write timeouts).
fn accept(listener: &TcpListener) -> TcpStream {
    accept_within(listener, STEP)
}

/// Greets, reads the subscriber's answer and names the first frame offered, as a publisher does.
fn handshake(stream: &mut TcpStream, format: Format, session: u64, next_sequence: u64) -> Subscribe {
    stream.write_all(&Hello::new(format, session, 1, next_sequence).to_bytes()).unwrap();
    let mut answer = vec![0u8; Subscribe::LEN];
    stream.read_exact(&mut answer).unwrap();
    let version = Subscribe::parse_version(&answer).unwrap();
    answer.resize(Subscribe::len_of(version), 0);
    stream.read_exact(&mut answer[Subscribe::LEN..]).unwrap();
    stream.write_all(&control_record(RecordTag::Format, format, next_sequence, &[])).unwrap();
    Subscribe::parse(&answer).unwrap()
}

/// Sends segments as DATA records of 1 to 7 frames (varying, so records and reads do not line
/// up), in `format`, from sequence `first`; returns the next sequence.
fn send_data(stream: &mut TcpStream, codec: &mut Codec, segments: &[Vec<u8>], first: u64) -> u64 {
    let mut seq = first;
    let mut rest = segments;
    for k in 0.. {
        if rest.is_empty() {
            break;
        }
        let (chunk, after) = rest.split_at((k % 7 + 1).min(rest.len()));
        stream.write_all(&data_record(codec.format(), seq, &frames(codec, chunk))).unwrap();
        seq += chunk.len() as u64;
        rest = after;
    }
    seq
}

/// Waits until the subscriber closes its side, so the publisher does not reset the connection
/// under bytes the subscriber has not read yet.
fn drain(stream: &mut TcpStream) -> Vec<u8> {
    let mut rest = Vec::new();
    let _ = stream.read_to_end(&mut rest);
    rest
}

/// A fake publisher on a free loopback port, on a thread of its own: it accepts one subscriber
/// and hands the connection and `data` to `serve`. The address to connect to, and the thread.
fn publisher_for_one<D: Send + 'static, T: Send + 'static>(
    data: D,
    serve: impl FnOnce(TcpStream, D) -> T + Send + 'static,
) -> (String, JoinHandle<T>) {
    let (listener, addr) = listen();
    (addr, thread::spawn(move || serve(accept(&listener), data)))
}

/// A publisher that streams `segments` in raw over one connection and ends the stream.
fn raw_publisher(listener: TcpListener, segments: Vec<Vec<u8>>) -> JoinHandle<Subscribe> {
    thread::spawn(move || {
        let mut s = accept(&listener);
        let sub = handshake(&mut s, Format::Raw, 0x5eed, 1);
        let mut codec = Codec::new(Format::Raw, Limits::default());
        let next = send_data(&mut s, &mut codec, &segments, 1);
        s.write_all(&end_record(&totals(&refs(&segments)), Format::Raw, next)).unwrap();
        drain(&mut s);
        sub
    })
}

#[test]
fn a_tcp_stream_aggregates_as_proto_does_and_matches_the_publishers_totals() {
    let _shared = mdrelay_harness::shared();
    let segments = synthetic(20_000, 20, 7);
    let (listener, addr) = listen();
    let publisher = raw_publisher(listener, segments.clone());
    let done =
        subscriber(&["--connect", &addr, "--json", "-", "--report-interval", "0", "--duration", "60"]).finish(STEP);
    let subscribe = publisher.join().unwrap();
    assert_eq!(subscribe, Subscribe::new(false));
    assert_eq!(subscribe.protocol_version, PROTOCOL_VERSION);
    assert!(done.status.success(), "{done:?}");
    let r = done.json();
    assert_fields(&r, &expected_report(&refs(&segments), None));
    assert_eq!(r["totals_match"], true);
    assert_eq!(r["publisher_totals"]["frames"], segments.len());
    for zero in ["gaps", "duplicates", "reordered", "decode_errors", "format_switches", "reconnects"] {
        assert_eq!(r[zero], 0, "{zero}");
    }
    assert_eq!(r["late_join_sequence"], serde_json::Value::Null);
    assert_eq!(r["formats_seen"], serde_json::json!(["raw"]));
    assert_eq!(r["stop_reason"], "end");
    assert_eq!(r["latency_ns"]["count"], segments.len());
    assert!(r["latency_ns"]["p50"].as_u64().is_some() && r["latency_ns"]["max"].as_u64().is_some());
    // The text report went to stderr, since stdout holds the JSON.
    assert!(done.stderr.contains("publisher totals:") && done.stderr.contains("match yes"), "{}", done.stderr);
}

#[test]
fn the_symbol_filter_limits_the_aggregates_and_the_text_report_goes_to_stdout() {
    let _shared = mdrelay_harness::shared();
    let segments = synthetic(5_000, 12, 3);
    let all = expected_report(&refs(&segments), None);
    let chosen: Vec<String> = all["symbols"].as_object().unwrap().keys().take(2).cloned().collect();
    let chosen: Vec<&str> = chosen.iter().map(|s| s.as_str()).collect();
    let (listener, addr) = listen();
    let publisher = raw_publisher(listener, segments.clone());
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("report.json");
    let done = subscriber(&[
        "--connect",
        &addr,
        "--symbols",
        &chosen.join(","),
        "--json",
        json.to_str().unwrap(),
        "--report-interval",
        "0",
    ])
    .finish(STEP);
    publisher.join().unwrap();
    assert!(done.status.success(), "{done:?}");
    let r: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_fields(&r, &expected_report(&refs(&segments), Some(&chosen)));
    assert_eq!(r["symbols"].as_object().unwrap().len(), 2);
    // Counts cover every message whatever the filter, so the totals still match.
    assert_eq!(r["totals_match"], true);
    assert!(done.stdout.contains("total trade volume") && done.stdout.contains(chosen[0]), "{}", done.stdout);
}

#[test]
fn format_switches_mid_stream_lose_no_message() {
    let _shared = mdrelay_harness::shared();
    let segments = synthetic(12_000, 10, 11);
    // Raw first, then every other format in turn, each announced by a FORMAT record; raw
    // records of odd lengths leave the next records misaligned in the read buffer.
    let formats: Vec<Format> =
        std::iter::once(Format::Raw).chain(Format::ALL.into_iter().filter(|f| *f != Format::Raw)).collect();
    assert_eq!(formats.len(), Format::ALL.len());
    let (addr, publisher) = publisher_for_one((segments.clone(), formats.clone()), |mut s, (segs, plan)| {
        handshake(&mut s, Format::Raw, 1, 1);
        let part = segs.len().div_ceil(plan.len());
        let mut next = 1;
        for (k, (format, chunk)) in plan.iter().zip(segs.chunks(part)).enumerate() {
            if k > 0 {
                s.write_all(&control_record(RecordTag::Format, *format, next, &[])).unwrap();
            }
            let mut codec = Codec::new(*format, Limits::default());
            next = send_data(&mut s, &mut codec, chunk, next);
        }
        s.write_all(&end_record(&totals(&refs(&segs)), *plan.last().unwrap(), next)).unwrap();
        drain(&mut s);
    });
    let done = subscriber(&["--connect", &addr, "--json", "-", "--report-interval", "0"]).finish(STEP);
    publisher.join().unwrap();
    let r = done.json();
    assert_fields(&r, &expected_report(&refs(&segments), None));
    assert_eq!(r["format_switches"], formats.len() - 1);
    let names: Vec<&str> = formats.iter().map(|f| f.name()).collect();
    assert_eq!(r["formats_seen"], serde_json::json!(names), "every format, in the order sent");
    assert_eq!(r["decode_errors"], 0, "{}", done.stderr);
    assert_eq!(r["totals_match"], true);
}

#[test]
fn another_protocol_version_is_refused_with_exit_code_3_naming_both_versions() {
    let _shared = mdrelay_harness::shared();
    let (addr, publisher) = publisher_for_one((), |mut s, ()| {
        let greeting = Hello { protocol_version: PROTOCOL_VERSION + 1, ..Hello::new(Format::Raw, 1, 1, 1) };
        s.write_all(&greeting.to_bytes()).unwrap();
        drain(&mut s);
    });
    let done = subscriber(&["--connect", &addr, "--json", "-"]).finish(STEP);
    publisher.join().unwrap();
    assert_eq!(done.code(), Some(3), "{done:?}");
    // It names both versions, and the publisher.
    let theirs = format!("protocol version {}", PROTOCOL_VERSION + 1);
    let ours = format!("speaks versions {MIN_PROTOCOL_VERSION} to {PROTOCOL_VERSION}");
    assert!(
        done.stderr.contains(&theirs) && done.stderr.contains(&ours) && done.stderr.contains(&addr),
        "{}",
        done.stderr
    );
    // The final report is printed all the same.
    assert_eq!(done.json()["stop_reason"], "refused");
}

#[test]
fn a_refuse_record_prints_the_publishers_reason_with_exit_code_3() {
    let _shared = mdrelay_harness::shared();
    let (addr, publisher) = publisher_for_one((), |mut s, ()| {
        handshake(&mut s, Format::Raw, 1, 1);
        s.write_all(&control_record(RecordTag::Refuse, Format::Raw, 1, b"subscriber limit (4) reached")).unwrap();
        drain(&mut s);
    });
    let done = subscriber(&["--connect", &addr]).finish(STEP);
    publisher.join().unwrap();
    assert_eq!(done.code(), Some(3), "{done:?}");
    assert!(done.stderr.contains("subscriber limit (4) reached"), "{}", done.stderr);
}

#[test]
fn a_lost_connection_is_reestablished_and_nothing_is_missed() {
    let _shared = mdrelay_harness::shared();
    let segments = synthetic(4_000, 8, 5);
    let (listener, addr) = listen();
    let segs = segments.clone();
    let publisher = thread::spawn(move || {
        let half = segs.len() / 2;
        let mut codec = Codec::new(Format::Raw, Limits::default());
        let next = {
            let mut s = accept(&listener);
            handshake(&mut s, Format::Raw, 42, 1);
            send_data(&mut s, &mut codec, &segs[..half], 1)
            // Dropped here: the connection closes without an END.
        };
        let mut s = accept(&listener);
        handshake(&mut s, Format::Raw, 42, next);
        let next = send_data(&mut s, &mut codec, &segs[half..], next);
        s.write_all(&end_record(&totals(&refs(&segs)), Format::Raw, next)).unwrap();
        drain(&mut s);
    });
    let mut sub = subscriber(&["--connect", &addr, "--json", "-", "--reconnect-max-seconds", "0.2"]);
    sub.wait_for("reconnected");
    let done = sub.finish(STEP);
    publisher.join().unwrap();
    let r = done.json();
    assert_fields(&r, &expected_report(&refs(&segments), None));
    assert_eq!(r["reconnects"], 1);
    assert_eq!(r["gaps"], 0);
    assert_eq!(r["publisher_restarts"], 0);
    assert_eq!(r["totals_match"], true);
    assert!(done.stderr.contains("connection lost"), "{}", done.stderr);
}

#[test]
fn a_refused_connection_is_retried_until_the_publisher_comes_up() {
    let _shared = mdrelay_harness::shared();
    // A port nobody listens on yet (the kernel just handed it out on loopback).
    let addr = format!("127.0.0.1:{}", free_tcp_port());
    let mut sub = subscriber(&["--connect", &addr, "--json", "-", "--reconnect-max-seconds", "0.1"]);
    sub.wait_for("connection failed");
    sub.wait_for("connection failed");
    let segments = synthetic(1_000, 4, 6);
    let publisher = raw_publisher(TcpListener::bind(&addr).unwrap(), segments.clone());
    let done = sub.finish(STEP);
    publisher.join().unwrap();
    let r = done.json();
    assert_fields(&r, &expected_report(&refs(&segments), None));
    assert_eq!(r["totals_match"], true);
    // Never connected before: these were first attempts, not reconnections.
    assert_eq!(r["reconnects"], 0);
}

#[test]
fn duration_stops_a_subscriber_whose_publisher_never_comes() {
    let _shared = mdrelay_harness::shared();
    let addr = format!("127.0.0.1:{}", free_tcp_port());
    let started = Instant::now();
    let done = subscriber(&["--connect", &addr, "--json", "-", "--duration", "0.5"]).finish(STEP);
    assert!(started.elapsed() < Duration::from_secs(10));
    assert_eq!(done.code(), Some(0), "{done:?}");
    let r = done.json();
    assert_eq!(r["stop_reason"], "duration");
    assert_eq!(r["publisher_totals"], serde_json::Value::Null);
    assert_eq!(r["totals_match"], serde_json::Value::Null);
}

#[test]
fn a_late_joiner_says_so_and_an_undecodable_frame_is_skipped() {
    let _shared = mdrelay_harness::shared();
    let segments = synthetic(3_000, 8, 9);
    let (addr, publisher) = publisher_for_one(segments.clone(), |mut s, segs| {
        handshake(&mut s, Format::Raw, 7, 10);
        let mut codec = Codec::new(Format::Raw, Limits::default());
        let next = send_data(&mut s, &mut codec, &segs[..4], 10);
        // A record of a good frame, then one whose IEX-TP version byte is wrong: the second
        // cannot even be delimited, the stream goes on with the next record.
        let mut pair = frames(&mut codec, &segs[4..6]);
        pair[1][8] = 9;
        s.write_all(&data_record(Format::Raw, next, &pair)).unwrap();
        let next = send_data(&mut s, &mut codec, &segs[6..], next + 2);
        s.write_all(&end_record(&totals(&refs(&segs)), Format::Raw, next)).unwrap();
        drain(&mut s);
    });
    let done = subscriber(&["--connect", &addr, "--json", "-"]).finish(STEP);
    publisher.join().unwrap();
    let r = done.json();
    let received: Vec<&[u8]> =
        segments.iter().enumerate().filter(|(i, _)| *i != 5).map(|(_, s)| s.as_slice()).collect();
    assert_fields(&r, &expected_report(&received, None));
    assert_eq!(r["late_join_sequence"], 10);
    // The frame that cannot be delimited is never seen: one payload left undelimited, one frame
    // missing, nothing decoded wrongly.
    assert_eq!(r["undelimited_payloads"], 1);
    assert_eq!(r["gaps"], 1);
    assert_eq!(r["decode_errors"], 0);
    // Joined late: the publisher's totals cannot be compared.
    assert_eq!(r["totals_match"], false);
    assert!(done.stderr.contains("cannot delimit a frame") && done.stderr.contains("stream byte"), "{}", done.stderr);
    assert!(done.stderr.contains("joined late"), "{}", done.stderr);
}

#[test]
fn round_trip_mode_echoes_every_nth_frame_as_echo_records() {
    let _shared = mdrelay_harness::shared();
    let segments = synthetic(2_000, 5, 2);
    let (addr, publisher) = publisher_for_one(segments.clone(), |mut s, segs| {
        let sub = handshake(&mut s, Format::Raw, 3, 1);
        let mut codec = Codec::new(Format::Raw, Limits::default());
        let mut sent = Vec::new();
        for (i, seg) in segs.iter().enumerate() {
            let mut frame = Vec::new();
            encode(&mut codec, seg, &mut frame);
            let publish_time = i64::from_le_bytes(frame[..8].try_into().unwrap());
            sent.push(publish_time);
            s.write_all(&data_record(Format::Raw, i as u64 + 1, &[frame])).unwrap();
        }
        s.write_all(&end_record(&totals(&refs(&segs)), Format::Raw, segs.len() as u64 + 1)).unwrap();
        let back = drain(&mut s);
        (sub, sent, back)
    });
    let done =
        subscriber(&["--connect", &addr, "--json", "-", "--latency", "round-trip", "--echo-every", "3"]).finish(STEP);
    let (subscribe, sent, back) = publisher.join().unwrap();
    assert!(subscribe.echo);
    let r = done.json();
    assert_eq!(back.len() % 32, 0);
    let echoes: Vec<(RecordHeader, Echo)> =
        back.chunks(32).map(|c| (RecordHeader::parse(&c[..16], 16).unwrap(), Echo::parse(&c[16..]).unwrap())).collect();
    assert_eq!(echoes.len(), segments.len() / 3);
    assert_eq!(r["echoes_sent"], echoes.len());
    for (k, (header, echo)) in echoes.iter().enumerate() {
        let seq = 3 * (k as u64 + 1);
        assert_eq!(header.tag, RecordTag::Echo);
        assert_eq!(header.length, 16);
        assert_eq!(echo.sequence, seq);
        assert_eq!(echo.publish_time, sent[seq as usize - 1]);
    }
    assert_eq!(r["latency_mode"], "round-trip");
    assert_eq!(r["latency_ns"]["count"], segments.len());
}

#[test]
fn the_histogram_log_has_one_interval_per_report_period() {
    let _shared = mdrelay_harness::shared();
    use hdrhistogram::serialization::Deserializer;
    use hdrhistogram::serialization::interval_log::{IntervalLogIterator, LogEntry};
    let segments = synthetic(1_000, 5, 4);
    let (listener, addr) = listen();
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("latency.hlog");
    let args =
        ["--connect", &addr, "--json", "-", "--report-interval", "0.1", "--histogram-log", log.to_str().unwrap()];
    let mut sub = subscriber(&args);
    let mut s = accept(&listener);
    handshake(&mut s, Format::Raw, 3, 1);
    let mut codec = Codec::new(Format::Raw, Limits::default());
    let mut next = 1;
    let chunks = 4;
    for chunk in segments.chunks(segments.len().div_ceil(chunks)) {
        next = send_data(&mut s, &mut codec, chunk, next);
        // Counted in an interval that ends before the next chunk is sent: every chunk lands in
        // an interval of its own.
        sub.wait_for_frames(next - 1);
    }
    s.write_all(&end_record(&totals(&refs(&segments)), Format::Raw, next)).unwrap();
    drain(&mut s);
    let done = sub.finish(STEP);
    let r = done.json();
    assert!(done.stderr.contains("msg/s"), "interval lines on stderr: {}", done.stderr);
    let text = std::fs::read(&log).unwrap();
    assert!(String::from_utf8_lossy(&text).contains("#[StartTime: "));
    let mut intervals = 0;
    let mut with_frames = 0;
    let mut count = 0;
    let mut deserializer = Deserializer::new();
    for entry in IntervalLogIterator::new(&text) {
        if let LogEntry::Interval(interval) = entry.unwrap() {
            intervals += 1;
            let bytes = base64_decode(interval.encoded_histogram());
            let h: hdrhistogram::Histogram<u64> = deserializer.deserialize(&mut bytes.as_slice()).unwrap();
            count += h.len();
            with_frames += usize::from(!h.is_empty());
        }
    }
    assert!(with_frames >= chunks, "{with_frames} intervals with frames of {intervals}, for {chunks} chunks");
    assert_eq!(count, r["latency_ns"]["count"].as_u64().unwrap());
}

#[test]
fn a_snapshot_that_does_not_open_is_dropped_whole_and_the_stream_is_taken() {
    let _shared = mdrelay_harness::shared();
    let segments = synthetic(3_000, 12, 5);
    let (addr, publisher) = publisher_for_one(segments.clone(), |mut s, segments| {
        let format = Format::Raw;
        s.write_all(&Hello::new(format, 0x5eed, 1, 1).to_bytes()).unwrap();
        let mut answer = vec![0u8; Subscribe::V2_LEN];
        s.read_exact(&mut answer).unwrap();
        let subscribe = Subscribe::parse(&answer).unwrap();
        // A snapshot as of frame 0 whose one frame is noise: no raw frame delimits it.
        let noise: Vec<u8> = (0..64u32).map(|i| (i * 89 + 7) as u8).collect();
        let header = RecordHeader { tag: RecordTag::Snapshot, format, frame_count: 1, length: 64, sequence: 0 };
        s.write_all(&header.to_bytes()).unwrap();
        s.write_all(&noise).unwrap();
        s.write_all(&control_record(RecordTag::Format, format, 1, &[])).unwrap();
        let mut codec = Codec::new(format, Limits::default());
        let next = send_data(&mut s, &mut codec, &segments, 1);
        s.write_all(&end_record(&totals(&refs(&segments)), format, next)).unwrap();
        drain(&mut s);
        subscribe
    });
    let done = subscriber(&["--connect", &addr, "--snapshot", "--json", "-", "--report-interval", "0"]).finish(STEP);
    let subscribe = publisher.join().unwrap();
    assert!(subscribe.snapshot, "the answer asked for a snapshot");
    assert!(done.status.success(), "{done:?}");
    assert!(
        done.stderr.contains("no snapshot: a snapshot frame at payload byte 0 cannot be delimited"),
        "{}",
        done.stderr
    );
    let r = done.json();
    assert_eq!(r["snapshot_as_of"], serde_json::Value::Null);
    // The stream from its first frame is whole without the snapshot.
    assert_eq!((&r["totals_match"], &r["late_join_sequence"]), (&true.into(), &serde_json::Value::Null));
    assert_fields(&r, &expected_report(&refs(&segments), None));
}
