//! `--record FILE`: what the subscriber takes, written to a capture file as IEX-TP over UDP, in
//! arrival order, whatever the wire format, so that `mdrelay-pub inspect`, the reference reader,
//! `mdrelay-pub run --capture` or tcpreplay can read it.
//!
//! The frames written are the frames the subscriber takes and decodes: a duplicate, the other
//! A/B line's copy or a frame that does not decode is not written, so the recording inspects to
//! the aggregates of the run's report. Each is written as the IEX-TP segment it carried
//! (`mdrelay_codec::resegment`), stamped with its receive time, in an Ethernet / IPv4 / UDP
//! frame from the publisher's address to the multicast group the subscriber joined (or
//! [`RECORD_GROUP`]).
//!
//! The receive loop only copies each segment into a chunk; a writer thread does the framing,
//! the gzip, the file I/O and the rotation (a new numbered file by size or by time, the oldest
//! removed beyond a cap). Chunks go to it through a bounded queue and come back to be reused,
//! so recording allocates nothing per frame once warm.
//!
//! A chunk reaches its file in one write: its records as they are, or gzipped as one gzip
//! member of its own (a gzipped file is a series of members, which every gzip reader reads as
//! one stream). A write that fails (a full disk) cuts the file back to where it was before it,
//! so every file ends with a whole record and a whole member, and the counts (segments,
//! messages, bytes) are of what the files hold, as a reader of them finds it.
//!
//! A recording is written only to a regular file it creates: it is never opened through a
//! symbolic link, nor is a FIFO, a device or a socket opened (a FIFO without a reader would
//! hold up the start in `open()`); an existing file is replaced only when asked
//! (`record_overwrite`): the recording's path may be in a directory others can write to.

use crate::config::RecordSettings;
use flate2::Compression;
use flate2::write::GzEncoder;
use mdrelay_client::Settings;
use mdrelay_codec::resegment::Resegmenter;
use mdrelay_codec::{BatchHeader, Format};
use mdrelay_iex::capture_writer::{CaptureWriter, Container, WriterOptions};
use mdrelay_iex::message::Message;
use mdrelay_telemetry::config_file::kind_name;
use serde::Serialize;
use std::cell::RefCell;
use std::collections::VecDeque;
use std::ffi::{OsStr, OsString};
use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering, Ordering::Relaxed};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

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
/// Digits of a rotated file's sequence number (more once a recording has a million files).
const NUMBER_DIGITS: usize = 6;

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

/// A file name split where a rotated file's sequence number goes: before the extension, which
/// is the last one and a `.gz` after it (`day.pcap.gz`: `day` and `.pcap.gz`; `day`: no
/// extension). Bytes, so a name that is not UTF-8 keeps its bytes.
fn split_name(name: &OsStr) -> (&[u8], &[u8]) {
    let bytes = name.as_bytes();
    let gz = bytes.len() > 3 && bytes[bytes.len() - 3..].eq_ignore_ascii_case(b".gz");
    let rest = if gz { &bytes[..bytes.len() - 3] } else { bytes };
    // A dot that starts the name (`.hidden`) begins no extension.
    let cut = match rest.iter().rposition(|&b| b == b'.') {
        Some(dot) if dot > 0 => dot,
        _ => rest.len(),
    };
    bytes.split_at(cut)
}

/// The name of a rotated recording's file `number`: `day.pcap.gz` gives `day.000001.pcap.gz`.
pub fn numbered(path: &Path, number: u64) -> PathBuf {
    let name = path.file_name().unwrap_or_default();
    let (stem, extension) = split_name(name);
    let mut numbered = stem.to_vec();
    numbered.extend_from_slice(format!(".{number:0NUMBER_DIGITS$}").as_bytes());
    numbered.extend_from_slice(extension);
    path.with_file_name(OsString::from_vec(numbered))
}

/// Whether `name` is one of the numbered files of a rotated recording at `path` (any number).
fn is_numbered(path: &Path, name: &OsStr) -> bool {
    let (stem, extension) = split_name(path.file_name().unwrap_or_default());
    let name = name.as_bytes();
    let Some(middle) =
        name.strip_prefix(stem).and_then(|rest| rest.strip_prefix(b".")).and_then(|rest| rest.strip_suffix(extension))
    else {
        return false;
    };
    middle.len() >= NUMBER_DIGITS && middle.iter().all(u8::is_ascii_digit)
}

/// Creates `path` for a recording: a new regular file, never opened through a symbolic link,
/// nor written over an existing regular file unless `overwrite`, when it is removed and a new
/// file created. Anything else there (a FIFO, a device, a socket, a directory) is refused
/// without being opened: opening a FIFO to write waits for its reader. The error says why,
/// naming nothing: the caller names the file.
fn open_recording(path: &Path, overwrite: bool) -> Result<File, String> {
    let create = || {
        // O_CREAT | O_EXCL never follows a symbolic link, nor opens anything already there;
        // O_NOFOLLOW says so twice.
        OpenOptions::new()
            .write(true)
            .create_new(true)
            .custom_flags(nix::fcntl::OFlag::O_NOFOLLOW.bits())
            .open(path)
            .map_err(|e| e.to_string())
    };
    let metadata = match std::fs::symlink_metadata(path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => return create(),
        Err(e) => return Err(e.to_string()),
        Ok(metadata) => metadata,
    };
    let kind = metadata.file_type();
    if kind.is_symlink() {
        return Err("it is a symbolic link; a recording is never written through one (that would replace the \
                    file it points to): give the path of a file"
            .into());
    }
    if !kind.is_file() {
        return Err(format!(
            "it is {}, not a regular file; a recording is written only to a file it creates (a FIFO would \
             hold up the start until a reader came, and could not be rotated or cut back on a full disk)",
            kind_name(kind)
        ));
    }
    if !overwrite {
        return Err("the file exists; --record-overwrite (record_overwrite = true) replaces it".into());
    }
    // Removed, not truncated: should a symbolic link or a FIFO take its place meanwhile, that is
    // what goes, and the creation after it refuses whatever is there by then.
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(format!("cannot remove the file there: {e}")),
    }
    create()
}

/// When the writer starts a new file: the rotation settings applied to what the current file
/// holds. No I/O and no clock of its own, so the rules are tested on numbers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Rotation {
    /// A file is full once it holds this many bytes.
    size: Option<u64>,
    /// A file spans at most this long of receive time, in ns.
    interval: Option<i64>,
}

/// What a file holds so far, as rotation sees it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Span {
    /// Bytes in the file, and those staged for it when they go as they are (gzipped, staged
    /// bytes count once compressed, at their commit).
    bytes: u64,
    /// Receive time of its first segment (ns since the epoch); `None` while it has none.
    first: Option<i64>,
}

impl Rotation {
    fn new(settings: &RecordSettings) -> Rotation {
        Rotation {
            size: settings.rotate_size,
            interval: settings.rotate_interval.map(|d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX)),
        }
    }

    /// A segment received at `time` goes to a new file: the current one spans the interval
    /// already.
    fn starts_new_file(&self, span: Span, time: i64) -> bool {
        matches!((self.interval, span.first), (Some(interval), Some(first)) if time.saturating_sub(first) >= interval)
    }

    /// The file is full (checked after each segment).
    fn is_full(&self, span: Span) -> bool {
        self.size.is_some_and(|size| span.bytes >= size)
    }

    /// When a file that gets no more segments is closed all the same (ns since the epoch), so a
    /// file is complete on disk soon after its interval even when the stream goes quiet.
    fn closes_at(&self, span: Span) -> Option<i64> {
        Some(span.first?.saturating_add(self.interval?))
    }
}

/// The bytes of the file being written that are not in it yet: the capture writer appends its
/// records here, and a commit writes them to the file at once ([`Output::commit`]).
#[derive(Clone, Default)]
struct Staged(Rc<RefCell<Vec<u8>>>);

impl Staged {
    fn len(&self) -> usize {
        self.0.borrow().len()
    }
}

impl Write for Staged {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.borrow_mut().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
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

/// What the recording has done so far: written by the writer thread (and the dropped segments
/// by the receive loop), read by the metrics export and the final report. Segments, messages
/// and bytes are counted once they are in a file (a chunk's at its commit), never before.
#[derive(Debug, Default)]
pub struct RecordProgress {
    segments: AtomicU64,
    messages: AtomicU64,
    bytes: AtomicU64,
    files_written: AtomicU64,
    files_rotated: AtomicU64,
    files_removed: AtomicU64,
    dropped: AtomicU64,
    /// The writer stopped on an error: what it counted is final, and nothing more is written.
    stopped: AtomicBool,
}

/// The recording's counts at one moment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RecordCounts {
    /// Segments (frames) in the files.
    pub segments: u64,
    /// Messages in them.
    pub messages: u64,
    /// Bytes in the files (compressed ones when gzipped), those removed by the cap included.
    pub bytes: u64,
    /// Files created.
    pub files_written: u64,
    /// Files closed by rotation (full, or their time up): each but the last, and the last too
    /// when it was full or its time was up before the stream ended.
    pub files_rotated: u64,
    /// The oldest files removed to keep at most `record_max_files`.
    pub files_removed: u64,
    /// Segments not written because the writer was a whole queue behind.
    pub dropped_segments: u64,
    /// Segments not in the files because the recording stopped on an error (a full disk): those
    /// cut back from the last file, those still queued, and every one taken after; 0 while the
    /// recording goes on.
    pub unwritten_segments: u64,
}

impl RecordProgress {
    /// The writer's counts now (no segment counts as unwritten here: see [`Recorder::counts`]).
    pub fn counts(&self) -> RecordCounts {
        RecordCounts {
            segments: self.segments.load(Relaxed),
            messages: self.messages.load(Relaxed),
            bytes: self.bytes.load(Relaxed),
            files_written: self.files_written.load(Relaxed),
            files_rotated: self.files_rotated.load(Relaxed),
            files_removed: self.files_removed.load(Relaxed),
            dropped_segments: self.dropped.load(Relaxed),
            unwritten_segments: 0,
        }
    }

    /// Whether the writer stopped on an error. Acquire, and read before the counts: once the
    /// writer is seen stopped, the counts read after are its last.
    fn stopped(&self) -> bool {
        self.stopped.load(Ordering::Acquire)
    }
}

/// The recording's part of the final report.
#[derive(Clone, Debug, Serialize)]
pub struct RecordReport {
    /// The capture file as configured; with rotation, the name of the numbered files.
    pub file: String,
    /// `pcap` or `pcapng`.
    pub container: &'static str,
    /// Whether the file is gzipped.
    pub gzip: bool,
    /// Segments (frames) in the files, as a reader of them finds them: after a write error,
    /// those in the files as they were cut back to their last whole record.
    pub segments: u64,
    /// Messages in them.
    pub messages: u64,
    /// Bytes in the files (compressed ones when gzipped), those removed by the cap included.
    pub bytes: u64,
    /// Segments not written because the writer was a whole queue behind.
    pub dropped_segments: u64,
    /// Frames taken that gave no segment a capture can hold (larger than a UDP datagram).
    pub unrecordable_segments: u64,
    /// Segments not in the files because the recording stopped on an error: frames taken are
    /// `segments` + `dropped_segments` + `unrecordable_segments` + this.
    pub unwritten_segments: u64,
    /// Whether the recording rotates (numbered files, by size or by time).
    pub rotates: bool,
    /// Files created: 1 without rotation.
    pub files_written: u64,
    /// Files closed by rotation (full, or their time up): each but the last, and the last too
    /// when it was full or its time was up before the stream ended.
    pub files_rotated: u64,
    /// The oldest files removed to keep at most `record_max_files`.
    pub files_removed: u64,
    /// The last file written to (with rotation, the highest number).
    pub last_file: Option<String>,
    /// Why the recording stopped before the run did (a write error), naming the file.
    pub error: Option<String>,
}

impl RecordReport {
    /// Why the recording stopped early, for the text report: the segments that are not in the
    /// files because of it, and the error; empty when it did not stop.
    pub fn stopped_text(&self) -> String {
        match &self.error {
            None => String::new(),
            Some(error) => format!("   unwritten {}   STOPPED: {error}", self.unwritten_segments),
        }
    }

    /// The rotation's figures for the text report: empty without rotation.
    pub fn files_text(&self) -> String {
        if !self.rotates {
            return String::new();
        }
        format!(
            "   files {} (rotated {}, removed {}; last {})",
            self.files_written,
            self.files_rotated,
            self.files_removed,
            self.last_file.as_deref().unwrap_or("-")
        )
    }
}

/// The recording's files: their names, their creation (never through a symbolic link) and,
/// beyond the cap, the removal of the oldest.
struct Files {
    /// The path as configured.
    path: PathBuf,
    rotates: bool,
    overwrite: bool,
    max_files: Option<usize>,
    /// The files this recording wrote and still keeps, oldest first.
    kept: VecDeque<PathBuf>,
    /// The next file's sequence number.
    next: u64,
}

impl Files {
    fn new(settings: &RecordSettings) -> Files {
        Files {
            path: settings.path.clone(),
            rotates: settings.rotates(),
            overwrite: settings.overwrite,
            max_files: settings.max_files.map(|n| n as usize),
            kept: VecDeque::new(),
            next: 1,
        }
    }

    /// Before the first file: a rotated recording's numbered files already in the directory
    /// (an earlier recording at the same path) are refused, or with `overwrite` removed, so the
    /// files there are this recording's and the cap counts them all. The error names a file.
    fn clear_earlier(&self) -> Result<(), String> {
        if !self.rotates {
            return Ok(());
        }
        let dir = match self.path.parent() {
            Some(dir) if !dir.as_os_str().is_empty() => dir,
            _ => Path::new("."),
        };
        let first = numbered(&self.path, 1);
        let entries = match std::fs::read_dir(dir) {
            Ok(entries) => entries,
            // A missing directory: the creation says so, naming the file.
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(format!("cannot create {}: cannot list {}: {e}", first.display(), dir.display())),
        };
        let mut earlier: Vec<PathBuf> = entries
            .filter_map(Result::ok)
            .filter(|entry| is_numbered(&self.path, &entry.file_name()))
            .map(|entry| dir.join(entry.file_name()))
            .collect();
        earlier.sort();
        let Some(oldest) = earlier.first() else { return Ok(()) };
        if !self.overwrite {
            return Err(format!(
                "cannot create {}: {} of an earlier recording at {} exist ({}{}); --record-overwrite \
                 (record_overwrite = true) removes them",
                first.display(),
                earlier.len(),
                self.path.display(),
                oldest.display(),
                if earlier.len() > 1 { ", ..." } else { "" }
            ));
        }
        for file in &earlier {
            if let Ok(kind) = std::fs::symlink_metadata(file).map(|m| m.file_type())
                && !kind.is_file()
            {
                return Err(format!(
                    "cannot remove {} (an earlier recording's file): it is {}, not a regular file; remove it \
                     yourself",
                    file.display(),
                    kind_name(kind)
                ));
            }
            match std::fs::remove_file(file) {
                Ok(()) => tracing::info!(file = %file.display(), "removed a file of an earlier recording"),
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(format!("cannot remove {} (an earlier recording's file): {e}", file.display())),
            }
        }
        Ok(())
    }

    /// Creates the next file, first removing the oldest one kept if that makes one more than
    /// `max_files`. The error names the file.
    fn open_next(&mut self, progress: &RecordProgress) -> Result<(File, PathBuf), String> {
        if let Some(max) = self.max_files {
            while self.kept.len() >= max {
                let Some(oldest) = self.kept.pop_front() else { break };
                match std::fs::remove_file(&oldest) {
                    Ok(()) => {
                        progress.files_removed.fetch_add(1, Relaxed);
                        tracing::info!(file = %oldest.display(), max_files = max, "removed the oldest recording file");
                    }
                    // Removed by someone else already.
                    Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                    Err(e) => {
                        return Err(format!(
                            "cannot remove {} (record_max_files is {max}): {e}; the recording stops here",
                            oldest.display()
                        ));
                    }
                }
            }
        }
        let path = if self.rotates { numbered(&self.path, self.next) } else { self.path.clone() };
        // The first file may replace an existing one when asked; a later one is always new
        // (the earlier recording's were cleared at start), so anything there is refused.
        let overwrite = self.overwrite && !self.rotates;
        let file =
            open_recording(&path, overwrite).map_err(|why| format!("cannot create {}: {why}", path.display()))?;
        self.next += 1;
        self.kept.push_back(path.clone());
        progress.files_written.fetch_add(1, Relaxed);
        Ok((file, path))
    }
}

/// Records the frames the pipeline takes. Decoding feeds it ([`Recorder::begin`],
/// [`Recorder::message`], [`Recorder::frame`]) so a frame is decoded once for both.
pub struct Recorder {
    path: PathBuf,
    container: Container,
    gzip: bool,
    rotates: bool,
    resegmenter: Resegmenter,
    chunk: Chunk,
    /// `None` once the writer has stopped (a write error) or the recording is finished.
    queue: Option<SyncSender<Chunk>>,
    /// Chunks the writer is done with.
    spare: Receiver<Chunk>,
    writer: Option<JoinHandle<WriterEnd>>,
    /// What the writer reported when it ended.
    end: Option<WriterEnd>,
    progress: Arc<RecordProgress>,
    /// Frames given to the recording, whatever became of them.
    taken: u64,
    dropped: u64,
    unrecordable: u64,
}

impl Recorder {
    /// Creates the first file (never through a symbolic link; an existing one only replaced
    /// with `overwrite`), so that a path that cannot be written fails before anything is
    /// received; then starts the writer thread. The error names the file.
    pub fn create(settings: &RecordSettings, receive: &Settings) -> anyhow::Result<Recorder> {
        let path = &settings.path;
        let (container, gzip) = container_for(path);
        let progress = Arc::new(RecordProgress::default());
        let mut files = Files::new(settings);
        files.clear_earlier().map_err(anyhow::Error::msg)?;
        let (file, first) = files.open_next(&progress).map_err(anyhow::Error::msg)?;
        let (queue, chunks) = mpsc::sync_channel::<Chunk>(QUEUE_CHUNKS);
        let (give_back, spare) = mpsc::channel::<Chunk>();
        let (rotation, destination, shared) = (Rotation::new(settings), destination(receive), Arc::clone(&progress));
        let thread = std::thread::Builder::new()
            .name("record".into())
            .spawn(move || {
                // Built on its thread: the file being written stages its bytes in an `Rc`.
                let writer = Writer {
                    files,
                    rotation,
                    container,
                    gzip,
                    destination,
                    progress: shared,
                    output: None,
                    member: Vec::new(),
                    closed_bytes: 0,
                    last_file: None,
                };
                writer.run(file, first, chunks, give_back)
            })
            .map_err(|e| anyhow::anyhow!("cannot start the thread writing {}: {e}", path.display()))?;
        tracing::info!(file = %path.display(), container = container_name(container), gzip,
            rotate_size = ?settings.rotate_size, rotate_interval = ?settings.rotate_interval,
            max_files = ?settings.max_files, "recording");
        Ok(Recorder {
            path: path.clone(),
            container,
            gzip,
            rotates: settings.rotates(),
            resegmenter: Resegmenter::new(),
            chunk: Chunk::new(),
            queue: Some(queue),
            spare,
            writer: Some(thread),
            end: None,
            progress,
            taken: 0,
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
        self.taken += 1;
        if self.queue.is_none() {
            return;
        }
        let segment = match self.resegmenter.finish(frame, header) {
            Ok(segment) => segment,
            Err(error) => {
                self.unrecordable += 1;
                if mdrelay_iex::warn::allow("record") {
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
                self.progress.dropped.store(self.dropped, Relaxed);
                if mdrelay_iex::warn::allow("record queue") {
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

    /// The recording's counts now (the metrics export reads them).
    pub fn counts(&self) -> RecordCounts {
        // Once the writer has ended (a write error, or `finish`), its counts are final, and every
        // segment taken that is not in the files, dropped or unrecordable never will be: still
        // queued, cut back from the last file, or taken since.
        let ended = self.end.is_some() || self.progress.stopped();
        let mut counts = self.progress.counts();
        if ended {
            let accounted = counts.segments + self.dropped + self.unrecordable;
            counts.unwritten_segments = self.taken.saturating_sub(accounted);
        }
        counts
    }

    /// Writes what is still queued, ends the file (its last chunk committed) and reports. Once
    /// finished, the recorder takes nothing more, and a second call reports the same.
    pub fn finish(&mut self) -> RecordReport {
        if let Some(queue) = self.queue.take()
            && !self.chunk.entries.is_empty()
        {
            // At the end nothing is left to hold up: the last chunk is waited for, not dropped.
            let _ = queue.send(std::mem::take(&mut self.chunk));
        }
        if let Some(thread) = self.writer.take() {
            let end = thread.join().unwrap_or_else(|_| WriterEnd {
                last_file: None,
                error: Some(format!("the thread writing {} failed", self.path.display())),
            });
            self.end = Some(end);
        }
        let counts = self.counts();
        let end = self.end.as_ref();
        RecordReport {
            file: self.path.display().to_string(),
            container: container_name(self.container),
            gzip: self.gzip,
            segments: counts.segments,
            messages: counts.messages,
            bytes: counts.bytes,
            dropped_segments: self.dropped,
            unrecordable_segments: self.unrecordable,
            unwritten_segments: counts.unwritten_segments,
            rotates: self.rotates,
            files_written: counts.files_written,
            files_rotated: counts.files_rotated,
            files_removed: counts.files_removed,
            last_file: end.and_then(|e| e.last_file.as_ref()).map(|p| p.display().to_string()),
            error: end.and_then(|e| e.error.clone()),
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
fn destination(receive: &Settings) -> SocketAddrV4 {
    // Checked addresses: a group is IPv4, a UDP address has a port.
    let group = receive.multicast.as_deref().and_then(|g| g.parse::<SocketAddrV4>().ok());
    let udp_port = receive.udp.as_deref().and_then(|a| a.parse::<SocketAddr>().ok()).map(|a| a.port());
    let (ip, port) = match (group, udp_port) {
        (Some(group), _) => (*group.ip(), group.port()),
        (None, Some(port)) => (RECORD_GROUP, port),
        (None, None) => (RECORD_GROUP, 0),
    };
    SocketAddrV4::new(ip, if port == 0 { RECORD_PORT } else { port })
}

/// The time now as receive times are stamped: ns since the epoch.
fn now_ns() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
}

/// How the writer thread ended: the last file it wrote, and the error that stopped it.
struct WriterEnd {
    last_file: Option<PathBuf>,
    error: Option<String>,
}

/// The file being written.
struct Output {
    /// Writes the capture's records into `staged`.
    writer: CaptureWriter<Staged>,
    staged: Staged,
    file: File,
    path: PathBuf,
    gzip: bool,
    /// The file's length: every byte in it committed, so it ends with a whole record (gzipped,
    /// a whole member).
    committed: u64,
    /// Segments staged and not yet in the file.
    staged_segments: u64,
    /// Messages in them.
    staged_messages: u64,
    /// Receive time of its first segment.
    first: Option<i64>,
}

impl Output {
    fn span(&self) -> Span {
        // Plain, the staged bytes go to the file as they are; gzipped, what they take is known
        // once they are compressed, at their commit.
        let staged = if self.gzip { 0 } else { self.staged.len() as u64 };
        Span { bytes: self.committed + staged, first: self.first }
    }

    /// Writes the staged bytes to the file in one write: as they are, or gzipped as one member
    /// (compressed into `member`, a buffer kept for the next). When the write fails (a full
    /// disk), the file is cut back to its length before it, so it still ends with a whole
    /// record and a whole member, and reads to its end; the staged bytes are lost.
    fn commit(&mut self, member: &mut Vec<u8>) -> io::Result<()> {
        let mut staged = self.staged.0.borrow_mut();
        if staged.is_empty() {
            return Ok(());
        }
        let bytes: &[u8] = if self.gzip {
            // The fast level: it keeps up with a feed on one core; IEX's own files are gzipped
            // so. A member per chunk costs about 1 % of the compressed size (DEEP10).
            let mut encoder = GzEncoder::new(std::mem::take(member), Compression::fast());
            encoder.write_all(&staged)?;
            *member = encoder.finish()?;
            member
        } else {
            &staged
        };
        if let Err(error) = (&self.file).write_all(bytes) {
            // A write may have put part of the bytes in the file before it failed.
            return Err(match self.file.set_len(self.committed) {
                Ok(()) => error,
                Err(cut) => io::Error::new(
                    error.kind(),
                    format!("{error}; cutting the file back to its last whole record failed too: {cut}"),
                ),
            });
        }
        self.committed += bytes.len() as u64;
        staged.clear();
        member.clear();
        Ok(())
    }
}

/// The writer thread's state: the files, the one being written, and what rotation asks of it.
struct Writer {
    files: Files,
    rotation: Rotation,
    container: Container,
    gzip: bool,
    destination: SocketAddrV4,
    progress: Arc<RecordProgress>,
    output: Option<Output>,
    /// A gzip member being built, kept between commits.
    member: Vec<u8>,
    /// Bytes of the files closed so far.
    closed_bytes: u64,
    last_file: Option<PathBuf>,
}

impl Writer {
    /// Chunks to files until the queue closes, then the end of the last file. On an error
    /// (writing, creating or removing a file) it logs, stops and says why, naming the file; its
    /// end of the queue closes, which tells the receive loop to stop queueing.
    fn run(mut self, first: File, path: PathBuf, chunks: Receiver<Chunk>, give_back: mpsc::Sender<Chunk>) -> WriterEnd {
        let result = self.start(first, path).and_then(|()| self.write_all(&chunks, &give_back));
        let error = result.err().map(|error| {
            // Release, after the last counts: whoever sees it stopped sees those counts.
            self.progress.stopped.store(true, Ordering::Release);
            tracing::error!("{error}; the recording stops here, the run goes on");
            error
        });
        WriterEnd { last_file: self.last_file, error }
    }

    /// Begins a file with its capture header, written at once: a disk without room for it
    /// fails here, before any segment is taken for the file.
    fn start(&mut self, file: File, path: PathBuf) -> Result<(), String> {
        let staged = Staged::default();
        let options = WriterOptions { container: self.container, ..WriterOptions::default() };
        let writer =
            CaptureWriter::new(staged.clone(), options).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        self.last_file = Some(path.clone());
        self.output = Some(Output {
            writer,
            staged,
            file,
            path,
            gzip: self.gzip,
            committed: 0,
            staged_segments: 0,
            staged_messages: 0,
            first: None,
        });
        self.commit()
    }

    fn write_all(&mut self, chunks: &Receiver<Chunk>, give_back: &mpsc::Sender<Chunk>) -> Result<(), String> {
        loop {
            // A file with a time span is closed when its time is up even if the stream is
            // quiet, so it is complete on disk then.
            let closes_at = self.output.as_ref().and_then(|o| self.rotation.closes_at(o.span()));
            let received = match closes_at {
                None => chunks.recv().map_err(|_| RecvTimeoutError::Disconnected),
                Some(at) => {
                    let wait = u64::try_from(at.saturating_sub(now_ns())).unwrap_or(0);
                    chunks.recv_timeout(Duration::from_nanos(wait))
                }
            };
            match received {
                Ok(mut chunk) => {
                    self.write_chunk(&chunk)?;
                    chunk.bytes.clear();
                    chunk.entries.clear();
                    // The receive loop may be gone already at the end of the run.
                    let _ = give_back.send(chunk);
                }
                Err(RecvTimeoutError::Timeout) => {
                    if closes_at.is_some_and(|at| now_ns() >= at) {
                        self.close(true)?;
                    }
                }
                Err(RecvTimeoutError::Disconnected) => return self.close(false),
            }
        }
    }

    /// A chunk's segments, then their commit: the chunk reaches its file (or the last of its
    /// files, when rotation splits it) in one write.
    fn write_chunk(&mut self, chunk: &Chunk) -> Result<(), String> {
        let mut start = 0;
        for entry in &chunk.entries {
            let segment = &chunk.bytes[start..entry.end];
            start = entry.end;
            self.write_segment(entry, segment)?;
        }
        self.commit()?;
        // Gzipped, a file's size is known at each commit: one full by now is closed here, and
        // the next chunk begins the next file.
        if self.output.as_ref().is_some_and(|o| self.rotation.is_full(o.span())) {
            self.close(true)?;
        }
        Ok(())
    }

    fn write_segment(&mut self, entry: &Entry, segment: &[u8]) -> Result<(), String> {
        if self.output.as_ref().is_some_and(|o| self.rotation.starts_new_file(o.span(), entry.time)) {
            self.close(true)?;
        }
        if self.output.is_none() {
            let (file, path) = self.files.open_next(&self.progress)?;
            tracing::info!(file = %path.display(), "recording to a new file");
            self.start(file, path)?;
        }
        let output = self.output.as_mut().expect("a file is open");
        output
            .writer
            .write_udp(entry.time, entry.source, self.destination, segment)
            .map_err(|e| format!("cannot write {}: {e}", output.path.display()))?;
        output.staged_segments += 1;
        output.staged_messages += entry.messages;
        output.first.get_or_insert(entry.time);
        if self.rotation.is_full(output.span()) {
            self.close(true)?;
        }
        Ok(())
    }

    /// Writes what is staged to the current file, and counts its segments, messages and bytes
    /// once they are in it. On an error nothing staged is counted (the file is cut back).
    fn commit(&mut self) -> Result<(), String> {
        let Some(output) = &mut self.output else { return Ok(()) };
        let committed = output.commit(&mut self.member);
        if committed.is_ok() {
            self.progress.segments.fetch_add(output.staged_segments, Relaxed);
            self.progress.messages.fetch_add(output.staged_messages, Relaxed);
            (output.staged_segments, output.staged_messages) = (0, 0);
        }
        self.progress.bytes.store(self.closed_bytes + output.committed, Relaxed);
        committed.map_err(|e| format!("cannot write {}: {e}", output.path.display()))
    }

    /// Ends the file being written, if any: what is staged goes to it; the next segment starts
    /// a new one. `rotated`: closed for rotation, not at the end.
    fn close(&mut self, rotated: bool) -> Result<(), String> {
        self.commit()?;
        let Some(output) = self.output.take() else { return Ok(()) };
        // Nothing is left to write: the capture writer keeps no bytes of its own (its records
        // went to the staged bytes, just committed), and a capture has no trailer. No fsync:
        // the file is complete for any reader once written, and syncing a large file could hold
        // up a stop for seconds.
        self.closed_bytes += output.committed;
        self.progress.bytes.store(self.closed_bytes, Relaxed);
        if rotated {
            self.progress.files_rotated.fetch_add(1, Relaxed);
        }
        tracing::info!(file = %output.path.display(), bytes = output.committed, "recording file finished");
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::os::unix::fs::FileTypeExt;

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
    fn a_rotated_file_has_its_number_before_the_extension() {
        let name = |path: &str, n: u64| numbered(Path::new(path), n).display().to_string();
        assert_eq!(name("day.pcap.gz", 1), "day.000001.pcap.gz");
        assert_eq!(name("/var/rec/day.pcapng", 42), "/var/rec/day.000042.pcapng");
        assert_eq!(name("DAY.PCAPNG.GZ", 7), "DAY.000007.PCAPNG.GZ");
        assert_eq!(name("a.b.pcap", 1), "a.b.000001.pcap");
        assert_eq!(name("day.gz", 1), "day.000001.gz");
        assert_eq!(name("day", 1), "day.000001");
        assert_eq!(name(".hidden", 1), ".hidden.000001");
        assert_eq!(name("dir.d/day", 1), "dir.d/day.000001");
        assert_eq!(name("day.pcap", 1_234_567), "day.1234567.pcap");
        // The name's bytes are kept whatever they are.
        let odd = Path::new(OsStr::from_bytes(b"d\xffy.pcap"));
        assert_eq!(numbered(odd, 3).as_os_str().as_bytes(), b"d\xffy.000003.pcap");
    }

    #[test]
    fn only_the_numbered_files_of_the_same_name_are_a_recording_s() {
        let ours = |base: &str, name: &str| is_numbered(Path::new(base), OsStr::new(name));
        assert!(ours("/r/day.pcap.gz", "day.000001.pcap.gz"));
        assert!(ours("day.pcap.gz", "day.1234567.pcap.gz"));
        assert!(ours("day", "day.000002"));
        assert!(!ours("day.pcap.gz", "day.pcap.gz"));
        assert!(!ours("day.pcap.gz", "day.00001.pcap.gz"));
        assert!(!ours("day.pcap.gz", "day.notes.pcap.gz"));
        assert!(!ours("day.pcap.gz", "day.000001.pcap"));
        assert!(!ours("day.pcap.gz", "days.000001.pcap.gz"));
        assert!(!ours("day.pcap", "day.000001.pcap.gz"));
        assert!(!ours("day.pcap", "day.00000x.pcap"));
    }

    #[test]
    fn rotation_starts_a_file_when_the_size_is_reached_or_the_interval_spent() {
        let none = Rotation::default();
        let full = Span { bytes: u64::MAX, first: Some(0) };
        assert!(!none.is_full(full) && !none.starts_new_file(full, i64::MAX) && none.closes_at(full).is_none());

        let size = Rotation { size: Some(1000), interval: None };
        assert!(!size.is_full(Span { bytes: 999, first: Some(5) }));
        assert!(size.is_full(Span { bytes: 1000, first: Some(5) }));
        assert!(!size.starts_new_file(Span { bytes: 10, first: Some(0) }, i64::MAX));
        assert_eq!(size.closes_at(Span { bytes: 10, first: Some(0) }), None);

        let second = 1_000_000_000;
        let time = Rotation { size: None, interval: Some(second) };
        let span = Span { bytes: 10, first: Some(5 * second) };
        assert!(!time.starts_new_file(span, 6 * second - 1));
        assert!(time.starts_new_file(span, 6 * second));
        // A file with no segment yet spans nothing: it is neither due nor closed on a timer.
        assert!(!time.starts_new_file(Span { bytes: 24, first: None }, i64::MAX));
        assert_eq!(time.closes_at(Span { bytes: 24, first: None }), None);
        assert_eq!(time.closes_at(span), Some(6 * second));
        // A clock stepped back is no reason to rotate, nor does a far future overflow.
        assert!(!time.starts_new_file(span, 0));
        assert_eq!(time.closes_at(Span { bytes: 0, first: Some(i64::MAX) }), Some(i64::MAX));

        let both = Rotation { size: Some(100), interval: Some(second) };
        assert!(both.is_full(Span { bytes: 100, first: Some(0) }));
        assert!(both.starts_new_file(Span { bytes: 1, first: Some(0) }, second));
    }

    #[test]
    fn a_recording_is_never_opened_through_a_link_nor_over_a_file_unless_asked() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("target");
        std::fs::write(&target, b"kept").unwrap();
        let link = dir.path().join("link.pcap");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        let dangling = dir.path().join("dangling.pcap");
        std::os::unix::fs::symlink(dir.path().join("nowhere"), &dangling).unwrap();
        for overwrite in [false, true] {
            assert!(open_recording(&link, overwrite).unwrap_err().contains("symbolic link"));
            assert!(open_recording(&dangling, overwrite).unwrap_err().contains("symbolic link"));
            assert!(open_recording(dir.path(), overwrite).unwrap_err().contains("directory"));
        }
        assert_eq!(std::fs::read(&target).unwrap(), b"kept");
        assert!(!dir.path().join("nowhere").exists());

        assert!(open_recording(&target, false).unwrap_err().contains("exists"));
        assert_eq!(std::fs::read(&target).unwrap(), b"kept");
        let mut replaced = open_recording(&target, true).unwrap();
        replaced.write_all(b"new").unwrap();
        assert_eq!(std::fs::read(&target).unwrap(), b"new");

        let new = dir.path().join("new.pcap");
        open_recording(&new, false).unwrap();
        assert!(new.is_file());
    }

    #[test]
    fn a_fifo_a_device_or_a_socket_is_refused_without_being_opened() {
        let dir = tempfile::tempdir().unwrap();
        // No reader: had it been opened to write, this test would wait for one for ever.
        let fifo = dir.path().join("live.pcap");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).unwrap();
        let socket = dir.path().join("sock.pcap");
        let _listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
        for overwrite in [false, true] {
            let e = open_recording(&fifo, overwrite).unwrap_err();
            assert!(e.starts_with("it is a FIFO, not a regular file"), "{e}");
            let e = open_recording(Path::new("/dev/null"), overwrite).unwrap_err();
            assert!(e.starts_with("it is a character device, not a regular file"), "{e}");
            let e = open_recording(&socket, overwrite).unwrap_err();
            assert!(e.starts_with("it is a socket, not a regular file"), "{e}");
        }
        assert!(std::fs::symlink_metadata(&fifo).unwrap().file_type().is_fifo(), "left as it was");
    }

    /// A file opened to be recorded to, and the output that writes `container` to it.
    fn output(path: &Path, container: Container, gzip: bool) -> Output {
        let staged = Staged::default();
        let options = WriterOptions { container, ..WriterOptions::default() };
        Output {
            writer: CaptureWriter::new(staged.clone(), options).unwrap(),
            staged,
            file: open_recording(path, false).unwrap(),
            path: path.to_path_buf(),
            gzip,
            committed: 0,
            staged_segments: 0,
            staged_messages: 0,
            first: None,
        }
    }

    #[test]
    fn a_gzipped_file_is_a_gzip_member_per_commit_and_reads_as_one_stream() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("day.pcap.gz");
        let mut out = output(&path, Container::Pcap, true);
        let mut member = Vec::new();
        let (from, to) = (SocketAddrV4::new(Ipv4Addr::LOCALHOST, 1), SocketAddrV4::new(RECORD_GROUP, RECORD_PORT));
        let mut plain = Vec::new();
        for round in 0..3u8 {
            out.writer.write_udp(i64::from(round), from, to, &[round; 100]).unwrap();
            plain.extend_from_slice(&out.staged.0.borrow());
            out.commit(&mut member).unwrap();
            assert_eq!(out.staged.len(), 0);
            assert_eq!(std::fs::metadata(&path).unwrap().len(), out.committed, "every committed byte is in the file");
        }
        let on_disk = std::fs::read(&path).unwrap();
        let members = on_disk.windows(3).filter(|w| w == &[0x1f, 0x8b, 0x08]).count();
        assert!(members >= 3, "{members} gzip headers");
        let mut inflated = Vec::new();
        flate2::read::MultiGzDecoder::new(&on_disk[..]).read_to_end(&mut inflated).unwrap();
        assert_eq!(inflated, plain, "the members read as the capture written");
    }

    #[test]
    fn datagrams_go_to_the_group_joined_or_the_default_group() {
        let settings = |text: &str| toml::from_str::<Settings>(text).unwrap();
        let group = settings("multicast = \"239.1.2.3:9300\"\ninterface = \"127.0.0.1\"");
        assert_eq!(destination(&group), "239.1.2.3:9300".parse().unwrap());
        let udp = settings("udp = \"127.0.0.1:0\"");
        assert_eq!(destination(&udp), SocketAddrV4::new(RECORD_GROUP, RECORD_PORT));
        let udp = settings("udp = \"127.0.0.1:9200\"");
        assert_eq!(destination(&udp), SocketAddrV4::new(RECORD_GROUP, 9200));
        assert_eq!(destination(&settings("tcp = \"h:1\"")), SocketAddrV4::new(RECORD_GROUP, RECORD_PORT));
        assert_eq!(source("[::1]:5".parse().unwrap()), SocketAddrV4::new(IPV6_SOURCE, 5));
        assert_eq!(source("[::ffff:10.0.0.1]:5".parse().unwrap()), "10.0.0.1:5".parse().unwrap());
    }
}
