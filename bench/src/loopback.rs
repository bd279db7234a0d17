//! `mdrelay-bench loopback`: the relay end to end on this host, once per format, to choose one.
//!
//! For each format it starts a real `mdrelay-pub` and a real `mdrelay-sub` (the binaries beside
//! this one), streams the same data at the same fixed rate over loopback TCP, UDP or multicast,
//! and tabulates the subscriber's one-way latency percentiles, its totals check and the bytes
//! per message. At a fixed rate every format carries the same load, so the percentiles compare.

use anyhow::{Context, Result, bail};
use clap::{Args, ValueEnum};
use mdrelay_harness::process::{Finished, Process};
use mdrelay_proto::codec::Format;
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Transports the comparison can run over.
#[derive(Debug, Clone, Copy, ValueEnum, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Transport {
    /// TCP to 127.0.0.1.
    Tcp,
    /// UDP unicast to 127.0.0.1.
    Udp,
    /// UDP multicast to 239.255.0.1 on interface 127.0.0.1.
    Multicast,
}

/// Arguments of `loopback`.
#[derive(Debug, Args)]
pub struct LoopbackArgs {
    /// Formats to compare (default: all).
    #[arg(long, value_delimiter = ',')]
    pub formats: Vec<Format>,
    /// Transport.
    #[arg(long, value_enum, default_value_t = Transport::Tcp)]
    pub transport: Transport,
    /// Replay this capture instead of the built-in synthetic day.
    #[arg(long)]
    pub capture: Option<PathBuf>,
    /// Synthetic day: messages.
    #[arg(long, default_value_t = 300_000)]
    pub messages: u64,
    /// Messages per second.
    #[arg(long, default_value_t = 100_000.0)]
    pub rate: f64,
    /// Write the table as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

/// One format's result.
#[derive(Debug, Serialize)]
pub struct Row {
    /// The format.
    pub format: Format,
    /// Messages the subscriber decoded.
    pub messages: u64,
    /// Whether the subscriber's counts equal the publisher's totals.
    pub totals_match: Option<bool>,
    /// Frames lost.
    pub gaps: u64,
    /// Frame bytes per message (publisher side).
    pub bytes_per_message: f64,
    /// One-way latency, ns.
    pub latency_ns: serde_json::Value,
}

/// `name` of `package` beside this binary, built in the same profile when missing.
fn sibling(package: &str, name: &str) -> Result<PathBuf> {
    mdrelay_harness::bins::binary(package, name)
        .with_context(|| format!("{name}: build the workspace first (cargo build --release)"))
}

/// How long a process may take to print a readiness line.
const READY: Duration = Duration::from_secs(30);

/// Waits for `process` to exit within `limit`; fails with its output unless it succeeded.
fn finish(process: Process, limit: Duration) -> Result<Finished> {
    let finished = process.try_finish(limit)?;
    if !finished.status.success() {
        bail!("{finished:?}");
    }
    Ok(finished)
}

fn run_one(args: &LoopbackArgs, format: Format, publisher: &Path, subscriber: &Path, dir: &Path) -> Result<Row> {
    let sub_json = dir.join(format!("sub-{format}.json"));
    let pub_json = dir.join(format!("pub-{format}.json"));
    let mut pub_args: Vec<String> =
        vec!["run".into(), "--format".into(), format.name().into(), "--pacing".into(), "rate".into()];
    pub_args.extend(["--rate".into(), args.rate.to_string(), "--json".into(), pub_json.display().to_string()]);
    match &args.capture {
        Some(path) => pub_args.extend(["--capture".into(), path.display().to_string()]),
        None => pub_args.extend(["--messages".into(), args.messages.to_string()]),
    }
    let mut sub_args: Vec<String> =
        vec!["--json".into(), sub_json.display().to_string(), "--report-interval".into(), "0".into()];
    let spawn = |bin: &Path, args: &[String]| {
        Process::spawn(bin, args, &[]).with_context(|| format!("starting {}", bin.display()))
    };
    // Each side starts once the other is ready (the lines both print), never after a guess.
    let (publisher_process, subscriber_process) = match args.transport {
        Transport::Tcp => {
            pub_args.extend(["--tcp".into(), "127.0.0.1:0".into(), "--wait-subscribers".into(), "1".into()]);
            pub_args.extend(["--slow-subscriber".into(), "block".into()]);
            let mut publisher_process = spawn(publisher, &pub_args)?;
            let addr = publisher_process.try_serving_on(READY)?;
            sub_args.extend(["--connect".into(), addr.to_string()]);
            (publisher_process, spawn(subscriber, &sub_args)?)
        }
        Transport::Udp | Transport::Multicast => {
            if args.transport == Transport::Udp {
                sub_args.extend(["--listen".into(), "127.0.0.1:0".into()]);
            } else {
                sub_args.extend(["--group".into(), "239.255.0.1:0".into(), "--interface".into(), "127.0.0.1".into()]);
            }
            let mut subscriber_process = spawn(subscriber, &sub_args)?;
            // UDP has no handshake: nothing is sent before the subscriber has bound (and joined).
            let addr = subscriber_process.try_listening_on(READY)?.to_string();
            if args.transport == Transport::Udp {
                pub_args.extend(["--udp".into(), addr]);
            } else {
                pub_args.extend(["--multicast".into(), addr, "--interface".into(), "127.0.0.1".into()]);
                pub_args.extend(["--ttl".into(), "0".into()]);
            }
            (spawn(publisher, &pub_args)?, subscriber_process)
        }
    };
    let limit = Duration::from_secs_f64(60.0 + args.messages as f64 / args.rate * 3.0);
    finish(publisher_process, limit).context("mdrelay-pub")?;
    finish(subscriber_process, limit).context("mdrelay-sub")?;
    let sub: serde_json::Value = serde_json::from_slice(&std::fs::read(&sub_json)?)?;
    let publ: serde_json::Value = serde_json::from_slice(&std::fs::read(&pub_json)?)?;
    let messages = sub["messages"].as_u64().unwrap_or(0);
    let frame_bytes = publ["frame_bytes"].as_f64().unwrap_or(0.0);
    let sent = publ["totals"]["messages"].as_f64().unwrap_or(1.0).max(1.0);
    Ok(Row {
        format,
        messages,
        totals_match: sub["totals_match"].as_bool(),
        gaps: sub["gaps"].as_u64().unwrap_or(0),
        bytes_per_message: frame_bytes / sent,
        latency_ns: sub["latency_ns"].clone(),
    })
}

fn us(v: &serde_json::Value, key: &str) -> String {
    v[key].as_f64().map_or_else(|| "-".into(), |ns| format!("{:.1}", ns / 1000.0))
}

/// Runs the comparison and prints the table.
pub fn run(args: &LoopbackArgs) -> Result<()> {
    let publisher = sibling("mdrelay-publisher", "mdrelay-pub")?;
    let subscriber = sibling("mdrelay-subscriber", "mdrelay-sub")?;
    let dir = std::env::temp_dir().join(format!("mdrelay-loopback-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let formats = if args.formats.is_empty() { Format::ALL.to_vec() } else { args.formats.clone() };
    let source = match &args.capture {
        Some(p) => p.display().to_string(),
        None => format!("synthetic day of {} messages", args.messages),
    };
    eprintln!("loopback {:?}: {source} at {} messages/s, one format at a time", args.transport, args.rate);
    let mut rows = Vec::new();
    for format in formats {
        let row = run_one(args, format, &publisher, &subscriber, &dir).with_context(|| format!("format {format}"))?;
        eprintln!("  {format}: done");
        rows.push(row);
    }
    let _ = std::fs::remove_dir_all(&dir);
    println!(
        "| format | messages | totals match | frames lost | bytes/message | p50 µs | p90 µs | p99 µs | p99.9 µs | p99.99 µs | max µs |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    for r in &rows {
        let l = &r.latency_ns;
        println!(
            "| {} | {} | {} | {} | {:.1} | {} | {} | {} | {} | {} | {} |",
            r.format,
            r.messages,
            r.totals_match.map_or("-".into(), |b| if b { "yes".to_string() } else { "NO".to_string() }),
            r.gaps,
            r.bytes_per_message,
            us(l, "p50"),
            us(l, "p90"),
            us(l, "p99"),
            us(l, "p999"),
            us(l, "p9999"),
            us(l, "max")
        );
    }
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&rows)?)?;
    }
    Ok(())
}
