//! The publisher's configuration: a TOML file, every setting overridable by a flag.
//!
//! Each setting is one field of [`FileConfig`]'s sections, and the section's `Default` is its
//! default; a field stays an `Option` where none means off, or where its default is another
//! setting's (the profile's idle strategy, line A's TTL for line B). The file, the flags and
//! the environment are laid by `mdrelay_telemetry::settings::Layered` (see `run.rs`), then
//! [`FileConfig::check`] checks the values, fills in those other-setting defaults and derives
//! the [`Config`] the relay runs with, keeping the settings so resolved: what `--check` prints
//! and a reload compares.
//!
//! Unknown keys are refused with the key, its line and the nearest known key; values are checked
//! at start and errors name the setting and its origin, so a bad file fails before anything is
//! sent.

use anyhow::{Context, Result, bail};
use mdrelay_proto::codec::Format;
use mdrelay_proto::idle::{IdleStrategy, Profile};
use mdrelay_proto::relay::{ProtectionSection, ProtectionSettings, WireKey};
use mdrelay_telemetry::prometheus::{MetricsSection, MetricsSettings};
use mdrelay_telemetry::units;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The whole configuration file, and the settings it amounts to once the flags are applied and
/// checked ([`Config::settings`]): every key missing from the file takes its field's default.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct FileConfig {
    /// default or low-latency: the idle strategy and core pinning unless set explicitly.
    pub profile: Profile,
    /// Wire format: raw, sbe, flatbuffers, capnp, capnp-packed, protobuf, brec or json.
    pub format: Format,
    /// Stream number announced in the TCP greeting.
    pub stream: u32,
    /// Where segments come from.
    pub source: SourceSection,
    /// When segments are sent.
    pub pacing: PacingSection,
    /// How frames are grouped.
    pub batching: BatchingSection,
    /// TCP server.
    pub tcp: Option<TcpSection>,
    /// UDP unicast.
    pub udp: Option<UdpSection>,
    /// UDP multicast.
    pub multicast: Option<MulticastSection>,
    /// A second multicast line (B): every datagram is sent to both groups.
    pub multicast_b: Option<MulticastSection>,
    /// A NATS subject, stored in a JetStream stream.
    pub nats: Option<NatsSection>,
    /// The retransmission ring and service.
    pub retransmit: RetransmitSection,
    /// Threads, and where the hot one runs.
    pub cpu: CpuSection,
    /// The Prometheus endpoint; left out of a resolved configuration when there is none.
    #[serde(skip_serializing_if = "MetricsSection::is_off")]
    pub metrics: MetricsSection,
    /// Per-frame CRC-32C and encryption.
    pub protection: ProtectionSection,
}

impl Default for FileConfig {
    fn default() -> FileConfig {
        FileConfig {
            profile: Profile::default(),
            format: Format::Sbe,
            stream: 1,
            source: SourceSection::default(),
            pacing: PacingSection::default(),
            batching: BatchingSection::default(),
            tcp: None,
            udp: None,
            multicast: None,
            multicast_b: None,
            nats: None,
            retransmit: RetransmitSection::default(),
            cpu: CpuSection::default(),
            metrics: MetricsSection::default(),
            protection: ProtectionSection::default(),
        }
    }
}

/// `[cpu]`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct CpuSection {
    /// Pin the hot thread (`mdrelay-pub-hot`) to this CPU (none: the scheduler's choice).
    pub hot_core: Option<usize>,
    /// Threads serving subscribers' sockets (`mdrelay-pub-io`).
    pub io_threads: usize,
}

impl Default for CpuSection {
    fn default() -> CpuSection {
        CpuSection { hot_core: None, io_threads: 1 }
    }
}

/// `[source]`: exactly one of `capture`, `synthetic`, `live`, `upstream` (default: a synthetic
/// day).
#[derive(Debug, Clone, Deserialize, Serialize, Default)]
#[serde(deny_unknown_fields)]
pub struct SourceSection {
    /// A capture file (pcap / pcapng, gzipped or not).
    pub capture: Option<PathBuf>,
    /// A synthetic day generated on the fly.
    pub synthetic: Option<SyntheticSection>,
    /// A live IEX-TP feed on UDP.
    pub live: Option<LiveSection>,
    /// Another mdrelay publisher's stream, over TCP or from a NATS subject (relay chaining).
    pub upstream: Option<UpstreamSection>,
}

/// `[source.upstream]`: another publisher's stream, which this one re-publishes: its TCP server
/// (`connect`), or the NATS subject its `[nats]` output feeds (`nats` and `subject`). The
/// settings of one kind only are options: one of the other kind given is refused by name, and
/// the check fills in the defaults of its own kind.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct UpstreamSection {
    /// The upstream publisher's TCP server, "host:port".
    pub connect: String,
    /// NATS: the servers' URLs ("nats://host:port"), instead of `connect`.
    pub nats: Option<Vec<String>>,
    /// NATS: the subject the upstream's `[nats]` output publishes to.
    pub subject: Option<String>,
    /// NATS: the JetStream stream that stores the subject (the upstream's `nats.stream`): gaps
    /// are repaired from it where the client can, and `from_start` replays it.
    pub stream: Option<String>,
    /// NATS: replay the stream from its first frame before taking the subject live.
    pub from_start: Option<bool>,
    /// NATS: seconds frames after a gap wait for it to be repaired before going on without it
    /// (0: never wait; default 2 with a `stream`, 0 without).
    #[serde(default, deserialize_with = "units::option_seconds")]
    pub repair_wait: Option<f64>,
    /// Seconds one connection attempt may take.
    #[serde(default, deserialize_with = "units::option_seconds")]
    pub connect_timeout: Option<f64>,
    /// Seconds the upstream has to greet once connected.
    #[serde(default, deserialize_with = "units::option_seconds")]
    pub handshake_timeout: Option<f64>,
    /// Longest wait between attempts, seconds (the wait doubles from 0.1 s up to this).
    #[serde(default, deserialize_with = "units::option_seconds")]
    pub reconnect_max: Option<f64>,
    /// Seconds to keep trying to reach the upstream (at start, and after losing it) before the
    /// relay ends with an error (0: after the first failed attempt).
    #[serde(deserialize_with = "seconds_value")]
    pub give_up_after: f64,
    /// A connection silent this many seconds is lost, and made again (0: never).
    #[serde(default, deserialize_with = "units::option_seconds")]
    pub idle_timeout: Option<f64>,
    /// The upstream protects its frames with a CRC-32C (its `[protection] crc = true`): the
    /// relay checks every frame's, and an upstream protected otherwise is refused.
    pub crc: bool,
    /// NATS: a `.creds` file (JWT and nkey seed).
    pub creds_file: Option<PathBuf>,
    /// NATS: a file holding an nkey seed.
    pub nkey_file: Option<PathBuf>,
    /// NATS: user name, with `password_file`.
    pub user: Option<String>,
    /// NATS: a file holding the password of `user`.
    pub password_file: Option<PathBuf>,
    /// NATS: CA certificates (PEM) to check the servers' TLS certificates with; TLS is required
    /// when set.
    pub tls_ca_file: Option<PathBuf>,
}

impl Default for UpstreamSection {
    fn default() -> UpstreamSection {
        UpstreamSection {
            connect: String::new(),
            nats: None,
            subject: None,
            stream: None,
            from_start: None,
            repair_wait: None,
            connect_timeout: None,
            handshake_timeout: None,
            reconnect_max: None,
            give_up_after: 30.0,
            idle_timeout: None,
            crc: false,
            creds_file: None,
            nkey_file: None,
            user: None,
            password_file: None,
            tls_ca_file: None,
        }
    }
}

/// `[source.synthetic]`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct SyntheticSection {
    /// Messages in the day.
    pub messages: u64,
    /// Symbols.
    pub symbols: usize,
    /// Seed.
    pub seed: u64,
}

impl Default for SyntheticSection {
    fn default() -> SyntheticSection {
        let day = mdrelay_proto::synth::SynthConfig::default();
        SyntheticSection { messages: day.messages, symbols: day.symbols, seed: day.seed }
    }
}

/// `[source.live]`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct LiveSection {
    /// Address and port to receive on, e.g. "0.0.0.0:10378".
    pub listen: String,
    /// Multicast group to join, e.g. "239.255.21.4" (none: unicast).
    pub group: Option<String>,
    /// Interface address to join the group on (0.0.0.0: the kernel's choice).
    #[serde(default = "any_interface")]
    pub interface: String,
    /// Stop after this many seconds without a datagram (0: never).
    #[serde(default, deserialize_with = "seconds_value")]
    pub idle_timeout: f64,
}

/// The default interface of a group's join or send: 0.0.0.0, the system's choice.
fn any_interface() -> String {
    Ipv4Addr::UNSPECIFIED.to_string()
}

/// A number of seconds with or without units, as a file or flag writes it.
fn seconds_value<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<f64, D::Error> {
    Ok(units::Seconds::deserialize(deserializer)?.0)
}

/// A number of bytes with or without units, as the field's integer type.
fn bytes_value<'de, D: serde::Deserializer<'de>, T: TryFrom<u64>>(deserializer: D) -> Result<T, D::Error> {
    let units::Bytes(bytes) = units::Bytes::deserialize(deserializer)?;
    T::try_from(bytes).map_err(|_| serde::de::Error::custom(format!("{bytes} bytes is too large here")))
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
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct PacingSection {
    /// original, rate or top-speed.
    pub mode: PacingMode,
    /// Time scale for `original`: 2 is twice as fast, 0.5 half as fast.
    pub speed: f64,
    /// Messages per second for `rate`.
    pub rate: f64,
    /// Passes over the source (0: forever).
    pub loops: u64,
    /// Stop after this many messages (0: no limit).
    pub max_messages: u64,
    /// Stop after this many seconds (0: no limit).
    #[serde(deserialize_with = "seconds_value")]
    pub duration: f64,
    /// `original`: a wait longer than this many seconds (a jump in the capture's clock) is not
    /// waited out: the schedule starts again from the next segment.
    #[serde(deserialize_with = "seconds_value")]
    pub max_gap: f64,
    /// How the hot thread waits: spin, yield, backoff or sleep (default: the profile's).
    pub idle: Option<IdleStrategy>,
    /// Seconds of segments sent per wake-up: a segment due within this goes out early, with
    /// the one that woke the thread (default: the profile's).
    #[serde(default, deserialize_with = "units::option_seconds")]
    pub duty_cycle: Option<f64>,
}

impl Default for PacingSection {
    fn default() -> PacingSection {
        PacingSection {
            mode: PacingMode::default(),
            speed: 1.0,
            rate: 100_000.0,
            loops: 1,
            max_messages: 0,
            duration: 0.0,
            max_gap: 60.0,
            idle: None,
            duty_cycle: None,
        }
    }
}

/// `[batching]`.
#[derive(Debug, Clone, Deserialize, Serialize, Default)]
#[serde(default, deny_unknown_fields)]
pub struct BatchingSection {
    /// Coalesce frames into one TCP record / datagram up to this many bytes (0: one frame each).
    #[serde(deserialize_with = "bytes_value")]
    pub coalesce_bytes: usize,
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

/// `[tcp]`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct TcpSection {
    /// Address to listen on.
    pub listen: String,
    /// Records in the queue all subscribers read from; a subscriber this far behind is slow.
    pub queue: usize,
    /// drop, disconnect or block.
    pub slow_subscriber: SlowPolicy,
    /// Wait for this many subscribers before sending.
    pub wait_subscribers: usize,
    /// Connections at once, handshaking or subscribed; more are told to retry later.
    pub max_connections: usize,
    /// Seconds a connection has to answer the greeting.
    #[serde(deserialize_with = "seconds_value")]
    pub handshake_timeout: f64,
    /// Seconds subscribers get at the end of the stream to take what is queued for them.
    #[serde(deserialize_with = "seconds_value")]
    pub drain_timeout: f64,
    /// Bytes of replay records built and not yet written, over every resuming subscriber.
    #[serde(deserialize_with = "bytes_value")]
    pub replay_bytes: u64,
    /// Seconds a resuming subscriber has to take a replay chunk before it is cut off as slow.
    #[serde(deserialize_with = "seconds_value")]
    pub replay_timeout: f64,
}

impl Default for TcpSection {
    fn default() -> TcpSection {
        TcpSection {
            listen: DEFAULT_TCP_LISTEN.into(),
            queue: 65_536,
            slow_subscriber: SlowPolicy::default(),
            wait_subscribers: 0,
            max_connections: 64,
            handshake_timeout: 5.0,
            drain_timeout: 10.0,
            replay_bytes: 16 << 20,
            replay_timeout: 10.0,
        }
    }
}

/// `[udp]`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct UdpSection {
    /// Unicast destinations.
    pub destinations: Vec<String>,
    /// Largest datagram to build when coalescing, for every UDP output (a multicast line's, when
    /// given, wins; given nowhere, 1472); the check writes the limit in force here.
    #[serde(default, deserialize_with = "units::option_bytes")]
    pub max_datagram: Option<usize>,
}

/// `[multicast]`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct MulticastSection {
    /// Group and port, e.g. "239.255.0.1:9300".
    pub group: String,
    /// Interface address to send from (0.0.0.0: the routing table's choice).
    #[serde(default = "any_interface")]
    pub interface: String,
    /// Multicast TTL (default 1: this subnet; line B's default is line A's).
    pub ttl: Option<u32>,
    /// Deliver to receivers on this host too (default true; line B's default is line A's).
    pub loopback: Option<bool>,
    /// Largest datagram to build when coalescing.
    #[serde(default, deserialize_with = "units::option_bytes")]
    pub max_datagram: Option<usize>,
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
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct NatsSection {
    /// Server URLs of the cluster (none: `NATS_URL`'s, or nats://127.0.0.1:4222); the client fails
    /// over among them.
    pub servers: Option<Vec<String>>,
    /// Subject the stream goes to (none: `mdrelay.<stream>`).
    pub subject: Option<String>,
    /// JetStream stream that stores the subject (none: `MDRELAY_<stream>`).
    pub stream: Option<String>,
    /// Create the stream when it is missing; otherwise a missing stream is an error.
    pub create_stream: bool,
    /// file or memory, for a stream created here.
    pub storage: NatsStorage,
    /// limits or interest, for a stream created here.
    pub retention: NatsRetention,
    /// Copies of the stream in a cluster (1 to 5), for a stream created here.
    pub replicas: usize,
    /// Seconds a message is kept (0: no limit), for a stream created here.
    #[serde(deserialize_with = "seconds_value")]
    pub max_age: f64,
    /// Bytes the stream keeps at most (0: no limit), for a stream created here.
    #[serde(deserialize_with = "bytes_value")]
    pub max_bytes: u64,
    /// Seconds within which the server drops a message whose id it has seen (the same frame from
    /// a second publisher or a restarted one), for a stream created here.
    #[serde(deserialize_with = "seconds_value")]
    pub duplicate_window: f64,
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
    pub max_pending_acks: usize,
    /// Messages queued between the hot thread and the publishing task.
    pub queue: usize,
    /// Bytes of messages held for the server: queued, or published and not yet acknowledged.
    #[serde(deserialize_with = "bytes_value")]
    pub queue_bytes: u64,
    /// block, drop or fail when that queue is full (in messages or in bytes).
    pub slow_server: SlowServerPolicy,
    /// A file holding the key of the messages' ids (64 hex digits, mode 600); without it each run
    /// makes a key of its own. Relays of one origin that share it store each frame once.
    pub id_key_file: Option<PathBuf>,
    /// Largest message to build when coalescing, header included.
    #[serde(deserialize_with = "bytes_value")]
    pub max_message: usize,
}

impl Default for NatsSection {
    fn default() -> NatsSection {
        NatsSection {
            servers: None,
            subject: None,
            stream: None,
            create_stream: true,
            storage: NatsStorage::default(),
            retention: NatsRetention::default(),
            replicas: 1,
            max_age: 0.0,
            max_bytes: 0,
            duplicate_window: 120.0,
            creds_file: None,
            nkey_file: None,
            user: None,
            password_file: None,
            tls_ca_file: None,
            max_pending_acks: 4096,
            queue: 65_536,
            queue_bytes: NATS_QUEUE_BYTES,
            slow_server: SlowServerPolicy::default(),
            id_key_file: None,
            max_message: 64 << 10,
        }
    }
}

/// How the publisher authenticates to NATS: the client's, from the same four settings.
pub use mdrelay_client::NatsAuth;

/// The NATS output, checked.
#[derive(Debug, Clone, PartialEq)]
pub struct Nats {
    /// Server URLs.
    pub servers: Vec<String>,
    /// Subject.
    pub subject: String,
    /// JetStream stream.
    pub stream: String,
    /// Create the stream when missing.
    pub create_stream: bool,
    /// Storage of a created stream.
    pub storage: NatsStorage,
    /// Retention of a created stream.
    pub retention: NatsRetention,
    /// Replicas of a created stream.
    pub replicas: usize,
    /// Age limit of a created stream (zero: none).
    pub max_age: Duration,
    /// Byte limit of a created stream (0: none).
    pub max_bytes: u64,
    /// Deduplication window of a created stream.
    pub duplicate_window: Duration,
    /// Credentials.
    pub auth: NatsAuth,
    /// CA file for TLS.
    pub tls_ca_file: Option<PathBuf>,
    /// Unacknowledged messages at most.
    pub max_pending_acks: usize,
    /// Queue between the hot thread and the publishing task, in messages.
    pub queue: usize,
    /// Bytes of messages held for the server (queued, or awaiting acknowledgement), at most.
    pub queue_bytes: u64,
    /// What a full queue does.
    pub slow_server: SlowServerPolicy,
    /// The key of the messages' ids, when one is given (else each run makes its own).
    pub id_key: Option<WireKey>,
    /// Where that key came from.
    pub id_key_file: Option<PathBuf>,
    /// Largest coalesced message.
    pub max_message: usize,
}

/// The largest NATS message built: the datagram header counts its frames in one byte, and a
/// server's default `max_payload` is 1 MiB.
const MAX_NATS_MESSAGE: u64 = 1 << 20;

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

/// `[nats]`, checked; the servers, subject and stream it leaves out are filled in.
fn nats_output(n: &mut NatsSection, stream_number: u32) -> Result<Nats> {
    let servers = n.servers.get_or_insert_with(|| vec!["nats://127.0.0.1:4222".into()]).clone();
    if servers.is_empty() {
        bail!("nats.servers: give at least one server URL");
    }
    for (i, url) in servers.iter().enumerate() {
        if url.trim().is_empty() || url.contains(char::is_whitespace) {
            bail!("nats.servers[{i}]: {url:?} is not a server URL (nats://HOST:PORT)");
        }
    }
    let subject = n.subject.get_or_insert_with(|| format!("mdrelay.{stream_number}")).clone();
    let tokens_ok = !subject.is_empty() && subject.split('.').all(|t| !t.is_empty() && t != "*" && t != ">");
    if !tokens_ok || subject.contains(char::is_whitespace) {
        bail!(
            "nats.subject: {subject:?} is not a subject to publish to (dot-separated tokens, no wildcards or spaces)"
        );
    }
    let stream = n.stream.get_or_insert_with(|| format!("MDRELAY_{stream_number}")).clone();
    if stream.is_empty() || stream.contains(['.', '*', '>', ' ', '\t', '/', '\\']) {
        bail!("nats.stream: {stream:?} is not a JetStream stream name (no dots, wildcards, spaces or slashes)");
    }
    let auth = nats_auth("nats", n.creds_file.clone(), n.nkey_file.clone(), n.user.clone(), n.password_file.clone())?;
    let max_message = count_within("nats.max_message", n.max_message as u64, 64, MAX_NATS_MESSAGE)? as usize;
    Ok(Nats {
        servers,
        subject,
        stream,
        create_stream: n.create_stream,
        storage: n.storage,
        retention: n.retention,
        replicas: count_within("nats.replicas", n.replicas as u64, 1, 5)? as usize,
        max_age: seconds("nats.max_age", n.max_age, 0.0, 10.0 * YEAR)?,
        max_bytes: n.max_bytes,
        duplicate_window: seconds("nats.duplicate_window", n.duplicate_window, 0.001, YEAR)?,
        auth,
        tls_ca_file: n.tls_ca_file.clone(),
        max_pending_acks: count_within("nats.max_pending_acks", n.max_pending_acks as u64, 1, 1 << 20)? as usize,
        queue: count_within("nats.queue", n.queue as u64, 16, 1 << 22)? as usize,
        queue_bytes: count_within("nats.queue_bytes", n.queue_bytes, 64 << 10, 1 << 40)?,
        slow_server: n.slow_server,
        max_message,
        id_key: n
            .id_key_file
            .as_deref()
            .map(|path| WireKey::read_file(path).map_err(|e| anyhow::anyhow!("nats.id_key_file: {e}")))
            .transpose()?,
        id_key_file: n.id_key_file.clone(),
    })
}

/// `[retransmit]`: the ring of the last frames (for TCP resume and retransmission requests) and
/// the retransmission service for UDP subscribers.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct RetransmitSection {
    /// Bytes the ring may hold, frames and their bookkeeping (0: no ring, so no resume and no
    /// retransmission).
    #[serde(deserialize_with = "bytes_value")]
    pub ring_bytes: u64,
    /// Serve retransmission requests over TCP on this address (none: no service).
    pub listen: Option<String>,
    /// Frames one request is served at most.
    pub max_range: u32,
    /// Requests per second per connection (with a burst of as many).
    pub requests_per_second: u32,
    /// Connections to the service at once.
    pub max_connections: usize,
    /// Seconds a connection may ask nothing before it is closed.
    #[serde(deserialize_with = "seconds_value")]
    pub idle_timeout: f64,
    /// Seconds the service stays up after the end of the stream, for the tail's gaps.
    #[serde(deserialize_with = "seconds_value")]
    pub linger: f64,
}

impl Default for RetransmitSection {
    fn default() -> RetransmitSection {
        RetransmitSection {
            ring_bytes: DEFAULT_RING_BYTES,
            listen: None,
            max_range: 1024,
            requests_per_second: 10_000,
            max_connections: 64,
            idle_timeout: 60.0,
            linger: 2.0,
        }
    }
}

/// Where segments come from, checked.
#[derive(Debug, Clone, PartialEq)]
pub enum Source {
    /// A capture file.
    Capture(PathBuf),
    /// A synthetic day.
    Synthetic(mdrelay_proto::synth::SynthConfig),
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

/// A live feed, checked.
#[derive(Debug, Clone, PartialEq)]
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
#[derive(Debug, Clone, Copy, PartialEq)]
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
    /// `original`: the longest wait, in seconds, before the schedule is re-anchored.
    pub max_gap: f64,
    /// How waits wait.
    pub idle: IdleStrategy,
    /// Seconds of segments sent per wake-up, at most that early.
    pub duty_cycle: f64,
}

/// The TCP server, checked.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Tcp {
    /// Listen address.
    pub listen: SocketAddr,
    /// Records in the shared queue.
    pub queue: usize,
    /// Slow subscriber policy.
    pub slow: SlowPolicy,
    /// Subscribers to wait for before sending.
    pub wait_subscribers: usize,
    /// Connections at once.
    pub max_connections: usize,
    /// Time a connection has to answer the greeting.
    pub handshake_timeout: Duration,
    /// Time subscribers get at the end to take what is queued for them.
    pub drain_timeout: Duration,
    /// Bytes of replay records built and not yet written, over every resuming subscriber.
    pub replay_bytes: usize,
    /// Time a resuming subscriber has to take one replay chunk.
    pub replay_timeout: Duration,
}

/// UDP destinations, checked.
#[derive(Debug, Clone, PartialEq)]
pub struct Udp {
    /// Unicast destinations.
    pub destinations: Vec<SocketAddr>,
    /// Multicast group.
    pub multicast: Option<Multicast>,
    /// Line B's multicast group: every datagram goes to both.
    pub multicast_b: Option<Multicast>,
    /// Largest coalesced datagram.
    pub max_datagram: usize,
}

/// Multicast settings, checked.
#[derive(Debug, Clone, Copy, PartialEq)]
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

/// The retransmission ring and service, checked.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Retransmit {
    /// Bytes the ring may hold (0: no ring).
    pub ring_bytes: usize,
    /// Where the service listens, if it runs.
    pub listen: Option<SocketAddr>,
    /// Frames per request at most.
    pub max_range: u32,
    /// Requests per second per connection.
    pub requests_per_second: u32,
    /// Connections at once.
    pub max_connections: usize,
    /// Time a connection may ask nothing before it is closed.
    pub idle_timeout: Duration,
    /// Time the service stays up after the end of the stream.
    pub linger: Duration,
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
    /// NATS, if configured.
    pub nats: Option<Nats>,
    /// The ring and the retransmission service.
    pub retransmit: Retransmit,
    /// The profile the idle strategy and pinning defaulted from.
    pub profile: Profile,
    /// The CPU the hot thread is pinned to, if any.
    pub hot_core: Option<usize>,
    /// Threads of the runtime that serves subscribers' sockets.
    pub io_threads: usize,
    /// The Prometheus endpoint, if any.
    pub metrics: Option<MetricsSettings>,
    /// Per-frame CRC-32C and encryption.
    pub protection: ProtectionSettings,
    /// The settings this view was derived from, every default filled in: the one source of what
    /// `--check` prints and a reload compares.
    pub settings: FileConfig,
}

/// Default TCP listen address: loopback, so nothing is exposed unless asked for.
pub const DEFAULT_TCP_LISTEN: &str = "127.0.0.1:9100";

// The loader is the one both programs share: bounded to 1 MiB, and on reload a regular file only.
use mdrelay_telemetry::config_file::toml_error_message;
pub use mdrelay_telemetry::config_file::{MAX_CONFIG_BYTES, Reading, read_text};

/// Reads a configuration file at start.
pub fn read_file(path: &Path) -> Result<FileConfig> {
    read_config(path, Reading::AtStart)
}

/// Reads a configuration file: at most [`MAX_CONFIG_BYTES`]; on reload, a regular file only.
pub fn read_config(path: &Path, reading: Reading) -> Result<FileConfig> {
    parse_text(path, &read_text(path, reading)?)
}

/// Parses the text of the configuration file `path`; errors name the file, line and key.
pub fn parse_text(path: &Path, text: &str) -> Result<FileConfig> {
    toml::from_str(text).map_err(|e| anyhow::anyhow!("{}: {}", path.display(), toml_error_message(&e)))
}

/// A failed check's error with the origin of the setting it names (`pacing.rate (--rate): ...`,
/// `tcp.queue (pub.toml, line 7): ...`); an error naming no setting given keeps the file's name.
pub fn name_origin(error: anyhow::Error, origins: &BTreeMap<String, String>, file: Option<&Path>) -> anyhow::Error {
    let message = format!("{error:#}");
    if let Some((key, rest)) = message.split_once(": ") {
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

/// Parses a socket address for the setting `name`.
pub fn socket_addr(name: &str, text: &str) -> Result<SocketAddr> {
    text.parse().with_context(|| format!("{name}: {text:?} is not an address:port (e.g. 127.0.0.1:9100)"))
}

/// Parses an IPv4 interface address for the setting `name`.
pub fn ipv4(name: &str, text: &str) -> Result<Ipv4Addr> {
    text.parse().with_context(|| format!("{name}: {text:?} is not an IPv4 address"))
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

/// `v`, when it is a whole number from `low` to `high`.
fn count_within<T: Into<u64> + Copy + std::fmt::Display>(name: &str, v: T, low: u64, high: u64) -> Result<T> {
    if !(low..=high).contains(&v.into()) {
        bail!("{name}: {v} is out of range: give a whole number from {low} to {high}");
    }
    Ok(v)
}

/// Most passes over the source `pacing.loops` takes (0 runs forever).
pub const MAX_LOOPS: u64 = 1_000_000_000;
/// Most messages `pacing.max_messages` takes (0: no limit): days at any rate the relay reaches.
pub const MAX_MESSAGE_LIMIT: u64 = 1_000_000_000_000;
/// Most messages in a synthetic day, about 50 full IEX days: the generator spreads them over the
/// 6.5 trading hours, microseconds apart at this bound; many more would crowd them into the same
/// nanosecond.
pub const MAX_SYNTHETIC_MESSAGES: u64 = 10_000_000_000;

/// A year: the longest time limit a setting takes (0 still means none where it is allowed).
const YEAR: f64 = 365.0 * 86_400.0;
/// Most memory the shared TCP queue may be configured to hold.
const MAX_QUEUE_MEMORY: u64 = 16 << 30;
/// Largest coalescing budget: a TCP record's payload limit.
const MAX_COALESCE: u64 = mdrelay_proto::relay::MAX_RECORD as u64;
/// The longest duty cycle: segments go out at most this early.
const MAX_DUTY_CYCLE: f64 = 0.01;

impl FileConfig {
    /// Checks every value, fills in the defaults that depend on other settings, and derives the
    /// runtime view; the settings, so resolved, stay in [`Config::settings`]. Every number is
    /// checked against bounds at start, so no value can fail (or panic) the relay after it has
    /// begun.
    pub fn check(mut self) -> Result<Config> {
        let hot_core = self.cpu.hot_core.map(|c| mdrelay_telemetry::cpu::check_core("cpu.hot_core", c)).transpose()?;
        let io_threads = count_within("cpu.io_threads", self.cpu.io_threads as u64, 1, 256)? as usize;
        let source = self.source.check()?;
        let pacing = self.pacing.check(self.profile)?;
        let tcp = self.tcp.as_ref().map(TcpSection::check).transpose()?;
        let udp = self.udp_outputs()?;
        let nats = self.nats.as_mut().map(|n| nats_output(n, self.stream)).transpose()?;
        if tcp.is_none() && udp.is_none() && nats.is_none() {
            bail!(
                "no transport: configure [tcp], [udp] destinations, [multicast] or [nats] (or pass --tcp, --udp, --multicast)"
            );
        }
        let coalesce_bytes =
            count_within("batching.coalesce_bytes", self.batching.coalesce_bytes as u64, 0, MAX_COALESCE)? as usize;
        if let Some(t) = &tcp {
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
        let retransmit = self.retransmit.check()?;
        let metrics = self.metrics.clone().check(None, None)?;
        // The hold, when left out, is written as the value it takes.
        self.metrics = MetricsSection::from(metrics);
        let mut listeners = own_listeners(tcp.as_ref(), &retransmit);
        listeners.extend(metrics.map(|m| ("metrics.listen", m.listen)));
        for (i, (setting, addr)) in listeners.iter().enumerate() {
            if let Some((other, taken)) = listeners[..i].iter().find(|(_, taken)| same_port(*addr, *taken)) {
                bail!("{setting}: {addr} takes the port of {other} ({taken}); give each server its own port");
            }
        }
        let protection = self.protection.check().map_err(anyhow::Error::msg)?;
        if matches!(source, Source::Upstream(_) | Source::NatsUpstream(_)) {
            // Subscribers refuse an encrypted session older than the one they follow (a replay);
            // that needs sessions that grow, which an origin's start time is and an upstream's
            // session, kept by the relay, need not be.
            if protection.key.is_some() {
                bail!(
                    "protection.key_file: a relay keeps its upstream's session, and encryption needs sessions of its own; encrypt at the origin's subscribers, or protect this relay's output with `crc` only"
                );
            }
            if pacing.mode != PacingMode::TopSpeed {
                bail!(
                    "pacing.mode: an upstream's frames go out as they arrive, with the origin's publish times; leave pacing.mode out (or top-speed)"
                );
            }
        }
        if let Source::Upstream(upstream) = &source {
            // A literal address can be checked now; a host name is checked once resolved.
            if let Ok(addr) = upstream.connect.parse::<SocketAddr>() {
                check_not_self(addr, &own_listeners(tcp.as_ref(), &retransmit))?;
            }
        }
        Ok(Config {
            format: self.format,
            stream: self.stream,
            source,
            pacing,
            coalesce_bytes,
            tcp,
            udp,
            nats,
            retransmit,
            profile: self.profile,
            hot_core,
            io_threads,
            metrics,
            protection,
            settings: self,
        })
    }

    /// The UDP outputs, checked: unicast destinations and the two multicast lines. Line B's TTL
    /// and loopback left out are line A's, and the one datagram limit of them all is written to
    /// the unicast output and line A (line B's is left out: it is line A's).
    fn udp_outputs(&mut self) -> Result<Option<Udp>> {
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
        let multicast = self
            .multicast
            .as_mut()
            .map(|m| multicast_line("multicast", m, (1, true), &mut max_datagram))
            .transpose()?;
        let line_a = multicast.map_or((1, true), |a| (a.ttl, a.loopback));
        let multicast_b = self
            .multicast_b
            .as_mut()
            .map(|b| multicast_line("multicast_b", b, line_a, &mut max_datagram))
            .transpose()?;
        match (&multicast, &multicast_b) {
            (None, Some(_)) => bail!("multicast_b: line B needs line A: configure [multicast] too"),
            (Some(a), Some(b)) if a.group == b.group => {
                bail!("multicast_b.group: {} is line A's group too; give line B its own group", b.group)
            }
            _ => {}
        }
        // Room for the relay header and the smallest frame.
        count_within("max_datagram", max_datagram as u64, 64, mdrelay_proto::relay::MAX_DATAGRAM as u64)?;
        if destinations.is_empty() {
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
        Ok((!destinations.is_empty() || multicast.is_some()).then_some(Udp {
            destinations,
            multicast,
            multicast_b,
            max_datagram,
        }))
    }
}

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
            return live.check().map(Source::Live);
        }
        let syn = self.synthetic.get_or_insert_default();
        let config = mdrelay_proto::synth::SynthConfig {
            messages: count_within("source.synthetic.messages", syn.messages, 0, MAX_SYNTHETIC_MESSAGES)?,
            symbols: syn.symbols,
            seed: syn.seed,
            ..mdrelay_proto::synth::SynthConfig::default()
        };
        // The generator checks its own limits (symbols, the fewest messages a day needs).
        mdrelay_proto::synth::SyntheticDay::new(config).context("source.synthetic")?;
        Ok(Source::Synthetic(config))
    }
}

impl LiveSection {
    /// The live feed, checked.
    fn check(&self) -> Result<Live> {
        let listen = socket_addr("source.live.listen", &self.listen)?;
        let group = self.group.as_deref().map(|g| ipv4("source.live.group", g)).transpose()?;
        if let Some(g) = group
            && !g.is_multicast()
        {
            bail!("source.live.group: {g} is not a multicast address (224.0.0.0/4); for unicast leave group out");
        }
        if group.is_none() && listen.ip().is_multicast() {
            bail!(
                "source.live.listen: {listen} is a multicast address; put the group in source.live.group and listen on 0.0.0.0:PORT"
            );
        }
        let interface = ipv4("source.live.interface", &self.interface)?;
        let idle_timeout = within("source.live.idle_timeout", self.idle_timeout, 0.0, 86_400.0, "seconds (0: never)")?;
        Ok(Live { listen, group, interface, idle_timeout })
    }
}

impl PacingSection {
    /// Pacing, checked; the idle strategy and duty cycle left out are `profile`'s.
    fn check(&mut self, profile: Profile) -> Result<Pacing> {
        let idle = *self.idle.get_or_insert(mdrelay_proto::idle::pacing_idle(profile));
        let duty_cycle = *self.duty_cycle.get_or_insert(mdrelay_proto::idle::duty_cycle(profile).as_secs_f64());
        Ok(Pacing {
            mode: self.mode,
            speed: within("pacing.speed", self.speed, 0.001, 1e6, "(times the capture's pace)")?,
            rate: within("pacing.rate", self.rate, 1.0, 1e9, "messages per second")?,
            loops: count_within("pacing.loops", self.loops, 0, MAX_LOOPS)?,
            max_messages: count_within("pacing.max_messages", self.max_messages, 0, MAX_MESSAGE_LIMIT)?,
            duration: within("pacing.duration", self.duration, 0.0, YEAR, "seconds (0: no limit)")?,
            max_gap: within("pacing.max_gap", self.max_gap, 0.001, 86_400.0, "seconds")?,
            idle,
            duty_cycle: within("pacing.duty_cycle", duty_cycle, 0.0, MAX_DUTY_CYCLE, "seconds")?,
        })
    }
}

impl TcpSection {
    /// The TCP server, checked.
    fn check(&self) -> Result<Tcp> {
        let listen = socket_addr("tcp.listen", &self.listen)?;
        if listen.ip().is_multicast() {
            bail!("tcp.listen: {listen} is a multicast address; TCP needs a unicast address");
        }
        let max_connections = count_within("tcp.max_connections", self.max_connections as u64, 1, 65_535)? as usize;
        let wait_subscribers = self.wait_subscribers;
        if wait_subscribers > max_connections {
            bail!(
                "tcp.wait_subscribers: {wait_subscribers} is more than tcp.max_connections ({max_connections}) allows"
            );
        }
        Ok(Tcp {
            listen,
            queue: count_within("tcp.queue", self.queue as u64, 16, 1 << 22)? as usize,
            slow: self.slow_subscriber,
            wait_subscribers,
            max_connections,
            handshake_timeout: seconds("tcp.handshake_timeout", self.handshake_timeout, 0.01, 300.0)?,
            drain_timeout: seconds("tcp.drain_timeout", self.drain_timeout, 0.0, 3_600.0)?,
            replay_bytes: count_within("tcp.replay_bytes", self.replay_bytes, 64 << 10, 1 << 30)? as usize,
            replay_timeout: seconds("tcp.replay_timeout", self.replay_timeout, 0.01, 3_600.0)?,
        })
    }
}

impl RetransmitSection {
    /// The ring and the retransmission service, checked.
    fn check(&self) -> Result<Retransmit> {
        let ring_bytes = count_within("retransmit.ring_bytes", self.ring_bytes, 0, MAX_RING_BYTES)?;
        let listen = self.listen.as_deref().map(|l| socket_addr("retransmit.listen", l)).transpose()?;
        if listen.is_some() && ring_bytes == 0 {
            bail!("retransmit.listen: the service needs the ring; give retransmit.ring_bytes above 0");
        }
        Ok(Retransmit {
            ring_bytes: ring_bytes as usize,
            listen,
            max_range: count_within("retransmit.max_range", self.max_range, 1, u64::from(u16::MAX))?,
            requests_per_second: count_within(
                "retransmit.requests_per_second",
                self.requests_per_second,
                1,
                1_000_000,
            )?,
            max_connections: count_within("retransmit.max_connections", self.max_connections as u64, 1, 65_535)?
                as usize,
            idle_timeout: seconds("retransmit.idle_timeout", self.idle_timeout, 1.0, 3_600.0)?,
            linger: seconds("retransmit.linger", self.linger, 0.0, 3_600.0)?,
        })
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
        give_up_after: seconds("source.upstream.give_up_after", u.give_up_after, 0.0, 86_400.0)?,
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
        give_up_after: seconds("source.upstream.give_up_after", u.give_up_after, 0.0, 86_400.0)?,
        idle_timeout: (idle > 0.0).then(|| Duration::from_secs_f64(idle)),
        crc: u.crc,
    })
}

/// Default bound of the retransmission ring.
pub const DEFAULT_RING_BYTES: u64 = 64 << 20;
/// Largest ring that may be configured.
const MAX_RING_BYTES: u64 = 64 << 30;

/// A `[multicast]`-shaped section `name`, checked; its `max_datagram` (if given) becomes the
/// datagram limit, and its TTL and loopback left out are `defaults`.
fn multicast_line(
    name: &str,
    m: &mut MulticastSection,
    defaults: (u32, bool),
    max_datagram: &mut usize,
) -> Result<Multicast> {
    let group = socket_addr(&format!("{name}.group"), &m.group)?;
    if !group.ip().is_multicast() {
        bail!("{name}.group: {} is not a multicast address (224.0.0.0/4, e.g. 239.255.0.1)", group.ip());
    }
    if !matches!(group.ip(), IpAddr::V4(_)) {
        bail!("{name}.group: only IPv4 groups are supported");
    }
    let interface = ipv4(&format!("{name}.interface"), &m.interface)?;
    *max_datagram = m.max_datagram.unwrap_or(*max_datagram);
    let ttl = count_within(&format!("{name}.ttl"), *m.ttl.get_or_insert(defaults.0), 0, 255)?;
    Ok(Multicast { group, interface, ttl, loopback: *m.loopback.get_or_insert(defaults.1) })
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

    /// The error of checking `[source.upstream]` given as `upstream` (TOML lines).
    fn upstream_error(upstream: &str) -> String {
        let file: FileConfig = toml::from_str(&format!("{TCP}[source.upstream]\n{upstream}\n")).unwrap();
        format!("{:#}", file.check().unwrap_err())
    }

    #[test]
    fn the_nats_queues_bytes_and_id_key_are_checked_and_named() {
        let nats = |keys: &str| -> Result<Nats> {
            let file: FileConfig = toml::from_str(&format!("[nats]\n{keys}\n")).unwrap();
            Ok(file.check()?.nats.expect("a NATS output"))
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
    fn read_back_nats(keys: &str) -> NatsSection {
        let file: FileConfig = toml::from_str(&format!("[nats]\n{keys}\n")).unwrap();
        file.check().unwrap().settings.nats.unwrap()
    }

    #[test]
    fn a_nats_upstream_is_checked_and_its_mistakes_are_named() {
        let file: FileConfig = toml::from_str(&format!(
            "{TCP}[source.upstream]\nnats = [\"nats://10.0.0.1:4222\"]\nsubject = \"md.1\"\nstream = \"MD\"\n"
        ))
        .unwrap();
        let Source::NatsUpstream(u) = file.check().unwrap().source else { panic!("not a NATS upstream") };
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
        let file: FileConfig = toml::from_str(&format!(
            "{TCP}[source.upstream]\n{nats}\nuser = \"feed\"\npassword_file = \"/p\"\ntls_ca_file = \"/ca.pem\"\n"
        ))
        .unwrap();
        let Source::NatsUpstream(u) = file.check().unwrap().source else { panic!("not a NATS upstream") };
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
            let file: FileConfig = toml::from_str(text).unwrap();
            let resolved = file.check().unwrap_or_else(|e| panic!("{text}: {e:#}")).to_table();
            let again: FileConfig = toml::from_str(&toml::to_string(&resolved).unwrap()).unwrap();
            assert_eq!(again.check().unwrap().to_table(), resolved, "{text}");
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
