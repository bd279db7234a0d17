//! The transport-independent part of receiving: one codec per format seen (so a format switch
//! mid-stream loses nothing and rebuilds nothing), walking the frames of a record or datagram,
//! handing messages to [`Stats`], queueing echoes, and the periodic and final reports.

use crate::config::{LatencyMode, Settings, Transport};
use crate::histlog::HistogramLog;
use crate::lines::{Line, Lines};
use crate::metrics::{LoopCounts, SubscriberMetrics};
use crate::record::Recorder;
use crate::recovery::{RecoveryBook, RecoveryReport};
use crate::stats::{FromStartReport, Report, RunInfo, Stats};
use crate::unseal::Unsealer;
use mdrelay_proto::codec::{Codec, Format, Limits, SymbolFilter};
use mdrelay_proto::relay::{Echo, Observed, SequenceCounts, SessionTracker};
use mdrelay_proto::warn;
use std::collections::BTreeSet;
use std::fmt;
use std::net::SocketAddr;
use std::time::Instant;

/// Where a payload sits, for error messages: a byte offset in the TCP stream or in a datagram.
#[derive(Clone, Copy, Debug)]
pub enum Place {
    /// The payload starts at this byte of the TCP stream (counted from the greeting).
    Stream(u64),
    /// The payload starts at this byte of its datagram.
    Datagram(u64),
    /// The payload starts at this byte of the recovery connection (counted from the greeting).
    Recovery(u64),
}

impl Place {
    fn at(self, offset: usize) -> PlaceAt {
        PlaceAt(self, offset as u64)
    }
}

/// A byte within a payload, displayed as where it is in the stream or datagram.
struct PlaceAt(Place, u64);

impl fmt::Display for PlaceAt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Place::Stream(base) => write!(f, "stream byte {}", base + self.1),
            Place::Datagram(base) => write!(f, "datagram byte {}", base + self.1),
            Place::Recovery(base) => write!(f, "recovery connection byte {}", base + self.1),
        }
    }
}

/// Where a payload's frames come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Origin {
    /// The stream: TCP, or the one UDP line.
    Stream,
    /// One of two redundant UDP lines (A/B).
    Line(Line),
    /// The retransmission service, answering a request for missing frames.
    Recovered,
}

/// A payload of frames as a transport hands it over.
#[derive(Clone, Copy, Debug)]
pub struct Payload<'a> {
    /// Where the frames come from.
    pub origin: Origin,
    /// Who sent it.
    pub peer: SocketAddr,
    /// The frames' format, from the record or datagram header.
    pub format: Format,
    /// The frames, back to back.
    pub bytes: &'a [u8],
    /// Sequence number of the first frame.
    pub first_sequence: u64,
    /// Frames the header says the payload holds.
    pub declared_frames: usize,
    /// When the bytes were received, ns since the epoch (CLOCK_REALTIME).
    pub receive_time: i64,
    /// Where the payload is, for messages.
    pub place: Place,
}

/// Decoding, counting and reporting for one run.
pub struct Pipeline {
    /// One codec per format, created when the format is first seen; indexed by format id.
    codecs: [Option<Codec>; Format::ALL.len()],
    current: Option<Format>,
    formats_seen: BTreeSet<Format>,
    format_switches: u64,
    /// The statistics.
    pub stats: Stats,
    /// Opens protected frames before they are read (always present, so frames protected
    /// otherwise than configured are refused too). Taken out while it lends a payload.
    pub unsealer: Option<Unsealer>,
    /// With a symbol filter: the filter, applied as the frames are decoded, and the type bytes
    /// of one frame's skipped messages, counted into `stats` after its decode.
    filter: Option<(SymbolFilter, Vec<u8>)>,
    /// The publisher's session and the frames' accounting.
    pub tracker: SessionTracker,
    /// A/B: each line's accounting, and the copies arbitrated.
    pub lines: Option<Lines>,
    /// UDP loss recovery: the missing frames and what became of them.
    pub recovery: Option<RecoveryBook>,
    /// The retransmission service, for the report.
    recovery_server: Option<String>,
    /// `--from-start` was asked for.
    from_start: bool,
    /// The lowest frame taken in the run's first session (with that session's epoch).
    first_frame: Option<(u64, u64)>,
    /// Round-trip mode: echo every Nth frame.
    echo_every: Option<u64>,
    echo_countdown: u64,
    /// Echoes waiting for the transport to send them.
    pub echoes: Vec<Echo>,
    count: Option<u64>,
    histogram_log: Option<HistogramLog>,
    /// `--record`: the frames taken, written to a capture file.
    pub recorder: Option<Recorder>,
    /// `[metrics] listen`: the counts copied to the Prometheus endpoint.
    pub metrics: Option<SubscriberMetrics>,
    print_intervals: bool,
    latency_mode: LatencyMode,
    transport: String,
    started: Instant,
    last_tick: Instant,
}

impl Pipeline {
    /// A pipeline for `settings`, writing intervals to `histogram_log` if given.
    pub fn new(settings: &Settings, histogram_log: Option<HistogramLog>, started: Instant) -> Pipeline {
        let echo_every = (settings.latency == LatencyMode::RoundTrip).then_some(settings.echo_every.max(1));
        let mut pipeline = Pipeline {
            codecs: Default::default(),
            current: None,
            formats_seen: BTreeSet::new(),
            format_switches: 0,
            stats: Stats::new(settings.symbols.clone()),
            filter: settings.symbols.clone().map(|s| (SymbolFilter::new(s), Vec::new())),
            unsealer: Some(Unsealer::new(&settings.protection)),
            tracker: SessionTracker::new(),
            lines: None,
            recovery: settings
                .recovery
                .as_ref()
                .map(|r| RecoveryBook::new(crate::recovery::policy(r.delay, r.retry, r.attempts))),
            recovery_server: settings.recovery.as_ref().map(|r| r.server.clone()),
            from_start: settings.from_start,
            first_frame: None,
            echo_every,
            echo_countdown: echo_every.unwrap_or(0),
            echoes: Vec::new(),
            count: settings.count,
            histogram_log,
            recorder: None,
            metrics: None,
            print_intervals: settings.report_interval.is_some(),
            latency_mode: settings.latency,
            transport: settings.transport.to_string(),
            started,
            last_tick: started,
        };
        // A TCP publisher names the first frame it offers; over UDP, from the start means
        // every frame of the session is owed, so frames lost before the first received count
        // (and, with recovery, are asked for).
        if settings.from_start && !matches!(settings.transport, Transport::Tcp(_)) {
            pipeline.tracker.expect_from(1);
            if let Some(book) = &mut pipeline.recovery {
                book.expect_from(1);
            }
        }
        pipeline
    }

    /// The format now in use, if any was announced.
    pub fn current_format(&self) -> Option<Format> {
        self.current
    }

    /// Notes the format the publisher uses from now on (greeting, FORMAT record, data header).
    pub fn format(&mut self, format: Format, peer: SocketAddr) {
        self.formats_seen.insert(format);
        match self.current {
            Some(old) if old != format => {
                self.format_switches += 1;
                tracing::info!(%peer, from = %old, to = %format, "format switch");
            }
            None => tracing::info!(%peer, %format, "format"),
            _ => {}
        }
        self.current = Some(format);
    }

    /// True in round-trip mode: the publisher is asked for echo handling.
    pub fn echoes_wanted(&self) -> bool {
        self.echo_every.is_some()
    }

    /// True once `--count` messages have arrived.
    pub fn count_reached(&self) -> bool {
        self.count.is_some_and(|n| self.stats.messages >= n)
    }

    /// True when `--from-start` was asked for.
    pub fn from_start(&self) -> bool {
        self.from_start
    }

    /// The lowest frame taken in the run's first session, if any.
    pub fn first_frame(&self) -> Option<u64> {
        self.first_frame.map(|(_, seq)| seq)
    }

    /// The clock of the recovery book: ns since the run started, monotonic.
    pub fn now_ns(&self) -> i64 {
        i64::try_from(self.started.elapsed().as_nanos()).unwrap_or(i64::MAX)
    }

    /// Brings the per-line and recovery accounting to the tracker's epoch: when sequence
    /// tracking started over, so do they.
    fn sync_epoch(&mut self) {
        let epoch = self.tracker.epoch();
        if let Some(lines) = &mut self.lines {
            lines.sync(epoch);
        }
        if let Some(book) = &mut self.recovery {
            book.sync(epoch);
        }
    }

    /// The publisher's END (after the tracker took it): frames up to `next` were sent, so the
    /// lines and the recovery book know what is missing at the tail.
    pub fn end(&mut self, next: u64) {
        self.sync_epoch();
        let now = self.now_ns();
        if let Some(lines) = &mut self.lines {
            lines.end(next);
        }
        if let Some(book) = &mut self.recovery {
            book.end(next, now);
        }
    }

    /// Frames still missing that recovery may yet fill (0 without recovery, or once the
    /// service refused).
    pub fn missing(&self) -> u64 {
        self.recovery.as_ref().filter(|b| !b.is_refused()).map_or(0, |b| b.missing())
    }

    /// Takes a payload whose frames are protected (as configured): opened, then handed to
    /// [`Pipeline::data`]; a payload that does not open is counted and dropped, its frames then
    /// show as missing. `session` is the publisher session of the record or answer.
    pub fn protected_data(&mut self, p: Payload<'_>, session: u64) {
        let Some(mut unsealer) = self.unsealer.take() else { return self.data(p) };
        match unsealer.frames(session, p.first_sequence, p.format, p.declared_frames as u64, p.bytes) {
            Ok(plain) => self.data(Payload { bytes: plain, ..p }),
            Err(e) => {
                if warn::allow("unprotected frames") {
                    tracing::warn!(peer = %p.peer, at = %p.place.at(0), first = p.first_sequence, frames = p.declared_frames,
                        error = %e, "frames refused: they do not pass the protection check");
                }
            }
        }
        self.stats.protection = unsealer.counts;
        self.unsealer = Some(unsealer);
    }

    /// Walks and decodes the frames of one record or datagram payload: exactly as many as its
    /// header declares. A frame that does not decode is counted and skipped; one that cannot be
    /// delimited loses the rest of the payload, never the stream, and those frames are not
    /// counted as arrived (their content is unknown), so they show as lost. Bytes past the
    /// declared frames are not read: a frame there would take the sequence number of a frame
    /// still to come. A duplicate, or a frame too old for the window, is counted and not
    /// decoded, so aggregates never count a frame twice.
    ///
    /// Retransmitted frames (origin [`Origin::Recovered`]) are in their original format, which
    /// is not a switch of the stream's, and are taken only while they are missing; their
    /// latency is the recovery's, not the stream's, and they are not echoed. Frames of an A/B
    /// line are taken once, from whichever line delivers them first.
    pub fn data(&mut self, p: Payload<'_>) {
        let recovered = p.origin == Origin::Recovered;
        if recovered {
            self.formats_seen.insert(p.format);
        } else if self.current != Some(p.format) {
            self.format(p.format, p.peer);
        }
        self.sync_epoch();
        let now = if self.recovery.is_some() { self.now_ns() } else { 0 };
        let Pipeline {
            codecs,
            stats,
            filter,
            tracker,
            lines,
            recovery,
            first_frame,
            echoes,
            echo_every,
            echo_countdown,
            recorder,
            ..
        } = self;
        let codec = codecs[usize::from(p.format.id())].get_or_insert_with(|| Codec::new(p.format, Limits::default()));
        let mut offset = 0usize;
        let mut index = 0u64;
        let declared = p.declared_frames as u64;
        while index < declared && offset < p.bytes.len() {
            let rest = &p.bytes[offset..];
            let sequence = p.first_sequence.saturating_add(index);
            let len = match codec.frame_len(rest) {
                Ok(Some(n)) if n > 0 && n <= rest.len() => n,
                delimit => {
                    let what = match delimit {
                        Err(e) => e.to_string(),
                        Ok(None) => format!("{} bytes left, not a whole frame", rest.len()),
                        Ok(Some(n)) => format!("framing says {n} bytes with {} left", rest.len()),
                    };
                    stats.undelimited_payloads += 1;
                    if warn::allow("delimit") {
                        tracing::warn!(peer = %p.peer, at = %p.place.at(offset), format = %p.format, frame = index,
                            error = %what, "cannot delimit a frame; rest of the payload skipped");
                    }
                    return;
                }
            };
            let frame = &rest[..len];
            offset += len;
            index += 1;
            let observed = match (p.origin, lines.as_mut(), recovery.as_mut()) {
                (Origin::Recovered, _, Some(book)) => {
                    if book.recovered(sequence, now) {
                        // Missing until now, so new to the window: it fills its hole without
                        // counting as reordered.
                        let o = tracker.observe_copy(sequence);
                        if matches!(o, Observed::InOrder | Observed::Gap(_)) {
                            book.slide(tracker.highest());
                        }
                        o
                    } else {
                        continue;
                    }
                }
                // Without recovery there is nothing to fill.
                (Origin::Recovered, _, None) => continue,
                (Origin::Line(line), Some(lines), _) => match lines.observe(line, sequence, tracker) {
                    Some(o) => o,
                    // The other line's copy of a frame taken already: expected, not a duplicate.
                    None => continue,
                },
                _ => tracker.observe(sequence),
            };
            if !recovered
                && observed.take()
                && let Some(book) = recovery.as_mut()
            {
                book.original(sequence, tracker.highest(), now);
            }
            if observed.take() {
                let epoch = tracker.epoch();
                match first_frame {
                    None => *first_frame = Some((epoch, sequence)),
                    Some((e, low)) if *e == epoch && sequence < *low => *low = sequence,
                    _ => {}
                }
            }
            match observed {
                Observed::InOrder => {}
                Observed::Gap(_) if recovered => {}
                Observed::Gap(n) => {
                    if warn::allow("gap") {
                        tracing::warn!(peer = %p.peer, missing = n, before = sequence, "frames missing");
                    }
                }
                Observed::Duplicate => {
                    if warn::allow("duplicate") {
                        tracing::info!(peer = %p.peer, sequence, "duplicate frame skipped");
                    }
                    continue;
                }
                Observed::TooLate => {
                    if warn::allow("too late") {
                        tracing::info!(peer = %p.peer, sequence, "frame older than the sequence window skipped");
                    }
                    continue;
                }
                Observed::Reordered if recovered => {}
                Observed::Reordered => {
                    if warn::allow("order") {
                        tracing::info!(peer = %p.peer, sequence, "frame out of order");
                    }
                }
            }
            // Recording rides on the one decode: the recorder takes the messages as they are visited.
            let decoded = match (recorder.as_mut(), filter.as_mut()) {
                (None, None) => codec.decode(frame, |m| stats.message(m)),
                // Filter before decode: other symbols' messages are skipped on their type and
                // symbol, as far as the format allows, and only counted.
                (None, Some((filter, skipped))) => {
                    let decoded = codec.decode_filtered(frame, filter, |m| stats.message(m), |k| skipped.push(k));
                    for kind in skipped.drain(..) {
                        stats.message_skipped(kind);
                    }
                    decoded
                }
                // A recording keeps every message, so the frame is decoded whole.
                (Some(r), _) => {
                    r.begin(p.format);
                    let decoded = codec.decode(frame, |m| {
                        stats.message(m);
                        r.message(m);
                    });
                    if let Ok(header) = &decoded {
                        r.frame(frame, header, p.receive_time, p.peer);
                    }
                    decoded
                }
            };
            match decoded {
                // Its publish time is as old as the gap: the stream's latency would only show
                // the recovery's, which the recovery report has.
                Ok(_) if recovered => stats.frame_recovered(),
                Ok(header) => {
                    stats.frame_decoded(header.publish_time, p.receive_time);
                    if let Some(every) = *echo_every {
                        *echo_countdown -= 1;
                        if *echo_countdown == 0 {
                            *echo_countdown = every;
                            echoes.push(Echo { publish_time: header.publish_time, sequence });
                        }
                    }
                }
                Err(error) => {
                    stats.decode_errors += 1;
                    if warn::allow("decode") {
                        tracing::warn!(peer = %p.peer, at = %p.place.at(offset - len), frame = index - 1, sequence,
                            %error, "frame skipped");
                    }
                }
            }
        }
        if offset < p.bytes.len() {
            stats.excess_payloads += 1;
            if warn::allow("excess") {
                tracing::warn!(peer = %p.peer, at = %p.place.at(offset), declared = p.declared_frames, bytes = p.bytes.len() - offset,
                    "bytes after the frames the header declares; not read");
            }
        } else if index < declared && warn::allow("frame count") {
            tracing::warn!(peer = %p.peer, at = %p.place.at(0), declared = p.declared_frames, found = index,
                "fewer frames than the header declares");
        }
    }

    /// Copies the counts to the metrics endpoint, if there is one.
    pub fn export_metrics(&mut self) {
        let Some(metrics) = &mut self.metrics else { return };
        metrics.export(&LoopCounts {
            stats: &self.stats,
            sequence: self.tracker.counts().plus(self.lines.as_ref().map(|l| l.merged_extra()).unwrap_or_default()),
            frames_recovered: self.recovery.as_ref().map(|book| book.counts().frames_recovered),
            last_sequence: self.tracker.highest(),
            format: self.current,
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
        let line = self.stats.interval_line(now - self.started, now - self.last_tick, self.tracker.counts().lost);
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
        self.tracker.finish();
        // The frames still missing will not come now: they count as lost, and as
        // unrecoverable.
        self.sync_epoch();
        let recovery = match (&mut self.recovery, &self.recovery_server) {
            (Some(book), Some(server)) => {
                book.give_up_all();
                book.report(server)
            }
            _ => RecoveryReport::default(),
        };
        let from_start = self.from_start.then(|| FromStartReport {
            requested: true,
            complete: self.first_frame() == Some(1),
            first_frame: self.first_frame(),
        });
        let raw_skipped_messages = match &self.codecs[usize::from(Format::Raw.id())] {
            Some(Codec::Raw(raw)) => raw.skipped_messages(),
            _ => 0,
        };
        let mut report = self.stats.report(
            &self.tracker,
            RunInfo {
                transport: self.transport.clone(),
                stop_reason,
                elapsed: now - self.started,
                latency_mode: self.latency_mode.name(),
                format_switches: self.format_switches,
                formats_seen: self.formats_seen.clone(),
                raw_skipped_messages,
                recovery,
                lines: self.lines.as_ref().map(Lines::report),
                arbitrated: self.lines.as_ref().map_or(0, Lines::arbitrated),
                merged_extra: self.lines.as_ref().map_or(SequenceCounts::default(), Lines::merged_extra),
                from_start,
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
