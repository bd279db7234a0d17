//! The relay across emulated hosts: `mdrelay-pub` on host `pub`, `mdrelay-sub` on `sub1` and
//! `sub2`, each in a network namespace of `deploy/netns-hosts.sh`, so datagrams and connections
//! cross veth pairs and bridges instead of loopback. DEEP10 from ../shared reaches both
//! subscribers at once over TCP in every format, and over UDP unicast and multicast in half the
//! formats each (every format crosses the hosts in datagrams once); round trips are
//! measured across hosts; loss injected with nftables must equal the subscriber's gap count; the
//! script refuses bad input and leaves nothing behind; and the README's two-host steps run as
//! written.
//!
//! These tests need root and nftables (CI runs as root; the script installs nftables when it is
//! missing). Each builds a network of its own under a unique prefix, taken down when the test
//! ends however it ends, and holds `serial()`: two cores carry the publisher, two subscribers
//! and the kernel's forwarding between namespaces, and paced UDP streams must not starve each
//! other.
//!
//! Nothing here may lose a datagram the test did not drop on purpose. The veth pairs and bridges
//! drop only when a receiver falls a whole socket buffer behind (16 MiB, granted to root) or the
//! kernel's per-CPU backlog (1,000 packets) overflows; the streams are paced far below either:
//! 150,000 msg/s coalesced into 8 KiB datagrams is about 750 datagrams a second (six 1,500-byte
//! fragments each), and the loss test's single frames at 100,000 msg/s are 31,000 small
//! datagrams a second, each handled in microseconds.

use crate::common::{alone_on_emulated_hosts, deep10, path, report as sub_report};
use mdrelay_harness::cli_args::words;
use mdrelay_harness::netns::{self, Host, Hosts, Line, run_script, unique_prefix};
use mdrelay_harness::{
    Process, STEP, assert_aggregates, expected, formats, json_file, publisher_bin, serial, subscriber_bin,
};
use serde_json::{Value, json};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// The longest a relay of DEEP10 may take (under 5 s paced; far longer only if something hangs).
const RUN: Duration = Duration::from_secs(120);

/// The multicast group of these tests: from the range the script routes over line A. A fixed
/// port works (every host has its own), and both subscribers must listen on the one port the
/// publisher sends to.
const GROUP: &str = "239.255.0.1:9300";

/// The project root, where the README and `config/` are.
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Waits for `subscriber` to end and asserts its report `json` is the whole stream (see
/// [`assert_whole_stream`]); returns the report.
fn finished_whole(
    subscriber: Process,
    json: &str,
    publ: &Value,
    reference: &Value,
    format: &str,
    context: &str,
) -> Value {
    let sub = sub_report(&subscriber.finish(STEP), json, context);
    assert_whole_stream(&sub, publ, reference, format, context);
    sub
}

/// Asserts a subscriber got all of DEEP10 from the publisher whose summary is `publ`: the
/// reference aggregates, every message and frame, nothing missing or repeated.
fn assert_whole_stream(sub: &Value, publ: &Value, reference: &Value, format: &str, context: &str) {
    assert_eq!(publ["totals"]["messages"], reference["messages"], "{context}: the publisher sent every message");
    assert_eq!(sub["formats_seen"], json!([format]), "{context}: the format comes from the publisher");
    assert_eq!(sub["gaps"], 0, "{context}: no frame missing");
    assert_eq!(sub["frames"], publ["totals"]["frames"], "{context}: every frame sent arrived");
    assert_eq!(sub["duplicates"], 0, "{context}");
    assert_eq!(sub["decode_errors"], 0, "{context}");
    assert_aggregates(sub, reference, context);
    assert_eq!(sub["messages"], reference["messages"], "{context}: every message arrives");
    assert_eq!(sub["message_types"], reference["message_types"], "{context}");
    assert_eq!(sub["totals_match"], true, "{context}: the subscriber's counts equal the publisher's totals");
    assert_eq!(sub["stop_reason"], "end", "{context}");
}

/// The two subscriber hosts, and the line each one's traffic takes in the unicast tests: line B
/// for `sub2`, so both lines carry the relay.
const SUBSCRIBERS: [(Host, Line); 2] = [(Host::Sub1, Line::A), (Host::Sub2, Line::B)];

#[test]
#[ignore = "long (over 3 s here): .ci/run runs it with --ignored"]
fn deep10_reaches_two_hosts_at_once_over_tcp_in_every_format() {
    let (_serial, hosts, dir) = alone_on_emulated_hosts();
    let reference = expected("DEEP10.json");
    let deep10 = deep10();
    for format in formats() {
        let f = format.name();
        let pub_json = path(dir.path(), &format!("pub-{f}.json"));
        // On every address of the host: sub1 connects over line A, sub2 over line B.
        let mut publisher = hosts.start(
            Host::Pub,
            publisher_bin(),
            words(&format!(
                "run --capture {deep10} --format {f} --tcp 0.0.0.0:0 --wait-subscribers 2 --slow-subscriber block \
                --json {pub_json}"
            )),
        );
        let port = publisher.serving_on().port();
        let subscribers: Vec<(Process, String, Host)> = SUBSCRIBERS
            .iter()
            .map(|&(host, line)| {
                let json = path(dir.path(), &format!("{}-{f}.json", host.name()));
                let addr = SocketAddr::from((Host::Pub.addr(line), port)).to_string();
                let args = ["--connect", &addr, "--json", &json, "--report-interval", "0"];
                (hosts.start(host, subscriber_bin(), args), json, host)
            })
            .collect();
        publisher.finish(RUN).assert_success();
        let publ = json_file(Path::new(&pub_json));
        for (subscriber, json, host) in subscribers {
            let context = format!("{f} over TCP to {}", host.name());
            let sub = finished_whole(subscriber, &json, &publ, &reference, f, &context);
            assert_eq!(sub["reconnects"], 0, "{context}");
        }
    }
}

/// DEEP10 over UDP to `sub1` and `sub2` at once: unicast (`sub1` on line A, `sub2` on line B)
/// or multicast (both on line A); asserts both get the whole stream. Unicast takes every other
/// format and multicast the rest: the formats' encodings are checked on loopback in every
/// transport (tests/it/relay.rs), and each paced run here costs seconds.
fn deep10_over_udp_to_both(multicast: bool) {
    let (_serial, hosts, dir) = alone_on_emulated_hosts();
    let reference = expected("DEEP10.json");
    let deep10 = deep10();
    let transport = if multicast { "multicast" } else { "UDP" };
    let all = formats();
    // A single format (MDRELAY_FORMATS narrowed to one) goes over both.
    let half = all.len() > 1 && multicast;
    for format in all.into_iter().skip(usize::from(half)).step_by(2) {
        let f = format.name();
        let mut subscribers = Vec::new();
        let mut destinations = Vec::new();
        for (host, line) in SUBSCRIBERS {
            let json = path(dir.path(), &format!("{}-{f}.json", host.name()));
            let mut args = vec!["--json".to_string(), json.clone(), "--report-interval".into(), "0".into()];
            if multicast {
                args.extend(["--group".into(), GROUP.into(), "--interface".into(), host.addr(Line::A).to_string()]);
            } else {
                args.extend(["--listen".into(), format!("{}:0", host.addr(line))]);
            }
            let mut subscriber = hosts.start(host, subscriber_bin(), &args);
            // Bound (and joined): nothing sent from now on is lost to a socket not there yet.
            let addr = subscriber.listening_on();
            destinations.push(addr.to_string());
            subscribers.push((subscriber, json, host));
        }
        let pub_json = path(dir.path(), &format!("pub-{f}.json"));
        let mut args: Vec<String> =
            ["run", "--capture", &deep10, "--format", f, "--json", &pub_json].map(String::from).into();
        if multicast {
            let interface = Host::Pub.addr(Line::A).to_string();
            args.extend(["--multicast", GROUP, "--interface", &interface, "--ttl", "1"].map(String::from));
        } else {
            for d in &destinations {
                args.extend(["--udp".to_string(), d.clone()]);
            }
        }
        // The pacing and datagram size of the loopback relay tests (see the module comment).
        args.extend(["--pacing", "rate", "--rate", "150000", "--coalesce-bytes", "8192"].map(String::from));
        hosts.start(Host::Pub, publisher_bin(), &args).finish(RUN).assert_success();
        let publ = json_file(Path::new(&pub_json));
        for (subscriber, json, host) in subscribers {
            let context = format!("{f} over {transport} to {}", host.name());
            let sub = finished_whole(subscriber, &json, &publ, &reference, f, &context);
            assert_eq!(sub["unconfirmed_datagrams"], 0, "{context}");
        }
    }
}

#[test]
#[ignore = "long (over 3 s here): .ci/run runs it with --ignored"]
fn deep10_reaches_two_hosts_at_once_over_udp_unicast_in_half_the_formats() {
    deep10_over_udp_to_both(false);
}

#[test]
#[ignore = "long (over 3 s here): .ci/run runs it with --ignored"]
fn deep10_reaches_two_hosts_at_once_over_multicast_in_the_other_half() {
    deep10_over_udp_to_both(true);
}

#[test]
#[ignore = "long (over 3 s here): .ci/run runs it with --ignored"]
fn round_trips_are_measured_across_hosts_over_tcp_and_udp() {
    let (_serial, hosts, dir) = alone_on_emulated_hosts();
    // TCP from sub1 over line A, UDP to sub2 over line B: its echoes go back over line B too.
    for (transport, host, line) in [("tcp", Host::Sub1, Line::A), ("udp", Host::Sub2, Line::B)] {
        let pub_json = path(dir.path(), &format!("pub-{transport}.json"));
        let sub_json = path(dir.path(), &format!("sub-{transport}.json"));
        // 30,000 messages at 50,000 msg/s: a few thousand small datagrams a second each way.
        let mut p: Vec<String> = ["run", "--synthetic", "--messages", "30000", "--symbols", "20", "--format", "capnp"]
            .map(String::from)
            .into();
        p.extend(["--pacing", "rate", "--rate", "50000", "--json", &pub_json].map(String::from));
        let mut s: Vec<String> =
            ["--latency", "round-trip", "--echo-every", "10", "--report-interval", "0", "--json", &sub_json]
                .map(String::from)
                .into();
        let (publisher, subscriber) = if transport == "tcp" {
            let listen = format!("{}:0", Host::Pub.addr(line));
            p.extend(["--tcp".to_string(), listen, "--wait-subscribers".into(), "1".into()]);
            let mut publisher = hosts.start(Host::Pub, publisher_bin(), &p);
            let addr = publisher.serving_on();
            assert_eq!(addr.ip(), Host::Pub.addr(line));
            s.extend(["--connect".to_string(), addr.to_string()]);
            (publisher, hosts.start(host, subscriber_bin(), &s))
        } else {
            s.extend(["--listen".to_string(), format!("{}:0", host.addr(line))]);
            let mut subscriber = hosts.start(host, subscriber_bin(), &s);
            let addr = subscriber.listening_on();
            p.extend(["--udp".to_string(), addr.to_string()]);
            (hosts.start(Host::Pub, publisher_bin(), &p), subscriber)
        };
        publisher.finish(RUN).assert_success();
        let report = sub_report(&subscriber.finish(STEP), &sub_json, transport);
        let publ = json_file(Path::new(&pub_json));
        let rtt = &publ["round_trip_ns"];
        let echoes = rtt["count"].as_u64().unwrap_or_else(|| panic!("{transport}: no round trip count: {publ}"));
        let frames = report["frames"].as_u64().unwrap();
        assert!(frames > 1000, "{transport}: {report}");
        assert!(echoes > 0, "{transport}: no round trip checked: {publ}");
        // Every echo the subscriber sent was checked by the publisher: one per ten frames.
        assert_eq!(echoes, report["echoes_sent"].as_u64().unwrap(), "{transport}: {publ}");
        assert!(echoes.abs_diff(frames / 10) <= 1, "{transport}: {echoes} echoes for {frames} frames");
        for percentile in ["p50", "p90", "p99", "p999", "p9999", "max"] {
            let ns = rtt[percentile].as_u64().unwrap_or_else(|| panic!("{transport}: no {percentile}: {rtt}"));
            assert!(ns > 0 && ns < 10_000_000_000, "{transport}: a plausible round trip, {percentile} {ns} ns");
        }
        assert_eq!(publ["echoes_rejected"], 0, "{transport}: {publ}");
    }
}

#[test]
#[ignore = "long (over 3 s here): .ci/run runs it with --ignored"]
fn five_percent_loss_on_sub1_is_reported_as_exactly_the_datagrams_nftables_dropped() {
    let (_serial, hosts, dir) = alone_on_emulated_hosts();
    let reference = expected("DEEP10.json");
    hosts.loss(Host::Sub1, 5, Line::A);
    let mut subscribers = Vec::new();
    for host in [Host::Sub1, Host::Sub2] {
        let json = path(dir.path(), &format!("{}.json", host.name()));
        let interface = host.addr(Line::A).to_string();
        let args = ["--group", GROUP, "--interface", &interface, "--json", &json, "--report-interval", "0"];
        let mut subscriber = hosts.start(host, subscriber_bin(), args);
        subscriber.listening_on();
        subscribers.push((subscriber, json));
    }
    let pub_json = path(dir.path(), "pub.json");
    let deep10 = deep10();
    let interface = Host::Pub.addr(Line::A).to_string();
    // One frame per datagram (coalescing off, also the default): each datagram dropped is one
    // frame missing.
    let p = ["run", "--capture", &deep10, "--format", "sbe", "--coalesce-bytes", "0", "--json", &pub_json];
    let m = ["--multicast", GROUP, "--interface", &interface, "--ttl", "1", "--pacing", "rate", "--rate", "100000"];
    hosts.start(Host::Pub, publisher_bin(), p.iter().chain(&m)).finish(RUN).assert_success();
    let publ = json_file(Path::new(&pub_json));
    let sent = publ["totals"]["frames"].as_u64().unwrap();
    let mut reports = subscribers.into_iter().map(|(s, json)| sub_report(&s.finish(STEP), &json, "subscriber"));
    let (lossy, clean) = (reports.next().unwrap(), reports.next().unwrap());

    let (drops_a, drops_b) = hosts.counter(Host::Sub1);
    let dropped = hosts.dropped(Host::Sub1, Line::A);
    assert_eq!(drops_b, 0, "no loss rule on line B");
    assert_eq!(dropped.len() as u64, drops_a, "one recorded sequence per datagram dropped");
    // About 5 %: binomial over 121,000 frames, far inside these bounds unless the rule is wrong.
    assert!(drops_a > sent * 3 / 100 && drops_a < sent * 7 / 100, "{drops_a} of {sent} frames dropped");
    assert!(dropped.iter().all(|&seq| (1..=sent).contains(&seq)), "sequences of this stream: {dropped:?}");
    assert_eq!(missed(&lossy), drops_a, "sub1 reports exactly the frames nftables dropped: {lossy}");
    if let Some(first) = lossy["late_join_sequence"].as_u64() {
        assert_eq!(
            dropped[..first as usize - 1],
            (1..first).collect::<Vec<u64>>(),
            "what came before sub1's first frame"
        );
    }
    assert_eq!(lossy["frames"].as_u64().unwrap() + drops_a, sent, "frames received + dropped = sent");
    for zero in ["duplicates", "reordered", "decode_errors", "unconfirmed_datagrams"] {
        assert_eq!(lossy[zero], 0, "{zero}: {lossy}");
    }
    assert_eq!(lossy["totals_match"], false, "frames were lost");
    assert_eq!(lossy["stop_reason"], "end", "END datagrams are never dropped");

    assert_eq!(hosts.counter(Host::Sub2), (0, 0));
    assert_whole_stream(&clean, &publ, &reference, "sbe", "sub2, without loss");
    // Removing the rule zeroes the record.
    hosts.loss(Host::Sub1, 0, Line::A);
    assert_eq!(hosts.counter(Host::Sub1), (0, 0));
    assert!(hosts.dropped(Host::Sub1, Line::A).is_empty());
}

/// The frames a UDP subscriber reports missing: its gaps, and those before the first frame it
/// saw when that was not the stream's first. A subscriber whose first datagrams were lost cannot
/// know they were sent, so it reports joining late, at the first it received (`late_join_sequence`;
/// the publisher numbers frames from 1).
fn missed(report: &Value) -> u64 {
    let gaps = report["gaps"].as_u64().unwrap_or_else(|| panic!("no gaps in {report}"));
    gaps + report["late_join_sequence"].as_u64().map_or(0, |first| first - 1)
}

/// The namespaces whose names start with `prefix-`.
fn namespaces_of(prefix: &str) -> Vec<String> {
    let mut names: Vec<String> =
        netns::namespaces().into_iter().filter(|n| n.starts_with(&format!("{prefix}-"))).collect();
    names.sort();
    names
}

/// Runs the script for `prefix`, expecting it to refuse with `message` in its output.
fn refused(prefix: &str, args: &[&str], message: &str) {
    let (code, stdout, stderr) = run_script(prefix, args, STEP);
    assert!(matches!(code, Some(c) if c != 0), "{args:?} should fail: {code:?}\n{stdout}\n{stderr}");
    assert!(stderr.contains(message), "{args:?}: the message should say {message:?}:\n{stderr}");
}

#[test]
#[ignore = "long (over 3 s here): .ci/run runs it with --ignored"]
fn the_script_refuses_bad_input_and_down_leaves_no_namespace_behind() {
    let _serial = serial();
    let prefix = unique_prefix();
    refused(&prefix, &["loss", "sub3", "5"], "unknown host \"sub3\"");
    refused(&prefix, &["loss", "sub1", "101"], "\"101\" is not a whole percentage");
    refused(&prefix, &["loss", "sub1", "-5"], "\"-5\" is not a whole percentage");
    refused(&prefix, &["loss", "sub1", "5", "c"], "unknown line \"c\"");
    refused(&prefix, &["exec", "laptop", "true"], "unknown host \"laptop\"");
    refused(&prefix, &["link", "sub1", "a", "sideways"], "neither up nor down");
    refused(&prefix, &["launch"], "unknown command");
    refused(&prefix, &[], "usage:");
    refused("Bad-Prefix", &["up"], "MDR_NETNS_PREFIX");
    refused("toolong", &["up"], "1 to 6 characters");
    // A command on a network that is not up says so.
    refused(&prefix, &["counter", "sub1"], "run \"netns-hosts.sh up\" first");

    // A failure midway through `up` (nft failing, here) removes what it had made.
    let fake = tempfile::tempdir().unwrap();
    std::fs::write(fake.path().join("nft"), "#!/bin/sh\necho nft: simulated failure >&2\nexit 1\n").unwrap();
    Command::new("chmod").arg("+x").arg(fake.path().join("nft")).status().unwrap();
    let mut up = Command::new("bash");
    let path = format!("{}:{}", fake.path().display(), std::env::var("PATH").unwrap_or_default());
    up.arg(netns::script()).arg("up").env("MDR_NETNS_PREFIX", &prefix).env("PATH", path);
    let failed = Process::spawn_command("netns-hosts.sh", up).unwrap().finish(STEP);
    assert_ne!(failed.code(), Some(0), "{failed:?}");
    assert!(failed.stderr.contains("up failed; removed what it had made"), "{failed:?}");
    assert_eq!(namespaces_of(&prefix), Vec::<String>::new(), "a failed up leaves nothing");

    let hosts = Hosts::up(&prefix);
    let all = ["net", "pub", "sub1", "sub2"].map(|h| format!("{prefix}-{h}")).to_vec();
    assert_eq!(namespaces_of(&prefix), all);
    // `up` on a network that exists rebuilds it.
    hosts.script_ok(&["up"], STEP);
    assert_eq!(namespaces_of(&prefix), all);
    // Pulling a cable, and plugging it back in with the multicast route restored.
    hosts.link(Host::Sub1, Line::A, false);
    assert!(hosts.script_ok(&["status"], STEP).contains("a0 198.18.0.2 DOWN"));
    hosts.link(Host::Sub1, Line::A, true);
    let status = hosts.script_ok(&["status"], STEP);
    assert!(status.contains("a0 198.18.0.2 UP") && !status.contains("DOWN"), "{status}");
    let routes = hosts.command(Host::Sub1, "ip").arg("route").output().unwrap();
    assert!(String::from_utf8_lossy(&routes.stdout).contains("239.255.0.0/16 dev a0"), "{routes:?}");
    hosts.loss(Host::Sub2, 100, Line::B);
    assert!(hosts.script_ok(&["status"], STEP).contains("b0 198.18.1.3 UP loss 100%"));

    drop(hosts);
    assert_eq!(namespaces_of(&prefix), Vec::<String>::new(), "down leaves no namespace behind");
    // And a second `down` has nothing to do, successfully.
    let (code, stdout, stderr) = run_script(&prefix, &["down"], STEP);
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");
    assert_eq!(namespaces_of(&prefix), Vec::<String>::new());
}

/// The commands of the README's two-host steps (inside the `two-hosts-steps` markers), one per
/// line of their code blocks, in order.
fn readme_steps() -> Vec<String> {
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let begin = readme.find("<!-- two-hosts-steps:begin -->").expect("the README marks its two-host steps");
    let end = readme[begin..].find("<!-- two-hosts-steps:end -->").expect("the steps' end marker") + begin;
    let mut in_code = false;
    let mut commands = Vec::new();
    for line in readme[begin..end].lines() {
        let line = line.trim();
        if line.starts_with("```") {
            in_code = !in_code;
        } else if in_code && !line.is_empty() {
            commands.push(line.to_string());
        }
    }
    commands
}

/// The output of the first step starting with `command`.
fn output_of_step(outputs: &[(String, String)], command: &str) -> String {
    outputs
        .iter()
        .find(|(s, _)| s.starts_with(command))
        .map(|(_, o)| o.clone())
        .unwrap_or_else(|| panic!("no step runs {command:?}: {:?}", outputs.iter().map(|(s, _)| s).collect::<Vec<_>>()))
}

/// Takes the network of `prefix` down when dropped: the README's steps bring it up themselves,
/// and a failing test must not leave it behind.
struct Down(String);

impl Drop for Down {
    fn drop(&mut self) {
        let (code, stdout, stderr) = run_script(&self.0, &["down"], STEP);
        if code != Some(0) {
            eprintln!("netns-hosts.sh down (prefix {}): {code:?}\n{stdout}\n{stderr}", self.0);
        }
    }
}

/// Runs one README command with bash in `work`, on the network `prefix`.
fn readme_command(work: &Path, prefix: &str, command: &str) -> Process {
    let mut bash = Command::new("bash");
    bash.args(["-c", command]).current_dir(work).env("MDR_NETNS_PREFIX", prefix);
    Process::spawn_command(command, bash).unwrap_or_else(|e| panic!("{command}: {e}"))
}

#[test]
#[ignore = "long (over 3 s here): .ci/run runs it with --ignored"]
fn the_readme_two_host_steps_run_as_written() {
    let _serial = serial();
    let steps = readme_steps();
    assert!(steps.len() >= 8, "the README's steps: {steps:?}");
    assert!(steps.first().is_some_and(|s| s == "deploy/netns-hosts.sh up"), "{steps:?}");
    assert!(steps.last().is_some_and(|s| s == "deploy/netns-hosts.sh down"), "{steps:?}");
    // A project tree of its own, so the reports the steps write land in a temporary directory:
    // the scripts and configurations are the project's, the binaries this build's, at the paths
    // the README names. The README's text runs unchanged.
    let work = tempfile::tempdir().unwrap();
    let release = work.path().join("target/release");
    std::fs::create_dir_all(&release).unwrap();
    for (name, target) in [
        ("deploy", root().join("deploy")),
        ("config", root().join("config")),
        ("target/release/mdrelay-pub", publisher_bin()),
        ("target/release/mdrelay-sub", subscriber_bin()),
    ] {
        std::os::unix::fs::symlink(target, work.path().join(name)).unwrap();
    }
    // Its own network, not the default `mdr` someone may be using.
    let prefix = unique_prefix();
    let _down = Down(prefix.clone());

    // Programs run in their own terminal, in the background: each is waited for until it is
    // ready, and every other command first waits for them to end, as a person reading their
    // output would.
    let mut running: Vec<(String, Process)> = Vec::new();
    let mut outputs: Vec<(String, String)> = Vec::new();
    for step in &steps {
        if step.contains("target/release/mdrelay-") {
            let mut program = readme_command(work.path(), &prefix, step);
            program
                .try_wait_until("a readiness line", STEP, |l| {
                    l.contains("serving subscribers over TCP") || l.contains("listening on ") || l.contains("connected")
                })
                .unwrap_or_else(|f| panic!("{step}: {f}"));
            running.push((step.clone(), program));
            continue;
        }
        if step.contains("/metrics") {
            // A look at a running program's metrics: it runs beside them, as from a third terminal.
            let done = readme_command(work.path(), &prefix, step).finish(STEP);
            assert_eq!(done.code(), Some(0), "{step}: {done:?}");
            outputs.push((step.clone(), done.stdout));
            continue;
        }
        for (command, program) in running.drain(..) {
            let done = program.finish(RUN);
            // The subscriber under loss ends with the END and frames missing: 5, as the README
            // says (stream incomplete).
            let status = if command.contains("sub-loss.json") { 5 } else { 0 };
            assert_eq!(done.code(), Some(status), "{command}: {done:?}");
        }
        let done = readme_command(work.path(), &prefix, step).finish(Duration::from_secs(300));
        assert_eq!(done.code(), Some(0), "{step}: {done:?}");
        outputs.push((step.clone(), done.stdout));
    }
    assert!(running.is_empty(), "the steps end with a command that waits for the programs: {steps:?}");
    assert_eq!(namespaces_of(&prefix), Vec::<String>::new(), "the steps' `down` leaves nothing");

    // The metrics, scraped over HTTP from another host while the TCP run went on.
    let metrics = output_of_step(&outputs, "deploy/netns-hosts.sh exec sub1 curl");
    for series in ["mdrelay_pub_subscribers", "mdrelay_pub_frames_sent_total{format=\"capnp\",transport=\"tcp\"}"] {
        assert!(metrics.lines().any(|l| l.starts_with(series)), "{series} in:\n{metrics}");
    }
    // The TCP run: the whole synthetic day, and round trips (the configuration asks for them).
    let tcp = json_file(&work.path().join("sub-two-host.json"));
    assert_eq!(tcp["totals_match"], true, "{tcp}");
    assert_eq!(tcp["gaps"], 0, "{tcp}");
    assert!(tcp["echoes_sent"].as_u64().is_some_and(|n| n > 0), "{tcp}");
    // The multicast run under 5 % loss: the gaps are what the loss rule dropped.
    let lossy = json_file(&work.path().join("sub-loss.json"));
    // The output of the `nth` step (from 0) starting with `command`.
    let output_of = |command: &str, nth: usize| {
        outputs
            .iter()
            .filter(|(s, _)| s.starts_with(command))
            .nth(nth)
            .map(|(_, o)| o.clone())
            .unwrap_or_else(|| panic!("the steps run {command:?} {} times: {steps:?}", nth + 1))
    };
    let drops_of = |counter: String| -> u64 {
        counter
            .trim()
            .strip_prefix("a=")
            .and_then(|rest| rest.strip_suffix(" b=0"))
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("counter prints a=N b=0: {counter:?}"))
    };
    let drops = drops_of(output_of("deploy/netns-hosts.sh counter sub1", 0));
    assert!(drops > 0, "5 % of the day's datagrams were dropped");
    assert_eq!(missed(&lossy), drops, "{lossy}");
    assert_eq!(output_of("deploy/netns-hosts.sh dropped sub1 a", 0).lines().count() as u64, drops);
    // The multicast run with recovery: every frame dropped came back, and the day is whole.
    let recovered = json_file(&work.path().join("sub-recovered.json"));
    let drops = drops_of(output_of("deploy/netns-hosts.sh counter sub1", 1));
    assert!(drops > 0, "5 % of the day's datagrams were dropped again");
    assert_eq!(recovered["recovery"]["frames_recovered"].as_u64(), Some(drops), "{recovered}");
    assert_eq!((&recovered["gaps"], &recovered["totals_match"]), (&json!(0), &json!(true)), "{recovered}");
}
