//! The library over NATS against a real `nats-server` and `mdrelay-pub` with a `[nats]` output:
//! DEEP10 and TOPS16 in every wire format to two live subscribers and, after each run, a late
//! joiner replaying the stream from JetStream; and a joiner from the start halfway through a
//! run, handed over from the replay to the live subject. Each subscriber's messages are
//! aggregated here and compared with the independent reference outputs in ../shared.

use crate::common::*;
use mdrelay_client::{Builder, Subscriber};
use mdrelay_harness::{NatsServer, expected, formats};
use std::thread;

/// Receives the whole stream on its own thread; the tally, the counters and whether the end
/// said the stream was complete.
fn receive(mut subscriber: Subscriber) -> thread::JoinHandle<(Tally, mdrelay_client::Counters, bool)> {
    thread::spawn(move || {
        let (tally, events, end) = receive_all(&mut subscriber, RUN);
        let end = end.unwrap_or_else(|| panic!("no end of stream: {events:?}"));
        (tally, subscriber.counters(), end.complete)
    })
}

fn check(context: &str, reference: &serde_json::Value, result: (Tally, mdrelay_client::Counters, bool)) {
    let (tally, counters, complete) = result;
    tally.assert_reference(reference, context);
    assert_eq!(counters.lost, 0, "{context}: {counters:?}");
    assert!(complete, "{context}: the end says every frame came: {counters:?}");
}

#[test]
#[ignore = "long (over 3 s here): .ci/run runs it with --ignored"]
fn every_format_reaches_two_live_subscribers_and_a_late_joiner_exactly() {
    let nats = NatsSetting::start(&[]);
    for name in ["DEEP10", "TOPS16"] {
        let reference = expected(&format!("{name}.json"));
        for format in formats() {
            let subject = format!("md.{}.{}", name.to_lowercase(), format.name());
            let stream = format!("{name}_{}", format.name().replace('-', "_"));
            let config = nats.config(&subject, &stream, "");
            let live = || Builder::nats(nats.server.url(), &subject).build().expect("a NATS subscriber");
            let receivers = [("live 1", receive(live())), ("live 2", receive(live()))];
            let extra = ["--format", format.name(), "--coalesce-bytes", "8192"];
            let publisher = nats_publisher(&config, name, "400000", &extra);
            for (who, receiver) in receivers {
                let context = format!("{name} in {format} over NATS, {who}");
                check(&context, &reference, receiver.join().unwrap_or_else(|_| panic!("{context}: panicked")));
            }
            publisher.finish(RUN).assert_success();
            // After the run: everything comes from JetStream, the end included.
            let late =
                Builder::nats(nats.server.url(), &subject).nats_stream(&stream).from_start(true).build().unwrap();
            let context = format!("{name} in {format} over NATS, joined after the end");
            check(&context, &reference, receive(late).join().unwrap());
        }
    }
}

#[test]
#[ignore = "long (over 3 s here): .ci/run runs it with --ignored"]
fn a_joiner_from_the_start_halfway_through_is_handed_over_without_gap_or_duplicate() {
    let nats = NatsSetting::start(&[]);
    let reference = expected("DEEP10.json");
    let config = nats.config("md.half", "HALF", "");
    // One frame a message: the stream's count says how far the run is.
    let mut publisher = nats_publisher(&config, "DEEP10", "100000", &[]);
    publisher.wait_for("publishing to NATS");
    nats.wait_until_stored("HALF", reference["segments"].as_u64().unwrap() / 2);
    let joiner = Builder::nats(nats.server.url(), "md.half").nats_stream("HALF").from_start(true).build().unwrap();
    let result = receive(joiner).join().unwrap();
    publisher.finish(RUN).assert_success();
    check("DEEP10 over NATS, joined from the start halfway", &reference, result);
}

#[test]
fn the_connection_is_named_as_the_setting_says_for_the_servers_monitoring() {
    let _shared = mdrelay_harness::shared();
    let server = NatsServer::start();
    let named = Builder::nats(server.url(), "md.named").nats_name("desk-3").build().unwrap();
    let unnamed = Builder::nats(server.url(), "md.unnamed").build().unwrap();
    let (status, connz) = mdrelay_harness::scrape::get(server.monitor(), "/connz").unwrap();
    assert_eq!(status, 200, "{connz}");
    let connz: serde_json::Value = serde_json::from_str(&connz).unwrap();
    let mut names: Vec<&str> =
        connz["connections"].as_array().unwrap().iter().filter_map(|c| c["name"].as_str()).collect();
    names.sort();
    assert_eq!(names, ["desk-3", "mdrelay-client"], "{connz}");
    drop((named, unnamed));
}
