//! The datagram receiver on real frames and a fake clock: protection, held datagrams, END, A/B
//! lines, echoes, and recovery over a connection to a retransmission service made of bytes.

use super::*;
use crate::relay::client::book::MAX_REQUEST_FRAMES;
use crate::relay::client::testing::{Notes, capture_frames, peer, record};
use crate::relay::protect::{KEY_LEN, Protector, WireKey};
use crate::relay::window::WINDOW;
use crate::relay::wire::{Hello, Subscribe, gone_payload};
use mdrelay_codec::FormatCodec;

const MS: i64 = 1_000_000;
const SESSION: u64 = 0x1234;

fn data(session: u64, first: u64, frames: &[&[u8]], format: Format) -> Vec<u8> {
    let header = DatagramHeader {
        version: DATAGRAM_VERSION,
        format,
        kind: DatagramKind::Data,
        frame_count: frames.len() as u32,
        protection: Protection::NONE,
        session,
        sequence: first,
    };
    let mut d = header.to_bytes().to_vec();
    for f in frames {
        d.extend_from_slice(f);
    }
    d
}

fn end(session: u64, next: u64) -> Vec<u8> {
    let header = DatagramHeader {
        version: DATAGRAM_VERSION,
        format: Format::Sbe,
        kind: DatagramKind::End,
        frame_count: 0,
        protection: Protection::NONE,
        session,
        sequence: next,
    };
    let mut d = header.to_bytes().to_vec();
    Totals { frames: next - 1, messages: 5, ..Totals::default() }.write(&mut d);
    d
}

fn events(r: &mut DatagramReceiver, notes: &mut Notes) -> Vec<DatagramEvent> {
    std::iter::from_fn(|| r.poll_event(notes)).collect()
}

fn recovery(linger_ms: u64) -> Option<RecoveryConfig> {
    Some(RecoveryConfig {
        delay: Duration::from_millis(5),
        retry: Duration::from_millis(50),
        attempts: 3,
        linger: Duration::from_millis(linger_ms),
    })
}

#[test]
fn datagrams_in_order_give_their_frames_and_the_end_finishes_the_stream() {
    let frames = capture_frames("DEEP10.pcap.gz", Format::Sbe, 10);
    let mut r = DatagramReceiver::new(DatagramConfig::default());
    let mut notes = Notes::default();
    assert_eq!(r.deadline(), None);
    for seq in 1..=10u64 {
        r.datagram(
            Origin::Stream,
            &data(SESSION, seq, &[&frames[seq as usize - 1]], Format::Sbe),
            peer(),
            0,
            0,
            &mut notes,
        );
    }
    r.datagram(Origin::Stream, &end(SESSION, 11), peer(), 0, 0, &mut notes);
    let ev = events(&mut r, &mut notes);
    assert_eq!(ev[0], DatagramEvent::SessionStarted { session: SESSION, peer: peer() });
    assert!(
        matches!(&ev[1], DatagramEvent::End { first: true, totals, next_sequence: 11, .. } if totals.frames == 10),
        "{ev:?}"
    );
    assert_eq!(ev[2], DatagramEvent::Finished);
    assert!(r.is_finished());
    assert_eq!(notes.sequences(), (1..=10).collect::<Vec<_>>());
    assert_eq!(r.reader().tracker().counts().lost, 0);
    assert_eq!(r.counts().datagrams, 11);
}

#[test]
fn foreign_and_broken_datagrams_are_counted_and_skipped() {
    let frames = capture_frames("DEEP10.pcap.gz", Format::Sbe, 2);
    let mut r = DatagramReceiver::new(DatagramConfig::default());
    let mut notes = Notes::default();
    r.datagram(Origin::Stream, b"\x01\x00\x04\x80an IEX-TP segment, say", peer(), 0, 0, &mut notes);
    let mut v9 = data(SESSION, 1, &[&frames[0]], Format::Sbe);
    v9[4] = 9;
    r.datagram(Origin::Stream, &v9, peer(), 0, 0, &mut notes);
    r.datagram(Origin::Stream, &end(SESSION, 3), peer(), 0, 0, &mut notes);
    let mut cut_end = end(SESSION, 3);
    cut_end.truncate(30);
    r.datagram(Origin::Stream, &cut_end, peer(), 0, 0, &mut notes);
    let ev = events(&mut r, &mut notes);
    assert!(
        matches!(&ev[0], DatagramEvent::NotRelay { head, len: 26, .. } if head == b"\x01\x00\x04\x80an I"),
        "{ev:?}"
    );
    assert!(matches!(&ev[1], DatagramEvent::BadHeader { error, .. } if error.what.contains("version 9")), "{ev:?}");
    assert!(matches!(ev[2], DatagramEvent::ForeignEnd { next_sequence: 3, .. }), "an END before any data: {ev:?}");
    assert!(matches!(ev[3], DatagramEvent::UnreadableEnd { at: 24, .. }), "{ev:?}");
    assert_eq!(r.counts().invalid_packets, 4);
    assert!(!r.is_finished());
    r.datagram(Origin::Stream, &data(SESSION, 1, &[&frames[0], &frames[1]], Format::Sbe), peer(), 0, 0, &mut notes);
    r.datagram(Origin::Stream, &end(SESSION + 1, 3), peer(), 0, 0, &mut notes);
    let ev = events(&mut r, &mut notes);
    assert!(matches!(ev.last(), Some(DatagramEvent::ForeignEnd { session, .. }) if *session == SESSION + 1), "{ev:?}");
}

#[test]
fn a_wild_datagram_is_held_and_refuted_and_a_real_restart_confirmed() {
    let frames = capture_frames("DEEP10.pcap.gz", Format::Sbe, 6);
    let mut r = DatagramReceiver::new(DatagramConfig::default());
    let mut notes = Notes::default();
    let f = |i: usize| frames[i].as_slice();
    for (session, seq, i) in [(SESSION, 1, 0), (SESSION, 2, 1), (SESSION, 1 << 40, 2), (SESSION, 3, 2)] {
        r.datagram(Origin::Stream, &data(session, seq, &[f(i)], Format::Sbe), peer(), 0, 0, &mut notes);
    }
    let ev = events(&mut r, &mut notes);
    assert!(ev.contains(&DatagramEvent::Held { session: SESSION, sequence: 1 << 40, peer: peer() }));
    assert_eq!(r.reader().tracker().unconfirmed(), 1);
    assert_eq!(notes.sequences(), [1, 2, 3]);
    // Another session twice in a row: a restart.
    for seq in [1, 2] {
        r.datagram(
            Origin::Stream,
            &data(SESSION + 9, seq, &[f(3 + seq as usize)], Format::Sbe),
            peer(),
            0,
            0,
            &mut notes,
        );
    }
    let ev = events(&mut r, &mut notes);
    assert!(ev.contains(&DatagramEvent::Restarted { old: SESSION, new: SESSION + 9, peer: peer() }), "{ev:?}");
    assert_eq!(notes.sequences(), [1, 2, 3, 1, 2], "the held datagram first, then the one that confirmed it");
}

#[test]
fn protected_datagrams_are_opened_before_their_header_is_believed() {
    let frames = capture_frames("DEEP10.pcap.gz", Format::Capnp, 3);
    let key = WireKey::new([3; KEY_LEN]);
    let protection = Protection { crc: true, encrypted: true };
    let mut sealer = Protector::new(true, Some(&key), 1 << 20);
    let sealed = |sealer: &mut Protector, session: u64, seq: u64, f: &[u8]| {
        let header = DatagramHeader {
            version: DATAGRAM_VERSION,
            format: Format::Capnp,
            kind: DatagramKind::Data,
            frame_count: 1,
            protection,
            session,
            sequence: seq,
        };
        let mut d = header.to_bytes().to_vec();
        sealer.seal(session, seq, Format::Capnp, f, &mut d);
        d
    };
    let config = DatagramConfig {
        reader: ReaderConfig { crc: true, key: Some(key.clone()), ..ReaderConfig::default() },
        ..DatagramConfig::default()
    };
    let mut r = DatagramReceiver::new(config);
    let mut notes = Notes::default();
    r.datagram(Origin::Stream, &sealed(&mut sealer, SESSION, 1, &frames[0]), peer(), 0, 0, &mut notes);
    // An unprotected sender on the group; a flipped bit; an older session replayed.
    r.datagram(Origin::Stream, &data(SESSION, 2, &[&frames[1]], Format::Capnp), peer(), 0, 0, &mut notes);
    let mut bad = sealed(&mut sealer, SESSION, 2, &frames[1]);
    bad[40] ^= 1;
    r.datagram(Origin::Stream, &bad, peer(), 0, 0, &mut notes);
    r.datagram(Origin::Stream, &sealed(&mut sealer, SESSION - 1, 2, &frames[1]), peer(), 0, 0, &mut notes);
    r.datagram(Origin::Stream, &sealed(&mut sealer, SESSION, 3, &frames[2]), peer(), 0, 0, &mut notes);
    assert_eq!(notes.sequences(), [1, 3]);
    let ev = events(&mut r, &mut notes);
    let refused: Vec<&str> = ev
        .iter()
        .filter_map(|e| if let DatagramEvent::Refused { why, .. } = e { Some(why.as_str()) } else { None })
        .collect();
    assert_eq!(refused.len(), 3, "{ev:?}");
    assert_eq!(refused[0], "protected with none, this subscriber expects crc32c+encrypted");
    assert!(refused[2].ends_with("older than the stream's 0x1234: replayed"), "{}", refused[2]);
    let p = r.reader().counts().protection;
    assert_eq!((p.mismatched_datagrams, p.crc_failures, p.replayed_datagrams, p.frames_refused), (1, 1, 1, 3));
    assert_eq!(r.reader().tracker().counts().lost, 1);
}

#[test]
fn two_lines_wait_a_while_for_the_second_end() {
    let frames = capture_frames("DEEP10.pcap.gz", Format::Sbe, 3);
    let config = DatagramConfig { lines: Some(("a:1".into(), "b:2".into())), ..DatagramConfig::default() };
    let mut r = DatagramReceiver::new(config.clone());
    let mut notes = Notes::default();
    for line in [Line::A, Line::B] {
        for seq in 1..=3u64 {
            r.datagram(
                Origin::Line(line),
                &data(SESSION, seq, &[&frames[seq as usize - 1]], Format::Sbe),
                peer(),
                0,
                0,
                &mut notes,
            );
        }
    }
    r.datagram(Origin::Line(Line::A), &end(SESSION, 4), peer(), 10 * MS, 0, &mut notes);
    let ev = events(&mut r, &mut notes);
    assert!(ev.contains(&DatagramEvent::Ending { missing: 0, wait: 1_000 * MS }), "{ev:?}");
    assert_eq!(r.deadline(), Some(1_010 * MS));
    r.on_timeout(1_009 * MS);
    assert!(!r.is_finished());
    r.on_timeout(1_010 * MS);
    let ev = events(&mut r, &mut notes);
    assert_eq!(ev, [DatagramEvent::EndWaitOver { lines_without_end: true, given_up: 0 }, DatagramEvent::Finished]);
    assert_eq!(notes.sequences(), [1, 2, 3]);
    assert_eq!(r.reader().lines().unwrap().arbitrated(), 3);
    // Both ENDs: over at once.
    let mut r = DatagramReceiver::new(config);
    r.datagram(Origin::Line(Line::B), &data(SESSION, 1, &[&frames[0]], Format::Sbe), peer(), 0, 0, &mut notes);
    r.datagram(Origin::Line(Line::A), &end(SESSION, 2), peer(), 0, 0, &mut notes);
    r.datagram(Origin::Line(Line::B), &end(SESSION, 2), peer(), 0, 0, &mut notes);
    assert!(r.is_finished());
}

#[test]
fn echoes_go_back_as_datagrams_with_the_streams_session() {
    let frames = capture_frames("DEEP10.pcap.gz", Format::Sbe, 2);
    let config = DatagramConfig {
        reader: ReaderConfig { echo_every: Some(1), ..ReaderConfig::default() },
        ..DatagramConfig::default()
    };
    let mut r = DatagramReceiver::new(config);
    r.datagram(Origin::Stream, &data(SESSION, 7, &[&frames[0], &frames[1]], Format::Sbe), peer(), 0, 0, &mut ());
    let echoes: Vec<[u8; ECHO_DATAGRAM]> = std::iter::from_fn(|| r.next_echo()).collect();
    assert_eq!(echoes.len(), 2);
    let header = DatagramHeader::parse(&echoes[1]).unwrap();
    assert_eq!(
        (header.kind, header.session, header.sequence, header.format),
        (DatagramKind::Echo, SESSION, 8, Format::Sbe)
    );
    assert_eq!(Echo::parse(&echoes[1][24..]).unwrap(), Echo { publish_time: 2, sequence: 8 });
    assert_eq!(r.last_peer(), Some(peer()));
}

#[test]
fn from_the_start_the_frames_before_the_first_received_are_owed() {
    let frames = capture_frames("DEEP10.pcap.gz", Format::Sbe, 5);
    let mut r = DatagramReceiver::new(DatagramConfig { from_start: true, ..DatagramConfig::default() });
    for seq in 3..=5u64 {
        r.datagram(
            Origin::Stream,
            &data(SESSION, seq, &[&frames[seq as usize - 1]], Format::Sbe),
            peer(),
            0,
            0,
            &mut (),
        );
    }
    assert_eq!(r.reader().tracker().counts().lost, 2);
}

/// A retransmission service's greeting.
fn service_greeting() -> Vec<u8> {
    Hello::new(Format::Sbe, SESSION, 1, 100).to_bytes().to_vec()
}

/// Feeds the recovery connection `bytes` at `now`, polling its events into `events` and writing
/// what it has as a driver does, then closes it when `eof`; returns what it wrote.
fn serve(
    r: &mut DatagramReceiver,
    bytes: &[u8],
    now: i64,
    eof: bool,
    notes: &mut Notes,
    events: &mut Vec<DatagramEvent>,
) -> Vec<u8> {
    let mut rest = bytes;
    while !rest.is_empty() {
        let room = r.recovery_read_buf();
        let n = room.len().min(rest.len());
        assert!(n > 0, "the connection takes bytes");
        room[..n].copy_from_slice(&rest[..n]);
        r.recovery_received(n, now, now);
        rest = &rest[n..];
    }
    events.extend(std::iter::from_fn(|| r.poll_event(notes)));
    let written = r.recovery_transmit().to_vec();
    r.recovery_transmitted(written.len());
    if eof {
        r.recovery_received(0, now, now);
        events.extend(std::iter::from_fn(|| r.poll_event(notes)));
    }
    written
}

/// A stream of frames 1..=6 with frames 3 and 4 lost, and recovery on.
fn with_a_gap(frames: &[Vec<u8>], notes: &mut Notes, linger_ms: u64) -> DatagramReceiver {
    let mut r = DatagramReceiver::new(DatagramConfig { recovery: recovery(linger_ms), ..DatagramConfig::default() });
    for seq in [1u64, 2, 5, 6] {
        r.datagram(Origin::Stream, &data(SESSION, seq, &[&frames[seq as usize - 1]], Format::Sbe), peer(), 0, 0, notes);
    }
    events(&mut r, notes);
    r
}

#[test]
fn a_gap_is_asked_for_after_the_delay_and_filled_by_the_service() {
    let frames = capture_frames("DEEP10.pcap.gz", Format::Sbe, 6);
    let mut notes = Notes::default();
    let mut r = with_a_gap(&frames, &mut notes, 2_000);
    assert_eq!(r.reader().missing(), 2);
    assert_eq!(r.recovery_action(0), None, "nothing asked yet");
    // The timer looks every 2.5 ms (half the 5 ms delay): not due at once, due after the delay.
    r.on_timeout(0);
    assert_eq!(r.recovery_action(0), None);
    assert_eq!(r.deadline(), Some(2_500_000));
    r.on_timeout(5 * MS);
    assert_eq!(r.recovery_action(5 * MS), Some(RecoveryAction::Connect));
    r.recovery_connected(peer(), 5 * MS);
    let mut ev = Vec::new();
    let written = serve(&mut r, &service_greeting(), 6 * MS, false, &mut notes, &mut ev);
    assert!(matches!(ev[0], DatagramEvent::RecoveryConnected { session: SESSION, stream: None, .. }), "{ev:?}");
    let answer = Subscribe::parse(&written).unwrap();
    assert_eq!(answer.purpose, crate::relay::wire::Purpose::Recovery);
    let request = &written[Subscribe::V2_LEN..];
    let header = crate::relay::wire::RecordHeader::parse(request, 8).unwrap();
    let asked = RetransmitRequest::parse(&header, &request[16..]).unwrap();
    assert_eq!(asked, RetransmitRequest { first: 3, count: 2 });
    // The service answers with frame 3, then GONE for frame 4.
    let mut answer = record(RecordTag::Data, Format::Sbe, 1, 3, &frames[2]);
    answer.extend(record(RecordTag::Gone, Format::Raw, 0, 4, &gone_payload(1)));
    let mut ev = Vec::new();
    serve(&mut r, &answer, 7 * MS, false, &mut notes, &mut ev);
    assert_eq!(ev, [DatagramEvent::RecoveryGone { first: 4, count: 1 }]);
    assert_eq!(notes.frames.last().unwrap().0, 3);
    assert_eq!(notes.frames.last().unwrap().1, Origin::Recovered);
    let book = r.reader().book().unwrap();
    let c = book.counts();
    assert_eq!((c.frames_recovered, c.frames_unrecoverable, c.requests), (1, 1, 1));
    assert_eq!(book.report("h:1").latency_ns.count, 1, "the recovery's time was measured");
    assert_eq!(r.reader().missing(), 0);
    // The END with nothing missing finishes at once.
    r.datagram(Origin::Stream, &end(SESSION, 7), peer(), 8 * MS, 0, &mut notes);
    assert!(r.is_finished());
    assert_eq!(r.reader().tracker().counts().lost, 1);
}

#[test]
fn after_the_end_the_receiver_lingers_for_missing_frames_then_gives_them_up() {
    let frames = capture_frames("DEEP10.pcap.gz", Format::Sbe, 6);
    let mut notes = Notes::default();
    let mut r = with_a_gap(&frames, &mut notes, 300);
    r.datagram(Origin::Stream, &end(SESSION, 7), peer(), MS, 0, &mut notes);
    let ev = events(&mut r, &mut notes);
    assert!(ev.contains(&DatagramEvent::Ending { missing: 2, wait: 300 * MS }), "{ev:?}");
    r.on_timeout(301 * MS);
    let ev = events(&mut r, &mut notes);
    assert_eq!(ev.last(), Some(&DatagramEvent::Finished));
    assert!(ev.contains(&DatagramEvent::EndWaitOver { lines_without_end: false, given_up: 2 }), "{ev:?}");
}

#[test]
fn a_busy_service_is_connected_to_again_later_and_a_refusing_one_turns_recovery_off() {
    let frames = capture_frames("DEEP10.pcap.gz", Format::Sbe, 6);
    let mut notes = Notes::default();
    let mut r = with_a_gap(&frames, &mut notes, 2_000);
    r.on_timeout(5 * MS);
    assert_eq!(r.recovery_action(5 * MS), Some(RecoveryAction::Connect));
    r.recovery_connected(peer(), 5 * MS);
    let mut ev = Vec::new();
    serve(
        &mut r,
        &record(RecordTag::Busy, Format::Raw, 0, 0, b"retransmit.max_connections (64) reached"),
        6 * MS,
        false,
        &mut notes,
        &mut ev,
    );
    assert_eq!(
        ev,
        [DatagramEvent::RecoveryLost {
            why: "127.0.0.1:9100 is busy: retransmit.max_connections (64) reached".into(),
            retry_in: 50 * MS,
            quiet: false
        }]
    );
    let report = r.reader().book().unwrap().report("h:1");
    assert_eq!((report.busy_answers, report.busy_at_connect), (1, 1));
    // The request that made that connection is dropped: the next connection waits for the retry.
    assert_eq!(r.recovery_action(56 * MS), None);
    r.on_timeout(56 * MS);
    assert_eq!(r.recovery_action(56 * MS), Some(RecoveryAction::Connect), "the retry after 50 ms asks again");
    r.recovery_connected(peer(), 56 * MS);
    let mut ev = Vec::new();
    serve(&mut r, &record(RecordTag::Refuse, Format::Raw, 0, 0, b"purpose"), 57 * MS, false, &mut notes, &mut ev);
    assert_eq!(
        ev,
        [DatagramEvent::RecoveryRefused { why: "127.0.0.1:9100 refused the recovery connection: purpose".into() }]
    );
    assert!(!r.recovering());
    assert_eq!(r.reader().missing(), 0, "given up once refused");
    assert_eq!(r.reader().book().unwrap().report("h:1").unrecoverable_causes.refused, 2);
}

#[test]
fn a_quiet_close_and_a_failed_connection_wait_and_connect_again() {
    let frames = capture_frames("DEEP10.pcap.gz", Format::Sbe, 6);
    let mut notes = Notes::default();
    let mut r = with_a_gap(&frames, &mut notes, 2_000);
    r.on_timeout(5 * MS);
    r.recovery_action(5 * MS);
    r.recovery_connect_failed("cannot connect: Connection refused (os error 111)", 5 * MS);
    let ev = events(&mut r, &mut notes);
    assert_eq!(
        ev,
        [DatagramEvent::RecoveryLost {
            why: "cannot connect: Connection refused (os error 111)".into(),
            retry_in: 50 * MS,
            quiet: false
        }]
    );
    r.on_timeout(55 * MS);
    assert_eq!(r.recovery_action(55 * MS), Some(RecoveryAction::Connect));
    r.recovery_connected(peer(), 55 * MS);
    let mut bytes = service_greeting();
    bytes.extend(record(RecordTag::Data, Format::Sbe, 1, 3, &frames[2]));
    bytes.extend(record(RecordTag::Data, Format::Sbe, 1, 4, &frames[3]));
    let mut ev = Vec::new();
    serve(&mut r, &bytes, 56 * MS, true, &mut notes, &mut ev);
    assert!(
        matches!(ev.last(), Some(DatagramEvent::RecoveryLost { quiet: true, retry_in, .. }) if *retry_in == 50 * MS),
        "{ev:?}"
    );
    assert_eq!(r.reader().missing(), 0);
    assert_eq!(r.reader().book().unwrap().report("h:1").connections, 1);
}

#[test]
fn recovery_from_a_store_hands_the_requests_to_the_driver_and_takes_its_datagrams_once() {
    let frames = capture_frames("DEEP10.pcap.gz", Format::Sbe, 8);
    let f = |i: usize| frames[i - 1].as_slice();
    let mut r = DatagramReceiver::new(DatagramConfig { recovery: recovery(1_000), ..DatagramConfig::default() })
        .with_store_recovery();
    let mut notes = Notes::default();
    assert!(r.recovering());
    r.datagram(Origin::Stream, &data(SESSION, 1, &[f(1), f(2)], Format::Sbe), peer(), 0, 0, &mut notes);
    r.datagram(Origin::Stream, &data(SESSION, 7, &[f(7), f(8)], Format::Sbe), peer(), MS, 0, &mut notes);
    assert_eq!(r.next_store_request(), None, "asked after the delay, not at once");
    let due = r.deadline().expect("a gap to ask for");
    r.on_timeout(due.max(6 * MS));
    assert_eq!(r.next_store_request(), Some((SESSION, RetransmitRequest { first: 3, count: 4 })));
    assert_eq!(r.recovery_action(6 * MS), None, "no connection to a retransmission service");
    // The store's datagram covering 3..5 is taken, recovered; the same again is redundant.
    let stored = data(SESSION, 3, &[f(3), f(4)], Format::Sbe);
    r.store_datagram(&stored, 7 * MS, 0, &mut notes);
    r.store_datagram(&stored, 7 * MS, 0, &mut notes);
    // The store no longer has 5..7.
    r.store_gone(SESSION, 5, 2);
    r.datagram(Origin::Stream, &end(SESSION, 9), peer(), 8 * MS, 0, &mut notes);
    let ev = events(&mut r, &mut notes);
    assert!(ev.contains(&DatagramEvent::RecoveryGone { first: 5, count: 2 }), "{ev:?}");
    assert!(ev.contains(&DatagramEvent::Finished), "nothing missing once the end came: {ev:?}");
    let report = r.reader().book().unwrap().report("store");
    assert_eq!(
        (
            report.frames_recovered,
            report.frames_unrecoverable,
            report.unrecoverable_causes.gone,
            report.frames_redundant
        ),
        (2, 2, 2, 2)
    );
    let recovered: Vec<u64> =
        notes.frames.iter().filter(|(_, o, _)| *o == Origin::Recovered).map(|(s, ..)| *s).collect();
    assert_eq!(recovered, vec![3, 4]);
    assert_eq!(r.reader().tracker().counts().lost, 2);
}

const S: i64 = 1_000 * MS;

/// A receiver reading from a store, giving up after `give_up_s` seconds of nothing new.
fn store_receiver(give_up_s: u64) -> DatagramReceiver {
    DatagramReceiver::new(DatagramConfig { recovery: recovery(1_000), ..DatagramConfig::default() })
        .with_store_recovery()
        .with_give_up_after(Some(Duration::from_secs(give_up_s)))
}

/// Datagrams of 255 frames each (the same frame's bytes under every number) for frames
/// `first..end` of `SESSION`.
fn datagrams(frame: &[u8], first: u64, end: u64) -> Vec<Vec<u8>> {
    (first..end)
        .step_by(255)
        .map(|from| {
            let frames: Vec<&[u8]> = (from..end.min(from + 255)).map(|_| frame).collect();
            data(SESSION, from, &frames, Format::Sbe)
        })
        .collect()
}

#[test]
fn far_behind_with_a_store_the_receiver_catches_up_in_order_and_a_forgery_costs_its_own_datagram() {
    let frames = capture_frames("DEEP10.pcap.gz", Format::Sbe, 1);
    let f = frames[0].as_slice();
    let mut r = store_receiver(30);
    let mut notes = Notes::default();
    let live = |r: &mut DatagramReceiver, notes: &mut Notes, d: &[u8], now: i64| {
        r.datagram(Origin::Stream, d, peer(), now, 0, notes);
    };
    for d in datagrams(f, 1, 101) {
        live(&mut r, &mut notes, &d, 0);
    }
    // The live subject, after a long stop: more than a window on.
    let far = 101 + WINDOW + 1_000;
    let trigger = data(SESSION, far, &[f], Format::Sbe);
    live(&mut r, &mut notes, &trigger, MS);
    let ev = events(&mut r, &mut notes);
    assert!(ev.contains(&DatagramEvent::Behind { session: SESSION, from: 101, ahead: far }), "{ev:?}");
    assert_eq!(notes.frames.len(), 100, "the datagram far ahead is not taken");
    assert_eq!(r.counts().datagrams, 1, "nor counted: it is given again");
    assert!(r.reading_store());
    assert_eq!(r.next_catch_up(), Some(CatchUp { session: SESSION, from: 101 }));
    assert_eq!(r.next_catch_up(), None, "asked for once");
    // The store, in order, up to the live subject's frame; then the live datagrams, the one
    // that showed the gap first.
    for d in datagrams(f, 101, far + 1) {
        live(&mut r, &mut notes, &d, 2 * MS);
    }
    r.store_read_ended(3 * MS);
    assert!(!r.reading_store());
    assert!(events(&mut r, &mut notes).contains(&DatagramEvent::CaughtUp { frames: far - 100 }));
    live(&mut r, &mut notes, &trigger, 3 * MS);
    live(&mut r, &mut notes, &data(SESSION, far + 1, &[f], Format::Sbe), 3 * MS);
    assert_eq!(notes.frames.len() as u64, far + 1, "every frame once");
    assert_eq!(r.reader().tracker().counts().lost, 0);
    assert_eq!(r.reader().book().unwrap().counts().frames_missing, 0, "no gap: nothing given up as too old");
    // A forgery far ahead soon after: judged as over UDP (held, then refuted), not read for.
    let forged = data(SESSION, far + 1 + 2 * WINDOW, &[f], Format::Sbe);
    live(&mut r, &mut notes, &forged, 4 * MS);
    assert_eq!(r.next_catch_up(), None, "within the interval after a read of the store");
    live(&mut r, &mut notes, &data(SESSION, far + 2, &[f], Format::Sbe), 5 * MS);
    assert_eq!(r.reader().tracker().unconfirmed(), 1);
    // Past the interval, the stream having moved, another one is read for; the store holds
    // nothing from there, so it is judged as over UDP again.
    live(&mut r, &mut notes, &forged, 3 * MS + duration_ns(CATCH_UP_INTERVAL));
    assert_eq!(r.next_catch_up(), Some(CatchUp { session: SESSION, from: far + 3 }));
    r.store_read_ended(2 * S);
    assert!(events(&mut r, &mut notes).contains(&DatagramEvent::CaughtUp { frames: 0 }));
    live(&mut r, &mut notes, &forged, 2 * S);
    assert_eq!(r.next_catch_up(), None);
    live(&mut r, &mut notes, &data(SESSION, far + 3, &[f], Format::Sbe), 2 * S);
    assert_eq!(r.reader().tracker().unconfirmed(), 2);
    assert_eq!((r.reader().tracker().counts().lost, notes.frames.len() as u64), (0, far + 3));
    // Nothing far ahead without a store: held and confirmed as over UDP.
    let mut udp = DatagramReceiver::new(DatagramConfig::default());
    live(&mut udp, &mut notes, &data(SESSION, 1, &[f], Format::Sbe), 0);
    live(&mut udp, &mut notes, &trigger, 0);
    assert_eq!(udp.next_catch_up(), None);
    assert!(!udp.reading_store());
}

#[test]
fn an_end_far_ahead_of_what_the_store_holds_is_taken_once_nothing_follows_it() {
    let frames = capture_frames("DEEP10.pcap.gz", Format::Sbe, 1);
    let f = frames[0].as_slice();
    // Replayed from the start: frames 1..=100, then the publisher dropped 100,000, then its END.
    let mut r = store_receiver(2);
    let mut notes = Notes::default();
    r.store_read_began();
    for d in datagrams(f, 1, 101) {
        r.datagram(Origin::Stream, &d, peer(), 0, 0, &mut notes);
    }
    let next = 100_101;
    let end_far = end(SESSION, next);
    r.datagram(Origin::Stream, &end_far, peer(), MS, 0, &mut notes);
    let ev = events(&mut r, &mut notes);
    assert!(
        ev.contains(&DatagramEvent::EndAhead { peer: peer(), session: SESSION, next_sequence: next }),
        "held, neither taken nor ignored: {ev:?}"
    );
    assert_eq!(r.next_catch_up(), None, "read in order already");
    r.store_read_ended(2 * MS);
    assert!(r.wants_tail());
    // The store's tail is that END: nothing new; not yet for the give-up time.
    r.stored_tail(9, &end_far, peer(), S, S, 0, &mut notes);
    assert!(!r.is_finished());
    r.stored_tail(9, &end_far, peer(), 2 * S, 2 * S, 0, &mut notes);
    let ev = events(&mut r, &mut notes);
    assert!(
        ev.iter().any(|e| matches!(e, DatagramEvent::End { next_sequence, .. } if *next_sequence == next)),
        "taken after 2 s of nothing new: {ev:?}"
    );
    assert!(!r.wants_tail());
    // Read in order, the store held nothing between frame 100 and it: those frames are gone,
    // without a search.
    let lost = next - 101;
    assert!(ev.contains(&DatagramEvent::RecoveryGone { first: 101, count: lost }), "{ev:?}");
    assert!(ev.contains(&DatagramEvent::Finished), "{ev:?}");
    assert_eq!(r.next_store_request(), None);
    assert_eq!(r.reader().tracker().counts().lost, lost);
    let report = r.reader().book().unwrap().report("store");
    assert_eq!((report.frames_unrecoverable, report.unrecoverable_causes.gone), (lost, lost), "{report:?}");
    assert_eq!(r.publisher_totals().map(|t| t.frames), Some(next - 1));

    // The same END live, just after a read of the store (no other read for a second): held,
    // taken after the give-up time, and the frames before it sought in the store (within the
    // linger), which says they are gone.
    let (mut r, mut notes) = read_frames_1_to_100_from_the_store(f);
    r.datagram(Origin::Stream, &data(SESSION, 101, &[f], Format::Sbe), peer(), MS, 0, &mut notes);
    r.datagram(Origin::Stream, &end_far, peer(), 2 * MS, 0, &mut notes);
    assert_eq!(r.next_catch_up(), None, "within a second of the last read");
    r.stored_tail(9, &end_far, peer(), 3 * S, 3 * S, 0, &mut notes);
    r.on_timeout(3 * S + 10 * MS);
    let (session, request) = r.next_store_request().expect("the frames before the END are asked for");
    assert_eq!((session, request.first), (SESSION, 102));
    let mut first = 102;
    while first < next {
        let count = (next - first).min(u64::from(MAX_REQUEST_FRAMES));
        r.store_gone(SESSION, first, count);
        first += count;
    }
    assert!(events(&mut r, &mut notes).contains(&DatagramEvent::Finished));
    let report = r.reader().book().unwrap().report("store");
    assert_eq!((report.frames_unrecoverable, report.unrecoverable_causes.gone), (lost - 1, lost - 1));

    // A forged END far ahead of a live stream is refuted by the next frame, and the stream then
    // given up when nothing new comes: no END to end it.
    let mut r = store_receiver(2);
    let mut notes = Notes::default();
    r.datagram(Origin::Stream, &data(SESSION, 1, &[f], Format::Sbe), peer(), 0, 0, &mut notes);
    r.datagram(Origin::Stream, &end(SESSION, 1 << 40), peer(), 0, 0, &mut notes);
    assert_eq!(r.next_catch_up(), Some(CatchUp { session: SESSION, from: 2 }), "read for first");
    r.store_read_ended(MS);
    r.datagram(Origin::Stream, &end(SESSION, 1 << 40), peer(), MS, 0, &mut notes);
    assert_eq!(r.next_catch_up(), None);
    r.datagram(Origin::Stream, &data(SESSION, 2, &[f], Format::Sbe), peer(), 2 * MS, 0, &mut notes);
    assert_eq!(r.reader().tracker().unconfirmed(), 1, "refuted");
    r.stored_tail(3, &data(SESSION, 2, &[f], Format::Sbe), peer(), 2 * S, 2 * S, 0, &mut notes);
    assert!(!r.is_finished(), "1.998 s of nothing new");
    r.stored_tail(3, &data(SESSION, 2, &[f], Format::Sbe), peer(), 3 * S, 3 * S, 0, &mut notes);
    let ev = events(&mut r, &mut notes);
    assert!(ev.iter().any(|e| matches!(e, DatagramEvent::GaveUp { given_up: 0, .. })), "{ev:?}");
    assert!(!ev.iter().any(|e| matches!(e, DatagramEvent::End { .. } | DatagramEvent::Finished)), "{ev:?}");
    assert!(r.is_finished());
    assert_eq!(r.reader().tracker().counts().lost, 0, "no END: nothing owed past frame 2");
}

/// A receiver with a store (give-up time 2 s) that took frames 1..=100 (`f` each) from a read of
/// it, ended at 1 ms.
fn read_frames_1_to_100_from_the_store(f: &[u8]) -> (DatagramReceiver, Notes) {
    let mut r = store_receiver(2);
    let mut notes = Notes::default();
    r.store_read_began();
    for d in datagrams(f, 1, 101) {
        r.datagram(Origin::Stream, &d, peer(), 0, 0, &mut notes);
    }
    r.store_read_ended(MS);
    (r, notes)
}

/// The receiver above, then, half a second later (too soon for a catch-up), `end_far` as the
/// store's tail (position 9).
fn holding_an_end_from_the_tail(f: &[u8], end_far: &[u8]) -> (DatagramReceiver, Notes) {
    let (mut r, mut notes) = read_frames_1_to_100_from_the_store(f);
    r.stored_tail(9, end_far, peer(), 500 * MS, 500 * MS, 0, &mut notes);
    (r, notes)
}

#[test]
fn an_end_read_from_the_stores_tail_is_not_refuted_by_live_frames_sent_before_it() {
    let frames = capture_frames("DEEP10.pcap.gz", Format::Sbe, 1);
    let f = frames[0].as_slice();
    // A slow subscriber: frames 1..=100 came from a read of the store; the subject went quiet
    // behind its queue and the store's tail is the END, far ahead (the publisher dropped what
    // came between), within a second of that read, so no catch-up. Frames 101..=120, sent
    // before that END, then come live from the queue.
    let next = 100_101;
    let end_far = end(SESSION, next);
    let (mut r, mut notes) = holding_an_end_from_the_tail(f, &end_far);
    let ev = events(&mut r, &mut notes);
    assert!(ev.contains(&DatagramEvent::EndAhead { peer: peer(), session: SESSION, next_sequence: next }), "{ev:?}");
    for d in datagrams(f, 101, 121) {
        r.datagram(Origin::Stream, &d, peer(), 600 * MS, 0, &mut notes);
    }
    assert_eq!(r.reader().tracker().unconfirmed(), 0, "not refuted by frames sent before it");
    // The live END never came (a slow consumer's loss): the store's tail, read again after the
    // give-up time, is the same END, which is taken.
    r.stored_tail(9, &end_far, peer(), 2 * S + 600 * MS, 2 * S + 600 * MS, 0, &mut notes);
    let ev = events(&mut r, &mut notes);
    assert!(
        ev.iter().any(|e| matches!(e, DatagramEvent::End { next_sequence, .. } if *next_sequence == next)),
        "taken: {ev:?}"
    );
    assert!(!ev.iter().any(|e| matches!(e, DatagramEvent::GaveUp { .. })), "{ev:?}");

    // A message the store holds after that END refutes it.
    let (mut r, mut notes) = holding_an_end_from_the_tail(f, &end_far);
    let stored_after = data(SESSION, 121, &[f], Format::Sbe);
    r.stored_tail(10, &stored_after, peer(), S, S, 0, &mut notes);
    assert_eq!(r.reader().tracker().unconfirmed(), 1, "refuted");
    r.stored_tail(10, &stored_after, peer(), 3 * S + 100 * MS, 3 * S + 100 * MS, 0, &mut notes);
    let ev = events(&mut r, &mut notes);
    assert!(!ev.iter().any(|e| matches!(e, DatagramEvent::End { .. })), "{ev:?}");
    assert!(ev.iter().any(|e| matches!(e, DatagramEvent::GaveUp { .. })), "{ev:?}");
}

#[test]
fn a_store_that_answers_slowly_was_stalled_and_its_silence_is_not_the_streams() {
    let frames = capture_frames("DEEP10.pcap.gz", Format::Sbe, 1);
    let f = frames[0].as_slice();
    // Frame 1 came at 0; the server then froze: a read of the tail sent at 0.5 s is answered at
    // 2.5 s (its round trip over a quarter of the 2 s give-up time), before the END the
    // publisher queued for it meanwhile is stored. Not taken as silence.
    let mut r = store_receiver(2);
    let mut notes = Notes::default();
    let first = data(SESSION, 1, &[f], Format::Sbe);
    r.datagram(Origin::Stream, &first, peer(), 0, 0, &mut notes);
    r.stored_tail(1, &first, peer(), 500 * MS, 2 * S + 500 * MS, 0, &mut notes);
    assert!(!r.is_finished(), "a stalled store's word is not taken");
    // The next read, answered promptly, brings the END.
    r.stored_tail(2, &end(SESSION, 2), peer(), 3 * S, 3 * S + MS, 0, &mut notes);
    let ev = events(&mut r, &mut notes);
    assert!(ev.iter().any(|e| matches!(e, DatagramEvent::End { next_sequence: 2, .. })), "{ev:?}");
    assert!(!ev.iter().any(|e| matches!(e, DatagramEvent::GaveUp { .. })), "{ev:?}");

    // Had the store nothing newer, the give-up time starts again from the slow answer: prompt
    // answers of nothing new give up 2 s after it, not before.
    let mut r = store_receiver(2);
    r.datagram(Origin::Stream, &first, peer(), 0, 0, &mut notes);
    r.stored_tail(1, &first, peer(), 500 * MS, 2 * S + 500 * MS, 0, &mut notes);
    r.stored_tail(1, &first, peer(), 4 * S, 4 * S, 0, &mut notes);
    assert!(!r.is_finished(), "1.5 s since the store came back");
    r.store_holds_nothing(4 * S + 500 * MS, 4 * S + 500 * MS);
    let ev = events(&mut r, &mut notes);
    assert!(
        ev.iter().any(|e| matches!(e, DatagramEvent::GaveUp { silent, .. } if *silent == 4 * S + 500 * MS)),
        "given up, counting the whole silence since frame 1: {ev:?}"
    );
    // A prompt answer just under a quarter of the give-up time is taken as ever.
    let mut r = store_receiver(2);
    r.datagram(Origin::Stream, &first, peer(), 0, 0, &mut notes);
    r.stored_tail(1, &first, peer(), 2 * S - 500 * MS, 2 * S, 0, &mut notes);
    assert!(r.is_finished(), "a 0.5 s round trip is the store's word");
}

#[test]
fn a_stream_that_brings_nothing_new_is_given_up_with_what_it_lacks() {
    let frames = capture_frames("DEEP10.pcap.gz", Format::Sbe, 1);
    let f = frames[0].as_slice();
    // With a store: frames 1 and 4 came; 2 and 3 are missing; the store's tail (4) is nothing
    // new, and a newer tail is taken as if it had come live.
    let mut r = store_receiver(2);
    let mut notes = Notes::default();
    assert!(!r.wants_tail(), "nothing taken yet");
    r.datagram(Origin::Stream, &data(SESSION, 1, &[f], Format::Sbe), peer(), 0, 0, &mut notes);
    r.datagram(Origin::Stream, &data(SESSION, 4, &[f], Format::Sbe), peer(), 0, 0, &mut notes);
    assert_eq!(r.deadline().map(|d| d < S), Some(true), "the gap's requests; no give-up timer with a store");
    r.stored_tail(4, &data(SESSION, 4, &[f], Format::Sbe), peer(), S, S, 0, &mut notes);
    r.stored_tail(5, &data(SESSION, 5, &[f], Format::Sbe), peer(), S, S, 0, &mut notes);
    assert_eq!(notes.sequences(), [1, 4, 5], "a newer tail is taken");
    r.stored_tail(5, &data(SESSION, 5, &[f], Format::Sbe), peer(), 2 * S, 2 * S, 0, &mut notes);
    assert!(!r.is_finished(), "2 s since frame 5 came only at 3 s");
    r.store_holds_nothing(3 * S, 3 * S);
    let ev = events(&mut r, &mut notes);
    assert!(
        ev.iter().any(|e| matches!(e, DatagramEvent::GaveUp { given_up: 2, silent } if *silent == 2 * S)),
        "{ev:?}"
    );
    assert_eq!(r.reader().tracker().counts().lost, 2);
    assert_eq!(r.reader().book().unwrap().counts().frames_unrecoverable, 2);
    // Without a store the time alone says it.
    let mut r = DatagramReceiver::new(DatagramConfig::default()).with_give_up_after(Some(Duration::from_secs(2)));
    assert_eq!(r.deadline(), None, "not before the stream started");
    r.datagram(Origin::Stream, &data(SESSION, 1, &[f], Format::Sbe), peer(), S, 0, &mut notes);
    assert_eq!(r.deadline(), Some(3 * S));
    r.on_timeout(3 * S);
    assert!(events(&mut r, &mut notes).iter().any(|e| matches!(e, DatagramEvent::GaveUp { .. })));
    assert!(r.is_finished());
    // Nor without a give-up time: UDP waits for its END as ever.
    let mut r = DatagramReceiver::new(DatagramConfig::default());
    r.datagram(Origin::Stream, &data(SESSION, 1, &[f], Format::Sbe), peer(), S, 0, &mut notes);
    r.datagram(Origin::Stream, &end(SESSION, 1 << 40), peer(), S, 0, &mut notes);
    assert_eq!(r.deadline(), None);
    assert!(matches!(events(&mut r, &mut notes).last(), Some(DatagramEvent::ForeignEnd { .. })));
}

#[test]
fn a_gap_the_window_would_pass_is_caught_up_from_the_store_filling_it_and_skipping_copies() {
    let frames = capture_frames("DEEP10.pcap.gz", Format::Sbe, 1);
    let f = frames[0].as_slice();
    let mut r = store_receiver(30);
    let mut notes = Notes::default();
    let live =
        |r: &mut DatagramReceiver, notes: &mut Notes, d: &[u8]| r.datagram(Origin::Stream, d, peer(), MS, 0, notes);
    // Frames 1..=100 and 201..=300 came; 101..=200 are missing. A datagram reaching 101 + WINDOW
    // is within the window's reach, but taking it would give 101 up as too old.
    for d in datagrams(f, 1, 101).into_iter().chain(datagrams(f, 201, 301)) {
        live(&mut r, &mut notes, &d);
    }
    let trigger = data(SESSION, 100 + WINDOW, &[f, f], Format::Sbe);
    live(&mut r, &mut notes, &trigger);
    assert_eq!(r.next_catch_up(), Some(CatchUp { session: SESSION, from: 101 }), "from the first frame missing");
    // Gaps are not asked for while the read brings them.
    r.on_timeout(S);
    assert_eq!(r.next_store_request(), None);
    // The store in order from 101: the gap is filled, 201..=300 are skipped as copies, and the
    // rest follows; then the live datagrams held, which the read brought already.
    for d in datagrams(f, 101, 101 + WINDOW) {
        live(&mut r, &mut notes, &d);
    }
    r.store_read_ended(2 * S);
    live(&mut r, &mut notes, &trigger);
    live(&mut r, &mut notes, &data(SESSION, 102 + WINDOW, &[f], Format::Sbe));
    let counts = r.reader().tracker().counts();
    assert_eq!((counts.lost, counts.duplicates, counts.too_late), (0, 0, 0), "{counts:?}");
    let book = r.reader().book().unwrap().report("store");
    assert_eq!((book.frames_recovered, book.frames_unrecoverable, book.frames_redundant), (100, 0, 0), "{book:?}");
    let mut taken = notes.sequences();
    assert_eq!(taken.len() as u64, 102 + WINDOW, "every frame once");
    taken.sort_unstable();
    taken.dedup();
    assert_eq!(taken.len() as u64, 102 + WINDOW);
    let recovered = notes.frames.iter().filter(|(_, o, _)| *o == Origin::Recovered).count();
    assert_eq!(recovered, 100, "only the gap's frames are marked recovered; the rest are the stream's");
}

/// `SNAPSHOT` records of the state of `frames` up to frame `as_of`, unsealed, as the
/// retransmission service sends them.
fn snapshot_records(as_of: u64, frames: &[Vec<u8>]) -> Vec<u8> {
    use crate::relay::snapshot::{MarketState, write_snapshot};
    let mut state = MarketState::new();
    let mut codec = mdrelay_codec::Codec::new(Format::Sbe, mdrelay_codec::Limits::default());
    for (i, frame) in frames.iter().take(as_of as usize).enumerate() {
        codec
            .decode(frame, |m| {
                state.messages += 1;
                state.types.add(m.kind());
                state.books.apply(m);
                state.aggregates.apply(m);
            })
            .unwrap();
        state.frames += 1;
        state.as_of = i as u64 + 1;
    }
    let mut records = Vec::new();
    let mut protector = Protector::new(false, None, 1 << 20);
    write_snapshot(&state, &mut codec, &mut protector, SESSION, 0, &mut records).unwrap();
    records.concat()
}

#[test]
fn a_joiner_with_a_snapshot_holds_the_datagrams_skips_what_it_covers_and_recovers_the_gap_after_it() {
    let frames = capture_frames("DEEP10.pcap.gz", Format::Sbe, 12);
    let mut notes = Notes::default();
    let config = DatagramConfig { recovery: recovery(2_000), snapshot: true, ..DatagramConfig::default() };
    let mut r = DatagramReceiver::new(config);
    // Frames 4 and 9, 10 come while the snapshot is on its way: held, nothing taken yet.
    for seq in [4u64, 9, 10] {
        r.datagram(
            Origin::Stream,
            &data(SESSION, seq, &[&frames[seq as usize - 1]], Format::Sbe),
            peer(),
            0,
            0,
            &mut notes,
        );
    }
    assert!(events(&mut r, &mut notes).is_empty());
    assert!(notes.frames.is_empty(), "held while the snapshot is awaited");
    assert_eq!(r.deadline(), Some(SNAPSHOT_WAIT.as_nanos() as i64), "the wait is bounded");
    // The snapshot is asked on a connection of its own, first thing after the greeting.
    assert_eq!(r.recovery_action(MS), Some(RecoveryAction::Connect));
    r.recovery_connected(peer(), MS);
    let mut ev = Vec::new();
    let written = serve(&mut r, &service_greeting(), 2 * MS, false, &mut notes, &mut ev);
    assert_eq!(&written[Subscribe::V2_LEN..], RetransmitRequest::snapshot_record().as_slice());
    // The state as of frame 6: frame 4 is covered (skipped, not counted), 9 and 10 are taken,
    // and 7 and 8 are a gap, asked of the service.
    let mut ev = Vec::new();
    serve(&mut r, &snapshot_records(6, &frames), 3 * MS, false, &mut notes, &mut ev);
    let Some(DatagramEvent::Snapshot(snapshot)) = ev.first() else { panic!("the snapshot first: {ev:?}") };
    assert_eq!(snapshot.state.as_of, 6);
    let taken: Vec<u64> = notes.frames.iter().map(|f| f.0).collect();
    assert_eq!(taken, [9, 10], "after the snapshot: the frames past it, none it covers");
    assert_eq!(r.reader().missing(), 2, "frames 7 and 8");
    r.on_timeout(10 * MS);
    let mut ev = Vec::new();
    let written = serve(&mut r, &[], 10 * MS, false, &mut notes, &mut ev);
    let header = crate::relay::wire::RecordHeader::parse(&written, 8).unwrap();
    assert_eq!(RetransmitRequest::parse(&header, &written[16..]).unwrap(), RetransmitRequest { first: 7, count: 2 });
    assert_eq!(r.reader().tracker().counts().too_late, 0, "nothing covered was counted");
}

#[test]
fn a_service_that_refuses_the_snapshot_or_never_sends_one_leaves_the_stream_taken_as_it_came() {
    let frames = capture_frames("DEEP10.pcap.gz", Format::Sbe, 3);
    for refuse in [true, false] {
        let mut notes = Notes::default();
        let config = DatagramConfig { recovery: recovery(2_000), snapshot: true, ..DatagramConfig::default() };
        let mut r = DatagramReceiver::new(config);
        r.datagram(Origin::Stream, &data(SESSION, 2, &[&frames[1]], Format::Sbe), peer(), 0, 0, &mut notes);
        assert_eq!(r.recovery_action(0), Some(RecoveryAction::Connect));
        r.recovery_connected(peer(), 0);
        let mut ev = Vec::new();
        serve(&mut r, &service_greeting(), MS, false, &mut notes, &mut ev);
        if refuse {
            let busy = record(RecordTag::Busy, Format::Raw, 0, 0, b"this publisher keeps no state");
            serve(&mut r, &busy, 2 * MS, false, &mut notes, &mut ev);
        } else {
            r.on_timeout(SNAPSHOT_WAIT.as_nanos() as i64);
            ev.extend(events(&mut r, &mut notes));
        }
        let why = ev.iter().find_map(|e| match e {
            DatagramEvent::SnapshotMissing { why } => Some(why.clone()),
            _ => None,
        });
        let why = why.unwrap_or_else(|| panic!("refused {refuse}: {ev:?}"));
        assert!(why.contains(if refuse { "keeps no state" } else { "no snapshot within" }), "{why}");
        assert_eq!(notes.frames.iter().map(|f| f.0).collect::<Vec<_>>(), [2], "the held datagram taken");
    }
}
