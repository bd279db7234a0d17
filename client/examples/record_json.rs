//! Records the received messages as JSON lines, one object per message with its frame's
//! sequence number, publish time and receive time:
//!
//! ```text
//! cargo run --release -p mdrelay-client --example record_json -- tcp 127.0.0.1:9100 > day.jsonl
//! cargo run --release -p mdrelay-client --example record_json -- multicast 239.255.0.1:9300 0.0.0.0 > day.jsonl
//! ```
//!
//! Over UDP or multicast, `--recovery HOST:PORT` after the transport asks the publisher's
//! retransmission service for missing frames.

use mdrelay_client::message::Side;
use mdrelay_client::{Builder, Event, Message};
use serde_json::{Value, json};
use std::io::{BufWriter, Write};
use std::process::ExitCode;

/// The message's fields as JSON (prices in ten-thousandths of a dollar, as on the wire).
fn fields(m: &Message<'_>) -> Value {
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    match m {
        Message::SystemEvent(e) => json!({"event": text(&[e.event]), "timestamp": e.timestamp}),
        Message::SecurityDirectory(d) => json!({
            "symbol": d.symbol.to_text(), "flags": d.flags, "round_lot_size": d.round_lot_size,
            "adjusted_poc_price": d.adjusted_poc_price.0, "luld_tier": d.luld_tier, "timestamp": d.timestamp,
        }),
        Message::TradingStatus(s) => json!({
            "symbol": s.symbol.to_text(), "status": text(&[s.status]), "reason": text(&s.reason), "timestamp": s.timestamp,
        }),
        Message::RetailLiquidityIndicator(r) => {
            json!({"symbol": r.symbol.to_text(), "indicator": text(&[r.indicator]), "timestamp": r.timestamp})
        }
        Message::OperationalHaltStatus(h) => {
            json!({"symbol": h.symbol.to_text(), "status": text(&[h.status]), "timestamp": h.timestamp})
        }
        Message::ShortSalePriceTestStatus(p) => json!({
            "symbol": p.symbol.to_text(), "in_effect": p.in_effect, "detail": text(&[p.detail]), "timestamp": p.timestamp,
        }),
        Message::SecurityEvent(e) => {
            json!({"symbol": e.symbol.to_text(), "event": text(&[e.event]), "timestamp": e.timestamp})
        }
        Message::PriceLevelUpdate(p) => json!({
            "symbol": p.symbol.to_text(), "side": if p.side == Side::Buy { "buy" } else { "sell" },
            "size": p.size, "price": p.price.0, "event_flags": p.event_flags, "timestamp": p.timestamp,
        }),
        Message::QuoteUpdate(q) => json!({
            "symbol": q.symbol.to_text(), "bid_size": q.bid_size, "bid_price": q.bid_price.0,
            "ask_price": q.ask_price.0, "ask_size": q.ask_size, "flags": q.flags, "timestamp": q.timestamp,
        }),
        Message::TradeReport(t) | Message::TradeBreak(t) => json!({
            "symbol": t.symbol.to_text(), "size": t.size, "price": t.price.0, "trade_id": t.trade_id,
            "sale_condition": t.sale_condition, "timestamp": t.timestamp,
        }),
        Message::OfficialPrice(o) => json!({
            "symbol": o.symbol.to_text(), "price_type": text(&[o.price_type]), "price": o.price.0, "timestamp": o.timestamp,
        }),
        Message::AuctionInformation(a) => json!({
            "symbol": a.symbol.to_text(), "auction_type": text(&[a.auction_type]), "paired_shares": a.paired_shares,
            "reference_price": a.reference_price.0, "indicative_clearing_price": a.indicative_clearing_price.0,
            "imbalance_shares": a.imbalance_shares, "imbalance_side": text(&[a.imbalance_side]), "timestamp": a.timestamp,
        }),
        Message::Unknown(u) => json!({"bytes": u.bytes.len()}),
    }
}

fn builder(args: &[String]) -> Option<Builder> {
    let (builder, rest) = match args {
        [t, addr, rest @ ..] if t == "tcp" => (Builder::tcp(addr.as_str()), rest),
        [t, addr, rest @ ..] if t == "udp" => (Builder::udp(addr.as_str()), rest),
        [t, group, interface, rest @ ..] if t == "multicast" => {
            (Builder::multicast(group.as_str(), interface.as_str()), rest)
        }
        _ => return None,
    };
    match rest {
        [] => Some(builder),
        [flag, server] if flag == "--recovery" => Some(builder.recovery(server.as_str())),
        _ => None,
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(builder) = builder(&args) else {
        eprintln!(
            "usage: record_json tcp HOST:PORT | udp ADDR:PORT | multicast GROUP:PORT INTERFACE [--recovery HOST:PORT]"
        );
        return ExitCode::from(2);
    };
    let mut subscriber = match builder.build() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("record_json: {e}");
            return ExitCode::from(2);
        }
    };
    let mut out = BufWriter::new(std::io::stdout().lock());
    loop {
        match subscriber.next_event() {
            Ok(Some(Event::Frame(frame))) => {
                for message in frame.messages() {
                    let mut line = fields(&message);
                    line["type"] = json!((message.kind() as char).to_string());
                    line["sequence"] = json!(frame.sequence());
                    line["publish_time"] = json!(frame.publish_time());
                    line["receive_time"] = json!(frame.receive_time());
                    if serde_json::to_writer(&mut out, &line).is_err() || out.write_all(b"\n").is_err() {
                        return ExitCode::SUCCESS;
                    }
                }
            }
            Ok(Some(Event::End(end))) => eprintln!("record_json: end of stream, complete {}", end.complete),
            Ok(Some(_)) => {}
            Ok(None) => return if out.flush().is_ok() { ExitCode::SUCCESS } else { ExitCode::FAILURE },
            Err(e) => {
                let _ = out.flush();
                eprintln!("record_json: {e}");
                return ExitCode::FAILURE;
            }
        }
    }
}
