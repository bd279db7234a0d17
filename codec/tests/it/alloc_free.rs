//! Steady-state encode, frame and decode make no heap allocation, in every format: a counting
//! global allocator watches a whole pass over DEEP10 after a warm-up pass.

/// The formats under test: all of them, unless a developer narrows the run with
/// `MDRELAY_FORMATS=sbe,raw` while working on one format (CI never sets it).
fn formats() -> Vec<mdrelay_codec::Format> {
    match std::env::var("MDRELAY_FORMATS") {
        Ok(list) => list.split(',').map(|f| f.trim().parse().expect("MDRELAY_FORMATS names formats")).collect(),
        Err(_) => mdrelay_codec::Format::ALL.to_vec(),
    }
}

use mdrelay_codec::FormatCodec;
use mdrelay_codec::{BatchHeader, Codec, Limits, MessageScratch, collect_segment};
use mdrelay_harness::alloc::count_allocations;
use mdrelay_iex::Aggregator;
use mdrelay_iex::iextp::Segment;

// Counts only the thread inside `count_allocations` (the test harness has threads of its own).
struct Pipeline {
    codec: Codec,
    scratch: MessageScratch,
    frame: Vec<u8>,
    aggregator: Aggregator,
    messages: u64,
}

impl Pipeline {
    fn pass(&mut self, payloads: &[Vec<u8>]) {
        for payload in payloads {
            let Ok(segment) = Segment::parse(payload) else { continue };
            self.frame.clear();
            let codec = &mut self.codec;
            let frame = &mut self.frame;
            self.scratch.with(|list| {
                collect_segment(&segment, list);
                let header = BatchHeader { publish_time: 1, ..BatchHeader::from_segment(&segment.header) };
                codec.encode(&header, list, frame).expect("encodes");
            });
            let len = self.codec.frame_len(&self.frame).expect("frames").expect("complete");
            let aggregator = &mut self.aggregator;
            let messages = &mut self.messages;
            self.codec
                .decode(&self.frame[..len], |m| {
                    *messages += 1;
                    aggregator.apply(m);
                })
                .expect("decodes");
        }
    }
}

#[test]
fn the_counter_sees_allocations() {
    let (boxed, allocations) = count_allocations(|| std::hint::black_box(Box::new([0u8; 64])));
    drop(boxed);
    assert!(allocations.count >= 1, "{allocations:?}");
    assert!(allocations.largest >= 64, "{allocations:?}");
}

#[test]
fn no_allocation_in_steady_state_for_any_format() {
    let payloads = crate::udp_payloads();
    let mut failures = Vec::new();
    for format in formats() {
        let mut pipeline = Pipeline {
            codec: Codec::new(format, Limits::default()),
            scratch: MessageScratch::new(),
            frame: Vec::new(),
            aggregator: Aggregator::new(),
            messages: 0,
        };
        pipeline.pass(&payloads);
        let warm = pipeline.messages;
        assert!(warm > 0, "{format}: the warm-up pass decoded messages");
        let ((), allocations) = count_allocations(|| pipeline.pass(&payloads));
        assert_eq!(pipeline.messages, 2 * warm, "{format}: the measured pass saw every message");
        if allocations.count != 0 {
            failures.push(format!(
                "{format}: {} allocations over {} segments, the largest {} bytes",
                allocations.count,
                payloads.len(),
                allocations.largest
            ));
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}
