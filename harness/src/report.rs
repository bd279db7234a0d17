//! JSON reports, and how they are compared with the reference outputs.

use serde_json::Value;
use std::path::Path;

/// A JSON file a process wrote; panics naming the file when it is missing or not JSON.
pub fn json_file(path: &Path) -> Value {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_slice(&bytes).unwrap_or_else(|e| panic!("{}: not JSON: {e}", path.display()))
}

/// Asserts a report's aggregates (total volume, active symbols, every symbol's figures) equal
/// the reference's.
pub fn assert_aggregates(report: &Value, reference: &Value, context: &str) {
    for key in ["total_trade_volume", "symbols_with_trades_or_quotes", "symbols"] {
        assert!(!reference[key].is_null(), "{context}: the reference has no {key}");
        assert_eq!(report[key], reference[key], "{context}: {key}");
    }
}

/// Asserts an `inspect` report carries every field of the reference with the same value (the
/// file name aside), and that the counters the reference leaves out (it omits zero counts) are
/// zero in the report.
pub fn assert_matches_reference(ours: &Value, reference: &Value) {
    let ours = ours.as_object().expect("the report is an object");
    let reference = reference.as_object().expect("the reference is an object");
    for (key, value) in reference {
        if key != "file" {
            assert_eq!(ours.get(key), Some(value), "field {key} differs from the reference");
        }
    }
    for key in ["packets", "segments", "heartbeats", "messages", "truncated_records", "non_iex_packets"] {
        if !reference.contains_key(key) {
            assert_eq!(ours.get(key), Some(&serde_json::json!(0)), "the reference omits {key}, so it must be 0");
        }
    }
}

/// Asserts the `symbols` of books written in the reference reader's schema (`iexbook.py`) equal
/// the reference's: the same symbols with the same state. A difference names the first symbol
/// that differs and both sides of it, not the whole document.
pub fn assert_books_match(ours: &Value, reference: &Value, context: &str) {
    let (ours_symbols, theirs) = (&ours["symbols"], &reference["symbols"]);
    let (Some(ours_map), Some(theirs_map)) = (ours_symbols.as_object(), theirs.as_object()) else {
        panic!("{context}: both documents must have a `symbols` object");
    };
    assert!(!theirs_map.is_empty(), "{context}: the reference has no symbols");
    for (symbol, state) in theirs_map {
        assert_eq!(ours_map.get(symbol), Some(state), "{context}: symbol {symbol} differs from the reference");
    }
    let extra: Vec<_> = ours_map.keys().filter(|s| !theirs_map.contains_key(*s)).take(5).collect();
    assert!(extra.is_empty(), "{context}: symbols the reference does not have: {extra:?}");
    assert_eq!(ours_symbols, theirs, "{context}: symbols");
}
