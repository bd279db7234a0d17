//! The capture tools: `inspect`, `synth` and `convert`.

use crate::progress::{CaptureProgress, Counted, PROGRESS_EVERY, finish, progress_bar};
use anyhow::{Context, Result};
use clap::{Args, ValueEnum};
use flate2::Compression;
use flate2::write::GzEncoder;
use mdrelay_iex::capture::{CaptureError, CaptureReader};
use mdrelay_iex::capture_writer::{CaptureWriter, Container, WriterOptions};
use mdrelay_iex::iextp::Segment;
use mdrelay_iex::inspect::inspect_reader;
use mdrelay_iex::synth::{SynthConfig, SyntheticDay};
use std::fs::File;
use std::io::{BufWriter, Write};
use std::net::{Ipv4Addr, SocketAddrV4};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Instant;

/// Opens a capture as [`CaptureReader::open`] does (the same errors), counting the bytes read.
fn open_capture(path: &Path) -> Result<(CaptureReader, CaptureProgress), CaptureError> {
    let name = path.display().to_string();
    let file = File::open(path).map_err(|source| CaptureError::Io { name: name.clone(), source })?;
    // A FIFO or a device has no size: a spinner then, with bytes and packets but no time left.
    let total = file.metadata().ok().filter(|m| m.is_file()).map(|m| m.len());
    let template = match total {
        Some(_) => "{spinner} {bytes}/{total_bytes} {wide_bar} {binary_bytes_per_sec}  {msg}  {eta} left",
        None => "{spinner} {bytes} {binary_bytes_per_sec}  {msg}  {elapsed}",
    };
    let read = Arc::new(AtomicU64::new(0));
    let reader = CaptureReader::new(name, Counted::new(file, Arc::clone(&read)))?;
    Ok((reader, CaptureProgress::new(progress_bar(total, template), read)))
}

/// Arguments of `inspect`.
#[derive(Debug, Args)]
pub struct InspectArgs {
    /// The capture: pcap or pcapng, gzipped or not.
    pub file: PathBuf,
    /// Print JSON with the reference reader's field names instead of text.
    #[arg(long)]
    pub json: bool,
}

/// Prints the counts and per-symbol aggregates of a capture.
pub fn inspect(args: &InspectArgs) -> Result<()> {
    let (reader, progress) = open_capture(&args.file)?;
    let report = inspect_reader(reader, |packets| {
        if packets % PROGRESS_EVERY == 0 {
            progress.update(packets);
        }
    })?;
    progress.finish();
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    if args.json {
        serde_json::to_writer_pretty(&mut out, &report)?;
        writeln!(out)?;
    } else {
        write!(out, "{report}")?;
    }
    Ok(())
}

/// A capture container on the command line.
#[derive(Debug, Clone, Copy, ValueEnum, PartialEq, Eq)]
pub enum ContainerArg {
    /// Classic pcap.
    Pcap,
    /// pcapng.
    Pcapng,
}

impl From<ContainerArg> for Container {
    fn from(f: ContainerArg) -> Container {
        match f {
            ContainerArg::Pcap => Container::Pcap,
            ContainerArg::Pcapng => Container::PcapNg,
        }
    }
}

/// Arguments of `synth`.
#[derive(Debug, Args)]
pub struct SynthArgs {
    /// Where to write the capture.
    #[arg(long)]
    pub out: PathBuf,
    /// Messages in the day, exactly (heartbeats not counted).
    #[arg(long, default_value_t = SynthConfig::default().messages)]
    pub messages: u64,
    /// Distinct symbols.
    #[arg(long, default_value_t = SynthConfig::default().symbols)]
    pub symbols: usize,
    /// Seed; the same seed writes the same file.
    #[arg(long, default_value_t = SynthConfig::default().seed)]
    pub seed: u64,
    /// Capture container to write (`--format` is accepted too, as in earlier releases).
    #[arg(long, alias = "format", value_enum, default_value_t = ContainerArg::Pcap)]
    pub container: ContainerArg,
    /// Compress with gzip (fast level; IEX's historical files are gzipped too).
    #[arg(long)]
    pub gzip: bool,
}

/// Source and destination of synthetic datagrams: a documentation-range sender and an
/// administratively scoped multicast group, so a replay with tcpreplay stays on site.
const SYNTH_SOURCE: SocketAddrV4 = SocketAddrV4::new(Ipv4Addr::new(198, 18, 0, 1), 10378);
const SYNTH_GROUP: SocketAddrV4 = SocketAddrV4::new(Ipv4Addr::new(239, 255, 21, 4), 10378);

fn create(path: &PathBuf, gzip: bool) -> Result<Box<dyn Write>> {
    let file = File::create(path).with_context(|| format!("cannot create {}", path.display()))?;
    let buffered = BufWriter::with_capacity(1 << 20, file);
    Ok(if gzip { Box::new(GzEncoder::new(buffered, Compression::fast())) } else { Box::new(buffered) })
}

/// Writes a synthetic capture.
pub fn synth(args: &SynthArgs) -> Result<()> {
    let config =
        SynthConfig { messages: args.messages, symbols: args.symbols, seed: args.seed, ..SynthConfig::default() };
    let mut day = SyntheticDay::new(config)?;
    let started = Instant::now();
    let out = create(&args.out, args.gzip)?;
    let options = WriterOptions { container: args.container.into(), ..WriterOptions::default() };
    let mut writer = CaptureWriter::new(out, options)?;
    let bar = progress_bar(
        Some(args.messages),
        "{spinner} {human_pos}/{human_len} messages {wide_bar} {per_sec:0}  {eta} left",
    );
    let mut packets = 0u64;
    let mut messages = 0u64;
    while let Some(segment) = day.next_segment() {
        // Captured two microseconds after it was sent.
        writer
            .write_udp(segment.send_time + 2_000, SYNTH_SOURCE, SYNTH_GROUP, segment.bytes)
            .with_context(|| format!("writing {}", args.out.display()))?;
        packets += 1;
        // The header's count (a 40-byte parse, no message is read); heartbeats count none.
        messages += Segment::parse(segment.bytes).map_or(0, |s| u64::from(s.header.message_count));
        if packets.is_multiple_of(PROGRESS_EVERY) {
            bar.set_position(messages);
        }
    }
    finish(&bar);
    let out = writer.finish()?;
    drop(out);
    eprintln!(
        "wrote {} messages in {} packets for {} symbols to {} in {:.2?}",
        args.messages,
        packets,
        args.symbols,
        args.out.display(),
        started.elapsed()
    );
    Ok(())
}

/// Arguments of `convert`.
#[derive(Debug, Args)]
pub struct ConvertArgs {
    /// The capture to read.
    pub input: PathBuf,
    /// Where to write.
    #[arg(long)]
    pub out: PathBuf,
    /// Capture container to write (`--format` is accepted too, as in earlier releases).
    #[arg(long, alias = "format", value_enum, default_value_t = ContainerArg::Pcap)]
    pub container: ContainerArg,
    /// pcap only: microsecond timestamps instead of nanoseconds.
    #[arg(long)]
    pub microseconds: bool,
    /// Write big-endian headers.
    #[arg(long)]
    pub big_endian: bool,
    /// Compress with gzip.
    #[arg(long)]
    pub gzip: bool,
}

/// Rewrites a capture, packet for packet, in another container.
pub fn convert(args: &ConvertArgs) -> Result<()> {
    let (mut reader, progress) = open_capture(&args.input)?;
    let mut writer: Option<CaptureWriter<Box<dyn Write>>> = None;
    let mut packets = 0u64;
    while let Some(packet) = reader.next_packet()? {
        if writer.is_none() {
            let options = WriterOptions {
                container: args.container.into(),
                nanosecond: !args.microseconds,
                big_endian: args.big_endian,
                link_type: packet.link_type,
            };
            writer = Some(CaptureWriter::new(create(&args.out, args.gzip)?, options)?);
        }
        let w = writer.as_mut().expect("created above");
        w.write_frame(packet.timestamp_ns, packet.data).with_context(|| format!("writing {}", args.out.display()))?;
        packets += 1;
        if packets.is_multiple_of(PROGRESS_EVERY) {
            progress.update(packets);
        }
    }
    progress.finish();
    match writer {
        Some(w) => drop(w.finish()?),
        None => anyhow::bail!("{} holds no packets; nothing to convert", args.input.display()),
    }
    if let Some(offset) = reader.truncated_at() {
        eprintln!("note: {} ends inside a record at offset {offset}; that record was not copied", args.input.display());
    }
    eprintln!("copied {packets} packets to {}", args.out.display());
    Ok(())
}

/// Runs the default synthetic day through the inspector without touching the disk.
pub fn demo() -> Result<()> {
    let config = SynthConfig::default();
    let started = Instant::now();
    let mut day = SyntheticDay::new(config)?;
    let mut inspector = mdrelay_iex::inspect::Inspector::new("synthetic-day");
    while let Some(segment) = day.next_segment() {
        inspector.datagram(segment.bytes, 0);
    }
    let report = inspector.finish();
    print!("{report}");
    eprintln!("generated and inspected {} messages in {:.2?}", report.messages, started.elapsed());
    Ok(())
}
