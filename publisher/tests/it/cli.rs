//! `mdrelay-pub`'s capture tools run as real processes on real files, their results compared
//! with the independent reference reader's.

use crate::common::{beside_others_in_tempdir, run_with_config};
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
    // A whole capture read or written: CPU a serial test must not share.
    let _shared = mdrelay_harness::shared();
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
    // A whole capture read or written: CPU a serial test must not share.
    let _shared = mdrelay_harness::shared();
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
    // A whole capture read or written: CPU a serial test must not share.
    let (_shared, dir) = beside_others_in_tempdir();
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
    // A whole capture read or written: CPU a serial test must not share.
    let (_shared, dir) = beside_others_in_tempdir();
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

/// Asserts the exit code, that stderr names every one of `names`, and that nothing was served.
fn assert_exit(done: &Finished, code: i32, names: &[&str], case: &str) {
    assert_eq!(done.code(), Some(code), "{case}: {done:?}");
    for name in names {
        assert!(done.stderr.contains(name), "{case}: {name:?} in {done:?}");
    }
    assert!(!done.stderr.contains("publishing"), "{case}: nothing was published: {done:?}");
}

#[test]
fn configuration_and_usage_errors_exit_2() {
    let port = mdrelay_harness::free_tcp_port();
    let missing = publisher(&["run", "--config", "/nonexistent/mdrelay/pub.toml"]);
    assert_exit(&missing, 2, &["/nonexistent/mdrelay/pub.toml"], "a missing file");
    for (case, toml, names) in [
        ("a TOML syntax error", "format = \n[tcp]\n".to_string(), &["pub.toml", "line 1"][..]),
        ("an unknown key", "fromat = \"sbe\"\n[tcp]\n".into(), &["fromat", "line 1"]),
        ("an out-of-range value", "[tcp]\nqueue = 0\n".into(), &["tcp.queue", "out of range"]),
        (
            "a self-pointing upstream",
            format!("[source.upstream]\nconnect = \"127.0.0.1:{port}\"\n[tcp]\nlisten = \"127.0.0.1:{port}\"\n"),
            &["source.upstream.connect", "own tcp.listen"],
        ),
        (
            "the stream and retransmission on one address",
            format!("[tcp]\nlisten = \"127.0.0.1:{port}\"\n[retransmit]\nlisten = \"127.0.0.1:{port}\"\n"),
            &["retransmit.listen", "tcp.listen"],
        ),
        (
            "the stream and metrics on one address",
            format!("[tcp]\nlisten = \"0.0.0.0:{port}\"\n[metrics]\nlisten = \"127.0.0.1:{port}\"\n"),
            &["metrics.listen", "tcp.listen"],
        ),
    ] {
        assert_exit(&run_with_config(&toml, &[]), 2, names, case);
    }
    let bad_flag = publisher(&["run", "--tcp", "127.0.0.1:0", "--rate", "fast"]);
    assert_exit(&bad_flag, 2, &["--rate", "fast"], "a bad flag value");
    let unknown_flag = publisher(&["run", "--tcp", "127.0.0.1:0", "--frmat", "sbe"]);
    assert_exit(&unknown_flag, 2, &["--frmat"], "an unknown flag");
}

#[test]
fn a_port_in_use_exits_1() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let done = publisher(&["run", "--synthetic", "--messages", "100000", "--tcp", &addr]);
    assert_exit(&done, 1, &["tcp.listen", &addr], "a port in use");
}

#[test]
fn an_upstream_that_refuses_the_relay_exits_3_and_one_never_reached_exits_4() {
    let _shared = mdrelay_harness::shared();
    use mdrelay_codec::Format;
    use mdrelay_proto::relay::{Hello, RecordTag, control_record};
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let upstream = listener.local_addr().unwrap();
    // A publisher that greets, takes the relay's answer and refuses it, as a real one refuses a
    // subscriber it cannot serve.
    let refusing = std::thread::spawn(move || {
        let mut s = mdrelay_harness::accept_within(&listener, STEP);
        s.write_all(&Hello::new(Format::Sbe, 0x5151, 1, 1).to_bytes()).unwrap();
        let _ = s.read(&mut [0u8; 64]);
        s.write_all(&control_record(RecordTag::Refuse, Format::Sbe, 0, b"no relays here")).unwrap();
        let _ = s.read_to_end(&mut Vec::new());
    });
    let relay = |connect: &str| {
        run_with_config(
            &format!(
                "[source.upstream]\nconnect = \"{connect}\"\nreconnect_max = 0.2\ngive_up_after = 1\n[tcp]\nlisten = \"127.0.0.1:0\"\n"
            ),
            &[],
        )
    };
    let done = relay(&upstream.to_string());
    assert_eq!(done.code(), Some(3), "{done:?}");
    assert!(done.stderr.contains("refused this relay") && done.stderr.contains("no relays here"), "{done:?}");
    refusing.join().unwrap();
    // Nothing listens: not reached within give_up_after.
    let nobody = format!("127.0.0.1:{}", mdrelay_harness::free_tcp_port());
    let done = relay(&nobody);
    assert_exit(
        &done,
        4,
        &[&format!("upstream {nobody}"), "not reached", "give_up_after"],
        "an upstream never reached",
    );
}

#[test]
fn help_lists_the_exit_statuses() {
    let done = publisher(&["run", "--help"]);
    done.assert_success();
    let help = done.stdout.split_once("Exit status:").map(|(_, table)| table).unwrap_or_else(|| panic!("{done:?}"));
    for code in ["0", "1", "2", "3", "4", "130"] {
        assert!(
            help.lines().any(|l| l.trim_start().strip_prefix(code).is_some_and(|rest| rest.starts_with("  "))),
            "exit status {code} in {help}"
        );
    }
}
