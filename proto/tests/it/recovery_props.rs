//! Properties of the recovery state machines under arbitrary operations: the publisher's ring
//! never exceeds its bound and answers exactly from a model of what it holds; the subscriber's
//! gap list accounts for every missing frame exactly once.

use mdrelay_codec::Format;
use mdrelay_proto::relay::ring::ENTRY_OVERHEAD;
use mdrelay_proto::relay::{FrameRing, GapList, RecordHeader, RecoveryPolicy};
use proptest::prelude::*;
use std::collections::{BTreeSet, VecDeque};

proptest! {
    /// Whatever the frame sizes, the ring stays within its bound, holds a suffix of the frames
    /// pushed (the newest that fit), and copies them back byte for byte.
    #[test]
    fn the_ring_holds_the_newest_frames_within_its_bound(
        limit in 64usize..20_000,
        sizes in proptest::collection::vec(0usize..3_000, 1..200),
    ) {
        let mut ring = FrameRing::new(limit);
        let mut model: VecDeque<(u64, Vec<u8>)> = VecDeque::new();
        for (i, &size) in sizes.iter().enumerate() {
            let seq = i as u64 + 1;
            let frame: Vec<u8> = (0..size).map(|b| (b as u64 ^ seq) as u8).collect();
            ring.push(seq, Format::Raw, &frame);
            model.push_back((seq, frame));
            let cost = |m: &VecDeque<(u64, Vec<u8>)>| m.iter().map(|(_, f)| f.len() + ENTRY_OVERHEAD).sum::<usize>();
            while cost(&model) > limit {
                model.pop_front();
            }
            prop_assert!(ring.charged() <= limit);
            prop_assert_eq!(ring.next(), seq + 1);
            prop_assert_eq!(ring.len(), model.len());
        }
        for (seq, frame) in &model {
            let mut out = Vec::new();
            prop_assert_eq!(ring.copy_record(*seq, 1, usize::MAX, &mut out), Some(seq + 1));
            let header = RecordHeader::parse(&out, usize::MAX).unwrap();
            prop_assert_eq!((header.sequence, header.frame_count), (*seq, 1));
            prop_assert_eq!(&out[RecordHeader::LEN..], &frame[..]);
        }
        let first = ring.first();
        let lookup = ring.lookup(1, ring.next() + 9);
        prop_assert_eq!((lookup.gone, lookup.held, lookup.ahead), (first - 1, ring.len() as u64, 10));
    }

    /// Every frame found missing ends up exactly once as recovered, filled late, unrecoverable
    /// or still open, whatever arrives, is said gone, or times out, in whatever order.
    #[test]
    fn every_missing_frame_is_accounted_for_once(
        ops in proptest::collection::vec((0u8..5, 0u64..400, 1u64..20), 1..300),
    ) {
        let policy = RecoveryPolicy { delay_ns: 10, retry_ns: 20, attempts: 3, max_frames: 8 };
        let mut gaps = GapList::new();
        let mut missing: BTreeSet<u64> = BTreeSet::new();
        let mut opened_to = 0u64;
        let mut now = 0i64;
        for (op, at, len) in ops {
            now += 7;
            match op {
                // Frames go missing only beyond what was seen, as a window reports them.
                0 => {
                    let first = opened_to.max(at);
                    gaps.open(first, first + len, now);
                    missing.extend(first..first + len);
                    opened_to = first + len;
                }
                1 => {
                    let was = missing.remove(&at);
                    prop_assert_eq!(gaps.fill(at, true, now).is_some(), was);
                }
                2 => {
                    let was = missing.remove(&at);
                    prop_assert_eq!(gaps.fill(at, false, now).is_some(), was);
                }
                3 => {
                    let given_up = gaps.give_up(at, at + len);
                    let gone: Vec<u64> = missing.range(at..at + len).copied().collect();
                    prop_assert_eq!(given_up, gone.len() as u64);
                    for s in gone {
                        missing.remove(&s);
                    }
                }
                _ => {
                    for request in gaps.due(now, &policy, 4) {
                        prop_assert!(missing.contains(&request.first), "asked for a frame not missing");
                        prop_assert!(request.count >= 1 && request.count <= policy.max_frames);
                    }
                    // Given up after its attempts: no longer open.
                    missing.retain(|&s| gaps.is_missing(s));
                }
            }
            let c = gaps.counts();
            prop_assert_eq!(gaps.open_frames(), missing.len() as u64);
            prop_assert_eq!(
                c.frames_missing,
                c.frames_recovered + c.frames_filled_late + c.frames_unrecoverable + gaps.open_frames()
            );
        }
    }
}
