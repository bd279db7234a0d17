//! What the subscriber measures: counters, messages by type, per-symbol aggregates (with the
//! optional symbol filter), frame sequence counts, one-way latency; and the reports made of
//! them: the interval line, the final text report and the JSON report.

use hdrhistogram::Histogram;
use mdrelay_client::{Counters, LinesReport, ProtectionCounts, RecoveryReport};
use mdrelay_codec::SymbolFilter;
use mdrelay_iex::aggregate::{Aggregator, SymbolAggregate};
use mdrelay_iex::book::Books;
use mdrelay_iex::counts::TypeCounts;
use mdrelay_iex::message::Message;
use mdrelay_iex::price::Symbol;
use mdrelay_proto::latency::{LatencySummary, latency_histogram};
use mdrelay_proto::relay::Totals;
use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt::{self, Write as _};
use std::time::Duration;

/// Everything counted over the run.
pub struct Stats {
    /// Frames decoded.
    pub frames: u64,
    /// Messages decoded.
    pub messages: u64,
    /// Frames delimited but not decodable (skipped).
    pub decode_errors: u64,
    /// Frames whose publish time was after their receive time (clocks apart); recorded as 0.
    pub negative_latencies: u64,
    types: TypeCounts,
    aggregator: Aggregator,
    /// Per-symbol state, when the run writes it (`book`).
    books: Option<Books>,
    /// The frame the snapshot the run started from is as of, if it took one.
    snapshot_as_of: Option<u64>,
    /// `None` aggregates every symbol.
    filter: Option<SymbolFilter>,
    latency: Histogram<u64>,
    interval_latency: Histogram<u64>,
    interval_frames: u64,
    interval_messages: u64,
}

impl Stats {
    /// Empty statistics; with `filter`, only those symbols are aggregated.
    pub fn new(filter: Option<Vec<Symbol>>) -> Stats {
        let filter = filter.map(SymbolFilter::new);
        Stats {
            frames: 0,
            messages: 0,
            decode_errors: 0,
            negative_latencies: 0,
            types: TypeCounts::new(),
            aggregator: Aggregator::new(),
            books: None,
            snapshot_as_of: None,
            filter,
            latency: latency_histogram(),
            interval_latency: latency_histogram(),
            interval_frames: 0,
            interval_messages: 0,
        }
    }

    /// Takes one decoded message.
    #[inline]
    pub fn message(&mut self, message: &Message<'_>) {
        self.messages += 1;
        self.interval_messages += 1;
        self.types.add(message.kind());
        if self.filter.as_ref().is_none_or(|filter| filter.matches_message(message)) {
            self.aggregator.apply(message);
            if let Some(books) = &mut self.books {
                books.apply(message);
            }
        }
    }

    /// Starts from a snapshot: its aggregates, counts and books (when kept) stand for the
    /// stream up to its frame.
    pub fn snapshot(&mut self, snapshot: &mdrelay_client::Snapshot) {
        for (symbol, figures) in snapshot.aggregates() {
            if self.filter.as_ref().is_none_or(|f| f.matches(symbol.0)) {
                self.aggregator.add(symbol, &figures);
            }
        }
        let totals = snapshot.totals();
        self.frames += totals.frames;
        self.messages += totals.messages;
        for (&kind, &n) in &totals.by_type {
            self.types.add_many(kind, n);
        }
        if let Some(books) = &mut self.books {
            *books = snapshot.books().clone();
            if let Some(filter) = &self.filter {
                books.retain(|symbol| filter.matches(symbol.0));
            }
        }
        self.snapshot_as_of = Some(snapshot.as_of());
    }

    /// Keeps per-symbol state from now on (of the filter's symbols, with a filter).
    pub fn keep_books(&mut self) {
        self.books.get_or_insert_with(Books::new);
    }

    /// The per-symbol state, if it is kept.
    pub fn books(&self) -> Option<&Books> {
        self.books.as_ref()
    }

    /// Counts a message a filtered decode skipped (another symbol's): its type, not its fields.
    #[inline]
    pub fn message_skipped(&mut self, kind: u8) {
        self.messages += 1;
        self.interval_messages += 1;
        self.types.add(kind);
    }

    /// The symbol filter, if the run has one.
    pub fn filter(&self) -> Option<&SymbolFilter> {
        self.filter.as_ref()
    }

    /// Records a decoded frame's latency: receive time minus publish time, both ns since the epoch.
    #[inline]
    pub fn frame_decoded(&mut self, publish_time: i64, receive_time: i64) {
        self.frames += 1;
        self.interval_frames += 1;
        let latency = receive_time.saturating_sub(publish_time);
        let ns = if latency < 0 {
            self.negative_latencies += 1;
            0
        } else {
            latency as u64
        };
        // Only the interval's histogram is written per frame; it is added to the run's at
        // each interval's end, which costs far less than a second record per frame.
        self.interval_latency.saturating_record(ns);
    }

    /// Counts a retransmitted frame decoded: a frame, without a latency (its publish time is
    /// as old as its gap).
    #[inline]
    pub fn frame_recovered(&mut self) {
        self.frames += 1;
        self.interval_frames += 1;
    }

    /// Ends the latency interval: its counts join the run's histogram and it starts over.
    pub fn end_interval(&mut self) {
        // Both histograms have the same bounds, so adding cannot fail.
        let _ = self.latency.add(&self.interval_latency);
        self.interval_latency.reset();
        self.interval_frames = 0;
        self.interval_messages = 0;
    }

    /// The run's latencies so far, the current interval's included.
    pub fn latency_so_far(&self) -> Histogram<u64> {
        let mut all = self.latency.clone();
        // Both histograms have the same bounds, so adding cannot fail.
        let _ = all.add(&self.interval_latency);
        all
    }

    /// The latency histogram of the current interval.
    pub fn interval_latency(&self) -> &Histogram<u64> {
        &self.interval_latency
    }

    /// The line for an interval of length `period` ending `elapsed` after the start, with
    /// `lost` frames so far; starts the next interval.
    pub fn interval_line(&mut self, elapsed: Duration, period: Duration, lost: u64) -> String {
        let secs = period.as_secs_f64().max(1e-9);
        let h = &self.interval_latency;
        let lat = if h.is_empty() {
            "latency -".to_string()
        } else {
            format!(
                "latency p50 {} p99 {} max {}",
                human_ns(h.value_at_quantile(0.50)),
                human_ns(h.value_at_quantile(0.99)),
                human_ns(h.max())
            )
        };
        let line = format!(
            "mdrelay-sub [{:>8.1}s] {:>10.0} msg/s  frames {} (+{})  messages {}  {}  gaps {}",
            elapsed.as_secs_f64(),
            self.interval_messages as f64 / secs,
            self.frames,
            self.interval_frames,
            self.messages,
            lat,
            lost
        );
        self.end_interval();
        line
    }

    /// Whether what arrived equals what the publisher's `totals` say it sent (see
    /// [`Report::totals_match`]).
    fn totals_match(&self, totals: Option<&Totals>, late_join: Option<u64>) -> Option<bool> {
        let totals = totals?;
        Some(
            late_join.is_none()
                && !totals.truncated
                && totals.frames == self.frames
                && totals.messages == self.messages
                && totals.by_type.iter().filter(|(_, n)| **n > 0).map(|(k, n)| (*k, *n)).eq(self.types.seen()),
        )
    }

    /// Whether everything the publisher sent this subscriber arrived and decoded (see
    /// [`Report::stream_complete`]); `from_start`: the run asked for the session from its first
    /// frame.
    fn stream_complete(&self, c: &Counters, from_start: bool) -> Option<bool> {
        let totals = c.publisher_totals.as_ref()?;
        Some(match c.late_join {
            None => self.totals_match(Some(totals), None) == Some(true),
            // It asked for the session from its first frame, and that frame never came.
            Some(_) if from_start => false,
            // Joined mid-stream: owed only what was sent from its first frame on, so nothing
            // may be missing from there to the END (given-up frames are missing too), and every
            // frame must have decoded. The END's totals count frames it was never owed.
            Some(_) => !totals.truncated && c.lost == 0 && self.decode_errors == 0,
        })
    }

    /// The final report (call [`Stats::end_interval`] first, so the last interval counts), with
    /// what the subscriber counted besides (`counters`: the transport's, the frame accounting,
    /// recovery, the lines).
    pub fn report(&self, counters: &Counters, run: RunInfo) -> Report {
        let symbols = self.aggregator.active();
        // A snapshot stands for every frame up to its own: the stream after it joined nothing
        // late.
        let late_join = counters.late_join.filter(|first| self.snapshot_as_of.is_none_or(|n| *first > n + 1));
        let mut adjusted = counters.clone();
        adjusted.late_join = late_join;
        let c = &adjusted;
        let stream_complete = self.stream_complete(c, run.from_start.is_some());
        Report {
            total_trade_volume: symbols.iter().map(|(_, a)| a.trade_volume).sum(),
            symbols_with_trades_or_quotes: symbols.len() as u64,
            symbols,
            message_types: self.types.by_name(),
            frames: self.frames,
            messages: self.messages,
            bytes: c.bytes,
            gaps: c.lost,
            duplicates: c.duplicates,
            reordered: c.reordered,
            decode_errors: self.decode_errors,
            undelimited_payloads: c.undelimited_payloads,
            excess_payloads: c.excess_payloads,
            format_switches: c.format_switches,
            formats_seen: c.formats_seen.iter().map(|f| f.name()).collect(),
            late_join_sequence: late_join,
            snapshot_as_of: self.snapshot_as_of,
            publisher_totals: c.publisher_totals.clone(),
            totals_match: self.totals_match(c.publisher_totals.as_ref(), late_join),
            stream_complete,
            latency_ns: LatencySummary::of(&self.latency),
            reconnects: c.reconnects,
            resumes: c.resumes,
            from_start: run.from_start,
            recovery: c.recovery.clone().unwrap_or_default(),
            repair_fetches: run.jetstream_repair.then_some(c.repair_fetches),
            lines: c.lines.clone(),
            arbitrated: c.arbitrated,
            transport: run.transport,
            stop_reason: run.stop_reason,
            elapsed_seconds: run.elapsed.as_secs_f64(),
            latency_mode: run.latency_mode,
            echoes_sent: c.echoes_sent,
            echoes_dropped: c.echoes_dropped,
            publisher_restarts: c.publisher_restarts,
            unconfirmed_datagrams: c.unconfirmed_datagrams,
            invalid_packets: c.invalid_packets,
            protection: c.protection,
            negative_latencies: self.negative_latencies,
            beyond_window: c.too_late,
            raw_skipped_messages: c.raw_skipped_messages,
            warnings_suppressed: mdrelay_iex::warn::suppressed(),
            record: None,
        }
    }
}

/// What the run knows besides the counts, for the report.
#[derive(Debug)]
pub struct RunInfo {
    /// The transport, as text.
    pub transport: String,
    /// Why the run stopped.
    pub stop_reason: &'static str,
    /// How long it ran.
    pub elapsed: Duration,
    /// `one-way` or `round-trip`.
    pub latency_mode: &'static str,
    /// `--from-start`: whether the whole session came.
    pub from_start: Option<FromStartReport>,
    /// NATS with a JetStream stream: gaps are repaired from the stream (`recovery` says how).
    pub jetstream_repair: bool,
}

/// What `--from-start` got.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct FromStartReport {
    /// Always true: the object is there only when asked for.
    pub requested: bool,
    /// The session's first frame (1) was taken: nothing is missing at the head.
    pub complete: bool,
    /// The lowest frame taken in the first session, if any.
    pub first_frame: Option<u64>,
}

/// The final report. The first fields carry the names and shapes of `mdrelay-pub inspect --json`.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    /// Traded volume over the reported symbols.
    pub total_trade_volume: u64,
    /// Reported symbols that had a trade or a quote.
    pub symbols_with_trades_or_quotes: u64,
    /// Those symbols' aggregates, sorted by symbol.
    #[serde(serialize_with = "serialize_symbols")]
    pub symbols: Vec<(Symbol, SymbolAggregate)>,
    /// Messages by type byte (all symbols, whatever the filter).
    pub message_types: BTreeMap<String, u64>,
    /// Frames decoded.
    pub frames: u64,
    /// Messages decoded.
    pub messages: u64,
    /// Bytes received, relay headers included.
    pub bytes: u64,
    /// Frames lost: sequence numbers never received between the lowest and highest seen.
    pub gaps: u64,
    /// Frames received twice.
    pub duplicates: u64,
    /// Frames received after later ones.
    pub reordered: u64,
    /// Frames that arrived but could not be decoded (skipped).
    pub decode_errors: u64,
    /// Payloads whose frames could not all be delimited; their frames count as lost.
    pub undelimited_payloads: u64,
    /// Payloads with bytes after the frames their header declares (not read).
    pub excess_payloads: u64,
    /// Format changes during the stream.
    pub format_switches: u64,
    /// Formats the publisher used, by name.
    pub formats_seen: Vec<&'static str>,
    /// The first frame's sequence number when above 1 (the subscriber joined late).
    pub late_join_sequence: Option<u64>,
    /// The frame the snapshot the run started from was as of (`--snapshot`): its aggregates
    /// and counts are in the report's, which then cover the whole stream.
    pub snapshot_as_of: Option<u64>,
    /// The publisher's END totals.
    pub publisher_totals: Option<Totals>,
    /// `null` without an END; else true when the subscriber did not join late, the END does
    /// not say the stream was truncated (a relay that lost its upstream), and frames, messages
    /// and messages by type equal the publisher's totals.
    pub totals_match: Option<bool>,
    /// The verdict on the stream, which the exit status follows: `null` without an END (the
    /// run stopped first, by a signal, `--duration` or `--count`: nothing to judge against);
    /// else true when everything the publisher sent this subscriber arrived and decoded. That
    /// is `totals_match`, except for a subscriber that joined late without `--from-start`: it
    /// was never owed the frames before its first, so it is complete when none is missing from
    /// there to the END, none failed to decode and the END does not say the stream was
    /// truncated. False ends the run with exit status 5 ([`Report::incomplete`] says why).
    pub stream_complete: Option<bool>,
    /// One-way latency.
    pub latency_ns: LatencySummary,
    /// Connections re-established after a loss (TCP; NATS, to any server of the cluster).
    pub reconnects: u64,
    /// Reconnections the publisher resumed at the frame asked for, after the last frame
    /// received (TCP, protocol version 2).
    pub resumes: u64,
    /// `--from-start` (TCP): `null` when not asked for.
    pub from_start: Option<FromStartReport>,
    /// Loss recovery (UDP and multicast; NATS from the JetStream stream, whose reads of a range
    /// are its `requests`): what was missing and what became of it.
    pub recovery: RecoveryReport,
    /// NATS with a JetStream stream: messages read from the stream to repair gaps (those read to
    /// find where a range starts included); `null` otherwise.
    pub repair_fetches: Option<u64>,
    /// A/B: each line's figures (`a` and `b`); `null` with one line.
    pub lines: Option<LinesReport>,
    /// A/B: copies of frames that the other line had delivered first (taken once).
    pub arbitrated: u64,
    /// The transport.
    pub transport: String,
    /// `end`, `count`, `duration`, `signal` or `error`.
    pub stop_reason: &'static str,
    /// Seconds from start to stop.
    pub elapsed_seconds: f64,
    /// The mode asked for: `one-way`, or `round-trip` (echoes besides, for the publisher to
    /// measure the round trip on its own clock). `latency_ns` is one-way in both.
    pub latency_mode: &'static str,
    /// Echoes sent (round-trip mode).
    pub echoes_sent: u64,
    /// Echoes dropped because the way back was full.
    pub echoes_dropped: u64,
    /// Publisher restarts (new sessions) seen.
    pub publisher_restarts: u64,
    /// Datagrams whose session or sequence number no later datagram confirmed (dropped).
    pub unconfirmed_datagrams: u64,
    /// Records or datagrams refused before any frame was read.
    pub invalid_packets: u64,
    /// What frame protection refused (CRC, authentication, replayed or mismatched datagrams).
    pub protection: ProtectionCounts,
    /// Frames published "after" they were received (clocks apart), counted as 0 ns.
    pub negative_latencies: u64,
    /// Frames too old for the sequence window to tell from duplicates (not taken).
    pub beyond_window: u64,
    /// Messages the raw decoder skipped for being shorter than their type's layout.
    pub raw_skipped_messages: u64,
    /// Warnings about bad input counted but not logged (the log budget).
    pub warnings_suppressed: u64,
    /// `--record`: what was written to the capture file; `null` when not recording.
    pub record: Option<crate::record::RecordReport>,
}

impl Report {
    /// Why the stream is incomplete (`stream_complete` false), in a line of figures; `None`
    /// when it is complete or there is no verdict.
    pub fn incomplete(&self) -> Option<String> {
        if self.stream_complete != Some(false) {
            return None;
        }
        let totals = self.publisher_totals.as_ref()?;
        let mut why = match (self.late_join_sequence, &self.from_start) {
            (Some(first), Some(_)) => {
                format!("asked for the session from its first frame, and the first received was frame {first}")
            }
            (Some(first), None) => format!("joined at frame {first}; frames missing since {}", self.gaps),
            (None, _) => format!(
                "frames {} of the publisher's {}, messages {} of its {}; frames missing {}",
                self.frames, totals.frames, self.messages, totals.messages, self.gaps
            ),
        };
        let given_up = self.recovery.frames_unrecoverable;
        for (what, n) in [("given up", given_up), ("undecodable", self.decode_errors)] {
            if n > 0 {
                why.push_str(&format!(", {what} {n}"));
            }
        }
        if totals.truncated {
            why.push_str("; the END says the stream was cut short (a relay that lost its upstream)");
        }
        if self.publisher_restarts > 0 {
            why.push_str(&format!(
                "; the publisher restarted {} time(s): the counts span its sessions, and an earlier one ended \
                 without its END",
                self.publisher_restarts
            ));
        }
        Some(why)
    }
}

/// `symbols` as `inspect` writes it: a map from symbol text to its aggregate.
fn serialize_symbols<S: serde::Serializer>(symbols: &[(Symbol, SymbolAggregate)], s: S) -> Result<S::Ok, S::Error> {
    use serde::ser::SerializeMap;
    let mut map = s.serialize_map(Some(symbols.len()))?;
    for (symbol, aggregate) in symbols {
        map.serialize_entry(&symbol.to_text(), aggregate)?;
    }
    map.end()
}

/// Nanoseconds for a person: `850ns`, `12.3us`, `1.20ms`, `2.50s`.
pub fn human_ns(ns: u64) -> String {
    match ns {
        0..1_000 => format!("{ns}ns"),
        1_000..1_000_000 => format!("{:.1}us", ns as f64 / 1e3),
        1_000_000..1_000_000_000 => format!("{:.2}ms", ns as f64 / 1e6),
        _ => format!("{:.2}s", ns as f64 / 1e9),
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let opt = |v: Option<u64>| v.map_or_else(|| "-".to_string(), |v| v.to_string());
        writeln!(
            f,
            "mdrelay-sub: {}, stopped by {} after {:.1} s",
            self.transport, self.stop_reason, self.elapsed_seconds
        )?;
        writeln!(
            f,
            "  frames {}   messages {}   bytes {}   decode errors {}   invalid packets {}",
            self.frames, self.messages, self.bytes, self.decode_errors, self.invalid_packets
        )?;
        writeln!(
            f,
            "  gaps {}   duplicates {}   reordered {}   late join {}   reconnects {}   resumes {}   publisher restarts {}",
            self.gaps,
            self.duplicates,
            self.reordered,
            opt(self.late_join_sequence),
            self.reconnects,
            self.resumes,
            self.publisher_restarts
        )?;
        if let Some(s) = &self.from_start {
            match s.first_frame {
                _ if s.complete => writeln!(f, "  from start: complete (the session from its first frame)")?,
                Some(first) => writeln!(
                    f,
                    "  from start: INCOMPLETE: the first frame received was {first}; the ones before it never came"
                )?,
                None => writeln!(f, "  from start: INCOMPLETE: no frame received")?,
            }
        }
        let r = &self.recovery;
        if r.enabled {
            writeln!(
                f,
                "  recovery: gaps {}   missing {}   recovered {}   filled late {}   unrecoverable {}   requests {}   \
                 busy {}   gone {}   latency p50 {}  p99 {}  max {}{}{}",
                r.gaps_detected,
                r.frames_missing,
                r.frames_recovered,
                r.frames_filled_late,
                r.frames_unrecoverable,
                r.requests,
                r.busy_answers,
                r.gone_frames,
                r.latency_ns.p50.map_or_else(|| "-".to_string(), human_ns),
                r.latency_ns.p99.map_or_else(|| "-".to_string(), human_ns),
                r.latency_ns.max.map_or_else(|| "-".to_string(), human_ns),
                if r.refused { "   (refused by the service)" } else { "" },
                self.repair_fetches.map_or_else(String::new, |n| format!("   stream reads {n}"))
            )?;
        }
        if let Some(lines) = &self.lines {
            for (name, l) in [("A", &lines.a), ("B", &lines.b)] {
                writeln!(
                    f,
                    "  line {name} {}: datagrams {}   frames {}   lost {}   duplicates {}",
                    l.address, l.datagrams, l.frames, l.lost, l.duplicates
                )?;
            }
            writeln!(f, "  arbitrated {} (copies the other line delivered first)", self.arbitrated)?;
        }
        let odd = [
            ("undelimited payloads", self.undelimited_payloads),
            ("payloads with excess bytes", self.excess_payloads),
            ("unconfirmed datagrams", self.unconfirmed_datagrams),
            ("frames beyond the window", self.beyond_window),
            ("raw messages skipped", self.raw_skipped_messages),
            ("CRC failures", self.protection.crc_failures),
            ("authentication failures", self.protection.authentication_failures),
            ("replayed datagrams", self.protection.replayed_datagrams),
            ("datagrams otherwise protected", self.protection.mismatched_datagrams),
            ("warnings not logged", self.warnings_suppressed),
        ];
        let odd: Vec<String> = odd.iter().filter(|(_, n)| *n > 0).map(|(what, n)| format!("{what} {n}")).collect();
        if !odd.is_empty() {
            writeln!(f, "  {}", odd.join("   "))?;
        }
        if let Some(r) = &self.record {
            writeln!(
                f,
                "  recorded to {}: segments {}   messages {}   dropped {}   unrecordable {}{}{}",
                r.file,
                r.segments,
                r.messages,
                r.dropped_segments,
                r.unrecordable_segments,
                r.files_text(),
                r.stopped_text()
            )?;
        }
        let formats = if self.formats_seen.is_empty() { "-".to_string() } else { self.formats_seen.join(", ") };
        writeln!(f, "  formats {formats}   switches {}", self.format_switches)?;
        match &self.publisher_totals {
            None => writeln!(f, "  publisher totals: none (no end of stream received)")?,
            Some(t) => writeln!(
                f,
                "  publisher totals: frames {}   messages {}   match {}",
                t.frames,
                t.messages,
                if self.totals_match == Some(true) { "yes" } else { "no" }
            )?,
        }
        if let Some(why) = self.incomplete() {
            writeln!(f, "  stream INCOMPLETE: {why}")?;
        }
        let l = &self.latency_ns;
        let h = |v: Option<u64>| v.map_or_else(|| "-".to_string(), human_ns);
        writeln!(
            f,
            "  latency one-way over {} frames: p50 {}  p90 {}  p99 {}  p99.9 {}  p99.99 {}  max {}",
            l.count,
            h(l.p50),
            h(l.p90),
            h(l.p99),
            h(l.p999),
            h(l.p9999),
            h(l.max)
        )?;
        if self.latency_mode == "round-trip" {
            // The round trip is measured where the echoes return: the publisher reports it.
            writeln!(
                f,
                "  echoes sent {}   dropped {}   (the round trip is in the publisher's report)",
                self.echoes_sent, self.echoes_dropped
            )?;
        }
        let mut types = String::new();
        for (k, n) in &self.message_types {
            // A type byte is the peer's: a control byte is shown escaped, not sent to the terminal.
            let _ = write!(types, "{}:{n}  ", mdrelay_iex::peer_text::escape(k));
        }
        writeln!(f, "  by type   {}", types.trim_end())?;
        writeln!(
            f,
            "  total trade volume {}   symbols with trades or quotes {}",
            self.total_trade_volume, self.symbols_with_trades_or_quotes
        )?;
        mdrelay_iex::aggregate::write_symbol_table(f, &self.symbols)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mdrelay_codec::Format;
    use mdrelay_iex::message::{Trade, TradingStatus};
    use mdrelay_iex::price::Price;

    /// A one-second run over the "test" transport that ended with the stream.
    fn test_run() -> RunInfo {
        RunInfo {
            transport: "test".into(),
            stop_reason: "end",
            elapsed: Duration::from_secs(1),
            latency_mode: "one-way",
            from_start: None,
            jetstream_repair: false,
        }
    }

    fn trade(symbol: &str, size: u32) -> Message<'static> {
        Message::TradeReport(Trade {
            sale_condition: 0,
            timestamp: 0,
            symbol: Symbol::new(symbol).unwrap(),
            size,
            price: Price(10_000),
            trade_id: 1,
        })
    }

    #[test]
    fn the_filter_limits_aggregates_but_not_counts_and_totals_compare_by_type() {
        let mut stats = Stats::new(Some(vec![Symbol::new("B").unwrap()]));
        for m in [trade("A", 5), trade("B", 7)] {
            stats.message(&m);
        }
        stats.message(&Message::TradingStatus(TradingStatus {
            status: b'T',
            timestamp: 0,
            symbol: Symbol::new("A").unwrap(),
            reason: *b"    ",
        }));
        stats.frame_decoded(100, 350);
        stats.frame_decoded(500, 400);
        stats.end_interval();
        let mut counters = Counters::default();
        counters.publisher_totals = Some(Totals {
            frames: 2,
            messages: 3,
            by_type: [(b'T', 2), (b'H', 1)].into_iter().collect(),
            truncated: false,
        });
        counters.formats_seen = vec![Format::Raw];
        let report = stats.report(&counters, test_run());
        assert_eq!(report.total_trade_volume, 7);
        assert_eq!(report.symbols.len(), 1);
        assert_eq!(report.message_types.get("T"), Some(&2));
        assert_eq!(report.totals_match, Some(true));
        assert_eq!(report.negative_latencies, 1);
        assert_eq!((report.latency_ns.count, report.latency_ns.max), (2, Some(250)));
        let json = serde_json::to_value(&report).unwrap();
        assert_eq!(json["symbols"]["B"]["trade_volume"], 7);
        assert_eq!(json["late_join_sequence"], serde_json::Value::Null);
        assert!(report.to_string().contains("match yes"));
        assert_eq!(report.stream_complete, Some(true));
        assert_eq!(report.incomplete(), None);
        // The same counts against a truncated stream's END (a relay that lost its upstream).
        counters.publisher_totals.as_mut().unwrap().truncated = true;
        assert_eq!(stats.totals_match(counters.publisher_totals.as_ref(), None), Some(false));
        assert_eq!(stats.stream_complete(&counters, false), Some(false));
    }

    #[test]
    fn the_verdict_needs_an_end_and_judges_a_late_joiner_from_where_it_joined() {
        let mut stats = Stats::new(None);
        stats.message(&trade("A", 5));
        stats.frame_decoded(100, 200);
        stats.end_interval();
        let mut counters = Counters::default();
        // No END: no verdict, whatever is missing.
        counters.lost = 3;
        assert_eq!(stats.stream_complete(&counters, false), None);
        // An END counting more frames than came.
        counters.publisher_totals =
            Some(Totals { frames: 4, messages: 4, by_type: [(b'T', 4)].into_iter().collect(), truncated: false });
        assert_eq!(stats.stream_complete(&counters, false), Some(false));
        // Joined at frame 4, the session's last: owed that frame only, and it came.
        counters.lost = 0;
        counters.late_join = Some(4);
        assert_eq!(stats.stream_complete(&counters, false), Some(true));
        // ... unless it asked for the session from its first frame.
        assert_eq!(stats.stream_complete(&counters, true), Some(false));
        // A late joiner missing a frame after it joined, or whose END says truncated.
        counters.lost = 1;
        assert_eq!(stats.stream_complete(&counters, false), Some(false));
        counters.lost = 0;
        counters.publisher_totals.as_mut().unwrap().truncated = true;
        assert_eq!(stats.stream_complete(&counters, false), Some(false));
        let report = stats.report(&counters, test_run());
        let why = report.incomplete().unwrap();
        assert!(why.contains("joined at frame 4") && why.contains("cut short"), "{why}");
        assert!(report.to_string().contains("stream INCOMPLETE: joined at frame 4"), "{report}");
    }
}
