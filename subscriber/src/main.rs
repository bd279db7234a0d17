//! `mdrelay-sub`: the subscriber. It will connect to or join a publisher's stream; today it has
//! nothing to connect to, so it only describes itself.

use clap::Parser;

/// mdrelay subscriber: decodes a relayed stream, aggregates per symbol, reports latency.
#[derive(Debug, Parser)]
#[command(name = "mdrelay-sub", version, about)]
struct Cli {}

fn main() {
    let _ = Cli::parse();
    eprintln!("mdrelay-sub: no transport is configured in this build; see README.md");
    std::process::exit(2);
}
