//! The hot path: source → pacing → encoding → TCP fanout and UDP, on a thread of its own.
//!
//! It runs outside the async runtime on purpose: pacing spins for the last stretch of each wait
//! (an async timer's millisecond granularity is far coarser than gaps between packets), and
//! capture reading and gunzip are blocking work. The runtime keeps the subscribers' sockets; the
//! hot path owns the subscriber list (see [`crate::fanout`]) and never waits on a lock of theirs:
//! paced, it writes into the sockets of current subscribers when it can try-lock them.

use crate::config::{Config, PacingMode};
use crate::fanout::Fanout;
use crate::item::Item;
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
    /// The state of the frames published, for snapshots (`tcp.snapshots`,
    /// `retransmit.snapshots`).
    pub state: Option<crate::snapshot::StateKeeper>,
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
            // Written by the hot thread, a run leaves as soon as it is made: short runs keep a
            // cycle's first frames from waiting for its last (a run each frame cost twice the
            // CPU at 100,000 msg/s for no lower p50; docs/benchmarks.md).
            let run = if f.hot_writes() { HOT_RUN_RECORDS } else { RUN_RECORDS };
            (coalescer.with_runs(run), f)
        });
        let udp = udp.map(|u| {
            let envelope = Envelope::Datagram { session, protection: protector.protection() };
            let coalesce_bytes = config.batching.coalesce_bytes;
            let budget = if coalesce_bytes == 0 { 0 } else { coalesce_bytes.min(config.max_datagram()) };
            (Coalescer::new(envelope, budget).with_wide_datagrams(config.batching.wide_datagrams), u)
        });
        let nats = nats.map(|n| {
            let envelope = Envelope::Datagram { session, protection: protector.protection() };
            let limit = config.nats.as_ref().map_or(0, |n| n.max_message);
            let coalesce_bytes = config.batching.coalesce_bytes;
            let budget = if coalesce_bytes == 0 { 0 } else { coalesce_bytes.min(limit) };
            (Coalescer::new(envelope, budget).with_wide_datagrams(config.batching.wide_datagrams), n)
        });
        Outputs { tcp, udp, nats, ring, protector, session, state: None }
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
            let (ring, state) = (&self.ring, &mut self.state);
            let _ = coalescer.push(sequence, format, frame, |r| publish(ring, state, fanout, &r, stop));
        } else if let Some(state) = &mut self.state {
            // Without TCP, the state serves the retransmission service's snapshots: the frame
            // is in the ring already, so the state is never ahead of it.
            state.published(sequence.saturating_add(1));
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
            let (ring, state) = (&self.ring, &mut self.state);
            coalescer.flush(|r| publish(ring, state, fanout, &r, stop));
            fanout.set_position(next_sequence, format);
        }
    }
}

/// Hands a record to the fanout. The ring's mark moves first: a subscriber that resumes reads
/// the mark and joins the fanout under the ring's lock, so it either joins before this record
/// is sent (and skips it, as the replay up to the mark covers it) or after the mark moved past
/// it (and the replay covers it): never neither. The state for snapshots takes the record's
/// frames after the mark moved, so it is never ahead of it, and after the record is on its way,
/// so the subscribers' latency does not wait for it.
fn publish(
    ring: &Option<SharedRing>,
    state: &mut Option<crate::snapshot::StateKeeper>,
    fanout: &mut Fanout,
    record: &Sealed,
    stop: &AtomicBool,
) {
    if let Some(ring) = ring {
        lock(ring).set_published(record.next_sequence());
    }
    fanout.send(record, stop);
    if let Some(state) = state {
        state.published(record.next_sequence());
    }
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

/// Records in a run when the hot thread writes them into subscribers' sockets (`tcp.hot_writes`).
const HOT_RUN_RECORDS: usize = 4;

/// Segments between two reads of the clock for `pacing.duration`.
const DEADLINE_EVERY: u32 = 64;

/// What one segment came to.
enum Stepped {
    /// Its frame went out.
    Sent,
    /// It was skipped (not a segment, or not encodable) and counted.
    Skipped,
    /// The stream ends here: a stop, the time limit, or a failed output (`Some`).
    Ends(Option<anyhow::Error>),
}

/// The publishing loop's state, stepped once per segment of the source: a duty cycle of
/// [`Publishing::segment`] (the stop, the time limit and a format switch looked at, the segment
/// decoded, paced and encoded) and [`Publishing::frame`] (sealed, counted and handed to the
/// outputs), with the metrics published between them every [`PUBLISH_EVERY`] frames or when the
/// pacer has time to spare.
struct Publishing<'a> {
    config: &'a Config,
    controls: &'a Controls,
    echoes: &'a Echoes,
    outputs: Outputs,
    metrics: EngineMetrics,
    progress: Option<ReplayProgress>,
    limits: Limits,
    format: Format,
    codec: Codec,
    scratch: MessageScratch,
    /// The frame encoded, and sealed when protection is on: buffers reused for every frame.
    frame: Vec<u8>,
    sealed: Vec<u8>,
    pacer: Pacer,
    summary: EngineSummary,
    by_type: TypeCounts,
    by_format: [FormatCount; Format::ALL.len()],
    sequence: u64,
    /// `pacing.duration`'s end, read every `deadline_every` segments.
    deadline: Option<Instant>,
    deadline_every: u32,
    until_clock: u32,
    until_metrics: u64,
    /// A live feed: every frame flushed as it is sent, the metrics following the clock.
    live: bool,
    next_live_metrics: Instant,
    upstream_metrics: Option<UpstreamMetrics>,
    feed_metrics: Option<FeedMetrics>,
    /// Paced: each frame's datagrams go out as it is stamped.
    paced: bool,
}

impl Publishing<'_> {
    /// One segment of the source: stop, deadline and format switch looked at, then decoded,
    /// paced and encoded; its frame goes on to [`Publishing::frame`].
    #[inline]
    fn segment(&mut self, item: Item<'_>) -> Stepped {
        let stop = self.controls.stop.flag();
        if stop.load(Ordering::Relaxed) {
            return Stepped::Ends(None);
        }
        if let Some(deadline) = self.deadline {
            if self.until_clock == 0 {
                self.until_clock = self.deadline_every;
                if Instant::now() >= deadline {
                    return Stepped::Ends(None);
                }
            }
            self.until_clock -= 1;
        }
        let wanted = Format::from_id(self.controls.format.load(Ordering::Relaxed)).unwrap_or(self.format);
        if wanted != self.format {
            self.outputs.flush(self.sequence, self.format, stop);
            tracing::info!(from = %self.format, to = %wanted, sequence = self.sequence, "format switch");
            self.format = wanted;
            self.codec = Codec::new(wanted, self.limits);
            self.summary.format_switches += 1;
        }
        let Ok(segment) = Segment::parse(item.bytes) else {
            self.summary.skipped_segments += 1;
            return Stepped::Skipped;
        };
        // A relayed frame keeps the origin's number: a gap upstream stays a gap here.
        if let Some(origin) = item.origin {
            self.sequence = origin.sequence;
        }
        if self.pacer.due(item.time_ns).is_some() {
            // Nothing waits in a coalescing buffer while the pacer sleeps; the metrics are
            // brought up to date in the same idle moment.
            self.outputs.flush(self.sequence, self.format, stop);
            self.publish_metrics();
        }
        self.frame.clear();
        let mut publish_time = 0;
        let messages_before = self.summary.totals.messages;
        let Publishing { scratch, summary, pacer, by_type, codec, frame, outputs, sequence, .. } = self;
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
            let encoded = codec.encode_segment(publish_time, &segment, item.bytes, list, frame);
            if encoded.is_ok()
                && let Some(state) = &mut outputs.state
            {
                state.frame(*sequence, list);
            }
            encoded
        });
        if let Err(e) = encoded {
            self.summary.unencodable_segments += 1;
            if mdrelay_iex::warn::allow("encode") {
                tracing::warn!(sequence = self.sequence, error = %e, "segment not encodable; skipped");
            }
            return Stepped::Skipped;
        }
        self.frame(publish_time, self.summary.totals.messages - messages_before)
    }

    /// The frame just encoded (`messages` of them, stamped `publish_time`): sealed once, counted,
    /// and handed to the ring, every subscriber and every line, which all get these bytes.
    #[inline]
    fn frame(&mut self, publish_time: i64, messages: u64) -> Stepped {
        let stop = self.controls.stop.flag();
        self.echoes.sent.record(self.sequence, publish_time);
        self.summary.totals.frames += 1;
        let sealed = self.outputs.protector.protection().any();
        if sealed {
            self.sealed.clear();
            self.outputs.protector.seal(
                self.outputs.session,
                self.sequence,
                self.format,
                &self.frame,
                &mut self.sealed,
            );
        }
        let wire_len = if sealed { self.sealed.len() } else { self.frame.len() } as u64;
        self.summary.frame_bytes += wire_len;
        let count = &mut self.by_format[usize::from(self.format.id())];
        count.frames += 1;
        count.messages += messages;
        count.bytes += wire_len;
        self.until_metrics -= 1;
        if self.until_metrics == 0 {
            self.publish_metrics();
        }
        let wire = if sealed { &self.sealed } else { &self.frame };
        self.outputs.frame(self.sequence, self.format, wire, stop, &mut self.summary);
        self.sequence += 1;
        if self.paced {
            // A frame goes out as it is stamped: held for one batch of datagrams per duty
            // cycle, the cycle's first frames would wait for its last (measured over UDP at
            // 20,000 msg/s in 1 ms cycles: p50 85 µs batched, 25 µs sent as stamped).
            self.outputs.send_datagrams();
        }
        if let Some(failed) = self.outputs.nats.as_mut().and_then(|(_, out)| out.failure()) {
            return Stepped::Ends(Some(failed));
        }
        if self.live {
            self.outputs.flush(self.sequence, self.format, stop);
        }
        Stepped::Sent
    }

    /// The engine's metrics and the replay's progress brought up to date.
    fn publish_metrics(&mut self) {
        self.until_metrics = PUBLISH_EVERY;
        let drift = PacingDrift { lag: self.pacer.take_lag(), lead: self.pacer.take_lead() };
        let summary = &self.summary;
        self.metrics.publish(
            &self.by_format,
            self.format,
            summary.format_switches,
            summary.udp_oversized_frames,
            drift,
        );
        if let Some(progress) = &self.progress {
            progress.update(summary.totals.messages, summary.passes);
        }
    }

    /// A live feed's metrics, on the clock (its frames may be few).
    fn live_metrics(&mut self, source: &SegmentSource) {
        let now = Instant::now();
        if now < self.next_live_metrics {
            return;
        }
        self.next_live_metrics = now + LIVE_METRICS_EVERY;
        self.publish_metrics();
        if let (Some(m), Some(upstream)) = (&mut self.upstream_metrics, source.upstream()) {
            m.publish(upstream);
        }
        if let (Some(m), Some(feed)) = (&self.feed_metrics, source.feed_summary()) {
            m.publish(&feed);
        }
    }

    /// Whether `pacing.max_messages` were sent.
    fn sent_enough(&self) -> bool {
        let max = self.config.pacing.max_messages;
        max > 0 && self.summary.totals.messages >= max
    }
}

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
    let format = Format::from_id(controls.format.load(Ordering::Relaxed)).unwrap_or(config.format);
    if let Some(tcp) = &config.tcp {
        wait_for_subscribers(&mut outputs, tcp.wait_subscribers, controls.stop.flag());
    }
    let limits = Limits::default();
    let started = Instant::now();
    let mut run = Publishing {
        config,
        controls,
        echoes,
        outputs,
        metrics,
        progress,
        limits,
        format,
        codec: Codec::new(format, limits),
        scratch: MessageScratch::new(),
        frame: Vec::with_capacity(1 << 20),
        sealed: Vec::with_capacity(1 << 20),
        pacer: Pacer::new(config.pacing, config.profile),
        summary: EngineSummary::default(),
        by_type: TypeCounts::new(),
        by_format: [FormatCount::default(); Format::ALL.len()],
        sequence: 1,
        deadline: (!config.pacing.duration.is_zero()).then(|| started + config.pacing.duration),
        // At top speed the clock is read for the deadline every DEADLINE_EVERY segments (a read
        // per segment cost a few per cent; the run ends at most microseconds late); paced, every
        // segment, since 64 segments may be minutes of a capture.
        deadline_every: if config.pacing.mode == PacingMode::TopSpeed { DEADLINE_EVERY } else { 1 },
        until_clock: 0,
        until_metrics: PUBLISH_EVERY,
        // A live feed's next segment comes when it comes: nothing may wait for it in a
        // coalescing buffer, a run or a send batch, so every frame is flushed as it is sent.
        live: source.is_live(),
        next_live_metrics: Instant::now(),
        upstream_metrics: source.upstream().map(|_| UpstreamMetrics::new()),
        feed_metrics: source.feed_summary().map(|_| FeedMetrics::new()),
        paced: config.pacing.mode != PacingMode::TopSpeed,
    };
    let mut failure: Option<anyhow::Error> = None;
    'stream: loop {
        run.summary.passes += 1;
        loop {
            let item = match source.next_item() {
                Ok(Some(item)) => item,
                Ok(None) => break,
                Err(e) => {
                    failure = Some(e);
                    break 'stream;
                }
            };
            match run.segment(item) {
                Stepped::Sent => {}
                Stepped::Skipped => continue,
                Stepped::Ends(failed) => {
                    failure = failed;
                    break 'stream;
                }
            }
            if run.live {
                run.live_metrics(&source);
            }
            if run.sent_enough() {
                break 'stream;
            }
        }
        if config.pacing.loops != 0 && run.summary.passes >= config.pacing.loops {
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
        run.pacer.rewind();
    }
    Ok(run.finish(&source, failure, started))
}

impl Publishing<'_> {
    /// The stream's end: the last frames flushed, the metrics and the summary brought up to date,
    /// and the END with its totals sent on every output.
    fn finish(mut self, source: &SegmentSource, mut failure: Option<anyhow::Error>, started: Instant) -> Ended {
        let stop = self.controls.stop.flag();
        // The upstream's END says where its stream ended: frames it sent that never came here
        // are missing at the tail downstream too.
        if let Some(end) = source.end_sequence() {
            self.sequence = self.sequence.max(end);
        }
        let (sequence, format) = (self.sequence, self.format);
        self.outputs.flush(sequence, format, stop);
        self.publish_metrics();
        if let (Some(m), Some(upstream)) = (&mut self.upstream_metrics, source.upstream()) {
            m.publish(upstream);
        }
        let mut summary = std::mem::take(&mut self.summary);
        summary.feed = source.feed_summary();
        if let (Some(m), Some(feed)) = (&self.feed_metrics, &summary.feed) {
            m.publish(feed);
        }
        if let Some(progress) = &self.progress {
            progress.finish();
        }
        summary.seconds = started.elapsed().as_secs_f64();
        summary.totals.by_type = self.by_type.by_byte();
        summary.source_skipped = source.skipped();
        summary.upstream = source.upstream_summary();
        summary.pacing_reanchors = self.pacer.reanchors();
        // A relay's END carries its upstream's totals, or says its stream was cut short
        // (`Upstream::end_totals`), so no leaf takes a truncated session for a whole one.
        let mut end_totals =
            source.upstream().map_or_else(|| summary.totals.clone(), |u| u.end_totals(&summary.totals));
        end_totals.truncated |= failure.is_some();
        summary.totals.truncated = end_totals.truncated;
        let mut totals = Vec::new();
        end_totals.write(&mut totals);
        let outputs = &mut self.outputs;
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
        Ended { summary, failure }
    }
}
