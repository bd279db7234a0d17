//! The hot path: source → pacing → encoding → TCP fanout and UDP, on a thread of its own.
//!
//! It runs outside the async runtime on purpose: pacing spins for the last stretch of each wait
//! (an async timer's millisecond granularity is far coarser than gaps between packets), and
//! capture reading and gunzip are blocking work. The runtime keeps the subscribers' sockets; the
//! hot path owns the subscriber list (see [`crate::fanout`]) and never shares a lock with them.

use crate::config::{Config, PacingMode};
use crate::fanout::Fanout;
use crate::metrics::{
    EngineMetrics, FeedMetrics, FormatCount, LIVE_METRICS_EVERY, PUBLISH_EVERY, PacingDrift, UpstreamMetrics,
};
use crate::nats::NatsOut;
use crate::pacing::Pacer;
use crate::progress::ReplayProgress;
use crate::ring::{SharedRing, lock};
use crate::source::{FeedSummary, SegmentSource, SourceSkips};
use crate::stats::Echoes;
use crate::stop::Stop;
use crate::udp::UdpOut;
use anyhow::Result;
use bytes::Bytes;
use mdrelay_codec::{Codec, Format, Limits, MessageScratch, collect_segment};
use mdrelay_iex::counts::TypeCounts;
use mdrelay_iex::iextp::Segment;
use mdrelay_proto::relay::{Coalescer, Envelope, Protector, RecordTag, Sealed, Totals, control_record};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::time::{Duration, Instant};

/// Controls shared with the signal handlers.
#[derive(Clone)]
pub struct Controls {
    /// Format to switch to at the next frame (a [`Format::id`]).
    pub format: Arc<AtomicU8>,
    /// Set to end the stream (with its totals) at the next frame; it ends the source's waits too.
    pub stop: Arc<Stop>,
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
    /// Segments no format could carry (skipped; each logged).
    pub unencodable_segments: u64,
    /// Input the source skipped.
    pub source_skipped: SourceSkips,
    /// Format switches.
    pub format_switches: u64,
    /// Passes over the source.
    pub passes: u64,
    /// Wall time of the stream, seconds.
    pub seconds: f64,
    /// Times `original` pacing started its schedule again at a jump in the capture's clock.
    pub pacing_reanchors: u64,
    /// UDP sends that failed.
    pub udp_send_errors: u64,
    /// Frames too large for a UDP datagram, not sent over UDP.
    pub udp_oversized_frames: u64,
    /// Frames too large for a NATS message (`nats.max_message`), not sent over NATS.
    pub nats_oversized_frames: u64,
    /// What came from the upstream publisher, when the source is one.
    pub upstream: Option<crate::upstream::UpstreamSummary>,
    /// A live feed's input by its IEX-TP numbering: gaps, copies dropped, late segments, restarts.
    pub feed: Option<FeedSummary>,
}

/// How a stream ended: what it sent, and the failure that cut it short, if one did (its END
/// then says the stream was truncated, so no subscriber takes it for a whole one).
pub struct Ended {
    /// What the run sent.
    pub summary: EngineSummary,
    /// What ended the stream before its source did: an output that failed (NATS), or a source
    /// that could not be read on.
    pub failure: Option<anyhow::Error>,
}

/// The outputs of one run, each behind the coalescer that groups its frames.
pub struct Outputs {
    /// TCP subscribers, if a server is configured.
    pub tcp: Option<(Coalescer, Fanout)>,
    /// UDP destinations, if any.
    pub udp: Option<(Coalescer, UdpOut)>,
    /// The NATS subject, if configured: datagrams, as UDP's.
    pub nats: Option<(Coalescer, NatsOut)>,
    /// The last frames, for retransmission and resume, if kept.
    pub ring: Option<SharedRing>,
    /// Seals each frame once (CRC-32C, encryption), before it goes anywhere.
    pub protector: Protector,
    /// The publisher's session, in every nonce.
    pub session: u64,
}

impl Outputs {
    /// The outputs for `config`: coalescing up to its budget (a datagram at most `max_datagram`).
    pub fn new(
        config: &Config,
        fanout: Option<Fanout>,
        udp: Option<UdpOut>,
        nats: Option<NatsOut>,
        session: u64,
        ring: Option<SharedRing>,
        protector: Protector,
    ) -> Outputs {
        // Records go to the fanout in runs: one queue slot and one wake-up check per run instead
        // of per frame-sized record (runs end at every flush, so paced frames are not held).
        let tcp = fanout.map(|f| {
            let coalescer = Coalescer::new(Envelope::Record, budget(config.batching.coalesce_bytes, Envelope::Record));
            (coalescer.with_runs(RUN_RECORDS), f)
        });
        let udp = udp.map(|u| {
            let envelope = Envelope::Datagram { session, protection: protector.protection() };
            let coalesce_bytes = config.batching.coalesce_bytes;
            let budget = if coalesce_bytes == 0 { 0 } else { coalesce_bytes.min(config.max_datagram()) };
            (Coalescer::new(envelope, budget), u)
        });
        let nats = nats.map(|n| {
            let envelope = Envelope::Datagram { session, protection: protector.protection() };
            let limit = config.nats.as_ref().map_or(0, |n| n.max_message);
            let coalesce_bytes = config.batching.coalesce_bytes;
            let budget = if coalesce_bytes == 0 { 0 } else { coalesce_bytes.min(limit) };
            (Coalescer::new(envelope, budget), n)
        });
        Outputs { tcp, udp, nats, ring, protector, session }
    }

    fn frame(&mut self, sequence: u64, format: Format, frame: &[u8], stop: &AtomicBool, summary: &mut EngineSummary) {
        // Held before it is sent anywhere: a request for a frame just received can be served.
        if let Some(ring) = &self.ring {
            lock(ring).push(sequence, format, frame);
        }
        if let Some((coalescer, out)) = &mut self.udp {
            let pushed = coalescer.push(sequence, format, frame, |d| out.send(d.bytes));
            if let Err(too_large) = pushed {
                summary.udp_oversized_frames += 1;
                if mdrelay_iex::warn::allow("udp oversized") {
                    tracing::warn!(sequence, %too_large, "frame not sent over UDP");
                }
            }
        }
        if let Some((coalescer, out)) = &mut self.nats
            && coalescer.push(sequence, format, frame, |d| out.send(d.bytes, stop)).is_err()
        {
            summary.nats_oversized_frames += 1;
        }
        if let Some((coalescer, fanout)) = &mut self.tcp {
            // A frame within the record limit always fits: frames are limited far below it.
            let ring = &self.ring;
            let _ = coalescer.push(sequence, format, frame, |r| publish(ring, fanout, &r, stop));
        }
    }

    /// Sends the datagrams batched for one `sendmmsg` now (what waits in a coalescer stays).
    fn send_datagrams(&mut self) {
        if let Some((_, out)) = &mut self.udp {
            out.flush();
        }
    }

    /// Sends whatever waits in a coalescer, and tells greetings where the stream is.
    fn flush(&mut self, next_sequence: u64, format: Format, stop: &AtomicBool) {
        if let Some((coalescer, out)) = &mut self.udp {
            coalescer.flush(|d| out.send(d.bytes));
            out.flush();
        }
        if let Some((coalescer, out)) = &mut self.nats {
            coalescer.flush(|d| out.send(d.bytes, stop));
        }
        if let Some((coalescer, fanout)) = &mut self.tcp {
            let ring = &self.ring;
            coalescer.flush(|r| publish(ring, fanout, &r, stop));
            fanout.set_position(next_sequence, format);
        }
    }
}

/// Hands a record to the fanout. The ring's mark moves first: a subscriber that resumes reads
/// the mark and joins the fanout under the ring's lock, so it either joins before this record
/// is sent (and skips it, as the replay up to the mark covers it) or after the mark moved past
/// it (and the replay covers it): never neither.
fn publish(ring: &Option<SharedRing>, fanout: &mut Fanout, record: &Sealed, stop: &AtomicBool) {
    if let Some(ring) = ring {
        lock(ring).set_published(record.next_sequence());
    }
    fanout.send(record, stop);
}

/// A coalescing budget in envelope bytes (the setting counts frame bytes).
fn budget(coalesce: usize, envelope: Envelope) -> usize {
    if coalesce == 0 { 0 } else { coalesce.saturating_add(envelope.header_len()) }
}

fn wait_for_subscribers(outputs: &mut Outputs, wanted: usize, stop: &AtomicBool) {
    let Some((_, fanout)) = &mut outputs.tcp else { return };
    if wanted == 0 {
        return;
    }
    tracing::info!(wanted, "waiting for subscribers before sending");
    while fanout.subscriber_count() < wanted && !stop.load(Ordering::Relaxed) {
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Records handed to the TCP fanout at once, at most (and about `MAX_RUN_BYTES`, 1 KiB, of them).
const RUN_RECORDS: usize = 64;

/// Segments between two reads of the clock for `pacing.duration`.
const DEADLINE_EVERY: u32 = 64;

/// Runs the stream to its end: every pass of the source, then the totals. The source is
/// `prepared` when the caller opened it already (an upstream, whose session the outputs took),
/// else opened here. A failure once the stream has begun ends it early, with its END and its
/// summary ([`Ended`]); only one before it begins (the source cannot be opened) is an error.
pub fn run(
    config: &Config,
    prepared: Option<SegmentSource>,
    mut outputs: Outputs,
    controls: &Controls,
    echoes: &Echoes,
) -> Result<Ended> {
    // Before any wait, so the endpoint lists every series from the start.
    let metrics = EngineMetrics::new(&crate::metrics::transports(config));
    let mut source = match prepared {
        Some(source) => source,
        None => SegmentSource::open(&config.source, controls.stop.clone())?,
    };
    if config.pacing.loops != 1 {
        source.keep_for_loops()?;
    }
    // A capture replay shows its progress on a terminal (and nothing anywhere else).
    let progress = source.progress().and_then(|(read, size)| ReplayProgress::new(size, read));
    tracing::info!(source = %source.describe(), format = %config.format, "publishing");
    let mut format = Format::from_id(controls.format.load(Ordering::Relaxed)).unwrap_or(config.format);
    if let Some(tcp) = &config.tcp {
        wait_for_subscribers(&mut outputs, tcp.wait_subscribers, controls.stop.flag());
    }
    let limits = Limits::default();
    let mut codec = Codec::new(format, limits);
    let mut scratch = MessageScratch::new();
    let mut frame = Vec::with_capacity(1 << 20);
    let mut sealed = Vec::with_capacity(1 << 20);
    let mut pacer = Pacer::new(config.pacing, config.profile);
    let mut summary = EngineSummary::default();
    let mut by_type = TypeCounts::new();
    let mut sequence = 1u64;
    let stop = controls.stop.flag();
    let started = Instant::now();
    let deadline = (!config.pacing.duration.is_zero()).then(|| started + config.pacing.duration);
    // At top speed the clock is read for the deadline every DEADLINE_EVERY segments (a read per
    // segment cost a few per cent; the run ends at most microseconds late); paced, every segment,
    // since 64 segments may be minutes of a capture.
    let deadline_every = if config.pacing.mode == PacingMode::TopSpeed { DEADLINE_EVERY } else { 1 };
    let mut until_clock = 0u32;
    let mut by_format = [FormatCount::default(); Format::ALL.len()];
    let mut until_metrics = PUBLISH_EVERY;
    let mut upstream_metrics = source.upstream().map(|_| UpstreamMetrics::new());
    let feed_metrics = source.feed_summary().map(|_| FeedMetrics::new());
    let mut next_live_metrics = Instant::now();
    let publish_metrics = |by_format: &[FormatCount], format, summary: &EngineSummary, pacer: &mut Pacer| {
        let drift = PacingDrift { lag: pacer.take_lag(), lead: pacer.take_lead() };
        metrics.publish(by_format, format, summary.format_switches, summary.udp_oversized_frames, drift);
    };
    // A live feed's next segment comes when it comes: nothing may wait for it in a coalescing
    // buffer, a run or a send batch, so every frame is flushed as it is sent.
    let live = source.is_live();
    let paced = config.pacing.mode != PacingMode::TopSpeed;
    let mut failure: Option<anyhow::Error> = None;
    'stream: loop {
        summary.passes += 1;
        loop {
            let item = match source.next_item() {
                Ok(Some(item)) => item,
                Ok(None) => break,
                Err(e) => {
                    failure = Some(e);
                    break 'stream;
                }
            };
            if stop.load(Ordering::Relaxed) {
                break 'stream;
            }
            if let Some(deadline) = deadline {
                if until_clock == 0 {
                    until_clock = deadline_every;
                    if Instant::now() >= deadline {
                        break 'stream;
                    }
                }
                until_clock -= 1;
            }
            let wanted = Format::from_id(controls.format.load(Ordering::Relaxed)).unwrap_or(format);
            if wanted != format {
                outputs.flush(sequence, format, stop);
                tracing::info!(from = %format, to = %wanted, sequence, "format switch");
                format = wanted;
                codec = Codec::new(format, limits);
                summary.format_switches += 1;
            }
            let Ok(segment) = Segment::parse(item.bytes) else {
                summary.skipped_segments += 1;
                continue;
            };
            // A relayed frame keeps the origin's number: a gap upstream stays a gap here.
            if let Some(origin) = item.origin {
                sequence = origin.sequence;
            }
            if pacer.due(item.time_ns).is_some() {
                // Nothing waits in a coalescing buffer while the pacer sleeps; the metrics are
                // brought up to date in the same idle moment.
                outputs.flush(sequence, format, stop);
                publish_metrics(&by_format, format, &summary, &mut pacer);
                until_metrics = PUBLISH_EVERY;
                if let Some(progress) = &progress {
                    progress.update(summary.totals.messages, summary.passes);
                }
            }
            frame.clear();
            let mut publish_time = 0;
            let messages_before = summary.totals.messages;
            let encoded = scratch.with(|list| {
                summary.undecodable_messages += collect_segment(&segment, list) as u64;
                // A relayed frame keeps the origin's stamp, and is not paced: it is live.
                publish_time = match item.origin {
                    Some(origin) => origin.publish_time,
                    None => pacer.wait(item.time_ns, list.len() as u64),
                };
                for m in list.iter() {
                    by_type.add(m.kind());
                }
                summary.totals.messages += list.len() as u64;
                codec.encode_segment(publish_time, &segment, item.bytes, list, &mut frame)
            });
            if let Err(e) = encoded {
                summary.unencodable_segments += 1;
                if mdrelay_iex::warn::allow("encode") {
                    tracing::warn!(sequence, error = %e, "segment not encodable; skipped");
                }
                continue;
            }
            echoes.sent.record(sequence, publish_time);
            summary.totals.frames += 1;
            // Sealed once here; the ring, every subscriber and every line get these bytes, and
            // the byte counts are of them.
            let wire = if outputs.protector.protection().any() {
                sealed.clear();
                outputs.protector.seal(outputs.session, sequence, format, &frame, &mut sealed);
                &sealed
            } else {
                &frame
            };
            summary.frame_bytes += wire.len() as u64;
            let count = &mut by_format[usize::from(format.id())];
            count.frames += 1;
            count.messages += summary.totals.messages - messages_before;
            count.bytes += wire.len() as u64;
            until_metrics -= 1;
            if until_metrics == 0 {
                until_metrics = PUBLISH_EVERY;
                publish_metrics(&by_format, format, &summary, &mut pacer);
                if let Some(progress) = &progress {
                    progress.update(summary.totals.messages, summary.passes);
                }
            }
            outputs.frame(sequence, format, wire, stop, &mut summary);
            sequence += 1;
            if paced {
                // A frame goes out as it is stamped: held for one batch of datagrams per duty
                // cycle, the cycle's first frames would wait for its last (measured over UDP at
                // 20,000 msg/s in 1 ms cycles: p50 85 µs batched, 25 µs sent as stamped).
                outputs.send_datagrams();
            }
            if let Some(failed) = outputs.nats.as_mut().and_then(|(_, out)| out.failure()) {
                failure = Some(failed);
                break 'stream;
            }
            if live {
                outputs.flush(sequence, format, stop);
                // A live feed's frames may be few: the metrics follow the clock, not a count.
                let now = Instant::now();
                if now >= next_live_metrics {
                    next_live_metrics = now + LIVE_METRICS_EVERY;
                    publish_metrics(&by_format, format, &summary, &mut pacer);
                    if let (Some(m), Some(upstream)) = (&mut upstream_metrics, source.upstream()) {
                        m.publish(upstream);
                    }
                    if let (Some(m), Some(feed)) = (&feed_metrics, source.feed_summary()) {
                        m.publish(&feed);
                    }
                }
            }
            if config.pacing.max_messages > 0 && summary.totals.messages >= config.pacing.max_messages {
                break 'stream;
            }
        }
        if config.pacing.loops != 0 && summary.passes >= config.pacing.loops {
            break;
        }
        match source.rewind() {
            Ok(true) => {}
            Ok(false) => break,
            Err(e) => {
                failure = Some(e);
                break;
            }
        }
        pacer.rewind();
    }
    // The upstream's END says where its stream ended: frames it sent that never came here are
    // missing at the tail downstream too.
    if let Some(end) = source.end_sequence() {
        sequence = sequence.max(end);
    }
    outputs.flush(sequence, format, stop);
    publish_metrics(&by_format, format, &summary, &mut pacer);
    if let (Some(m), Some(upstream)) = (&mut upstream_metrics, source.upstream()) {
        m.publish(upstream);
    }
    summary.feed = source.feed_summary();
    if let (Some(m), Some(feed)) = (&feed_metrics, &summary.feed) {
        m.publish(feed);
    }
    if let Some(progress) = &progress {
        progress.finish();
    }
    summary.seconds = started.elapsed().as_secs_f64();
    summary.totals.by_type = by_type.by_byte();
    summary.source_skipped = source.skipped();
    summary.upstream = source.upstream_summary();
    summary.pacing_reanchors = pacer.reanchors();
    // A relay's END carries its upstream's totals, or says its stream was cut short
    // (`Upstream::end_totals`), so no leaf takes a truncated session for a whole one.
    let mut end_totals = source.upstream().map_or_else(|| summary.totals.clone(), |u| u.end_totals(&summary.totals));
    end_totals.truncated |= failure.is_some();
    summary.totals.truncated = end_totals.truncated;
    let mut totals = Vec::new();
    end_totals.write(&mut totals);
    if let Some((_, fanout)) = &mut outputs.tcp {
        fanout.end(Bytes::from(control_record(RecordTag::End, format, sequence, &totals)), stop);
    }
    if let Some((_, udp)) = &mut outputs.udp {
        udp.end(format, sequence, &totals, &mut outputs.protector);
        summary.udp_send_errors = udp.send_errors;
    }
    if let Some((_, nats)) = &mut outputs.nats {
        nats.end(format, sequence, &totals, &mut outputs.protector);
        if let Some(failed) = nats.failure() {
            failure.get_or_insert(failed);
        }
    }
    match &failure {
        None => tracing::info!(
            frames = summary.totals.frames,
            messages = summary.totals.messages,
            seconds = summary.seconds,
            "end of stream"
        ),
        Some(failure) => tracing::error!(
            frames = summary.totals.frames,
            messages = summary.totals.messages,
            seconds = summary.seconds,
            error = %format!("{failure:#}"),
            "the stream ends early: its END says it was cut short"
        ),
    }
    // The first line of the run's printed summary: whether the input itself lost anything.
    if let Some(feed) = &summary.feed {
        println!("{}: {feed}", source.describe());
    }
    Ok(Ended { summary, failure })
}
