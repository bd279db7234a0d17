//! What the subscriber's tests share beyond the harness: a synthetic feed and what it should
//! aggregate to (computed here with mdrelay-iex's Aggregator, independently of the subscriber), and the
//! frames, records and datagrams a fake publisher sends, built with proto's relay module.
#![allow(dead_code)]

use mdrelay_codec::FormatCodec;
use mdrelay_codec::{BatchHeader, Codec, Format, collect_segment};
use mdrelay_harness::process::field;
use mdrelay_harness::{NatsServer, Process, iex_data, subscriber_bin};
use mdrelay_iex::aggregate::Aggregator;
use mdrelay_iex::iextp::Segment;
use mdrelay_iex::message::Message;
use mdrelay_iex::price::Symbol;
use mdrelay_iex::synth::{SynthConfig, SyntheticDay};
use mdrelay_proto::relay::Protection;
use mdrelay_proto::relay::{
    Coalescer, DATAGRAM_VERSION, DatagramHeader, DatagramKind, Envelope, RecordTag, Totals, control_record,
};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

/// Starts `mdrelay-sub` with these arguments.
pub fn subscriber(args: &[&str]) -> Process {
    Process::start(subscriber_bin(), args)
}

/// Starts `mdrelay-sub` with `args`, its report on stdout and interval lines every 20 ms (a
/// sender's flow control reads them), for 60 s at most; waits until each of its `lines` has
/// bound. The process, the lines' addresses, and a quarter of the smallest receive buffer the
/// kernel granted: what a sender may have in flight.
pub fn udp_subscriber(args: &[&str], lines: usize) -> (Process, Vec<SocketAddr>, usize) {
    let mut all = vec!["--json", "-", "--report-interval", "0.02", "--duration", "60"];
    all.extend_from_slice(args);
    let mut process = subscriber(&all);
    let mut budget = usize::MAX;
    let mut addrs = Vec::new();
    for _ in 0..lines {
        let line = process.wait_for("receive buffer");
        let granted: usize = field(&line, "granted").and_then(|g| g.parse().ok()).expect("granted=BYTES");
        budget = budget.min(granted / 4);
        addrs.push(process.listening_on());
    }
    (process, addrs, budget)
}

/// A listener on a free loopback port, and its address.
pub fn listen() -> (TcpListener, String) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    (listener, addr)
}

/// What a datagram of `len` bytes may cost a loopback receive buffer: the kernel charges the
/// buffer it allocated (rounded up to a power of two, with its shared info) and the socket
/// buffer's own header; this errs on the high side.
pub fn charge(len: usize) -> usize {
    (len + 512).next_power_of_two() + 512
}

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

/// The segments as slices.
pub fn refs(segments: &[Vec<u8>]) -> Vec<&[u8]> {
    segments.iter().map(|s| s.as_slice()).collect()
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

/// One frame per segment, in the codec's format.
pub fn frames(codec: &mut Codec, segments: &[Vec<u8>]) -> Vec<Vec<u8>> {
    segments
        .iter()
        .map(|s| {
            let mut frame = Vec::new();
            encode(codec, s, &mut frame);
            frame
        })
        .collect()
}

/// Frames grouped into one envelope, the first numbered `first`.
fn envelope(envelope: Envelope, format: Format, first: u64, frames: &[Vec<u8>]) -> Vec<u8> {
    let mut coalescer = Coalescer::new(envelope, usize::MAX);
    let mut out = Vec::new();
    for (i, frame) in frames.iter().enumerate() {
        coalescer.push(first + i as u64, format, frame, |_| panic!("the frames fit one envelope")).unwrap();
    }
    coalescer.flush(|sealed| out = sealed.bytes.to_vec());
    out
}

/// A TCP `DATA` record of these frames, the first numbered `first`.
pub fn data_record(format: Format, first: u64, frames: &[Vec<u8>]) -> Vec<u8> {
    envelope(Envelope::Record, format, first, frames)
}

/// A UDP `DATA` datagram of these frames, the first numbered `first`.
pub fn data_datagram(format: Format, session: u64, first: u64, frames: &[Vec<u8>]) -> Vec<u8> {
    envelope(Envelope::Datagram { session, protection: Protection::NONE }, format, first, frames)
}

/// An `END` record: the totals and the next frame's number.
pub fn end_record(totals: &Totals, format: Format, next_sequence: u64) -> Vec<u8> {
    let mut payload = Vec::new();
    totals.write(&mut payload);
    control_record(RecordTag::End, format, next_sequence, &payload)
}

/// An `END` datagram: the totals and the next frame's number.
pub fn end_datagram(totals: &Totals, session: u64, next_sequence: u64) -> Vec<u8> {
    let header = DatagramHeader {
        version: DATAGRAM_VERSION,
        format: Format::Raw,
        kind: DatagramKind::End,
        frame_count: 0,
        protection: Protection::NONE,
        session,
        sequence: next_sequence,
    };
    let mut out = header.to_bytes().to_vec();
    totals.write(&mut out);
    out
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
/// with mdrelay-iex's Aggregator: aggregates (of `filter`'s symbols only, if given), counts by type.
pub fn expected_report(segments: &[&[u8]], filter: Option<&[&str]>) -> Value {
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

/// A NATS test's `nats-server`, and a directory for the test's files.
pub struct NatsSetting {
    /// The server.
    pub server: NatsServer,
    /// The directory, removed with the setting.
    pub dir: tempfile::TempDir,
}

impl NatsSetting {
    /// A server started with `args` (none: anyone may connect), and a new directory.
    pub fn start(args: &[&str]) -> NatsSetting {
        NatsSetting { server: NatsServer::start_with(args), dir: tempfile::tempdir().unwrap() }
    }

    /// The file `name` in the directory.
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// A publisher configuration: DEEP10 in SBE to `[nats]` on the server, the stream's subject
    /// and `stream`, at `rate` messages a second, with `batching` and `nats` lines added to their
    /// sections.
    pub fn publisher_config(&self, stream: &str, rate: u32, batching: &str, nats: &str) -> String {
        let path = self.path(&format!("{stream}.toml"));
        std::fs::write(
            &path,
            format!(
                "format = \"sbe\"\n[source]\ncapture = \"{}\"\n[pacing]\nmode = \"rate\"\nrate = {rate}\n\
                 [batching]\n{batching}\n[nats]\nservers = [\"{}\"]\nsubject = \"{}\"\nstream = \"{stream}\"\n{nats}\n",
                iex_data().join("DEEP10.pcap.gz").display(),
                self.server.url(),
                nats_subject(stream),
            ),
        )
        .unwrap();
        path.display().to_string()
    }

    /// `mdrelay-sub` on `stream`'s subject with the stream, writing its report to `json`, with
    /// `extra` arguments.
    pub fn subscriber(&self, stream: &str, json: &Path, extra: &[&str]) -> Process {
        let url = self.server.url();
        let subject = nats_subject(stream);
        let mut args = vec![
            "--nats",
            url.as_str(),
            "--nats-subject",
            subject.as_str(),
            "--nats-stream",
            stream,
            "--json",
            json.to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        Process::start(subscriber_bin(), args)
    }
}

/// The subject a NATS test's stream stores: `md.` and the stream's name in lower case.
pub fn nats_subject(stream: &str) -> String {
    format!("md.{}", stream.to_lowercase())
}

/// Starts `mdrelay-pub run` with the configuration file `config`.
pub fn publisher_with(config: &str) -> Process {
    Process::start(mdrelay_harness::publisher_bin(), ["run", "--config", config])
}
