//! `mdrelay-pub`'s capture tools run as real processes on real files.

use std::path::PathBuf;
use std::process::{Command, Output};

fn iex_data() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared/data/iex");
    assert!(
        dir.join("README.md").is_file(),
        "missing {}: the tests need the shared IEX captures beside the project root, as in CI",
        dir.display()
    );
    dir
}

fn publisher(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_mdrelay-pub")).args(args).output().expect("mdrelay-pub runs")
}

fn json(output: &Output) -> serde_json::Value {
    assert!(output.status.success(), "failed: {}", String::from_utf8_lossy(&output.stderr));
    serde_json::from_slice(&output.stdout).expect("stdout is JSON")
}

fn reference(path: &std::path::Path) -> serde_json::Value {
    let script = iex_data().join("../../tools/iexref.py");
    let output = Command::new("python3").arg(script).arg(path).output().expect("python3 runs");
    json(&output)
}

/// Every field of the reference equals ours (the file name aside).
fn assert_same(ours: &serde_json::Value, reference: &serde_json::Value) {
    for (key, value) in reference.as_object().unwrap() {
        if key != "file" {
            assert_eq!(&ours[key], value, "field {key}");
        }
    }
}

#[test]
fn inspect_json_equals_the_expected_files() {
    for (capture, expected) in [("DEEP10.pcap.gz", "DEEP10.json"), ("TOPS16.pcap.gz", "TOPS16.json")] {
        let path = iex_data().join(capture);
        let ours = json(&publisher(&["inspect", "--json", path.to_str().unwrap()]));
        let text = std::fs::read_to_string(iex_data().join("expected").join(expected)).unwrap();
        let reference: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(ours["file"], reference["file"]);
        assert_same(&ours, &reference);
    }
}

#[test]
fn inspect_text_names_symbols_in_dollars() {
    let path = iex_data().join("DEEP10.pcap.gz");
    let output = publisher(&["inspect", path.to_str().unwrap()]);
    assert!(output.status.success());
    let text = String::from_utf8(output.stdout).unwrap();
    // AA's trade high in the reference is 500500, i.e. $50.05.
    let line = text.lines().find(|l| l.trim_start().starts_with("AA ")).expect("a line for AA");
    assert!(line.contains("50.0500"), "{line}");
    let stderr = String::from_utf8(output.stderr).unwrap();
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
    assert!(!output.status.success());
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert!(stderr.contains("readme.txt") && stderr.contains("not a pcap"), "{stderr}");
    let output = publisher(&["inspect", "/nonexistent/file.pcap"]);
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("/nonexistent/file.pcap"));
}

#[test]
fn synth_writes_what_the_reference_reader_reads() {
    let dir = tempfile::tempdir().unwrap();
    for (name, extra) in [("day.pcap", vec![]), ("day.pcapng.gz", vec!["--format", "pcapng", "--gzip"])] {
        let path = dir.path().join(name);
        let p = path.to_str().unwrap();
        let mut args = vec!["synth", "--out", p, "--messages", "200000", "--symbols", "40", "--seed", "5"];
        args.extend(extra);
        let output = publisher(&args);
        assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
        let ours = json(&publisher(&["inspect", "--json", p]));
        assert_eq!(ours["messages"], 200_000);
        assert_same(&ours, &reference(&path));
    }
    // Same seed, same bytes; another seed, other bytes.
    let a = dir.path().join("a.pcap");
    let b = dir.path().join("b.pcap");
    let c = dir.path().join("c.pcap");
    for (path, seed) in [(&a, "9"), (&b, "9"), (&c, "10")] {
        assert!(
            publisher(&["synth", "--out", path.to_str().unwrap(), "--messages", "20000", "--seed", seed])
                .status
                .success()
        );
    }
    assert_eq!(std::fs::read(&a).unwrap(), std::fs::read(&b).unwrap());
    assert_ne!(std::fs::read(&a).unwrap(), std::fs::read(&c).unwrap());
}

#[test]
fn synth_refuses_too_few_messages_with_the_minimum() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("x.pcap");
    let output = publisher(&["synth", "--out", path.to_str().unwrap(), "--messages", "10", "--symbols", "50"]);
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("456"), "names the minimum for 50 symbols");
}

#[test]
fn convert_keeps_every_count() {
    let dir = tempfile::tempdir().unwrap();
    let source = iex_data().join("TOPS16.pcap.gz");
    let expected = reference(&source);
    for (name, args) in [
        ("tops.pcapng", vec!["--format", "pcapng"]),
        ("tops.pcap.gz", vec!["--microseconds", "--big-endian", "--gzip"]),
    ] {
        let out = dir.path().join(name);
        let mut all = vec!["convert", source.to_str().unwrap(), "--out", out.to_str().unwrap()];
        all.extend(args);
        let output = publisher(&all);
        assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
        let ours = json(&publisher(&["inspect", "--json", out.to_str().unwrap()]));
        assert_same(&ours, &expected);
        assert_same(&reference(&out), &expected);
    }
}
