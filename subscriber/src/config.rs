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
    /// How the stream is received: the library's settings, a flag each.
    #[command(flatten)]
    #[serde(flatten)]
    pub receive: Settings,
    /// The report, its outputs, the recording and the receive thread's CPU.
    #[command(flatten)]
    #[serde(flatten)]
    pub app: Application,
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

/// The command line: [`Cli`]'s flags, where each setting's flag is also read from the
/// environment as `MDRELAY_SUB_` and the setting's name in capitals (`MDRELAY_SUB_RECOVERY_DELAY`).
pub fn command() -> clap::Command {
    use clap::CommandFactory;
    let settings = [field_names::<Settings>(), field_names::<Application>()].concat();
    Cli::command().mut_args(|arg| {
        let id = arg.get_id().as_str();
        match arg.get_env().is_none() && settings.contains(&id) {
            // Once per flag in a process's life: the leak is the command's static name.
            true => {
                let variable: &'static str = Box::leak(format!("MDRELAY_SUB_{}", id.to_uppercase()).into_boxed_str());
                arg.env(variable)
            }
            false => arg,
        }
    })
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
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize, clap::Args)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct Application {
    /// How latency is measured: one-way, or round-trip (the publisher is also sent echoes).
    #[arg(long, value_enum, default_value = "one-way", help_heading = "Report")]
    pub latency: LatencyMode,
    /// Seconds between interval lines on stderr, or a duration such as "500ms" (0.01 to 86400,
    /// or 0 for none; default 5).
    #[serde(deserialize_with = "option_seconds")]
    #[arg(long, value_name = "DURATION", value_parser = parse_seconds, help_heading = "Report")]
    pub report_interval: Option<f64>,
    /// The final report as JSON to this file ("-": stdout, the text report then going to stderr).
    #[arg(long, value_name = "FILE", help_heading = "Report")]
    pub json: Option<String>,
    /// An HdrHistogram interval log of one-way latency (ns), one interval per report period.
    #[arg(long, value_name = "FILE", help_heading = "Report")]
    pub histogram_log: Option<PathBuf>,
    /// The final books and symbol state (price levels, status, short-sale test, last trade) as
    /// JSON to this file, in the schema of IEX's reference reader `iexbook.py`.
    #[arg(long, value_name = "FILE", help_heading = "Report")]
    pub book: Option<PathBuf>,
    /// Stop once this many messages have been received (at least 1).
    #[arg(long, value_name = "N", alias = "count", help_heading = "Report")]
    pub max_messages: Option<u64>,
    /// Stop after this many seconds, or a duration such as "10m" (at most a day).
    #[serde(deserialize_with = "option_seconds")]
    #[arg(long, value_name = "DURATION", value_parser = parse_seconds, help_heading = "Report")]
    pub duration: Option<f64>,
    /// Record what is received to this capture file (pcap, or pcapng by its name; gzipped if it
    /// ends in .gz).
    #[arg(long, value_name = "FILE", help_heading = "Recording")]
    pub record: Option<PathBuf>,
    /// Recording: replace an existing file (never through a symbolic link).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    #[arg(long, visible_alias = "force", help_heading = "Recording")]
    pub record_overwrite: bool,
    /// Recording: a new file once the current one holds this many bytes, or e.g. "512MiB" (64 KiB
    /// to 1 TiB).
    #[serde(deserialize_with = "option_bytes")]
    #[arg(long, value_name = "SIZE", value_parser = parse_bytes::<u64>, help_heading = "Recording")]
    pub record_rotate_size: Option<u64>,
    /// Recording: a new file once the current one spans this many seconds of receive time (1 to
    /// 86400).
    #[serde(deserialize_with = "option_seconds")]
    #[arg(long, value_name = "DURATION", value_parser = parse_seconds, help_heading = "Recording")]
    pub record_rotate_interval: Option<f64>,
    /// Recording with rotation: keep at most this many files, removing the oldest (1 to 1000000).
    #[arg(long, value_name = "N", help_heading = "Recording")]
    pub record_max_files: Option<u64>,
    /// Pin the receive thread to this CPU.
    #[arg(long, value_name = "N", alias = "core", help_heading = "Latency and CPU")]
    pub hot_core: Option<usize>,
    /// The Prometheus endpoint (`[metrics] listen`, `hold`).
    #[serde(skip_serializing_if = "MetricsSection::is_off")]
    #[arg(skip)]
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
