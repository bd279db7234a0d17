//! Fuzz target bodies: one function per target, each taking arbitrary bytes.
//!
//! Every body must return normally on any input: a panic, a hang or a wild allocation is a bug in
//! the code under test (or a broken invariant asserted here). `fuzz/libfuzzer` runs them under
//! libFuzzer on nightly; `tests/replay.rs` runs the committed corpus and crash inputs through the
//! same functions on stable, so a regression fails the ordinary test suite.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

use mdrelay_codec::{BatchHeader, Codec, Format, FormatCodec, Limits, SymbolFilter, fbs};
use mdrelay_iex::capture::CaptureReader;
use mdrelay_iex::iextp::{HEADER_LEN, Segment};
use mdrelay_iex::link;
use mdrelay_iex::message::{Message, UnknownMessage};
use mdrelay_proto::relay::{
    DatagramHeader, Echo, FrameRing, GapList, Hello, MAX_RECORD, RecordHeader, RecoveryPolicy, RetransmitRequest,
    Subscribe, Totals, parse_gone,
};
use std::path::Path;

/// A fuzz target's body.
pub type Target = fn(&[u8]);

/// Every target, by the name of its `fuzz/libfuzzer/fuzz_targets/<name>.rs` and of its corpus
/// and artifacts directories.
pub const TARGETS: &[(&str, Target)] = &[
    ("raw", raw),
    ("sbe", sbe),
    ("flatbuffers", flatbuffers),
    ("capnp", capnp),
    ("capnp_packed", capnp_packed),
    ("protobuf", protobuf),
    ("brec", brec),
    ("relay_record_header", relay_record_header),
    ("relay_datagram_header", relay_datagram_header),
    ("relay_hello", relay_hello),
    ("relay_subscribe", relay_subscribe),
    ("relay_echo", relay_echo),
    ("relay_totals", relay_totals),
    ("relay_recovery", relay_recovery),
    ("capture", capture),
    ("iextp", iextp),
    ("message", message),
    ("publisher_config", publisher_config),
    ("subscriber_config", subscriber_config),
];

/// The target called `name`.
pub fn target(name: &str) -> Option<Target> {
    TARGETS.iter().find(|(n, _)| *n == name).map(|(_, f)| *f)
}

/// A decoded message that owns its bytes, so messages can outlive the frame they came from and be
/// compared after re-encoding.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Owned {
    Known(Message<'static>),
    Unknown(u8, Vec<u8>),
}

impl Owned {
    fn new(message: &Message<'_>) -> Owned {
        match *message {
            Message::Unknown(UnknownMessage { kind, bytes }) => Owned::Unknown(kind, bytes.to_vec()),
            Message::SystemEvent(m) => Owned::Known(Message::SystemEvent(m)),
            Message::SecurityDirectory(m) => Owned::Known(Message::SecurityDirectory(m)),
            Message::TradingStatus(m) => Owned::Known(Message::TradingStatus(m)),
            Message::RetailLiquidityIndicator(m) => Owned::Known(Message::RetailLiquidityIndicator(m)),
            Message::OperationalHaltStatus(m) => Owned::Known(Message::OperationalHaltStatus(m)),
            Message::ShortSalePriceTestStatus(m) => Owned::Known(Message::ShortSalePriceTestStatus(m)),
            Message::SecurityEvent(m) => Owned::Known(Message::SecurityEvent(m)),
            Message::PriceLevelUpdate(m) => Owned::Known(Message::PriceLevelUpdate(m)),
            Message::QuoteUpdate(m) => Owned::Known(Message::QuoteUpdate(m)),
            Message::TradeReport(m) => Owned::Known(Message::TradeReport(m)),
            Message::TradeBreak(m) => Owned::Known(Message::TradeBreak(m)),
            Message::OfficialPrice(m) => Owned::Known(Message::OfficialPrice(m)),
            Message::AuctionInformation(m) => Owned::Known(Message::AuctionInformation(m)),
        }
    }

    fn borrow(&self) -> Message<'_> {
        match self {
            Owned::Known(m) => *m,
            Owned::Unknown(kind, bytes) => Message::Unknown(UnknownMessage { kind: *kind, bytes }),
        }
    }
}

/// Decodes `frame`, collecting its messages; `None` when the frame is refused.
fn decode_owned(codec: &mut Codec, frame: &[u8]) -> Option<(BatchHeader, Vec<Owned>)> {
    let mut messages = Vec::new();
    let header = codec.decode(frame, |m| messages.push(Owned::new(m))).ok()?;
    Some((header, messages))
}

/// Frames whose decoded messages are re-encoded and decoded again. Bounded so a large input's
/// batch does not slow every execution down; what a frame of this size exercises, a larger one
/// does not do differently.
const MAX_ROUND_TRIP_MESSAGES: usize = 4096;

/// Delimits and decodes `data` with `codec`, checking the framing contract of [`Codec`]:
/// `frame_len` never claims more bytes than it was given, nor an empty frame (a reader would spin
/// on it), and it delimits the same frame from exactly its own bytes; a decoded frame re-encodes
/// to one that decodes to the same batch. The whole input is decoded too, whatever `frame_len`
/// said, since a reader may be handed any bytes as a frame (a datagram's payload, for one).
fn codec_body(codec: &mut Codec, data: &[u8]) {
    let format = codec.format();
    if let Ok(Some(len)) = codec.frame_len(data) {
        assert!(len <= data.len(), "{format}: frame_len {len} for {} bytes", data.len());
        assert!(len > 0, "{format}: frame_len delimited an empty frame");
        let frame = &data[..len];
        assert_eq!(codec.frame_len(frame), Ok(Some(len)), "{format}: frame_len depends on bytes after the frame");
        if let Some((header, messages)) = decode_owned(codec, frame) {
            round_trip(codec, &header, &messages);
        }
    }
    if let Some((header, messages)) = decode_owned(codec, data) {
        round_trip(codec, &header, &messages);
    }
    // As a stream reader would: frame after frame with one codec, so state kept between calls
    // (buffers, the packed frame cache) is exercised with different frames in turn.
    let mut rest = data;
    while let Ok(Some(len)) = codec.frame_len(rest) {
        assert!(len > 0 && len <= rest.len(), "{format}: frame_len {len} for {} bytes", rest.len());
        let _ = codec.decode(&rest[..len], |_| {});
        rest = &rest[len..];
    }
}

/// Re-encodes a decoded batch and checks that it decodes to the same header and messages.
fn round_trip(codec: &mut Codec, header: &BatchHeader, messages: &[Owned]) {
    if messages.len() > MAX_ROUND_TRIP_MESSAGES {
        return;
    }
    let format = codec.format();
    let borrowed: Vec<Message<'_>> = messages.iter().map(Owned::borrow).collect();
    let mut out = Vec::new();
    // A decoded batch may hold what this format cannot write back (see EncodeError); only what
    // encodes is checked.
    if codec.encode(header, &borrowed, &mut out).is_err() {
        return;
    }
    assert_eq!(codec.frame_len(&out), Ok(Some(out.len())), "{format}: an encoded frame does not delimit itself");
    let (again, decoded) = decode_owned(codec, &out)
        .unwrap_or_else(|| panic!("{format}: a re-encoded frame does not decode: {:?}", codec.decode(&out, |_| {})));
    assert_eq!(decoded, messages, "{format}: messages changed through re-encoding");
    let expected = BatchHeader { message_count: messages.len() as u32, ..*header };
    assert_eq!(again, expected, "{format}: batch header changed through re-encoding");
}

/// Raw IEX-TP frames: `frame_len` and `decode`.
pub fn raw(data: &[u8]) {
    codec_body(&mut Codec::new(Format::Raw, Limits::default()), data);
}

/// SBE frames: `frame_len` and `decode`.
pub fn sbe(data: &[u8]) {
    codec_body(&mut Codec::new(Format::Sbe, Limits::default()), data);
}

/// FlatBuffers frames: `frame_len` and `decode`, in each of the decoder's three modes (own
/// navigation, the library verifier first, trusted).
pub fn flatbuffers(data: &[u8]) {
    let limits = Limits::default();
    codec_body(&mut Codec::new(Format::FlatBuffers, limits), data);
    codec_body(&mut Codec::FlatBuffers(Box::new(fbs::FlatBuffersCodec::with_library_verifier(limits))), data);
    let trusted = Limits { trust_flatbuffers: true, ..limits };
    codec_body(&mut Codec::new(Format::FlatBuffers, trusted), data);
}

/// Cap'n Proto frames: `frame_len` and `decode`.
pub fn capnp(data: &[u8]) {
    codec_body(&mut Codec::new(Format::Capnp, Limits::default()), data);
}

/// Packed Cap'n Proto frames: `frame_len` and `decode`.
pub fn capnp_packed(data: &[u8]) {
    codec_body(&mut Codec::new(Format::CapnpPacked, Limits::default()), data);
}

/// Protobuf frames: `frame_len` and `decode`.
pub fn protobuf(data: &[u8]) {
    codec_body(&mut Codec::new(Format::Protobuf, Limits::default()), data);
}

/// brec frames: `frame_len` and `decode`, then `decode_filtered`, which reads blocks and records
/// by their symbol without building the messages it skips: it must fail exactly when `decode`
/// does, and visit exactly the messages of `decode` that the filter holds, skipping the others.
pub fn brec(data: &[u8]) {
    let mut codec = Codec::new(Format::Brec, Limits::default());
    codec_body(&mut codec, data);
    let Ok(Some(len)) = codec.frame_len(data) else { return };
    let frame = &data[..len];
    let Some((header, messages)) = decode_owned(&mut codec, frame) else {
        assert!(
            codec.decode_filtered(frame, &SymbolFilter::default(), |_| {}, |_| {}).is_err(),
            "brec: filtered decode of a bad frame"
        );
        return;
    };
    // The first symbol seen, so the filter holds something the frame has.
    let symbol = messages.iter().find_map(|m| m.borrow().symbol());
    let filter = SymbolFilter::new(symbol);
    let want: Vec<&Owned> = messages.iter().filter(|m| filter.matches_message(&m.borrow())).collect();
    let skip_want: Vec<u8> =
        messages.iter().filter(|m| !filter.matches_message(&m.borrow())).map(|m| m.borrow().kind()).collect();
    let (mut visited, mut skipped) = (Vec::new(), Vec::new());
    let filtered = codec.decode_filtered(frame, &filter, |m| visited.push(Owned::new(m)), |k| skipped.push(k));
    assert_eq!(filtered, Ok(header), "brec: filtered decode of a good frame");
    assert_eq!(visited.iter().collect::<Vec<_>>(), want, "brec: filtered messages");
    assert_eq!(skipped, skip_want, "brec: skipped type bytes");
}

/// The TCP record header: every byte is a field, so a parsed header writes back its input.
pub fn relay_record_header(data: &[u8]) {
    // The real limit, and one taken from the input so small limits are exercised too.
    let small = data.get(16..20).map_or(0, |b| u32::from_le_bytes(b.try_into().expect("4 bytes")) as usize);
    for max in [MAX_RECORD, small] {
        if let Ok(header) = RecordHeader::parse(data, max) {
            assert!(header.length as usize <= max, "record length {} over the limit {max}", header.length);
            assert_eq!(header.to_bytes()[..], data[..RecordHeader::LEN]);
            assert_eq!(RecordHeader::parse(&header.to_bytes(), max), Ok(header));
        }
    }
}

/// The datagram header: every byte is a field, so a parsed header writes back its input.
pub fn relay_datagram_header(data: &[u8]) {
    let relay = DatagramHeader::is_relay_datagram(data);
    if let Ok(header) = DatagramHeader::parse(data) {
        assert!(relay, "a datagram header parsed from bytes without the magic");
        assert_eq!(header.to_bytes()[..], data[..header.len_on_wire()]);
        assert_eq!(DatagramHeader::parse(&header.to_bytes()), Ok(header));
        // As a receiver reads it: no more frames than the payload has bytes.
        let bounded = DatagramHeader::parse_datagram(data).expect("the same bytes parse");
        assert!(bounded.frame_count as usize <= data.len() - header.len_on_wire());
        assert_eq!(DatagramHeader { frame_count: header.frame_count, ..bounded }, header);
    }
}

/// The publisher's greeting (its padding bytes are not kept, so only the fields round-trip).
pub fn relay_hello(data: &[u8]) {
    if let Ok(hello) = Hello::parse(data) {
        assert_eq!(Hello::parse(&hello.to_bytes()), Ok(hello));
    }
}

/// The subscriber's answer (only the echo flag's low bit is kept, so only the fields round-trip).
pub fn relay_subscribe(data: &[u8]) {
    if let Ok(subscribe) = Subscribe::parse(data) {
        assert_eq!(Subscribe::parse(&subscribe.to_bytes()), Ok(subscribe));
    }
}

/// The recovery side: a retransmission request and a GONE answer as a client or the service
/// parses them, then the input as operations on the publisher's ring and the subscriber's gap
/// list, whose invariants must hold whatever the operations (a ring never over its bound, every
/// missing frame accounted for once).
pub fn relay_recovery(data: &[u8]) {
    if let Ok(header) = RecordHeader::parse(data, 64) {
        let payload = data.get(RecordHeader::LEN..).unwrap_or_default();
        if let Ok(request) = RetransmitRequest::parse(&header, payload) {
            let record = request.to_record();
            let reparsed = RecordHeader::parse(&record, 64).expect("a request's own header");
            assert_eq!(RetransmitRequest::parse(&reparsed, &record[RecordHeader::LEN..]), Ok(request));
        }
        let _ = parse_gone(payload);
    }
    let mut ring = FrameRing::new(data.first().map_or(64, |&b| usize::from(b) * 64 + 64));
    let mut gaps = GapList::new();
    let policy = RecoveryPolicy { delay_ns: 2, retry_ns: 3, attempts: 2, max_frames: 5 };
    let mut seq = 1u64;
    let mut opened_to = 0u64;
    for (now, op) in data.chunks(3).enumerate() {
        let now = now as i64;
        let [kind, a, b] = [op[0], op.get(1).copied().unwrap_or(0), op.get(2).copied().unwrap_or(0)];
        let (a, b) = (u64::from(a), u64::from(b));
        match kind % 6 {
            0 => {
                ring.push(seq, Format::Raw, &vec![kind; (a * 8) as usize]);
                seq += 1;
            }
            1 => {
                let lookup = ring.lookup(a, b);
                assert_eq!(lookup.gone + lookup.held + lookup.ahead, b, "{lookup:?} of {b} frames from {a}");
                let mut out = Vec::new();
                if let Some(next) = ring.copy_record(a, b.max(1), 256, &mut out) {
                    assert!(next > a && RecordHeader::parse(&out, usize::MAX).is_ok());
                }
            }
            2 => {
                let first = opened_to.max(a);
                gaps.open(first, first + b, now);
                opened_to = first + b;
            }
            3 => {
                gaps.fill(a, b % 2 == 0, now);
            }
            4 => {
                gaps.give_up(a, a + b);
            }
            _ => {
                for r in gaps.due(now, &policy, 8) {
                    assert!(gaps.is_missing(r.first) && r.count >= 1 && r.count <= policy.max_frames);
                }
            }
        }
        assert!(ring.charged() <= ring.limit());
        let c = gaps.counts();
        assert_eq!(
            c.frames_missing,
            c.frames_recovered + c.frames_filled_late + c.frames_unrecoverable + gaps.open_frames()
        );
    }
}

/// The round-trip echo: every byte is a field, so a parsed echo writes back its input.
pub fn relay_echo(data: &[u8]) {
    if let Ok(echo) = Echo::parse(data) {
        assert_eq!(echo.to_bytes()[..], data[..Echo::LEN]);
        assert_eq!(Echo::parse(&echo.to_bytes()), Ok(echo));
    }
}

/// The publisher's totals (a type named twice is kept once, so only the parsed value round-trips).
pub fn relay_totals(data: &[u8]) {
    if let Ok(totals) = Totals::parse(data) {
        assert!(totals.by_type.len() <= 256);
        let mut out = Vec::new();
        totals.write(&mut out);
        // The flags byte follows the per-type entries only when a flag is set.
        assert_eq!(out.len(), 18 + 9 * totals.by_type.len() + usize::from(totals.truncated));
        assert_eq!(Totals::parse(&out), Ok(totals));
    }
}

/// A capture file (pcap or pcapng, gzipped or not) read to its end or first error, every packet
/// taken down to its UDP payload and IEX-TP segment as the publisher does.
pub fn capture(data: &[u8]) {
    let Ok(mut reader) = CaptureReader::new("fuzz", std::io::Cursor::new(data.to_vec())) else {
        return;
    };
    let mut previous_offset = 0;
    while let Ok(Some(packet)) = reader.next_packet() {
        // Offsets are in the decompressed capture, so only their order can be checked.
        assert!(packet.offset >= previous_offset, "packet offsets go backwards");
        previous_offset = packet.offset;
        if let Ok(datagram) = link::udp_datagram(packet.link_type, packet.data) {
            segment_body(datagram.payload);
        }
    }
}

/// An IEX-TP segment, its blocks and their messages.
pub fn iextp(data: &[u8]) {
    segment_body(data);
}

fn segment_body(data: &[u8]) {
    let Ok(segment) = Segment::parse(data) else {
        return;
    };
    assert_eq!(usize::from(segment.header.payload_length), segment.payload.len());
    // Byte 1 is reserved and written as zero.
    let bytes = segment.header.to_bytes();
    assert_eq!((bytes[0], &bytes[2..]), (data[0], &data[2..HEADER_LEN]));
    let mut blocks = segment.blocks();
    let mut count = 0;
    while let Some(block) = blocks.next() {
        count += 1;
        // Every block takes at least its 2-byte prefix, so the iterator cannot run forever.
        assert!(count <= segment.payload.len() / 2 + 1, "more blocks than the payload can hold");
        assert!(blocks.offset() <= segment.payload.len());
        if let Ok(block) = block {
            message(block);
        }
    }
}

/// One IEX message: a decoded message writes back the bytes of its layout, which decode to it.
pub fn message(data: &[u8]) {
    let Ok(message) = Message::parse(data) else {
        return;
    };
    assert_eq!(message.kind(), data[0]);
    let mut out = Vec::new();
    message.write_iex(&mut out);
    assert_eq!(out.len(), message.iex_len());
    // Known types write their documented layout, which is a prefix of what was parsed (IEX may
    // append fields); unknown ones write their bytes back whole.
    assert_eq!(out[..], data[..out.len()], "write_iex does not reproduce the parsed bytes");
    assert_eq!(Message::parse(&out), Ok(message));
}

/// The publisher's TOML configuration: parsed and checked, an error or a configuration, never a
/// panic.
pub fn publisher_config(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    if let Ok(file) = toml::from_str::<mdrelay_publisher::config::Settings>(&text) {
        let _ = file.check();
    }
}

/// The subscriber's TOML configuration: parsed and checked, an error or a configuration, never a
/// panic.
pub fn subscriber_config(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let _ = mdrelay_subscriber::config::Config::from_text(Path::new("fuzz.toml"), &text);
}
