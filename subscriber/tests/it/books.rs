//! `--book`: the final books and symbol state a subscriber writes, from a real publisher
//! replaying IEX's DEEP sample, equal to the independent reference reader's (`iexbook.py`,
//! `expected/DEEP10.book.json`), whole or for a symbol filter; and a path it cannot write is
//! refused before it connects.

use mdrelay_harness::{
    Process, STEP, assert_books_match, expected, iex_data, json_file, publisher_bin, shared, subscriber_bin,
};
use std::net::TcpListener;
use std::path::Path;
use std::time::Duration;

/// The longest a relay of DEEP10 may take (a few seconds; far longer only if something hangs).
const RUN: Duration = Duration::from_secs(120);

fn text(path: &Path) -> String {
    path.display().to_string()
}

/// The book file of a subscriber that took the whole of DEEP10 over TCP, in `format`, with
/// `extra` arguments.
fn book_of_a_whole_stream(format: &str, extra: &[&str]) -> serde_json::Value {
    let dir = tempfile::tempdir().unwrap();
    let (book, json) = (dir.path().join("book.json"), dir.path().join("report.json"));
    let deep10 = text(&iex_data().join("DEEP10.pcap.gz"));
    let args = ["run", "--capture", &deep10, "--format", format, "--tcp", "127.0.0.1:0"];
    let mut publisher =
        Process::start(publisher_bin(), args.iter().chain(&["--wait-subscribers", "1", "--slow-subscriber", "block"]));
    let addr = publisher.serving_on().to_string();
    let (book_arg, json_arg) = (text(&book), text(&json));
    let sub_args = ["--tcp", &addr, "--book", &book_arg, "--json", &json_arg, "--report-interval", "0"];
    let subscriber = Process::start(subscriber_bin(), sub_args.iter().chain(extra));
    publisher.finish(RUN).assert_success();
    subscriber.finish(RUN).assert_success();
    let report = json_file(&json);
    assert_eq!(report["totals_match"], true, "the whole stream: {report}");
    json_file(&book)
}

#[test]
fn the_book_of_a_whole_stream_equals_the_reference_books() {
    let _shared = shared();
    let reference = expected("DEEP10.book.json");
    for format in ["sbe", "json"] {
        let ours = book_of_a_whole_stream(format, &[]);
        assert_books_match(&ours, &reference, &format!("{format}: --book"));
        assert_eq!(ours["messages_applied"], reference["messages_applied"], "{format}");
    }
}

#[test]
fn with_a_symbol_filter_the_book_holds_those_symbols_as_the_reference_has_them() {
    let _shared = shared();
    let reference = expected("DEEP10.book.json");
    let ours = book_of_a_whole_stream("flatbuffers", &["--symbols", "AA,CVS,NOPE"]);
    let symbols = ours["symbols"].as_object().unwrap();
    let names: Vec<_> = symbols.keys().map(String::as_str).collect();
    // NOPE has no state in DEEP10: a filter names symbols, it does not make state.
    assert_eq!(names, ["AA", "CVS"], "only the filter's symbols with state");
    for (symbol, state) in symbols {
        assert_eq!(Some(state), reference["symbols"].get(symbol), "{symbol}");
    }
}

#[test]
fn a_book_path_that_cannot_be_written_is_refused_before_connecting() {
    let _shared = shared();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let dir = tempfile::tempdir().unwrap();
    for path in [dir.path().join("missing/book.json"), dir.path().to_path_buf()] {
        let book = text(&path);
        let args = ["--tcp", &addr, "--book", &book, "--report-interval", "0", "--duration", "1"];
        let done = Process::start(subscriber_bin(), args).finish(STEP);
        assert_eq!(done.code(), Some(2), "{book}: the configuration's exit status: {done:?}");
        let says = format!("configuration error: book: cannot create {book}");
        assert!(done.stderr.contains(&says), "{book}: wanted {says:?}: {done:?}");
    }
    assert!(listener.accept().is_err(), "refused before connecting");
}
