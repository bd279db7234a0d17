//! `mdrelay-bench-client`: a program built on `mdrelay-client` doing what `mdrelay-sub` does per
//! frame and message (decode, count by type, aggregate volume, high and low per symbol, record
//! each frame's one-way latency in an HdrHistogram), so `mdrelay-bench client` can run it and
//! `mdrelay-sub` against the same publisher and compare the library with the binary.
//!
//! It takes the subset of `mdrelay-sub`'s flags the benchmark passes (`--connect`, `--listen`,
//! `--group`/`--interface`, `--json`, `--histogram-log`, `--report-interval 0`, `--profile`) and
//! writes the fields of `mdrelay-sub`'s JSON report the benchmark reads.

#![forbid(unsafe_code)]

use anyhow::{Context, Result, bail};
use clap::Parser;
use hdrhistogram::Histogram;
use hdrhistogram::serialization::V2DeflateSerializer;
use hdrhistogram::serialization::interval_log::IntervalLogWriterBuilder;
use mdrelay_client::{Builder, Event, Profile};
use mdrelay_iex::Aggregator;
use mdrelay_iex::counts::TypeCounts;
use mdrelay_proto::latency::{LatencySummary, latency_histogram};
use serde_json::json;
use std::io::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Instant, SystemTime};

/// A subscriber on mdrelay-client, for the benchmark's library-against-binary comparison.
#[derive(Debug, Parser)]
#[command(name = "mdrelay-bench-client", version = env!("MDRELAY_VERSION"))]
struct Args {
    /// TCP: the publisher's address.
    #[arg(long)]
    connect: Option<String>,
    /// UDP unicast: the address to receive on.
    #[arg(long)]
    listen: Option<String>,
    /// Multicast: the group to join (with --interface).
    #[arg(long)]
    group: Option<String>,
    /// Multicast: the interface's address.
    #[arg(long, default_value = "127.0.0.1")]
    interface: String,
    /// Write the report (the fields of `mdrelay-sub --json` the benchmark reads) here.
    #[arg(long)]
    json: PathBuf,
    /// Write the run's latency histogram as an HdrHistogram interval log (one interval).
    #[arg(long)]
    histogram_log: Option<PathBuf>,
    /// Accepted for `mdrelay-sub`'s command line; only 0 (no interval lines) is supported.
    #[arg(long, default_value_t = 0)]
    report_interval: u64,
    /// `low-latency` as `mdrelay-sub --profile` (busy polling, spinning).
    #[arg(long)]
    profile: Option<String>,
}

fn main() -> ExitCode {
    match run(&Args::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("mdrelay-bench-client: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: &Args) -> Result<()> {
    // As mdrelay-sub's `elapsed_seconds`: from the program's start, connection and drain included.
    let started = Instant::now();
    let start_time = SystemTime::now();
    if args.report_interval != 0 {
        bail!("--report-interval {}: only 0 is supported", args.report_interval);
    }
    let mut builder = match (&args.connect, &args.listen, &args.group) {
        (Some(a), None, None) => Builder::tcp(a.clone()),
        (None, Some(a), None) => Builder::udp(a.clone()),
        (None, None, Some(g)) => Builder::multicast(g.clone(), args.interface.clone()),
        _ => bail!("give one of --connect, --listen, --group"),
    };
    match args.profile.as_deref() {
        None | Some("default") => {}
        Some("low-latency") => builder = builder.profile(Profile::LowLatency),
        Some(other) => bail!("--profile {other}: default or low-latency"),
    }
    let mut subscriber = builder.build().context("subscribing")?;
    if args.connect.is_none() {
        // The benchmark starts the publisher once this line says where to send.
        let local = subscriber.local_addrs().first().copied().context("no local address")?;
        let shown = match &args.group {
            Some(group) => format!("{}:{}", group.rsplit_once(':').map_or(group.as_str(), |(h, _)| h), local.port()),
            None => local.to_string(),
        };
        println!("listening on {shown}");
        std::io::stdout().flush()?;
    }
    let mut aggregator = Aggregator::new();
    let mut types = TypeCounts::new();
    let mut messages = 0u64;
    let mut frames = 0u64;
    let mut negative_latencies = 0u64;
    let mut latency: Histogram<u64> = latency_histogram();
    let mut complete = None;
    while let Some(event) = subscriber.next_event()? {
        match event {
            Event::Frame(frame) => {
                for message in frame.messages() {
                    messages += 1;
                    types.add(message.kind());
                    aggregator.apply(&message);
                }
                if frame.decode_error().is_none() && !frame.recovered() {
                    frames += 1;
                    let ns = frame.receive_time().saturating_sub(frame.publish_time());
                    if ns < 0 {
                        negative_latencies += 1;
                    }
                    latency.saturating_record(ns.max(0) as u64);
                }
            }
            Event::End(end) => complete = Some(end.complete),
            _ => {}
        }
    }
    let elapsed = started.elapsed();
    let counters = subscriber.counters();
    if let Some(path) = &args.histogram_log {
        let mut out = std::io::BufWriter::new(
            std::fs::File::create(path).with_context(|| format!("--histogram-log {}", path.display()))?,
        );
        let mut serializer = V2DeflateSerializer::new();
        let mut writer = IntervalLogWriterBuilder::new()
            .with_start_time(start_time)
            .with_base_time(start_time)
            .begin_log_with(&mut out, &mut serializer)
            .with_context(|| format!("--histogram-log {}", path.display()))?;
        writer
            .write_histogram(&latency, std::time::Duration::ZERO, elapsed, None)
            .map_err(|e| anyhow::anyhow!("--histogram-log {}: {e}", path.display()))?;
        drop(writer);
        out.flush()?;
    }
    let report = json!({
        "messages": messages,
        "frames": frames,
        "gaps": counters.lost,
        "elapsed_seconds": elapsed.as_secs_f64(),
        "totals_match": complete,
        "negative_latencies": negative_latencies,
        "symbols": aggregator.active().len(),
        "messages_by_type": types.by_name(),
        "latency_ns": LatencySummary::of(&latency),
    });
    std::fs::write(&args.json, serde_json::to_vec_pretty(&report)?)
        .with_context(|| format!("writing {}", args.json.display()))?;
    Ok(())
}
