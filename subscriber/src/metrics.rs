//! The subscriber's Prometheus metrics (`[metrics] listen`; the endpoint is
//! `mdrelay_telemetry::prometheus`).
//!
//! The receive loop keeps its own plain counters and latency histogram ([`crate::stats`]); every
//! [`EXPORT_EVERY`] (and at the end of the run) [`SubscriberMetrics::export`] copies them into
//! the exporter's atomics, and feeds the latencies recorded since the last copy into the
//! latency summary. Nothing is added per frame.
//!
//! The pipeline ([`crate::receive`]) holds the handles and gathers its counts into
//! [`LoopCounts`] for each export: its own statistics and what the `mdrelay_client` subscriber
//! counted. This module reads only that, so it depends on the modules that keep the counters,
//! and not back on the pipeline that calls it.

use crate::record::RecordCounts;
use crate::stats::Stats;
use mdrelay_client::Counters;
use mdrelay_codec::Format;
use mdrelay_telemetry::prometheus::HistogramExport;
use metrics::{
    Counter, Gauge, Histogram as Summary, Unit, counter, describe_counter, describe_gauge, describe_histogram,
};
use metrics::{gauge, histogram};
use std::time::Duration;

/// How often the loop's counts are copied into the exporter.
pub const EXPORT_EVERY: Duration = Duration::from_secs(1);

/// The receive loop's counts as one export copies them.
pub struct LoopCounts<'a> {
    /// The run's counters and latencies.
    pub stats: &'a Stats,
    /// What the subscriber counted: bytes, frame accounting, refusals, reconnections,
    /// recovery, the highest frame and the format now.
    pub counters: &'a Counters,
    /// `--record`: what the writer thread has written; `None` when not recording.
    pub record: Option<RecordCounts>,
}

/// Handles to the subscriber's metrics, and what was exported last.
pub struct SubscriberMetrics {
    frames: Counter,
    messages: Counter,
    bytes: Counter,
    /// Frames missing now: a level, which falls as gaps are filled (a counter must not).
    missing: Gauge,
    duplicates: Counter,
    reordered: Counter,
    decode_errors: Counter,
    invalid_packets: Counter,
    /// Refused by frame protection, by reason: crc, authentication, replayed, mismatched.
    refused: [Counter; 4],
    recovered: Counter,
    unrecoverable: Counter,
    /// NATS: messages read from the JetStream stream to repair gaps.
    repair_fetches: Counter,
    reconnects: Counter,
    last_sequence: Gauge,
    format: Vec<Gauge>,
    latency: Summary,
    build_info: Gauge,
    /// The recording's counters, registered at the first export that finds a recording.
    record: Option<RecordMetrics>,
    /// The run's latencies as of the last export, so each export adds only the new ones.
    exported: HistogramExport,
}

impl SubscriberMetrics {
    /// Handles for this process's endpoint; `build_info` is set again at every export.
    pub fn new(build_info: Gauge) -> SubscriberMetrics {
        describe();
        SubscriberMetrics {
            frames: counter!("mdrelay_sub_frames_total"),
            messages: counter!("mdrelay_sub_messages_total"),
            bytes: counter!("mdrelay_sub_received_bytes_total"),
            missing: gauge!("mdrelay_sub_missing_frames"),
            duplicates: counter!("mdrelay_sub_duplicate_frames_total"),
            reordered: counter!("mdrelay_sub_reordered_frames_total"),
            decode_errors: counter!("mdrelay_sub_decode_errors_total"),
            invalid_packets: counter!("mdrelay_sub_invalid_packets_total"),
            refused: ["crc", "authentication", "replayed", "mismatched"]
                .map(|reason| counter!("mdrelay_sub_protection_refused_total", "reason" => reason)),
            recovered: counter!("mdrelay_sub_recovered_frames_total"),
            unrecoverable: counter!("mdrelay_sub_unrecoverable_frames_total"),
            repair_fetches: counter!("mdrelay_sub_nats_repair_fetches_total"),
            reconnects: counter!("mdrelay_sub_reconnects_total"),
            last_sequence: gauge!("mdrelay_sub_last_sequence"),
            format: Format::ALL.iter().map(|f| gauge!("mdrelay_sub_format", "format" => f.name())).collect(),
            // One-way whatever the mode: in round-trip mode the publisher measures the round trip.
            latency: histogram!("mdrelay_sub_latency_seconds", "mode" => "one-way"),
            build_info,
            record: None,
            exported: HistogramExport::new(),
        }
    }

    /// Copies the loop's counts, and the latencies recorded since the last export.
    pub fn export(&mut self, counts: &LoopCounts<'_>) {
        let stats = counts.stats;
        let c = counts.counters;
        self.frames.absolute(stats.frames);
        self.messages.absolute(stats.messages);
        self.bytes.absolute(c.bytes);
        self.missing.set(c.lost as f64);
        self.duplicates.absolute(c.duplicates);
        self.reordered.absolute(c.reordered);
        self.decode_errors.absolute(stats.decode_errors);
        self.invalid_packets.absolute(c.invalid_packets);
        let p = &c.protection;
        let refused = [p.crc_failures, p.authentication_failures, p.replayed_datagrams, p.mismatched_datagrams];
        for (counter, n) in self.refused.iter().zip(refused) {
            counter.absolute(n);
        }
        self.reconnects.absolute(c.reconnects);
        if let Some(recovery) = &c.recovery {
            self.recovered.absolute(recovery.frames_recovered);
            self.unrecoverable.absolute(recovery.frames_unrecoverable);
        }
        self.repair_fetches.absolute(c.repair_fetches);
        if let Some(highest) = c.highest_sequence {
            self.last_sequence.set(highest as f64);
        }
        for (f, gauge) in Format::ALL.iter().zip(&self.format) {
            gauge.set(if Some(*f) == c.format { 1.0 } else { 0.0 });
        }
        if let Some(record) = counts.record {
            self.record.get_or_insert_with(RecordMetrics::new).export(record);
        }
        self.build_info.set(1.0);
        self.exported.export(&self.latency, &stats.latency_so_far());
    }
}

/// `--record`: what the writer thread has written, from its shared counts.
struct RecordMetrics {
    segments: Counter,
    bytes: Counter,
    dropped: Counter,
    unwritten: Counter,
    files_written: Counter,
    files_rotated: Counter,
    files_removed: Counter,
}

impl RecordMetrics {
    fn new() -> RecordMetrics {
        describe_counter!("mdrelay_sub_record_segments_total", "Segments (frames) in the recording's files.");
        describe_counter!(
            "mdrelay_sub_record_bytes_total",
            Unit::Bytes,
            "Bytes in the recording's files (compressed ones when gzipped)."
        );
        describe_counter!(
            "mdrelay_sub_record_dropped_segments_total",
            "Segments not recorded because the recording's writer was a whole queue behind."
        );
        describe_counter!(
            "mdrelay_sub_record_unwritten_segments_total",
            "Segments not in the recording because it stopped on a write error (a full disk)."
        );
        describe_counter!("mdrelay_sub_record_files_written_total", "Recording files created.");
        describe_counter!(
            "mdrelay_sub_record_files_rotated_total",
            "Recording files closed to start a new one (record_rotate_size, record_rotate_interval)."
        );
        describe_counter!(
            "mdrelay_sub_record_files_removed_total",
            "The oldest recording files removed to keep at most record_max_files."
        );
        RecordMetrics {
            segments: counter!("mdrelay_sub_record_segments_total"),
            bytes: counter!("mdrelay_sub_record_bytes_total"),
            dropped: counter!("mdrelay_sub_record_dropped_segments_total"),
            unwritten: counter!("mdrelay_sub_record_unwritten_segments_total"),
            files_written: counter!("mdrelay_sub_record_files_written_total"),
            files_rotated: counter!("mdrelay_sub_record_files_rotated_total"),
            files_removed: counter!("mdrelay_sub_record_files_removed_total"),
        }
    }

    fn export(&self, counts: RecordCounts) {
        self.segments.absolute(counts.segments);
        self.bytes.absolute(counts.bytes);
        self.dropped.absolute(counts.dropped_segments);
        self.unwritten.absolute(counts.unwritten_segments);
        self.files_written.absolute(counts.files_written);
        self.files_rotated.absolute(counts.files_rotated);
        self.files_removed.absolute(counts.files_removed);
    }
}

/// HELP lines and units, once.
fn describe() {
    describe_counter!("mdrelay_sub_frames_total", "Frames decoded (retransmitted ones included).");
    describe_counter!("mdrelay_sub_messages_total", "IEX messages decoded.");
    describe_counter!(
        "mdrelay_sub_received_bytes_total",
        Unit::Bytes,
        "Bytes received from the network, relay headers included."
    );
    describe_gauge!(
        "mdrelay_sub_missing_frames",
        "Frames the publisher sent that have not arrived, now (the report's gaps; frames recovered or arriving late leave it)."
    );
    describe_counter!("mdrelay_sub_duplicate_frames_total", "Frames received more than once.");
    describe_counter!("mdrelay_sub_reordered_frames_total", "Frames that arrived after a later frame.");
    describe_counter!("mdrelay_sub_decode_errors_total", "Frames delimited but not decodable (skipped).");
    describe_counter!(
        "mdrelay_sub_invalid_packets_total",
        "Records or datagrams refused before any frame was read (bad header, foreign traffic)."
    );
    describe_counter!(
        "mdrelay_sub_protection_refused_total",
        "Records or datagrams refused by frame protection, by reason: CRC-32C mismatch, failed authentication, replayed (an older session), protected otherwise than configured."
    );
    describe_counter!(
        "mdrelay_sub_recovered_frames_total",
        "Missing frames recovered from the retransmission service (NATS: from the JetStream stream)."
    );
    describe_counter!(
        "mdrelay_sub_unrecoverable_frames_total",
        "Missing frames given up for good: the service or stream no longer had them, the window passed them, or the attempts ran out (with recovery only)."
    );
    describe_counter!(
        "mdrelay_sub_nats_repair_fetches_total",
        "NATS: messages read from the JetStream stream to repair gaps (those read to find where a range starts included)."
    );
    describe_counter!(
        "mdrelay_sub_reconnects_total",
        "Connections re-established after one was lost (TCP; NATS, to any server of the cluster)."
    );
    describe_gauge!("mdrelay_sub_last_sequence", "The highest frame sequence number received.");
    describe_gauge!("mdrelay_sub_format", "1 for the wire format the publisher sends now, 0 for the others.");
    describe_histogram!(
        "mdrelay_sub_latency_seconds",
        Unit::Seconds,
        "Latency per frame, one-way: receive time minus the origin's publish time (in round-trip mode too: the publisher measures the round trip)."
    );
}
