//! What the client's tests share: an aggregation of received messages written here from the
//! rules in ../shared/data/iex/README.md (not the project's aggregator), compared with the
//! reference outputs; and publishers started as real processes.
#![allow(dead_code)]

use mdrelay_client::{Event, Frame, Message, Subscriber};
use mdrelay_harness::process::field;
use mdrelay_harness::serial::Serial;
use mdrelay_harness::{NatsServer, Process, iex_data, nats_stream_state, publisher_bin, serial};
use serde_json::{Map, Value, json};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

/// The longest a test's stream may take before the test fails (a few seconds when all is well).
pub const RUN: Duration = Duration::from_secs(120);

/// A capture in ../shared.
pub fn capture(name: &str) -> String {
    iex_data().join(format!("{name}.pcap.gz")).display().to_string()
}

/// One symbol's figures, by the README's rules.
#[derive(Clone, Debug, Default)]
struct Figures {
    trade_volume: u64,
    trades: u64,
    broken_trades: u64,
    trade_high: Option<i64>,
    trade_low: Option<i64>,
    bid_high: Option<i64>,
    bid_low: Option<i64>,
    ask_high: Option<i64>,
    ask_low: Option<i64>,
}

fn high(v: &mut Option<i64>, p: i64) {
    *v = Some(v.map_or(p, |h| h.max(p)));
}

fn low(v: &mut Option<i64>, p: i64) {
    *v = Some(v.map_or(p, |l| l.min(p)));
}

fn figures<'a>(s: &'a mut BTreeMap<String, Figures>, symbol: &mdrelay_client::Symbol) -> &'a mut Figures {
    s.entry(String::from_utf8_lossy(symbol.trimmed()).into_owned()).or_default()
}

/// What a test received: messages by type and per-symbol figures, frames by sequence.
#[derive(Debug, Default)]
pub struct Tally {
    symbols: BTreeMap<String, Figures>,
    pub types: BTreeMap<String, u64>,
    pub messages: u64,
    pub frames: u64,
    pub recovered: u64,
    /// Sequence numbers taken, to find a frame taken twice.
    pub sequences: Vec<u64>,
    /// Who sent the recovered frames.
    pub recovered_from: std::collections::BTreeSet<SocketAddr>,
}

impl Tally {
    /// Takes one frame's messages and skipped kinds.
    pub fn frame(&mut self, frame: &Frame<'_>) {
        assert!(
            frame.decode_error().is_none(),
            "frame {} did not decode: {:?}",
            frame.sequence(),
            frame.decode_error()
        );
        let peer = frame.peer().unwrap_or_else(|| panic!("frame {} says who sent it", frame.sequence()));
        self.frames += 1;
        self.recovered += u64::from(frame.recovered());
        if frame.recovered() {
            self.recovered_from.insert(peer);
        }
        self.sequences.push(frame.sequence());
        for m in frame.messages() {
            self.message(&m);
        }
        for &kind in frame.skipped() {
            self.messages += 1;
            *self.types.entry((kind as char).to_string()).or_default() += 1;
        }
    }

    /// Takes one owned frame (from the stream adapter).
    pub fn owned_frame(&mut self, frame: &mdrelay_client::OwnedFrame) {
        assert!(frame.decode_error().is_none(), "frame {} did not decode", frame.sequence());
        self.frames += 1;
        self.recovered += u64::from(frame.recovered());
        self.sequences.push(frame.sequence());
        for m in frame.messages() {
            self.message(&m.as_message());
        }
        for &kind in frame.skipped() {
            self.messages += 1;
            *self.types.entry((kind as char).to_string()).or_default() += 1;
        }
    }

    /// Takes one message.
    pub fn message(&mut self, m: &Message<'_>) {
        self.messages += 1;
        *self.types.entry((m.kind() as char).to_string()).or_default() += 1;
        match m {
            Message::TradeReport(t) => {
                let f = figures(&mut self.symbols, &t.symbol);
                f.trade_volume += u64::from(t.size);
                f.trades += 1;
                high(&mut f.trade_high, t.price.0);
                low(&mut f.trade_low, t.price.0);
            }
            Message::TradeBreak(t) => figures(&mut self.symbols, &t.symbol).broken_trades += 1,
            Message::PriceLevelUpdate(p) => {
                let f = figures(&mut self.symbols, &p.symbol);
                match m.kind() {
                    b'8' => {
                        high(&mut f.bid_high, p.price.0);
                        low(&mut f.bid_low, p.price.0);
                    }
                    _ => {
                        high(&mut f.ask_high, p.price.0);
                        low(&mut f.ask_low, p.price.0);
                    }
                }
            }
            Message::QuoteUpdate(q) => {
                let f = figures(&mut self.symbols, &q.symbol);
                if q.bid_size > 0 {
                    high(&mut f.bid_high, q.bid_price.0);
                    low(&mut f.bid_low, q.bid_price.0);
                }
                if q.ask_size > 0 {
                    high(&mut f.ask_high, q.ask_price.0);
                    low(&mut f.ask_low, q.ask_price.0);
                }
            }
            _ => {}
        }
    }

    /// The symbols with a trade or a quote, as the reference writes them.
    pub fn symbols(&self) -> Value {
        let mut out = Map::new();
        for (name, f) in &self.symbols {
            // Listed when it has a trade or a quote (a bid or an ask set).
            if f.trades == 0 && f.bid_high.is_none() && f.ask_high.is_none() {
                continue;
            }
            out.insert(
                name.clone(),
                json!({
                    "trade_volume": f.trade_volume, "trades": f.trades, "broken_trades": f.broken_trades,
                    "trade_high": f.trade_high, "trade_low": f.trade_low, "bid_high": f.bid_high,
                    "bid_low": f.bid_low, "ask_high": f.ask_high, "ask_low": f.ask_low,
                }),
            );
        }
        Value::Object(out)
    }

    /// Total traded volume.
    pub fn volume(&self) -> u64 {
        self.symbols.values().map(|f| f.trade_volume).sum()
    }

    /// Asserts every message arrived once and the aggregates equal the reference's.
    pub fn assert_reference(&self, reference: &Value, context: &str) {
        assert_eq!(self.messages, reference["messages"].as_u64().unwrap(), "{context}: messages");
        assert_eq!(json!(self.types), reference["message_types"], "{context}: message types");
        let ours = self.symbols();
        if ours != reference["symbols"] {
            // The symbols that differ, not two whole tables.
            let (a, b) = (ours.as_object().unwrap(), reference["symbols"].as_object().unwrap());
            let differ: Vec<String> = a
                .keys()
                .chain(b.keys())
                .filter(|k| a.get(*k) != b.get(*k))
                .map(|k| format!("{k}: {:?} against the reference's {:?}", a.get(k), b.get(k)))
                .take(5)
                .collect();
            panic!("{context}: symbols differ: {differ:#?}");
        }
        assert_eq!(self.volume(), reference["total_trade_volume"].as_u64().unwrap(), "{context}: volume");
        let mut seen = self.sequences.clone();
        seen.sort_unstable();
        seen.dedup();
        assert_eq!(seen.len(), self.sequences.len(), "{context}: a frame taken twice");
    }
}

/// Receives until the end of the stream (or `limit`), taking every frame; returns the tally
/// and the other events, as their `Debug` text.
pub fn receive_all(subscriber: &mut Subscriber, limit: Duration) -> (Tally, Vec<String>, Option<mdrelay_client::End>) {
    receive_all_with(subscriber, limit, |_| {})
}

/// As [`receive_all`], calling `before_each_wait` with the tally so far before each wait for an
/// event (to stall the reader, say).
pub fn receive_all_with(
    subscriber: &mut Subscriber,
    limit: Duration,
    mut before_each_wait: impl FnMut(&Tally),
) -> (Tally, Vec<String>, Option<mdrelay_client::End>) {
    let started = Instant::now();
    let mut tally = Tally::default();
    let mut events = Vec::new();
    let mut end = None;
    loop {
        assert!(started.elapsed() < limit, "no end of stream within {limit:?}: {events:?}");
        before_each_wait(&tally);
        match subscriber.next_event_timeout(Duration::from_secs(1)) {
            Ok(mdrelay_client::Waited::Event(Event::Frame(frame))) => tally.frame(&frame),
            Ok(mdrelay_client::Waited::Event(Event::End(e))) => end = Some(e),
            Ok(mdrelay_client::Waited::Event(other)) => events.push(format!("{other:?}")),
            Ok(mdrelay_client::Waited::TimedOut) => {}
            Ok(mdrelay_client::Waited::Finished) => return (tally, events, end),
            Err(e) => panic!("the stream failed: {e} (after {events:?})"),
        }
    }
}

/// Starts `mdrelay-pub run` with `args`.
pub fn publisher(args: &[&str]) -> Process {
    Process::start(publisher_bin(), ["run"].iter().chain(args))
}

/// Starts `mdrelay-pub run` serving the capture `capture_name` over TCP on a free loopback
/// port, once one subscriber has come, blocking when a subscriber falls behind (so no frame is
/// dropped); `extra` arguments after those.
pub fn tcp_publisher(capture_name: &str, extra: &[&str]) -> Process {
    let file = capture(capture_name);
    let preset = ["--capture", &file, "--tcp", "127.0.0.1:0", "--wait-subscribers", "1", "--slow-subscriber", "block"];
    publisher(&[&preset[..], extra].concat())
}

/// The retransmission service's address, from the publisher's log.
pub fn retransmit_addr(publisher: &mut Process) -> SocketAddr {
    let line = publisher.wait_until("\"serving retransmissions over TCP\"", |l| l.contains("serving retransmissions"));
    field(&line, "listen").unwrap_or_default().parse().unwrap_or_else(|e| panic!("{line}: {e}"))
}

/// Starts `mdrelay-pub run` with the configuration file `config` (its `[nats]` output), sending
/// the capture `capture_name` paced at `rate` messages a second; `extra` arguments after those.
pub fn nats_publisher(config: &str, capture_name: &str, rate: &str, extra: &[&str]) -> Process {
    let file = capture(capture_name);
    let preset = ["--config", config, "--capture", &file, "--pacing", "rate", "--rate", rate];
    publisher(&[&preset[..], extra].concat())
}

/// A NATS test's setting: the host to itself ([`serial`]), a `nats-server`, and a directory for
/// the test's files.
pub struct NatsSetting {
    /// The server.
    pub server: NatsServer,
    /// The directory, removed with the setting.
    pub dir: tempfile::TempDir,
    /// Dropped last: the server is gone before another test has the host.
    _serial: Serial,
}

impl NatsSetting {
    /// Once the host is this test's alone, a server started with `args` (none: anyone may
    /// connect), and a new directory.
    pub fn start(args: &[&str]) -> NatsSetting {
        let serial = serial();
        NatsSetting { server: NatsServer::start_with(args), dir: tempfile::tempdir().unwrap(), _serial: serial }
    }

    /// A publisher configuration file with only its `[nats]` output to `subject` and `stream`
    /// (and `extra` lines in it); the rest comes as flags.
    pub fn config(&self, subject: &str, stream: &str, extra: &str) -> String {
        let path = self.dir.path().join(format!("{stream}.toml"));
        let servers = self.server.url();
        let text =
            format!("[nats]\nservers = [\"{servers}\"]\nsubject = \"{subject}\"\nstream = \"{stream}\"\n{extra}");
        std::fs::write(&path, text).unwrap();
        path.display().to_string()
    }

    /// Messages `stream` holds now, by natscli (0 while it cannot be read).
    pub fn stored(&self, stream: &str) -> u64 {
        nats_stream_state(&self.server.url(), stream).unwrap_or_default()["messages"].as_u64().unwrap_or(0)
    }

    /// Waits until `stream` holds `messages` messages, for a minute at most.
    pub fn wait_until_stored(&self, stream: &str, messages: u64) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while self.stored(stream) < messages {
            assert!(Instant::now() < deadline, "the stream {stream} did not reach {messages} messages");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}
