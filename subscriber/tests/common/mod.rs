//! Helpers for the subscriber's tests: a synthetic feed and what it should aggregate to
//! (computed here with proto's Aggregator, independently of the subscriber), the relay bytes a
//! fake publisher sends, and running the real `mdrelay-sub` binary with bounded waits.
#![allow(dead_code)]

use mdrelay_proto::aggregate::Aggregator;
use mdrelay_proto::codec::{BatchHeader, Codec, Format, Limits, collect_segment};
use mdrelay_proto::iextp::Segment;
use mdrelay_proto::message::Message;
use mdrelay_proto::price::Symbol;
use mdrelay_proto::relay::{
    DatagramHeader, DatagramKind, Hello, PROTOCOL_VERSION, RecordHeader, RecordTag, SCHEMA_VERSION, Totals,
};
use mdrelay_proto::synth::{SynthConfig, SyntheticDay};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// How long any single test step may wait before the test fails.
pub const STEP: Duration = Duration::from_secs(30);

/// The segments (IEX-TP UDP payloads) of a small synthetic day.
pub fn synthetic(messages: u64, symbols: usize, seed: u64) -> Vec<Vec<u8>> {
    let config = SynthConfig { messages, symbols, seed, ..SynthConfig::default() };
    let mut day = SyntheticDay::new(config).expect("valid synthetic configuration");
    let mut out = Vec::new();
    while let Some(segment) = day.next_segment() {
        out.push(segment.bytes.to_vec());
    }
    out
}

/// Current time in ns since the epoch, as publish times are.
pub fn now_ns() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_nanos() as i64
}

/// Appends one frame of `segment` in the codec's format, stamped now.
pub fn encode(codec: &mut Codec, segment: &[u8], out: &mut Vec<u8>) {
    let now = now_ns();
    if let Codec::Raw(raw) = codec {
        raw.encode_segment(now, segment, out);
        return;
    }
    let parsed = Segment::parse(segment).expect("synthetic segments parse");
    let mut list = Vec::new();
    collect_segment(&parsed, &mut list);
    let mut header = BatchHeader::from_segment(&parsed.header);
    header.publish_time = now;
    codec.encode(&header, &list, out).expect("synthetic batches encode");
}

/// The formats besides raw whose codecs already round-trip the feed's busiest segment, to
/// exercise format switches; empty while no other format is implemented.
pub fn other_formats(segments: &[Vec<u8>]) -> Vec<Format> {
    let Some(segment) = segments.iter().max_by_key(|s| Segment::parse(s).map_or(0, |p| p.header.message_count)) else {
        return Vec::new();
    };
    let expected = messages_of(segment);
    Format::ALL
        .into_iter()
        .filter(|f| *f != Format::Raw)
        .filter(|&format| {
            std::panic::catch_unwind(|| {
                let mut codec = Codec::new(format, Limits::default());
                let parsed = Segment::parse(segment).unwrap();
                let mut list = Vec::new();
                collect_segment(&parsed, &mut list);
                let mut out = Vec::new();
                if codec.encode(&BatchHeader::from_segment(&parsed.header), &list, &mut out).is_err() {
                    return false;
                }
                if codec.frame_len(&out) != Ok(Some(out.len())) {
                    return false;
                }
                let mut got = Vec::new();
                codec.decode(&out, |m| got.push(format!("{m:?}"))).is_ok() && got == expected
            })
            .unwrap_or(false)
        })
        .collect()
}

fn messages_of(segment: &[u8]) -> Vec<String> {
    let parsed = Segment::parse(segment).unwrap();
    let mut list = Vec::new();
    collect_segment(&parsed, &mut list);
    list.iter().map(|m| format!("{m:?}")).collect()
}

/// What the publisher's END says for these segments, all of them frames.
pub fn totals(segments: &[&[u8]]) -> Totals {
    let mut t = Totals { frames: segments.len() as u64, ..Totals::default() };
    for s in segments {
        let parsed = Segment::parse(s).unwrap();
        for block in parsed.blocks() {
            if let Ok(Ok(m)) = block.map(Message::parse) {
                t.messages += 1;
                *t.by_type.entry(m.kind()).or_default() += 1;
            }
        }
    }
    t
}

/// The report fields the subscriber must compute from these segments, figured independently
/// with proto's Aggregator: aggregates (of `filter`'s symbols only, if given), counts by type.
pub fn expected(segments: &[&[u8]], filter: Option<&[&str]>) -> Value {
    let filter: Option<Vec<Symbol>> = filter.map(|f| f.iter().map(|s| Symbol::new(s).unwrap()).collect());
    let mut agg = Aggregator::new();
    let mut types: BTreeMap<String, u64> = BTreeMap::new();
    let mut messages = 0u64;
    for s in segments {
        for block in Segment::parse(s).unwrap().blocks() {
            let Ok(Ok(m)) = block.map(Message::parse) else { continue };
            messages += 1;
            *types.entry(char::from(m.kind()).to_string()).or_default() += 1;
            if filter.as_ref().is_none_or(|f| m.symbol().is_some_and(|s| f.contains(&s))) {
                agg.apply(&m);
            }
        }
    }
    let active = agg.active();
    let symbols: serde_json::Map<String, Value> =
        active.iter().map(|(s, a)| (s.to_text(), serde_json::to_value(a).unwrap())).collect();
    json!({
        "total_trade_volume": agg.total_trade_volume(),
        "symbols_with_trades_or_quotes": active.len(),
        "symbols": symbols,
        "message_types": types,
        "messages": messages,
        "frames": segments.len(),
    })
}

/// Asserts that every field of `expected` has the same value in the report.
pub fn assert_fields(report: &Value, expected: &Value) {
    for (key, value) in expected.as_object().unwrap() {
        assert_eq!(&report[key], value, "report field {key}");
    }
}

/// A publisher greeting.
pub fn hello(format: Format, session: u64, next_sequence: u64) -> [u8; Hello::LEN] {
    Hello {
        protocol_version: PROTOCOL_VERSION,
        format,
        schema_version: SCHEMA_VERSION,
        session,
        stream: 1,
        next_sequence,
    }
    .to_bytes()
}

/// A TCP record: header and payload.
pub fn record(tag: RecordTag, format: Format, frame_count: u16, sequence: u64, payload: &[u8]) -> Vec<u8> {
    let header = RecordHeader { tag, format, frame_count, length: payload.len() as u32, sequence };
    let mut out = header.to_bytes().to_vec();
    out.extend_from_slice(payload);
    out
}

/// An END record.
pub fn end_record(totals: &Totals, format: Format, next_sequence: u64) -> Vec<u8> {
    let mut payload = Vec::new();
    totals.write(&mut payload);
    record(RecordTag::End, format, 0, next_sequence, &payload)
}

/// A datagram: header and body.
pub fn datagram(
    kind: DatagramKind,
    format: Format,
    frame_count: u8,
    session: u64,
    sequence: u64,
    body: &[u8],
) -> Vec<u8> {
    let header = DatagramHeader { version: PROTOCOL_VERSION as u8, format, kind, frame_count, session, sequence };
    let mut out = header.to_bytes().to_vec();
    out.extend_from_slice(body);
    out
}

/// An END datagram.
pub fn end_datagram(totals: &Totals, session: u64, next_sequence: u64) -> Vec<u8> {
    let mut body = Vec::new();
    totals.write(&mut body);
    datagram(DatagramKind::End, Format::Raw, 0, session, next_sequence, &body)
}

/// A running `mdrelay-sub`, killed if the test drops it early.
pub struct Sub {
    child: Child,
    lines: mpsc::Receiver<String>,
    stderr: Vec<String>,
    stdout: std::thread::JoinHandle<String>,
}

/// What a finished run left.
#[derive(Debug)]
pub struct Finished {
    /// The exit status.
    pub status: ExitStatus,
    /// Standard output.
    pub stdout: String,
    /// Standard error.
    pub stderr: String,
}

impl Finished {
    /// The JSON report, when it was written to stdout (`--json -`).
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("stdout is not a JSON report ({e}):\n{}\nstderr:\n{}", self.stdout, self.stderr))
    }
}

impl Sub {
    /// Starts the binary with these arguments (logs on stderr, collected as they come).
    pub fn start(args: &[&str]) -> Sub {
        let mut child = Command::new(env!("CARGO_BIN_EXE_mdrelay-sub"))
            .args(args)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("mdrelay-sub starts");
        let (tx, lines) = mpsc::channel();
        let stderr = child.stderr.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut out = child.stdout.take().unwrap();
        let stdout = std::thread::spawn(move || {
            let mut s = String::new();
            let _ = out.read_to_string(&mut s);
            s
        });
        Sub { child, lines, stderr: Vec::new(), stdout }
    }

    /// Waits for a log line containing `needle` and returns it.
    pub fn wait_for(&mut self, needle: &str) -> String {
        let deadline = Instant::now() + STEP;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    self.stderr.push(line.clone());
                    if line.contains(needle) {
                        return line;
                    }
                }
                Err(_) => {
                    panic!("no log line with {needle:?} within {STEP:?}; stderr so far:\n{}", self.stderr.join("\n"))
                }
            }
        }
    }

    /// The address after "listening on " in the log (UDP transports bound to port 0).
    pub fn listening_on(&mut self) -> std::net::SocketAddr {
        let line = self.wait_for("listening on ");
        let rest = &line[line.find("listening on ").unwrap() + "listening on ".len()..];
        rest.split_whitespace().next().unwrap().parse().unwrap()
    }

    /// The process id.
    pub fn id(&self) -> u32 {
        self.child.id()
    }

    /// Waits for the exit (killing the process and failing the test after [`STEP`]).
    pub fn finish(mut self) -> Finished {
        let deadline = Instant::now() + STEP;
        let status = loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                break status;
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                panic!("mdrelay-sub did not exit within {STEP:?}; stderr:\n{}", self.stderr.join("\n"));
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        // The pipes close at exit: collect the rest of stderr.
        while let Ok(line) = self.lines.recv_timeout(Duration::from_secs(5)) {
            self.stderr.push(line);
        }
        let stdout = std::mem::replace(&mut self.stdout, std::thread::spawn(String::new)).join().unwrap();
        Finished { status, stdout, stderr: self.stderr.join("\n") }
    }
}

impl Drop for Sub {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}
