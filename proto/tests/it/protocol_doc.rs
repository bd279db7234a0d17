//! Keeps `docs/protocol.md` honest. Its hex examples (the bytes before each `#` of a ```` ```hex
//! NAME ```` block, captured from real runs) are read with this crate's parsers and codecs and
//! checked against the rules the page states; every record tag, datagram kind, protection bit and
//! format id the code knows must have its row in the page's tables, and every row there must be
//! one the code knows; the limits table must give the code's constants. The protected examples
//! are opened twice: by [`Protector`], and by hand from the page's description (HKDF salt and
//! info, nonce layout, key check), so the description is checked, not only the code.

use aes_gcm::aead::consts::U12;
use aes_gcm::aead::{AeadInPlace, KeyInit};
use aes_gcm::{Aes256Gcm, Tag};
use mdrelay_codec::FormatCodec;
use mdrelay_codec::{self as codec, BatchHeader, Codec, Format, Limits};
use mdrelay_harness::{iex_data, reference_output};
use mdrelay_iex::message::{Message, Trade};
use mdrelay_proto::relay::protect::{CRC_LEN, KEY_CHECK_LEN, TAG_LEN};
use mdrelay_proto::relay::window::WINDOW;
use mdrelay_proto::relay::{
    DatagramHeader, DatagramKind, Echo, Hello, MAX_DATAGRAM, MAX_RECORD, Protection, Protector, Purpose, RecordHeader,
    RecordTag, Resume, RetransmitRequest, Subscribe, Totals, WireKey,
};
use std::collections::{BTreeMap, BTreeSet};

/// The capture the examples were recorded from: one IEX-TP segment holding one trade.
const EXAMPLE_CAPTURE: &str = "packets/Deep.IexTp.v1.0__TradeReportMessage.T.pcap";

/// The page, read from the tree.
fn doc() -> String {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/protocol.md");
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// Every ```` ```hex NAME ```` block of `doc`: its bytes, by name. Panics on anything in a block
/// that is not a two-digit hex byte before a `#`, naming the line.
fn hex_blocks(doc: &str) -> BTreeMap<String, Vec<u8>> {
    let mut blocks = BTreeMap::new();
    let mut current: Option<(String, Vec<u8>)> = None;
    for (number, line) in doc.lines().enumerate() {
        let number = number + 1;
        if let Some(name) = line.strip_prefix("```hex ") {
            assert!(current.is_none(), "protocol.md:{number}: a hex block opens inside another");
            current = Some((name.trim().to_string(), Vec::new()));
            continue;
        }
        let Some((name, bytes)) = current.as_mut() else { continue };
        if line.trim() == "```" {
            assert!(!bytes.is_empty(), "protocol.md:{number}: hex block {name} is empty");
            let (name, bytes) = current.take().expect("inside a block");
            assert!(blocks.insert(name.clone(), bytes).is_none(), "protocol.md: two hex blocks named {name}");
            continue;
        }
        let data = line.split('#').next().unwrap_or_default();
        for token in data.split_whitespace() {
            let byte = (token.len() == 2).then(|| u8::from_str_radix(token, 16).ok()).flatten();
            bytes.push(
                byte.unwrap_or_else(|| panic!("protocol.md:{number}: {token:?} in block {name} is not a hex byte")),
            );
        }
    }
    assert!(current.is_none(), "protocol.md: a hex block is not closed");
    blocks
}

/// The example `name`; panics naming it when the page has none.
fn block<'a>(blocks: &'a BTreeMap<String, Vec<u8>>, name: &str) -> &'a [u8] {
    blocks.get(name).unwrap_or_else(|| panic!("protocol.md has no hex block {name}"))
}

/// The rows of the first table after the line `heading`, each a list of its cells (trimmed, with
/// backticks removed), without the header and separator rows.
fn table_after(doc: &str, heading: &str) -> Vec<Vec<String>> {
    let mut lines = doc.lines().skip_while(|l| l.trim() != heading);
    assert!(lines.next().is_some(), "protocol.md has no heading {heading:?}");
    let rows: Vec<Vec<String>> = lines
        .skip_while(|l| !l.starts_with('|'))
        .take_while(|l| l.starts_with('|'))
        .skip(2)
        .map(|l| l.trim().trim_matches('|').split('|').map(|c| c.trim().replace('`', "")).collect())
        .collect();
    assert!(!rows.is_empty(), "protocol.md: no table rows after {heading:?}");
    rows
}

/// The (number, name) pairs of a table whose first two columns are a number and a name.
fn numbered_names(doc: &str, heading: &str) -> BTreeSet<(u8, String)> {
    table_after(doc, heading)
        .into_iter()
        .map(|row| {
            let value = row[0].parse().unwrap_or_else(|_| panic!("{heading}: {:?} is not a number", row[0]));
            (value, row[1].clone())
        })
        .collect()
}

/// Every record tag the code reads, found by asking the parser about every tag byte.
fn record_tags() -> BTreeSet<(u8, String)> {
    (0..=u8::MAX)
        .filter_map(|byte| {
            let mut header = [0u8; RecordHeader::LEN];
            header[0] = byte;
            let tag = RecordHeader::parse(&header, 0).ok()?.tag;
            assert_eq!(tag as u8, byte, "tag {tag:?} is read from its own number");
            Some((byte, format!("{tag:?}").to_uppercase()))
        })
        .collect()
}

/// Every datagram kind the code reads, found by asking the parser about every kind nibble.
fn datagram_kinds() -> BTreeSet<(u8, String)> {
    (0..16u8)
        .filter_map(|nibble| {
            let mut header = [0u8; DatagramHeader::LEN];
            header[..4].copy_from_slice(b"MDRU");
            header[4] = 1;
            header[6] = nibble;
            let kind = DatagramHeader::parse(&header).ok()?.kind;
            assert_eq!(kind as u8, nibble, "kind {kind:?} is read from its own number");
            Some((nibble, format!("{kind:?}").to_uppercase()))
        })
        .collect()
}

#[test]
fn every_record_tag_datagram_kind_protection_bit_and_format_id_has_its_row() {
    let doc = doc();
    let tags = record_tags();
    assert!(tags.contains(&(1, "DATA".to_string())), "the parser reads tag 1 as DATA: {tags:?}");
    assert_eq!(numbered_names(&doc, "### Record tags"), tags, "protocol.md's record tags against the code's");
    assert_eq!(numbered_names(&doc, "### Datagram kinds"), datagram_kinds(), "protocol.md's datagram kinds");
    let formats: BTreeSet<(u8, String)> =
        (0..=u8::MAX).filter_map(Format::from_id).map(|f| (f.id(), f.name().to_string())).collect();
    assert_eq!(formats.len(), Format::ALL.len());
    assert_eq!(numbered_names(&doc, "### Format ids"), formats, "protocol.md's format ids against the code's");
    // Protection: bit, value, name; each single bit the code accepts, and nothing else.
    let bits: BTreeSet<(u8, String)> = (0..8u8)
        .filter(|bit| Protection::from_bits(1 << bit).is_some())
        .map(|bit| {
            let p = Protection::from_bits(1 << bit).expect("accepted");
            (1 << bit, if p.crc { "crc" } else { "encrypted" }.to_string())
        })
        .collect();
    let documented: BTreeSet<(u8, String)> = table_after(&doc, "### Protection bits")
        .into_iter()
        .map(|row| {
            let bit: u8 = row[0].parse().expect("a bit number");
            let value: u8 = row[1].parse().expect("a value");
            assert_eq!(value, 1 << bit, "protection bit {bit}'s value");
            (value, row[2].clone())
        })
        .collect();
    assert_eq!(documented, bits, "protocol.md's protection bits against the code's");
    assert_eq!(Protection::from_bits(3), Some(Protection { crc: true, encrypted: true }));
}

#[test]
fn the_limits_table_gives_the_codes_constants() {
    let doc = doc();
    let documented: BTreeMap<String, String> =
        table_after(&doc, "## Limits").into_iter().map(|row| (row[0].clone(), row[1].clone())).collect();
    let numbers: BTreeMap<&str, u64> = [
        ("Hello::LEN", Hello::LEN as u64),
        ("Subscribe::LEN", Subscribe::LEN as u64),
        ("Subscribe::V2_LEN", Subscribe::V2_LEN as u64),
        ("RecordHeader::LEN", RecordHeader::LEN as u64),
        ("DatagramHeader::LEN", DatagramHeader::LEN as u64),
        ("DatagramHeader::WIDE_LEN", DatagramHeader::WIDE_LEN as u64),
        ("Echo::LEN", Echo::LEN as u64),
        ("RetransmitRequest::PAYLOAD", RetransmitRequest::PAYLOAD as u64),
        ("MAX_RECORD", MAX_RECORD as u64),
        ("MAX_DATAGRAM", MAX_DATAGRAM as u64),
        ("MAX_REASON", mdrelay_proto::relay::wire::MAX_REASON as u64),
        ("DEFAULT_MAX_FRAME", codec::DEFAULT_MAX_FRAME as u64),
        ("MAX_BATCH", codec::MAX_BATCH as u64),
        ("WINDOW", WINDOW),
        ("KEY_CHECK_LEN", KEY_CHECK_LEN as u64),
        ("TAG_LEN", TAG_LEN as u64),
        ("CRC_LEN", CRC_LEN as u64),
    ]
    .into_iter()
    .collect();
    // Numbers as they are; times in seconds, as the table writes them.
    let mut code: BTreeMap<&str, String> = numbers.into_iter().map(|(name, n)| (name, n.to_string())).collect();
    let catch_up = mdrelay_proto::relay::client::CATCH_UP_INTERVAL;
    code.insert("CATCH_UP_INTERVAL", format!("{} s", catch_up.as_secs_f64()));
    for (name, value) in &code {
        let row = documented.get(*name).unwrap_or_else(|| panic!("protocol.md's limits table has no {name}"));
        assert_eq!(row, value, "protocol.md gives {name} as {row}; the code has {value}");
    }
    for name in documented.keys() {
        assert!(
            code.contains_key(name.as_str()),
            "protocol.md's limits table names {name}, which this test does not check"
        );
    }
}

/// A record: its header, and its payload (exactly `length` bytes, nothing after them).
fn record(bytes: &[u8], name: &str) -> (RecordHeader, Vec<u8>) {
    let header = RecordHeader::parse(bytes, MAX_RECORD).unwrap_or_else(|e| panic!("{name}: {e}"));
    assert_eq!(header.to_bytes(), bytes[..RecordHeader::LEN], "{name}: the header as the code writes it");
    let payload = &bytes[RecordHeader::LEN..];
    assert_eq!(payload.len(), header.length as usize, "{name}: the payload is `length` bytes");
    (header, payload.to_vec())
}

/// A datagram: its header, written as the code writes it, and its payload.
fn datagram(bytes: &[u8], name: &str) -> (DatagramHeader, Vec<u8>) {
    let header = DatagramHeader::parse(bytes).unwrap_or_else(|e| panic!("{name}: {e}"));
    assert_eq!(header.to_bytes(), bytes[..DatagramHeader::LEN], "{name}: the header as the code writes it");
    (header, bytes[DatagramHeader::LEN..].to_vec())
}

/// The frames of a payload of `count` plain frames of `format`: each delimited by the format's
/// framing and decoded; the payload holds exactly those frames.
fn frames(format: Format, payload: &[u8], count: usize, name: &str) -> Vec<(BatchHeader, Vec<Trade>)> {
    let mut codec = Codec::new(format, Limits::default());
    let mut rest = payload;
    let mut out = Vec::new();
    for i in 0..count {
        let len = codec.frame_len(rest).unwrap_or_else(|e| panic!("{name}: frame {i}: {e}"));
        let len = len.unwrap_or_else(|| panic!("{name}: frame {i} is cut short"));
        let mut trades = Vec::new();
        let batch = codec
            .decode(&rest[..len], |m| match m {
                Message::TradeReport(t) => trades.push(*t),
                other => panic!("{name}: the example holds trades only, not {other:?}"),
            })
            .unwrap_or_else(|e| panic!("{name}: frame {i}: {e}"));
        assert_eq!(batch.message_count as usize, trades.len(), "{name}: frame {i}'s message count");
        out.push((batch, trades));
        rest = &rest[len..];
    }
    assert!(rest.is_empty(), "{name}: {} bytes after the declared frames", rest.len());
    out
}

/// The independent reference reader's figures for the example capture: the trades' symbol,
/// volume and prices, and the messages by type.
struct Reference {
    symbol: String,
    volume: u64,
    high: i64,
    low: i64,
    types: BTreeMap<u8, u64>,
    segments: u64,
}

fn reference() -> Reference {
    let r = reference_output(&iex_data().join(EXAMPLE_CAPTURE));
    let symbols = r["symbols"].as_object().expect("symbols");
    assert_eq!(symbols.len(), 1, "the example capture trades one symbol");
    let (symbol, figures) = symbols.iter().next().expect("one symbol");
    let types = r["message_types"]
        .as_object()
        .expect("message types")
        .iter()
        .map(|(k, v)| (k.as_bytes()[0], v.as_u64().expect("a count")))
        .collect();
    Reference {
        symbol: symbol.clone(),
        volume: figures["trade_volume"].as_u64().expect("volume"),
        high: figures["trade_high"].as_i64().expect("high"),
        low: figures["trade_low"].as_i64().expect("low"),
        types,
        segments: r["segments"].as_u64().expect("segments"),
    }
}

/// Asserts `trades` are the example capture's, `passes` times over, as the reference reads it.
fn assert_reference_trades(trades: &[Trade], passes: u64, reference: &Reference, name: &str) {
    let volume: u64 = trades.iter().map(|t| u64::from(t.size)).sum();
    assert_eq!(volume, reference.volume * passes, "{name}: traded volume");
    for t in trades {
        assert_eq!(t.symbol.to_string().trim_end(), reference.symbol, "{name}: symbol");
        assert!((reference.low..=reference.high).contains(&t.price.0), "{name}: price {}", t.price.0);
    }
}

/// Asserts END totals are the example capture's, `passes` times over.
fn assert_reference_totals(totals: &Totals, passes: u64, reference: &Reference, name: &str) {
    assert_eq!(totals.frames, reference.segments * passes, "{name}: frames");
    let types: BTreeMap<u8, u64> = reference.types.iter().map(|(&k, &v)| (k, v * passes)).collect();
    assert_eq!(totals.by_type, types, "{name}: messages by type");
    assert_eq!(totals.messages, types.values().sum::<u64>(), "{name}: messages");
}

#[test]
fn the_tcp_stream_example_reads_as_the_page_says() {
    let blocks = hex_blocks(&doc());
    let reference = reference();

    let bytes = block(&blocks, "greeting");
    let hello = Hello::parse(bytes).unwrap_or_else(|e| panic!("greeting: {e}"));
    assert_eq!(hello.to_bytes(), bytes, "greeting: as the code writes it (reserved bytes zero)");
    assert_eq!((hello.protocol_version, hello.schema_version), (2, 1));
    assert_eq!((hello.protection, hello.key_check), (Protection::NONE, [0; KEY_CHECK_LEN]));

    let bytes = block(&blocks, "answer");
    assert_eq!(bytes.len(), Subscribe::V2_LEN);
    assert_eq!(Subscribe::parse_version(&bytes[..Subscribe::LEN]), Ok(2), "the first 16 bytes give the length");
    let answer = Subscribe::parse(bytes).unwrap_or_else(|e| panic!("answer: {e}"));
    assert_eq!(answer.to_bytes(), bytes, "answer: as the code writes it");
    assert!(answer.echo && answer.purpose == Purpose::Stream && answer.resume == Resume::Live, "{answer:?}");

    let (format, payload) = record(block(&blocks, "format-record"), "format-record");
    assert_eq!((format.tag, format.frame_count, payload.len()), (RecordTag::Format, 0, 0));
    assert_eq!(format.format, hello.format, "nothing switched between the greeting and the first record");

    let (data, payload) = record(block(&blocks, "data-record"), "data-record");
    assert_eq!(data.tag, RecordTag::Data);
    assert_eq!(data.format, format.format, "the FORMAT record names the format of the DATA records after it");
    assert_eq!(data.sequence, format.sequence, "the first DATA record starts at the frame FORMAT names");
    let decoded = frames(data.format, &payload, data.frame_count.into(), "data-record");
    let trades: Vec<Trade> = decoded.iter().flat_map(|(_, t)| t.clone()).collect();
    assert_reference_trades(&trades, 1, &reference, "data-record");

    let (end, payload) = record(block(&blocks, "end-record"), "end-record");
    assert_eq!(end.tag, RecordTag::End);
    assert_eq!(end.sequence, data.sequence + u64::from(data.frame_count), "END names the frame after the last");
    let totals = Totals::parse(&payload).unwrap_or_else(|e| panic!("end-record totals: {e}"));
    let mut written = Vec::new();
    totals.write(&mut written);
    assert_eq!(written, payload, "the totals as the code writes them");
    assert_reference_totals(&totals, 1, &reference, "end-record");

    let (echo_header, payload) = record(block(&blocks, "echo-record"), "echo-record");
    assert_eq!((echo_header.tag, payload.len()), (RecordTag::Echo, Echo::LEN));
    let echo = Echo::parse(&payload).unwrap_or_else(|e| panic!("echo-record: {e}"));
    assert_eq!(echo.sequence, echo_header.sequence, "the header carries the echoed frame's number");
    assert_eq!(echo.sequence, data.sequence);
    assert_eq!(echo.publish_time, decoded[0].0.publish_time, "the echo carries the frame's publish time");
}

#[test]
fn the_udp_examples_read_as_the_page_says() {
    let blocks = hex_blocks(&doc());
    let reference = reference();

    let (data, payload) = datagram(block(&blocks, "data-datagram"), "data-datagram");
    assert_eq!((data.kind, data.protection, data.version), (DatagramKind::Data, Protection::NONE, 1));
    let decoded = frames(data.format, &payload, data.frame_count as usize, "data-datagram");
    let trades: Vec<Trade> = decoded.iter().flat_map(|(_, t)| t.clone()).collect();
    assert_reference_trades(&trades, 1, &reference, "data-datagram");

    let (end, payload) = datagram(block(&blocks, "end-datagram"), "end-datagram");
    assert_eq!((end.kind, end.session, end.frame_count), (DatagramKind::End, data.session, 0));
    assert_eq!(end.sequence, data.sequence + u64::from(data.frame_count), "END names the frame after the last");
    assert_reference_totals(&Totals::parse(&payload).expect("end-datagram totals"), 1, &reference, "end-datagram");

    let (echo_header, payload) = datagram(block(&blocks, "echo-datagram"), "echo-datagram");
    assert_eq!((echo_header.kind, echo_header.session), (DatagramKind::Echo, data.session));
    assert_eq!(echo_header.protection, Protection::NONE, "echo datagrams are never protected");
    let echo = Echo::parse(&payload).expect("echo-datagram");
    assert_eq!((echo.sequence, echo_header.sequence), (data.sequence, data.sequence));
    assert_eq!(echo.publish_time, decoded[0].0.publish_time);
}

#[test]
fn the_recovery_example_reads_as_the_page_says() {
    let blocks = hex_blocks(&doc());
    let reference = reference();

    let hello = Hello::parse(block(&blocks, "recovery-greeting")).expect("recovery-greeting");
    let answer = Subscribe::parse(block(&blocks, "recovery-answer")).expect("recovery-answer");
    assert_eq!((answer.protocol_version, answer.purpose), (2, Purpose::Recovery));

    let (header, payload) = record(block(&blocks, "request-record"), "request-record");
    assert_eq!((header.tag, payload.len()), (RecordTag::Request, RetransmitRequest::PAYLOAD));
    let request = RetransmitRequest::parse(&header, &payload).expect("request-record");
    assert_eq!(request.to_record(), block(&blocks, "request-record"), "the request as the code writes it");
    assert!(request.first < hello.next_sequence, "a request is for frames the service has sent");

    let (data, payload) = record(block(&blocks, "retransmitted-record"), "retransmitted-record");
    assert_eq!(data.tag, RecordTag::Data);
    assert_eq!(data.sequence, request.first, "the answer starts at the frame asked for");
    assert!(u64::from(data.frame_count) <= u64::from(request.count), "no more frames than asked for");
    let decoded = frames(data.format, &payload, data.frame_count.into(), "retransmitted-record");
    let trades: Vec<Trade> = decoded.iter().flat_map(|(_, t)| t.clone()).collect();
    assert_reference_trades(&trades, 1, &reference, "retransmitted-record");
}

/// The session key of `session`, derived as protocol.md says: HKDF-SHA256 with its salt, the
/// pre-shared key as input and the session, 8 bytes little-endian, as info.
fn session_cipher(key: &[u8; 32], session: u64) -> Aes256Gcm {
    let mut session_key = [0u8; 32];
    hkdf::Hkdf::<sha2::Sha256>::new(Some(b"mdrelay wire protection v1"), key)
        .expand(&session.to_le_bytes(), &mut session_key)
        .expect("32 bytes are within HKDF's limit");
    Aes256Gcm::new(&session_key.into())
}

/// A nonce as protocol.md lays it out: the sequence (8 bytes, little-endian), the format id
/// (or 0xf0 for an END's totals), three zero bytes.
fn nonce(sequence: u64, domain: u8) -> aes_gcm::Nonce<U12> {
    let mut n = [0u8; 12];
    n[..8].copy_from_slice(&sequence.to_le_bytes());
    n[8] = domain;
    n.into()
}

/// Opens a sealed frame (length, body, GCM tag, CRC-32C) by hand, as protocol.md describes it.
fn open_by_hand(cipher: &Aes256Gcm, sequence: u64, domain: u8, sealed: &[u8], name: &str) -> Vec<u8> {
    let body_len = u32::from_le_bytes(sealed[..4].try_into().expect("4 bytes")) as usize;
    assert_eq!(sealed.len(), 4 + body_len + TAG_LEN + CRC_LEN, "{name}: length, body, tag and CRC");
    let (covered, crc) = sealed.split_at(sealed.len() - CRC_LEN);
    assert_eq!(crc32c::crc32c(covered).to_le_bytes(), crc, "{name}: the CRC-32C covers the length on");
    let mut body = covered[4..4 + body_len].to_vec();
    let tag = Tag::from_slice(&covered[4 + body_len..]);
    cipher
        .decrypt_in_place_detached(&nonce(sequence, domain), &[], &mut body, tag)
        .unwrap_or_else(|_| panic!("{name}: does not authenticate under the page's key, salt, info and nonce"));
    body
}

#[test]
fn the_protected_examples_open_as_the_page_says() {
    let doc = doc();
    for text in ["`mdrelay wire protection v1`", "`key check`", "`0xf0`", "twelve `0xff` bytes"] {
        assert!(doc.contains(text), "protocol.md names {text}, which this test uses");
    }
    let blocks = hex_blocks(&doc);
    let reference = reference();
    let key: [u8; 32] = block(&blocks, "example-key").try_into().expect("a 32-byte key");
    let both = Protection { crc: true, encrypted: true };

    let hello = Hello::parse(block(&blocks, "protected-greeting")).expect("protected-greeting");
    assert_eq!(hello.protection, both);
    let cipher = session_cipher(&key, hello.session);
    let tag = cipher.encrypt_in_place_detached(&[0xffu8; 12].into(), b"key check", &mut []).expect("an empty message");
    assert_eq!(hello.key_check, tag[..KEY_CHECK_LEN], "the key check, computed as the page says");
    let mut protector = Protector::new(true, Some(&WireKey::new(key)), codec::DEFAULT_MAX_FRAME);
    assert_eq!(protector.key_check(hello.session), hello.key_check, "the key check, computed by the code");

    let answer = Subscribe::parse(block(&blocks, "protected-answer")).expect("protected-answer");
    assert_eq!((answer.protection, answer.resume), (both, Resume::From(1)));
    let (format, _) = record(block(&blocks, "protected-format-record"), "protected-format-record");
    assert_eq!((format.tag, format.sequence), (RecordTag::Format, 1), "from the start: frame 1");

    let (data, payload) = record(block(&blocks, "protected-data-record"), "protected-data-record");
    assert_eq!((data.tag, data.frame_count, data.sequence), (RecordTag::Data, 1, format.sequence));
    let plain = open_by_hand(&cipher, data.sequence, data.format.id(), &payload, "protected-data-record");
    let mut scratch = Vec::new();
    let opened = protector.open(hello.session, data.sequence, data.format, &payload, &mut scratch).expect("opens");
    assert_eq!(opened, plain, "the code opens it to the same frame");
    let decoded = frames(data.format, &plain, 1, "protected-data-record");
    let trades: Vec<Trade> = decoded.iter().flat_map(|(_, t)| t.clone()).collect();
    assert_reference_trades(&trades, 1, &reference, "protected-data-record");

    let (end, payload) = record(block(&blocks, "protected-end-record"), "protected-end-record");
    assert_eq!((end.tag, end.sequence), (RecordTag::End, data.sequence + 1));
    let totals = Totals::parse(&payload).expect("the TCP END's totals are in the clear");
    assert_reference_totals(&totals, 1, &reference, "protected-end-record");

    let (dg, payload) = datagram(block(&blocks, "protected-data-datagram"), "protected-data-datagram");
    assert_eq!((dg.kind, dg.protection), (DatagramKind::Data, both));
    assert_eq!(block(&blocks, "protected-data-datagram")[6], 0x30, "kind 0, protection 3 in the high nibble");
    let cipher = session_cipher(&key, dg.session);
    let plain = open_by_hand(&cipher, dg.sequence, dg.format.id(), &payload, "protected-data-datagram");
    assert_eq!(protector.open(dg.session, dg.sequence, dg.format, &payload, &mut scratch).expect("opens"), plain);
    let decoded = frames(dg.format, &plain, 1, "protected-data-datagram");
    let trades: Vec<Trade> = decoded.iter().flat_map(|(_, t)| t.clone()).collect();
    assert_reference_trades(&trades, 1, &reference, "protected-data-datagram");
    assert!(
        protector.open(dg.session, dg.sequence + 1, dg.format, &payload, &mut scratch).is_err(),
        "another sequence number in the header fails authentication"
    );

    let (end, payload) = datagram(block(&blocks, "protected-end-datagram"), "protected-end-datagram");
    assert_eq!((end.kind, end.protection, end.session), (DatagramKind::End, both, dg.session));
    let plain = open_by_hand(&cipher, end.sequence, 0xf0, &payload, "protected-end-datagram");
    assert_eq!(protector.open_end(end.session, end.sequence, &payload, &mut scratch).expect("opens"), plain);
    assert_reference_totals(&Totals::parse(&plain).expect("sealed totals"), 1, &reference, "protected-end-datagram");
}

#[test]
fn every_example_is_checked() {
    let checked = [
        "greeting",
        "answer",
        "format-record",
        "data-record",
        "end-record",
        "echo-record",
        "data-datagram",
        "end-datagram",
        "echo-datagram",
        "recovery-greeting",
        "recovery-answer",
        "request-record",
        "retransmitted-record",
        "example-key",
        "protected-greeting",
        "protected-answer",
        "protected-format-record",
        "protected-data-record",
        "protected-end-record",
        "protected-data-datagram",
        "protected-end-datagram",
    ];
    let blocks = hex_blocks(&doc());
    let names: BTreeSet<&str> = blocks.keys().map(String::as_str).collect();
    assert_eq!(names, checked.into_iter().collect(), "protocol.md's hex blocks against those this file checks");
}

/// A heading's anchor as GitHub makes it: lower case, spaces to hyphens, punctuation dropped.
fn anchor(heading: &str) -> String {
    heading
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c.to_ascii_lowercase()),
            _ => None,
        })
        .collect()
}

/// The targets of the links `](FILE#anchor)` in `text` (`FILE` empty for links within it).
fn links_to<'a>(text: &'a str, file: &str) -> Vec<&'a str> {
    let opening = format!("]({file}#");
    text.match_indices(&opening)
        .map(|(at, _)| {
            let rest = &text[at + opening.len()..];
            &rest[..rest.find(')').expect("a link closes")]
        })
        .collect()
}

#[test]
fn links_into_the_page_name_its_headings() {
    let doc = doc();
    let anchors: BTreeSet<String> =
        doc.lines().filter_map(|l| l.strip_prefix('#')).map(|h| anchor(h.trim_start_matches('#').trim())).collect();
    let formats = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/formats.md");
    let formats = std::fs::read_to_string(formats).unwrap_or_else(|e| panic!("{formats}: {e}"));
    let links: Vec<(&str, &str)> = links_to(&doc, "")
        .into_iter()
        .map(|l| ("protocol.md", l))
        .chain(links_to(&formats, "protocol.md").into_iter().map(|l| ("formats.md", l)))
        .collect();
    assert!(links.len() > 10, "the pages link into protocol.md: {links:?}");
    for (from, target) in links {
        assert!(anchors.contains(target), "{from} links to protocol.md#{target}, which is no heading there");
    }
    assert!(doc.contains("](formats.md)"), "protocol.md links to formats.md");
}
