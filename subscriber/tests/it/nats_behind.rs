//! `mdrelay-sub` over NATS when it falls far behind, or its stream lacks frames or its END,
//! against a real `nats-server`, a real `mdrelay-pub` with a `[nats]` output and real signals:
//!
//! - a subscriber stopped (SIGSTOP) until its publisher has ended, more than a window of
//!   65,536 frames behind, catches up from the JetStream stream in order (or repairs, where the
//!   server and its pending limit left it less far behind) and ends with the whole of DEEP10;
//!   so does one stopped for 12 s while the stream goes on, holding 1,000 messages pending;
//! - a publisher under `slow_server = "drop"` whose server is frozen (SIGSTOP) drops frames: a
//!   live subscriber and a late one replaying the stream from the start each end with exit
//!   status 5 (stream incomplete), and count exactly the frames the publisher counted dropped
//!   as lost;
//! - a stream without its END (the publisher killed; the END and frames erased from the stream
//!   afterwards): a live subscriber and one replaying from the start end within
//!   `nats_give_up_after`, counting the frames erased as lost, and say why they gave up.
//!
//! Each subscriber must end on its own within a bound; one that does not is stopped with
//! SIGINT and its report shown.

use serde_json::Value;
use std::time::{Duration, Instant};

use crate::common::{NatsSetting, publisher_with};
use mdrelay_harness::receive::stored_message;
use mdrelay_harness::{
    Finished, NatsServer, Process, Signal, assert_aggregates, expected, json_file, lines_other_than_intervals,
    nats_cli, nats_stream_state, publisher_bin, serial,
};
use mdrelay_proto::relay::wire::{DatagramHeader, DatagramKind};

/// The longest a publisher's run may take.
const RUN: Duration = Duration::from_secs(120);
/// How long a subscriber may take to end once its stream has nothing more to give: its
/// catch-up, repairs, `nats_give_up_after` and linger, with room for a loaded host.
const ENDS_WITHIN: Duration = Duration::from_secs(60);

/// A report's counts on one line, for the test's output.
fn figures(report: &Value) -> String {
    let r = &report["recovery"];
    format!(
        "frames {} gaps {} duplicates {} recovered {} unrecoverable {} (causes {}) totals_match {} stop {}",
        report["frames"],
        report["gaps"],
        report["duplicates"],
        r["frames_recovered"],
        r["frames_unrecoverable"],
        r["unrecoverable_causes"],
        report["totals_match"],
        report["stop_reason"]
    )
}

/// Asserts a subscriber ended with 0 and the whole of DEEP10: the reference's aggregates,
/// frames and messages, nothing missing, its counts equal to the publisher's totals.
fn assert_whole(finished: &Finished, report: &Value, context: &str) {
    let reference = expected("DEEP10.json");
    let context = format!(
        "{context} (recovery: {}; report:\n{}\nlog:\n{})",
        report["recovery"],
        finished.stdout,
        lines_other_than_intervals(&finished.stderr)
    );
    assert_eq!(finished.code(), Some(0), "{context}");
    assert_aggregates(report, &reference, &context);
    assert_eq!(report["messages"], reference["messages"], "{context}: messages");
    assert_eq!(report["frames"], reference["segments"], "{context}: frames");
    assert_eq!(report["gaps"].as_u64(), Some(0), "{context}: gaps");
    assert_eq!(report["totals_match"].as_bool(), Some(true), "{context}: totals match");
    assert_eq!(report["stop_reason"], "end", "{context}");
}

/// DEEP10's frames.
fn deep10_frames() -> u64 {
    expected("DEEP10.json")["segments"].as_u64().unwrap()
}

/// A subscriber stopped once it has taken 10,000 frames, from `stream` published at `rate`
/// messages a second (one frame each), with `extra` arguments; `stopped` lets it run again.
/// Returns its output and report once it ended on its own.
fn stopped_far_behind(stream: &str, rate: u32, extra: &[&str], stopped: impl FnOnce(&Process, Process)) -> Finished {
    let nats = NatsSetting::start(&[]);
    let config = nats.publisher_config(stream, rate, "", "");
    let json = nats.path("sub.json");
    let mut args = vec!["--report-interval", "0.2"];
    args.extend_from_slice(extra);
    let mut sub = nats.subscriber(stream, &json, &args);
    sub.wait_for("subscribed over NATS");
    let publisher = publisher_with(&config);
    sub.wait_for_frames(10_000);
    sub.signal(Signal::SIGSTOP);
    stopped(&sub, publisher);
    let context = format!("a subscriber stopped far behind ({stream})");
    let finished = sub.ends_on_its_own(ENDS_WITHIN, &context, Some(&json));
    let report = json_file(&json);
    eprintln!("{context}: exit {:?}, {}", finished.code(), figures(&report));
    assert_whole(&finished, &report, &context);
    // Whether it caught up from the stream or repaired its gaps depends on how far behind the
    // server and the client's pending limit left it: either way it ends whole.
    for line in finished.stderr.lines().filter(|l| l.contains("catching up") || l.contains("caught up")) {
        eprintln!("{context}: {line}");
    }
    finished
}

#[test]
#[ignore = "long (over 3 s here): .ci/run runs it with --ignored"]
fn a_subscriber_stopped_until_its_publisher_ended_catches_up_from_the_stream_and_ends_whole() {
    let _serial = serial();
    // At 40,000 messages a second DEEP10 lasts about 10 s: stopped after 10,000 frames, the
    // subscriber misses the other 111,314 (what the server and the client buffer is cut as a
    // slow consumer's, or dropped past the client's 65,536 pending messages) and the END.
    stopped_far_behind("BEHIND", 40_000, &[], |sub, publisher| {
        publisher.finish(RUN).assert_success();
        std::thread::sleep(Duration::from_secs(2));
        sub.signal(Signal::SIGCONT);
    });
}

#[test]
#[ignore = "long (over 3 s here): .ci/run runs it with --ignored"]
fn a_subscriber_stopped_for_twelve_seconds_mid_stream_catches_up_and_ends_whole() {
    let _serial = serial();
    // At 20,000 messages a second DEEP10 lasts about 20 s: 12 s stopped are about 74,000 frames,
    // more than a window, and the stream goes on after it runs again, so the live subject is
    // held while it catches up. 1,000 messages pending at most: the rest is dropped.
    let finished = stopped_far_behind("TWELVE", 20_000, &["--nats-pending-messages", "1000"], |sub, publisher| {
        std::thread::sleep(Duration::from_secs(12));
        sub.signal(Signal::SIGCONT);
        publisher.finish(RUN).assert_success();
    });
    eprintln!("{}", finished.stdout);
}

/// A stream message's relay header, read with natscli.
fn stored_header(server: &NatsServer, stream: &str, position: u64) -> DatagramHeader {
    DatagramHeader::parse(&stored_message(&server.url(), stream, position).1).unwrap()
}

/// Asserts a report counts `lost` frames of DEEP10 as lost and given up, and every other frame
/// taken.
fn assert_lost_exactly(report: &Value, lost: u64, context: &str) {
    let recovery = &report["recovery"];
    let context = format!("{context}: {report}");
    assert_eq!(report["frames"].as_u64(), Some(deep10_frames() - lost), "{context}: frames taken");
    assert_eq!(report["gaps"].as_u64(), Some(lost), "{context}: gaps");
    assert_eq!(recovery["frames_unrecoverable"].as_u64(), Some(lost), "{context}: given up");
    assert_eq!(recovery["frames_still_missing"].as_u64(), Some(0), "{context}");
}

#[test]
#[ignore = "long (over 3 s here): .ci/run runs it with --ignored"]
fn the_frames_a_publisher_dropped_for_a_frozen_server_are_counted_lost_live_and_from_the_start() {
    let _serial = serial();
    let nats = NatsSetting::start(&[]);
    // One frame a message, so the publisher's dropped messages are frames.
    let nats_keys = "queue = 512\nmax_pending_acks = 64\nslow_server = \"drop\"";
    let config = nats.publisher_config("DROP", 50_000, "", nats_keys);
    let (live_json, late_json, pub_json) = (nats.path("live.json"), nats.path("late.json"), nats.path("pub.json"));
    let give_up = ["--nats-give-up-after", "2", "--report-interval", "0"];
    let mut live = nats.subscriber("DROP", &live_json, &give_up);
    live.wait_for("subscribed over NATS");
    let mut publisher =
        Process::start(publisher_bin(), ["run", "--config", config.as_str(), "--json", pub_json.to_str().unwrap()]);
    publisher.wait_for("publishing to NATS");
    let deadline = Instant::now() + Duration::from_secs(60);
    while nats_stream_state(&nats.server.url(), "DROP").unwrap_or_default()["messages"].as_u64().unwrap_or(0) < 10_000 {
        assert!(Instant::now() < deadline, "the stream did not fill");
        std::thread::sleep(Duration::from_millis(50));
    }
    // Frozen, the server takes nothing: the publisher's queue fills and it drops what follows,
    // to the end of its replay (its END is never dropped).
    nats.server.signal(Signal::SIGSTOP);
    let ended = publisher.try_wait_until("the end of the replay", RUN, |line| line.contains("end of stream"));
    nats.server.signal(Signal::SIGCONT);
    ended.unwrap_or_else(|f| panic!("{f}"));
    publisher.finish(RUN).assert_success();
    let summary = json_file(&pub_json);
    let dropped = summary["nats"]["dropped"].as_u64().unwrap();
    assert!(dropped > 65_536, "more than a window dropped, so the END is far ahead: {summary}");
    assert_eq!(summary["nats"]["published"].as_u64().unwrap() + dropped, deep10_frames() + 1, "{summary}");

    let finished = live.ends_on_its_own(ENDS_WITHIN, "the live subscriber", Some(&live_json));
    let report = json_file(&live_json);
    eprintln!("the live subscriber ({dropped} dropped): exit {:?}, {}", finished.code(), figures(&report));
    let context = format!("the live subscriber ({dropped} frames dropped; log:\n{})", finished.stderr);
    assert_eq!(finished.code(), Some(5), "{context}: the END is taken, the stream incomplete");
    assert_lost_exactly(&report, dropped, &context);
    assert_eq!(report["totals_match"].as_bool(), Some(false), "{context}");
    assert_eq!(report["stream_complete"].as_bool(), Some(false), "{context}");
    assert_eq!(report["stop_reason"], "end", "{context}");

    let late = nats.subscriber("DROP", &late_json, &[&give_up[..], &["--from-start"]].concat());
    let finished = late.ends_on_its_own(ENDS_WITHIN, "the subscriber from the start", Some(&late_json));
    let report = json_file(&late_json);
    eprintln!("the subscriber from the start ({dropped} dropped): exit {:?}, {}", finished.code(), figures(&report));
    let context = format!("the subscriber from the start ({dropped} frames dropped; log:\n{})", finished.stderr);
    assert_eq!(finished.code(), Some(5), "{context}: the END is taken, the stream incomplete");
    assert_lost_exactly(&report, dropped, &context);
    assert_eq!(report["totals_match"].as_bool(), Some(false), "{context}");
    assert_eq!(report["duplicates"].as_u64(), Some(0), "{context}: the stream stores each frame once");
}

#[test]
#[ignore = "long (over 3 s here): .ci/run runs it with --ignored"]
fn a_stream_without_its_end_is_given_up_after_give_up_after_counting_what_it_lacks() {
    let _serial = serial();
    let nats = NatsSetting::start(&[]);
    // About 40 frames a message.
    let config = nats.publisher_config("NOEND", 50_000, "coalesce_bytes = 4096", "");
    let (live_json, late_json) = (nats.path("live.json"), nats.path("late.json"));
    let give_up = ["--nats-give-up-after", "2", "--report-interval", "0.2"];
    let mut live = nats.subscriber("NOEND", &live_json, &give_up);
    live.wait_for("subscribed over NATS");
    let mut publisher = publisher_with(&config);
    publisher.wait_for("publishing to NATS");
    // Killed halfway: no END.
    live.wait_for_frames(deep10_frames() / 2);
    publisher.signal(Signal::SIGKILL);
    assert_eq!(publisher.finish(RUN).code(), None, "killed by the signal");
    let finished = live.ends_on_its_own(ENDS_WITHIN, "the live subscriber of a killed publisher", Some(&live_json));
    let report = json_file(&live_json);
    eprintln!("the live subscriber of a killed publisher: exit {:?}, {}", finished.code(), figures(&report));
    let context = format!("the live subscriber of a killed publisher: {report}\nlog:\n{}", finished.stderr);
    assert_eq!(finished.code(), Some(1), "{context}: it gave up");
    assert!(finished.stderr.contains("give_up_after"), "{context}: the reason names the setting");
    assert_eq!(report["stop_reason"], "error", "{context}");
    assert!(report["totals_match"].is_null(), "{context}: no END, no totals");
    let state = nats_stream_state(&nats.server.url(), "NOEND").unwrap();
    let last = state["last_seq"].as_u64().unwrap();
    let end = stored_header(&nats.server, "NOEND", last);
    assert_eq!(end.kind, DatagramKind::Data, "the stream holds no END");
    let stored_frames = end.sequence + u64::from(end.frame_count) - 1;
    assert_eq!(report["frames"].as_u64(), Some(stored_frames), "{context}: every frame stored was taken");

    // Ten messages erased in the middle of what is stored, as a rogue's junk under their ids
    // would leave them: their frames are what a reader from the start lacks.
    let erased: Vec<u64> = (last / 2..last / 2 + 10).collect();
    let mut lacks = 0;
    for position in &erased {
        lacks += u64::from(stored_header(&nats.server, "NOEND", *position).frame_count);
        nats_cli(&nats.server.url(), &["stream", "rmm", "NOEND", &position.to_string(), "-f"]).unwrap();
    }
    let late = nats.subscriber("NOEND", &late_json, &[&give_up[..], &["--from-start"]].concat());
    let finished = late.ends_on_its_own(ENDS_WITHIN, "the subscriber from the start", Some(&late_json));
    let report = json_file(&late_json);
    eprintln!("the subscriber from the start ({lacks} erased): exit {:?}, {}", finished.code(), figures(&report));
    let context = format!("the subscriber from the start ({lacks} frames erased): {report}\nlog:\n{}", finished.stderr);
    assert_eq!(finished.code(), Some(1), "{context}: it gave up");
    assert!(report["totals_match"].is_null(), "{context}");
    assert_eq!(report["frames"].as_u64(), Some(stored_frames - lacks), "{context}: frames taken");
    assert_eq!(report["gaps"].as_u64(), Some(lacks), "{context}: gaps");
    assert_eq!(report["recovery"]["frames_unrecoverable"].as_u64(), Some(lacks), "{context}: given up");
}
