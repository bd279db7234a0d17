//! Untrusted bytes: empty files, random bytes, captures cut anywhere, lying length fields. The
//! reader must return a clear error or count and skip, never panic, never over-allocate.

use mdrelay_harness::alloc::count_allocations;
use mdrelay_harness::iex_data;
use mdrelay_iex::capture::{CaptureError, CaptureReader, READ_BUFFER};
use mdrelay_iex::iextp::{Segment, SegmentBuilder, SegmentHeader};
use mdrelay_iex::inspect::{InspectReport, Inspector, inspect_file};
use mdrelay_iex::message::{Message, Trade};
use mdrelay_iex::{Price, Symbol};
use proptest::prelude::*;
use std::io::Read;

// Counts only the threads that ask (see `count_allocations`); every other test runs as before.
/// Inspects `bytes` as a capture, checking that nothing it allocated was larger than the reader's
/// fixed buffer, whatever the length fields in the bytes say.
fn inspect_bytes(bytes: Vec<u8>) -> Result<(InspectReport, Option<u64>), CaptureError> {
    let (result, allocations) = count_allocations(|| read_capture(bytes));
    assert!(allocations.largest <= READ_BUFFER, "{allocations:?}");
    result
}

fn read_capture(bytes: Vec<u8>) -> Result<(InspectReport, Option<u64>), CaptureError> {
    let mut reader = CaptureReader::new("bytes", std::io::Cursor::new(bytes))?;
    let mut inspector = Inspector::new("bytes");
    while let Some(packet) = reader.next_packet()? {
        inspector.packet(&packet);
    }
    Ok((inspector.finish(), reader.truncated_at()))
}

fn tops16_head(len: usize) -> Vec<u8> {
    let mut raw = Vec::new();
    flate2::read::GzDecoder::new(std::fs::File::open(iex_data().join("TOPS16.pcap.gz")).unwrap())
        .take(len as u64)
        .read_to_end(&mut raw)
        .unwrap();
    raw
}

#[test]
fn an_empty_file_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("empty.pcap");
    std::fs::write(&path, b"").unwrap();
    let error = inspect_file(&path).unwrap_err();
    assert!(matches!(error, CaptureError::Empty { .. }));
    assert!(error.to_string().contains("empty.pcap"), "{error}");
}

#[test]
fn a_text_file_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("notes.pcap");
    std::fs::write(&path, b"this is not a capture\n").unwrap();
    let error = inspect_file(&path).unwrap_err().to_string();
    assert!(error.contains("notes.pcap") && error.contains("not a pcap or pcapng"), "{error}");
    // Gzipped garbage too.
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    std::io::Write::write_all(&mut gz, b"garbage garbage").unwrap();
    let error = CaptureReader::new("garbage.gz", std::io::Cursor::new(gz.finish().unwrap())).err().unwrap();
    assert!(matches!(error, CaptureError::NotACapture { .. }), "{error}");
}

#[test]
fn a_capture_cut_at_every_offset_of_its_first_packets_never_panics() {
    let full = tops16_head(4096);
    let (complete, _) = inspect_bytes(full.clone()).unwrap();
    assert!(complete.packets >= 10);
    let mut previous_packets = 0;
    for cut in 0..full.len() {
        match inspect_bytes(full[..cut].to_vec()) {
            Ok((report, truncated)) => {
                assert!(report.packets >= previous_packets, "a longer prefix never yields fewer packets");
                previous_packets = report.packets;
                // A cut inside a record is reported, a cut at a record boundary is not.
                if truncated.is_none() {
                    assert!(report.packets <= complete.packets);
                }
            }
            Err(e) => assert!(cut < 24, "only a cut inside the 24-byte file header is an error, got {e} at {cut}"),
        }
    }
}

#[test]
fn a_huge_record_length_is_an_error_not_an_allocation() {
    let mut bytes = tops16_head(24 + 16);
    // incl_len of the first record: 4 GB.
    bytes[24 + 8..24 + 12].copy_from_slice(&u32::MAX.to_le_bytes());
    bytes.extend_from_slice(&[0u8; 100]);
    let (result, allocations) = count_allocations(|| read_capture(bytes));
    match result {
        Err(CaptureError::Malformed { offset, .. }) => assert_eq!(offset, 24),
        Ok((report, truncated)) => assert!(report.packets == 0 && truncated.is_some()),
        Err(other) => panic!("unexpected {other}"),
    }
    // The reader allocated (so the counter saw it), and nothing larger than its fixed buffer:
    // nothing was sized from the record's claim.
    assert!(allocations.count > 0, "{allocations:?}");
    assert!(allocations.largest <= READ_BUFFER, "{allocations:?}: the record claims {} bytes", u32::MAX);
}

fn trade(id: i64) -> Message<'static> {
    Message::TradeReport(Trade {
        sale_condition: 0,
        timestamp: 1,
        symbol: Symbol::new("ZVZZT").unwrap(),
        size: 100,
        price: Price(10_0000),
        trade_id: id,
    })
}

#[test]
fn a_length_prefix_past_the_segment_is_counted_and_the_messages_before_it_kept() {
    let mut builder = SegmentBuilder::new();
    builder.start();
    builder.push(&trade(1));
    builder.push(&trade(2));
    let mut bytes = builder.finish(SegmentHeader { version: 1, first_sequence: 1, ..Default::default() }).to_vec();
    // Second message's length prefix: 38 -> 200.
    let second = 40 + 2 + 38;
    bytes[second..second + 2].copy_from_slice(&200u16.to_le_bytes());
    let segment = Segment::parse(&bytes).unwrap();
    let mut inspector = Inspector::new("segment");
    inspector.segment(&segment, 0);
    let report = inspector.finish();
    assert_eq!(report.length_overruns, 1);
    assert_eq!(report.messages, 1);
    assert_eq!(report.message_count_mismatches, 1);
    assert_eq!(report.total_trade_volume, 100);
}

#[test]
fn short_and_unknown_messages_are_counted_and_skipped() {
    let mut builder = SegmentBuilder::new();
    builder.start();
    builder.push(&trade(1));
    builder.push(&Message::Unknown(mdrelay_iex::message::UnknownMessage { kind: b'z', bytes: b"z123" }));
    builder.push(&Message::Unknown(mdrelay_iex::message::UnknownMessage { kind: b'T', bytes: b"T-too-short" }));
    builder.push(&trade(2));
    let bytes = builder.finish(SegmentHeader { version: 1, first_sequence: 1, ..Default::default() }).to_vec();
    let mut inspector = Inspector::new("segment");
    inspector.segment(&Segment::parse(&bytes).unwrap(), 0);
    let report = inspector.finish();
    assert_eq!((report.messages, report.unknown_messages, report.malformed_messages), (4, 1, 1));
    assert_eq!(report.total_trade_volume, 200);
    assert_eq!(report.message_types["z"], 1);
    assert_eq!(report.message_types["T"], 3);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..4096)) {
        let _ = inspect_bytes(bytes);
    }

    #[test]
    fn random_bytes_after_a_valid_header_never_panic(tail in proptest::collection::vec(any::<u8>(), 0..4096), ng in any::<bool>()) {
        let mut bytes = if ng {
            // Section header block (little-endian, no options) and an Ethernet interface block.
            let mut b = vec![0x0a, 0x0d, 0x0d, 0x0a, 28, 0, 0, 0, 0x4d, 0x3c, 0x2b, 0x1a, 1, 0, 0, 0];
            b.extend_from_slice(&[0xff; 8]);
            b.extend_from_slice(&[28, 0, 0, 0]);
            b.extend_from_slice(&[1, 0, 0, 0, 20, 0, 0, 0, 1, 0, 0, 0, 0xff, 0xff, 0, 0, 20, 0, 0, 0]);
            b
        } else {
            tops16_head(24)
        };
        bytes.extend_from_slice(&tail);
        let _ = inspect_bytes(bytes);
    }

    #[test]
    fn flipped_bits_in_a_real_capture_never_panic(flips in proptest::collection::vec((0usize..8192, 0u8..8), 1..32)) {
        let mut bytes = tops16_head(8192);
        for (at, bit) in flips {
            let at = at % bytes.len();
            bytes[at] ^= 1 << bit;
        }
        let _ = inspect_bytes(bytes);
    }

    #[test]
    fn random_segments_never_panic(payload in proptest::collection::vec(any::<u8>(), 0..1500)) {
        if let Ok(segment) = Segment::parse(&payload) {
            let mut inspector = Inspector::new("random");
            inspector.segment(&segment, 0);
            let _ = inspector.finish();
        }
        for block in payload.chunks(7) {
            let _ = Message::parse(block);
        }
    }
}
