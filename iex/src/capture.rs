//! Streaming capture reader: classic pcap (microsecond or nanosecond, either byte order) and
//! pcapng (any `if_tsresol`, several sections and interfaces), each optionally gzip-compressed.
//!
//! The format is found from the magic bytes, never from the file name. Reading streams through a
//! fixed-size buffer, so memory stays flat whatever the file size; a record larger than the buffer
//! is an error rather than a reason to allocate.

use flate2::read::MultiGzDecoder;
use pcap_parser::traits::PcapReaderIterator;
use pcap_parser::{Block, PcapBlockOwned, PcapError};
use std::fs::File;
use std::io::{self, BufRead, BufReader, Read};
use std::path::Path;
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};

/// Buffer size of the block reader; also the largest record it accepts.
pub const READ_BUFFER: usize = 1 << 20;

/// One captured packet, borrowed from the reader's buffer until the next call.
#[derive(Clone, Copy, Debug)]
pub struct Packet<'a> {
    /// 0-based index of the packet in the capture.
    pub index: u64,
    /// Byte offset of the packet's record in the (decompressed) capture.
    pub offset: u64,
    /// Capture time, nanoseconds since the Unix epoch.
    pub timestamp_ns: i64,
    /// The pcap link-layer type of `data`.
    pub link_type: i32,
    /// The captured bytes.
    pub data: &'a [u8],
}

/// The container format found from the magic bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CaptureFormat {
    /// Classic pcap.
    Pcap,
    /// pcapng.
    PcapNg,
}

/// A capture that cannot be read (as opposed to bad packets inside it, which are counted).
#[derive(Debug, thiserror::Error)]
pub enum CaptureError {
    /// The file could not be opened or read.
    #[error("{name}: {source}")]
    Io {
        /// The file.
        name: String,
        /// The cause.
        source: io::Error,
    },
    /// The file is empty.
    #[error("{name}: the file is empty, not a pcap or pcapng capture")]
    Empty {
        /// The file.
        name: String,
    },
    /// The magic bytes are neither pcap nor pcapng (after gzip, if compressed).
    #[error(
        "{name}: not a pcap or pcapng capture (starts with {magic}); give a .pcap or .pcapng file, optionally gzipped"
    )]
    NotACapture {
        /// The file.
        name: String,
        /// The first bytes, in hex.
        magic: String,
    },
    /// A record that cannot be parsed; reading cannot go on past it.
    #[error("{name}: malformed capture record at offset {offset}: {what}")]
    Malformed {
        /// The file.
        name: String,
        /// Offset of the record in the (decompressed) capture.
        offset: u64,
        /// What was wrong.
        what: String,
    },
}

/// Makes every `read` fill the buffer unless the end is reached: the block reader takes a short
/// read (common from a gzip decoder) for the end of the file.
struct ReadFully<R>(R);

impl<R: Read> Read for ReadFully<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let mut filled = 0;
        while filled < buf.len() {
            match self.0.read(&mut buf[filled..]) {
                Ok(0) => break,
                Ok(n) => filled += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(filled)
    }
}

/// Bytes per block of decompressed data handed from the inflating thread to the reader.
const INFLATE_BLOCK: usize = 256 * 1024;
/// Blocks in flight between the two threads: enough to ride out a pause on either side, while
/// memory stays bounded (about 1 MiB).
const INFLATE_BLOCKS: usize = 4;

/// Gunzip on a thread of its own, handing decompressed blocks to the reader through a bounded
/// channel: inflating costs about as much as parsing and relaying the packets, so on a second
/// core it comes off the hot thread's critical path. Blocks go back for reuse, so nothing is
/// allocated per block once the pipeline is full.
struct InflateThread {
    blocks: Receiver<io::Result<Vec<u8>>>,
    spare: SyncSender<Vec<u8>>,
    current: Vec<u8>,
    at: usize,
    done: bool,
}

impl InflateThread {
    fn spawn<R: Read + Send + 'static>(mut source: R) -> io::Result<InflateThread> {
        let (full_tx, blocks) = sync_channel::<io::Result<Vec<u8>>>(INFLATE_BLOCKS);
        // One more spare than blocks in flight: the reader holds one while the channel is full.
        let (spare, spare_rx) = sync_channel::<Vec<u8>>(INFLATE_BLOCKS + 2);
        std::thread::Builder::new().name("capture-gunzip".into()).spawn(move || {
            loop {
                let mut block = spare_rx.try_recv().unwrap_or_else(|_| Vec::with_capacity(INFLATE_BLOCK));
                block.resize(INFLATE_BLOCK, 0);
                let mut filled = 0;
                let result = loop {
                    match source.read(&mut block[filled..]) {
                        Ok(0) => break Ok(()),
                        Ok(n) => {
                            filled += n;
                            if filled == block.len() {
                                break Ok(());
                            }
                        }
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                        Err(e) => break Err(e),
                    }
                };
                block.truncate(filled);
                let last = filled < INFLATE_BLOCK || result.is_err();
                // An empty block marks the end; a send fails once the reader is gone, which
                // ends this thread.
                let sent = match result {
                    Ok(()) => full_tx.send(Ok(block)),
                    Err(e) if filled > 0 => full_tx.send(Ok(block)).and_then(|()| full_tx.send(Err(e))),
                    Err(e) => full_tx.send(Err(e)),
                };
                if sent.is_err() || last {
                    if last {
                        let _ = full_tx.send(Ok(Vec::new()));
                    }
                    return;
                }
            }
        })?;
        Ok(InflateThread { blocks, spare, current: Vec::new(), at: 0, done: false })
    }
}

impl Read for InflateThread {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        while self.at == self.current.len() {
            if self.done {
                return Ok(0);
            }
            let next = match self.blocks.recv() {
                Ok(Ok(block)) => block,
                Ok(Err(e)) => {
                    self.done = true;
                    return Err(e);
                }
                // The thread ended without its end marker: it panicked.
                Err(_) => {
                    self.done = true;
                    return Err(io::Error::other("the gunzip thread stopped"));
                }
            };
            if next.is_empty() {
                self.done = true;
            }
            let used = std::mem::replace(&mut self.current, next);
            let _ = self.spare.try_send(used);
            self.at = 0;
        }
        let n = buf.len().min(self.current.len() - self.at);
        buf[..n].copy_from_slice(&self.current[self.at..self.at + n]);
        self.at += n;
        Ok(n)
    }
}

#[derive(Clone, Copy, Debug)]
struct Interface {
    link_type: i32,
    /// Timestamp units per second; `None` when the interface's `if_tsresol` is invalid.
    units_per_second: Option<u64>,
    offset_seconds: i64,
    snaplen: u32,
}

/// Where the next packet's bytes sit in the block reader's buffer.
#[derive(Clone, Copy)]
struct Found {
    start: usize,
    len: usize,
    timestamp_ns: i64,
    link_type: i32,
}

/// Streaming reader of packets from a capture.
pub struct CaptureReader {
    name: String,
    format: CaptureFormat,
    compressed: bool,
    blocks: Box<dyn PcapReaderIterator + Send>,
    /// Bytes of the block last returned, consumed on the next call so the packet can borrow them.
    pending: usize,
    nanosecond_pcap: bool,
    /// Byte order of the current pcapng section.
    big_endian_section: bool,
    interfaces: Vec<Interface>,
    packets: u64,
    truncated_at: Option<u64>,
    skipped_records: u64,
    /// The packet last returned, until the next call moves past it.
    last: Option<(Found, u64, u64)>,
}

fn to_ns(ticks: u64, units_per_second: u64, offset_seconds: i64) -> i64 {
    let ns = u128::from(ticks) * 1_000_000_000 / u128::from(units_per_second.max(1));
    (ns as i64).wrapping_add(offset_seconds.wrapping_mul(1_000_000_000))
}

impl CaptureReader {
    /// Opens a capture file.
    pub fn open(path: impl AsRef<Path>) -> Result<CaptureReader, CaptureError> {
        let path = path.as_ref();
        let name = path.display().to_string();
        let file = File::open(path).map_err(|source| CaptureError::Io { name: name.clone(), source })?;
        CaptureReader::new(name, file)
    }

    /// Reads a capture from any byte stream; `name` is used in errors and logs.
    pub fn new<R: Read + Send + 'static>(name: impl Into<String>, reader: R) -> Result<CaptureReader, CaptureError> {
        let name = name.into();
        let io_err = |name: &str, source| CaptureError::Io { name: name.to_string(), source };
        let mut buffered = BufReader::with_capacity(64 * 1024, reader);
        let head = buffered.fill_buf().map_err(|e| io_err(&name, e))?;
        if head.is_empty() {
            return Err(CaptureError::Empty { name });
        }
        let compressed = head.len() >= 2 && head[0] == 0x1f && head[1] == 0x8b;
        let mut stream: Box<dyn Read + Send> = if !compressed {
            Box::new(ReadFully(buffered))
        } else {
            let inflate = InflateThread::spawn(MultiGzDecoder::new(buffered)).map_err(|e| io_err(&name, e))?;
            Box::new(ReadFully(inflate))
        };
        // Peek the inner magic to name the format (and to give a clear error), then hand the
        // peeked bytes back in front of the stream.
        let mut magic = [0u8; 4];
        let got = stream.read(&mut magic).map_err(|e| io_err(&name, e))?;
        if got == 0 {
            return Err(CaptureError::Empty { name });
        }
        let format = match magic {
            [0x0a, 0x0d, 0x0d, 0x0a] => CaptureFormat::PcapNg,
            [0xd4, 0xc3, 0xb2, 0xa1]
            | [0xa1, 0xb2, 0xc3, 0xd4]
            | [0x4d, 0x3c, 0xb2, 0xa1]
            | [0xa1, 0xb2, 0x3c, 0x4d] => CaptureFormat::Pcap,
            _ => {
                let magic = magic[..got].iter().map(|b| format!("{b:02x}")).collect::<Vec<_>>().join(" ");
                return Err(CaptureError::NotACapture { name, magic });
            }
        };
        let stream = ReadFully(io::Cursor::new(magic).chain(stream));
        let blocks = pcap_parser::create_reader(READ_BUFFER, stream).map_err(|e| match e {
            PcapError::ReadError => {
                CaptureError::Malformed { name: name.clone(), offset: 0, what: "read error in the file header".into() }
            }
            other => {
                CaptureError::Malformed { name: name.clone(), offset: 0, what: format!("bad file header: {other:?}") }
            }
        })?;
        Ok(CaptureReader {
            name,
            format,
            compressed,
            blocks,
            pending: 0,
            nanosecond_pcap: false,
            big_endian_section: false,
            interfaces: Vec::new(),
            packets: 0,
            truncated_at: None,
            skipped_records: 0,
            last: None,
        })
    }

    /// The name given at construction (the path for [`CaptureReader::open`]).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// pcap or pcapng.
    pub fn format(&self) -> CaptureFormat {
        self.format
    }

    /// True when the file was gzip-compressed.
    pub fn compressed(&self) -> bool {
        self.compressed
    }

    /// When the last record was cut short: its offset. Everything before it was returned.
    pub fn truncated_at(&self) -> Option<u64> {
        self.truncated_at
    }

    /// pcapng packet records skipped because they named an interface that was never described or
    /// one with an invalid timestamp resolution.
    pub fn skipped_records(&self) -> u64 {
        self.skipped_records
    }

    fn malformed(&self, offset: u64, what: impl Into<String>) -> CaptureError {
        CaptureError::Malformed { name: self.name.clone(), offset, what: what.into() }
    }

    /// The next packet, or `None` at the end of the capture (including a truncated last record,
    /// see [`CaptureReader::truncated_at`]).
    pub fn next_packet(&mut self) -> Result<Option<Packet<'_>>, CaptureError> {
        self.last = None;
        let found = loop {
            if self.pending > 0 {
                self.blocks.consume(self.pending);
                self.pending = 0;
            }
            let offset = self.blocks.consumed() as u64;
            if let Some(len) = self.short_pcapng_block() {
                let what = format!("pcapng block of {len} bytes, shorter than its 12-byte type and length fields");
                return Err(self.malformed(offset, what));
            }
            let (len, block) = match self.blocks.next() {
                Ok(next) => next,
                Err(PcapError::Eof) => return Ok(None),
                Err(PcapError::Incomplete(_)) => {
                    if let Err(e) = self.blocks.refill() {
                        let what = format!("read error: {e:?}");
                        return Err(self.malformed(offset, what));
                    }
                    continue;
                }
                Err(PcapError::UnexpectedEof) => {
                    let present = self.blocks.data().len();
                    tracing::warn!(file = %self.name, offset, present, "capture ends inside a record; the record is ignored, everything before it is kept");
                    self.truncated_at = Some(offset);
                    return Ok(None);
                }
                Err(PcapError::BufferTooSmall) => {
                    let what = format!("record larger than the reader's {READ_BUFFER}-byte limit");
                    return Err(self.malformed(offset, what));
                }
                Err(e) => {
                    let what = format!("{e:?}");
                    return Err(self.malformed(offset, what));
                }
            };
            self.pending = len;
            // Positions are taken as addresses so the block's borrow of the reader can end before
            // the packet is returned (the data is re-sliced from the buffer below).
            let located = match block {
                PcapBlockOwned::LegacyHeader(header) => {
                    self.nanosecond_pcap = header.is_nanosecond_precision();
                    self.interfaces = vec![Interface {
                        link_type: header.network.0,
                        units_per_second: Some(if self.nanosecond_pcap { 1_000_000_000 } else { 1_000_000 }),
                        offset_seconds: 0,
                        snaplen: header.snaplen,
                    }];
                    None
                }
                PcapBlockOwned::Legacy(record) => {
                    let units = if self.nanosecond_pcap { 1 } else { 1_000 };
                    let timestamp_ns = i64::from(record.ts_sec) * 1_000_000_000 + i64::from(record.ts_usec) * units;
                    let link_type = self.interfaces.first().map_or(0, |i| i.link_type);
                    let data = &record.data[..record.data.len().min(record.caplen as usize)];
                    Some((data.as_ptr() as usize, data.len(), timestamp_ns, link_type))
                }
                PcapBlockOwned::NG(Block::SectionHeader(shb)) => {
                    self.big_endian_section = shb.big_endian();
                    self.interfaces.clear();
                    None
                }
                PcapBlockOwned::NG(Block::InterfaceDescription(idb)) => {
                    self.interfaces.push(Interface {
                        link_type: idb.linktype.0,
                        units_per_second: idb.ts_resolution(),
                        offset_seconds: idb.if_tsoffset,
                        snaplen: idb.snaplen,
                    });
                    None
                }
                PcapBlockOwned::NG(Block::EnhancedPacket(epb)) => match self.interfaces.get(epb.if_id as usize) {
                    Some(Interface { link_type, units_per_second: Some(units), offset_seconds, .. }) => {
                        let ticks = (u64::from(epb.ts_high) << 32) | u64::from(epb.ts_low);
                        let data = &epb.data[..epb.data.len().min(epb.caplen as usize)];
                        Some((data.as_ptr() as usize, data.len(), to_ns(ticks, *units, *offset_seconds), *link_type))
                    }
                    _ => {
                        let if_id = epb.if_id;
                        self.skipped_records += 1;
                        if crate::warn::allow("capture interface") {
                            tracing::warn!(file = %self.name, offset, if_id, "packet names an undescribed interface or one with an invalid if_tsresol; skipped");
                        }
                        None
                    }
                },
                PcapBlockOwned::NG(Block::SimplePacket(spb)) => match self.interfaces.first() {
                    Some(interface) => {
                        let mut len = spb.data.len().min(spb.origlen as usize);
                        if interface.snaplen > 0 {
                            len = len.min(interface.snaplen as usize);
                        }
                        Some((spb.data.as_ptr() as usize, len, 0, interface.link_type))
                    }
                    None => {
                        self.skipped_records += 1;
                        if crate::warn::allow("capture interface") {
                            tracing::warn!(file = %self.name, offset, "simple packet block before any interface description; skipped");
                        }
                        None
                    }
                },
                PcapBlockOwned::NG(_) => None,
            };
            if let Some((address, len, timestamp_ns, link_type)) = located {
                let base = self.blocks.data().as_ptr() as usize;
                break Found { start: address - base, len, timestamp_ns, link_type };
            }
        };
        let index = self.packets;
        self.packets += 1;
        let offset = self.blocks.consumed() as u64;
        self.last = Some((found, index, offset));
        Ok(self.current_packet())
    }

    /// The length of the next pcapng block when it is below the 12 bytes every block needs.
    /// pcap-parser 0.17 subtracts 12 from the length of a process information block checked
    /// only against 4, which overflows on such a block; it is refused here before it is parsed.
    /// (A section header's length is checked by the parser, in the byte order its magic gives.)
    fn short_pcapng_block(&self) -> Option<u32> {
        if self.format != CaptureFormat::PcapNg {
            return None;
        }
        let head = self.blocks.data().first_chunk::<8>()?;
        if head[..4] == [0x0a, 0x0d, 0x0d, 0x0a] {
            return None;
        }
        let len = [head[4], head[5], head[6], head[7]];
        let len = if self.big_endian_section { u32::from_be_bytes(len) } else { u32::from_le_bytes(len) };
        (len < 12).then_some(len)
    }

    /// The packet the last [`CaptureReader::next_packet`] returned, again (`None` before the
    /// first or after the end). Lets a caller that skipped ahead in a loop borrow it afresh.
    pub fn current_packet(&self) -> Option<Packet<'_>> {
        let (found, index, offset) = self.last?;
        let data = &self.blocks.data()[found.start..found.start + found.len];
        Some(Packet { index, offset, timestamp_ns: found.timestamp_ns, link_type: found.link_type, data })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gzip(data: &[u8]) -> Vec<u8> {
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        io::Write::write_all(&mut gz, data).unwrap();
        gz.finish().unwrap()
    }

    #[test]
    fn the_gunzip_thread_hands_over_every_byte_in_order_across_blocks() {
        // Several blocks and a partial last one, in reads of an odd size.
        let data: Vec<u8> = (0..3 * INFLATE_BLOCK + 12_345).map(|i| (i * 7 + i / 1000) as u8).collect();
        let gz = gzip(&data);
        let mut inflate = InflateThread::spawn(MultiGzDecoder::new(io::Cursor::new(gz))).unwrap();
        let mut out = Vec::new();
        let mut buf = [0u8; 4099];
        loop {
            let n = inflate.read(&mut buf).unwrap();
            if n == 0 {
                break;
            }
            out.extend_from_slice(&buf[..n]);
        }
        assert_eq!(out, data);
        assert_eq!(inflate.read(&mut buf).unwrap(), 0, "the end stays the end");
    }

    #[test]
    fn a_cut_gzip_stream_gives_its_bytes_then_an_error_not_a_hang() {
        let data: Vec<u8> = (0..2 * INFLATE_BLOCK).map(|i| (i % 251) as u8).collect();
        let gz = gzip(&data);
        let cut = gz[..gz.len() / 2].to_vec();
        let mut inflate = InflateThread::spawn(MultiGzDecoder::new(io::Cursor::new(cut))).unwrap();
        let mut out = Vec::new();
        let result = inflate.read_to_end(&mut out);
        assert!(result.is_err(), "a cut stream is an error");
        assert_eq!(out[..], data[..out.len()], "what came before the cut is intact");
    }

    /// A little-endian section header block with no options.
    fn section_header() -> Vec<u8> {
        let mut b = vec![0x0a, 0x0d, 0x0d, 0x0a];
        b.extend_from_slice(&28u32.to_le_bytes());
        b.extend_from_slice(&0x1a2b_3c4du32.to_le_bytes());
        b.extend_from_slice(&[1, 0, 0, 0]);
        b.extend_from_slice(&u64::MAX.to_le_bytes());
        b.extend_from_slice(&28u32.to_le_bytes());
        b
    }

    #[test]
    fn a_pcapng_block_shorter_than_its_length_fields_is_malformed_not_a_panic() {
        // Found by fuzzing: a process information block (type 0x80000001) of length 11 made
        // pcap-parser compute 11 - 12, a panic with overflow checks.
        for len in [11u32, 8, 4, 0] {
            let mut bytes = section_header();
            bytes.extend_from_slice(&0x8000_0001u32.to_le_bytes());
            bytes.extend_from_slice(&len.to_le_bytes());
            bytes.extend_from_slice(&[0; 16]);
            let mut reader = CaptureReader::new("short-block", io::Cursor::new(bytes)).unwrap();
            let error = reader.next_packet().unwrap_err().to_string();
            assert!(error.contains(&format!("pcapng block of {len} bytes")) && error.contains("offset 28"), "{error}");
        }
    }
}
