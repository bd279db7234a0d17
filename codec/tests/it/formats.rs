//! Every wire format: property-tested round trips of every message type, the real captures
//! decoded and aggregated to exactly the reference figures, framing on split and merged reads,
//! and corrupt frames that give errors, never panics.

use mdrelay_codec::FormatCodec;
use mdrelay_codec::{BatchHeader, Codec, Format, Limits};
use mdrelay_harness::{assert_aggregates, expected, formats, iex_data};
use mdrelay_iex::inspect::InspectReport;
use mdrelay_iex::message::*;
use mdrelay_iex::{Aggregator, Price, Symbol};
use proptest::prelude::*;
use std::collections::BTreeMap;

use crate::strategies::{header, messages, spec};

fn round_trip(format: Format, header: &BatchHeader, messages: &[Message<'_>]) -> (BatchHeader, Vec<String>) {
    let mut codec = Codec::new(format, Limits::default());
    let mut out = Vec::new();
    codec.encode(header, messages, &mut out).unwrap_or_else(|e| panic!("{format}: {e}"));
    assert_eq!(codec.frame_len(&out).unwrap(), Some(out.len()), "{format}: the framer delimits exactly the frame");
    let mut seen = Vec::new();
    let decoded = codec.decode(&out, |m| seen.push(format!("{m:?}"))).unwrap_or_else(|e| panic!("{format}: {e}"));
    (decoded, seen)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    #[test]
    fn every_message_type_round_trips_through_every_format(header in header(), specs in proptest::collection::vec(spec(), 0..40)) {
        let messages = messages(&specs);
        let want: Vec<String> = messages.iter().map(|m| format!("{m:?}")).collect();
        for format in formats() {
            let (decoded, seen) = round_trip(format, &header, &messages);
            prop_assert_eq!(&seen, &want, "{}", format);
            prop_assert_eq!(decoded, BatchHeader { message_count: messages.len() as u32, ..header }, "{}", format);
        }
    }

    #[test]
    fn corrupt_frames_are_errors_not_panics(header in header(), specs in proptest::collection::vec(spec(), 0..12), flips in proptest::collection::vec((any::<usize>(), 0u8..8), 1..8), cut in any::<usize>()) {
        let messages = messages(&specs);
        for format in formats() {
            let mut codec = Codec::new(format, Limits::default());
            let mut frame = Vec::new();
            codec.encode(&header, &messages, &mut frame).unwrap();
            let mut flipped = frame.clone();
            for (at, bit) in &flips {
                let at = at % flipped.len();
                flipped[at] ^= 1 << bit;
            }
            for bytes in [&flipped[..], &frame[..cut % (frame.len() + 1)]] {
                if let Ok(Some(len)) = codec.frame_len(bytes) {
                    prop_assert!(len <= bytes.len());
                    let _ = codec.decode(&bytes[..len], |_| {});
                }
                let _ = codec.decode(bytes, |_| {});
            }
        }
    }

    #[test]
    fn random_bytes_are_errors_not_panics(bytes in proptest::collection::vec(any::<u8>(), 0..2048)) {
        for format in formats() {
            let mut codec = Codec::new(format, Limits::default());
            if let Ok(Some(len)) = codec.frame_len(&bytes) {
                prop_assert!(len <= bytes.len());
            }
            let _ = codec.decode(&bytes, |_| {});
        }
    }
}

#[test]
fn empty_and_largest_batches_round_trip() {
    let header = BatchHeader {
        protocol_id: 0x8004,
        session_id: 7,
        first_sequence: 99,
        send_time: 5,
        publish_time: 6,
        ..Default::default()
    };
    let trade = Message::TradeReport(Trade {
        sale_condition: 0,
        timestamp: 1,
        symbol: Symbol::new("ZIEXT").unwrap(),
        size: 100,
        price: Price(1),
        trade_id: 1,
    });
    let event = Message::SystemEvent(SystemEvent { event: b'O', timestamp: 3 });
    for format in formats() {
        let (decoded, seen) = round_trip(format, &header, &[]);
        assert_eq!((decoded.message_count, seen.len()), (0, 0), "{format}");
        assert_eq!(decoded.first_sequence, 99, "{format}");
        // Raw is bounded by an IEX-TP segment's 65535-byte payload; the schema formats by the
        // u16 message count.
        let (largest, one) =
            if format == Format::Raw { (65535 / 12, event) } else { (mdrelay_codec::MAX_BATCH, trade) };
        let batch = vec![one; largest];
        let (decoded, seen) = round_trip(format, &header, &batch);
        assert_eq!(decoded.message_count as usize, largest, "{format}");
        assert_eq!(seen.len(), largest, "{format}");
        let mut codec = Codec::new(format, Limits::default());
        let too_many = vec![one; largest + 1];
        assert!(
            codec.encode(&header, &too_many, &mut Vec::new()).is_err(),
            "{format}: one more than the largest batch is refused"
        );
    }
}

#[test]
fn framers_handle_split_and_merged_reads_and_refuse_oversized_frames() {
    let header = BatchHeader { protocol_id: 0x8004, ..Default::default() };
    let batches: Vec<Vec<Message<'static>>> = (0..20)
        .map(|n| {
            (0..n)
                .map(|i| {
                    Message::TradeReport(Trade {
                        sale_condition: 0,
                        timestamp: i,
                        symbol: Symbol::new("AB").unwrap(),
                        size: i as u32,
                        price: Price(i),
                        trade_id: i,
                    })
                })
                .collect()
        })
        .collect();
    for format in formats() {
        let mut codec = Codec::new(format, Limits::default());
        let mut stream = Vec::new();
        let mut ends = Vec::new();
        for batch in &batches {
            codec.encode(&BatchHeader { first_sequence: batch.len() as i64, ..header }, batch, &mut stream).unwrap();
            ends.push(stream.len());
        }
        // Many frames in one read: walk the whole stream.
        let mut at = 0;
        for (i, end) in ends.iter().enumerate() {
            let len = codec.frame_len(&stream[at..]).unwrap().unwrap_or_else(|| panic!("{format}: frame {i} complete"));
            assert_eq!(at + len, *end, "{format}: frame {i} boundary");
            let mut count = 0;
            let h = codec.decode(&stream[at..at + len], |_| count += 1).unwrap();
            assert_eq!((h.first_sequence, count), (i as i64, i), "{format}");
            at = *end;
        }
        // A frame split anywhere: not complete until the last byte.
        let first = ends[5] - ends[4];
        let frame = &stream[ends[4]..ends[5]];
        for cut in 0..first {
            assert_eq!(codec.frame_len(&frame[..cut]).unwrap(), None, "{format}: cut at {cut} of {first}");
        }
        // A frame over the limit is refused from its first bytes.
        let small = Codec::new(format, Limits { max_frame: first - 1, ..Limits::default() });
        assert!(small.frame_len(frame).is_err(), "{format}: over the limit");
    }
}

/// Each capture's segments through one format, decoded and aggregated as a subscriber does;
/// with the decoded messages counted by type, as `inspect` names the types.
pub(crate) fn through_format(path: &std::path::Path, format: Format) -> (Aggregator, BTreeMap<String, u64>) {
    let mut aggregator = Aggregator::new();
    let mut types = BTreeMap::new();
    crate::each_frame(path, &mut Codec::new(format, Limits::default()), |codec, segment, frame| {
        let len = codec.frame_len(frame).unwrap().unwrap();
        assert_eq!(len, frame.len());
        let header = codec.decode(frame, |m| {
            *types.entry(char::from(m.kind()).to_string()).or_insert(0u64) += 1;
            aggregator.apply(m);
        });
        assert_eq!(header.unwrap().session_id, segment.session_id);
    });
    (aggregator, types)
}

#[test]
#[ignore = "long (over 3 s here): .ci/run runs it with --ignored"]
fn the_real_captures_through_every_format_give_the_reference_figures() {
    for (capture, reference) in [("DEEP10.pcap.gz", "DEEP10.json"), ("TOPS16.pcap.gz", "TOPS16.json")] {
        let reference = expected(reference);
        for format in formats() {
            let context = format!("{capture} through {format}");
            let (aggregator, types) = through_format(&iex_data().join(capture), format);
            let report = InspectReport {
                total_trade_volume: aggregator.total_trade_volume(),
                symbols: aggregator.active(),
                symbols_with_trades_or_quotes: aggregator.active().len() as u64,
                ..InspectReport::default()
            };
            assert_aggregates(&serde_json::to_value(&report).unwrap(), &reference, &context);
            // Every message arrives, each as the type it was sent as.
            assert_eq!(serde_json::json!(types), reference["message_types"], "{context}");
            assert_eq!(types.values().sum::<u64>(), reference["messages"].as_u64().unwrap(), "{context}");
        }
    }
}
