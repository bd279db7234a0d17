//! SIGHUP against a configuration path that is not a plain file, on real processes: a FIFO with
//! no writer, a directory, a file far larger than any configuration. Each is refused with the
//! reason logged, the running configuration is kept, signals keep working, and the stream ends
//! exact with its END.

use crate::common::{beside_others_in_tempdir, path};
use mdrelay_harness::{
    Finished, Process, STEP, Signal, assert_aggregates, deep10_tcp_config, expected, json_file, publisher_bin,
    subscriber_bin,
};
use serde_json::{Value, json};
use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// A whole DEEP10 relay at 40,000 msg/s takes about 10 s; this bounds it on a loaded machine.
const RUN: Duration = Duration::from_secs(120);

/// DEEP10 in `format` over TCP, lossless, at 40,000 msg/s: long enough for a few reloads
/// mid-stream.
fn deep10_config(format: &str) -> String {
    deep10_tcp_config(format, "").replace("rate = 120000", "rate = 40000")
}

/// A TCP subscriber of `addr` writing its report to `json`, with interval lines for
/// `wait_for_frames`.
fn subscriber(addr: SocketAddr, json: &str) -> Process {
    let connect = addr.to_string();
    Process::start(subscriber_bin(), ["--connect", connect.as_str(), "--json", json, "--report-interval", "0.1"])
}

/// The subscriber's report after a successful exit.
fn report(finished: &Finished, json: &str) -> Value {
    finished.assert_success();
    json_file(Path::new(json))
}

/// Replaces the file at `config` with a FIFO no one writes to.
fn fifo_at(config: &Path) {
    std::fs::remove_file(config).unwrap();
    let made = std::process::Command::new("mkfifo").arg(config).status().expect("mkfifo runs");
    assert!(made.success(), "mkfifo {}", config.display());
}

/// A publisher of DEEP10 in SBE from the file `pub.toml` in `dir`, and a subscriber that has seen
/// frames: the reload comes mid-stream. With the subscriber's report and the file's paths.
fn relay_under_way(dir: &Path) -> (Process, Process, String, PathBuf) {
    let config = dir.join("pub.toml");
    std::fs::write(&config, deep10_config("sbe")).unwrap();
    let mut publisher = Process::start(publisher_bin(), ["run", "--config", config.to_str().unwrap()]);
    // Printed after the signal handlers are installed.
    let addr = publisher.serving_on();
    let json = path(dir, "sub.json");
    let mut subscriber = subscriber(addr, &json);
    subscriber.wait_for_frames(1);
    (publisher, subscriber, json, config)
}

/// The subscriber got the whole of DEEP10 in SBE alone, and the publisher's END.
fn assert_whole_day_in_sbe(report: &Value) {
    let reference = expected("DEEP10.json");
    assert_eq!(report["messages"], reference["messages"], "{report}");
    assert_aggregates(report, &reference, "after a refused reload");
    assert_eq!((&report["stop_reason"], &report["totals_match"]), (&json!("end"), &json!(true)), "{report}");
    assert_eq!((&report["gaps"], &report["format_switches"]), (&json!(0), &json!(0)), "{report}");
    assert_eq!(report["formats_seen"], json!(["sbe"]), "the running format was kept: {report}");
}

#[test]
#[ignore = "long (over 3 s here): .ci/run runs it with --ignored"]
fn sighup_with_a_fifo_at_the_configuration_path_keeps_the_configuration_and_the_stream_ends_exact() {
    let (_shared, dir) = beside_others_in_tempdir();
    let (mut publisher, subscriber, json, config) = relay_under_way(dir.path());
    fifo_at(&config);
    publisher.signal(Signal::SIGHUP);
    let line = publisher.wait_for("keeping the running configuration");
    assert!(line.contains("not a regular file") && line.contains("FIFO"), "{line}");
    assert!(line.contains(config.to_str().unwrap()), "names the file: {line}");
    let published = publisher.finish(RUN);
    published.assert_success();
    assert!(published.stdout.contains("final format sbe"), "{published:?}");
    assert_whole_day_in_sbe(&report(&subscriber.finish(STEP), &json));
}

#[test]
#[ignore = "long (over 3 s here): .ci/run runs it with --ignored"]
fn sigterm_after_a_sighup_on_a_fifo_stops_the_publisher_promptly_with_its_end() {
    let (_shared, dir) = beside_others_in_tempdir();
    let config = dir.path().join("pub.toml");
    // A day far longer than the test: only the SIGTERM ends it.
    std::fs::write(
        &config,
        "[source.synthetic]\nmessages = 50000000\n[pacing]\nmode = \"rate\"\nrate = 50000\n\
         [tcp]\nlisten = \"127.0.0.1:0\"\nwait_subscribers = 1\nslow_subscriber = \"block\"\n",
    )
    .unwrap();
    let mut publisher = Process::start(publisher_bin(), ["run", "--config", config.to_str().unwrap()]);
    let addr = publisher.serving_on();
    let json = path(dir.path(), "sub.json");
    let mut subscriber = subscriber(addr, &json);
    subscriber.wait_for_frames(1);
    fifo_at(&config);
    publisher.signal(Signal::SIGHUP);
    // Give a read that blocks the time to block.
    std::thread::sleep(Duration::from_millis(500));
    let signalled = Instant::now();
    publisher.signal(Signal::SIGTERM);
    let published = publisher.finish(Duration::from_secs(30));
    let took = signalled.elapsed();
    published.assert_success();
    assert!(took < Duration::from_secs(15), "one SIGTERM stopped it, in {took:?}");
    assert!(published.stderr.contains("stopping: the stream ends with its totals"), "{published:?}");
    let report = report(&subscriber.finish(STEP), &json);
    assert_eq!((&report["stop_reason"], &report["totals_match"]), (&json!("end"), &json!(true)), "{report}");
    assert_eq!(report["gaps"], 0, "{report}");
}

#[test]
#[ignore = "long (over 3 s here): .ci/run runs it with --ignored"]
fn sighup_with_a_directory_or_an_oversized_file_keeps_the_configuration_and_a_symlink_is_followed() {
    let (_shared, dir) = beside_others_in_tempdir();
    let (mut publisher, subscriber, json, config) = relay_under_way(dir.path());
    // A directory where the file was.
    std::fs::remove_file(&config).unwrap();
    std::fs::create_dir(&config).unwrap();
    publisher.signal(Signal::SIGHUP);
    let line = publisher.wait_for("keeping the running configuration");
    assert!(line.contains("not a regular file") && line.contains("directory"), "{line}");
    // A valid configuration asking for another format, padded with comments past the bound: not
    // read, so the format stays.
    std::fs::remove_dir(&config).unwrap();
    let padding = "# padding\n".repeat(200_000);
    std::fs::write(&config, format!("{}{padding}", deep10_config("capnp"))).unwrap();
    let size = std::fs::metadata(&config).unwrap().len().to_string();
    publisher.signal(Signal::SIGHUP);
    let line = publisher.wait_for("keeping the running configuration");
    assert!(line.contains(&size) && line.contains("1048576"), "names the size and the bound: {line}");
    // A symlink to a regular file (as configuration managers swap them) is read as the file.
    let real = dir.path().join("real.toml");
    std::fs::write(&real, deep10_config("sbe")).unwrap();
    std::fs::remove_file(&config).unwrap();
    std::os::unix::fs::symlink(&real, &config).unwrap();
    publisher.signal(Signal::SIGHUP);
    publisher.wait_for("configuration re-read");
    let published = publisher.finish(RUN);
    published.assert_success();
    assert!(published.stdout.contains("final format sbe"), "{published:?}");
    assert_whole_day_in_sbe(&report(&subscriber.finish(STEP), &json));
}

/// A key file readable by its owner only, as `[protection] key_file` wants.
fn key_file(path: &Path) {
    std::fs::write(path, "5a".repeat(32) + "\n").unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).unwrap();
}

#[test]
#[ignore = "long (over 3 s here): .ci/run runs it with --ignored"]
fn a_reload_that_blocks_is_abandoned_at_its_bound_and_a_sighup_during_it_reads_again_once_it_returns() {
    let (_shared, dir) = beside_others_in_tempdir();
    // The configuration is a plain file, but reading it reads the key file too: a FIFO there
    // blocks the read as a stalled network mount would.
    let key = dir.path().join("relay.key");
    key_file(&key);
    let sub_key = dir.path().join("sub.key");
    key_file(&sub_key);
    let config = dir.path().join("pub.toml");
    std::fs::write(
        &config,
        format!(
            "[source.synthetic]\nmessages = 50000000\n[pacing]\nmode = \"rate\"\nrate = 20000\n\
             [tcp]\nlisten = \"127.0.0.1:0\"\nwait_subscribers = 1\nslow_subscriber = \"block\"\n\
             [protection]\nkey_file = {:?}\n",
            key.display().to_string()
        ),
    )
    .unwrap();
    let sub_config = dir.path().join("sub.toml");
    std::fs::write(&sub_config, format!("[protection]\nkey_file = {:?}\n", sub_key.display().to_string())).unwrap();
    let mut publisher = Process::start(publisher_bin(), ["run", "--config", config.to_str().unwrap()]);
    let addr = publisher.serving_on().to_string();
    let json = path(dir.path(), "sub.json");
    let sub_args = ["--config", sub_config.to_str().unwrap(), "--connect", &addr, "--json", &json];
    let mut subscriber = Process::start(subscriber_bin(), sub_args.iter().chain(&["--report-interval", "0.1"]));
    let before = subscriber.wait_for_frames(1);
    std::fs::remove_file(&key).unwrap();
    let made = std::process::Command::new("mkfifo").args(["-m", "600"]).arg(&key).status().expect("mkfifo runs");
    assert!(made.success());
    publisher.signal(Signal::SIGHUP);
    let line = publisher.wait_for("keeping the running configuration");
    assert!(line.contains("longer than 5s") && line.contains("abandoned"), "{line}");
    // A second SIGHUP waits for the first read to return.
    subscriber.wait_for_frames(before + 1000);
    publisher.signal(Signal::SIGHUP);
    publisher.wait_for("has not returned");
    // The blocked read returns once a writer comes: by then the key is a plain file again, which
    // the read that follows finds.
    let mut writer = std::fs::OpenOptions::new().write(true).open(&key).unwrap();
    let plain = dir.path().join("plain.key");
    key_file(&plain);
    std::fs::rename(&plain, &key).unwrap();
    std::io::Write::write_all(&mut writer, ("5a".repeat(32) + "\n").as_bytes()).unwrap();
    drop(writer);
    publisher.wait_for("the abandoned read of the configuration returned");
    publisher.wait_for("configuration re-read");
    publisher.signal(Signal::SIGTERM);
    publisher.finish(RUN).assert_success();
    let report = report(&subscriber.finish(STEP), &json);
    assert_eq!((&report["stop_reason"], &report["totals_match"]), (&json!("end"), &json!(true)), "{report}");
    assert_eq!(report["gaps"], 0, "{report}");
    // The stream went on while the read was blocked: a stalled runtime would have held frames
    // back for the 5 s of the bound, and each would count its wait as latency.
    let max = report["latency_ns"]["max"].as_u64().unwrap();
    assert!(max < 2_000_000_000, "no frame waited for the blocked read: max latency {max} ns");
}
