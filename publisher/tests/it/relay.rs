//! The relay end to end: real `mdrelay-pub` and `mdrelay-sub` processes on loopback, DEEP10 from
//! ../shared, every result compared with the independent reference output.
//!
//! No test sleeps to let a process get ready: each waits for the line the process prints once
//! it is (`serving subscribers over TCP`, `listening on`, `greeted`, interval lines).
//!
//! UDP on loopback loses nothing unless the receiver falls behind by a whole receive buffer.
//! The paced streams here are far below what the receivers sustain: DEEP10 at 150,000 msg/s is
//! 6 MB/s of frames (16.1 MB in 2.7 s), coalesced into 8 KiB datagrams, about 750 a second,
//! while a subscriber decodes DEEP10 in a few tens of milliseconds per pass (`mdrelay-bench
//! codecs`), so it is idle most of the time. Loss needs it kept off the CPU for as long as its
//! buffer lasts: the subscriber asks for 16 MiB (granted in full to root through
//! SO_RCVBUFFORCE, as in CI; otherwise up to net.core.rmem_max), more than a second of this
//! stream, against the few tens of milliseconds a loaded two-core machine keeps a runnable
//! thread waiting. Where a buffer could still overflow (a machine with a small rmem_max), the
//! UDP checks are exact accounting (frames received + frames lost = frames sent), and the
//! reference figures are required whenever nothing was lost.

use crate::common::{alone_in_tempdir, deep10, path, report as sub_report};
use mdrelay_codec::Format;
use mdrelay_harness::cli_args::words;
use mdrelay_harness::{
    Finished, Process, STEP, Signal, assert_aggregates, cutting_proxy, deep10_tcp_config, expected, formats,
    free_udp_port, iex_data, json_file, publisher_bin, serial, subscriber_bin,
};
use mdrelay_proto::relay::{Hello, MIN_PROTOCOL_VERSION, PROTOCOL_VERSION, RecordHeader, RecordTag, Subscribe};
use serde_json::{Value, json};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::time::Duration;

/// The longest a relay of DEEP10 may take (2.7 s paced; far longer only if something hangs).
const RUN: Duration = Duration::from_secs(120);

/// A publisher serving TCP on a port of its choosing, and the address it serves on.
fn tcp_publisher(args: &[&str]) -> (Process, SocketAddr) {
    let mut publisher = Process::start(publisher_bin(), args.iter().copied().chain(["--tcp", "127.0.0.1:0"]));
    let addr = publisher.serving_on();
    (publisher, addr)
}

/// A subscriber connecting to `addr`, writing its report to `json`; without interval lines
/// unless `extra` asks for them.
fn tcp_subscriber(addr: SocketAddr, json: &str, extra: &[&str]) -> Process {
    let addr = addr.to_string();
    let mut args = vec!["--connect", addr.as_str(), "--json", json];
    if !extra.contains(&"--report-interval") {
        args.extend(["--report-interval", "0"]);
    }
    Process::start(subscriber_bin(), args.iter().chain(extra))
}

/// What one publisher/subscriber pair left: the reports and the subscriber's output.
struct Relayed {
    sub: Value,
    publ: Value,
}

/// Relays DEEP10 once in `format` over `transport` (tcp, udp or multicast).
fn relay_once(format: &str, transport: &str, dir: &Path, extra_sub: &[&str]) -> Relayed {
    relay_capture(&deep10(), format, transport, dir, extra_sub)
}

/// Relays `capture` once in `format` over `transport` (tcp, udp or multicast).
fn relay_capture(capture: &str, format: &str, transport: &str, dir: &Path, extra_sub: &[&str]) -> Relayed {
    let sub_json = path(dir, &format!("sub-{format}-{transport}.json"));
    let pub_json = path(dir, &format!("pub-{format}-{transport}.json"));
    let deep10 = capture.to_string();
    let target: String;
    let mut p = vec!["run", "--capture", &deep10, "--format", format, "--json", &pub_json];
    let (publisher, subscriber);
    match transport {
        "tcp" => {
            p.extend(["--wait-subscribers", "1", "--slow-subscriber", "block"]);
            let (started, addr) = tcp_publisher(&p);
            publisher = started;
            subscriber = tcp_subscriber(addr, &sub_json, extra_sub);
        }
        udp => {
            let mut s = vec!["--report-interval", "0", "--json", &sub_json];
            if udp == "udp" {
                s.extend(["--listen", "127.0.0.1:0"]);
            } else {
                s.extend(["--group", "239.255.42.1:0", "--interface", "127.0.0.1"]);
            }
            s.extend(extra_sub);
            let mut started = Process::start(subscriber_bin(), &s);
            // Bound (and joined): nothing sent from now on is lost to a socket not there yet.
            target = started.listening_on().to_string();
            subscriber = started;
            if udp == "udp" {
                p.extend(["--udp", &target]);
            } else {
                p.extend(["--multicast", &target, "--interface", "127.0.0.1", "--ttl", "0"]);
            }
            // The rate and datagram size the module's margin is stated for.
            p.extend(["--pacing", "rate", "--rate", "150000", "--coalesce-bytes", "8192"]);
            publisher = Process::start(publisher_bin(), &p);
        }
    }
    let context = format!("{format} over {transport}");
    publisher.finish(RUN).assert_success();
    let finished = subscriber.finish(STEP);
    Relayed { sub: sub_report(&finished, &sub_json, &context), publ: json_file(Path::new(&pub_json)) }
}

/// Whether the report lost frames; asserts exact accounting either way: frames received plus
/// frames lost equal the frames the publisher sent, and a run that lost some cannot match the
/// publisher's totals.
fn lost_frames(sub: &Value, publ: &Value, context: &str) -> bool {
    let frames = sub["frames"].as_u64().expect("frames");
    let gaps = sub["gaps"].as_u64().expect("gaps");
    assert_eq!(frames + gaps, publ["totals"]["frames"].as_u64().unwrap(), "{context}: frames received + lost = sent");
    assert_eq!(sub["decode_errors"], 0, "{context}");
    if gaps > 0 {
        assert_eq!(sub["totals_match"], false, "{context}: {gaps} frames lost, yet the totals match");
        eprintln!("{context}: {gaps} frames lost on loopback (a receive buffer overflowed); accounting checked");
    }
    gaps > 0
}

#[test]
#[ignore = "long (over 3 s here): .ci/run runs it with --ignored"]
fn every_format_over_every_transport_gives_the_reference_aggregates() {
    let (_serial, dir) = alone_in_tempdir();
    let captures = [("DEEP10", expected("DEEP10.json")), ("TOPS16", expected("TOPS16.json"))];
    // Each format over each transport once, the two captures taking turns: every capture still
    // crosses every transport in half the formats, and every format is read from both captures,
    // in half the relays of running both captures in every format over every transport.
    for (i, format) in formats().into_iter().enumerate() {
        for (t, transport) in ["tcp", "udp", "multicast"].into_iter().enumerate() {
            let (capture, reference) = &captures[(i + t) % captures.len()];
            let file = iex_data().join(format!("{capture}.pcap.gz")).display().to_string();
            let Relayed { sub, publ } = relay_capture(&file, format.name(), transport, dir.path(), &[]);
            let context = format!("{capture} in {format} over {transport}");
            assert_eq!(
                publ["totals"]["messages"], reference["messages"],
                "{context}: the publisher sent every message"
            );
            assert_eq!(sub["formats_seen"], json!([format.name()]), "{context}: the format comes from the publisher");
            if transport != "tcp" && lost_frames(&sub, &publ, &context) {
                continue;
            }
            assert_aggregates(&sub, reference, &context);
            assert_eq!(sub["messages"], reference["messages"], "{context}: every message arrives");
            assert_eq!(sub["message_types"], reference["message_types"], "{context}");
            assert_eq!(sub["totals_match"], true, "{context}: the subscriber's counts equal the publisher's totals");
            assert_eq!(sub["gaps"], 0, "{context}");
        }
    }
}

#[test]
#[ignore = "long (over 3 s here): .ci/run runs it with --ignored"]
fn a_symbol_filter_gives_exactly_that_symbols_aggregates_in_every_format() {
    let (_serial, dir) = alone_in_tempdir();
    let reference = expected("DEEP10.json");
    // The filter is applied while decoding (each format skips other symbols' messages as early
    // as it can), so every format's skipping is checked, not only the aggregate.
    for format in formats() {
        let context = format!("{format} filtered to AA, ZIEXT and NOSUCH");
        let Relayed { sub, .. } = relay_once(format.name(), "tcp", dir.path(), &["--symbols", "AA,ZIEXT,NOSUCH"]);
        let symbols = sub["symbols"].as_object().unwrap();
        assert_eq!(symbols.keys().collect::<Vec<_>>(), ["AA", "ZIEXT"], "{context}: NOSUCH is not in DEEP10");
        let mut volume = 0;
        for name in ["AA", "ZIEXT"] {
            assert_eq!(symbols[name], reference["symbols"][name], "{context}: {name}");
            volume += reference["symbols"][name]["trade_volume"].as_u64().unwrap();
        }
        assert_eq!(sub["total_trade_volume"], volume, "{context}");
        // Counts cover every message, of every type, whatever the filter.
        assert_eq!(sub["messages"], reference["messages"], "{context}");
        assert_eq!(sub["message_types"], reference["message_types"], "{context}");
        assert_eq!(sub["totals_match"], true, "{context}");
    }
}

#[test]
#[ignore = "long (over 3 s here): .ci/run runs it with --ignored"]
fn two_subscribers_at_once_and_one_that_joins_late() {
    let (_serial, dir) = alone_in_tempdir();
    let reference = expected("DEEP10.json");
    let pub_json = path(dir.path(), "pub.json");
    let deep10 = deep10();
    let p = ["run", "--capture", &deep10, "--format", "capnp", "--wait-subscribers", "2"];
    let (publisher, addr) =
        tcp_publisher(&[&p[..], &["--pacing", "rate", "--rate", "150000", "--json", &pub_json]].concat());
    let jsons: Vec<String> = (0..3).map(|i| path(dir.path(), &format!("sub{i}.json"))).collect();
    // The first reports every 0.1 s, so the test sees when the stream is under way.
    let mut first = tcp_subscriber(addr, &jsons[0], &["--report-interval", "0.1"]);
    let second = tcp_subscriber(addr, &jsons[1], &[]);
    first.wait_for_frames(1);
    // Stopped while the third connects, so it joins mid-stream however slowly it starts; the
    // kernel completes its connection from the listen backlog meanwhile.
    publisher.signal(Signal::SIGSTOP);
    let mut late = tcp_subscriber(addr, &jsons[2], &[]);
    late.wait_for("connected");
    publisher.signal(Signal::SIGCONT);
    publisher.finish(RUN).assert_success();
    let reports: Vec<(Value, Finished)> = [first, second, late]
        .into_iter()
        .zip(&jsons)
        .map(|(p, json)| {
            let f = p.finish(STEP);
            (sub_report(&f, json, "subscriber"), f)
        })
        .collect();
    for (report, _) in &reports[..2] {
        assert_aggregates(report, &reference, "an on-time subscriber");
        assert_eq!(report["totals_match"], true);
        assert!(report["late_join_sequence"].is_null());
    }
    let (late, finished) = &reports[2];
    let first = late["late_join_sequence"].as_u64().expect("the late subscriber says where it joined");
    assert!(first > 1, "joined at {first}");
    assert_eq!(late["totals_match"], false, "a late joiner cannot have everything");
    let messages = late["messages"].as_u64().unwrap();
    assert!(messages > 0 && messages < reference["messages"].as_u64().unwrap(), "it counts what it saw: {messages}");
    let by_type: u64 = late["message_types"].as_object().unwrap().values().map(|v| v.as_u64().unwrap()).sum();
    assert_eq!(by_type, messages);
    // Everything from where it joined arrives: no frame after the first is missing.
    assert_eq!(late["gaps"], 0);
    assert!(finished.stderr.contains("late"), "the late subscriber says so: {}", finished.stderr);
    let publ = json_file(Path::new(&pub_json));
    assert_eq!(publ["subscribers"].as_array().unwrap().len(), 3, "{publ}");
}

#[test]
#[ignore = "long (over 3 s here): .ci/run runs it with --ignored"]
fn a_tcp_subscriber_that_loses_its_connection_reconnects_and_resumes_from_the_ring() {
    let _serial = serial();
    let reference = expected("DEEP10.json");
    let deep10 = deep10();
    // With the ring (the default), the reconnection resumes where the subscriber stopped: the
    // whole stream arrives. Without it (`--ring-bytes 0`), the frames sent meanwhile are missed,
    // and reported.
    for ring in ["67108864", "0"] {
        let dir = tempfile::tempdir().unwrap();
        let p = ["run", "--capture", &deep10, "--format", "sbe", "--wait-subscribers", "1", "--ring-bytes", ring];
        let (publisher, addr) = tcp_publisher(&[&p[..], &["--pacing", "rate", "--rate", "150000"]].concat());
        let (proxy, proxy_thread) = cutting_proxy(addr, 200_000);
        let proxy = proxy.port();
        let json = path(dir.path(), "sub.json");
        let subscriber = tcp_subscriber(SocketAddr::from(([127, 0, 0, 1], proxy)), &json, &[]);
        publisher.finish(RUN).assert_success();
        let report = sub_report(&subscriber.finish(STEP), &json, "reconnecting subscriber");
        proxy_thread.join().expect("the subscriber connected twice");
        assert_eq!(report["reconnects"], 1, "{report}");
        assert_eq!(report["stop_reason"], "end", "it reconnected and saw the end of the stream");
        if ring == "0" {
            assert_eq!(report["resumes"], 0, "nothing to resume from: {report}");
            assert!(
                report["gaps"].as_u64().unwrap() > 0 || report["late_join_sequence"].as_u64().is_some(),
                "the frames missed while away are reported: {report}"
            );
            assert_eq!(report["totals_match"], false, "frames were missed");
        } else {
            assert_eq!(report["resumes"], 1, "{report}");
            assert_eq!((&report["gaps"], &report["duplicates"]), (&json!(0), &json!(0)), "{report}");
            assert_aggregates(&report, &reference, "resumed after a cut");
            assert_eq!(report["totals_match"], true, "{report}");
        }
    }
}

#[test]
#[ignore = "long (over 3 s here): .ci/run runs it with --ignored"]
fn sighup_switches_the_format_mid_stream_and_the_aggregates_stay_exact() {
    let (_serial, dir) = alone_in_tempdir();
    let reference = expected("DEEP10.json");
    let config = dir.path().join("pub.toml");
    let write = |format: &str| {
        let text = deep10_tcp_config(format, "");
        std::fs::write(&config, text).unwrap();
    };
    write("sbe");
    let mut publisher = Process::start(publisher_bin(), ["run", "--config", config.to_str().unwrap()]);
    // Printed after the signal handlers are installed.
    let addr = publisher.serving_on();
    let json = path(dir.path(), "sub.json");
    let mut subscriber = tcp_subscriber(addr, &json, &["--report-interval", "0.1"]);
    // SBE frames have arrived: the switches come mid-stream (the stream takes 3.3 s). To each of
    // the formats that parse whole frames, and back to a zero-copy one.
    subscriber.wait_for_frames(1);
    let chain = ["protobuf", "brec", "json", "capnp-packed"];
    for (from, to) in std::iter::once("sbe").chain(chain).zip(chain) {
        write(to);
        publisher.signal(Signal::SIGHUP);
        // The engine's line once the switch is made: the next switch comes after it.
        publisher.wait_until(&format!("the switch from {from} to {to}"), |line| {
            line.contains("format switch") && line.contains(&format!("to={to}"))
        });
    }
    let published = publisher.finish(RUN);
    published.assert_success();
    let report = sub_report(&subscriber.finish(STEP), &json, "switching subscriber");
    assert_eq!(report["format_switches"], chain.len(), "{report}");
    assert_eq!(report["formats_seen"], json!(["sbe", "capnp-packed", "json", "protobuf", "brec"]));
    assert_aggregates(&report, &reference, "across format switches");
    assert_eq!(report["messages"], reference["messages"]);
    assert_eq!(report["totals_match"], true);
}

/// DEEP10 as raw relay datagrams over multicast at `rate` (and `upstream_extra` arguments) into a
/// relay that republishes it as SBE over TCP to one subscriber: the reports of the subscriber,
/// the relay and the upstream.
fn live_relay(dir: &Path, rate: &str, upstream_extra: &[&str]) -> (Value, Value, Value) {
    // The live input's port must be known to the upstream before the relay prints it.
    let port = free_udp_port();
    let (live, group) = (format!("0.0.0.0:{port}"), format!("239.255.42.7:{port}"));
    let relay_json = path(dir, &format!("relay-{rate}.json"));
    let (mut relay, addr) = tcp_publisher(&words(&format!(
        "run --live {live} --live-group 239.255.42.7 --live-interface 127.0.0.1 --format sbe --wait-subscribers \
         1 --slow-subscriber block --json {relay_json}"
    )));
    // Printed once the live socket is bound and has joined the group.
    relay.wait_for("publishing");
    let json = path(dir, &format!("sub-{rate}.json"));
    let mut subscriber = tcp_subscriber(addr, &json, &[]);
    subscriber.wait_for("greeted");
    relay.wait_for("subscriber admitted");
    let upstream_json = path(dir, &format!("upstream-{rate}.json"));
    let deep10 = deep10();
    let u = ["run", "--capture", &deep10, "--format", "raw", "--multicast", &group, "--interface", "127.0.0.1"];
    let u2 = ["--ttl", "0", "--pacing", "rate", "--rate", rate, "--json", &upstream_json];
    Process::start(publisher_bin(), u.iter().chain(&u2).chain(upstream_extra)).finish(RUN).assert_success();
    relay.finish(RUN).assert_success();
    let report = sub_report(&subscriber.finish(STEP), &json, "subscriber behind the relay");
    (report, json_file(Path::new(&relay_json)), json_file(Path::new(&upstream_json)))
}

#[test]
#[ignore = "long (over 3 s here): .ci/run runs it with --ignored"]
fn a_live_feed_relayed_from_multicast_raw_to_tcp_sbe() {
    // One frame per datagram: 46,000 datagrams a second at 150,000 msg/s into the relay's live
    // buffer (8 MiB asked for, capped at 2 × net.core.rmem_max: about 130 ms of this stream at
    // 8 MiB).
    relayed_whole_from_multicast(&["150000", "50000"], &[]);
}

/// The same from an upstream that coalesces to 64 KiB datagrams at 2 M msg/s: about 600 frames
/// a duty cycle, so its datagrams hold more than 255 frames (header version 2), whose frames
/// start 32 bytes in.
#[test]
#[ignore = "long (over 3 s here): .ci/run runs it with --ignored"]
fn a_live_feed_of_wide_relay_datagrams_is_relayed_whole() {
    relayed_whole_from_multicast(&["2000000", "1000000"], &["--coalesce-bytes", "65536", "--max-datagram", "65507"]);
}

/// DEEP10 through [`live_relay`] at each of `rates` in turn with `upstream_extra`, until one
/// arrives whole; equal to the reference. The relay's input reports no gaps, so a run that lost
/// frames is repeated at the next, lower, rate before the test gives up.
fn relayed_whole_from_multicast(rates: &[&str], upstream_extra: &[&str]) {
    let (_serial, dir) = alone_in_tempdir();
    let reference = expected("DEEP10.json");
    for &rate in rates {
        let (report, relayed, upstream) = live_relay(dir.path(), rate, upstream_extra);
        assert_eq!(report["formats_seen"], json!(["sbe"]));
        // The TCP leg is exact whatever the UDP leg lost.
        assert_eq!(report["totals_match"], true, "{report}");
        assert_eq!(report["messages"], relayed["totals"]["messages"]);
        let sent = upstream["totals"]["frames"].as_u64().unwrap();
        let got = relayed["totals"]["frames"].as_u64().unwrap();
        assert!(got <= sent, "the relay relayed {got} frames of {sent}");
        if got == sent {
            assert_aggregates(&report, &reference, "raw multicast relayed as SBE over TCP");
            assert_eq!(report["messages"], reference["messages"]);
            assert_eq!(report["message_types"], reference["message_types"]);
            return;
        }
        eprintln!("at {rate} msg/s the relay's live input lost {} of {sent} frames on loopback", sent - got);
    }
    panic!("the relay's live input lost frames at every rate: is net.core.rmem_max tiny?");
}

/// The first IEX-TP segment of DEEP10 that carries messages, as the exchange sends it.
fn first_deep10_segment() -> Vec<u8> {
    let mut reader = mdrelay_iex::capture::CaptureReader::open(Path::new(&deep10())).unwrap();
    while let Some(packet) = reader.next_packet().unwrap() {
        if let Ok(datagram) = mdrelay_iex::link::udp_datagram(packet.link_type, packet.data) {
            let segment = mdrelay_iex::iextp::Segment::parse(datagram.payload);
            if segment.is_ok_and(|s| s.blocks().count() > 0) {
                return datagram.payload.to_vec();
            }
        }
    }
    panic!("DEEP10 has no segment with messages");
}

/// A live feed's segment goes out as it arrives, with coalescing on and nothing behind it: it
/// does not wait in a coalescing buffer, a run of records or a send batch for a next segment
/// that may not come for a long time.
#[test]
#[ignore = "long (over 3 s here): .ci/run runs it with --ignored"]
fn a_lone_live_segment_is_relayed_without_waiting_for_the_next() {
    let (_serial, dir) = alone_in_tempdir();
    let live = format!("127.0.0.1:{}", free_udp_port());
    let relay_json = path(dir.path(), "relay.json");
    let (mut relay, addr) = tcp_publisher(&words(&format!(
        "run --live {live} --idle-timeout 600 --format sbe --coalesce-bytes 65536 --wait-subscribers 1 --json \
         {relay_json}"
    )));
    relay.wait_for("publishing");
    let json = path(dir.path(), "sub.json");
    let mut subscriber = tcp_subscriber(addr, &json, &["--report-interval", "0.05"]);
    subscriber.wait_for("greeted");
    relay.wait_for("subscriber admitted");
    std::net::UdpSocket::bind("127.0.0.1:0").unwrap().send_to(&first_deep10_segment(), &live).unwrap();
    // Within STEP (30 s), while the feed stays open for another 600 s.
    assert_eq!(subscriber.wait_for_frames(1), 1);
    relay.signal(Signal::SIGINT);
    relay.finish(RUN).assert_success();
    let report = sub_report(&subscriber.finish(STEP), &json, "subscriber behind the live relay");
    assert_eq!((report["frames"].as_u64(), report["totals_match"].as_bool()), (Some(1), Some(true)), "{report}");
    assert_eq!(json_file(Path::new(&relay_json))["totals"]["frames"], 1);
}

/// Connects, completes the handshake, then never reads: a stalled subscriber.
fn stalled_subscriber(addr: SocketAddr) -> TcpStream {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(STEP)).unwrap();
    let mut hello = [0u8; Hello::LEN];
    s.read_exact(&mut hello).unwrap();
    s.write_all(&Subscribe::new(false).to_bytes()).unwrap();
    s
}

/// DEEP10 in raw under `policy`, to a stalled subscriber and a healthy one; the publisher's and
/// the healthy subscriber's reports.
fn slow_policy_run(policy: &str) -> (Value, Value) {
    let dir = tempfile::tempdir().unwrap();
    let pub_json = path(dir.path(), "pub.json");
    let deep10 = deep10();
    let (publisher, addr) = tcp_publisher(&[
        "run",
        "--capture",
        &deep10,
        "--format",
        "raw",
        "--wait-subscribers",
        "2",
        // Runs of records, several frames each: about a tenth of a second of this stream.
        "--queue",
        "2048",
        "--slow-subscriber",
        policy,
        "--pacing",
        "rate",
        "--rate",
        "200000",
        "--json",
        &pub_json,
    ]);
    let _stalled = stalled_subscriber(addr);
    let json = path(dir.path(), "sub.json");
    let subscriber = tcp_subscriber(addr, &json, &[]);
    publisher.finish(RUN).assert_success();
    let report = sub_report(&subscriber.finish(STEP), &json, policy);
    (json_file(Path::new(&pub_json)), report)
}

#[test]
#[ignore = "long (over 3 s here): .ci/run runs it with --ignored"]
fn a_slow_subscriber_is_dropped_from_or_disconnected_and_never_slows_the_others() {
    let _serial = serial();
    let reference = expected("DEEP10.json");
    for policy in ["drop", "disconnect"] {
        let (publ, healthy) = slow_policy_run(policy);
        let subscribers = publ["subscribers"].as_array().unwrap();
        assert_eq!(subscribers.len(), 2, "{policy}: {publ}");
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
        assert_eq!(healthy["gaps"], 0, "{policy}");
    }
}

#[test]
#[ignore = "long (over 3 s here): .ci/run runs it with --ignored"]
fn a_subscriber_speaking_another_protocol_version_is_refused_with_a_reason() {
    let _serial = serial();
    let (publisher, addr) =
        tcp_publisher(&["run", "--synthetic", "--messages", "20000", "--wait-subscribers", "1", "--duration", "5"]);
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(STEP)).unwrap();
    let mut hello = [0u8; Hello::LEN];
    s.read_exact(&mut hello).unwrap();
    let greeting = Hello::parse(&hello).unwrap();
    assert_eq!(greeting.format, Format::Sbe, "the default format");
    s.write_all(&Subscribe { protocol_version: 99, ..Subscribe::new(false) }.to_bytes()).unwrap();
    let mut header = [0u8; RecordHeader::LEN];
    s.read_exact(&mut header).unwrap();
    let record = RecordHeader::parse(&header, 4096).unwrap();
    assert_eq!(record.tag, RecordTag::Refuse);
    let mut reason = vec![0u8; record.length as usize];
    s.read_exact(&mut reason).unwrap();
    let reason = String::from_utf8(reason).unwrap();
    // It names both versions.
    let ours = format!("speaks versions {MIN_PROTOCOL_VERSION} to {PROTOCOL_VERSION}");
    assert!(reason.contains("protocol version 99") && reason.contains(&ours), "{reason}");
    // Then the connection closes.
    assert_eq!(s.read(&mut [0u8; 1]).unwrap(), 0, "the refused connection closes");
    drop(s);
    // The publisher is unharmed: a real subscriber still gets the whole stream.
    let dir = tempfile::tempdir().unwrap();
    let json = path(dir.path(), "sub.json");
    let sub = tcp_subscriber(addr, &json, &[]);
    publisher.finish(RUN).assert_success();
    let report = sub_report(&sub.finish(STEP), &json, "after a refusal");
    assert_eq!(report["messages"], 20000);
    assert_eq!(report["totals_match"], true);
}

#[test]
#[ignore = "long (over 3 s here): .ci/run runs it with --ignored"]
fn round_trip_mode_echoes_reach_the_publisher_over_tcp_and_udp() {
    let (_serial, dir) = alone_in_tempdir();
    for transport in ["tcp", "udp"] {
        let pub_json = path(dir.path(), &format!("pub-{transport}.json"));
        let sub_json = path(dir.path(), &format!("sub-{transport}.json"));
        // 30,000 messages at 50,000 msg/s: a few thousand small datagrams a second each way,
        // orders of magnitude inside either side's receive buffer.
        let mut p = vec!["run", "--synthetic", "--messages", "30000", "--symbols", "20", "--format", "capnp"];
        p.extend(["--pacing", "rate", "--rate", "50000", "--json", &pub_json]);
        let s = ["--latency", "round-trip", "--echo-every", "10", "--report-interval", "0", "--json", &sub_json];
        let (publisher, subscriber) = if transport == "tcp" {
            p.extend(["--wait-subscribers", "1"]);
            let (publisher, addr) = tcp_publisher(&p);
            let addr = addr.to_string();
            (publisher, Process::start(subscriber_bin(), s.iter().chain(&["--connect", addr.as_str()])))
        } else {
            let mut subscriber = Process::start(subscriber_bin(), s.iter().chain(&["--listen", "127.0.0.1:0"]));
            let addr = subscriber.listening_on().to_string();
            p.extend(["--udp", &addr]);
            (Process::start(publisher_bin(), &p), subscriber)
        };
        publisher.finish(RUN).assert_success();
        let finished = subscriber.finish(STEP);
        let report = sub_report(&finished, &sub_json, transport);
        let publ = json_file(Path::new(&pub_json));
        let frames = report["frames"].as_u64().unwrap();
        let echoes = publ["round_trip_ns"]["count"].as_u64().unwrap();
        // The subscriber's own latency is one-way (each frame's), and says so; the round trip
        // is the publisher's, over the echoes.
        assert_eq!(report["latency_ns"]["count"].as_u64(), Some(frames), "{transport}: {report}");
        let text = &finished.stdout;
        assert!(text.contains(&format!("latency one-way over {frames} frames")), "{transport}: {text}");
        assert!(
            !text.contains("latency round-trip"),
            "{transport}: one-way values are not called a round trip: {text}"
        );
        assert!(text.contains(&format!("echoes sent {echoes} ")), "{transport}: {text}");
        assert!(frames > 1000, "{transport}: {report}");
        // One echo per ten frames, all of them measured by the publisher.
        assert_eq!(echoes, report["echoes_sent"].as_u64().unwrap(), "{transport}");
        assert!(
            echoes >= frames / 10 - 1 && echoes <= frames / 10 + 1,
            "{transport}: {echoes} echoes for {frames} frames"
        );
        let p50 = publ["round_trip_ns"]["p50"].as_u64().unwrap();
        assert!(p50 > 0 && p50 < 10_000_000_000, "{transport}: a plausible round trip, {p50} ns");
    }
}
