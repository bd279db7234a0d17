//! `mdrelay-sub` over UDP unicast on 127.0.0.1 and multicast (239.255.x.x on the interface
//! 127.0.0.1), against datagrams built here with proto's relay module and mdrelay-codec: loss,
//! duplicates, reordering, publisher restarts, foreign traffic, echoes, stops.
//!
//! The tests count gaps, duplicates and reorderings exactly, so the network must lose nothing
//! the test did not drop on purpose. Loopback drops a datagram only when the receiver's buffer
//! is full, so the sender never has more than a quarter of that buffer in flight: past that, it
//! waits for the subscriber's interval line to count what was sent. However long a loaded
//! machine keeps the subscriber off the CPU, the buffer cannot overflow.

use crate::common;

use common::*;
use mdrelay_codec::{Codec, Format, Limits};
use mdrelay_harness::{Finished, Process, STEP, Signal};
use mdrelay_proto::relay::{DatagramHeader, DatagramKind, Echo, Totals};
use socket2::{Domain, Protocol, Socket, Type};
use std::collections::HashSet;
use std::net::{Ipv4Addr, SocketAddr, UdpSocket};

/// One datagram per segment, sequence numbers from 1.
fn datagrams(segments: &[Vec<u8>], session: u64) -> Vec<Vec<u8>> {
    let mut codec = Codec::new(Format::Raw, Limits::default());
    frames(&mut codec, segments)
        .into_iter()
        .enumerate()
        .map(|(i, frame)| data_datagram(Format::Raw, session, i as u64 + 1, &[frame]))
        .collect()
}

/// The segments that carry messages: a synthetic day is mostly heartbeats, which tests that
/// count messages or echoes do not need.
fn with_messages(segments: Vec<Vec<u8>>) -> Vec<Vec<u8>> {
    segments.into_iter().filter(|s| totals(&[s.as_slice()]).messages > 0).collect()
}

/// A sender socket on loopback.
fn sender() -> UdpSocket {
    let s = UdpSocket::bind("127.0.0.1:0").unwrap();
    s.set_read_timeout(Some(STEP)).unwrap();
    s
}

/// A subscriber under test and what may be in flight to it.
struct Receiver {
    process: Process,
    /// Where to send.
    addr: SocketAddr,
    /// Bytes of receive buffer the sender may fill ahead of the subscriber: a quarter of what
    /// the kernel granted it.
    budget: usize,
}

impl Receiver {
    /// Starts `mdrelay-sub` with `args`; waits until it has bound (and joined).
    fn start(args: &[&str]) -> Receiver {
        let (process, addrs, budget) = udp_subscriber(args, 1);
        Receiver { process, addr: addrs[0], budget }
    }

    /// Starts a subscriber listening on 127.0.0.1, on a port of its choosing.
    fn unicast(extra: &[&str]) -> Receiver {
        Receiver::start(&[&["--listen", "127.0.0.1:0"], extra].concat())
    }

    /// Sends `datagrams` from `socket`, never more than the budget ahead of the frames the
    /// subscriber has counted.
    fn send_all(&mut self, socket: &UdpSocket, datagrams: &[Vec<u8>]) {
        self.send_all_settling(socket, datagrams, |_| {});
    }

    /// As [`Receiver::send_all`], calling `settle(n)` once the subscriber has counted `n`
    /// frames, before more are sent. The last datagram sent is not waited for: the subscriber
    /// may hold it until the next one backs it up (the first of a new session, say).
    fn send_all_settling(&mut self, socket: &UdpSocket, datagrams: &[Vec<u8>], mut settle: impl FnMut(usize)) {
        let mut frames = HashSet::new();
        let mut counted_before_last = 0;
        let mut in_flight = 0;
        let mut last = 0;
        for d in datagrams {
            if in_flight + charge(d.len()) > self.budget && in_flight > last {
                self.process.wait_for_frames(counted_before_last as u64);
                settle(counted_before_last);
                in_flight = last;
            }
            socket.send_to(d, self.addr).unwrap();
            counted_before_last = frames.len();
            // Frames the subscriber counts: distinct (session, sequence) pairs of DATA.
            match DatagramHeader::parse(d) {
                Ok(h) if h.kind == DatagramKind::Data => {
                    frames.extend((0..u64::from(h.frame_count)).map(|k| (h.session, h.sequence + k)));
                }
                _ => {}
            }
            last = charge(d.len());
            in_flight += last;
        }
    }

    /// Sends the END of `segments` (frames 1 on of `session`) and waits for the run to end.
    fn finish_after_end(self, socket: &UdpSocket, segments: &[Vec<u8>], session: u64) -> Finished {
        self.send_end(socket, &totals(&refs(segments)), session, segments.len() as u64 + 1);
        self.process.finish(STEP)
    }

    /// The END, three times, as a publisher repeats it.
    fn send_end(&self, socket: &UdpSocket, totals: &Totals, session: u64, next: u64) {
        for _ in 0..3 {
            socket.send_to(&end_datagram(totals, session, next), self.addr).unwrap();
        }
    }
}

#[test]
fn a_skipped_datagram_is_one_gap_and_foreign_datagrams_are_counted_not_fatal() {
    let _shared = mdrelay_harness::shared();
    let segments = synthetic(1_500, 6, 21);
    let mut sub = Receiver::unicast(&[]);
    let socket = sender();
    let mut all = datagrams(&segments, 0xfeed);
    let skipped = 7;
    all.remove(skipped);
    all.insert(0, b"GET / HTTP/1.1\r\n\r\n".to_vec());
    sub.send_all(&socket, &all);
    let done = sub.finish_after_end(&socket, &segments, 0xfeed);
    let r = done.json();
    let received: Vec<&[u8]> =
        segments.iter().enumerate().filter(|(i, _)| *i != skipped).map(|(_, s)| s.as_slice()).collect();
    assert_fields(&r, &expected_report(&received, None));
    assert_eq!(r["gaps"], 1);
    assert_eq!(r["duplicates"], 0);
    assert_eq!(r["invalid_packets"], 1);
    assert_eq!(r["totals_match"], false);
    assert_eq!(r["stop_reason"], "end");
    assert!(done.stderr.contains("not a relay datagram"), "{}", done.stderr);
}

#[test]
fn a_duplicate_is_counted_and_skipped_and_a_reordered_frame_fills_its_gap() {
    let _shared = mdrelay_harness::shared();
    let segments = synthetic(1_500, 6, 22);
    let mut sub = Receiver::unicast(&[]);
    let socket = sender();
    let mut all = datagrams(&segments, 0xbeef);
    let again = all[4].clone();
    all.insert(5, again);
    all.swap(9, 10);
    sub.send_all(&socket, &all);
    let r = sub.finish_after_end(&socket, &segments, 0xbeef).json();
    // The duplicate is not aggregated twice: everything matches the publisher.
    assert_fields(&r, &expected_report(&refs(&segments), None));
    assert_eq!(r["duplicates"], 1);
    assert_eq!(r["reordered"], 1);
    assert_eq!(r["gaps"], 0);
    assert_eq!(r["totals_match"], true);
}

#[test]
fn a_new_publisher_session_restarts_sequence_tracking() {
    let _shared = mdrelay_harness::shared();
    let segments = synthetic(1_200, 6, 23);
    let mut sub = Receiver::unicast(&[]);
    let socket = sender();
    let (first, second) = segments.split_at(segments.len() / 2);
    // The restarted publisher numbers its frames from 1 again: no duplicates, no gaps.
    sub.send_all(&socket, &[datagrams(first, 1), datagrams(second, 2)].concat());
    let done = sub.finish_after_end(&socket, second, 2);
    let r = done.json();
    assert_eq!(r["publisher_restarts"], 1);
    assert_eq!(r["duplicates"], 0);
    assert_eq!(r["gaps"], 0);
    assert_eq!(r["frames"], segments.len());
    // Every frame of both sessions is aggregated.
    let all = expected_report(&refs(&segments), None);
    for key in ["total_trade_volume", "symbols", "message_types", "messages"] {
        assert_eq!(r[key], all[key], "{key}");
    }
    assert!(done.stderr.contains("publisher restarted"), "{}", done.stderr);
}

#[test]
fn multicast_on_the_loopback_interface_receives_the_stream() {
    let _shared = mdrelay_harness::shared();
    let segments = synthetic(3_000, 10, 24);
    let mut sub = Receiver::start(&["--group", "239.255.77.21:0", "--interface", "127.0.0.1"]);
    assert_eq!(sub.addr.ip(), "239.255.77.21".parse::<std::net::IpAddr>().unwrap());
    let socket = Socket::new(Domain::IPV4, Type::DGRAM, Some(Protocol::UDP)).unwrap();
    socket.set_multicast_if_v4(&Ipv4Addr::LOCALHOST).unwrap();
    socket.set_multicast_loop_v4(true).unwrap();
    socket.bind(&SocketAddr::from((Ipv4Addr::LOCALHOST, 0)).into()).unwrap();
    let socket: UdpSocket = socket.into();
    // Several frames per datagram, as a publisher packs them.
    let mut codec = Codec::new(Format::Raw, Limits::default());
    let all: Vec<Vec<u8>> = frames(&mut codec, &segments)
        .chunks(3)
        .enumerate()
        .map(|(k, chunk)| data_datagram(Format::Raw, 77, 3 * k as u64 + 1, chunk))
        .collect();
    sub.send_all(&socket, &all);
    let done = sub.finish_after_end(&socket, &segments, 77);
    assert!(done.status.success(), "{done:?}");
    let r = done.json();
    assert_fields(&r, &expected_report(&refs(&segments), None));
    assert_eq!(r["totals_match"], true);
    assert_eq!(r["gaps"], 0);
    assert!(r["transport"].as_str().unwrap().starts_with("multicast 239.255.77.21"), "{r}");
}

#[test]
fn round_trip_echo_datagrams_go_back_to_the_sender() {
    let _shared = mdrelay_harness::shared();
    let segments = with_messages(synthetic(500, 4, 25));
    let mut sub = Receiver::unicast(&["--latency", "round-trip"]);
    let socket = sender();
    // Echoes come back into this socket's buffer: no more may be in flight than it holds.
    let socket2 = socket2::SockRef::from(&socket);
    socket2.set_recv_buffer_size(4 << 20).unwrap();
    sub.budget = sub.budget.min(socket2.recv_buffer_size().unwrap() / 4);
    // Echoes are read as they come, as a publisher does, and passed on one by one.
    let back = socket.try_clone().unwrap();
    let expected_echoes = segments.len();
    let (echo_tx, echo_rx) = std::sync::mpsc::channel();
    let reader = std::thread::spawn(move || {
        let mut buf = [0u8; 2048];
        for _ in 0..expected_echoes {
            let (n, _) = back.recv_from(&mut buf).expect("an echo for every frame");
            let header = DatagramHeader::parse(&buf[..n]).unwrap();
            assert_eq!(header.kind, DatagramKind::Echo);
            assert_eq!(header.session, 9);
            echo_tx.send(Echo::parse(&buf[DatagramHeader::LEN..n]).unwrap()).unwrap();
        }
    });
    let all = datagrams(&segments, 9);
    let mut echoes = Vec::new();
    let take_echoes = |until: usize, echoes: &mut Vec<Echo>| {
        while echoes.len() < until {
            echoes.push(echo_rx.recv_timeout(STEP).expect("an echo for every frame counted"));
        }
    };
    // Echoes of the frames counted are read before more are sent.
    sub.send_all_settling(&socket, &all, |counted| take_echoes(counted, &mut echoes));
    sub.send_end(&socket, &totals(&refs(&segments)), 9, segments.len() as u64 + 1);
    take_echoes(expected_echoes, &mut echoes);
    reader.join().unwrap();
    let r = sub.process.finish(STEP).json();
    assert_eq!(r["echoes_sent"], segments.len());
    for (i, echo) in echoes.iter().enumerate() {
        assert_eq!(echo.sequence, i as u64 + 1);
        assert_eq!(echo.publish_time, i64::from_le_bytes(all[i][DatagramHeader::LEN..][..8].try_into().unwrap()));
    }
}

#[test]
fn count_stops_the_run_with_a_report() {
    let _shared = mdrelay_harness::shared();
    let segments = with_messages(synthetic(1_000, 4, 26));
    let sub = Receiver::unicast(&["--count", "100"]);
    let socket = sender();
    // Datagrams up to 200 messages, all within the budget (so none is lost, and the subscriber,
    // which stops at 100, is not waited for).
    let all = datagrams(&segments, 1);
    let mut messages = 0;
    let mut charged = 0;
    for (d, segment) in all.iter().zip(&segments) {
        if messages >= 200 {
            break;
        }
        charged += charge(d.len());
        assert!(charged <= sub.budget, "200 messages fit in the subscriber's receive buffer");
        socket.send_to(d, sub.addr).unwrap();
        messages += totals(&[segment.as_slice()]).messages;
    }
    let r = sub.process.finish(STEP).json();
    assert_eq!(r["stop_reason"], "count");
    let received = r["messages"].as_u64().unwrap();
    assert!((100..messages).contains(&received), "stopped at {received} of {messages} messages sent");
    assert_eq!(r["totals_match"], serde_json::Value::Null);
}

#[test]
fn sigterm_stops_the_run_with_a_report() {
    let _shared = mdrelay_harness::shared();
    let segments = synthetic(300, 4, 27);
    let mut sub = Receiver::unicast(&[]);
    let socket = sender();
    let all = datagrams(&segments, 1);
    sub.send_all(&socket, &all[..5]);
    // All five counted, then the signal.
    sub.process.wait_for_frames(5);
    sub.process.signal(Signal::SIGTERM);
    let done = sub.process.finish(STEP);
    assert_eq!(done.code(), Some(0), "{done:?}");
    let r = done.json();
    assert_eq!(r["stop_reason"], "signal");
    assert_eq!(r["frames"], 5);
    assert_fields(&r, &expected_report(&refs(&segments[..5]), None));
}
