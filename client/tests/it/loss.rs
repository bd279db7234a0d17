//! Loss, and what the library does about it, against a real `mdrelay-pub` and DEEP10: 5 % of the
//! datagrams dropped by a lossy link and recovered from the publisher's retransmission service,
//! two lines that lose different frames, a TCP connection cut mid-stream and resumed, and late
//! joiners with and without `from_start`. Every result is compared with the reference output.

use crate::common::*;
use mdrelay_client::{Builder, Event, Line, Subscriber};
use mdrelay_harness::{LossyLink, Process, cutting_proxy, delaying_proxy, expected, mix, serial};
use std::time::Duration;
use std::time::Instant;

/// DEEP10 in SBE, one frame per datagram, to `destinations`, at 100,000 messages/s: far below
/// what a receiver takes, so a loaded machine's scheduling does not add loss of its own.
fn deep10_udp_publisher(destinations: &[&str], extra: &[&str]) -> Process {
    deep10_udp_publisher_at("100000", destinations, extra)
}

/// As [`deep10_udp_publisher`], paced at `rate` messages a second.
fn deep10_udp_publisher_at(rate: &str, destinations: &[&str], extra: &[&str]) -> Process {
    let deep10 = capture("DEEP10");
    let mut args = vec!["--capture", &deep10, "--format", "sbe", "--coalesce-bytes", "0"];
    for d in destinations {
        args.extend(["--udp", d]);
    }
    args.extend(["--pacing", "rate", "--rate", rate]);
    args.extend(extra);
    publisher(&args)
}

/// A link that drops the DATA datagrams of one frame in twenty on their way to a new UDP
/// subscriber, which recovers them from `service`: the link, and the subscriber.
fn behind_a_lossy_link(service: &str) -> (LossyLink, Subscriber) {
    let link = LossyLink::start(|seq| mix(seq).is_multiple_of(20));
    let subscriber = Builder::udp("127.0.0.1:0").recovery(service).build().unwrap();
    link.forward_to(subscriber.local_addrs()[0]);
    (link, subscriber)
}

#[test]
#[ignore = "long (over 3 s here): .ci/run runs it with --ignored"]
fn five_percent_loss_is_recovered_exactly() {
    let _serial = serial();
    // One frame per datagram; the DATA datagrams of one frame in twenty are dropped.
    let retransmit = format!("127.0.0.1:{}", mdrelay_harness::free_tcp_port());
    let (link, mut subscriber) = behind_a_lossy_link(&retransmit);
    let link_addr = link.addr.to_string();
    let publisher = deep10_udp_publisher(&[&link_addr], &["--retransmit-listen", &retransmit]);
    let (tally, events, end) = receive_all(&mut subscriber, RUN);
    publisher.finish(RUN).assert_success();
    let dropped = link.dropped();
    let c = subscriber.counters();
    let r = c.recovery.clone().expect("recovery was on");
    eprintln!(
        "5 % loss: {} frames dropped, {} recovered, recovery latency p50 {:?} ns, max {:?} ns",
        dropped.len(),
        r.frames_recovered,
        r.latency_ns.p50,
        r.latency_ns.max
    );
    let frames = c.publisher_totals.as_ref().expect("the publisher's totals").frames;
    let share = dropped.len() as f64 / frames as f64;
    assert!((0.04..0.06).contains(&share), "about 5 % dropped: {} of {frames}", dropped.len());
    // Every frame the link dropped came back from the service (and any the kernel dropped).
    assert!(r.frames_recovered >= dropped.len() as u64, "{r:?}");
    assert_eq!(r.frames_unrecoverable, 0, "{r:?}");
    assert_eq!(tally.recovered, r.frames_recovered, "recovered frames are handed out as such");
    assert_eq!(tally.recovered_from, [retransmit.parse().unwrap()].into(), "from the retransmission service");
    assert_eq!((c.lost, c.duplicates), (0, 0), "{c:?}");
    tally.assert_reference(&expected("DEEP10.json"), "DEEP10 with 5 % loss, recovered");
    assert!(end.expect("an end").complete);
    assert!(events.iter().any(|e| e.starts_with("Gap")), "gaps are told as they are found");
    assert!(events.iter().any(|e| e.starts_with("Recovery(Connected")), "{:?}", &events[..events.len().min(5)]);
}

/// Datagrams of more than 255 frames (header version 2): DEEP10 coalesced to 64 KiB datagrams
/// at 2 M messages a second, one of them dropped on the way and recovered from the service. The
/// frames the link dropped with that one datagram are more than a version-1 header can count.
#[test]
#[ignore = "long (over 3 s here): .ci/run runs it with --ignored"]
fn a_lost_datagram_of_more_than_255_frames_is_recovered_exactly() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let _serial = serial();
    let retransmit = format!("127.0.0.1:{}", mdrelay_harness::free_tcp_port());
    let dropped_one = AtomicBool::new(false);
    let link = LossyLink::start(move |seq| seq > 20_000 && !dropped_one.swap(true, Ordering::Relaxed));
    let mut subscriber = Builder::udp("127.0.0.1:0").recovery(retransmit.as_str()).build().unwrap();
    link.forward_to(subscriber.local_addrs()[0]);
    let link_addr = link.addr.to_string();
    let deep10 = capture("DEEP10");
    let publisher = publisher(&mdrelay_harness::cli_args::words(&format!(
        "--capture {deep10} --format sbe --udp {link_addr} --max-datagram 65507 --coalesce-bytes 65536 \
         --pacing rate --rate 2000000 --retransmit-listen {retransmit}"
    )));
    let (tally, _events, end) = receive_all(&mut subscriber, RUN);
    publisher.finish(RUN).assert_success();
    let dropped = link.dropped();
    assert!(dropped.len() > 255, "one datagram of {} frames dropped", dropped.len());
    let c = subscriber.counters();
    let r = c.recovery.clone().expect("recovery was on");
    assert!(r.frames_recovered >= dropped.len() as u64, "{r:?}");
    assert_eq!(r.frames_unrecoverable, 0, "{r:?}");
    // The wide datagrams were read as they came, not refused and recovered.
    let frames = c.publisher_totals.as_ref().expect("the publisher's totals").frames;
    assert!(tally.recovered < frames / 2, "{} of {frames} frames recovered", tally.recovered);
    tally.assert_reference(&expected("DEEP10.json"), "DEEP10 in datagrams of more than 255 frames, one lost");
    assert!(end.expect("an end").complete);
}

#[test]
#[ignore = "long (over 3 s here): .ci/run runs it with --ignored"]
fn a_slow_service_at_its_rate_limit_still_gives_every_frame_back() {
    let _serial = serial();
    // Answers take a tenth of a second (twice the retry interval), through a proxy that holds
    // them, and the service takes 5,000 requests a second, about as many as the link makes gaps.
    // Asking every open gap again at each retry interval needs three times that: the service's
    // BUSY answers then hold gaps back until their attempts run out (half the frames were lost
    // so). Waiting for answers as long as they have been taking, and asking nothing for a while
    // after a BUSY, gets every frame back with the default attempts.
    let service = format!("127.0.0.1:{}", mdrelay_harness::free_tcp_port());
    let (far_service, _proxy) = delaying_proxy(service.parse().unwrap(), Duration::from_millis(100));
    let (link, mut subscriber) = behind_a_lossy_link(&far_service.to_string());
    let link_addr = link.addr.to_string();
    // Paced at 30,000 messages a second (about 8,700 frames, about 430 gaps), so the window of
    // 65,536 frames spans about 7.5 s and how fast this host can send does not decide whether a
    // gap outlives it; the service takes 1,000 requests a second, about twice the gaps, so with
    // the requests asked again it says BUSY thousands of times.
    let publisher = deep10_udp_publisher_at(
        "30000",
        &[&link_addr],
        &["--retransmit-listen", &service, "--retransmit-rate", "1000"],
    );
    let (tally, _events, end) = receive_all(&mut subscriber, RUN);
    publisher.finish(RUN).assert_success();
    let r = subscriber.counters().recovery.clone().expect("recovery was on");
    eprintln!(
        "slow service: {} frames missing, {} recovered, {} requests, {} BUSY, latency p50 {:?} ns, max {:?} ns",
        r.frames_missing, r.frames_recovered, r.requests, r.busy_answers, r.latency_ns.p50, r.latency_ns.max
    );
    assert!(r.frames_recovered >= link.dropped().len() as u64, "{r:?}");
    assert_eq!(r.frames_unrecoverable, 0, "{r:?}");
    assert!(r.busy_answers > 0, "the service was held at its rate limit: {r:?}");
    assert!(
        r.latency_ns.p50.is_some_and(|p50| p50 >= 100_000_000),
        "the answers did come through the slow proxy: {r:?}"
    );
    tally.assert_reference(&expected("DEEP10.json"), "DEEP10 with 5 % loss, recovered from a slow service");
    assert!(end.expect("an end").complete);
}

#[test]
#[ignore = "long (over 3 s here): .ci/run runs it with --ignored"]
fn two_lines_that_lose_different_frames_give_every_frame_once() {
    let _serial = serial();
    let a = LossyLink::start(|seq| mix(seq).is_multiple_of(10));
    let b = LossyLink::start(|seq| mix(seq) % 10 == 1);
    let mut subscriber = Builder::udp("127.0.0.1:0").line_b("127.0.0.1:0").build().unwrap();
    let lines = subscriber.local_addrs();
    a.forward_to(lines[0]);
    b.forward_to(lines[1]);
    let (a_addr, b_addr) = (a.addr.to_string(), b.addr.to_string());
    let publisher = deep10_udp_publisher(&[&a_addr, &b_addr], &[]);
    let started = Instant::now();
    let mut tally = Tally::default();
    let mut from_b = 0u64;
    let mut end = None;
    while let Some(event) = subscriber.next_event().unwrap() {
        assert!(started.elapsed() < RUN, "no end of stream within {RUN:?}");
        match event {
            Event::Frame(frame) => {
                from_b += u64::from(frame.line() == Some(Line::B));
                assert!(frame.line().is_some(), "two lines: each frame says which");
                tally.frame(&frame);
            }
            Event::End(e) => end = Some(e),
            _ => {}
        }
    }
    publisher.finish(RUN).assert_success();
    let (dropped_a, dropped_b) = (a.dropped(), b.dropped());
    let c = subscriber.counters();
    let lines = c.lines.clone().expect("two lines");
    eprintln!("A/B: line A lost {}, line B lost {}, {from_b} frames taken from B", dropped_a.len(), dropped_b.len());
    assert!(dropped_a.is_disjoint(&dropped_b), "the links drop different frames");
    // Each line's own loss: what its link dropped (and, on a loaded machine, what the kernel
    // dropped when the receiver fell a whole buffer behind).
    assert!(lines.a.lost >= dropped_a.len() as u64, "line A's own loss: {lines:?}");
    assert!(lines.b.lost >= dropped_b.len() as u64, "line B's own loss: {lines:?}");
    // Every frame line A lost came from B; the others from whichever line was first.
    assert!(from_b >= dropped_a.len() as u64);
    assert_eq!(c.arbitrated + c.frames, lines.a.frames + lines.b.frames, "each frame taken once: {c:?}");
    assert_eq!(c.lost, 0, "no frame was lost on both lines");
    tally.assert_reference(&expected("DEEP10.json"), "DEEP10 over two lossy lines");
    assert!(end.expect("an end").complete);
}

#[test]
fn a_connection_cut_mid_stream_resumes_where_it_left_off() {
    let _serial = serial();
    let mut publisher = tcp_publisher("DEEP10", &["--pacing", "rate", "--rate", "300000"]);
    // The first connection is cut after 4 MB of the stream's 20, inside a record.
    let (proxy, thread) = cutting_proxy(publisher.serving_on(), 4_000_000);
    let mut subscriber = Builder::tcp(proxy.to_string()).build().unwrap();
    let (tally, events, end) = receive_all(&mut subscriber, RUN);
    thread.join().unwrap();
    publisher.finish(RUN).assert_success();
    let c = subscriber.counters();
    assert_eq!((c.connections, c.reconnects, c.resumes), (2, 1, 1), "{c:?}");
    let resumed: Vec<&String> = events.iter().filter(|e| e.starts_with("Resumed")).collect();
    assert_eq!(resumed.len(), 1, "{events:?}");
    let Some((asked, offered)) = resumed[0].strip_prefix("Resumed { asked: ").and_then(|r| {
        let (asked, rest) = r.split_once(", offered: ")?;
        Some((asked.to_string(), rest.trim_end_matches(" }").to_string()))
    }) else {
        panic!("{resumed:?}")
    };
    assert_eq!(asked, offered, "the ring replays from the frame asked for");
    assert!(events.iter().any(|e| e.starts_with("Reconnecting")), "{events:?}");
    assert!(events.iter().any(|e| e.contains("start: Resume { from: ")), "{events:?}");
    assert_eq!(c.lost, 0);
    tally.assert_reference(&expected("DEEP10.json"), "DEEP10 over a connection cut and resumed");
    assert!(end.expect("an end").complete);
}

/// Receives until `frames` frames came, then hands the subscriber back.
fn receive_some(subscriber: &mut Subscriber, frames: u64) {
    let started = Instant::now();
    let mut n = 0;
    while n < frames {
        assert!(started.elapsed() < RUN);
        match subscriber.next_event().unwrap() {
            Some(Event::Frame(_)) => n += 1,
            Some(_) => {}
            None => panic!("the stream ended after {n} frames"),
        }
    }
}

#[test]
#[ignore = "long (over 3 s here): .ci/run runs it with --ignored"]
fn a_late_joiner_from_the_start_gets_the_whole_session_and_one_without_only_the_rest() {
    let _serial = serial();
    let mut publisher = tcp_publisher("DEEP10", &["--pacing", "rate", "--rate", "200000"]);
    let addr = publisher.serving_on().to_string();
    let mut first = Builder::tcp(&addr).build().unwrap();
    // The stream starts with the first subscriber; the others join a good way into it.
    receive_some(&mut first, 30_000);
    let late = std::thread::spawn({
        let addr = addr.clone();
        move || {
            let mut s = Builder::tcp(addr).build().unwrap();
            let (tally, _, end) = receive_all(&mut s, RUN);
            (tally, s.counters(), end)
        }
    });
    let whole = std::thread::spawn(move || {
        let mut s = Builder::tcp(addr).from_start(true).build().unwrap();
        let (tally, events, end) = receive_all(&mut s, RUN);
        (tally, events, s.counters(), end)
    });
    let (_, _, first_end) = receive_all(&mut first, RUN);
    assert!(first_end.expect("an end").complete);
    let (tally, events, c, end) = whole.join().unwrap();
    assert!(events.iter().any(|e| e.contains("start: FromStart")), "{events:?}");
    assert_eq!((c.first_frame, c.late_join, c.lost), (Some(1), None, 0), "{c:?}");
    tally.assert_reference(&expected("DEEP10.json"), "DEEP10 from the start, joined late");
    assert!(end.expect("an end").complete);
    let (late_tally, late_c, late_end) = late.join().unwrap();
    let joined = late_c.late_join.expect("a late join");
    assert!(joined > 1 && late_c.first_frame == Some(joined), "{late_c:?}");
    assert_eq!(late_c.lost, 0, "frames before the join were never owed");
    let totals = late_end.as_ref().and_then(|e| e.totals.clone()).expect("the publisher's totals");
    assert_eq!(late_tally.frames, totals.frames - (joined - 1), "every frame from the join on");
    assert!(!late_end.expect("an end").complete, "a late joiner's stream is not the whole stream");
    publisher.finish(RUN).assert_success();
}
