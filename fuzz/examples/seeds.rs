//! Writes the seed inputs of every fuzz target into `fuzz/corpus/<target>/seed-*`, derived from the
//! first packets of the shared IEX captures (never copied whole) and from the project's example
//! configurations. Run from the workspace root, before minimizing the corpus with `cargo fuzz cmin`:
//!
//! ```text
//! cargo run --release -p mdrelay-fuzz --example seeds
//! ```

use mdrelay_codec::{BatchHeader, Codec, Format, FormatCodec, Limits, raw::RawCodec};
use mdrelay_iex::capture::CaptureReader;
use mdrelay_iex::capture_writer::{CaptureWriter, Container, WriterOptions};
use mdrelay_iex::iextp::Segment;
use mdrelay_iex::link;
use mdrelay_iex::message::Message;
use mdrelay_proto::relay::Protection;
use mdrelay_proto::relay::{
    DATAGRAM_VERSION, DatagramHeader, DatagramKind, Echo, Hello, PROTOCOL_VERSION, RecordHeader, RecordTag, Resume,
    RetransmitRequest, SCHEMA_VERSION, Subscribe, Totals, WIDE_DATAGRAM_VERSION,
};
use std::collections::BTreeSet;
use std::io::Write;
use std::net::SocketAddrV4;
use std::path::{Path, PathBuf};

/// Packets read from the start of each large capture: enough for every message type they hold
/// near their start, few enough that the seeds stay small.
const HEAD_PACKETS: usize = 20_000;

/// A segment taken from a capture, with its capture time and UDP endpoints.
struct Taken {
    timestamp_ns: i64,
    source: SocketAddrV4,
    destination: SocketAddrV4,
    segment: Vec<u8>,
}

/// The segments of `path` that bring a set of message types not seen before (the first few
/// packets are always kept), up to `limit` packets in.
fn segments(path: &Path, limit: usize, keep_first: usize) -> Vec<Taken> {
    let mut reader = CaptureReader::open(path).unwrap_or_else(|e| panic!("{e}"));
    let mut seen = BTreeSet::new();
    let mut out = Vec::new();
    let mut index = 0;
    while let Ok(Some(packet)) = reader.next_packet() {
        index += 1;
        if index > limit {
            break;
        }
        let Ok(datagram) = link::udp_datagram(packet.link_type, packet.data) else { continue };
        let Ok(segment) = Segment::parse(datagram.payload) else { continue };
        // Only short segments: a seed is mutated often, and a short one is cheap to mutate.
        if segment.payload.len() > 600 {
            continue;
        }
        let kinds: BTreeSet<u8> = segment.blocks().filter_map(|b| b.ok()).filter_map(|b| b.first().copied()).collect();
        let novel = kinds.iter().any(|k| !seen.contains(k));
        if out.len() < keep_first || novel {
            seen.extend(kinds);
            out.push(Taken {
                timestamp_ns: packet.timestamp_ns,
                source: datagram.source,
                destination: datagram.destination,
                segment: datagram.payload.to_vec(),
            });
        }
    }
    out
}

fn write(dir: &Path, name: &str, bytes: &[u8]) {
    std::fs::create_dir_all(dir).expect("corpus directory");
    std::fs::write(dir.join(format!("seed-{name}")), bytes).expect("seed file");
}

fn capture(taken: &[Taken], options: WriterOptions) -> Vec<u8> {
    let mut writer = CaptureWriter::new(Vec::new(), options).expect("capture writer");
    for t in taken {
        writer.write_udp(t.timestamp_ns, t.source, t.destination, &t.segment).expect("packet");
    }
    writer.finish().expect("capture")
}

fn main() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let data = root.join("../../shared/data/iex");
    let corpus = root.join("corpus");

    let mut taken = segments(&data.join("TOPS16.pcap.gz"), HEAD_PACKETS, 4);
    taken.extend(segments(&data.join("DEEP10.pcap.gz"), HEAD_PACKETS, 4));
    // The single-packet extracts are the only samples of some types (and of DEEP+'s unknown ones).
    let mut extracts: Vec<_> = std::fs::read_dir(data.join("packets")).expect("packets").flatten().collect();
    extracts.sort_by_key(|e| e.file_name());
    for entry in extracts {
        let path = entry.path();
        if std::fs::metadata(&path).map_or(true, |m| m.len() > 2048) {
            continue;
        }
        taken.extend(segments(&path, 1, 1));
    }
    println!("{} segments", taken.len());

    // IEX-TP segments and their messages, one file per distinct message.
    let mut messages = BTreeSet::new();
    for (i, t) in taken.iter().enumerate() {
        write(&corpus.join("iextp"), &format!("{i:02}"), &t.segment);
        let segment = Segment::parse(&t.segment).expect("a segment");
        for block in segment.blocks().flatten() {
            if !block.is_empty() && messages.iter().all(|m: &Vec<u8>| m[0] != block[0]) {
                messages.insert(block.to_vec());
            }
        }
    }
    for (i, m) in messages.iter().enumerate() {
        write(&corpus.join("message"), &format!("{i:02}-{}", char::from(m[0]).escape_default()), m);
    }

    // Each segment as a frame of every format, and a stream of the first three frames.
    for format in Format::ALL {
        let dir = corpus.join(format.name().replace('-', "_"));
        let mut codec = Codec::new(format, Limits::default());
        let mut stream = Vec::new();
        for (i, t) in taken.iter().enumerate() {
            let segment = Segment::parse(&t.segment).expect("a segment");
            let parsed: Vec<Message<'_>> = segment.blocks().flatten().filter_map(|b| Message::parse(b).ok()).collect();
            let header = BatchHeader { publish_time: t.timestamp_ns, ..BatchHeader::from_segment(&segment.header) };
            let mut frame = Vec::new();
            if format == Format::Raw {
                RawCodec::new(Limits::default()).encode_segment(header.publish_time, &t.segment, &mut frame);
            } else if codec.encode(&header, &parsed, &mut frame).is_err() {
                continue;
            }
            write(&dir, &format!("{i:02}"), &frame);
            if i < 3 {
                stream.extend_from_slice(&frame);
            }
        }
        write(&dir, "stream", &stream);
    }

    // Captures: the first packets in each container and byte order, and gzipped.
    let head = &taken[..4];
    let dir = corpus.join("capture");
    write(&dir, "pcap-ns", &capture(head, WriterOptions::default()));
    write(
        &dir,
        "pcap-us-be",
        &capture(head, WriterOptions { nanosecond: false, big_endian: true, ..Default::default() }),
    );
    write(&dir, "pcapng", &capture(head, WriterOptions { container: Container::PcapNg, ..Default::default() }));
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    gz.write_all(&capture(&head[..2], WriterOptions::default())).expect("gzip");
    write(&dir, "pcap-gz", &gz.finish().expect("gzip"));

    // Relay structures.
    let hello = Hello {
        protocol_version: PROTOCOL_VERSION,
        format: Format::Sbe,
        schema_version: SCHEMA_VERSION,
        session: 0x1234_5678_9abc_def0,
        stream: 1,
        next_sequence: 1,
        protection: Protection { crc: true, encrypted: true },
        key_check: [1, 2, 3, 4],
    };
    write(&corpus.join("relay_hello"), "1", &hello.to_bytes());
    write(
        &corpus.join("relay_subscribe"),
        "1",
        &Subscribe { resume: Resume::From(7), ..Subscribe::new(true) }.to_bytes(),
    );
    let record = RecordHeader { tag: RecordTag::Data, format: Format::Capnp, frame_count: 3, length: 100, sequence: 5 };
    write(&corpus.join("relay_record_header"), "1", &record.to_bytes());
    let datagram = DatagramHeader {
        version: DATAGRAM_VERSION,
        format: Format::FlatBuffers,
        kind: DatagramKind::Data,
        frame_count: 2,
        protection: Protection { crc: true, encrypted: false },
        session: 7,
        sequence: 9,
    };
    write(&corpus.join("relay_datagram_header"), "1", &datagram.to_bytes());
    let wide = DatagramHeader { version: WIDE_DATAGRAM_VERSION, frame_count: 300, ..datagram };
    write(&corpus.join("relay_datagram_header"), "2", &wide.to_bytes());
    write(&corpus.join("relay_echo"), "1", &Echo { publish_time: 1_500_000_000_000_000_000, sequence: 3 }.to_bytes());
    let totals =
        Totals { frames: 10, messages: 20, by_type: [(b'T', 15), (b'8', 5)].into_iter().collect(), truncated: false };
    let mut bytes = Vec::new();
    totals.write(&mut bytes);
    write(&corpus.join("relay_totals"), "1", &bytes);
    write(&corpus.join("relay_recovery"), "1", &RetransmitRequest { first: 3, count: 9 }.to_record());
    // Ring pushes, lookups, gaps opened, filled, given up and asked for.
    write(
        &corpus.join("relay_recovery"),
        "2",
        &[0, 4, 0, 0, 9, 0, 1, 1, 3, 2, 5, 4, 3, 6, 0, 5, 0, 0, 4, 5, 2, 5, 0, 0],
    );

    // The example configurations, each to the program that reads it.
    let mut configs: Vec<_> = std::fs::read_dir(root.join("../config")).expect("config").flatten().collect();
    configs.sort_by_key(|e| e.file_name());
    for entry in configs {
        let name = entry.file_name().to_string_lossy().trim_end_matches(".toml").to_string();
        let target = if name.starts_with("sub-") { "subscriber_config" } else { "publisher_config" };
        write(&corpus.join(target), &name, &std::fs::read(entry.path()).expect("config"));
    }
}
