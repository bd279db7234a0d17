//! The crate's examples, built and run against a real publisher, their output checked against
//! the reference outputs of ../shared: `trades` (the trades of some symbols), `vwap` (a running
//! VWAP per symbol) and `record_json` (every message as a JSON line).

use crate::common::*;
use mdrelay_harness::{Finished, Process, example_bin, expected, serial};
use serde_json::Value;
use std::collections::BTreeMap;

/// Runs `example` with `args` (after the publisher's address) against a publisher of `capture`
/// over TCP; what it printed.
fn run_example(example: &str, capture_name: &str, args: &[&str]) -> Finished {
    let mut publisher = tcp_publisher(capture_name, &["--format", "capnp"]);
    let addr = publisher.serving_on().to_string();
    let mut all = vec![addr.as_str()];
    if example == "record_json" {
        all.insert(0, "tcp");
    }
    all.extend(args);
    let run = Process::start(example_bin("mdrelay-client", example), &all).finish(RUN);
    publisher.finish(RUN).assert_success();
    assert_eq!(run.code(), Some(0), "{example}: {}", run.stderr);
    run
}

/// Ten-thousandths of a dollar from `12.3400`.
fn price(text: &str) -> i64 {
    let (dollars, fraction) = text.split_once('.').unwrap_or_else(|| panic!("{text:?} is not a price"));
    dollars.parse::<i64>().unwrap() * 10_000 + fraction.parse::<i64>().unwrap()
}

#[test]
fn trades_prints_exactly_the_trades_of_the_symbols_asked_for() {
    let _serial = serial();
    let run = run_example("trades", "DEEP10", &["AA", "ZIEXT", "NOSUCH"]);
    let reference = expected("DEEP10.json");
    let mut figures: BTreeMap<String, (u64, u64, i64, i64)> = BTreeMap::new();
    let mut last_sequence = 0;
    let mut end = None;
    for line in run.stdout.lines() {
        if let Some(rest) = line.strip_prefix("end: ") {
            end = Some(rest.to_string());
            continue;
        }
        let fields: Vec<&str> = line.split_whitespace().collect();
        let [symbol, size, p, sequence] = fields[..] else { panic!("{line:?}") };
        let sequence: u64 = sequence.parse().unwrap();
        assert!(sequence >= last_sequence, "in the stream's order: {line}");
        last_sequence = sequence;
        let f = figures.entry(symbol.to_string()).or_insert((0, 0, i64::MIN, i64::MAX));
        let p = price(p);
        f.0 += size.parse::<u64>().unwrap();
        f.1 += 1;
        f.2 = f.2.max(p);
        f.3 = f.3.min(p);
    }
    assert_eq!(figures.keys().collect::<Vec<_>>(), ["AA", "ZIEXT"], "only the symbols asked for (NOSUCH never trades)");
    for (symbol, (volume, trades, high, low)) in &figures {
        let r = &reference["symbols"][symbol];
        assert_eq!(Some(*volume), r["trade_volume"].as_u64(), "{symbol}");
        assert_eq!(Some(*trades), r["trades"].as_u64(), "{symbol}");
        assert_eq!((Some(*high), Some(*low)), (r["trade_high"].as_i64(), r["trade_low"].as_i64()), "{symbol}");
    }
    let end = end.expect("an end line");
    assert!(end.ends_with("complete true"), "{end}");
    assert!(end.contains(&format!("messages {}", reference["messages"])), "every message counted: {end}");
}

#[test]
fn vwap_gives_each_symbols_volume_and_an_average_within_its_range() {
    let _serial = serial();
    let run = run_example("vwap", "DEEP10", &["--every", "20000"]);
    let reference = expected("DEEP10.json");
    let lines: Vec<&str> = run.stdout.lines().collect();
    let running = lines.iter().filter(|l| l.starts_with("after ")).count() as u64;
    let trades: u64 = reference["symbols"].as_object().unwrap().values().map(|s| s["trades"].as_u64().unwrap()).sum();
    assert_eq!(running, trades / 20_000, "a running table every 20,000 trades");
    let at = lines.iter().rposition(|l| l.starts_with("end: ")).expect("an end table");
    assert_eq!(lines[at], format!("end: {trades} trades, complete true"));
    let mut seen = 0;
    for line in &lines[at + 1..] {
        let [symbol, volume, vwap] = line.split_whitespace().collect::<Vec<_>>()[..] else { panic!("{line:?}") };
        let r = &reference["symbols"][symbol];
        assert_eq!(volume.parse::<u64>().ok(), r["trade_volume"].as_u64(), "{symbol}");
        let vwap = price(vwap);
        let (low, high) = (r["trade_low"].as_i64().unwrap(), r["trade_high"].as_i64().unwrap());
        assert!((low..=high).contains(&vwap), "{symbol}: VWAP {vwap} outside the traded range {low}..={high}");
        seen += 1;
    }
    let traded = reference["symbols"].as_object().unwrap().values().filter(|s| s["trades"].as_u64() > Some(0)).count();
    assert_eq!(seen, traded, "every symbol that traded");
}

#[test]
fn record_json_writes_every_message_as_a_json_line() {
    let _serial = serial();
    let run = run_example("record_json", "TOPS16", &[]);
    let reference = expected("TOPS16.json");
    let mut types: BTreeMap<String, u64> = BTreeMap::new();
    let mut volume: BTreeMap<String, (u64, u64)> = BTreeMap::new();
    let mut messages = 0u64;
    let mut last_sequence = 0;
    for line in run.stdout.lines() {
        let m: Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("{line:?}: {e}"));
        messages += 1;
        let kind = m["type"].as_str().expect("a type").to_string();
        let sequence = m["sequence"].as_u64().expect("a sequence");
        assert!(
            sequence >= last_sequence && m["publish_time"].as_i64() > Some(0) && m["receive_time"].as_i64() > Some(0)
        );
        last_sequence = sequence;
        if kind == "T" {
            let v = volume.entry(m["symbol"].as_str().unwrap().to_string()).or_default();
            v.0 += m["size"].as_u64().unwrap();
            v.1 += 1;
        }
        *types.entry(kind).or_default() += 1;
    }
    assert_eq!(Some(messages), reference["messages"].as_u64());
    assert_eq!(serde_json::to_value(&types).unwrap(), reference["message_types"]);
    for (symbol, (v, n)) in &volume {
        let r = &reference["symbols"][symbol];
        assert_eq!((Some(*v), Some(*n)), (r["trade_volume"].as_u64(), r["trades"].as_u64()), "{symbol}");
    }
    assert!(run.stderr.contains("end of stream, complete true"), "{}", run.stderr);
}
