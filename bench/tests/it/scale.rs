//! `mdrelay-bench scale` as users run it, on real processes but short: the samples, the delivery
//! check and the summary in its JSON; its arguments; and an interrupted run leaving neither
//! processes nor its capture behind. No figure is asserted: the host decides those.

use crate::outputs::{Outputs, assert_each_fails_naming, assert_help_lists, read_json};
use mdrelay_harness::{Process, Signal};
use std::path::Path;
use std::time::{Duration, Instant};

const BENCH: &str = env!("CARGO_BIN_EXE_mdrelay-bench");

/// Starts `mdrelay-bench ARGS` with its temporary files in `tmp`.
fn start(args: &[&str], tmp: &Path) -> Process {
    Process::spawn(BENCH, args, &[("TMPDIR", tmp.to_str().unwrap())]).expect("starting mdrelay-bench")
}

/// What is left in `dir`: the run's temporary directory should not be.
fn left_in(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect()
}

#[test]
#[ignore = "long (over 3 s here): .ci/run runs it with --ignored"]
fn a_short_run_samples_all_three_processes_and_checks_delivery() {
    let _serial = mdrelay_harness::serial();
    let out = Outputs::new("scale.json");
    let tmp = tempfile::tempdir().unwrap();
    // Two million messages: at the publisher's top speed (10 M msg/s over TCP) at least 0.2 s of
    // stream, so each subscriber prints a few of its 50 ms interval lines whatever the host.
    const MESSAGES: u64 = 2_000_000;
    let messages = MESSAGES.to_string();
    let args = out.args(&["scale", "--messages", &messages, "--sample-ms", "50", "--timeout", "120"]);
    let done = start(&args, tmp.path()).finish(Duration::from_secs(150));
    done.assert_success();
    assert!(done.stdout.contains("| time s | pub RSS MiB | sub1 RSS MiB | sub2 RSS MiB |"), "{done:?}");
    assert!(done.stdout.contains("Delivered: both subscribers"), "{done:?}");
    assert_eq!(left_in(tmp.path()), Vec::<String>::new(), "the capture's directory is left behind");
    let table = std::fs::read_to_string(out.plots.join("scale.md")).unwrap();
    assert!(table.contains("RSS flat:") && table.contains("Throughput steady:"), "{table}");
    let svg = std::fs::read_to_string(out.plots.join("scale.svg")).unwrap();
    assert!(svg.starts_with("<svg") && svg.contains("resident memory") && svg.contains("sub2"), "{svg}");

    let report = read_json(&out.json);
    assert!(report["capture_bytes"].as_u64().unwrap() > 1_000_000, "{}", report["capture_bytes"]);
    let samples = report["samples"].as_array().unwrap();
    let running =
        samples.iter().filter(|s| (0..3).all(|i| s["processes"][i]["rss_kib"].as_u64().is_some_and(|k| k > 0))).count();
    assert!(running >= 1, "no sample with all three processes' RSS: {samples:?}");
    for s in samples {
        for i in 0..3 {
            assert!(s["processes"][i]["cpu_seconds"].as_f64().is_none_or(|c| c >= 0.0), "{s}");
        }
    }

    assert_eq!(report["publisher_messages"], MESSAGES, "{}", report["problems"]);
    assert_eq!(report["delivered"], true, "{}", report["problems"]);
    let subscribers = report["subscribers"].as_array().unwrap();
    assert_eq!(subscribers.len(), 2);
    for sub in subscribers {
        assert_eq!(sub["messages"], report["publisher_messages"], "{sub}");
        assert_eq!(sub["frames"], report["publisher_frames"], "{sub}");
        assert_eq!((&sub["gaps"], &sub["totals_match"]), (&0.into(), &true.into()), "{sub}");
        let intervals = sub["intervals"].as_array().unwrap();
        assert!(!intervals.is_empty(), "no interval line read from {}", sub["name"]);
        let counts: Vec<u64> = intervals.iter().map(|i| i["messages"].as_u64().unwrap()).collect();
        assert!(counts.is_sorted() && counts.last() <= Some(&MESSAGES), "{counts:?}");
        let frames: Vec<u64> = intervals.iter().map(|i| i["frames"].as_u64().unwrap()).collect();
        assert!(frames.is_sorted() && frames.last() <= sub["frames"].as_u64().as_ref(), "{frames:?}");
    }

    let summary = &report["summary"];
    let rss = summary["rss"].as_array().unwrap();
    let processes: Vec<&str> = rss.iter().map(|r| r["process"].as_str().unwrap()).collect();
    assert_eq!(processes, ["mdrelay-pub", "sub1", "sub2"]);
    for r in rss {
        for field in ["first_kib", "last_kib", "max_kib", "growth_kib", "excursion_kib", "bound_kib"] {
            assert!(r[field].as_u64().is_some() || r[field].as_i64().is_some(), "{field}: {r}");
        }
        assert!(r["max_kib"].as_u64().unwrap() > 0 && r["flat"].is_boolean(), "{r}");
        assert!(r["cpu_seconds"].as_f64().unwrap() > 0.0, "{r}");
    }
    assert!(summary["rss_flat"].is_boolean() && summary["rss_bound"].is_string(), "{summary}");
    let throughput = summary["throughput"].as_array().unwrap();
    assert_eq!(throughput.len(), 2, "{summary}");
    for t in throughput {
        for field in ["intervals", "full_intervals", "min", "p50", "max", "max_deviation_percent", "steady"] {
            assert!(t.get(field).is_some(), "{field}: {t}");
        }
        assert!(t["overall_rate"].as_f64().unwrap() > 0.0, "{t}");
    }
    assert!(summary.get("throughput_steady").is_some() && summary["throughput_bound"].is_string(), "{summary}");
    assert!(summary["overall_rate"].as_f64().unwrap() > 0.0, "{summary}");
}

#[test]
fn bad_arguments_fail_with_a_message_naming_the_flag() {
    let tmp = tempfile::tempdir().unwrap();
    let missing = tmp.path().join("missing.pcap");
    let missing = missing.to_str().unwrap();
    let run = |args: &[&str]| start(args, tmp.path()).finish(Duration::from_secs(30));
    assert_each_fails_naming(
        run,
        &[
            (&["scale", "--messages", "0"][..], "--messages"),
            (&["scale", "--sample-ms", "0"][..], "--sample-ms"),
            (&["scale", "--timeout", "0"][..], "--timeout"),
            (&["scale", "--capture", missing][..], "--capture"),
            (&["scale", "--capture", missing, "--messages", "5"][..], "--messages"),
            (&["scale", "--format", "morse"][..], "morse"),
        ],
    );
    let help = run(&["scale", "--help"]);
    assert_help_lists(&help, &["--messages", "--capture", "--format", "--sample-ms", "--timeout", "--json", "--plots"]);
}

/// The children of `pid`, from /proc.
fn children(pid: u32) -> Vec<u32> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(child) = entry.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{child}/stat")) else { continue };
        // The parent is the second field after the command name, which is in parentheses.
        let ppid = stat.rfind(')').and_then(|i| stat[i + 1..].split_whitespace().nth(1)?.parse::<u32>().ok());
        if ppid == Some(pid) {
            found.push(child);
        }
    }
    found
}

#[test]
#[ignore = "long (over 3 s here): .ci/run runs it with --ignored"]
fn an_interrupted_run_kills_its_processes_and_removes_its_capture() {
    let _serial = mdrelay_harness::serial();
    let tmp = tempfile::tempdir().unwrap();
    let out = Outputs::new("scale.json");
    // Three million messages: seconds of streaming, ample time for the signal to land mid-run.
    let args = out.args(&["scale", "--messages", "3000000", "--timeout", "120"]);
    let mut bench = start(&args, tmp.path());
    bench.wait_for_within("relaying at top speed", Duration::from_secs(60));
    let kids = children(bench.pid());
    assert_eq!(kids.len(), 3, "mdrelay-pub and two mdrelay-sub: {kids:?}");
    assert!(!left_in(tmp.path()).is_empty(), "no temporary directory while the run goes on");
    // To mdrelay-bench alone, as a supervisor would: its children must be stopped by it.
    let sent = Instant::now();
    bench.signal(Signal::SIGINT);
    let done = bench.finish(Duration::from_secs(30));
    assert_ne!(done.code(), Some(0), "{done:?}");
    assert!(done.stderr.contains("interrupted"), "{done:?}");
    assert!(sent.elapsed() < Duration::from_secs(10), "took {:?} to stop", sent.elapsed());
    for pid in kids {
        assert!(!Path::new(&format!("/proc/{pid}")).exists(), "child {pid} outlived the run: {done:?}");
    }
    assert_eq!(left_in(tmp.path()), Vec::<String>::new(), "the capture's directory is left behind");
    assert!(!out.json.exists(), "an interrupted run wrote a report");
}
