//! Idle strategies, profiles and pinning, through the real processes: the settings are checked
//! by name, every strategy relays a whole stream exactly (publisher's and subscriber's waits
//! alike, over TCP and UDP), and a pinned hot thread runs only on its core. No timing is
//! asserted: what each strategy costs is measured in docs/idle.md, not here.

use crate::common::alone_in_tempdir;
use mdrelay_harness::cli_args::words;
use mdrelay_harness::{
    Finished, Process, STEP, Signal, free_udp_port, json_file, publisher_bin, serial, subscriber_bin,
};
use serde_json::Value;
use std::path::Path;
use std::time::Duration;

/// Longer than any of these runs takes (about a second each), short of a hang.
const RUN: Duration = Duration::from_secs(60);

fn publisher(args: &[&str]) -> Finished {
    Process::start(publisher_bin(), args.iter().copied()).finish(STEP)
}

/// A synthetic day of 20,000 messages paced at 100,000/s: every wait in the pacer is short,
/// about 0.2 s of stream.
const STREAM: [&str; 8] = ["run", "--synthetic", "--messages", "20000", "--pacing", "rate", "--rate", "100000"];

#[test]
fn bad_idle_profile_and_core_settings_are_named() {
    let out = publisher(&["run", "--synthetic", "--tcp", "127.0.0.1:0", "--idle", "fast"]);
    assert_ne!(out.code(), Some(0));
    assert!(out.stderr.contains("--idle") && out.stderr.contains("spin, yield, backoff or sleep"), "{}", out.stderr);

    let out = publisher(&["run", "--synthetic", "--tcp", "127.0.0.1:0", "--profile", "quick"]);
    assert_ne!(out.code(), Some(0));
    assert!(out.stderr.contains("--profile") && out.stderr.contains("default or low-latency"), "{}", out.stderr);

    let out = publisher(&["run", "--synthetic", "--tcp", "127.0.0.1:0", "--hot-core", "100000"]);
    assert_ne!(out.code(), Some(0));
    assert!(out.stderr.contains("cpu.hot_core (--hot-core): 100000 is not a CPU"), "{}", out.stderr);

    let dir = tempfile::tempdir().unwrap();
    for (text, named) in [
        ("[pacing]\nidle = \"fast\"\n[tcp]\n", "idle"),
        ("profile = \"quick\"\n[tcp]\n", "profile"),
        ("[cpu]\nhot_core = 100000\n[tcp]\n", "cpu.hot_core"),
        ("[cpu]\ncore = 1\n[tcp]\n", "core"),
    ] {
        let file = dir.path().join("pub.toml");
        std::fs::write(&file, text).unwrap();
        let out = publisher(&["run", "--config", file.to_str().unwrap()]);
        assert_ne!(out.code(), Some(0), "{text}");
        assert!(out.stderr.contains(named), "{text}: {}", out.stderr);
    }
}

/// Relays [`STREAM`] over TCP with `pub_extra` and `sub_extra`; returns both reports.
fn relay_tcp(dir: &Path, name: &str, pub_extra: &[&str], sub_extra: &[&str]) -> (Value, Value) {
    let pub_json = dir.join(format!("pub-{name}.json")).display().to_string();
    let sub_json = dir.join(format!("sub-{name}.json")).display().to_string();
    let mut args: Vec<&str> = STREAM.to_vec();
    args.extend(["--tcp", "127.0.0.1:0", "--wait-subscribers", "1", "--json", &pub_json]);
    args.extend(pub_extra);
    let mut publ = Process::start(publisher_bin(), args);
    let addr = publ.serving_on().to_string();
    let mut sub_args = vec!["--connect", addr.as_str(), "--json", &sub_json, "--report-interval", "0"];
    sub_args.extend(sub_extra);
    let sub = Process::start(subscriber_bin(), sub_args);
    let sub = sub.finish(RUN);
    publ.finish(RUN).assert_success();
    assert_eq!(sub.code(), Some(0), "{name}: {sub:?}");
    (json_file(Path::new(&pub_json)), json_file(Path::new(&sub_json)))
}

/// The subscriber took exactly what the publisher sent.
fn assert_exact(publ: &Value, sub: &Value, context: &str) {
    assert_eq!(sub["gaps"], 0, "{context}");
    assert_eq!(sub["duplicates"], 0, "{context}");
    assert_eq!(sub["totals_match"], true, "{context}");
    assert_eq!(sub["messages"], publ["totals"]["messages"], "{context}");
    assert_eq!(sub["frames"], publ["totals"]["frames"], "{context}");
}

#[test]
#[ignore = "long (over 3 s here): .ci/run runs it with --ignored"]
fn every_idle_strategy_relays_the_whole_stream_over_tcp() {
    let (_serial, dir) = alone_in_tempdir();
    for idle in ["spin", "yield", "backoff", "sleep"] {
        let (publ, sub) = relay_tcp(dir.path(), idle, &["--idle", idle], &["--idle", idle]);
        assert_exact(&publ, &sub, idle);
        assert_eq!(publ["totals"]["messages"], 20_000, "{idle}");
    }
}

#[test]
fn the_low_latency_profile_relays_the_whole_stream_over_tcp_and_udp() {
    let (_serial, dir) = alone_in_tempdir();
    let (publ, sub) =
        relay_tcp(dir.path(), "low-latency", &["--profile", "low-latency"], &["--profile", "low-latency"]);
    assert_exact(&publ, &sub, "low-latency over TCP");

    // UDP: the subscriber busy-polls its socket and must still see the END and stop.
    let pub_json = dir.path().join("pub-udp.json").display().to_string();
    let sub_json = dir.path().join("sub-udp.json").display().to_string();
    let port = free_udp_port();
    let listen = format!("127.0.0.1:{port}");
    let mut sub = Process::start(
        subscriber_bin(),
        ["--listen", &listen, "--json", &sub_json, "--report-interval", "0", "--profile", "low-latency"],
    );
    sub.listening_on();
    let mut args: Vec<&str> = STREAM.to_vec();
    args.extend(["--udp", &listen, "--coalesce-bytes", "1400", "--json", &pub_json, "--profile", "low-latency"]);
    Process::start(publisher_bin(), args).finish(RUN).assert_success();
    let sub = sub.finish(RUN);
    assert_eq!(sub.code(), Some(0), "{sub:?}");
    assert!(sub.stderr.contains("SO_BUSY_POLL"), "the socket option is set or its refusal logged: {}", sub.stderr);
    let (publ, sub) = (json_file(Path::new(&pub_json)), json_file(Path::new(&sub_json)));
    assert_exact(&publ, &sub, "low-latency over UDP");
}

/// The CPUs a thread may run on, from /proc/PID/task/TID/status.
fn cpus_allowed(pid: u32, tid: &str) -> String {
    let status = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("Cpus_allowed_list:")).expect("Cpus_allowed_list");
    line.split(':').nth(1).unwrap().trim().to_string()
}

/// The task id of `pid`'s thread named `name`, if it runs.
fn thread_named(pid: u32, name: &str) -> Option<String> {
    std::fs::read_dir(format!("/proc/{pid}/task")).ok()?.flatten().find_map(|task| {
        let comm = std::fs::read_to_string(task.path().join("comm")).ok()?;
        (comm.trim() == name).then(|| task.file_name().to_string_lossy().into_owned())
    })
}

#[test]
fn the_hot_thread_and_the_receive_thread_run_on_their_cores() {
    let _serial = serial();
    // The last CPU this process may use: a core that exists whatever the machine.
    let core = std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .find(|l| l.starts_with("Cpus_allowed_list:"))
        .and_then(|l| l.rsplit([',', '-', ' ', '\t']).next().map(str::to_string))
        .unwrap();
    // The hot thread is pinned before it waits for its first subscriber, which never comes.
    let mut publ = Process::start(
        publisher_bin(),
        words(&format!(
            "run --synthetic --tcp 127.0.0.1:0 --wait-subscribers 1 --profile low-latency --hot-core {core}"
        )),
    );
    publ.wait_for("hot thread pinned");
    let pid = publ.pid();
    let hot = thread_named(pid, "mdrelay-pub-hot").expect("the hot thread runs");
    assert_eq!(cpus_allowed(pid, &hot), core);
    // Only the hot thread: the runtime's threads keep every CPU.
    let main = cpus_allowed(pid, &pid.to_string());
    assert_eq!(main, cpus_allowed(std::process::id(), &std::process::id().to_string()));
    publ.signal(Signal::SIGINT);
    publ.finish(RUN).assert_success();

    let port = free_udp_port();
    let listen = format!("127.0.0.1:{port}");
    let mut sub = Process::start(subscriber_bin(), ["--listen", &listen, "--core", &core, "--idle", "backoff"]);
    sub.listening_on();
    let pid = sub.pid();
    assert_eq!(cpus_allowed(pid, &pid.to_string()), core, "the receive loop runs on the main thread");
    sub.signal(Signal::SIGINT);
    assert_eq!(sub.finish(RUN).code(), Some(0));
}

#[test]
fn the_subscriber_checks_and_prints_its_idle_settings() {
    let sub = |args: &[&str]| Process::start(subscriber_bin(), args.iter().copied()).finish(STEP);
    let out = sub(&["--listen", "127.0.0.1:0", "--profile", "low-latency", "--check"]);
    out.assert_success();
    for wanted in ["profile = \"low-latency\"  # --profile", "idle = \"spin\"  # default"] {
        assert!(out.stdout.contains(wanted), "{wanted}: {}", out.stdout);
    }
    assert!(!out.stdout.contains("hot_core"), "no pinning unless asked for: {}", out.stdout);
    // An explicit strategy overrides the profile's.
    let out = sub(&["--listen", "127.0.0.1:0", "--profile", "low-latency", "--idle", "backoff", "--check"]);
    assert!(out.stdout.contains("idle = \"backoff\"  # --idle"), "{}", out.stdout);
    let out = sub(&["--listen", "127.0.0.1:0", "--check"]);
    assert!(out.stdout.contains("idle = \"sleep\"") && out.stdout.contains("profile = \"default\""), "{}", out.stdout);

    // `--core` is the earlier name of --hot-core.
    let out = sub(&["--listen", "127.0.0.1:0", "--core", "100000", "--check"]);
    assert_eq!(out.code(), Some(2));
    assert!(out.stderr.contains("hot_core (--hot-core): 100000 is not a CPU"), "{}", out.stderr);
    let out = sub(&["--listen", "127.0.0.1:0", "--idle", "fast"]);
    assert_eq!(out.code(), Some(2), "{out:?}");
    assert!(out.stderr.contains("--idle"), "{}", out.stderr);

    let dir = tempfile::tempdir().unwrap();
    for (text, named) in [
        ("listen = \"127.0.0.1:0\"\nidle = \"fast\"\n", "idle"),
        ("listen = \"127.0.0.1:0\"\nprofile = \"quick\"\n", "profile"),
        (
            "listen = \"127.0.0.1:0\"\ncore = 100000\n",
            "sub.toml, line 2, under its earlier name core (now hot_core)): 100000",
        ),
    ] {
        let file = dir.path().join("sub.toml");
        std::fs::write(&file, text).unwrap();
        let out = sub(&["--config", file.to_str().unwrap(), "--check"]);
        assert_eq!(out.code(), Some(2), "{text}");
        assert!(out.stderr.contains(named), "{text}: {}", out.stderr);
    }
}
