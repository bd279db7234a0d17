//! Prints the trades of some symbols as they arrive, one line each:
//! `SYMBOL SIZE PRICE SEQUENCE`, then a line with the totals at the end of the stream.
//!
//! ```text
//! cargo run --release -p mdrelay-client --example trades -- 127.0.0.1:9100 AAPL IBM
//! ```
//!
//! Only the symbols given are decoded: the others' messages are skipped while decoding.

use mdrelay_client::{Builder, Event, Message};
use std::io::Write;
use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some((publisher, symbols)) = args.split_first().filter(|(_, s)| !s.is_empty()) else {
        eprintln!("usage: trades HOST:PORT SYMBOL [SYMBOL...]");
        return ExitCode::from(2);
    };
    let mut subscriber = match Builder::tcp(publisher.as_str()).symbols(symbols).build() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("trades: {e}");
            return ExitCode::from(2);
        }
    };
    let mut out = std::io::stdout().lock();
    loop {
        match subscriber.next_event() {
            Ok(Some(Event::Frame(frame))) => {
                for message in frame.messages() {
                    if let Message::TradeReport(t) = message {
                        // A closed pipe (`| head`) ends the program quietly.
                        if writeln!(out, "{} {} {} {}", t.symbol, t.size, t.price, frame.sequence()).is_err() {
                            return ExitCode::SUCCESS;
                        }
                    }
                }
            }
            Ok(Some(Event::Gap { first, count })) => eprintln!("trades: {count} frames missing from {first}"),
            Ok(Some(Event::End(end))) => {
                let c = subscriber.counters();
                let _ = writeln!(out, "end: frames {} messages {} complete {}", c.frames, c.messages, end.complete);
            }
            Ok(Some(_)) => {}
            Ok(None) => return ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("trades: {e}");
                return ExitCode::FAILURE;
            }
        }
    }
}
