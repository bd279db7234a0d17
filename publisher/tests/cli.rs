//! `mdrelay-pub`'s capture tools run as real processes on real files, their results compared
//! with the independent reference reader's.

use mdrelay_harness::{
    Finished, Process, STEP, assert_matches_reference, expected, iex_data, publisher_bin, reference_output,
};
use serde_json::Value;

/// Runs `mdrelay-pub` to its exit (at most [`STEP`]).
fn publisher(args: &[&str]) -> Finished {
    Process::start(publisher_bin(), args).finish(STEP)
}

/// Stdout as JSON, after checking the run succeeded.
fn json(output: &Finished) -> Value {
    output.assert_success().json()
}

/// A reference output without its file name, to compare two of them whole.
fn without_file(mut reference: Value) -> Value {
    reference.as_object_mut().expect("the reference is an object").remove("file");
    reference
}

#[test]
fn inspect_json_equals_the_expected_files() {
    for (capture, expected_name) in [("DEEP10.pcap.gz", "DEEP10.json"), ("TOPS16.pcap.gz", "TOPS16.json")] {
        let path = iex_data().join(capture);
        let ours = json(&publisher(&["inspect", "--json", path.to_str().unwrap()]));
        let reference = expected(expected_name);
        assert_eq!(ours["file"], reference["file"]);
        assert_matches_reference(&ours, &reference);
    }
}

#[test]
fn inspect_text_names_symbols_in_dollars() {
    let path = iex_data().join("DEEP10.pcap.gz");
    let output = publisher(&["inspect", path.to_str().unwrap()]);
    output.assert_success();
    let text = &output.stdout;
    // AA's trade high in the reference is 500500, i.e. $50.05.
    let line = text.lines().find(|l| l.trim_start().starts_with("AA ")).expect("a line for AA");
    assert!(line.contains("50.0500"), "{line}");
    let stderr = &output.stderr;
    assert!(
        stderr.contains("DEEP10.pcap.gz") && stderr.contains("offset"),
        "the truncated record is logged with file and offset: {stderr}"
    );
}

#[test]
fn a_file_that_is_not_a_capture_fails_with_its_name() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("readme.txt");
    std::fs::write(&path, "hello").unwrap();
    let output = publisher(&["inspect", path.to_str().unwrap()]);
    assert!(!output.status.success(), "{output:?}");
    assert!(output.stderr.contains("readme.txt") && output.stderr.contains("not a pcap"), "{output:?}");
    let output = publisher(&["inspect", "/nonexistent/file.pcap"]);
    assert!(!output.status.success(), "{output:?}");
    assert!(output.stderr.contains("/nonexistent/file.pcap"), "{output:?}");
}

#[test]
fn synth_writes_what_the_reference_reader_reads() {
    let dir = tempfile::tempdir().unwrap();
    for (name, extra) in [("day.pcap", vec![]), ("day.pcapng.gz", vec!["--format", "pcapng", "--gzip"])] {
        let path = dir.path().join(name);
        let p = path.to_str().unwrap();
        let mut args = vec!["synth", "--out", p, "--messages", "200000", "--symbols", "40", "--seed", "5"];
        args.extend(extra);
        publisher(&args).assert_success();
        let ours = json(&publisher(&["inspect", "--json", p]));
        assert_eq!(ours["messages"], 200_000);
        assert_matches_reference(&ours, &reference_output(&path));
    }
    // Same seed, same bytes; another seed, other bytes.
    let a = dir.path().join("a.pcap");
    let b = dir.path().join("b.pcap");
    let c = dir.path().join("c.pcap");
    for (path, seed) in [(&a, "9"), (&b, "9"), (&c, "10")] {
        publisher(&["synth", "--out", path.to_str().unwrap(), "--messages", "20000", "--seed", seed]).assert_success();
    }
    assert_eq!(std::fs::read(&a).unwrap(), std::fs::read(&b).unwrap());
    assert_ne!(std::fs::read(&a).unwrap(), std::fs::read(&c).unwrap());
}

#[test]
fn synth_refuses_too_few_messages_with_the_minimum() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("x.pcap");
    let output = publisher(&["synth", "--out", path.to_str().unwrap(), "--messages", "10", "--symbols", "50"]);
    assert!(!output.status.success(), "{output:?}");
    assert!(output.stderr.contains("456"), "names the minimum for 50 symbols: {output:?}");
    assert!(!path.exists(), "no capture is left behind");
}

#[test]
fn convert_keeps_every_count() {
    let dir = tempfile::tempdir().unwrap();
    let source = iex_data().join("TOPS16.pcap.gz");
    let expected = reference_output(&source);
    for (name, args) in [
        ("tops.pcapng", vec!["--format", "pcapng"]),
        ("tops.pcap.gz", vec!["--microseconds", "--big-endian", "--gzip"]),
    ] {
        let out = dir.path().join(name);
        let mut all = vec!["convert", source.to_str().unwrap(), "--out", out.to_str().unwrap()];
        all.extend(args);
        publisher(&all).assert_success();
        let ours = json(&publisher(&["inspect", "--json", out.to_str().unwrap()]));
        assert_matches_reference(&ours, &expected);
        assert_eq!(without_file(reference_output(&out)), without_file(expected.clone()), "{name}");
    }
}
