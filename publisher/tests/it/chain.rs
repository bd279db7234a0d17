//! Relay chaining end to end: real `mdrelay-pub` processes taking each other's TCP streams
//! (`--upstream`, `[source.upstream]`), real `mdrelay-sub` leaves, DEEP10 from ../shared, every
//! aggregate compared with the independent reference output.
//!
//! What a chain must keep: the leaf's aggregates are the reference's exactly; its frames carry
//! the origin's session, sequence numbers and publish times, so its latency is origin-to-leaf
//! (never below any hop's on the way) and a gap upstream is a gap at the leaf; a relay that loses
//! its upstream resumes from the upstream's ring, and ends its own stream (with an error naming
//! the upstream) when it cannot. A record whose numbers a link changed, or whose CRC fails, is a
//! protocol violation: the relay (or subscriber) drops the connection and resumes after the last
//! good frame, so nothing wrong is relayed and nothing is lost; and a stream that ends short of
//! its origin's never lets a leaf report its totals as matching.
//!
//! The chains start only when every hop is connected: the origin waits for two subscribers, the
//! first relay and a direct subscriber that connects last, so no frame waits in a queue while the
//! chain is being built and the latency figures are the chain's own.
//!
//! UDP: the multicast leg carries one datagram per frame (a relay flushes every frame, as a live
//! source does): DEEP10 at 100,000 msg/s is about 31,000 small datagrams a second, inside what
//! the leaf takes with its 16 MiB receive buffer; the leaf also recovers from the last relay's
//! retransmission service, so a datagram lost on a loaded host costs latency, not exactness.

use crate::common::{
    alone_on_emulated_hosts, assert_leaf_exact, beside_others_in_tempdir, deep10, json_paths, logged_session, path,
    report,
};
use mdrelay_codec::{Codec, Format, Limits, MessageScratch, collect_segment};
use mdrelay_harness::cli_args::{
    NO_INTERVAL_REPORTS, PACED_100K, TCP_LOSSLESS_ONE_SUBSCRIBER, TCP_LOSSLESS_ONE_SUBSCRIBER_ANY_ADDRESS, words,
};
use mdrelay_harness::netns::{Host, Line};
use mdrelay_harness::process::field;
use mdrelay_harness::{
    Finished, Process, STEP, Signal, accept_within, cutting_proxy, dashboard_queries, deep10_tcp_config, expected,
    free_tcp_port, json_file, loopback_group_subscriber, mangling_proxy, publisher_bin, scrape, subscriber_bin,
};
use mdrelay_proto::relay::{Hello, RecordHeader, RecordTag, Subscribe, control_record};
use serde_json::{Value, json};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::time::{Duration, Instant};

/// The longest a relay of DEEP10 through a chain may take (about 4 s paced; far longer only if
/// something hangs).
const RUN: Duration = Duration::from_secs(120);

/// The multicast group of the loopback chain (other test binaries use 239.255.42.x).
const LOOPBACK_GROUP: &str = "239.255.43.1:0";

/// The multicast group of the three-host chain: from the range netns-hosts.sh routes over line A.
const HOSTS_GROUP: &str = "239.255.0.1:9310";

/// The origin: DEEP10 over TCP on loopback in `format`, every subscriber waited for (`block`),
/// paced at `rate`, starting once `wait` subscribers are connected.
fn origin(format: &str, rate: &str, wait: &str, json: &str) -> (Process, SocketAddr) {
    let deep10 = deep10();
    let mut p = Process::start(
        publisher_bin(),
        words(&format!(
            "run --capture {deep10} --format {format} --tcp 127.0.0.1:0 --wait-subscribers {wait} \
             --slow-subscriber block --pacing rate --rate {rate} --json {json}"
        )),
    );
    let addr = p.serving_on();
    (p, addr)
}

/// A relay of `upstream` serving TCP on loopback in `format`, waiting for one subscriber; with the
/// address it serves on and the session it took from its upstream.
fn tcp_relay(upstream: SocketAddr, format: &str, json: &str, extra: &[&str]) -> (Process, SocketAddr, u64) {
    let upstream = upstream.to_string();
    let args = format!("run --upstream {upstream} --format {format} {TCP_LOSSLESS_ONE_SUBSCRIBER} --json {json}");
    let mut p = Process::start(publisher_bin(), words(&args).iter().chain(extra));
    // Logged before the relay serves: the upstream is reached first.
    let session = logged_session(&mut p, "upstream greeted", STEP);
    let addr = p.serving_on();
    (p, addr, session)
}

/// A TCP subscriber of `addr` writing its report to `json`.
fn tcp_leaf(addr: SocketAddr, json: &str, extra: &[&str]) -> Process {
    let addr = addr.to_string();
    let mut args = vec!["--connect", addr.as_str(), "--json", json];
    if !extra.contains(&"--report-interval") {
        args.extend(["--report-interval", "0"]);
    }
    Process::start(subscriber_bin(), args.iter().chain(extra))
}

/// Asserts `leaf` got all of DEEP10: the reference's aggregates and counts, nothing missing.
fn assert_exact(leaf: &Value, reference: &Value, context: &str) {
    assert_leaf_exact(leaf, reference, context);
    assert_eq!(leaf["duplicates"], 0, "{context}");
}

/// Prints the chain's latencies beside a direct subscriber's, and asserts they grow hop by hop
/// unless the leaf recovered frames: those have no stream latency, so the leaf measured fewer.
fn check_latencies(context: &str, direct: (&str, &Value), hops: &[(&str, &Value)], leaf_report: &Value) {
    print_latencies(context, &[&[direct][..], hops].concat());
    match leaf_report["recovery"]["frames_recovered"].as_u64().unwrap_or(0) {
        0 => assert_latency_grows(hops),
        recovered => eprintln!("{context}: the leaf recovered {recovered} frames lost on the multicast leg"),
    }
}

/// A percentile of a latency summary, ns.
fn ns(latency: &Value, percentile: &str) -> u64 {
    latency[percentile].as_u64().unwrap_or_else(|| panic!("no {percentile} in {latency}"))
}

/// Asserts each latency summary is at least the one before it at p50, p99 and the maximum: the
/// same frames, received later down the chain against the same origin stamp.
fn assert_latency_grows(hops: &[(&str, &Value)]) {
    for pair in hops.windows(2) {
        let ((before, a), (after, b)) = (pair[0], pair[1]);
        assert_eq!(a["count"], b["count"], "{before} and {after} measured the same frames");
        for p in ["p50", "p99", "max"] {
            assert!(
                ns(a, p) <= ns(b, p),
                "{p}: {before} {} ns, {after} {} ns: a later hop is never earlier",
                ns(a, p),
                ns(b, p)
            );
        }
    }
}

/// Prints a chain's latency per hop, from the origin's publish time (ns).
fn print_latencies(context: &str, hops: &[(&str, &Value)]) {
    for (hop, l) in hops {
        eprintln!(
            "{context}: {hop}: p50 {} p99 {} p99.9 {} max {} ns",
            ns(l, "p50"),
            ns(l, "p99"),
            ns(l, "p999"),
            ns(l, "max")
        );
    }
}

#[test]
#[ignore = "long (over 3 s here): .ci/run runs it with --ignored"]
fn deep10_through_two_relays_tcp_sbe_then_multicast_capnp_reaches_the_leaf_exact() {
    let (_shared, dir) = beside_others_in_tempdir();
    let reference = expected("DEEP10.json");
    let [origin_json, relay1_json, relay2_json, leaf_json, direct_json] =
        json_paths(dir.path(), ["origin", "relay1", "relay2", "leaf", "direct"]);
    // The leaf first: bound and joined before anything is sent to the group.
    let recovery = format!("127.0.0.1:{}", free_tcp_port());
    let mut leaf = loopback_group_subscriber(LOOPBACK_GROUP, &recovery, &leaf_json);
    let group = leaf.listening_on().to_string();
    let (origin, origin_addr) = origin("raw", "100000", "2", &origin_json);
    // Relay 1's metrics stay up after its run, for the last scrape.
    let relay1_metrics: SocketAddr = format!("127.0.0.1:{}", free_tcp_port()).parse().unwrap();
    let metrics_flags = ["--metrics-listen", &relay1_metrics.to_string(), "--metrics-hold", "60"].map(String::from);
    let metrics_flags: Vec<&str> = metrics_flags.iter().map(String::as_str).collect();
    let (mut relay1, relay1_addr, relay1_session) = tcp_relay(origin_addr, "sbe", &relay1_json, &metrics_flags);
    let relay1_addr = relay1_addr.to_string();
    let mut relay2 = Process::start(
        publisher_bin(),
        words(&format!(
            "run --upstream {relay1_addr} --format capnp --multicast {group} --interface 127.0.0.1 --ttl 0 \
             --retransmit-listen {recovery} --json {relay2_json}"
        )),
    );
    let relay2_session = logged_session(&mut relay2, "upstream greeted", STEP);
    relay2.wait_for("publishing");
    // The chain is up: the origin's second subscriber starts the stream.
    let mut direct = tcp_leaf(origin_addr, &direct_json, &[]);
    let origin_session = logged_session(&mut direct, "greeted", STEP);
    origin.finish(RUN).assert_success();
    relay1.wait_for_within("metrics endpoint stays up", RUN);
    let relay1_scrape = scrape(relay1_metrics).unwrap();
    relay1.signal(Signal::SIGTERM);
    relay1.finish(STEP).assert_success();
    relay2.finish(RUN).assert_success();
    let leaf_done = leaf.finish(STEP);
    let leaf_session = {
        let line =
            leaf_done.stderr.lines().find(|l| l.contains("publisher session")).expect("the leaf logs the session");
        u64::from_str_radix(field(line, "session").unwrap().trim_start_matches("0x"), 16).unwrap()
    };
    let leaf_report = report(&leaf_done, &leaf_json, "the leaf");
    let direct_report = report(&direct.finish(STEP), &direct_json, "the origin's direct subscriber");
    let (origin_report, relay1_report, relay2_report) =
        (json_file(Path::new(&origin_json)), json_file(Path::new(&relay1_json)), json_file(Path::new(&relay2_json)));

    assert_eq!(origin_report["totals"]["messages"], reference["messages"], "the origin sent every message");
    let frames = &origin_report["totals"]["frames"];
    assert_exact(&direct_report, &reference, "the origin's direct subscriber");
    assert_exact(&leaf_report, &reference, "the leaf behind two relays");
    assert_eq!(leaf_report["formats_seen"], json!(["capnp"]), "the last relay's format");
    assert_eq!(leaf_report["frames"], *frames, "one frame per origin frame");
    // One session through the chain, and the origin's numbering at every hop.
    assert_eq!([relay1_session, relay2_session, leaf_session], [origin_session; 3], "the origin's session everywhere");
    for (name, relay, upstream_format) in [("relay 1", &relay1_report, "raw"), ("relay 2", &relay2_report, "sbe")] {
        let u = &relay["upstream"];
        assert_eq!(u["session"], origin_session, "{name}: {u}");
        assert_eq!(u["formats_seen"], json!([upstream_format]), "{name}");
        assert_eq!((&u["first_sequence"], &u["last_sequence"]), (&json!(1), frames), "{name}: the origin's numbers");
        for zero in ["gaps", "duplicates", "decode_errors", "undelimited_records", "reconnects", "negative_latencies"] {
            assert_eq!(u[zero], 0, "{name}: {zero}: {u}");
        }
        assert_eq!(u["stop_reason"], "end", "{name}");
        assert_eq!(relay["totals"]["frames"], *frames, "{name} relayed every frame");
        assert_eq!(relay["totals"]["messages"], reference["messages"], "{name}");
    }
    // Relay 1's metrics: what came from upstream, and this hop's latency for every frame.
    let relay1_frames = relay1_report["upstream"]["frames"].as_f64().unwrap();
    assert_eq!(relay1_scrape.get("mdrelay_pub_upstream_frames_total", ""), Some(relay1_frames));
    assert_eq!(relay1_scrape.get("mdrelay_pub_upstream_gap_frames_total", ""), Some(0.0));
    assert_eq!(relay1_scrape.get("mdrelay_pub_upstream_latency_seconds_count", ""), Some(relay1_frames));
    let hop_p50 = relay1_scrape.quantile_bucket("mdrelay_pub_upstream_latency_seconds", "", 0.5);
    assert!(hop_p50.is_some_and(|p| p > 0.0 && p.is_finite()), "{}", relay1_scrape.text);
    assert_eq!(relay1_scrape.sum("mdrelay_pub_frames_sent_total"), relay1_frames, "relay 1 sent what it received");
    // The dashboard's upstream panels query series a relay serves.
    let served = relay1_scrape.names();
    for name in dashboard_queries().iter().filter(|n| n.starts_with("mdrelay_pub_upstream_")) {
        assert!(served.contains(name), "the dashboard queries {name}, which a relay does not serve: {served:?}");
    }
    // Latency: the leaf's is origin-to-leaf, so never below a hop's before it.
    let leaf_latency = &leaf_report["latency_ns"];
    assert_eq!(leaf_report["negative_latencies"], 0, "{leaf_report}");
    assert!(ns(leaf_latency, "p50") > 0);
    let hops = [
        ("origin → relay 1", &relay1_report["upstream"]["latency_ns"]),
        ("origin → relay 2", &relay2_report["upstream"]["latency_ns"]),
        ("origin → leaf", leaf_latency),
    ];
    check_latencies(
        "loopback chain",
        ("origin → direct subscriber", &direct_report["latency_ns"]),
        &hops,
        &leaf_report,
    );
}

#[test]
fn a_relay_whose_upstream_connection_is_cut_resumes_from_the_upstream_ring_and_the_leaf_stays_exact() {
    let (_shared, dir) = beside_others_in_tempdir();
    let reference = expected("DEEP10.json");
    let (origin_json, relay_json, leaf_json) =
        (path(dir.path(), "origin.json"), path(dir.path(), "relay.json"), path(dir.path(), "leaf.json"));
    let (origin, origin_addr) = origin("sbe", "150000", "1", &origin_json);
    // Cut 2 MB into the stream (about a sixth of it): the relay reconnects and asks for the frame
    // after its last one; the origin's ring (64 MiB by default) still holds it.
    let (proxy, proxy_thread) = cutting_proxy(origin_addr, 2_000_000);
    let (relay, relay_addr, _) = tcp_relay(proxy, "flatbuffers", &relay_json, &[]);
    let leaf = tcp_leaf(relay_addr, &leaf_json, &[]);
    origin.finish(RUN).assert_success();
    relay.finish(RUN).assert_success();
    let leaf_report = report(&leaf.finish(STEP), &leaf_json, "the leaf");
    proxy_thread.join().expect("the relay connected twice");
    let relay_report = json_file(Path::new(&relay_json));
    let u = &relay_report["upstream"];
    assert_eq!((&u["reconnects"], &u["resumes"]), (&json!(1), &json!(1)), "{u}");
    assert_eq!((&u["gaps"], &u["duplicates"]), (&json!(0), &json!(0)), "{u}");
    assert_exact(&leaf_report, &reference, "the leaf of a relay that resumed");
    assert_eq!(leaf_report["reconnects"], 0, "the leaf's own connection was never cut");
    assert_eq!(leaf_report["frames"], json_file(Path::new(&origin_json))["totals"]["frames"]);
}

/// A change to the `nth` DATA record (0-based) of the first connection through a
/// [`mangling_proxy`]; every other record, and every later connection, passes as it is.
fn on_nth_data_record(
    nth: usize,
    change: impl Fn(&mut [u8]) + Send + 'static,
) -> impl FnMut(usize, &mut Vec<u8>) + Send {
    let mut seen = 0;
    move |connection, record| {
        if connection == 0 && record[0] == RecordTag::Data as u8 {
            if seen == nth {
                change(record);
            }
            seen += 1;
        }
    }
}

/// The sequence number in a record's header.
fn record_sequence(record: &[u8]) -> u64 {
    u64::from_le_bytes(record[8..16].try_into().unwrap())
}

/// A sequence number as a broken link changes it.
type Renumber = fn(u64) -> u64;

/// DATA records into the stream where the link breaks one: far enough for the relay to have
/// taken frames (about a thousand), far from the end.
const BROKEN_RECORD: usize = 300;

/// An origin → relay → leaf chain of DEEP10 whose origin-to-relay link renumbers one DATA record
/// with `renumber`: the relay must count one protocol violation, reconnect, resume after its last
/// good frame, and the leaf get exactly the reference, with totals matching the origin's.
fn a_renumbered_record_costs_a_reconnection_and_nothing_else(renumber: Renumber, context: &str) {
    let (_shared, dir) = beside_others_in_tempdir();
    let reference = expected("DEEP10.json");
    let (origin_json, relay_json, leaf_json) =
        (path(dir.path(), "origin.json"), path(dir.path(), "relay.json"), path(dir.path(), "leaf.json"));
    let (origin, origin_addr) = origin("sbe", "150000", "1", &origin_json);
    let (proxy, proxy_thread) = mangling_proxy(
        origin_addr,
        2,
        on_nth_data_record(BROKEN_RECORD, move |record| {
            let wrong = renumber(record_sequence(record));
            record[8..16].copy_from_slice(&wrong.to_le_bytes());
        }),
    );
    let metrics: SocketAddr = format!("127.0.0.1:{}", free_tcp_port()).parse().unwrap();
    let metrics_flags = ["--metrics-listen", &metrics.to_string(), "--metrics-hold", "60"].map(String::from);
    let metrics_flags: Vec<&str> = metrics_flags.iter().map(String::as_str).collect();
    let (mut relay, relay_addr, _) = tcp_relay(proxy, "flatbuffers", &relay_json, &metrics_flags);
    let leaf = tcp_leaf(relay_addr, &leaf_json, &[]);
    origin.finish(RUN).assert_success();
    relay.wait_for_within("metrics endpoint stays up", RUN);
    let scraped = scrape(metrics).unwrap();
    relay.signal(Signal::SIGTERM);
    let relay_done = relay.finish(STEP);
    relay_done.assert_success();
    let leaf_report = report(&leaf.finish(STEP), &leaf_json, context);
    let origin_totals = &json_file(Path::new(&origin_json))["totals"];
    let u = &json_file(Path::new(&relay_json))["upstream"];
    eprintln!(
        "{context}: leaf frames {} of the origin's {}, totals_match {}; relay duplicates {}, violations {}",
        leaf_report["frames"],
        origin_totals["frames"],
        leaf_report["totals_match"],
        u["duplicates"],
        u["protocol_violations"]
    );
    assert_eq!(leaf_report["frames"], origin_totals["frames"], "{context}: the leaf got every frame the origin sent");
    assert_eq!(u["protocol_violations"], 1, "{context}: {u}");
    assert_eq!((&u["reconnects"], &u["resumes"]), (&json!(1), &json!(1)), "{context}: {u}");
    assert_eq!(
        (&u["gaps"], &u["duplicates"], &u["decode_errors"]),
        (&json!(0), &json!(0), &json!(0)),
        "{context}: {u}"
    );
    assert_eq!(u["stop_reason"], "end", "{context}: {u}");
    assert_exact(&leaf_report, &reference, context);
    assert_eq!(leaf_report["publisher_totals"]["frames"], origin_totals["frames"], "{context}: the origin's totals");
    assert_eq!(leaf_report["publisher_totals"]["messages"], origin_totals["messages"], "{context}");
    // The log names the upstream and says what was expected.
    let line = relay_done
        .stderr
        .lines()
        .find(|l| l.contains("protocol violation"))
        .unwrap_or_else(|| panic!("{context}: no violation logged: {}", relay_done.stderr));
    eprintln!("{context}: {line}");
    for needle in [&format!("upstream={proxy}"), "expected", "stream byte"] {
        assert!(line.contains(needle), "{context}: {needle} in {line}");
    }
    assert_eq!(scraped.get("mdrelay_pub_upstream_protocol_violations_total", ""), Some(1.0), "{}", scraped.text);
    proxy_thread.join().expect("the relay connected twice");
}

#[test]
fn a_data_record_renumbered_a_million_ahead_on_the_upstream_link_is_a_violation_the_relay_resumes_from() {
    a_renumbered_record_costs_a_reconnection_and_nothing_else(|s| s + 1_000_000, "sequence + 10^6");
}

#[test]
fn a_data_record_with_a_flipped_sequence_bit_on_the_upstream_link_is_a_violation_the_relay_resumes_from() {
    a_renumbered_record_costs_a_reconnection_and_nothing_else(|s| s ^ (1 << 29), "sequence bit 29 flipped");
}

#[test]
#[ignore = "long (over 3 s here): .ci/run runs it with --ignored"]
fn a_subscriber_treats_a_renumbered_record_as_a_violation_and_resumes_exact() {
    let (_shared, dir) = beside_others_in_tempdir();
    let reference = expected("DEEP10.json");
    let renumberings: [(Renumber, &str); 2] =
        [(|s| s + 1_000_000, "sequence + 10^6"), (|s| s ^ (1 << 29), "sequence bit 29 flipped")];
    for (renumber, context) in renumberings {
        let (origin_json, leaf_json) = (path(dir.path(), "origin.json"), path(dir.path(), "leaf.json"));
        let (origin, origin_addr) = origin("capnp", "150000", "1", &origin_json);
        let (proxy, proxy_thread) = mangling_proxy(
            origin_addr,
            2,
            on_nth_data_record(BROKEN_RECORD, move |record| {
                let wrong = renumber(record_sequence(record));
                record[8..16].copy_from_slice(&wrong.to_le_bytes());
            }),
        );
        let leaf = tcp_leaf(proxy, &leaf_json, &[]);
        origin.finish(RUN).assert_success();
        let leaf_done = leaf.finish(STEP);
        let leaf_report = report(&leaf_done, &leaf_json, context);
        let origin_totals = &json_file(Path::new(&origin_json))["totals"];
        eprintln!(
            "subscriber, {context}: frames {} of the origin's {}, gaps {}, duplicates {}, totals_match {}",
            leaf_report["frames"],
            origin_totals["frames"],
            leaf_report["gaps"],
            leaf_report["duplicates"],
            leaf_report["totals_match"]
        );
        assert_eq!(leaf_report["frames"], origin_totals["frames"], "{context}: {leaf_report}");
        assert_exact(&leaf_report, &reference, context);
        assert_eq!((&leaf_report["reconnects"], &leaf_report["resumes"]), (&json!(1), &json!(1)), "{leaf_report}");
        assert_eq!(leaf_report["invalid_packets"], 1, "{context}: the violation is counted: {leaf_report}");
        assert!(leaf_done.stderr.contains("protocol violation"), "{context}: {}", leaf_done.stderr);
        proxy_thread.join().expect("the subscriber connected twice");
    }
}

#[test]
#[ignore = "long (over 3 s here): .ci/run runs it with --ignored"]
fn an_upstream_that_breaks_the_numbering_on_every_connection_is_retried_with_backoff_then_given_up() {
    let (_shared, dir) = beside_others_in_tempdir();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let upstream = listener.local_addr().unwrap();
    // Every connection: the stream announced from frame 10, then a record of frame 3.
    let fake = std::thread::spawn(move || {
        socket2::SockRef::from(&listener).set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut connections = 0;
        while let Ok((mut s, _)) = listener.accept() {
            connections += 1;
            let _ = s.write_all(&Hello::new(Format::Sbe, 0x4444, 1, 10).to_bytes());
            let mut answer = [0u8; Subscribe::V2_LEN];
            if s.read_exact(&mut answer).is_err() {
                continue;
            }
            let _ = s.write_all(&control_record(RecordTag::Format, Format::Sbe, 10, &[]));
            let _ = s.write_all(&data_record(Format::Sbe, 3, &[0u8; 8]));
            let _ = s.read_to_end(&mut Vec::new());
        }
        connections
    });
    let relay_json = path(dir.path(), "relay.json");
    let toml = format!(
        "[source.upstream]\nconnect = \"{upstream}\"\nreconnect_max = 0.4\ngive_up_after = 2\n[tcp]\nlisten = \
         \"127.0.0.1:0\"\n"
    );
    let started = Instant::now();
    let done = run_config(dir.path(), "relay.toml", &toml, &["--json", &relay_json]).finish(RUN);
    let took = started.elapsed();
    let connections = fake.join().unwrap();
    assert_eq!(done.code(), Some(4), "the relay gives up: {done:?}");
    assert!(took < Duration::from_secs(20), "{took:?}");
    let u = &json_file(Path::new(&relay_json))["upstream"];
    eprintln!("numbering broken on every connection: {connections} connections in {took:?}");
    // 0.1, 0.2, 0.4, 0.4 ... s between attempts over about 2 s: a handful, never hundreds.
    assert!((3..=12).contains(&connections), "{connections} connections in {took:?}: {u}");
    assert_eq!(u["protocol_violations"], connections, "{u}");
    assert_eq!(u["frames"], 0, "{u}");
    assert!(u["error"].as_str().unwrap_or_default().contains("protocol violation"), "{u}");
    assert!(done.stderr.contains(&format!("upstream={upstream}")), "{done:?}");
}

#[test]
#[ignore = "long (over 3 s here): .ci/run runs it with --ignored"]
fn a_relay_stopped_mid_stream_does_not_let_its_leaf_believe_it_got_the_whole_session() {
    let (_shared, dir) = beside_others_in_tempdir();
    let (origin_json, relay_json, leaf_json) =
        (path(dir.path(), "origin.json"), path(dir.path(), "relay.json"), path(dir.path(), "leaf.json"));
    let (origin, origin_addr) = origin("sbe", "100000", "1", &origin_json);
    let (relay, relay_addr, _) = tcp_relay(origin_addr, "sbe", &relay_json, &[]);
    let mut leaf = tcp_leaf(relay_addr, &leaf_json, &["--report-interval", "0.1"]);
    leaf.wait_for_frames(1000);
    relay.signal(Signal::SIGTERM);
    relay.finish(RUN).assert_success();
    let leaf_report = report(&leaf.finish(STEP), &leaf_json, "the leaf");
    origin.finish(RUN).assert_success();
    let origin_frames = json_file(Path::new(&origin_json))["totals"]["frames"].as_u64().unwrap();
    assert!(leaf_report["frames"].as_u64().unwrap() < origin_frames, "the relay stopped early: {leaf_report}");
    assert_eq!(leaf_report["stop_reason"], "end", "the relay ended its stream: {leaf_report}");
    assert_eq!(leaf_report["totals_match"], false, "{leaf_report}");
    assert_eq!(leaf_report["publisher_totals"]["truncated"], true, "{leaf_report}");
}

#[test]
fn a_bit_flipped_on_a_crc_protected_upstream_link_is_caught_and_the_relay_resumes_exact() {
    let (_shared, dir) = beside_others_in_tempdir();
    let reference = expected("DEEP10.json");
    let (origin_json, relay_json, leaf_json) =
        (path(dir.path(), "origin.json"), path(dir.path(), "relay.json"), path(dir.path(), "leaf.json"));
    let origin_config = dir.path().join("origin.toml");
    std::fs::write(&origin_config, "[protection]\ncrc = true\n").unwrap();
    let origin_config = origin_config.display().to_string();
    let deep10 = deep10();
    let mut origin = Process::start(
        publisher_bin(),
        words(&format!(
            "run --config {origin_config} --capture {deep10} --format capnp {TCP_LOSSLESS_ONE_SUBSCRIBER} \
             --pacing rate --rate 150000 --json {origin_json}"
        )),
    );
    let origin_addr = origin.serving_on();
    // A relay not told of the upstream's CRC is refused at the greeting, naming the setting.
    let unaware = run_config(
        dir.path(),
        "unaware.toml",
        &format!("[source.upstream]\nconnect = \"{origin_addr}\"\n[tcp]\nlisten = \"127.0.0.1:0\"\n"),
        &[],
    )
    .finish(STEP);
    assert_eq!(unaware.code(), Some(3), "{unaware:?}");
    assert!(unaware.stderr.contains("source.upstream.crc"), "{unaware:?}");
    // One bit of a frame flipped in the 300th DATA record.
    let (proxy, proxy_thread) = mangling_proxy(
        origin_addr,
        2,
        on_nth_data_record(BROKEN_RECORD, |record| record[RecordHeader::LEN + 12] ^= 0x10),
    );
    let toml = format!(
        "format = \"sbe\"\n[source.upstream]\nconnect = \"{proxy}\"\ncrc = true\n[tcp]\nlisten = \
         \"127.0.0.1:0\"\nwait_subscribers = 1\nslow_subscriber = \"block\"\n"
    );
    let mut relay = run_config(dir.path(), "relay.toml", &toml, &["--json", &relay_json]);
    let relay_addr = relay.serving_on();
    let leaf = tcp_leaf(relay_addr, &leaf_json, &[]);
    origin.finish(RUN).assert_success();
    let relay_done = relay.finish(RUN);
    relay_done.assert_success();
    let leaf_report = report(&leaf.finish(STEP), &leaf_json, "the leaf of a CRC-checked relay");
    proxy_thread.join().expect("the relay connected twice");
    let origin_totals = &json_file(Path::new(&origin_json))["totals"];
    let u = &json_file(Path::new(&relay_json))["upstream"];
    assert_eq!(u["crc_failures"], 1, "{u}");
    assert_eq!((&u["reconnects"], &u["resumes"]), (&json!(1), &json!(1)), "{u}");
    assert_eq!((&u["gaps"], &u["duplicates"], &u["decode_errors"]), (&json!(0), &json!(0), &json!(0)), "{u}");
    assert_exact(&leaf_report, &reference, "the leaf of a relay whose upstream link flipped a bit");
    assert_eq!(leaf_report["frames"], origin_totals["frames"]);
    assert!(relay_done.stderr.contains("CRC-32C"), "{}", relay_done.stderr);
}

#[test]
fn a_relay_that_joins_late_carries_the_origins_numbers_so_the_leaf_sees_where() {
    let (_shared, dir) = beside_others_in_tempdir();
    let (origin_json, direct_json, relay_json, leaf_json) = (
        path(dir.path(), "origin.json"),
        path(dir.path(), "direct.json"),
        path(dir.path(), "relay.json"),
        path(dir.path(), "leaf.json"),
    );
    let (origin, origin_addr) = origin("capnp-packed", "150000", "1", &origin_json);
    let mut direct = tcp_leaf(origin_addr, &direct_json, &["--report-interval", "0.1"]);
    let origin_session = logged_session(&mut direct, "greeted", STEP);
    direct.wait_for_frames(1000);
    // The stream is under way: the relay joins it live.
    let (relay, relay_addr, relay_session) = tcp_relay(origin_addr, "raw", &relay_json, &[]);
    let mut leaf = tcp_leaf(relay_addr, &leaf_json, &[]);
    let leaf_session = logged_session(&mut leaf, "greeted", STEP);
    origin.finish(RUN).assert_success();
    relay.finish(RUN).assert_success();
    let leaf_report = report(&leaf.finish(STEP), &leaf_json, "the leaf");
    report(&direct.finish(STEP), &direct_json, "the direct subscriber");
    let relay_report = json_file(Path::new(&relay_json));
    let origin_frames = json_file(Path::new(&origin_json))["totals"]["frames"].as_u64().unwrap();
    assert_eq!([relay_session, leaf_session], [origin_session; 2]);
    let first = relay_report["upstream"]["first_sequence"].as_u64().expect("the relay took frames");
    assert!(first > 1000, "the relay joined after the direct subscriber's first thousand frames: {first}");
    // The leaf says it joined where the relay did, in the origin's numbers, and misses nothing after.
    assert_eq!(leaf_report["late_join_sequence"], first, "{leaf_report}");
    assert_eq!(leaf_report["frames"], origin_frames - first + 1, "{leaf_report}");
    assert_eq!(leaf_report["gaps"], 0, "{leaf_report}");
    assert_eq!(leaf_report["totals_match"], false, "a late joiner cannot have everything");
    assert_eq!(relay_report["upstream"]["last_sequence"], origin_frames);
}

/// Writes `toml` to a file in `dir` and runs `mdrelay-pub run --config` on it.
fn run_config(dir: &Path, name: &str, toml: &str, extra: &[&str]) -> Process {
    let config = dir.join(name);
    std::fs::write(&config, toml).unwrap();
    let config = config.display().to_string();
    Process::start(publisher_bin(), ["run", "--config", &config].iter().chain(extra))
}

/// A relay of `connect` that gives up after `give_up` seconds: its exit and output, within `limit`.
fn doomed_relay(dir: &Path, connect: &str, give_up: &str, limit: Duration) -> Finished {
    let toml = format!(
        "[source.upstream]\nconnect = \"{connect}\"\nhandshake_timeout = 0.3\nreconnect_max = \
         0.2\ngive_up_after = {give_up}\n[tcp]\nlisten = \"127.0.0.1:0\"\n"
    );
    let started = Instant::now();
    let finished = run_config(dir, "doomed.toml", &toml, &[]).finish(limit);
    assert!(started.elapsed() < limit, "{finished:?}");
    finished
}

#[test]
#[ignore = "long (over 3 s here): .ci/run runs it with --ignored"]
fn an_upstream_that_refuses_is_silent_or_is_not_a_publisher_fails_the_relay_naming_it() {
    let (_shared, dir) = beside_others_in_tempdir();
    let limit = Duration::from_secs(20);
    // Nothing listens: refused at every attempt, for a second.
    let refusing = format!("127.0.0.1:{}", free_tcp_port());
    let done = doomed_relay(dir.path(), &refusing, "1", limit);
    assert_eq!(done.code(), Some(4), "{done:?}");
    for needle in [&format!("upstream {refusing}"), "refused", "not reached", "give_up_after"] {
        assert!(done.stderr.contains(needle), "{needle}: {done:?}");
    }
    assert!(!done.stderr.contains("serving subscribers"), "nothing is served before the upstream is reached");
    // Accepts and never says a word: the greeting times out, again and again.
    let silent = TcpListener::bind("127.0.0.1:0").unwrap();
    let silent_addr = silent.local_addr().unwrap();
    let held = std::thread::spawn(move || {
        let mut held = Vec::new();
        socket2::SockRef::from(&silent).set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        while let Ok((stream, _)) = silent.accept() {
            held.push(stream);
        }
        held.len()
    });
    let done = doomed_relay(dir.path(), &silent_addr.to_string(), "1", limit);
    assert_eq!(done.code(), Some(4), "{done:?}");
    for needle in [&format!("upstream {silent_addr}"), "greeting", "handshake_timeout", "not reached"] {
        assert!(done.stderr.contains(needle), "{needle}: {done:?}");
    }
    assert!(held.join().unwrap() >= 2, "the relay tried again after a silent connection");
    // Something else entirely (an HTTP server, say): no retry, it cannot become a publisher.
    let http = TcpListener::bind("127.0.0.1:0").unwrap();
    let http_addr = http.local_addr().unwrap();
    let server = std::thread::spawn(move || {
        let mut s = accept_within(&http, STEP);
        let _ = s.write_all(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
        let _ = s.read(&mut [0u8; 64]);
    });
    let done = doomed_relay(dir.path(), &http_addr.to_string(), "30", limit);
    assert_eq!(done.code(), Some(3), "{done:?}");
    assert!(done.stderr.contains("is not an mdrelay publisher"), "{done:?}");
    assert!(done.stderr.contains(&http_addr.to_string()), "{done:?}");
    server.join().unwrap();
}

/// The first IEX-TP segment of DEEP10 that carries messages.
fn first_deep10_segment() -> Vec<u8> {
    let mut reader = mdrelay_iex::capture::CaptureReader::open(Path::new(&deep10())).unwrap();
    while let Some(packet) = reader.next_packet().unwrap() {
        if let Ok(datagram) = mdrelay_iex::link::udp_datagram(packet.link_type, packet.data)
            && let Ok(segment) = mdrelay_iex::iextp::Segment::parse(datagram.payload)
            && segment.blocks().count() > 0
        {
            return datagram.payload.to_vec();
        }
    }
    panic!("DEEP10 has no segment with messages");
}

/// A DATA record of one frame.
fn data_record(format: Format, sequence: u64, frame: &[u8]) -> Vec<u8> {
    let header = RecordHeader { tag: RecordTag::Data, format, frame_count: 1, length: frame.len() as u32, sequence };
    [&header.to_bytes()[..], frame].concat()
}

/// Greets one connection as a publisher of `session` and reads its answer.
fn greet(listener: &TcpListener, session: u64) -> TcpStream {
    let mut s = accept_within(listener, STEP);
    s.write_all(&Hello::new(Format::Sbe, session, 1, 1).to_bytes()).unwrap();
    let mut answer = [0u8; Subscribe::V2_LEN];
    s.read_exact(&mut answer).unwrap();
    Subscribe::parse(&answer).expect("the relay answers as a subscriber");
    s
}

#[test]
fn hostile_upstream_bytes_cost_their_frames_and_a_restarted_upstream_ends_the_relay_cleanly() {
    let (_shared, dir) = beside_others_in_tempdir();
    let segment = first_deep10_segment();
    let mut sbe = Codec::new(Format::Sbe, Limits::default());
    let mut frame = Vec::new();
    let messages = MessageScratch::new().with(|list| {
        let parsed = mdrelay_iex::iextp::Segment::parse(&segment).unwrap();
        collect_segment(&parsed, list);
        sbe.encode_segment(1_000, &parsed, &segment, list, &mut frame).unwrap();
        list.len()
    });
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let upstream = listener.local_addr().unwrap();
    // A "publisher" that sends one good frame, one of garbage, a record header claiming 2 GiB,
    // and, once the relay is back, greets it under another session: a restart.
    let fake = std::thread::spawn(move || {
        let mut s = greet(&listener, 0x1111);
        s.write_all(&control_record(RecordTag::Format, Format::Sbe, 1, &[])).unwrap();
        s.write_all(&data_record(Format::Sbe, 1, &frame)).unwrap();
        s.write_all(&data_record(Format::Sbe, 2, &[0xAB; 64])).unwrap();
        let huge =
            RecordHeader { tag: RecordTag::Data, format: Format::Sbe, frame_count: 1, length: 1 << 31, sequence: 3 };
        s.write_all(&huge.to_bytes()).unwrap();
        // The relay leaves at the greeting: it cannot follow a new session.
        let mut restarted = accept_within(&listener, STEP);
        restarted.write_all(&Hello::new(Format::Sbe, 0x2222, 1, 1).to_bytes()).unwrap();
        let _ = restarted.read_to_end(&mut Vec::new());
    });
    let (relay_json, leaf_json) = (path(dir.path(), "relay.json"), path(dir.path(), "leaf.json"));
    let (relay, relay_addr, session) = tcp_relay(upstream, "sbe", &relay_json, &[]);
    assert_eq!(session, 0x1111);
    let leaf = tcp_leaf(relay_addr, &leaf_json, &[]);
    let done = relay.finish(RUN);
    assert_eq!(done.code(), Some(4), "the relay fails: {done:?}");
    for needle in ["bad record header", "exceeds", "restarted", "0x1111", "0x2222", &format!("upstream {upstream}")] {
        assert!(done.stderr.contains(needle), "{needle}: {done:?}");
    }
    fake.join().unwrap();
    let u = &json_file(Path::new(&relay_json))["upstream"];
    assert_eq!((&u["frames"], &u["messages"]), (&json!(1), &json!(messages)), "{u}");
    assert_eq!(u["decode_errors"].as_u64().unwrap() + u["undelimited_records"].as_u64().unwrap(), 1, "{u}");
    assert_eq!((&u["stop_reason"], &u["reconnects"]), (&json!("failed"), &json!(0)), "{u}");
    assert!(u["error"].as_str().unwrap().contains("restarted"), "{u}");
    // Its subscriber got the one good frame and the relay's END: it stops instead of waiting,
    // and is told the stream ended short of its source's.
    let leaf_report = report(&leaf.finish(STEP), &leaf_json, "the relay's subscriber");
    assert_eq!((&leaf_report["frames"], &leaf_report["messages"]), (&json!(1), &json!(messages)), "{leaf_report}");
    assert_eq!((&leaf_report["stop_reason"], &leaf_report["totals_match"]), (&json!("end"), &json!(false)));
    assert_eq!(leaf_report["publisher_totals"]["truncated"], true, "{leaf_report}");
}

#[test]
fn a_relay_whose_upstream_is_killed_mid_stream_ends_its_own_stream_with_an_error_naming_it() {
    let (_shared, dir) = beside_others_in_tempdir();
    let reference = expected("DEEP10.json");
    let (origin_json, relay_json, leaf_json) =
        (path(dir.path(), "origin.json"), path(dir.path(), "relay.json"), path(dir.path(), "leaf.json"));
    let (origin, origin_addr) = origin("sbe", "100000", "1", &origin_json);
    let toml = format!(
        "format = \"capnp\"\n[source.upstream]\nconnect = \"{origin_addr}\"\nreconnect_max = 0.2\ngive_up_after \
         = 2\n[tcp]\nlisten = \"127.0.0.1:0\"\nwait_subscribers = 1\nslow_subscriber = \"block\"\n"
    );
    let mut relay = run_config(dir.path(), "relay.toml", &toml, &["--json", &relay_json]);
    let relay_addr = relay.serving_on();
    let mut leaf = tcp_leaf(relay_addr, &leaf_json, &["--report-interval", "0.1"]);
    leaf.wait_for_frames(1000);
    origin.signal(Signal::SIGKILL);
    let killed_at = Instant::now();
    let done = relay.finish(RUN);
    let took = killed_at.elapsed();
    assert_eq!(done.code(), Some(4), "{done:?}");
    for needle in [&format!("upstream {origin_addr}"), "connection lost", "not reached", "give_up_after"] {
        assert!(done.stderr.contains(needle), "{needle}: {done:?}");
    }
    // Two seconds of attempts, then the end: not the default 30.
    assert!(took < Duration::from_secs(15), "the relay gave up after {took:?}");
    let relay_report = json_file(Path::new(&relay_json));
    let u = &relay_report["upstream"];
    assert_eq!((&u["stop_reason"], &u["gaps"]), (&json!("failed"), &json!(0)), "{u}");
    assert!(u["totals"].is_null(), "no END came from the killed upstream");
    assert_eq!(origin.finish(STEP).code(), None, "the origin was killed");
    let leaf_report = report(&leaf.finish(STEP), &leaf_json, "the leaf");
    // The leaf has everything the relay sent, in order, and the relay's END.
    let frames = leaf_report["frames"].as_u64().unwrap();
    assert!(frames >= 1000, "{leaf_report}");
    assert!(leaf_report["messages"].as_u64() < reference["messages"].as_u64(), "the stream was cut: {leaf_report}");
    assert_eq!(leaf_report["frames"], relay_report["totals"]["frames"]);
    assert_eq!((&leaf_report["gaps"], &leaf_report["stop_reason"]), (&json!(0), &json!("end")), "{leaf_report}");
    // The origin sent frames the leaf never got: its totals must not match.
    eprintln!(
        "upstream killed: leaf frames {}, totals_match {}, publisher totals {}",
        leaf_report["frames"], leaf_report["totals_match"], leaf_report["publisher_totals"]
    );
    assert_eq!(leaf_report["totals_match"], false, "{leaf_report}");
    assert_eq!(leaf_report["publisher_totals"]["truncated"], true, "{leaf_report}");
}

#[test]
#[ignore = "long (over 3 s here): .ci/run runs it with --ignored"]
fn a_format_switch_upstream_is_followed_and_the_leaf_stays_exact() {
    let (_shared, dir) = beside_others_in_tempdir();
    let reference = expected("DEEP10.json");
    let config = dir.path().join("origin.toml");
    let write = |format: &str| {
        let text = deep10_tcp_config(format, "");
        std::fs::write(&config, text).unwrap();
    };
    write("sbe");
    let mut origin = Process::start(publisher_bin(), ["run", "--config", config.to_str().unwrap()]);
    let origin_addr = origin.serving_on();
    let (relay_json, leaf_json) = (path(dir.path(), "relay.json"), path(dir.path(), "leaf.json"));
    let (relay, relay_addr, _) = tcp_relay(origin_addr, "raw", &relay_json, &[]);
    let mut leaf = tcp_leaf(relay_addr, &leaf_json, &["--report-interval", "0.1"]);
    // Frames have reached the leaf through the relay: the switch comes mid-stream.
    leaf.wait_for_frames(1);
    write("capnp-packed");
    origin.signal(Signal::SIGHUP);
    origin.wait_for("SIGHUP: format changes at the next frame");
    origin.finish(RUN).assert_success();
    relay.finish(RUN).assert_success();
    let leaf_report = report(&leaf.finish(STEP), &leaf_json, "the leaf");
    let u = &json_file(Path::new(&relay_json))["upstream"];
    assert_eq!(u["format_switches"], 1, "{u}");
    assert_eq!(u["formats_seen"], json!(["sbe", "capnp-packed"]), "{u}");
    assert_eq!((&u["decode_errors"], &u["gaps"]), (&json!(0), &json!(0)), "{u}");
    // The relay's own format never changed.
    assert_eq!((&leaf_report["formats_seen"], &leaf_report["format_switches"]), (&json!(["raw"]), &json!(0)));
    assert_exact(&leaf_report, &reference, "the leaf of a relay whose upstream switched formats");
}

#[test]
fn a_relay_whose_upstream_is_itself_or_badly_configured_is_refused_naming_the_setting() {
    let (_shared, dir) = beside_others_in_tempdir();
    let port = free_tcp_port();
    let key = dir.path().join("wire.key");
    std::fs::write(&key, "ab".repeat(32)).unwrap();
    std::fs::set_permissions(&key, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    for (toml, names) in [
        (
            format!("[source.upstream]\nconnect = \"127.0.0.1:{port}\"\n[tcp]\nlisten = \"127.0.0.1:{port}\"\n"),
            &["source.upstream.connect", "own tcp.listen"][..],
        ),
        (
            format!("[source.upstream]\nconnect = \"127.0.0.1:{port}\"\n[tcp]\nlisten = \"0.0.0.0:{port}\"\n"),
            &["source.upstream.connect", "own tcp.listen"],
        ),
        (
            // A name is checked once it resolves.
            format!("[source.upstream]\nconnect = \"localhost:{port}\"\n[tcp]\nlisten = \"127.0.0.1:{port}\"\n"),
            &["source.upstream.connect", "own tcp.listen"],
        ),
        (
            format!(
                "[source.upstream]\nconnect = \"127.0.0.1:{port}\"\n[tcp]\nlisten = \
                 \"127.0.0.1:0\"\n[retransmit]\nlisten = \"127.0.0.1:{port}\"\n"
            ),
            &["source.upstream.connect", "own retransmit.listen"],
        ),
        ("[source.upstream]\nconnect = \"upstream-host\"\n[tcp]\n".into(), &["source.upstream.connect", "no port"]),
        ("[source.upstream]\nconnect = \"0.0.0.0:9100\"\n[tcp]\n".into(), &["source.upstream.connect", "0.0.0.0"]),
        (
            "[source.upstream]\nconnect = \"10.0.0.1:9100\"\ngive_up_after = -1\n[tcp]\n".into(),
            &["source.upstream.give_up_after", "out of range"],
        ),
        (
            "[source.upstream]\nconnect = \"10.0.0.1:9100\"\nreconnect_max = 1e9\n[tcp]\n".into(),
            &["source.upstream.reconnect_max", "out of range"],
        ),
        ("[source.upstream]\nconnect = \"10.0.0.1:9100\"\nconect_timeout = 1\n[tcp]\n".into(), &["conect_timeout"]),
        (
            "[source]\ncapture = \"x.pcap\"\n[source.upstream]\nconnect = \"10.0.0.1:9100\"\n[tcp]\n".into(),
            &["source", "not 2"],
        ),
        (
            "[source.upstream]\nconnect = \"10.0.0.1:9100\"\n[pacing]\nmode = \"rate\"\n[tcp]\n".into(),
            &["pacing.mode", "upstream"],
        ),
        (
            format!("[source.upstream]\nconnect = \"10.0.0.1:9100\"\n[tcp]\n[protection]\nkey_file = {key:?}\n"),
            &["protection.key_file", "relay", "crc"],
        ),
    ] {
        let done = run_config(dir.path(), "bad.toml", &toml, &[]).finish(STEP);
        assert_eq!(done.code(), Some(2), "{toml}: {done:?}");
        assert!(names.iter().all(|n| done.stderr.contains(n)), "{toml}: {done:?}");
        assert!(!done.stderr.contains("serving subscribers"), "{toml}: {done:?}");
    }
}

#[test]
#[ignore = "long (over 3 s here): .ci/run runs it with --ignored"]
fn deep10_through_a_relay_across_three_hosts_reaches_a_multicast_leaf_exact() {
    let (_serial, hosts, dir) = alone_on_emulated_hosts();
    let reference = expected("DEEP10.json");
    let [origin_json, relay1_json, relay2_json, leaf_json, direct_json] =
        json_paths(dir.path(), ["origin", "relay1", "relay2", "leaf", "direct"]);
    let deep10 = deep10();
    // The leaf on the origin's host, so every hop crosses a bridge: pub → sub1 (TCP, line A) →
    // sub2 (TCP, line B) → pub (multicast, line A).
    let pub_a = Host::Pub.addr(Line::A).to_string();
    // A port of sub2's own network namespace: nothing else there can hold it.
    let recovery = format!("{}:9311", Host::Sub2.addr(Line::A));
    let mut leaf = hosts.start(
        Host::Pub,
        subscriber_bin(),
        words(&format!(
            "--group {HOSTS_GROUP} --interface {pub_a} --recovery {recovery} {NO_INTERVAL_REPORTS} --json {leaf_json}"
        )),
    );
    leaf.listening_on();
    let mut origin = hosts.start(
        Host::Pub,
        publisher_bin(),
        words(&format!(
            "run --capture {deep10} --format raw --tcp 0.0.0.0:0 --wait-subscribers 2 --slow-subscriber block \
            {PACED_100K} --json {origin_json}"
        )),
    );
    let origin_port = origin.serving_on().port();
    let tcp_relay_on = |host: Host, upstream: String, format: &str, json: &str| {
        let args = format!(
            "run --upstream {upstream} --format {format} {TCP_LOSSLESS_ONE_SUBSCRIBER_ANY_ADDRESS} --json {json}"
        );
        hosts.start(host, publisher_bin(), words(&args))
    };
    let mut relay1 =
        tcp_relay_on(Host::Sub1, format!("{}:{origin_port}", Host::Pub.addr(Line::A)), "sbe", &relay1_json);
    let relay1_session = logged_session(&mut relay1, "upstream greeted", STEP);
    let relay1_port = relay1.serving_on().port();
    let sub2_a = Host::Sub2.addr(Line::A).to_string();
    let relay1_b = format!("{}:{relay1_port}", Host::Sub1.addr(Line::B));
    let mut relay2 = hosts.start(
        Host::Sub2,
        publisher_bin(),
        words(&format!(
            "run --upstream {relay1_b} --format capnp --multicast {HOSTS_GROUP} --interface {sub2_a} --ttl 1 \
            --retransmit-listen {recovery} --json {relay2_json}"
        )),
    );
    let relay2_session = logged_session(&mut relay2, "upstream greeted", STEP);
    relay2.wait_for("publishing");
    let origin_b = format!("{}:{origin_port}", Host::Pub.addr(Line::B));
    let mut direct = hosts.start(
        Host::Sub2,
        subscriber_bin(),
        ["--connect", &origin_b, "--report-interval", "0", "--json", &direct_json],
    );
    let origin_session = logged_session(&mut direct, "greeted", STEP);
    origin.finish(RUN).assert_success();
    relay1.finish(RUN).assert_success();
    relay2.finish(RUN).assert_success();
    let leaf_report = report(&leaf.finish(STEP), &leaf_json, "the leaf on pub");
    let direct_report = report(&direct.finish(STEP), &direct_json, "the direct subscriber on sub2");
    let (relay1_report, relay2_report) = (json_file(Path::new(&relay1_json)), json_file(Path::new(&relay2_json)));
    assert_eq!([relay1_session, relay2_session], [origin_session; 2]);
    assert_exact(&direct_report, &reference, "the origin's direct subscriber on sub2");
    assert_exact(&leaf_report, &reference, "the leaf on pub behind relays on sub1 and sub2");
    assert_eq!(leaf_report["formats_seen"], json!(["capnp"]));
    assert_eq!(leaf_report["unconfirmed_datagrams"], 0);
    assert_eq!(leaf_report["negative_latencies"], 0);
    let frames = &json_file(Path::new(&origin_json))["totals"]["frames"];
    assert_eq!(&leaf_report["frames"], frames);
    for (name, r) in [("relay 1 on sub1", &relay1_report), ("relay 2 on sub2", &relay2_report)] {
        let u = &r["upstream"];
        assert_eq!((&u["session"], &u["last_sequence"]), (&json!(origin_session), frames), "{name}: {u}");
        assert_eq!((&u["gaps"], &u["reconnects"], &u["decode_errors"]), (&json!(0), &json!(0), &json!(0)), "{name}");
    }
    let hops = [
        ("origin on pub → relay on sub1", &relay1_report["upstream"]["latency_ns"]),
        ("→ relay on sub2", &relay2_report["upstream"]["latency_ns"]),
        ("→ leaf on pub", &leaf_report["latency_ns"]),
    ];
    check_latencies(
        "three hosts",
        ("origin → direct subscriber on sub2", &direct_report["latency_ns"]),
        &hops,
        &leaf_report,
    );
}

#[test]
fn an_upstream_at_its_connection_limit_is_retried_with_growing_waits_and_no_busy_connection_counts_as_a_reconnection() {
    let (_shared, dir) = beside_others_in_tempdir();
    let (origin_json, relay_json) = (path(dir.path(), "origin.json"), path(dir.path(), "relay.json"));
    // An origin with room for one connection, streaming slowly to it: every connection past the
    // first is greeted and told BUSY.
    let deep10 = deep10();
    let mut origin = Process::start(
        publisher_bin(),
        words(&format!(
            "run --capture {deep10} --tcp 127.0.0.1:0 --max-connections 1 --wait-subscribers 1 \
             --slow-subscriber block --pacing rate --rate 1000 --json {origin_json}"
        )),
    );
    let origin_addr = origin.serving_on();
    // The one connection it has room for: greeted, and answered as a subscriber.
    let mut holder = TcpStream::connect(origin_addr).unwrap();
    holder.set_read_timeout(Some(STEP)).unwrap();
    let mut hello = [0u8; Hello::LEN];
    holder.read_exact(&mut hello).unwrap();
    Hello::parse(&hello).expect("the origin greets its first connection");
    holder.write_all(&Subscribe::new(false).to_bytes()).unwrap();
    // A relay of it: greeted (so it starts serving), then told BUSY, again and again.
    let upstream = origin_addr.to_string();
    let mut relay = Process::start(
        publisher_bin(),
        ["run", "--upstream", &upstream, "--tcp", "127.0.0.1:0", "--json", &relay_json],
    );
    relay.serving_on();
    // The window the waits are counted over: 100 + 200 + 400 + 800 ms of waits fit in it, so a
    // relay that backs off connects about five times; one that does not, hundreds of times.
    let window = Duration::from_secs(2);
    std::thread::sleep(window);
    relay.signal(Signal::SIGTERM);
    let done = relay.finish(RUN);
    done.assert_success();
    drop(holder);
    origin.signal(Signal::SIGTERM);
    origin.finish(RUN).assert_success();
    let busy = json_file(Path::new(&origin_json))["connections"]["busy"].as_u64().unwrap();
    assert!((2..=8).contains(&busy), "BUSY answers in {window:?}: {busy} (the relay must back off)\n{done:?}");
    let u = &json_file(Path::new(&relay_json))["upstream"];
    assert_eq!(u["reconnects"], 0, "a connection told BUSY is no reconnection: {u}");
    assert!(done.stderr.contains("busy"), "the relay says why it waits: {done:?}");
}

#[test]
fn a_relay_keeps_the_state_of_what_it_relays_and_serves_late_joiners_a_snapshot_of_it() {
    let (_shared, dir) = beside_others_in_tempdir();
    let (origin_json, relay_json) = (path(dir.path(), "origin.json"), path(dir.path(), "relay.json"));
    let (early_json, late_json, book) =
        (path(dir.path(), "early.json"), path(dir.path(), "late.json"), path(dir.path(), "book.json"));
    let (origin, origin_addr) = origin("sbe", "300000", "1", &origin_json);
    let (relay, relay_addr, _) = tcp_relay(origin_addr, "capnp", &relay_json, &[]);
    let mut early = tcp_leaf(relay_addr, &early_json, &["--report-interval", "100ms"]);
    early.wait_for_frames(5_000);
    let late = tcp_leaf(relay_addr, &late_json, &["--snapshot", "--book", &book]);
    origin.finish(RUN).assert_success();
    relay.finish(RUN).assert_success();
    let reference = expected("DEEP10.json");
    assert_exact(&report(&early.finish(STEP), &early_json, "the early leaf"), &reference, "the early leaf");
    let late = report(&late.finish(STEP), &late_json, "the late leaf");
    let as_of = late["snapshot_as_of"].as_u64().unwrap_or_else(|| panic!("no snapshot from the relay: {late}"));
    assert!(as_of >= 5_000, "the late leaf joined mid-stream, at frame {as_of}");
    assert_exact(&late, &reference, "a late leaf with the relay's snapshot");
    let books = expected("DEEP10.book.json");
    mdrelay_harness::assert_books_match(&json_file(Path::new(&book)), &books, "the late leaf's books");
}
