//! The connection machine on byte slices and a fake clock: every branch of the handshake, every
//! record kind, records cut at every offset, resume, deadlines and violations.

use super::*;
use crate::relay::client::testing::{feed, peer, random_cuts, record};
use crate::relay::continuity::ViolationKind;
use crate::relay::protect::KEY_LEN;
use crate::relay::wire::{RetransmitRequest, gone_payload};
use mdrelay_iex::peer_text::from_bytes;

const S: i64 = 1_000_000_000;
const SESSION: u64 = 0x5e55_1011;

fn subscriber() -> StreamConnection {
    StreamConnection::new(ConnectionConfig::subscriber(peer(), Protection::NONE, None, false), 0)
}

fn greeting() -> Vec<u8> {
    Hello::new(Format::Sbe, SESSION, 1, 1).to_bytes().to_vec()
}

fn totals() -> Totals {
    Totals { frames: 2, messages: 3, by_type: [(b'T', 3)].into_iter().collect(), truncated: false }
}

fn totals_bytes() -> Vec<u8> {
    let mut b = Vec::new();
    totals().write(&mut b);
    b
}

/// A whole stream: greeting, FORMAT, two DATA records (the first of two frames), END.
fn stream() -> Vec<u8> {
    let mut b = greeting();
    b.extend(record(RecordTag::Format, Format::Sbe, 0, 1, &[]));
    b.extend(record(RecordTag::Data, Format::Sbe, 2, 1, b"frame one, frame two"));
    b.extend(record(RecordTag::Data, Format::Raw, 1, 3, b"a raw frame"));
    b.extend(record(RecordTag::End, Format::Raw, 0, 4, &totals_bytes()));
    b
}

fn closed(events: &[String]) -> &str {
    events.last().map(String::as_str).unwrap_or_default()
}

fn run(mut conn: StreamConnection, bytes: &[u8]) -> (Vec<String>, StreamConnection) {
    let events = feed(&mut conn, bytes, &[], 0, true);
    (events, conn)
}

fn reason_and_why(conn: &StreamConnection) -> (CloseReason, String) {
    let c = conn.closed().expect("closed");
    (c.reason.clone(), c.why.clone())
}

#[test]
fn a_whole_stream_gives_every_event_in_order_and_the_answer_goes_out() {
    let mut conn = subscriber();
    assert!(conn.poll_event().is_none(), "nothing before the greeting");
    let bytes = stream();
    let n = greeting().len();
    conn.read_buf()[..n].copy_from_slice(&bytes[..n]);
    conn.received(n, 5);
    let Some(ConnectionEvent::Greeted { hello, answer, resume }) = conn.poll_event() else { panic!("greeted") };
    assert_eq!((hello.session, answer.resume, resume), (SESSION, Resume::Live, Start::Live));
    assert_eq!(Subscribe::parse(conn.transmit()).unwrap(), Subscribe::new(false));
    assert!(!conn.is_established(), "the answer is not written yet");
    conn.transmitted(7);
    conn.transmitted(conn.transmit().len());
    assert!(conn.is_established());
    let events = feed(&mut conn, &bytes[n..], &[], 5, false);
    assert_eq!(events.len(), 5, "{events:#?}");
    assert!(events[0].starts_with("Format { format: Sbe, first_sequence: 1, at: 40 }"), "{}", events[0]);
    assert!(events[1].contains("frame_count: 2") && events[1].contains("payload_at: 72"), "{}", events[1]);
    assert!(events[2].contains("format: Raw"), "{}", events[2]);
    assert!(events[3].starts_with("End { next_sequence: 4, totals: Ok("), "{}", events[3]);
    assert!(events[4].contains("reason: End"), "{}", events[4]);
    assert_eq!(conn.closed().unwrap().reason.disposition(), Disposition::Finished);
    assert_eq!(conn.counts().bytes, bytes.len() as u64);
    assert!(conn.poll_event().is_none() && conn.read_buf().is_empty(), "nothing after the end");
}

#[test]
fn byte_by_byte_and_in_random_splits_the_events_are_the_same() {
    let bytes = stream();
    let (whole, _) = run(subscriber(), &bytes);
    let every: Vec<usize> = (1..bytes.len()).collect();
    assert_eq!(feed(&mut subscriber(), &bytes, &every, 0, true), whole, "byte by byte");
    for seed in 0..200 {
        assert_eq!(feed(&mut subscriber(), &bytes, &random_cuts(bytes.len(), seed), 0, true), whole, "seed {seed}");
    }
}

#[test]
fn a_stream_cut_at_every_offset_says_where_it_was_cut() {
    let bytes = stream();
    let boundaries = [40, 56, 92, 119, bytes.len()];
    for cut in 0..bytes.len() {
        let (events, conn) = run(subscriber(), &bytes[..cut]);
        let (reason, why) = reason_and_why(&conn);
        if cut < Hello::LEN {
            assert_eq!(reason, CloseReason::ClosedInGreeting { received: cut }, "cut at {cut}");
            assert_eq!(why, format!("closed after {cut} bytes of the greeting"));
        } else if boundaries.contains(&cut) {
            assert_eq!(why, "the publisher closed the connection without an end of stream", "cut at {cut}");
        } else {
            let record = *boundaries.iter().rev().find(|&&b| b <= cut).unwrap();
            assert_eq!(
                why,
                format!("the publisher closed the connection inside a record at stream byte {record}"),
                "cut at {cut}"
            );
        }
        assert_eq!(conn.closed().unwrap().reason.disposition(), Disposition::Retry, "cut at {cut}");
        assert!(!closed(&events).is_empty());
    }
}

#[test]
fn a_greeting_that_is_not_one_or_of_another_version_is_refused() {
    let (_, conn) = run(subscriber(), b"HTTP/1.1 200 OK\r\nContent-Length: 20\r\n\r\nhello");
    let (reason, why) = reason_and_why(&conn);
    assert!(matches!(reason, CloseReason::NotAPublisher(ref e) if e.offset == 0), "{reason:?}");
    assert!(why.starts_with("127.0.0.1:9100 is not an mdrelay publisher: not an mdrelay publisher"), "{why}");
    assert!(why.ends_with("at byte 0"), "{why}");
    assert_eq!(conn.closed().unwrap().reason.disposition(), Disposition::Refused);

    let mut v3 = greeting();
    v3[8] = 3;
    let (_, conn) = run(subscriber(), &v3);
    let (reason, why) = reason_and_why(&conn);
    assert_eq!(reason, CloseReason::Version(HandshakeError::Version { protocol: 3, schema: Some(1) }));
    assert!(why.starts_with("publisher 127.0.0.1:9100: the peer speaks relay protocol version 3"), "{why}");
    let mut schema = greeting();
    schema[12] = 9;
    let (_, conn) = run(subscriber(), &schema);
    assert!(reason_of(&conn).contains("(schema version 9)"));
    let mut format = greeting();
    format[10] = 200;
    let (_, conn) = run(subscriber(), &format);
    assert!(reason_of(&conn).contains("unknown format id 200 at byte 10"), "{}", reason_of(&conn));
}

fn reason_of(conn: &StreamConnection) -> String {
    conn.closed().map(|c| c.why.clone()).unwrap_or_default()
}

#[test]
fn a_version_one_publisher_gets_a_version_one_answer_without_resume() {
    let mut hello = Hello::new(Format::Sbe, SESSION, 1, 1);
    hello.protocol_version = 1;
    let mut config = ConnectionConfig::subscriber(peer(), Protection::NONE, None, true);
    config.resume = ResumePlan { session: Some(SESSION), next: Some(50), ..ResumePlan::default() };
    let mut conn = StreamConnection::new(config, 0);
    conn.read_buf()[..Hello::LEN].copy_from_slice(&hello.to_bytes());
    conn.received(Hello::LEN, 0);
    let greeted = format!("{:?}", conn.poll_event());
    assert!(greeted.contains("resume: ResumeUnsupported { version: 1 }"), "{greeted}");
    assert_eq!(conn.transmit().len(), Subscribe::LEN, "a version-1 answer is 16 bytes");
    let answer = Subscribe::parse(conn.transmit()).unwrap();
    assert_eq!((answer.protocol_version, answer.echo, answer.resume), (1, true, Resume::Live));
}

#[test]
fn resume_from_start_and_live_are_asked_as_planned() {
    let plan = |session, next, from_start| ResumePlan { session, next, from_start, same_session_only: false };
    for (plan, greeted_session, resume, asked) in [
        (plan(Some(SESSION), Some(77), false), SESSION, Resume::From(77), Start::Resume { from: 77 }),
        // Another session: a restart, so nothing to resume; from the start only when asked.
        (plan(Some(SESSION), Some(77), false), SESSION + 1, Resume::Live, Start::Live),
        (plan(Some(SESSION), Some(77), true), SESSION + 1, Resume::From(1), Start::FromStart),
        (plan(None, None, true), SESSION, Resume::From(1), Start::FromStart),
        (plan(None, None, false), SESSION, Resume::Live, Start::Live),
    ] {
        let mut config = ConnectionConfig::subscriber(peer(), Protection::NONE, None, false);
        config.resume = plan;
        let mut conn = StreamConnection::new(config, 0);
        let events = feed(&mut conn, &Hello::new(Format::Sbe, greeted_session, 1, 1).to_bytes(), &[], 0, false);
        assert!(events[0].contains(&format!("resume: {asked:?}")), "{plan:?}: {events:?}");
        // The answer was taken by `feed`; the plan is in the event.
        assert!(events[0].contains(&format!("resume: {resume:?}, protection")), "{plan:?}: {events:?}");
    }
}

#[test]
fn a_resume_is_checked_against_the_first_record() {
    let mut config = ConnectionConfig::subscriber(peer(), Protection::NONE, None, false);
    config.resume = ResumePlan { session: Some(SESSION), next: Some(10), ..ResumePlan::default() };
    let mut bytes = greeting();
    bytes.extend(record(RecordTag::Format, Format::Sbe, 0, 10, &[]));
    bytes.extend(record(RecordTag::Data, Format::Sbe, 1, 10, b"x"));
    let events = feed(&mut StreamConnection::new(config.clone(), 0), &bytes, &[], 0, false);
    assert_eq!(events[1], "Resume { asked: 10, offered: 10 }");
    assert!(events[2].starts_with("Format"));
    // A publisher without a ring serves live: its first record names a later frame.
    let mut later = greeting();
    later.extend(record(RecordTag::Format, Format::Sbe, 0, 500, &[]));
    let events = feed(&mut StreamConnection::new(config.clone(), 0), &later, &[], 0, false);
    assert_eq!(events[1], "Resume { asked: 10, offered: 500 }");
    // A relay checks its first DATA record too (an upstream that sends no FORMAT first).
    let mut relay = ConnectionConfig::relay("up:1".into(), peer(), false, SUBSCRIBER_HANDSHAKE_TIMEOUT);
    relay.resume = ResumePlan { session: Some(SESSION), next: Some(10), same_session_only: true, from_start: false };
    let mut data_first = greeting();
    data_first.extend(record(RecordTag::Data, Format::Sbe, 1, 12, b"x"));
    data_first.extend(record(RecordTag::Data, Format::Sbe, 1, 13, b"y"));
    let events = feed(&mut StreamConnection::new(relay, 0), &data_first, &[], 0, false);
    assert_eq!(events[1], "Resume { asked: 10, offered: 12 }", "{events:#?}");
    assert!(events[2].starts_with("Data"), "{events:#?}");
}

#[test]
fn protection_must_match_both_ways_and_the_key_check_must_agree() {
    let crc = Protection { crc: true, encrypted: false };
    let encrypted = Protection { crc: false, encrypted: true };
    // The publisher protects, the subscriber does not; and the other way round.
    for (theirs, ours) in [(crc, Protection::NONE), (Protection::NONE, crc), (encrypted, crc)] {
        let hello = Hello::new(Format::Sbe, SESSION, 1, 1).protected(theirs, [0; 4]);
        let (_, conn) =
            run(StreamConnection::new(ConnectionConfig::subscriber(peer(), ours, None, false), 0), &hello.to_bytes());
        let (reason, why) = reason_and_why(&conn);
        assert_eq!(reason, CloseReason::ProtectionMismatch { theirs, ours });
        assert_eq!(
            why,
            format!(
                "publisher 127.0.0.1:9100 protects its frames with {theirs} and this subscriber expects {ours}: configure the same [protection] (crc, key_file) on both"
            )
        );
    }
    let key = WireKey::new([7; KEY_LEN]);
    let check = Protector::new(false, Some(&key), 1 << 20).key_check(SESSION);
    let right = Hello::new(Format::Sbe, SESSION, 1, 1).protected(encrypted, check).to_bytes();
    let config = ConnectionConfig::subscriber(peer(), encrypted, Some(key.clone()), false);
    let (events, _) = run(StreamConnection::new(config.clone(), 0), &right);
    assert!(events[0].starts_with("Greeted"), "{events:?}");
    let wrong =
        Hello::new(Format::Sbe, SESSION, 1, 1).protected(encrypted, [check[0] ^ 1, check[1], check[2], check[3]]);
    let (_, conn) = run(StreamConnection::new(config, 0), &wrong.to_bytes());
    assert_eq!(reason_and_why(&conn).0, CloseReason::WrongKey);
    assert!(reason_and_why(&conn).1.contains("encrypts with another key than protection.key_file"));
    // A relay takes no encrypted upstream, and its crc must match.
    let relay = |crc| ConnectionConfig::relay("up.example:9100".into(), peer(), crc, SUBSCRIBER_HANDSHAKE_TIMEOUT);
    let (_, conn) = run(StreamConnection::new(relay(false), 0), &wrong.to_bytes());
    assert_eq!(reason_and_why(&conn).0, CloseReason::Encrypted(encrypted));
    assert!(
        reason_and_why(&conn)
            .1
            .starts_with("upstream up.example:9100 (127.0.0.1:9100) encrypts its frames (encrypted)")
    );
    let crc_hello = Hello::new(Format::Sbe, SESSION, 1, 1).protected(crc, [0; 4]).to_bytes();
    let (_, conn) = run(StreamConnection::new(relay(false), 0), &crc_hello);
    assert!(
        reason_and_why(&conn).1.contains("source.upstream.crc = false expects none: set source.upstream.crc = true")
    );
    let (events, _) = run(StreamConnection::new(relay(true), 0), &crc_hello);
    assert!(events[0].starts_with("Greeted"));
}

#[test]
fn refuse_busy_and_records_out_of_place_on_the_stream() {
    let mut refused = greeting();
    refused.extend(record(RecordTag::Refuse, Format::Sbe, 0, 0, b"version 1 answers are refused here"));
    let (_, conn) = run(subscriber(), &refused);
    assert_eq!(
        reason_and_why(&conn).1,
        "publisher 127.0.0.1:9100 refused the subscription: version 1 answers are refused here"
    );
    assert_eq!(conn.closed().unwrap().reason.disposition(), Disposition::Refused);

    let mut busy = greeting();
    busy.extend(record(RecordTag::Busy, Format::Sbe, 0, 9, b"subscriber limit (4) reached"));
    let (_, conn) = run(subscriber(), &busy);
    assert_eq!(reason_and_why(&conn).1, "the publisher is busy: subscriber limit (4) reached");
    assert_eq!(conn.closed().unwrap().reason.disposition(), Disposition::Busy);

    let mut odd = greeting();
    odd.extend(record(RecordTag::Format, Format::Sbe, 0, 1, &[]));
    odd.extend(record(RecordTag::Request, Format::Raw, 0, 1, &[0; 8]));
    odd.extend(record(RecordTag::Gone, Format::Raw, 0, 1, &gone_payload(3)));
    odd.extend(record(RecordTag::Echo, Format::Sbe, 0, 1, &[0; 16]));
    odd.extend(record(RecordTag::Data, Format::Sbe, 1, 1, b"still read"));
    let (events, conn) = run(subscriber(), &odd);
    assert!(events[2].starts_with("OutOfPlace { tag: Request, at: 56 }"), "{events:#?}");
    assert!(events[3].starts_with("OutOfPlace { tag: Gone"), "{events:#?}");
    assert!(events[4].starts_with("OutOfPlace { tag: Echo"), "{events:#?}");
    assert!(events[5].starts_with("Data"), "the framing is kept: {events:#?}");
    let c = conn.counts();
    assert_eq!((c.out_of_place, c.echoes_from_publisher), (3, 1));

    let mut unreadable = greeting();
    unreadable.extend(record(RecordTag::End, Format::Sbe, 0, 1, &[1, 2, 3]));
    let (events, conn) = run(subscriber(), &unreadable);
    assert!(events[1].contains("totals: Err("), "{events:?}");
    assert_eq!(conn.counts().unreadable_totals, 1);
    assert_eq!(conn.closed().unwrap().reason, CloseReason::End);
}

#[test]
fn a_bad_header_loses_the_framing_and_says_where() {
    let mut bytes = greeting();
    bytes.extend(record(RecordTag::Format, Format::Sbe, 0, 1, &[]));
    let mut bad = record(RecordTag::Data, Format::Sbe, 1, 1, b"x");
    bad[0] = 165;
    bytes.extend(bad);
    let (_, conn) = run(subscriber(), &bytes);
    assert_eq!(reason_and_why(&conn).1, "bad record header at stream byte 56: unknown record tag 165");
    let mut huge = greeting();
    let mut h = record(RecordTag::Data, Format::Sbe, 1, 1, &[]);
    h[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
    huge.extend(h);
    let (_, conn) = run(subscriber(), &huge);
    assert!(
        reason_and_why(&conn).1.starts_with("bad record header at stream byte 44: record length 4294967295 exceeds")
    );
    assert_eq!(conn.counts().bad_headers, 1);
    let mut format = greeting();
    let mut f = record(RecordTag::Format, Format::Sbe, 0, 1, &[]);
    f[1] = 99;
    format.extend(f);
    let (_, conn) = run(subscriber(), &format);
    assert_eq!(reason_and_why(&conn).1, "bad record header at stream byte 41: unknown format id 99");
}

#[test]
fn a_jumped_sequence_is_a_violation_before_any_of_its_frames_is_handed_out() {
    let mut bytes = greeting();
    bytes.extend(record(RecordTag::Format, Format::Sbe, 0, 1, &[]));
    bytes.extend(record(RecordTag::Data, Format::Sbe, 3, 1, b"abc"));
    bytes.extend(record(RecordTag::Data, Format::Sbe, 1, 4 + 1_000_000, b"d"));
    bytes.extend(record(RecordTag::Data, Format::Sbe, 1, 5, b"e"));
    for cuts in [vec![], (1..bytes.len()).collect()] {
        let events = feed(&mut subscriber(), &bytes, &cuts, 0, false);
        assert_eq!(events.len(), 5, "{events:#?}");
        assert!(
            events[3].starts_with("Violation { violation: Violation { tag: Data, sequence: 1000004, expected: Some(4)")
        );
        assert!(events[4].contains("protocol violation at stream byte 75"), "{}", events[4]);
    }
    let mut conn = subscriber();
    feed(&mut conn, &bytes, &[], 0, false);
    let closed = conn.closed().unwrap();
    assert!(
        matches!(closed.reason, CloseReason::Violation { at: 75, violation } if matches!(violation.kind, ViolationKind::Unconfirmed { .. }))
    );
    assert_eq!(closed.reason.disposition(), Disposition::Violation);
    assert_eq!(conn.counts().violations, 1);
    // A relay's text names the violation.
    let mut relay =
        StreamConnection::new(ConnectionConfig::relay("u:1".into(), peer(), false, SUBSCRIBER_HANDSHAKE_TIMEOUT), 0);
    feed(&mut relay, &bytes, &[], 0, false);
    assert!(
        reason_of(&relay).starts_with("protocol violation at stream byte 75: DATA numbered from 1000004 skips ahead")
    );
    // Behind: refused at once, without waiting for the record after it.
    let mut behind = greeting();
    behind.extend(record(RecordTag::Data, Format::Sbe, 3, 1, b"abc"));
    behind.extend(record(RecordTag::Data, Format::Sbe, 1, 2, b"d"));
    let (_, conn) = run(subscriber(), &behind);
    assert!(
        matches!(conn.closed().unwrap().reason, CloseReason::Violation { violation, .. } if violation.kind == ViolationKind::Behind)
    );
}

#[test]
fn deadlines_end_a_silent_handshake_and_an_idle_relay() {
    let mut conn = StreamConnection::new(ConnectionConfig::subscriber(peer(), Protection::NONE, None, false), 100);
    assert_eq!(conn.deadline(), Some(100 + 10 * S));
    conn.on_timeout(100 + 10 * S - 1);
    assert!(!conn.is_closed(), "not yet");
    conn.read_buf()[..10].copy_from_slice(&greeting()[..10]);
    conn.received(10, 5 * S);
    conn.on_timeout(100 + 10 * S);
    let mut events = Vec::new();
    crate::relay::client::testing::drain(&mut conn, &mut events);
    assert_eq!(
        reason_and_why(&conn),
        (CloseReason::HandshakeTimeout { received: 10 }, "no greeting within 10s".to_string())
    );
    assert_eq!(conn.deadline(), None);

    // The greeting came, the answer is never taken.
    let mut conn = subscriber();
    conn.read_buf()[..Hello::LEN].copy_from_slice(&greeting());
    conn.received(Hello::LEN, 2 * S);
    while conn.poll_event().is_some() {}
    assert_eq!(conn.deadline(), Some(12 * S), "the answer has a handshake time of its own");
    conn.on_timeout(12 * S);
    assert_eq!(reason_and_why(&conn).1, "the publisher does not read the subscription");

    let mut config = ConnectionConfig::relay("u:1".into(), peer(), false, Duration::from_secs(3));
    config.idle_timeout_ns = Some(30 * S);
    let mut relay = StreamConnection::new(config.clone(), 0);
    relay.on_timeout(3 * S);
    assert_eq!(
        reason_and_why(&relay).1,
        "127.0.0.1:9100 sent 0 of the 40 greeting bytes within 3s (source.upstream.handshake_timeout)"
    );
    let mut relay = StreamConnection::new(config, 0);
    feed(&mut relay, &greeting(), &[], S, false);
    assert_eq!(relay.deadline(), Some(31 * S));
    relay.on_timeout(31 * S);
    assert_eq!(reason_and_why(&relay).1, "nothing received for 30s (source.upstream.idle_timeout)");
}

#[test]
fn a_relay_refuses_an_upstream_that_restarted() {
    let mut config = ConnectionConfig::relay("up:9".into(), peer(), false, SUBSCRIBER_HANDSHAKE_TIMEOUT);
    config.resume =
        ResumePlan { session: Some(SESSION - 1), next: Some(8), same_session_only: true, from_start: false };
    let (_, conn) = run(StreamConnection::new(config, 0), &greeting());
    assert_eq!(reason_and_why(&conn).0, CloseReason::Restarted { old: SESSION - 1, new: SESSION });
    assert!(reason_and_why(&conn).1.contains("restarted: its session 0x5e551010 is now 0x5e551011"));
    assert_eq!(conn.closed().unwrap().reason.disposition(), Disposition::Fatal);
}

#[test]
fn echoes_go_out_counted_and_bounded_and_unsent_ones_count_as_dropped() {
    let mut conn = subscriber();
    let mut bytes = greeting();
    bytes.extend(record(RecordTag::Format, Format::Sbe, 0, 1, &[]));
    feed(&mut conn, &bytes, &[], 0, false);
    assert!(conn.transmit().is_empty(), "the answer was taken");
    let echo = Echo { publish_time: 99, sequence: 7 };
    assert!(conn.queue_echo(echo, Format::Sbe));
    let written = conn.transmit().to_vec();
    let header = RecordHeader::parse(&written, 16).unwrap();
    assert_eq!((header.tag, header.sequence, Echo::parse(&written[16..]).unwrap()), (RecordTag::Echo, 7, echo));
    conn.transmitted(31);
    assert_eq!(conn.counts().echoes_sent, 0, "a record counts when written whole");
    conn.transmitted(1);
    assert_eq!(conn.counts().echoes_sent, 1);
    while conn.queue_echo(echo, Format::Sbe) {}
    assert_eq!(conn.transmit().len(), MAX_PENDING_ECHOES);
    assert_eq!(conn.counts().echoes_dropped, 1);
    conn.transmitted(10);
    conn.received(0, 0);
    while conn.poll_event().is_some() {}
    assert_eq!(conn.counts().echoes_dropped, 1 + (MAX_PENDING_ECHOES / ECHO_RECORD) as u64, "the rest never went out");
}

#[test]
fn read_and_write_failures_are_worded_by_where_they_happened() {
    let mut conn = subscriber();
    conn.read_failed(&"connection reset by peer");
    while conn.poll_event().is_some() {}
    assert_eq!(reason_of(&conn), "reading the greeting: connection reset by peer");
    let mut conn = subscriber();
    conn.read_buf()[..Hello::LEN].copy_from_slice(&greeting());
    conn.received(Hello::LEN, 0);
    while conn.poll_event().is_some() {}
    conn.write_failed(&"broken pipe");
    assert_eq!(reason_of(&conn), "sending the subscription: broken pipe");
    let mut conn = subscriber();
    let mut bytes = greeting();
    bytes.extend(record(RecordTag::Format, Format::Sbe, 0, 1, &[]));
    bytes.extend(&[1, 1, 0]);
    feed(&mut conn, &bytes, &[], 0, false);
    conn.read_failed(&"timed out");
    while conn.poll_event().is_some() {}
    assert_eq!(reason_of(&conn), "reading at stream byte 59: timed out");
}

fn recovery() -> StreamConnection {
    StreamConnection::new(ConnectionConfig::recovery(peer(), Protection::NONE), 0)
}

#[test]
fn a_retransmission_service_may_say_busy_or_refuse_instead_of_greeting() {
    let busy = record(RecordTag::Busy, Format::Raw, 0, 0, b"retransmit.max_connections (64) reached");
    for cuts in [vec![], (1..busy.len()).collect::<Vec<_>>()] {
        let mut conn = recovery();
        feed(&mut conn, &busy, &cuts, 0, false);
        assert_eq!(reason_of(&conn), "127.0.0.1:9100 is busy: retransmit.max_connections (64) reached");
        assert_eq!(conn.closed().unwrap().reason.disposition(), Disposition::Busy);
    }
    let refuse = record(RecordTag::Refuse, Format::Raw, 0, 0, b"no");
    let (_, conn) = run(recovery(), &refuse);
    assert_eq!(reason_of(&conn), "127.0.0.1:9100 refused the recovery connection: no");
    // Cut short: the reason is what came, saying so.
    let (_, conn) = run(recovery(), &busy[..20]);
    assert_eq!(reason_of(&conn), "127.0.0.1:9100 is busy: retr [the first 4 of 39 bytes]");
    let (_, conn) = run(recovery(), b"SSH-2.0-OpenSSH_9.6 and more");
    assert!(reason_of(&conn).ends_with("(check the recovery setting)"), "{}", reason_of(&conn));
    // A version-1 publisher has no retransmission service.
    let mut hello = Hello::new(Format::Sbe, SESSION, 1, 1);
    hello.protocol_version = 1;
    let (_, conn) = run(recovery(), &hello.to_bytes());
    assert_eq!(reason_of(&conn), "127.0.0.1:9100 speaks relay protocol version 1, which has no retransmission service");
    let crc = Hello::new(Format::Sbe, SESSION, 1, 1).protected(Protection { crc: true, encrypted: false }, [0; 4]);
    let (_, conn) = run(recovery(), &crc.to_bytes());
    assert!(reason_of(&conn).ends_with("this subscriber expects none: configure the same [protection] on both"));
}

#[test]
fn a_recovery_connection_asks_and_takes_answers_gone_and_busy() {
    let mut conn = recovery();
    let mut bytes = greeting();
    let events = feed(&mut conn, &bytes, &[], 0, false);
    assert!(events[0].contains("purpose: Recovery"), "{events:?}");
    assert!(conn.queue_request(RetransmitRequest { first: 5, count: 3 }));
    assert_eq!(conn.transmit(), RetransmitRequest { first: 5, count: 3 }.to_record());
    bytes.clear();
    bytes.extend(record(RecordTag::Gone, Format::Raw, 0, 5, &gone_payload(1)));
    bytes.extend(record(RecordTag::Data, Format::Sbe, 2, 6, b"two frames"));
    bytes.extend(record(RecordTag::Busy, Format::Raw, 0, 9, b"over the rate"));
    bytes.extend(record(RecordTag::Format, Format::Raw, 0, 9, &[]));
    let events = feed(&mut conn, &bytes, &[], 0, false);
    assert_eq!(events[0], "Gone { first: 5, count: 1 }");
    assert!(events[1].starts_with("Data"));
    assert_eq!(events[2], "Busy { first: 9, reason: \"over the rate\" }");
    assert!(events[3].starts_with("OutOfPlace { tag: Format"));
    conn.transmitted(conn.transmit().len());
    conn.received(0, 0);
    let mut events = Vec::new();
    crate::relay::client::testing::drain(&mut conn, &mut events);
    assert_eq!(conn.closed().unwrap().reason, CloseReason::Quiet, "answered, nothing unsent: a quiet close");
    // A bad GONE, and a close before anything was answered.
    let mut bad = greeting();
    bad.extend(record(RecordTag::Gone, Format::Raw, 0, 5, &[1, 2]));
    let (_, conn) = run(recovery(), &bad);
    assert_eq!(
        reason_of(&conn),
        "bad GONE record from 127.0.0.1:9100 at byte 56: 2 bytes end where 8 more were expected"
    );
    let (_, conn) = run(recovery(), &greeting());
    assert_eq!(reason_of(&conn), "127.0.0.1:9100 closed the connection");
    let mut big = greeting();
    big.extend(record(RecordTag::Data, Format::Raw, 1, 1, &[]));
    big.truncate(big.len() - 16);
    let mut h = record(RecordTag::Data, Format::Raw, 1, 1, &[]);
    h[4..8].copy_from_slice(&((MAX_ANSWER_RECORD + 1) as u32).to_le_bytes());
    big.extend(h);
    let (_, conn) = run(recovery(), &big);
    assert!(reason_of(&conn).starts_with("bad record header from 127.0.0.1:9100 at byte 44: record length 1048577"));
}

#[test]
fn requests_wait_within_a_bound() {
    let mut conn = recovery();
    assert!(!conn.queue_request(RetransmitRequest { first: 1, count: 1 }), "not before the handshake");
    feed(&mut conn, &greeting(), &[], 0, false);
    let mut queued = 0;
    while conn.queue_request(RetransmitRequest { first: 1, count: 1 }) {
        queued += 1;
    }
    assert_eq!(queued, MAX_PENDING_REQUESTS.div_ceil(24));
    assert!(!conn.has_room_for_requests());
    conn.transmitted(24 * 100);
    assert!(conn.has_room_for_requests());
}

#[test]
fn the_read_buffer_grows_only_as_records_need_it() {
    let mut config = ConnectionConfig::subscriber(peer(), Protection::NONE, None, false);
    config.read_buffer = 64;
    let mut conn = StreamConnection::new(config, 0);
    let mut bytes = greeting();
    bytes.extend(record(RecordTag::Format, Format::Sbe, 0, 1, &[]));
    // A length that promises a 60 MiB record, and only a few bytes of it.
    let mut h = record(RecordTag::Data, Format::Sbe, 1, 1, &[]);
    h[4..8].copy_from_slice(&(60u32 << 20).to_le_bytes());
    bytes.extend(h);
    bytes.extend([0u8; 100]);
    feed(&mut conn, &bytes, &[], 0, false);
    assert!(conn.read_buf().len() < 1024, "room grows by doubling as bytes arrive, not to the length's size");
}

#[test]
fn echoes_still_unsent_at_the_end_of_the_stream_count_as_dropped_once_the_driver_stops_writing() {
    let mut conn = subscriber();
    let mut bytes = greeting();
    bytes.extend(record(RecordTag::Format, Format::Sbe, 0, 1, &[]));
    feed(&mut conn, &bytes, &[], 0, false);
    let echo = Echo { publish_time: 99, sequence: 7 };
    for _ in 0..3 {
        assert!(conn.queue_echo(echo, Format::Sbe));
    }
    // One and a half go out; then END, and the driver's last write takes nothing more.
    conn.transmitted(ECHO_RECORD + ECHO_RECORD / 2);
    let end = record(RecordTag::End, Format::Sbe, 0, 1, &totals_bytes());
    conn.read_buf()[..end.len()].copy_from_slice(&end);
    conn.received(end.len(), 0);
    while conn.poll_event().is_some() {}
    assert_eq!(conn.closed().unwrap().reason, CloseReason::End);
    conn.discard_unsent();
    let c = conn.counts();
    assert_eq!((c.echoes_sent, c.echoes_dropped), (1, 2), "every echo queued is counted once");
    assert!(conn.transmit().is_empty());
}

#[test]
fn a_busy_or_refuse_reason_longer_than_the_limit_is_cut_there_and_still_understood() {
    let long: Vec<u8> = b"at the limit; ".iter().copied().cycle().take(MAX_REASON + 5000).collect();
    for (tag, disposition, start) in [
        (RecordTag::Busy, Disposition::Busy, "127.0.0.1:9100 is busy: at the limit; "),
        (RecordTag::Refuse, Disposition::Refused, "127.0.0.1:9100 refused the recovery connection: at the limit; "),
    ] {
        let bytes = record(tag, Format::Raw, 0, 0, &long);
        for cuts in [vec![], vec![7, 100, MAX_REASON]] {
            let mut conn = recovery();
            // The service keeps the connection open: the reason is read without the rest.
            feed(&mut conn, &bytes[..RecordHeader::LEN + MAX_REASON + 10], &cuts, 0, false);
            let closed = conn.closed().unwrap_or_else(|| panic!("{tag:?}: not understood"));
            assert_eq!(closed.reason.disposition(), disposition, "{closed:?}");
            assert!(closed.why.starts_with(start), "{}", closed.why);
            let reason = match &closed.reason {
                CloseReason::Busy(r) | CloseReason::Refused(r) => r.clone(),
                other => panic!("{other:?}"),
            };
            let shown = format!("{} [the first {MAX_REASON} of {} bytes]", from_bytes(&long[..MAX_REASON]), long.len());
            assert_eq!(reason, shown, "cut at MAX_REASON bytes, saying so");
        }
    }
}

#[test]
fn a_refusal_on_the_stream_is_read_to_the_reason_limit_whatever_length_it_declares() {
    let reason = "closed\n\x1b[2J for upgrade; ".repeat(40);
    let reason = reason.as_bytes();
    // 60 MiB, and a length past the record limit: both are refusals, of which 256 bytes are read.
    for declared in [60u32 << 20, u32::MAX] {
        for (tag, disposition) in [(RecordTag::Refuse, Disposition::Refused), (RecordTag::Busy, Disposition::Busy)] {
            let mut conn = subscriber();
            let mut bytes = greeting();
            let header = RecordHeader { tag, format: Format::Sbe, frame_count: 0, length: declared, sequence: 0 };
            bytes.extend(header.to_bytes());
            bytes.extend(&reason[..MAX_REASON + 10]);
            for cuts in [vec![], random_cuts(bytes.len(), u64::from(declared))] {
                let mut conn_cut = subscriber();
                feed(&mut conn_cut, &bytes, &cuts, 0, false);
                let closed = conn_cut.closed().unwrap_or_else(|| panic!("{tag:?} of {declared}: not understood"));
                assert_eq!(closed.reason.disposition(), disposition, "{closed:?}");
                let (CloseReason::Refused(shown) | CloseReason::Busy(shown)) = &closed.reason else { panic!() };
                let expected =
                    format!("{} [the first {MAX_REASON} of {declared} bytes]", from_bytes(&reason[..MAX_REASON]));
                assert_eq!(shown, &expected);
                assert!(!shown.chars().any(char::is_control), "{shown:?}");
                assert!(conn_cut.buffer_capacity() <= STREAM_READ_BUFFER, "the buffer never grew for the length");
            }
            // What came before the peer closed is the reason.
            feed(&mut conn, &bytes[..Hello::LEN + RecordHeader::LEN + 20], &[], 0, true);
            let closed = conn.closed().expect("closed");
            assert_eq!(closed.reason.disposition(), disposition, "{closed:?}");
            assert!(closed.why.contains(&format!("[the first 20 of {declared} bytes]")), "{}", closed.why);
        }
    }
}
