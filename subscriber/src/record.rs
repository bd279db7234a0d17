//! `--record FILE`: what the subscriber takes, written to a capture file as IEX-TP over UDP, in
//! arrival order, whatever the wire format, so that `mdrelay-pub inspect`, the reference reader,
//! `mdrelay-pub run --capture` or tcpreplay can read it.
//!
//! The frames written are the frames the subscriber takes and decodes: a duplicate, the other
//! A/B line's copy or a frame that does not decode is not written, so the recording inspects to
//! the aggregates of the run's report. Each is written as the IEX-TP segment it carried
//! (`mdrelay_proto::resegment`), stamped with its receive time, in an Ethernet / IPv4 / UDP
//! frame from the publisher's address to the multicast group the subscriber joined (or
//! [`RECORD_GROUP`]).
//!
//! The receive loop only copies each segment into a chunk; a writer thread does the framing,
//! the gzip and the file I/O. Chunks go to it through a bounded queue and come back to be
//! reused, so recording allocates nothing per frame once warm.

use crate::config::Transport;
use flate2::Compression;
use flate2::write::GzEncoder;
use mdrelay_proto::capture_writer::{CaptureWriter, Container, WriterOptions};
use mdrelay_proto::codec::{BatchHeader, Format};
use mdrelay_proto::message::Message;
use mdrelay_proto::resegment::Resegmenter;
use serde::Serialize;
use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, Receiver, SyncSender, TrySendError};
use std::thread::JoinHandle;

/// The destination of recorded datagrams when the subscriber joined no multicast group: an
/// administratively scoped group (as `mdrelay-pub synth` writes), so a replay with tcpreplay
/// stays on site.
pub const RECORD_GROUP: Ipv4Addr = Ipv4Addr::new(239, 255, 21, 4);
/// The destination port when the transport has none of its own (TCP, or a port 0).
pub const RECORD_PORT: u16 = 10378;
/// The source of recorded datagrams from a publisher reached over IPv6 (benchmark range).
const IPV6_SOURCE: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 1);

/// Bytes of segments handed to the writer at once: one queue operation per few hundred
/// segments instead of one per segment.
const CHUNK_BYTES: usize = 64 << 10;
/// Chunks the queue to the writer holds: 32 MiB, a few seconds of a busy feed, which absorbs a
/// writer held up by the disk or by gzip for that long.
const QUEUE_CHUNKS: usize = 512;

/// Which container and compression a recording's file name asks for: pcapng when the name ends
/// in `.pcapng` (before any `.gz`), pcap otherwise; gzip when it ends in `.gz`.
pub fn container_for(path: &Path) -> (Container, bool) {
    let name = path.file_name().map(|n| n.to_string_lossy().to_ascii_lowercase()).unwrap_or_default();
    let (stem, gzip) = match name.strip_suffix(".gz") {
        Some(stem) => (stem, true),
        None => (name.as_str(), false),
    };
    let container = if stem.ends_with(".pcapng") { Container::PcapNg } else { Container::Pcap };
    (container, gzip)
}

/// The file under the capture writer: buffered, gzipped or not. Its own type, not a boxed
/// `Write`, so the end of the file (the gzip trailer) is written by a call whose error is seen.
enum Sink {
    Plain(BufWriter<File>),
    /// Boxed: the encoder's state would make every `Sink` ten times the size of a plain one.
    Gzip(Box<BufWriter<GzEncoder<File>>>),
}

impl Write for Sink {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Sink::Plain(w) => w.write(buf),
            Sink::Gzip(w) => w.write(buf),
        }
    }

    fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        match self {
            Sink::Plain(w) => w.write_all(buf),
            Sink::Gzip(w) => w.write_all(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            Sink::Plain(w) => w.flush(),
            Sink::Gzip(w) => w.flush(),
        }
    }
}

impl Sink {
    /// Writes everything buffered and, gzipped, the trailer. No fsync: the file is complete
    /// for any reader once written, and syncing a large file could hold up a stop for seconds.
    fn finish(self) -> io::Result<()> {
        match self {
            Sink::Plain(w) => w.into_inner().map_err(io::IntoInnerError::into_error).map(drop),
            Sink::Gzip(w) => (*w).into_inner().map_err(io::IntoInnerError::into_error)?.finish().map(drop),
        }
    }
}

/// Segments received and waiting for the writer, back to back in `bytes`.
#[derive(Default)]
struct Chunk {
    bytes: Vec<u8>,
    entries: Vec<Entry>,
}

impl Chunk {
    /// A chunk that holds [`CHUNK_BYTES`] of segments without growing.
    fn new() -> Chunk {
        // A DEEP segment averages about 130 bytes.
        Chunk { bytes: Vec::with_capacity(CHUNK_BYTES + 2048), entries: Vec::with_capacity(CHUNK_BYTES / 64) }
    }
}

/// One segment of a chunk.
struct Entry {
    /// Receive time, ns since the epoch.
    time: i64,
    /// Who sent it.
    source: SocketAddrV4,
    /// Where it ends in the chunk's bytes (it starts where the previous one ends).
    end: usize,
    /// Its messages.
    messages: u64,
}

/// What the writer thread wrote.
#[derive(Clone, Copy, Debug, Default)]
struct Written {
    segments: u64,
    messages: u64,
}

/// The recording's part of the final report.
#[derive(Clone, Debug, Serialize)]
pub struct RecordReport {
    /// The capture file.
    pub file: String,
    /// `pcap` or `pcapng`.
    pub container: &'static str,
    /// Whether the file is gzipped.
    pub gzip: bool,
    /// Segments (frames) written to the file (after an error: handed to it before the error).
    pub segments: u64,
    /// Messages in them.
    pub messages: u64,
    /// Segments not written because the writer was a whole queue behind.
    pub dropped_segments: u64,
    /// Frames taken that gave no segment a capture can hold (larger than a UDP datagram).
    pub unrecordable_segments: u64,
    /// Why the recording stopped before the run did (a write error), naming the file.
    pub error: Option<String>,
}

/// Records the frames the pipeline takes. Decoding feeds it ([`Recorder::begin`],
/// [`Recorder::message`], [`Recorder::frame`]) so a frame is decoded once for both.
pub struct Recorder {
    path: PathBuf,
    container: Container,
    gzip: bool,
    resegmenter: Resegmenter,
    chunk: Chunk,
    /// `None` once the writer has stopped (a write error) or the recording is finished.
    queue: Option<SyncSender<Chunk>>,
    /// Chunks the writer is done with.
    spare: Receiver<Chunk>,
    writer: Option<JoinHandle<Result<Written, (Written, String)>>>,
    dropped: u64,
    unrecordable: u64,
}

impl Recorder {
    /// Creates `path` and writes the capture's header, so that a path that cannot be written
    /// fails before anything is received; then starts the writer thread. The error names the
    /// file.
    pub fn create(path: &Path, transport: &Transport) -> anyhow::Result<Recorder> {
        let (container, gzip) = container_for(path);
        let file = File::create(path).map_err(|e| anyhow::anyhow!("cannot create {}: {e}", path.display()))?;
        let sink = if gzip {
            // The fast level: it keeps up with a feed on one core; IEX's own files are gzipped so.
            Sink::Gzip(Box::new(BufWriter::with_capacity(CHUNK_BYTES, GzEncoder::new(file, Compression::fast()))))
        } else {
            Sink::Plain(BufWriter::with_capacity(1 << 20, file))
        };
        let options = WriterOptions { container, ..WriterOptions::default() };
        let writer =
            CaptureWriter::new(sink, options).map_err(|e| anyhow::anyhow!("cannot write {}: {e}", path.display()))?;
        let (queue, chunks) = mpsc::sync_channel::<Chunk>(QUEUE_CHUNKS);
        let (give_back, spare) = mpsc::channel::<Chunk>();
        let destination = destination(transport);
        let name = path.display().to_string();
        let thread = std::thread::Builder::new()
            .name("record".into())
            .spawn(move || write_chunks(writer, chunks, give_back, destination, &name))
            .map_err(|e| anyhow::anyhow!("cannot start the thread writing {}: {e}", path.display()))?;
        tracing::info!(file = %path.display(), container = container_name(container), gzip, "recording");
        Ok(Recorder {
            path: path.to_path_buf(),
            container,
            gzip,
            resegmenter: Resegmenter::new(),
            chunk: Chunk::new(),
            queue: Some(queue),
            spare,
            writer: Some(thread),
            dropped: 0,
            unrecordable: 0,
        })
    }

    /// A frame of `format` is about to be decoded.
    #[inline]
    pub fn begin(&mut self, format: Format) {
        self.resegmenter.begin(format);
    }

    /// The decoder visits the frame's next message.
    #[inline]
    pub fn message(&mut self, message: &Message<'_>) {
        self.resegmenter.message(message);
    }

    /// The frame begun last decoded to `header`: its segment is queued, stamped `receive_time`
    /// (ns since the epoch) and sent by `peer`.
    pub fn frame(&mut self, frame: &[u8], header: &BatchHeader, receive_time: i64, peer: SocketAddr) {
        if self.queue.is_none() {
            return;
        }
        let segment = match self.resegmenter.finish(frame, header) {
            Ok(segment) => segment,
            Err(error) => {
                self.unrecordable += 1;
                if mdrelay_proto::warn::allow("record") {
                    tracing::warn!(file = %self.path.display(), sequence = header.first_sequence, %error,
                        "frame not recorded");
                }
                return;
            }
        };
        self.chunk.bytes.extend_from_slice(segment);
        self.chunk.entries.push(Entry {
            time: receive_time,
            source: source(peer),
            end: self.chunk.bytes.len(),
            messages: u64::from(header.message_count),
        });
        if self.chunk.bytes.len() >= CHUNK_BYTES {
            self.hand_over();
        }
    }

    /// Hands the segments queued so far to the writer (also at each report tick, so a quiet
    /// stream still reaches the file). When the writer is a whole queue behind, they are
    /// dropped and counted rather than waited for: waiting would hold up the receive loop,
    /// which over UDP loses frames for the whole report (not only the recording) and over TCP
    /// holds back the publisher; the report says how many segments the file lacks.
    pub fn hand_over(&mut self) {
        let Some(queue) = &self.queue else { return };
        if self.chunk.entries.is_empty() {
            return;
        }
        match queue.try_send(std::mem::take(&mut self.chunk)) {
            Ok(()) => self.chunk = self.spare.try_recv().unwrap_or_else(|_| Chunk::new()),
            Err(TrySendError::Full(mut chunk)) => {
                self.dropped += chunk.entries.len() as u64;
                if mdrelay_proto::warn::allow("record queue") {
                    tracing::warn!(file = %self.path.display(), segments = chunk.entries.len(),
                        "the recording's writer is behind by a whole queue; segments not recorded");
                }
                chunk.bytes.clear();
                chunk.entries.clear();
                self.chunk = chunk;
            }
            // The writer stopped on an error, which it logged and `finish` reports.
            Err(TrySendError::Disconnected(_)) => self.queue = None,
        }
    }

    /// Writes what is still queued, ends the file (gzip trailer included) and reports.
    pub fn finish(mut self) -> RecordReport {
        if let Some(queue) = self.queue.take()
            && !self.chunk.entries.is_empty()
        {
            // At the end nothing is left to hold up: the last chunk is waited for, not dropped.
            let _ = queue.send(std::mem::take(&mut self.chunk));
        }
        let (written, error) = match self.writer.take().map(JoinHandle::join) {
            Some(Ok(Ok(written))) => (written, None),
            Some(Ok(Err((written, error)))) => (written, Some(error)),
            Some(Err(_)) | None => {
                (Written::default(), Some(format!("the thread writing {} failed", self.path.display())))
            }
        };
        RecordReport {
            file: self.path.display().to_string(),
            container: container_name(self.container),
            gzip: self.gzip,
            segments: written.segments,
            messages: written.messages,
            dropped_segments: self.dropped,
            unrecordable_segments: self.unrecordable,
            error,
        }
    }
}

fn container_name(container: Container) -> &'static str {
    match container {
        Container::Pcap => "pcap",
        Container::PcapNg => "pcapng",
    }
}

/// The recorded datagrams' source: the publisher's address.
fn source(peer: SocketAddr) -> SocketAddrV4 {
    match peer {
        SocketAddr::V4(a) => a,
        SocketAddr::V6(a) => SocketAddrV4::new(a.ip().to_ipv4_mapped().unwrap_or(IPV6_SOURCE), a.port()),
    }
}

/// The recorded datagrams' destination: the multicast group joined, else [`RECORD_GROUP`], on
/// the transport's port when it has one.
fn destination(transport: &Transport) -> SocketAddrV4 {
    let (ip, port) = match transport {
        Transport::Multicast { group: SocketAddr::V4(group), .. } => (*group.ip(), group.port()),
        Transport::Udp(addr) => (RECORD_GROUP, addr.port()),
        _ => (RECORD_GROUP, 0),
    };
    SocketAddrV4::new(ip, if port == 0 { RECORD_PORT } else { port })
}

/// The writer thread: chunks to the file until the queue closes, then the end of the file. On
/// a write error it logs, stops and returns what it wrote with the error naming the file (its
/// end of the queue closes, which tells the receive loop to stop queueing).
fn write_chunks(
    mut writer: CaptureWriter<Sink>,
    chunks: Receiver<Chunk>,
    give_back: mpsc::Sender<Chunk>,
    destination: SocketAddrV4,
    name: &str,
) -> Result<Written, (Written, String)> {
    let mut written = Written::default();
    let failed = |written: Written, error: io::Error| {
        let error = format!("cannot write {name}: {error}");
        tracing::error!("{error}; the recording stops here, the run goes on");
        Err((written, error))
    };
    for mut chunk in chunks {
        let mut start = 0;
        for entry in &chunk.entries {
            let segment = &chunk.bytes[start..entry.end];
            start = entry.end;
            if let Err(error) = writer.write_udp(entry.time, entry.source, destination, segment) {
                return failed(written, error);
            }
            written.segments += 1;
            written.messages += entry.messages;
        }
        chunk.bytes.clear();
        chunk.entries.clear();
        // The receive loop may be gone already at the end of the run.
        let _ = give_back.send(chunk);
    }
    match writer.finish().and_then(Sink::finish) {
        Ok(()) => Ok(written),
        Err(error) => failed(written, error),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_name_chooses_the_container_and_gzip() {
        let kind = |name: &str| container_for(Path::new(name));
        assert_eq!(kind("day.pcap"), (Container::Pcap, false));
        assert_eq!(kind("/tmp/day.pcap.gz"), (Container::Pcap, true));
        assert_eq!(kind("day.pcapng"), (Container::PcapNg, false));
        assert_eq!(kind("DAY.PCAPNG.GZ"), (Container::PcapNg, true));
        // Anything else is a classic pcap, the container every tool reads.
        assert_eq!(kind("day.cap"), (Container::Pcap, false));
        assert_eq!(kind("pcapng.d/day"), (Container::Pcap, false));
    }

    #[test]
    fn datagrams_go_to_the_group_joined_or_the_default_group() {
        let group = Transport::Multicast { group: "239.1.2.3:9300".parse().unwrap(), interface: Ipv4Addr::LOCALHOST };
        assert_eq!(destination(&group), "239.1.2.3:9300".parse().unwrap());
        let udp = Transport::Udp("127.0.0.1:0".parse().unwrap());
        assert_eq!(destination(&udp), SocketAddrV4::new(RECORD_GROUP, RECORD_PORT));
        assert_eq!(destination(&Transport::Tcp("h:1".into())), SocketAddrV4::new(RECORD_GROUP, RECORD_PORT));
        assert_eq!(source("[::1]:5".parse().unwrap()), SocketAddrV4::new(IPV6_SOURCE, 5));
        assert_eq!(source("[::ffff:10.0.0.1]:5".parse().unwrap()), "10.0.0.1:5".parse().unwrap());
    }
}
