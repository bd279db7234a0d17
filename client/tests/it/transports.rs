//! The library against a real `mdrelay-pub`: DEEP10 and TOPS16 from ../shared, in every wire
//! format, over TCP, UDP and multicast at once (one publisher run per capture and format serves
//! the three), each subscriber's messages aggregated here and compared with the independent
//! reference outputs.
//!
//! The UDP and multicast subscribers ask the publisher's retransmission service for anything
//! the kernel drops on a loaded machine, so what they receive is exact whatever the load; what
//! they had to recover is printed.

use crate::common::*;
use mdrelay_client::{Builder, Subscriber};
use mdrelay_harness::{expected, formats, free_tcp_port, serial};
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

#[test]
#[ignore = "long (over 3 s here): .ci/run runs it with --ignored"]
fn every_format_over_tcp_udp_and_multicast_gives_the_reference_aggregates() {
    let _serial = serial();
    for (n, name) in ["DEEP10", "TOPS16"].into_iter().enumerate() {
        let reference = expected(&format!("{name}.json"));
        for (f, format) in formats().into_iter().enumerate() {
            let retransmit = format!("127.0.0.1:{}", free_tcp_port());
            let udp = Builder::udp("127.0.0.1:0").recovery(&retransmit).build().expect("a UDP subscriber");
            let group = format!("239.255.19.{}:0", 1 + n * 10 + f);
            let multicast =
                Builder::multicast(group, "127.0.0.1").recovery(&retransmit).build().expect("a multicast subscriber");
            let udp_addr = udp.local_addrs()[0].to_string();
            let group_addr = multicast.local_addrs()[0].to_string();
            let mut publisher = tcp_publisher(
                name,
                &[
                    "--format",
                    format.name(),
                    "--udp",
                    &udp_addr,
                    "--multicast",
                    &group_addr,
                    "--interface",
                    "127.0.0.1",
                    "--ttl",
                    "0",
                    "--retransmit-listen",
                    &retransmit,
                    // Up a moment after the end, for a frame lost at the tail; not the default 2 s.
                    "--retransmit-linger",
                    "0.5",
                    "--pacing",
                    "rate",
                    "--rate",
                    "300000",
                    "--coalesce-bytes",
                    "8192",
                ],
            );
            let tcp = Builder::tcp(publisher.serving_on().to_string()).build().expect("a TCP subscriber");
            let receivers = [("tcp", receive(tcp)), ("udp", receive(udp)), ("multicast", receive(multicast))];
            for (transport, receiver) in receivers {
                let context = format!("{name} in {format} over {transport}");
                let (tally, counters, complete) = receiver.join().unwrap_or_else(|_| panic!("{context}: panicked"));
                tally.assert_reference(&reference, &context);
                assert_eq!(counters.formats_seen, [format], "{context}: the format comes from the publisher");
                assert_eq!(counters.lost, 0, "{context}: {counters:?}");
                assert_eq!(counters.frames, tally.frames, "{context}");
                assert!(complete, "{context}: the end says every frame came: {counters:?}");
                if let Some(r) = &counters.recovery
                    && r.frames_recovered > 0
                {
                    eprintln!("{context}: {} frames the kernel dropped were recovered", r.frames_recovered);
                }
            }
            publisher.finish(RUN).assert_success();
        }
    }
}

#[test]
#[ignore = "long (over 3 s here): .ci/run runs it with --ignored"]
fn echoes_of_every_tenth_frame_reach_the_publisher_over_tcp_and_udp() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    for transport in ["tcp", "udp"] {
        let pub_json = dir.path().join(format!("pub-{transport}.json")).display().to_string();
        // 30,000 messages at 50,000 msg/s: a few thousand small datagrams a second each way.
        let mut args = vec!["--synthetic", "--messages", "30000", "--symbols", "20", "--format", "capnp"];
        args.extend(["--pacing", "rate", "--rate", "50000", "--json", &pub_json]);
        let (publisher, mut subscriber) = if transport == "tcp" {
            args.extend(["--tcp", "127.0.0.1:0", "--wait-subscribers", "1"]);
            let mut publisher = publisher(&args);
            let subscriber = Builder::tcp(publisher.serving_on().to_string()).echo_every(10).build().unwrap();
            (publisher, subscriber)
        } else {
            let subscriber = Builder::udp("127.0.0.1:0").echo_every(10).build().unwrap();
            let addr = subscriber.local_addrs()[0].to_string();
            args.extend(["--udp", &addr]);
            (publisher(&args), subscriber)
        };
        let (tally, _, end) = receive_all(&mut subscriber, RUN);
        publisher.finish(RUN).assert_success();
        assert!(end.is_some_and(|e| e.complete), "{transport}");
        let c = subscriber.counters();
        let echoes = mdrelay_harness::json_file(std::path::Path::new(&pub_json))["round_trip_ns"]["count"].as_u64();
        assert!(tally.frames > 1000, "{transport}: {c:?}");
        // One echo per ten frames, every one measured by the publisher.
        assert_eq!(echoes, Some(c.echoes_sent), "{transport}: {c:?}");
        assert_eq!(c.echoes_sent, tally.frames / 10, "{transport}");
        assert_eq!(c.echoes_dropped, 0, "{transport}");
    }
}

#[test]
#[ignore = "long (over 3 s here): .ci/run runs it with --ignored"]
fn the_low_latency_profile_busy_polls_and_takes_every_frame() {
    let _serial = serial();
    for idle in [mdrelay_client::IdleStrategy::Spin, mdrelay_client::IdleStrategy::Backoff] {
        let mut publisher = tcp_publisher("TOPS16", &["--format", "sbe", "--pacing", "rate", "--rate", "200000"]);
        let mut subscriber = Builder::tcp(publisher.serving_on().to_string())
            .profile(mdrelay_client::Profile::LowLatency)
            .idle(idle)
            .build()
            .unwrap();
        let (tally, _, end) = receive_all(&mut subscriber, RUN);
        publisher.finish(RUN).assert_success();
        tally.assert_reference(&expected("TOPS16.json"), &format!("TOPS16, low-latency profile, idle {idle}"));
        assert!(end.is_some_and(|e| e.complete));
        // SO_BUSY_POLL needs CAP_NET_ADMIN above net.core.busy_read: said, not fatal.
        eprintln!("idle {idle}: SO_BUSY_POLL refused: {}", subscriber.counters().busy_poll_refused);
    }
}
