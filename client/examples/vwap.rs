//! A running volume-weighted average price per symbol: every `--every` trades (default 10,000)
//! a line per symbol traded so far, and the final figures at the end of the stream:
//! `SYMBOL VOLUME VWAP` (VWAP in dollars, four decimals).
//!
//! ```text
//! cargo run --release -p mdrelay-client --example vwap -- 127.0.0.1:9100
//! ```

use mdrelay_client::{Builder, Event, Message, Symbol};
use std::collections::BTreeMap;
use std::io::Write;
use std::process::ExitCode;

/// One symbol's running sums.
#[derive(Default)]
struct Running {
    volume: u64,
    /// Sum of size times price, in ten-thousandths of a dollar.
    notional: i128,
}

impl Running {
    /// The VWAP in ten-thousandths of a dollar, rounded to the nearest.
    fn vwap(&self) -> i128 {
        let v = i128::from(self.volume.max(1));
        (2 * self.notional + v) / (2 * v)
    }
}

fn write_table(out: &mut impl Write, title: &str, symbols: &BTreeMap<Symbol, Running>) -> std::io::Result<()> {
    writeln!(out, "{title}")?;
    for (symbol, r) in symbols {
        let vwap = r.vwap();
        writeln!(out, "{symbol} {} {}.{:04}", r.volume, vwap / 10_000, vwap % 10_000)?;
    }
    Ok(())
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (publisher, every) = match args.as_slice() {
        [p] => (p.clone(), 10_000),
        [p, flag, n] if flag == "--every" && n.parse::<u64>().is_ok_and(|n| n > 0) => {
            (p.clone(), n.parse().unwrap_or(1))
        }
        _ => {
            eprintln!("usage: vwap HOST:PORT [--every N]");
            return ExitCode::from(2);
        }
    };
    let mut subscriber = match Builder::tcp(publisher).build() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("vwap: {e}");
            return ExitCode::from(2);
        }
    };
    let mut symbols: BTreeMap<Symbol, Running> = BTreeMap::new();
    let mut trades = 0u64;
    let mut out = std::io::stdout().lock();
    loop {
        match subscriber.next_event() {
            Ok(Some(Event::Frame(frame))) => {
                for message in frame.messages() {
                    if let Message::TradeReport(t) = message {
                        let r = symbols.entry(t.symbol).or_default();
                        r.volume += u64::from(t.size);
                        r.notional += i128::from(t.size) * i128::from(t.price.0);
                        trades += 1;
                        if trades.is_multiple_of(every)
                            && write_table(&mut out, &format!("after {trades} trades"), &symbols).is_err()
                        {
                            return ExitCode::SUCCESS;
                        }
                    }
                }
            }
            Ok(Some(Event::End(end))) => {
                let _ = write_table(&mut out, &format!("end: {trades} trades, complete {}", end.complete), &symbols);
            }
            Ok(Some(_)) => {}
            Ok(None) => return ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("vwap: {e}");
                return ExitCode::FAILURE;
            }
        }
    }
}
