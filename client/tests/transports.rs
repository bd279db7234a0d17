//! The library against a real `mdrelay-pub`: DEEP10 and TOPS16 from ../shared, in every wire
//! format, over TCP, UDP and multicast at once (one publisher run per capture and format serves
//! the three), each subscriber's messages aggregated here and compared with the independent
//! reference outputs.
//!
//! The UDP and multicast subscribers ask the publisher's retransmission service for anything
//! the kernel drops on a loaded machine, so what they receive is exact whatever the load; what
//! they had to recover is printed.

mod common;

use common::*;
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
fn every_format_over_tcp_udp_and_multicast_gives_the_reference_aggregates() {
    let _serial = serial();
    for (n, name) in ["DEEP10", "TOPS16"].into_iter().enumerate() {
        let reference = expected(&format!("{name}.json"));
        let file = capture(name);
        for (f, format) in formats().into_iter().enumerate() {
            let retransmit = format!("127.0.0.1:{}", free_tcp_port());
            let udp = Builder::udp("127.0.0.1:0").recovery(&retransmit).build().expect("a UDP subscriber");
            let group = format!("239.255.19.{}:0", 1 + n * 10 + f);
            let multicast =
                Builder::multicast(group, "127.0.0.1").recovery(&retransmit).build().expect("a multicast subscriber");
            let udp_addr = udp.local_addrs()[0].to_string();
            let group_addr = multicast.local_addrs()[0].to_string();
            let mut publisher = publisher(&[
                "--capture",
                &file,
                "--format",
                format.name(),
                "--tcp",
                "127.0.0.1:0",
                "--wait-subscribers",
                "1",
                "--slow-subscriber",
                "block",
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
            ]);
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
