//! `mdrelay-bench loopback` as users run it: its arguments, and short runs that write the table,
//! the JSON and the plots. No timing is asserted: the host decides those.

use crate::outputs::{Outputs, assert_each_fails_naming, assert_help_lists, read_json};
use mdrelay_harness::Process;
use std::path::Path;
use std::time::Duration;

const BENCH: &str = env!("CARGO_BIN_EXE_mdrelay-bench");

/// Runs `mdrelay-bench ARGS` to its end (at most four minutes: longer than the bench's own
/// limits on its runs, so that a run it gives up on is reported with its programs' output).
fn bench(args: &[&str]) -> mdrelay_harness::Finished {
    Process::start(BENCH, args).finish(Duration::from_secs(240))
}

/// Runs `mdrelay-bench loopback ARGS` (words apart at spaces) with `--json` and `--plots` in a
/// fresh directory, alone on the host, and checks that it succeeded. Returns the host's lock (held
/// while the test reads the outputs), the outputs and the run.
fn loopback_run(args: &str) -> (mdrelay_harness::serial::Serial, Outputs, mdrelay_harness::Finished) {
    let serial = mdrelay_harness::serial();
    let out = Outputs::new("loopback.json");
    let args: Vec<&str> = ["loopback"].into_iter().chain(args.split_whitespace()).collect();
    let done = bench(&out.args(&args));
    done.assert_success();
    (serial, out, done)
}

#[test]
fn help_lists_the_flags_and_bad_values_fail_with_a_message() {
    let help = bench(&["loopback", "--help"]);
    assert_help_lists(
        &help,
        &[
            "--transport",
            "--rate",
            "--top-speed",
            "--profile",
            "--json",
            "--plots",
            "--coalesce-bytes",
            "--hot-core",
            "--sub-core",
            "--nats-cluster",
            "--nats-storage",
            "--nats-bench-messages",
        ],
    );
    assert!(help.stdout.contains("multicast") && help.stdout.contains("low-latency"), "{help:?}");
    assert!(help.stdout.contains("nats"), "{help:?}");
    assert_each_fails_naming(
        bench,
        &[
            (&["loopback", "--transport", "carrier-pigeon"][..], "carrier-pigeon"),
            (&["loopback", "--profile", "fastest"][..], "fastest"),
            (&["loopback", "--rate", "lots"][..], "lots"),
            (&["loopback", "--rate", "0"][..], "--rate"),
            (&["loopback", "--floor-bytes", "4"][..], "--floor-bytes"),
            (&["loopback", "--formats", "morse"][..], "morse"),
            (&["loopback", "--transport", "udp", "--nats-cluster"][..], "--nats-cluster"),
            (&["loopback", "--nats-storage", "paper"][..], "paper"),
        ],
    );
}

#[test]
#[ignore = "long (over 3 s here): .ci/run runs it with --ignored"]
fn a_short_latency_run_writes_the_floor_and_every_format() {
    let (_serial, out, done) = loopback_run("--formats sbe,raw --transport tcp --messages 10000 --rate 20000");
    assert!(done.stdout.contains("| floor (socket ping-pong"), "{done:?}");
    let table = std::fs::read_to_string(out.plots.join("loopback.md")).unwrap();
    assert!(table.contains("| sbe |") && table.contains("| raw |"), "{table}");
    let svg = std::fs::read_to_string(out.plots.join("latency-tcp.svg")).unwrap();
    assert!(svg.starts_with("<svg") && svg.contains("99.9%") && svg.contains("floor"), "{svg}");

    let report = read_json(&out.json);
    let floors = report["floors"].as_array().unwrap();
    assert_eq!(floors.len(), 1, "{report}");
    assert_eq!(floors[0]["transport"], "tcp");
    assert!(floors[0]["echoes"].as_u64().unwrap() > 0 && floors[0]["one_way_ns"]["p50"].as_u64().unwrap() > 0);
    // The waits alone, at the relay's frame rate, as the default profile's publisher waits.
    let pacing = &report["pacing_floor"];
    assert_eq!(pacing["idle"], "backoff", "{report}");
    assert!(pacing["waits"].as_u64().unwrap() >= 100 && pacing["late_ns"]["count"] == pacing["waits"], "{pacing}");
    assert!(pacing["cpu_percent"].as_f64().is_some_and(|c| (0.0..=100.5).contains(&c)), "{pacing}");
    assert!(table.contains("Pacing floor:"), "{table}");
    let rows = report["rows"].as_array().unwrap();
    let formats: Vec<&str> = rows.iter().map(|r| r["format"].as_str().unwrap()).collect();
    assert_eq!(formats, ["sbe", "raw"], "{report}");
    for row in rows {
        // Heartbeats weigh one in the pacer, so its rate is at least the messages' rate.
        assert!(row["paced_rate"].as_f64().unwrap() >= row["sent_rate"].as_f64().unwrap(), "{row}");
        assert!(row["publisher_cpu_percent"].as_f64().unwrap() > 0.0, "{row}");
        assert!(row["publisher_cpu_ms_per_million"].as_f64().unwrap() > 0.0, "{row}");
        assert_eq!(row["messages_received"], 10_000, "{row}");
        assert_eq!(row["totals_match"], true, "{row}");
        assert!(row["latency_ns"]["p99"].as_u64().unwrap() > 0, "{row}");
        assert!(row["p50_vs_floor"].as_f64().unwrap() > 0.0, "{row}");
        assert!(!row["curve"].as_array().unwrap().is_empty(), "{row}");
        for side in ["publisher", "subscriber"] {
            assert!(row[side]["peak_rss_kib"].as_u64().unwrap() > 0, "{side}: {row}");
            assert_eq!(row[side]["complete"], true, "{side}: {row}");
        }
    }
}

#[test]
#[ignore = "long (over 3 s here): .ci/run runs it with --ignored"]
fn a_short_top_speed_run_reports_throughput_and_a_bar_chart() {
    let _serial = mdrelay_harness::serial();
    let dir = tempfile::tempdir().unwrap();
    let plots = dir.path().join("plots");
    // Without --json, the JSON goes beside the table and plots.
    let json = plots.join("loopback.json");
    let done = bench(&[
        "loopback",
        "--top-speed",
        "--formats",
        "sbe",
        "--transport",
        "udp",
        "--messages",
        "20000",
        "--coalesce-bytes",
        "65536",
        "--plots",
        plots.to_str().unwrap(),
    ]);
    done.assert_success();
    assert!(done.stdout.contains("msg/s delivered"), "{done:?}");
    assert!(std::fs::read_to_string(plots.join("throughput.svg")).unwrap().starts_with("<svg"));
    let report = read_json(&json);
    assert_eq!(report["mode"], "top-speed");
    assert!(report["floors"].as_array().unwrap().is_empty(), "{report}");
    let row = &report["rows"][0];
    assert_eq!((&row["transport"], &row["format"]), (&"udp".into(), &"sbe".into()), "{report}");
    assert_eq!(row["messages_sent"], 20_000, "{row}");
    assert!(row["delivered_rate"].as_f64().unwrap() > 0.0 && row["loss_percent"].as_f64().is_some(), "{row}");
}

/// The NATS rows of a report, after checking the TCP row that they are compared with is there.
fn nats_rows(report: &serde_json::Value, messages: u64) -> Vec<serde_json::Value> {
    let rows = report["rows"].as_array().unwrap();
    assert_eq!(rows[0]["transport"], "tcp", "the TCP fan-out first, as the reference: {report}");
    for row in rows {
        // Lossless and exact on every transport: the totals of the publisher's END.
        assert_eq!(row["messages_received"], messages, "{row}");
        assert_eq!(row["frames_lost"], 0, "{row}");
        assert_eq!(row["totals_match"], true, "{row}");
        assert!(row["delivered_rate"].as_f64().unwrap() > 0.0, "{row}");
    }
    rows.iter().filter(|r| r["nats"].is_object()).cloned().collect()
}

#[test]
#[ignore = "long (over 3 s here): .ci/run runs it with --ignored"]
fn nats_rows_come_beside_tcp_with_nats_bench_as_the_floor() {
    let (_serial, out, _) = loopback_run(
        "--top-speed --transport nats --nats-cluster --formats sbe --messages 20000 --coalesce-bytes 8192 --nats-bench-messages 2000",
    );
    let report = read_json(&out.json);
    let transports: Vec<&str> =
        report["rows"].as_array().unwrap().iter().map(|r| r["transport"].as_str().unwrap()).collect();
    assert_eq!(transports, ["tcp", "nats", "nats-cluster"], "{report}");
    let rows = nats_rows(&report, 20_000);
    for (row, replicas) in rows.iter().zip([1, 3]) {
        let nats = &row["nats"];
        assert_eq!(nats["replicas"], replicas, "{row}");
        // Coalesced: several frames per message, none above the budget.
        let bytes = nats["message_bytes"].as_f64().unwrap();
        assert!(bytes > 200.0 && bytes <= 8192.0, "{row}");
        assert!(nats["market_messages_per_message"].as_f64().unwrap() > 2.0, "{row}");
        assert!(nats["messages_per_second"].as_f64().unwrap() > 0.0, "{row}");
        // The floor ran through the same server with that size, core and JetStream.
        let floor = &nats["floor"];
        assert_eq!(floor["message_bytes"].as_f64().unwrap(), bytes.round(), "{row}");
        assert_eq!(floor["messages"], 2000, "{row}");
        // A core subscriber the server finds too slow (a loaded host) is cut off, and that
        // half of the floor is left out; one of the two always stands.
        let core = floor["core_per_second"].as_f64();
        let jetstream = floor["jetstream_per_second"].as_f64();
        assert!(core.is_some() || jetstream.is_some(), "{row}");
        for (rate, ratio) in [(core, &nats["vs_core"]), (jetstream, &nats["vs_jetstream"])] {
            assert_eq!(rate.is_some(), ratio.is_number(), "{row}");
            assert!(rate.is_none_or(|r| r > 0.0) && ratio.as_f64().is_none_or(|r| r > 0.0), "{row}");
        }
    }
    let table = std::fs::read_to_string(out.plots.join("loopback.md")).unwrap();
    assert!(
        table.contains("nats bench JetStream msg/s") && table.contains("| nats-cluster | sbe | 8192 | 3 |"),
        "{table}"
    );
    assert!(table.contains("≥ 5 M market msg/s through one server"), "{table}");
}

#[test]
#[ignore = "long (over 3 s here): .ci/run runs it with --ignored"]
fn nats_latency_rows_are_read_against_the_tcp_floor() {
    let (_serial, out, _) = loopback_run("--transport nats --formats sbe --messages 10000 --rate 20000");
    let report = read_json(&out.json);
    let floors: Vec<&str> =
        report["floors"].as_array().unwrap().iter().map(|f| f["transport"].as_str().unwrap()).collect();
    assert_eq!(floors, ["tcp", "nats"], "{report}");
    let rows = nats_rows(&report, 10_000);
    assert_eq!(rows.len(), 1, "{report}");
    assert!(
        rows[0]["latency_ns"]["p99"].as_u64().unwrap() > 0 && rows[0]["p50_vs_floor"].as_f64().is_some(),
        "{report}"
    );
    // No floor of nats bench at a fixed rate: it measures throughput.
    assert!(rows[0]["nats"]["floor"].is_null(), "{report}");
    let table = std::fs::read_to_string(out.plots.join("loopback.md")).unwrap();
    assert!(table.contains("### nats at 20,000 msg/s") && table.contains("floor (TCP socket ping-pong"), "{table}");
    assert!(std::fs::read_to_string(out.plots.join("latency-nats.svg")).unwrap().starts_with("<svg"));
}

/// A first run, with neither of the relay's programs beside the benchmark: it says what it
/// builds and why, builds both in one cargo invocation with cargo's output shown (no
/// `--quiet`), then prints a line per step with how far along it is, to the last. The cargo it
/// runs (`$CARGO`) is a stand-in that records its arguments and links the programs this test
/// built: a real build into a fresh target directory takes tens of minutes here.
#[test]
#[ignore = "long (over 3 s here): .ci/run runs it with --ignored"]
fn a_first_run_builds_both_programs_in_one_cargo_saying_so_and_shows_every_step() {
    let _serial = mdrelay_harness::serial();
    let dir = tempfile::tempdir().unwrap();
    let real = Path::new(BENCH);
    let profile = real.parent().and_then(Path::file_name).unwrap();
    let target = dir.path().join("target");
    let profile_dir = target.join(profile);
    std::fs::create_dir_all(profile_dir.join("deps")).unwrap();
    let bench_copy = profile_dir.join("mdrelay-bench");
    std::fs::copy(real, &bench_copy).unwrap();
    let calls = dir.path().join("cargo-calls");
    let cargo = dir.path().join("cargo");
    std::fs::write(
        &cargo,
        format!(
            "#!/bin/sh\necho \"$*\" >> '{calls}'\necho '   Compiling mdrelay-publisher (stand-in)' >&2\n\
             ln -s '{publisher}' '{dir}/mdrelay-pub'\nln -s '{subscriber}' '{dir}/mdrelay-sub'\n",
            calls = calls.display(),
            publisher = mdrelay_harness::publisher_bin().display(),
            subscriber = mdrelay_harness::subscriber_bin().display(),
            dir = profile_dir.display(),
        ),
    )
    .unwrap();
    std::fs::set_permissions(&cargo, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();

    let plots = dir.path().join("plots");
    let mut command = std::process::Command::new(&bench_copy);
    command.args(["loopback", "--formats", "sbe,raw", "--messages", "5000", "--rate", "20000", "--plots"]);
    command.arg(&plots).env("CARGO", &cargo);
    let done = Process::spawn_command("mdrelay-bench", command).unwrap().finish(Duration::from_secs(240));
    done.assert_success();

    let calls = std::fs::read_to_string(&calls).unwrap();
    assert_eq!(calls.lines().count(), 1, "one cargo invocation builds both: {calls}");
    let profile_args = match profile.to_string_lossy().as_ref() {
        "debug" => String::new(),
        "release" => "--release ".into(),
        other => format!("--profile {other} "),
    };
    let expected = format!(
        "build -p mdrelay-publisher --bin mdrelay-pub -p mdrelay-subscriber --bin mdrelay-sub {profile_args}--target-dir {}",
        target.display()
    );
    assert_eq!(calls.trim(), expected, "cargo's output is shown, not --quiet");
    let stderr = &done.stderr;
    let said = stderr.lines().find(|line| line.starts_with("building ")).unwrap_or_else(|| panic!("{done:?}"));
    assert!(
        said.contains("mdrelay-pub (missing) and mdrelay-sub (missing)") && said.contains("separate processes"),
        "the build line names what and why: {said}"
    );
    assert!(stderr.contains("Compiling mdrelay-publisher (stand-in)"), "cargo's progress is shown: {done:?}");
    // Pacing floor, the TCP floor, two formats: each step's line says where the run is.
    for step in 1..=4 {
        assert!(stderr.contains(&format!("  [{step}/4] ")), "step {step} of 4 is announced: {done:?}");
    }
    assert!(stderr.contains("[4/4] tcp: raw"), "{done:?}");
}

/// A copy of the benchmark outside a target directory, beside copies of the two programs (two
/// builds side by side, to compare them), runs those copies as they are: not the programs of the
/// target directory it was built in, and without building anything.
#[test]
fn a_copy_outside_a_target_directory_runs_the_programs_beside_it() {
    let dir = tempfile::tempdir().unwrap();
    let bench_copy = dir.path().join("mdrelay-bench");
    std::fs::copy(BENCH, &bench_copy).unwrap();
    let calls = dir.path().join("calls");
    for name in ["mdrelay-pub", "mdrelay-sub"] {
        let program = dir.path().join(name);
        std::fs::write(&program, format!("#!/bin/sh\necho \"{name} $*\" >> '{}'\nexit 3\n", calls.display())).unwrap();
        let mut permissions = std::fs::metadata(&program).unwrap().permissions();
        std::os::unix::fs::PermissionsExt::set_mode(&mut permissions, 0o755);
        std::fs::set_permissions(&program, permissions).unwrap();
    }
    let args = ["loopback", "--transport", "tcp", "--formats", "sbe", "--messages", "1000"];
    let done = Process::start(&bench_copy, args).finish(Duration::from_secs(60));
    assert!(!done.status.success(), "the stand-in programs fail: {done:?}");
    let calls = std::fs::read_to_string(&calls).unwrap_or_default();
    assert!(calls.lines().any(|l| l.starts_with("mdrelay-pub run")), "the publisher beside it ran: {calls:?}");
    assert!(!done.stderr.contains("building"), "nothing was built: {}", done.stderr);
}
