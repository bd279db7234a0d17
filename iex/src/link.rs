//! From a captured frame to the UDP payload inside it: Ethernet (with 802.1Q / 802.1ad VLAN tags),
//! Linux cooked capture (SLL) or raw IPv4, then IPv4 and UDP.

use etherparse::{NetSlice, SlicedPacket, TransportSlice};
use std::net::{Ipv4Addr, SocketAddrV4};

/// pcap link-layer type numbers this reader understands.
pub mod linktype {
    /// DLT_EN10MB: Ethernet II.
    pub const ETHERNET: i32 = 1;
    /// DLT_RAW as most platforms number it.
    pub const RAW: i32 = 101;
    /// DLT_RAW on some BSDs.
    pub const RAW_BSD_12: i32 = 12;
    /// DLT_RAW on OpenBSD.
    pub const RAW_BSD_14: i32 = 14;
    /// LINKTYPE_IPV4: raw IPv4 only.
    pub const IPV4: i32 = 228;
    /// DLT_LINUX_SLL: Linux cooked capture v1.
    pub const LINUX_SLL: i32 = 113;
}

/// A UDP datagram found in a frame.
#[derive(Clone, Copy, Debug)]
pub struct UdpDatagram<'a> {
    /// Sender.
    pub source: SocketAddrV4,
    /// Destination (for IEX, the multicast group and port).
    pub destination: SocketAddrV4,
    /// The UDP payload, cut to the UDP length (Ethernet padding excluded).
    pub payload: &'a [u8],
}

/// Why a frame holds no IPv4 UDP datagram.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LinkError {
    /// A link type this reader does not decode.
    #[error("link type {0} is not supported (Ethernet, Linux SLL and raw IPv4 are)")]
    UnsupportedLinkType(i32),
    /// The headers could not be sliced.
    #[error("malformed frame: {0}")]
    Malformed(String),
    /// Not IPv4 (IPv6, ARP or another ether type).
    #[error("not an IPv4 packet")]
    NotIpv4,
    /// IPv4 but not UDP, or a fragment whose UDP header is elsewhere.
    #[error("not a complete UDP datagram")]
    NotUdp,
}

/// Finds the IPv4 UDP datagram in `frame`, captured with link type `link_type`.
pub fn udp_datagram(link_type: i32, frame: &[u8]) -> Result<UdpDatagram<'_>, LinkError> {
    let sliced = match link_type {
        linktype::ETHERNET => SlicedPacket::from_ethernet(frame),
        linktype::LINUX_SLL => SlicedPacket::from_linux_sll(frame),
        linktype::RAW | linktype::RAW_BSD_12 | linktype::RAW_BSD_14 | linktype::IPV4 => SlicedPacket::from_ip(frame),
        other => return Err(LinkError::UnsupportedLinkType(other)),
    }
    .map_err(|e| LinkError::Malformed(e.to_string()))?;
    let Some(NetSlice::Ipv4(ip)) = &sliced.net else {
        return Err(LinkError::NotIpv4);
    };
    let Some(TransportSlice::Udp(udp)) = &sliced.transport else {
        return Err(LinkError::NotUdp);
    };
    let header = ip.header();
    Ok(UdpDatagram {
        source: SocketAddrV4::new(Ipv4Addr::from(header.source()), udp.source_port()),
        destination: SocketAddrV4::new(Ipv4Addr::from(header.destination()), udp.destination_port()),
        payload: udp.payload(),
    })
}
