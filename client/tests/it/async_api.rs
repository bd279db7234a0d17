//! The async API against a real publisher: `next_event` inside `tokio::select!` beside a timer
//! that fires every 100 µs, so most calls are dropped before they return, over a whole DEEP10
//! stream (TCP, and UDP with recovery through a lossy link, where the recovery connection is
//! being made while calls are dropped), losing nothing; and the `Stream` adapter's owned events
//! over TOPS16.

use crate::common::*;
use futures_core::Stream;
use mdrelay_client::{AsyncSubscriber, Builder, Event};
use mdrelay_harness::{LossyLink, expected, free_tcp_port, mix, serial};
use std::pin::Pin;
use std::time::Duration;
use tokio::time::MissedTickBehavior;

/// Receives the whole stream with a fast timer beside it; the tally and the calls cancelled.
async fn receive_beside_a_timer(subscriber: &mut AsyncSubscriber) -> (Tally, u64, bool) {
    let mut timer = tokio::time::interval(Duration::from_micros(100));
    timer.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let (mut tally, mut cancelled, mut complete) = (Tally::default(), 0u64, false);
    let deadline = tokio::time::Instant::now() + RUN;
    loop {
        assert!(tokio::time::Instant::now() < deadline, "no end of stream within {RUN:?}");
        tokio::select! {
            // The timer first: whenever it is due, the pending call is dropped.
            biased;
            _ = timer.tick() => cancelled += 1,
            event = subscriber.next_event() => match event {
                Ok(Some(Event::Frame(frame))) => tally.frame(&frame),
                Ok(Some(Event::End(end))) => complete = end.complete,
                Ok(Some(_)) => {}
                Ok(None) => return (tally, cancelled, complete),
                Err(e) => panic!("the stream failed: {e}"),
            },
        }
    }
}

#[test]
#[ignore = "long (over 3 s here): .ci/run runs it with --ignored"]
fn next_event_dropped_mid_wait_loses_nothing() {
    let _serial = serial();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    runtime.block_on(dropped_calls());
}

async fn dropped_calls() {
    let deep10 = capture("DEEP10");
    let mut publisher = tcp_publisher("DEEP10", &["--format", "capnp", "--pacing", "rate", "--rate", "300000"]);
    let mut subscriber = Builder::tcp(publisher.serving_on().to_string()).build_async().await.unwrap();
    let (tally, cancelled, complete) = receive_beside_a_timer(&mut subscriber).await;
    eprintln!("TCP: {cancelled} calls dropped by the timer");
    assert!(cancelled > 1_000, "the timer fired while calls waited: {cancelled}");
    tally.assert_reference(&expected("DEEP10.json"), "DEEP10 over TCP, calls dropped");
    assert!(complete);
    publisher.finish(RUN).assert_success();

    // UDP, 2 % dropped on the way and recovered while calls are dropped.
    let link = LossyLink::start(|seq| mix(seq).is_multiple_of(50));
    let retransmit = format!("127.0.0.1:{}", free_tcp_port());
    let mut subscriber = Builder::udp("127.0.0.1:0").recovery(&retransmit).build_async().await.unwrap();
    link.forward_to(subscriber.local_addrs()[0]);
    let link_addr = link.addr.to_string();
    let udp_publisher = crate::common::publisher(&[
        "--capture",
        &deep10,
        "--format",
        "sbe",
        "--udp",
        &link_addr,
        "--coalesce-bytes",
        "0",
        "--retransmit-listen",
        &retransmit,
        "--pacing",
        "rate",
        // Half the TCP rate: the subscriber's one thread serves a timer every 100 us beside the
        // stream and the recovery, on a machine the publisher and the test share.
        "--rate",
        "75000",
    ]);
    let (tally, cancelled, complete) = receive_beside_a_timer(&mut subscriber).await;
    let dropped = link.dropped();
    let report = subscriber.counters().recovery;
    let recovered = report.as_ref().map_or(0, |r| r.frames_recovered);
    eprintln!("UDP: {cancelled} calls dropped, {} frames dropped on the way, {recovered} recovered", dropped.len());
    assert!(
        cancelled > 1_000 && !dropped.is_empty() && recovered >= dropped.len() as u64,
        "{cancelled} calls dropped, {} frames lost on the way: {report:?}",
        dropped.len()
    );
    tally.assert_reference(&expected("DEEP10.json"), "DEEP10 over UDP with loss, calls dropped");
    assert!(complete);
    udp_publisher.finish(RUN).assert_success();
}

#[test]
#[ignore = "long (over 3 s here): .ci/run runs it with --ignored"]
fn the_stream_adapter_yields_owned_events_until_the_end() {
    let _serial = serial();
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    runtime.block_on(owned_events());
}

async fn owned_events() {
    let mut publisher = tcp_publisher("TOPS16", &["--format", "flatbuffers"]);
    let subscriber = Builder::tcp(publisher.serving_on().to_string()).build_async().await.unwrap();
    let mut stream = subscriber.into_stream();
    // Owned events can go to another task.
    let consumer = tokio::spawn(async move {
        let (mut tally, mut end) = (Tally::default(), None);
        while let Some(item) = std::future::poll_fn(|cx| Pin::new(&mut stream).poll_next(cx)).await {
            match item.expect("no error") {
                Event::Frame(frame) => tally.owned_frame(&frame),
                Event::End(e) => end = Some(e),
                _ => {}
            }
        }
        (tally, end)
    });
    let (tally, end) = tokio::time::timeout(RUN, consumer).await.expect("within the time").unwrap();
    tally.assert_reference(&expected("TOPS16.json"), "TOPS16 as owned events");
    assert!(end.expect("the end").complete);
    publisher.finish(RUN).assert_success();
}
