//! The Prometheus endpoints of real `mdrelay-pub` and `mdrelay-sub` processes, scraped over HTTP
//! during and after a relay of DEEP10, against the programs' own final JSON and the reference;
//! and both programs under a stand-in service manager (systemd's notifications).
//!
//! The names served follow Prometheus's naming conventions (`.ci/deploy-check.sh` lints scrapes
//! of both programs with `promtool check metrics`; the unit's place, which promtool does not
//! check, is checked here); every one is in docs/operations.md's metrics table, the deprecated
//! ones served with the same values as their replacements; the Grafana dashboard's queries and
//! the alerts' are checked against the metric names the programs actually serve.

use crate::common::alone_in_tempdir;
use mdrelay_harness::cli_args::{NO_INTERVAL_REPORTS, words};
use mdrelay_harness::{
    NotifySocket, Process, STEP, Scrape, Signal, alert_queries, assert_aggregates, dashboard_queries,
    deep10_tcp_config, expected, free_tcp_port, free_udp_port, get, json_file, publisher_bin, scrape, serial,
    subscriber_bin,
};
use serde_json::Value;
use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

/// The longest the relay may take (DEEP10 at 120,000 msg/s is under 4 s).
const RUN: Duration = Duration::from_secs(120);

/// Scrapes `addr` until `ready` holds, for at most `limit`.
fn scrape_until(addr: SocketAddr, limit: Duration, what: &str, ready: impl Fn(&Scrape) -> bool) -> Scrape {
    let deadline = Instant::now() + limit;
    loop {
        match scrape(addr) {
            Ok(s) if ready(&s) => return s,
            Ok(s) if Instant::now() >= deadline => panic!("{addr}: {what} not seen within {limit:?}:\n{}", s.text),
            Err(e) if Instant::now() >= deadline => panic!("{addr}: {what}: {e}"),
            _ => std::thread::sleep(Duration::from_millis(50)),
        }
    }
}

fn n(v: &Value) -> f64 {
    v.as_f64().unwrap_or_else(|| panic!("{v} is not a number"))
}

/// The metrics table of docs/operations.md: every name in a row's first column, and for the rows
/// of deprecated names, `(old, new)`: the name that replaces it is the first one the row's
/// description names.
fn documented_metrics() -> (BTreeSet<String>, Vec<(String, String)>) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/operations.md");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let quoted = |cell: &str| -> Vec<String> { cell.split('`').skip(1).step_by(2).map(str::to_string).collect() };
    let (mut names, mut deprecated) = (BTreeSet::new(), Vec::new());
    for row in text.lines().filter(|l| l.starts_with("| `mdrelay_") || l.starts_with("| `process_")) {
        // Name | type | labels | what it counts.
        let cells: Vec<&str> = row.trim_matches('|').split('|').map(str::trim).collect();
        let first = quoted(cells[0]);
        let description = cells.get(3..).unwrap_or_default().join("|");
        if description.starts_with("deprecated") {
            let new = quoted(&description).into_iter().next().unwrap_or_else(|| panic!("names no replacement: {row}"));
            deprecated.extend(first.iter().map(|old| (old.clone(), new.clone())));
        }
        names.extend(first);
    }
    (names, deprecated)
}

/// The unit words of Prometheus's base units the programs' metrics use.
const UNITS: [&str; 2] = ["bytes", "seconds"];

/// Whether `name` has its unit, if any, last (before `_total` for a counter), as Prometheus's
/// conventions have it: `x_sent_frame_bytes_total`, not `x_frame_bytes_sent_total`.
fn unit_is_last(name: &str) -> bool {
    let words: Vec<&str> = name.strip_suffix("_total").unwrap_or(name).split('_').collect();
    words.iter().enumerate().all(|(at, word)| !UNITS.contains(word) || at + 1 == words.len())
}

#[test]
#[ignore = "long (over 3 s here): .ci/run runs it with --ignored"]
fn the_endpoints_count_what_the_final_reports_say_through_a_format_switch() {
    let (_serial, dir) = alone_in_tempdir();
    let reference = expected("DEEP10.json");
    let (pub_metrics, sub_metrics): (SocketAddr, SocketAddr) = (
        format!("127.0.0.1:{}", free_tcp_port()).parse().unwrap(),
        format!("127.0.0.1:{}", free_tcp_port()).parse().unwrap(),
    );
    let udp_port = free_udp_port();
    let config = dir.path().join("pub.toml");
    // The endpoint is set in the file (as deployed), the rest on the command line.
    let write = |format: &str| {
        let text = deep10_tcp_config(
            format,
            &format!(
                "[udp]\ndestinations = [\"127.0.0.1:{udp_port}\"]\n\
             [retransmit]\nlisten = \"127.0.0.1:0\"\nlinger = 0.1\n\
             [metrics]\nlisten = \"{pub_metrics}\"\nhold = 60\n"
            ),
        );
        std::fs::write(&config, text).unwrap();
    };
    write("sbe");
    let pub_json = dir.path().join("pub.json");
    let mut publisher = Process::start(
        publisher_bin(),
        ["run", "--config", config.to_str().unwrap(), "--json", pub_json.to_str().unwrap()],
    );
    let addr = publisher.serving_on();
    let udp_listen = format!("127.0.0.1:{udp_port}");
    let mut udp_subscriber = Process::start(subscriber_bin(), ["--listen", &udp_listen, "--report-interval", "0"]);
    udp_subscriber.wait_for("listening on");
    let sub_json = dir.path().join("sub.json");
    let mut subscriber = Process::start(
        subscriber_bin(),
        words(&format!(
            "--connect {addr} --json {} {NO_INTERVAL_REPORTS} --metrics-listen {sub_metrics} --metrics-hold 60",
            sub_json.display()
        )),
    );

    // During the run: both endpoints answer and count what has gone by so far.
    let during =
        scrape_until(sub_metrics, RUN, "frames", |s| s.get("mdrelay_sub_frames_total", "").unwrap_or(0.0) > 0.0);
    let so_far = during.get("mdrelay_sub_messages_total", "").unwrap();
    assert!(so_far < n(&reference["messages"]), "the scrape came mid-run: {so_far} messages");
    assert_eq!(during.get("mdrelay_sub_format", "format=\"sbe\""), Some(1.0), "{}", during.text);
    let pub_during = scrape(pub_metrics).unwrap();
    assert_eq!(pub_during.get("mdrelay_pub_subscribers", ""), Some(1.0), "{}", pub_during.text);
    // Queues in series of bounded labels: none names a peer (an ephemeral port a connection).
    for name in ["mdrelay_pub_subscriber_queue_max_records", "mdrelay_pub_subscriber_queued_records"] {
        assert!(pub_during.get(name, "").is_some(), "{name} in:\n{}", pub_during.text);
    }
    assert!(!pub_during.text.contains("peer="), "a label names a peer:\n{}", pub_during.text);
    let sbe_tcp = "format=\"sbe\",transport=\"tcp\"";
    assert!(pub_during.get("mdrelay_pub_frames_sent_total", sbe_tcp).unwrap_or(0.0) > 0.0, "{}", pub_during.text);
    assert_eq!(pub_during.get("mdrelay_pub_format", "format=\"sbe\""), Some(1.0));

    // The format switches mid-stream: the counters split by format.
    write("capnp");
    publisher.signal(Signal::SIGHUP);
    publisher.wait_for("SIGHUP: format changes at the next frame");

    // After the run: the endpoints stay up (metrics.hold) with the final counts.
    subscriber.wait_for_within("metrics endpoint stays up", RUN);
    publisher.wait_for_within("metrics endpoint stays up", RUN);
    let sub = scrape(sub_metrics).unwrap();
    let publ = scrape(pub_metrics).unwrap();

    let report = json_file(&sub_json);
    assert_aggregates(&report, &reference, "the scraped subscriber");
    for (metric, field) in [
        ("mdrelay_sub_frames_total", "frames"),
        ("mdrelay_sub_messages_total", "messages"),
        ("mdrelay_sub_received_bytes_total", "bytes"),
        ("mdrelay_sub_missing_frames", "gaps"),
        ("mdrelay_sub_duplicate_frames_total", "duplicates"),
        ("mdrelay_sub_reordered_frames_total", "reordered"),
        ("mdrelay_sub_decode_errors_total", "decode_errors"),
        ("mdrelay_sub_reconnects_total", "reconnects"),
    ] {
        assert_eq!(sub.get(metric, ""), Some(n(&report[field])), "{metric} against the report's {field}");
    }
    assert_eq!(sub.get("mdrelay_sub_messages_total", ""), Some(n(&reference["messages"])));
    // Frames missing fall as gaps are filled: a level, which a counter must never be (a scraper
    // takes a counter that falls for a restart).
    assert!(sub.text.contains("# TYPE mdrelay_sub_missing_frames gauge"), "{}", sub.text);
    for scrape in [&sub, &publ] {
        for line in scrape.text.lines().filter(|l| l.starts_with("# TYPE ") && l.ends_with(" counter")) {
            assert!(line.split(' ').nth(2).is_some_and(|name| name.ends_with("_total")), "{line}");
        }
    }
    let one_way = "mode=\"one-way\"";
    assert_eq!(sub.get("mdrelay_sub_latency_seconds_count", one_way), Some(n(&report["latency_ns"]["count"])));
    // A histogram of buckets: the report's p50 and max fall in the buckets the scrape's do.
    let buckets = sub.buckets("mdrelay_sub_latency_seconds", one_way);
    assert_eq!(buckets.last().map(|b| b.1), Some(n(&report["latency_ns"]["count"])), "+Inf holds every frame");
    let bucket_of = |seconds: f64| buckets.iter().map(|b| b.0).find(|bound| seconds <= *bound).unwrap();
    for (q, field) in [(0.5, "p50"), (1.0, "max")] {
        let served = sub.quantile_bucket("mdrelay_sub_latency_seconds", one_way, q).unwrap();
        let reported = n(&report["latency_ns"][field]) * 1e-9;
        assert_eq!(served, bucket_of(reported), "{field}: the report's {reported} s against the buckets served");
    }
    assert_eq!(sub.get("mdrelay_sub_format", "format=\"capnp\""), Some(1.0), "{}", sub.text);
    assert_eq!(sub.get("mdrelay_sub_last_sequence", ""), Some(n(&report["frames"])));

    let summary = json_file(&pub_json);
    let frames = n(&summary["totals"]["frames"]);
    assert_eq!(publ.sum("mdrelay_pub_frames_sent_total"), 2.0 * frames, "every frame went to TCP and to UDP");
    for transport in ["tcp", "udp"] {
        let per_format: f64 = ["sbe", "capnp"]
            .iter()
            .map(|f| {
                publ.get("mdrelay_pub_frames_sent_total", &format!("format=\"{f}\",transport=\"{transport}\"")).unwrap()
            })
            .sum();
        assert_eq!(per_format, frames, "{transport}");
        let bytes: f64 = ["sbe", "capnp"]
            .iter()
            .map(|f| {
                publ.get("mdrelay_pub_sent_frame_bytes_total", &format!("format=\"{f}\",transport=\"{transport}\""))
                    .unwrap()
            })
            .sum();
        assert_eq!(bytes, n(&summary["frame_bytes"]), "{transport}");
    }
    let capnp_tcp = "format=\"capnp\",transport=\"tcp\"";
    assert!(publ.get("mdrelay_pub_frames_sent_total", sbe_tcp).unwrap() > 0.0);
    assert!(publ.get("mdrelay_pub_frames_sent_total", capnp_tcp).unwrap() > 0.0);
    assert_eq!(publ.sum("mdrelay_pub_messages_sent_total"), 2.0 * n(&reference["messages"]));
    assert_eq!(publ.get("mdrelay_pub_format_switches_total", ""), Some(n(&summary["format_switches"])));
    assert_eq!(publ.get("mdrelay_pub_format_switches_total", ""), Some(1.0));
    assert_eq!(publ.get("mdrelay_pub_format", "format=\"capnp\""), Some(1.0));
    assert_eq!(publ.get("mdrelay_pub_connections_total", ""), Some(n(&summary["connections"]["connections"])));
    assert_eq!(publ.get("mdrelay_pub_subscribers", ""), Some(0.0), "the subscriber has gone");
    assert_eq!(publ.get("mdrelay_pub_dropped_frames_total", "policy=\"block\""), Some(0.0));
    assert!(publ.get("mdrelay_pub_pacing_lag_seconds", "").is_some());
    assert_eq!(publ.get("mdrelay_pub_retransmit_requests_total", ""), Some(n(&summary["retransmit"]["requests"])));
    // The process, as Prometheus's own clients name it.
    for (s, program) in [(&sub, "mdrelay-sub"), (&publ, "mdrelay-pub")] {
        for name in ["process_resident_memory_bytes", "process_open_fds", "process_threads"] {
            assert!(s.get(name, "").is_some_and(|v| v > 0.0), "{program}: {name} in:\n{}", s.text);
        }
        // Its fraction is checked against /proc in
        // the_cpu_time_served_is_the_kernels_with_its_fraction.
        assert!(s.get("process_cpu_seconds_total", "").is_some(), "{program}: CPU in:\n{}", s.text);
    }
    // The version and the commit in labels of their own (git's hash, `-dirty` for a changed tree).
    let commit = mdrelay_harness::version::expected_commit();
    for (s, program) in [(&sub, "mdrelay-sub"), (&publ, "mdrelay-pub")] {
        let info = s.samples.keys().find(|k| k.starts_with("mdrelay_build_info{")).expect("build info");
        for label in [
            format!("program=\"{program}\""),
            format!("version=\"{}\"", env!("CARGO_PKG_VERSION")),
            format!("revision=\"{commit}"),
        ] {
            assert!(info.contains(&label), "{info} has {label}");
        }
    }

    // A signal ends the hold at once (it is 60 s).
    let started = Instant::now();
    subscriber.signal(Signal::SIGTERM);
    publisher.signal(Signal::SIGTERM);
    assert_eq!(subscriber.finish(STEP).code(), Some(0));
    publisher.finish(STEP).assert_success();
    assert!(started.elapsed() < Duration::from_secs(30));
    udp_subscriber.signal(Signal::SIGTERM);
    let _ = udp_subscriber.finish(STEP);

    // The names: the unit last, every one documented, the deprecated ones still served with the
    // same values as their replacements and read by no dashboard panel or alert.
    let served: BTreeSet<String> = sub.names().union(&publ.names()).cloned().collect();
    let (documented, deprecated) = documented_metrics();
    let old_names: BTreeSet<&str> = deprecated.iter().map(|(old, _)| old.as_str()).collect();
    // A histogram's series by its own name: `x` for `x_bucket`, `x_sum` and `x_count`.
    let families = served.iter().filter(|name| {
        !["_bucket", "_sum", "_count"].iter().any(|s| name.strip_suffix(s).is_some_and(|base| served.contains(base)))
    });
    for name in families {
        assert!(unit_is_last(name) || old_names.contains(name.as_str()), "{name}: the unit is not last");
        assert!(documented.contains(name), "{name} is served but not in docs/operations.md's metrics table");
    }
    for renamed in ["mdrelay_pub_frame_bytes_sent_total", "mdrelay_pub_retransmit_throttled_total"] {
        assert!(old_names.contains(renamed), "docs/operations.md does not list {renamed} as deprecated");
    }
    for (old, new) in &deprecated {
        assert!(served.contains(new) && !old_names.contains(new.as_str()), "{old}: {new} replaces it: {served:?}");
        let series: Vec<(&String, &f64)> =
            publ.samples.iter().chain(&sub.samples).filter(|(k, _)| k.split('{').next() == Some(new)).collect();
        assert!(!series.is_empty(), "{new} in:\n{}", publ.text);
        for (key, value) in series {
            let alias = key.replacen(new.as_str(), old, 1);
            let aliased = publ.samples.get(&alias).or(sub.samples.get(&alias));
            assert_eq!(aliased, Some(value), "{alias}: the same value as {key}");
        }
        assert!(
            publ.text.contains(&format!("# HELP {old} Deprecated"))
                || sub.text.contains(&format!("# HELP {old} Deprecated")),
            "{old}'s help says it is deprecated"
        );
    }
    assert_eq!(
        publ.get("mdrelay_pub_retransmit_throttled_requests_total", ""),
        Some(n(&summary["retransmit"]["throttled"]))
    );

    // Every series the dashboard queries is one the programs serve (a relay's upstream series are
    // checked where a relay runs, in tests/chain.rs), and none is deprecated.
    let queried = dashboard_queries();
    assert!(queried.len() >= 10, "the dashboard queries too little: {queried:?}");
    for name in &queried {
        assert!(!old_names.contains(name.as_str()), "the dashboard queries {name}, which is deprecated");
    }
    for name in queried.iter().filter(|n| !n.starts_with("mdrelay_pub_upstream_")) {
        assert!(
            served.contains(name),
            "the dashboard queries {name}, which neither program serves; served: {served:?}"
        );
    }
    // And every series an alert reads (the recording's are served only while a subscriber
    // records: they are checked where one does, in subscriber/tests/it/files.rs; the NATS
    // output's where it runs, in tests/it/nats_hostile.rs).
    let alerted = alert_queries();
    assert!(alerted.len() >= 5, "the alerts read too little: {alerted:?}");
    for name in &alerted {
        assert!(!old_names.contains(name.as_str()), "an alert reads {name}, which is deprecated");
    }
    for name in alerted.iter().filter(|n| !n.starts_with("mdrelay_sub_record_") && !n.starts_with("mdrelay_pub_nats_"))
    {
        assert!(served.contains(name), "an alert reads {name}, which neither program serves; served: {served:?}");
    }
}

/// The CPU time `pid` has used, user and system, in seconds, as the kernel counts it in
/// /proc/PID/stat (utime and stime, in clock ticks of `ticks_per_second`).
fn cpu_seconds(pid: u32, ticks_per_second: f64) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // The command's name (field 2) is in parentheses and may hold spaces: count from after it.
    let fields: Vec<&str> = stat[stat.rfind(')').unwrap() + 1..].split_whitespace().collect();
    // utime and stime are fields 14 and 15 of proc(5); the first after the name is field 3.
    let ticks: u64 = fields[14 - 3].parse::<u64>().unwrap() + fields[15 - 3].parse::<u64>().unwrap();
    ticks as f64 / ticks_per_second
}

#[test]
fn the_cpu_time_served_is_the_kernels_with_its_fraction() {
    let _shared = mdrelay_harness::shared();
    let clock = std::process::Command::new("getconf").arg("CLK_TCK").output().expect("getconf CLK_TCK");
    let ticks_per_second: f64 = String::from_utf8_lossy(&clock.stdout).trim().parse().expect("CLK_TCK");
    let metrics: SocketAddr = format!("127.0.0.1:{}", free_tcp_port()).parse().unwrap();
    let udp = format!("127.0.0.1:{}", free_udp_port());
    // A stream that keeps the publisher busy for up to 10 s: it is stopped once seen.
    let mut publisher = Process::start(
        publisher_bin(),
        words(&format!(
            "run --synthetic --messages 2000000 --pacing rate --rate 200000 --udp {udp} --metrics-listen {metrics}"
        )),
    );
    publisher.wait_for("serving Prometheus metrics");
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut served = Vec::new();
    loop {
        // The scrape reads /proc between these two reads: it serves a value between them.
        let before = cpu_seconds(publisher.pid(), ticks_per_second);
        let s = scrape(metrics).unwrap();
        let after = cpu_seconds(publisher.pid(), ticks_per_second);
        assert!(s.text.contains("# TYPE process_cpu_seconds_total counter\n"), "{}", s.text);
        let cpu = s.get("process_cpu_seconds_total", "").unwrap_or_else(|| panic!("no CPU time in:\n{}", s.text));
        assert!(before - 1e-9 <= cpu && cpu <= after + 1e-9, "served {cpu} s; /proc said {before} s, then {after} s");
        served.push(cpu);
        // Cut to whole seconds, a busy second's CPU time would show as 0 here.
        if cpu.fract() != 0.0 {
            break;
        }
        assert!(Instant::now() < deadline, "only whole seconds served: {served:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
    publisher.signal(Signal::SIGTERM);
    publisher.finish(STEP).assert_success();
}

#[test]
fn an_endpoint_that_cannot_be_bound_is_refused_by_name() {
    let _shared = mdrelay_harness::shared();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let published = Process::start(
        publisher_bin(),
        ["run", "--synthetic", "--messages", "1000", "--udp", "127.0.0.1:9", "--metrics-listen", &addr],
    )
    .finish(STEP);
    assert_ne!(published.code(), Some(0));
    assert!(published.stderr.contains("metrics.listen") && published.stderr.contains(&addr), "{published:?}");
    let subscribed =
        Process::start(subscriber_bin(), ["--listen", "127.0.0.1:0", "--metrics-listen", &addr]).finish(STEP);
    assert_eq!(subscribed.code(), Some(1), "{subscribed:?}");
    assert!(subscribed.stderr.contains("metrics.listen"), "{subscribed:?}");
    let absurd =
        Process::start(subscriber_bin(), ["--listen", "127.0.0.1:0", "--metrics-listen", "nowhere"]).finish(STEP);
    assert_eq!(absurd.code(), Some(2), "{absurd:?}");
    assert!(absurd.stderr.contains("metrics.listen"), "{absurd:?}");
}

#[test]
#[ignore = "long (over 3 s here): .ci/run runs it with --ignored"]
fn a_scraper_that_connects_and_goes_silent_holds_up_neither_the_relay_nor_other_scrapes() {
    let _serial = serial();
    let metrics: SocketAddr = format!("127.0.0.1:{}", free_tcp_port()).parse().unwrap();
    let udp_port = free_udp_port();
    let mut publisher = Process::start(
        publisher_bin(),
        [
            "run",
            "--synthetic",
            "--messages",
            "200000",
            "--pacing",
            "rate",
            "--rate",
            "100000",
            "--udp",
            &format!("127.0.0.1:{udp_port}"),
            "--metrics-listen",
            &metrics.to_string(),
        ],
    );
    publisher.wait_for("serving Prometheus metrics");
    // Silent connections: connected, never a byte of request; and one that sends half a request.
    let silent: Vec<_> = (0..50).map(|_| std::net::TcpStream::connect(metrics).unwrap()).collect();
    let mut half = std::net::TcpStream::connect(metrics).unwrap();
    std::io::Write::write_all(&mut half, b"GET /metr").unwrap();
    let s = scrape_until(metrics, STEP, "frames", |s| s.sum("mdrelay_pub_frames_sent_total") > 0.0);
    assert!(s.get("mdrelay_pub_pacing_lag_seconds", "").is_some());
    // Dozens of frames fall in each of the default profile's 1 ms duty cycles at this rate:
    // some went out early, none more than the duty cycle.
    let lead = s.get("mdrelay_pub_pacing_lead_seconds", "").unwrap();
    let duty_cycle = mdrelay_runtime::idle::duty_cycle(mdrelay_runtime::idle::Profile::Default).as_secs_f64();
    assert!(lead > 0.0 && lead <= duty_cycle, "lead {lead} s against a duty cycle of {duty_cycle} s");
    let published = publisher.finish(RUN);
    published.assert_success();
    drop(silent);
}

#[test]
fn the_dashboards_sequence_series_has_an_axis_of_its_own() {
    let _shared = mdrelay_harness::shared();
    // A sequence number (millions) beside a count of format switches (a few) on one axis leaves
    // the switches flat at zero.
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/grafana/mdrelay.json");
    let dashboard: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let mut checked = 0;
    for panel in dashboard["panels"].as_array().unwrap() {
        let targets = panel["targets"].as_array().map(Vec::as_slice).unwrap_or_default();
        for target in targets.iter().filter(|t| t["expr"].as_str().unwrap_or_default().contains("last_sequence")) {
            checked += 1;
            if targets.len() == 1 {
                continue;
            }
            let on_the_right = panel["fieldConfig"]["overrides"].as_array().into_iter().flatten().any(|o| {
                o["matcher"]["id"] == "byFrameRefID"
                    && o["matcher"]["options"] == target["refId"]
                    && o["properties"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .any(|p| p["id"] == "custom.axisPlacement" && p["value"] == "right")
            });
            assert!(
                on_the_right,
                "panel {:?} plots {} on the axis of its other series",
                panel["title"], target["expr"]
            );
        }
    }
    assert!(checked > 0, "the dashboard plots the subscriber's last sequence");
}

#[test]
fn a_subscriber_that_has_received_nothing_shows_no_latency_quantiles() {
    let _shared = mdrelay_harness::shared();
    let metrics: SocketAddr = format!("127.0.0.1:{}", free_tcp_port()).parse().unwrap();
    let mut subscriber = Process::start(
        subscriber_bin(),
        ["--listen", "127.0.0.1:0", "--report-interval", "0", "--metrics-listen", &metrics.to_string()],
    );
    subscriber.wait_for("listening on");
    let empty = scrape_until(metrics, RUN, "the latency histogram", |s| {
        s.get("mdrelay_sub_latency_seconds_count", "mode=\"one-way\"").is_some()
    });
    // Nothing measured is no latency: not a quantile of 0 s, as the exporter's summary showed.
    assert!(!empty.text.contains("quantile="), "{}", empty.text);
    assert_eq!(empty.get("mdrelay_sub_latency_seconds_count", "mode=\"one-way\""), Some(0.0));
    assert_eq!(empty.quantile_bucket("mdrelay_sub_latency_seconds", "mode=\"one-way\"", 0.5), None);
    assert!(empty.buckets("mdrelay_sub_latency_seconds", "mode=\"one-way\"").iter().all(|(_, count)| *count == 0.0));
    subscriber.signal(Signal::SIGTERM);
    assert_eq!(subscriber.finish(STEP).code(), Some(0));
}

#[test]
#[ignore = "long (over 3 s here): .ci/run runs it with --ignored"]
fn under_a_service_manager_the_publisher_says_ready_keeps_the_watchdog_fed_and_says_stopping() {
    let _shared = mdrelay_harness::shared();
    let manager = NotifySocket::bind();
    // About a second of stream, the watchdog asking every 200 ms.
    let args =
        ["run", "--synthetic", "--messages", "20000", "--pacing", "rate", "--rate", "20000", "--tcp", "127.0.0.1:0"];
    let mut publisher = manager.start(&publisher_bin(), &args, Some(Duration::from_millis(200)));
    let said = manager.until("STOPPING=1", Duration::from_secs(60));
    publisher.serving_on();
    publisher.finish(Duration::from_secs(60)).assert_success();
    assert!(said[0].contains("READY=1") && said[0].contains("STATUS=relaying"), "ready first: {said:?}");
    let fed = said.iter().filter(|m| m.contains("WATCHDOG=1")).count();
    assert!(fed >= 3, "the watchdog fed every 100 ms through the run: {said:?}");
    assert_eq!(said.iter().filter(|m| m.contains("READY=1")).count(), 1, "{said:?}");
}

#[test]
fn under_a_service_manager_the_subscriber_says_ready_once_listening_and_stopping_on_sigterm() {
    let _shared = mdrelay_harness::shared();
    let manager = NotifySocket::bind();
    let mut subscriber = manager.start(
        &subscriber_bin(),
        &["--listen", "127.0.0.1:0", "--report-interval", "0"],
        Some(Duration::from_millis(200)),
    );
    let ready = manager.until("READY=1", STEP);
    subscriber.wait_for("listening on");
    assert!(ready[0].contains("STATUS=receiving"), "{ready:?}");
    // Idle, it still feeds the watchdog: the runtime is alive.
    let fed = manager.until("WATCHDOG=1", STEP);
    assert_eq!(fed.len(), 1, "nothing else before: {fed:?}");
    subscriber.signal(Signal::SIGTERM);
    manager.until("STOPPING=1", STEP);
    assert_eq!(subscriber.finish(STEP).code(), Some(0));
}

#[test]
#[ignore = "long (over 3 s here): .ci/run runs it with --ignored"]
fn readyz_says_a_subscriber_is_ready_only_while_connected_and_healthz_while_it_runs() {
    let _serial = serial();
    let metrics: SocketAddr = format!("127.0.0.1:{}", free_tcp_port()).parse().unwrap();
    let tcp = format!("127.0.0.1:{}", free_tcp_port());
    // The subscriber first: nothing listens at its publisher's address yet, so it retries.
    let metrics_arg = metrics.to_string();
    let mut subscriber = Process::start(
        subscriber_bin(),
        ["--connect", &tcp, "--report-interval", "0", "--metrics-listen", &metrics_arg, "--metrics-hold", "60"],
    );
    let status = |path: &str| get(metrics, path).map(|(status, _)| status);
    let deadline = Instant::now() + STEP;
    while status("/healthz") != Ok(200) {
        assert!(Instant::now() < deadline, "/healthz: {:?}", status("/healthz"));
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(status("/readyz"), Ok(503), "not connected yet: not ready");
    assert_eq!(status("/nowhere"), Ok(404));
    let wait_for = |wanted: u16, when: &str| {
        let deadline = Instant::now() + STEP;
        while status("/readyz") != Ok(wanted) {
            assert!(Instant::now() < deadline, "/readyz {when}: {:?}", status("/readyz"));
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    let publish = |messages: &str| {
        Process::start(
            publisher_bin(),
            ["run", "--synthetic", "--messages", messages, "--pacing", "rate", "--rate", "50000", "--tcp", &tcp],
        )
    };
    // The publisher comes; once connected the subscriber is ready.
    let first = publish("10000000");
    subscriber.wait_for("connected");
    wait_for(200, "once connected");
    // Its publisher killed, it is not ready while it reconnects; ready again with the next one.
    first.signal(Signal::SIGKILL);
    let _ = first.finish(STEP);
    subscriber.wait_for("connection lost");
    wait_for(503, "while reconnecting");
    let publisher = publish("100000");
    subscriber.wait_for("reconnected");
    wait_for(200, "once reconnected");
    publisher.finish(RUN).assert_success();
    // The stream over, it holds its endpoint up: alive, no longer ready.
    subscriber.wait_for_within("metrics endpoint stays up", RUN);
    assert_eq!(status("/readyz"), Ok(503), "the stream is over");
    assert_eq!(status("/healthz"), Ok(200));
    subscriber.signal(Signal::SIGTERM);
    assert_eq!(subscriber.finish(STEP).code(), Some(0));
}
