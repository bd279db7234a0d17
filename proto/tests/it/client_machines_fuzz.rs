//! The client machines under arbitrary bytes: whatever a peer sends, in whatever pieces, they
//! never panic, never allocate because a length field says so, and hand out the same events
//! however the bytes were split. Half the inputs start like the protocol (a real greeting, real
//! record headers with lying fields), so the cases reach past the first check.

use mdrelay_codec::Format;
use mdrelay_harness::alloc::count_allocations;
use mdrelay_proto::relay::client::{
    ConnectionConfig, DatagramConfig, DatagramReceiver, FrameReader, Line, Origin, Payload, Place, ReaderConfig,
    RecoveryConfig, StreamClient, StreamClientConfig, StreamConnection,
};
use mdrelay_proto::relay::{
    DATAGRAM_VERSION, DatagramHeader, DatagramKind, Hello, Protection, RecordHeader, RecordTag, WireKey,
};
use proptest::prelude::*;
use std::net::SocketAddr;
use std::time::Duration;

// Counts only the threads that ask (see `count_allocations`).
/// A read buffer this small makes every growth show.
const SMALL_BUFFER: usize = 64;

fn peer() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 9100))
}

/// Bytes that look like a stream to the first checks: a greeting, then records whose headers
/// are real but whose fields (lengths, counts, numbers, tags) and payloads are arbitrary.
fn stream_like() -> impl Strategy<Value = Vec<u8>> {
    let record =
        (0u8..10, 0u8..9, any::<u16>(), 0u32..300, any::<u64>(), proptest::collection::vec(any::<u8>(), 0..300));
    (any::<u64>(), any::<bool>(), proptest::collection::vec(record, 0..12)).prop_map(|(session, v1, records)| {
        let mut hello = Hello::new(Format::Sbe, session % 4, 1, 1);
        if v1 {
            hello.protocol_version = 1;
        }
        let mut bytes = hello.to_bytes().to_vec();
        for (tag, format, frames, length, sequence, payload) in records {
            let mut header = RecordHeader {
                tag: RecordTag::Data,
                format: Format::ALL[usize::from(format) % Format::ALL.len()],
                frame_count: frames,
                length,
                sequence: sequence % 64,
            }
            .to_bytes();
            header[0] = tag;
            header[1] = format;
            bytes.extend_from_slice(&header);
            bytes.extend_from_slice(&payload[..payload.len().min(length as usize)]);
        }
        bytes
    })
}

fn input() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![proptest::collection::vec(any::<u8>(), 0..2048), stream_like()]
}

/// Cut points inside `len` bytes, from arbitrary numbers.
fn cuts(len: usize, picks: &[usize]) -> Vec<usize> {
    let mut cuts: Vec<usize> = picks.iter().map(|p| p % len.max(1)).filter(|c| *c > 0).collect();
    cuts.sort_unstable();
    cuts.dedup();
    cuts
}

/// Feeds `bytes` to `conn` in pieces cut at `cuts`, polling and writing after each as a driver
/// does, then closes the input; returns the events' `Debug` texts.
fn feed(conn: &mut StreamConnection, bytes: &[u8], cuts: &[usize]) -> Vec<String> {
    let mut events = Vec::new();
    let poll = |conn: &mut StreamConnection, events: &mut Vec<String>| {
        while let Some(e) = conn.poll_event() {
            events.push(format!("{e:?}"));
            let n = conn.transmit().len();
            conn.transmitted(n);
        }
    };
    let mut start = 0;
    for end in cuts.iter().copied().chain([bytes.len()]) {
        let mut piece = &bytes[start..end];
        start = end;
        while !piece.is_empty() {
            let room = conn.read_buf();
            if room.is_empty() {
                poll(conn, &mut events);
                if conn.read_buf().is_empty() {
                    return events;
                }
                continue;
            }
            let n = room.len().min(piece.len());
            room[..n].copy_from_slice(&piece[..n]);
            conn.received(n, 0);
            piece = &piece[n..];
            poll(conn, &mut events);
        }
    }
    conn.received(0, 0);
    poll(conn, &mut events);
    events
}

fn configs() -> Vec<ConnectionConfig> {
    let key = WireKey::new([1; 32]);
    let mut configs = vec![
        ConnectionConfig::subscriber(peer(), Protection::NONE, None, true),
        ConnectionConfig::subscriber(peer(), Protection { crc: true, encrypted: true }, Some(key), false),
        ConnectionConfig::relay("up:1".into(), peer(), false, Duration::from_secs(1)),
        ConnectionConfig::recovery(peer(), Protection::NONE),
    ];
    for c in &mut configs {
        c.read_buffer = SMALL_BUFFER;
    }
    configs
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn a_connection_takes_any_bytes_in_any_pieces_alike_within_bounded_memory(
        bytes in input(),
        picks in proptest::collection::vec(any::<usize>(), 0..40),
    ) {
        for config in configs() {
            let role = format!("{:?}", config.role);
            let (whole, allocations) = count_allocations(|| {
                let mut conn = StreamConnection::new(config.clone(), 0);
                let events = feed(&mut conn, &bytes, &[]);
                (events, conn.buffer_capacity())
            });
            let split = feed(&mut StreamConnection::new(config.clone(), 0), &bytes, &cuts(bytes.len(), &picks));
            let byte_by_byte = feed(&mut StreamConnection::new(config.clone(), 0), &bytes, &(1..bytes.len()).collect::<Vec<_>>());
            prop_assert_eq!(&whole.0, &split, "{}", role);
            prop_assert_eq!(&whole.0, &byte_by_byte, "{}", role);
            prop_assert!(whole.0.last().is_some_and(|e| e.starts_with("Closed")), "{}: it always ends: {:?}", role, whole.0);
            // The buffer grows by doubling as bytes arrive: never past twice what came.
            let bound = (2 * bytes.len()).max(SMALL_BUFFER) + 64;
            prop_assert!(whole.1 <= bound, "{}: a buffer of {} for {} bytes", role, whole.1, bytes.len());
            prop_assert!(allocations.largest <= 4 * bytes.len() + 4096, "{}: {:?} for {} bytes", role, allocations, bytes.len());
        }
    }

    #[test]
    fn a_stream_client_takes_any_bytes_over_several_connections(
        inputs in proptest::collection::vec(input(), 1..4),
        picks in proptest::collection::vec(any::<usize>(), 0..20),
    ) {
        let mut config = StreamClientConfig::subscriber(Protection::NONE, None, Duration::from_secs(1));
        config.read_buffer = SMALL_BUFFER;
        config.echo_every = Some(1);
        let mut client = StreamClient::new(config);
        let mut now = 0;
        for bytes in &inputs {
            // Whatever the last connection did, the client says what to do next.
            loop {
                match client.poll_action(now) {
                    mdrelay_proto::relay::client::ClientAction::Wait(until) => now = until,
                    mdrelay_proto::relay::client::ClientAction::Connect => break,
                    mdrelay_proto::relay::client::ClientAction::Finished => return Ok(()),
                    mdrelay_proto::relay::client::ClientAction::Run => {
                        client.on_timeout(now + 20_000_000_000);
                        while client.poll_event(&mut ()).is_some() {}
                    }
                }
            }
            client.connected(peer(), now);
            let cuts = cuts(bytes.len(), &picks);
            let mut start = 0;
            for end in cuts.iter().copied().chain([bytes.len()]) {
                let mut piece = &bytes[start..end];
                start = end;
                while !piece.is_empty() {
                    let room = client.read_buf();
                    if room.is_empty() {
                        break;
                    }
                    let n = room.len().min(piece.len());
                    room[..n].copy_from_slice(&piece[..n]);
                    client.received(n, now, now);
                    piece = &piece[n..];
                    while client.poll_event(&mut ()).is_some() {}
                    let n = client.transmit().len();
                    client.transmitted(n);
                    prop_assert!(client.buffer_capacity() <= (2 * bytes.len()).max(SMALL_BUFFER) + 64);
                }
            }
            client.received(0, now, now);
            while client.poll_event(&mut ()).is_some() {}
        }
    }

    #[test]
    fn a_datagram_receiver_takes_any_datagrams(
        datagrams in proptest::collection::vec(datagram(), 0..40),
        protected in any::<bool>(),
    ) {
        let reader = if protected {
            ReaderConfig { crc: true, key: Some(WireKey::new([2; 32])), echo_every: Some(1), ..ReaderConfig::default() }
        } else {
            ReaderConfig { echo_every: Some(2), ..ReaderConfig::default() }
        };
        let config = DatagramConfig {
            reader,
            from_start: true,
            lines: Some(("a".into(), "b".into())),
            recovery: Some(RecoveryConfig {
                delay: Duration::from_millis(1),
                retry: Duration::from_millis(2),
                attempts: 2,
                linger: Duration::from_millis(5),
            }),
            // Waiting for a snapshot holds the datagrams: with none, every one is taken.
            snapshot: false,
        };
        let mut r = DatagramReceiver::new(config);
        let mut now = 0;
        for (i, d) in datagrams.iter().enumerate() {
            let line = if i % 3 == 0 { Line::B } else { Line::A };
            let ((), allocations) = count_allocations(|| {
                r.datagram(Origin::Line(line), d, peer(), now, now, &mut ());
                while r.poll_event(&mut ()).is_some() {}
                while r.next_echo().is_some() {}
            });
            prop_assert!(allocations.largest <= (4 * d.len()).max(64 << 10), "{:?} for {} bytes", allocations, d.len());
            now += 1_000_000;
            r.on_timeout(now);
            if r.recovery_action(now).is_some() {
                r.recovery_connect_failed("cannot connect", now);
            }
            while r.poll_event(&mut ()).is_some() {}
        }
        r.finish_run();
    }

    #[test]
    fn a_frame_reader_takes_any_payload_in_any_format(
        bytes in proptest::collection::vec(any::<u8>(), 0..2048),
        format in 0usize..Format::ALL.len(),
        frames in any::<u16>(),
        first in any::<u64>(),
        crc in any::<bool>(),
        ordered in any::<bool>(),
    ) {
        let mode = if ordered { mdrelay_proto::relay::client::ReaderMode::Ordered } else { Default::default() };
        let mut reader = FrameReader::new(ReaderConfig { mode, crc, echo_every: Some(1), ..ReaderConfig::default() });
        let p = Payload {
            origin: Origin::Stream,
            format: Format::ALL[format],
            bytes: &bytes,
            first_sequence: first,
            declared_frames: u64::from(frames),
            session: 1,
            receive_time: 0,
            now: 0,
            place: Place::Stream(56),
        };
        let (outcome, allocations) = count_allocations(|| reader.payload(p, &mut ()));
        prop_assert!(outcome.decoded <= u64::from(frames));
        // A codec is made for the format the first time (its own buffers), nothing by a length.
        // Packed Cap'n Proto is unpacked before it is read, and may take what its bytes unpack
        // to: at most 1 KiB a byte (a two-byte zero run is 256 words), however large a size
        // its segment table claims.
        let expands = if Format::ALL[format] == Format::CapnpPacked { 1024 } else { 4 };
        prop_assert!(allocations.largest <= (expands * bytes.len()).max(1 << 20), "{:?}", allocations);
    }
}

/// Datagrams: arbitrary bytes, or a relay header with arbitrary fields and payload.
fn datagram() -> impl Strategy<Value = Vec<u8>> {
    let header = (0u8..3, 0u8..4, any::<u8>(), 0u64..3, 0u64..200, proptest::collection::vec(any::<u8>(), 0..400));
    prop_oneof![
        proptest::collection::vec(any::<u8>(), 0..200),
        header.prop_map(|(kind, protection, frames, session, sequence, payload)| {
            let mut d = DatagramHeader {
                version: DATAGRAM_VERSION,
                format: Format::Sbe,
                kind: DatagramKind::Data,
                frame_count: frames.into(),
                protection: Protection::from_bits(protection).unwrap_or_default(),
                session,
                sequence,
            }
            .to_bytes()
            .to_vec();
            d[6] = kind | protection << 4;
            d.extend(payload);
            d
        }),
    ]
}
