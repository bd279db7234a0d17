//! Writing captures: IEX-TP segments wrapped in Ethernet / IPv4 / UDP frames, or frames copied
//! from another capture, as classic pcap (µs or ns, either byte order) or pcapng.
//!
//! Used by `synth` and `convert`, and by tests that need the same capture in several containers.

use etherparse::PacketBuilder;
use pcap_file::pcap::{PcapHeader, PcapPacket, PcapWriter};
use pcap_file::pcapng::PcapNgWriter;
use pcap_file::pcapng::blocks::enhanced_packet::EnhancedPacketBlock;
use pcap_file::pcapng::blocks::interface_description::{InterfaceDescriptionBlock, InterfaceDescriptionOption};
use pcap_file::{DataLink, Endianness, TsResolution};
use std::borrow::Cow;
use std::io::{self, Write};
use std::net::SocketAddrV4;
use std::time::Duration;

/// The container to write.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Container {
    /// Classic pcap.
    #[default]
    Pcap,
    /// pcapng, one interface, nanosecond `if_tsresol`.
    PcapNg,
}

/// How to write a capture.
#[derive(Clone, Copy, Debug)]
pub struct WriterOptions {
    /// pcap or pcapng.
    pub container: Container,
    /// Classic pcap only: nanosecond timestamps (magic a1b23c4d) instead of microseconds.
    pub nanosecond: bool,
    /// Write big-endian headers instead of little-endian.
    pub big_endian: bool,
    /// pcap link-layer type of the frames (Ethernet for [`CaptureWriter::write_udp`]).
    pub link_type: i32,
}

impl Default for WriterOptions {
    fn default() -> Self {
        WriterOptions {
            container: Container::Pcap,
            nanosecond: true,
            big_endian: false,
            link_type: crate::link::linktype::ETHERNET,
        }
    }
}

enum Sink<W: Write> {
    Pcap(PcapWriter<W>),
    PcapNg(PcapNgWriter<W>),
}

/// Writes packets to a capture stream.
pub struct CaptureWriter<W: Write> {
    sink: Sink<W>,
    frame: Vec<u8>,
}

fn to_io(e: pcap_file::PcapError) -> io::Error {
    match e {
        pcap_file::PcapError::IoError(e) => e,
        other => io::Error::other(other.to_string()),
    }
}

/// The Ethernet multicast MAC for an IPv4 group (01:00:5e and the low 23 bits), or a locally
/// administered unicast MAC derived from the address.
fn mac_for(address: &std::net::Ipv4Addr) -> [u8; 6] {
    let o = address.octets();
    if address.is_multicast() {
        [0x01, 0x00, 0x5e, o[1] & 0x7f, o[2], o[3]]
    } else {
        [0x02, 0x00, o[0], o[1], o[2], o[3]]
    }
}

impl<W: Write> CaptureWriter<W> {
    /// Starts a capture on `out`, writing the file header.
    pub fn new(out: W, options: WriterOptions) -> io::Result<Self> {
        let endianness = if options.big_endian { Endianness::Big } else { Endianness::Little };
        let datalink = DataLink::from(options.link_type as u32);
        let sink = match options.container {
            Container::Pcap => {
                let header = PcapHeader {
                    datalink,
                    endianness,
                    ts_resolution: if options.nanosecond {
                        TsResolution::NanoSecond
                    } else {
                        TsResolution::MicroSecond
                    },
                    snaplen: 65535,
                    ..PcapHeader::default()
                };
                Sink::Pcap(PcapWriter::with_header(out, header).map_err(to_io)?)
            }
            Container::PcapNg => {
                let mut writer = PcapNgWriter::with_endianness(out, endianness).map_err(to_io)?;
                let interface = InterfaceDescriptionBlock {
                    linktype: datalink,
                    snaplen: 65535,
                    // The writer stores nanoseconds; say so, since the pcapng default is µs.
                    options: vec![InterfaceDescriptionOption::IfTsResol(9)],
                };
                writer.write_pcapng_block(interface).map_err(to_io)?;
                Sink::PcapNg(writer)
            }
        };
        Ok(CaptureWriter { sink, frame: Vec::with_capacity(2048) })
    }

    /// Writes one frame of the writer's link type, captured at `timestamp_ns`.
    pub fn write_frame(&mut self, timestamp_ns: i64, frame: &[u8]) -> io::Result<()> {
        let timestamp = Duration::from_nanos(timestamp_ns.max(0) as u64);
        match &mut self.sink {
            Sink::Pcap(w) => {
                w.write_packet(&PcapPacket::new(timestamp, frame.len() as u32, frame)).map(drop).map_err(to_io)
            }
            Sink::PcapNg(w) => {
                let block = EnhancedPacketBlock {
                    interface_id: 0,
                    timestamp,
                    original_len: frame.len() as u32,
                    data: Cow::Borrowed(frame),
                    options: Vec::new(),
                };
                w.write_pcapng_block(block).map(drop).map_err(to_io)
            }
        }
    }

    /// Writes `payload` as a UDP datagram from `source` to `destination` in an Ethernet frame.
    pub fn write_udp(
        &mut self,
        timestamp_ns: i64,
        source: SocketAddrV4,
        destination: SocketAddrV4,
        payload: &[u8],
    ) -> io::Result<()> {
        let builder = PacketBuilder::ethernet2(mac_for(source.ip()), mac_for(destination.ip()))
            .ipv4(source.ip().octets(), destination.ip().octets(), 32)
            .udp(source.port(), destination.port());
        let mut frame = std::mem::take(&mut self.frame);
        frame.clear();
        let built =
            builder.write(&mut frame, payload).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.to_string()));
        let written = built.and_then(|()| self.write_frame(timestamp_ns, &frame));
        self.frame = frame;
        written
    }

    /// Flushes and returns the underlying stream.
    pub fn finish(self) -> io::Result<W> {
        let mut out = match self.sink {
            Sink::Pcap(w) => w.into_writer(),
            Sink::PcapNg(w) => w.into_inner(),
        };
        out.flush()?;
        Ok(out)
    }
}
