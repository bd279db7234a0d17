//! The library over NATS when the live subject loses messages, against a real `nats-server`
//! and `mdrelay-pub` with a `[nats]` output: a reader that stalls, and so loses what backed up
//! past its pending limit, has its gap repaired from the JetStream stream (exact against the reference in ../shared); a gap
//! older than the stream keeps is given up as gone and the subscriber goes on; a late joiner
//! starts at a time; and a server that requires a user and password.

use crate::common::*;
use mdrelay_client::{Builder, Counters, Error, Event, Subscriber, Waited};
use mdrelay_harness::receive::stored_message;
use mdrelay_harness::{NatsServer, expected, nats_cli};
use mdrelay_proto::relay::wire::DatagramHeader;
use std::collections::BTreeMap;
use std::thread;
use std::time::{Duration, Instant, SystemTime};

/// Receives the whole stream, stopping reading for `pause` once `after` frames came (as a
/// process the scheduler stops would); the tally, the counters and the end.
fn receive_pausing(
    mut subscriber: Subscriber,
    after: u64,
    pause: Duration,
) -> (Tally, Counters, Option<mdrelay_client::End>, Vec<String>) {
    let mut paused = false;
    let (tally, events, end) = receive_all_with(&mut subscriber, RUN, |tally| {
        if !paused && tally.frames >= after {
            paused = true;
            thread::sleep(pause);
        }
    });
    (tally, subscriber.counters(), end, events)
}

/// DEEP10 over NATS on `subject` and `stream`, published at `rate` messages a second (with
/// `extra` arguments), to a subscriber that stops reading for `pause` once 20,000 frames came:
/// what backs up past 256 messages meanwhile is dropped by the client as a slow consumer's.
/// What [`receive_pausing`] returns.
fn stalled_reader(
    nats: &NatsSetting,
    subject: &str,
    stream: &str,
    pause: Duration,
    rate: &str,
    extra: &[&str],
) -> (Tally, Counters, Option<mdrelay_client::End>, Vec<String>) {
    let config = nats.config(subject, stream, "");
    let subscriber =
        Builder::nats(nats.server.url(), subject).nats_stream(stream).nats_pending_messages(256).build().unwrap();
    let receiver = thread::spawn(move || receive_pausing(subscriber, 20_000, pause));
    let publisher = nats_publisher(&config, "DEEP10", rate, extra);
    let received = receiver.join().unwrap();
    publisher.finish(RUN).assert_success();
    received
}

#[test]
#[ignore = "long (over 3 s here): .ci/run runs it with --ignored"]
fn a_reader_that_stalls_has_the_messages_dropped_meanwhile_repaired_from_jetstream() {
    let nats = NatsSetting::start(&[]);
    let reference = expected("DEEP10.json");
    // A reader that stalls for a second. Paced with room for the repair to outrun the window:
    // frames still missing when the stream is 65,536 frames further on are given up as too old.
    // The repair reads up to 64 stream messages at once; at 100,000 messages a second (about
    // 30,000 frames) it passed 14 runs in 15 here, and half that rate leaves a slower server the
    // margin.
    let (tally, counters, end, events) =
        stalled_reader(&nats, "md.cut", "CUT", Duration::from_secs(1), "50000", &["--coalesce-bytes", "4096"]);
    let context = "DEEP10 over NATS, a reader stalled for a second";
    tally.assert_reference(&reference, context);
    let recovery = counters.recovery.clone().expect("repairs reported");
    assert!(
        tally.recovered > 0 && counters.frames_recovered > 0,
        "{context}: nothing repaired: {counters:?} {events:?}"
    );
    assert_eq!(recovery.frames_recovered, counters.frames_recovered, "{context}");
    assert_eq!((counters.lost, recovery.frames_unrecoverable), (0, 0), "{context}: {recovery:?}");
    assert!(counters.repair_fetches > 0, "{context}: {counters:?}");
    assert!(end.expect("the end").complete, "{context}: {counters:?}");
}

#[test]
#[ignore = "long (over 3 s here): .ci/run runs it with --ignored"]
fn a_gap_older_than_the_stream_keeps_is_given_up_as_gone_and_the_stream_goes_on() {
    let nats = NatsSetting::start(&[]);
    let reference = expected("DEEP10.json");
    // The stream keeps the last 2,000 messages (one frame each) only.
    nats_cli(
        &nats.server.url(),
        &["stream", "add", "SHORT", "--subjects", "md.short", "--max-msgs", "2000", "--allow-direct", "--defaults"],
    )
    .expect("creating the stream");
    let (tally, counters, end, events) =
        stalled_reader(&nats, "md.short", "SHORT", Duration::from_secs(2), "100000", &[]);
    let context = "DEEP10 over NATS, a gap older than the stream";
    let end = end.unwrap_or_else(|| panic!("{context}: the stream went on to its end: {events:?}"));
    let recovery = counters.recovery.clone().expect("repairs reported");
    let segments = reference["segments"].as_u64().unwrap();
    assert!(recovery.unrecoverable_causes.gone > 0, "{context}: {recovery:?}");
    assert!(recovery.gone_frames > 0, "{context}: {recovery:?}");
    // Every frame is accounted for: taken, or given up.
    assert_eq!(counters.frames + recovery.frames_unrecoverable, segments, "{context}: {recovery:?}");
    assert_eq!(counters.lost, recovery.frames_unrecoverable, "{context}");
    assert_eq!(tally.frames, counters.frames, "{context}");
    assert!(!end.complete, "{context}: frames were given up");
    assert!(events.iter().any(|e| e.contains("GivenUp")), "{context}: {events:?}");
}

/// Messages per frame, by sequence: what a subscriber took.
fn per_frame(mut subscriber: Subscriber) -> (BTreeMap<u64, u64>, Counters) {
    let started = Instant::now();
    let mut frames = BTreeMap::new();
    loop {
        assert!(started.elapsed() < RUN, "no end of stream within {RUN:?}");
        match subscriber.next_event_timeout(Duration::from_secs(1)).expect("the stream") {
            Waited::Event(Event::Frame(frame)) => {
                let n = frame.messages().count() + frame.skipped().len();
                frames.insert(frame.sequence(), n as u64);
            }
            Waited::Finished => return (frames, subscriber.counters()),
            _ => {}
        }
    }
}

/// A stream message's time and first frame, read with natscli.
fn stored_at(server: &NatsServer, stream: &str, position: u64) -> (SystemTime, u64) {
    let (json, bytes) = stored_message(&server.url(), stream, position);
    let time =
        time::OffsetDateTime::parse(json["time"].as_str().unwrap(), &time::format_description::well_known::Rfc3339)
            .unwrap();
    (time.into(), DatagramHeader::parse(&bytes).unwrap().sequence)
}

#[test]
#[ignore = "long (over 3 s here): .ci/run runs it with --ignored"]
fn a_late_joiner_starts_at_a_time_and_is_handed_over_to_the_live_subject() {
    let nats = NatsSetting::start(&[]);
    let server = &nats.server;
    let reference = expected("DEEP10.json");
    let config = nats.config("md.time", "TIME", "");
    // One frame a message, so a stream position is one frame.
    let mut publisher = nats_publisher(&config, "DEEP10", "60000", &[]);
    publisher.wait_for("publishing to NATS");
    nats.wait_until_stored("TIME", 20_000);
    // A time between two messages: the joiner's first frame is the later one's.
    let mut position = 10_000;
    let (start, first) = loop {
        let (before, _) = stored_at(server, "TIME", position - 1);
        let (at, first) = stored_at(server, "TIME", position);
        if before < at {
            break (at, first);
        }
        position += 1;
    };
    let joiner = Builder::nats(server.url(), "md.time").nats_stream("TIME").nats_start_at(start).build().unwrap();
    let (joined, counters) = per_frame(joiner);
    publisher.finish(RUN).assert_success();
    // The whole stream from the start, every message once: what the joiner should have had
    // is its frames from the first on.
    let everyone = Builder::nats(server.url(), "md.time").nats_stream("TIME").from_start(true).build().unwrap();
    let (all, all_counters) = per_frame(everyone);
    let segments = reference["segments"].as_u64().unwrap();
    assert_eq!(all.len() as u64, segments, "from the start: {all_counters:?}");
    assert_eq!(all.values().sum::<u64>(), reference["messages"].as_u64().unwrap(), "from the start");
    assert_eq!(joined.keys().next(), Some(&first), "the joiner's first frame is the first stored at its time");
    assert_eq!(joined.len() as u64, segments - first + 1, "every frame from there, once: {counters:?}");
    assert_eq!(counters.late_join, Some(first));
    assert_eq!(counters.lost, 0, "{counters:?}");
    let owed: u64 = all.range(first..).map(|(_, n)| n).sum();
    assert_eq!(joined.values().sum::<u64>(), owed, "the joiner's messages are the stream's from its first frame");
    // A start before the first message: the whole stream, as from the start.
    let early = Builder::nats(server.url(), "md.time")
        .nats_stream("TIME")
        .nats_start_at(SystemTime::now() - Duration::from_secs(3600))
        .build()
        .unwrap();
    let (early_tally, early_end) = {
        let mut early = early;
        let (t, _, e) = receive_all(&mut early, RUN);
        (t, e)
    };
    early_tally.assert_reference(&reference, "DEEP10 over NATS started an hour ago");
    assert!(early_end.unwrap().complete);
}

#[test]
#[ignore = "long (over 3 s here): .ci/run runs it with --ignored"]
fn a_server_that_requires_a_password_takes_the_right_one_and_the_wrong_one_names_the_setting() {
    let nats = NatsSetting::start(&["--user", "feed", "--pass", "s3cret"]);
    let (server, dir) = (&nats.server, &nats.dir);
    let password = dir.path().join("password");
    std::fs::write(&password, "s3cret\n").unwrap();
    let wrong = dir.path().join("wrong");
    std::fs::write(&wrong, "guess\n").unwrap();
    let reference = expected("DEEP10.json");
    let extra = format!("user = \"feed\"\npassword_file = \"{}\"\n", password.display());
    let config = nats.config("md.auth", "AUTH", &extra);
    let subscriber = Builder::nats(server.url(), "md.auth")
        .nats_stream("AUTH")
        .nats_user("feed")
        .nats_password_file(&password)
        .build()
        .expect("the right password");
    let receiver = thread::spawn(move || {
        let mut subscriber = subscriber;
        let (tally, _, end) = receive_all(&mut subscriber, RUN);
        (tally, end)
    });
    let publisher = nats_publisher(&config, "DEEP10", "300000", &["--coalesce-bytes", "8192"]);
    let (tally, end) = receiver.join().unwrap();
    publisher.finish(RUN).assert_success();
    tally.assert_reference(&reference, "DEEP10 over NATS with a password");
    assert!(end.unwrap().complete);
    match Builder::nats(server.url(), "md.auth").nats_user("feed").nats_password_file(&wrong).build() {
        Err(Error::Config { setting, reason }) => {
            assert_eq!(setting, "nats_password_file", "{reason}");
            assert!(reason.contains("refused"), "{reason}");
        }
        other => panic!("a wrong password: {other:?}"),
    }
    match Builder::nats(server.url(), "md.auth").build() {
        Err(Error::Config { setting, .. }) => assert_eq!(setting, "nats"),
        other => panic!("no credentials: {other:?}"),
    }
}
