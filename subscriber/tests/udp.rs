//! `mdrelay-sub` over UDP unicast on 127.0.0.1 and multicast (239.255.x.x on the interface
//! 127.0.0.1), against datagrams built here with proto's relay and codec modules: loss,
//! duplicates, reordering, publisher restarts, foreign traffic, echoes, stops.

mod common;

use common::*;
use mdrelay_proto::codec::{Codec, Format, Limits};
use mdrelay_proto::relay::{DatagramHeader, DatagramKind, Echo, Totals};
use socket2::{Domain, Protocol, Socket, Type};
use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::time::Duration;

/// One datagram per segment, sequence numbers from 1.
fn datagrams(segments: &[Vec<u8>], session: u64) -> Vec<Vec<u8>> {
    let mut codec = Codec::new(Format::Raw, Limits::default());
    segments
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let mut frame = Vec::new();
            encode(&mut codec, s, &mut frame);
            datagram(DatagramKind::Data, Format::Raw, 1, session, i as u64 + 1, &frame)
        })
        .collect()
}

fn refs(segments: &[Vec<u8>]) -> Vec<&[u8]> {
    segments.iter().map(|s| s.as_slice()).collect()
}

/// A sender socket on loopback.
fn sender() -> UdpSocket {
    let s = UdpSocket::bind("127.0.0.1:0").unwrap();
    s.set_read_timeout(Some(STEP)).unwrap();
    s
}

/// Sends datagrams with a short pause every few, so a loopback receive buffer never overflows
/// whatever the machine's load (loss here would be the test's, not the subscriber's).
fn send_all(socket: &UdpSocket, to: SocketAddr, datagrams: &[Vec<u8>]) {
    for (i, d) in datagrams.iter().enumerate() {
        socket.send_to(d, to).unwrap();
        if i % 50 == 49 {
            std::thread::sleep(Duration::from_millis(2));
        }
    }
}

/// The END, three times, as a publisher repeats it.
fn send_end(socket: &UdpSocket, to: SocketAddr, totals: &Totals, session: u64, next: u64) {
    for _ in 0..3 {
        socket.send_to(&end_datagram(totals, session, next), to).unwrap();
    }
}

fn start_unicast(extra: &[&str]) -> (Sub, SocketAddr) {
    let mut args = vec!["--listen", "127.0.0.1:0", "--json", "-", "--report-interval", "0", "--duration", "60"];
    args.extend_from_slice(extra);
    let mut sub = Sub::start(&args);
    let addr = sub.listening_on();
    (sub, addr)
}

#[test]
fn a_skipped_datagram_is_one_gap_and_foreign_datagrams_are_counted_not_fatal() {
    let segments = synthetic(1_500, 6, 21);
    let (sub, addr) = start_unicast(&[]);
    let socket = sender();
    let mut all = datagrams(&segments, 0xfeed);
    let skipped = 7;
    all.remove(skipped);
    socket.send_to(b"GET / HTTP/1.1\r\n\r\n", addr).unwrap();
    send_all(&socket, addr, &all);
    send_end(&socket, addr, &totals(&refs(&segments)), 0xfeed, segments.len() as u64 + 1);
    let done = sub.finish();
    let r = done.json();
    let received: Vec<&[u8]> =
        segments.iter().enumerate().filter(|(i, _)| *i != skipped).map(|(_, s)| s.as_slice()).collect();
    assert_fields(&r, &expected(&received, None));
    assert_eq!(r["gaps"], 1);
    assert_eq!(r["duplicates"], 0);
    assert_eq!(r["invalid_packets"], 1);
    assert_eq!(r["totals_match"], false);
    assert_eq!(r["stop_reason"], "end");
    assert!(done.stderr.contains("not a relay datagram"), "{}", done.stderr);
}

#[test]
fn a_duplicate_is_counted_and_skipped_and_a_reordered_frame_fills_its_gap() {
    let segments = synthetic(1_500, 6, 22);
    let (sub, addr) = start_unicast(&[]);
    let socket = sender();
    let mut all = datagrams(&segments, 0xbeef);
    let again = all[4].clone();
    all.insert(5, again);
    all.swap(9, 10);
    send_all(&socket, addr, &all);
    send_end(&socket, addr, &totals(&refs(&segments)), 0xbeef, segments.len() as u64 + 1);
    let r = sub.finish().json();
    // The duplicate is not aggregated twice: everything matches the publisher.
    assert_fields(&r, &expected(&refs(&segments), None));
    assert_eq!(r["duplicates"], 1);
    assert_eq!(r["reordered"], 1);
    assert_eq!(r["gaps"], 0);
    assert_eq!(r["totals_match"], true);
}

#[test]
fn a_new_publisher_session_restarts_sequence_tracking() {
    let segments = synthetic(1_200, 6, 23);
    let (sub, addr) = start_unicast(&[]);
    let socket = sender();
    let (first, second) = segments.split_at(segments.len() / 2);
    send_all(&socket, addr, &datagrams(first, 1));
    // The restarted publisher numbers its frames from 1 again: no duplicates, no gaps.
    send_all(&socket, addr, &datagrams(second, 2));
    send_end(&socket, addr, &totals(&refs(second)), 2, second.len() as u64 + 1);
    let done = sub.finish();
    let r = done.json();
    assert_eq!(r["publisher_restarts"], 1);
    assert_eq!(r["duplicates"], 0);
    assert_eq!(r["gaps"], 0);
    assert_eq!(r["frames"], segments.len());
    assert!(done.stderr.contains("publisher restarted"), "{}", done.stderr);
}

#[test]
fn multicast_on_the_loopback_interface_receives_the_stream() {
    let segments = synthetic(3_000, 10, 24);
    let mut sub = Sub::start(&[
        "--group",
        "239.255.77.21:0",
        "--interface",
        "127.0.0.1",
        "--json",
        "-",
        "--report-interval",
        "0",
        "--duration",
        "60",
    ]);
    let group = sub.listening_on();
    assert_eq!(group.ip(), "239.255.77.21".parse::<std::net::IpAddr>().unwrap());
    let socket = Socket::new(Domain::IPV4, Type::DGRAM, Some(Protocol::UDP)).unwrap();
    socket.set_multicast_if_v4(&Ipv4Addr::LOCALHOST).unwrap();
    socket.set_multicast_loop_v4(true).unwrap();
    socket.bind(&SocketAddr::from((Ipv4Addr::LOCALHOST, 0)).into()).unwrap();
    let socket: UdpSocket = socket.into();
    // Several frames per datagram, as a publisher packs them.
    let mut codec = Codec::new(Format::Raw, Limits::default());
    let mut all = Vec::new();
    let mut seq = 1u64;
    for chunk in segments.chunks(3) {
        let mut body = Vec::new();
        for s in chunk {
            encode(&mut codec, s, &mut body);
        }
        all.push(datagram(DatagramKind::Data, Format::Raw, chunk.len() as u8, 77, seq, &body));
        seq += chunk.len() as u64;
    }
    send_all(&socket, group, &all);
    send_end(&socket, group, &totals(&refs(&segments)), 77, seq);
    let done = sub.finish();
    assert!(done.status.success(), "{done:?}");
    let r = done.json();
    assert_fields(&r, &expected(&refs(&segments), None));
    assert_eq!(r["totals_match"], true);
    assert_eq!(r["gaps"], 0);
    assert!(r["transport"].as_str().unwrap().starts_with("multicast 239.255.77.21"));
}

#[test]
fn round_trip_echo_datagrams_go_back_to_the_sender() {
    let segments = synthetic(500, 4, 25);
    let (sub, addr) = start_unicast(&["--latency", "round-trip"]);
    let socket = sender();
    // Echoes are read as they come, as a publisher does: left queued, they would overflow the
    // sender's receive buffer.
    let back = socket.try_clone().unwrap();
    let expected_echoes = segments.len();
    let reader = std::thread::spawn(move || {
        let mut echoes = Vec::new();
        let mut buf = [0u8; 2048];
        while echoes.len() < expected_echoes {
            let (n, _) = back.recv_from(&mut buf).expect("an echo for every frame");
            let header = DatagramHeader::parse(&buf[..n]).unwrap();
            assert_eq!(header.kind, DatagramKind::Echo);
            assert_eq!(header.session, 9);
            echoes.push(Echo::parse(&buf[DatagramHeader::LEN..n]).unwrap());
        }
        echoes
    });
    let all = datagrams(&segments, 9);
    send_all(&socket, addr, &all);
    send_end(&socket, addr, &totals(&refs(&segments)), 9, segments.len() as u64 + 1);
    let echoes = reader.join().unwrap();
    let r = sub.finish().json();
    assert_eq!(r["echoes_sent"], segments.len());
    for (i, echo) in echoes.iter().enumerate() {
        assert_eq!(echo.sequence, i as u64 + 1);
        assert_eq!(echo.publish_time, i64::from_le_bytes(all[i][DatagramHeader::LEN..][..8].try_into().unwrap()));
    }
}

#[test]
fn count_stops_the_run_with_a_report() {
    let segments = synthetic(1_000, 4, 26);
    let (sub, addr) = start_unicast(&["--count", "100"]);
    let socket = sender();
    send_all(&socket, addr, &datagrams(&segments, 1));
    let r = sub.finish().json();
    assert_eq!(r["stop_reason"], "count");
    assert!(r["messages"].as_u64().unwrap() >= 100);
    assert_eq!(r["totals_match"], serde_json::Value::Null);
}

#[test]
fn sigterm_stops_the_run_with_a_report() {
    let segments = synthetic(300, 4, 27);
    let (sub, addr) = start_unicast(&[]);
    let socket = sender();
    let all = datagrams(&segments, 1);
    send_all(&socket, addr, &all[..5]);
    std::thread::sleep(Duration::from_millis(300));
    let pid = nix::unistd::Pid::from_raw(sub.id() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    let done = sub.finish();
    assert_eq!(done.status.code(), Some(0), "{done:?}");
    let r = done.json();
    assert_eq!(r["stop_reason"], "signal");
    assert_eq!(r["frames"], 5);
}
