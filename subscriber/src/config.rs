//! Settings: a TOML file (`--config`) overridden by command-line flags, validated once at start
//! into [`Settings`], so a bad setting fails before anything is bound or connected, with a
//! message naming the setting (and, for the file, the file and line).

use clap::{Parser, ValueEnum};
use mdrelay_client::{NatsAuth, NatsSetting, check_host_port};
use mdrelay_proto::Symbol;
use mdrelay_proto::idle::{IdleStrategy, Profile};
use mdrelay_proto::relay::{ProtectionSection, ProtectionSettings};
use mdrelay_telemetry::config_file::{Reading, read_text, toml_error_message};
use mdrelay_telemetry::prometheus::{MetricsSection, MetricsSettings};
use mdrelay_telemetry::units::{Seconds, parse_seconds};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};
use toml::Spanned;

/// mdrelay subscriber: receives a publisher's stream over TCP, UDP or multicast, decodes it
/// (the format comes from the publisher), aggregates per symbol and reports loss and latency.
#[derive(Debug, Default, Parser)]
#[command(name = "mdrelay-sub", version, about, allow_negative_numbers = true)]
pub struct Cli {
    /// TOML configuration file; flags given here override its settings.
    #[arg(long, short, value_name = "FILE", env = "MDRELAY_SUB_CONFIG")]
    pub config: Option<PathBuf>,
    /// TCP: connect to a publisher at HOST:PORT (reconnects when the connection drops).
    #[arg(long, value_name = "HOST:PORT", env = "MDRELAY_SUB_CONNECT", help_heading = "Transport")]
    pub connect: Option<String>,
    /// UDP unicast: listen on ADDR:PORT (port 0 picks a free port, logged at start).
    #[arg(long, value_name = "ADDR:PORT", env = "MDRELAY_SUB_LISTEN", help_heading = "Transport")]
    pub listen: Option<String>,
    /// UDP multicast: join GROUP:PORT (an IPv4 multicast group).
    #[arg(long, value_name = "GROUP:PORT", env = "MDRELAY_SUB_GROUP", help_heading = "Transport")]
    pub group: Option<String>,
    /// Multicast: the local interface address to join the group on (default 0.0.0.0).
    #[arg(long, value_name = "ADDR", env = "MDRELAY_SUB_INTERFACE", help_heading = "Transport")]
    pub interface: Option<String>,
    /// NATS: the servers' URLs (comma-separated, nats://HOST:PORT) of a publisher's `[nats]` output.
    #[arg(long, value_name = "URLS", env = "MDRELAY_SUB_NATS", help_heading = "NATS")]
    pub nats: Option<String>,
    /// NATS: the subject the stream is published to (default mdrelay.1).
    #[arg(long, value_name = "SUBJECT", env = "MDRELAY_SUB_NATS_SUBJECT", help_heading = "NATS")]
    pub nats_subject: Option<String>,
    /// NATS: the JetStream stream that stores the subject, replayed by --from-start.
    #[arg(long, value_name = "NAME", env = "MDRELAY_SUB_NATS_STREAM", help_heading = "NATS")]
    pub nats_stream: Option<String>,
    /// NATS with --nats-stream: start with the first message the stream stored at or after this
    /// RFC 3339 time (e.g. 2026-11-26T14:30:00Z), replayed, then the live subject.
    #[arg(long, value_name = "TIME", env = "MDRELAY_SUB_NATS_START_AT", help_heading = "NATS")]
    pub nats_start_at: Option<String>,
    /// NATS: authenticate with this .creds file (JWT and nkey seed).
    #[arg(long, value_name = "FILE", env = "MDRELAY_SUB_NATS_CREDS_FILE", help_heading = "NATS")]
    pub nats_creds_file: Option<PathBuf>,
    /// NATS: authenticate with the nkey seed in this file.
    #[arg(long, value_name = "FILE", env = "MDRELAY_SUB_NATS_NKEY_FILE", help_heading = "NATS")]
    pub nats_nkey_file: Option<PathBuf>,
    /// NATS: authenticate as this user, with --nats-password-file.
    #[arg(long, value_name = "USER", env = "MDRELAY_SUB_NATS_USER", help_heading = "NATS")]
    pub nats_user: Option<String>,
    /// NATS: the file holding --nats-user's password.
    #[arg(long, value_name = "FILE", env = "MDRELAY_SUB_NATS_PASSWORD_FILE", help_heading = "NATS")]
    pub nats_password_file: Option<PathBuf>,
    /// NATS: check the servers' TLS certificates with the CA certificates (PEM) in this file, and
    /// require TLS.
    #[arg(long, value_name = "FILE", env = "MDRELAY_SUB_NATS_TLS_CA_FILE", help_heading = "NATS")]
    pub nats_tls_ca_file: Option<PathBuf>,
    /// NATS: messages held for the subscription while the subscriber does not read them (16 to
    /// 16777216, default 65536); past it they are dropped and repaired from --nats-stream.
    #[arg(long, value_name = "N", env = "MDRELAY_SUB_NATS_PENDING_MESSAGES", help_heading = "NATS")]
    pub nats_pending_messages: Option<u64>,
    /// NATS: once the stream has started, give up on it (exit 1) when nothing new came for this
    /// many seconds, or a duration such as 1m: no frame on the subject nor in --nats-stream's
    /// tail (default 30).
    #[arg(long, value_name = "DURATION", value_parser = parse_seconds, env = "MDRELAY_SUB_NATS_GIVE_UP_AFTER", help_heading = "NATS")]
    pub nats_give_up_after: Option<f64>,
    /// Aggregate and report only these symbols (comma-separated or repeated).
    #[arg(long, value_name = "SYMBOL", value_delimiter = ',', env = "MDRELAY_SUB_SYMBOLS", help_heading = "Report")]
    pub symbols: Option<Vec<String>>,
    /// Latency mode; round-trip also echoes publish times back to the publisher.
    #[arg(long, value_enum, env = "MDRELAY_SUB_LATENCY", help_heading = "Report")]
    pub latency: Option<LatencyMode>,
    /// Round-trip mode: echo every Nth frame (default 1).
    #[arg(long, value_name = "N", env = "MDRELAY_SUB_ECHO_EVERY", help_heading = "Report")]
    pub echo_every: Option<u64>,
    /// Seconds between interval lines on stderr, or a duration such as 500ms (default 5; 0: none).
    #[arg(long, value_name = "DURATION", value_parser = parse_seconds, env = "MDRELAY_SUB_REPORT_INTERVAL", help_heading = "Report")]
    pub report_interval: Option<f64>,
    /// Write the final report as JSON to FILE ("-": stdout, and the text report goes to stderr).
    #[arg(long, value_name = "FILE", env = "MDRELAY_SUB_JSON", help_heading = "Report")]
    pub json: Option<String>,
    /// Write an HdrHistogram interval log of one-way latency (ns), one interval per report period.
    #[arg(long, value_name = "FILE", env = "MDRELAY_SUB_HISTOGRAM_LOG", help_heading = "Report")]
    pub histogram_log: Option<PathBuf>,
    /// Record what is received to FILE as an IEX-TP capture, in arrival order, whatever the
    /// wire format: pcapng if the name ends in .pcapng, else pcap; gzipped if it ends in .gz
    /// (e.g. day.pcapng.gz). An existing file is refused unless --record-overwrite is given; a
    /// symbolic link always is.
    #[arg(long, value_name = "FILE", env = "MDRELAY_SUB_RECORD", help_heading = "Recording")]
    pub record: Option<PathBuf>,
    /// Recording: replace an existing file at the --record path (with rotation, the numbered files
    /// of an earlier recording there). Never through a symbolic link.
    #[arg(long, visible_alias = "force", env = "MDRELAY_SUB_RECORD_OVERWRITE", help_heading = "Recording")]
    pub record_overwrite: bool,
    /// Recording: start a new file once the current one holds SIZE bytes (compressed, when
    /// gzipped): a number of bytes or e.g. 512MiB, 1GB, 2GiB. Files are numbered: day.pcap.gz
    /// becomes day.000001.pcap.gz, day.000002.pcap.gz, ...
    #[arg(long, value_name = "SIZE", env = "MDRELAY_SUB_RECORD_ROTATE_SIZE", help_heading = "Recording")]
    pub record_rotate_size: Option<String>,
    /// Recording: start a new file once the current one spans this many seconds of receive time
    /// (or a duration such as 1h).
    #[arg(long, value_name = "DURATION", value_parser = parse_seconds, env = "MDRELAY_SUB_RECORD_ROTATE_INTERVAL", help_heading = "Recording")]
    pub record_rotate_interval: Option<f64>,
    /// Recording with rotation: keep at most N files, removing the oldest.
    #[arg(long, value_name = "N", env = "MDRELAY_SUB_RECORD_MAX_FILES", help_heading = "Recording")]
    pub record_max_files: Option<u64>,
    /// Stop once this many messages have been received (`--count` in earlier releases).
    #[arg(long, value_name = "N", alias = "count", env = "MDRELAY_SUB_MAX_MESSAGES", help_heading = "Report")]
    pub max_messages: Option<u64>,
    /// Stop after this many seconds (or a duration such as 10m).
    #[arg(long, value_name = "DURATION", value_parser = parse_seconds, env = "MDRELAY_SUB_DURATION", help_heading = "Report")]
    pub duration: Option<f64>,
    /// TCP: the longest wait between reconnection attempts, seconds or e.g. 500ms (default 5;
    /// `--reconnect-max-seconds` in earlier releases).
    #[arg(long, value_name = "DURATION", value_parser = parse_seconds, alias = "reconnect-max-seconds", env = "MDRELAY_SUB_RECONNECT_MAX", help_heading = "TCP")]
    pub reconnect_max: Option<f64>,
    /// UDP and multicast: the publisher's retransmission service at HOST:PORT; missing frames
    /// are asked for there.
    #[arg(long, value_name = "HOST:PORT", env = "MDRELAY_SUB_RECOVERY", help_heading = "Recovery")]
    pub recovery: Option<String>,
    /// Recovery: how long to wait after a gap is seen before asking, seconds or e.g. 5ms
    /// (default 5ms).
    #[arg(long, value_name = "DURATION", value_parser = parse_seconds, env = "MDRELAY_SUB_RECOVERY_DELAY", help_heading = "Recovery")]
    pub recovery_delay: Option<f64>,
    /// Recovery: how long without an answer before asking again, seconds or e.g. 50ms (default
    /// 50ms); doubles with each further unanswered request for the same frames, up to 8 times.
    #[arg(long, value_name = "DURATION", value_parser = parse_seconds, env = "MDRELAY_SUB_RECOVERY_RETRY", help_heading = "Recovery")]
    pub recovery_retry: Option<f64>,
    /// Earlier releases' name of --recovery-delay, in milliseconds.
    #[arg(long, value_name = "MS", hide = true, env = "MDRELAY_SUB_RECOVERY_DELAY_MS", help_heading = "Recovery")]
    pub recovery_delay_ms: Option<u64>,
    /// Earlier releases' name of --recovery-retry, in milliseconds.
    #[arg(long, value_name = "MS", hide = true, env = "MDRELAY_SUB_RECOVERY_RETRY_MS", help_heading = "Recovery")]
    pub recovery_retry_ms: Option<u64>,
    /// Recovery: requests per gap before it is given up (default 10).
    #[arg(long, value_name = "N", env = "MDRELAY_SUB_RECOVERY_ATTEMPTS", help_heading = "Recovery")]
    pub recovery_attempts: Option<u64>,
    /// Recovery: seconds to keep waiting for missing frames after the end of stream, or a
    /// duration such as 500ms (default 2).
    #[arg(long, value_name = "DURATION", value_parser = parse_seconds, env = "MDRELAY_SUB_RECOVERY_LINGER", help_heading = "Recovery")]
    pub recovery_linger: Option<f64>,
    /// The whole session from its first frame: over TCP the publisher is asked for it (as far as
    /// its ring holds it); over UDP every frame from the first is owed, so frames lost before the
    /// first received count (and, with recovery, are asked for).
    #[arg(long, env = "MDRELAY_SUB_FROM_START", help_heading = "Recovery")]
    pub from_start: bool,
    /// Multicast A/B: the second line's GROUP:PORT.
    #[arg(long, value_name = "GROUP:PORT", env = "MDRELAY_SUB_GROUP_B", help_heading = "Transport")]
    pub group_b: Option<String>,
    /// Multicast A/B: the local interface address to join the second line on (default 0.0.0.0).
    #[arg(long, value_name = "ADDR", env = "MDRELAY_SUB_INTERFACE_B", help_heading = "Transport")]
    pub interface_b: Option<String>,
    /// UDP A/B: listen for the second line on ADDR:PORT.
    #[arg(long, value_name = "ADDR:PORT", env = "MDRELAY_SUB_LISTEN_B", help_heading = "Transport")]
    pub listen_b: Option<String>,
    /// Profile: default (wait for readiness) or low-latency (busy-poll the socket, SO_BUSY_POLL,
    /// the receive thread pinned to --core) [default: default].
    #[arg(long, value_name = "PROFILE", env = "MDRELAY_SUB_PROFILE", help_heading = "Latency and CPU")]
    pub profile: Option<Profile>,
    /// How the receive loop waits: spin, yield, backoff (busy-poll, then wait) or sleep (wait for
    /// readiness) [default: the profile's].
    #[arg(long, value_name = "STRATEGY", env = "MDRELAY_SUB_IDLE", help_heading = "Latency and CPU")]
    pub idle: Option<IdleStrategy>,
    /// Pin the receive thread, the subscriber's hot thread, to this CPU (`--core` in earlier
    /// releases).
    #[arg(long, value_name = "N", alias = "core", env = "MDRELAY_SUB_HOT_CORE", help_heading = "Latency and CPU")]
    pub hot_core: Option<usize>,
    /// Serve Prometheus metrics on ADDR:PORT (e.g. 127.0.0.1:9901).
    #[arg(long, value_name = "ADDR:PORT", env = "MDRELAY_SUB_METRICS_LISTEN", help_heading = "Metrics")]
    pub metrics_listen: Option<String>,
    /// Metrics: seconds the endpoint stays up after the run, for the last scrape, or a duration
    /// such as 30s (default 0).
    #[arg(long, value_name = "DURATION", value_parser = parse_seconds, env = "MDRELAY_SUB_METRICS_HOLD", help_heading = "Metrics")]
    pub metrics_hold: Option<f64>,
    /// Logging: --log-format, --log-level.
    #[command(flatten)]
    pub log: mdrelay_telemetry::logs::LogArgs,
    /// Documentation: --generate-completions, --generate-man.
    #[command(flatten)]
    pub docs: mdrelay_telemetry::docs::DocArgs,
    /// Check the configuration, print the settings it amounts to and exit.
    #[arg(long)]
    pub check: bool,
    /// Not a setting: the format comes from the publisher. Accepted only to explain that.
    #[arg(long, hide = true)]
    pub format: Option<String>,
    /// The flags given (on the command line or in the environment), for naming where each
    /// setting came from.
    #[arg(skip)]
    pub given: Vec<mdrelay_telemetry::settings::GivenFlag>,
}

/// How latency is measured.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum LatencyMode {
    /// Receive time minus the frame's publish time (clocks of both hosts must agree).
    #[default]
    OneWay,
    /// One-way, plus echoes so the publisher measures the round trip on its own clock.
    RoundTrip,
}

impl LatencyMode {
    /// The name in reports and metrics' labels.
    pub fn name(self) -> &'static str {
        match self {
            LatencyMode::OneWay => "one-way",
            LatencyMode::RoundTrip => "round-trip",
        }
    }
}

/// A time as TOML writes it: a string, or a bare offset date-time.
#[derive(Clone, Debug, Deserialize)]
#[serde(untagged)]
enum TimeText {
    Text(String),
    Datetime(toml::value::Datetime),
}

impl TimeText {
    fn text(self) -> String {
        match self {
            TimeText::Text(t) => t,
            TimeText::Datetime(d) => d.to_string(),
        }
    }
}

/// Keys of earlier releases still read, and the settings they are now (`recovery_delay_ms` and
/// `recovery_retry_ms` are in milliseconds, the others in the new key's unit).
const EARLIER_NAMES: &[(&str, &str)] = &[
    ("count", "max_messages"),
    ("core", "hot_core"),
    ("reconnect_max_seconds", "reconnect_max"),
    ("recovery_delay_ms", "recovery_delay"),
    ("recovery_retry_ms", "recovery_retry"),
];

/// The configuration file as written; every key optional, unknown keys refused.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    connect: Option<Spanned<String>>,
    listen: Option<Spanned<String>>,
    group: Option<Spanned<String>>,
    interface: Option<Spanned<String>>,
    nats: Option<Spanned<String>>,
    nats_subject: Option<Spanned<String>>,
    nats_stream: Option<Spanned<String>>,
    nats_start_at: Option<Spanned<TimeText>>,
    nats_creds_file: Option<Spanned<PathBuf>>,
    nats_nkey_file: Option<Spanned<PathBuf>>,
    nats_user: Option<Spanned<String>>,
    nats_password_file: Option<Spanned<PathBuf>>,
    nats_tls_ca_file: Option<Spanned<PathBuf>>,
    nats_pending_messages: Option<Spanned<u64>>,
    nats_give_up_after: Option<Spanned<Seconds>>,
    symbols: Option<Spanned<Vec<String>>>,
    latency: Option<LatencyMode>,
    echo_every: Option<Spanned<u64>>,
    report_interval: Option<Spanned<Seconds>>,
    json: Option<String>,
    histogram_log: Option<PathBuf>,
    record: Option<PathBuf>,
    record_overwrite: Option<Spanned<bool>>,
    record_rotate_size: Option<Spanned<ByteSize>>,
    record_rotate_interval: Option<Spanned<Seconds>>,
    record_max_files: Option<Spanned<u64>>,
    #[serde(alias = "count")]
    max_messages: Option<Spanned<u64>>,
    duration: Option<Spanned<Seconds>>,
    #[serde(alias = "reconnect_max_seconds")]
    reconnect_max: Option<Spanned<Seconds>>,
    recovery: Option<Spanned<String>>,
    recovery_delay: Option<Spanned<Seconds>>,
    recovery_retry: Option<Spanned<Seconds>>,
    /// Earlier releases' `recovery_delay`, in milliseconds.
    recovery_delay_ms: Option<Spanned<u64>>,
    /// Earlier releases' `recovery_retry`, in milliseconds.
    recovery_retry_ms: Option<Spanned<u64>>,
    recovery_attempts: Option<Spanned<u64>>,
    recovery_linger: Option<Spanned<Seconds>>,
    from_start: Option<Spanned<bool>>,
    group_b: Option<Spanned<String>>,
    interface_b: Option<Spanned<String>>,
    listen_b: Option<Spanned<String>>,
    profile: Option<Profile>,
    idle: Option<IdleStrategy>,
    #[serde(alias = "core")]
    hot_core: Option<Spanned<usize>>,
    #[serde(default)]
    metrics: MetricsSection,
    #[serde(default)]
    protection: ProtectionSection,
}

/// Where the stream comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Transport {
    /// TCP to a publisher at `host:port` (resolved at each connection attempt).
    Tcp(String),
    /// UDP datagrams sent to this local address.
    Udp(SocketAddr),
    /// UDP multicast: the group and port, and the local interface to join on.
    Multicast {
        /// Group address and port.
        group: SocketAddr,
        /// Local interface address.
        interface: Ipv4Addr,
    },
    /// NATS: a publisher's `[nats]` subject.
    Nats {
        /// Server URLs, comma-separated.
        servers: String,
        /// The subject.
        subject: String,
        /// The JetStream stream that stores it, for `from_start`, a start time and gap repair.
        stream: Option<String>,
        /// Where to start, credentials, TLS and the subscription's pending limit.
        options: NatsOptions,
    },
}

/// NATS settings besides the servers, subject and stream; `None`: the library's default.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NatsOptions {
    /// Start with the stream's first message stored at or after this time.
    pub start_at: Option<SystemTime>,
    /// The credentials.
    pub auth: NatsAuth,
    /// CA certificates (PEM) the servers' are checked with; TLS is required.
    pub tls_ca_file: Option<PathBuf>,
    /// Messages held for the subscription while it is not read.
    pub pending_messages: Option<usize>,
}

impl fmt::Display for Transport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Transport::Tcp(addr) => write!(f, "tcp {addr}"),
            Transport::Udp(addr) => write!(f, "udp {addr}"),
            Transport::Multicast { group, interface } => write!(f, "multicast {group} on {interface}"),
            Transport::Nats { servers, subject, .. } => write!(f, "nats {subject} on {servers}"),
        }
    }
}

/// Where the JSON report goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum JsonTarget {
    /// Standard output.
    Stdout,
    /// A file.
    File(PathBuf),
}

/// Validated settings.
#[derive(Clone, Debug)]
pub struct Settings {
    /// The one transport.
    pub transport: Transport,
    /// Symbols to aggregate; `None`: all.
    pub symbols: Option<Vec<Symbol>>,
    /// Latency mode.
    pub latency: LatencyMode,
    /// Round-trip mode: echo every Nth frame.
    pub echo_every: u64,
    /// Interval between report lines; `None`: no interval lines.
    pub report_interval: Option<Duration>,
    /// JSON report destination.
    pub json: Option<JsonTarget>,
    /// HdrHistogram interval log file.
    pub histogram_log: Option<PathBuf>,
    /// Where and how the frames taken are recorded (see `record`).
    pub record: Option<RecordSettings>,
    /// The Prometheus endpoint, if any.
    pub metrics: Option<MetricsSettings>,
    /// Per-frame CRC-32C and encryption expected of the publisher.
    pub protection: ProtectionSettings,
    /// Stop after this many messages.
    pub count: Option<u64>,
    /// Stop after this long.
    pub duration: Option<Duration>,
    /// Cap of the TCP reconnection backoff.
    pub reconnect_max: Duration,
    /// NATS: how long a started stream may bring nothing new before it is given up.
    pub nats_give_up_after: Option<Duration>,
    /// UDP and multicast: the publisher's retransmission service, and when to ask it.
    pub recovery: Option<RecoverySettings>,
    /// The whole session from its first frame is wanted (TCP: asked for; UDP: owed).
    pub from_start: bool,
    /// A/B: the second line, of the same kind as the transport (UDP or multicast).
    pub line_b: Option<Transport>,
    /// The profile the idle strategy and socket options defaulted from.
    pub profile: Profile,
    /// How the receive loop waits for data.
    pub idle: IdleStrategy,
    /// The CPU the receive thread is pinned to, if any.
    pub core: Option<usize>,
    /// SO_BUSY_POLL on the receive sockets (the low-latency profile).
    pub busy_poll: bool,
}

/// Loss recovery through the publisher's retransmission service.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecoverySettings {
    /// The service's `host:port` (resolved at each connection attempt).
    pub server: String,
    /// Wait this long after a gap is seen before asking: reordering often fills it first.
    pub delay: Duration,
    /// Ask again after this long without an answer.
    pub retry: Duration,
    /// Requests per gap before it is given up.
    pub attempts: u32,
    /// After the end of stream, wait this long for frames still missing.
    pub linger: Duration,
}

/// `record`: the capture file the frames taken are written to, and its rotation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecordSettings {
    /// The capture file; with rotation, the name the numbered files are made from.
    pub path: PathBuf,
    /// Replace an existing file (never through a symbolic link).
    pub overwrite: bool,
    /// Start a new file once the current one holds this many bytes (compressed when gzipped).
    pub rotate_size: Option<u64>,
    /// Start a new file once the current one spans this long of receive time.
    pub rotate_interval: Option<Duration>,
    /// With rotation: keep at most this many files, removing the oldest.
    pub max_files: Option<u32>,
}

impl Settings {
    /// The configuration file that gives these settings, every setting written out (defaults
    /// too; a setting that is off, such as a recording, is left out): what `--check` prints.
    pub fn to_table(&self) -> toml::Table {
        use toml::Value;
        let mut t = toml::Table::new();
        let mut put = |key: &str, value: Value| {
            t.insert(key.to_string(), value);
        };
        let text = |v: &dyn fmt::Display| Value::String(v.to_string());
        let seconds = |d: Duration| Value::Float(d.as_secs_f64());
        let count = |n: u64| Value::Integer(i64::try_from(n).unwrap_or(i64::MAX));
        match &self.transport {
            Transport::Tcp(addr) => put("connect", text(addr)),
            Transport::Udp(addr) => put("listen", text(addr)),
            Transport::Multicast { group, interface } => {
                put("group", text(group));
                put("interface", text(interface));
            }
            Transport::Nats { servers, subject, stream, options } => {
                put("nats", text(servers));
                put("nats_subject", text(subject));
                if let Some(stream) = stream {
                    put("nats_stream", text(stream));
                }
                if let Some(at) = options.start_at {
                    put("nats_start_at", text(&humantime::format_rfc3339(at)));
                }
                let (creds_file, nkey_file, user, password_file) = options.auth.to_settings();
                let files = [
                    ("nats_creds_file", &creds_file),
                    ("nats_nkey_file", &nkey_file),
                    ("nats_password_file", &password_file),
                    ("nats_tls_ca_file", &options.tls_ca_file),
                ];
                for (key, file) in files {
                    if let Some(path) = file {
                        put(key, text(&path.display()));
                    }
                }
                if let Some(user) = &user {
                    put("nats_user", text(user));
                }
                if let Some(n) = options.pending_messages {
                    put("nats_pending_messages", count(n as u64));
                }
                if let Some(d) = self.nats_give_up_after {
                    put("nats_give_up_after", seconds(d));
                }
            }
        }
        match &self.line_b {
            Some(Transport::Udp(addr)) => put("listen_b", text(addr)),
            Some(Transport::Multicast { group, interface }) => {
                put("group_b", text(group));
                put("interface_b", text(interface));
            }
            _ => {}
        }
        put("from_start", Value::Boolean(self.from_start));
        put("reconnect_max", seconds(self.reconnect_max));
        if let Some(r) = &self.recovery {
            put("recovery", text(&r.server));
            put("recovery_delay", seconds(r.delay));
            put("recovery_retry", seconds(r.retry));
            put("recovery_attempts", count(u64::from(r.attempts)));
            put("recovery_linger", seconds(r.linger));
        }
        if let Some(symbols) = &self.symbols {
            put("symbols", Value::Array(symbols.iter().map(|s| text(s)).collect()));
        }
        put("latency", text(&self.latency.name()));
        put("echo_every", count(self.echo_every));
        put("report_interval", seconds(self.report_interval.unwrap_or_default()));
        match &self.json {
            Some(JsonTarget::Stdout) => put("json", text(&"-")),
            Some(JsonTarget::File(path)) => put("json", text(&path.display())),
            None => {}
        }
        if let Some(path) = &self.histogram_log {
            put("histogram_log", text(&path.display()));
        }
        if let Some(r) = &self.record {
            put("record", text(&r.path.display()));
            put("record_overwrite", Value::Boolean(r.overwrite));
            if let Some(size) = r.rotate_size {
                put("record_rotate_size", count(size));
            }
            if let Some(interval) = r.rotate_interval {
                put("record_rotate_interval", seconds(interval));
            }
            if let Some(n) = r.max_files {
                put("record_max_files", count(u64::from(n)));
            }
        }
        if let Some(n) = self.count {
            put("max_messages", count(n));
        }
        if let Some(d) = self.duration {
            put("duration", seconds(d));
        }
        put("profile", text(&self.profile.name()));
        put("idle", text(&self.idle.name()));
        if let Some(core) = self.core {
            put("hot_core", count(core as u64));
        }
        let section = |value: Result<toml::Table, toml::ser::Error>| Value::Table(value.unwrap_or_default());
        if self.metrics.is_some() {
            put("metrics", section(toml::Table::try_from(MetricsSection::from(self.metrics))));
        }
        put("protection", section(toml::Table::try_from(ProtectionSection::from(&self.protection))));
        t
    }
}

impl RecordSettings {
    /// Whether the recording is split into numbered files.
    pub fn rotates(&self) -> bool {
        self.rotate_size.is_some() || self.rotate_interval.is_some()
    }
}

/// A configuration that cannot be used; the message names the setting.
#[derive(Debug)]
pub struct ConfigError(pub String);

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ConfigError {}

/// Where the values came from, to name a setting in errors as the publisher does:
/// `key (--flag)`, `key (MDRELAY_SUB_KEY)` or `key (FILE, line N)`.
struct Origin<'a> {
    file: Option<(&'a Path, &'a str)>,
    /// The flags given, on the command line or in the environment, by key.
    flags: BTreeMap<String, String>,
}

impl Origin<'_> {
    /// `key` as given by a flag or its environment variable.
    fn flag(&self, key: &str) -> String {
        match self.flags.get(key) {
            Some(given) => format!("{key} ({given})"),
            None => format!("{key} (--{})", key.replace('_', "-")),
        }
    }

    /// `key` as written at byte `span.start` of the file.
    fn file_key(&self, key: &str, span: std::ops::Range<usize>) -> String {
        match self.file {
            Some((path, text)) => format!("{key} ({})", mdrelay_telemetry::settings::file_line(path, text, span.start)),
            None => key.to_string(),
        }
    }

    /// Whether a name [`Origin::flag`] or [`Origin::file_key`] gave is a flag's (or its
    /// environment variable's) rather than the file's.
    fn is_flag(name: &str) -> bool {
        name.ends_with(')') && (name.contains(" (--") || name.contains(" (MDRELAY_"))
    }
}

/// The key each given flag sets (`--recovery-linger`: `recovery_linger`), with where it was given.
fn flag_origins(given: &[mdrelay_telemetry::settings::GivenFlag]) -> BTreeMap<String, String> {
    given
        .iter()
        .map(|flag| {
            let key = match flag.long.as_str() {
                "metrics-listen" => "metrics.listen".to_string(),
                "metrics-hold" => "metrics.hold".to_string(),
                long => long.replace('-', "_"),
            };
            (key, flag.origin.clone())
        })
        .collect()
}

/// A value with the name of where it was set.
struct Named<T> {
    value: T,
    name: String,
}

fn pick<T>(cli: Option<T>, file: Option<Spanned<T>>, key: &str, origin: &Origin<'_>) -> Option<Named<T>> {
    match (cli, file) {
        (Some(value), _) => Some(Named { value, name: origin.flag(key) }),
        (None, Some(s)) => {
            let name = origin.file_key(key, s.span());
            Some(Named { value: s.into_inner(), name })
        }
        (None, None) => None,
    }
}

/// A file that does not parse: toml's message names the line, column and key; a `format` key
/// gets its own explanation rather than the list of known keys.
fn file_error(path: &Path, text: &str, error: &toml::de::Error) -> ConfigError {
    if error.message().starts_with("unknown field `format`") {
        let origin = Origin { file: Some((path, text)), flags: BTreeMap::new() };
        return ConfigError(format!(
            "{}: the subscriber has no format setting: the format comes from the publisher (its greeting, \
             FORMAT records and every datagram header say it); remove the key",
            origin.file_key("format", error.span().unwrap_or(0..0))
        ));
    }
    ConfigError(format!("{}: {}", path.display(), toml_error_message(error)))
}

/// How to write a setting in the place the user wrote another: `--key value` or `key = "value"`.
fn suggest(origin_name: &str, key: &str, value: &str) -> String {
    if Origin::is_flag(origin_name) {
        format!("--{} {value}", key.replace('_', "-"))
    } else {
        format!("{key} = \"{value}\"")
    }
}

const DEFAULT_REPORT_INTERVAL: f64 = 5.0;
const DEFAULT_RECONNECT_MAX: f64 = 5.0;

impl Settings {
    /// Reads the file named by `--config` (if any; at most 1 MiB, as the publisher reads its own)
    /// and applies the flags over it.
    pub fn load(cli: Cli) -> Result<Settings, ConfigError> {
        Settings::load_with_origins(cli).map(|(settings, _)| settings)
    }

    /// As [`Settings::load`], with where each setting given came from, by key: the file and
    /// line, the flag, or the environment variable.
    pub fn load_with_origins(mut cli: Cli) -> Result<(Settings, BTreeMap<String, String>), ConfigError> {
        let path = cli.config.take();
        let text = match &path {
            // The loader both programs share: at most 1 MiB, whatever the path is (a pipe too).
            Some(path) => read_text(path, Reading::AtStart).map_err(|e| ConfigError(format!("{e:#}")))?,
            None => String::new(),
        };
        let flags = flag_origins(&cli.given);
        let mut origins = match &path {
            Some(path) => mdrelay_telemetry::settings::file_origins(path, &text),
            None => BTreeMap::new(),
        };
        origins.extend(flags.iter().map(|(key, given)| (key.clone(), given.clone())));
        for (earlier, now) in EARLIER_NAMES {
            if let Some(origin) = origins.remove(*earlier) {
                origins.insert(now.to_string(), format!("{origin}, under its earlier name {earlier}"));
            }
        }
        let file: FileConfig = match &path {
            Some(path) => toml::from_str(&text).map_err(|e| file_error(path, &text, &e))?,
            None => FileConfig::default(),
        };
        // natscli's NATS_CREDS, for a NATS subscriber that no other setting gives credentials.
        let over_nats = cli.nats.is_some() || file.nats.is_some();
        let credentials = [cli.nats_creds_file.is_some(), cli.nats_nkey_file.is_some(), cli.nats_user.is_some()]
            .into_iter()
            .chain([cli.nats_password_file.is_some(), file.nats_creds_file.is_some(), file.nats_nkey_file.is_some()])
            .chain([file.nats_user.is_some(), file.nats_password_file.is_some()])
            .any(|given| given);
        if over_nats
            && !credentials
            && let Some(creds) = std::env::var_os("NATS_CREDS").filter(|value| !value.is_empty())
        {
            cli.nats_creds_file = Some(PathBuf::from(creds));
            origins.insert("nats_creds_file".into(), "NATS_CREDS".into());
        }
        let origin = Origin { file: path.as_deref().map(|p| (p, text.as_str())), flags };
        Settings::build(cli, file, &origin).map(|settings| (settings, origins))
    }

    /// Checks the text of a configuration file named `path` (for messages), with no flags over it.
    pub fn from_toml(path: &Path, text: &str) -> Result<Settings, ConfigError> {
        let file: FileConfig = toml::from_str(text).map_err(|e| file_error(path, text, &e))?;
        Settings::build(Cli::default(), file, &Origin { file: Some((path, text)), flags: BTreeMap::new() })
    }

    fn build(cli: Cli, file: FileConfig, origin: &Origin<'_>) -> Result<Settings, ConfigError> {
        if cli.format.is_some() {
            return Err(ConfigError(
                "--format: the subscriber has no format setting: the format comes from the publisher (its \
                 greeting, FORMAT records and every datagram header say it)"
                    .into(),
            ));
        }

        let (transport, transport_from_file) = transport(&cli, &file, origin)?;
        let tie = Tie { transport: &transport, from_file: transport_from_file };
        let line_b = line_b(&cli, &file, origin, &tie)?;
        let recovery = recovery(&cli, &file, origin, &tie)?;
        let record = record(&cli, &file, origin)?;
        let from_start =
            pick(cli.from_start.then_some(true), file.from_start, "from_start", origin).is_some_and(|n| n.value);

        let symbols = match pick(cli.symbols, file.symbols, "symbols", origin) {
            None => None,
            Some(Named { value, name }) => {
                let mut out = Vec::with_capacity(value.len());
                for text in value {
                    let text = text.trim();
                    let symbol = Symbol::new(text).filter(|_| !text.is_empty()).ok_or_else(|| {
                        ConfigError(format!("{name}: {text:?} is not a symbol (1 to 8 ASCII characters)"))
                    })?;
                    out.push(symbol);
                }
                if out.is_empty() {
                    return Err(ConfigError(format!("{name}: the list is empty; leave it out to report every symbol")));
                }
                Some(out)
            }
        };

        let latency = cli.latency.or(file.latency).unwrap_or_default();
        let echo_every = match pick(cli.echo_every, file.echo_every, "echo_every", origin) {
            None => 1,
            Some(Named { value: 0, name }) => {
                return Err(ConfigError(format!("{name}: must be at least 1 (1 echoes every frame)")));
            }
            Some(n) => n.value,
        };

        let report_interval =
            seconds(cli.report_interval, file.report_interval, "report_interval", origin, true, MIN_TIMER)?
                .unwrap_or(Duration::from_secs_f64(DEFAULT_REPORT_INTERVAL));
        let report_interval = (!report_interval.is_zero()).then_some(report_interval);
        let duration = seconds(cli.duration, file.duration, "duration", origin, false, 0.0)?;
        let reconnect_max = seconds(cli.reconnect_max, file.reconnect_max, "reconnect_max", origin, false, MIN_TIMER)?
            .unwrap_or(Duration::from_secs_f64(DEFAULT_RECONNECT_MAX));
        // Refused without a NATS transport with the other NATS settings.
        let nats_give_up_after =
            seconds(cli.nats_give_up_after, file.nats_give_up_after, "nats_give_up_after", origin, false, MIN_TIMER)?;

        let count = match pick(cli.max_messages, file.max_messages, "max_messages", origin) {
            Some(Named { value: 0, name }) => {
                return Err(ConfigError(format!("{name}: must be at least 1 message")));
            }
            other => other.map(|n| n.value),
        };

        let json = match cli.json.or(file.json) {
            None => None,
            Some(s) if s == "-" => Some(JsonTarget::Stdout),
            Some(s) if s.is_empty() => return Err(ConfigError("json: empty file name (use \"-\" for stdout)".into())),
            Some(s) => Some(JsonTarget::File(PathBuf::from(s))),
        };
        let histogram_log = cli.histogram_log.or(file.histogram_log);
        let metrics = file
            .metrics
            .check(cli.metrics_listen.clone(), cli.metrics_hold)
            .map_err(|e| ConfigError(format!("{e:#}")))?;
        let protection = file.protection.check().map_err(ConfigError)?;

        let profile = cli.profile.or(file.profile).unwrap_or_default();
        let idle = cli.idle.or(file.idle).unwrap_or(match profile {
            // Waiting on the kernel costs nothing while the network is quiet.
            Profile::Default => IdleStrategy::Sleep,
            Profile::LowLatency => IdleStrategy::Spin,
        });
        let core = match pick(cli.hot_core, file.hot_core, "hot_core", origin) {
            None => None,
            Some(Named { value, name }) => {
                let allowed = crate::cpu::allowed_cpus();
                if !allowed.contains(&value) {
                    return Err(ConfigError(format!(
                        "{name}: {value} is not a CPU this process may run on (it may use {})",
                        crate::cpu::list(&allowed)
                    )));
                }
                Some(value)
            }
        };

        Ok(Settings {
            transport,
            symbols,
            latency,
            echo_every,
            report_interval,
            json,
            histogram_log,
            record,
            metrics,
            protection,
            count,
            duration,
            reconnect_max,
            nats_give_up_after,
            recovery,
            from_start,
            line_b,
            profile,
            idle,
            core,
            busy_poll: profile == Profile::LowLatency,
        })
    }
}

/// The shortest period of a repeating timer (report lines, reconnection attempts): shorter ones
/// would only busy the subscriber.
const MIN_TIMER: f64 = 0.01;

/// A number of seconds from the flag or the file: finite, at most a day, at least `min` unless
/// it is 0 where `zero_ok`.
fn seconds(
    cli: Option<f64>,
    file: Option<Spanned<Seconds>>,
    key: &str,
    origin: &Origin<'_>,
    zero_ok: bool,
    min: f64,
) -> Result<Option<Duration>, ConfigError> {
    let file = file.map(|s| {
        let span = s.span();
        Spanned::new(span, s.into_inner().0)
    });
    let Some(Named { value, name }) = pick(cli, file, key, origin) else {
        return Ok(None);
    };
    // A day bounds every timer here; larger values are typos, and Duration::from_secs_f64 would
    // panic on infinities.
    let ok = value.is_finite() && value <= 86_400.0 && ((value > 0.0 && value >= min) || (zero_ok && value == 0.0));
    if !ok {
        let range = match (zero_ok, min > 0.0) {
            (true, true) => format!("0, or {min} to 86400"),
            (true, false) => "0 to 86400".to_string(),
            (false, true) => format!("{min} to 86400"),
            (false, false) => "above 0 and at most 86400".to_string(),
        };
        return Err(ConfigError(format!("{name}: {value} seconds is out of range ({range})")));
    }
    Ok(Some(Duration::from_secs_f64(value)))
}

/// The transport, and whether it came from the file (no transport flag was given).
fn transport(cli: &Cli, file: &FileConfig, origin: &Origin<'_>) -> Result<(Transport, bool), ConfigError> {
    let file_given: Vec<(&str, &Spanned<String>)> =
        [("connect", &file.connect), ("listen", &file.listen), ("group", &file.group), ("nats", &file.nats)]
            .into_iter()
            .filter_map(|(k, v)| v.as_ref().map(|v| (k, v)))
            .collect();
    if file_given.len() > 1 {
        let names: Vec<String> = file_given.iter().map(|(k, v)| origin.file_key(k, v.span())).collect();
        return Err(ConfigError(format!(
            "several transports configured ({}): set exactly one of connect (TCP), listen (UDP), group (multicast) or nats",
            names.join(", ")
        )));
    }
    let cli_given: Vec<(&str, &String)> =
        [("connect", &cli.connect), ("listen", &cli.listen), ("group", &cli.group), ("nats", &cli.nats)]
            .into_iter()
            .filter_map(|(k, v)| v.as_ref().map(|v| (k, v)))
            .collect();
    if cli_given.len() > 1 {
        let names: Vec<String> = cli_given.iter().map(|(k, _)| origin.flag(k)).collect();
        return Err(ConfigError(format!(
            "several transports given ({}): use exactly one of --connect (TCP), --listen (UDP), --group (multicast) or --nats",
            names.join(", ")
        )));
    }
    // A transport flag replaces the file's transport, whichever it is.
    let (key, value, name) = match (cli_given.first(), file_given.first()) {
        (Some((k, v)), _) => (*k, (*v).clone(), origin.flag(k)),
        (None, Some((k, v))) => (*k, v.get_ref().clone(), origin.file_key(k, v.span())),
        (None, None) => {
            return Err(ConfigError(
                "no transport configured: set one of connect = \"host:port\" (TCP), listen = \"addr:port\" (UDP) \
                 or group = \"239.x.y.z:port\" (multicast), in the file or as --connect/--listen/--group"
                    .into(),
            ));
        }
    };

    // The file's interface goes with the file's transport: when a flag replaces that transport
    // with a unicast one, the interface is dropped with it rather than reported as misplaced.
    let transport_from_file = cli_given.is_empty();
    let interface = match (&cli.interface, &file.interface) {
        (Some(v), _) => Some((v.clone(), origin.flag("interface"), true)),
        (None, Some(s)) => Some((s.get_ref().clone(), origin.file_key("interface", s.span()), transport_from_file)),
        (None, None) => None,
    };
    let interface = match interface {
        Some((_, iname, true)) if key != "group" => {
            return Err(ConfigError(format!(
                "{iname}: an interface is only used to join a multicast group, and {name} is not one"
            )));
        }
        Some((_, _, false)) if key != "group" => None,
        other => other.map(|(text, iname, _)| (text, iname)),
    };

    let transport = match key {
        "connect" => {
            check_host_port(&value).map_err(|why| ConfigError(format!("{name}: {value:?} {why}")))?;
            Transport::Tcp(value)
        }
        "listen" => Transport::Udp(listen_addr(&value, &name, "listen", "group")?),
        "nats" => {
            let subject = pick(cli.nats_subject.clone(), file.nats_subject.clone(), "nats_subject", origin)
                .map_or_else(|| "mdrelay.1".to_string(), |s| s.value);
            let stream =
                pick(cli.nats_stream.clone(), file.nats_stream.clone(), "nats_stream", origin).map(|s| s.value);
            let options = nats_options(cli, file, origin, stream.is_some())?;
            Transport::Nats { servers: value, subject, stream, options }
        }
        _ => multicast(&value, &name, interface, "listen")?,
    };
    if !matches!(transport, Transport::Nats { .. }) {
        // Named as given: the flag's name, or the file's line.
        let named = |key: &str, flag: bool, span: Option<std::ops::Range<usize>>| match (flag, span) {
            (true, _) => Some(origin.flag(key)),
            (false, Some(span)) => Some(origin.file_key(key, span)),
            (false, None) => None,
        };
        let span = |s: &Option<Spanned<String>>| s.as_ref().map(|s| s.span());
        let path_span = |s: &Option<Spanned<PathBuf>>| s.as_ref().map(|s| s.span());
        let given = [
            named("nats_subject", cli.nats_subject.is_some(), span(&file.nats_subject)),
            named("nats_stream", cli.nats_stream.is_some(), span(&file.nats_stream)),
            named("nats_start_at", cli.nats_start_at.is_some(), file.nats_start_at.as_ref().map(|s| s.span())),
            named("nats_creds_file", cli.nats_creds_file.is_some(), path_span(&file.nats_creds_file)),
            named("nats_nkey_file", cli.nats_nkey_file.is_some(), path_span(&file.nats_nkey_file)),
            named("nats_user", cli.nats_user.is_some(), span(&file.nats_user)),
            named("nats_password_file", cli.nats_password_file.is_some(), path_span(&file.nats_password_file)),
            named("nats_tls_ca_file", cli.nats_tls_ca_file.is_some(), path_span(&file.nats_tls_ca_file)),
            named(
                "nats_pending_messages",
                cli.nats_pending_messages.is_some(),
                file.nats_pending_messages.as_ref().map(|s| s.span()),
            ),
            named(
                "nats_give_up_after",
                cli.nats_give_up_after.is_some(),
                file.nats_give_up_after.as_ref().map(|s| s.span()),
            ),
        ];
        if let Some(key) = given.into_iter().flatten().next() {
            return Err(ConfigError(format!("{key}: only used with a NATS transport (nats), and {name} is not one")));
        }
    }
    Ok((transport, transport_from_file))
}

/// The most `nats_pending_messages` (the library's limit).
const MAX_NATS_PENDING_MESSAGES: u64 = 1 << 24;
/// The fewest `nats_pending_messages`.
const MIN_NATS_PENDING_MESSAGES: u64 = 16;

/// A path setting from the flag or the file, refused when empty.
fn path_setting(
    cli: Option<PathBuf>,
    file: Option<Spanned<PathBuf>>,
    key: &str,
    origin: &Origin<'_>,
) -> Result<Option<Named<PathBuf>>, ConfigError> {
    match pick(cli, file, key, origin) {
        Some(Named { value, name }) if value.as_os_str().is_empty() => {
            Err(ConfigError(format!("{name}: empty file name")))
        }
        other => Ok(other),
    }
}

/// NATS's settings besides the servers, subject and stream (`with_stream`: one is set): a start
/// time (with the stream, not with `from_start`), one kind of credentials, TLS, the pending limit.
fn nats_options(
    cli: &Cli,
    file: &FileConfig,
    origin: &Origin<'_>,
    with_stream: bool,
) -> Result<NatsOptions, ConfigError> {
    let start_setting = file.nats_start_at.clone().map(|s| {
        let span = s.span();
        Spanned::new(span, s.into_inner().text())
    });
    let start_at = match pick(cli.nats_start_at.clone(), start_setting, "nats_start_at", origin) {
        None => None,
        Some(Named { value, name }) => {
            let time = time::OffsetDateTime::parse(value.trim(), &time::format_description::well_known::Rfc3339)
                .map_err(|e| {
                    ConfigError(format!(
                        "{name}: {value:?} is not an RFC 3339 time with its offset (e.g. \"2026-11-26T14:30:00Z\"): {e}"
                    ))
                })?;
            if time.unix_timestamp() < 0 {
                return Err(ConfigError(format!("{name}: {value} is before 1970")));
            }
            if !with_stream {
                return Err(ConfigError(format!(
                    "{name}: the start is replayed from JetStream: give the stream with nats_stream"
                )));
            }
            let from_start = cli.from_start || file.from_start.as_ref().is_some_and(|s| *s.get_ref());
            if from_start {
                return Err(ConfigError(format!("{name}: give from_start or a start time, not both")));
            }
            Some(SystemTime::from(time))
        }
    };
    let creds_file =
        path_setting(cli.nats_creds_file.clone(), file.nats_creds_file.clone(), "nats_creds_file", origin)?;
    let nkey_file = path_setting(cli.nats_nkey_file.clone(), file.nats_nkey_file.clone(), "nats_nkey_file", origin)?;
    let user = pick(cli.nats_user.clone(), file.nats_user.clone(), "nats_user", origin);
    let password_file =
        path_setting(cli.nats_password_file.clone(), file.nats_password_file.clone(), "nats_password_file", origin)?;
    let tls_ca_file =
        path_setting(cli.nats_tls_ca_file.clone(), file.nats_tls_ca_file.clone(), "nats_tls_ca_file", origin)?;
    if let Some(Named { value, name }) = &user
        && value.is_empty()
    {
        return Err(ConfigError(format!("{name}: empty user name")));
    }
    let name = |n: &Option<Named<_>>| n.as_ref().map(|n: &Named<_>| n.name.clone());
    let names = [
        (NatsSetting::CredsFile, name(&creds_file)),
        (NatsSetting::NkeyFile, name(&nkey_file)),
        (NatsSetting::User, user.as_ref().map(|n| n.name.clone())),
        (NatsSetting::PasswordFile, name(&password_file)),
    ];
    let auth = NatsAuth::from_settings(
        creds_file.map(|n| n.value),
        nkey_file.map(|n| n.value),
        user.map(|n| n.value),
        password_file.map(|n| n.value),
    )
    .map_err(|e| {
        // Each setting by the name its origin gives it, with the others given beside it.
        let at_fault = names.iter().find(|(s, _)| *s == e.setting).and_then(|(_, n)| n.clone());
        let others: Vec<&str> =
            names.iter().filter(|(s, _)| *s != e.setting).filter_map(|(_, n)| n.as_deref()).collect();
        let also = if others.is_empty() { String::new() } else { format!(" (also given: {})", others.join(", ")) };
        ConfigError(format!("{}: {}{also}", at_fault.unwrap_or_else(|| format!("nats_{}", e.setting)), e.reason))
    })?;
    let pending_messages =
        match pick(cli.nats_pending_messages, file.nats_pending_messages.clone(), "nats_pending_messages", origin) {
            None => None,
            Some(Named { value, name })
                if !(MIN_NATS_PENDING_MESSAGES..=MAX_NATS_PENDING_MESSAGES).contains(&value) =>
            {
                return Err(ConfigError(format!(
                    "{name}: {value} is out of range ({MIN_NATS_PENDING_MESSAGES} to {MAX_NATS_PENDING_MESSAGES})"
                )));
            }
            // At most 16 Mi by the range check.
            Some(n) => Some(n.value as usize),
        };
    Ok(NatsOptions { start_at, auth, tls_ca_file: tls_ca_file.map(|n| n.value), pending_messages })
}

/// A unicast `addr:port` to listen on (`key` is the setting, `group_key` its multicast twin).
fn listen_addr(value: &str, name: &str, key: &str, group_key: &str) -> Result<SocketAddr, ConfigError> {
    let addr: SocketAddr = value.parse().map_err(|_| {
        ConfigError(format!("{name}: {value:?} is not an address:port (e.g. \"0.0.0.0:9200\" or \"[::]:9200\")"))
    })?;
    if addr.ip().is_multicast() {
        return Err(ConfigError(format!(
            "{name}: {} is a multicast address; {key} takes a unicast address, use {} to join a multicast group",
            addr.ip(),
            suggest(name, group_key, &addr.to_string())
        )));
    }
    Ok(addr)
}

/// A multicast `group:port` and the interface to join it on (`listen_key`: the unicast twin).
fn multicast(
    value: &str,
    name: &str,
    interface: Option<(String, String)>,
    listen_key: &str,
) -> Result<Transport, ConfigError> {
    let addr: SocketAddr = value
        .parse()
        .map_err(|_| ConfigError(format!("{name}: {value:?} is not a group:port (e.g. \"239.255.0.1:9300\")")))?;
    let group = match addr.ip() {
        IpAddr::V4(ip) if ip.is_multicast() => ip,
        IpAddr::V4(ip) => {
            return Err(ConfigError(format!(
                "{name}: {ip} is not a multicast address (224.0.0.0/4); for unicast UDP use {}",
                suggest(name, listen_key, &addr.to_string())
            )));
        }
        IpAddr::V6(_) => {
            return Err(ConfigError(format!("{name}: {addr} is IPv6; only IPv4 multicast groups are supported")));
        }
    };
    let interface = match interface {
        None => Ipv4Addr::UNSPECIFIED,
        Some((text, iname)) => {
            let ip: Ipv4Addr = text.parse().map_err(|_| {
                ConfigError(format!(
                    "{iname}: {text:?} is not an IPv4 address (the local interface's address, e.g. \"127.0.0.1\")"
                ))
            })?;
            if ip.is_multicast() {
                return Err(ConfigError(format!(
                    "{iname}: {ip} is a multicast address; give the local interface's own address"
                )));
            }
            ip
        }
    };
    Ok(Transport::Multicast { group: SocketAddr::new(IpAddr::V4(group), addr.port()), interface })
}

/// The transport settings that belong with it (recovery, A/B, from-start) are checked against.
struct Tie<'a> {
    transport: &'a Transport,
    /// No transport flag was given: the transport is the file's.
    from_file: bool,
}

impl Tie<'_> {
    /// `setting` if it `fits` the transport. One from the file that does not fit a transport
    /// given as a flag went with the file's transport, which the flag replaced: it is dropped, as
    /// the file's interface is. Otherwise a setting that does not fit is an error, `why` says
    /// (given the setting's name and the transport).
    fn keep<T>(
        &self,
        setting: Named<T>,
        fits: bool,
        why: impl FnOnce(&str, &Transport) -> String,
    ) -> Result<Option<Named<T>>, ConfigError> {
        if fits {
            return Ok(Some(setting));
        }
        let setting_from_file = !Origin::is_flag(&setting.name);
        if setting_from_file && !self.from_file {
            return Ok(None);
        }
        Err(ConfigError(why(&setting.name, self.transport)))
    }
}

/// The second line of an A/B pair: `listen_b` for UDP, `group_b` (and `interface_b`) for
/// multicast; never the first line's address.
fn line_b(cli: &Cli, file: &FileConfig, origin: &Origin<'_>, tie: &Tie<'_>) -> Result<Option<Transport>, ConfigError> {
    let is_udp = matches!(tie.transport, Transport::Udp(_));
    let is_multicast = matches!(tie.transport, Transport::Multicast { .. });
    let not_for = |want: &'static str, instead: &'static str| {
        move |name: &str, t: &Transport| {
            if matches!(t, Transport::Tcp(_)) {
                format!("{name}: a second line (A/B) is for UDP and multicast; {t} is one TCP connection")
            } else {
                format!("{name}: line B of a {want} transport; {t} is not one (its line B is {instead})")
            }
        }
    };
    let listen_b = pick(cli.listen_b.clone(), file.listen_b.clone(), "listen_b", origin);
    let listen_b = match listen_b {
        None => None,
        Some(n) => tie.keep(n, is_udp, not_for("unicast UDP", "group_b"))?,
    };
    let group_b = match pick(cli.group_b.clone(), file.group_b.clone(), "group_b", origin) {
        None => None,
        Some(n) => tie.keep(n, is_multicast, not_for("multicast", "listen_b"))?,
    };
    let interface_b = match pick(cli.interface_b.clone(), file.interface_b.clone(), "interface_b", origin) {
        None => None,
        Some(n) => tie.keep(n, is_multicast, not_for("multicast", "listen_b"))?,
    };
    if let Some(Named { name, .. }) = &interface_b
        && group_b.is_none()
    {
        return Err(ConfigError(format!(
            "{name}: an interface for line B is only used with group_b (line B's multicast group)"
        )));
    }
    if let Some(Named { value, name }) = listen_b {
        let addr = listen_addr(&value, &name, "listen_b", "group_b")?;
        if let Transport::Udp(a) = tie.transport
            && *a == addr
            && addr.port() != 0
        {
            return Err(ConfigError(format!(
                "{name}: {addr} is line A's address (listen) too; line B needs an address or port of its own"
            )));
        }
        return Ok(Some(Transport::Udp(addr)));
    }
    if let Some(Named { value, name }) = group_b {
        let line = multicast(&value, &name, interface_b.map(|n| (n.value, n.name)), "listen_b")?;
        if let (Transport::Multicast { group: a, .. }, Transport::Multicast { group: b, .. }) = (tie.transport, &line)
            && a == b
            && b.port() != 0
        {
            return Err(ConfigError(format!(
                "{name}: {b} is line A's group and port (group) too; line B needs another group or port (a socket \
                 bound to a group and port receives it from every interface)"
            )));
        }
        return Ok(Some(line));
    }
    Ok(None)
}

const DEFAULT_RECOVERY_DELAY_MS: u64 = 5;
const DEFAULT_RECOVERY_RETRY_MS: u64 = 50;
const DEFAULT_RECOVERY_ATTEMPTS: u64 = 10;
const DEFAULT_RECOVERY_LINGER: f64 = 2.0;

/// The retransmission service and its timing; the timing settings only go with `recovery`.
fn recovery(
    cli: &Cli,
    file: &FileConfig,
    origin: &Origin<'_>,
    tie: &Tie<'_>,
) -> Result<Option<RecoverySettings>, ConfigError> {
    let server = match pick(cli.recovery.clone(), file.recovery.clone(), "recovery", origin) {
        None => None,
        Some(n) => tie.keep(n, !matches!(tie.transport, Transport::Tcp(_)), |name, _| {
            format!(
                "{name}: a TCP subscriber resumes from the publisher's ring when it reconnects; the retransmission \
                 service (recovery) is for UDP and multicast subscribers"
            )
        })?,
    };
    let given = server.is_some();
    let only_with_recovery = |setting: Option<Named<u64>>| -> Result<Option<Named<u64>>, ConfigError> {
        match setting {
            None => Ok(None),
            Some(n) => tie.keep(n, given, |name, _| {
                format!("{name}: only used with recovery (the publisher's retransmission service), which is not set")
            }),
        }
    };
    let ranged = |setting: Option<Named<u64>>, min: u64, max: u64, default: u64, unit: &str| match only_with_recovery(
        setting,
    )? {
        None => Ok(default),
        Some(n) if (min..=max).contains(&n.value) => Ok(n.value),
        Some(Named { value, name }) => {
            Err(ConfigError(format!("{name}: {value}{unit} is out of range ({min} to {max})")))
        }
    };
    let delay = ranged(
        millis(
            (cli.recovery_delay, file.recovery_delay.clone(), "recovery_delay"),
            (cli.recovery_delay_ms, file.recovery_delay_ms.clone(), "recovery_delay_ms"),
            origin,
        )?,
        0,
        10_000,
        DEFAULT_RECOVERY_DELAY_MS,
        " ms",
    )?;
    let retry = ranged(
        millis(
            (cli.recovery_retry, file.recovery_retry.clone(), "recovery_retry"),
            (cli.recovery_retry_ms, file.recovery_retry_ms.clone(), "recovery_retry_ms"),
            origin,
        )?,
        1,
        60_000,
        DEFAULT_RECOVERY_RETRY_MS,
        " ms",
    )?;
    let attempts = ranged(
        pick(cli.recovery_attempts, file.recovery_attempts.clone(), "recovery_attempts", origin),
        1,
        1_000,
        DEFAULT_RECOVERY_ATTEMPTS,
        "",
    )?;
    let linger_setting = file.recovery_linger.clone().map(|s| {
        let span = s.span();
        Spanned::new(span, s.into_inner().0)
    });
    let linger = match pick(cli.recovery_linger, linger_setting, "recovery_linger", origin) {
        None => DEFAULT_RECOVERY_LINGER,
        Some(n) => match tie.keep(n, given, |name, _| {
            format!("{name}: only used with recovery (the publisher's retransmission service), which is not set")
        })? {
            None => DEFAULT_RECOVERY_LINGER,
            Some(Named { value, name }) => {
                if !(value.is_finite() && (0.0..=600.0).contains(&value)) {
                    return Err(ConfigError(format!("{name}: {value} seconds is out of range (0 to 600)")));
                }
                value
            }
        },
    };
    let Some(Named { value: server, name }) = server else { return Ok(None) };
    check_host_port(&server).map_err(|why| ConfigError(format!("{name}: {server:?} {why}")))?;
    Ok(Some(RecoverySettings {
        server,
        delay: Duration::from_millis(delay),
        retry: Duration::from_millis(retry),
        // At most 1000 by the range check.
        attempts: attempts as u32,
        linger: Duration::from_secs_f64(linger),
    }))
}

/// A duration in milliseconds, from its setting in seconds (with units) or from the name earlier
/// releases gave it, in milliseconds; both at once is refused, naming the one to keep.
fn millis(
    (cli, file, key): (Option<f64>, Option<Spanned<Seconds>>, &str),
    (old_cli, old_file, old_key): (Option<u64>, Option<Spanned<u64>>, &str),
    origin: &Origin<'_>,
) -> Result<Option<Named<u64>>, ConfigError> {
    let file = file.map(|s| Spanned::new(s.span(), s.into_inner().0));
    match (pick(cli, file, key, origin), pick(old_cli, old_file, old_key, origin)) {
        (Some(new), Some(old)) => Err(ConfigError(format!(
            "{} and {}: the same setting twice ({old_key} is its earlier name, in milliseconds): keep {key}",
            new.name, old.name
        ))),
        (Some(Named { value, name }), None) => {
            // An hour bounds every recovery timer; the range check names the exact bounds.
            if !(value.is_finite() && (0.0..=3_600.0).contains(&value)) {
                return Err(ConfigError(format!("{name}: {value} seconds is out of range")));
            }
            Ok(Some(Named { value: (value * 1_000.0).round() as u64, name }))
        }
        (None, old) => Ok(old),
    }
}

/// A byte count as TOML writes it: an integer, or a string with a unit ("512MiB", "1GB").
#[derive(Clone, Debug, Deserialize)]
#[serde(untagged)]
enum ByteSize {
    Int(i64),
    Text(String),
}

/// The smallest `record_rotate_size`: a chunk of segments as the writer gets them (smaller files
/// would hold one chunk each).
const MIN_RECORD_ROTATE_SIZE: u64 = 64 << 10;
/// The largest `record_rotate_size`: 1 TiB; a larger file is no longer a rotated one.
const MAX_RECORD_ROTATE_SIZE: u64 = 1 << 40;
/// The shortest `record_rotate_interval`, in seconds.
const MIN_RECORD_ROTATE_INTERVAL: f64 = 1.0;
/// The most `record_max_files`.
const MAX_RECORD_FILES: u64 = 1_000_000;

/// The recording: its file, overwriting, and rotation by size or time with a cap on the number
/// of files. The other settings only go with `record`, and the cap only with rotation.
fn record(cli: &Cli, file: &FileConfig, origin: &Origin<'_>) -> Result<Option<RecordSettings>, ConfigError> {
    let path = cli.record.clone().or_else(|| file.record.clone());
    if path.as_ref().is_some_and(|p| p.as_os_str().is_empty()) {
        return Err(ConfigError("record: empty file name".into()));
    }
    let overwrite =
        pick(cli.record_overwrite.then_some(true), file.record_overwrite.clone(), "record_overwrite", origin);
    let size_setting = file.record_rotate_size.clone().map(|s| {
        let span = s.span();
        let text = match s.into_inner() {
            ByteSize::Int(n) => n.to_string(),
            ByteSize::Text(t) => t,
        };
        Spanned::new(span, text)
    });
    let size = pick(cli.record_rotate_size.clone(), size_setting, "record_rotate_size", origin);
    let interval_name = match (&cli.record_rotate_interval, &file.record_rotate_interval) {
        (Some(_), _) => Some(origin.flag("record_rotate_interval")),
        (None, Some(s)) => Some(origin.file_key("record_rotate_interval", s.span())),
        (None, None) => None,
    };
    let interval = seconds(
        cli.record_rotate_interval,
        file.record_rotate_interval.clone(),
        "record_rotate_interval",
        origin,
        false,
        MIN_RECORD_ROTATE_INTERVAL,
    )?;
    let max_files = pick(cli.record_max_files, file.record_max_files.clone(), "record_max_files", origin);
    let Some(path) = path else {
        let given = [overwrite.map(|n| n.name), size.as_ref().map(|n| n.name.clone()), interval_name]
            .into_iter()
            .chain([max_files.map(|n| n.name)])
            .flatten()
            .next();
        return match given {
            Some(name) => {
                Err(ConfigError(format!("{name}: only used with record (the capture file), which is not set")))
            }
            None => Ok(None),
        };
    };
    let rotate_size = match size {
        None => None,
        Some(Named { value, name }) => {
            let bytes = parse_size::parse_size(value.trim()).map_err(|e| {
                ConfigError(format!("{name}: {value:?} is not a size ({e}; e.g. 1073741824, \"512MiB\" or \"1GB\")"))
            })?;
            if !(MIN_RECORD_ROTATE_SIZE..=MAX_RECORD_ROTATE_SIZE).contains(&bytes) {
                return Err(ConfigError(format!("{name}: {value} ({bytes} bytes) is out of range (64KiB to 1TiB)")));
            }
            Some(bytes)
        }
    };
    let max_files = match max_files {
        None => None,
        Some(Named { name, .. }) if rotate_size.is_none() && interval.is_none() => {
            return Err(ConfigError(format!(
                "{name}: only used with rotation (record_rotate_size or record_rotate_interval): without it the \
                 recording is one file"
            )));
        }
        Some(Named { value, name }) if !(1..=MAX_RECORD_FILES).contains(&value) => {
            return Err(ConfigError(format!("{name}: {value} is out of range (1 to {MAX_RECORD_FILES})")));
        }
        // At most a million by the range check.
        Some(n) => Some(n.value as u32),
    };
    Ok(Some(RecordSettings {
        path,
        overwrite: overwrite.is_some_and(|n| n.value),
        rotate_size,
        rotate_interval: interval,
        max_files,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn from_file(text: &str) -> Result<Settings, ConfigError> {
        Settings::from_toml(Path::new("sub.toml"), text)
    }

    fn err(text: &str) -> String {
        from_file(text).unwrap_err().0
    }

    /// An error that names a setting as `key (where): rest`.
    trait NamesSetting {
        /// Whether `key`, where it came from, then `rest` are in the text.
        fn names(&self, key: &str, rest: &str) -> bool;
    }

    impl NamesSetting for str {
        fn names(&self, key: &str, rest: &str) -> bool {
            self.match_indices(&format!("{key} ("))
                .any(|(at, _)| self[at..].split_once("): ").is_some_and(|(_, after)| after.starts_with(rest)))
        }
    }

    #[test]
    fn a_file_with_one_transport_is_accepted_and_flags_override_it() {
        let s =
            from_file("connect = \"localhost:9100\"\nsymbols = [\"AAPL\", \"MSFT\"]\nreport_interval = 0\n").unwrap();
        assert_eq!(s.transport, Transport::Tcp("localhost:9100".into()));
        assert_eq!(s.symbols.unwrap().len(), 2);
        assert_eq!(s.report_interval, None);
        assert_eq!(s.latency, LatencyMode::OneWay);

        let text = "group = \"239.255.0.1:9300\"\ninterface = \"127.0.0.1\"\nduration = 1.5\n";
        let file: FileConfig = toml::from_str(text).unwrap();
        let cli = Cli { listen: Some("127.0.0.1:0".into()), ..Cli::default() };
        // The interface belonged to the file's multicast transport, which the flag replaced.
        let s = Settings::build(cli, file, &Origin { file: None, flags: BTreeMap::new() }).unwrap();
        assert_eq!(s.transport, Transport::Udp("127.0.0.1:0".parse().unwrap()));
        let file: FileConfig = toml::from_str(text).unwrap();
        let cli = Cli { listen: Some("127.0.0.1:0".into()), interface: Some("127.0.0.1".into()), ..Cli::default() };
        assert!(
            Settings::build(cli, file, &Origin { file: None, flags: BTreeMap::new() })
                .unwrap_err()
                .0
                .contains("--interface")
        );
        let s = from_file(text).unwrap();
        assert_eq!(
            s.transport,
            Transport::Multicast { group: "239.255.0.1:9300".parse().unwrap(), interface: Ipv4Addr::LOCALHOST }
        );
        assert_eq!(s.duration, Some(Duration::from_millis(1500)));
    }

    #[test]
    fn bad_settings_are_named() {
        assert!(err("listen = \"239.255.0.1:9300\"").contains("listen (sub.toml, line 1): 239.255.0.1 is a multicast"));
        assert!(err("group = \"127.0.0.1:9300\"").names("group", "127.0.0.1 is not a multicast address"));
        assert!(err("symbols = []\n").contains("no transport"));
        assert!(err("connect = \"a:1\"\nlisten = \"127.0.0.1:2\"").contains("several transports"));
        assert!(err("connect = \"nohost\"").names("connect", "\"nohost\" is not host:port"));
        assert!(err("connect = \"h:99999\"").contains("port"));
        let format = err("connect = \"h:1\"\nformat = \"sbe\"");
        assert!(
            format.contains("format (sub.toml, line 2): ") && format.contains("comes from the publisher"),
            "{format}"
        );
        assert!(err("connect = \"h:1\"\necho_every = 0").contains("echo_every"));
        assert!(err("connect = \"h:1\"\nduration = 0").contains("duration"));
        assert!(err("connect = \"h:1\"\nreport_interval = 1e-9").contains("report_interval"));
        // Named as the setting is now called, on the line of the earlier name.
        assert!(
            err("connect = \"h:1\"\nreconnect_max_seconds = 0.001").contains("reconnect_max (sub.toml, line 2): 0.001")
        );
        assert!(err("connect = \"h:1\"\nreconnect_max = \"1ms\"").contains("reconnect_max (sub.toml, line 2): 0.001"));
        assert!(err("connect = \"h:1\"\nsymbols = [\"TOOLONGSYM\"]").contains("symbols"));
        assert!(err("connect = \"h:1\"\ninterface = \"127.0.0.1\"").contains("interface"));
        let unknown = err("connect = \"h:1\"\n\nbogus = 1\n");
        assert!(
            unknown.starts_with("sub.toml: ") && unknown.contains("bogus") && unknown.contains("line 3"),
            "{unknown}"
        );
    }

    #[test]
    fn recovery_from_start_and_a_second_line_go_with_their_transports() {
        let s =
            from_file("listen = \"127.0.0.1:9200\"\nrecovery = \"pub:9400\"\nlisten_b = \"127.0.0.1:9201\"\n").unwrap();
        let r = s.recovery.unwrap();
        assert_eq!(r.server, "pub:9400");
        assert_eq!(
            (r.delay, r.retry, r.attempts, r.linger),
            (Duration::from_millis(5), Duration::from_millis(50), 10, Duration::from_secs(2))
        );
        assert_eq!(s.line_b, Some(Transport::Udp("127.0.0.1:9201".parse().unwrap())));
        let text = "group = \"239.1.2.3:9300\"\ngroup_b = \"239.1.2.4:9300\"\ninterface_b = \"127.0.0.1\"\n\
                    recovery = \"pub:9400\"\nrecovery_delay_ms = 0\nrecovery_retry_ms = 7\nrecovery_attempts = 3\n\
                    recovery_linger = 0.5\n";
        let s = from_file(text).unwrap();
        assert_eq!(
            s.line_b,
            Some(Transport::Multicast { group: "239.1.2.4:9300".parse().unwrap(), interface: Ipv4Addr::LOCALHOST })
        );
        let r = s.recovery.unwrap();
        assert_eq!(
            (r.delay, r.retry, r.attempts, r.linger),
            (Duration::ZERO, Duration::from_millis(7), 3, Duration::from_millis(500))
        );
        assert!(from_file("connect = \"h:1\"\nfrom_start = true\n").unwrap().from_start);
        assert!(from_file("listen = \"127.0.0.1:1\"\nfrom_start = true\n").unwrap().from_start);
        // The file's UDP-only settings went with its transport, which a flag replaced.
        let file: FileConfig = toml::from_str(text).unwrap();
        let cli = Cli { connect: Some("h:1".into()), from_start: true, ..Cli::default() };
        let s = Settings::build(cli, file, &Origin { file: None, flags: BTreeMap::new() }).unwrap();
        assert_eq!((s.recovery, s.line_b, s.from_start), (None, None, true));
        // A flag that does not fit the transport is an error all the same.
        let file: FileConfig = toml::from_str("connect = \"h:1\"\n").unwrap();
        let cli = Cli { recovery: Some("pub:1".into()), ..Cli::default() };
        let e = Settings::build(cli, file, &Origin { file: None, flags: BTreeMap::new() }).unwrap_err().0;
        assert!(e.starts_with("recovery (--recovery): a TCP subscriber resumes"), "{e}");
    }

    #[test]
    fn bad_recovery_and_line_settings_are_named() {
        let udp = "listen = \"127.0.0.1:9200\"\n";
        let with = |extra: &str| err(&format!("{udp}recovery = \"pub:9400\"\n{extra}"));
        assert!(
            err("connect = \"h:1\"\nrecovery = \"pub:9400\"")
                .contains("recovery (sub.toml, line 2): a TCP subscriber resumes")
        );
        assert!(err(&format!("{udp}recovery = \"pub\"")).names("recovery", "\"pub\" is not host:port"));
        assert!(with("recovery_delay_ms = 10001").names("recovery_delay_ms", "10001 ms is out of range (0 to 10000)"));
        assert!(with("recovery_retry_ms = 0").names("recovery_retry_ms", "0 ms is out of range (1 to 60000)"));
        assert!(with("recovery_attempts = 1001").names("recovery_attempts", "1001 is out of range (1 to 1000)"));
        assert!(with("recovery_linger = 601").names("recovery_linger", "601 seconds is out of range (0 to 600)"));
        assert!(with("recovery_linger = -1").contains("recovery_linger"));
        assert!(err(&format!("{udp}recovery_retry_ms = 9")).names("recovery_retry_ms", "only used with recovery"));
        assert!(err(&format!("{udp}group_b = \"239.1.1.1:1\"")).names("group_b", "line B of a multicast transport"));
        assert!(err(&format!("{udp}listen_b = \"127.0.0.1:9200\"")).names("listen_b", "127.0.0.1:9200 is line A's"));
        assert!(err(&format!("{udp}listen_b = \"239.1.1.1:1\"")).names("listen_b", "239.1.1.1 is a multicast address"));
        let group = "group = \"239.1.1.1:9300\"\n";
        assert!(
            err(&format!("{group}listen_b = \"127.0.0.1:1\"")).names("listen_b", "line B of a unicast UDP transport")
        );
        assert!(err(&format!("{group}group_b = \"239.1.1.1:9300\"")).names("group_b", "239.1.1.1:9300 is line A's"));
        assert!(err(&format!("{group}interface_b = \"127.0.0.1\"")).names("interface_b", "an interface for line B"));
        assert!(err(&format!("{group}group_b = \"239.1.1.2:1\"\ninterface_b = \"x\"")).names("interface_b", "\"x\""));
        assert!(
            err("connect = \"h:1\"\nlisten_b = \"127.0.0.1:1\"").names("listen_b", "a second line (A/B) is for UDP")
        );
    }

    #[test]
    fn the_recording_file_comes_from_the_file_or_the_flag() {
        let s = from_file("connect = \"h:1\"\nrecord = \"day.pcapng.gz\"\n").unwrap();
        assert_eq!(s.record.map(|r| r.path), Some(PathBuf::from("day.pcapng.gz")));
        let file: FileConfig = toml::from_str("connect = \"h:1\"\nrecord = \"day.pcapng.gz\"\n").unwrap();
        let cli = Cli { record: Some("other.pcap".into()), ..Cli::default() };
        let record = Settings::build(cli, file, &Origin { file: None, flags: BTreeMap::new() }).unwrap().record;
        assert_eq!(record.map(|r| r.path), Some("other.pcap".into()));
        assert_eq!(from_file("connect = \"h:1\"\n").unwrap().record, None);
        assert!(err("connect = \"h:1\"\nrecord = \"\"\n").contains("record: empty file name"));
        let s = from_file("connect = \"h:1\"\nrecord = \"day.pcap\"\n").unwrap().record.unwrap();
        assert!(!s.overwrite && !s.rotates() && s.max_files.is_none());
    }

    #[test]
    fn recording_rotation_and_overwrite_are_read_and_range_checked() {
        let with = |extra: &str| from_file(&format!("connect = \"h:1\"\nrecord = \"day.pcap.gz\"\n{extra}"));
        let s = with(
            "record_rotate_size = \"512MiB\"\nrecord_rotate_interval = 3600\nrecord_max_files = 48\n\
                      record_overwrite = true\n",
        )
        .unwrap()
        .record
        .unwrap();
        assert_eq!(
            s,
            RecordSettings {
                path: "day.pcap.gz".into(),
                overwrite: true,
                rotate_size: Some(512 << 20),
                rotate_interval: Some(Duration::from_secs(3600)),
                max_files: Some(48),
            }
        );
        assert!(s.rotates());
        let size = |text: &str| with(&format!("record_rotate_size = {text}\n")).unwrap().record.unwrap().rotate_size;
        assert_eq!(size("1048576"), Some(1 << 20));
        assert_eq!(size("\"1GB\""), Some(1_000_000_000));
        assert_eq!(size("\"1.5 GiB\""), Some(3 << 29));
        assert_eq!(size("\"64KiB\""), Some(64 << 10));
        let interval = with("record_rotate_interval = 1.5\n").unwrap().record.unwrap().rotate_interval;
        assert_eq!(interval, Some(Duration::from_millis(1500)));

        let bad = |extra: &str| with(extra).unwrap_err().0;
        let e = bad("record_rotate_size = 65535\n");
        assert!(
            e.contains("record_rotate_size (sub.toml, line 3): 65535 (65535 bytes) is out of range (64KiB to 1TiB)"),
            "{e}"
        );
        assert!(bad("record_rotate_size = \"1.1TiB\"\n").names("record_rotate_size", "1.1TiB"));
        assert!(bad("record_rotate_size = -1\n").names("record_rotate_size", "\"-1\" is not a size"));
        assert!(bad("record_rotate_size = \"big\"\n").names("record_rotate_size", "\"big\" is not a size"));
        assert!(bad("record_rotate_interval = 0\n").names("record_rotate_interval", "0 seconds is out of range"));
        assert!(bad("record_rotate_interval = 86401\n").names("record_rotate_interval", "86401 seconds"));
        assert!(
            bad("record_rotate_interval = 60\nrecord_max_files = 0\n").names("record_max_files", "0 is out of range")
        );
        assert!(bad("record_max_files = 5\n").names("record_max_files", "only used with rotation"));
        assert!(bad("record_overwrite = \"yes\"\n").contains("record_overwrite"));
        let unset = err("connect = \"h:1\"\nrecord_max_files = 5\n");
        assert!(unset.contains("record_max_files (sub.toml, line 2): only used with record"), "{unset}");

        // Flags over the file's settings, named as flags.
        let file: FileConfig =
            toml::from_str("connect = \"h:1\"\nrecord = \"d.pcap\"\nrecord_rotate_size = 70000\n").unwrap();
        let cli = Cli { record_rotate_size: Some("2MiB".into()), record_overwrite: true, ..Cli::default() };
        let s = Settings::build(cli, file, &Origin { file: None, flags: BTreeMap::new() }).unwrap().record.unwrap();
        assert_eq!((s.rotate_size, s.overwrite), (Some(2 << 20), true));
        let file: FileConfig = toml::from_str("connect = \"h:1\"\nrecord = \"d.pcap\"\n").unwrap();
        let cli = Cli { record_max_files: Some(3), ..Cli::default() };
        let e = Settings::build(cli, file, &Origin { file: None, flags: BTreeMap::new() }).unwrap_err().0;
        assert!(e.starts_with("record_max_files (--record-max-files): only used with rotation"), "{e}");
    }

    #[test]
    fn nats_settings_are_read_checked_and_only_go_with_nats() {
        let nats = "nats = \"nats://127.0.0.1:4222\"\nnats_stream = \"MD\"\n";
        let s = from_file(&format!(
            "{nats}nats_start_at = \"2026-11-26T14:30:00.5+01:00\"\nnats_user = \"feed\"\n\
             nats_password_file = \"pw\"\nnats_tls_ca_file = \"ca.pem\"\nnats_pending_messages = 256\n"
        ))
        .unwrap();
        let Transport::Nats { stream, options, .. } = s.transport else { panic!("not NATS: {:?}", s.transport) };
        assert_eq!(stream.as_deref(), Some("MD"));
        // 13:30:00.5 UTC that day.
        let at = SystemTime::UNIX_EPOCH + Duration::from_millis(1_795_699_800_500);
        assert_eq!(
            options,
            NatsOptions {
                start_at: Some(at),
                auth: NatsAuth::UserPassword("feed".into(), "pw".into()),
                tls_ca_file: Some("ca.pem".into()),
                pending_messages: Some(256),
            }
        );
        // A bare TOML date-time is taken as well; the flags override the file.
        let s = from_file(&format!("{nats}nats_start_at = 2026-11-26T13:30:00.5Z\n")).unwrap();
        assert!(
            matches!(s.transport, Transport::Nats { options: NatsOptions { start_at: Some(t), .. }, .. } if t == at)
        );
        let file: FileConfig = toml::from_str(&format!("{nats}nats_creds_file = \"a.creds\"\n")).unwrap();
        let cli = Cli {
            nats_creds_file: Some("b.creds".into()),
            nats_start_at: Some("2026-11-26T13:30:00.5Z".into()),
            nats_pending_messages: Some(16),
            ..Cli::default()
        };
        let s = Settings::build(cli, file, &Origin { file: None, flags: BTreeMap::new() }).unwrap();
        let Transport::Nats { options, .. } = s.transport else { panic!() };
        assert_eq!(
            (options.auth, options.start_at, options.pending_messages),
            (NatsAuth::Creds("b.creds".into()), Some(at), Some(16))
        );
        let s = from_file(&format!("{nats}nats_nkey_file = \"seed.nk\"\n")).unwrap();
        assert!(matches!(s.transport, Transport::Nats { options: NatsOptions { auth: NatsAuth::Nkey(_), .. }, .. }));

        let bad = |extra: &str| err(&format!("{nats}{extra}"));
        let e = bad("nats_start_at = \"yesterday\"\n");
        assert!(e.contains("nats_start_at (sub.toml, line 3): \"yesterday\" is not an RFC 3339 time"), "{e}");
        assert!(bad("nats_start_at = \"2026-11-26T13:30:00\"\n").contains("nats_start_at"));
        assert!(
            bad("nats_start_at = \"1969-12-31T23:59:59Z\"\n")
                .names("nats_start_at", "1969-12-31T23:59:59Z is before 1970")
        );
        let e = err("nats = \"nats://h:1\"\nnats_start_at = \"2026-11-26T13:30:00Z\"\n");
        assert!(
            e.names("nats_start_at", "the start is replayed from JetStream: give the stream with nats_stream"),
            "{e}"
        );
        let e = bad("nats_start_at = \"2026-11-26T13:30:00Z\"\nfrom_start = true\n");
        assert!(e.names("nats_start_at", "give from_start or a start time, not both"), "{e}");
        assert!(bad("nats_user = \"feed\"\n").names("nats_user", "a user needs the file holding its password too"));
        assert!(
            bad("nats_password_file = \"pw\"\n").names("nats_password_file", "a password's file needs its user too")
        );
        let e = bad("nats_creds_file = \"a.creds\"\nnats_nkey_file = \"s.nk\"\n");
        assert!(e.names("nats_creds_file", "give one kind of credentials") && e.contains("nats_nkey_file"), "{e}");
        assert!(bad("nats_tls_ca_file = \"\"\n").names("nats_tls_ca_file", "empty file name"));
        assert!(bad("nats_user = \"\"\nnats_password_file = \"pw\"\n").names("nats_user", "empty user name"));
        let e = bad("nats_pending_messages = 15\n");
        assert!(e.names("nats_pending_messages", "15 is out of range (16 to 16777216)"), "{e}");
        assert!(bad("nats_pending_messages = 16777217\n").names("nats_pending_messages", "16777217 is out of range"));
        let s = from_file(&format!("{nats}nats_give_up_after = \"90s\"\n")).unwrap();
        assert_eq!(s.nats_give_up_after, Some(Duration::from_secs(90)));
        assert!(bad("nats_give_up_after = 0\n").contains("nats_give_up_after"));
        assert!(bad("nats_give_up_after = 86401\n").contains("nats_give_up_after"));

        // Only with a NATS transport, from the file or as a flag.
        for key in [
            "nats_start_at = \"2026-11-26T13:30:00Z\"",
            "nats_creds_file = \"a\"",
            "nats_nkey_file = \"a\"",
            "nats_user = \"u\"",
            "nats_password_file = \"p\"",
            "nats_tls_ca_file = \"c\"",
            "nats_pending_messages = 64",
            "nats_give_up_after = 5",
        ] {
            let e = err(&format!("connect = \"h:1\"\n{key}\n"));
            let name = key.split(' ').next().unwrap();
            assert!(e.contains(&format!("{name} (sub.toml, line 2): only used with a NATS transport")), "{e}");
        }
        let file: FileConfig = toml::from_str("listen = \"127.0.0.1:1\"\n").unwrap();
        let cli = Cli { nats_password_file: Some("p".into()), ..Cli::default() };
        let e = Settings::build(cli, file, &Origin { file: None, flags: BTreeMap::new() }).unwrap_err().0;
        assert!(e.starts_with("nats_password_file (--nats-password-file): only used with a NATS transport"), "{e}");
        let file: FileConfig = toml::from_str("").unwrap();
        let cli = Cli { connect: Some("h:1".into()), nats_pending_messages: Some(64), ..Cli::default() };
        let e = Settings::build(cli, file, &Origin { file: None, flags: BTreeMap::new() }).unwrap_err().0;
        assert!(
            e.starts_with("nats_pending_messages (--nats-pending-messages): only used with a NATS transport"),
            "{e}"
        );
    }
}
