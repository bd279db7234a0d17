//! The hot path: source → pacing → encoding → TCP fanout and UDP, on a thread of its own.
//!
//! It runs outside the async runtime on purpose: pacing spins for the last stretch of each wait
//! (an async timer's millisecond granularity is far coarser than gaps between packets), and
//! capture reading and gunzip are blocking work. The runtime keeps the sockets of subscribers.

use crate::config::Config;
use crate::pacing::Pacer;
use crate::source::SegmentSource;
use crate::tcp::Fanout;
use crate::udp::UdpOut;
use anyhow::Result;
use bytes::{BufMut, Bytes, BytesMut};
use mdrelay_proto::codec::{BatchHeader, Codec, Format, Limits, MessageScratch, collect_segment};
use mdrelay_proto::iextp::Segment;
use mdrelay_proto::relay::{RecordHeader, RecordTag, Totals};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::time::{Duration, Instant};

/// Controls shared with the signal handlers.
#[derive(Clone)]
pub struct Controls {
    /// Format to switch to at the next frame (a [`Format::id`]).
    pub format: Arc<AtomicU8>,
    /// Set to end the stream (with its totals) at the next frame.
    pub stop: Arc<AtomicBool>,
}

/// What one run sent.
#[derive(Debug, Default, serde::Serialize)]
pub struct EngineSummary {
    /// The publisher's totals, as sent at the end of the stream.
    pub totals: Totals,
    /// Frame bytes encoded (without relay headers).
    pub frame_bytes: u64,
    /// Segments the source produced that were not IEX-TP.
    pub skipped_segments: u64,
    /// Messages inside segments that did not decode (not relayed in schema formats).
    pub undecodable_messages: u64,
    /// Format switches.
    pub format_switches: u64,
    /// Passes over the source.
    pub passes: u64,
    /// Wall time of the stream, seconds.
    pub seconds: f64,
    /// UDP sends that failed.
    pub udp_send_errors: u64,
}

/// The TCP record being built: frames of one format, back to back.
struct PendingRecord {
    buf: BytesMut,
    frames: u16,
    first_sequence: u64,
    format: Format,
}

impl PendingRecord {
    fn new() -> Self {
        PendingRecord { buf: BytesMut::with_capacity(256 * 1024), frames: 0, first_sequence: 0, format: Format::Raw }
    }

    fn push(&mut self, sequence: u64, format: Format, frame: &[u8]) {
        if self.frames == 0 {
            self.buf.clear();
            self.buf.put_bytes(0, RecordHeader::LEN);
            self.first_sequence = sequence;
            self.format = format;
        }
        self.buf.extend_from_slice(frame);
        self.frames += 1;
    }

    fn take(&mut self) -> Option<(Bytes, u64)> {
        if self.frames == 0 {
            return None;
        }
        let header = RecordHeader {
            tag: RecordTag::Data,
            format: self.format,
            frame_count: self.frames,
            length: (self.buf.len() - RecordHeader::LEN) as u32,
            sequence: self.first_sequence,
        };
        self.buf[..RecordHeader::LEN].copy_from_slice(&header.to_bytes());
        let frames = u64::from(self.frames);
        self.frames = 0;
        Some((self.buf.split().freeze(), frames))
    }
}

fn control_record(tag: RecordTag, format: Format, sequence: u64, payload: &[u8]) -> Bytes {
    let header = RecordHeader { tag, format, frame_count: 0, length: payload.len() as u32, sequence };
    let mut b = BytesMut::with_capacity(RecordHeader::LEN + payload.len());
    b.extend_from_slice(&header.to_bytes());
    b.extend_from_slice(payload);
    b.freeze()
}

/// The outputs of one run.
pub struct Outputs {
    /// TCP subscribers, if a server is configured.
    pub fanout: Option<Arc<Fanout>>,
    /// UDP destinations, if any.
    pub udp: Option<UdpOut>,
}

struct Sender {
    outputs: Outputs,
    record: PendingRecord,
    coalesce: usize,
}

impl Sender {
    fn frame(&mut self, sequence: u64, format: Format, frame: &[u8]) {
        if let Some(udp) = &mut self.outputs.udp {
            udp.push(sequence, format, frame);
        }
        if self.outputs.fanout.is_some() {
            if self.record.frames > 0
                && (self.record.format != format
                    || self.record.buf.len() + frame.len() > self.coalesce
                    || self.record.frames == u16::MAX)
            {
                self.flush_tcp(sequence);
            }
            self.record.push(sequence, format, frame);
            if self.coalesce == 0 {
                self.flush_tcp(sequence + 1);
            }
        }
    }

    fn flush_tcp(&mut self, next_sequence: u64) {
        if let (Some(fanout), Some((record, frames))) = (&self.outputs.fanout, self.record.take()) {
            let format = self.record.format;
            fanout.send(record, frames, next_sequence, format);
        }
    }

    fn flush(&mut self, next_sequence: u64) {
        self.flush_tcp(next_sequence);
        if let Some(udp) = &mut self.outputs.udp {
            udp.flush();
        }
    }
}

fn wait_for_subscribers(fanout: &Fanout, wanted: usize, stop: &AtomicBool, listen: std::net::SocketAddr) {
    if wanted == 0 {
        return;
    }
    tracing::info!(%listen, wanted, "waiting for subscribers before sending");
    while fanout.ready() < wanted && !stop.load(Ordering::Relaxed) {
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Runs the stream to its end: every pass of the source, then the totals.
pub fn run(config: &Config, mut outputs: Outputs, controls: &Controls) -> Result<EngineSummary> {
    let mut source = SegmentSource::open(&config.source)?;
    if let SegmentSource::Live(live) = &mut source {
        live.set_stop(controls.stop.clone());
    }
    tracing::info!(source = %source.describe(), format = %config.format, "publishing");
    if let (Some(fanout), Some(tcp)) = (&outputs.fanout, &config.tcp) {
        wait_for_subscribers(fanout, tcp.wait_subscribers, &controls.stop, tcp.listen);
    }
    let limits = Limits::default();
    let mut format = Format::from_id(controls.format.load(Ordering::Relaxed)).unwrap_or(config.format);
    let mut codec = Codec::new(format, limits);
    let mut scratch = MessageScratch::new();
    let mut frame = Vec::with_capacity(1 << 20);
    let mut pacer = Pacer::new(config.pacing);
    let mut summary = EngineSummary::default();
    let mut by_type = [0u64; 256];
    let mut sequence = 1u64;
    let coalesce = config.coalesce_bytes;
    let mut sender = Sender {
        outputs: Outputs { fanout: outputs.fanout.take(), udp: outputs.udp.take() },
        record: PendingRecord::new(),
        coalesce,
    };
    let started = Instant::now();
    let deadline = (config.pacing.duration > 0.0).then(|| started + Duration::from_secs_f64(config.pacing.duration));
    'stream: loop {
        summary.passes += 1;
        while let Some(item) = source.next_item()? {
            if controls.stop.load(Ordering::Relaxed) || deadline.is_some_and(|d| Instant::now() >= d) {
                break 'stream;
            }
            let wanted = Format::from_id(controls.format.load(Ordering::Relaxed)).unwrap_or(format);
            if wanted != format {
                sender.flush(sequence);
                tracing::info!(from = %format, to = %wanted, sequence, "format switch");
                format = wanted;
                codec = Codec::new(format, limits);
                summary.format_switches += 1;
                if let Some(fanout) = &sender.outputs.fanout {
                    fanout.send_reliably(control_record(RecordTag::Format, format, sequence, &[]), sequence, format);
                }
            }
            let Ok(segment) = Segment::parse(item.bytes) else {
                summary.skipped_segments += 1;
                continue;
            };
            if pacer.due(item.time_ns).is_some() {
                // Nothing waits in a coalescing buffer while the pacer sleeps.
                sender.flush(sequence);
            }
            frame.clear();
            let encoded = scratch.with(|list| {
                summary.undecodable_messages += collect_segment(&segment, list) as u64;
                let publish_time = pacer.wait(item.time_ns, list.len() as u64);
                for m in list.iter() {
                    by_type[usize::from(m.kind())] += 1;
                }
                summary.totals.messages += list.len() as u64;
                match &mut codec {
                    // Raw relays the segment's bytes as they came.
                    Codec::Raw(raw) => {
                        raw.encode_segment(publish_time, item.bytes, &mut frame);
                        Ok(())
                    }
                    codec => codec.encode(
                        &BatchHeader { publish_time, ..BatchHeader::from_segment(&segment.header) },
                        list,
                        &mut frame,
                    ),
                }
            });
            if let Err(e) = encoded {
                tracing::warn!(sequence, error = %e, "segment not encodable; skipped");
                continue;
            }
            summary.totals.frames += 1;
            summary.frame_bytes += frame.len() as u64;
            sender.frame(sequence, format, &frame);
            sequence += 1;
            if config.pacing.max_messages > 0 && summary.totals.messages >= config.pacing.max_messages {
                break 'stream;
            }
        }
        if config.pacing.loops != 0 && summary.passes >= config.pacing.loops {
            break;
        }
        if !source.rewind()? {
            break;
        }
        pacer.rewind();
    }
    sender.flush(sequence);
    summary.seconds = started.elapsed().as_secs_f64();
    summary.totals.by_type = by_type.iter().enumerate().filter(|(_, n)| **n > 0).map(|(k, n)| (k as u8, *n)).collect();
    let mut totals = Vec::new();
    summary.totals.write(&mut totals);
    if let Some(fanout) = &sender.outputs.fanout {
        fanout.send_reliably(control_record(RecordTag::End, format, sequence, &totals), sequence, format);
        fanout.close();
    }
    if let Some(udp) = &mut sender.outputs.udp {
        udp.end(sequence, &totals);
        summary.udp_send_errors = udp.send_errors;
    }
    tracing::info!(
        frames = summary.totals.frames,
        messages = summary.totals.messages,
        seconds = summary.seconds,
        "end of stream"
    );
    Ok(summary)
}
