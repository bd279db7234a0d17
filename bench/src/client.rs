//! `mdrelay-bench client`: a program built on `mdrelay-client` (`mdrelay-bench-client`: decode,
//! count by type, aggregate per symbol, a latency histogram per frame, as `mdrelay-sub` does)
//! against `mdrelay-sub` itself, in one run: the same publisher settings and source, the two
//! programs alternating (the first to go swaps at every repetition), several repetitions of a
//! fixed-rate latency run and of a top-speed run each. The table gives each program's median
//! over the repetitions (throughput, p50, p99) and the library's figures over the binary's.

use crate::latency::Transport;
use crate::loopback::{self, LoopbackArgs, Plan, Profile, ProfileUse, ProtectionChoice, Row, thousands, us};
use crate::nats::NatsStorage;
use anyhow::{Context, Result, bail};
use clap::Args;
use mdrelay_codec::Format;
use serde::Serialize;
use std::fmt::Write as _;
use std::path::PathBuf;

/// Arguments of `client`.
#[derive(Debug, Args)]
pub struct ClientArgs {
    /// The publisher's format.
    #[arg(long, default_value = "sbe")]
    pub format: Format,
    /// Transport: tcp, udp or multicast.
    #[arg(long, value_enum, default_value_t = Transport::Tcp)]
    pub transport: Transport,
    /// Repetitions of each program in each mode.
    #[arg(long, default_value_t = 5)]
    pub repetitions: usize,
    /// Replay this capture instead of the built-in synthetic day.
    #[arg(long)]
    pub capture: Option<PathBuf>,
    /// Latency runs: messages of the synthetic day.
    #[arg(long, default_value_t = 300_000)]
    pub messages: u64,
    /// Latency runs: messages per second.
    #[arg(long, default_value_t = 100_000.0)]
    pub rate: f64,
    /// Top-speed runs: messages of the synthetic day (0: no top-speed runs).
    #[arg(long, default_value_t = 5_000_000)]
    pub top_speed_messages: u64,
    /// Settings profile passed to the publisher and both receiving programs as `--profile`.
    #[arg(long, value_enum, default_value_t = Profile::Default)]
    pub profile: Profile,
    /// Write everything measured as JSON to this file [default: client.json in --plots].
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Directory for the table (client.md) and the JSON.
    #[arg(long, default_value = "target/mdrelay-bench")]
    pub plots: PathBuf,
}

/// Which receiving program a run used.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Program {
    /// `mdrelay-sub`.
    Binary,
    /// `mdrelay-bench-client`, on mdrelay-client.
    Library,
}

impl Program {
    fn name(self) -> &'static str {
        match self {
            Program::Binary => "mdrelay-sub",
            Program::Library => "mdrelay-client program",
        }
    }
}

/// One run of one program.
#[derive(Debug, Serialize)]
pub struct Run {
    /// `latency` or `top-speed`.
    pub mode: &'static str,
    /// The repetition, from 0.
    pub repetition: usize,
    /// The program.
    pub program: Program,
    /// What was measured, as `loopback` measures it.
    pub row: Row,
}

/// One program's medians over the repetitions of one mode.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Medians {
    /// Messages per second delivered.
    pub delivered_rate: f64,
    /// p50 one-way latency, ns.
    pub p50_ns: f64,
    /// p99 one-way latency, ns.
    pub p99_ns: f64,
    /// The receiving program's CPU seconds.
    pub cpu_seconds: f64,
    /// The receiving program's peak RSS, KiB.
    pub peak_rss_kib: f64,
    /// Runs whose counts equalled the publisher's totals, of all runs.
    pub totals_matched: usize,
    /// Runs.
    pub runs: usize,
}

/// The library's medians over the binary's, one mode.
#[derive(Debug, Serialize)]
pub struct Comparison {
    /// `latency` or `top-speed`.
    pub mode: &'static str,
    /// `mdrelay-sub`.
    pub binary: Medians,
    /// The program on mdrelay-client.
    pub library: Medians,
    /// Library throughput over binary throughput.
    pub throughput_ratio: f64,
    /// Library p50 over binary p50.
    pub p50_ratio: f64,
    /// Library p99 over binary p99.
    pub p99_ratio: f64,
}

/// Everything a run of `client` measured.
#[derive(Debug, Serialize)]
pub struct Report {
    /// The host.
    pub machine: loopback::Machine,
    /// What was replayed.
    pub source: String,
    /// The format.
    pub format: Format,
    /// The transport.
    pub transport: Transport,
    /// Every run, in the order run.
    pub runs: Vec<Run>,
    /// Medians and ratios per mode.
    pub comparisons: Vec<Comparison>,
}

fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 { v[n / 2] } else { (v[n / 2 - 1] + v[n / 2]) / 2.0 }
}

fn medians(runs: &[&Run]) -> Medians {
    let of = |f: &dyn Fn(&Row) -> f64| median(runs.iter().map(|r| f(&r.row)).collect());
    Medians {
        delivered_rate: of(&|r| r.delivered_rate),
        p50_ns: of(&|r| r.latency_ns.p50 as f64),
        p99_ns: of(&|r| r.latency_ns.p99 as f64),
        cpu_seconds: of(&|r| r.subscriber.cpu_seconds),
        peak_rss_kib: of(&|r| r.subscriber.peak_rss_kib as f64),
        totals_matched: runs.iter().filter(|r| r.row.totals_match == Some(true)).count(),
        runs: runs.len(),
    }
}

fn over(a: f64, b: f64) -> f64 {
    if b > 0.0 { a / b } else { 0.0 }
}

/// Runs the comparison, prints the table, writes it and the JSON.
pub fn run(args: &ClientArgs) -> Result<()> {
    if args.repetitions == 0 {
        bail!("--repetitions 0: give at least one");
    }
    if args.transport == Transport::All {
        bail!("--transport all: give one transport");
    }
    if args.transport.is_nats() {
        bail!("--transport nats: the client comparison runs over tcp, udp or multicast");
    }
    let programs =
        loopback::siblings(&[loopback::RELAY[0], loopback::RELAY[1], ("mdrelay-bench", "mdrelay-bench-client")])?;
    let [publisher, binary, library] = <[PathBuf; 3]>::try_from(programs)
        .map_err(|paths| anyhow::anyhow!("the programs compared: three paths expected, got {}", paths.len()))?;
    let profile = ProfileUse {
        requested: args.profile,
        publisher: loopback::has_profile_flag(&publisher, &["run"]),
        subscriber: loopback::has_profile_flag(&binary, &[]),
    };
    let dir = tempfile::tempdir().context("a directory for the runs' reports")?;
    std::fs::create_dir_all(&args.plots).with_context(|| format!("creating {}", args.plots.display()))?;
    let loopback_args = |top_speed: bool, messages: u64| LoopbackArgs {
        formats: vec![args.format],
        transport: args.transport,
        capture: args.capture.clone(),
        messages: Some(messages),
        rate: args.rate,
        top_speed,
        coalesce_bytes: vec![0],
        protection: vec![ProtectionChoice::None],
        profile: args.profile,
        hot_core: None,
        duty_cycle: None,
        sub_core: None,
        floor_bytes: 128,
        nats_cluster: false,
        nats_storage: NatsStorage::File,
        nats_bench_messages: None,
        json: None,
        plots: args.plots.clone(),
    };
    let mut modes = vec![("latency", loopback_args(false, args.messages))];
    if args.top_speed_messages > 0 {
        modes.push(("top-speed", loopback_args(true, args.top_speed_messages)));
    }
    let source = match &args.capture {
        Some(p) => p.display().to_string(),
        None => "synthetic day".to_string(),
    };
    eprintln!(
        "client: {source}, {} over {}, {} repetitions, mdrelay-sub and the mdrelay-client program alternating",
        args.format,
        args.transport.name(),
        args.repetitions
    );
    let mut runs = Vec::new();
    for (mode, mode_args) in &modes {
        let units = if mode_args.top_speed { 1 } else { loopback::frame_schedule(mode_args)?.1 };
        for repetition in 0..args.repetitions {
            let order = if repetition % 2 == 0 {
                [Program::Binary, Program::Library]
            } else {
                [Program::Library, Program::Binary]
            };
            for program in order {
                let plan = Plan {
                    args: mode_args,
                    transport: args.transport,
                    format: args.format,
                    coalesce: 0,
                    protection: ProtectionChoice::None,
                    publisher: &publisher,
                    subscriber: if program == Program::Binary { &binary } else { &library },
                    dir: dir.path(),
                    profile: &profile,
                    units,
                };
                let row = loopback::run_one(&plan)
                    .with_context(|| format!("{mode} run {repetition} of {}", program.name()))?;
                eprintln!(
                    "  {mode} {repetition} {}: {} msg/s, p50 {} µs, p99 {} µs, totals {}",
                    program.name(),
                    thousands(row.delivered_rate),
                    us(row.latency_ns.p50),
                    us(row.latency_ns.p99),
                    row.totals_match.map_or("-", |m| if m { "match" } else { "DIFFER" })
                );
                runs.push(Run { mode, repetition, program, row });
            }
        }
    }
    let comparisons: Vec<Comparison> = modes
        .iter()
        .map(|(mode, _)| {
            let of =
                |p: Program| medians(&runs.iter().filter(|r| r.mode == *mode && r.program == p).collect::<Vec<_>>());
            let (binary, library) = (of(Program::Binary), of(Program::Library));
            Comparison {
                mode,
                binary,
                library,
                throughput_ratio: over(library.delivered_rate, binary.delivered_rate),
                p50_ratio: over(library.p50_ns, binary.p50_ns),
                p99_ratio: over(library.p99_ns, binary.p99_ns),
            }
        })
        .collect();
    let report = Report {
        machine: loopback::machine(),
        source,
        format: args.format,
        transport: args.transport,
        runs,
        comparisons,
    };
    let table = table(&report, args);
    loopback::write_table_and_json(&table, &report, &args.plots, args.json.as_deref(), "client")
}

fn table(report: &Report, args: &ClientArgs) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "mdrelay-bench client: {}, {} over {}, {} repetitions per program and mode; {} ({} CPUs), Linux {}\n",
        report.source,
        report.format,
        report.transport.name(),
        args.repetitions,
        report.machine.cpu,
        report.machine.cpus,
        report.machine.kernel
    );
    let _ = writeln!(
        out,
        "| mode | program | msg/s delivered (median) | p50 µs (median) | p99 µs (median) | CPU s (median) | RSS MiB (median) | totals match |"
    );
    let _ = writeln!(out, "|---|---|---|---|---|---|---|---|");
    for c in &report.comparisons {
        let mode = match c.mode {
            "latency" => format!("{} msg/s, {} messages", thousands(args.rate), thousands(args.messages as f64)),
            _ => format!("top speed, {} messages", thousands(args.top_speed_messages as f64)),
        };
        for (program, m) in [(Program::Binary, &c.binary), (Program::Library, &c.library)] {
            let _ = writeln!(
                out,
                "| {mode} | {} | {} | {} | {} | {:.2} | {:.1} | {} of {} |",
                program.name(),
                thousands(m.delivered_rate),
                us(m.p50_ns as u64),
                us(m.p99_ns as u64),
                m.cpu_seconds,
                m.peak_rss_kib / 1024.0,
                m.totals_matched,
                m.runs
            );
        }
        let _ = writeln!(
            out,
            "| {mode} | **library / binary** | **{:.3}** | **{:.3}** | {:.3} | {:.3} | | |",
            c.throughput_ratio,
            c.p50_ratio,
            c.p99_ratio,
            over(c.library.cpu_seconds, c.binary.cpu_seconds)
        );
    }
    let _ = writeln!(out, "\nEvery run, in order:\n");
    let _ =
        writeln!(out, "| mode | repetition | program | msg/s delivered | p50 µs | p99 µs | max µs | CPU s | totals |");
    let _ = writeln!(out, "|---|---|---|---|---|---|---|---|---|");
    for r in &report.runs {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} | {:.2} | {} |",
            r.mode,
            r.repetition,
            r.program.name(),
            thousands(r.row.delivered_rate),
            us(r.row.latency_ns.p50),
            us(r.row.latency_ns.p99),
            us(r.row.latency_ns.max),
            r.row.subscriber.cpu_seconds,
            r.row.totals_match.map_or("-", |m| if m { "match" } else { "DIFFER" })
        );
    }
    out
}
