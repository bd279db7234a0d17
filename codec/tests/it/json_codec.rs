//! The JSON codec on its own: property-tested round trips of every message type,
//! the real captures through it giving exactly the reference figures, framing on split reads and
//! against the limit, corrupt and hostile lines that give errors with offsets, never panics, and
//! what steady-state encode and decode allocate.

use mdrelay_codec::DecodeError;
use mdrelay_codec::FormatCodec;
use mdrelay_codec::json::JsonCodec;
use mdrelay_codec::{BatchHeader, Limits, MAX_BATCH, MessageScratch, collect_segment};
use mdrelay_harness::alloc::count_allocations;
use mdrelay_harness::{assert_aggregates, expected, iex_data};
use mdrelay_iex::iextp::Segment;
use mdrelay_iex::inspect::InspectReport;
use mdrelay_iex::message::*;
use mdrelay_iex::{Aggregator, Price, Symbol};
use proptest::prelude::*;

// Counts only the thread inside `count_allocations` (the test harness has threads of its own).
// The message strategies every format's tests share.
use crate::strategies::{header, messages, spec};

fn codec() -> JsonCodec {
    JsonCodec::new(Limits::default())
}

fn encode(header: &BatchHeader, messages: &[Message<'_>]) -> Vec<u8> {
    let mut out = Vec::new();
    codec().encode(header, messages, &mut out).unwrap();
    out
}

fn decode(frame: &[u8]) -> Result<(BatchHeader, Vec<String>), DecodeError> {
    let mut seen = Vec::new();
    let header = codec().decode(frame, |m| seen.push(format!("{m:?}")))?;
    Ok((header, seen))
}

fn round_trip(header: &BatchHeader, messages: &[Message<'_>]) -> (BatchHeader, Vec<String>) {
    let out = encode(header, messages);
    assert_eq!(codec().frame_len(&out).unwrap(), Some(out.len()), "the framer delimits exactly the frame");
    assert_eq!(out.iter().filter(|&&b| b == b'\n').count(), 1, "one line");
    decode(&out).unwrap_or_else(|e| panic!("{e}\n{}", String::from_utf8_lossy(&out)))
}

/// The error has an offset within the frame (or just past it) and says `what`.
fn refused(frame: &[u8], what: &str) -> DecodeError {
    let e = decode(frame).expect_err(what);
    assert!(e.offset <= frame.len(), "{e}: offset past the frame of {}", frame.len());
    assert!(e.what.contains(what), "{e} should say {what:?}");
    assert!(e.to_string().starts_with("json frame: "), "{e}");
    e
}

fn test_header() -> BatchHeader {
    BatchHeader {
        protocol_id: 0x8004,
        channel_id: 1,
        session_id: 2,
        first_sequence: 3,
        send_time: 4,
        publish_time: 5,
        message_count: 0,
    }
}

fn trade(n: i64) -> Message<'static> {
    Message::TradeReport(Trade {
        sale_condition: 0,
        timestamp: n,
        symbol: Symbol::new("ZIEXT").unwrap(),
        size: 100,
        price: Price(n),
        trade_id: n,
    })
}

/// A valid frame with the first message's `"field":value` text replaced by `with`.
fn edited(field: &str, with: &str) -> Vec<u8> {
    let text = String::from_utf8(encode(&test_header(), &[trade(1)])).unwrap();
    let start = text.find(&format!("\"{field}\":")).unwrap_or_else(|| panic!("{field} in {text}"));
    let end = start + text[start..].find([',', '}']).unwrap();
    format!("{}{with}{}", &text[..start], &text[end..]).into_bytes()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    #[test]
    fn every_message_type_round_trips(header in header(), specs in proptest::collection::vec(spec(), 0..40)) {
        let messages = messages(&specs);
        let want: Vec<String> = messages.iter().map(|m| format!("{m:?}")).collect();
        let (decoded, seen) = round_trip(&header, &messages);
        prop_assert_eq!(&seen, &want);
        prop_assert_eq!(decoded, BatchHeader { message_count: messages.len() as u32, ..header });
    }

    #[test]
    fn any_symbol_and_reason_bytes_round_trip(symbol in any::<[u8; 8]>(), reason in any::<[u8; 4]>(), status in any::<u8>()) {
        // Bytes outside ASCII, control bytes, quotes and backslashes, inner and leading spaces.
        let m = Message::TradingStatus(TradingStatus { status, timestamp: -1, symbol: Symbol(symbol), reason });
        let (_, seen) = round_trip(&test_header(), &[m]);
        prop_assert_eq!(seen, vec![format!("{m:?}")]);
    }

    #[test]
    fn corrupt_frames_are_errors_not_panics(header in header(), specs in proptest::collection::vec(spec(), 0..12), flips in proptest::collection::vec((any::<usize>(), 0u8..8), 1..8), cut in any::<usize>()) {
        let messages = messages(&specs);
        let frame = encode(&header, &messages);
        let mut flipped = frame.clone();
        for (at, bit) in &flips {
            let at = at % flipped.len();
            flipped[at] ^= 1 << bit;
        }
        let mut codec = codec();
        for bytes in [&flipped[..], &frame[..cut % (frame.len() + 1)]] {
            if let Ok(Some(len)) = codec.frame_len(bytes) {
                prop_assert!(len <= bytes.len());
                if let Err(e) = codec.decode(&bytes[..len], |_| {}) {
                    prop_assert!(e.offset <= len, "{}", e);
                }
            }
            if let Err(e) = codec.decode(bytes, |_| {}) {
                prop_assert!(e.offset <= bytes.len(), "{}", e);
            }
        }
    }

    #[test]
    fn random_bytes_are_errors_not_panics(bytes in proptest::collection::vec(any::<u8>(), 0..2048)) {
        let mut codec = codec();
        if let Ok(Some(len)) = codec.frame_len(&bytes) {
            prop_assert!(len <= bytes.len());
        }
        let mut visited = 0;
        if codec.decode(&bytes, |_| visited += 1).is_err() {
            prop_assert_eq!(visited, 0, "a bad frame visits nothing");
        }
    }

    #[test]
    fn random_json_like_text_is_errors_not_panics(text in "[{}\\[\\]\",:0-9a-z_ .eE+-]{0,400}") {
        let mut line = text.into_bytes();
        line.push(b'\n');
        let _ = codec().decode(&line, |_| {});
    }
}

#[test]
fn every_known_layout_round_trips() {
    for k in kind::ALL {
        let len = mdrelay_iex::message::layout_len(k).unwrap();
        // Bytes 0x80.. in symbols, reasons and flags too.
        let mut bytes: Vec<u8> = (0..len).map(|i| (i as u8).wrapping_mul(37).wrapping_add(200)).collect();
        bytes[0] = k;
        let message = Message::parse(&bytes).unwrap();
        let (_, seen) = round_trip(&test_header(), &[message]);
        assert_eq!(seen, [format!("{message:?}")], "type {}", k as char);
    }
}

#[test]
fn empty_and_largest_batches_round_trip() {
    let (decoded, seen) = round_trip(&test_header(), &[]);
    assert_eq!((decoded.message_count, seen.len(), decoded.first_sequence), (0, 0, 3));
    let batch = vec![trade(1); MAX_BATCH];
    let (decoded, seen) = round_trip(&test_header(), &batch);
    assert_eq!((decoded.message_count as usize, seen.len()), (MAX_BATCH, MAX_BATCH));
    let too_many = vec![trade(1); MAX_BATCH + 1];
    assert!(codec().encode(&test_header(), &too_many, &mut Vec::new()).is_err());
    // A hand-made line with one message more than a batch holds.
    let mut text = String::from_utf8(encode(&test_header(), &batch)).unwrap();
    let one = text[text.find("{\"type\"").unwrap()..text.find("}").unwrap() + 1].to_string();
    text.insert_str(text.len() - 3, &format!(",{one}"));
    refused(text.as_bytes(), "more than 65535 messages");
}

#[test]
fn framing_handles_split_and_merged_reads_and_refuses_long_lines() {
    let mut stream = Vec::new();
    let mut ends = Vec::new();
    let mut codec = codec();
    for n in 0..20 {
        let batch: Vec<_> = (0..n).map(trade).collect();
        codec.encode(&BatchHeader { first_sequence: n, ..test_header() }, &batch, &mut stream).unwrap();
        ends.push(stream.len());
    }
    let mut at = 0;
    for (i, end) in ends.iter().enumerate() {
        let len = codec.frame_len(&stream[at..]).unwrap().unwrap();
        assert_eq!(at + len, *end, "frame {i}");
        let mut count = 0;
        let h = codec.decode(&stream[at..at + len], |_| count += 1).unwrap();
        assert_eq!((h.first_sequence, count), (i as i64, i));
        at = *end;
    }
    let frame = &stream[ends[4]..ends[5]];
    for cut in 0..frame.len() {
        assert_eq!(codec.frame_len(&frame[..cut]).unwrap(), None, "cut at {cut}");
    }
    // A limit one byte short: refused once that many bytes have come without a newline.
    let small = JsonCodec::new(Limits { max_frame: frame.len() - 1, ..Limits::default() });
    let e = small.frame_len(frame).unwrap_err();
    assert_eq!(e.offset, frame.len() - 1, "{e}");
    assert_eq!(small.frame_len(&frame[..frame.len() - 2]).unwrap(), None);
    let mut small = small;
    assert!(small.decode(frame, |_| {}).unwrap_err().what.contains("exceeds"));
}

#[test]
fn a_100_mb_line_without_newline_is_refused_at_the_limit() {
    let line = vec![b' '; 100 << 20];
    let codec = codec();
    let max = Limits::default().max_frame;
    let e = codec.frame_len(&line).unwrap_err();
    assert_eq!(e.offset, max, "{e}");
    assert!(e.what.contains("no newline"), "{e}");
    // With the newline just inside the limit the line is a frame; just outside, it is not.
    let mut line = vec![b' '; max];
    line[max - 1] = b'\n';
    assert_eq!(codec.frame_len(&line).unwrap(), Some(max));
    line[max - 1] = b' ';
    line.push(b'\n');
    assert!(codec.frame_len(&line).is_err());
}

#[test]
fn hostile_lines_are_errors_with_offsets() {
    // Not JSON, cut short, empty, bytes after the object, no newline.
    refused(b"\n", "EOF");
    refused(b"garbage\n", "expected");
    let frame = encode(&test_header(), &[trade(1)]);
    refused(&frame[..frame.len() / 2], "does not end with a newline");
    let mut cut = frame[..frame.len() / 2].to_vec();
    cut.push(b'\n');
    refused(&cut, "EOF");
    let mut trailing = frame[..frame.len() - 1].to_vec();
    trailing.extend_from_slice(b" {}\n");
    let e = refused(&trailing, "trailing characters");
    assert_eq!(e.offset, frame.len() + 1, "{e}");
    let mut two = frame.clone();
    two.extend_from_slice(&frame);
    refused(&two, "after the frame's newline");
    refused(b"[]\n", "invalid type");
    // Deep nesting: where a value is expected, and where a string is.
    let deep = format!("{}\n", "[".repeat(100_000));
    refused(deep.as_bytes(), "invalid type");
    let e = refused(&edited("symbol", &format!("\"symbol\":{}", "[".repeat(100_000))), "invalid type");
    assert!(e.what.contains("symbol"), "{e}");
    let nested = format!("{{\"messages\":{}\n", "[".repeat(100_000));
    refused(nested.as_bytes(), "invalid type");
    // Numbers: too large for the field, for any integer, fractions, NaN-like tokens.
    let e = refused(&edited("sale_condition", "\"sale_condition\":256"), "256");
    let at = String::from_utf8(edited("sale_condition", "\"sale_condition\":256")).unwrap().find("256").unwrap();
    assert!(e.offset >= at && e.offset <= at + 3, "{e}: the value is at {at}");
    refused(&edited("size", "\"size\":-1"), "-1");
    refused(&edited("size", "\"size\":4294967296"), "4294967296");
    refused(&edited("price", "\"price\":9223372036854775808"), "9223372036854775808");
    refused(&edited("price", "\"price\":99999999999999999999999999999999"), "invalid type");
    refused(&edited("price", "\"price\":1e400"), "number out of range");
    refused(&edited("price", "\"price\":1.5"), "invalid type");
    refused(&edited("price", "\"price\":1e3"), "invalid type");
    for token in ["NaN", "Infinity", "-Infinity", "nan", "inf", "+1", "0x10", "01"] {
        let e = decode(&edited("price", &format!("\"price\":{token}"))).expect_err(token);
        assert!(e.offset > 0, "{token}: {e}");
    }
    refused(&edited("price", "\"price\":\"1.0000\""), "invalid type");
    refused(&edited("price", "\"price\":null"), "invalid type");
    // Symbols: too long, not one byte per character, not a string.
    refused(&edited("symbol", "\"symbol\":\"ABCDEFGHI\""), "longer than 8");
    refused(&edited("symbol", "\"symbol\":\"\u{20ac}\""), "not one byte");
    refused(&edited("symbol", "\"symbol\":42"), "invalid type");
    // Types, fields: unknown, missing, duplicated, belonging to another type.
    refused(&edited("type", "\"type\":\"trade\""), "unknown variant `trade`");
    refused(&edited("trade_id", "\"bogus\":1"), "unknown field `bogus`");
    refused(&edited("trade_id", "\"size\":1"), "duplicate field `size`");
    refused(&edited("trade_id", "\"luld_tier\":1"), "field `luld_tier` does not belong to it");
    refused(&edited("trade_id", "\"kind\":1"), "does not belong");
    let text = String::from_utf8(edited("type", "")).unwrap().replace("{,", "{");
    refused(text.as_bytes(), "missing field `type`");
    let text = String::from_utf8(edited("trade_id", "")).unwrap().replace(",}", "}");
    refused(text.as_bytes(), "missing field `trade_id`");
    let text = String::from_utf8(encode(&test_header(), &[])).unwrap();
    refused(text.replace("\"channel_id\":1,", "").as_bytes(), "missing field `channel_id`");
    refused(text.replace("\"channel_id\":1,", "\"message_count\":0,").as_bytes(), "unknown field `message_count`");
    refused(text.replace("\"protocol_id\":32772", "\"protocol_id\":65536").as_bytes(), "65536");
    // Unknown messages: bad hex, mismatched type byte, a known type byte.
    let unknown = |kind: &str, bytes: &str| {
        text.replace("[]", &format!("[{{\"type\":\"unknown\",\"kind\":{kind},\"bytes\":\"{bytes}\"}}]")).into_bytes()
    };
    assert!(decode(&unknown("122", "7a00")).is_ok());
    refused(&unknown("122", "7a0"), "odd number");
    refused(&unknown("122", "7azz"), "not a hex digit");
    refused(&unknown("122", ""), "no bytes");
    refused(&unknown("122", "7b"), "do not start with its type byte");
    refused(&unknown("84", "54"), "known type");
    refused(&unknown("122", &format!("7a{}", "00".repeat(65535))), "exceed 65535");
}

#[test]
fn escaped_keys_and_strings_are_read() {
    let text = String::from_utf8(encode(&test_header(), &[trade(1)])).unwrap();
    let escaped = text.replace("\"symbol\":\"ZIEXT\"", "\"sym\\u0062ol\":\"Z\\u0049EXT\"");
    let escaped = escaped.replace("\"trade_report\"", "\"trade\\u005freport\"");
    assert_eq!(decode(escaped.as_bytes()).unwrap(), decode(text.as_bytes()).unwrap());
    // Whitespace between tokens and keys in any order are JSON too.
    let spaced = text
        .replace(',', " ,\t")
        .replace("{\"protocol_id\":32772 ,\t", "{")
        .replace("]}", "], \"protocol_id\": 32772}");
    assert_eq!(decode(spaced.as_bytes()).unwrap(), decode(text.as_bytes()).unwrap());
}

/// Each capture's segments through JSON, decoded and aggregated as a subscriber does; with the
/// messages counted by type, and the encoded bytes and timings.
#[test]
fn the_real_captures_through_json_give_the_reference_figures() {
    for (capture, reference) in [("DEEP10.pcap.gz", "DEEP10.json"), ("TOPS16.pcap.gz", "TOPS16.json")] {
        let reference = expected(reference);
        let (aggregator, types) =
            crate::formats::through_format(&iex_data().join(capture), mdrelay_codec::Format::Json);
        let report = InspectReport {
            total_trade_volume: aggregator.total_trade_volume(),
            symbols: aggregator.active(),
            symbols_with_trades_or_quotes: aggregator.active().len() as u64,
            ..InspectReport::default()
        };
        assert_aggregates(&serde_json::to_value(&report).unwrap(), &reference, capture);
        assert_eq!(serde_json::json!(types), reference["message_types"], "{capture}");
        assert_eq!(types.values().sum::<u64>(), reference["messages"].as_u64().unwrap(), "{capture}");
    }
}

/// Encodes every segment into `frames` (cleared first); returns the messages encoded.
fn encode_all(codec: &mut JsonCodec, scratch: &mut MessageScratch, payloads: &[Vec<u8>], frames: &mut Vec<u8>) -> u64 {
    frames.clear();
    let mut messages = 0;
    for payload in payloads {
        let Ok(segment) = Segment::parse(payload) else { continue };
        scratch.with(|list| {
            collect_segment(&segment, list);
            messages += list.len() as u64;
            let header = BatchHeader { publish_time: 1, ..BatchHeader::from_segment(&segment.header) };
            codec.encode(&header, list, frames).expect("encodes");
        });
    }
    messages
}

/// Frames and decodes every frame in `frames`; returns the messages decoded.
fn decode_all(codec: &mut JsonCodec, frames: &[u8], aggregator: &mut Aggregator) -> u64 {
    let mut messages = 0;
    let mut at = 0;
    while at < frames.len() {
        let len = codec.frame_len(&frames[at..]).expect("frames").expect("complete");
        codec
            .decode(&frames[at..at + len], |m| {
                messages += 1;
                aggregator.apply(m);
            })
            .expect("decodes");
        at += len;
    }
    messages
}

/// Steady state over DEEP10: encoding allocates nothing; decoding allocates nothing either —
/// serde_json borrows keys and strings from the frame (its scratch is used only for strings with
/// escapes, which this encoder writes only for control or non-ASCII bytes in symbols), and the
/// codec's message list and hex scratch are reused. Also prints the cost per message (meaningful
/// with `--release`).
#[test]
fn steady_state_allocations_and_cost_per_message() {
    let payloads = crate::udp_payloads();
    let mut codec = codec();
    let mut scratch = MessageScratch::new();
    let mut frames = Vec::new();
    let mut aggregator = Aggregator::new();
    let warm = encode_all(&mut codec, &mut scratch, &payloads, &mut frames);
    assert_eq!(decode_all(&mut codec, &frames, &mut aggregator), warm);

    let start = std::time::Instant::now();
    let (encoded, enc_allocs) = count_allocations(|| encode_all(&mut codec, &mut scratch, &payloads, &mut frames));
    let encode_time = start.elapsed();
    let start = std::time::Instant::now();
    let (decoded, dec_allocs) = count_allocations(|| decode_all(&mut codec, &frames, &mut aggregator));
    let decode_time = start.elapsed();
    assert_eq!((encoded, decoded), (warm, warm));
    eprintln!(
        "json over DEEP10: {warm} messages, {} bytes ({:.1} per message); encode {:.0} ns/message, \
         frame+decode+aggregate {:.0} ns/message; allocations: encode {enc_allocs:?}, decode {dec_allocs:?}",
        frames.len(),
        frames.len() as f64 / warm as f64,
        encode_time.as_nanos() as f64 / warm as f64,
        decode_time.as_nanos() as f64 / warm as f64,
    );
    assert_eq!(enc_allocs.count, 0, "encode: {enc_allocs:?}");
    assert_eq!(dec_allocs.count, 0, "decode: {dec_allocs:?}");
}
