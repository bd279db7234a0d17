//! The relay end to end: real `mdrelay-pub` and `mdrelay-sub` processes on loopback, DEEP10 from
//! ../shared, every result compared with the independent reference output.

mod common;

use common::*;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::time::Duration;

const FORMATS: [&str; 5] = ["raw", "sbe", "flatbuffers", "capnp", "capnp-packed"];

fn deep10() -> String {
    iex_data().join("DEEP10.pcap.gz").display().to_string()
}

fn sub_report(finished: &Finished, path: &Path, context: &str) -> serde_json::Value {
    assert_eq!(finished.code, Some(0), "{context}: subscriber failed\n{}", finished.stderr);
    json_file(path)
}

/// Runs one publisher/subscriber pair over `transport` and returns (subscriber, publisher) reports.
fn relay_once(
    format: &str,
    transport: &str,
    dir: &Path,
    extra_sub: &[&str],
) -> (serde_json::Value, serde_json::Value, Finished) {
    let sub_json = dir.join(format!("sub-{format}-{transport}.json"));
    let pub_json = dir.join(format!("pub-{format}-{transport}.json"));
    let mut p = args(&["run", "--capture", &deep10(), "--format", format, "--json"]);
    p.push(pub_json.display().to_string());
    let mut s = args(&["--report-interval", "0", "--json"]);
    s.push(sub_json.display().to_string());
    s.extend(args(extra_sub));
    let (publisher, subscriber);
    match transport {
        "tcp" => {
            let port = tcp_port().to_string();
            p.extend(args(&[
                "--tcp",
                &format!("127.0.0.1:{port}"),
                "--wait-subscribers",
                "1",
                "--slow-subscriber",
                "block",
            ]));
            publisher = Proc::start("mdrelay-pub", &publisher_bin(), &p);
            s.extend(args(&["--connect", &format!("127.0.0.1:{port}")]));
            subscriber = Proc::start("mdrelay-sub", &subscriber_bin(), &s);
        }
        udp => {
            let port = udp_port().to_string();
            if udp == "udp" {
                s.extend(args(&["--listen", &format!("127.0.0.1:{port}")]));
                p.extend(args(&["--udp", &format!("127.0.0.1:{port}")]));
            } else {
                s.extend(args(&["--group", &format!("239.255.42.1:{port}"), "--interface", "127.0.0.1"]));
                p.extend(args(&[
                    "--multicast",
                    &format!("239.255.42.1:{port}"),
                    "--interface",
                    "127.0.0.1",
                    "--ttl",
                    "0",
                ]));
            }
            // Paced, so a loopback receiver on a busy two-core machine keeps up.
            p.extend(args(&["--pacing", "rate", "--rate", "150000", "--coalesce-bytes", "8192"]));
            subscriber = Proc::start("mdrelay-sub", &subscriber_bin(), &s);
            std::thread::sleep(Duration::from_millis(400));
            publisher = Proc::start("mdrelay-pub", &publisher_bin(), &p);
        }
    }
    let published = publisher.wait(Duration::from_secs(120));
    assert_eq!(published.code, Some(0), "{format}/{transport}: publisher failed\n{}", published.stderr);
    let finished = subscriber.wait(Duration::from_secs(60));
    let context = format!("{format} over {transport}");
    (sub_report(&finished, &sub_json, &context), json_file(&pub_json), finished)
}

#[test]
fn every_format_over_every_transport_gives_the_reference_aggregates() {
    let _serial = serial();
    let reference = expected("DEEP10.json");
    let dir = tempfile::tempdir().unwrap();
    for transport in ["tcp", "udp", "multicast"] {
        for format in FORMATS {
            let (sub, publ, _) = relay_once(format, transport, dir.path(), &[]);
            let context = format!("{format} over {transport}");
            assert_aggregates(&sub, &reference, &context);
            assert_eq!(sub["messages"], reference["messages"], "{context}: every message arrives");
            assert_eq!(sub["totals_match"], true, "{context}: the subscriber's counts equal the publisher's totals");
            assert_eq!(sub["gaps"], 0, "{context}");
            assert_eq!(
                publ["totals"]["messages"], reference["messages"],
                "{context}: the publisher sent every message"
            );
            assert_eq!(
                sub["formats_seen"],
                serde_json::json!([format]),
                "{context}: the format comes from the publisher"
            );
        }
    }
}

#[test]
fn a_symbol_filter_gives_exactly_that_symbols_aggregates() {
    let _serial = serial();
    let reference = expected("DEEP10.json");
    let dir = tempfile::tempdir().unwrap();
    let (sub, _, _) = relay_once("sbe", "tcp", dir.path(), &["--symbols", "AA"]);
    let symbols = sub["symbols"].as_object().unwrap();
    assert_eq!(symbols.len(), 1);
    assert_eq!(symbols["AA"], reference["symbols"]["AA"]);
}

#[test]
fn two_subscribers_at_once_and_one_that_joins_late() {
    let _serial = serial();
    let reference = expected("DEEP10.json");
    let dir = tempfile::tempdir().unwrap();
    let port = tcp_port().to_string();
    let addr = format!("127.0.0.1:{port}");
    let pub_json = dir.path().join("pub.json");
    let mut p = args(&["run", "--capture", &deep10(), "--format", "capnp", "--tcp", &addr, "--wait-subscribers", "2"]);
    p.extend(args(&["--pacing", "rate", "--rate", "150000", "--json", pub_json.to_str().unwrap()]));
    let publisher = Proc::start("mdrelay-pub", &publisher_bin(), &p);
    let subs: Vec<_> = (0..3)
        .map(|i| {
            if i == 2 {
                // The stream takes ~2.6 s; join a second into it.
                std::thread::sleep(Duration::from_millis(1000));
            }
            let path = dir.path().join(format!("sub{i}.json"));
            let s = args(&["--connect", &addr, "--report-interval", "0", "--json", path.to_str().unwrap()]);
            (Proc::start("mdrelay-sub", &subscriber_bin(), &s), path)
        })
        .collect();
    assert_eq!(publisher.wait(Duration::from_secs(60)).code, Some(0));
    let reports: Vec<_> = subs
        .into_iter()
        .map(|(p, path)| {
            let f = p.wait(Duration::from_secs(30));
            (sub_report(&f, &path, "subscriber"), f)
        })
        .collect();
    for (report, _) in &reports[..2] {
        assert_aggregates(report, &reference, "an on-time subscriber");
        assert_eq!(report["totals_match"], true);
        assert!(report["late_join_sequence"].is_null());
    }
    let (late, finished) = &reports[2];
    let first = late["late_join_sequence"].as_u64().expect("the late subscriber says where it joined");
    assert!(first > 1);
    assert_ne!(late["totals_match"], true, "a late joiner cannot have everything");
    let messages = late["messages"].as_u64().unwrap();
    assert!(messages > 0 && messages < reference["messages"].as_u64().unwrap(), "it counts what it saw: {messages}");
    let by_type: u64 = late["message_types"].as_object().unwrap().values().map(|v| v.as_u64().unwrap()).sum();
    assert_eq!(by_type, messages);
    assert!(finished.stderr.contains("late"), "the late subscriber says so: {}", finished.stderr);
    let publ = json_file(&pub_json);
    assert_eq!(publ["subscribers"].as_array().unwrap().len(), 3);
}

/// Forwards TCP connections from a local port to `target`, cutting the first connection after
/// `cut_after` bytes from the publisher.
fn cutting_proxy(target: String, cut_after: usize) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for (n, client) in listener.incoming().enumerate() {
            let Ok(client) = client else { return };
            // The publisher may not listen yet: drop this client, it reconnects.
            let Ok(upstream) = TcpStream::connect(&target) else { continue };
            let (mut c_read, mut u_write) = (client.try_clone().unwrap(), upstream.try_clone().unwrap());
            std::thread::spawn(move || {
                let _ = std::io::copy(&mut c_read, &mut u_write);
            });
            let (mut u_read, mut c_write) = (upstream, client);
            std::thread::spawn(move || {
                let mut buf = [0u8; 16384];
                let mut sent = 0;
                while let Ok(k) = u_read.read(&mut buf) {
                    if k == 0 || c_write.write_all(&buf[..k]).is_err() {
                        break;
                    }
                    sent += k;
                    if n == 0 && sent >= cut_after {
                        break;
                    }
                }
                let _ = c_write.shutdown(std::net::Shutdown::Both);
                let _ = u_read.shutdown(std::net::Shutdown::Both);
            });
        }
    });
    port
}

#[test]
fn a_tcp_subscriber_that_loses_its_connection_reconnects() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let port = tcp_port();
    let proxy = cutting_proxy(format!("127.0.0.1:{port}"), 200_000);
    let mut p = args(&[
        "run",
        "--capture",
        &deep10(),
        "--format",
        "sbe",
        "--tcp",
        &format!("127.0.0.1:{port}"),
        "--wait-subscribers",
        "1",
    ]);
    p.extend(args(&["--pacing", "rate", "--rate", "150000"]));
    let publisher = Proc::start("mdrelay-pub", &publisher_bin(), &p);
    let path = dir.path().join("sub.json");
    let s =
        args(&["--connect", &format!("127.0.0.1:{proxy}"), "--report-interval", "0", "--json", path.to_str().unwrap()]);
    let subscriber = Proc::start("mdrelay-sub", &subscriber_bin(), &s);
    assert_eq!(publisher.wait(Duration::from_secs(60)).code, Some(0));
    let finished = subscriber.wait(Duration::from_secs(30));
    let report = sub_report(&finished, &path, "reconnecting subscriber");
    assert!(report["reconnects"].as_u64().unwrap() >= 1, "{report}");
    assert_eq!(report["stop_reason"], "end", "it reconnected and saw the end of the stream");
    assert!(
        report["gaps"].as_u64().unwrap() > 0 || report["late_join_sequence"].as_u64().is_some(),
        "the frames missed while away are reported"
    );
}

#[test]
fn sighup_switches_the_format_mid_stream_and_the_aggregates_stay_exact() {
    let _serial = serial();
    let reference = expected("DEEP10.json");
    let dir = tempfile::tempdir().unwrap();
    let port = tcp_port();
    let config = dir.path().join("pub.toml");
    let write = |format: &str| {
        let text = format!(
            "format = \"{format}\"\n[source]\ncapture = \"{}\"\n[pacing]\nmode = \"rate\"\nrate = 120000\n[tcp]\nlisten = \"127.0.0.1:{port}\"\nwait_subscribers = 1\nslow_subscriber = \"block\"\n",
            deep10()
        );
        std::fs::write(&config, text).unwrap();
    };
    write("sbe");
    let publisher = Proc::start("mdrelay-pub", &publisher_bin(), &args(&["run", "--config", config.to_str().unwrap()]));
    let path = dir.path().join("sub.json");
    let s =
        args(&["--connect", &format!("127.0.0.1:{port}"), "--report-interval", "0", "--json", path.to_str().unwrap()]);
    let subscriber = Proc::start("mdrelay-sub", &subscriber_bin(), &s);
    std::thread::sleep(Duration::from_millis(1200));
    write("capnp-packed");
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(publisher.pid()), nix::sys::signal::Signal::SIGHUP).unwrap();
    let published = publisher.wait(Duration::from_secs(60));
    assert_eq!(published.code, Some(0), "{}", published.stderr);
    assert!(published.stderr.contains("format switch"), "{}", published.stderr);
    let report = sub_report(&subscriber.wait(Duration::from_secs(30)), &path, "switching subscriber");
    assert_eq!(report["format_switches"], 1, "{report}");
    assert_eq!(report["formats_seen"], serde_json::json!(["sbe", "capnp-packed"]));
    assert_aggregates(&report, &reference, "across a format switch");
    assert_eq!(report["totals_match"], true);
}

#[test]
fn a_live_feed_relayed_from_multicast_raw_to_tcp_sbe() {
    let _serial = serial();
    let reference = expected("DEEP10.json");
    let dir = tempfile::tempdir().unwrap();
    let group_port = udp_port();
    let tcp = tcp_port();
    // The relay: joins the group, republishes as SBE over TCP.
    let relay_json = dir.path().join("relay.json");
    let mut r = args(&[
        "run",
        "--live",
        &format!("0.0.0.0:{group_port}"),
        "--live-group",
        "239.255.42.7",
        "--live-interface",
        "127.0.0.1",
    ]);
    r.extend(args(&[
        "--format",
        "sbe",
        "--tcp",
        &format!("127.0.0.1:{tcp}"),
        "--wait-subscribers",
        "1",
        "--slow-subscriber",
        "block",
    ]));
    r.extend(args(&["--json", relay_json.to_str().unwrap()]));
    let relay = Proc::start("mdrelay-pub relay", &publisher_bin(), &r);
    let path = dir.path().join("sub.json");
    let s =
        args(&["--connect", &format!("127.0.0.1:{tcp}"), "--report-interval", "0", "--json", path.to_str().unwrap()]);
    let subscriber = Proc::start("mdrelay-sub", &subscriber_bin(), &s);
    std::thread::sleep(Duration::from_millis(700));
    // The upstream: the capture as raw IEX-TP over multicast.
    let mut u =
        args(&["run", "--capture", &deep10(), "--format", "raw", "--multicast", &format!("239.255.42.7:{group_port}")]);
    u.extend(args(&["--interface", "127.0.0.1", "--ttl", "0", "--pacing", "rate", "--rate", "150000"]));
    let upstream = Proc::start("mdrelay-pub upstream", &publisher_bin(), &u);
    assert_eq!(upstream.wait(Duration::from_secs(60)).code, Some(0));
    let relayed = relay.wait(Duration::from_secs(30));
    assert_eq!(relayed.code, Some(0), "{}", relayed.stderr);
    let report = sub_report(&subscriber.wait(Duration::from_secs(30)), &path, "subscriber behind the relay");
    assert_eq!(report["formats_seen"], serde_json::json!(["sbe"]));
    assert_aggregates(&report, &reference, "raw multicast relayed as SBE over TCP");
    assert_eq!(report["messages"], reference["messages"]);
    assert_eq!(report["totals_match"], true);
}

/// Connects, completes the handshake, then never reads: a stalled subscriber.
fn stalled_subscriber(port: u16) -> TcpStream {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    let mut hello = [0u8; 40];
    s.read_exact(&mut hello).unwrap();
    s.write_all(
        &mdrelay_proto::relay::Subscribe { protocol_version: mdrelay_proto::relay::PROTOCOL_VERSION, echo: false }
            .to_bytes(),
    )
    .unwrap();
    // A small receive buffer fills fast.
    s
}

fn slow_policy_run(policy: &str) -> (serde_json::Value, serde_json::Value) {
    let dir = tempfile::tempdir().unwrap();
    let port = tcp_port();
    let pub_json = dir.path().join("pub.json");
    let mut p = args(&[
        "run",
        "--capture",
        &deep10(),
        "--format",
        "raw",
        "--tcp",
        &format!("127.0.0.1:{port}"),
        "--wait-subscribers",
        "2",
    ]);
    p.extend(args(&[
        "--queue",
        "16384",
        "--slow-subscriber",
        policy,
        "--pacing",
        "rate",
        "--rate",
        "200000",
        "--json",
        pub_json.to_str().unwrap(),
    ]));
    let publisher = Proc::start("mdrelay-pub", &publisher_bin(), &p);
    std::thread::sleep(Duration::from_millis(300));
    let _stalled = stalled_subscriber(port);
    let path = dir.path().join("sub.json");
    let s =
        args(&["--connect", &format!("127.0.0.1:{port}"), "--report-interval", "0", "--json", path.to_str().unwrap()]);
    let subscriber = Proc::start("mdrelay-sub", &subscriber_bin(), &s);
    let published = publisher.wait(Duration::from_secs(90));
    assert_eq!(published.code, Some(0), "{}", published.stderr);
    let report = sub_report(&subscriber.wait(Duration::from_secs(30)), &path, policy);
    (json_file(&pub_json), report)
}

#[test]
fn a_slow_subscriber_is_dropped_from_or_disconnected_and_never_slows_the_others() {
    let _serial = serial();
    let reference = expected("DEEP10.json");
    for policy in ["drop", "disconnect"] {
        let (publ, healthy) = slow_policy_run(policy);
        let subscribers = publ["subscribers"].as_array().unwrap();
        let stalled = subscribers.iter().find(|s| {
            s["first_sequence"] == 1 && (s["dropped_frames"].as_u64().unwrap() > 0 || s["disconnected_slow"] == true)
        });
        let stalled = stalled.unwrap_or_else(|| {
            panic!("{policy}: the stalled subscriber was neither dropped from nor disconnected: {publ}")
        });
        match policy {
            "drop" => assert!(stalled["dropped_frames"].as_u64().unwrap() > 0),
            _ => assert_eq!(stalled["disconnected_slow"], true),
        }
        assert_aggregates(&healthy, &reference, &format!("the healthy subscriber under {policy}"));
        assert_eq!(healthy["totals_match"], true, "{policy}");
    }
}

#[test]
fn a_subscriber_speaking_another_protocol_version_is_refused_with_a_reason() {
    let _serial = serial();
    let port = tcp_port();
    let p = args(&[
        "run",
        "--synthetic",
        "--messages",
        "20000",
        "--tcp",
        &format!("127.0.0.1:{port}"),
        "--wait-subscribers",
        "1",
        "--duration",
        "5",
    ]);
    let publisher = Proc::start("mdrelay-pub", &publisher_bin(), &p);
    let mut s = loop {
        match TcpStream::connect(("127.0.0.1", port)) {
            Ok(s) => break s,
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    };
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut hello = [0u8; 40];
    s.read_exact(&mut hello).unwrap();
    let greeting = mdrelay_proto::relay::Hello::parse(&hello).unwrap();
    assert_eq!(greeting.format, mdrelay_proto::codec::Format::Sbe, "the default format");
    s.write_all(&mdrelay_proto::relay::Subscribe { protocol_version: 99, echo: false }.to_bytes()).unwrap();
    let mut header = [0u8; 16];
    s.read_exact(&mut header).unwrap();
    let record = mdrelay_proto::relay::RecordHeader::parse(&header, 4096).unwrap();
    assert_eq!(record.tag, mdrelay_proto::relay::RecordTag::Refuse);
    let mut reason = vec![0u8; record.length as usize];
    s.read_exact(&mut reason).unwrap();
    let reason = String::from_utf8(reason).unwrap();
    assert!(reason.contains("version 99") && reason.contains("speaks 1"), "{reason}");
    drop(s);
    // The publisher is unharmed: a real subscriber still gets the whole stream.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sub.json");
    let sub = Proc::start(
        "mdrelay-sub",
        &subscriber_bin(),
        &args(&["--connect", &format!("127.0.0.1:{port}"), "--report-interval", "0", "--json", path.to_str().unwrap()]),
    );
    assert_eq!(publisher.wait(Duration::from_secs(30)).code, Some(0));
    let report = sub_report(&sub.wait(Duration::from_secs(30)), &path, "after a refusal");
    assert_eq!(report["messages"], 20000);
    assert_eq!(report["totals_match"], true);
}

#[test]
fn round_trip_mode_echoes_reach_the_publisher_over_tcp_and_udp() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    for transport in ["tcp", "udp"] {
        let pub_json = dir.path().join(format!("pub-{transport}.json"));
        let sub_json = dir.path().join(format!("sub-{transport}.json"));
        let mut p = args(&["run", "--synthetic", "--messages", "30000", "--symbols", "20", "--format", "capnp"]);
        p.extend(args(&["--pacing", "rate", "--rate", "50000", "--json", pub_json.to_str().unwrap()]));
        let mut s = args(&["--latency", "round-trip", "--echo-every", "10", "--report-interval", "0"]);
        s.extend(args(&["--json", sub_json.to_str().unwrap()]));
        let (publisher, subscriber) = if transport == "tcp" {
            let port = tcp_port();
            p.extend(args(&["--tcp", &format!("127.0.0.1:{port}"), "--wait-subscribers", "1"]));
            s.extend(args(&["--connect", &format!("127.0.0.1:{port}")]));
            let publisher = Proc::start("mdrelay-pub", &publisher_bin(), &p);
            (publisher, Proc::start("mdrelay-sub", &subscriber_bin(), &s))
        } else {
            let port = udp_port();
            s.extend(args(&["--listen", &format!("127.0.0.1:{port}")]));
            p.extend(args(&["--udp", &format!("127.0.0.1:{port}")]));
            let subscriber = Proc::start("mdrelay-sub", &subscriber_bin(), &s);
            std::thread::sleep(Duration::from_millis(400));
            (Proc::start("mdrelay-pub", &publisher_bin(), &p), subscriber)
        };
        let published = publisher.wait(Duration::from_secs(60));
        assert_eq!(published.code, Some(0), "{}", published.stderr);
        let report = sub_report(&subscriber.wait(Duration::from_secs(30)), &sub_json, transport);
        let publ = json_file(&pub_json);
        let frames = report["frames"].as_u64().unwrap();
        let echoes = publ["round_trip_ns"]["count"].as_u64().unwrap();
        assert!(frames > 1000, "{transport}: {report}");
        // One echo per ten frames, all of them measured by the publisher (loopback loses none).
        assert_eq!(echoes, report["echoes_sent"].as_u64().unwrap(), "{transport}");
        assert!(
            echoes >= frames / 10 - 1 && echoes <= frames / 10 + 1,
            "{transport}: {echoes} echoes for {frames} frames"
        );
        let p50 = publ["round_trip_ns"]["p50"].as_u64().unwrap();
        assert!(p50 > 0 && p50 < 10_000_000_000, "{transport}: a plausible round trip, {p50} ns");
    }
}
