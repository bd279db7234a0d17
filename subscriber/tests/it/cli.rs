//! `mdrelay-sub`'s configuration as a user meets it: the messages for bad settings (exit code
//! 2), and the example files under config/.

mod common;

use common::subscriber;
use mdrelay_harness::{Finished, Process, STEP, subscriber_bin};
use std::path::PathBuf;

fn config_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../config")
}

fn run_with_file(text: &str, extra: &[&str]) -> (Finished, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sub.toml");
    std::fs::write(&path, text).unwrap();
    let path = path.to_str().unwrap().to_string();
    let mut args = vec!["--config", path.as_str()];
    args.extend_from_slice(extra);
    (subscriber(&args).finish(STEP), path)
}

#[test]
fn an_unknown_key_fails_naming_the_file_the_key_and_the_line() {
    let (done, path) =
        run_with_file("connect = \"127.0.0.1:9100\"\nreport_interval = 1\nreconect_max_seconds = 2\n", &[]);
    assert_eq!(done.code(), Some(2), "{done:?}");
    assert!(done.stderr.contains(&path), "{}", done.stderr);
    assert!(done.stderr.contains("reconect_max_seconds") && done.stderr.contains("line 3"), "{}", done.stderr);
}

#[test]
fn bad_settings_fail_at_start_naming_the_setting() {
    let cases: &[(&str, &[&str], &str)] = &[
        ("listen = \"239.255.0.1:9300\"\n", &[], "listen: 239.255.0.1 is a multicast address"),
        ("group = \"127.0.0.1:9300\"\n", &[], "group: 127.0.0.1 is not a multicast address"),
        ("group = \"239.255.0.1:9300\"\ninterface = \"eth0\"\n", &[], "interface: \"eth0\" is not an IPv4 address"),
        ("connect = \"127.0.0.1\"\n", &[], "connect: \"127.0.0.1\" is not host:port"),
        ("listen = \"not an address\"\n", &[], "listen: \"not an address\" is not an address:port"),
        ("symbols = [\"AAPL\"]\n", &[], "no transport configured"),
        ("connect = \"127.0.0.1:9100\"\ngroup = \"239.255.0.1:9300\"\n", &[], "several transports"),
        (
            "connect = \"127.0.0.1:9100\"\nformat = \"sbe\"\n",
            &[],
            "line 2: format: the subscriber has no format setting",
        ),
        ("connect = \"127.0.0.1:9100\"\nlatency = \"both\"\n", &[], "latency"),
        ("connect = \"127.0.0.1:9100\"\necho_every = 0\n", &[], "echo_every: must be at least 1"),
        (
            "connect = \"127.0.0.1:9100\"\n",
            &["--listen", "127.0.0.1:0", "--group", "239.255.0.1:1"],
            "several transports",
        ),
        ("connect = \"127.0.0.1:9100\"\n", &["--duration", "-1"], "--duration: -1 seconds is out of range"),
        ("connect = \"127.0.0.1:9100\"\n", &["--format", "sbe"], "the format comes from the publisher"),
        ("connect = \"127.0.0.1:9100\"\n", &["--recovery", "127.0.0.1:9400"], "--recovery: a TCP subscriber resumes"),
        (
            "listen = \"127.0.0.1:0\"\nrecovery = \"127.0.0.1:9400\"\n",
            &["--recovery-attempts", "0"],
            "--recovery-attempts: 0 is out of range (1 to 1000)",
        ),
        ("listen = \"127.0.0.1:0\"\n", &["--recovery-linger", "3"], "--recovery-linger: only used with recovery"),
        ("listen = \"127.0.0.1:0\"\n", &["--group-b", "239.1.1.1:1"], "--group-b: line B of a multicast transport"),
    ];
    for (text, flags, needle) in cases {
        let (done, _) = run_with_file(text, flags);
        assert_eq!(done.code(), Some(2), "{text:?} {flags:?}: {done:?}");
        assert!(done.stderr.contains(needle), "{text:?} {flags:?}: expected {needle:?} in:\n{}", done.stderr);
    }
}

#[test]
fn the_example_files_are_valid() {
    let mut seen = 0;
    for entry in std::fs::read_dir(config_dir()).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        if !(name.starts_with("sub-") && name.ends_with(".toml")) {
            continue;
        }
        seen += 1;
        let done = subscriber(&["--config", path.to_str().unwrap(), "--check"]).finish(STEP);
        assert!(done.status.success(), "{name}: {done:?}");
        assert!(done.stdout.contains("transport"), "{name}: {}", done.stdout);
    }
    assert!(seen >= 3, "the example subscriber configurations are missing");
}

#[test]
fn check_prints_the_recovery_and_line_b_settings() {
    let args = [
        "--listen",
        "127.0.0.1:9200",
        "--listen-b",
        "127.0.0.1:9201",
        "--recovery",
        "127.0.0.1:9400",
        "--recovery-delay-ms",
        "3",
        "--check",
    ];
    let done = subscriber(&args).finish(STEP);
    assert!(done.status.success(), "{done:?}");
    for needle in
        ["server: \"127.0.0.1:9400\"", "delay: 3ms", "retry: 50ms", "attempts: 10", "linger: 2s", "127.0.0.1:9201"]
    {
        assert!(done.stdout.contains(needle), "{needle:?} in:\n{}", done.stdout);
    }
}

#[test]
fn configuration_and_usage_errors_exit_2() {
    let missing = subscriber(&["--config", "/nonexistent/mdrelay/sub.toml"]).finish(STEP);
    assert_eq!(missing.code(), Some(2), "{missing:?}");
    assert!(missing.stderr.contains("/nonexistent/mdrelay/sub.toml"), "{missing:?}");
    for (case, text, flags, needle) in [
        ("a TOML syntax error", "connect = \n", &[][..], "line 1"),
        ("an unknown key", "connect = \"127.0.0.1:9100\"\nconect = 1\n", &[], "conect"),
        ("an out-of-range value", "connect = \"127.0.0.1:9100\"\n", &["--duration", "-1"], "--duration"),
        ("a bad flag value", "connect = \"127.0.0.1:9100\"\n", &["--report-interval", "often"], "often"),
        ("an unknown flag", "connect = \"127.0.0.1:9100\"\n", &["--conect", "x"], "--conect"),
    ] {
        let (done, _) = run_with_file(text, flags);
        assert_eq!(done.code(), Some(2), "{case}: {done:?}");
        assert!(done.stderr.contains(needle), "{case}: {needle:?} in {done:?}");
    }
}

#[test]
fn a_port_in_use_exits_1() {
    let taken = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let done = subscriber(&["--listen", &addr, "--report-interval", "0"]).finish(STEP);
    assert_eq!(done.code(), Some(1), "{done:?}");
    assert!(done.stderr.contains(&addr), "{done:?}");
}

#[test]
fn a_peer_that_is_not_a_publisher_is_refused_with_exit_3() {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let http = std::thread::spawn(move || {
        let mut s = mdrelay_harness::accept_within(&listener, STEP);
        let _ = s.write_all(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
        let _ = s.read(&mut [0u8; 64]);
    });
    let done = subscriber(&["--connect", &addr, "--report-interval", "0"]).finish(STEP);
    http.join().unwrap();
    assert_eq!(done.code(), Some(3), "{done:?}");
    assert!(done.stderr.contains("not an mdrelay publisher") && done.stderr.contains(&addr), "{done:?}");
}

#[test]
fn help_lists_the_exit_statuses() {
    let done = subscriber(&["--help"]).finish(STEP);
    done.assert_success();
    let help = done.stdout.split_once("Exit status:").map(|(_, table)| table).unwrap_or_else(|| panic!("{done:?}"));
    for code in ["0", "1", "2", "3"] {
        assert!(
            help.lines().any(|l| l.trim_start().strip_prefix(code).is_some_and(|rest| rest.starts_with("  "))),
            "exit status {code} in {help}"
        );
    }
    assert!(!help.contains("130"), "the subscriber has no immediate stop: {help}");
}

#[test]
fn check_refuses_a_log_filter_that_a_run_refuses() {
    // A port nothing listens on: a run that got past its configuration would fail otherwise.
    let connect = ["--connect", "127.0.0.1:1"];
    for (case, flags, env) in
        [("--log-level", &["--log-level", "mdrelay=loud"][..], "info"), ("MDRELAY_LOG", &[][..], "mdrelay=loud")]
    {
        let start = |check: bool| {
            let mut args: Vec<&str> = connect.iter().chain(flags).copied().collect();
            if check {
                args.push("--check");
            }
            Process::spawn(subscriber_bin(), &args, &[("MDRELAY_LOG", env)]).unwrap().finish(STEP)
        };
        let (run, check) = (start(false), start(true));
        assert_eq!(run.code(), Some(2), "{case}: a run refuses the filter: {run:?}");
        assert_eq!(check.code(), Some(2), "{case}: --check refuses it as the run does: {check:?}");
        for done in [&run, &check] {
            assert!(done.stderr.contains(case) && done.stderr.contains("not a log filter"), "{case}: {}", done.stderr);
        }
    }
}
