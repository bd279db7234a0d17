//! mdrelay-codec's integration tests in one test binary, a module per area: every format's round
//! trip, filtered decoding, JSON's own rules, and no allocation per frame once warm.

use mdrelay_codec::FormatCodec;
use mdrelay_harness::alloc::CountingAllocator;

// Counts allocations on threads that measure (`count_allocations`); the others are not counted,
// so tests that assert "no allocation" run beside any other.
#[global_allocator]
static GLOBAL: CountingAllocator = CountingAllocator;

mod alloc_free;
mod filtered_decode;
mod formats;
mod json_codec;
mod strategies;

use mdrelay_codec::{BatchHeader, Codec, MessageScratch, collect_segment};
use mdrelay_iex::capture::CaptureReader;
use mdrelay_iex::iextp::{Segment, SegmentHeader};
use mdrelay_iex::link;
use std::path::Path;

/// The UDP payloads of the DEEP10 capture, in order.
fn udp_payloads() -> Vec<Vec<u8>> {
    let mut reader = CaptureReader::open(mdrelay_harness::iex_data().join("DEEP10.pcap.gz")).unwrap();
    let mut out = Vec::new();
    while let Some(packet) = reader.next_packet().unwrap() {
        if let Ok(datagram) = link::udp_datagram(packet.link_type, packet.data) {
            out.push(datagram.payload.to_vec());
        }
    }
    out
}

/// Each IEX-TP segment of the capture at `path` encoded by `codec` as one frame (publish time 1),
/// handed to `each` with the codec and the segment's header, as a publisher sends them.
fn each_frame(path: &Path, codec: &mut Codec, mut each: impl FnMut(&mut Codec, &SegmentHeader, &[u8])) {
    let mut reader = CaptureReader::open(path).unwrap();
    let mut scratch = MessageScratch::new();
    let mut frame = Vec::new();
    while let Some(packet) = reader.next_packet().unwrap() {
        let Ok(datagram) = link::udp_datagram(packet.link_type, packet.data) else { continue };
        let Ok(segment) = Segment::parse(datagram.payload) else { continue };
        frame.clear();
        scratch.with(|list| {
            collect_segment(&segment, list);
            let header = BatchHeader { publish_time: 1, ..BatchHeader::from_segment(&segment.header) };
            codec.encode(&header, list, &mut frame).unwrap();
        });
        each(codec, &segment.header, &frame);
    }
}
