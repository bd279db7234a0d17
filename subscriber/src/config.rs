//! Settings: a TOML file (`--config`) overridden by command-line flags, validated once at start
//! into [`Settings`], so a bad setting fails before anything is bound or connected, with a
//! message naming the setting (and, for the file, the file and line).

use clap::{Parser, ValueEnum};
use mdrelay_proto::Symbol;
use serde::Deserialize;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;
use toml::Spanned;

/// mdrelay subscriber: receives a publisher's stream over TCP, UDP or multicast, decodes it
/// (the format comes from the publisher), aggregates per symbol and reports loss and latency.
#[derive(Debug, Default, Parser)]
#[command(name = "mdrelay-sub", version, about, allow_negative_numbers = true)]
pub struct Cli {
    /// TOML configuration file; flags given here override its settings.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// TCP: connect to a publisher at HOST:PORT (reconnects when the connection drops).
    #[arg(long, value_name = "HOST:PORT")]
    pub connect: Option<String>,
    /// UDP unicast: listen on ADDR:PORT (port 0 picks a free port, logged at start).
    #[arg(long, value_name = "ADDR:PORT")]
    pub listen: Option<String>,
    /// UDP multicast: join GROUP:PORT (an IPv4 multicast group).
    #[arg(long, value_name = "GROUP:PORT")]
    pub group: Option<String>,
    /// Multicast: the local interface address to join the group on (default 0.0.0.0).
    #[arg(long, value_name = "ADDR")]
    pub interface: Option<String>,
    /// Aggregate and report only these symbols (comma-separated or repeated).
    #[arg(long, value_name = "SYMBOL", value_delimiter = ',')]
    pub symbols: Option<Vec<String>>,
    /// Latency mode; round-trip also echoes publish times back to the publisher.
    #[arg(long, value_enum)]
    pub latency: Option<LatencyMode>,
    /// Round-trip mode: echo every Nth frame (default 1).
    #[arg(long, value_name = "N")]
    pub echo_every: Option<u64>,
    /// Seconds between interval lines on stderr (default 5; 0: none).
    #[arg(long, value_name = "SECONDS")]
    pub report_interval: Option<f64>,
    /// Write the final report as JSON to FILE ("-": stdout, and the text report goes to stderr).
    #[arg(long, value_name = "FILE")]
    pub json: Option<String>,
    /// Write an HdrHistogram interval log of one-way latency (ns), one interval per report period.
    #[arg(long, value_name = "FILE")]
    pub histogram_log: Option<PathBuf>,
    /// Stop once this many messages have been received.
    #[arg(long, value_name = "N")]
    pub count: Option<u64>,
    /// Stop after this many seconds.
    #[arg(long, value_name = "SECONDS")]
    pub duration: Option<f64>,
    /// TCP: the longest wait between reconnection attempts (default 5).
    #[arg(long, value_name = "SECONDS")]
    pub reconnect_max_seconds: Option<f64>,
    /// Check the configuration, print the settings it amounts to and exit.
    #[arg(long)]
    pub check: bool,
    /// Not a setting: the format comes from the publisher. Accepted only to explain that.
    #[arg(long, hide = true)]
    pub format: Option<String>,
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

/// A number of seconds as TOML writes it: an integer or a float.
#[derive(Clone, Copy, Debug, Deserialize)]
#[serde(untagged)]
enum Seconds {
    Int(i64),
    Float(f64),
}

impl Seconds {
    fn get(self) -> f64 {
        match self {
            Seconds::Int(n) => n as f64,
            Seconds::Float(f) => f,
        }
    }
}

/// The configuration file as written; every key optional, unknown keys refused.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    connect: Option<Spanned<String>>,
    listen: Option<Spanned<String>>,
    group: Option<Spanned<String>>,
    interface: Option<Spanned<String>>,
    symbols: Option<Spanned<Vec<String>>>,
    latency: Option<LatencyMode>,
    echo_every: Option<Spanned<u64>>,
    report_interval: Option<Spanned<Seconds>>,
    json: Option<String>,
    histogram_log: Option<PathBuf>,
    count: Option<Spanned<u64>>,
    duration: Option<Spanned<Seconds>>,
    reconnect_max_seconds: Option<Spanned<Seconds>>,
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
}

impl fmt::Display for Transport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Transport::Tcp(addr) => write!(f, "tcp {addr}"),
            Transport::Udp(addr) => write!(f, "udp {addr}"),
            Transport::Multicast { group, interface } => write!(f, "multicast {group} on {interface}"),
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
    /// Stop after this many messages.
    pub count: Option<u64>,
    /// Stop after this long.
    pub duration: Option<Duration>,
    /// Cap of the TCP reconnection backoff.
    pub reconnect_max: Duration,
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

/// Where a value came from, to name it in errors: `--flag` or `file:line: key`.
struct Origin<'a> {
    file: Option<(&'a Path, &'a str)>,
}

impl Origin<'_> {
    fn flag(key: &str) -> String {
        format!("--{}", key.replace('_', "-"))
    }

    fn file_key(&self, key: &str, span: std::ops::Range<usize>) -> String {
        match self.file {
            Some((path, text)) => {
                let line = text[..span.start.min(text.len())].matches('\n').count() + 1;
                format!("{}: line {line}: {key}", path.display())
            }
            None => key.to_string(),
        }
    }
}

/// A value with the name of where it was set.
struct Named<T> {
    value: T,
    name: String,
}

fn pick<T>(cli: Option<T>, file: Option<Spanned<T>>, key: &str, origin: &Origin<'_>) -> Option<Named<T>> {
    match (cli, file) {
        (Some(value), _) => Some(Named { value, name: Origin::flag(key) }),
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
        let origin = Origin { file: Some((path, text)) };
        return ConfigError(format!(
            "{}: the subscriber has no format setting: the format comes from the publisher (its greeting, \
             FORMAT records and every datagram header say it); remove the key",
            origin.file_key("format", error.span().unwrap_or(0..0))
        ));
    }
    ConfigError(format!("{}: {}", path.display(), error.to_string().trim_end()))
}

/// How to write a setting in the place the user wrote another: `--key value` or `key = "value"`.
fn suggest(origin_name: &str, key: &str, value: &str) -> String {
    if origin_name.starts_with("--") { format!("--{key} {value}") } else { format!("{key} = \"{value}\"") }
}

const DEFAULT_REPORT_INTERVAL: f64 = 5.0;
const DEFAULT_RECONNECT_MAX: f64 = 5.0;

impl Settings {
    /// Reads the file named by `--config` (if any) and applies the flags over it.
    pub fn load(mut cli: Cli) -> Result<Settings, ConfigError> {
        let path = cli.config.take();
        let (file, text) = match &path {
            Some(path) => {
                let text = std::fs::read_to_string(path)
                    .map_err(|e| ConfigError(format!("{}: cannot read the configuration: {e}", path.display())))?;
                let file: FileConfig = toml::from_str(&text).map_err(|e| file_error(path, &text, &e))?;
                (file, text)
            }
            None => (FileConfig::default(), String::new()),
        };
        let origin = Origin { file: path.as_deref().map(|p| (p, text.as_str())) };
        Settings::build(cli, file, &origin)
    }

    /// Checks the text of a configuration file named `path` (for messages), with no flags over it.
    pub fn from_toml(path: &Path, text: &str) -> Result<Settings, ConfigError> {
        let file: FileConfig = toml::from_str(text).map_err(|e| file_error(path, text, &e))?;
        Settings::build(Cli::default(), file, &Origin { file: Some((path, text)) })
    }

    fn build(cli: Cli, file: FileConfig, origin: &Origin<'_>) -> Result<Settings, ConfigError> {
        if cli.format.is_some() {
            return Err(ConfigError(
                "--format: the subscriber has no format setting: the format comes from the publisher (its \
                 greeting, FORMAT records and every datagram header say it)"
                    .into(),
            ));
        }

        let transport = transport(&cli, &file, origin)?;

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
        let reconnect_max = seconds(
            cli.reconnect_max_seconds,
            file.reconnect_max_seconds,
            "reconnect_max_seconds",
            origin,
            false,
            MIN_TIMER,
        )?
        .unwrap_or(Duration::from_secs_f64(DEFAULT_RECONNECT_MAX));

        let count = match pick(cli.count, file.count, "count", origin) {
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

        Ok(Settings {
            transport,
            symbols,
            latency,
            echo_every,
            report_interval,
            json,
            histogram_log,
            count,
            duration,
            reconnect_max,
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
        Spanned::new(span, s.into_inner().get())
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

fn transport(cli: &Cli, file: &FileConfig, origin: &Origin<'_>) -> Result<Transport, ConfigError> {
    let file_given: Vec<(&str, &Spanned<String>)> =
        [("connect", &file.connect), ("listen", &file.listen), ("group", &file.group)]
            .into_iter()
            .filter_map(|(k, v)| v.as_ref().map(|v| (k, v)))
            .collect();
    if file_given.len() > 1 {
        let names: Vec<String> = file_given.iter().map(|(k, v)| origin.file_key(k, v.span())).collect();
        return Err(ConfigError(format!(
            "several transports configured ({}): set exactly one of connect (TCP), listen (UDP) or group (multicast)",
            names.join(", ")
        )));
    }
    let cli_given: Vec<(&str, &String)> = [("connect", &cli.connect), ("listen", &cli.listen), ("group", &cli.group)]
        .into_iter()
        .filter_map(|(k, v)| v.as_ref().map(|v| (k, v)))
        .collect();
    if cli_given.len() > 1 {
        let names: Vec<String> = cli_given.iter().map(|(k, _)| Origin::flag(k)).collect();
        return Err(ConfigError(format!(
            "several transports given ({}): use exactly one of --connect (TCP), --listen (UDP) or --group (multicast)",
            names.join(", ")
        )));
    }
    // A transport flag replaces the file's transport, whichever it is.
    let (key, value, name) = match (cli_given.first(), file_given.first()) {
        (Some((k, v)), _) => (*k, (*v).clone(), Origin::flag(k)),
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
        (Some(v), _) => Some((v.clone(), Origin::flag("interface"), true)),
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

    match key {
        "connect" => {
            check_host_port(&value).map_err(|why| ConfigError(format!("{name}: {value:?} {why}")))?;
            Ok(Transport::Tcp(value))
        }
        "listen" => {
            let addr: SocketAddr = value.parse().map_err(|_| {
                ConfigError(format!(
                    "{name}: {value:?} is not an address:port (e.g. \"0.0.0.0:9200\" or \"[::]:9200\")"
                ))
            })?;
            if addr.ip().is_multicast() {
                return Err(ConfigError(format!(
                    "{name}: {} is a multicast address; listen takes a unicast address, use {} to join a multicast \
                     group",
                    addr.ip(),
                    suggest(&name, "group", &addr.to_string())
                )));
            }
            Ok(Transport::Udp(addr))
        }
        _ => {
            let addr: SocketAddr = value.parse().map_err(|_| {
                ConfigError(format!("{name}: {value:?} is not a group:port (e.g. \"239.255.0.1:9300\")"))
            })?;
            let group = match addr.ip() {
                IpAddr::V4(ip) if ip.is_multicast() => ip,
                IpAddr::V4(ip) => {
                    return Err(ConfigError(format!(
                        "{name}: {ip} is not a multicast address (224.0.0.0/4); for unicast UDP use {}",
                        suggest(&name, "listen", &addr.to_string())
                    )));
                }
                IpAddr::V6(_) => {
                    return Err(ConfigError(format!(
                        "{name}: {addr} is IPv6; only IPv4 multicast groups are supported"
                    )));
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
    }
}

/// Checks `host:port` syntax without resolving the name (the publisher may not be up yet).
fn check_host_port(value: &str) -> Result<(), &'static str> {
    if value.parse::<SocketAddr>().is_ok() {
        return Ok(());
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

#[cfg(test)]
mod tests {
    use super::*;

    fn from_file(text: &str) -> Result<Settings, ConfigError> {
        Settings::from_toml(Path::new("sub.toml"), text)
    }

    fn err(text: &str) -> String {
        from_file(text).unwrap_err().0
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
        let s = Settings::build(cli, file, &Origin { file: None }).unwrap();
        assert_eq!(s.transport, Transport::Udp("127.0.0.1:0".parse().unwrap()));
        let file: FileConfig = toml::from_str(text).unwrap();
        let cli = Cli { listen: Some("127.0.0.1:0".into()), interface: Some("127.0.0.1".into()), ..Cli::default() };
        assert!(Settings::build(cli, file, &Origin { file: None }).unwrap_err().0.contains("--interface"));
        let s = from_file(text).unwrap();
        assert_eq!(
            s.transport,
            Transport::Multicast { group: "239.255.0.1:9300".parse().unwrap(), interface: Ipv4Addr::LOCALHOST }
        );
        assert_eq!(s.duration, Some(Duration::from_millis(1500)));
    }

    #[test]
    fn bad_settings_are_named() {
        assert!(err("listen = \"239.255.0.1:9300\"").contains("line 1: listen: 239.255.0.1 is a multicast"));
        assert!(err("group = \"127.0.0.1:9300\"").contains("group: 127.0.0.1 is not a multicast address"));
        assert!(err("symbols = []\n").contains("no transport"));
        assert!(err("connect = \"a:1\"\nlisten = \"127.0.0.1:2\"").contains("several transports"));
        assert!(err("connect = \"nohost\"").contains("connect: \"nohost\" is not host:port"));
        assert!(err("connect = \"h:99999\"").contains("port"));
        let format = err("connect = \"h:1\"\nformat = \"sbe\"");
        assert!(format.contains("sub.toml: line 2: format") && format.contains("comes from the publisher"), "{format}");
        assert!(err("connect = \"h:1\"\necho_every = 0").contains("echo_every"));
        assert!(err("connect = \"h:1\"\nduration = 0").contains("duration"));
        assert!(err("connect = \"h:1\"\nreport_interval = 1e-9").contains("report_interval"));
        assert!(err("connect = \"h:1\"\nreconnect_max_seconds = 0.001").contains("reconnect_max_seconds"));
        assert!(err("connect = \"h:1\"\nsymbols = [\"TOOLONGSYM\"]").contains("symbols"));
        assert!(err("connect = \"h:1\"\ninterface = \"127.0.0.1\"").contains("interface"));
        let unknown = err("connect = \"h:1\"\n\nbogus = 1\n");
        assert!(
            unknown.starts_with("sub.toml: ") && unknown.contains("bogus") && unknown.contains("line 3"),
            "{unknown}"
        );
    }
}
