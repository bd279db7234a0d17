//! The frame reader on real frames (the shared DEEP10 capture, encoded in each format): every
//! frame declared is walked, accounted for and decoded once, and everything refused is counted.

use super::*;
use crate::relay::client::book::{self, RecoveryBook};
use crate::relay::client::testing::{Notes, capture_frames};
use crate::relay::protect::{KEY_LEN, Protection, Protector};
use crate::relay::window::SequenceCounts;
use mdrelay_codec::Format;
use mdrelay_iex::price::Symbol;
use std::time::Duration;

const SESSION: u64 = 77;

/// A payload of `frames` (already back to back), first numbered `first`.
fn payload(bytes: &[u8], format: Format, first: u64, frames: u64, origin: Origin) -> Payload<'_> {
    Payload {
        origin,
        format,
        bytes,
        first_sequence: first,
        declared_frames: frames,
        session: SESSION,
        receive_time: 1_000,
        now: 0,
        place: Place::Stream(56),
    }
}

fn joined(frames: &[Vec<u8>]) -> Vec<u8> {
    frames.concat()
}

fn reader() -> FrameReader {
    FrameReader::new(ReaderConfig::default())
}

#[test]
fn every_format_walks_exactly_the_declared_frames_and_decodes_each_once() {
    for format in Format::ALL {
        let frames = capture_frames("DEEP10.pcap.gz", format, 40);
        let mut expected = Notes::default();
        let mut plain = mdrelay_codec::Codec::new(format, mdrelay_codec::Limits::default());
        for f in &frames {
            plain.decode(f, |m| expected.kinds.push(m.kind())).unwrap();
        }
        let mut r = reader();
        let mut notes = Notes::default();
        // Records of 1, 2, 3... frames.
        let (mut at, mut size, mut first) = (0, 1, 1u64);
        while at < frames.len() {
            let end = (at + size).min(frames.len());
            let bytes = joined(&frames[at..end]);
            let outcome = r.payload(payload(&bytes, format, first, (end - at) as u64, Origin::Stream), &mut notes);
            assert_eq!(outcome.decoded, (end - at) as u64, "{format}");
            first += (end - at) as u64;
            (at, size) = (end, size + 1);
        }
        assert_eq!(notes.kinds, expected.kinds, "{format}: the same messages, in order");
        assert_eq!(notes.sequences(), (1..=40).collect::<Vec<_>>(), "{format}");
        assert!(notes.anomalies.is_empty(), "{format}: {:?}", notes.anomalies);
        assert_eq!(notes.formats, vec![(None, format)]);
        assert_eq!(r.counts().frames_decoded, 40);
        assert_eq!(r.tracker().counts(), SequenceCounts::default());
        assert_eq!(r.first_frame(), Some(1));
    }
}

#[test]
fn duplicates_gaps_reordering_and_frames_too_late_are_accounted_and_not_decoded_twice() {
    let frames = capture_frames("DEEP10.pcap.gz", Format::Sbe, 6);
    let mut r = reader();
    let mut notes = Notes::default();
    for (seq, i) in [(1, 0), (2, 1), (5, 4), (3, 2), (3, 2), (6, 5)] {
        r.payload(payload(&frames[i], Format::Sbe, seq, 1, Origin::Stream), &mut notes);
    }
    assert_eq!(notes.sequences(), vec![1, 2, 5, 3, 6]);
    assert_eq!(
        notes.anomalies,
        ["Gap { missing: 2, before: 5 }", "Reordered { sequence: 3 }", "Duplicate { sequence: 3 }",]
    );
    let c = r.tracker().counts();
    assert_eq!((c.lost, c.duplicates, c.reordered), (1, 1, 1));
    // Older than the window: neither taken nor counted as arrived.
    let far = 1 + crate::relay::window::WINDOW + 10;
    r.payload(payload(&frames[0], Format::Sbe, far, 1, Origin::Stream), &mut notes);
    r.payload(payload(&frames[0], Format::Sbe, 4, 1, Origin::Stream), &mut notes);
    assert_eq!(notes.anomalies.last().unwrap(), "TooLate { sequence: 4 }");
    assert_eq!(r.tracker().counts().too_late, 1);
}

#[test]
fn a_frame_that_cannot_be_delimited_loses_the_rest_of_its_payload_only() {
    let frames = capture_frames("DEEP10.pcap.gz", Format::FlatBuffers, 3);
    let mut bytes = joined(&frames);
    bytes.truncate(bytes.len() - 5);
    let mut r = reader();
    let mut notes = Notes::default();
    r.payload(payload(&bytes, Format::FlatBuffers, 1, 3, Origin::Stream), &mut notes);
    assert_eq!(notes.sequences(), vec![1, 2]);
    let at = 56 + frames[0].len() + frames[1].len();
    assert!(
        notes.anomalies[0].starts_with(&format!(
            "Undelimited {{ at: PlaceAt(Stream(56), {}), format: FlatBuffers, frame: 2",
            at - 56
        )),
        "{:?}",
        notes.anomalies
    );
    assert_eq!(r.counts().undelimited_payloads, 1);
    // The frame after it comes in the next payload: the stream goes on, frame 3 is missing.
    r.payload(payload(&frames[2], Format::FlatBuffers, 4, 1, Origin::Stream), &mut notes);
    assert_eq!(r.tracker().counts().lost, 1);
    // Bytes past the declared frames are not read; fewer frames than declared are reported.
    let mut r = reader();
    let mut notes = Notes::default();
    r.payload(payload(&joined(&frames), Format::FlatBuffers, 1, 2, Origin::Stream), &mut notes);
    assert_eq!((notes.sequences(), r.counts().excess_payloads), (vec![1, 2], 1));
    assert!(notes.anomalies[0].starts_with("Excess"));
    r.payload(payload(&frames[2], Format::FlatBuffers, 3, 4, Origin::Stream), &mut notes);
    assert!(notes.anomalies[1].starts_with("FewerFrames"), "{:?}", notes.anomalies);
    assert_eq!(PlaceAt(Place::Stream(56), 10).to_string(), "stream byte 66");
}

#[test]
fn a_frame_that_does_not_decode_is_counted_and_the_next_one_decoded() {
    let mut frames = capture_frames("DEEP10.pcap.gz", Format::FlatBuffers, 3);
    // The root offset (after the size prefix) points far outside: still delimited by its
    // prefix, no longer a batch.
    frames[1][4..8].copy_from_slice(&u32::MAX.to_le_bytes());
    let mut r = reader();
    let mut notes = Notes::default();
    r.payload(payload(&joined(&frames), Format::FlatBuffers, 1, 3, Origin::Stream), &mut notes);
    let delimited = notes.failed.len() + notes.frames.len();
    assert_eq!(delimited, 3, "{:?}", notes.anomalies);
    assert_eq!((notes.sequences(), notes.failed.clone()), (vec![1, 3], vec![2]));
    assert_eq!(r.counts().decode_errors, 1);
    assert!(notes.anomalies[0].starts_with("DecodeFailed"), "{:?}", notes.anomalies);
}

#[test]
fn the_symbol_filter_applies_before_decode_unless_every_message_is_wanted() {
    let frames = capture_frames("DEEP10.pcap.gz", Format::Capnp, 300);
    let bytes = joined(&frames);
    let mut all = Notes::default();
    reader().payload(payload(&bytes, Format::Capnp, 1, 300, Origin::Stream), &mut all);
    // A symbol of the capture's first frames, whichever it is.
    let mut codec = mdrelay_codec::Codec::new(Format::Capnp, mdrelay_codec::Limits::default());
    let mut symbol: Option<Symbol> = None;
    for f in frames.iter().rev() {
        codec.decode(f, |m| symbol = m.symbol().or(symbol)).unwrap();
    }
    let symbol = symbol.expect("the capture's frames name symbols");
    let config = || ReaderConfig { symbols: Some(SymbolFilter::new([symbol])), ..ReaderConfig::default() };
    let mut filtered = Notes::default();
    FrameReader::new(config()).payload(payload(&bytes, Format::Capnp, 1, 300, Origin::Stream), &mut filtered);
    assert_eq!(filtered.kinds.len() + filtered.skipped.len(), all.kinds.len(), "every message counted");
    assert!(!filtered.kinds.is_empty() && !filtered.skipped.is_empty(), "the capture has both");
    let mut recording = Notes { every: true, ..Notes::default() };
    FrameReader::new(config()).payload(payload(&bytes, Format::Capnp, 1, 300, Origin::Stream), &mut recording);
    assert_eq!(recording.kinds, all.kinds);
}

#[test]
fn a_format_switch_is_followed_without_losing_a_frame() {
    let sbe = capture_frames("DEEP10.pcap.gz", Format::Sbe, 4);
    let json = capture_frames("DEEP10.pcap.gz", Format::Json, 4);
    let mut r = reader();
    let mut notes = Notes::default();
    r.payload(payload(&joined(&sbe[..2]), Format::Sbe, 1, 2, Origin::Stream), &mut notes);
    r.payload(payload(&joined(&json[2..]), Format::Json, 3, 2, Origin::Stream), &mut notes);
    r.payload(payload(&sbe[0], Format::Sbe, 5, 1, Origin::Stream), &mut notes);
    assert_eq!(
        notes.formats,
        vec![(None, Format::Sbe), (Some(Format::Sbe), Format::Json), (Some(Format::Json), Format::Sbe)]
    );
    assert_eq!((r.format_switches(), r.formats_seen().len()), (2, 2));
    assert_eq!(notes.sequences(), vec![1, 2, 3, 4, 5]);
}

#[test]
fn protected_payloads_open_and_any_frame_failing_refuses_the_whole_payload() {
    let frames = capture_frames("DEEP10.pcap.gz", Format::Protobuf, 3);
    let key = WireKey::new([5; KEY_LEN]);
    for (crc, key) in [(true, None), (false, Some(&key)), (true, Some(&key))] {
        let mut sealer = Protector::new(crc, key, 1 << 20);
        let mut sealed = Vec::new();
        for (i, f) in frames.iter().enumerate() {
            sealer.seal(SESSION, 10 + i as u64, Format::Protobuf, f, &mut sealed);
        }
        let config = ReaderConfig { crc, key: key.cloned(), ..ReaderConfig::default() };
        let mut r = FrameReader::new(config.clone());
        let mut notes = Notes::default();
        r.payload(payload(&sealed, Format::Protobuf, 10, 3, Origin::Stream), &mut notes);
        assert_eq!(notes.sequences(), vec![10, 11, 12], "{:?}", sealer.protection());
        // One flipped bit in the last frame refuses all three.
        let mut bad = sealed.clone();
        let last = bad.len() - 1;
        bad[last] ^= 1;
        let mut r = FrameReader::new(config);
        let mut notes = Notes::default();
        r.payload(payload(&bad, Format::Protobuf, 10, 3, Origin::Stream), &mut notes);
        assert!(notes.frames.is_empty() && notes.anomalies[0].starts_with("Unsealed"), "{:?}", notes.anomalies);
        let p = r.counts().protection;
        assert_eq!(p.frames_refused, 3);
        assert_eq!((p.crc_failures, p.authentication_failures), if crc { (1, 0) } else { (0, 1) });
    }
    assert_eq!(
        FrameReader::new(ReaderConfig { crc: true, ..ReaderConfig::default() }).protection(),
        Protection { crc: true, encrypted: false }
    );
}

#[test]
fn every_nth_frame_of_the_stream_is_echoed_and_retransmitted_ones_never() {
    let frames = capture_frames("DEEP10.pcap.gz", Format::Sbe, 6);
    let mut r = FrameReader::new(ReaderConfig { echo_every: Some(2), ..ReaderConfig::default() })
        .with_recovery(RecoveryBook::new(book::policy(Duration::ZERO, Duration::from_millis(50), 10)));
    let mut notes = Notes::default();
    for seq in [1u64, 2, 4, 5, 6] {
        r.payload(payload(&frames[seq as usize - 1], Format::Sbe, seq, 1, Origin::Stream), &mut notes);
    }
    // Frame 3 comes back from the retransmission service.
    r.payload(payload(&frames[2], Format::Sbe, 3, 1, Origin::Recovered), &mut notes);
    let echoes: Vec<(i64, u64)> = r.drain_echoes().map(|e| (e.publish_time, e.sequence)).collect();
    assert_eq!(echoes, vec![(2, 2), (5, 5)], "every second frame decoded from the stream, with its publish time");
    assert_eq!((r.counts().frames_recovered, r.counts().frames_decoded), (1, 6));
    assert_eq!(notes.frames.last().unwrap().1, Origin::Recovered);
    // A second copy of a recovered frame is not taken; without a book nothing is.
    r.payload(payload(&frames[2], Format::Sbe, 3, 1, Origin::Recovered), &mut notes);
    assert_eq!(r.counts().frames_decoded, 6);
    let mut plain = reader();
    plain.payload(payload(&frames[2], Format::Sbe, 3, 1, Origin::Recovered), &mut notes);
    assert_eq!(plain.counts().frames_decoded, 0);
    assert_eq!(r.tracker().counts().lost, 0);
}

#[test]
fn two_lines_merge_into_one_stream() {
    let frames = capture_frames("DEEP10.pcap.gz", Format::Raw, 4);
    let mut r = reader().with_lines(Lines::new("a".into(), "b".into()));
    let mut notes = Notes::default();
    for (line, seq) in [(Line::A, 1), (Line::B, 1), (Line::B, 2), (Line::A, 2), (Line::A, 4), (Line::B, 3)] {
        r.payload(payload(&frames[seq as usize - 1], Format::Raw, seq, 1, Origin::Line(line)), &mut notes);
    }
    assert_eq!(notes.sequences(), vec![1, 2, 4, 3]);
    let lines = r.lines().unwrap();
    assert_eq!(lines.arbitrated(), 2);
    assert_eq!(lines.merged_extra().reordered, 1);
    let report = lines.report();
    assert_eq!((report.a.frames, report.b.frames), (3, 3));
}

#[test]
fn a_relays_reader_keeps_order_and_a_frame_failing_its_crc_stops_the_payload_there() {
    let frames = capture_frames("DEEP10.pcap.gz", Format::Sbe, 5);
    let mut r = FrameReader::new(ReaderConfig { mode: ReaderMode::Ordered, ..ReaderConfig::default() });
    let mut notes = Notes::default();
    r.payload(payload(&joined(&frames[..2]), Format::Sbe, 1, 2, Origin::Stream), &mut notes);
    // A replay overlapping what was handed on, then a gap.
    r.payload(payload(&joined(&frames[1..3]), Format::Sbe, 2, 2, Origin::Stream), &mut notes);
    r.payload(payload(&frames[4], Format::Sbe, 6, 1, Origin::Stream), &mut notes);
    assert_eq!(notes.sequences(), vec![1, 2, 3, 6]);
    assert_eq!(r.counts().ordered, OrderedCounts { gaps: 2, duplicates: 1 });
    assert_eq!(r.ordered_next(), Some(7));
    assert_eq!(notes.anomalies, ["Gap { missing: 2, before: 6 }"]);

    let mut sealer = Protector::new(true, None, 1 << 20);
    let mut sealed = Vec::new();
    for (i, f) in frames[..3].iter().enumerate() {
        sealer.seal(SESSION, 1 + i as u64, Format::Sbe, f, &mut sealed);
    }
    let second = frames[0].len() + 8;
    sealed[second + 10] ^= 4;
    let mut r = FrameReader::new(ReaderConfig { mode: ReaderMode::Ordered, crc: true, ..ReaderConfig::default() });
    let mut notes = Notes::default();
    let outcome = r.payload(payload(&sealed, Format::Sbe, 1, 3, Origin::Stream), &mut notes);
    assert_eq!(notes.sequences(), vec![1], "the frame before it was handed on");
    let failed = outcome.check_failed.expect("frame 2 fails");
    assert_eq!((failed.sequence, failed.at), (2, PlaceAt(Place::Stream(56), second as u64)));
    assert!(matches!(failed.error, crate::relay::protect::ProtectError::Crc { .. }));
    assert_eq!((r.counts().frame_check_failures, r.ordered_next()), (1, Some(2)), "resume from the frame that failed");
}
