//! `mdrelay-sub` over NATS, against a real `nats-server` and an `mdrelay-pub` with a `[nats]`
//! output: DEEP10 to a live subscriber and, after the run, to one replaying the JetStream
//! stream from the start; a subscriber stopped (SIGSTOP) mid-stream, whose lost messages are
//! repaired from the stream; a server that requires a user and password; a publisher SIGKILLed
//! mid-stream and started again, followed live, from the start and from the new session's time.
//! Every whole stream equals the independent reference in ../shared.

use serde_json::Value;
use std::path::Path;
use std::time::Duration;

use crate::common::{NatsSetting, publisher_with};
use mdrelay_harness::receive::stored_message;
use mdrelay_harness::{
    Finished, NatsServer, Process, Signal, assert_aggregates, expected, iex_data, json_file,
    lines_other_than_intervals, nats_stream_state, publisher_bin, serial, subscriber_bin,
};

const RUN: Duration = Duration::from_secs(120);

#[test]
#[ignore = "long (over 3 s here): .ci/run runs it with --ignored"]
fn deep10_over_nats_live_and_from_the_start_matches_the_reference() {
    let _shared = mdrelay_harness::shared();
    let nats = NatsSetting::start(&[]);
    let config = nats.path("pub.toml");
    std::fs::write(
        &config,
        format!(
            "format = \"capnp\"\n[source]\ncapture = \"{}\"\n[pacing]\nmode = \"rate\"\nrate = 300000\n\
             [batching]\ncoalesce_bytes = 8192\n[nats]\nservers = [\"{}\"]\nsubject = \"md.sub\"\nstream = \"SUB\"\n",
            iex_data().join("DEEP10.pcap.gz").display(),
            nats.server.url()
        ),
    )
    .unwrap();
    let reference = expected("DEEP10.json");
    let live_json = nats.path("live.json");
    let url = nats.server.url();
    let nats_args = ["--nats", url.as_str(), "--nats-subject", "md.sub", "--report-interval", "0"];
    let mut live = Process::start(subscriber_bin(), nats_args.iter().chain(&["--json", live_json.to_str().unwrap()]));
    live.wait_for("subscribed over NATS");
    let publisher = Process::start(publisher_bin(), ["run", "--config", config.to_str().unwrap()]);
    assert_eq!(live.finish(RUN).code(), Some(0));
    publisher.finish(RUN).assert_success();
    assert_aggregates(&json_file(&live_json), &reference, "mdrelay-sub on the live subject");

    let late_json = nats.path("late.json");
    let late_args = ["--from-start", "--nats-stream", "SUB", "--json", late_json.to_str().unwrap()];
    let late = Process::start(subscriber_bin(), nats_args.iter().chain(&late_args));
    assert_eq!(late.finish(RUN).code(), Some(0));
    assert_aggregates(&json_file(&late_json), &reference, "mdrelay-sub replaying the stream from the start");
}

/// Asserts a report has the whole of DEEP10: the reference's aggregates, frames and messages, and
/// nothing missing.
fn assert_whole(report: &serde_json::Value, reference: &serde_json::Value, context: &str) {
    assert_aggregates(report, reference, context);
    assert_eq!(report["messages"], reference["messages"], "{context}: messages");
    assert_eq!(report["frames"], reference["segments"], "{context}: frames");
    assert_eq!(report["gaps"].as_u64(), Some(0), "{context}: gaps");
    assert_eq!(report["totals_match"].as_bool(), Some(true), "{context}: totals match");
}

/// DEEP10 over NATS at 50,000 msg/s to a subscriber that keeps at most 256 messages pending and
/// is stopped (SIGSTOP) by `stop` once it has taken `stop_after` frames; `stop` also waits for
/// the publisher. Asserts the subscriber repaired what it lost from the stream and ended with
/// the whole of DEEP10; returns its report and its output.
fn stopped_subscriber_is_repaired(
    stream: &str,
    stop_after: u64,
    stop: impl FnOnce(&Process, Process),
) -> (Value, Finished) {
    let nats = NatsSetting::start(&[]);
    let reference = expected("DEEP10.json");
    // Paced with room for the repair (a direct get per stream message, up to 64 in flight) to
    // outrun the window of 65,536 frames past the gap, as in the client's stalled-reader test.
    let config = nats.publisher_config(stream, 50_000, "coalesce_bytes = 4096", "");
    let json = nats.path("stopped.json");
    let args = ["--nats-pending-messages", "256", "--report-interval", "0.2"];
    let mut subscriber = nats.subscriber(stream, &json, &args);
    subscriber.wait_for("subscribed over NATS");
    let publisher = publisher_with(&config);
    subscriber.wait_for_frames(stop_after);
    stop(&subscriber, publisher);
    let finished = subscriber.finish(RUN);
    assert_eq!(finished.code(), Some(0), "stderr: {}", finished.stderr);
    let report = json_file(&json);
    let printed = format!("report:\n{}\nlog:\n{}", finished.stdout, lines_other_than_intervals(&finished.stderr));
    let context = format!("mdrelay-sub over NATS, stopped (recovery: {}; {printed})", report["recovery"]);
    assert_whole(&report, &reference, &context);
    let recovery = &report["recovery"];
    assert!(recovery["frames_recovered"].as_u64().unwrap() > 0, "{context}: nothing repaired: {recovery}");
    assert_eq!(recovery["frames_unrecoverable"].as_u64(), Some(0), "{context}: {recovery}");
    assert!(report["repair_fetches"].as_u64().unwrap() > 0, "{context}: no reads from the stream: {report}");
    (report, finished)
}

/// DEEP10's frames.
fn deep10_frames() -> u64 {
    expected("DEEP10.json")["segments"].as_u64().unwrap()
}

#[test]
#[ignore = "long (over 3 s here): .ci/run runs it with --ignored"]
fn a_subscriber_stopped_mid_stream_has_what_it_lost_repaired_from_jetstream() {
    let _serial = serial();
    // A quarter of the way in, the subscriber stops for a second: what the server sends meanwhile
    // backs up, and past 256 messages the client drops it when the process runs again.
    let (_, finished) = stopped_subscriber_is_repaired("STOP", deep10_frames() / 4, |subscriber, publisher| {
        subscriber.signal(Signal::SIGSTOP);
        std::thread::sleep(Duration::from_secs(1));
        subscriber.signal(Signal::SIGCONT);
        publisher.finish(RUN).assert_success();
    });
    assert!(finished.stdout.contains("stream reads"), "the text report says the reads:\n{}", finished.stdout);
}

#[test]
#[ignore = "long (over 3 s here): .ci/run runs it with --ignored"]
fn a_subscriber_stopped_until_the_stream_ended_reads_the_tail_and_end_it_lost_from_jetstream() {
    let _serial = serial();
    // Stopped near the end until the publisher is done: the client keeps the first 256 messages
    // of what follows and drops the rest, the END among them. No later message comes live to
    // show the gap: only reading the stream's tail does (without it, the subscriber waits on).
    stopped_subscriber_is_repaired("TAIL", deep10_frames() * 4 / 5, |subscriber, publisher| {
        subscriber.signal(Signal::SIGSTOP);
        publisher.finish(RUN).assert_success();
        subscriber.signal(Signal::SIGCONT);
    });
}

#[test]
#[ignore = "long (over 3 s here): .ci/run runs it with --ignored"]
fn a_server_that_requires_a_password_takes_the_right_one_and_the_wrong_one_is_named() {
    let _serial = serial();
    let nats = NatsSetting::start(&["--user", "feed", "--pass", "s3cret"]);
    let password = nats.path("password");
    std::fs::write(&password, "s3cret\n").unwrap();
    let wrong = nats.path("wrong");
    std::fs::write(&wrong, "guess\n").unwrap();
    let reference = expected("DEEP10.json");
    let extra = format!("user = \"feed\"\npassword_file = \"{}\"\n", password.display());
    let config = nats.publisher_config("AUTH", 300_000, "coalesce_bytes = 4096", &extra);
    let json = nats.path("auth.json");
    let url = nats.server.url();
    let args = |password: &Path| {
        vec![
            "--nats".to_string(),
            url.clone(),
            "--nats-subject".into(),
            "md.auth".into(),
            "--nats-user".into(),
            "feed".into(),
            "--nats-password-file".into(),
            password.display().to_string(),
            "--report-interval".into(),
            "0".into(),
        ]
    };
    let mut subscriber = Process::start(
        subscriber_bin(),
        args(&password).into_iter().chain(["--json".into(), json.display().to_string()]),
    );
    subscriber.wait_for("subscribed over NATS");
    let publisher = publisher_with(&config);
    let finished = subscriber.finish(RUN);
    assert_eq!(finished.code(), Some(0), "stderr: {}", finished.stderr);
    publisher.finish(RUN).assert_success();
    assert_whole(&json_file(&json), &reference, "mdrelay-sub over NATS with a password");

    let refused = Process::start(subscriber_bin(), args(&wrong)).finish(RUN);
    assert_eq!(refused.code(), Some(2), "a wrong password is a configuration error; stderr: {}", refused.stderr);
    assert!(
        refused.stderr.contains("nats_password_file") && refused.stderr.contains("refused the credentials"),
        "the error names the setting: {}",
        refused.stderr
    );
}

/// The stream's stored message count (0 while it cannot be read).
fn stored_messages(server: &NatsServer, stream: &str) -> u64 {
    nats_stream_state(&server.url(), stream).unwrap_or_default()["messages"].as_u64().unwrap_or(0)
}

#[test]
#[ignore = "long (over 3 s here): .ci/run runs it with --ignored"]
fn a_publisher_killed_mid_stream_and_started_again_is_followed_and_its_new_session_is_whole() {
    let _serial = serial();
    let nats = NatsSetting::start(&[]);
    let reference = expected("DEEP10.json");
    let config = nats.publisher_config("KILL", 50_000, "coalesce_bytes = 4096", "");
    let live_json = nats.path("live.json");
    let mut live = nats.subscriber("KILL", &live_json, &["--report-interval", "0.2"]);
    live.wait_for("subscribed over NATS");
    // The first publisher dies a third of the way in, with publishes in flight and no END.
    let mut first = publisher_with(&config);
    first.wait_for("publishing to NATS");
    let segments = reference["segments"].as_u64().unwrap();
    live.wait_for_frames(segments / 3);
    first.signal(Signal::SIGKILL);
    assert_eq!(first.finish(RUN).code(), None, "killed by the signal");
    // What the server took from it is stored by now; the count settles.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let mut killed_session = stored_messages(&nats.server, "KILL");
    loop {
        std::thread::sleep(Duration::from_millis(200));
        let now = stored_messages(&nats.server, "KILL");
        if now == killed_session && now > 0 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "the stream's count did not settle");
        killed_session = now;
    }
    // Started again, the publisher runs a new session through to its END.
    publisher_with(&config).finish(RUN).assert_success();
    let finished = live.finish(RUN);
    // Its first session ended without an END, and its counts span both sessions: not the
    // stream the END's totals count, so incomplete (5), though nothing it was sent is missing.
    assert_eq!(finished.code(), Some(5), "stderr: {}", finished.stderr);
    let live_report = json_file(&live_json);
    let context = format!("the live subscriber: {live_report}");
    assert_eq!(live_report["publisher_restarts"].as_u64(), Some(1), "{context}");
    assert_eq!(live_report["gaps"].as_u64(), Some(0), "{context}");
    assert!(finished.stderr.contains("publisher restarted"), "{}", finished.stderr);
    // The first session's frames, then the whole second one.
    let live_frames = live_report["frames"].as_u64().unwrap();
    assert!(live_frames > segments + segments / 3 && live_frames < 2 * segments, "{context}");

    // A subscriber joining at the time of the new session's first message has it all, exactly.
    let (stored, _) = stored_message(&nats.server.url(), "KILL", killed_session + 1);
    let start_at = stored["time"].as_str().unwrap();
    let joiner_json = nats.path("joiner.json");
    let joiner_args = ["--nats-start-at", start_at, "--report-interval", "0"];
    let joiner = nats.subscriber("KILL", &joiner_json, &joiner_args).finish(RUN);
    assert_eq!(joiner.code(), Some(0), "stderr: {}", joiner.stderr);
    assert_whole(&json_file(&joiner_json), &reference, "a subscriber joining at the restarted session's start");

    // From the start, the stream holds what the live subscriber had: the killed session's
    // frames once, then the new one's.
    let replay_json = nats.path("replay.json");
    let replay_args = ["--from-start", "--report-interval", "0"];
    let replay = nats.subscriber("KILL", &replay_json, &replay_args).finish(RUN);
    assert_eq!(replay.code(), Some(5), "both sessions, as live: stderr: {}", replay.stderr);
    let replayed = json_file(&replay_json);
    for key in ["frames", "messages", "total_trade_volume", "symbols", "message_types", "publisher_restarts", "gaps"] {
        assert_eq!(replayed[key], live_report[key], "from the start and live: {key}");
    }
}
