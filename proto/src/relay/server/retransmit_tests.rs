//! The retransmission service's side of a client on byte slices, rings built in the test and a
//! fake clock: requests whole, cut and wrong; the idle and partial-request deadlines; the rate;
//! answers within, across and beyond the ring, absurd ranges; any bytes without a panic.

use super::retransmit::*;
use super::testing::bytes_and_cuts;
use crate::relay::ring::{ENTRY_OVERHEAD, FrameRing};
use crate::relay::wire::{RecordHeader, RecordTag, RetransmitRequest, control_record, parse_gone};
use mdrelay_codec::Format;
use proptest::prelude::*;
use std::time::Duration;

const S: i64 = 1_000_000_000;
const MS: i64 = 1_000_000;
/// Bytes of the handshake's answer before the first request.
const AFTER_HANDSHAKE: u64 = 32;

fn reader(now: i64) -> RequestReader {
    RequestReader::new(AFTER_HANDSHAKE, Duration::from_secs(30), Duration::from_secs(2), now)
}

fn request(first: u64, count: u32) -> Vec<u8> {
    RetransmitRequest { first, count }.to_record()
}

/// Feeds `bytes` in pieces cut at `cuts` at `now`, never more than `read_buf` offers; the
/// events, and the bytes taken.
fn feed(r: &mut RequestReader, bytes: &[u8], cuts: &[usize], now: i64) -> (Vec<RequestEvent>, usize) {
    let mut events = Vec::new();
    let mut start = 0;
    for end in cuts.iter().copied().chain([bytes.len()]) {
        while start < end {
            let room = r.read_buf();
            if room.is_empty() {
                return (events, start);
            }
            let n = room.len().min(end - start);
            room[..n].copy_from_slice(&bytes[start..start + n]);
            start += n;
            if let Some(event) = r.received(n, now) {
                let over = matches!(event, RequestEvent::Ended(_));
                events.push(event);
                if over {
                    return (events, start);
                }
            }
        }
    }
    (events, start)
}

fn asked(first: u64, count: u32) -> RequestEvent {
    RequestEvent::Request(RetransmitRequest { first, count })
}

fn refused(event: &RequestEvent) -> String {
    match event {
        RequestEvent::Ended(ClientEnd::Refused(why)) => why.clone(),
        other => panic!("not refused: {other:?}"),
    }
}

#[test]
fn requests_are_read_one_at_a_time_and_the_next_waits_for_the_answer() {
    let mut r = reader(0);
    let mut two = request(5, 3);
    two.extend(request(100, 1));
    let (events, taken) = feed(&mut r, &two, &[], MS);
    assert_eq!((events, taken), (vec![asked(5, 3)], REQUEST_LEN), "nothing of the next is read");
    assert_eq!(r.deadline(), None, "no deadline while answering");
    assert_eq!(r.on_timeout(i64::MAX), None);
    r.answered(2 * MS);
    let (events, _) = feed(&mut r, &two[REQUEST_LEN..], &[], 3 * MS);
    assert_eq!(events, vec![asked(100, 1)]);
}

#[test]
fn a_request_cut_at_every_offset_is_the_same_request() {
    let bytes = request(77, 9);
    for a in 1..REQUEST_LEN {
        for b in a..REQUEST_LEN {
            let mut r = reader(0);
            assert_eq!(feed(&mut r, &bytes, &[a, b], 0).0, vec![asked(77, 9)], "cut at {a}, {b}");
        }
    }
}

#[test]
fn anything_but_a_request_is_refused_once_its_header_is_in_naming_the_byte() {
    // Another tag: refused at the 16th byte, the payload not waited for.
    let mut r = reader(0);
    let wrong = control_record(RecordTag::Echo, Format::Raw, 1, &[0; 16]);
    let (events, taken) = feed(&mut r, &wrong, &[RecordHeader::LEN], 0);
    assert_eq!(taken, RecordHeader::LEN);
    assert_eq!(
        refused(&events[0]),
        "a client sends only REQUEST records of 8 bytes; this one sent Echo of 16 at byte 32"
    );
    // A request of another length.
    let mut r = reader(0);
    let (events, _) = feed(&mut r, &control_record(RecordTag::Request, Format::Raw, 1, &[0; 4]), &[], 0);
    assert!(refused(&events[0]).contains("sent Request of 4 at byte 32"));
    // Not a record at all, after one good request: the byte is of the whole connection.
    let mut r = reader(0);
    feed(&mut r, &request(1, 1), &[], 0);
    r.answered(0);
    let (events, _) = feed(&mut r, &[0xff; REQUEST_LEN], &[], 0);
    let why = refused(&events[0]);
    assert!(why.starts_with("bad request at byte 56"), "{why}");
}

#[test]
fn closing_between_requests_is_an_end_and_inside_one_a_failure_at_its_byte() {
    let mut r = reader(0);
    assert_eq!(r.received(0, 0), Some(RequestEvent::Ended(ClientEnd::Closed)));
    for cut in 1..REQUEST_LEN {
        let mut r = reader(0);
        feed(&mut r, &request(1, 1)[..cut], &[], 0);
        let expected = format!("the client closed inside a request, at byte {}", AFTER_HANDSHAKE + cut as u64);
        assert_eq!(r.received(0, 0), Some(RequestEvent::Ended(ClientEnd::Failed(expected))));
    }
    let r = reader(0);
    assert_eq!(
        r.read_failed(&"Connection reset by peer"),
        ClientEnd::Failed("reading a request at byte 32: Connection reset by peer".into())
    );
}

#[test]
fn an_idle_client_times_out_from_its_last_answer() {
    let mut r = reader(10 * S);
    assert_eq!(r.deadline(), Some(40 * S));
    assert_eq!(r.on_timeout(40 * S - 1), None);
    assert_eq!(r.on_timeout(40 * S), Some(ClientEnd::Idle));
    // Asking moves the idle time to after the answer.
    feed(&mut r, &request(1, 1), &[], 39 * S);
    r.answered(45 * S);
    assert_eq!(r.deadline(), Some(75 * S));
    assert_eq!(r.on_timeout(74 * S), None);
    assert_eq!(r.on_timeout(75 * S), Some(ClientEnd::Idle));
}

#[test]
fn a_request_left_half_sent_times_out_from_its_first_byte() {
    let mut r = reader(0);
    feed(&mut r, &request(1, 1)[..5], &[], 7 * S);
    assert_eq!(r.deadline(), Some(9 * S), "the partial deadline replaces the idle one");
    // More bytes do not move it.
    feed(&mut r, &request(1, 1)[5..20], &[], 8 * S);
    assert_eq!(r.deadline(), Some(9 * S));
    assert_eq!(r.on_timeout(9 * S - 1), None);
    assert_eq!(r.on_timeout(9 * S), Some(ClientEnd::RequestTimeout));
    // Whole in time: back to the idle deadline after the answer.
    let mut r = reader(0);
    feed(&mut r, &request(1, 1)[..5], &[], S);
    feed(&mut r, &request(1, 1)[5..], &[], 2 * S);
    r.answered(2 * S);
    assert_eq!(r.deadline(), Some(32 * S));
}

#[test]
fn the_token_bucket_holds_a_seconds_worth_and_refills_with_the_time() {
    let mut b = TokenBucket::new(3, 100 * S);
    assert!((0..3).all(|_| b.admit(100 * S)));
    assert!(!b.admit(100 * S), "the burst is a second's worth");
    assert!(!b.admit(100 * S + 300 * MS));
    assert!(b.admit(100 * S + 340 * MS), "a third of a second later: one more");
    assert!(!b.admit(100 * S + 340 * MS));
    // A long silence refills to the burst, no more.
    assert_eq!((0..10).filter(|_| b.admit(1_000 * S)).count(), 3);
    // A clock that goes back grants nothing and breaks nothing.
    assert!(!b.admit(0));
    assert!(b.admit(1_000 * S + 400 * MS));
    let mut none = TokenBucket::new(0, 0);
    assert!(!none.admit(i64::MAX));
}

#[test]
fn a_request_over_the_rate_is_told_busy_with_the_setting() {
    let record = throttled(&RetransmitRequest { first: 9, count: 1 }, 50);
    let header = RecordHeader::parse(&record, 1 << 20).unwrap();
    assert_eq!((header.tag, header.sequence), (RecordTag::Busy, 9));
    let why = std::str::from_utf8(&record[RecordHeader::LEN..]).unwrap();
    assert!(why.contains("over 50 requests per second (retransmit.requests_per_second)"), "{why}");
}

/// A ring holding 100-byte frames 16..=25 (1 to 15 left it), frame `s` filled with `s`.
fn ring() -> FrameRing {
    let mut ring = FrameRing::new(10 * (100 + ENTRY_OVERHEAD));
    for seq in 1..=25u64 {
        ring.push(seq, Format::Sbe, &[seq as u8; 100]);
    }
    assert_eq!((ring.first(), ring.next()), (16, 26));
    ring
}

/// The records of an answer: (tag, first frame, frames or GONE count), each DATA frame checked.
fn records(bytes: &[u8]) -> Vec<(RecordTag, u64, u64)> {
    let mut out = Vec::new();
    let mut at = 0;
    while at < bytes.len() {
        let h = RecordHeader::parse(&bytes[at..], usize::MAX).unwrap();
        let payload = &bytes[at + RecordHeader::LEN..at + RecordHeader::LEN + h.length as usize];
        match h.tag {
            RecordTag::Gone => out.push((h.tag, h.sequence, parse_gone(payload).unwrap())),
            _ => {
                let len = (h.length / u32::from(h.frame_count)) as usize;
                for (i, frame) in payload.chunks(len).enumerate() {
                    assert!(frame.iter().all(|&b| u64::from(b) == h.sequence + i as u64));
                }
                out.push((h.tag, h.sequence, u64::from(h.frame_count)));
            }
        }
        at += RecordHeader::LEN + h.length as usize;
    }
    out
}

/// The whole answer to `first, count` against `ring`, and whether it asked ahead.
fn answer(ring: &FrameRing, first: u64, count: u32, max_range: u32) -> (Vec<(RecordTag, u64, u64)>, bool) {
    let mut out = Vec::new();
    let (mut a, mut step) = Answer::new(ring, RetransmitRequest { first, count }, max_range, &mut out);
    while step.more {
        step = a.fill(ring, &mut out);
    }
    (records(&out), a.ahead)
}

use RecordTag::{Data, Gone};

#[test]
fn answers_within_across_and_beyond_the_ring() {
    let r = ring();
    assert_eq!(answer(&r, 17, 3, 1000), (vec![(Data, 17, 3)], false));
    // What left the ring is GONE at once, then the frames held.
    assert_eq!(answer(&r, 10, 10, 1000), (vec![(Gone, 10, 6), (Data, 16, 4)], false));
    assert_eq!(answer(&r, 1, 5, 1000), (vec![(Gone, 1, 5)], false));
    // Past the ring's end: what is held, nothing for frames not sent yet.
    assert_eq!(answer(&r, 24, 5, 1000), (vec![(Data, 24, 2)], true));
    assert_eq!(answer(&r, 30, 5, 1000), (vec![], true));
    // The range limit bounds the frames served, never what is said GONE.
    assert_eq!(answer(&r, 5, 20, 3), (vec![(Gone, 5, 11), (Data, 16, 3)], false));
}

#[test]
fn absurd_ranges_are_answered_with_nothing_and_never_overflow() {
    let r = ring();
    assert_eq!(answer(&r, 17, 0, 1000), (vec![], false), "no frames asked, none answered");
    assert_eq!(answer(&r, u64::MAX - 1, u32::MAX, 1000), (vec![], true));
    assert_eq!(answer(&r, u64::MAX, 1, 1000), (vec![], true));
    // Frame 0 is never sent: from 0, everything below the ring is gone.
    assert_eq!(answer(&r, 0, u32::MAX, u32::MAX), (vec![(Gone, 0, 16), (Data, 16, 10)], true));
}

#[test]
fn a_large_answer_comes_in_parts_and_frames_leaving_meanwhile_are_gone() {
    let big = 10 << 10;
    // Room for 20 frames: each frame pushed from here on evicts one.
    let mut ring = FrameRing::new(20 * (big + ENTRY_OVERHEAD));
    for seq in 1..=20u64 {
        ring.push(seq, Format::Capnp, &vec![seq as u8; big]);
    }
    let mut out = Vec::new();
    let (mut a, step) = Answer::new(&ring, RetransmitRequest { first: 1, count: 20 }, 1000, &mut out);
    assert!(step.more && out.is_empty());
    let step = a.fill(&ring, &mut out);
    assert!(step.more && out.len() >= ANSWER_BYTES && step.sent < 20, "{step:?}");
    let sent_first = step.sent;
    out.clear();
    // The stream goes on while the first part is written: the next frames leave the ring.
    for seq in 21..=(21 + sent_first + 3) {
        ring.push(seq, Format::Capnp, &vec![seq as u8; big]);
    }
    let gone_now = ring.first() - (1 + sent_first);
    assert!(gone_now > 0);
    let mut gone = 0;
    let mut sent = sent_first;
    loop {
        let step = a.fill(&ring, &mut out);
        gone += step.gone;
        sent += step.sent;
        if !step.more {
            break;
        }
    }
    assert_eq!((gone, sent), (gone_now, 20 - gone_now));
    assert_eq!(records(&out)[0].0, Gone);
}

proptest! {
    /// Whatever a client sends, in whatever pieces: a request is at most 24 bytes read, the
    /// reader ends or asks, and nothing panics.
    #[test]
    fn any_bytes_never_panic((mut bytes, cuts) in bytes_and_cuts(120), plausible in any::<bool>()) {
        if plausible && bytes.len() >= 2 {
            bytes[0] = RecordTag::Request as u8;
            bytes[1] = 0;
        }
        let mut r = reader(0);
        let (events, taken) = feed(&mut r, &bytes, &cuts, 0);
        prop_assert!(taken <= REQUEST_LEN);
        prop_assert!(events.len() <= 1);
        if let Some(RequestEvent::Request(asked)) = events.first() {
            let mut out = Vec::new();
            let ring = ring();
            let (mut a, mut step) = Answer::new(&ring, *asked, u32::MAX, &mut out);
            while step.more {
                step = a.fill(&ring, &mut out);
            }
        }
        let _ = r.on_timeout(i64::MAX);
        let _ = r.received(0, i64::MAX);
    }
}
