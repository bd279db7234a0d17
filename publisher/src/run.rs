//! `mdrelay-pub run`: the relay itself. Reads the configuration, starts the TCP server and the
//! UDP output, runs the hot path, handles SIGHUP (reload: a changed format takes effect at the
//! next frame) and Ctrl-C (end the stream with its totals), and prints a summary.

use crate::config::{self, PacingMode, Reading, Settings};
use crate::engine::{self, Controls, EngineSummary, Outputs};
use crate::fanout::{ConnectionCounts, Fanout, Shared, SubscriberSummary};
use crate::retransmit::{RetransmitSummary, Service};
use crate::ring::SharedRing;
use crate::snapshot::SNAPSHOT_BUILDS;
use crate::source::SegmentSource;
use crate::stats::Echoes;
use crate::stop::Stop;
use crate::tcp::Server;
use crate::udp::UdpOut;
use crate::upstream::{TcpUpstream, UpstreamSource};
use crate::upstream_nats::NatsUpstream;
use anyhow::{Context, Result};
use clap::Args;
use mdrelay_codec::Format;
use mdrelay_proto::latency::LatencySummary;
use mdrelay_proto::relay::FrameRing;
use mdrelay_telemetry::exit::{ExitStatus, WithExitStatus};
use mdrelay_telemetry::settings::{Layered, field_names};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

/// Flags of `run`: the configuration file, `--check`, the report, and a flag for every setting
/// of the file ([`SettingFlags`]), laid over the file's value.
#[derive(Debug, Args, Clone, Default)]
pub struct RunArgs {
    /// TOML configuration file (see config/ for examples).
    #[arg(long, value_name = "FILE", short, env = "MDRELAY_PUB_CONFIG")]
    pub config: Option<PathBuf>,
    /// Check the configuration, print the settings it amounts to (TOML, each value followed by
    /// where it came from) and exit.
    #[arg(long)]
    pub check: bool,
    /// The settings' flags.
    #[command(flatten)]
    pub settings: SettingFlags,
    /// Write the run's summary as JSON to this file ("-" for stdout).
    #[arg(long, value_name = "FILE", help_heading = "Metrics and report")]
    pub json: Option<PathBuf>,
    /// The flags given (on the command line or in the environment), as given: where each
    /// setting came from is worked out from them.
    #[arg(skip)]
    pub given: Vec<mdrelay_telemetry::settings::GivenFlag>,
}

/// A flag for every setting of the configuration file that has one: its name, placeholder,
/// heading and help are those of the setting's field in [`Settings`] (its `#[arg]`, whose id is
/// the setting's dotted key, and its doc), and its variable is `MDRELAY_PUB_` and its name.
/// Each takes its value as text, which is read and checked by the setting's type as the file's
/// value is ([`Layered::from_flag_texts`]), so every error names the setting and its flag.
#[derive(Debug, Clone, Default)]
pub struct SettingFlags;

impl clap::FromArgMatches for SettingFlags {
    fn from_arg_matches(_: &clap::ArgMatches) -> Result<SettingFlags, clap::Error> {
        // What was given is read by `GivenFlag::all`, with where it came from.
        Ok(SettingFlags)
    }

    fn update_from_arg_matches(&mut self, _: &clap::ArgMatches) -> Result<(), clap::Error> {
        Ok(())
    }
}

impl Args for SettingFlags {
    fn augment_args(command: clap::Command) -> clap::Command {
        command.args(setting_flags())
    }

    fn augment_args_for_update(command: clap::Command) -> clap::Command {
        command.args(setting_flags())
    }
}

/// The flags of the settings, from [`Settings`]' fields: line B's are line A's with `-b`, and
/// `--synthetic` stands for its section.
fn setting_flags() -> Vec<clap::Arg> {
    // Once per flag in a process's life: the leaks are the command's static names.
    let leak = |text: String| -> &'static str { Box::leak(text.into_boxed_str()) };
    let described = <Settings as Args>::augment_args(clap::Command::new("settings"));
    let mut flags: Vec<clap::Arg> = described.get_arguments().cloned().collect();
    let line_b: Vec<clap::Arg> = flags
        .iter()
        .filter_map(|a| Some((a, a.get_id().as_str().strip_prefix("multicast.")?, a.get_long()?)))
        .map(|(a, key, long)| {
            let help = a.get_help().map(ToString::to_string).unwrap_or_default();
            let help = format!(
                "Line B: {}{}",
                help.get(..1).unwrap_or_default().to_lowercase(),
                help.get(1..).unwrap_or_default()
            );
            a.clone().id(leak(format!("multicast_b.{key}"))).long(leak(format!("{long}-b"))).help(help)
        })
        .collect();
    flags.extend(line_b);
    let synthetic = flags.iter().position(|f| f.get_id() == "source.synthetic.messages").unwrap_or(flags.len());
    let order = flags.get(synthetic).map(clap::Arg::get_display_order).unwrap_or_default();
    flags.insert(
        synthetic,
        clap::Arg::new("source.synthetic")
            .display_order(order)
            .long("synthetic")
            .action(clap::ArgAction::SetTrue)
            .conflicts_with("source.live.listen")
            .help("Generate a synthetic day on the fly (the default source)")
            .help_heading("Source"),
    );
    // Headings in the order an operator reads them (clap shows them as their flags come).
    let rank = |flag: &clap::Arg| HEADINGS.iter().position(|h| flag.get_help_heading() == Some(*h));
    flags.sort_by_key(rank);
    let defaults = leaves_of(&defaults_of_every_section());
    flags
        .into_iter()
        .map(|flag| {
            let long = flag.get_long().unwrap_or_default().to_uppercase().replace('-', "_");
            let mut flag = flag.env(leak(format!("MDRELAY_PUB_{long}"))).required(false);
            if let Some(default) = defaults.get(flag.get_id().as_str()) {
                let help = flag.get_help().map(ToString::to_string).unwrap_or_default();
                flag = flag.help(format!("{help} [default: {default}]"));
            }
            if !flag.get_action().takes_values() {
                return flag;
            }
            let action = match flag.get_action() {
                clap::ArgAction::Append => clap::ArgAction::Append,
                _ => clap::ArgAction::Set,
            };
            let flag = flag.action(action).num_args(1);
            // Numbers, durations, sizes and addresses are read as the file's are, by the
            // setting's type, so that a value out of range is named with its setting; choices
            // (a format, a mode, true or false) and files are checked as given.
            let names = flag.get_value_names().unwrap_or_default();
            match names.iter().any(|name| READ_AS_TEXT.contains(&name.as_str())) {
                true => flag.value_parser(clap::builder::ValueParser::string()),
                false => flag,
            }
        })
        .collect()
}

/// The headings of `run --help`, in order.
const HEADINGS: [&str; 10] = [
    "Format",
    "Source",
    "Upstream (relay)",
    "Pacing",
    "Batching",
    "TCP",
    "UDP and multicast",
    "Retransmission",
    "Latency and CPU",
    "Metrics and report",
];

/// The placeholders of the values a flag takes as text, read by its setting's type.
const READ_AS_TEXT: [&str; 9] =
    ["N", "FACTOR", "DURATION", "SIZE", "ADDR:PORT", "HOST:PORT", "GROUP:PORT", "GROUP", "ADDR"];

/// The settings' defaults, with a section of each kind that has defaults of its own (`[tcp]`,
/// a synthetic day, a TCP upstream): what `--help` says a flag's value is when it is not given.
fn defaults_of_every_section() -> toml::Table {
    let mut settings = Settings { tcp: Some(config::Tcp::default()), ..Settings::default() };
    settings.source.synthetic = Some(config::Synthetic::default());
    settings.source.upstream = Some(config::UpstreamSection::default());
    toml::Table::try_from(&settings).unwrap_or_default()
}

/// Every value of `table` by its dotted key, as TOML writes it; empty texts left out.
fn leaves_of(table: &toml::Table) -> BTreeMap<String, String> {
    let leaves = mdrelay_telemetry::settings::leaves(table);
    let text = |value: &toml::Value| match value {
        toml::Value::String(text) => text.clone(),
        // Seconds and rates: `60`, not `60.0`.
        toml::Value::Float(number) if number.fract() == 0.0 && number.abs() < 1e15 => format!("{}", *number as i64),
        value => value.to_string(),
    };
    leaves.into_iter().map(|(key, value)| (key, text(value))).filter(|(_, text)| !text.is_empty()).collect()
}

impl RunArgs {
    /// Lays the flags given over the file's settings. Each flag sets the key that is its id
    /// (its `#[arg]` on the setting's field), with three rules:
    /// - a flag of one kind of source (`source.live.*`, say) replaces a source of another kind
    ///   in the file, keeping the file's settings of its own kind;
    /// - `--max-datagram` sets `max_datagram` in every UDP output there is;
    /// - a flag of an output or source that neither the file nor another flag creates (`--ttl`
    ///   without a multicast group) is an error naming the setting, not ignored.
    fn lay_flags(&self, layers: &mut Layered) -> Result<()> {
        let mut flags = Layered::from_flag_texts(&self.given, &setting_flags())?;
        let sections_in_file: Vec<&str> =
            ANCHORED_SECTIONS.iter().map(|(section, _)| *section).filter(|s| layers.get(s).is_some()).collect();
        let mut source_given: Option<&str> = None;
        for key in flags.set_keys() {
            if let ["source", kind, ..] = key.split('.').collect::<Vec<_>>()[..] {
                match source_given {
                    Some(given) if given != kind => {
                        anyhow::bail!("{}: given with a flag of source.{given}; give one source", flags.name(key))
                    }
                    _ => source_given = Some(kind),
                }
            }
        }
        if let Some(kind) = source_given {
            for other in ["capture", "synthetic", "live", "upstream"].into_iter().filter(|other| *other != kind) {
                layers.remove(&format!("source.{other}"));
            }
        }
        let max_datagram = flags.origin("udp.max_datagram").map(String::from).zip(flags.remove("udp.max_datagram"));
        if flags.get("udp").and_then(toml::Value::as_table).is_some_and(toml::Table::is_empty) {
            flags.remove("udp");
        }
        layers.lay(flags);
        if let Some((origin, value)) = max_datagram {
            // One limit for every UDP output, whichever the file or the flags create.
            let outputs: Vec<&str> =
                ["udp", "multicast", "multicast_b"].into_iter().filter(|o| layers.get(o).is_some()).collect();
            if outputs.is_empty() {
                anyhow::bail!(
                    "udp.max_datagram ({origin}): given, but there is no UDP output to apply it to; set \
                     udp.destinations as well"
                )
            }
            for output in outputs {
                layers.set(&format!("{output}.max_datagram"), value.clone(), &origin);
            }
        }
        for (section, anchors) in ANCHORED_SECTIONS {
            if !sections_in_file.contains(section)
                && let Some(toml::Value::Table(given)) = layers.get(section)
                && !anchors.iter().any(|anchor| given.contains_key(*anchor))
            {
                let key = given.keys().next().map(|k| format!("{section}.{k}")).unwrap_or(section.to_string());
                let anchor = format!("{section}.{}", anchors[0]);
                let key = layers.name(&key);
                anyhow::bail!("{key}: given, but there is no {section} to apply it to; set {anchor} as well");
            }
        }
        Ok(())
    }

    /// The checked configuration at start: the file (if any) under the flags.
    pub fn config(&self) -> Result<config::Config> {
        self.config_read(Reading::AtStart)
    }

    /// The checked configuration on SIGHUP: as at start, but the file must be a regular file.
    pub fn reload_config(&self) -> Result<config::Config> {
        self.config_read(Reading::Reload)
    }

    fn config_read(&self, reading: Reading) -> Result<config::Config> {
        self.config_with_origins(reading).map(|(config, _)| config)
    }

    /// The checked configuration, and where each setting given came from (by dotted key): a
    /// file and line, a flag or an environment variable. A setting that fails its check is
    /// named with its origin.
    pub fn config_with_origins(&self, reading: Reading) -> Result<(config::Config, BTreeMap<String, String>)> {
        let mut layers = match &self.config {
            Some(path) => Layered::from_file(path, reading, &[])?,
            None => Layered::default(),
        };
        self.lay_flags(&mut layers)?;
        nats_environment(&mut layers, |name| std::env::var(name).ok());
        // Line B's TTL and loopback are line A's unless set (config::check).
        for key in ["ttl", "loopback"] {
            if let Some(origin) = layers.origin(&format!("multicast.{key}")).map(String::from) {
                layers.origin_or(&format!("multicast_b.{key}"), &format!("line A's, {origin}"));
            }
        }
        let origins = layers.origins().clone();
        let keys = field_names::<Settings>();
        match layers.refuse_unknown(keys).and_then(|()| layers.extract::<Settings>(keys)).and_then(Settings::check) {
            Ok(config) => Ok((config, origins)),
            Err(error) => Err(config::name_origin(error, &origins, self.config.as_deref())),
        }
    }
}

/// The sections a flag can create that are nothing without one of their keys (the first one
/// named in errors): a flag of such a section with neither in the file nor among the flags has
/// nothing to apply to.
const ANCHORED_SECTIONS: &[(&str, &[&str])] = &[
    ("source.live", &["listen"]),
    ("source.upstream", &["connect", "nats"]),
    ("udp", &["destinations"]),
    ("multicast", &["group"]),
    ("multicast_b", &["group"]),
];

/// The publisher's summary of a run.
#[derive(Debug, serde::Serialize)]
pub struct RunSummary {
    /// Format at the end of the run.
    pub format: Format,
    /// The engine's figures.
    #[serde(flatten)]
    pub engine: EngineSummary,
    /// The most recent TCP subscribers (at most [`crate::fanout::KEPT_SUMMARIES`]).
    pub subscribers: Vec<SubscriberSummary>,
    /// Subscribers before those, left out of the list.
    pub subscribers_omitted: u64,
    /// Counters over every TCP connection.
    pub connections: Option<ConnectionCounts>,
    /// Round trips measured from subscribers' echoes, ns.
    pub round_trip_ns: LatencySummary,
    /// Echoes that named no frame sent, with another publish time, or out of order.
    pub echoes_rejected: u64,
    /// Warnings about bad input counted but not logged (the log budget).
    pub warnings_suppressed: u64,
    /// The retransmission service, when it ran.
    pub retransmit: Option<RetransmitSummary>,
    /// The NATS output, when configured.
    pub nats: Option<crate::nats::NatsSummary>,
    /// Why the run failed (it exits with an error after writing this summary), when it did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The failure itself, with the exit status it carries.
    #[serde(skip)]
    pub failure: Option<anyhow::Error>,
}

/// Runs the publisher until the stream ends. An error carries the exit status it ends the
/// process with ([`ExitStatus::of`]).
pub fn run(args: &RunArgs) -> Result<()> {
    if args.check {
        let (config, origins) = args.config_with_origins(Reading::AtStart).exit_status(ExitStatus::Config)?;
        let title = "mdrelay-pub run: the configuration this run would use";
        print!(
            "{}",
            mdrelay_telemetry::settings::annotated(title, &config.to_table(), &|key| origins.get(key).cloned())
        );
        return Ok(());
    }
    let config = args.config().exit_status(ExitStatus::Config)?;
    // The relay's memory is bounded by its ring and its queue: what it frees (records its
    // subscribers have taken) it keeps for the next burst, so its resident set stays at its
    // high-water mark instead of swinging, and the hot thread does not fault those pages in again.
    if !mdrelay_runtime::memory::keep_freed_memory() {
        tracing::debug!("the C library's allocator hands freed memory back by its own policy");
    }
    // Before the runtime exists, so the exporter gets a thread and runtime of its own.
    let build_info = match &config.metrics {
        Some(m) => Some(mdrelay_telemetry::prometheus::serve(
            m,
            "mdrelay-pub",
            env!("CARGO_PKG_VERSION"),
            env!("MDRELAY_REVISION"),
        )?),
        None => None,
    };
    // One I/O thread by default: with more, a record handed over by the hot thread wakes one
    // worker, which wakes a sibling to share the work; at 10,000 frames/s those wake-ups cost
    // more CPU than the writes (docs/idle.md). More threads help only with many subscribers.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(config.cpu.io_threads)
        .enable_all()
        .thread_name("mdrelay-pub-io")
        .build()?;
    let hold = config.metrics.map(|m| m.hold).unwrap_or_default();
    // A relay takes its upstream's session as its own, so a leaf sees one session through the
    // whole chain: the upstream is reached (or the run fails, naming it) before anything else.
    // The run's stop, made first: it ends the waits for the upstream too.
    let stop = Arc::new(Stop::new().context("cannot make the run's stop signal")?);
    let upstream: Option<UpstreamSource> = match &config.source {
        config::Source::Upstream(u) => {
            let own = config::own_listeners(config.tcp.as_ref(), &config.retransmit);
            // A literal address was checked with the configuration; a host name naming this
            // publisher is the same mistake, once resolved. Each attempt checks again (a name
            // may move), but then the relay has begun.
            if u.connect.parse::<std::net::SocketAddr>().is_err()
                && let Ok(addrs) = std::net::ToSocketAddrs::to_socket_addrs(u.connect.as_str())
            {
                for addr in addrs {
                    config::check_not_self(addr, &own).exit_status(ExitStatus::Config)?;
                }
            }
            Some(Box::new(TcpUpstream::connect(u.clone(), own, stop.clone())?))
        }
        config::Source::NatsUpstream(u) => Some(Box::new(NatsUpstream::connect(u.clone(), stop.clone())?)),
        _ => None,
    };
    // Encrypted, a session is the time the run started (ns since the epoch), so a subscriber can
    // refuse datagrams replayed from an older session: each is authentic under its own
    // session's key, but the older one is past.
    let new_session = || {
        if config.protection.key.is_some() { mdrelay_runtime::clock::wall_clock_ns() as u64 } else { rand::random() }
    };
    let session: u64 = upstream.as_ref().map_or_else(new_session, |u| u.session());
    // Every line of the run (the hot path's, the connections') names the session through this
    // span, once.
    let span = tracing::info_span!("session", id = %format_args!("{session:#x}"));
    // Once the stream has begun, every way out writes the summary: a failure is returned after it.
    let mut summary =
        runtime.block_on(relay(args.clone(), config, build_info, session, upstream, stop).instrument(span))?;
    print_summary(&summary);
    if let Some(path) = &args.json {
        let json = serde_json::to_string_pretty(&summary)?;
        if path.as_os_str() == "-" {
            println!("{json}");
        } else {
            std::fs::write(path, json).with_context(|| format!("writing {}", path.display()))?;
        }
    }
    runtime.block_on(mdrelay_telemetry::prometheus::hold(hold));
    if let Some(failure) = summary.failure.take() {
        return Err(failure);
    }
    // The stream ended (with its END) because the upstream refused this relay or was lost for
    // good: a failed run.
    if let Some(upstream) = &summary.engine.upstream
        && let Some(error) = &upstream.error
    {
        let status = if upstream.refused { ExitStatus::Refused } else { ExitStatus::UpstreamLost };
        return Err(anyhow::anyhow!(error.clone())).exit_status(status);
    }
    Ok(())
}

/// The TCP server while it runs: what shutdown needs.
struct Serving {
    shared: Arc<Shared>,
    accepting: CancellationToken,
    abort: CancellationToken,
    tracker: TaskTracker,
    drain: Duration,
}

async fn relay(
    args: RunArgs,
    config: config::Config,
    build_info: Option<metrics::Gauge>,
    session: u64,
    upstream: Option<UpstreamSource>,
    stop: Arc<Stop>,
) -> Result<RunSummary> {
    // Installed before anything starts, so a signal is never missed; tests and scripts wait for
    // this line before signalling.
    let handlers = Signals::install().context("installing the signal handlers")?;
    tracing::info!("signal handlers installed");
    let session_span = tracing::Span::current();
    let echoes = Arc::new(Echoes::default());
    let controls = Controls { format: Arc::new(AtomicU8::new(config.format.id())), stop };
    let prepared = upstream.map(SegmentSource::Upstream);
    // The ring is kept when someone can read it: resuming TCP subscribers, or the service.
    let mut protector = config.protection.protector(mdrelay_codec::DEFAULT_MAX_FRAME);
    let guard: crate::fanout::Guard = (protector.protection(), protector.key_check(session));
    let keep_ring = config.retransmit.ring_bytes > 0 && (config.tcp.is_some() || config.retransmit.listen.is_some());
    let ring: Option<SharedRing> =
        keep_ring.then(|| Arc::new(std::sync::Mutex::new(FrameRing::new(config.retransmit.ring_bytes))));
    // Snapshots join as a resume from the frame after the state's (TCP), or are followed by
    // recovery from the ring (UDP and multicast): they need the ring.
    let tcp_snapshots = config.tcp.as_ref().is_some_and(|tcp| tcp.snapshots);
    let service_snapshots = config.retransmit.listen.is_some() && config.retransmit.snapshots;
    // Over NATS, a snapshot is followed by the live subject (and repairs from the stream).
    let nats_snapshots = config.nats.as_ref().is_some_and(|nats| nats.snapshots);
    let state: Option<crate::snapshot::SharedState> =
        ((ring.is_some() && (tcp_snapshots || service_snapshots)) || nats_snapshots).then(Arc::default);
    let retransmit = match (config.retransmit.listen, &ring) {
        (Some(listen), Some(ring)) => {
            let listener = tokio::net::TcpListener::bind(listen)
                .await
                .with_context(|| format!("retransmit.listen: cannot listen on {listen}"))?;
            tracing::info!(listen = %listener.local_addr()?, ring_bytes = config.retransmit.ring_bytes, "serving retransmissions over TCP");
            let service = Service {
                ring: ring.clone(),
                settings: config.retransmit,
                session,
                stream: config.stream,
                format: config.format,
                guard,
                counters: Default::default(),
                tracker: TaskTracker::new(),
                state: state.clone().filter(|_| service_snapshots),
                protection: config.protection.clone(),
                snapshot_builds: Arc::new(tokio::sync::Semaphore::new(SNAPSHOT_BUILDS)),
            };
            let stop = CancellationToken::new();
            tokio::spawn(
                crate::retransmit::serve(listener, service.clone(), stop.clone()).instrument(session_span.clone()),
            );
            Some((service, stop))
        }
        _ => None,
    };
    let (fanout, serving) = match &config.tcp {
        Some(tcp) => {
            let listener = tokio::net::TcpListener::bind(tcp.listen)
                .await
                .with_context(|| format!("tcp.listen: cannot listen on {}", tcp.listen))?;
            tracing::info!(listen = %listener.local_addr()?, "serving subscribers over TCP");
            let (fanout, shared) = Fanout::new(
                tcp,
                session,
                config.stream,
                config.format,
                guard,
                config.pacing.mode != PacingMode::TopSpeed,
            );
            let serving = Serving {
                shared: shared.clone(),
                accepting: CancellationToken::new(),
                abort: CancellationToken::new(),
                tracker: TaskTracker::new(),
                drain: tcp.drain_timeout,
            };
            let server = Server {
                shared: shared.clone(),
                echoes: echoes.clone(),
                tcp: *tcp,
                abort: serving.abort.clone(),
                tracker: serving.tracker.clone(),
                ring: ring.clone(),
                state: state.clone().filter(|_| tcp_snapshots),
                protection: config.protection.clone(),
            };
            tokio::spawn(
                crate::tcp::serve(listener, server, serving.accepting.clone()).instrument(session_span.clone()),
            );
            (Some(fanout), Some(serving))
        }
        None => (None, None),
    };
    let echo_stop = Arc::new(AtomicBool::new(false));
    let mut echo_threads = Vec::new();
    let udp = if config.has_udp() {
        let out = UdpOut::open(&config, session)?;
        if let config::Source::Live(live) = &config.source {
            crate::source::check_live_not_self(live, &out.targets()).exit_status(ExitStatus::Config)?;
        }
        tracing::info!(targets = ?out.targets(), "sending over UDP");
        echo_threads = out.spawn_echo_readers(&echoes, &echo_stop)?;
        Some(out)
    } else {
        None
    };
    tokio::spawn(signals(handlers, args, config.clone(), controls.clone()).instrument(session_span.clone()));
    let (nats_out, nats_task) = match &config.nats {
        Some(nats) => {
            let snapshots = state.clone().filter(|_| nats.snapshots).map(|state| crate::snapshot::NatsSnapshots {
                state,
                protection: config.protection.clone(),
                format: controls.format.clone(),
                session,
                stream: config.stream,
                guard,
            });
            let (out, task) = crate::nats::NatsOut::start(nats, session, snapshots).await?;
            (Some(out), Some(task))
        }
        None => (None, None),
    };
    let metrics_sources = build_info.map(|build_info| crate::metrics::Sources {
        tcp: serving.as_ref().map(|s| s.shared.clone()),
        retransmit: retransmit.as_ref().map(|(service, _)| service.clone()),
        build_info,
        nats: nats_task.as_ref().map(|t| t.counters.clone()),
    });
    let sampler = metrics_sources.clone().map(|sources| tokio::spawn(crate::metrics::sample(sources)));
    let mut outputs = Outputs::new(&config, fanout, udp, nats_out, session, ring, protector);
    outputs.state = state.map(crate::snapshot::StateKeeper::new);
    // Every listener is bound and every output open: a Type=notify unit is started.
    mdrelay_telemetry::service::ready("relaying");
    mdrelay_telemetry::service::spawn_watchdog();
    let engine_config = config.clone();
    let engine_controls = controls.clone();
    let engine_echoes = echoes.clone();
    let engine_span = session_span.clone();
    let engine = std::thread::Builder::new()
        .name("mdrelay-pub-hot".into())
        .spawn(move || {
            let _session = engine_span.entered();
            hot_thread_setup(&engine_config)?;
            engine::run(&engine_config, prepared, outputs, &engine_controls, &engine_echoes)
        })
        .context("starting the hot path thread")?;
    let result = tokio::task::spawn_blocking(move || engine.join()).await?;
    mdrelay_telemetry::service::stopping();
    let ended = match result {
        Ok(r) => r?,
        Err(_) => anyhow::bail!("the hot path panicked"),
    };
    let (engine, mut failure) = (ended.summary, ended.failure);
    if let Some(serving) = &serving {
        shut_down(serving).await;
    }
    let nats = match nats_task {
        Some(task) => {
            let counters = task.counters.clone();
            if let Err(e) = task.finish(failure.is_some()).await {
                failure.get_or_insert(e);
            }
            Some(counters.summary())
        }
        None => None,
    };
    echo_stop.store(true, Ordering::Relaxed);
    for t in echo_threads {
        let _ = tokio::task::spawn_blocking(move || t.join()).await;
    }
    let retransmit = match retransmit {
        Some((service, stop)) => {
            // Subscribers ask for the tail's gaps after END: the service outlives the stream.
            tracing::info!(linger = ?config.retransmit.linger, "retransmission service stays up after the end of the stream");
            tokio::time::sleep(config.retransmit.linger).await;
            stop.cancel();
            service.tracker.close();
            let _ = tokio::time::timeout(Duration::from_secs(2), service.tracker.wait()).await;
            Some(service.summary())
        }
        None => None,
    };
    if let Some(sampler) = sampler {
        sampler.abort();
    }
    if let Some(sources) = &metrics_sources {
        crate::metrics::sample_once(sources);
    }
    let format = Format::from_id(controls.format.load(Ordering::Relaxed)).unwrap_or(config.format);
    let (subscribers, subscribers_omitted) = serving.as_ref().map(|s| s.shared.summaries.report()).unwrap_or_default();
    Ok(RunSummary {
        format,
        engine,
        subscribers,
        subscribers_omitted,
        connections: serving.map(|s| s.shared.counters.snapshot()),
        round_trip_ns: echoes.round_trips.summary(),
        echoes_rejected: echoes.rejected.load(Ordering::Relaxed),
        warnings_suppressed: mdrelay_iex::warn::suppressed(),
        retransmit,
        nats,
        error: failure.as_ref().map(|e| format!("{e:#}")),
        failure,
    })
}

/// Puts the calling (hot) thread where the configuration says: on its core, with precise
/// timers when it sleeps.
fn hot_thread_setup(config: &config::Config) -> Result<()> {
    let idle = config.pacing.idle(config.profile);
    if !idle.busy() {
        crate::cpu::precise_timers();
    }
    match config.cpu.hot_core {
        Some(core) => {
            mdrelay_telemetry::cpu::pin_current_thread(core)
                .with_context(|| format!("cpu.hot_core: cannot pin the hot thread to CPU {core}"))?;
            tracing::info!(%idle, profile = %config.profile, core, "hot thread pinned");
        }
        None if config.profile == mdrelay_runtime::idle::Profile::LowLatency => {
            tracing::warn!(%idle, "profile low-latency without [cpu] hot_core (--hot-core): the hot thread is not pinned");
        }
        None => tracing::info!(%idle, profile = %config.profile, "hot thread"),
    }
    if idle.busy() && mdrelay_telemetry::cpu::allowed_cpus().len() < 2 {
        tracing::warn!(%idle, "a busy idle strategy on a single CPU competes with every other thread of the relay");
    }
    Ok(())
}

/// The end of the stream for TCP: no new connections; subscribers get `tcp.drain_timeout` to
/// take what is queued for them (and END), then every connection still open is cut off.
async fn shut_down(serving: &Serving) {
    serving.accepting.cancel();
    serving.tracker.close();
    if tokio::time::timeout(serving.drain, serving.tracker.wait()).await.is_err() {
        tracing::warn!(
            subscribers = serving.tracker.len(),
            drain_timeout = ?serving.drain,
            "subscribers still taking the stream at the end of the drain time; disconnected"
        );
        serving.abort.cancel();
        // Every task returns at once on the abort; bounded all the same.
        let _ = tokio::time::timeout(Duration::from_secs(2), serving.tracker.wait()).await;
    }
}

/// The signals the publisher handles.
struct Signals {
    hup: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
    term: tokio::signal::unix::Signal,
}

impl Signals {
    fn install() -> std::io::Result<Signals> {
        use tokio::signal::unix::{SignalKind, signal};
        Ok(Signals {
            hup: signal(SignalKind::hangup())?,
            int: signal(SignalKind::interrupt())?,
            term: signal(SignalKind::terminate())?,
        })
    }
}

/// How long a reload may take to read and check the configuration (a file on a stalled network
/// mount, a key file that is a FIFO) before it is abandoned and the running configuration kept.
const RELOAD_BOUND: Duration = Duration::from_secs(5);

/// SIGHUP reloads the configuration; SIGINT / SIGTERM end the stream (a second one exits). A
/// reload reads on a thread of its own, so nothing here waits on a file.
async fn signals(signals: Signals, args: RunArgs, running: config::Config, controls: Controls) {
    let Signals { mut hup, mut int, mut term } = signals;
    let mut reloads = Reloads::new(Arc::new(args), running, controls.clone(), RELOAD_BOUND);
    loop {
        tokio::select! {
            _ = hup.recv() => reloads.requested(),
            outcome = reloads.outcome() => reloads.settle(outcome),
            _ = int.recv() => stop(&controls),
            _ = term.recv() => stop(&controls),
        }
    }
}

fn stop(controls: &Controls) {
    if controls.stop.set() {
        eprintln!("mdrelay-pub: stopping now");
        std::process::exit(ExitStatus::Interrupted.code().into());
    }
    tracing::info!("stopping: the stream ends with its totals (again to stop at once)");
}

/// SIGHUP's reloads, one at a time. Each reads and checks the configuration on a detached thread
/// (not the runtime's blocking pool, which the runtime waits for when it shuts down), bounded in
/// time: a read past the bound is abandoned, and the running configuration stays.
struct Reloads {
    args: Arc<RunArgs>,
    /// The configuration the run started with: what a reload is compared with.
    running: config::Config,
    controls: Controls,
    bound: Duration,
    current: Option<InFlight>,
}

/// The reload being read.
struct InFlight {
    started: tokio::time::Instant,
    result: tokio::sync::oneshot::Receiver<Result<Box<config::Config>>>,
    /// Past the bound: its result, when it comes, is dropped.
    abandoned: bool,
    /// A SIGHUP came while it was read: one more reload follows it, for all of them.
    again: bool,
}

/// What became of the reload being read.
enum Outcome {
    /// Read within the bound: the configuration (boxed: it is large beside the others), or why
    /// it is refused.
    Read(Result<Box<config::Config>>),
    /// Not read within the bound.
    TimedOut,
    /// An abandoned read returned at last.
    Returned,
}

impl Reloads {
    fn new(args: Arc<RunArgs>, running: config::Config, controls: Controls, bound: Duration) -> Reloads {
        Reloads { args, running, controls, bound, current: None }
    }

    /// The file, for log lines.
    fn file(&self) -> String {
        self.args.config.as_ref().map(|p| p.display().to_string()).unwrap_or_default()
    }

    /// A SIGHUP: a reload starts, unless one is being read (then one more follows it).
    fn requested(&mut self) {
        if self.args.config.is_none() {
            tracing::warn!("SIGHUP: no configuration file to re-read (start with --config FILE)");
            return;
        }
        let file = self.file();
        match &mut self.current {
            None => self.start(),
            Some(reading) if reading.abandoned => {
                reading.again = true;
                tracing::warn!(%file, stalled = ?reading.started.elapsed(),
                    "SIGHUP: the read of the configuration abandoned earlier has not returned; the file is read again once it does");
            }
            Some(reading) => {
                reading.again = true;
                tracing::info!(%file, "SIGHUP: a reload is being read; one more follows it");
            }
        }
    }

    /// Starts reading the configuration on a thread of its own.
    fn start(&mut self) {
        let (sender, result) = tokio::sync::oneshot::channel();
        let args = self.args.clone();
        let span = tracing::Span::current();
        let spawned = std::thread::Builder::new().name("mdrelay-pub-reload".into()).spawn(move || {
            let _session = span.entered();
            // The receiver is gone when the run ended meanwhile: nothing to tell.
            let _ = sender.send(args.reload_config().map(Box::new));
        });
        match spawned {
            // Detached: a read that never returns holds only its own thread.
            Ok(_detached) => {
                self.current =
                    Some(InFlight { started: tokio::time::Instant::now(), result, abandoned: false, again: false });
            }
            Err(error) => tracing::error!(file = %self.file(),
                "SIGHUP: keeping the running configuration: cannot start a thread to read it: {error}"),
        }
    }

    /// The next thing to happen to the reload being read; pending while there is none.
    /// Cancel-safe: it sits in a `select!` with the signals.
    async fn outcome(&mut self) -> Outcome {
        let Reloads { current, bound, .. } = self;
        let Some(reading) = current else { return std::future::pending().await };
        if reading.abandoned {
            let _ = (&mut reading.result).await;
            return Outcome::Returned;
        }
        tokio::select! {
            result = &mut reading.result => Outcome::Read(
                result.unwrap_or_else(|_| Err(anyhow::anyhow!("the thread reading it ended without an answer"))),
            ),
            _ = tokio::time::sleep_until(reading.started + *bound) => Outcome::TimedOut,
        }
    }

    fn settle(&mut self, outcome: Outcome) {
        let file = self.file();
        match outcome {
            Outcome::Read(result) => {
                let again = self.current.take().is_some_and(|reading| reading.again);
                self.apply(result);
                if again {
                    self.start();
                }
            }
            Outcome::TimedOut => {
                if let Some(reading) = &mut self.current {
                    reading.abandoned = true;
                }
                tracing::error!(%file,
                    "SIGHUP: keeping the running configuration: reading {file} took longer than {:?} (a stalled mount, or a file that waits for a writer); the read is abandoned",
                    self.bound);
            }
            Outcome::Returned => {
                let Some(reading) = self.current.take() else { return };
                tracing::info!(%file, after = ?reading.started.elapsed(),
                    "the abandoned read of the configuration returned; what it read is not applied");
                if reading.again {
                    self.start();
                }
            }
        }
    }

    /// Applies what a reload read: the format takes effect at the next frame; other changed
    /// settings are named, as they need a restart.
    fn apply(&self, result: Result<Box<config::Config>>) {
        let file = self.file();
        let new = match result {
            Ok(new) => new,
            Err(e) => {
                tracing::error!(%file, "SIGHUP: keeping the running configuration: {e:#}");
                return;
            }
        };
        let old = self.controls.format.swap(new.format.id(), Ordering::Relaxed);
        if old != new.format.id() {
            tracing::info!(%file, format = %new.format, "SIGHUP: format changes at the next frame");
        } else {
            tracing::info!(%file, "SIGHUP: configuration re-read; only the format applies without a restart");
        }
        if let Some(flag) = self.args.given.iter().find(|flag| flag.long == "format") {
            let origin = match flag.origin.starts_with("--") {
                true => format!("{} on the command line", flag.origin),
                false => flag.origin.clone(),
            };
            tracing::warn!("SIGHUP: {origin} overrides the file's format");
        }
        let ignored = self.running.restart_required(&new);
        if !ignored.is_empty() {
            tracing::warn!(settings = %ignored.join(", "), %file,
                "SIGHUP: these settings changed but take effect only at a restart; the running values stay");
        }
    }
}

fn print_summary(s: &RunSummary) {
    let e = &s.engine;
    println!(
        "published {} frames, {} messages ({} frame bytes) in {:.2} s, final format {}",
        e.totals.frames, e.totals.messages, e.frame_bytes, e.seconds, s.format
    );
    if e.format_switches > 0 {
        println!("  format switches: {}", e.format_switches);
    }
    let skipped = &e.source_skipped;
    let skips = [
        ("non-IEX packets", skipped.non_iex_packets),
        ("capture records", skipped.capture_records),
        ("live datagrams rejected", skipped.live_datagrams),
        ("segments not IEX-TP", e.skipped_segments),
        ("undecodable messages", e.undecodable_messages),
        ("unencodable segments", e.unencodable_segments),
        ("frames too large for UDP", e.udp_oversized_frames),
        ("UDP send errors", e.udp_send_errors),
        ("pacing re-anchors", e.pacing_reanchors),
        ("echoes rejected", s.echoes_rejected),
        ("warnings not logged", s.warnings_suppressed),
    ];
    let skips: Vec<String> = skips.iter().filter(|(_, n)| *n > 0).map(|(what, n)| format!("{what} {n}")).collect();
    if !skips.is_empty() {
        println!("  skipped and rejected: {}", skips.join(", "));
    }
    if let Some(c) = &s.connections {
        println!(
            "  connections {}: busy {}, failed handshakes {}, disconnected slow {}, protocol violations {}, accept errors {}",
            c.connections, c.busy, c.handshake_failures, c.disconnects_slow, c.protocol_violations, c.accept_errors
        );
    }
    if s.subscribers_omitted > 0 {
        println!("  ({} earlier subscribers not listed)", s.subscribers_omitted);
    }
    for sub in &s.subscribers {
        let fate = if let Some(reason) = &sub.refused {
            format!("refused: {reason}")
        } else if sub.disconnected_slow {
            "disconnected (slow)".into()
        } else {
            format!("dropped {} frames", sub.dropped_frames)
        };
        let from = sub.first_sequence.map_or_else(|| "-".to_string(), |f| f.to_string());
        println!("  subscriber {} from frame {from}: {fate}", sub.peer);
    }
    if let Some(n) = &s.nats {
        println!(
            "  NATS: {} messages published, {} acknowledged ({} duplicates), {} retried, {} dropped, {} reconnects",
            n.published, n.acknowledged, n.duplicates, n.retries, n.dropped, n.reconnects
        );
        if n.taken > 0 || n.stream_recreations > 0 {
            println!(
                "  NATS incidents: {} message ids taken by other messages (published again under new ids), stream created again {} times",
                n.taken, n.stream_recreations
            );
        }
    }
    if let Some(r) = &s.retransmit {
        println!(
            "  retransmission: {} connections ({} refused), {} requests ({} throttled), {} frames sent, {} gone, ring {}..{} of {} bytes",
            r.connections,
            r.refused,
            r.requests,
            r.throttled,
            r.frames_sent,
            r.frames_gone,
            r.ring_first,
            r.ring_next,
            r.ring_bytes
        );
    }
    if let Some(u) = &e.upstream {
        let l = &u.latency_ns;
        let v = |x: Option<u64>| x.unwrap_or_default();
        println!(
            "  upstream {} (session {:#x}): {} frames, {} messages, {} reconnects ({} resumed), gaps {}, decode errors {}; hop latency from the origin (ns): p50 {} p99 {} p99.9 {} max {}",
            u.connect,
            u.session,
            u.frames,
            u.messages,
            u.reconnects,
            u.resumes,
            u.gaps,
            u.decode_errors,
            v(l.p50),
            v(l.p99),
            v(l.p999),
            v(l.max)
        );
    }
    let rt = &s.round_trip_ns;
    if rt.count > 0 {
        let v = |x: Option<u64>| x.unwrap_or_default();
        println!(
            "  round trip (ns, {} echoes): p50 {} p90 {} p99 {} p99.9 {} p99.99 {} max {}",
            rt.count,
            v(rt.p50),
            v(rt.p90),
            v(rt.p99),
            v(rt.p999),
            v(rt.p9999),
            v(rt.max)
        );
    }
}

/// natscli's environment, where nothing else sets the same: `NATS_URL` (comma-separated URLs)
/// for the `[nats]` output's servers, `NATS_CREDS` for the credentials of the `[nats]` output and
/// of a NATS upstream that give none. Each value taken has its variable as its origin (`--check`
/// prints it). `var` reads a variable (the process's environment, or a test's).
fn nats_environment(layers: &mut Layered, var: impl Fn(&str) -> Option<String>) {
    let var = |name: &str| var(name).filter(|value| !value.trim().is_empty());
    let credentials = ["creds_file", "nkey_file", "user", "password_file"];
    let without_credentials =
        |layers: &Layered, section: &str| !credentials.iter().any(|c| layers.get(&format!("{section}.{c}")).is_some());
    if layers.get("nats").is_some() {
        if layers.get("nats.servers").is_none()
            && let Some(urls) = var("NATS_URL")
        {
            let urls = urls.split(',').map(str::trim).filter(|u| !u.is_empty());
            layers.set("nats.servers", toml::Value::Array(urls.map(toml::Value::from).collect()), "NATS_URL");
        }
        if without_credentials(layers, "nats")
            && let Some(creds) = var("NATS_CREDS")
        {
            layers.set("nats.creds_file", toml::Value::String(creds), "NATS_CREDS");
        }
    }
    if layers.get("source.upstream.nats").is_some()
        && without_credentials(layers, "source.upstream")
        && let Some(creds) = var("NATS_CREDS")
    {
        layers.set("source.upstream.creds_file", toml::Value::String(creds), "NATS_CREDS");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn natscli_variables_fill_only_what_nothing_else_set() {
        let env = |name: &str| match name {
            "NATS_URL" => Some("nats://a:1, nats://b:2".to_string()),
            "NATS_CREDS" => Some("/etc/nats/feed.creds".to_string()),
            _ => None,
        };
        let layers = |text: &str| Layered::from_text(std::path::Path::new("pub.toml"), text, &[]).unwrap();
        let mut file = layers("[nats]\nsubject = \"md.1\"\n");
        nats_environment(&mut file, env);
        let urls: Vec<toml::Value> = ["nats://a:1", "nats://b:2"].into_iter().map(toml::Value::from).collect();
        assert_eq!(file.get("nats.servers"), Some(&toml::Value::Array(urls)));
        assert_eq!(file.get("nats.creds_file").and_then(|v| v.as_str()), Some("/etc/nats/feed.creds"));
        assert_eq!(file.origin("nats.servers"), Some("NATS_URL"));
        assert_eq!(file.origin("nats.creds_file"), Some("NATS_CREDS"));

        // What the file sets stays, and other credentials keep NATS_CREDS out.
        let mut file = layers("[nats]\nservers = [\"nats://c:3\"]\nnkey_file = \"/seed\"\n");
        nats_environment(&mut file, env);
        assert_eq!(file.origin("nats.servers"), Some("pub.toml, line 2"));
        assert_eq!(file.get("nats.creds_file"), None);

        // No [nats] section, no NATS output; a NATS upstream takes the credentials.
        let mut file = layers("[source.upstream]\nnats = [\"nats://d:4\"]\nsubject = \"md.1\"\n");
        nats_environment(&mut file, env);
        assert!(file.get("nats").is_none());
        assert_eq!(file.get("source.upstream.creds_file").and_then(|v| v.as_str()), Some("/etc/nats/feed.creds"));
        assert_eq!(file.origin("source.upstream.creds_file"), Some("NATS_CREDS"));
    }
}
