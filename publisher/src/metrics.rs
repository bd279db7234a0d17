//! The publisher's Prometheus metrics (`[metrics] listen`; the endpoint is
//! `mdrelay_telemetry::prometheus`).
//!
//! Two writers, so the hot path pays next to nothing:
//! - the hot path counts frames, messages and bytes per format in plain integers and copies them
//!   into the exporter's atomics ([`EngineMetrics::publish`]) before each pacing wait and every
//!   [`PUBLISH_EVERY`] frames at top speed, plus the pacing lag and format switches;
//! - a task on the runtime ([`sample`]) reads, once a second, what the connection tasks and the
//!   retransmission service already count (subscribers, queue depths, drops, disconnects,
//!   requests), so their own paths gain nothing either.
//!
//! Without an endpoint the `metrics` macros hand out no-op handles, and the copies cost a few
//! stores per thousand frames.

use crate::fanout::Shared;
use crate::retransmit::Service;
use crate::source::FeedSummary;
use crate::upstream::{Upstream, UpstreamSummary};
use mdrelay_codec::Format;
use mdrelay_telemetry::prometheus::HistogramExport;
use metrics::{Counter, Gauge, Unit, counter, describe_counter, describe_gauge, describe_histogram, gauge, histogram};
use std::sync::Arc;
use std::time::Duration;

/// Frames between two copies of the hot path's counts at top speed.
pub const PUBLISH_EVERY: u64 = 4096;

/// How often a live source's counts are copied (its frames may be too few for a count to do).
pub const LIVE_METRICS_EVERY: Duration = Duration::from_secs(1);

/// How often [`sample`] reads the connection tasks' and the service's counts.
pub const SAMPLE_EVERY: Duration = Duration::from_secs(1);

/// Bytes of the frames handed to a transport, by format and transport.
pub const SENT_FRAME_BYTES: &str = "mdrelay_pub_sent_frame_bytes_total";
/// Retransmission requests over the rate limit, answered BUSY.
pub const RETRANSMIT_THROTTLED_REQUESTS: &str = "mdrelay_pub_retransmit_throttled_requests_total";

/// Metrics renamed to follow Prometheus's naming conventions, `(old, new)`: the old name is still
/// served for one release, with the same value and a HELP line naming its replacement, so that
/// dashboards and rules written against it keep working while they move (docs/operations.md
/// lists them). Remove them in the release after the one that renamed them.
pub const RENAMED: [(&str, &str); 2] = [
    // The unit last, before `_total`.
    ("mdrelay_pub_frame_bytes_sent_total", SENT_FRAME_BYTES),
    // A counter names what it counts.
    ("mdrelay_pub_retransmit_throttled_total", RETRANSMIT_THROTTLED_REQUESTS),
];

/// A counter served under its name and, for one release, under its old one ([`RENAMED`]): both
/// are set together, so they always hold the same value.
struct Renamed {
    counter: Counter,
    old: Counter,
}

impl Renamed {
    /// The counter `new` with `labels`, and its old name's with the same labels.
    fn new(new: &'static str, labels: &[(&'static str, &'static str)]) -> Renamed {
        let old = RENAMED.iter().find(|(_, n)| *n == new).map_or(new, |(old, _)| *old);
        Renamed { counter: counter!(new, labels), old: counter!(old, labels) }
    }

    /// Sets both to `value`.
    fn absolute(&self, value: u64) {
        self.counter.absolute(value);
        self.old.absolute(value);
    }
}

/// Frames, messages and bytes encoded in one format, as the hot path counts them.
#[derive(Debug, Default, Clone, Copy)]
pub struct FormatCount {
    /// Frames encoded.
    pub frames: u64,
    /// Messages in them.
    pub messages: u64,
    /// Frame bytes (without relay headers).
    pub bytes: u64,
}

/// One format's counters on one transport.
struct Sent {
    frames: Counter,
    messages: Counter,
    bytes: Renamed,
}

/// How far paced segments strayed from their schedule since the last look.
#[derive(Debug, Clone, Copy, Default)]
pub struct PacingDrift {
    /// The latest a segment went out after its time.
    pub lag: Duration,
    /// The earliest a segment went out before its time (with a duty cycle).
    pub lead: Duration,
}

/// The hot path's metrics: counters per format and transport, switches, the pacing lag.
pub struct EngineMetrics {
    /// `[format][transport]`.
    sent: Vec<Vec<Sent>>,
    format: Vec<Gauge>,
    switches: Counter,
    lag: Gauge,
    lead: Gauge,
    oversized: Counter,
}

/// Counters set together from one summary of type `T`, once a second: each served under its
/// name with its HELP line, and copying one count of the summary.
struct CopiedCounters<T: 'static, const N: usize> {
    counters: [(Counter, Count<T>); N],
}

/// Which count of a summary a counter copies.
type Count<T> = fn(&T) -> u64;

/// A counter of [`CopiedCounters`]: its name, its HELP line, and the count it copies.
type CopiedCounter<T> = (&'static str, &'static str, Count<T>);

impl<T, const N: usize> CopiedCounters<T, N> {
    /// Describes and registers the counters of `table`.
    fn new(table: [CopiedCounter<T>; N]) -> Self {
        for (name, help, _) in table {
            describe_counter!(name, help);
        }
        CopiedCounters { counters: table.map(|(name, _, count)| (counter!(name), count)) }
    }

    /// Copies each counter's count of `summary`.
    fn publish(&self, summary: &T) {
        for (counter, count) in &self.counters {
            counter.absolute(count(summary));
        }
    }
}

/// What a relay counts of its upstream, as [`UpstreamMetrics`] serves it.
const UPSTREAM_COUNTERS: [CopiedCounter<UpstreamSummary>; 6] = [
    ("mdrelay_pub_upstream_frames_total", "Frames received from the upstream publisher.", |c| c.frames),
    ("mdrelay_pub_upstream_gap_frames_total", "Frames missing from the upstream's numbering.", |c| c.gaps),
    ("mdrelay_pub_upstream_decode_errors_total", "Upstream frames that did not decode.", |c| c.decode_errors),
    ("mdrelay_pub_upstream_reconnects_total", "Connections to the upstream made again.", |c| c.reconnects),
    (
        "mdrelay_pub_upstream_protocol_violations_total",
        "Upstream records whose numbers did not fit the stream (the connection was made again).",
        |c| c.protocol_violations,
    ),
    (
        "mdrelay_pub_upstream_crc_failures_total",
        "Upstream frames whose CRC-32C did not match (the connection was made again).",
        |c| c.crc_failures,
    ),
];

/// What a live feed's input counts, as [`FeedMetrics`] serves it.
const FEED_COUNTERS: [CopiedCounter<FeedSummary>; 9] = [
    ("mdrelay_pub_feed_segments_total", "IEX-TP segments received on the live feed, copies included.", |f| f.segments),
    ("mdrelay_pub_feed_gaps_total", "Gaps in the live feed's numbering (ranges of messages skipped).", |f| {
        f.sequence.gaps
    }),
    (
        "mdrelay_pub_feed_gap_messages_total",
        "Messages of the live feed skipped and never received (a late segment takes its messages out).",
        |f| f.sequence.gap_messages,
    ),
    ("mdrelay_pub_feed_late_messages_total", "Messages of the live feed that arrived late, filling a gap.", |f| {
        f.sequence.late_messages
    }),
    (
        "mdrelay_pub_feed_duplicate_segments_total",
        "Segments of the live feed with nothing new (copies, stale heartbeats): dropped, not relayed.",
        |f| f.sequence.duplicate_segments,
    ),
    ("mdrelay_pub_feed_reordered_segments_total", "Late segments of the live feed, relayed.", |f| {
        f.sequence.reordered_segments
    }),
    (
        "mdrelay_pub_feed_overlapping_segments_total",
        "Segments of the live feed partly received before, relayed whole.",
        |f| f.sequence.overlapping_segments,
    ),
    (
        "mdrelay_pub_feed_repeated_messages_total",
        "Messages relayed twice because an overlapping segment repeated them.",
        |f| f.sequence.repeated_messages,
    ),
    (
        "mdrelay_pub_feed_restarts_total",
        "Times the live feed's numbering started again: within a session, or with a new session.",
        |f| f.sequence.restarts,
    ),
];

/// A relay's view of its upstream: this hop's latency from the origin, and what arrived.
pub struct UpstreamMetrics {
    latency: metrics::Histogram,
    exported: HistogramExport,
    counts: CopiedCounters<UpstreamSummary, 6>,
}

impl UpstreamMetrics {
    /// Handles for a relay fed by an upstream publisher.
    pub fn new() -> UpstreamMetrics {
        describe_histogram!(
            "mdrelay_pub_upstream_latency_seconds",
            Unit::Seconds,
            "This hop's latency per frame: receipt from the upstream minus the origin's publish time."
        );
        UpstreamMetrics {
            latency: histogram!("mdrelay_pub_upstream_latency_seconds"),
            exported: HistogramExport::new(),
            counts: CopiedCounters::new(UPSTREAM_COUNTERS),
        }
    }

    /// Copies the upstream's counts, and the latencies recorded since the last copy.
    pub fn publish(&mut self, upstream: &dyn Upstream) {
        self.counts.publish(&upstream.counts());
        self.exported.export(&self.latency, upstream.latency());
    }
}

impl Default for UpstreamMetrics {
    fn default() -> Self {
        UpstreamMetrics::new()
    }
}

/// A live feed's input by its IEX-TP numbering (`docs/operations.md`, "Loss on the live input").
pub struct FeedMetrics {
    counts: CopiedCounters<FeedSummary, 9>,
}

impl FeedMetrics {
    /// Handles for a publisher fed by a live feed.
    pub fn new() -> FeedMetrics {
        FeedMetrics { counts: CopiedCounters::new(FEED_COUNTERS) }
    }

    /// Copies the feed's counts.
    pub fn publish(&self, feed: &FeedSummary) {
        self.counts.publish(feed);
    }
}

impl Default for FeedMetrics {
    fn default() -> Self {
        FeedMetrics::new()
    }
}

/// Names the transports a configuration sends on, as the `transport` label has them.
pub fn transports(config: &crate::config::Config) -> Vec<&'static str> {
    let mut names = Vec::new();
    if config.tcp.is_some() {
        names.push("tcp");
    }
    if config.udp.is_some() {
        names.push("udp");
    }
    if config.multicast.is_some() {
        names.push("multicast");
    }
    if config.nats.is_some() {
        names.push("nats");
    }
    names
}

impl EngineMetrics {
    /// Handles for the transports in `transports` (see [`transports`]).
    pub fn new(transports: &[&'static str]) -> EngineMetrics {
        describe();
        let sent = Format::ALL
            .iter()
            .map(|f| {
                transports
                    .iter()
                    .map(|&t| {
                        let labels = [("format", f.name()), ("transport", t)];
                        Sent {
                            frames: counter!("mdrelay_pub_frames_sent_total", &labels),
                            messages: counter!("mdrelay_pub_messages_sent_total", &labels),
                            bytes: Renamed::new(SENT_FRAME_BYTES, &labels),
                        }
                    })
                    .collect()
            })
            .collect();
        EngineMetrics {
            sent,
            format: Format::ALL.iter().map(|f| gauge!("mdrelay_pub_format", "format" => f.name())).collect(),
            switches: counter!("mdrelay_pub_format_switches_total"),
            lag: gauge!("mdrelay_pub_pacing_lag_seconds"),
            lead: gauge!("mdrelay_pub_pacing_lead_seconds"),
            oversized: counter!("mdrelay_pub_udp_oversized_frames_total"),
        }
    }

    /// Copies the hot path's counts: `by_format` indexed by [`Format::id`], the format now in use,
    /// the switches and UDP frames too large so far, and the worst pacing lag and lead (how early
    /// a duty cycle sent a segment) since the last copy.
    pub fn publish(
        &self,
        by_format: &[FormatCount],
        format: Format,
        switches: u64,
        oversized: u64,
        pacing: PacingDrift,
    ) {
        for (count, per_transport) in by_format.iter().zip(&self.sent) {
            for sent in per_transport {
                sent.frames.absolute(count.frames);
                sent.messages.absolute(count.messages);
                sent.bytes.absolute(count.bytes);
            }
        }
        for (f, gauge) in Format::ALL.iter().zip(&self.format) {
            gauge.set(if *f == format { 1.0 } else { 0.0 });
        }
        self.switches.absolute(switches);
        self.oversized.absolute(oversized);
        self.lag.set(pacing.lag.as_secs_f64());
        self.lead.set(pacing.lead.as_secs_f64());
    }
}

/// What [`sample`] reads.
#[derive(Clone)]
pub struct Sources {
    /// The TCP server's shared state, if it runs.
    pub tcp: Option<Arc<Shared>>,
    /// The retransmission service, if it runs.
    pub retransmit: Option<Service>,
    /// `mdrelay_build_info`, set again with the other gauges so it stays in the scrape.
    pub build_info: Gauge,
    /// The NATS output's counts, if it runs.
    pub nats: Option<Arc<crate::nats::NatsCounters>>,
}

/// Copies the connection tasks' and the service's counts into the exporter every
/// [`SAMPLE_EVERY`], until the task is dropped; [`sample_once`] takes the final copy.
pub async fn sample(sources: Sources) {
    let mut tick = tokio::time::interval(SAMPLE_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        sample_once(&sources);
    }
}

/// One copy of the connection tasks' and the service's counts.
pub fn sample_once(sources: &Sources) {
    sources.build_info.set(1.0);
    if let Some(shared) = &sources.tcp {
        let c = shared.counters.snapshot();
        counter!("mdrelay_pub_connections_total").absolute(c.connections);
        counter!("mdrelay_pub_connections_refused_total", "reason" => "busy").absolute(c.busy);
        counter!("mdrelay_pub_connections_refused_total", "reason" => "handshake").absolute(c.handshake_failures);
        counter!("mdrelay_pub_disconnects_total", "reason" => "slow").absolute(c.disconnects_slow);
        counter!("mdrelay_pub_disconnects_total", "reason" => "protocol_violation").absolute(c.protocol_violations);
        counter!("mdrelay_pub_accept_errors_total").absolute(c.accept_errors);
        counter!("mdrelay_pub_dropped_frames_total", "policy" => shared.policy.name()).absolute(c.dropped_frames);
        gauge!("mdrelay_pub_subscribers").set(c.subscribers as f64);
        // Bounded series only: a label per peer (an ephemeral port each) would make a series
        // per connection, and every reconnect another. Who is slow is in the logs and summary.
        let (mut deepest, mut queued_all) = (0u64, 0u64);
        shared.summaries.queued(|queued| {
            deepest = deepest.max(queued);
            queued_all = queued_all.saturating_add(queued);
        });
        gauge!("mdrelay_pub_subscriber_queue_max_records").set(deepest as f64);
        gauge!("mdrelay_pub_subscriber_queued_records").set(queued_all as f64);
    }
    if let Some(service) = &sources.retransmit {
        let s = service.summary();
        counter!("mdrelay_pub_retransmit_requests_total").absolute(s.requests);
        Renamed::new(RETRANSMIT_THROTTLED_REQUESTS, &[]).absolute(s.throttled);
        counter!("mdrelay_pub_retransmit_frames_total").absolute(s.frames_sent);
        counter!("mdrelay_pub_retransmit_gone_frames_total").absolute(s.frames_gone);
        counter!("mdrelay_pub_retransmit_bytes_total").absolute(s.bytes_sent);
        counter!("mdrelay_pub_retransmit_requests_ahead_total").absolute(s.requests_ahead);
        counter!("mdrelay_pub_retransmit_busy_connections_total").absolute(s.busy_at_connect);
        counter!("mdrelay_pub_retransmit_disconnects_total", "reason" => "evicted").absolute(s.evicted);
        counter!("mdrelay_pub_retransmit_disconnects_total", "reason" => "idle").absolute(s.idle_timeouts);
        counter!("mdrelay_pub_retransmit_disconnects_total", "reason" => "request_timeout")
            .absolute(s.request_timeouts);
        gauge!("mdrelay_pub_ring_frames").set(s.ring_next.saturating_sub(s.ring_first) as f64);
    }
    if let Some(nats) = &sources.nats {
        let n = nats.summary();
        counter!("mdrelay_pub_nats_messages_total", "outcome" => "published").absolute(n.published);
        counter!("mdrelay_pub_nats_messages_total", "outcome" => "acknowledged").absolute(n.acknowledged);
        counter!("mdrelay_pub_nats_messages_total", "outcome" => "duplicate").absolute(n.duplicates);
        counter!("mdrelay_pub_nats_messages_total", "outcome" => "taken").absolute(n.taken);
        counter!("mdrelay_pub_nats_messages_total", "outcome" => "retried").absolute(n.retries);
        counter!("mdrelay_pub_nats_messages_total", "outcome" => "dropped").absolute(n.dropped);
        counter!("mdrelay_pub_nats_reconnects_total").absolute(n.reconnects);
        counter!("mdrelay_pub_nats_stream_recreations_total").absolute(n.stream_recreations);
        gauge!("mdrelay_pub_nats_acks_pending").set(n.pending_acks as f64);
        gauge!("mdrelay_pub_nats_queue_bytes").set(n.held_bytes as f64);
    }
}

/// What kind of series a HELP line of [`DESCRIBED`] is for.
#[derive(Clone, Copy)]
enum Kind {
    Counter,
    Gauge,
}

/// The HELP lines and units of the series [`EngineMetrics`] and [`sample_once`] serve: the kind
/// of series, its name, its unit if it has one, and its HELP line.
const DESCRIBED: [(Kind, &str, Option<Unit>, &str); 30] = [
    (Kind::Counter, "mdrelay_pub_frames_sent_total", None, "Frames handed to a transport, by wire format."),
    (
        Kind::Counter,
        "mdrelay_pub_nats_messages_total",
        None,
        "NATS messages by outcome: published, acknowledged by JetStream, acknowledged as a duplicate id of this message's own copy, found under an id another message had taken (published again under a new id), published again after a failure, dropped for a full queue.",
    ),
    (Kind::Counter, "mdrelay_pub_nats_reconnects_total", None, "Connections to a NATS server after the first."),
    (
        Kind::Counter,
        "mdrelay_pub_nats_stream_recreations_total",
        None,
        "Times the JetStream stream was found deleted while publishing, and created again (nats.create_stream).",
    ),
    (
        Kind::Gauge,
        "mdrelay_pub_nats_acks_pending",
        None,
        "NATS messages published and not yet acknowledged by JetStream.",
    ),
    (
        Kind::Gauge,
        "mdrelay_pub_nats_queue_bytes",
        Some(Unit::Bytes),
        "Bytes of NATS messages held for the server: queued, or published and not yet acknowledged (at most nats.queue_bytes).",
    ),
    (Kind::Counter, "mdrelay_pub_messages_sent_total", None, "IEX messages in the frames handed to a transport."),
    (
        Kind::Counter,
        SENT_FRAME_BYTES,
        Some(Unit::Bytes),
        "Encoded frame bytes handed to a transport (without relay headers).",
    ),
    (Kind::Gauge, "mdrelay_pub_format", None, "1 for the wire format in use, 0 for the others."),
    (Kind::Counter, "mdrelay_pub_format_switches_total", None, "Wire format switches (SIGHUP with an edited format)."),
    (
        Kind::Gauge,
        "mdrelay_pub_pacing_lag_seconds",
        Some(Unit::Seconds),
        "How far behind its schedule a paced segment went out: the most since the last update.",
    ),
    (
        Kind::Gauge,
        "mdrelay_pub_pacing_lead_seconds",
        Some(Unit::Seconds),
        "How far ahead of its schedule a paced segment went out with its duty cycle: the most since the last update.",
    ),
    (
        Kind::Counter,
        "mdrelay_pub_udp_oversized_frames_total",
        None,
        "Frames too large for a datagram, not sent over UDP.",
    ),
    (Kind::Gauge, "mdrelay_pub_subscribers", None, "TCP subscribers connected and taking the stream."),
    (
        Kind::Gauge,
        "mdrelay_pub_subscriber_queue_max_records",
        None,
        "Records queued for the most backed-up TCP subscriber, not taken by its connection yet (the slow-subscriber policy acts at tcp.queue).",
    ),
    (
        Kind::Gauge,
        "mdrelay_pub_subscriber_queued_records",
        None,
        "Records queued for all TCP subscribers together, not taken by their connections yet.",
    ),
    (Kind::Counter, "mdrelay_pub_connections_total", None, "TCP connections accepted."),
    (Kind::Counter, "mdrelay_pub_connections_refused_total", None, "TCP connections refused, by reason."),
    (Kind::Counter, "mdrelay_pub_disconnects_total", None, "TCP subscribers disconnected by the publisher, by reason."),
    (
        Kind::Counter,
        "mdrelay_pub_accept_errors_total",
        None,
        "TCP accept calls that failed (e.g. out of file descriptors).",
    ),
    (
        Kind::Counter,
        "mdrelay_pub_dropped_frames_total",
        None,
        "Frames skipped for TCP subscribers a whole queue behind, by slow-subscriber policy.",
    ),
    (Kind::Counter, "mdrelay_pub_retransmit_requests_total", None, "Retransmission requests received."),
    (Kind::Counter, RETRANSMIT_THROTTLED_REQUESTS, None, "Retransmission requests over the rate limit (BUSY)."),
    (Kind::Counter, "mdrelay_pub_retransmit_frames_total", None, "Frames retransmitted."),
    (Kind::Counter, "mdrelay_pub_retransmit_gone_frames_total", None, "Frames asked for that the ring no longer held."),
    (
        Kind::Counter,
        "mdrelay_pub_retransmit_bytes_total",
        Some(Unit::Bytes),
        "Bytes of retransmission answers written.",
    ),
    (
        Kind::Counter,
        "mdrelay_pub_retransmit_requests_ahead_total",
        None,
        "Retransmission requests naming frames not sent yet (each request once).",
    ),
    (
        Kind::Counter,
        "mdrelay_pub_retransmit_busy_connections_total",
        None,
        "Retransmission clients told BUSY at connect: every place was held by a client that had just asked.",
    ),
    (
        Kind::Counter,
        "mdrelay_pub_retransmit_disconnects_total",
        None,
        "Retransmission clients closed by the service, by reason: evicted (idle the longest when a newcomer came to a full service), idle (retransmit.idle_timeout), request_timeout (a request left unfinished).",
    ),
    (Kind::Gauge, "mdrelay_pub_ring_frames", None, "Frames the retransmission ring holds."),
];

/// HELP lines and units, once.
fn describe() {
    for (kind, name, unit, help) in DESCRIBED {
        match (kind, unit) {
            (Kind::Counter, Some(unit)) => describe_counter!(name, unit, help),
            (Kind::Counter, None) => describe_counter!(name, help),
            (Kind::Gauge, Some(unit)) => describe_gauge!(name, unit, help),
            (Kind::Gauge, None) => describe_gauge!(name, help),
        }
    }
    for (old, new) in RENAMED {
        describe_counter!(
            old,
            format!("Deprecated, removed in the next release: the same value as {new}, its new name.")
        );
    }
}
