//! `mdrelay-bench`: benchmarks of mdrelay's wire formats.
//!
//! `mdrelay-bench codecs [FILE]` encodes every IEX segment of a capture in every format, then
//! decodes and aggregates it, and prints per-batch latency percentiles, whole-capture totals and
//! bytes as a markdown table (and JSON on request).
//!
//! `mdrelay-bench loopback` measures a plain socket ping-pong (the latency floor), then runs the
//! real publisher and subscriber over loopback once per format at the same fixed rate, and
//! tabulates end-to-end latency percentiles against the floor, CPU time and peak memory, to
//! choose a format; `--top-speed` measures throughput instead. Plots are written as SVG.
//!
//! `mdrelay-bench client` runs a program built on `mdrelay-client` (`mdrelay-bench-client`)
//! and `mdrelay-sub` against the same publisher, alternating, and compares their throughput and
//! latency.
//!
//! `mdrelay-bench recovery` multicasts across emulated hosts with loss injected by nftables and
//! tabulates recovery latency percentiles per loss rate (root); `mdrelay-bench arbitration`
//! measures what A/B line arbitration costs the receive path per datagram.
//!
//! `mdrelay-bench scale` replays a 50-million-message synthetic capture at top speed to two
//! subscribers and samples every process's resident memory and the throughput over the run, to
//! show that neither drifts with the stream's length.

#![forbid(unsafe_code)]

// `codecs` counts each format's steady-state allocations; only the thread measuring pays for the
// count (a thread-local flag check per allocation elsewhere).
#[global_allocator]
static GLOBAL: mdrelay_harness::alloc::CountingAllocator = mdrelay_harness::alloc::CountingAllocator;

mod arbitration;
mod client;
mod codecs;
mod floor;
mod latency;
mod loopback;
mod nats;
mod plots;
mod procstat;
mod recovery;
mod scale;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

/// mdrelay benchmarks.
#[derive(Debug, Parser)]
// The version names the git commit built (build.rs), so a result can be traced to its code.
#[command(name = "mdrelay-bench", version = env!("MDRELAY_VERSION"), about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Serialize and deserialize+aggregate every batch of a capture in every format.
    Codecs(codecs::CodecArgs),
    /// Run publisher and subscriber over loopback once per format: latency against a socket floor, or top speed.
    Loopback(loopback::LoopbackArgs),
    /// A program on mdrelay-client against mdrelay-sub, alternating: throughput and latency, and their ratio.
    Client(client::ClientArgs),
    /// Recovery latency under injected loss, across emulated hosts (root).
    Recovery(recovery::RecoveryArgs),
    /// What A/B line arbitration costs the receive path, per datagram.
    Arbitration(arbitration::ArbitrationArgs),
    /// A long top-speed run to two subscribers: memory and throughput sampled over time, to show they stay flat.
    Scale(scale::ScaleArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Codecs(args) => codecs::run(&args),
        Command::Loopback(args) => loopback::run(&args),
        Command::Client(args) => client::run(&args),
        Command::Recovery(args) => recovery::run(&args),
        Command::Arbitration(args) => arbitration::run(&args),
        Command::Scale(args) => scale::run(&args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("mdrelay-bench: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
