//! Every receive setting of a subscriber as one serde struct ([`Settings`]), its rules checked
//! in one place ([`Settings::check`]), and the checked form the drivers take.
//!
//! A setting's name is its field's name everywhere: the [`Builder`](crate::Builder) method,
//! the key in a file, the Python keyword, and, with dashes, the `mdrelay-sub` flag.

use crate::NatsAuth;
use crate::error::Error;
use crate::nats_auth::nats_config;
use mdrelay_codec::SymbolFilter;
use mdrelay_iex::Symbol;
use mdrelay_proto::relay::{KeyError, MAX_KEY_FILE, Protection, WireKey};
use mdrelay_runtime::idle::{IdleStrategy, Profile};
use serde::{Deserialize, Serialize};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

/// Default cap of the wait between TCP connection attempts (they start at 100 ms and double).
pub(crate) const DEFAULT_RECONNECT_MAX: Duration = Duration::from_secs(5);
/// Default time for a TCP connection to be made (and a name resolved).
pub(crate) const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Default receive buffer asked of the kernel for UDP and multicast sockets: deep enough to ride
/// out a scheduling hiccup at full rate.
pub(crate) const DEFAULT_RECEIVE_BUFFER: usize = 16 << 20;
/// Default wait after a gap is seen before its frames are asked for (reordering often fills it).
pub(crate) const DEFAULT_RECOVERY_DELAY: Duration = Duration::from_millis(5);
/// Default wait before a request without an answer is asked again.
pub(crate) const DEFAULT_RECOVERY_RETRY: Duration = Duration::from_millis(50);
/// Default number of requests for one gap before it is given up.
pub(crate) const DEFAULT_RECOVERY_ATTEMPTS: u32 = 10;
/// Default wait after the end of the stream for frames still missing.
pub(crate) const DEFAULT_RECOVERY_LINGER: Duration = Duration::from_secs(2);
/// NATS with a JetStream stream: default wait after a gap is seen before it is read from the
/// stream (one connection delivers in order, so a gap is a loss; the wait lets the stream store
/// the frames that follow it).
#[cfg_attr(not(feature = "nats"), allow(dead_code))]
pub(crate) const DEFAULT_NATS_REPAIR_DELAY: Duration = Duration::from_millis(20);
/// NATS with a JetStream stream: default wait before frames still missing are read again. It
/// doubles with each read (and is at least twice as long as reads take), to 2 s: frames lost
/// with a stream's leader are stored only once published again, after an election, and must
/// then be read before the live subject takes them out of the window (the publisher runs at
/// most half a window ahead of what is stored; at 12,000 frames a second the other half lasts
/// 2.7 s).
#[cfg_attr(not(feature = "nats"), allow(dead_code))]
pub(crate) const DEFAULT_NATS_REPAIR_RETRY: Duration = Duration::from_millis(250);
/// NATS with a JetStream stream: default number of reads of a gap before it is given up
/// (about 18 s of reads at the default retry: an election and a publication again fit).
#[cfg_attr(not(feature = "nats"), allow(dead_code))]
pub(crate) const DEFAULT_NATS_REPAIR_ATTEMPTS: u32 = 12;
/// NATS with a JetStream stream: default wait after the end of the stream for frames still
/// missing.
#[cfg_attr(not(feature = "nats"), allow(dead_code))]
pub(crate) const DEFAULT_NATS_REPAIR_LINGER: Duration = Duration::from_secs(10);
/// NATS: default `give_up_after`, how long a stream that has started may bring
/// nothing new (no frame on the subject nor, with a stream, in its tail) before the subscriber
/// gives up on it. Past a stream leader's election (about 18 s of repairs) and far past the
/// publisher's own silences (an IEX feed sends a heartbeat every second).
#[cfg_attr(not(feature = "nats"), allow(dead_code))]
pub(crate) const DEFAULT_NATS_GIVE_UP_AFTER: Duration = Duration::from_secs(30);

/// The NATS subject a publisher's `[nats]` output sends to when it is not told otherwise.
const DEFAULT_NATS_SUBJECT: &str = "mdrelay.1";

/// Every setting of a subscriber, as a program reads them from a file, its flags or keyword
/// arguments: one transport (`tcp`, `udp`, `multicast` or `nats`), then anything else. Each
/// field's default is what [`Default`] gives (`None`: the default the field's doc names).
/// Durations are written as seconds (`2.5`) or with their unit (`"250ms"`), times in RFC 3339.
///
/// Nothing is checked until [`Settings::check`] (or [`Builder::build`](crate::Builder::build),
/// which checks them): an error names the field.
///
/// ```
/// let settings: mdrelay_client::Settings =
///     serde_json::from_str(r#"{"udp": "127.0.0.1:0", "recovery": "127.0.0.1:9101", "recovery_delay": "10ms"}"#)
///         .unwrap();
/// settings.check().unwrap();
/// let subscriber = mdrelay_client::Builder::from_settings(settings);
/// # drop(subscriber);
/// ```
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "clap", derive(clap::Args))]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct Settings {
    /// TCP: the publisher's `host:port` (the name is resolved at each connection attempt). A
    /// lost connection is made again, waiting from 100 ms doubling up to `reconnect_max`, and
    /// resumes after the last frame received.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "clap", arg(long, value_name = "HOST:PORT", help_heading = "Transport"))]
    pub tcp: Option<String>,
    /// UDP: the local `addr:port` the datagrams are sent to (port 0 picks a free port, see
    /// `Subscriber::local_addrs`).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "clap", arg(long, value_name = "ADDR:PORT", help_heading = "Transport"))]
    pub udp: Option<String>,
    /// Multicast: the IPv4 `group:port` to join.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "clap", arg(long, value_name = "GROUP:PORT", help_heading = "Transport"))]
    pub multicast: Option<String>,
    /// Multicast: the address of the local interface to join the group on (default `0.0.0.0`,
    /// the system's choice).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "clap", arg(long, value_name = "ADDR", help_heading = "Transport"))]
    pub interface: Option<String>,
    /// NATS: the servers' URLs, comma-separated (`nats://host:port`; the client fails over
    /// among them and reconnects for ever), of a publisher's `[nats]` output.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "clap", arg(long, value_name = "URLS", help_heading = "NATS"))]
    pub nats: Option<String>,
    /// NATS: the subject the stream is published to (default `mdrelay.1`), each message one
    /// relay datagram.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "clap", arg(long, value_name = "SUBJECT", help_heading = "NATS"))]
    pub nats_subject: Option<String>,
    /// NATS: the JetStream stream that stores the subject (the publisher's `nats.stream`), from
    /// which `from_start` and `nats_start_at` replay and from which gaps in the live subject are
    /// repaired (the `recovery_*` timings apply, with NATS's defaults: 20 ms, 250 ms, 12 reads,
    /// 10 s).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "clap", arg(long, value_name = "NAME", help_heading = "NATS"))]
    pub nats_stream: Option<String>,
    /// NATS with `nats_stream`: start with the stream's first message stored at or after this
    /// time (RFC 3339), replayed and then handed over to the live subject without a gap or a
    /// duplicate. The frames before it are not owed (the subscriber joined late).
    #[serde(with = "rfc3339", skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "clap", arg(long, value_name = "TIME", value_parser = time_from_text, help_heading = "NATS"))]
    pub nats_start_at: Option<SystemTime>,
    /// NATS: authenticate with a `.creds` file (JWT and nkey seed).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "clap", arg(long, value_name = "FILE", help_heading = "NATS"))]
    pub nats_creds_file: Option<PathBuf>,
    /// NATS: authenticate with the nkey seed in this file.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "clap", arg(long, value_name = "FILE", help_heading = "NATS"))]
    pub nats_nkey_file: Option<PathBuf>,
    /// NATS: authenticate as this user, with `nats_password_file`.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "clap", arg(long, value_name = "USER", help_heading = "NATS"))]
    pub nats_user: Option<String>,
    /// NATS: the file holding `nats_user`'s password (white space around it is trimmed).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "clap", arg(long, value_name = "FILE", help_heading = "NATS"))]
    pub nats_password_file: Option<PathBuf>,
    /// NATS: check the servers' TLS certificates with the CA certificates (PEM) in this file,
    /// and require TLS.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "clap", arg(long, value_name = "FILE", help_heading = "NATS"))]
    pub nats_tls_ca_file: Option<PathBuf>,
    /// NATS: messages the client holds for the subscription, at most, while the program does
    /// not read them (16 to 16 Mi, default 65,536); past it they are dropped as a slow
    /// consumer's and repaired from `nats_stream` (or counted lost). Lower it to bound memory
    /// when the program may stall.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "clap", arg(long, value_name = "N", help_heading = "NATS"))]
    pub nats_pending_messages: Option<usize>,
    /// NATS: the connection's name, as the servers' monitoring lists it (default `mdrelay-client`).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "clap", arg(long, value_name = "NAME", help_heading = "NATS"))]
    pub nats_name: Option<String>,
    /// A second line (A/B) carrying the same datagrams: a local `addr:port` for UDP, a
    /// `group:port` for multicast. Each frame is taken from whichever line delivers it first.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "clap", arg(long, value_name = "ADDR:PORT", help_heading = "Transport"))]
    pub line_b: Option<String>,
    /// Multicast: the local interface to join line B's group on (default `0.0.0.0`).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "clap", arg(long, value_name = "ADDR", help_heading = "Transport"))]
    pub interface_b: Option<String>,
    /// UDP and multicast: the publisher's retransmission service (`host:port`, its
    /// `retransmit.listen`), asked for missing frames.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "clap", arg(long, value_name = "HOST:PORT", help_heading = "Recovery"))]
    pub recovery: Option<String>,
    /// Recovery: wait this long after a gap is seen before asking (0 to 10 s, default 5 ms).
    #[serde(with = "seconds", skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "clap", arg(long, value_name = "DURATION", value_parser = duration_from_text, help_heading = "Recovery"))]
    pub recovery_delay: Option<Duration>,
    /// Recovery: ask again after this long without an answer (1 ms to 60 s, default 50 ms);
    /// the wait doubles with each further unanswered request for the same frames, up to 8 times.
    #[serde(with = "seconds", skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "clap", arg(long, value_name = "DURATION", value_parser = duration_from_text, help_heading = "Recovery"))]
    pub recovery_retry: Option<Duration>,
    /// Recovery: requests per gap before it is given up (1 to 1,000, default 10).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "clap", arg(long, value_name = "N", help_heading = "Recovery"))]
    pub recovery_attempts: Option<u32>,
    /// Recovery: after the end of the stream, wait this long at most for frames still missing
    /// (0 to 600 s, default 2 s).
    #[serde(with = "seconds", skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "clap", arg(long, value_name = "DURATION", value_parser = duration_from_text, help_heading = "Recovery"))]
    pub recovery_linger: Option<Duration>,
    /// TCP: whether a reconnection to the same publisher run asks for the frames after the last
    /// one received (default true), or takes the stream live from where it is.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "clap", arg(long, value_name = "BOOL", help_heading = "TCP"))]
    pub resume: Option<bool>,
    /// The session from its first frame: over TCP asked of the publisher (replayed from its
    /// ring), over UDP owed (frames before the first received count as missing, and recovery
    /// asks for them), over NATS replayed from `nats_stream`.
    #[cfg_attr(feature = "clap", arg(long, help_heading = "Recovery"))]
    pub from_start: bool,
    /// Join with a snapshot of the state (every symbol's book and status, the day's aggregates
    /// and counts) as of a frame, then the stream from the frame after it, with no gap and no
    /// duplicate (`Event::Snapshot`).
    ///
    /// Over TCP it is asked on the first connection only (a reconnection resumes); over UDP and
    /// multicast it comes from the retransmission service (`recovery`), and the frames between
    /// it and the first datagram are recovered from the ring; over NATS it is asked of the
    /// publisher by request.
    #[cfg_attr(feature = "clap", arg(long, help_heading = "Recovery"))]
    pub snapshot: bool,
    /// Decode only these symbols' messages (1 to 8 ASCII characters each); the others are
    /// skipped while decoding, as early as the format allows, and only counted by type (see
    /// `Frame::skipped`).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "clap", arg(long, value_name = "SYMBOL", value_delimiter = ',', help_heading = "Report"))]
    pub symbols: Option<Vec<String>>,
    /// The publisher adds a CRC-32C to every frame (its `[protection] crc = true`).
    #[cfg_attr(feature = "clap", arg(long, help_heading = "Protection"))]
    pub crc: bool,
    /// The publisher encrypts every frame with the key in this file (64 hex digits, readable by
    /// its owner only, as the publisher's `[protection] key_file`).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "clap", arg(long, value_name = "FILE", help_heading = "Protection"))]
    pub key_file: Option<PathBuf>,
    /// The publisher encrypts every frame with this key (never read from nor written to a
    /// file: give `key_file` there).
    #[serde(skip)]
    #[cfg_attr(feature = "clap", arg(skip))]
    pub key: Option<WireKey>,
    /// Round-trip latency: echo every `n`th frame's publish time back to the publisher, which
    /// measures the round trip on its own clock (at least 1).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "clap", arg(long, value_name = "N", help_heading = "Report"))]
    pub echo_every: Option<u64>,
    /// TCP: the longest wait between connection attempts (10 ms to 1 day, default 5 s).
    #[serde(with = "seconds", skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "clap", arg(long, value_name = "DURATION", value_parser = duration_from_text, alias = "reconnect-max-seconds", help_heading = "TCP"))]
    pub reconnect_max: Option<Duration>,
    /// Give up when nothing comes for this long: over TCP, no connection made (default: never);
    /// over NATS, once started, no frame on the subject nor in `nats_stream`'s tail (default 30 s).
    ///
    /// TCP: the subscriber ends with `ErrorKind::Unreachable` when no connection could be made,
    /// or every one was told BUSY, for this long (10 ms to 1 day), counted from the first attempt
    /// that failed since the last connection whose stream started. NATS: it gives up on the
    /// stream with `ErrorKind::Ended` when nothing new came for this long, on the subject nor in
    /// `nats_stream`'s tail, which is read whenever the subject is quiet (a server out of reach
    /// answers nothing and is waited for; one that answers after more than a quarter of this
    /// limit was stalled, and the limit starts again from its answer). What is missing then is
    /// given up, and counted. An end of stream far ahead of the frames the stream holds (frames a
    /// publisher dropped) is taken at that point instead, unless a frame of its session came
    /// after it.
    #[serde(with = "seconds", skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "clap", arg(long, value_name = "DURATION", value_parser = duration_from_text, help_heading = "NATS"))]
    pub give_up_after: Option<Duration>,
    /// TCP: time for a connection to be made, the name resolved included (10 ms to 1 day,
    /// default 10 s).
    #[serde(with = "seconds", skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "clap", arg(long, value_name = "DURATION", value_parser = duration_from_text, help_heading = "TCP"))]
    pub connect_timeout: Option<Duration>,
    /// The receive buffer asked of the kernel for each socket (4 KiB to 1 GiB; default 16 MiB
    /// for UDP and multicast, the system's for TCP). Above `net.core.rmem_max` it is granted
    /// only to a process with CAP_NET_ADMIN.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "clap", arg(long, value_name = "SIZE", value_parser = bytes_from_text, help_heading = "Transport"))]
    pub receive_buffer: Option<usize>,
    /// A set of choices made together: `low-latency` busy-polls the sockets (`idle = "spin"`,
    /// SO_BUSY_POLL); settings given explicitly override it.
    #[cfg_attr(
        feature = "clap",
        arg(long, value_name = "PROFILE", default_value = "default", help_heading = "Latency and CPU")
    )]
    pub profile: Profile,
    /// How waiting for data is done: `sleep` (the default) waits for the kernel to say a socket
    /// is readable; `spin` and `yield` read the non-blocking sockets over and over (a core),
    /// `backoff` does so for a few dozen empty reads after data, then waits.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "clap", arg(long, value_name = "STRATEGY", help_heading = "Latency and CPU"))]
    pub idle: Option<IdleStrategy>,
    /// SO_BUSY_POLL on the sockets (default: on with the low-latency profile); a kernel that
    /// refuses it is counted in `Counters::busy_poll_refused`.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "clap", arg(long, value_name = "BOOL", help_heading = "Latency and CPU"))]
    pub busy_poll: Option<bool>,
    /// Keep each frame's bytes (opened, as the format encodes them) for
    /// `Frame::bytes`, as a recorder needs them: one copy per frame.
    #[cfg_attr(feature = "clap", arg(skip))]
    pub frame_bytes: bool,
}

/// A duration from text: seconds (`"2.5"`) or a number with its unit (`"250ms"`, `"1m 30s"`).
fn duration_from_text(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    match text.parse::<f64>() {
        Ok(seconds) => Duration::try_from_secs_f64(seconds)
            .map_err(|_| format!("{seconds} is not a duration: give a number of seconds from 0")),
        Err(_) => humantime::parse_duration(text).map_err(|e| {
            format!(
                "{text:?} is not a duration ({e}): give seconds (e.g. 2.5) or a number with its unit (250ms, 5s, 2m)"
            )
        }),
    }
}

/// A time from RFC 3339 text (`2026-11-26T14:30:00Z`).
fn time_from_text(text: &str) -> Result<SystemTime, String> {
    humantime::parse_rfc3339_weak(text.trim())
        .map_err(|e| format!("{text:?} is not an RFC 3339 time ({e}), e.g. 2026-11-26T14:30:00Z"))
}

/// A size from text: bytes (`"65536"`) or a number with its unit (`"16MiB"`), as flags write it.
#[cfg(feature = "clap")]
fn bytes_from_text(text: &str) -> Result<usize, String> {
    let text = text.trim();
    let bytes = parse_size::parse_size(text).map_err(|e| {
        format!("{text:?} is not a size ({e}): give bytes (e.g. 65536) or a size with its unit (64KiB, 16MiB)")
    })?;
    usize::try_from(bytes).map_err(|_| format!("{text:?} ({bytes} bytes) is too large here"))
}

/// Durations as seconds: a number (`2.5`) or text with its unit (`"250ms"`, `"1m 30s"`);
/// written back as seconds.
mod seconds {
    use serde::{Deserialize, Deserializer, Serializer};
    use std::time::Duration;

    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Written {
        Int(i64),
        Float(f64),
        Text(String),
    }

    pub fn serialize<S: Serializer>(value: &Option<Duration>, serializer: S) -> Result<S::Ok, S::Error> {
        match value {
            Some(d) => serializer.serialize_f64(d.as_secs_f64()),
            None => serializer.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<Duration>, D::Error> {
        let text = match Written::deserialize(deserializer)? {
            Written::Int(n) => (n as f64).to_string(),
            Written::Float(f) => f.to_string(),
            Written::Text(text) => text,
        };
        super::duration_from_text(&text).map(Some).map_err(serde::de::Error::custom)
    }
}

/// Times as RFC 3339 text (`2026-11-26T14:30:00Z`), or a TOML date-time.
mod rfc3339 {
    use serde::{Deserialize, Deserializer, Serializer};
    use std::time::SystemTime;

    pub fn serialize<S: Serializer>(value: &Option<SystemTime>, serializer: S) -> Result<S::Ok, S::Error> {
        match value {
            Some(t) => serializer.collect_str(&humantime::format_rfc3339(*t)),
            None => serializer.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<SystemTime>, D::Error> {
        /// A TOML date-time arrives as a map of one private key; its text is what matters.
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Written {
            Text(String),
            Datetime {
                #[serde(rename = "$__toml_private_datetime")]
                text: String,
            },
        }
        let (Written::Text(text) | Written::Datetime { text }) = Written::deserialize(deserializer)?;
        super::time_from_text(&text).map(Some).map_err(serde::de::Error::custom)
    }
}

/// Reads a key file, as the `key_file` setting and the publisher's `[protection] key_file` name
/// one: 64 hex digits, readable by its owner only. At most
/// [`MAX_KEY_FILE`](mdrelay_proto::relay::MAX_KEY_FILE) + 1 bytes are read, whatever the file
/// is (a FIFO whose writer never stops, a device); a FIFO is read as its writer writes (a start
/// or reload waits for it, a reload within its bound).
pub fn read_key_file(path: &Path) -> Result<WireKey, KeyError> {
    use std::io::Read;
    let name = path.display().to_string();
    let read = |source| KeyError::Read { path: name.clone(), source };
    let file = std::fs::File::open(path).map_err(read)?;
    let metadata = file.metadata().map_err(read)?;
    #[cfg(unix)]
    let mode = Some(std::os::unix::fs::PermissionsExt::mode(&metadata.permissions()));
    #[cfg(not(unix))]
    let mode = None;
    let mut contents = Vec::with_capacity(128);
    file.take(MAX_KEY_FILE as u64 + 1).read_to_end(&mut contents).map_err(read)?;
    WireKey::from_key_file(&name, mode, &contents)
}

/// Where the stream comes from, checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Transport {
    /// TCP to `host:port`.
    Tcp(String),
    /// UDP to this local address.
    Udp(SocketAddr),
    /// Multicast: the group and port, joined on the interface.
    Multicast { group: SocketAddr, interface: Ipv4Addr },
    /// NATS: the servers' URLs, the subject, and the JetStream stream that stores it.
    Nats { servers: Vec<String>, subject: String, stream: Option<String> },
}

/// Recovery's settings, checked.
#[derive(Clone, Debug)]
pub(crate) struct RecoverySettings {
    pub server: String,
    pub delay: Duration,
    pub retry: Duration,
    pub attempts: u32,
    pub linger: Duration,
}

/// NATS's own settings, checked (without the nats feature, checked and not used).
#[derive(Clone, Debug, Default)]
#[cfg_attr(not(feature = "nats"), allow(dead_code))]
pub(crate) struct NatsSettings {
    /// Replay the JetStream stream from its first message stored at or after this time.
    pub start_at: Option<SystemTime>,
    pub auth: NatsAuth,
    /// CA certificates (PEM) to check the servers' certificates with; TLS is required.
    pub tls_ca_file: Option<PathBuf>,
    /// Messages held for the subscription at most (async-nats's default when none).
    pub pending_messages: Option<usize>,
    /// The connection's name (the driver's default when none).
    pub name: Option<String>,
}

/// Every setting, checked, with the defaults that depend on the transport filled in.
#[derive(Clone, Debug)]
pub(crate) struct Checked {
    pub transport: Transport,
    pub line_b: Option<Transport>,
    pub recovery: Option<RecoverySettings>,
    pub resume: bool,
    pub from_start: bool,
    pub snapshot: bool,
    pub symbols: Option<SymbolFilter>,
    pub protection: Protection,
    pub key: Option<WireKey>,
    pub echo_every: Option<u64>,
    pub reconnect_max: Duration,
    pub give_up_after: Option<Duration>,
    pub connect_timeout: Duration,
    pub receive_buffer: Option<usize>,
    pub idle: IdleStrategy,
    pub busy_poll: bool,
    pub frame_bytes: bool,
    #[cfg_attr(not(feature = "nats"), allow(dead_code))]
    pub nats: NatsSettings,
}

impl Settings {
    /// Checks every setting and how they go together, and reads the files they name (the key,
    /// NATS's credentials), without binding or connecting anything; the first setting found
    /// wrong is named in the [`Error::Config`] returned.
    pub fn check(&self) -> Result<(), Error> {
        self.checked().map(drop)
    }

    /// The settings as a subscriber uses them: checked as [`Settings::check`] checks them, with
    /// every default that applies to the transport written in (the reconnection wait of TCP,
    /// the recovery timings, the idle strategy...), as `mdrelay-sub --check` prints them.
    pub fn effective(&self) -> Result<Settings, Error> {
        let checked = self.checked()?;
        let mut settings = self.clone();
        match &checked.transport {
            Transport::Tcp(_) => {
                settings.reconnect_max = Some(checked.reconnect_max);
                settings.connect_timeout = Some(checked.connect_timeout);
                settings.resume = Some(checked.resume);
            }
            Transport::Multicast { interface, .. } => settings.interface = Some(interface.to_string()),
            Transport::Nats { subject, .. } => settings.nats_subject = Some(subject.clone()),
            Transport::Udp(_) => {}
        }
        if let Some(Transport::Multicast { interface, .. }) = &checked.line_b {
            settings.interface_b = Some(interface.to_string());
        }
        if let Some(recovery) = &checked.recovery {
            settings.recovery_delay = Some(recovery.delay);
            settings.recovery_retry = Some(recovery.retry);
            settings.recovery_attempts = Some(recovery.attempts);
            settings.recovery_linger = Some(recovery.linger);
        }
        settings.give_up_after = checked.give_up_after;
        settings.receive_buffer = checked.receive_buffer;
        settings.idle = Some(checked.idle);
        settings.busy_poll = Some(checked.busy_poll);
        Ok(settings)
    }

    /// The settings checked, as the drivers take them.
    pub(crate) fn checked(&self) -> Result<Checked, Error> {
        let transport = self.checked_transport()?;
        let tcp = matches!(transport, Transport::Tcp(_));
        let nats = matches!(transport, Transport::Nats { .. });
        self.only_with(nats, "a NATS subscriber (nats)", &self.nats_fields())?;
        let nats_settings = self.nats_settings()?;
        let line_b = self.checked_line_b(&transport)?;
        let recovery = self.checked_recovery(&transport)?;
        if !tcp {
            let udp_rule = "only used over TCP (UDP and multicast have no connection to make)";
            for (setting, set) in [
                ("resume", self.resume.is_some()),
                ("reconnect_max", self.reconnect_max.is_some()),
                ("give_up_after", self.give_up_after.is_some() && !nats),
                ("connect_timeout", self.connect_timeout.is_some() && !nats),
            ] {
                if set {
                    return Err(Error::config(setting, udp_rule));
                }
            }
        }
        if self.snapshot && !tcp && !nats && recovery.is_none() {
            return Err(Error::config(
                "snapshot",
                "over UDP and multicast the snapshot comes from the retransmission service: set recovery_server",
            ));
        }
        if self.snapshot && self.from_start {
            return Err(Error::config(
                "snapshot",
                "give snapshot (the state, then the stream from there) or from_start (the whole session), not both",
            ));
        }
        let day = Duration::from_secs(86_400);
        let tens_of_ms = Duration::from_millis(10);
        let reconnect_max =
            ranged(self.reconnect_max, "reconnect_max", tens_of_ms, day)?.unwrap_or(DEFAULT_RECONNECT_MAX);
        let give_up_after = ranged(self.give_up_after, "give_up_after", tens_of_ms, day)?
            .or(nats.then_some(DEFAULT_NATS_GIVE_UP_AFTER));
        let connect_timeout =
            ranged(self.connect_timeout, "connect_timeout", tens_of_ms, day)?.unwrap_or(DEFAULT_CONNECT_TIMEOUT);
        let symbols = self.checked_symbols()?;
        let key = match (&self.key, &self.key_file) {
            (Some(_), Some(_)) => return Err(Error::config("key", "both key and key_file were given; give one")),
            (Some(key), None) => Some(key.clone()),
            (None, Some(path)) => {
                Some(read_key_file(path).map_err(|e| Error::config("key_file", format!("{}: {e}", path.display())))?)
            }
            (None, None) => None,
        };
        if self.echo_every == Some(0) {
            return Err(Error::config("echo_every", "must be at least 1 (1 echoes every frame)"));
        }
        let receive_buffer = match self.receive_buffer {
            Some(n) if !(4 << 10..=1 << 30).contains(&n) => {
                return Err(Error::config("receive_buffer", format!("{n} bytes is out of range (4 KiB to 1 GiB)")));
            }
            Some(n) => Some(n),
            None if tcp || nats => None,
            None => Some(DEFAULT_RECEIVE_BUFFER),
        };
        let low_latency = self.profile == Profile::LowLatency;
        let idle = self.idle.unwrap_or(if low_latency { IdleStrategy::Spin } else { IdleStrategy::Sleep });
        Ok(Checked {
            transport,
            line_b,
            recovery,
            resume: self.resume.unwrap_or(true),
            from_start: self.from_start,
            snapshot: self.snapshot,
            symbols,
            protection: Protection { crc: self.crc, encrypted: key.is_some() },
            key,
            echo_every: self.echo_every,
            reconnect_max,
            give_up_after,
            connect_timeout,
            receive_buffer,
            idle,
            busy_poll: self.busy_poll.unwrap_or(low_latency),
            frame_bytes: self.frame_bytes,
            nats: nats_settings,
        })
    }

    /// The one transport given, checked.
    fn checked_transport(&self) -> Result<Transport, Error> {
        let given: Vec<&'static str> = [
            ("tcp", self.tcp.is_some()),
            ("udp", self.udp.is_some()),
            ("multicast", self.multicast.is_some()),
            ("nats", self.nats.is_some()),
        ]
        .into_iter()
        .filter_map(|(name, set)| set.then_some(name))
        .collect();
        match given[..] {
            [] => return Err(Error::config("tcp", "no transport given: give one of tcp, udp, multicast or nats")),
            [_] => {}
            [first, second, ..] => {
                return Err(Error::config(second, format!("{first} is given too: give one transport")));
            }
        }
        self.only_with(
            self.multicast.is_some(),
            "a multicast subscriber (multicast)",
            &[("interface", self.interface.is_some())],
        )?;
        if let Some(address) = &self.tcp {
            check_host_port(address).map_err(|why| Error::config("tcp", format!("{address:?} {why}")))?;
            Ok(Transport::Tcp(address.clone()))
        } else if let Some(address) = &self.udp {
            Ok(Transport::Udp(listen_addr(address, "udp", "multicast")?))
        } else if let Some(group) = &self.multicast {
            let group = multicast_group(group, "multicast")?;
            let interface = interface_addr(self.interface.as_deref().unwrap_or("0.0.0.0"), "interface")?;
            Ok(Transport::Multicast { group, interface })
        } else {
            let servers = self.nats.as_deref().unwrap_or_default();
            if !cfg!(feature = "nats") {
                return Err(Error::config(
                    "nats",
                    "this build of mdrelay-client has no NATS transport (the nats feature)",
                ));
            }
            let servers: Vec<String> =
                servers.split(',').map(str::trim).filter(|s| !s.is_empty()).map(String::from).collect();
            if servers.is_empty() {
                return Err(Error::config("nats", "no server URL given (nats://host:port, comma-separated)"));
            }
            let subject = self.nats_subject.as_deref().unwrap_or(DEFAULT_NATS_SUBJECT);
            let wildcard = subject.split('.').any(|t| t.is_empty() || t == "*" || t == ">");
            if wildcard || subject.contains(char::is_whitespace) {
                return Err(Error::config(
                    "nats_subject",
                    format!("{subject:?} is not one stream's subject (dot-separated tokens, no wildcards or spaces)"),
                ));
            }
            if self.from_start && self.nats_stream.is_none() {
                return Err(Error::config(
                    "from_start",
                    "over NATS the start is replayed from JetStream: give the stream with nats_stream",
                ));
            }
            Ok(Transport::Nats { servers, subject: subject.to_string(), stream: self.nats_stream.clone() })
        }
    }

    /// NATS's settings and whether each is set.
    fn nats_fields(&self) -> [(&'static str, bool); 10] {
        [
            ("nats_subject", self.nats_subject.is_some()),
            ("nats_stream", self.nats_stream.is_some()),
            ("nats_start_at", self.nats_start_at.is_some()),
            ("nats_creds_file", self.nats_creds_file.is_some()),
            ("nats_nkey_file", self.nats_nkey_file.is_some()),
            ("nats_user", self.nats_user.is_some()),
            ("nats_password_file", self.nats_password_file.is_some()),
            ("nats_tls_ca_file", self.nats_tls_ca_file.is_some()),
            ("nats_pending_messages", self.nats_pending_messages.is_some()),
            ("nats_name", self.nats_name.is_some()),
        ]
    }

    /// Refuses the first of `settings` set when `applies` does not hold.
    fn only_with(&self, applies: bool, what: &str, settings: &[(&'static str, bool)]) -> Result<(), Error> {
        match settings.iter().find(|(_, set)| *set) {
            Some((setting, _)) if !applies => Err(Error::config(setting, format!("only used with {what}"))),
            _ => Ok(()),
        }
    }

    /// Line B, checked against line A.
    fn checked_line_b(&self, transport: &Transport) -> Result<Option<Transport>, Error> {
        let line_b = match (transport, self.line_b.as_deref()) {
            (_, None) => None,
            (Transport::Tcp(_), Some(_)) => {
                return Err(Error::config(
                    "line_b",
                    "a second line (A/B) is for UDP and multicast; a TCP subscriber has one connection",
                ));
            }
            (Transport::Nats { .. }, Some(_)) => {
                return Err(Error::config("line_b", "a second line (A/B) is for UDP and multicast, not NATS"));
            }
            (Transport::Udp(a), Some(b)) => {
                let b = listen_addr(b, "line_b", "multicast")?;
                if *a == b && b.port() != 0 {
                    return Err(Error::config(
                        "line_b",
                        format!("{b} is line A's address too; line B needs an address or port of its own"),
                    ));
                }
                Some(Transport::Udp(b))
            }
            (Transport::Multicast { group: a, .. }, Some(b)) => {
                let group = multicast_group(b, "line_b")?;
                if *a == group && group.port() != 0 {
                    return Err(Error::config(
                        "line_b",
                        format!(
                            "{group} is line A's group and port too; line B needs another group or port (a socket bound to a group and port receives it from every interface)"
                        ),
                    ));
                }
                let interface = interface_addr(self.interface_b.as_deref().unwrap_or("0.0.0.0"), "interface_b")?;
                Some(Transport::Multicast { group, interface })
            }
        };
        if self.interface_b.is_some() && !matches!(line_b, Some(Transport::Multicast { .. })) {
            return Err(Error::config(
                "interface_b",
                "an interface for line B is only used with a multicast line B (line_b on a multicast subscriber)",
            ));
        }
        Ok(line_b)
    }

    /// Recovery: from the retransmission service (UDP, multicast) or the JetStream stream (NATS).
    fn checked_recovery(&self, transport: &Transport) -> Result<Option<RecoverySettings>, Error> {
        let (server, defaults) = match (&self.recovery, transport) {
            (None, Transport::Nats { stream: Some(stream), .. }) => (
                // Gaps are repaired from the stream, by the same book as a retransmission
                // service's, with NATS's defaults.
                format!("JetStream stream {stream}"),
                (
                    DEFAULT_NATS_REPAIR_DELAY,
                    DEFAULT_NATS_REPAIR_RETRY,
                    DEFAULT_NATS_REPAIR_ATTEMPTS,
                    DEFAULT_NATS_REPAIR_LINGER,
                ),
            ),
            (None, _) => {
                let timings = [
                    ("recovery_delay", self.recovery_delay.is_some()),
                    ("recovery_retry", self.recovery_retry.is_some()),
                    ("recovery_attempts", self.recovery_attempts.is_some()),
                    ("recovery_linger", self.recovery_linger.is_some()),
                ];
                let what = "recovery (the publisher's retransmission service, or a NATS subscriber's JetStream stream), which is not set";
                self.only_with(false, what, &timings)?;
                return Ok(None);
            }
            (Some(_), Transport::Nats { .. }) => {
                return Err(Error::config(
                    "recovery",
                    "the retransmission service is for UDP and multicast subscribers, not NATS",
                ));
            }
            (Some(_), Transport::Tcp(_)) => {
                return Err(Error::config(
                    "recovery",
                    "a TCP subscriber resumes from the publisher's ring when it reconnects; the retransmission service is for UDP and multicast subscribers",
                ));
            }
            (Some(server), _) => {
                check_host_port(server).map_err(|why| Error::config("recovery", format!("{server:?} {why}")))?;
                (
                    server.clone(),
                    (
                        DEFAULT_RECOVERY_DELAY,
                        DEFAULT_RECOVERY_RETRY,
                        DEFAULT_RECOVERY_ATTEMPTS,
                        DEFAULT_RECOVERY_LINGER,
                    ),
                )
            }
        };
        let ms = Duration::from_millis;
        let (delay, retry, attempts, linger) = defaults;
        if let Some(n) = self.recovery_attempts
            && !(1..=1000).contains(&n)
        {
            return Err(Error::config("recovery_attempts", format!("{n} is out of range (1 to 1000)")));
        }
        Ok(Some(RecoverySettings {
            server,
            delay: ranged(self.recovery_delay, "recovery_delay", Duration::ZERO, ms(10_000))?.unwrap_or(delay),
            retry: ranged(self.recovery_retry, "recovery_retry", ms(1), ms(60_000))?.unwrap_or(retry),
            attempts: self.recovery_attempts.unwrap_or(attempts),
            linger: ranged(self.recovery_linger, "recovery_linger", Duration::ZERO, Duration::from_secs(600))?
                .unwrap_or(linger),
        }))
    }

    /// The symbol filter, checked.
    fn checked_symbols(&self) -> Result<Option<SymbolFilter>, Error> {
        let Some(list) = &self.symbols else { return Ok(None) };
        if list.is_empty() {
            return Err(Error::config("symbols", "the list is empty; leave it out to receive every symbol"));
        }
        let mut out = Vec::with_capacity(list.len());
        for text in list {
            let trimmed = text.trim();
            let symbol = Symbol::new(trimmed).filter(|_| !trimmed.is_empty()).ok_or_else(|| {
                Error::config("symbols", format!("{text:?} is not a symbol (1 to 8 ASCII characters)"))
            })?;
            out.push(symbol);
        }
        Ok(Some(SymbolFilter::new(out)))
    }

    /// NATS's own settings checked (whether they fit the transport was checked before).
    fn nats_settings(&self) -> Result<NatsSettings, Error> {
        if let Some(time) = self.nats_start_at {
            if self.nats_stream.is_none() {
                return Err(Error::config(
                    "nats_start_at",
                    "the start is replayed from JetStream: give the stream with nats_stream",
                ));
            }
            if self.from_start {
                return Err(Error::config("nats_start_at", "give from_start or a start time, not both"));
            }
            if time.duration_since(SystemTime::UNIX_EPOCH).is_err() {
                return Err(Error::config("nats_start_at", "the time is before 1970"));
            }
        }
        let auth = NatsAuth::from_settings(
            self.nats_creds_file.clone(),
            self.nats_nkey_file.clone(),
            self.nats_user.clone(),
            self.nats_password_file.clone(),
        )
        .map_err(nats_config)?;
        for (setting, path) in [
            ("nats_creds_file", &self.nats_creds_file),
            ("nats_nkey_file", &self.nats_nkey_file),
            ("nats_password_file", &self.nats_password_file),
            ("nats_tls_ca_file", &self.nats_tls_ca_file),
        ] {
            if let Some(path) = path
                && !path.is_file()
            {
                return Err(Error::config(setting, format!("{} is not a file", path.display())));
            }
        }
        if let Some(n) = self.nats_pending_messages
            && !(16..=1 << 24).contains(&n)
        {
            return Err(Error::config("nats_pending_messages", format!("{n} is out of range (16 to 16 Mi)")));
        }
        Ok(NatsSettings {
            start_at: self.nats_start_at,
            auth,
            tls_ca_file: self.nats_tls_ca_file.clone(),
            pending_messages: self.nats_pending_messages,
            name: self.nats_name.clone().filter(|name| !name.is_empty()),
        })
    }
}

/// `value` when within `min..=max`.
fn ranged(
    value: Option<Duration>,
    setting: &'static str,
    min: Duration,
    max: Duration,
) -> Result<Option<Duration>, Error> {
    match value {
        Some(v) if v < min || v > max => {
            Err(Error::config(setting, format!("{v:?} is out of range ({min:?} to {max:?})")))
        }
        other => Ok(other),
    }
}

/// Whether `value` is a `host:port` that can be connected to (an IP address and port, or a
/// name and port; the name is not resolved here), as [`Settings::tcp`] and
/// [`Settings::recovery`] are checked; why not, to follow the value in a message
/// (`"h" is not host:port (...)`).
///
/// ```
/// assert!(mdrelay_client::check_host_port("localhost:9100").is_ok());
/// assert_eq!(mdrelay_client::check_host_port("localhost"), Err("is not host:port (the port is missing)"));
/// ```
pub fn check_host_port(value: &str) -> Result<(), &'static str> {
    if let Ok(addr) = value.parse::<SocketAddr>() {
        return if addr.port() == 0 { Err("is not host:port (port 0 cannot be connected to)") } else { Ok(()) };
    }
    let Some((host, port)) = value.rsplit_once(':') else {
        return Err("is not host:port (the port is missing)");
    };
    if host.is_empty() {
        return Err("is not host:port (the host is missing)");
    }
    if host.contains(':') && !(host.starts_with('[') && host.ends_with(']')) {
        return Err("is not host:port (write an IPv6 address in brackets, e.g. \"[::1]:9100\")");
    }
    if host.contains(char::is_whitespace) {
        return Err("is not host:port (the host contains a space)");
    }
    match port.parse::<u16>() {
        Ok(0) => Err("is not host:port (port 0 cannot be connected to)"),
        Ok(_) => Ok(()),
        Err(_) => Err("is not host:port (the port is not a number from 1 to 65535)"),
    }
}

fn listen_addr(value: &str, setting: &'static str, group_setting: &str) -> Result<SocketAddr, Error> {
    let addr: SocketAddr = value.parse().map_err(|_| {
        Error::config(setting, format!("{value:?} is not an address:port (e.g. \"0.0.0.0:9200\" or \"[::]:9200\")"))
    })?;
    if addr.ip().is_multicast() {
        return Err(Error::config(
            setting,
            format!("{} is a multicast address; join a group with {group_setting}", addr.ip()),
        ));
    }
    Ok(addr)
}

fn multicast_group(value: &str, setting: &'static str) -> Result<SocketAddr, Error> {
    let addr: SocketAddr = value
        .parse()
        .map_err(|_| Error::config(setting, format!("{value:?} is not a group:port (e.g. \"239.255.0.1:9300\")")))?;
    match addr.ip() {
        IpAddr::V4(ip) if ip.is_multicast() => Ok(addr),
        IpAddr::V4(ip) => Err(Error::config(
            setting,
            format!("{ip} is not a multicast address (224.0.0.0/4); for unicast UDP use udp"),
        )),
        IpAddr::V6(_) => {
            Err(Error::config(setting, format!("{addr} is IPv6; only IPv4 multicast groups are supported")))
        }
    }
}

fn interface_addr(value: &str, setting: &'static str) -> Result<Ipv4Addr, Error> {
    let ip: Ipv4Addr = value.parse().map_err(|_| {
        Error::config(
            setting,
            format!("{value:?} is not an IPv4 address (the local interface's address, e.g. \"127.0.0.1\")"),
        )
    })?;
    if ip.is_multicast() {
        return Err(Error::config(
            setting,
            format!("{ip} is a multicast address; give the local interface's own address"),
        ));
    }
    Ok(ip)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn from_toml(text: &str) -> Result<Settings, String> {
        toml::from_str(text).map_err(|e| e.to_string())
    }

    #[test]
    fn a_file_gives_the_same_settings_as_the_builder() {
        let read = from_toml(
            r#"
            multicast = "239.255.0.1:9300"
            interface = "127.0.0.1"
            line_b = "239.255.0.2:9300"
            recovery = "127.0.0.1:9101"
            recovery_delay = "10ms"
            recovery_retry = 0.02
            recovery_linger = 3
            symbols = ["AAPL", "IBM"]
            profile = "low-latency"
            idle = "backoff"
            "#,
        )
        .unwrap();
        let built = crate::Builder::multicast("239.255.0.1:9300", "127.0.0.1")
            .line_b("239.255.0.2:9300")
            .recovery("127.0.0.1:9101")
            .recovery_delay(Duration::from_millis(10))
            .recovery_retry(Duration::from_millis(20))
            .recovery_linger(Duration::from_secs(3))
            .symbols(["AAPL", "IBM"])
            .profile(Profile::LowLatency)
            .idle(IdleStrategy::Backoff);
        assert_eq!(&read, built.settings());
        read.check().unwrap();
    }

    /// Every field set to a value other than its default, written out in full (no
    /// `..Default::default()`): a field added to `Settings` fails to compile here until it is
    /// given a value, and so is checked by the round trips below.
    fn every_field_set() -> Settings {
        Settings {
            tcp: Some("publisher:9100".into()),
            udp: Some("127.0.0.1:9200".into()),
            multicast: Some("239.255.0.1:9300".into()),
            interface: Some("127.0.0.1".into()),
            nats: Some("nats://127.0.0.1:4222".into()),
            nats_subject: Some("md.deep".into()),
            nats_stream: Some("MD".into()),
            nats_start_at: Some(SystemTime::UNIX_EPOCH + Duration::from_secs(1_764_167_400)),
            nats_creds_file: Some("/etc/mdrelay/sub.creds".into()),
            nats_nkey_file: Some("/etc/mdrelay/sub.nk".into()),
            nats_user: Some("reader".into()),
            nats_password_file: Some("/etc/mdrelay/password".into()),
            nats_tls_ca_file: Some("/etc/mdrelay/ca.pem".into()),
            nats_pending_messages: Some(4096),
            nats_name: Some("desk-3".into()),
            line_b: Some("239.255.1.1:9300".into()),
            interface_b: Some("127.0.0.2".into()),
            recovery: Some("publisher:9101".into()),
            recovery_delay: Some(Duration::from_millis(7)),
            recovery_retry: Some(Duration::from_millis(70)),
            recovery_attempts: Some(7),
            recovery_linger: Some(Duration::from_millis(2500)),
            resume: Some(false),
            from_start: true,
            snapshot: true,
            symbols: Some(vec!["AAPL".into(), "IBM".into()]),
            crc: true,
            key_file: Some("/etc/mdrelay/wire.key".into()),
            key: None,
            echo_every: Some(10),
            reconnect_max: Some(Duration::from_secs(3)),
            give_up_after: Some(Duration::from_secs(45)),
            connect_timeout: Some(Duration::from_millis(1500)),
            receive_buffer: Some(8 << 20),
            profile: Profile::LowLatency,
            idle: Some(IdleStrategy::Backoff),
            busy_poll: Some(false),
            frame_bytes: true,
        }
    }

    #[test]
    fn every_field_reads_back_from_toml_and_json_as_written() {
        let settings = every_field_set();
        let toml_text = toml::to_string(&settings).unwrap();
        assert_eq!(from_toml(&toml_text).unwrap(), settings, "{toml_text}");
        let json = serde_json::to_string(&settings).unwrap();
        assert_eq!(serde_json::from_str::<Settings>(&json).unwrap(), settings, "{json}");
        // Each field alone too: none depends on another to be read.
        for (key, value) in toml::Table::try_from(&settings).unwrap() {
            let one = toml::Table::from_iter([(key.clone(), value)]);
            let read: Settings = one.clone().try_into().unwrap_or_else(|e| panic!("{key}: {e}"));
            assert_ne!(read, Settings::default(), "{key} is read");
            let written = toml::Table::try_from(&read).unwrap();
            assert_eq!(written.get(&key), one.get(&key), "{key} reads back as written");
        }
    }

    #[test]
    fn written_settings_read_back_the_same() {
        let settings = Settings {
            nats: Some("nats://127.0.0.1:4222".into()),
            nats_stream: Some("MD".into()),
            nats_start_at: Some(SystemTime::UNIX_EPOCH + Duration::from_secs(1_764_167_400)),
            give_up_after: Some(Duration::from_millis(1500)),
            nats_pending_messages: Some(1024),
            ..Settings::default()
        };
        let text = toml::to_string(&settings).unwrap();
        assert!(text.contains("nats_start_at = \"2025-11-26T14:30:00Z\""), "{text}");
        assert!(text.contains("give_up_after = 1.5"), "{text}");
        assert_eq!(from_toml(&text).unwrap(), settings);
        let datetime = from_toml("nats = \"nats://h:4222\"\nnats_start_at = 2025-11-26T14:30:00Z").unwrap();
        assert_eq!(datetime.nats_start_at, settings.nats_start_at, "a TOML date-time is a time too");
    }

    #[test]
    fn unknown_keys_wrong_types_and_bad_units_are_refused_by_name() {
        for (text, words) in [
            ("recovery_dela = 1", "unknown field `recovery_dela`"),
            ("recovery_delay = \"soon\"", "\"soon\" is not a duration"),
            ("recovery_delay = -1", "is not a duration"),
            ("recovery_attempts = 2.5", "invalid type"),
            ("nats_start_at = \"yesterday\"", "is not an RFC 3339 time"),
            ("profile = \"fastest\"", "unknown variant `fastest`"),
            ("key = \"00\"", "unknown field `key`"),
        ] {
            let error = from_toml(text).unwrap_err();
            assert!(error.contains(words), "{text}: {error}");
        }
    }

    #[test]
    fn the_effective_settings_write_in_the_transports_defaults_and_check_again() {
        let ms = Duration::from_millis;
        let cases = [
            ("udp = \"127.0.0.1:0\"\nrecovery = \"h:1\"", (ms(5), ms(50), 10, ms(2000))),
            ("nats = \"nats://h:4222\"\nnats_stream = \"MD\"", (ms(20), ms(250), 12, ms(10_000))),
        ];
        // A build without the nats feature refuses a NATS transport.
        for (text, expected) in
            cases.into_iter().filter(|(text, _)| cfg!(feature = "nats") || !text.starts_with("nats"))
        {
            let effective = from_toml(text).unwrap().effective().unwrap();
            let timings = (
                effective.recovery_delay.unwrap(),
                effective.recovery_retry.unwrap(),
                effective.recovery_attempts.unwrap(),
                effective.recovery_linger.unwrap(),
            );
            assert_eq!(timings, expected, "{text}");
            assert_eq!(effective.idle, Some(IdleStrategy::Sleep));
            assert_eq!(effective.effective().unwrap(), effective, "{text}: the defaults check again as given");
        }
        let tcp = from_toml("tcp = \"h:1\"\nprofile = \"low-latency\"").unwrap().effective().unwrap();
        assert_eq!(
            (tcp.reconnect_max, tcp.connect_timeout, tcp.resume),
            (Some(DEFAULT_RECONNECT_MAX), Some(DEFAULT_CONNECT_TIMEOUT), Some(true))
        );
        assert_eq!((tcp.idle, tcp.busy_poll, tcp.receive_buffer), (Some(IdleStrategy::Spin), Some(true), None));
        let multicast = from_toml("multicast = \"239.255.0.1:1\"\nline_b = \"239.255.0.2:1\"").unwrap();
        let multicast = multicast.effective().unwrap();
        assert_eq!(
            (multicast.interface.as_deref(), multicast.interface_b.as_deref()),
            (Some("0.0.0.0"), Some("0.0.0.0"))
        );
        assert_eq!(multicast.receive_buffer, Some(DEFAULT_RECEIVE_BUFFER));
    }

    #[test]
    fn one_transport_is_required_and_the_second_is_named() {
        let setting = |s: Settings| s.check().unwrap_err().setting();
        assert_eq!(setting(Settings::default()), Some("tcp"));
        let both = from_toml("tcp = \"h:1\"\nudp = \"127.0.0.1:0\"").unwrap();
        assert_eq!(setting(both), Some("udp"));
        let interface = from_toml("udp = \"127.0.0.1:0\"\ninterface = \"127.0.0.1\"").unwrap();
        assert_eq!(setting(interface), Some("interface"));
        let subject = from_toml("tcp = \"h:1\"\nnats_subject = \"md.x\"").unwrap();
        assert_eq!(setting(subject), Some("nats_subject"));
    }
}

#[cfg(test)]
mod key_file_tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn a_key_file_is_64_hex_digits_its_owner_alone_reads_and_no_more_of_it_is_read() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("wire.key");
        std::fs::write(&path, format!("{}\n", "ab".repeat(32))).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = read_key_file(&path).unwrap_err().to_string();
        assert!(e.contains("chmod 600") && e.contains("wire.key"), "{e}");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(read_key_file(&path).unwrap(), WireKey::new([0xab; 32]));
        std::fs::write(&path, "not a key").unwrap();
        let e = read_key_file(&path).unwrap_err().to_string();
        assert!(e.contains("64 hex digits") && e.contains("openssl rand -hex 32"), "{e}");
        let e = read_key_file(&dir.path().join("missing")).unwrap_err().to_string();
        assert!(e.contains("missing"), "{e}");
        // A large file is read no further than a key could be long.
        std::fs::write(&path, vec![b'a'; 16 << 20]).unwrap();
        let e = read_key_file(&path).unwrap_err().to_string();
        assert!(e.contains("over 1024 bytes"), "{e}");
    }
}
