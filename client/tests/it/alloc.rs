//! No allocation per message in steady state: a counting global allocator watches the blocking
//! subscriber take the whole of DEEP10 from a real publisher, in every format, after a warm-up
//! of the first frames (buffers grow to the largest record seen, codecs are made per format).
//! The subscriber's runtime runs on the calling thread, so everything it does is counted.

use crate::common::*;
use mdrelay_client::{Builder, Event};
use mdrelay_harness::alloc::{CountingAllocator, count_allocations};
use mdrelay_harness::{formats, serial};

// Counts only the thread inside `count_allocations` (the test harness has threads of its own).
#[global_allocator]
static GLOBAL: CountingAllocator = CountingAllocator;

/// Frames taken before counting starts.
const WARM_UP: u64 = 20_000;

#[test]
fn a_whole_stream_takes_no_allocation_per_message_in_any_format() {
    let _serial = serial();
    for format in formats() {
        let mut publisher = tcp_publisher("DEEP10", &["--format", format.name()]);
        let mut subscriber = Builder::tcp(publisher.serving_on().to_string()).build().unwrap();
        let mut frames = 0u64;
        while frames < WARM_UP {
            if let Some(Event::Frame(_)) = subscriber.next_event().unwrap() {
                frames += 1;
            }
        }
        let ((messages, counted_frames, end), allocations) = count_allocations(|| {
            let (mut messages, mut frames, mut end) = (0u64, 0u64, false);
            while let Some(event) = subscriber.next_event().unwrap() {
                match event {
                    Event::Frame(frame) => {
                        frames += 1;
                        // Every message is read, as an application would.
                        messages += frame.messages().filter(|m| m.kind() != 0).count() as u64;
                    }
                    Event::End(_) => end = true,
                    _ => {}
                }
            }
            (messages, frames, end)
        });
        publisher.finish(RUN).assert_success();
        assert!(end, "{format}: the stream ended");
        eprintln!(
            "{format}: {allocations:?} over {counted_frames} frames and {messages} messages after {WARM_UP} frames of warm-up"
        );
        assert!(messages > 200_000, "{format}: {messages}");
        // A handful in all (the end of stream, buffers growing once to a larger batch): none per
        // message or per frame.
        assert!(allocations.count < 50, "{format}: {allocations:?} for {messages} messages");
    }
}
