//! The publisher's configuration: a TOML file, every setting overridable by a flag.
//!
//! Unknown keys are refused (with the key and line, from the TOML parser); values are checked at
//! start and errors name the setting, so a bad file fails before anything is sent.

use anyhow::{Context, Result, bail};
use mdrelay_proto::codec::Format;
use serde::Deserialize;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};

/// The whole configuration file.
#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    /// Wire format: raw, sbe, flatbuffers, capnp or capnp-packed.
    pub format: Option<Format>,
    /// Stream number announced in the TCP greeting.
    pub stream: Option<u32>,
    /// Where segments come from.
    #[serde(default)]
    pub source: SourceSection,
    /// When segments are sent.
    #[serde(default)]
    pub pacing: PacingSection,
    /// How frames are grouped.
    #[serde(default)]
    pub batching: BatchingSection,
    /// TCP server.
    pub tcp: Option<TcpSection>,
    /// UDP unicast.
    pub udp: Option<UdpSection>,
    /// UDP multicast.
    pub multicast: Option<MulticastSection>,
}

/// `[source]`: exactly one of `capture`, `synthetic`, `live` (default: a synthetic day).
#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct SourceSection {
    /// A capture file (pcap / pcapng, gzipped or not).
    pub capture: Option<PathBuf>,
    /// A synthetic day generated on the fly.
    pub synthetic: Option<SyntheticSection>,
    /// A live IEX-TP feed on UDP.
    pub live: Option<LiveSection>,
}

/// `[source.synthetic]`.
#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct SyntheticSection {
    /// Messages in the day.
    pub messages: Option<u64>,
    /// Symbols.
    pub symbols: Option<usize>,
    /// Seed.
    pub seed: Option<u64>,
}

/// `[source.live]`.
#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct LiveSection {
    /// Address and port to receive on, e.g. "0.0.0.0:10378".
    pub listen: String,
    /// Multicast group to join, e.g. "239.255.21.4" (none: unicast).
    pub group: Option<String>,
    /// Interface address to join the group on (default 0.0.0.0: the kernel's choice).
    pub interface: Option<String>,
    /// Stop after this many seconds without a datagram (0: never).
    pub idle_timeout: Option<f64>,
}

/// How segments are paced.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq, clap::ValueEnum, Default)]
#[serde(rename_all = "kebab-case")]
pub enum PacingMode {
    /// The capture's own timing, scaled by `speed`.
    Original,
    /// A fixed rate in messages per second.
    Rate,
    /// As fast as possible.
    #[default]
    TopSpeed,
}

/// `[pacing]`.
#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct PacingSection {
    /// original, rate or top-speed.
    pub mode: Option<PacingMode>,
    /// Time scale for `original`: 2 is twice as fast, 0.5 half as fast.
    pub speed: Option<f64>,
    /// Messages per second for `rate`.
    pub rate: Option<f64>,
    /// Passes over the source (0: forever).
    pub loops: Option<u64>,
    /// Stop after this many messages (0: no limit).
    pub max_messages: Option<u64>,
    /// Stop after this many seconds (0: no limit).
    pub duration: Option<f64>,
}

/// `[batching]`.
#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct BatchingSection {
    /// Coalesce frames into one TCP record / datagram up to this many bytes (0: one frame each).
    pub coalesce_bytes: Option<usize>,
}

/// What to do with a TCP subscriber whose queue is full.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq, clap::ValueEnum, Default)]
#[serde(rename_all = "kebab-case")]
pub enum SlowPolicy {
    /// Skip its frames; it sees the gap in the sequence numbers.
    #[default]
    Drop,
    /// Close its connection.
    Disconnect,
    /// Wait for it (lossless; every subscriber then goes at the slowest one's pace).
    Block,
}

/// `[tcp]`.
#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct TcpSection {
    /// Address to listen on (default 127.0.0.1:9100).
    pub listen: Option<String>,
    /// Records queued per subscriber.
    pub queue: Option<usize>,
    /// drop, disconnect or block.
    pub slow_subscriber: Option<SlowPolicy>,
    /// Wait for this many subscribers before sending.
    pub wait_subscribers: Option<usize>,
}

/// `[udp]`.
#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct UdpSection {
    /// Unicast destinations.
    pub destinations: Vec<String>,
    /// Largest datagram to build when coalescing.
    pub max_datagram: Option<usize>,
}

/// `[multicast]`.
#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct MulticastSection {
    /// Group and port, e.g. "239.255.0.1:9300".
    pub group: String,
    /// Interface address to send from (default 0.0.0.0: the routing table's choice).
    pub interface: Option<String>,
    /// Multicast TTL (default 1: this subnet).
    pub ttl: Option<u32>,
    /// Deliver to receivers on this host too (default true).
    pub loopback: Option<bool>,
    /// Largest datagram to build when coalescing.
    pub max_datagram: Option<usize>,
}

/// Where segments come from, checked.
#[derive(Debug, Clone)]
pub enum Source {
    /// A capture file.
    Capture(PathBuf),
    /// A synthetic day.
    Synthetic(mdrelay_proto::synth::SynthConfig),
    /// A live feed.
    Live(Live),
}

/// A live feed, checked.
#[derive(Debug, Clone)]
pub struct Live {
    /// Receive address.
    pub listen: SocketAddr,
    /// Group to join.
    pub group: Option<Ipv4Addr>,
    /// Interface for the join.
    pub interface: Ipv4Addr,
    /// Seconds of silence that end the stream (0: never).
    pub idle_timeout: f64,
}

/// Pacing, checked.
#[derive(Debug, Clone, Copy)]
pub struct Pacing {
    /// The mode.
    pub mode: PacingMode,
    /// Time scale for `original`.
    pub speed: f64,
    /// Messages per second for `rate`.
    pub rate: f64,
    /// Passes over the source (0: forever).
    pub loops: u64,
    /// Message limit (0: none).
    pub max_messages: u64,
    /// Seconds limit (0: none).
    pub duration: f64,
}

/// The TCP server, checked.
#[derive(Debug, Clone, Copy)]
pub struct Tcp {
    /// Listen address.
    pub listen: SocketAddr,
    /// Records queued per subscriber.
    pub queue: usize,
    /// Slow subscriber policy.
    pub slow: SlowPolicy,
    /// Subscribers to wait for before sending.
    pub wait_subscribers: usize,
}

/// UDP destinations, checked.
#[derive(Debug, Clone)]
pub struct Udp {
    /// Unicast destinations.
    pub destinations: Vec<SocketAddr>,
    /// Multicast group.
    pub multicast: Option<Multicast>,
    /// Largest coalesced datagram.
    pub max_datagram: usize,
}

/// Multicast settings, checked.
#[derive(Debug, Clone, Copy)]
pub struct Multicast {
    /// Group and port.
    pub group: SocketAddr,
    /// Interface to send from.
    pub interface: Ipv4Addr,
    /// TTL.
    pub ttl: u32,
    /// Loop back to local receivers.
    pub loopback: bool,
}

/// The publisher's settings, checked.
#[derive(Debug, Clone)]
pub struct Config {
    /// Wire format.
    pub format: Format,
    /// Stream number.
    pub stream: u32,
    /// Source.
    pub source: Source,
    /// Pacing.
    pub pacing: Pacing,
    /// Coalescing limit in bytes (0: off).
    pub coalesce_bytes: usize,
    /// TCP server, if any.
    pub tcp: Option<Tcp>,
    /// UDP, if any destination.
    pub udp: Option<Udp>,
}

/// Default TCP listen address: loopback, so nothing is exposed unless asked for.
pub const DEFAULT_TCP_LISTEN: &str = "127.0.0.1:9100";

/// Reads a configuration file.
pub fn read_file(path: &Path) -> Result<FileConfig> {
    let text = std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    toml::from_str(&text).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))
}

/// Parses a socket address for the setting `name`.
pub fn socket_addr(name: &str, text: &str) -> Result<SocketAddr> {
    text.parse().with_context(|| format!("{name}: {text:?} is not an address:port (e.g. 127.0.0.1:9100)"))
}

/// Parses an IPv4 interface address for the setting `name`.
pub fn ipv4(name: &str, text: &str) -> Result<Ipv4Addr> {
    text.parse().with_context(|| format!("{name}: {text:?} is not an IPv4 address"))
}

fn positive(name: &str, v: f64) -> Result<f64> {
    if !(v.is_finite() && v > 0.0) {
        bail!("{name}: must be a positive number, got {v}");
    }
    Ok(v)
}

impl FileConfig {
    /// Checks every value and fills in defaults.
    pub fn check(self) -> Result<Config> {
        let format = self.format.unwrap_or(Format::Sbe);
        let s = self.source;
        let chosen =
            usize::from(s.capture.is_some()) + usize::from(s.synthetic.is_some()) + usize::from(s.live.is_some());
        if chosen > 1 {
            bail!("source: give one of capture, synthetic or live, not {chosen}");
        }
        let source = if let Some(path) = s.capture {
            Source::Capture(path)
        } else if let Some(live) = s.live {
            let listen = socket_addr("source.live.listen", &live.listen)?;
            let group = live.group.as_deref().map(|g| ipv4("source.live.group", g)).transpose()?;
            if let Some(g) = group {
                if !g.is_multicast() {
                    bail!(
                        "source.live.group: {g} is not a multicast address (224.0.0.0/4); for unicast leave group out"
                    );
                }
            }
            if group.is_none() && listen.ip().is_multicast() {
                bail!(
                    "source.live.listen: {listen} is a multicast address; put the group in source.live.group and listen on 0.0.0.0:PORT"
                );
            }
            let interface = live
                .interface
                .as_deref()
                .map(|i| ipv4("source.live.interface", i))
                .transpose()?
                .unwrap_or(Ipv4Addr::UNSPECIFIED);
            Source::Live(Live { listen, group, interface, idle_timeout: live.idle_timeout.unwrap_or(0.0).max(0.0) })
        } else {
            let defaults = mdrelay_proto::synth::SynthConfig::default();
            let syn = s.synthetic.unwrap_or_default();
            Source::Synthetic(mdrelay_proto::synth::SynthConfig {
                messages: syn.messages.unwrap_or(defaults.messages),
                symbols: syn.symbols.unwrap_or(defaults.symbols),
                seed: syn.seed.unwrap_or(defaults.seed),
                ..defaults
            })
        };
        let p = self.pacing;
        let pacing = Pacing {
            mode: p.mode.unwrap_or_default(),
            speed: positive("pacing.speed", p.speed.unwrap_or(1.0))?,
            rate: positive("pacing.rate", p.rate.unwrap_or(100_000.0))?,
            loops: p.loops.unwrap_or(1),
            max_messages: p.max_messages.unwrap_or(0),
            duration: p.duration.unwrap_or(0.0).max(0.0),
        };
        let tcp = match self.tcp {
            Some(t) => {
                let listen = socket_addr("tcp.listen", t.listen.as_deref().unwrap_or(DEFAULT_TCP_LISTEN))?;
                if listen.ip().is_multicast() {
                    bail!("tcp.listen: {listen} is a multicast address; TCP needs a unicast address");
                }
                let queue = t.queue.unwrap_or(65_536);
                if queue == 0 {
                    bail!("tcp.queue: must be at least 1");
                }
                Some(Tcp {
                    listen,
                    queue,
                    slow: t.slow_subscriber.unwrap_or_default(),
                    wait_subscribers: t.wait_subscribers.unwrap_or(0),
                })
            }
            None => None,
        };
        let mut destinations = Vec::new();
        let mut max_datagram = 1472;
        if let Some(u) = &self.udp {
            for (i, d) in u.destinations.iter().enumerate() {
                let name = format!("udp.destinations[{i}]");
                let addr = socket_addr(&name, d)?;
                if addr.ip().is_multicast() {
                    bail!("{name}: {addr} is a multicast address; put it in [multicast] group instead");
                }
                destinations.push(addr);
            }
            max_datagram = u.max_datagram.unwrap_or(max_datagram);
        }
        let multicast = match &self.multicast {
            Some(m) => {
                let group = socket_addr("multicast.group", &m.group)?;
                if !group.ip().is_multicast() {
                    bail!("multicast.group: {} is not a multicast address (224.0.0.0/4, e.g. 239.255.0.1)", group.ip());
                }
                if !matches!(group.ip(), IpAddr::V4(_)) {
                    bail!("multicast.group: only IPv4 groups are supported");
                }
                let interface = m
                    .interface
                    .as_deref()
                    .map(|i| ipv4("multicast.interface", i))
                    .transpose()?
                    .unwrap_or(Ipv4Addr::UNSPECIFIED);
                max_datagram = m.max_datagram.unwrap_or(max_datagram);
                Some(Multicast { group, interface, ttl: m.ttl.unwrap_or(1), loopback: m.loopback.unwrap_or(true) })
            }
            None => None,
        };
        if !(28..=65_507).contains(&max_datagram) {
            bail!("max_datagram: {max_datagram} is outside 28..=65507");
        }
        let udp =
            (!destinations.is_empty() || multicast.is_some()).then_some(Udp { destinations, multicast, max_datagram });
        if tcp.is_none() && udp.is_none() {
            bail!(
                "no transport: configure [tcp], [udp] destinations or [multicast] (or pass --tcp, --udp, --multicast)"
            );
        }
        Ok(Config {
            format,
            stream: self.stream.unwrap_or(1),
            source,
            pacing,
            coalesce_bytes: self.batching.coalesce_bytes.unwrap_or(0),
            tcp,
            udp,
        })
    }
}
