//! The subscriber's configuration: the library's receive [`Settings`] and the application's own
//! ([`Application`]: the report, its outputs, the recording, metrics, the CPU), laid from a TOML
//! file (`--config`), then the environment variables and flags given, and checked once at start,
//! so a bad setting fails before anything is bound or connected, named with where it came from.
//!
//! A setting has one name everywhere: the key in the file, `--key-with-dashes`,
//! `MDRELAY_SUB_KEY`, the [`Builder`](mdrelay_client::Builder) method and the Python keyword.

use clap::{Parser, ValueEnum};
use mdrelay_client::Settings;
use mdrelay_iex::Symbol;
use mdrelay_runtime::idle::{IdleStrategy, Profile};
use mdrelay_telemetry::config_file::Reading;
use mdrelay_telemetry::prometheus::{MetricsSection, MetricsSettings};
use mdrelay_telemetry::settings::{EarlierName, Layered, field_names};
use mdrelay_telemetry::units::{option_bytes, option_seconds, parse_bytes, parse_seconds};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

/// mdrelay subscriber: receives a publisher's stream over TCP, UDP, multicast or NATS, decodes
/// it (the format comes from the publisher), aggregates per symbol and reports loss and latency.
///
/// Each flag sets the setting of the configuration file its name gives (`--recovery-delay`:
/// `recovery_delay`), over the file's value.
#[derive(Debug, Default, Parser, Serialize)]
#[command(name = "mdrelay-sub", version, about, allow_negative_numbers = true)]
pub struct Cli {
    /// TOML configuration file; flags given here override its settings.
    #[arg(long, short, value_name = "FILE", env = "MDRELAY_SUB_CONFIG")]
    #[serde(skip)]
    pub config: Option<PathBuf>,
    /// TCP: connect to a publisher at HOST:PORT (reconnects when the connection drops).
    #[arg(long, value_name = "HOST:PORT", env = "MDRELAY_SUB_TCP", help_heading = "Transport")]
    pub tcp: Option<String>,
    /// UDP unicast: listen on ADDR:PORT (port 0 picks a free port, logged at start).
    #[arg(long, value_name = "ADDR:PORT", env = "MDRELAY_SUB_UDP", help_heading = "Transport")]
    pub udp: Option<String>,
    /// UDP multicast: join GROUP:PORT (an IPv4 multicast group).
    #[arg(long, value_name = "GROUP:PORT", env = "MDRELAY_SUB_MULTICAST", help_heading = "Transport")]
    pub multicast: Option<String>,
    /// Multicast: the local interface address to join the group on (default 0.0.0.0).
    #[arg(long, value_name = "ADDR", env = "MDRELAY_SUB_INTERFACE", help_heading = "Transport")]
    pub interface: Option<String>,
    /// A/B: the second line, ADDR:PORT for UDP or GROUP:PORT for multicast.
    #[arg(long, value_name = "ADDR:PORT", env = "MDRELAY_SUB_LINE_B", help_heading = "Transport")]
    pub line_b: Option<String>,
    /// Multicast A/B: the local interface address to join the second line on (default 0.0.0.0).
    #[arg(long, value_name = "ADDR", env = "MDRELAY_SUB_INTERFACE_B", help_heading = "Transport")]
    pub interface_b: Option<String>,
    /// The receive buffer asked of the kernel per socket, bytes or e.g. 16MiB (default 16MiB for
    /// UDP and multicast, the system's for TCP).
    #[arg(long, value_name = "SIZE", value_parser = parse_bytes::<u64>, env = "MDRELAY_SUB_RECEIVE_BUFFER", help_heading = "Transport")]
    pub receive_buffer: Option<u64>,
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
    /// NATS: the connection's name, as the servers' monitoring lists it (default mdrelay-client).
    #[arg(long, value_name = "NAME", env = "MDRELAY_SUB_NATS_NAME", help_heading = "NATS")]
    pub nats_name: Option<String>,
    /// Give up when nothing comes for this long, seconds or e.g. 1m: TCP, no connection made
    /// (default: never); NATS, once started, no frame on the subject nor in --nats-stream's
    /// tail (default 30).
    #[arg(long, value_name = "DURATION", value_parser = parse_seconds, env = "MDRELAY_SUB_GIVE_UP_AFTER", help_heading = "NATS")]
    pub give_up_after: Option<f64>,
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
    /// Write the final books and symbol state as JSON to FILE, in the schema of IEX's reference
    /// reader iexbook.py.
    #[arg(long, value_name = "FILE", env = "MDRELAY_SUB_BOOK", help_heading = "Report")]
    pub book: Option<PathBuf>,
    /// Stop once this many messages have been received (`--count` in earlier releases).
    #[arg(long, value_name = "N", alias = "count", env = "MDRELAY_SUB_MAX_MESSAGES", help_heading = "Report")]
    pub max_messages: Option<u64>,
    /// Stop after this many seconds (or a duration such as 10m).
    #[arg(long, value_name = "DURATION", value_parser = parse_seconds, env = "MDRELAY_SUB_DURATION", help_heading = "Report")]
    pub duration: Option<f64>,
    /// Record what is received to FILE as an IEX-TP capture, in arrival order, whatever the
    /// wire format: pcapng if the name ends in .pcapng, else pcap; gzipped if it ends in .gz
    /// (e.g. day.pcapng.gz). An existing file is refused unless --record-overwrite is given; a
    /// symbolic link always is.
    #[arg(long, value_name = "FILE", env = "MDRELAY_SUB_RECORD", help_heading = "Recording")]
    pub record: Option<PathBuf>,
    /// Recording: replace an existing file at the --record path (with rotation, the numbered files
    /// of an earlier recording there). Never through a symbolic link.
    #[arg(long, visible_alias = "force", env = "MDRELAY_SUB_RECORD_OVERWRITE", help_heading = "Recording")]
    #[serde(skip_serializing_if = "std::ops::Not::not")]
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
    /// TCP: the longest wait between reconnection attempts, seconds or e.g. 500ms (default 5;
    /// `--reconnect-max-seconds` in earlier releases).
    #[arg(long, value_name = "DURATION", value_parser = parse_seconds, alias = "reconnect-max-seconds", env = "MDRELAY_SUB_RECONNECT_MAX", help_heading = "TCP")]
    pub reconnect_max: Option<f64>,
    /// TCP: the time a connection may take to be made, the name resolved included (default 10).
    #[arg(long, value_name = "DURATION", value_parser = parse_seconds, env = "MDRELAY_SUB_CONNECT_TIMEOUT", help_heading = "TCP")]
    pub connect_timeout: Option<f64>,
    /// TCP: whether a reconnection asks for the frames after the last one received (default
    /// true), or takes the stream live from where it is.
    #[arg(long, value_name = "BOOL", env = "MDRELAY_SUB_RESUME", help_heading = "TCP")]
    pub resume: Option<bool>,
    /// UDP and multicast: the publisher's retransmission service at HOST:PORT; missing frames
    /// are asked for there.
    #[arg(long, value_name = "HOST:PORT", env = "MDRELAY_SUB_RECOVERY", help_heading = "Recovery")]
    pub recovery: Option<String>,
    /// Recovery: how long to wait after a gap is seen before asking, seconds or e.g. 5ms
    /// (default 5ms; 20ms repairing from a NATS stream).
    #[arg(long, value_name = "DURATION", value_parser = parse_seconds, env = "MDRELAY_SUB_RECOVERY_DELAY", help_heading = "Recovery")]
    pub recovery_delay: Option<f64>,
    /// Recovery: how long without an answer before asking again, seconds or e.g. 50ms (default
    /// 50ms); doubles with each further unanswered request for the same frames, up to 8 times.
    #[arg(long, value_name = "DURATION", value_parser = parse_seconds, env = "MDRELAY_SUB_RECOVERY_RETRY", help_heading = "Recovery")]
    pub recovery_retry: Option<f64>,
    /// Recovery: requests per gap before it is given up (default 10).
    #[arg(long, value_name = "N", env = "MDRELAY_SUB_RECOVERY_ATTEMPTS", help_heading = "Recovery")]
    pub recovery_attempts: Option<u64>,
    /// Recovery: seconds to keep waiting for missing frames after the end of stream, or a
    /// duration such as 500ms (default 2).
    #[arg(long, value_name = "DURATION", value_parser = parse_seconds, env = "MDRELAY_SUB_RECOVERY_LINGER", help_heading = "Recovery")]
    pub recovery_linger: Option<f64>,
    /// The whole session from its first frame: over TCP the publisher is asked for it (as far as
    /// its ring holds it); over UDP every frame from the first is owed, so frames lost before the
    /// first received count (and, with recovery, are asked for); over NATS replayed from
    /// --nats-stream.
    #[arg(long, env = "MDRELAY_SUB_FROM_START", help_heading = "Recovery")]
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub from_start: bool,
    /// TCP: join with a snapshot of the state (books, status, the day's aggregates and counts)
    /// as of a frame, then the stream from the frame after it: the report covers the whole day.
    #[arg(long, env = "MDRELAY_SUB_SNAPSHOT", help_heading = "TCP")]
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub snapshot: bool,
    /// Protection: the publisher adds a CRC-32C to every frame (its `[protection] crc`).
    #[arg(long, env = "MDRELAY_SUB_CRC", help_heading = "Protection")]
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub crc: bool,
    /// Protection: the publisher encrypts every frame with the key in this file (its
    /// `[protection] key_file`).
    #[arg(long, value_name = "FILE", env = "MDRELAY_SUB_KEY_FILE", help_heading = "Protection")]
    pub key_file: Option<PathBuf>,
    /// Profile: default (wait for readiness) or low-latency (busy-poll the socket, SO_BUSY_POLL,
    /// the receive thread pinned to --hot-core) [default: default].
    #[arg(long, value_name = "PROFILE", env = "MDRELAY_SUB_PROFILE", help_heading = "Latency and CPU")]
    pub profile: Option<Profile>,
    /// How the receive loop waits: spin, yield, backoff (busy-poll, then wait) or sleep (wait for
    /// readiness) [default: the profile's].
    #[arg(long, value_name = "STRATEGY", env = "MDRELAY_SUB_IDLE", help_heading = "Latency and CPU")]
    pub idle: Option<IdleStrategy>,
    /// SO_BUSY_POLL on the sockets [default: the profile's].
    #[arg(long, value_name = "BOOL", env = "MDRELAY_SUB_BUSY_POLL", help_heading = "Latency and CPU")]
    pub busy_poll: Option<bool>,
    /// Pin the receive thread, the subscriber's hot thread, to this CPU (`--core` in earlier
    /// releases).
    #[arg(long, value_name = "N", alias = "core", env = "MDRELAY_SUB_HOT_CORE", help_heading = "Latency and CPU")]
    pub hot_core: Option<usize>,
    /// Serve Prometheus metrics on ADDR:PORT (e.g. 127.0.0.1:9901).
    #[arg(long, value_name = "ADDR:PORT", env = "MDRELAY_SUB_METRICS_LISTEN", help_heading = "Metrics")]
    #[serde(rename = "metrics.listen")]
    pub metrics_listen: Option<String>,
    /// Metrics: seconds the endpoint stays up after the run, for the last scrape, or a duration
    /// such as 30s (default 0).
    #[arg(long, value_name = "DURATION", value_parser = parse_seconds, env = "MDRELAY_SUB_METRICS_HOLD", help_heading = "Metrics")]
    #[serde(rename = "metrics.hold")]
    pub metrics_hold: Option<f64>,
    /// Earlier releases' --tcp.
    #[arg(long, value_name = "HOST:PORT", hide = true, env = "MDRELAY_SUB_CONNECT")]
    pub connect: Option<String>,
    /// Earlier releases' --udp.
    #[arg(long, value_name = "ADDR:PORT", hide = true, env = "MDRELAY_SUB_LISTEN")]
    pub listen: Option<String>,
    /// Earlier releases' --multicast.
    #[arg(long, value_name = "GROUP:PORT", hide = true, env = "MDRELAY_SUB_GROUP")]
    pub group: Option<String>,
    /// Earlier releases' --line-b of a UDP subscriber.
    #[arg(long, value_name = "ADDR:PORT", hide = true, env = "MDRELAY_SUB_LISTEN_B")]
    pub listen_b: Option<String>,
    /// Earlier releases' --line-b of a multicast subscriber.
    #[arg(long, value_name = "GROUP:PORT", hide = true, env = "MDRELAY_SUB_GROUP_B")]
    pub group_b: Option<String>,
    /// Earlier releases' --give-up-after of a NATS subscriber.
    #[arg(long, value_name = "DURATION", value_parser = parse_seconds, hide = true, env = "MDRELAY_SUB_NATS_GIVE_UP_AFTER")]
    pub nats_give_up_after: Option<f64>,
    /// Earlier releases' --recovery-delay, in milliseconds.
    #[arg(long, value_name = "MS", hide = true, env = "MDRELAY_SUB_RECOVERY_DELAY_MS")]
    pub recovery_delay_ms: Option<u64>,
    /// Earlier releases' --recovery-retry, in milliseconds.
    #[arg(long, value_name = "MS", hide = true, env = "MDRELAY_SUB_RECOVERY_RETRY_MS")]
    pub recovery_retry_ms: Option<u64>,
    /// Logging: --log-format, --log-level.
    #[command(flatten)]
    #[serde(skip)]
    pub log: mdrelay_telemetry::logs::LogArgs,
    /// Documentation: --generate-completions, --generate-man.
    #[command(flatten)]
    #[serde(skip)]
    pub docs: mdrelay_telemetry::docs::DocArgs,
    /// Check the configuration, print the settings it amounts to and exit.
    #[arg(long)]
    #[serde(skip)]
    pub check: bool,
    /// Not a setting: the format comes from the publisher. Accepted only to explain that.
    #[arg(long, hide = true)]
    #[serde(skip)]
    pub format: Option<String>,
    /// The flags given (on the command line or in the environment), for naming where each
    /// setting came from.
    #[arg(skip)]
    #[serde(skip)]
    pub given: Vec<mdrelay_telemetry::settings::GivenFlag>,
}

/// How latency is measured.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, ValueEnum, Serialize)]
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

/// Settings of earlier releases still read, in files, flags and the environment, and the
/// settings they are now.
const EARLIER_NAMES: &[EarlierName] = &[
    EarlierName { earlier: "connect", now: "tcp", scale: 1.0 },
    EarlierName { earlier: "listen", now: "udp", scale: 1.0 },
    EarlierName { earlier: "group", now: "multicast", scale: 1.0 },
    EarlierName { earlier: "listen_b", now: "line_b", scale: 1.0 },
    EarlierName { earlier: "group_b", now: "line_b", scale: 1.0 },
    EarlierName { earlier: "nats_give_up_after", now: "give_up_after", scale: 1.0 },
    EarlierName { earlier: "protection.crc", now: "crc", scale: 1.0 },
    EarlierName { earlier: "protection.key_file", now: "key_file", scale: 1.0 },
    EarlierName { earlier: "count", now: "max_messages", scale: 1.0 },
    EarlierName { earlier: "core", now: "hot_core", scale: 1.0 },
    EarlierName { earlier: "reconnect_max_seconds", now: "reconnect_max", scale: 1.0 },
    EarlierName { earlier: "recovery_delay_ms", now: "recovery_delay", scale: 0.001 },
    EarlierName { earlier: "recovery_retry_ms", now: "recovery_retry", scale: 0.001 },
];

/// The subscriber's own settings, beside the library's receive settings: the report and its
/// outputs, when to stop, the recording, the metrics endpoint and the receive thread's CPU.
/// Written as TOML only, which leaves out what is `None`.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct Application {
    /// How latency is measured: one-way, or round-trip (the publisher is also sent echoes).
    pub latency: LatencyMode,
    /// Seconds between interval lines on stderr, or a duration such as "500ms" (0.01 to 86400,
    /// or 0 for none; default 5).
    #[serde(deserialize_with = "option_seconds")]
    pub report_interval: Option<f64>,
    /// The final report as JSON to this file ("-": stdout, the text report then going to stderr).
    pub json: Option<String>,
    /// An HdrHistogram interval log of one-way latency (ns), one interval per report period.
    pub histogram_log: Option<PathBuf>,
    /// The final books and symbol state (price levels, status, short-sale test, last trade) as
    /// JSON to this file, in the schema of IEX's reference reader `iexbook.py`.
    pub book: Option<PathBuf>,
    /// Stop once this many messages have been received (at least 1).
    pub max_messages: Option<u64>,
    /// Stop after this many seconds, or a duration such as "10m" (at most a day).
    #[serde(deserialize_with = "option_seconds")]
    pub duration: Option<f64>,
    /// Record what is received to this capture file (pcap, or pcapng by its name; gzipped if it
    /// ends in .gz).
    pub record: Option<PathBuf>,
    /// Recording: replace an existing file (never through a symbolic link).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub record_overwrite: bool,
    /// Recording: a new file once the current one holds this many bytes, or e.g. "512MiB" (64 KiB
    /// to 1 TiB).
    #[serde(deserialize_with = "option_bytes")]
    pub record_rotate_size: Option<u64>,
    /// Recording: a new file once the current one spans this many seconds of receive time (1 to
    /// 86400).
    #[serde(deserialize_with = "option_seconds")]
    pub record_rotate_interval: Option<f64>,
    /// Recording with rotation: keep at most this many files, removing the oldest (1 to 1000000).
    pub record_max_files: Option<u64>,
    /// Pin the receive thread to this CPU.
    pub hot_core: Option<usize>,
    /// The Prometheus endpoint (`[metrics] listen`, `hold`).
    #[serde(skip_serializing_if = "MetricsSection::is_off")]
    pub metrics: MetricsSection,
}

/// The subscriber's configuration, checked: the library's receive settings with every default
/// that applies written in, and the subscriber's own. What `--check` prints, as TOML.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Config {
    /// How the stream is received: the library's settings.
    #[serde(flatten)]
    pub receive: Settings,
    /// The report, its outputs, the recording, metrics and the CPU.
    #[serde(flatten)]
    pub app: Application,
}

/// Where the JSON report goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum JsonTarget {
    /// Standard output.
    Stdout,
    /// A file.
    File(PathBuf),
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

impl RecordSettings {
    /// Whether the recording is split into numbered files.
    pub fn rotates(&self) -> bool {
        self.rotate_size.is_some() || self.rotate_interval.is_some()
    }
}

/// A configuration that cannot be used; the message names the setting and where it came from.
#[derive(Debug)]
pub struct ConfigError(pub String);

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ConfigError {}

impl From<anyhow::Error> for ConfigError {
    fn from(error: anyhow::Error) -> ConfigError {
        ConfigError(format!("{error:#}"))
    }
}

/// Each transport, and the settings that go only with some transports: a file's setting that
/// does not go with a transport given as a flag went with the file's transport, which the flag
/// replaced, and is dropped with it.
const TRANSPORTS: [&str; 4] = ["tcp", "udp", "multicast", "nats"];
const GOES_WITH: &[(&str, &[&str])] = &[
    ("interface", &["multicast"]),
    ("line_b", &["udp", "multicast"]),
    ("interface_b", &["multicast"]),
    ("recovery", &["udp", "multicast"]),
    ("recovery_delay", &["udp", "multicast", "nats"]),
    ("recovery_retry", &["udp", "multicast", "nats"]),
    ("recovery_attempts", &["udp", "multicast", "nats"]),
    ("recovery_linger", &["udp", "multicast", "nats"]),
    ("resume", &["tcp"]),
    ("reconnect_max", &["tcp"]),
    ("connect_timeout", &["tcp"]),
    ("give_up_after", &["tcp", "nats"]),
];

/// The NATS settings that give credentials: without any, natscli's `NATS_CREDS` is read.
const NATS_CREDENTIALS: [&str; 4] = ["nats_creds_file", "nats_nkey_file", "nats_user", "nats_password_file"];

impl Config {
    /// The configuration `cli` gives: the file named by `--config` (if any; at most 1 MiB, as
    /// the publisher reads its own), the flags and environment variables given over it, then
    /// natscli's `NATS_CREDS` for a NATS subscriber that nothing else gives credentials; with
    /// each setting's origin, for `--check` and errors.
    pub fn load(cli: &Cli) -> Result<(Config, Layered), ConfigError> {
        if cli.format.is_some() {
            return Err(ConfigError(format!("--format: {NO_FORMAT}")));
        }
        let mut layers = match &cli.config {
            Some(path) => Layered::from_file(path, Reading::AtStart, EARLIER_NAMES)?,
            None => Layered::default(),
        };
        let flags = Layered::from_flags::<Cli>(&cli.given, EARLIER_NAMES)?;
        if let Some(kind) = TRANSPORTS.into_iter().find(|kind| flags.get(kind).is_some()) {
            for key in TRANSPORTS.into_iter().filter(|&other| other != kind) {
                layers.remove(key);
            }
            for (key, _) in GOES_WITH.iter().filter(|(_, with)| !with.contains(&kind)) {
                layers.remove(key);
            }
            if kind != "nats" {
                let nats_keys: Vec<String> =
                    layers.keys().filter(|k| k.starts_with("nats_")).map(String::from).collect();
                nats_keys.iter().for_each(|key| drop(layers.remove(key)));
            }
        }
        layers.lay(flags);
        // Earlier releases took a reconnection wait whatever the transport, and used it over TCP.
        if layers.get("tcp").is_none() {
            layers.remove("reconnect_max");
        }
        let credentials = NATS_CREDENTIALS.iter().any(|key| layers.get(key).is_some());
        if layers.get("nats").is_some()
            && !credentials
            && let Some(creds) = std::env::var("NATS_CREDS").ok().filter(|value| !value.is_empty())
        {
            layers.set("nats_creds_file", toml::Value::String(creds), "NATS_CREDS");
        }
        Config::from_layers(&layers).map(|config| (config, layers))
    }

    /// The configuration the text of the file `path` gives alone, checked.
    pub fn from_text(path: &std::path::Path, text: &str) -> Result<Config, ConfigError> {
        Config::from_layers(&Layered::from_text(path, text, EARLIER_NAMES)?)
    }

    /// The configuration the settings laid in `layers` give, checked.
    pub fn from_layers(layers: &Layered) -> Result<Config, ConfigError> {
        if layers.get("format").is_some() {
            return Err(ConfigError(format!("{}: {NO_FORMAT}; remove the key", layers.name("format"))));
        }
        let (receive_keys, app_keys) = (field_names::<Settings>(), field_names::<Application>());
        layers.refuse_unknown(&[receive_keys, app_keys].concat())?;
        let mut receive: Settings = layers.extract(receive_keys)?;
        let app: Application = layers.extract(app_keys)?;
        // Echoes go with round-trip latency only, every frame's unless said otherwise; one-way
        // latency leaves echo_every out, but a 0 is still refused by the check.
        receive.echo_every = match app.latency {
            LatencyMode::RoundTrip => Some(receive.echo_every.unwrap_or(1)),
            LatencyMode::OneWay => receive.echo_every.filter(|&every| every == 0),
        };
        let receive = receive.effective().map_err(|error| match error {
            // A setting left to its default is not at fault: the reason says what is missing.
            mdrelay_client::Error::Config { setting, reason } if layers.origin(setting).is_none() => {
                ConfigError(reason)
            }
            mdrelay_client::Error::Config { setting, reason } => {
                ConfigError(format!("{}: {reason}", layers.name(setting)))
            }
            other => ConfigError(other.to_string()),
        })?;
        let config = Config { receive, app };
        config.check(layers)?;
        Ok(config)
    }

    /// The subscriber's own settings' rules; errors name the setting and its origin.
    fn check(&self, layers: &Layered) -> Result<(), ConfigError> {
        let app = &self.app;
        let fail = |key: &str, why: String| Err(ConfigError(format!("{}: {why}", layers.name(key))));
        // A day bounds every timer here; longer ones are typos.
        for (key, value, zero, min) in [
            ("report_interval", app.report_interval, true, 0.01),
            ("duration", app.duration, false, 0.0),
            ("record_rotate_interval", app.record_rotate_interval, false, 1.0),
        ] {
            let Some(value) = value else { continue };
            let ok =
                value.is_finite() && value <= 86_400.0 && ((value > 0.0 && value >= min) || (zero && value == 0.0));
            if !ok {
                let range = match (zero, min > 0.0) {
                    (true, _) => format!("0, or {min} to 86400"),
                    (false, true) => format!("{min} to 86400"),
                    (false, false) => "above 0 and at most 86400".to_string(),
                };
                return fail(key, format!("{value} seconds is out of range ({range})"));
            }
        }
        if app.max_messages == Some(0) {
            return fail("max_messages", "must be at least 1 message".into());
        }
        if app.json.as_deref() == Some("") {
            return fail("json", "empty file name (use \"-\" for stdout)".into());
        }
        if let Some(core) = app.hot_core {
            let allowed = crate::cpu::allowed_cpus();
            if !allowed.contains(&core) {
                let cpus = crate::cpu::list(&allowed);
                return fail("hot_core", format!("{core} is not a CPU this process may run on (it may use {cpus})"));
            }
        }
        app.metrics.clone().check(None, None)?;
        match &app.record {
            Some(path) if path.as_os_str().is_empty() => return fail("record", "empty file name".into()),
            Some(_) => {}
            None => {
                let given = [
                    ("record_overwrite", app.record_overwrite),
                    ("record_rotate_size", app.record_rotate_size.is_some()),
                    ("record_rotate_interval", app.record_rotate_interval.is_some()),
                    ("record_max_files", app.record_max_files.is_some()),
                ];
                if let Some((key, _)) = given.into_iter().find(|(_, set)| *set) {
                    return fail(key, "only used with record (the capture file), which is not set".into());
                }
            }
        }
        if let Some(bytes) = app.record_rotate_size
            && !(64 << 10..=1 << 40).contains(&bytes)
        {
            return fail("record_rotate_size", format!("{bytes} bytes is out of range (64KiB to 1TiB)"));
        }
        match app.record_max_files {
            Some(_) if app.record_rotate_size.is_none() && app.record_rotate_interval.is_none() => fail(
                "record_max_files",
                "only used with rotation (record_rotate_size or record_rotate_interval): without it the recording \
                 is one file"
                    .into(),
            ),
            Some(n) if !(1..=1_000_000).contains(&n) => {
                fail("record_max_files", format!("{n} is out of range (1 to 1000000)"))
            }
            _ => Ok(()),
        }
    }

    /// The configuration with the subscriber's own defaults written in too, as `--check` prints it.
    pub fn effective(&self) -> Config {
        let mut config = self.clone();
        config.app.report_interval.get_or_insert(5.0);
        config
    }

    /// The symbols aggregated and reported; none: all.
    pub fn symbols(&self) -> Option<Vec<Symbol>> {
        // Checked by the library: each is 1 to 8 ASCII characters.
        let list = self.receive.symbols.as_ref()?;
        Some(list.iter().filter_map(|text| Symbol::new(text.trim())).collect())
    }

    /// The interval between report lines; none: no interval lines.
    pub fn report_interval(&self) -> Option<Duration> {
        let seconds = self.app.report_interval.unwrap_or(5.0);
        (seconds > 0.0).then(|| Duration::from_secs_f64(seconds))
    }

    /// How long the subscriber runs at most.
    pub fn duration(&self) -> Option<Duration> {
        self.app.duration.map(Duration::from_secs_f64)
    }

    /// Where the JSON report goes.
    pub fn json(&self) -> Option<JsonTarget> {
        self.app.json.as_deref().map(|json| match json {
            "-" => JsonTarget::Stdout,
            path => JsonTarget::File(PathBuf::from(path)),
        })
    }

    /// The recording, if one is asked for.
    pub fn record(&self) -> Option<RecordSettings> {
        let app = &self.app;
        Some(RecordSettings {
            path: app.record.clone()?,
            overwrite: app.record_overwrite,
            rotate_size: app.record_rotate_size,
            rotate_interval: app.record_rotate_interval.map(Duration::from_secs_f64),
            // At most a million by the check.
            max_files: app.record_max_files.map(|n| n as u32),
        })
    }

    /// The Prometheus endpoint, if any.
    pub fn metrics(&self) -> Option<MetricsSettings> {
        // Checked when the configuration was.
        self.app.metrics.clone().check(None, None).ok().flatten()
    }

    /// The transport as the report and logs name it: `tcp HOST:PORT`, `udp ADDR:PORT`,
    /// `multicast GROUP:PORT on ADDR` or `nats SUBJECT on URLS`.
    pub fn transport(&self) -> String {
        let r = &self.receive;
        match (&r.tcp, &r.udp, &r.multicast, &r.nats) {
            (Some(tcp), ..) => format!("tcp {tcp}"),
            (_, Some(udp), ..) => format!("udp {udp}"),
            (_, _, Some(group), _) => format!("multicast {group} on {}", r.interface.as_deref().unwrap_or("0.0.0.0")),
            (.., Some(servers)) => format!("nats {} on {servers}", r.nats_subject.as_deref().unwrap_or_default()),
            _ => String::new(),
        }
    }
}

/// Why the subscriber has no format setting.
const NO_FORMAT: &str = "the subscriber has no format setting: the format comes from the publisher (its greeting, \
                         FORMAT records and every datagram header say it)";

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{CommandFactory, FromArgMatches};
    use mdrelay_telemetry::settings::GivenFlag;
    use std::collections::BTreeMap;

    /// The configuration of a file's `text` under the flags of `argv`, and each setting's origin
    /// (the file named `sub.toml`).
    fn load(text: &str, argv: &[&str]) -> Result<(Config, BTreeMap<String, String>), String> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub.toml");
        std::fs::write(&path, text).unwrap();
        let command = Cli::command().mut_args(|arg| arg.env(None::<&str>));
        let args = ["mdrelay-sub", "--config", path.to_str().unwrap()].into_iter().chain(argv.iter().copied());
        let matches = command.clone().try_get_matches_from(args).map_err(|e| e.to_string())?;
        let mut cli = Cli::from_arg_matches(&matches).unwrap();
        cli.given = GivenFlag::all(&command, &matches);
        let short = |text: &str| text.replace(path.to_str().unwrap(), "sub.toml");
        let (config, layers) = Config::load(&cli).map_err(|e| short(&e.0))?;
        Ok((config, layers.origins().iter().map(|(key, origin)| (key.clone(), short(origin))).collect()))
    }

    #[test]
    fn a_transport_flag_replaces_the_files_transport_and_what_goes_only_with_it() {
        let file = "multicast = \"239.255.0.1:9300\"\ninterface = \"127.0.0.1\"\nline_b = \"239.255.0.2:9300\"\n\
                    recovery = \"127.0.0.1:9101\"\nrecovery_delay = \"7ms\"\nsymbols = [\"AAPL\"]\n";
        let (config, layers) = load(file, &["--tcp", "h:1"]).unwrap();
        let r = &config.receive;
        assert_eq!((r.tcp.as_deref(), r.multicast.as_deref(), r.interface.as_deref()), (Some("h:1"), None, None));
        assert_eq!((r.line_b.as_deref(), r.recovery.as_deref(), r.recovery_delay), (None, None, None));
        assert_eq!(config.symbols().unwrap().len(), 1, "what goes with every transport stays");
        assert_eq!(layers["tcp"], "--tcp");
        // The same file alone: every setting is its own.
        let (config, layers) = load(file, &[]).unwrap();
        assert_eq!(config.receive.recovery_delay, Some(Duration::from_millis(7)));
        assert_eq!(layers["line_b"], "sub.toml, line 3");
        assert_eq!(config.transport(), "multicast 239.255.0.1:9300 on 127.0.0.1");
        // A flag that does not go with the transport is refused, naming it.
        let e = load(file, &["--tcp", "h:1", "--recovery", "h:2"]).unwrap_err();
        assert!(e.starts_with("recovery (--recovery): a TCP subscriber resumes"), "{e}");
    }

    #[test]
    fn earlier_names_are_read_as_the_settings_they_are_now_and_say_so() {
        let file = "listen = \"127.0.0.1:9200\"\nrecovery = \"h:1\"\nrecovery_delay_ms = 7\n[protection]\ncrc = true\n";
        let (config, layers) = load(file, &["--listen-b", "127.0.0.1:9201"]).unwrap();
        let r = &config.receive;
        assert_eq!(
            (r.udp.as_deref(), r.line_b.as_deref(), r.crc),
            (Some("127.0.0.1:9200"), Some("127.0.0.1:9201"), true)
        );
        assert_eq!(r.recovery_delay, Some(Duration::from_millis(7)));
        assert_eq!(layers["udp"], "sub.toml, line 1, under its earlier name listen (now udp)");
        assert_eq!(layers["line_b"], "--listen-b, under its earlier name listen_b (now line_b)");
        assert_eq!(layers["crc"], "sub.toml, line 5, under its earlier name protection.crc (now crc)");
        let e = load("udp = \"127.0.0.1:1\"\nlisten = \"127.0.0.1:2\"\n", &[]).unwrap_err();
        assert!(e.contains("the same setting twice (listen is its earlier name): keep udp"), "{e}");
    }

    #[test]
    fn errors_name_the_setting_its_origin_and_what_is_wrong() {
        for (file, flags, expected) in [
            (
                "tcp = \"h:1\"\nreport_intervall = 1\n",
                &[][..],
                "report_intervall (sub.toml, line 2): unknown setting; did you mean `report_interval`?",
            ),
            (
                "tcp = \"h:1\"\nrecovery_attempts = \"many\"\n",
                &[],
                "recovery_attempts (sub.toml, line 2): invalid type: string \"many\", expected u32",
            ),
            (
                "tcp = \"h:1\"\nformat = \"sbe\"\n",
                &[],
                "format (sub.toml, line 2): the subscriber has no format setting",
            ),
            (
                "tcp = \"h:1\"\n",
                &["--duration", "-1"],
                "duration (--duration): -1 seconds is out of range (above 0 and at most 86400)",
            ),
            (
                "tcp = \"h:1\"\nrecord_max_files = 3\n",
                &[],
                "record_max_files (sub.toml, line 2): only used with record",
            ),
            (
                "udp = \"127.0.0.1:1\"\nrecovery = \"h:2\"\n",
                &["--recovery-attempts", "0"],
                "recovery_attempts (--recovery-attempts): 0 is out of range (1 to 1000)",
            ),
            ("udp = \"127.0.0.1:1\"\n[metrics]\nhold = 5\n", &[], "metrics.hold: set metrics.listen too"),
        ] {
            let e = load(file, flags).unwrap_err();
            assert!(e.starts_with(expected), "{file:?} {flags:?}: {e}");
        }
    }

    #[test]
    fn defaults_are_written_in_and_the_application_settings_read() {
        let file = "nats = \"nats://127.0.0.1:4222\"\nnats_stream = \"MD\"\nlatency = \"round-trip\"\n\
                    record = \"day.pcap.gz\"\nrecord_rotate_size = \"1GiB\"\nrecord_max_files = 3\njson = \"-\"\n";
        let (config, _) = load(file, &["--report-interval", "0"]).unwrap();
        assert_eq!(config.receive.nats_subject.as_deref(), Some("mdrelay.1"));
        assert_eq!(config.receive.recovery_delay, Some(Duration::from_millis(20)), "NATS's repair timings");
        assert_eq!(config.receive.echo_every, Some(1), "round-trip echoes every frame");
        assert_eq!(config.report_interval(), None);
        assert_eq!(config.json(), Some(JsonTarget::Stdout));
        let record = config.record().unwrap();
        assert_eq!((record.rotate_size, record.max_files, record.rotates()), (Some(1 << 30), Some(3), true));
        assert_eq!(config.transport(), "nats mdrelay.1 on nats://127.0.0.1:4222");
        // One-way latency sends no echoes, whatever echo_every says.
        let (config, _) = load("tcp = \"h:1\"\necho_every = 5\n", &[]).unwrap();
        assert_eq!(config.receive.echo_every, None);
    }
}
