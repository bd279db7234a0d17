//! The publisher's configuration: a TOML file, every setting overridable by a flag.
//!
//! Each setting is one field of [`Settings`]' sections: its type and bounds are read with it
//! (addresses, durations with units, whole numbers in their range), and the section's `Default`
//! is its default. A field stays an `Option` where none means off, or where its default is
//! another setting's (the profile's idle strategy, line A's TTL for line B). The file, the flags
//! and the environment are laid by `mdrelay_telemetry::settings::Layered` (see `run.rs`), then
//! [`Settings::check`] checks the rules that span settings, fills in those other-setting
//! defaults and reads the key files: the [`Config`] the relay runs with, whose settings, so
//! resolved, are what `--check` prints and a reload compares.
//!
//! Unknown keys are refused with the key, its line and the nearest known key; values are checked
//! at start and errors name the setting and its origin, so a bad file fails before anything is
//! sent.

use anyhow::{Context, Result, bail};
use mdrelay_codec::Format;
use mdrelay_proto::relay::{ProtectionSection, ProtectionSettings, WireKey};
use mdrelay_runtime::idle::{IdleStrategy, Profile};
use mdrelay_telemetry::prometheus::{MetricsSection, MetricsSettings};
use mdrelay_telemetry::units;
use serde::{Deserialize, Serialize};
use smart_default::SmartDefault;
use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Every setting of the publisher, as the file writes it; every key missing from the file takes
/// its field's default.
#[derive(Debug, Clone, Deserialize, Serialize, clap::Args, SmartDefault)]
#[serde(default, deny_unknown_fields)]
pub struct Settings {
    /// default or low-latency: the idle strategy and core pinning unless set explicitly.
    #[arg(long, value_name = "PROFILE", help_heading = "Latency and CPU")]
    pub profile: Profile,
    /// Wire format: raw, sbe, flatbuffers, capnp, capnp-packed, protobuf, brec or json.
    #[arg(long, value_name = "FORMAT", help_heading = "Format")]
    #[default(Format::Sbe)]
    pub format: Format,
    /// Stream number announced in the TCP greeting.
    #[arg(long, value_name = "N", help_heading = "Format")]
    #[default(1)]
    pub stream: u32,
    /// Where segments come from.
    #[command(flatten)]
    pub source: SourceSection,
    /// When segments are sent.
    #[command(flatten)]
    pub pacing: Pacing,
    /// How frames are grouped.
    #[command(flatten)]
    pub batching: Batching,
    /// TCP server.
    #[command(flatten)]
    pub tcp: Option<Tcp>,
    /// UDP unicast.
    #[command(flatten)]
    pub udp: Option<Udp>,
    /// UDP multicast.
    #[command(flatten)]
    pub multicast: Option<Multicast>,
    /// A second multicast line (B): every datagram is sent to both groups.
    #[arg(skip)] // Line A's flags with `-b` (run::setting_flags).
    pub multicast_b: Option<Multicast>,
    /// A NATS subject, stored in a JetStream stream.
    #[arg(skip)]
    pub nats: Option<Nats>,
    /// The retransmission ring and service.
    #[command(flatten)]
    pub retransmit: Retransmit,
    /// Threads, and where the hot one runs.
    #[command(flatten)]
    pub cpu: Cpu,
    /// The Prometheus endpoint; left out of a resolved configuration when there is none.
    #[serde(skip_serializing_if = "MetricsSection::is_off")]
    #[command(flatten)]
    pub metrics: MetricsSection,
    /// Per-frame CRC-32C and encryption.
    #[arg(skip)]
    pub protection: ProtectionSection,
}

/// `[cpu]`.
#[derive(Debug, Clone, Deserialize, Serialize, clap::Args, SmartDefault)]
#[serde(default, deny_unknown_fields)]
#[command(next_help_heading = "Latency and CPU")]
pub struct Cpu {
    /// Pin the hot thread (`mdrelay-pub-hot`) to this CPU (none: the scheduler's choice).
    #[arg(id = "cpu.hot_core", long = "hot-core", value_name = "N")]
    pub hot_core: Option<usize>,
    /// Threads serving subscribers' sockets (`mdrelay-pub-io`).
    #[serde(deserialize_with = "units::whole_within::<_, _, 1, 256>")]
    #[arg(id = "cpu.io_threads", long = "io-threads", value_name = "N")]
    #[default(1)]
    pub io_threads: usize,
}

/// `[source]`: exactly one of `capture`, `synthetic`, `live`, `upstream` (default: a synthetic
/// day).
#[derive(Debug, Clone, Deserialize, Serialize, Default, clap::Args)]
#[serde(deny_unknown_fields)]
#[command(next_help_heading = "Source")]
pub struct SourceSection {
    /// Replay this capture file (pcap / pcapng, gzipped or not).
    #[arg(id = "source.capture", long = "capture", value_name = "FILE", conflicts_with_all = ["source.synthetic", "source.live.listen"])]
    pub capture: Option<PathBuf>,
    /// A synthetic day generated on the fly.
    #[command(flatten)]
    pub synthetic: Option<Synthetic>,
    /// A live IEX-TP feed on UDP.
    #[command(flatten)]
    pub live: Option<Live>,
    /// Another mdrelay publisher's stream, over TCP or from a NATS subject (relay chaining).
    #[command(flatten)]
    pub upstream: Option<UpstreamSection>,
}

/// `[source.upstream]`: another publisher's stream, which this one re-publishes: its TCP server
/// (`connect`), or the NATS subject its `[nats]` output feeds (`nats` and `subject`). The
/// settings of one kind only are options: one of the other kind given is refused by name, and
/// the check fills in the defaults of its own kind.
#[derive(Debug, Clone, Deserialize, Serialize, clap::Args, SmartDefault)]
#[serde(default, deny_unknown_fields)]
#[command(next_help_heading = "Upstream (relay)")]
pub struct UpstreamSection {
    /// Relay the stream of another publisher's TCP server, "host:port" (relay chaining; a NATS
    /// upstream and its credentials are set in the file).
    #[arg(id = "source.upstream.connect", long = "upstream", value_name = "HOST:PORT", conflicts_with_all = ["source.capture", "source.synthetic", "source.live.listen"])]
    pub connect: String,
    /// NATS: the servers' URLs ("nats://host:port"), instead of `connect`.
    #[arg(skip)]
    pub nats: Option<Vec<String>>,
    /// NATS: the subject the upstream's `[nats]` output publishes to.
    #[arg(skip)]
    pub subject: Option<String>,
    /// NATS: the JetStream stream that stores the subject (the upstream's `nats.stream`): gaps
    /// are repaired from it where the client can, and `from_start` replays it.
    #[arg(skip)]
    pub stream: Option<String>,
    /// NATS: replay the stream from its first frame before taking the subject live.
    #[arg(skip)]
    pub from_start: Option<bool>,
    /// NATS: seconds frames after a gap wait for it to be repaired before going on without it
    /// (0: never wait; default 2 with a `stream`, 0 without).
    #[serde(default, deserialize_with = "units::option_seconds")]
    #[arg(skip)]
    pub repair_wait: Option<f64>,
    /// Seconds one connection attempt may take.
    #[serde(default, deserialize_with = "units::option_seconds")]
    #[arg(id = "source.upstream.connect_timeout", long = "upstream-connect-timeout", value_name = "DURATION", value_parser = units::parse_seconds)]
    pub connect_timeout: Option<f64>,
    /// Seconds the upstream has to greet once connected.
    #[serde(default, deserialize_with = "units::option_seconds")]
    #[arg(id = "source.upstream.handshake_timeout", long = "upstream-handshake-timeout", value_name = "DURATION", value_parser = units::parse_seconds)]
    pub handshake_timeout: Option<f64>,
    /// Longest wait between attempts, seconds (the wait doubles from 0.1 s up to this).
    #[serde(default, deserialize_with = "units::option_seconds")]
    #[arg(id = "source.upstream.reconnect_max", long = "upstream-reconnect-max", value_name = "DURATION", value_parser = units::parse_seconds)]
    pub reconnect_max: Option<f64>,
    /// Seconds to keep trying to reach the upstream (at start, and after losing it) before the
    /// relay ends with an error (0: after the first failed attempt).
    #[serde(deserialize_with = "units::seconds_within::<_, 0, 86_400_000>", serialize_with = "units::as_seconds")]
    #[arg(id = "source.upstream.give_up_after", long = "upstream-give-up-after", value_name = "DURATION", value_parser = units::parse_duration)]
    #[default(Duration::from_secs(30))]
    pub give_up_after: Duration,
    /// A connection silent this many seconds is lost, and made again (0: never).
    #[serde(default, deserialize_with = "units::option_seconds")]
    #[arg(id = "source.upstream.idle_timeout", long = "upstream-idle-timeout", value_name = "DURATION", value_parser = units::parse_seconds)]
    pub idle_timeout: Option<f64>,
    /// The upstream protects its frames with a CRC-32C (its `[protection] crc = true`): the
    /// relay checks every frame's, and an upstream protected otherwise is refused.
    #[arg(id = "source.upstream.crc", long = "upstream-crc", value_name = "BOOL", action = clap::ArgAction::Set)]
    pub crc: bool,
    /// NATS: a `.creds` file (JWT and nkey seed).
    #[arg(skip)]
    pub creds_file: Option<PathBuf>,
    /// NATS: a file holding an nkey seed.
    #[arg(skip)]
    pub nkey_file: Option<PathBuf>,
    /// NATS: user name, with `password_file`.
    #[arg(skip)]
    pub user: Option<String>,
    /// NATS: a file holding the password of `user`.
    #[arg(skip)]
    pub password_file: Option<PathBuf>,
    /// NATS: CA certificates (PEM) to check the servers' TLS certificates with; TLS is required
    /// when set.
    #[arg(skip)]
    pub tls_ca_file: Option<PathBuf>,
}

/// `[source.synthetic]`.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize, Serialize, clap::Args)]
#[serde(default, deny_unknown_fields)]
#[command(next_help_heading = "Source")]
pub struct Synthetic {
    /// Messages in the synthetic day.
    #[serde(deserialize_with = "units::whole_within::<_, _, 0, MAX_SYNTHETIC_MESSAGES>")]
    #[arg(id = "source.synthetic.messages", long = "synthetic-messages", visible_alias = "messages", value_name = "N")]
    pub messages: u64,
    /// Symbols the synthetic day trades.
    #[arg(id = "source.synthetic.symbols", long = "synthetic-symbols", visible_alias = "symbols", value_name = "N")]
    pub symbols: usize,
    /// Seed of the synthetic day's generator.
    #[arg(id = "source.synthetic.seed", long = "synthetic-seed", visible_alias = "seed", value_name = "N")]
    pub seed: u64,
}

impl Default for Synthetic {
    fn default() -> Synthetic {
        let day = mdrelay_iex::synth::SynthConfig::default();
        Synthetic { messages: day.messages, symbols: day.symbols, seed: day.seed }
    }
}

impl Synthetic {
    /// The generator's settings for this day.
    pub fn day(&self) -> mdrelay_iex::synth::SynthConfig {
        let Synthetic { messages, symbols, seed } = *self;
        mdrelay_iex::synth::SynthConfig { messages, symbols, seed, ..mdrelay_iex::synth::SynthConfig::default() }
    }
}

/// `[source.live]`: a live IEX-TP feed on UDP.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize, Serialize, clap::Args)]
#[serde(deny_unknown_fields)]
#[command(next_help_heading = "Source")]
pub struct Live {
    /// Relay a live IEX-TP feed received on this address and port, e.g. "0.0.0.0:10378".
    #[serde(deserialize_with = "units::address")]
    #[arg(id = "source.live.listen", long = "live", value_name = "ADDR:PORT")]
    pub listen: SocketAddr,
    /// Multicast group to join, e.g. "239.255.21.4" (none: unicast).
    #[serde(default, deserialize_with = "units::option_ipv4")]
    #[arg(id = "source.live.group", long = "live-group", value_name = "GROUP")]
    pub group: Option<Ipv4Addr>,
    /// Interface address to join the group on (0.0.0.0: the kernel's choice).
    #[serde(default = "any_interface", deserialize_with = "units::ipv4")]
    #[arg(id = "source.live.interface", long = "live-interface", value_name = "ADDR")]
    pub interface: Ipv4Addr,
    /// Stop after this many seconds without a datagram (0: never).
    #[serde(
        default,
        deserialize_with = "units::seconds_within::<_, 0, 86_400_000>",
        serialize_with = "units::as_seconds"
    )]
    #[arg(id = "source.live.idle_timeout", long = "idle-timeout", value_name = "DURATION", value_parser = units::parse_duration)]
    pub idle_timeout: Duration,
}

/// The default interface of a group's join or send: 0.0.0.0, the system's choice.
fn any_interface() -> Ipv4Addr {
    Ipv4Addr::UNSPECIFIED
}

/// How segments are paced.
#[derive(Debug, Clone, Copy, Deserialize, Serialize, PartialEq, Eq, clap::ValueEnum, Default)]
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
#[derive(Debug, Clone, Copy, PartialEq, Deserialize, Serialize, clap::Args, SmartDefault)]
#[serde(default, deny_unknown_fields)]
#[command(next_help_heading = "Pacing")]
pub struct Pacing {
    /// original, rate or top-speed.
    #[arg(id = "pacing.mode", long = "pacing", value_name = "MODE", value_enum)]
    pub mode: PacingMode,
    /// Time scale for `original`: 2 is twice as fast, 0.5 half as fast.
    #[arg(id = "pacing.speed", long = "speed", value_name = "FACTOR")]
    #[default(1.0)]
    pub speed: f64,
    /// Messages per second for `rate`.
    #[arg(id = "pacing.rate", long = "rate", value_name = "N")]
    #[default(100_000.0)]
    pub rate: f64,
    /// Passes over the source (0: forever).
    #[serde(deserialize_with = "units::whole_within::<_, _, 0, MAX_LOOPS>")]
    #[arg(id = "pacing.loops", long = "loops", value_name = "N")]
    #[default(1)]
    pub loops: u64,
    /// Stop after this many messages (0: no limit).
    #[serde(deserialize_with = "units::whole_within::<_, _, 0, MAX_MESSAGE_LIMIT>")]
    #[arg(id = "pacing.max_messages", long = "max-messages", value_name = "N")]
    pub max_messages: u64,
    /// Stop after this many seconds (0: no limit).
    #[serde(deserialize_with = "units::seconds_within::<_, 0, YEAR_MS>", serialize_with = "units::as_seconds")]
    #[arg(id = "pacing.duration", long = "duration", value_name = "DURATION", value_parser = units::parse_duration)]
    pub duration: Duration,
    /// `original`: a wait longer than this many seconds (a jump in the capture's clock) is not
    /// waited out: the schedule starts again from the next segment.
    #[serde(deserialize_with = "units::seconds_within::<_, 1, 86_400_000>", serialize_with = "units::as_seconds")]
    #[arg(id = "pacing.max_gap", long = "max-gap", value_name = "DURATION", value_parser = units::parse_duration)]
    #[default(Duration::from_secs(60))]
    pub max_gap: Duration,
    /// How the hot thread waits: spin, yield, backoff or sleep (default: the profile's).
    #[arg(id = "pacing.idle", long = "idle", value_name = "STRATEGY", help_heading = "Latency and CPU")]
    pub idle: Option<IdleStrategy>,
    /// Seconds of segments sent per wake-up: a segment due within this goes out early, with
    /// the one that woke the thread (default: the profile's).
    #[serde(default, deserialize_with = "units::option_seconds")]
    #[arg(id = "pacing.duty_cycle", long = "duty-cycle", value_name = "DURATION", value_parser = units::parse_seconds)]
    pub duty_cycle: Option<f64>,
}

impl Pacing {
    /// How the hot thread waits: the one set, else `profile`'s.
    pub fn idle(&self, profile: Profile) -> IdleStrategy {
        self.idle.unwrap_or_else(|| mdrelay_runtime::idle::pacing_idle(profile))
    }

    /// How early segments go out: the duty cycle set, else `profile`'s.
    pub fn duty_cycle(&self, profile: Profile) -> Duration {
        let given = self.duty_cycle.and_then(|seconds| Duration::try_from_secs_f64(seconds).ok());
        given.unwrap_or_else(|| mdrelay_runtime::idle::duty_cycle(profile))
    }
}

/// `[batching]`.
#[derive(Debug, Clone, Deserialize, Serialize, clap::Args, SmartDefault)]
#[serde(default, deny_unknown_fields)]
#[command(next_help_heading = "Batching")]
pub struct Batching {
    /// Coalesce frames into one TCP record / datagram up to this many bytes (0: one frame each).
    #[serde(deserialize_with = "units::bytes_within::<_, _, 0, MAX_COALESCE>")]
    #[arg(id = "batching.coalesce_bytes", long = "coalesce-bytes", value_name = "SIZE", value_parser = units::parse_bytes::<usize>)]
    pub coalesce_bytes: usize,
    /// A UDP datagram or NATS message of more than 255 frames is written in datagram header
    /// version 2; false holds each to 255 frames, for receivers older than version 2.
    #[arg(id = "batching.wide_datagrams", long = "wide-datagrams", value_name = "BOOL", action = clap::ArgAction::Set)]
    #[default(true)]
    pub wide_datagrams: bool,
}

/// What to do with a TCP subscriber whose queue is full.
#[derive(Debug, Clone, Copy, Deserialize, Serialize, PartialEq, Eq, clap::ValueEnum, Default)]
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

impl SlowPolicy {
    /// The name in configuration files and metrics' labels.
    pub fn name(self) -> &'static str {
        match self {
            SlowPolicy::Drop => "drop",
            SlowPolicy::Disconnect => "disconnect",
            SlowPolicy::Block => "block",
        }
    }
}

/// `[tcp]`: the TCP server.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize, Serialize, clap::Args, SmartDefault)]
#[serde(default, deny_unknown_fields)]
#[command(next_help_heading = "TCP")]
pub struct Tcp {
    /// Serve subscribers over TCP on this address and port.
    #[serde(deserialize_with = "units::address")]
    #[arg(id = "tcp.listen", long = "tcp", value_name = "ADDR:PORT")]
    #[default(SocketAddr::from(([127, 0, 0, 1], 9100)))]
    pub listen: SocketAddr,
    /// Records in the queue all subscribers read from; a subscriber this far behind is slow.
    #[serde(deserialize_with = "units::whole_within::<_, _, 16, 4_194_304>")]
    #[arg(id = "tcp.queue", long = "queue", value_name = "N")]
    #[default(65_536)]
    pub queue: usize,
    /// Under `block`: bytes of records the slowest subscriber has not read, at most (a record
    /// larger than this still goes, alone); the publisher's memory for the queue stays within
    /// it whatever the records' sizes.
    #[serde(deserialize_with = "units::bytes_within::<_, _, 65_536, 17_179_869_184>")]
    #[arg(id = "tcp.queue_bytes", long = "queue-bytes", value_name = "SIZE", value_parser = units::parse_bytes::<usize>)]
    #[default(16 << 20)]
    pub queue_bytes: usize,
    /// drop, disconnect or block.
    #[arg(id = "tcp.slow_subscriber", long = "slow-subscriber", value_name = "POLICY", value_enum)]
    pub slow_subscriber: SlowPolicy,
    /// Wait for this many subscribers before sending.
    #[arg(id = "tcp.wait_subscribers", long = "wait-subscribers", value_name = "N")]
    pub wait_subscribers: usize,
    /// Connections at once, handshaking or subscribed; more are told to retry later.
    #[serde(deserialize_with = "units::whole_within::<_, _, 1, 65_535>")]
    #[arg(id = "tcp.max_connections", long = "max-connections", value_name = "N")]
    #[default(64)]
    pub max_connections: usize,
    /// Seconds a connection has to answer the greeting.
    #[serde(deserialize_with = "units::seconds_within::<_, 10, 300_000>", serialize_with = "units::as_seconds")]
    #[arg(id = "tcp.handshake_timeout", long = "handshake-timeout", value_name = "DURATION", value_parser = units::parse_duration)]
    #[default(Duration::from_secs(5))]
    pub handshake_timeout: Duration,
    /// Seconds subscribers get at the end of the stream to take what is queued for them.
    #[serde(deserialize_with = "units::seconds_within::<_, 0, 3_600_000>", serialize_with = "units::as_seconds")]
    #[arg(id = "tcp.drain_timeout", long = "drain-timeout", value_name = "DURATION", value_parser = units::parse_duration)]
    #[default(Duration::from_secs(10))]
    pub drain_timeout: Duration,
    /// Bytes of replay records built and not yet written, over every resuming subscriber.
    #[serde(deserialize_with = "units::bytes_within::<_, _, 65_536, 1_073_741_824>")]
    #[arg(id = "tcp.replay_bytes", long = "replay-bytes", value_name = "SIZE", value_parser = units::parse_bytes::<usize>)]
    #[default(16 << 20)]
    pub replay_bytes: usize,
    /// Seconds a resuming subscriber has to take a replay chunk before it is cut off as slow.
    #[serde(deserialize_with = "units::seconds_within::<_, 10, 3_600_000>", serialize_with = "units::as_seconds")]
    #[arg(id = "tcp.replay_timeout", long = "replay-timeout", value_name = "DURATION", value_parser = units::parse_duration)]
    #[default(Duration::from_secs(10))]
    pub replay_timeout: Duration,
    /// Keep the state of the stream (books, status, day aggregates) for subscribers that join
    /// with a snapshot; needs the ring (`retransmit.ring_bytes` > 0).
    #[arg(id = "tcp.snapshots", long = "snapshots", value_name = "BOOL", action = clap::ArgAction::Set)]
    #[default(true)]
    pub snapshots: bool,
    /// Paced streams: the hot thread writes each record straight into the socket of a
    /// subscriber that is current and has room, instead of waking its task (top speed leaves
    /// every write to the tasks).
    #[arg(id = "tcp.hot_writes", long = "hot-writes", value_name = "BOOL", action = clap::ArgAction::Set)]
    #[default(true)]
    pub hot_writes: bool,
}

/// `[udp]`: unicast destinations.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, clap::Args)]
#[serde(deny_unknown_fields)]
#[command(next_help_heading = "UDP and multicast")]
pub struct Udp {
    /// Send every datagram to these unicast addresses and ports (the flag is given once for each).
    #[serde(deserialize_with = "units::addresses")]
    #[arg(id = "udp.destinations", long = "udp", value_name = "HOST:PORT")]
    pub destinations: Vec<SocketAddr>,
    /// Largest datagram to build when coalescing, for every UDP output (a multicast line's, when
    /// given, wins; given nowhere, 1472); the check writes the limit in force here.
    #[serde(default, deserialize_with = "units::option_bytes")]
    #[arg(id = "udp.max_datagram", long = "max-datagram", value_name = "SIZE", value_parser = units::parse_bytes::<usize>, help_heading = "Batching")]
    pub max_datagram: Option<usize>,
}

/// `[multicast]` and `[multicast_b]`: a group to send every datagram to.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize, Serialize, clap::Args)]
#[serde(deny_unknown_fields)]
#[command(next_help_heading = "UDP and multicast")]
pub struct Multicast {
    /// Send every datagram to this multicast group and port, e.g. "239.255.0.1:9300".
    #[serde(deserialize_with = "units::address")]
    #[arg(id = "multicast.group", long = "multicast", value_name = "GROUP:PORT")]
    pub group: SocketAddr,
    /// Interface address to send from (0.0.0.0: the routing table's choice).
    #[serde(default = "any_interface", deserialize_with = "units::ipv4")]
    #[arg(id = "multicast.interface", long = "interface", value_name = "ADDR")]
    pub interface: Ipv4Addr,
    /// Multicast TTL (default 1: this subnet; line B's default is line A's).
    #[arg(id = "multicast.ttl", long = "ttl", value_name = "N")]
    pub ttl: Option<u32>,
    /// Deliver to receivers on this host too (default true; line B's default is line A's).
    #[arg(id = "multicast.loopback", long = "multicast-loop", value_name = "BOOL")]
    pub loopback: Option<bool>,
    /// Largest datagram to build when coalescing.
    #[serde(default, deserialize_with = "units::option_bytes")]
    #[arg(skip)]
    pub max_datagram: Option<usize>,
}

impl Multicast {
    /// The TTL in force: the one set, else 1 (the check writes line A's into line B's).
    pub fn ttl(&self) -> u32 {
        self.ttl.unwrap_or(1)
    }

    /// Whether datagrams loop back to this host's receivers: as set, else yes.
    pub fn loopback(&self) -> bool {
        self.loopback.unwrap_or(true)
    }
}

/// What the publisher does when the NATS server takes messages slower than they come (its
/// queue is full), or is gone.
#[derive(Debug, Clone, Copy, Deserialize, Serialize, PartialEq, Eq, Default)]
#[serde(rename_all = "kebab-case")]
pub enum SlowServerPolicy {
    /// Wait for room (lossless; the stream goes at the server's pace).
    #[default]
    Block,
    /// Skip the messages and count them; subscribers see the gap and cannot repair it.
    Drop,
    /// End the run with an error (exit 1).
    Fail,
}

impl SlowServerPolicy {
    /// The name in configuration files.
    pub fn name(self) -> &'static str {
        match self {
            SlowServerPolicy::Block => "block",
            SlowServerPolicy::Drop => "drop",
            SlowServerPolicy::Fail => "fail",
        }
    }
}

/// JetStream stream storage.
#[derive(Debug, Clone, Copy, Deserialize, Serialize, PartialEq, Eq, Default)]
#[serde(rename_all = "kebab-case")]
pub enum NatsStorage {
    /// On disk: survives a server restart.
    #[default]
    File,
    /// In memory: faster, lost with the server.
    Memory,
}

/// JetStream stream retention.
#[derive(Debug, Clone, Copy, Deserialize, Serialize, PartialEq, Eq, Default)]
#[serde(rename_all = "kebab-case")]
pub enum NatsRetention {
    /// Kept until `max_age` or `max_bytes` says otherwise: late joiners and repairs find it.
    #[default]
    Limits,
    /// Kept while a consumer has not acknowledged it.
    Interest,
}

/// `[nats]`: publish every datagram to a NATS subject, stored in a JetStream stream.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, SmartDefault)]
#[serde(default, deny_unknown_fields)]
pub struct Nats {
    /// Server URLs of the cluster (none: `NATS_URL`'s, or nats://127.0.0.1:4222); the client fails
    /// over among them.
    pub servers: Option<Vec<String>>,
    /// Subject the stream goes to (none: `mdrelay.<stream>`).
    pub subject: Option<String>,
    /// JetStream stream that stores the subject (none: `MDRELAY_<stream>`).
    pub stream: Option<String>,
    /// Create the stream when it is missing; otherwise a missing stream is an error.
    #[default(true)]
    pub create_stream: bool,
    /// file or memory, for a stream created here.
    pub storage: NatsStorage,
    /// limits or interest, for a stream created here.
    pub retention: NatsRetention,
    /// Copies of the stream in a cluster (1 to 5), for a stream created here.
    #[serde(deserialize_with = "units::whole_within::<_, _, 1, 5>")]
    #[default(1)]
    pub replicas: usize,
    /// Seconds a message is kept (0: no limit), for a stream created here.
    #[serde(deserialize_with = "units::seconds_within::<_, 0, TEN_YEARS_MS>", serialize_with = "units::as_seconds")]
    pub max_age: Duration,
    /// Bytes the stream keeps at most (0: no limit), for a stream created here.
    #[serde(deserialize_with = "units::bytes_within::<_, _, 0, { i64::MAX as u64 }>")]
    pub max_bytes: u64,
    /// Seconds within which the server drops a message whose id it has seen (the same frame from
    /// a second publisher or a restarted one), for a stream created here.
    #[serde(deserialize_with = "units::seconds_within::<_, 1, YEAR_MS>", serialize_with = "units::as_seconds")]
    #[default(Duration::from_secs(120))]
    pub duplicate_window: Duration,
    /// A `.creds` file (JWT and nkey seed).
    pub creds_file: Option<PathBuf>,
    /// A file holding an nkey seed.
    pub nkey_file: Option<PathBuf>,
    /// User name, with `password_file`.
    pub user: Option<String>,
    /// A file holding the password of `user`.
    pub password_file: Option<PathBuf>,
    /// CA certificates (PEM) to check the servers' TLS certificates with; TLS is required when set.
    pub tls_ca_file: Option<PathBuf>,
    /// Messages published and not yet acknowledged by JetStream, at most.
    #[serde(deserialize_with = "units::whole_within::<_, _, 1, 1_048_576>")]
    #[default(4096)]
    pub max_pending_acks: usize,
    /// Messages queued between the hot thread and the publishing task.
    #[serde(deserialize_with = "units::whole_within::<_, _, 16, 4_194_304>")]
    #[default(65_536)]
    pub queue: usize,
    /// Bytes of messages held for the server: queued, or published and not yet acknowledged.
    #[serde(deserialize_with = "units::bytes_within::<_, _, 65_536, 1_099_511_627_776>")]
    #[default(NATS_QUEUE_BYTES)]
    pub queue_bytes: u64,
    /// block, drop or fail when that queue is full (in messages or in bytes).
    pub slow_server: SlowServerPolicy,
    /// A file holding the key of the messages' ids (64 hex digits, mode 600); without it each run
    /// makes a key of its own. Relays of one origin that share it store each frame once.
    pub id_key_file: Option<PathBuf>,
    /// Largest message to build when coalescing, header included: the datagram header counts its
    /// frames in one byte, and a server's default `max_payload` is 1 MiB.
    #[serde(deserialize_with = "units::bytes_within::<_, _, 64, 1_048_576>")]
    #[default(64 << 10)]
    pub max_message: usize,
    /// Keep the state of the stream (books, status, day aggregates) and answer subscribers that
    /// ask for a snapshot on `_MDRELAY.SNAPSHOT.<subject>`.
    #[default(true)]
    pub snapshots: bool,
    /// The credentials of the four settings above, read by the check.
    #[serde(skip)]
    pub auth: NatsAuth,
    /// The key `id_key_file` holds, read by the check.
    #[serde(skip)]
    pub id_key: Option<WireKey>,
}

impl Nats {
    /// The servers' URLs (the check writes the default in).
    pub fn servers(&self) -> &[String] {
        self.servers.as_deref().unwrap_or_default()
    }

    /// The subject published to (the check writes the default in).
    pub fn subject(&self) -> &str {
        self.subject.as_deref().unwrap_or_default()
    }

    /// The JetStream stream that stores it (the check writes the default in).
    pub fn stream(&self) -> &str {
        self.stream.as_deref().unwrap_or_default()
    }

    /// Fills in the servers, subject and stream left out, checks their form and reads the
    /// credentials and the id key.
    fn check(&mut self, stream_number: u32) -> Result<()> {
        let servers = self.servers.get_or_insert_with(|| vec!["nats://127.0.0.1:4222".into()]);
        if servers.is_empty() {
            bail!("nats.servers: give at least one server URL");
        }
        for (i, url) in servers.iter().enumerate() {
            if url.trim().is_empty() || url.contains(char::is_whitespace) {
                bail!("nats.servers[{i}]: {url:?} is not a server URL (nats://HOST:PORT)");
            }
        }
        let subject = self.subject.get_or_insert_with(|| format!("mdrelay.{stream_number}"));
        let tokens_ok = !subject.is_empty() && subject.split('.').all(|t| !t.is_empty() && t != "*" && t != ">");
        if !tokens_ok || subject.contains(char::is_whitespace) {
            bail!(
                "nats.subject: {subject:?} is not a subject to publish to (dot-separated tokens, no wildcards or spaces)"
            );
        }
        let stream = self.stream.get_or_insert_with(|| format!("MDRELAY_{stream_number}"));
        if stream.is_empty() || stream.contains(['.', '*', '>', ' ', '\t', '/', '\\']) {
            bail!("nats.stream: {stream:?} is not a JetStream stream name (no dots, wildcards, spaces or slashes)");
        }
        self.auth = nats_auth(
            "nats",
            self.creds_file.clone(),
            self.nkey_file.clone(),
            self.user.clone(),
            self.password_file.clone(),
        )?;
        self.id_key = self
            .id_key_file
            .as_deref()
            .map(|path| mdrelay_client::read_key_file(path).map_err(|e| anyhow::anyhow!("nats.id_key_file: {e}")))
            .transpose()?;
        Ok(())
    }
}

/// How the publisher authenticates to NATS: the client's, from the same four settings.
pub use mdrelay_client::NatsAuth;

/// `nats.queue_bytes` by default: as the ring's default, what a server's pause of a second or
/// two at a busy feed's rate fills, and far from the 4 GiB that 65,536 messages of 64 KiB hold.
pub const NATS_QUEUE_BYTES: u64 = 64 << 20;

/// The credentials of a NATS connection from the keys of section `section`: none, or exactly one
/// kind.
fn nats_auth(
    section: &str,
    creds_file: Option<PathBuf>,
    nkey_file: Option<PathBuf>,
    user: Option<String>,
    password_file: Option<PathBuf>,
) -> Result<NatsAuth> {
    NatsAuth::from_settings(creds_file, nkey_file, user, password_file).map_err(|e| anyhow::anyhow!("{section}.{e}"))
}

/// `[retransmit]`: the ring of the last frames (for TCP resume and retransmission requests) and
/// the retransmission service for UDP subscribers.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize, Serialize, clap::Args, SmartDefault)]
#[serde(default, deny_unknown_fields)]
#[command(next_help_heading = "Retransmission")]
pub struct Retransmit {
    /// Bytes the ring may hold, frames and their bookkeeping (0: no ring, so no resume and no
    /// retransmission).
    #[serde(deserialize_with = "units::bytes_within::<_, _, 0, MAX_RING_BYTES>")]
    #[arg(id = "retransmit.ring_bytes", long = "ring-bytes", value_name = "SIZE", value_parser = units::parse_bytes::<usize>)]
    #[default(DEFAULT_RING_BYTES)]
    pub ring_bytes: usize,
    /// Serve retransmission requests over TCP on this address (none: no service).
    #[serde(default, deserialize_with = "units::option_address")]
    #[arg(id = "retransmit.listen", long = "retransmit-listen", value_name = "ADDR:PORT")]
    pub listen: Option<SocketAddr>,
    /// Frames one request is served at most.
    #[serde(deserialize_with = "units::whole_within::<_, _, 1, 65_535>")]
    #[arg(id = "retransmit.max_range", long = "retransmit-max-range", value_name = "N")]
    #[default(1024)]
    pub max_range: u32,
    /// Requests per second per connection (with a burst of as many).
    #[serde(deserialize_with = "units::whole_within::<_, _, 1, 1_000_000>")]
    #[arg(id = "retransmit.requests_per_second", long = "retransmit-rate", value_name = "N")]
    #[default(10_000)]
    pub requests_per_second: u32,
    /// Connections to the service at once.
    #[serde(deserialize_with = "units::whole_within::<_, _, 1, 65_535>")]
    #[arg(id = "retransmit.max_connections", long = "retransmit-max-connections", value_name = "N")]
    #[default(64)]
    pub max_connections: usize,
    /// Seconds a connection may ask nothing before it is closed.
    #[serde(deserialize_with = "units::seconds_within::<_, 1_000, 3_600_000>", serialize_with = "units::as_seconds")]
    #[arg(id = "retransmit.idle_timeout", long = "retransmit-idle-timeout", value_name = "DURATION", value_parser = units::parse_duration)]
    #[default(Duration::from_secs(60))]
    pub idle_timeout: Duration,
    /// Seconds the service stays up after the end of the stream, for the tail's gaps.
    #[serde(deserialize_with = "units::seconds_within::<_, 0, 3_600_000>", serialize_with = "units::as_seconds")]
    #[arg(id = "retransmit.linger", long = "retransmit-linger", value_name = "DURATION", value_parser = units::parse_duration)]
    #[default(Duration::from_secs(2))]
    pub linger: Duration,
    /// Keep the state of the stream (books, status, day aggregates) and send it to UDP and
    /// multicast subscribers that join with a snapshot.
    #[arg(id = "retransmit.snapshots", long = "retransmit-snapshots", value_name = "BOOL", action = clap::ArgAction::Set)]
    #[default(true)]
    pub snapshots: bool,
}

/// Where segments come from, checked.
#[derive(Debug, Clone, PartialEq)]
pub enum Source {
    /// A capture file.
    Capture(PathBuf),
    /// A synthetic day.
    Synthetic(mdrelay_iex::synth::SynthConfig),
    /// A live feed.
    Live(Live),
    /// Another publisher's stream, over TCP.
    Upstream(Upstream),
    /// Another publisher's stream, from the NATS subject its `[nats]` output feeds.
    NatsUpstream(NatsUpstream),
}

/// An upstream publisher's NATS subject, checked.
#[derive(Debug, Clone, PartialEq)]
pub struct NatsUpstream {
    /// The servers' URLs.
    pub servers: Vec<String>,
    /// The subject.
    pub subject: String,
    /// The JetStream stream that stores it.
    pub stream: Option<String>,
    /// Replay the stream from its first frame first.
    pub from_start: bool,
    /// How long frames after a gap wait for its repair.
    pub repair_wait: Duration,
    /// How long the servers may stay out of reach, and the first frame in coming, at start.
    pub give_up_after: Duration,
    /// The upstream's frames carry a CRC-32C, checked on receipt.
    pub crc: bool,
    /// Credentials.
    pub auth: NatsAuth,
    /// CA file for TLS.
    pub tls_ca_file: Option<PathBuf>,
}

/// An upstream publisher, checked.
#[derive(Debug, Clone, PartialEq)]
pub struct Upstream {
    /// "host:port" of its TCP server; resolved at every attempt, so a name that moves is followed.
    pub connect: String,
    /// Time one connection attempt may take.
    pub connect_timeout: Duration,
    /// Time the upstream has to greet.
    pub handshake_timeout: Duration,
    /// Longest wait between attempts.
    pub reconnect_max: Duration,
    /// How long the upstream may stay out of reach before the relay ends with an error.
    pub give_up_after: Duration,
    /// Silence that counts as a lost connection (none: never).
    pub idle_timeout: Option<Duration>,
    /// The upstream's frames carry a CRC-32C, checked on receipt.
    pub crc: bool,
}

/// The publisher's settings, checked: every default that depends on another setting written in,
/// and what the check read from the key files. It reads as its [`Settings`].
#[derive(Debug, Clone)]
pub struct Config {
    /// The settings, resolved: the one source of what `--check` prints and a reload compares.
    pub settings: Settings,
    /// The source, of the kind its settings give.
    pub source: Source,
    /// The Prometheus endpoint, if any.
    pub metrics: Option<MetricsSettings>,
    /// Per-frame CRC-32C and encryption, with the key read.
    pub protection: ProtectionSettings,
}

impl std::ops::Deref for Config {
    type Target = Settings;

    fn deref(&self) -> &Settings {
        &self.settings
    }
}

// The loader is the one both programs share: bounded to 1 MiB, and on reload a regular file only.
use mdrelay_telemetry::config_file::toml_error_message;
pub use mdrelay_telemetry::config_file::{MAX_CONFIG_BYTES, Reading, read_text};

/// Reads a configuration file at start.
pub fn read_file(path: &Path) -> Result<Settings> {
    read_config(path, Reading::AtStart)
}

/// Reads a configuration file: at most [`MAX_CONFIG_BYTES`]; on reload, a regular file only.
pub fn read_config(path: &Path, reading: Reading) -> Result<Settings> {
    parse_text(path, &read_text(path, reading)?)
}

/// Parses the text of the configuration file `path`; errors name the file, line and key.
pub fn parse_text(path: &Path, text: &str) -> Result<Settings> {
    toml::from_str(text).map_err(|e| anyhow::anyhow!("{}: {}", path.display(), toml_error_message(&e)))
}

/// A failed check's error with the origin of the setting it names (`pacing.rate (--rate): ...`,
/// `tcp.queue (pub.toml, line 7): ...`); an error naming no setting given keeps the file's name.
pub fn name_origin(error: anyhow::Error, origins: &BTreeMap<String, String>, file: Option<&Path>) -> anyhow::Error {
    let message = format!("{error:#}");
    if let Some((key, rest)) = message.split_once(": ") {
        if key.contains(" (") {
            // Named with its origin already, as it was read.
            return error;
        }
        // "udp.destinations[0]" is written in the file as part of "udp.destinations".
        let base = key.split('[').next().unwrap_or(key);
        if let Some(origin) = origins.get(base) {
            return anyhow::anyhow!("{key} ({origin}): {rest}");
        }
    }
    match file {
        Some(path) => error.context(format!("in {}", path.display())),
        None => error,
    }
}

/// `v`, when it is a finite number from `low` to `high`; else an error naming the setting.
fn within(name: &str, v: f64, low: f64, high: f64, unit: &str) -> Result<f64> {
    if !(v.is_finite() && (low..=high).contains(&v)) {
        bail!("{name}: {v} is out of range: give a number from {low} to {high} {unit}");
    }
    Ok(v)
}

/// `v` seconds, from `low` to `high`, as a duration.
fn seconds(name: &str, v: f64, low: f64, high: f64) -> Result<Duration> {
    Ok(Duration::from_secs_f64(within(name, v, low, high, "seconds")?))
}

/// Most passes over the source `pacing.loops` takes (0 runs forever).
pub const MAX_LOOPS: u64 = 1_000_000_000;
/// Most messages `pacing.max_messages` takes (0: no limit): days at any rate the relay reaches.
pub const MAX_MESSAGE_LIMIT: u64 = 1_000_000_000_000;
/// Most messages in a synthetic day, about 50 full IEX days: the generator spreads them over the
/// 6.5 trading hours, microseconds apart at this bound; many more would crowd them into the same
/// nanosecond.
pub const MAX_SYNTHETIC_MESSAGES: u64 = 10_000_000_000;

/// A year in milliseconds: the longest time limit a setting takes (0 still means none where it
/// is allowed).
const YEAR_MS: u64 = 365 * 86_400_000;
/// Ten years in milliseconds: the longest a JetStream stream is asked to keep a message.
const TEN_YEARS_MS: u64 = 10 * YEAR_MS;
/// Most memory the shared TCP queue may be configured to hold.
const MAX_QUEUE_MEMORY: u64 = 16 << 30;
/// Largest coalescing budget: a TCP record's payload limit.
const MAX_COALESCE: u64 = mdrelay_proto::relay::MAX_RECORD as u64;
/// The longest duty cycle: segments go out at most this early.
const MAX_DUTY_CYCLE: f64 = 0.01;
/// Default bound of the retransmission ring.
pub const DEFAULT_RING_BYTES: usize = 64 << 20;
/// Largest ring that may be configured.
const MAX_RING_BYTES: u64 = 64 << 30;

impl Settings {
    /// Checks the rules that span settings, fills in the defaults that depend on other settings
    /// and reads the key files: the configuration the relay runs with. Every value is within its
    /// bounds once read, so none can fail (or panic) the relay after it has begun.
    pub fn check(mut self) -> Result<Config> {
        if let Some(core) = self.cpu.hot_core {
            mdrelay_telemetry::cpu::check_core("cpu.hot_core", core)?;
        }
        let source = self.source.check()?;
        self.pacing.check(self.profile)?;
        if let Some(tcp) = &self.tcp {
            tcp.check()?;
        }
        self.check_udp()?;
        if let Some(nats) = &mut self.nats {
            nats.check(self.stream)?;
        }
        if self.tcp.is_none() && !self.has_udp() && self.nats.is_none() {
            bail!(
                "no transport: configure [tcp], [udp] destinations, [multicast] or [nats] (or pass --tcp, --udp, --multicast)"
            );
        }
        let coalesce_bytes = self.batching.coalesce_bytes;
        if let Some(t) = &self.tcp {
            // The shared queue holds up to `queue` records of up to `coalesce_bytes` each, or runs
            // of small records of about MAX_RUN_BYTES.
            let item = coalesce_bytes.max(mdrelay_proto::relay::MAX_RUN_BYTES) as u64;
            let most = (t.queue as u64).saturating_mul(item);
            if most > MAX_QUEUE_MEMORY {
                bail!(
                    "tcp.queue: {} records of up to {coalesce_bytes} bytes (batching.coalesce_bytes) could hold {} GiB; lower one of them",
                    t.queue,
                    most >> 30
                );
            }
        }
        if self.retransmit.listen.is_some() && self.retransmit.ring_bytes == 0 {
            bail!("retransmit.listen: the service needs the ring; give retransmit.ring_bytes above 0");
        }
        let metrics = self.metrics.clone().check(None, None)?;
        // The hold, when left out, is written as the value it takes.
        self.metrics = MetricsSection::from(metrics);
        let mut listeners = own_listeners(self.tcp.as_ref(), &self.retransmit);
        listeners.extend(metrics.map(|m| ("metrics.listen", m.listen)));
        for (i, (setting, addr)) in listeners.iter().enumerate() {
            if let Some((other, taken)) = listeners[..i].iter().find(|(_, taken)| same_port(*addr, *taken)) {
                bail!("{setting}: {addr} takes the port of {other} ({taken}); give each server its own port");
            }
        }
        let key_file = self.protection.key_file.clone();
        let key = key_file
            .as_deref()
            .map(|path| mdrelay_client::read_key_file(path).map_err(|e| anyhow::anyhow!("protection.key_file: {e}")))
            .transpose()?;
        let protection = ProtectionSettings { crc: self.protection.crc, key, key_file };
        if matches!(source, Source::Upstream(_) | Source::NatsUpstream(_)) {
            // Subscribers refuse an encrypted session older than the one they follow (a replay);
            // that needs sessions that grow, which an origin's start time is and an upstream's
            // session, kept by the relay, need not be.
            if protection.key.is_some() {
                bail!(
                    "protection.key_file: a relay keeps its upstream's session, and encryption needs sessions of its own; encrypt at the origin's subscribers, or protect this relay's output with `crc` only"
                );
            }
            if self.pacing.mode != PacingMode::TopSpeed {
                bail!(
                    "pacing.mode: an upstream's frames go out as they arrive, with the origin's publish times; leave pacing.mode out (or top-speed)"
                );
            }
        }
        if let Source::Upstream(upstream) = &source {
            // A literal address can be checked now; a host name is checked once resolved.
            if let Ok(addr) = upstream.connect.parse::<SocketAddr>() {
                check_not_self(addr, &own_listeners(self.tcp.as_ref(), &self.retransmit))?;
            }
        }
        Ok(Config { settings: self, source, metrics, protection })
    }

    /// Whether any UDP output is configured: unicast destinations or a multicast line.
    pub fn has_udp(&self) -> bool {
        self.udp.is_some() || self.multicast.is_some()
    }

    /// The largest datagram any UDP output builds (the check writes it into each).
    pub fn max_datagram(&self) -> usize {
        let given = self.udp.as_ref().and_then(|u| u.max_datagram);
        given.or(self.multicast.as_ref().and_then(|m| m.max_datagram)).unwrap_or(DEFAULT_MAX_DATAGRAM)
    }

    /// The UDP outputs, checked: unicast destinations and the two multicast lines. Line B's TTL
    /// and loopback left out are line A's, and the one datagram limit of them all is written to
    /// the unicast output and line A (line B's is left out: it is line A's).
    fn check_udp(&mut self) -> Result<()> {
        let mut max_datagram = DEFAULT_MAX_DATAGRAM;
        if let Some(u) = &self.udp {
            for (i, addr) in u.destinations.iter().enumerate() {
                if addr.ip().is_multicast() {
                    bail!("udp.destinations[{i}]: {addr} is a multicast address; put it in [multicast] group instead");
                }
            }
            max_datagram = u.max_datagram.unwrap_or(max_datagram);
        }
        let mut line_a = (1, true);
        for (name, line) in [("multicast", &mut self.multicast), ("multicast_b", &mut self.multicast_b)] {
            let Some(m) = line else { continue };
            if !m.group.ip().is_multicast() {
                bail!("{name}.group: {} is not a multicast address (224.0.0.0/4, e.g. 239.255.0.1)", m.group.ip());
            }
            if !matches!(m.group.ip(), IpAddr::V4(_)) {
                bail!("{name}.group: only IPv4 groups are supported");
            }
            max_datagram = m.max_datagram.unwrap_or(max_datagram);
            let ttl = *m.ttl.get_or_insert(line_a.0);
            if ttl > 255 {
                bail!("{name}.ttl: {ttl} is out of range: give a whole number from 0 to 255");
            }
            line_a = (ttl, *m.loopback.get_or_insert(line_a.1));
        }
        match (&self.multicast, &self.multicast_b) {
            (None, Some(_)) => bail!("multicast_b: line B needs line A: configure [multicast] too"),
            (Some(a), Some(b)) if a.group == b.group => {
                bail!("multicast_b.group: {} is line A's group too; give line B its own group", b.group)
            }
            _ => {}
        }
        // Room for the relay header and the smallest frame.
        let most = mdrelay_proto::relay::MAX_DATAGRAM;
        if !(64..=most).contains(&max_datagram) {
            bail!("max_datagram: {max_datagram} is out of range: give a whole number from 64 to {most}");
        }
        if self.udp.as_ref().is_some_and(|u| u.destinations.is_empty()) {
            self.udp = None;
        }
        for output in
            [self.udp.as_mut().map(|u| &mut u.max_datagram), self.multicast.as_mut().map(|m| &mut m.max_datagram)]
                .into_iter()
                .flatten()
        {
            *output = Some(max_datagram);
        }
        if let Some(b) = &mut self.multicast_b {
            b.max_datagram = None;
        }
        Ok(())
    }
}

/// The largest datagram built when no UDP output sets one: an Ethernet frame's payload less the
/// IP and UDP headers.
const DEFAULT_MAX_DATAGRAM: usize = 1472;

impl SourceSection {
    /// The source given, checked: one kind at most, a synthetic day when none (written in as
    /// such).
    fn check(&mut self) -> Result<Source> {
        let chosen = usize::from(self.capture.is_some())
            + usize::from(self.synthetic.is_some())
            + usize::from(self.live.is_some())
            + usize::from(self.upstream.is_some());
        if chosen > 1 {
            bail!("source: give one of capture, synthetic, live or upstream, not {chosen}");
        }
        if let Some(path) = &self.capture {
            return Ok(Source::Capture(path.clone()));
        }
        if let Some(upstream) = &mut self.upstream {
            return if upstream.nats.is_some() {
                nats_upstream_source(upstream).map(Source::NatsUpstream)
            } else {
                upstream_source(upstream).map(Source::Upstream)
            };
        }
        if let Some(live) = &self.live {
            live.check()?;
            return Ok(Source::Live(*live));
        }
        let day = self.synthetic.get_or_insert_default().day();
        // The generator checks its own limits (symbols, the fewest messages a day needs).
        mdrelay_iex::synth::SyntheticDay::new(day).context("source.synthetic")?;
        Ok(Source::Synthetic(day))
    }
}

impl Live {
    /// A group that is one, and no group given as the address to listen on.
    fn check(&self) -> Result<()> {
        if let Some(g) = self.group
            && !g.is_multicast()
        {
            bail!("source.live.group: {g} is not a multicast address (224.0.0.0/4); for unicast leave group out");
        }
        if self.group.is_none() && self.listen.ip().is_multicast() {
            bail!(
                "source.live.listen: {} is a multicast address; put the group in source.live.group and listen on 0.0.0.0:PORT",
                self.listen
            );
        }
        Ok(())
    }
}

impl Pacing {
    /// The fractional settings within their bounds; the idle strategy and duty cycle left out
    /// are written in as `profile`'s.
    fn check(&mut self, profile: Profile) -> Result<()> {
        within("pacing.speed", self.speed, 0.001, 1e6, "(times the capture's pace)")?;
        within("pacing.rate", self.rate, 1.0, 1e9, "messages per second")?;
        self.idle = Some(self.idle(profile));
        let duty_cycle = self.duty_cycle.unwrap_or_else(|| mdrelay_runtime::idle::duty_cycle(profile).as_secs_f64());
        self.duty_cycle = Some(within("pacing.duty_cycle", duty_cycle, 0.0, MAX_DUTY_CYCLE, "seconds")?);
        Ok(())
    }
}

impl Tcp {
    /// A unicast address, and no more subscribers awaited than may connect.
    fn check(&self) -> Result<()> {
        if self.listen.ip().is_multicast() {
            bail!("tcp.listen: {} is a multicast address; TCP needs a unicast address", self.listen);
        }
        if self.wait_subscribers > self.max_connections {
            bail!(
                "tcp.wait_subscribers: {} is more than tcp.max_connections ({}) allows",
                self.wait_subscribers,
                self.max_connections
            );
        }
        Ok(())
    }
}

/// The addresses this publisher listens on, by setting: a relay must not take its stream from them.
pub fn own_listeners(tcp: Option<&Tcp>, retransmit: &Retransmit) -> Vec<(&'static str, SocketAddr)> {
    let tcp = tcp.map(|t| ("tcp.listen", t.listen));
    tcp.into_iter().chain(retransmit.listen.map(|l| ("retransmit.listen", l))).collect()
}

/// Whether two TCP servers' addresses would take the same port: the same port (not 0, which the
/// system chooses) on the same address, or on the unspecified address, which covers them all.
fn same_port(a: SocketAddr, b: SocketAddr) -> bool {
    a.port() == b.port() && a.port() != 0 && (a.ip() == b.ip() || a.ip().is_unspecified() || b.ip().is_unspecified())
}

/// Refuses an upstream address that is one of this publisher's own servers (`own`, by setting): a
/// relay taking its own stream would wait for itself.
pub fn check_not_self(upstream: SocketAddr, own: &[(&str, SocketAddr)]) -> anyhow::Result<()> {
    for (setting, listen) in own {
        let same_host = upstream.ip() == listen.ip()
            || listen.ip().is_unspecified()
            || (upstream.ip().is_loopback() && listen.ip().is_loopback());
        if listen.port() != 0 && upstream.port() == listen.port() && same_host {
            anyhow::bail!(
                "source.upstream.connect: {upstream} is this publisher's own {setting} ({listen}); a relay cannot take its own stream"
            );
        }
    }
    Ok(())
}

/// `[source.upstream]` with `nats`, checked: servers, a subject, and bounded waits; the TCP
/// settings refused by name. The NATS settings left out are filled in.
fn nats_upstream_source(u: &mut UpstreamSection) -> Result<NatsUpstream> {
    let tcp_only = [
        ("connect", !u.connect.trim().is_empty()),
        ("connect_timeout", u.connect_timeout.is_some()),
        ("handshake_timeout", u.handshake_timeout.is_some()),
        ("reconnect_max", u.reconnect_max.is_some()),
        ("idle_timeout", u.idle_timeout.is_some()),
    ];
    if let Some((setting, _)) = tcp_only.iter().find(|(_, set)| *set) {
        bail!(
            "source.upstream.{setting}: a TCP upstream's setting, and source.upstream.nats makes this a NATS upstream; give one of connect and nats"
        );
    }
    let servers: Vec<String> = u.nats.iter().flatten().map(|s| s.trim().to_string()).collect();
    if servers.is_empty() {
        bail!("source.upstream.nats: the list is empty; give the servers' URLs (e.g. [\"nats://10.0.0.1:4222\"])");
    }
    for url in &servers {
        if url.parse::<async_nats::ServerAddr>().is_err() {
            bail!("source.upstream.nats: {url:?} is not a server URL (nats://host:port)");
        }
    }
    let subject = u.subject.as_deref().map(str::trim).unwrap_or_default().to_string();
    if subject.is_empty() || subject.contains(['*', '>', ' ']) {
        bail!(
            "source.upstream.subject: {subject:?} is not a subject to take a stream from; give the upstream's nats.subject (e.g. \"mdrelay.1\"), without wildcards"
        );
    }
    let stream = u.stream.as_deref().map(str::trim).filter(|s| !s.is_empty()).map(str::to_string);
    let from_start = *u.from_start.get_or_insert(false);
    if from_start && stream.is_none() {
        bail!("source.upstream.from_start: the replay is from the JetStream stream; give source.upstream.stream");
    }
    let repair_wait = *u.repair_wait.get_or_insert(if stream.is_some() { 2.0 } else { 0.0 });
    (u.nats, u.subject, u.stream) = (Some(servers.clone()), Some(subject.clone()), stream.clone());
    Ok(NatsUpstream {
        servers,
        subject,
        stream,
        from_start,
        repair_wait: Duration::from_secs_f64(within(
            "source.upstream.repair_wait",
            repair_wait,
            0.0,
            600.0,
            "seconds",
        )?),
        give_up_after: u.give_up_after,
        crc: u.crc,
        auth: nats_auth(
            "source.upstream",
            u.creds_file.clone(),
            u.nkey_file.clone(),
            u.user.clone(),
            u.password_file.clone(),
        )?,
        tls_ca_file: u.tls_ca_file.clone(),
    })
}

/// `[source.upstream]`, checked: an address to connect to, and bounded waits. The TCP settings
/// left out are filled in.
fn upstream_source(u: &mut UpstreamSection) -> Result<Upstream> {
    let nats_only = [
        ("subject", u.subject.is_some()),
        ("stream", u.stream.is_some()),
        ("from_start", u.from_start.is_some()),
        ("repair_wait", u.repair_wait.is_some()),
        ("creds_file", u.creds_file.is_some()),
        ("nkey_file", u.nkey_file.is_some()),
        ("user", u.user.is_some()),
        ("password_file", u.password_file.is_some()),
        ("tls_ca_file", u.tls_ca_file.is_some()),
    ];
    if let Some((setting, _)) = nats_only.iter().find(|(_, set)| *set) {
        bail!("source.upstream.{setting}: only used with a NATS upstream (source.upstream.nats), and this one is TCP");
    }
    let connect = u.connect.trim().to_string();
    let (host, port) = connect.rsplit_once(':').with_context(|| {
        format!("source.upstream.connect: {connect:?} has no port; give host:port (e.g. 10.0.0.1:9100)")
    })?;
    if host.is_empty() || !port.parse::<u16>().is_ok_and(|p| p != 0) {
        bail!("source.upstream.connect: {connect:?} is not host:port with a port from 1 to 65535");
    }
    if let Ok(addr) = connect.parse::<SocketAddr>()
        && (addr.ip().is_unspecified() || addr.ip().is_multicast())
    {
        bail!("source.upstream.connect: {} is not an address to connect to; give the upstream host's", addr.ip());
    }
    u.connect.clone_from(&connect);
    let idle = within(
        "source.upstream.idle_timeout",
        *u.idle_timeout.get_or_insert(0.0),
        0.0,
        86_400.0,
        "seconds (0: never)",
    )?;
    Ok(Upstream {
        connect,
        connect_timeout: seconds(
            "source.upstream.connect_timeout",
            *u.connect_timeout.get_or_insert(5.0),
            0.01,
            300.0,
        )?,
        handshake_timeout: seconds(
            "source.upstream.handshake_timeout",
            *u.handshake_timeout.get_or_insert(5.0),
            0.01,
            300.0,
        )?,
        reconnect_max: seconds("source.upstream.reconnect_max", *u.reconnect_max.get_or_insert(2.0), 0.01, 60.0)?,
        give_up_after: u.give_up_after,
        idle_timeout: (idle > 0.0).then(|| Duration::from_secs_f64(idle)),
        crc: u.crc,
    })
}

impl Config {
    /// The settings that differ between `self` and `new` and take effect only at a restart: every
    /// key of the resolved configuration but `format`, so a setting added later is covered too.
    pub fn restart_required(&self, new: &Config) -> Vec<String> {
        let (old, new) = (self.to_table(), new.to_table());
        mdrelay_telemetry::settings::changed_keys(&old, &new).into_iter().filter(|key| key != "format").collect()
    }

    /// The resolved settings as a table, every setting written out, defaults too: what
    /// `--check` prints, and what a reload compares.
    pub fn to_table(&self) -> toml::Table {
        match toml::Table::try_from(&self.settings) {
            Ok(table) => table,
            // Every field is a string, number, boolean, path or a table of them.
            Err(error) => unreachable!("a configuration is TOML: {error}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A transport for the configurations of the tests.
    const TCP: &str = "[tcp]\nlisten = \"127.0.0.1:0\"\n";

    /// The configuration of the file `text`, read and checked as the program does.
    fn checked(text: &str) -> Result<Config> {
        use mdrelay_telemetry::settings::{Layered, field_names};
        let keys = field_names::<Settings>();
        Layered::from_text(Path::new("pub.toml"), text, &[])?.extract::<Settings>(keys)?.check()
    }

    /// The error of checking `[source.upstream]` given as `upstream` (TOML lines).
    fn upstream_error(upstream: &str) -> String {
        format!("{:#}", checked(&format!("{TCP}[source.upstream]\n{upstream}\n")).unwrap_err())
    }

    #[test]
    fn the_nats_queues_bytes_and_id_key_are_checked_and_named() {
        let nats = |keys: &str| -> Result<Nats> {
            Ok(checked(&format!("[nats]\n{keys}\n"))?.settings.nats.expect("a NATS output"))
        };
        let defaults = nats("").unwrap();
        assert_eq!((defaults.queue_bytes, defaults.id_key.is_none()), (NATS_QUEUE_BYTES, true));
        assert_eq!(nats("queue_bytes = \"16 MiB\"").unwrap().queue_bytes, 16 << 20);
        let e = format!("{:#}", nats("queue_bytes = 1000").unwrap_err());
        assert!(e.contains("nats.queue_bytes") && e.contains("1000"), "{e}");
        let dir = tempfile::tempdir().unwrap();
        let key = dir.path().join("ids.key");
        std::fs::write(&key, "ab".repeat(32)).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
        let given = format!("id_key_file = \"{}\"", key.display());
        let e = format!("{:#}", nats(&given).unwrap_err());
        assert!(e.contains("nats.id_key_file") && e.contains("chmod 600"), "a key others can read: {e}");
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
        let read = nats(&given).unwrap();
        assert_eq!(read.id_key, Some(WireKey::new([0xab; 32])));
        let written = toml::Table::try_from(read_back_nats(&given)).unwrap();
        assert_eq!(
            written.get("id_key_file").and_then(|v| v.as_str()),
            Some(key.to_str().unwrap()),
            "the file, never the key"
        );
        let e = format!("{:#}", nats("id_key_file = \"/nonexistent/ids.key\"").unwrap_err());
        assert!(e.contains("nats.id_key_file") && e.contains("/nonexistent/ids.key"), "{e}");
    }

    /// The `[nats]` section a configuration with the `[nats]` keys `keys` writes out.
    fn read_back_nats(keys: &str) -> Nats {
        checked(&format!("[nats]\n{keys}\n")).unwrap().settings.nats.unwrap()
    }

    #[test]
    fn a_nats_upstream_is_checked_and_its_mistakes_are_named() {
        let config = checked(&format!(
            "{TCP}[source.upstream]\nnats = [\"nats://10.0.0.1:4222\"]\nsubject = \"md.1\"\nstream = \"MD\"\n"
        ));
        let Source::NatsUpstream(u) = config.unwrap().source else { panic!("not a NATS upstream") };
        assert_eq!((u.subject.as_str(), u.stream.as_deref(), u.from_start), ("md.1", Some("MD"), false));
        assert_eq!(u.repair_wait, Duration::from_secs(2), "a stream to repair from: frames wait for it");
        let nats = "nats = [\"nats://h:4222\"]\nsubject = \"md.1\"";
        let e = upstream_error(&format!("{nats}\nconnect = \"h:9100\""));
        assert!(e.contains("source.upstream.connect") && e.contains("nats"), "{e}");
        let e = upstream_error(&format!("{nats}\nreconnect_max = 1"));
        assert!(e.contains("source.upstream.reconnect_max"), "{e}");
        let e = upstream_error(&format!("{nats}\nfrom_start = true"));
        assert!(e.contains("source.upstream.from_start") && e.contains("source.upstream.stream"), "{e}");
        let e = upstream_error("nats = [\"nats://h:4222\"]\nsubject = \"md.>\"");
        assert!(e.contains("source.upstream.subject"), "{e}");
        let e = upstream_error("nats = []\nsubject = \"md.1\"");
        assert!(e.contains("source.upstream.nats"), "{e}");
        let e = upstream_error("connect = \"h:9100\"\nstream = \"MD\"");
        assert!(e.contains("source.upstream.stream") && e.contains("TCP"), "{e}");
        let e = upstream_error(&format!("{nats}\n[protection]\nkey_file = \"/k\""));
        assert!(e.contains("protection.key_file"), "{e}");
        // Credentials: one kind, each key named; TCP has none.
        let e = upstream_error(&format!("{nats}\nuser = \"feed\""));
        assert!(e.contains("source.upstream.user") && e.contains("password"), "{e}");
        let e = upstream_error(&format!("{nats}\nnkey_file = \"/n\"\ncreds_file = \"/c\""));
        assert!(e.contains("source.upstream.creds_file: give one kind of credentials"), "{e}");
        let e = upstream_error("connect = \"h:9100\"\ntls_ca_file = \"/ca.pem\"");
        assert!(e.contains("source.upstream.tls_ca_file") && e.contains("TCP"), "{e}");
        let config = checked(&format!(
            "{TCP}[source.upstream]\n{nats}\nuser = \"feed\"\npassword_file = \"/p\"\ntls_ca_file = \"/ca.pem\"\n"
        ));
        let Source::NatsUpstream(u) = config.unwrap().source else { panic!("not a NATS upstream") };
        assert_eq!(u.auth, NatsAuth::UserPassword("feed".into(), "/p".into()));
        assert_eq!(u.tls_ca_file.as_deref(), Some(Path::new("/ca.pem")));
    }

    #[test]
    fn the_resolved_settings_read_back_as_themselves() {
        // One configuration per kind of default filled in by the check: the source, the profile's
        // pacing, NATS names from the stream number, line B from line A, an upstream's kind.
        for text in [
            "[tcp]\n",
            "profile = \"low-latency\"\nstream = 7\n[nats]\n[metrics]\nlisten = \"127.0.0.1:9900\"\n",
            "[udp]\ndestinations = [\"127.0.0.1:9400\"]\n[multicast]\ngroup = \"239.255.1.1:9300\"\nttl = 3\n\
             [multicast_b]\ngroup = \"239.255.1.2:9300\"\nmax_datagram = 1200\n",
            "[tcp]\n[source.live]\nlisten = \"0.0.0.0:10378\"\ngroup = \"239.255.21.4\"\n",
            "[tcp]\n[source.upstream]\nconnect = \" 10.0.0.1:9100 \"\n",
            "[tcp]\n[source.upstream]\nnats = [\"nats://h:4222\"]\nsubject = \"md.1\"\nstream = \"MD\"\n",
        ] {
            let resolved = checked(text).unwrap_or_else(|e| panic!("{text}: {e:#}")).to_table();
            let again = checked(&toml::to_string(&resolved).unwrap()).unwrap();
            assert_eq!(again.to_table(), resolved, "{text}");
        }
    }

    #[test]
    fn its_own_servers_are_not_an_upstream() {
        let own =
            [("tcp.listen", "0.0.0.0:9100".parse().unwrap()), ("retransmit.listen", "127.0.0.1:9101".parse().unwrap())];
        let e = check_not_self("127.0.0.1:9100".parse().unwrap(), &own).unwrap_err().to_string();
        assert!(e.contains("source.upstream.connect") && e.contains("tcp.listen"), "{e}");
        assert!(check_not_self("127.0.0.2:9101".parse().unwrap(), &own).is_err(), "loopback is one host");
        assert!(check_not_self("10.0.0.1:9101".parse().unwrap(), &own).is_ok());
        assert!(check_not_self("10.0.0.1:9102".parse().unwrap(), &own).is_ok());
        assert!(
            check_not_self("127.0.0.1:9100".parse().unwrap(), &[("tcp.listen", "127.0.0.1:0".parse().unwrap())])
                .is_ok()
        );
    }
}
