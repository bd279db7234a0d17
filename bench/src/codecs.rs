//! The codec benchmark.
//!
//! Two kinds of figure, measured separately so neither disturbs the other:
//! - per batch: each encode, and each frame+decode+aggregate, timed with a TSC clock into an
//!   HdrHistogram (p50 / p99 / p99.9 / max); the clock's own cost is measured and printed beside;
//! - totals: one clock read around a loop over the whole capture, repeated, median reported.
//!
//! Beside the full decode, each format is measured decoding with a one-symbol filter (other
//! symbols' messages skipped as early as the format allows), and the wire protection's cost per
//! frame is measured on the format's own frames: CRC-32C, and AES-256-GCM, each sealed and
//! opened. Steady-state allocations are counted on a pass of their own, after a warm-up pass.
//! Last, the client's `Books` are kept over the capture's price level messages, whole passes
//! timed, per message.
//!
//! Output buffers are reserved and reused, so no batch pays for a page fault on a fresh buffer.

use crate::loopback::thousands;
use anyhow::{Context, Result, bail};
use clap::Args;
use hdrhistogram::Histogram;
use mdrelay_codec::FormatCodec;
use mdrelay_codec::{BatchHeader, Codec, Format, Limits, SymbolFilter};
use mdrelay_harness::alloc::count_allocations;
use mdrelay_iex::capture::CaptureReader;
use mdrelay_iex::iextp::Segment;
use mdrelay_iex::message::{Message, kind};
use mdrelay_iex::synth::{SynthConfig, SyntheticDay};
use mdrelay_iex::{Aggregator, Books, Symbol, link};
use mdrelay_proto::relay::{Protector, WireKey};
use quanta::Clock;
use serde::Serialize;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// Default capture, relative to the project root (where `cargo run` starts).
const DEFAULT_CAPTURE: &str = "../shared/data/iex/DEEP10.pcap.gz";

/// Arguments of `codecs`.
#[derive(Debug, Args)]
pub struct CodecArgs {
    /// Capture to read (pcap / pcapng, gzipped or not). Default: ../shared/data/iex/DEEP10.pcap.gz
    /// if present, else a synthetic day of a million messages generated in memory.
    pub file: Option<PathBuf>,
    /// Keep only these message classes: trades (T), quotes (8, 5, Q), breaks (B), other. Batches
    /// left empty are dropped. `--only trades,quotes` is the subset the 2019 shootout measured.
    #[arg(long, value_delimiter = ',')]
    pub only: Vec<String>,
    /// Formats to run (default: all).
    #[arg(long, value_delimiter = ',')]
    pub formats: Vec<Format>,
    /// Symbols of the filtered decode (default: the symbol with the most messages).
    #[arg(long, value_delimiter = ',')]
    pub filter: Vec<String>,
    /// Repetitions of the whole-capture totals; the median is reported.
    #[arg(long, default_value_t = 7)]
    pub runs: usize,
    /// Also write the figures as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

/// Figures for one format.
#[derive(Debug, Serialize)]
pub struct FormatFigures {
    /// The format.
    pub format: Format,
    /// Per-batch serialize, ns: p50, p99, p99.9, max.
    pub serialize_ns: Percentiles,
    /// Per-batch frame + decode + aggregate, ns.
    pub deserialize_ns: Percentiles,
    /// Whole capture, serialize, median over runs, ms.
    pub serialize_total_ms: f64,
    /// Whole capture, deserialize + aggregate, median over runs, ms.
    pub deserialize_total_ms: f64,
    /// Per-batch frame + filtered decode + aggregate, ns.
    pub filtered_ns: Percentiles,
    /// Whole capture, filtered decode + aggregate, median over runs, ms.
    pub filtered_total_ms: f64,
    /// Per frame, CRC-32C seal + open, ns.
    pub crc_ns: Percentiles,
    /// Per frame, AES-256-GCM seal + open, ns.
    pub aead_ns: Percentiles,
    /// Whole capture, AES-256-GCM seal + open, median over runs, ms.
    pub aead_total_ms: f64,
    /// Steady-state heap allocations per 1,000 messages: encode, and frame + decode.
    pub allocations_per_1k: (f64, f64),
    /// Bytes of all frames.
    pub bytes: u64,
}

/// Percentiles of a histogram, ns.
#[derive(Debug, Serialize)]
pub struct Percentiles {
    /// Median.
    pub p50: u64,
    /// 99th percentile.
    pub p99: u64,
    /// 99.9th percentile.
    pub p999: u64,
    /// Largest.
    pub max: u64,
}

impl Percentiles {
    fn of(h: &Histogram<u64>) -> Percentiles {
        Percentiles {
            p50: h.value_at_quantile(0.5),
            p99: h.value_at_quantile(0.99),
            p999: h.value_at_quantile(0.999),
            max: h.max(),
        }
    }
}

/// The whole report.
#[derive(Debug, Serialize)]
pub struct Report {
    /// What was read.
    pub source: String,
    /// `--only` classes, empty for all.
    pub only: Vec<String>,
    /// Batches (IEX segments) per pass.
    pub batches: usize,
    /// Messages per pass.
    pub messages: usize,
    /// The CPU, from /proc/cpuinfo.
    pub cpu: String,
    /// Symbols of the filtered decode.
    pub filter: Vec<String>,
    /// Median cost of one clock read pair, ns.
    pub clock_overhead_ns: u64,
    /// Per format.
    pub formats: Vec<FormatFigures>,
    /// The client's `Books` kept over the capture's price level messages.
    pub books: BookFigures,
    /// A snapshot of the capture's state at its end, served and applied over loopback TCP.
    pub snapshot: SnapshotFigures,
}

/// What a late joiner's snapshot takes: the state at the end of the capture (every batch a
/// frame), copied, written as SBE `SNAPSHOT` records and sent over a loopback TCP connection by
/// one thread, as a publisher does for a joining subscriber; read and applied by another, as the
/// client does; timed from the connection to the last record applied.
#[derive(Debug, Serialize)]
pub struct SnapshotFigures {
    /// Symbols in the state.
    pub symbols: usize,
    /// Bytes of the snapshot's records.
    pub bytes: usize,
    /// Median of the runs, milliseconds.
    pub ms_median: f64,
    /// Slowest run, milliseconds.
    pub ms_max: f64,
}

/// What keeping books costs: the price level messages of the batches (the messages that change
/// a book), applied in order to `Books`, whole passes timed, the median pass reported per
/// message.
#[derive(Debug, Serialize)]
pub struct BookFigures {
    /// Price level messages per pass.
    pub level_messages: usize,
    /// Median pass, ns per message, books built from empty (their growth included).
    pub ns_per_level_message: f64,
    /// The same over books already as deep as the pass makes them (two passes applied first).
    pub ns_per_level_message_steady: f64,
}

fn class_of(k: u8) -> &'static str {
    match k {
        kind::TRADE_REPORT => "trades",
        kind::PRICE_LEVEL_BUY | kind::PRICE_LEVEL_SELL | kind::QUOTE_UPDATE => "quotes",
        kind::TRADE_BREAK => "breaks",
        _ => "other",
    }
}

/// UDP payloads of a capture's IEX segments, or of a synthetic day.
fn load(args: &CodecArgs) -> Result<(String, Vec<Vec<u8>>)> {
    let path = args.file.clone().or_else(|| {
        let default = PathBuf::from(DEFAULT_CAPTURE);
        default.is_file().then_some(default)
    });
    let mut payloads = Vec::new();
    match path {
        Some(path) => {
            let mut reader = CaptureReader::open(&path)?;
            while let Some(packet) = reader.next_packet()? {
                if let Ok(datagram) = link::udp_datagram(packet.link_type, packet.data)
                    && Segment::parse(datagram.payload).is_ok()
                {
                    payloads.push(datagram.payload.to_vec());
                }
            }
            Ok((path.display().to_string(), payloads))
        }
        None => {
            let mut day = SyntheticDay::new(SynthConfig::default())?;
            while let Some(segment) = day.next_segment() {
                payloads.push(segment.bytes.to_vec());
            }
            Ok(("synthetic day (1,000,000 messages, 50 symbols, seed 1)".into(), payloads))
        }
    }
}

struct Batch<'a> {
    header: BatchHeader,
    messages: Vec<Message<'a>>,
}

fn batches<'a>(payloads: &'a [Vec<u8>], only: &[String]) -> Vec<Batch<'a>> {
    let mut out = Vec::with_capacity(payloads.len());
    for payload in payloads {
        let segment = Segment::parse(payload).expect("checked at load");
        let messages: Vec<Message<'a>> = segment
            .blocks()
            .filter_map(|b| b.ok())
            .filter_map(|b| Message::parse(b).ok())
            .filter(|m| only.is_empty() || only.iter().any(|c| c == class_of(m.kind())))
            .collect();
        if !only.is_empty() && messages.is_empty() {
            continue;
        }
        let header = BatchHeader { publish_time: 1, ..BatchHeader::from_segment(&segment.header) };
        out.push(Batch { header, messages });
    }
    out
}

fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000_000, 3).expect("valid bounds")
}

/// Times `runs` passes of the batches' price level messages into `Books` (see [`BookFigures`]).
fn bench_books(batches: &[Batch<'_>], runs: usize) -> BookFigures {
    let levels: Vec<Message<'_>> = batches
        .iter()
        .flat_map(|b| b.messages.iter().copied())
        .filter(|m| matches!(m, Message::PriceLevelUpdate(_)))
        .collect();
    let pass = |books: &mut Books| {
        let started = Instant::now();
        books.extend(levels.iter().copied());
        started.elapsed()
    };
    let per_message = |d: Duration| d.as_nanos() as f64 / levels.len().max(1) as f64;
    let (mut fresh, mut steady) = (Vec::new(), Vec::new());
    for _ in 0..runs.max(1) {
        let mut books = Books::new();
        fresh.push(pass(&mut books));
        pass(&mut books);
        steady.push(pass(&mut books));
        std::hint::black_box(&books);
    }
    BookFigures {
        level_messages: levels.len(),
        ns_per_level_message: per_message(median(fresh)),
        ns_per_level_message_steady: per_message(median(steady)),
    }
}

/// Times `runs` snapshots of the state at the end of `batches`, served and applied over
/// loopback TCP (see [`SnapshotFigures`]).
fn bench_snapshot(batches: &[Batch<'_>], runs: usize) -> Result<SnapshotFigures> {
    use mdrelay_proto::relay::RecordHeader;
    use mdrelay_proto::relay::snapshot::{MarketState, SnapshotReader, write_snapshot};
    use std::io::{Read, Write};
    let mut state = MarketState::new();
    for (i, batch) in batches.iter().enumerate() {
        state.apply_frame(i as u64 + 1, &batch.messages);
    }
    let (mut times, mut bytes, mut symbols) = (Vec::new(), 0, 0);
    for _ in 0..runs.max(1) {
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        let addr = listener.local_addr()?;
        let served = std::thread::scope(|scope| -> Result<usize> {
            let server = scope.spawn(|| -> Result<usize> {
                let (mut stream, _) = listener.accept()?;
                let copy = state.clone();
                let mut records = Vec::new();
                let mut codec = Codec::new(Format::Sbe, Limits::default());
                let mut protector = Protector::new(false, None, Limits::default().max_frame);
                write_snapshot(&copy, &mut codec, &mut protector, 1, 0, &mut records)?;
                for record in &records {
                    stream.write_all(record)?;
                }
                Ok(records.iter().map(Vec::len).sum())
            });
            let started = Instant::now();
            let mut stream = std::net::TcpStream::connect(addr)?;
            let mut reader = SnapshotReader::new();
            let mut opener = Protector::new(false, None, Limits::default().max_frame);
            let (mut header, mut payload) = ([0u8; RecordHeader::LEN], Vec::new());
            let snapshot = loop {
                stream.read_exact(&mut header)?;
                let parsed = RecordHeader::parse(&header, 64 << 20)?;
                payload.resize(parsed.length as usize, 0);
                stream.read_exact(&mut payload)?;
                if let Some(snapshot) = reader.record(&parsed, &payload, &mut opener, 1, Limits::default())? {
                    break snapshot;
                }
            };
            times.push(started.elapsed());
            symbols = snapshot.state.books.len();
            server.join().map_err(|_| anyhow::anyhow!("the serving thread panicked"))?
        })?;
        bytes = served;
    }
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let max = times.iter().copied().max().unwrap_or_default();
    Ok(SnapshotFigures { symbols, bytes, ms_median: ms(median(times)), ms_max: ms(max) })
}

/// The median cost of reading the clock twice, which every per-batch figure includes.
fn clock_overhead(clock: &Clock) -> u64 {
    let mut h = histogram();
    for _ in 0..100_000 {
        let a = clock.raw();
        let b = clock.raw();
        h.saturating_record(clock.delta_as_nanos(a, b).max(1));
    }
    h.value_at_quantile(0.5)
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

/// The frames of every batch back to back, as a receiver's buffer would hold them.
fn encode_stream(codec: &mut Codec, batches: &[Batch<'_>]) -> Result<Vec<u8>> {
    let mut stream = Vec::new();
    for b in batches {
        codec.encode(&b.header, &b.messages, &mut stream)?;
    }
    Ok(stream)
}

fn decode_stream(codec: &mut Codec, stream: &[u8], aggregator: &mut Aggregator) -> Result<usize> {
    let mut at = 0;
    let mut frames = 0;
    while at < stream.len() {
        let len = codec.frame_len(&stream[at..])?.context("incomplete frame in a complete stream")?;
        codec.decode(&stream[at..at + len], |m| aggregator.apply(m))?;
        at += len;
        frames += 1;
    }
    Ok(frames)
}

fn bench_format(
    format: Format,
    batches: &[Batch<'_>],
    filter: &SymbolFilter,
    clock: &Clock,
    runs: usize,
) -> Result<(FormatFigures, Aggregator)> {
    let mut codec = Codec::new(format, Limits::default());
    let stream = encode_stream(&mut codec, batches)?;
    let bytes = stream.len() as u64;
    let largest = batches.len().max(1);

    // Per batch, serialize: one reused output buffer, its pages touched up front (a non-zero fill,
    // since a zeroed allocation may come from calloc with its pages still unmapped).
    let mut out = vec![0xa5u8; 1 << 20];
    let mut ser = histogram();
    for _ in 0..2 {
        ser.reset();
        for b in batches {
            out.clear();
            let t0 = clock.raw();
            codec.encode(&b.header, &b.messages, &mut out)?;
            let t1 = clock.raw();
            ser.saturating_record(clock.delta_as_nanos(t0, t1).max(1));
        }
    }

    // Per batch, deserialize + aggregate.
    let mut de = histogram();
    let mut aggregator = Aggregator::new();
    for pass in 0..2 {
        de.reset();
        aggregator = Aggregator::new();
        let mut at = 0;
        while at < stream.len() {
            let t0 = clock.raw();
            let len = codec.frame_len(&stream[at..])?.context("incomplete frame")?;
            codec.decode(&stream[at..at + len], |m| aggregator.apply(m))?;
            let t1 = clock.raw();
            if pass == 1 {
                de.saturating_record(clock.delta_as_nanos(t0, t1).max(1));
            }
            at += len;
        }
    }

    // Totals: one clock read around the whole capture.
    let mut ser_totals = Vec::with_capacity(runs);
    let mut de_totals = Vec::with_capacity(runs);
    let mut sink = Aggregator::new();
    for _ in 0..runs.max(1) {
        let started = Instant::now();
        for b in batches {
            out.clear();
            codec.encode(&b.header, &b.messages, &mut out)?;
        }
        ser_totals.push(started.elapsed());
        std::hint::black_box(&out);
        let started = Instant::now();
        let frames = decode_stream(&mut codec, &stream, &mut sink)?;
        de_totals.push(started.elapsed());
        if frames != largest && !batches.is_empty() {
            bail!("{format}: decoded {frames} frames of {}", batches.len());
        }
    }
    std::hint::black_box(&sink);

    let (filtered_ns, filtered_total_ms) = bench_filtered(&mut codec, &stream, filter, clock, runs)?;
    let frames = frames_of(&mut codec, &stream)?;
    let crc_ns =
        bench_protection(&mut Protector::new(true, None, Limits::default().max_frame), format, &frames, clock).0;
    let key = WireKey::new([0x5a; 32]);
    let (aead_ns, aead_total_ms) =
        bench_protection(&mut Protector::new(false, Some(&key), Limits::default().max_frame), format, &frames, clock);
    let messages = batches.iter().map(|b| b.messages.len()).sum::<usize>().max(1) as f64;
    let encode_allocations = count_allocations(|| {
        for b in batches {
            out.clear();
            let _ = codec.encode(&b.header, &b.messages, &mut out);
        }
    })
    .1
    .count;
    let (decoded, decode_allocations) = count_allocations(|| decode_stream(&mut codec, &stream, &mut sink));
    decoded?;
    let decode_allocations = decode_allocations.count;
    let figures = FormatFigures {
        format,
        serialize_ns: Percentiles::of(&ser),
        deserialize_ns: Percentiles::of(&de),
        serialize_total_ms: median(ser_totals).as_secs_f64() * 1e3,
        deserialize_total_ms: median(de_totals).as_secs_f64() * 1e3,
        filtered_ns,
        filtered_total_ms,
        crc_ns,
        aead_ns,
        aead_total_ms,
        allocations_per_1k: (encode_allocations as f64 * 1e3 / messages, decode_allocations as f64 * 1e3 / messages),
        bytes,
    };
    Ok((figures, aggregator))
}

/// Per batch and in total: frame + decode with `filter` + aggregate, as a filtering subscriber
/// does (skipped messages counted by type).
fn bench_filtered(
    codec: &mut Codec,
    stream: &[u8],
    filter: &SymbolFilter,
    clock: &Clock,
    runs: usize,
) -> Result<(Percentiles, f64)> {
    let mut h = histogram();
    let mut aggregator = Aggregator::new();
    let mut skipped = [0u64; 256];
    let mut pass = |h: &mut Histogram<u64>, timed: bool| -> Result<()> {
        let mut at = 0;
        while at < stream.len() {
            let t0 = clock.raw();
            let len = codec.frame_len(&stream[at..])?.context("incomplete frame")?;
            codec.decode_filtered(
                &stream[at..at + len],
                filter,
                |m| aggregator.apply(m),
                |k| skipped[usize::from(k)] += 1,
            )?;
            let t1 = clock.raw();
            if timed {
                h.saturating_record(clock.delta_as_nanos(t0, t1).max(1));
            }
            at += len;
        }
        Ok(())
    };
    pass(&mut h, false)?;
    pass(&mut h, true)?;
    let mut totals = Vec::with_capacity(runs);
    let mut untimed = histogram();
    for _ in 0..runs.max(1) {
        let started = Instant::now();
        pass(&mut untimed, false)?;
        totals.push(started.elapsed());
    }
    std::hint::black_box((&aggregator, &skipped));
    Ok((Percentiles::of(&h), median(totals).as_secs_f64() * 1e3))
}

/// The frames of a stream, each on its own.
fn frames_of(codec: &mut Codec, stream: &[u8]) -> Result<Vec<Vec<u8>>> {
    let mut frames = Vec::new();
    let mut at = 0;
    while at < stream.len() {
        let len = codec.frame_len(&stream[at..])?.context("incomplete frame")?;
        frames.push(stream[at..at + len].to_vec());
        at += len;
    }
    Ok(frames)
}

/// Per frame: seal then open under `protector` (both ends' cost); and the whole capture's, ms.
fn bench_protection(
    protector: &mut Protector,
    format: Format,
    frames: &[Vec<u8>],
    clock: &Clock,
) -> (Percentiles, f64) {
    let mut sealed = Vec::with_capacity(1 << 20);
    let mut scratch = Vec::with_capacity(1 << 20);
    let mut h = histogram();
    let mut total = Duration::ZERO;
    for pass in 0..2 {
        let started = Instant::now();
        for (i, frame) in frames.iter().enumerate() {
            let t0 = clock.raw();
            sealed.clear();
            protector.seal(7, i as u64 + 1, format, frame, &mut sealed);
            let opened = protector.open(7, i as u64 + 1, format, &sealed, &mut scratch).map(<[u8]>::len);
            let t1 = clock.raw();
            debug_assert_eq!(opened, Ok(frame.len()));
            std::hint::black_box(opened.ok());
            if pass == 1 {
                h.saturating_record(clock.delta_as_nanos(t0, t1).max(1));
            }
        }
        total = started.elapsed();
    }
    (Percentiles::of(&h), total.as_secs_f64() * 1e3)
}

/// The symbol with the most messages.
fn busiest_symbol(batches: &[Batch<'_>]) -> Option<Symbol> {
    let mut counts = std::collections::HashMap::<Symbol, u64>::new();
    for m in batches.iter().flat_map(|b| &b.messages) {
        if let Some(s) = m.symbol() {
            *counts.entry(s).or_default() += 1;
        }
    }
    counts.into_iter().max_by_key(|(s, n)| (*n, std::cmp::Reverse(*s))).map(|(s, _)| s)
}

fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_string())
        })
        .unwrap_or_else(|| "unknown".into())
}

/// Runs the benchmark and prints the table.
pub fn run(args: &CodecArgs) -> Result<()> {
    for class in &args.only {
        if !["trades", "quotes", "breaks", "other"].contains(&class.as_str()) {
            bail!("--only takes trades, quotes, breaks or other, not {class:?}");
        }
    }
    let (source, payloads) = load(args)?;
    let batches = batches(&payloads, &args.only);
    let messages = batches.iter().map(|b| b.messages.len()).sum();
    let clock = Clock::new();
    let formats = if args.formats.is_empty() { Format::ALL.to_vec() } else { args.formats.clone() };
    let filter_symbols: Vec<Symbol> = if args.filter.is_empty() {
        busiest_symbol(&batches).into_iter().collect()
    } else {
        args.filter
            .iter()
            .map(|s| Symbol::new(s).with_context(|| format!("--filter {s:?}: a symbol has 1 to 8 characters")))
            .collect::<Result<_>>()?
    };
    let filter = SymbolFilter::new(filter_symbols.iter().copied());
    let mut figures = Vec::new();
    let mut reference: Option<Aggregator> = None;
    for format in formats {
        let (f, aggregator) = bench_format(format, &batches, &filter, &clock, args.runs)?;
        // Every format must arrive at the same aggregates, or its figures mean nothing.
        match &reference {
            None => reference = Some(aggregator),
            Some(r) => {
                if r.active() != aggregator.active() {
                    bail!(
                        "{format} decoded to different aggregates than {}",
                        figures.first().map_or("the first format".into(), |f: &FormatFigures| f.format.to_string())
                    );
                }
            }
        }
        figures.push(f);
    }
    let report = Report {
        source,
        only: args.only.clone(),
        batches: batches.len(),
        messages,
        filter: filter_symbols.iter().map(Symbol::to_text).collect(),
        cpu: cpu_model(),
        clock_overhead_ns: clock_overhead(&clock),
        formats: figures,
        books: bench_books(&batches, args.runs),
        snapshot: bench_snapshot(&batches, args.runs)?,
    };
    print!("{}", markdown(&report));
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&report)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

/// A table cell of `p`'s median and 99th percentile, `p50 / p99`.
fn p50_p99(p: &Percentiles) -> String {
    format!("{} / {}", p.p50, p.p99)
}

/// A table cell of `p`'s median, 99th and 99.9th percentiles, `p50 / p99 / p99.9`.
fn p50_p99_p999(p: &Percentiles) -> String {
    format!("{} / {} / {}", p.p50, p.p99, p.p999)
}

fn markdown(r: &Report) -> String {
    let mut s = String::new();
    let only = if r.only.is_empty() { "all messages".to_string() } else { format!("only {}", r.only.join(",")) };
    s += &format!("{} — {only}: {} batches, {} messages; {}\n\n", r.source, r.batches, r.messages, r.cpu);
    s += "| format | serialize p50 / p99 / p99.9 ns | deserialize+aggregate p50 / p99 / p99.9 ns | serialize total | deserialize total | bytes | allocations per 1k messages (encode / decode) |\n";
    s += "|---|---|---|---|---|---|---|\n";
    for f in &r.formats {
        s += &format!(
            "| {} | {} | {} | {:.2} ms | {:.2} ms | {} | {:.1} / {:.1} |\n",
            f.format,
            p50_p99_p999(&f.serialize_ns),
            p50_p99_p999(&f.deserialize_ns),
            f.serialize_total_ms,
            f.deserialize_total_ms,
            thousands(f.bytes as f64),
            f.allocations_per_1k.0,
            f.allocations_per_1k.1,
        );
    }
    s += &format!(
        "\nFiltered to {} (decode skips other symbols' messages as early as the format allows), and the wire protection per frame (seal + open):\n\n",
        r.filter.join(",")
    );
    s += "| format | full decode p50 / p99 ns | filtered decode p50 / p99 ns | full total | filtered total | CRC-32C p50 / p99 ns | AES-256-GCM p50 / p99 ns | AEAD total |\n";
    s += "|---|---|---|---|---|---|---|---|\n";
    for f in &r.formats {
        s += &format!(
            "| {} | {} | {} | {:.2} ms | {:.2} ms | {} | {} | {:.2} ms |\n",
            f.format,
            p50_p99(&f.deserialize_ns),
            p50_p99(&f.filtered_ns),
            f.deserialize_total_ms,
            f.filtered_total_ms,
            p50_p99(&f.crc_ns),
            p50_p99(&f.aead_ns),
            f.aead_total_ms,
        );
    }
    s += &format!(
        "\nPer-batch figures include one clock read pair: {} ns at the median (TSC clock).\n",
        r.clock_overhead_ns
    );
    s += &format!(
        "\nBooks (`mdrelay_client::Books`) kept over the capture's {} price level messages: {:.1} ns a message from empty books, {:.1} ns over books already that deep (median pass).\n",
        thousands(r.books.level_messages as f64),
        r.books.ns_per_level_message,
        r.books.ns_per_level_message_steady
    );
    s += &format!(
        "\nA snapshot of the state at the capture's end ({} symbols, {} bytes of SBE records), served and applied over loopback TCP: {:.1} ms at the median, {:.1} ms at most.\n",
        thousands(r.snapshot.symbols as f64),
        thousands(r.snapshot.bytes as f64),
        r.snapshot.ms_median,
        r.snapshot.ms_max
    );
    s
}
