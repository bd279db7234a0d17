//! What a subscriber is sent, on rings and records built in the test: joins, replays with 0, 1
//! and several format switches, frames gone from the ring, the hand-over to the live records at
//! its boundaries, and any bytes without a panic.

use super::feed::*;
use crate::relay::ring::FrameRing;
use crate::relay::wire::{RecordHeader, RecordTag, control_record};
use mdrelay_codec::Format;
use proptest::prelude::*;

/// A ring holding frames `1..=formats.len()` of 10 bytes, frame `i` in `formats[i - 1]`, all
/// handed to the live records (the mark after the last).
fn ring(formats: &[Format]) -> FrameRing {
    let mut ring = FrameRing::new(1 << 20);
    for (i, &format) in formats.iter().enumerate() {
        let seq = i as u64 + 1;
        ring.push(seq, format, &[seq as u8; 10]);
    }
    ring.set_published(formats.len() as u64 + 1);
    ring
}

/// A DATA record of frames `first..first + frames`, 10 bytes each, in `format`.
fn data(format: Format, first: u64, frames: u16) -> Vec<u8> {
    let header = RecordHeader {
        tag: RecordTag::Data,
        format,
        frame_count: frames,
        length: u32::from(frames) * 10,
        sequence: first,
    };
    let mut out = header.to_bytes().to_vec();
    out.resize(RecordHeader::LEN + usize::from(frames) * 10, first as u8);
    out
}

/// What the subscriber is sent, by (tag, format, first frame, frames), and frames dropped.
#[derive(Default, Debug)]
struct Sent {
    records: Vec<(RecordTag, Format, u64, u16)>,
    dropped: u64,
}

impl Sent {
    fn push(&mut self, bytes: &[u8]) {
        let mut at = 0;
        while at < bytes.len() {
            let h = RecordHeader::parse(&bytes[at..], usize::MAX).unwrap();
            self.records.push((h.tag, h.format, h.sequence, h.frame_count));
            at += RecordHeader::LEN + h.length as usize;
        }
    }

    /// Takes `record` as the driver does.
    fn take(&mut self, feed: &mut SubscriberFeed, record: &[u8], replaying: bool) -> FeedStep {
        let step = feed.take(record, replaying);
        match &step {
            FeedStep::Skip => return step,
            FeedStep::Data { format_record, dropped, .. } => {
                self.dropped += dropped;
                if let Some(f) = format_record {
                    self.push(f);
                }
            }
            FeedStep::End { dropped } => self.dropped += dropped,
            FeedStep::Other => {}
        }
        self.push(record);
        step
    }
}

/// Joins `ring` from `from` and replays all of it (room for everything at once, or `room`).
fn replay(ring: &FrameRing, from: u64, room: usize) -> (SubscriberFeed, Sent, Join) {
    let join = plan_join(ring, from, Format::Raw);
    let (mut feed, format_record) = SubscriberFeed::resuming(&join).expect("a replay");
    let mut cursor = ReplayCursor::of(&join).unwrap();
    let mut sent = Sent::default();
    sent.push(&format_record);
    loop {
        match cursor.fill(ring, room, true, Vec::with_capacity) {
            ReplayFill::Built { buf, records } => {
                assert!(buf.len() <= room.max(RecordHeader::LEN + 10));
                for r in records {
                    sent.take(&mut feed, &buf[r], true);
                }
            }
            ReplayFill::Needs(n) => panic!("needs {n}"),
            ReplayFill::Done => break,
        }
    }
    assert!(cursor.is_finished());
    (feed, sent, join)
}

/// A ring with room for `room` 10-byte frames, given frames `1..=last` in SBE, all handed to
/// the live records.
fn small_ring(room: usize, last: u64) -> FrameRing {
    let mut r = FrameRing::new(room * (10 + crate::relay::ring::ENTRY_OVERHEAD));
    for seq in 1..=last {
        r.push(seq, Sbe, &[seq as u8; 10]);
    }
    r.set_published(last + 1);
    r
}

use Format::{Capnp, Raw, Sbe};
use RecordTag::{Data, End, Format as Fmt};

#[test]
fn a_join_is_a_replay_up_to_the_mark_or_live_for_numbers_not_sent() {
    let r = ring(&[Sbe; 10]);
    assert_eq!(plan_join(&r, 4, Raw), Join::Replay { from: 4, first: 4, end: 11, format: Sbe });
    assert_eq!(plan_join(&r, 12, Raw), Join::Ahead { from: 12, mark: 11 });
    assert_eq!(SubscriberFeed::resuming(&Join::Ahead { from: 12, mark: 11 }), None);
    assert_eq!(ReplayCursor::of(&Join::Ahead { from: 12, mark: 11 }), None);
    // At the mark: nothing to replay, the live format named, the live records from the mark.
    let join = plan_join(&r, 11, Raw);
    assert_eq!(join, Join::Replay { from: 11, first: 11, end: 11, format: Raw });
    let mut cursor = ReplayCursor::of(&join).unwrap();
    assert!(cursor.is_finished());
    assert_eq!(cursor.fill(&r, 1 << 16, true, |_| unreachable!("nothing to copy")), ReplayFill::Done);
    let (feed, record) = SubscriberFeed::resuming(&join).unwrap();
    assert_eq!(record, control_record(Fmt, Raw, 11, &[]));
    assert_eq!(feed.next(), Some(11));
}

#[test]
fn a_replay_without_a_format_switch_has_one_format_record() {
    let r = ring(&[Sbe; 6]);
    let (_, sent, _) = replay(&r, 2, 1 << 16);
    assert_eq!(sent.records, [(Fmt, Sbe, 2, 0), (Data, Sbe, 2, 5)]);
    assert_eq!(sent.dropped, 0);
}

#[test]
fn a_replay_with_one_format_switch_names_it_where_it_happens() {
    let r = ring(&[Sbe, Sbe, Sbe, Capnp, Capnp]);
    let (_, sent, _) = replay(&r, 1, 1 << 16);
    assert_eq!(sent.records, [(Fmt, Sbe, 1, 0), (Data, Sbe, 1, 3), (Fmt, Capnp, 4, 0), (Data, Capnp, 4, 2)]);
}

#[test]
fn a_replay_with_several_switches_names_each_and_records_split_by_room() {
    let r = ring(&[Sbe, Sbe, Capnp, Raw, Raw, Raw, Sbe, Capnp]);
    // Room for two records of one frame per chunk: records split at switches and at the room,
    // formats named once per switch.
    let (feed, sent, _) = replay(&r, 2, 2 * (RecordHeader::LEN + 10));
    assert_eq!(
        sent.records,
        [
            (Fmt, Sbe, 2, 0),
            (Data, Sbe, 2, 1),
            (Fmt, Capnp, 3, 0),
            (Data, Capnp, 3, 1),
            (Fmt, Raw, 4, 0),
            // Three frames in one record fill a chunk: one header, not three.
            (Data, Raw, 4, 3),
            (Fmt, Sbe, 7, 0),
            (Data, Sbe, 7, 1),
            (Fmt, Capnp, 8, 0),
            (Data, Capnp, 8, 1),
        ]
    );
    assert_eq!((feed.next(), sent.dropped), (Some(9), 0));
}

#[test]
fn frames_no_longer_held_are_the_subscribers_loss_named_by_the_format_record() {
    // Room for 4 frames: 1 to 6 left the ring.
    let r = small_ring(4, 10);
    let join = plan_join(&r, 2, Raw);
    assert_eq!((join, join.gone()), (Join::Replay { from: 2, first: 7, end: 11, format: Sbe }, 5));
    let (_, sent, _) = replay(&r, 2, 1 << 16);
    // The FORMAT record names the frame asked for; the gap to the first replayed is counted.
    assert_eq!(sent.records, [(Fmt, Sbe, 2, 0), (Data, Sbe, 7, 4)]);
    assert_eq!(sent.dropped, 5);
}

#[test]
fn frames_leaving_the_ring_during_the_replay_are_passed_over_and_counted() {
    let mut r = small_ring(4, 4);
    let join = plan_join(&r, 1, Raw);
    let (mut feed, format_record) = SubscriberFeed::resuming(&join).unwrap();
    let mut cursor = ReplayCursor::of(&join).unwrap();
    let mut sent = Sent::default();
    sent.push(&format_record);
    let one = RecordHeader::LEN + 10;
    let ReplayFill::Built { buf, records } = cursor.fill(&r, one, true, Vec::with_capacity) else { panic!() };
    sent.take(&mut feed, &buf[records[0].clone()], true);
    // The live stream moves on: frames 2 and 3 leave the ring before their turn.
    for seq in 5..=7u64 {
        r.push(seq, Sbe, &[seq as u8; 10]);
    }
    assert_eq!(r.first(), 4);
    let ReplayFill::Built { buf, records } = cursor.fill(&r, one, true, Vec::with_capacity) else { panic!() };
    sent.take(&mut feed, &buf[records[0].clone()], true);
    assert!(cursor.is_finished());
    assert_eq!(sent.records, [(Fmt, Sbe, 1, 0), (Data, Sbe, 1, 1), (Data, Sbe, 4, 1)]);
    assert_eq!(sent.dropped, 2);
    // Everything up to the mark left the ring: the replay ends with nothing more to copy.
    let mut r2 = FrameRing::new(2 * (10 + crate::relay::ring::ENTRY_OVERHEAD));
    r2.push(1, Sbe, &[1; 10]);
    r2.set_published(2);
    let mut cursor = ReplayCursor::of(&plan_join(&r2, 1, Raw)).unwrap();
    for seq in 2..=5u64 {
        r2.push(seq, Sbe, &[seq as u8; 10]);
    }
    assert_eq!(cursor.fill(&r2, 1 << 16, true, |_| unreachable!()), ReplayFill::Done);
    assert!(cursor.is_finished());
}

#[test]
fn the_hand_over_skips_live_records_below_the_mark_and_takes_the_rest_without_a_gap() {
    let r = ring(&[Sbe; 5]);
    let (mut feed, mut sent, _) = replay(&r, 1, 1 << 16);
    let replayed = sent.records.len();
    // Live records that start below the mark (6) were replayed: skipped whole, runs included.
    assert_eq!(sent.take(&mut feed, &data(Sbe, 3, 3), false), FeedStep::Skip);
    assert_eq!(sent.take(&mut feed, &data(Sbe, 5, 1), false), FeedStep::Skip);
    // The first at the mark is taken, in the same format: no FORMAT record, no gap.
    let step = sent.take(&mut feed, &data(Sbe, 6, 2), false);
    assert_eq!(step, FeedStep::Data { format_record: None, dropped: 0, first: 6 });
    // A live format switch is announced; a gap after the hand-over is counted.
    let step = sent.take(&mut feed, &data(Capnp, 10, 1), false);
    assert_eq!(
        step,
        FeedStep::Data { format_record: Some(control_record(Fmt, Capnp, 10, &[])), dropped: 2, first: 10 }
    );
    assert_eq!(sent.records[replayed..], [(Data, Sbe, 6, 2), (Fmt, Capnp, 10, 0), (Data, Capnp, 10, 1)]);
    // END names the next frame: what is between is dropped for it.
    let end = control_record(End, Capnp, 14, &[]);
    assert_eq!(sent.take(&mut feed, &end, false), FeedStep::End { dropped: 3 });
    assert!(feed.ended());
}

#[test]
fn a_live_subscriber_gets_a_format_record_first_and_runs_count_by_their_last_record() {
    let mut feed = SubscriberFeed::live();
    let mut sent = Sent::default();
    // A run of two records (frames 4-5, 6-8) handed over as one piece.
    let mut run = data(Sbe, 4, 2);
    run.extend(data(Sbe, 6, 3));
    assert_eq!(last_record(&run).map(|h| h.sequence), Some(6));
    let step = sent.take(&mut feed, &run, false);
    assert_eq!(step, FeedStep::Data { format_record: Some(control_record(Fmt, Sbe, 4, &[])), dropped: 0, first: 4 });
    assert_eq!(feed.next(), Some(9));
    // Other records pass as they are; bytes that are not a record are not sent.
    let busy = control_record(RecordTag::Busy, Sbe, 0, b"x");
    assert_eq!(sent.take(&mut feed, &busy, false), FeedStep::Other);
    assert_eq!(feed.take(&[0u8; 7], false), FeedStep::Skip);
    assert_eq!(last_record(&[0u8; 7]), None);
    assert_eq!(sent.dropped, 0);
}

#[test]
fn a_frame_larger_than_the_room_waits_for_its_size_unless_the_room_is_the_whole_budget() {
    let mut r = FrameRing::new(1 << 20);
    r.push(1, Sbe, &[1; 1000]);
    r.push(2, Sbe, &[2; 10]);
    r.set_published(3);
    let mut cursor = ReplayCursor::of(&plan_join(&r, 1, Raw)).unwrap();
    let need = RecordHeader::LEN + 1000;
    assert_eq!(cursor.fill(&r, 100, false, |_| unreachable!("nothing copied")), ReplayFill::Needs(need));
    assert_eq!(cursor.range(), (1, 3), "nothing taken meanwhile");
    // With the whole budget as room, it goes alone, in a buffer of its size.
    let ReplayFill::Built { buf, records } = cursor.fill(&r, 100, true, |size| {
        assert_eq!(size, need);
        Vec::with_capacity(size)
    }) else {
        panic!()
    };
    assert_eq!((records.len(), records[0].clone(), buf.len()), (1, 0..need, need));
    assert_eq!(cursor.range(), (2, 3));
}

proptest! {
    /// Any bytes, as a record or a run, from the replay or live: never a panic.
    #[test]
    fn any_bytes_taken_never_panic(
        bytes in proptest::collection::vec(any::<u8>(), 0..200),
        header in any::<bool>(),
        replaying in any::<bool>(),
        skip_below in 0u64..20,
    ) {
        let mut bytes = bytes;
        if header && bytes.len() >= RecordHeader::LEN {
            // A plausible DATA header, its length whatever the bytes say.
            bytes[0] = 1;
            bytes[1] = Sbe.id();
        }
        let join = Join::Replay { from: 1, first: 1, end: skip_below, format: Sbe };
        let (mut feed, _) = SubscriberFeed::resuming(&join).unwrap();
        feed.take(&bytes, replaying);
        let _ = last_record(&bytes);
    }
}
