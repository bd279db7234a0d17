//! `mdrelay-bench recovery`: recovery latency across emulated hosts. The publisher multicasts
//! the synthetic day from host `pub` (of `deploy/netns-hosts.sh`) at a fixed rate; nftables
//! drops a given share of the data datagrams arriving on `sub1`; the subscriber asks the
//! retransmission service for what is missing. Reported per loss rate: frames dropped (the
//! kernel's count), recovered, unrecoverable, and recovery latency percentiles, from the gap
//! being seen to the frame arriving. Needs root.

use anyhow::{Context, Result, bail};
use clap::Args;
use mdrelay_harness::netns::{Host, Hosts, Line};
use mdrelay_harness::{Process, json_file};
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Arguments of `recovery`.
#[derive(Debug, Args)]
pub struct RecoveryArgs {
    /// Loss rates to measure, percent.
    #[arg(long, value_delimiter = ',', default_values_t = [1, 5])]
    pub loss: Vec<u32>,
    /// Messages per second.
    #[arg(long, default_value_t = 100_000.0)]
    pub rate: f64,
    /// Messages in the synthetic day.
    #[arg(long, default_value_t = 1_000_000)]
    pub messages: u64,
    /// Wait this long after a gap is seen before asking, ms (the subscriber's setting).
    #[arg(long, default_value_t = 5)]
    pub delay_ms: u64,
    /// Write the table as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

/// One loss rate's result.
#[derive(Debug, Serialize)]
pub struct Row {
    /// Loss injected, percent.
    pub loss_percent: u32,
    /// Frames the publisher sent.
    pub frames: u64,
    /// Datagrams nftables dropped (one frame each).
    pub dropped: u64,
    /// Frames the subscriber recovered.
    pub recovered: u64,
    /// Frames it could not.
    pub unrecoverable: u64,
    /// Recovery latency, ns.
    pub latency_ns: serde_json::Value,
}

const GROUP: &str = "239.255.0.1:9300";
const SERVICE: &str = "198.18.0.1:9101";

/// Runs every loss rate and prints the table.
pub fn run(args: &RecoveryArgs) -> Result<()> {
    if !nix_is_root() {
        bail!("recovery builds network namespaces and nftables rules: run it as root");
    }
    let (publisher, subscriber) = crate::loopback::relay_programs()?;
    let mut rows = Vec::new();
    for &loss in &args.loss {
        if loss > 100 {
            bail!("--loss {loss}: give a percentage from 0 to 100");
        }
        let hosts = Hosts::unique();
        let dir = tempfile::tempdir()?;
        hosts.loss(Host::Sub1, loss, Line::A);
        let sub_json = path(dir.path(), "sub.json");
        let pub_json = path(dir.path(), "pub.json");
        let interface = Host::Sub1.addr(Line::A).to_string();
        let delay = format!("{}ms", args.delay_ms);
        let mut sub = hosts.start(
            Host::Sub1,
            &subscriber,
            [
                "--group",
                GROUP,
                "--interface",
                &interface,
                "--recovery",
                SERVICE,
                "--recovery-delay",
                &delay,
                "--from-start",
                "--report-interval",
                "0",
                "--json",
                &sub_json,
            ],
        );
        sub.listening_on();
        let pub_interface = Host::Pub.addr(Line::A).to_string();
        let (messages, rate) = (args.messages.to_string(), args.rate.to_string());
        let publisher = hosts.start(
            Host::Pub,
            &publisher,
            [
                "run",
                "--synthetic",
                "--messages",
                &messages,
                "--pacing",
                "rate",
                "--rate",
                &rate,
                "--multicast",
                GROUP,
                "--interface",
                &pub_interface,
                "--retransmit-listen",
                SERVICE,
                "--json",
                &pub_json,
            ],
        );
        let limit = Duration::from_secs_f64(args.messages as f64 / args.rate * 3.0 + 60.0);
        finish(publisher, limit, "the publisher", &[0])?;
        // Frames given up end the subscriber with 5 (stream incomplete): a figure of the row.
        finish(sub, Duration::from_secs(60), "the subscriber", &[0, 5])?;
        let sub = json_file(Path::new(&sub_json));
        let publ = json_file(Path::new(&pub_json));
        let r = &sub["recovery"];
        let row = Row {
            loss_percent: loss,
            frames: publ["totals"]["frames"].as_u64().unwrap_or(0),
            dropped: hosts.counter(Host::Sub1).0,
            recovered: r["frames_recovered"].as_u64().unwrap_or(0),
            unrecoverable: r["frames_unrecoverable"].as_u64().unwrap_or(0),
            latency_ns: r["latency_ns"].clone(),
        };
        eprintln!("{loss} %: {row:?}");
        rows.push(row);
    }
    print_table(args, &rows);
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&rows)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

/// Waits for `process` to exit within `limit`; fails unless its status is one of `statuses`.
fn finish(process: Process, limit: Duration, what: &str, statuses: &[i32]) -> Result<()> {
    let done = process.try_finish(limit).map_err(|f| anyhow::anyhow!("{what}: {f}"))?;
    if !done.code().is_some_and(|code| statuses.contains(&code)) {
        bail!("{what} failed: {done:?}");
    }
    Ok(())
}

fn path(dir: &Path, name: &str) -> String {
    dir.join(name).display().to_string()
}

fn nix_is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find_map(|l| l.strip_prefix("Uid:").map(|v| v.split_whitespace().next() == Some("0"))))
        .unwrap_or(false)
}

fn print_table(args: &RecoveryArgs, rows: &[Row]) {
    println!("recovery across emulated hosts, multicast, {} msg/s, delay {} ms", args.rate, args.delay_ms);
    println!();
    println!("| loss | frames | dropped | recovered | unrecoverable | p50 µs | p90 µs | p99 µs | p99.9 µs | max µs |");
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for r in rows {
        let us = |key: &str| r.latency_ns[key].as_f64().map_or("-".to_string(), |ns| format!("{:.0}", ns / 1000.0));
        println!(
            "| {} % | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            r.loss_percent,
            r.frames,
            r.dropped,
            r.recovered,
            r.unrecoverable,
            us("p50"),
            us("p90"),
            us("p99"),
            us("p999"),
            us("max")
        );
    }
}
