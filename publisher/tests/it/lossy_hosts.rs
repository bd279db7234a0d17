//! Loss recovery across emulated hosts (`deploy/netns-hosts.sh`): nftables drops relay data
//! datagrams at random on a subscriber host's line and records the sequence of each one it
//! drops; the subscriber must recover exactly those (retransmission), or take them from the
//! other line (A/B arbitration), and a TCP subscriber cut off mid-stream must resume without a
//! gap. Expected counts come from the kernel's records of what it dropped, and aggregates from
//! the independent reference output of DEEP10, never from the programs under test.
//!
//! Every test builds its own network under a unique prefix (taken down however the test ends),
//! holds `serial()`, and bounds each process's run. Needs root and nftables, as CI has.

use crate::common::{alone_on_emulated_hosts, deep10, n, path, report};
use mdrelay_harness::cli_args::{PACED_100K, words};
use mdrelay_harness::netns::{Host, Hosts, Line};
use mdrelay_harness::{Process, STEP, assert_aggregates, expected, json_file, publisher_bin, serial, subscriber_bin};
use serde_json::Value;
use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

/// The longest one relay of DEEP10 may take.
const RUN: Duration = Duration::from_secs(180);
/// Line A's group (routed over `a0`) and line B's (sent and joined on `b0` by address).
const GROUP_A: &str = "239.255.0.1:9300";
const GROUP_B: &str = "239.255.1.1:9300";
/// The retransmission service, on the publisher host.
const SERVICE: &str = "198.18.0.1:9101";

fn ip(host: Host, line: Line) -> String {
    host.addr(line).to_string()
}

/// Starts a multicast subscriber on `host` with `extra` flags, and waits until it listens.
fn subscriber(hosts: &Hosts, host: Host, json: &str, extra: &[&str]) -> Process {
    let interface = ip(host, Line::A);
    let args = ["--group", GROUP_A, "--interface", &interface, "--json", json, "--report-interval", "0"];
    let mut s = hosts.start(host, subscriber_bin(), args.iter().chain(extra));
    s.listening_on();
    s
}

/// Runs the publisher on `pub` to its end: DEEP10 in `format`, one frame per datagram (each
/// datagram dropped is one frame missing), paced, on line A (and B with `extra`); its summary.
fn publish(hosts: &Hosts, dir: &Path, format: &str, extra: &[&str]) -> Value {
    let json = path(dir, "pub.json");
    let deep10 = deep10();
    let interface = ip(Host::Pub, Line::A);
    let args = format!(
        "run --capture {deep10} --format {format} --coalesce-bytes 0 --multicast {GROUP_A} --interface \
         {interface} {PACED_100K} --json {json}"
    );
    hosts.start(Host::Pub, publisher_bin(), words(&args).iter().chain(extra)).finish(RUN).assert_success();
    json_file(Path::new(&json))
}

/// The recovery figures of a subscriber's report.
fn recovery(report: &Value) -> &Value {
    let r = &report["recovery"];
    assert!(r.is_object(), "no recovery figures in {report}");
    r
}

/// Asserts a subscriber ended with all of DEEP10: the reference aggregates and every frame.
fn assert_exact(sub: &Value, publ: &Value, context: &str) {
    let reference = expected("DEEP10.json");
    assert_aggregates(sub, &reference, context);
    assert_eq!(sub["messages"], reference["messages"], "{context}");
    assert_eq!(sub["frames"], publ["totals"]["frames"], "{context}: every frame, each once");
    assert_eq!(sub["gaps"], 0, "{context}: nothing left missing");
    assert_eq!(sub["duplicates"], 0, "{context}");
    assert_eq!(sub["totals_match"], true, "{context}");
    assert_eq!(sub["stop_reason"], "end", "{context}");
}

#[test]
#[ignore = "long (over 3 s here): .ci/run runs it with --ignored"]
fn five_percent_loss_is_recovered_exactly_by_retransmission() {
    let (_serial, hosts, dir) = alone_on_emulated_hosts();
    hosts.loss(Host::Sub1, 5, Line::A);
    let json = path(dir.path(), "sub1.json");
    // From the start: should the stream's first datagram be the one dropped, the subscriber
    // still knows frame 1 was owed and asks for it.
    let sub = subscriber(&hosts, Host::Sub1, &json, &["--recovery", SERVICE, "--from-start"]);
    let publ = publish(&hosts, dir.path(), "capnp", &["--retransmit-listen", SERVICE]);
    let sub = report(&sub.finish(STEP), &json, "sub1 with recovery");
    let (drops, _) = hosts.counter(Host::Sub1);
    let dropped = hosts.dropped(Host::Sub1, Line::A);
    let sent = n(&publ["totals"], "frames");
    assert_eq!(dropped.len() as u64, drops);
    assert!(drops > sent * 3 / 100 && drops < sent * 7 / 100, "{drops} of {sent} dropped");
    let r = recovery(&sub);
    assert_eq!(n(r, "frames_missing"), drops, "every frame nftables dropped was found missing: {r}");
    assert_eq!(n(r, "frames_recovered"), drops, "and recovered: {r}");
    assert_eq!((n(r, "frames_unrecoverable"), n(r, "frames_filled_late")), (0, 0), "{r}");
    assert!(n(r["latency_ns"].as_object().map(|_| &r["latency_ns"]).unwrap(), "count") == drops, "{r}");
    assert_exact(&sub, &publ, "5 % loss, recovered");
    let service = &publ["retransmit"];
    assert_eq!(n(service, "frames_sent"), drops, "the publisher retransmitted exactly those: {service}");
}

#[test]
#[ignore = "long (over 3 s here): .ci/run runs it with --ignored"]
fn frames_gone_from_the_ring_are_reported_unrecoverable() {
    let (_serial, hosts, dir) = alone_on_emulated_hosts();
    hosts.loss(Host::Sub1, 5, Line::A);
    let json = path(dir.path(), "sub1.json");
    // A ring of 64 KiB holds a few hundred frames, about 15 ms of this stream; the subscriber
    // waits 300 ms before asking, by when every gap but the tail's has left it (and none has
    // left the subscriber's window of 65,536 frames, which would make it unrecoverable without
    // asking). The retry is long: a request is asked again when its answer has not come within
    // the retry, and on a loaded host a service answering thousands of small requests can take
    // longer than the default 50 ms, so the same gaps would be asked (and said gone) again.
    let sub = subscriber(
        &hosts,
        Host::Sub1,
        &json,
        &["--recovery", SERVICE, "--recovery-delay-ms", "300", "--recovery-retry-ms", "2000", "--recovery-linger", "5"],
    );
    let publ = publish(
        &hosts,
        dir.path(),
        "sbe",
        &["--retransmit-listen", SERVICE, "--ring-bytes", "65536", "--retransmit-linger", "5"],
    );
    let sub = report(&sub.finish(STEP), &json, "sub1 with a tiny ring");
    let dropped: BTreeSet<u64> = hosts.dropped(Host::Sub1, Line::A).into_iter().collect();
    let first_seen = sub["late_join_sequence"].as_u64().unwrap_or(1);
    let owed = dropped.iter().filter(|&&s| s >= first_seen).count() as u64;
    let r = recovery(&sub);
    let service = &publ["retransmit"];
    assert!(n(r, "frames_unrecoverable") > owed / 2, "most gaps had left the ring: {r}");
    assert_eq!(n(r, "frames_recovered") + n(r, "frames_unrecoverable"), owed, "{r}");
    assert_eq!(n(&sub, "gaps"), n(r, "frames_unrecoverable"), "the stream's loss is what could not be recovered");
    // Every GONE the publisher sent was taken, whatever the timing: the two count the same
    // answers.
    assert_eq!(n(service, "frames_gone"), n(r, "gone_frames"), "{service}, {r}");
    assert_eq!(
        n(service, "frames_gone"),
        n(r, "frames_unrecoverable"),
        "each said gone by the publisher: {service}, {r}"
    );
    assert_eq!(n(service, "frames_sent"), n(r, "frames_recovered"), "{service}");
}

/// DEEP10 on lines A and B to sub1, with 5 % loss on each line drawn independently.
fn ab_run(recover: bool) -> (Value, Value, BTreeSet<u64>, BTreeSet<u64>) {
    let hosts = Hosts::unique();
    let dir = tempfile::tempdir().unwrap();
    hosts.loss(Host::Sub1, 5, Line::A);
    hosts.loss(Host::Sub1, 5, Line::B);
    let json = path(dir.path(), "sub1.json");
    let interface_b = ip(Host::Sub1, Line::B);
    let mut extra = vec!["--group-b", GROUP_B, "--interface-b", &interface_b, "--from-start"];
    if recover {
        extra.extend(["--recovery", SERVICE]);
    }
    let sub = subscriber(&hosts, Host::Sub1, &json, &extra);
    let pub_b = ip(Host::Pub, Line::B);
    let mut p = vec!["--multicast-b", GROUP_B, "--interface-b", &pub_b];
    if recover {
        p.extend(["--retransmit-listen", SERVICE]);
    }
    let publ = publish(&hosts, dir.path(), "flatbuffers", &p);
    let sub = report(&sub.finish(STEP), &json, "sub1 on two lines");
    let a: BTreeSet<u64> = hosts.dropped(Host::Sub1, Line::A).into_iter().collect();
    let b: BTreeSet<u64> = hosts.dropped(Host::Sub1, Line::B).into_iter().collect();
    assert_eq!(hosts.counter(Host::Sub1), (a.len() as u64, b.len() as u64));
    (sub, publ, a, b)
}

#[test]
#[ignore = "long (over 3 s here): .ci/run runs it with --ignored"]
fn ab_lines_lose_only_what_both_lines_lost_and_recovery_fills_that() {
    let _serial = serial();
    // Arbitration alone: what is missing is what both lines dropped.
    let (sub, publ, a, b) = ab_run(false);
    let sent = n(&publ["totals"], "frames");
    let both: Vec<u64> = a.intersection(&b).copied().collect();
    assert!(a.len() as u64 > sent * 3 / 100 && b.len() as u64 > sent * 3 / 100, "{} {}", a.len(), b.len());
    assert!(!both.is_empty() && both.len() < a.len() / 5, "about 0.25 % on both lines: {}", both.len());
    let lines = &sub["lines"];
    assert_eq!(n(&lines["a"], "lost"), a.len() as u64, "line A's own loss: {lines}");
    assert_eq!(n(&lines["b"], "lost"), b.len() as u64, "line B's own loss: {lines}");
    assert_eq!(n(&sub, "gaps"), both.len() as u64, "only frames both lines lost are missing: {sub}");
    assert_eq!(n(&sub, "frames") + both.len() as u64, sent);
    // Every frame that came on both lines was taken once and its second copy arbitrated.
    let on_both = sent - a.union(&b).count() as u64;
    assert_eq!(n(&sub, "arbitrated"), on_both, "{sub}");
    assert_eq!(sub["duplicates"], 0);

    // With recovery as well, nothing is missing at the end.
    let (sub, publ, a, b) = ab_run(true);
    let both = a.intersection(&b).count() as u64;
    let r = recovery(&sub);
    // Every frame both lines lost came back by recovery. A frame only one line lost is asked for
    // too when the other line's copy is later than the recovery delay (5 ms), which a loaded
    // host makes happen now and then: so at least `both`, and never more than one line lost.
    let recovered = n(r, "frames_recovered");
    assert!(recovered >= both, "every frame both lines lost was recovered ({both}): {r}");
    assert!(recovered <= a.union(&b).count() as u64, "recovered only frames a line lost: {r}");
    assert_exact(&sub, &publ, "A/B with recovery");
}

#[test]
#[ignore = "long (over 3 s here): .ci/run runs it with --ignored"]
fn a_tcp_subscriber_cut_off_mid_stream_resumes_without_a_gap() {
    let (_serial, hosts, dir) = alone_on_emulated_hosts();
    let json = path(dir.path(), "sub1.json");
    let pub_json = path(dir.path(), "pub.json");
    let deep10 = deep10();
    let listen = format!("{}:9100", ip(Host::Pub, Line::A));
    let mut publisher = hosts.start(
        Host::Pub,
        publisher_bin(),
        words(&format!(
            "run --capture {deep10} --format sbe --tcp {listen} --wait-subscribers 1 --pacing rate --rate 50000 \
            --json {pub_json}"
        )),
    );
    publisher.serving_on();
    let mut sub = hosts.start(
        Host::Sub1,
        subscriber_bin(),
        ["--connect", &listen, "--json", &json, "--report-interval", "0.2", "--reconnect-max-seconds", "1"],
    );
    sub.wait_for_frames(20_000);
    // Cut: every segment sub1 sends to the publisher's port is answered with a reset by its own
    // kernel, which tears the connection down on sub1's side; its reconnection attempts are
    // refused the same way for a second, while the stream goes on without it.
    let nft = |script: &str| {
        let status =
            hosts.command(Host::Sub1, "nft").args(["-f", "-"]).stdin(std::process::Stdio::piped()).spawn().and_then(
                |mut child| {
                    use std::io::Write;
                    child.stdin.take().expect("piped").write_all(script.as_bytes())?;
                    child.wait()
                },
            );
        assert!(status.is_ok_and(|s| s.success()), "nft {script}");
    };
    nft("table inet cut {\n chain out {\n type filter hook output priority 0;\n tcp dport 9100 reject with tcp \
         reset\n }\n}\n");
    sub.wait_for("connection lost");
    std::thread::sleep(Duration::from_secs(1));
    nft("delete table inet cut");
    sub.wait_for("resuming");
    publisher.finish(RUN).assert_success();
    let sub = report(&sub.finish(STEP), &json, "sub1 cut off and resumed");
    let publ = json_file(Path::new(&pub_json));
    assert!(n(&sub, "reconnects") >= 1, "{sub}");
    assert!(n(&sub, "resumes") >= 1, "{sub}");
    assert_exact(&sub, &publ, "TCP cut off and resumed");
}
