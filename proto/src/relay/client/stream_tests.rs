//! The stream client across connections, with a fake clock and a publisher made of bytes: a
//! whole stream in random splits, resume after a cut, restarts, the waits between connections,
//! refusals, and a relay's give-up, violations and CRC failures.

use super::*;
use crate::relay::client::testing::{Notes, capture_frames, feed_with, peer, random_cuts, record};
use crate::relay::protect::Protector;
use crate::relay::wire::{Resume, Subscribe, Totals};
use mdrelay_codec::Format;

const MS: i64 = 1_000_000;
const S: i64 = 1_000 * MS;
const SESSION: u64 = 0xabc;

/// A publisher's bytes: greeting, FORMAT naming `from`, the frames `from..` one per record up to
/// `to` (exclusive), then END when `end`.
fn publisher(frames: &[Vec<u8>], format: Format, session: u64, from: u64, to: u64, end: bool) -> Vec<u8> {
    let mut b = Hello::new(format, session, 1, from).to_bytes().to_vec();
    b.extend(record(RecordTag::Format, format, 0, from, &[]));
    for seq in from..to {
        b.extend(record(RecordTag::Data, format, 1, seq, &frames[seq as usize - 1]));
    }
    if end {
        let mut totals = Vec::new();
        Totals { frames: frames.len() as u64, messages: 0, ..Totals::default() }.write(&mut totals);
        b.extend(record(RecordTag::End, format, 0, to, &totals));
    }
    b
}

/// Feeds `bytes` in pieces cut at `cuts`, then closes the input when `eof`; the answer is written
/// at once. Returns the events and the answer the client wrote.
fn drive(
    client: &mut StreamClient,
    bytes: &[u8],
    cuts: &[usize],
    now: i64,
    eof: bool,
    notes: &mut Notes,
) -> (Vec<ClientEvent>, Vec<u8>) {
    let mut events = Vec::new();
    let mut written = Vec::new();
    feed_with(client, bytes, cuts, now, eof, |client| {
        while let Some(e) = client.poll_event(notes) {
            events.push(e);
            written.extend_from_slice(client.transmit());
            let n = client.transmit().len();
            client.transmitted(n);
        }
        written.extend_from_slice(client.transmit());
        let n = client.transmit().len();
        client.transmitted(n);
    });
    (events, written)
}

fn subscriber() -> StreamClient {
    StreamClient::new(StreamClientConfig::subscriber(Protection::NONE, None, Duration::from_secs(5)))
}

/// A subscriber connecting again after at most `reconnect_max`, its settings changed by `edit`.
fn subscriber_with(reconnect_max: Duration, edit: impl FnOnce(&mut StreamClientConfig)) -> StreamClient {
    let mut config = StreamClientConfig::subscriber(Protection::NONE, None, reconnect_max);
    edit(&mut config);
    StreamClient::new(config)
}

/// Takes `client`'s next action at `now`, whatever it is, and connects it.
fn connect(client: &mut StreamClient, now: i64) {
    client.poll_action(now);
    client.connected(peer(), now);
}

/// Checks that `client`'s next action at `now` is to connect, and connects it.
fn connect_at_once(client: &mut StreamClient, now: i64) {
    assert_eq!(client.poll_action(now), ClientAction::Connect);
    client.connected(peer(), now);
}

/// Steps `client` from `*now` until it finishes and returns how: `connect` at each connection
/// attempt, the waits taken as they come, then `after` each step; a client that runs panics
/// with `running`.
fn until_finished(
    client: &mut StreamClient,
    now: &mut i64,
    notes: &mut Notes,
    running: &str,
    mut connect: impl FnMut(&mut StreamClient, i64, &mut Notes),
    mut after: impl FnMut(&mut StreamClient, &mut Notes),
) -> Option<Finish> {
    loop {
        match client.poll_action(*now) {
            ClientAction::Connect => connect(client, *now, notes),
            ClientAction::Wait(until) => *now = until,
            ClientAction::Finished => return client.finished().cloned(),
            ClientAction::Run => panic!("{running}"),
        }
        after(client, notes);
    }
}

fn answer(written: &[u8]) -> Subscribe {
    Subscribe::parse(written).expect("the client answered")
}

#[test]
fn a_whole_stream_in_any_split_gives_every_frame_once_and_ends() {
    let frames = capture_frames("DEEP10.pcap.gz", Format::Capnp, 60);
    let bytes = publisher(&frames, Format::Capnp, SESSION, 1, 61, true);
    let mut reference: Option<(Vec<u64>, Vec<u8>)> = None;
    for seed in 0..40 {
        let mut client = subscriber();
        connect_at_once(&mut client, 0);
        let mut notes = Notes::default();
        let cuts = if seed == 0 { (1..bytes.len()).collect() } else { random_cuts(bytes.len(), seed) };
        let (events, written) = drive(&mut client, &bytes, &cuts, 0, false, &mut notes);
        assert_eq!(answer(&written).resume, Resume::Live);
        assert!(matches!(events[0], ClientEvent::Connected { again: false, .. }));
        assert!(matches!(events[1], ClientEvent::Greeted { first: true, .. }));
        assert!(matches!(events.last(), Some(ClientEvent::Finished(Finish::End))), "{events:?}");
        assert_eq!(client.poll_action(0), ClientAction::Finished);
        let got = (notes.sequences(), notes.kinds.clone());
        assert_eq!(got.0, (1..=60).collect::<Vec<_>>());
        match &reference {
            None => reference = Some(got),
            Some(r) => assert_eq!(&got, r, "seed {seed}"),
        }
        assert_eq!(client.reader().tracker().counts().lost, 0);
        assert!(client.end().is_some_and(|e| e.believed && e.next_sequence == 61));
    }
}

#[test]
fn a_cut_stream_resumes_after_the_last_frame_received_and_loses_nothing() {
    let frames = capture_frames("DEEP10.pcap.gz", Format::Sbe, 30);
    let mut client = subscriber();
    let mut notes = Notes::default();
    connect(&mut client, 0);
    // The connection dies inside the record of frame 13.
    let first = publisher(&frames, Format::Sbe, SESSION, 1, 14, false);
    let (events, _) = drive(&mut client, &first[..first.len() - 7], &[], S, true, &mut notes);
    let Some(ClientEvent::Lost { closed, retry_in }) = events.last() else { panic!("{events:?}") };
    assert!(
        closed.why.starts_with("the publisher closed the connection inside a record at stream byte"),
        "{}",
        closed.why
    );
    assert_eq!(*retry_in, 100 * MS, "a connection that worked starts the waits over");
    assert_eq!(client.poll_action(S + 50 * MS), ClientAction::Wait(S + 100 * MS));
    connect_at_once(&mut client, S + 100 * MS);
    // The same publisher run: the answer asks for frame 13; the ring replays from there.
    let second = publisher(&frames, Format::Sbe, SESSION, 13, 31, true);
    let (events, written) = drive(&mut client, &second, &random_cuts(second.len(), 3), 2 * S, false, &mut notes);
    assert_eq!(answer(&written).resume, Resume::From(13));
    assert!(events.iter().any(|e| matches!(e, ClientEvent::Greeted { resume: Start::Resume { from: 13 }, .. })));
    assert!(events.contains(&ClientEvent::Resumed { from: 13 }), "{events:?}");
    assert!(matches!(events[0], ClientEvent::Connected { again: true, .. }));
    assert_eq!(notes.sequences(), (1..=30).collect::<Vec<_>>(), "no gap, no duplicate");
    let c = client.counts();
    assert_eq!((c.connections, c.reconnects, c.resumes), (2, 1, 1));
    assert_eq!(client.reader().tracker().counts(), Default::default());
}

#[test]
fn a_resume_the_publisher_cannot_serve_loses_the_frames_between() {
    let frames = capture_frames("DEEP10.pcap.gz", Format::Sbe, 20);
    let mut client = subscriber();
    let mut notes = Notes::default();
    connect(&mut client, 0);
    drive(&mut client, &publisher(&frames, Format::Sbe, SESSION, 1, 6, false), &[], 0, true, &mut notes);
    connect(&mut client, S);
    // No ring: live from frame 9.
    let (events, _) =
        drive(&mut client, &publisher(&frames, Format::Sbe, SESSION, 9, 21, true), &[], S, false, &mut notes);
    assert!(events.contains(&ClientEvent::ResumeFailed { asked: 6, offered: 9 }), "{events:?}");
    assert_eq!(client.reader().tracker().counts().lost, 3);
    assert_eq!(client.counts().resumes, 0);
}

#[test]
fn without_resume_a_reconnection_takes_the_stream_live_and_the_frames_between_are_lost() {
    let frames = capture_frames("DEEP10.pcap.gz", Format::Sbe, 20);
    let mut client = subscriber_with(Duration::from_secs(5), |c| c.resume = false);
    let mut notes = Notes::default();
    connect(&mut client, 0);
    drive(&mut client, &publisher(&frames, Format::Sbe, SESSION, 1, 6, false), &[], 0, true, &mut notes);
    connect(&mut client, S);
    // The same session, yet the answer asks for the stream live; the publisher goes on at 9.
    let (events, written) =
        drive(&mut client, &publisher(&frames, Format::Sbe, SESSION, 9, 21, true), &[], S, false, &mut notes);
    assert_eq!(answer(&written).resume, Resume::Live);
    assert!(events.iter().any(|e| matches!(e, ClientEvent::Greeted { resume: Start::Live, .. })), "{events:?}");
    assert!(!events.iter().any(|e| matches!(e, ClientEvent::Resumed { .. } | ClientEvent::ResumeFailed { .. })));
    assert_eq!(client.reader().tracker().counts().lost, 3, "frames 6 to 8");
    assert_eq!(notes.sequences(), (1..=5).chain(9..=20).collect::<Vec<_>>());
    assert_eq!(client.counts().resumes, 0);
}

#[test]
fn a_restarted_publisher_starts_the_accounting_over_and_from_start_asks_for_frame_one() {
    let frames = capture_frames("DEEP10.pcap.gz", Format::Sbe, 10);
    let mut client = subscriber_with(Duration::from_secs(5), |c| c.from_start = true);
    let mut notes = Notes::default();
    connect(&mut client, 0);
    let (_, written) =
        drive(&mut client, &publisher(&frames, Format::Sbe, SESSION, 1, 5, false), &[], 0, true, &mut notes);
    assert_eq!(answer(&written).resume, Resume::From(1), "from the start before anything was received");
    connect(&mut client, S);
    let (events, written) =
        drive(&mut client, &publisher(&frames, Format::Sbe, SESSION + 1, 3, 11, true), &[], S, false, &mut notes);
    assert_eq!(answer(&written).resume, Resume::Live, "frames were received: from-start is over");
    assert!(events.contains(&ClientEvent::Restarted { old: SESSION, new: SESSION + 1 }), "{events:?}");
    assert_eq!(client.reader().tracker().restarts(), 1);
    assert_eq!(client.reader().tracker().late_join(), None, "the first session was had from its start");
}

#[test]
fn waits_double_after_failures_and_start_over_after_a_connection_that_worked() {
    let mut client =
        StreamClient::new(StreamClientConfig::subscriber(Protection::NONE, None, Duration::from_millis(500)));
    let mut notes = Notes::default();
    let mut now = 0;
    let mut waits = Vec::new();
    for _ in 0..4 {
        assert_eq!(client.poll_action(now), ClientAction::Connect);
        client.connect_failed("connection refused", now);
        let Some(ClientEvent::ConnectFailed { retry_in, .. }) = client.poll_event(&mut notes) else { panic!() };
        waits.push(retry_in / MS);
        assert_eq!(client.poll_action(now), ClientAction::Wait(now + retry_in));
        assert_eq!(client.deadline(), Some(now + retry_in));
        now += retry_in;
    }
    assert_eq!(waits, [100, 200, 400, 500]);
    // A greeting that never comes is no connection that worked: the waits keep growing.
    connect(&mut client, now);
    now += 10 * S;
    client.on_timeout(now);
    let events: Vec<ClientEvent> = std::iter::from_fn(|| client.poll_event(&mut notes)).collect();
    let Some(ClientEvent::Lost { closed, retry_in }) = events.last() else { panic!("{events:?}") };
    assert_eq!((closed.why.as_str(), *retry_in), ("no greeting within 10s", 500 * MS));
    // A connection whose handshake worked, then lost: from the first wait again.
    now += retry_in;
    connect(&mut client, now);
    let frames = capture_frames("DEEP10.pcap.gz", Format::Sbe, 2);
    let (events, _) =
        drive(&mut client, &publisher(&frames, Format::Sbe, SESSION, 1, 3, false), &[], now, true, &mut notes);
    assert!(matches!(events.last(), Some(ClientEvent::Lost { retry_in, .. }) if *retry_in == 100 * MS), "{events:?}");
    // BUSY and violations keep the waits growing.
    connect(&mut client, now + S);
    let mut busy = Hello::new(Format::Sbe, SESSION, 1, 3).to_bytes().to_vec();
    busy.extend(record(RecordTag::Busy, Format::Sbe, 0, 3, b"full"));
    let (events, _) = drive(&mut client, &busy, &[], now + S, false, &mut notes);
    assert!(matches!(events.last(), Some(ClientEvent::Lost { retry_in, .. }) if *retry_in == 200 * MS), "{events:?}");
}

#[test]
fn a_subscriber_with_a_limit_gives_up_when_no_connection_works_for_that_long() {
    let mut client = subscriber_with(Duration::from_millis(500), |c| c.give_up_after_ns = Some(2 * S));
    let mut notes = Notes::default();
    let mut now = 0;
    let mut attempts = 0;
    until_finished(
        &mut client,
        &mut now,
        &mut notes,
        "nothing connected",
        |client, now, _| {
            attempts += 1;
            client.connect_failed("connection refused", now);
        },
        |client, notes| while client.poll_event(notes).is_some() {},
    );
    // 100, 200, 400, 500, 500 ms of waits: the attempt at 1.7 s is the last before 2 s.
    assert_eq!((attempts, now), (6, 1_700 * MS));
    let Some(Finish::Fatal(why)) = client.finished() else { panic!("{:?}", client.finished()) };
    assert!(why.starts_with("connection refused; not reached in 6 attempts over 1.7 s (give up after 2s)"), "{why}");
    // A connection that works starts the count over; without a limit, attempts never end.
    let mut client = subscriber_with(Duration::from_millis(500), |c| c.give_up_after_ns = Some(2 * S));
    let frames = capture_frames("DEEP10.pcap.gz", Format::Sbe, 3);
    client.poll_action(0);
    client.connect_failed("connection refused", 0);
    connect(&mut client, S);
    drive(&mut client, &publisher(&frames, Format::Sbe, SESSION, 1, 3, false), &[], S, true, &mut notes);
    let mut now = 5 * S;
    for _ in 0..4 {
        assert_eq!(client.poll_action(now), ClientAction::Connect, "{:?}", client.finished());
        client.connect_failed("connection refused", now);
        while client.poll_event(&mut notes).is_some() {}
        now += S / 2;
    }
    let mut forever = subscriber();
    for n in 0..100 {
        assert_eq!(forever.poll_action(n * 10 * S), ClientAction::Connect);
        forever.connect_failed("connection refused", n * 10 * S);
    }
}

#[test]
fn a_refusal_ends_the_stream() {
    let mut client = subscriber();
    let mut notes = Notes::default();
    connect(&mut client, 0);
    let mut bytes = Hello::new(Format::Sbe, SESSION, 1, 1).to_bytes().to_vec();
    bytes[8] = 7;
    let (events, _) = drive(&mut client, &bytes, &[], 0, false, &mut notes);
    let Some(ClientEvent::Finished(Finish::Refused(closed))) = events.last() else { panic!("{events:?}") };
    assert!(closed.why.starts_with("publisher 127.0.0.1:9100: the peer speaks relay protocol version 7"));
    assert_eq!(client.poll_action(0), ClientAction::Finished);
    assert!(client.read_buf().is_empty());
}

#[test]
fn every_nth_frame_is_echoed_back_on_the_stream() {
    let frames = capture_frames("DEEP10.pcap.gz", Format::Sbe, 6);
    let mut client = subscriber_with(Duration::from_secs(5), |c| c.echo_every = Some(3));
    let mut notes = Notes::default();
    connect(&mut client, 0);
    let (_, written) =
        drive(&mut client, &publisher(&frames, Format::Sbe, SESSION, 1, 7, true), &[], 0, false, &mut notes);
    let subscribe = answer(&written);
    assert!(subscribe.echo);
    let echoes: Vec<u64> = written[Subscribe::V2_LEN..]
        .chunks(32)
        .map(|r| {
            let h = crate::relay::wire::RecordHeader::parse(r, 16).unwrap();
            assert_eq!((h.tag, h.format), (RecordTag::Echo, Format::Sbe));
            h.sequence
        })
        .collect();
    assert_eq!(echoes, [3, 6]);
    assert_eq!(client.counts().connection.echoes_sent, 2);
}

fn relay(give_up: Duration) -> StreamClient {
    StreamClient::new(StreamClientConfig::relay(
        "up.example:9100".into(),
        false,
        Duration::from_secs(1),
        give_up,
        Duration::from_secs(10),
        None,
    ))
}

#[test]
fn a_relay_retries_at_once_after_a_loss_then_waits_and_gives_up_in_time() {
    let mut client = relay(Duration::from_secs(2));
    let mut notes = Notes::default();
    let mut now = 0;
    let mut waits = Vec::new();
    let finish = until_finished(
        &mut client,
        &mut now,
        &mut notes,
        "never connected",
        |client, now, _| client.connect_failed("connecting to 10.0.0.1:9100: connection refused", now),
        |client, notes| {
            while let Some(e) = client.poll_event(notes) {
                if let ClientEvent::ConnectFailed { retry_in, .. } = e {
                    waits.push(retry_in / MS);
                }
            }
        },
    );
    assert_eq!(waits, [100, 200, 400, 800], "the next wait would pass give_up_after");
    let Some(Finish::Fatal(why)) = finish else { panic!("{finish:?}") };
    assert_eq!(
        why,
        "upstream up.example:9100: connecting to 10.0.0.1:9100: connection refused; not reached in 5 attempts over 1.5 s at start (source.upstream.give_up_after = 2s)"
    );

    // A connection that worked and was lost: the next attempt is at once.
    let frames = capture_frames("DEEP10.pcap.gz", Format::Sbe, 8);
    let mut client = relay(Duration::from_secs(2));
    connect(&mut client, 0);
    drive(&mut client, &publisher(&frames, Format::Sbe, SESSION, 1, 5, false), &[], S, true, &mut notes);
    connect_at_once(&mut client, S);
    let (events, written) =
        drive(&mut client, &publisher(&frames, Format::Sbe, SESSION, 5, 9, true), &[], S, false, &mut notes);
    assert_eq!(answer(&written).resume, Resume::From(5), "after the last frame handed on");
    assert!(events.contains(&ClientEvent::Reconnected { attempt: 1 }), "{events:?}");
    assert!(events.contains(&ClientEvent::Resumed { from: 5 }), "{events:?}");
    assert_eq!((client.counts().reconnects, client.counts().resumes), (1, 1));
    assert!(matches!(client.finished(), Some(Finish::End)));
}

#[test]
fn a_relay_cannot_follow_a_restart_and_ignores_an_end_that_does_not_fit() {
    let frames = capture_frames("DEEP10.pcap.gz", Format::Sbe, 8);
    let mut client = relay(Duration::from_secs(30));
    let mut notes = Notes::default();
    connect(&mut client, 0);
    drive(&mut client, &publisher(&frames, Format::Sbe, SESSION, 1, 4, false), &[], 0, true, &mut notes);
    connect(&mut client, 0);
    let (events, _) =
        drive(&mut client, &publisher(&frames, Format::Sbe, SESSION + 1, 1, 4, false), &[], 0, false, &mut notes);
    let Some(ClientEvent::Finished(Finish::Fatal(why))) = events.last() else { panic!("{events:?}") };
    assert!(why.contains("restarted: its session 0xabc is now 0xabd"), "{why}");

    let mut client = relay(Duration::from_secs(30));
    connect(&mut client, 0);
    let mut bytes = publisher(&frames, Format::Sbe, SESSION, 1, 4, false);
    let mut totals = Vec::new();
    Totals::default().write(&mut totals);
    bytes.extend(record(RecordTag::End, Format::Sbe, 0, 4 + (1 << 40), &totals));
    let (events, _) = drive(&mut client, &bytes, &[], 0, false, &mut notes);
    assert!(events.iter().any(|e| matches!(e, ClientEvent::End(end) if !end.believed)), "{events:?}");
}

#[test]
fn a_relay_drops_a_connection_whose_frame_fails_its_crc_and_resumes_from_that_frame() {
    let frames = capture_frames("DEEP10.pcap.gz", Format::Sbe, 6);
    let mut sealer = Protector::new(true, None, 1 << 20);
    let sealed: Vec<Vec<u8>> = frames
        .iter()
        .enumerate()
        .map(|(i, f)| {
            let mut out = Vec::new();
            sealer.seal(SESSION, i as u64 + 1, Format::Sbe, f, &mut out);
            out
        })
        .collect();
    let mut bad = sealed.clone();
    bad[3][9] ^= 1;
    let crc = Protection { crc: true, encrypted: false };
    let greeting = |from| {
        let mut b = Hello::new(Format::Sbe, SESSION, 1, from).protected(crc, [0; 4]).to_bytes().to_vec();
        b.extend(record(RecordTag::Format, Format::Sbe, 0, from, &[]));
        b
    };
    let mut config = StreamClientConfig::relay(
        "u:1".into(),
        true,
        Duration::from_secs(1),
        Duration::from_secs(30),
        Duration::from_secs(10),
        None,
    );
    config.jitter = None;
    let mut client = StreamClient::new(config);
    let mut notes = Notes::default();
    connect(&mut client, 0);
    let mut bytes = greeting(1);
    bytes.extend(record(RecordTag::Data, Format::Sbe, 6, 1, &bad.concat()));
    let (events, _) = drive(&mut client, &bytes, &[], 0, false, &mut notes);
    assert_eq!(notes.sequences(), [1, 2, 3], "the frames before the bad one were handed on");
    assert!(events.iter().any(|e| matches!(e, ClientEvent::FrameCheckFailed { sequence: 4, .. })), "{events:?}");
    let Some(ClientEvent::Lost { closed, retry_in }) = events.last() else { panic!("{events:?}") };
    assert!(closed.why.starts_with("frame 4 at stream byte"), "{}", closed.why);
    assert_eq!(*retry_in, 100 * MS);
    assert_eq!(client.reader().counts().frame_check_failures, 1);
    connect_at_once(&mut client, 100 * MS);
    let mut again = greeting(4);
    again.extend(record(RecordTag::Data, Format::Sbe, 3, 4, &sealed[3..].concat()));
    let (_, written) = drive(&mut client, &again, &[], 100 * MS, false, &mut notes);
    assert_eq!(answer(&written).resume, Resume::From(4));
    assert_eq!(notes.sequences(), [1, 2, 3, 4, 5, 6]);
}

#[test]
fn violations_in_a_row_without_a_frame_make_a_relay_give_up() {
    let frames = capture_frames("DEEP10.pcap.gz", Format::Sbe, 3);
    let mut client = relay(Duration::from_secs(1));
    let mut notes = Notes::default();
    let mut now = 0;
    let mut waits = Vec::new();
    // Every connection: FORMAT at 1, then a record numbered behind it.
    let mut bytes = Hello::new(Format::Sbe, SESSION, 1, 1).to_bytes().to_vec();
    bytes.extend(record(RecordTag::Format, Format::Sbe, 0, 5, &[]));
    bytes.extend(record(RecordTag::Data, Format::Sbe, 1, 2, &frames[0]));
    let finish = until_finished(
        &mut client,
        &mut now,
        &mut notes,
        "the connection should have ended",
        |client, now, notes| {
            client.connected(peer(), now);
            let (events, _) = drive(client, &bytes, &[], now, false, notes);
            for e in events {
                if let ClientEvent::Lost { retry_in, closed } = e {
                    assert!(closed.why.starts_with("protocol violation at stream byte 56: DATA numbered from 2"));
                    waits.push(retry_in / MS);
                }
            }
        },
        |_, _| {},
    );
    assert_eq!(waits, [100, 200, 400]);
    let Some(Finish::Fatal(why)) = finish else { panic!() };
    assert!(
        why.ends_with(
            "4 protocol violations in a row over 0.7 s without a frame taken (source.upstream.give_up_after = 1s)"
        ),
        "{why}"
    );
    assert_eq!(client.counts().connection.violations, 4);
}

/// A publisher at its connection limit: greeting, then BUSY at once.
fn busy_publisher() -> Vec<u8> {
    let mut busy = Hello::new(Format::Sbe, SESSION, 1, 3).to_bytes().to_vec();
    busy.extend(record(RecordTag::Busy, Format::Sbe, 0, 3, b"at its limit; retry later"));
    busy
}

#[test]
fn a_relay_told_busy_after_the_handshake_waits_longer_each_time_counts_no_reconnection_and_gives_up_in_time() {
    let mut client = relay(Duration::from_secs(2));
    let mut notes = Notes::default();
    let mut now = 0;
    let mut waits = Vec::new();
    let mut events = Vec::new();
    let finish = loop {
        match client.poll_action(now) {
            ClientAction::Connect => {
                client.connected(peer(), now);
                // The answer is written before BUSY is read: the handshake completed.
                let (got, written) = drive(&mut client, &busy_publisher(), &[], now, true, &mut notes);
                assert_eq!(answer(&written).resume, Resume::Live);
                events.extend(got);
            }
            ClientAction::Wait(until) => now = until,
            ClientAction::Finished => break client.finished().cloned(),
            ClientAction::Run => panic!("the connection was closed by BUSY"),
        }
        for e in std::iter::from_fn(|| client.poll_event(&mut notes)).chain(events.drain(..)) {
            match e {
                ClientEvent::Lost { closed, retry_in } => {
                    assert_eq!(closed.reason.disposition(), Disposition::Busy, "{closed:?}");
                    assert!(closed.established, "the handshake had completed");
                    waits.push(retry_in / MS);
                }
                ClientEvent::Reconnected { .. } | ClientEvent::ConnectFailed { .. } => {
                    panic!("BUSY is neither a reconnection nor a failed attempt: {e:?}")
                }
                _ => {}
            }
        }
    };
    assert_eq!(waits, [100, 200, 400, 800], "never at once; the next wait would pass give_up_after");
    assert_eq!(client.counts().reconnects, 0);
    let Some(Finish::Fatal(why)) = finish else { panic!("{finish:?}") };
    assert!(why.contains("the upstream is busy: at its limit; retry later"), "{why}");
    assert!(why.contains("not reached in 5 attempts over 1.5 s"), "{why}");
}

#[test]
fn a_resume_whose_first_record_is_data_is_judged_there_and_a_later_format_switch_is_no_failed_resume() {
    let sbe = capture_frames("DEEP10.pcap.gz", Format::Sbe, 12);
    let capnp = capture_frames("DEEP10.pcap.gz", Format::Capnp, 12);
    let mut client = subscriber();
    let mut notes = Notes::default();
    connect(&mut client, 0);
    drive(&mut client, &publisher(&sbe, Format::Sbe, SESSION, 1, 6, false), &[], 0, true, &mut notes);
    connect(&mut client, S);
    // The ring replays from frame 6 with DATA straight after the greeting (no FORMAT: the
    // greeting named the format), then the publisher switches to Cap'n Proto at frame 9.
    let mut second = Hello::new(Format::Sbe, SESSION, 1, 6).to_bytes().to_vec();
    for seq in 6..9 {
        second.extend(record(RecordTag::Data, Format::Sbe, 1, seq, &sbe[seq as usize - 1]));
    }
    second.extend(record(RecordTag::Format, Format::Capnp, 0, 9, &[]));
    for seq in 9..13 {
        second.extend(record(RecordTag::Data, Format::Capnp, 1, seq, &capnp[seq as usize - 1]));
    }
    let (events, written) = drive(&mut client, &second, &[], S, false, &mut notes);
    assert_eq!(answer(&written).resume, Resume::From(6));
    assert!(events.contains(&ClientEvent::Resumed { from: 6 }), "{events:?}");
    assert!(!events.iter().any(|e| matches!(e, ClientEvent::ResumeFailed { .. })), "{events:?}");
    assert_eq!(client.counts().resumes, 1);
    assert_eq!(notes.sequences(), (1..=12).collect::<Vec<_>>(), "no gap, no duplicate");
}

#[test]
fn a_subscriber_told_busy_at_every_connection_gives_up_when_its_limit_passes() {
    let mut client = subscriber_with(Duration::from_secs(5), |c| c.give_up_after_ns = Some(2 * S));
    let mut notes = Notes::default();
    let mut now = 0;
    let mut connections = 0;
    let finish = until_finished(
        &mut client,
        &mut now,
        &mut notes,
        "the connection was closed by BUSY",
        |client, now, notes| {
            connections += 1;
            assert!(connections < 100, "a publisher that is always busy is not connected to for ever");
            client.connected(peer(), now);
            drive(client, &busy_publisher(), &[], now, true, notes);
        },
        |client, notes| while client.poll_event(notes).is_some() {},
    );
    assert!(now <= 2 * S, "gave up within its limit, at {now} ns");
    let Some(Finish::Fatal(why)) = finish else { panic!("{finish:?}") };
    assert!(why.contains("at its limit; retry later"), "{why}");
    assert!(why.contains("still busy after 1.5 s of attempts (give up after 2s)"), "{why}");
}

#[test]
fn records_that_give_nothing_owe_the_caller_a_turn_after_each_budget_and_frames_start_it_over() {
    use crate::relay::client::quiet::QUIET_UNITS;
    let frames = capture_frames("DEEP10.pcap.gz", Format::Sbe, 2);
    let mut client = subscriber();
    let mut notes = Notes::default();
    connect(&mut client, 0);
    // FORMAT records of the format in use give nothing: three budgets' worth and a few, a frame,
    // then one record short of a budget, and another frame.
    let mut bytes = Hello::new(Format::Sbe, SESSION, 1, 1).to_bytes().to_vec();
    for _ in 0..3 * QUIET_UNITS + 10 {
        bytes.extend(record(RecordTag::Format, Format::Sbe, 0, 1, &[]));
    }
    bytes.extend(record(RecordTag::Data, Format::Sbe, 1, 1, &frames[0]));
    for _ in 0..QUIET_UNITS - 1 {
        bytes.extend(record(RecordTag::Format, Format::Sbe, 0, 2, &[]));
    }
    bytes.extend(record(RecordTag::Data, Format::Sbe, 1, 2, &frames[1]));
    let (events, _) = drive(&mut client, &bytes, &[], 0, false, &mut notes);
    let turns: Vec<usize> =
        events.iter().enumerate().filter(|(_, e)| matches!(e, ClientEvent::Quiet)).map(|(i, _)| i).collect();
    assert_eq!(turns.len(), 3, "a turn per {QUIET_UNITS} records that gave nothing: {turns:?}");
    assert_eq!(notes.sequences(), [1, 2], "nothing is lost");
    // One record of 3 MiB that gives nothing: a turn per MiB received, before it is whole.
    let mut client = subscriber();
    connect(&mut client, 0);
    let mut bytes = Hello::new(Format::Sbe, SESSION, 1, 1).to_bytes().to_vec();
    bytes.extend(record(RecordTag::Format, Format::Sbe, 0, 1, &vec![0u8; 3 << 20]));
    let (events, _) = drive(&mut client, &bytes, &[], 0, false, &mut notes);
    let turns = events.iter().filter(|e| matches!(e, ClientEvent::Quiet)).count();
    assert!((2..=3).contains(&turns), "{turns} turns for 3 MiB: {events:?}");
}

/// A state with books for two symbols, as of frame `as_of`.
fn small_state(as_of: u64) -> crate::relay::snapshot::MarketState {
    use mdrelay_iex::message::{Message, PriceLevelUpdate, Side, Trade};
    use mdrelay_iex::price::{Price, Symbol};
    let mut state = crate::relay::snapshot::MarketState::new();
    let level = |symbol: &str, side, price, size| {
        Message::PriceLevelUpdate(PriceLevelUpdate {
            side,
            event_flags: 1,
            timestamp: 1,
            symbol: Symbol::new(symbol).unwrap(),
            size,
            price: Price(price),
        })
    };
    let trade = Message::TradeReport(Trade {
        sale_condition: 0,
        timestamp: 2,
        symbol: Symbol::new("ZIEXT").unwrap(),
        size: 100,
        price: Price(990_000),
        trade_id: 7,
    });
    let messages = [level("ZIEXT", Side::Buy, 990_000, 300), level("ZXIET", Side::Sell, 120_000, 50), trade];
    state.apply_frame(as_of, &messages);
    state
}

/// A publisher's bytes for a subscriber that asked for a snapshot: greeting, the snapshot as of
/// `as_of` (when given), FORMAT naming `from`, frames `from..to`, END.
fn publisher_with_snapshot(frames: &[Vec<u8>], format: Format, as_of: Option<u64>, from: u64, to: u64) -> Vec<u8> {
    let mut b = Hello::new(format, SESSION, 1, from).to_bytes().to_vec();
    if let Some(as_of) = as_of {
        let mut records = Vec::new();
        let mut codec = mdrelay_codec::Codec::new(format, mdrelay_codec::Limits::default());
        let state = small_state(as_of);
        crate::relay::snapshot::write_snapshot(&state, &mut codec, &mut Protector::none(), SESSION, 1, &mut records)
            .unwrap();
        b.extend(records.concat());
    }
    let rest = publisher(frames, format, SESSION, from, to, true);
    b.extend(&rest[Hello::LEN..]);
    b
}

fn snapshot_subscriber() -> StreamClient {
    let mut config = StreamClientConfig::subscriber(Protection::NONE, None, Duration::from_secs(5));
    config.snapshot = true;
    StreamClient::new(config)
}

#[test]
fn a_snapshot_comes_whole_before_the_frames_after_it_in_any_split() {
    let frames = capture_frames("DEEP10.pcap.gz", Format::FlatBuffers, 40);
    let bytes = publisher_with_snapshot(&frames, Format::FlatBuffers, Some(20), 21, 41);
    for seed in 0..20 {
        let mut client = snapshot_subscriber();
        connect_at_once(&mut client, 0);
        let mut notes = Notes::default();
        let cuts = if seed == 0 { (1..bytes.len()).collect() } else { random_cuts(bytes.len(), seed) };
        let (events, written) = drive(&mut client, &bytes, &cuts, 0, false, &mut notes);
        assert!(answer(&written).snapshot, "the answer asks for a snapshot");
        let snapshots: Vec<_> =
            events.iter().filter_map(|e| if let ClientEvent::Snapshot(s) = e { Some(s) } else { None }).collect();
        assert_eq!(snapshots.len(), 1, "seed {seed}: {events:?}");
        let snapshot = snapshots[0];
        assert_eq!(snapshot.state.as_of, 20);
        assert_eq!(snapshot.totals.frames, 1);
        let ziext = snapshot.state.books.get(&mdrelay_iex::price::Symbol::new("ZIEXT").unwrap()).unwrap();
        assert_eq!(ziext.best_bid().map(|l| (l.price.0, l.size)), Some((990_000, 300)));
        assert_eq!(ziext.last_trade.map(|t| t.trade_id), Some(7));
        assert_eq!(notes.sequences(), (21..=40).collect::<Vec<_>>(), "seed {seed}");
        assert_eq!(client.reader().tracker().counts().lost, 0);
        assert!(matches!(events.last(), Some(ClientEvent::Finished(Finish::End))), "{events:?}");
    }
}

#[test]
fn a_stream_without_the_snapshot_asked_for_is_said_so_and_taken() {
    let frames = capture_frames("DEEP10.pcap.gz", Format::Sbe, 10);
    let bytes = publisher_with_snapshot(&frames, Format::Sbe, None, 1, 11);
    let mut client = snapshot_subscriber();
    connect_at_once(&mut client, 0);
    let mut notes = Notes::default();
    let (events, _) = drive(&mut client, &bytes, &[], 0, false, &mut notes);
    assert!(events.contains(&ClientEvent::SnapshotMissing { why: None }), "{events:?}");
    assert_eq!(notes.sequences(), (1..=10).collect::<Vec<_>>());
}

#[test]
fn a_snapshot_not_asked_for_is_skipped_and_one_the_stream_goes_behind_is_a_violation() {
    let frames = capture_frames("DEEP10.pcap.gz", Format::Sbe, 10);
    // Not asked for: skipped by its length, the stream taken.
    let bytes = publisher_with_snapshot(&frames, Format::Sbe, Some(0), 1, 11);
    let mut client = subscriber();
    connect_at_once(&mut client, 0);
    let mut notes = Notes::default();
    let (events, written) = drive(&mut client, &bytes, &[], 0, false, &mut notes);
    assert!(!answer(&written).snapshot);
    assert!(events.iter().any(|e| matches!(e, ClientEvent::OutOfPlace { tag: RecordTag::Snapshot, .. })), "{events:?}");
    assert!(!events.iter().any(|e| matches!(e, ClientEvent::Snapshot(_))));
    assert_eq!(notes.sequences(), (1..=10).collect::<Vec<_>>());
    // A snapshot as of frame 5 followed by a stream from frame 3: frames it already stands for.
    let bytes = publisher_with_snapshot(&frames, Format::Sbe, Some(5), 3, 11);
    let mut client = snapshot_subscriber();
    connect_at_once(&mut client, 0);
    let mut notes = Notes::default();
    let (events, _) = drive(&mut client, &bytes, &[], 0, false, &mut notes);
    assert!(events.iter().any(|e| matches!(e, ClientEvent::Violation { .. })), "{events:?}");
    assert!(notes.sequences().iter().all(|s| *s > 5), "no frame the snapshot stands for: {:?}", notes.sequences());
}
