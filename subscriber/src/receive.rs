//! The receive loop: a [`mdrelay_client`] subscriber built from the settings, its events taken
//! into the statistics, the recording and the logs, beside report ticks, metrics exports,
//! `--duration` and signals; then the final report.
//!
//! Everything about the protocol (connections, handshakes, resume, records and datagrams,
//! protection, sequence accounting, A/B lines, loss recovery, echoes, the idle strategy) is the
//! library's; this module is what the subscriber does with what arrives.

use crate::config::{Config, LatencyMode};
use crate::control::{Control, Event as ControlEvent, RunError, Stop};
use crate::histlog::HistogramLog;
use crate::metrics::{LoopCounts, SubscriberMetrics};
use crate::record::Recorder;
use crate::stats::{FromStartReport, Report, RunInfo, Stats};
use mdrelay_client::{
    AsyncSubscriber, Builder, Counters, Error, ErrorKind, Event, Frame, RecoveryEvent, Skipped, Start,
};
use mdrelay_iex::warn;
use std::net::SocketAddr;
use std::time::Instant;

/// Events taken one after the other, while more are ready, before ticks and signals are looked
/// at first again (they are looked at whenever the subscriber waits).
const EVENTS_BETWEEN_LOOKS: u32 = 64;

/// The application's state for one run: what it measures and writes of the frames taken.
pub struct Pipeline {
    /// The statistics.
    pub stats: Stats,
    /// `--record`: the frames taken, written to a capture file.
    pub recorder: Option<Recorder>,
    /// `[metrics] listen`: the counts copied to the Prometheus endpoint.
    pub metrics: Option<SubscriberMetrics>,
    histogram_log: Option<HistogramLog>,
    /// What the subscriber counted, as of the last look (the end of the run, in the report).
    counters: Counters,
    count: Option<u64>,
    from_start: bool,
    /// NATS with a JetStream stream: gaps are repaired from it.
    jetstream_repair: bool,
    print_intervals: bool,
    latency_mode: LatencyMode,
    transport: String,
    /// A TCP connection was made since the last attempt that failed: a loss, not a failure.
    connected: bool,
    /// A version-1 publisher's missing resume was reported.
    warned_v1: bool,
    /// `publisher{peer}` while a TCP connection is up: every line it logs names the publisher.
    span: tracing::Span,
    started: Instant,
    last_tick: Instant,
}

/// What the loop does after an event.
enum After {
    Go,
    Stop(Stop),
    /// A TCP connection was made: say whether SO_BUSY_POLL took, the first time.
    Connected,
}

impl Pipeline {
    /// A pipeline for `config`, writing intervals to `histogram_log` if given.
    pub fn new(config: &Config, histogram_log: Option<HistogramLog>, started: Instant) -> Pipeline {
        let receive = &config.receive;
        Pipeline {
            stats: {
                let mut stats = Stats::new(config.symbols());
                if config.app.book.is_some() {
                    stats.keep_books();
                }
                stats
            },
            recorder: None,
            metrics: None,
            histogram_log,
            counters: Counters::default(),
            count: config.app.max_messages,
            from_start: receive.from_start,
            jetstream_repair: receive.nats.is_some() && receive.nats_stream.is_some(),
            print_intervals: config.report_interval().is_some(),
            latency_mode: config.app.latency,
            transport: config.transport(),
            connected: false,
            warned_v1: false,
            span: tracing::Span::none(),
            started,
            last_tick: started,
        }
    }

    /// True once `--count` messages have arrived.
    fn count_reached(&self) -> bool {
        self.count.is_some_and(|n| self.stats.messages >= n)
    }

    /// Takes a frame: its messages into the statistics (and the recording), its latency.
    fn frame(&mut self, f: &Frame<'_>) {
        let stats = &mut self.stats;
        match &mut self.recorder {
            // A recording keeps every message (the subscriber was built without the filter, so
            // frames are decoded whole); the statistics aggregate the filter's symbols only.
            Some(r) => {
                r.begin(f.format());
                for m in f.messages() {
                    stats.message(&m);
                    r.message(&m);
                }
                if let (Some(header), Some(bytes)) = (f.header(), f.bytes()) {
                    let peer = f.peer().unwrap_or_else(|| SocketAddr::from(([0, 0, 0, 0], 0)));
                    r.frame(bytes, header, f.receive_time(), peer);
                }
            }
            None => {
                for m in f.messages() {
                    stats.message(&m);
                }
                for kind in f.skipped() {
                    stats.message_skipped(*kind);
                }
            }
        }
        match f.decode_error() {
            Some(error) => {
                stats.decode_errors += 1;
                if warn::allow("decode") {
                    tracing::warn!(peer = ?f.peer(), sequence = f.sequence(), %error, "frame skipped");
                }
            }
            // Its publish time is as old as the gap: the stream's latency would only show the
            // recovery's, which the recovery report has.
            None if f.recovered() => stats.frame_recovered(),
            None => {
                stats.frame_decoded(f.publish_time(), f.receive_time());
                if f.reordered() && warn::allow("order") {
                    tracing::info!(peer = ?f.peer(), sequence = f.sequence(), "frame out of order");
                }
            }
        }
    }

    /// Takes one event of the subscriber: frames into the statistics, the rest into the log.
    fn event(&mut self, event: Event<Frame<'_>>) -> After {
        if let Event::Frame(f) = &event {
            self.frame(f);
            return if self.count_reached() { After::Stop(Stop::Count) } else { After::Go };
        }
        if matches!(event, Event::Reconnecting { .. } | Event::Busy { .. }) {
            // Said with the publisher's address, after its connection.
            self.span = tracing::Span::none();
        }
        let span = self.span.clone();
        let _in = span.enter();
        self.notice(event)
    }

    /// Logs what happened to the stream.
    fn notice(&mut self, event: Event<Frame<'_>>) -> After {
        match event {
            Event::Connected { peer, attempt, reconnect } => {
                self.connected = true;
                if reconnect {
                    tracing::info!(publisher = %peer, attempt, "reconnected");
                    mdrelay_telemetry::service::set_serving(true);
                } else {
                    tracing::info!(publisher = %peer, attempt, "connected");
                    mdrelay_telemetry::service::ready("receiving");
                }
                self.span = tracing::info_span!("publisher", %peer);
                return After::Connected;
            }
            Event::Subscribed { peer, session, protocol_version, format, start } => {
                tracing::info!(publisher = %peer, session = format_args!("{session:#x}"), %format,
                    version = protocol_version, "greeted");
                match start {
                    Start::Resume { from } => tracing::info!(from, "resuming after the last frame received"),
                    Start::FromStart => tracing::info!(from = 1, "asking for the session from its first frame"),
                    Start::ResumeUnsupported { version } if !self.warned_v1 => {
                        self.warned_v1 = true;
                        tracing::warn!(
                            version,
                            "the publisher speaks relay protocol version {version}: it cannot resume a stream or send it from the start; frames missed while away are lost"
                        );
                    }
                    _ => {}
                }
            }
            Event::Resumed { asked, offered } if asked != offered => tracing::warn!(
                asked,
                offered,
                "the publisher could not resume (it keeps no ring of frames): the frames sent while away are lost"
            ),
            Event::Reconnecting { reason, retry_in, attempt } => {
                mdrelay_telemetry::service::set_serving(false);
                if std::mem::take(&mut self.connected) {
                    tracing::warn!(retry_in = ?retry_in, "connection lost: {reason}; reconnecting");
                } else {
                    tracing::warn!(attempt, retry_in = ?retry_in, error = %reason, "connection failed; retrying");
                }
            }
            Event::Busy { reason, retry_in } => {
                self.connected = false;
                mdrelay_telemetry::service::set_serving(false);
                tracing::warn!(retry_in = ?retry_in, "connection lost: the publisher is busy: {reason}; reconnecting");
            }
            Event::SessionStarted { session, peer } => {
                tracing::info!(publisher = %peer, session = format_args!("{session:#x}"), "publisher session")
            }
            Event::Restarted { old, new } if warn::allow("restart") => {
                tracing::warn!(
                    old_session = format_args!("{old:#x}"),
                    new_session = format_args!("{new:#x}"),
                    "publisher restarted: sequence tracking starts over"
                );
            }
            Event::FormatChanged { from: None, to } => tracing::info!(format = %to, "format"),
            Event::FormatChanged { from: Some(from), to } => tracing::info!(%from, %to, "format switch"),
            Event::Gap { first, count } if warn::allow("gap") => {
                tracing::warn!(missing = count, before = first.saturating_add(count), "frames missing");
            }
            // Counted in the report (recovery, gaps); not worth a warning each.
            Event::Snapshot(snapshot) => {
                tracing::info!(
                    as_of = snapshot.as_of(),
                    symbols = snapshot.books().len(),
                    frames = snapshot.frames(),
                    messages = snapshot.messages(),
                    "snapshot taken: the stream goes on from the frame after it"
                );
                self.stats.snapshot(&snapshot);
            }
            Event::SnapshotMissing { reason } => {
                tracing::warn!("no snapshot: {reason}; counts cover the frames from the first received");
            }
            Event::GivenUp { frames } => tracing::debug!(frames, "missing frames given up"),
            Event::Recovery(recovery) => recovery_event(recovery),
            Event::Skipped(skipped) => skipped_event(skipped),
            Event::End(end) => {
                match &end.totals {
                    Some(t) => tracing::info!(frames = t.frames, messages = t.messages, "end of stream"),
                    None => tracing::warn!(next_sequence = end.next_sequence, "end of stream with unreadable totals"),
                }
                return After::Stop(Stop::End);
            }
            _ => {}
        }
        After::Go
    }

    /// Copies the counts to the metrics endpoint, if there is one.
    pub fn export_metrics(&mut self) {
        let Some(metrics) = &mut self.metrics else { return };
        metrics.export(&LoopCounts {
            stats: &self.stats,
            counters: &self.counters,
            record: self.recorder.as_ref().map(Recorder::counts),
        });
    }

    /// A report period has passed: prints the interval line and logs the interval's histogram.
    pub fn tick(&mut self) {
        let now = Instant::now();
        self.write_interval(now);
        if let Some(recorder) = &mut self.recorder {
            recorder.hand_over();
        }
        let line = self.stats.interval_line(now - self.started, now - self.last_tick, self.counters.lost);
        if self.print_intervals {
            eprintln!("{line}");
        }
        self.last_tick = now;
    }

    fn write_interval(&mut self, now: Instant) {
        if let Some(log) = &mut self.histogram_log {
            let offset = self.last_tick - self.started;
            if let Err(error) = log.write(self.stats.interval_latency(), offset, now - self.last_tick) {
                tracing::error!("{error:#}; the histogram log stops here");
                self.histogram_log = None;
            }
        }
    }

    /// The final report; also closes the histogram log with the last (partial) interval, and
    /// finishes the recording.
    pub fn finish(&mut self, stop_reason: &'static str) -> Report {
        let now = Instant::now();
        self.write_interval(now);
        self.histogram_log = None;
        self.stats.end_interval();
        let first_frame = self.counters.first_frame;
        let from_start =
            self.from_start.then(|| FromStartReport { requested: true, complete: first_frame == Some(1), first_frame });
        let mut report = self.stats.report(
            &self.counters,
            RunInfo {
                transport: self.transport.clone(),
                stop_reason,
                elapsed: now - self.started,
                latency_mode: self.latency_mode.name(),
                from_start,
                jetstream_repair: self.jetstream_repair,
            },
        );
        // Last, so the file holds every frame the report counts; this waits for the writer.
        report.record = self.recorder.as_mut().map(Recorder::finish);
        // The endpoint ends with the report's counts, the recording's included.
        self.export_metrics();
        self.recorder = None;
        report
    }
}

/// Logs what the retransmission service did.
fn recovery_event(event: RecoveryEvent) {
    match event {
        RecoveryEvent::Connected { peer, session, other_session } => {
            tracing::info!(service = %peer, session = format_args!("{session:#x}"), "recovery connection set up");
            if other_session && warn::allow("recovery session") {
                tracing::warn!(service = %peer, serves = format_args!("{session:#x}"),
                    "the retransmission service serves another publisher session than the stream's: the stream's gaps cannot be recovered from it");
            }
        }
        RecoveryEvent::Gone { first, count } if warn::allow("recovery gone") => {
            tracing::info!(first, count, "frames no longer held by the publisher: unrecoverable");
        }
        RecoveryEvent::Busy { first } if warn::allow("recovery busy") => {
            tracing::info!(
                first,
                "the retransmission service is busy (over its rate limit, or full); asking again later"
            );
        }
        RecoveryEvent::Lost { reason, retry_in } => {
            tracing::warn!(retry_in = ?retry_in, "recovery connection: {reason}")
        }
        RecoveryEvent::Closed { reason } => tracing::debug!("{reason}"),
        RecoveryEvent::Refused { reason } => tracing::warn!("recovery is off: {reason}"),
        RecoveryEvent::CatchingUp { from, ahead } => tracing::warn!(
            from,
            ahead,
            "more than a window behind the stream: catching up from the stream in order, the live subject held meanwhile"
        ),
        RecoveryEvent::CaughtUp { frames } => {
            tracing::info!(frames, "caught up: frames taken from the stream in order")
        }
        RecoveryEvent::EndAhead { next_sequence } => tracing::warn!(
            next_sequence,
            "end of stream far ahead of the frames the stream holds: taken once nothing new comes for nats_give_up_after"
        ),
        _ => {}
    }
}

/// Logs what was received and not taken (each is counted in the report), within the budget.
fn skipped_event(skipped: Skipped) {
    match skipped {
        Skipped::Duplicate { sequence } if warn::allow("duplicate") => {
            tracing::info!(sequence, "duplicate frame skipped");
        }
        Skipped::TooLate { sequence } if warn::allow("too late") => {
            tracing::info!(sequence, "frame older than the sequence window skipped");
        }
        Skipped::Undelimited { at, format, what } if warn::allow("delimit") => {
            tracing::warn!(%at, %format, error = %what, "cannot delimit a frame; rest of the payload skipped");
        }
        Skipped::Excess { at, bytes } if warn::allow("excess") => {
            tracing::warn!(%at, bytes, "bytes after the frames the header declares; not read");
        }
        Skipped::FewerFrames { at, declared, found } if warn::allow("frame count") => {
            tracing::warn!(%at, declared, found, "fewer frames than the header declares");
        }
        Skipped::Protection { at, first, why } if warn::allow(protection_kind(&at)) => {
            tracing::warn!(%at, first, error = %why, "frames refused: they do not pass the protection check");
        }
        Skipped::Invalid { peer, len, what } if warn::allow(invalid_kind(&what)) => {
            tracing::warn!(%peer, len, "datagram skipped: {what}");
        }
        Skipped::Held { peer, session, sequence } if warn::allow("held datagram") => {
            tracing::info!(%peer, session = format_args!("{session:#x}"), sequence,
                "datagram out of line with the stream (session or sequence): held until the next one confirms it");
        }
        Skipped::End { peer, what } if warn::allow(end_kind(&what)) => {
            tracing::warn!(%peer, "end of stream ignored: {what}");
        }
        Skipped::OutOfPlace { tag, at } if warn::allow("recovery record on the stream") => {
            tracing::warn!(at, tag, "a record that has no place on the connection; skipped");
        }
        Skipped::Violation { at, what } => tracing::warn!(
            at,
            "protocol violation at stream byte {at}: {what}; dropping the connection to resume after the last frame received"
        ),
        _ => {}
    }
}

/// The warning budget's kind for frames refused by protection: datagrams apart from records.
fn protection_kind(at: &str) -> &'static str {
    if at.starts_with("datagram") { "protection" } else { "unprotected frames" }
}

/// The warning budget's kind for a datagram skipped before its frames: foreign traffic apart
/// from relay datagrams with a bad header.
fn invalid_kind(what: &str) -> &'static str {
    if what == "not a relay datagram" { "foreign datagram" } else { "datagram header" }
}

/// The warning budget's kind for an end of stream ignored: unreadable totals apart from one that
/// does not fit the stream.
fn end_kind(what: &str) -> &'static str {
    if what.starts_with("its totals cannot be read") { "end totals" } else { "foreign end" }
}

/// The library's builder for the subscriber's settings; `recording`: frames are decoded whole
/// and keep their bytes (the statistics still aggregate the filter's symbols only).
pub fn builder(config: &Config, recording: bool) -> Builder {
    let mut settings = config.receive.clone();
    if recording {
        settings.symbols = None;
        settings.frame_bytes = true;
    }
    Builder::from_settings(settings)
}

/// Receives until a stop; the counts are in the pipeline for its report.
pub async fn run(config: &Config, pipeline: &mut Pipeline, control: &mut Control) -> Result<Stop, RunError> {
    // Setting up (resolving a publisher's name, say) may take a while: ticks and stops go on.
    let build = builder(config, pipeline.recorder.is_some()).build_async();
    tokio::pin!(build);
    let built = loop {
        tokio::select! {
            biased;
            event = control.next() => match event {
                ControlEvent::Tick => pipeline.tick(),
                ControlEvent::Metrics => pipeline.export_metrics(),
                ControlEvent::Stop(stop) => return Ok(stop),
            },
            built = &mut build => break built,
        }
    };
    let mut subscriber = match built {
        Ok(s) => s,
        Err(error) => return Err(start_error(error, config)),
    };
    let r = &config.receive;
    if let (Some(servers), Some(subject)) = (&r.nats, &r.nats_subject) {
        // The subscription is made: what is published from now on reaches it.
        tracing::info!(%subject, %servers, "subscribed over NATS");
        mdrelay_telemetry::service::ready("receiving");
    }
    if r.udp.is_some() || r.multicast.is_some() {
        announce_lines(&subscriber, config);
    }
    let result = receive(&mut subscriber, config, pipeline, control).await;
    // Whatever is still missing is given up and counted now.
    subscriber.close();
    pipeline.counters = subscriber.counters();
    result
}

/// What woke the loop.
enum Woke {
    Control(ControlEvent),
    After(After),
    Over,
    Failed(Error),
}

async fn receive(
    subscriber: &mut AsyncSubscriber,
    config: &Config,
    pipeline: &mut Pipeline,
    control: &mut Control,
) -> Result<Stop, RunError> {
    let mut busy_poll_told = false;
    let mut rounds = 0u32;
    loop {
        rounds = rounds.wrapping_add(1);
        // Ready events are taken before ticks and signals, which are looked at first every few
        // dozen events (and whenever the subscriber waits).
        let woke = if rounds.is_multiple_of(EVENTS_BETWEEN_LOOKS) {
            tokio::select! {
                biased;
                event = control.next() => Woke::Control(event),
                next = subscriber.next_event() => taken(next, pipeline),
            }
        } else {
            tokio::select! {
                biased;
                next = subscriber.next_event() => taken(next, pipeline),
                event = control.next() => Woke::Control(event),
            }
        };
        match woke {
            Woke::After(After::Go) => {}
            Woke::After(After::Stop(stop)) => return Ok(stop),
            Woke::After(After::Connected) => {
                if config.receive.busy_poll == Some(true) && !busy_poll_told {
                    busy_poll_told = true;
                    tell_busy_poll(&subscriber.counters(), "tcp");
                }
            }
            Woke::Over => return Ok(Stop::End),
            Woke::Failed(error) => return Err(run_error(error)),
            Woke::Control(ControlEvent::Stop(stop)) => return Ok(stop),
            Woke::Control(ControlEvent::Tick) => {
                pipeline.counters = subscriber.counters();
                pipeline.tick();
            }
            Woke::Control(ControlEvent::Metrics) => {
                pipeline.counters = subscriber.counters();
                pipeline.export_metrics();
            }
        }
    }
}

/// An event taken (or the end, or the error the stream ended with).
fn taken(next: Result<Option<Event<Frame<'_>>>, Error>, pipeline: &mut Pipeline) -> Woke {
    match next {
        Ok(Some(event)) => Woke::After(pipeline.event(event)),
        Ok(None) => Woke::Over,
        Err(error) => Woke::Failed(error),
    }
}

/// Logs the lines' receive buffers and addresses (tests and scripts read the address after
/// "listening on"; line A's comes first), and SO_BUSY_POLL.
fn announce_lines(subscriber: &AsyncSubscriber, config: &Config) {
    let counters = subscriber.counters();
    let r = &config.receive;
    // The effective settings hold the size asked for.
    let requested = r.receive_buffer.unwrap_or_default();
    let interfaces = [r.interface.as_deref(), r.interface_b.as_deref()];
    for (i, local) in subscriber.local_addrs().iter().enumerate() {
        // Linux reports twice the usable size (it counts its bookkeeping).
        let granted = counters.receive_buffers.get(i).copied().unwrap_or(0);
        tracing::info!(requested, granted, "receive buffer");
        if granted < requested {
            tracing::warn!(
                "receive buffer below the {requested} bytes asked for: bursts may be dropped; run as root or raise net.core.rmem_max"
            );
        }
        let which = if i == 0 { "" } else { "line B, " };
        match (r.multicast.is_some(), interfaces.get(i).copied().flatten()) {
            (true, Some(interface)) => tracing::info!("listening on {local} ({which}multicast, interface {interface})"),
            _ if i > 0 => tracing::info!("listening on {local} (line B)"),
            _ => tracing::info!("listening on {local}"),
        }
    }
    // Bound (and joined): whatever is sent from now on is received.
    mdrelay_telemetry::service::ready("receiving");
    if r.busy_poll == Some(true) {
        tell_busy_poll(&counters, "udp");
    }
}

/// Logs whether SO_BUSY_POLL took (the relay works without it).
fn tell_busy_poll(counters: &Counters, socket: &str) {
    if counters.busy_poll_refused {
        tracing::warn!(socket, "SO_BUSY_POLL refused; receiving without it");
    } else {
        tracing::info!(socket, "SO_BUSY_POLL set");
    }
}

/// What an error setting up the subscriber means for the run.
fn start_error(error: Error, config: &Config) -> RunError {
    match (&error, error.kind()) {
        // A unicast port is one receiver's (multicast sockets share theirs).
        (Error::Bind { setting, address, .. }, ErrorKind::AddrInUse) => RunError::Fatal(anyhow::anyhow!(
            "{setting}: {address} is in use by another program (another subscriber?); a unicast port takes one receiver: give each subscriber its own port, or use multicast"
        )),
        // A NATS setting the server refuses (credentials, TLS) or a file it names that cannot be
        // read: named as the configuration names it.
        (Error::Config { .. }, _) if config.receive.nats.is_some() => RunError::Config(error.to_string()),
        (_, ErrorKind::Unreachable) if config.receive.tcp.is_some() => RunError::Fatal(anyhow::anyhow!("tcp: {error}")),
        _ => run_error(error),
    }
}

/// What an error ending the stream means for the run: a publisher that refuses this
/// subscriber, or speaks another protocol or protection, exits 3; anything else 1.
fn run_error(error: Error) -> RunError {
    // Named as the subscriber's configuration names them.
    match &error {
        Error::ProtectionMismatch { peer, publisher, subscriber } => {
            return RunError::Refused(format!(
                "publisher {peer} protects its frames with {publisher} and this subscriber expects {subscriber}: configure the same [protection] (crc, key_file) on both"
            ));
        }
        Error::Refused { peer, reason } => {
            return RunError::Refused(format!("publisher {peer} refused the subscription: {reason}"));
        }
        Error::WrongKey { peer } => {
            return RunError::Refused(format!(
                "publisher {peer} encrypts with another key than protection.key_file: give both the same key file"
            ));
        }
        _ => {}
    }
    match error.kind() {
        ErrorKind::WrongKey
        | ErrorKind::ProtectionMismatch
        | ErrorKind::Version
        | ErrorKind::Refused
        | ErrorKind::NotAPublisher => RunError::Refused(error.to_string()),
        _ => RunError::Fatal(anyhow::Error::new(error)),
    }
}
