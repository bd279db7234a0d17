//! `mdrelay-pub`: the publisher's command line.
//!
//! - `run`: the relay (see `mdrelay_publisher::run`);
//! - `inspect`: counts and aggregates of a capture (the reference for everything else);
//! - `synth`: writes a synthetic IEX DEEP capture;
//! - `convert`: rewrites a capture in another container (pcap / pcapng, µs / ns, gzip).

#![forbid(unsafe_code)]

use mdrelay_publisher::{commands, run};

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use mdrelay_telemetry::exit::{self, ExitStatus};
use std::process::ExitCode;

/// mdrelay publisher: replays IEX market data, and the capture tools around it.
#[derive(Debug, Parser)]
// The version names the git commit built (build.rs), so a report can be traced to its code.
#[command(name = "mdrelay-pub", version = env!("MDRELAY_VERSION"), about, after_help = exit::help(ExitStatus::PUBLISHER))]
struct Cli {
    /// What to do; none only with --generate-completions or --generate-man.
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    log: mdrelay_telemetry::logs::LogArgs,
    #[command(flatten)]
    docs: mdrelay_telemetry::docs::DocArgs,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Relay market data to subscribers over TCP, UDP or multicast in the configured format.
    #[command(after_help = exit::help(ExitStatus::PUBLISHER))]
    Run(Box<run::RunArgs>),
    /// Count a capture's packets and messages and aggregate volume and high/low prices per symbol.
    Inspect(commands::InspectArgs),
    /// Write a synthetic IEX DEEP 1.0 capture of a realistic trading day.
    Synth(commands::SynthArgs),
    /// Rewrite a capture as pcap or pcapng, with µs or ns stamps, gzipped or not.
    Convert(commands::ConvertArgs),
    /// Generate the default synthetic day in memory and report on it: the built-in demo.
    Demo,
}

fn main() -> ExitCode {
    let matches = Cli::command().get_matches();
    let mut cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    // Where each setting came from is worked out from the flags as given.
    if let (Some(Command::Run(args)), Some(run)) = (&mut cli.command, matches.subcommand_matches("run"))
        && let Some(command) = Cli::command().find_subcommand("run")
    {
        args.given = mdrelay_telemetry::settings::GivenFlag::all(command, run);
    }
    let command = match cli.command {
        Some(command) => command,
        None if cli.docs.requested() => return generate_docs(&cli.docs),
        None => Cli::command()
            .error(clap::error::ErrorKind::MissingSubcommand, "give a subcommand: run, inspect, synth, convert or demo")
            .exit(),
    };
    // The relay reports its progress; the tools speak only when something is wrong.
    let default_log = if matches!(command, Command::Run(_)) { "info" } else { "warn" };
    if let Err(error) = mdrelay_telemetry::logs::init(&cli.log, default_log, true) {
        eprintln!("mdrelay-pub: error: {error:#}");
        return ExitStatus::Config.into();
    }
    let result = match command {
        Command::Run(args) => run::run(&args),
        Command::Inspect(args) => commands::inspect(&args),
        Command::Synth(args) => commands::synth(&args),
        Command::Convert(args) => commands::convert(&args),
        Command::Demo => commands::demo(),
    };
    match result {
        Ok(()) => ExitStatus::Success.into(),
        // `mdrelay-pub inspect big.pcap | head`: the reader left; that is not a failure.
        Err(error)
            if error.chain().any(|e| {
                e.downcast_ref::<std::io::Error>().is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe)
            }) =>
        {
            ExitStatus::Success.into()
        }
        // The status the error carries: configuration 2, a refusing upstream 3, an upstream lost
        // for good 4, anything else 1 (the table in docs/operations.md).
        Err(error) => {
            eprintln!("mdrelay-pub: error: {error:#}");
            ExitStatus::of(&error).into()
        }
    }
}

/// `--generate-completions` and `--generate-man`: documentation from the clap definitions.
fn generate_docs(docs: &mdrelay_telemetry::docs::DocArgs) -> ExitCode {
    let command = Cli::command().version(env!("MDRELAY_VERSION"));
    let [log, rust_log] = mdrelay_telemetry::docs::LOG_ENVIRONMENT;
    let environment = [
        log,
        rust_log,
        ("NATS_URL", "natscli's: the [nats] output's servers, when neither the file nor a flag gives them."),
        (
            "NATS_CREDS",
            "natscli's: the .creds file of the [nats] output and of a NATS upstream, when no credentials are given for it.",
        ),
    ];
    match docs.generate(command, ExitStatus::PUBLISHER, &environment, &mut std::io::stdout().lock()) {
        Ok(()) => ExitStatus::Success.into(),
        Err(error) => {
            eprintln!("mdrelay-pub: error: {error:#}");
            ExitStatus::Failure.into()
        }
    }
}
