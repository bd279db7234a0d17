//! Reading a whole capture into counts and aggregates: what `mdrelay-pub inspect` prints.
//!
//! Bad data is counted and skipped, never fatal: a non-IEX packet, a segment whose header
//! disagrees with its UDP length, a message length that runs past its segment, a message shorter
//! than its layout, an unknown message type. Each is logged with the file and byte offset (a few
//! of each kind a minute, from the process's warning budget in [`crate::warn`]; the counts cover
//! all of them).

use crate::aggregate::{Aggregator, SymbolAggregate};
use crate::capture::{CaptureError, CaptureReader, Packet};
use crate::counts::TypeCounts;
use crate::iextp::{self, Segment};
use crate::link;
use crate::message::Message;
use crate::price::Symbol;
use crate::sequence::{SequenceCounts, SequenceEvent, SequenceTracker};
use crate::warn;
use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;

/// Everything `inspect` reports about a capture. The first fields carry the same names and
/// meanings as the reference reader's JSON; the rest are mdrelay's own counters.
#[derive(Clone, Debug, Default, Serialize)]
pub struct InspectReport {
    /// The capture's file name (without directories).
    pub file: String,
    /// Packet records read.
    pub packets: u64,
    /// IEX-TP segments among them.
    pub segments: u64,
    /// Segments with no messages.
    pub heartbeats: u64,
    /// Messages (length-prefixed blocks) over all segments.
    pub messages: u64,
    /// 1 when the capture ends inside a record.
    pub truncated_records: u64,
    /// Packets that are not IEX-TP: not IPv4/UDP, too short, wrong version or length mismatch.
    pub non_iex_packets: u64,
    /// Messages by type byte.
    pub message_types: BTreeMap<String, u64>,
    /// Traded volume over all symbols.
    pub total_trade_volume: u64,
    /// Symbols that had a trade or a quote.
    pub symbols_with_trades_or_quotes: u64,
    /// Those symbols' aggregates, sorted by symbol.
    #[serde(serialize_with = "serialize_symbols")]
    pub symbols: Vec<(Symbol, SymbolAggregate)>,
    /// Messages of a type the model does not know (counted in `message_types` too).
    pub unknown_messages: u64,
    /// Messages shorter than the layout of their type, or empty.
    pub malformed_messages: u64,
    /// Message length prefixes that ran past their segment (the rest of that segment is lost).
    pub length_overruns: u64,
    /// Segments whose message count disagrees with the blocks found in them.
    pub message_count_mismatches: u64,
    /// pcapng packet records skipped for naming an unusable interface.
    pub skipped_records: u64,
    /// Segments by message protocol.
    pub protocols: BTreeMap<String, u64>,
    /// Sequence gaps, restarts, duplicates and late segments.
    #[serde(flatten)]
    pub sequence: SequenceCounts,
}

/// Serializes symbols and their aggregates as a JSON object keyed by symbol, in order.
pub fn serialize_symbols<S: serde::Serializer>(symbols: &[(Symbol, SymbolAggregate)], s: S) -> Result<S::Ok, S::Error> {
    use serde::ser::SerializeMap;
    let mut map = s.serialize_map(Some(symbols.len()))?;
    for (symbol, aggregate) in symbols {
        map.serialize_entry(&symbol.to_text(), aggregate)?;
    }
    map.end()
}

/// Accumulates an [`InspectReport`] packet by packet.
#[derive(Debug)]
pub struct Inspector {
    source: String,
    report: InspectReport,
    types: TypeCounts,
    aggregates: Aggregator,
    sequences: SequenceTracker,
}

impl Inspector {
    /// An inspector for packets from `source` (a file name, used in logs).
    pub fn new(source: impl Into<String>) -> Self {
        Inspector {
            source: source.into(),
            report: InspectReport::default(),
            types: TypeCounts::new(),
            aggregates: Aggregator::new(),
            sequences: SequenceTracker::new(),
        }
    }

    /// Takes one captured packet.
    pub fn packet(&mut self, packet: &Packet<'_>) {
        self.report.packets += 1;
        match link::udp_datagram(packet.link_type, packet.data) {
            Ok(datagram) => self.datagram(datagram.payload, packet.offset),
            Err(error) => {
                self.report.non_iex_packets += 1;
                if warn::allow("link") {
                    tracing::warn!(file = %self.source, offset = packet.offset, %error, "packet skipped: no IPv4 UDP datagram");
                }
            }
        }
    }

    /// Takes one UDP payload (`offset`: where its packet record starts, for logs).
    pub fn datagram(&mut self, payload: &[u8], offset: u64) {
        match Segment::parse(payload) {
            Ok(segment) => self.segment(&segment, offset),
            Err(error) => {
                self.report.non_iex_packets += 1;
                if warn::allow("segment") {
                    tracing::warn!(file = %self.source, offset, %error, "packet skipped: not an IEX-TP segment");
                }
            }
        }
    }

    /// Takes one IEX-TP segment.
    pub fn segment(&mut self, segment: &Segment<'_>, offset: u64) {
        let header = &segment.header;
        self.report.segments += 1;
        if header.is_heartbeat() {
            self.report.heartbeats += 1;
        }
        *self.report.protocols.entry(iextp::protocol::name(header.protocol_id).to_string()).or_default() += 1;
        match self.sequences.observe(header) {
            SequenceEvent::InOrder => {}
            event => {
                if warn::allow("sequence") {
                    tracing::info!(file = %self.source, offset, session = header.session_id, sequence = header.first_sequence, ?event, "sequence break");
                }
            }
        }
        let mut blocks = segment.blocks();
        let mut found = 0u32;
        for block in blocks.by_ref() {
            let bytes = match block {
                Ok(bytes) => bytes,
                Err(overrun) => {
                    self.report.length_overruns += 1;
                    if warn::allow("overrun") {
                        let at = offset_in_payload(overrun.offset);
                        tracing::warn!(file = %self.source, offset, payload_offset = at, %overrun, "rest of segment skipped");
                    }
                    break;
                }
            };
            found += 1;
            self.report.messages += 1;
            let Some(&kind) = bytes.first() else {
                self.report.malformed_messages += 1;
                continue;
            };
            self.types.add(kind);
            match Message::parse(bytes) {
                Ok(message @ Message::Unknown(_)) => {
                    self.report.unknown_messages += 1;
                    if warn::allow("unknown") {
                        tracing::debug!(file = %self.source, offset, kind = %(message.kind() as char), "unknown message type skipped");
                    }
                }
                Ok(message) => self.aggregates.apply(&message),
                Err(error) => {
                    self.report.malformed_messages += 1;
                    if warn::allow("malformed") {
                        tracing::warn!(file = %self.source, offset, %error, "message skipped");
                    }
                }
            }
        }
        if found != u32::from(header.message_count) {
            self.report.message_count_mismatches += 1;
        }
    }

    /// The report for everything taken so far.
    pub fn finish(mut self) -> InspectReport {
        self.report.file = Path::new(&self.source)
            .file_name()
            .map_or_else(|| self.source.clone(), |n| n.to_string_lossy().into_owned());
        self.report.message_types = self.types.by_name();
        self.report.total_trade_volume = self.aggregates.total_trade_volume();
        self.report.symbols = self.aggregates.active();
        self.report.symbols_with_trades_or_quotes = self.report.symbols.len() as u64;
        self.report.sequence = self.sequences.counts();
        self.report
    }
}

fn offset_in_payload(offset: usize) -> usize {
    iextp::HEADER_LEN + offset
}

/// Reads a whole capture and reports on it. Errors only when the file cannot be read as a
/// capture at all; everything inside it that is bad is counted in the report.
pub fn inspect_file(path: impl AsRef<Path>) -> Result<InspectReport, CaptureError> {
    inspect_reader(CaptureReader::open(path)?, |_| {})
}

/// [`inspect_file`] on a reader already open; `packets_done` is told the packets read so far
/// after each one (for a progress display).
pub fn inspect_reader(
    mut reader: CaptureReader,
    mut packets_done: impl FnMut(u64),
) -> Result<InspectReport, CaptureError> {
    let mut inspector = Inspector::new(reader.name().to_string());
    let mut packets = 0u64;
    while let Some(packet) = reader.next_packet()? {
        inspector.packet(&packet);
        packets += 1;
        packets_done(packets);
    }
    let truncated = reader.truncated_at().is_some();
    let skipped = reader.skipped_records();
    let mut report = inspector.finish();
    report.truncated_records = u64::from(truncated);
    report.skipped_records = skipped;
    Ok(report)
}

impl fmt::Display for InspectReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "{}", self.file)?;
        writeln!(
            f,
            "  packets {:>12}   segments {:>12}   heartbeats {:>10}",
            self.packets, self.segments, self.heartbeats
        )?;
        writeln!(
            f,
            "  messages {:>11}   non-IEX packets {:>5}   truncated records {}",
            self.messages, self.non_iex_packets, self.truncated_records
        )?;
        let types: Vec<String> = self.message_types.iter().map(|(k, n)| format!("{k}:{n}")).collect();
        writeln!(f, "  by type   {}", types.join("  "))?;
        writeln!(
            f,
            "  unknown {}   malformed {}   length overruns {}   count mismatches {}   skipped records {}",
            self.unknown_messages,
            self.malformed_messages,
            self.length_overruns,
            self.message_count_mismatches,
            self.skipped_records
        )?;
        let s = &self.sequence;
        writeln!(
            f,
            "  sequence gaps {} ({} messages missing, {} came late)   restarts {}   duplicates {}   reordered {}   overlapping {} ({} messages repeated)",
            s.gaps,
            s.gap_messages,
            s.late_messages,
            s.restarts,
            s.duplicate_segments,
            s.reordered_segments,
            s.overlapping_segments,
            s.repeated_messages
        )?;
        writeln!(
            f,
            "  total trade volume {}   symbols with trades or quotes {}",
            self.total_trade_volume, self.symbols_with_trades_or_quotes
        )?;
        crate::aggregate::write_symbol_table(f, &self.symbols)?;
        Ok(())
    }
}
