//! The real IEX captures in ../shared: every count and aggregate equals the independent
//! reference reader's output, whatever the container the capture is written in.

use mdrelay_harness::{assert_matches_reference, expected, iex_data};
use mdrelay_iex::capture::CaptureReader;
use mdrelay_iex::capture_writer::{CaptureWriter, Container, WriterOptions};
use mdrelay_iex::inspect::{InspectReport, Inspector, inspect_file};
use mdrelay_iex::link::linktype;
use std::io::Write;
use std::path::Path;

fn report_json(report: &InspectReport) -> serde_json::Value {
    serde_json::to_value(report).unwrap()
}

#[test]
fn deep10_equals_the_reference() {
    let report = inspect_file(iex_data().join("DEEP10.pcap.gz")).unwrap();
    assert_matches_reference(&report_json(&report), &expected("DEEP10.json"));
    assert_eq!(report.file, "DEEP10.pcap.gz");
    // Facts the shared README states about this capture.
    assert_eq!(report.sequence.restarts, 11);
    assert_eq!(report.truncated_records, 1);
}

#[test]
fn tops16_equals_the_reference() {
    let report = inspect_file(iex_data().join("TOPS16.pcap.gz")).unwrap();
    assert_matches_reference(&report_json(&report), &expected("TOPS16.json"));
}

#[test]
fn every_single_message_extract_parses() {
    let mut files = 0;
    for entry in std::fs::read_dir(iex_data().join("packets")).unwrap() {
        let path = entry.unwrap().path();
        let report = inspect_file(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert_eq!(report.packets, report.segments, "{}", path.display());
        assert_eq!(
            report.non_iex_packets + report.malformed_messages + report.length_overruns,
            0,
            "{}",
            path.display()
        );
        assert_eq!(report.message_count_mismatches, 0, "{}", path.display());
        files += 1;
    }
    assert!(files >= 30, "expected the ~36 extracts, found {files}");
}

/// Reads `source` and writes every packet through `rewrite` into a new capture.
fn rewrite(
    source: &Path,
    options: WriterOptions,
    gzip: bool,
    frame: impl Fn(&[u8]) -> Vec<u8>,
) -> tempfile::NamedTempFile {
    let out = tempfile::NamedTempFile::new().unwrap();
    let file = out.reopen().unwrap();
    let sink: Box<dyn Write> = if gzip {
        Box::new(flate2::write::GzEncoder::new(file, flate2::Compression::fast()))
    } else {
        Box::new(std::io::BufWriter::new(file))
    };
    let mut writer = CaptureWriter::new(sink, options).unwrap();
    let mut reader = CaptureReader::open(source).unwrap();
    while let Some(packet) = reader.next_packet().unwrap() {
        writer.write_frame(packet.timestamp_ns, &frame(packet.data)).unwrap();
    }
    drop(writer.finish().unwrap());
    out
}

fn same_counts(report: &InspectReport) -> serde_json::Value {
    let mut v = report_json(report);
    let o = v.as_object_mut().unwrap();
    o.remove("file");
    // The rewritten copy stops before the truncated record rather than reproducing it.
    o.remove("truncated_records");
    v
}

#[test]
fn every_container_gives_identical_results() {
    let source = iex_data().join("TOPS16.pcap.gz");
    let original = same_counts(&inspect_file(&source).unwrap());
    let copy = |f: &[u8]| f.to_vec();
    let variants = [
        ("pcapng", WriterOptions { container: Container::PcapNg, ..Default::default() }, false),
        (
            "pcapng big-endian gz",
            WriterOptions { container: Container::PcapNg, big_endian: true, ..Default::default() },
            true,
        ),
        ("pcap ns", WriterOptions { nanosecond: true, ..Default::default() }, false),
        ("pcap µs big-endian", WriterOptions { nanosecond: false, big_endian: true, ..Default::default() }, false),
        ("pcap ns gz", WriterOptions { nanosecond: true, ..Default::default() }, true),
    ];
    for (name, options, gzip) in variants {
        let file = rewrite(&source, options, gzip, copy);
        let report = inspect_file(file.path()).unwrap();
        assert_eq!(same_counts(&report), original, "{name}");
        let reader = CaptureReader::open(file.path()).unwrap();
        assert_eq!(reader.compressed(), gzip, "{name}");
    }
}

#[test]
fn deep10_as_pcapng_gz_equals_the_reference() {
    let source = iex_data().join("DEEP10.pcap.gz");
    let file =
        rewrite(&source, WriterOptions { container: Container::PcapNg, ..Default::default() }, true, |f| f.to_vec());
    let report = inspect_file(file.path()).unwrap();
    let mut reference = expected("DEEP10.json");
    reference["truncated_records"] = serde_json::json!(0);
    assert_matches_reference(&report_json(&report), &reference);
}

#[test]
fn timestamps_survive_every_container() {
    let source = iex_data().join("TOPS16.pcap.gz");
    let stamps = |path: &Path| {
        let mut reader = CaptureReader::open(path).unwrap();
        let mut out = Vec::new();
        while let Some(p) = reader.next_packet().unwrap() {
            out.push(p.timestamp_ns);
        }
        out
    };
    let original = stamps(&source);
    assert!(original[0] > 1_499_000_000_000_000_000, "2017-07 capture");
    for options in [
        WriterOptions { container: Container::PcapNg, ..Default::default() },
        WriterOptions { nanosecond: true, big_endian: true, ..Default::default() },
    ] {
        let file = rewrite(&source, options, false, |f| f.to_vec());
        assert_eq!(stamps(file.path()), original);
    }
}

/// Every link layer the reader supports carries the same datagrams to the same results.
#[test]
fn every_link_layer_gives_identical_results() {
    let source = iex_data().join("TOPS16.pcap.gz");
    let original = same_counts(&inspect_file(&source).unwrap());
    let ethertype_at_12 = |f: &[u8]| {
        assert_eq!(&f[12..14], &[0x08, 0x00], "the source frames are untagged IPv4 Ethernet");
    };
    let vlan = |f: &[u8]| {
        ethertype_at_12(f);
        let mut out = f[..12].to_vec();
        out.extend_from_slice(&[0x81, 0x00, 0x00, 0x2a]);
        out.extend_from_slice(&f[12..]);
        out
    };
    let qinq = |f: &[u8]| {
        let mut out = f[..12].to_vec();
        out.extend_from_slice(&[0x88, 0xa8, 0x00, 0x07, 0x81, 0x00, 0x00, 0x2a]);
        out.extend_from_slice(&f[12..]);
        out
    };
    let sll = |f: &[u8]| {
        // Linux cooked v1: packet type, ARPHRD_ETHER, address length, 8 address bytes, protocol.
        let mut out = vec![0x00, 0x00, 0x00, 0x01, 0x00, 0x06];
        out.extend_from_slice(&f[6..12]);
        out.extend_from_slice(&[0, 0, 0x08, 0x00]);
        out.extend_from_slice(&f[14..]);
        out
    };
    let raw = |f: &[u8]| f[14..].to_vec();
    type Reframe<'a> = &'a dyn Fn(&[u8]) -> Vec<u8>;
    let cases: [(&str, i32, Reframe); 4] = [
        ("802.1Q", linktype::ETHERNET, &vlan),
        ("802.1ad", linktype::ETHERNET, &qinq),
        ("Linux SLL", linktype::LINUX_SLL, &sll),
        ("raw IPv4", linktype::RAW, &raw),
    ];
    for (name, link_type, frame) in cases {
        let options = WriterOptions { link_type, ..Default::default() };
        let file = rewrite(&source, options, false, frame);
        let report = inspect_file(file.path()).unwrap();
        assert_eq!(same_counts(&report), original, "{name}");
    }
}

#[test]
fn non_iex_packets_are_counted_and_the_rest_kept() {
    // Every third packet of TOPS16 replaced by a non-IEX UDP datagram, an ARP frame, or a segment
    // whose header disagrees with its length.
    let source = iex_data().join("TOPS16.pcap.gz");
    let mut reader = CaptureReader::open(&source).unwrap();
    let mut writer = CaptureWriter::new(Vec::new(), WriterOptions::default()).unwrap();
    let mut expected = Inspector::new("expected");
    let mut replaced = 0;
    let mut i = 0;
    while let Some(packet) = reader.next_packet().unwrap() {
        let mut frame = packet.data.to_vec();
        if i % 3 == 1 {
            match (i / 3) % 3 {
                0 => frame[14 + 20 + 8] = 7, // IEX-TP version 7
                1 => frame[12] = 0x08,       // still IPv4, but cut the segment short below
                _ => frame[13] = 0x06,       // ARP ether type
            }
            if (i / 3) % 3 == 1 {
                // Lie about the payload length in the segment header.
                frame[14 + 20 + 8 + 12] ^= 0x01;
            }
            replaced += 1;
        } else {
            expected.packet(&packet);
        }
        writer.write_frame(packet.timestamp_ns, &frame).unwrap();
        i += 1;
    }
    let bytes = writer.finish().unwrap();
    let mut reader = CaptureReader::new("mixed", std::io::Cursor::new(bytes)).unwrap();
    let mut got = Inspector::new("mixed");
    while let Some(packet) = reader.next_packet().unwrap() {
        got.packet(&packet);
    }
    let got = got.finish();
    let expected = expected.finish();
    assert_eq!(got.non_iex_packets, replaced);
    assert_eq!(got.segments, expected.segments);
    assert_eq!(got.messages, expected.messages);
    assert_eq!(got.symbols, expected.symbols);
}

/// pcapng built by hand: a millisecond `if_tsresol`, a simple packet block, and a second section
/// whose interface keeps the default microseconds.
#[test]
fn pcapng_resolutions_simple_packets_and_sections() {
    fn block(kind: u32, body: &[u8]) -> Vec<u8> {
        let padded = body.len().div_ceil(4) * 4;
        let len = (12 + padded) as u32;
        let mut b = kind.to_le_bytes().to_vec();
        b.extend_from_slice(&len.to_le_bytes());
        b.extend_from_slice(body);
        b.resize(8 + padded, 0);
        b.extend_from_slice(&len.to_le_bytes());
        b
    }
    let section =
        || block(0x0A0D_0D0A, &[0x4d, 0x3c, 0x2b, 0x1a, 1, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff]);
    let interface = |tsresol: Option<u8>| {
        let mut body = vec![1, 0, 0, 0, 0xff, 0xff, 0, 0];
        if let Some(r) = tsresol {
            body.extend_from_slice(&[9, 0, 1, 0, r, 0, 0, 0, 0, 0, 0, 0]);
        }
        block(1, &body)
    };
    let enhanced = |ticks: u64, data: &[u8]| {
        let mut body = 0u32.to_le_bytes().to_vec();
        body.extend_from_slice(&((ticks >> 32) as u32).to_le_bytes());
        body.extend_from_slice(&(ticks as u32).to_le_bytes());
        body.extend_from_slice(&(data.len() as u32).to_le_bytes());
        body.extend_from_slice(&(data.len() as u32).to_le_bytes());
        body.extend_from_slice(data);
        block(6, &body)
    };
    let simple = |data: &[u8]| {
        let mut body = (data.len() as u32).to_le_bytes().to_vec();
        body.extend_from_slice(data);
        block(3, &body)
    };
    let mut reader = CaptureReader::open(iex_data().join("TOPS16.pcap.gz")).unwrap();
    let mut frames = Vec::new();
    let mut expected = Inspector::new("expected");
    while frames.len() < 3 {
        let p = reader.next_packet().unwrap().unwrap();
        expected.packet(&p);
        frames.push(p.data.to_vec());
    }
    let mut bytes = section();
    bytes.extend(interface(Some(3)));
    bytes.extend(enhanced(1_500_000_000_123, &frames[0]));
    bytes.extend(simple(&frames[1]));
    bytes.extend(section());
    bytes.extend(interface(None));
    bytes.extend(enhanced(1_500_000_000_123_456, &frames[2]));
    let mut reader = CaptureReader::new("hand-built.pcapng", std::io::Cursor::new(bytes)).unwrap();
    let mut got = Inspector::new("hand-built");
    let mut stamps = Vec::new();
    while let Some(p) = reader.next_packet().unwrap() {
        stamps.push(p.timestamp_ns);
        got.packet(&p);
    }
    assert_eq!(stamps, vec![1_500_000_000_123_000_000, 0, 1_500_000_000_123_456_000], "ms, none (simple block), µs");
    let (got, expected) = (got.finish(), expected.finish());
    assert_eq!((got.packets, got.segments, got.messages), (3, expected.segments, expected.messages));
    assert_eq!(got.message_types, expected.message_types);
}
