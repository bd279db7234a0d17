//! `mdrelay-bench loopback`: the relay end to end on this host, once per format, to choose one.
//!
//! For each transport asked for, it first measures the latency floor (`floor`: a plain socket
//! ping-pong over the same transport, at the same rate, with a frame-sized message), then starts
//! a real `mdrelay-pub` and a real `mdrelay-sub` (the binaries beside this one) per format,
//! streams the same data at the same fixed rate, and tabulates the subscriber's one-way latency
//! percentiles, also as multiples of the floor's, with each process's CPU time and peak memory.
//! At a fixed rate every format carries the same load, so the percentiles compare.
//!
//! `--top-speed` measures throughput instead: the publisher sends as fast as it can (TCP with
//! `--slow-subscriber block`, so nothing is dropped; UDP reports what was lost), and the table
//! gives messages and megabytes per second delivered.
//!
//! Plots (SVG) and the table go to `--plots DIR`, everything measured as JSON to `--json FILE`
//! (default: `loopback.json` there). In latency mode a pacing floor comes first: a thread that
//! only waits for each frame's due time as the publisher does, so the publisher's CPU can be read
//! against what the waits alone cost on this host.

use crate::floor::{self, FloorSpec};
use crate::latency::{Percentiles, Transport};
use crate::nats::{BenchFloor, NatsStorage, Site};
use crate::plots::{self, Bar, Curve};
use crate::procstat::{Sampler, Usage};
use anyhow::{Context, Result, bail};
use base64::Engine;
use clap::{Args, ValueEnum};
use hdrhistogram::Histogram;
use hdrhistogram::serialization::Deserializer;
use hdrhistogram::serialization::interval_log::{IntervalLogIterator, LogEntry};
use indicatif::{ProgressBar, ProgressStyle};
use mdrelay_codec::Format;
use mdrelay_harness::process::{Finished, Process};
use mdrelay_iex::capture::CaptureReader;
use mdrelay_iex::iextp::Segment;
use mdrelay_iex::link;
use mdrelay_iex::synth::{SynthConfig, SyntheticDay};
use serde::Serialize;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Frame protection for both programs (`[protection]` in a configuration file of the run's).
#[derive(Debug, Clone, Copy, ValueEnum, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ProtectionChoice {
    /// No protection.
    None,
    /// A CRC-32C per frame.
    Crc,
    /// AES-256-GCM per frame, with a key made for the run.
    Aead,
    /// Both.
    CrcAead,
}

impl ProtectionChoice {
    /// The `[protection]` section, with `key` as the key file.
    fn section(self, key: &Path) -> String {
        let key_line = format!("key_file = {:?}\n", key.display().to_string());
        match self {
            ProtectionChoice::None => String::new(),
            ProtectionChoice::Crc => "[protection]\ncrc = true\n".into(),
            ProtectionChoice::Aead => format!("[protection]\n{key_line}"),
            ProtectionChoice::CrcAead => format!("[protection]\ncrc = true\n{key_line}"),
        }
    }

    /// The name on the command line and in the table.
    fn name(self) -> &'static str {
        match self {
            ProtectionChoice::None => "none",
            ProtectionChoice::Crc => "crc",
            ProtectionChoice::Aead => "aead",
            ProtectionChoice::CrcAead => "crc-aead",
        }
    }
}

/// The publisher's and subscriber's settings profile.
#[derive(Debug, Clone, Copy, ValueEnum, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Profile {
    /// The programs' defaults: no `--profile` is passed.
    Default,
    /// `--profile low-latency` to both programs.
    LowLatency,
}

/// Arguments of `loopback`.
#[derive(Debug, Args)]
pub struct LoopbackArgs {
    /// Formats to compare (default: all).
    #[arg(long, value_delimiter = ',')]
    pub formats: Vec<Format>,
    /// Transport: tcp, udp, multicast, all (those three in turn), or nats (TCP, then through a
    /// nats-server with JetStream that the run starts; `nats` and `nats-server` from the cache
    /// `.ci/nats.sh` builds, built on first use).
    #[arg(long, value_enum, default_value_t = Transport::Tcp)]
    pub transport: Transport,
    /// With --transport nats: also through a three-node cluster, stream replicated three times,
    /// publisher on one node and subscriber on another.
    #[arg(long)]
    pub nats_cluster: bool,
    /// With --transport nats: JetStream storage of the runs' streams.
    #[arg(long, value_enum, default_value_t = NatsStorage::File)]
    pub nats_storage: NatsStorage,
    /// With --transport nats --top-speed: messages per `nats bench` floor run [default: as many
    /// as mdrelay published, at least 5,000].
    #[arg(long)]
    pub nats_bench_messages: Option<u64>,
    /// Replay this capture instead of the built-in synthetic day.
    #[arg(long)]
    pub capture: Option<PathBuf>,
    /// Synthetic day: messages [default: 300000, or 5000000 with --top-speed].
    #[arg(long)]
    pub messages: Option<u64>,
    /// Messages per second (ignored with --top-speed).
    #[arg(long, default_value_t = 100_000.0)]
    pub rate: f64,
    /// Throughput instead of latency: the publisher sends as fast as it can.
    #[arg(long)]
    pub top_speed: bool,
    /// The publisher coalesces frames into records / datagrams up to this many bytes (0: off;
    /// UDP datagrams stop at 1472 bytes). Several values run one after the other.
    #[arg(long, value_delimiter = ',', default_values_t = [0usize])]
    pub coalesce_bytes: Vec<usize>,
    /// Frame protection: none, crc, aead (AES-256-GCM), crc-aead. Several values run one
    /// after the other.
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = [ProtectionChoice::None])]
    pub protection: Vec<ProtectionChoice>,
    /// Settings profile passed to both programs as `--profile` (default passes nothing).
    #[arg(long, value_enum, default_value_t = Profile::Default)]
    pub profile: Profile,
    /// Pin the publisher's hot thread to this CPU (`mdrelay-pub --hot-core`).
    #[arg(long)]
    pub hot_core: Option<usize>,
    /// The publisher's duty cycle in seconds (`mdrelay-pub --duty-cycle`; 0: each frame at its
    /// time) [default: the profile's]. The pacing floor waits in the same duty cycles.
    #[arg(long)]
    pub duty_cycle: Option<f64>,
    /// Pin the subscriber's receive thread to this CPU (`mdrelay-sub --hot-core`).
    #[arg(long)]
    pub sub_core: Option<usize>,
    /// Bytes per ping of the latency floor, about one relay frame.
    #[arg(long, default_value_t = 128)]
    pub floor_bytes: usize,
    /// Write everything measured as JSON to this file [default: loopback.json in --plots].
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Directory for the SVG plots and the table (loopback.md).
    #[arg(long, default_value = "target/mdrelay-bench")]
    pub plots: PathBuf,
}

impl LoopbackArgs {
    fn messages(&self) -> u64 {
        self.messages.unwrap_or(if self.top_speed { 5_000_000 } else { 300_000 })
    }
}

/// The latency floor of one transport: a plain socket ping-pong, one-way = half the round trip.
#[derive(Debug, Serialize)]
pub struct FloorRow {
    /// The transport.
    pub transport: Transport,
    /// Bytes per ping.
    pub message_bytes: usize,
    /// Pings per second asked for: the relay's frames per second at the requested message rate.
    pub requested_rate: f64,
    /// Pings per second sent.
    pub achieved_rate: f64,
    /// Whether at least 97 % of the rate was sent.
    pub rate_reached: bool,
    /// Pings sent.
    pub pings: u64,
    /// Echoes received.
    pub echoes: u64,
    /// One-way time, ns.
    pub one_way_ns: Percentiles,
    /// The p50 one-way time of each fifth of the pings, in order, ns.
    pub part_p50_ns: Vec<u64>,
    /// The largest of `part_p50_ns` over the smallest: 1 when the machine was steady.
    pub spread: f64,
    /// (percentile %, ns) along the percentile axis.
    pub curve: Vec<(f64, u64)>,
}

/// One format over one transport.
#[derive(Debug, Serialize)]
pub struct Row {
    /// The transport.
    pub transport: Transport,
    /// The format.
    pub format: Format,
    /// The profile as applied (says when a program has no `--profile` yet).
    pub profile: String,
    /// The publisher's `--coalesce-bytes`.
    pub coalesce_bytes: usize,
    /// Frame protection.
    pub protection: ProtectionChoice,
    /// `latency` (fixed rate) or `top-speed`.
    pub mode: &'static str,
    /// Messages per second asked for (none at top speed).
    pub requested_rate: Option<f64>,
    /// Messages per second the publisher sent (its messages over its stream's seconds).
    pub sent_rate: f64,
    /// The pacer's units per second (messages, and one for each frame without any, such as a
    /// heartbeat, as `--rate` counts them): what `requested_rate` compares with.
    pub paced_rate: f64,
    /// Messages per second delivered: received over the stream's wall time (TCP: the
    /// subscriber's whole run, connection and drain included; UDP: the publisher's stream, as
    /// nothing arrives later than its socket buffer allows).
    pub delivered_rate: f64,
    /// Whether the pacer's rate reached 97 % of the requested rate (none at top speed).
    pub rate_reached: Option<bool>,
    /// Messages the publisher sent.
    pub messages_sent: u64,
    /// Messages the subscriber decoded.
    pub messages_received: u64,
    /// Frames the publisher sent.
    pub frames_sent: u64,
    /// Frames the subscriber never received.
    pub frames_lost: u64,
    /// Frames lost, percent of those sent.
    pub loss_percent: f64,
    /// Whether the subscriber's counts equal the publisher's totals.
    pub totals_match: Option<bool>,
    /// Frame bytes per message (publisher side).
    pub bytes_per_message: f64,
    /// Frame megabytes (10^6) per second delivered.
    pub megabytes_per_second: f64,
    /// The publisher's stream, seconds.
    pub publisher_seconds: f64,
    /// The subscriber's run, seconds.
    pub subscriber_seconds: f64,
    /// One-way latency, ns (the subscriber's report).
    pub latency_ns: Percentiles,
    /// (percentile %, ns) along the percentile axis, from the subscriber's histogram log.
    pub curve: Vec<(f64, u64)>,
    /// p50 over the floor's one-way p50 (latency mode).
    pub p50_vs_floor: Option<f64>,
    /// p99 over the floor's one-way p99 (latency mode).
    pub p99_vs_floor: Option<f64>,
    /// What `mdrelay-pub` used.
    pub publisher: Usage,
    /// The publisher's CPU over its stream's seconds, percent of one core.
    pub publisher_cpu_percent: f64,
    /// The publisher's CPU milliseconds per million messages sent: comparable across rates.
    pub publisher_cpu_ms_per_million: f64,
    /// What `mdrelay-sub` used.
    pub subscriber: Usage,
    /// Through NATS: the messages on the subject, and the floor `nats bench` measured.
    pub nats: Option<NatsFigures>,
}

/// A NATS run's messages on the subject (one relay datagram each), against `nats bench`.
#[derive(Debug, Serialize)]
pub struct NatsFigures {
    /// Copies JetStream keeps of each message (3 in the cluster).
    pub replicas: usize,
    /// JetStream storage.
    pub storage: NatsStorage,
    /// NATS messages the publisher published (the END included).
    pub messages: u64,
    /// Bytes per NATS message, relay header included (as received; when frames were lost,
    /// over the share of frames received).
    pub message_bytes: f64,
    /// Market messages per NATS message.
    pub market_messages_per_message: f64,
    /// NATS messages per second delivered, over the same seconds as `delivered_rate`.
    pub messages_per_second: f64,
    /// CPU the server used (every node of the cluster) while mdrelay ran, seconds.
    pub server_cpu_seconds: f64,
    /// `nats bench` through the same server with messages of `message_bytes` (top speed).
    pub floor: Option<BenchFloor>,
    /// `messages_per_second` over the floor's JetStream messages per second.
    pub vs_jetstream: Option<f64>,
    /// `messages_per_second` over the floor's core NATS messages per second.
    pub vs_core: Option<f64>,
}

/// The host the figures come from.
#[derive(Debug, Serialize)]
pub struct Machine {
    /// CPU model, from /proc/cpuinfo.
    pub cpu: String,
    /// CPUs available to this process.
    pub cpus: usize,
    /// Kernel release.
    pub kernel: String,
    /// The load average (1, 5 and 15 minutes) when the run started: work beside the benchmark
    /// shows here before it shows as a slower relay.
    pub load_average: [f64; 3],
}

/// Everything a run measured.
#[derive(Debug, Serialize)]
pub struct Report {
    /// The host.
    pub machine: Machine,
    /// `latency` or `top-speed`.
    pub mode: &'static str,
    /// What was replayed.
    pub source: String,
    /// Messages per second asked for (latency mode).
    pub rate: Option<f64>,
    /// The profile asked for.
    pub profile_requested: Profile,
    /// The CPU the publisher's hot thread was pinned to, if any.
    pub hot_core: Option<usize>,
    /// The CPU the subscriber's receive thread was pinned to, if any.
    pub sub_core: Option<usize>,
    /// Whether `mdrelay-pub run --help` lists `--profile`.
    pub publisher_has_profile: bool,
    /// Whether `mdrelay-sub --help` lists `--profile`.
    pub subscriber_has_profile: bool,
    /// The latency floor per transport (latency mode).
    pub floors: Vec<FloorRow>,
    /// What the publisher's waits alone cost at the relay's frame rate (latency mode).
    pub pacing_floor: Option<floor::PacingFloor>,
    /// One row per transport, coalescing setting and format.
    pub rows: Vec<Row>,
    /// The SVG files written.
    pub plots: Vec<PathBuf>,
}

/// The relay's two programs, which a run starts as separate processes.
pub(crate) const RELAY: [(&str, &str); 2] =
    [("mdrelay-publisher", "mdrelay-pub"), ("mdrelay-subscriber", "mdrelay-sub")];

/// The binaries `wanted` (package, name) beside this one, in that order; those missing or older
/// than their sources are built first in the same profile, in one cargo invocation, saying what
/// and why and showing cargo's progress (the first run's build takes minutes).
pub(crate) fn siblings(wanted: &[(&str, &str)]) -> Result<Vec<PathBuf>> {
    let purpose = "the benchmark runs them as separate processes, and `cargo run` built only the benchmark";
    mdrelay_harness::bins::binaries(wanted, mdrelay_harness::bins::Build::Shown { purpose }).with_context(|| {
        let names = wanted.iter().map(|(_, name)| *name).collect::<Vec<_>>().join(", ");
        format!("{names}: build the workspace first (cargo build --release)")
    })
}

/// `mdrelay-pub` and `mdrelay-sub` beside this binary, built first when missing or stale (see
/// [`siblings`]).
pub(crate) fn relay_programs() -> Result<(PathBuf, PathBuf)> {
    let mut paths = siblings(&RELAY)?.into_iter();
    match (paths.next(), paths.next()) {
        (Some(publisher), Some(subscriber)) => Ok((publisher, subscriber)),
        _ => bail!("the relay's programs: two paths expected"),
    }
}

/// Whether `bin args --help` lists a `--profile` flag: the flag is new, and a binary without it
/// would reject it, so the benchmark asks first and says so instead of failing.
pub(crate) fn has_profile_flag(bin: &Path, args: &[&str]) -> bool {
    std::process::Command::new(bin)
        .args(args)
        .arg("--help")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("--profile"))
}

/// Which programs get `--profile`, and how the tables name what was applied.
pub(crate) struct ProfileUse {
    pub(crate) requested: Profile,
    pub(crate) publisher: bool,
    pub(crate) subscriber: bool,
}

impl ProfileUse {
    fn flag(&self, supported: bool) -> Vec<String> {
        match self.requested {
            Profile::LowLatency if supported => vec!["--profile".into(), "low-latency".into()],
            _ => Vec::new(),
        }
    }

    pub(crate) fn label(&self) -> String {
        match (self.requested, self.publisher, self.subscriber) {
            (Profile::Default, ..) => "default".into(),
            (Profile::LowLatency, true, true) => "low-latency".into(),
            (Profile::LowLatency, true, false) => {
                "low-latency (mdrelay-sub has no --profile yet: default there)".into()
            }
            (Profile::LowLatency, false, true) => {
                "low-latency (mdrelay-pub has no --profile yet: default there)".into()
            }
            (Profile::LowLatency, false, false) => "default (no --profile in mdrelay-pub or mdrelay-sub yet)".into(),
        }
    }
}

/// How long a process may take to print a readiness line.
const READY: Duration = Duration::from_secs(30);

/// Waits for `process` to exit within `limit`; fails with its output unless it succeeded.
fn finish(process: Process, limit: Duration) -> Result<Finished> {
    let finished = process.try_finish(limit)?;
    if !finished.status.success() {
        bail!("{finished:?}");
    }
    Ok(finished)
}

/// Waits for the subscriber to exit within `limit`; fails with its output unless it succeeded
/// or ended with status 5, a stream incomplete: frames lost, which its report counts and the
/// run reports as such.
fn finish_subscriber(process: Process, limit: Duration) -> Result<Finished> {
    let finished = process.try_finish(limit)?;
    if !matches!(finished.code(), Some(0 | STREAM_INCOMPLETE)) {
        bail!("{finished:?}");
    }
    Ok(finished)
}

/// `mdrelay-sub`'s exit status for a stream whose END's totals were not met (docs/operations.md).
const STREAM_INCOMPLETE: i32 = 5;

/// The percentiles of the x axis' grid (1 / (1 − p) from 1 to 10^5, 20 points a decade).
fn grid() -> impl Iterator<Item = f64> {
    (0..=100).map(|k| 100.0 * (1.0 - 1.0 / 10f64.powf(f64::from(k) / 20.0)))
}

/// (percentile %, ns) of `h` along the grid.
fn curve(h: &Histogram<u64>) -> Vec<(f64, u64)> {
    if h.is_empty() {
        return Vec::new();
    }
    grid().map(|p| (p, h.value_at_quantile(p / 100.0))).collect()
}

/// The whole run's histogram: every interval of the subscriber's HdrHistogram interval log.
fn read_histogram_log(path: &Path) -> Result<Histogram<u64>> {
    let text = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    let mut total = floor::histogram();
    let mut deserializer = Deserializer::new();
    for entry in IntervalLogIterator::new(&text) {
        let entry = entry.map_err(|e| anyhow::anyhow!("{}: {e:?}", path.display()))?;
        if let LogEntry::Interval(interval) = entry {
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(interval.encoded_histogram())
                .with_context(|| format!("{}: an interval is not base64", path.display()))?;
            let h: Histogram<u64> = deserializer
                .deserialize(&mut bytes.as_slice())
                .map_err(|e| anyhow::anyhow!("{}: {e:?}", path.display()))?;
            total.add(&h).map_err(|e| anyhow::anyhow!("{}: {e:?}", path.display()))?;
        }
    }
    Ok(total)
}

/// Everything one format's run needs to know.
pub(crate) struct Plan<'a> {
    pub(crate) args: &'a LoopbackArgs,
    pub(crate) transport: Transport,
    pub(crate) format: Format,
    pub(crate) coalesce: usize,
    pub(crate) protection: ProtectionChoice,
    pub(crate) publisher: &'a Path,
    /// The receiving program: `mdrelay-sub`, or a program taking the same flags
    /// (`mdrelay-bench-client`).
    pub(crate) subscriber: &'a Path,
    pub(crate) dir: &'a Path,
    pub(crate) profile: &'a ProfileUse,
    /// The pacer's units in the source (see [`frame_schedule`]).
    pub(crate) units: u64,
}

pub(crate) fn run_one(plan: &Plan<'_>) -> Result<Row> {
    let Plan { args, transport, format, coalesce, protection, .. } = *plan;
    // The receiving program in the name too, so no run reads another program's files.
    let receiver = plan.subscriber.file_name().map_or(String::new(), |n| n.to_string_lossy().into_owned());
    let name = format!("{receiver}-{}-{format}-{coalesce}-{}", transport.name(), protection.name());
    for stale in [&sub_json_of(plan.dir, &name), &hlog_of(plan.dir, &name)] {
        let _ = std::fs::remove_file(stale);
    }
    let sub_json = sub_json_of(plan.dir, &name);
    let pub_json = plan.dir.join(format!("pub-{name}.json"));
    let hlog = hlog_of(plan.dir, &name);
    let messages = args.messages();
    let mut pub_args: Vec<String> = vec!["run".into(), "--format".into(), format.name().into()];
    if args.top_speed {
        pub_args.extend(["--pacing".into(), "top-speed".into()]);
    } else {
        pub_args.extend(["--pacing".into(), "rate".into(), "--rate".into(), args.rate.to_string()]);
    }
    pub_args.extend(["--coalesce-bytes".into(), coalesce.to_string()]);
    pub_args.extend(["--json".into(), pub_json.display().to_string()]);
    match &args.capture {
        Some(path) => pub_args.extend(["--capture".into(), path.display().to_string()]),
        None => pub_args.extend(["--messages".into(), messages.to_string()]),
    }
    pub_args.extend(plan.profile.flag(plan.profile.publisher));
    if let Some(core) = args.hot_core {
        pub_args.extend(["--hot-core".into(), core.to_string()]);
    }
    if let Some(duty_cycle) = args.duty_cycle {
        pub_args.extend(["--duty-cycle".into(), duty_cycle.to_string()]);
    }
    let mut sub_args: Vec<String> = vec!["--json".into(), sub_json.display().to_string()];
    // The publisher's configuration file: protection, and the `[nats]` output.
    let mut pub_config = String::new();
    if protection != ProtectionChoice::None {
        // One key for the whole comparison, readable by its owner only, as the programs insist.
        let key = plan.dir.join("wire.key");
        if !key.exists() {
            use std::os::unix::fs::PermissionsExt;
            let hex: String = rand::random::<[u8; 32]>().iter().map(|b| format!("{b:02x}")).collect();
            std::fs::write(&key, hex)?;
            std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600))?;
        }
        let config = plan.dir.join(format!("protection-{}.toml", protection.name()));
        std::fs::write(&config, protection.section(&key))?;
        sub_args.extend(["--config".into(), config.display().to_string()]);
        pub_config.push_str(&protection.section(&key));
    }
    // A fresh server (or cluster) per run, stopped when the run's figures are in.
    let site = if transport.is_nats() {
        let site = Site::start(transport == Transport::NatsCluster)?;
        pub_config.push_str(&site.publisher_section(args.nats_storage));
        Some(site)
    } else {
        None
    };
    if !pub_config.is_empty() {
        let config = plan.dir.join(format!("pub-{name}.toml"));
        std::fs::write(&config, &pub_config)?;
        pub_args.extend(["--config".into(), config.display().to_string()]);
    }
    sub_args.extend(["--report-interval".into(), "0".into(), "--histogram-log".into(), hlog.display().to_string()]);
    sub_args.extend(plan.profile.flag(plan.profile.subscriber));
    if let Some(core) = args.sub_core {
        sub_args.extend(["--hot-core".into(), core.to_string()]);
    }
    let spawn = |bin: &Path, args: &[String]| {
        Process::spawn(bin, args, &[]).with_context(|| format!("starting {}", bin.display()))
    };
    let expected_seconds = if args.top_speed { messages as f64 / 200_000.0 } else { messages as f64 / args.rate };
    let deadline = Instant::now() + Duration::from_secs_f64(60.0 + expected_seconds * 3.0);
    // Over NATS: how long after the subscriber's start the publisher began to stream.
    let mut streaming_after: Option<Duration> = None;
    let mut server_cpu_before = 0.0;
    // Each side starts once the other is ready (the lines both print), never after a guess.
    let (publisher, pub_sampler, subscriber, sub_sampler) = match transport {
        Transport::Tcp => {
            pub_args.extend(["--tcp".into(), "127.0.0.1:0".into(), "--wait-subscribers".into(), "1".into()]);
            // Lossless: at top speed the subscriber sets the pace instead of skipping ahead.
            pub_args.extend(["--slow-subscriber".into(), "block".into()]);
            let mut publisher = spawn(plan.publisher, &pub_args)?;
            let pub_sampler = Sampler::start(publisher.pid(), deadline);
            let addr = publisher.try_serving_on(READY)?;
            sub_args.extend(["--connect".into(), addr.to_string()]);
            let subscriber = spawn(plan.subscriber, &sub_args)?;
            let sub_sampler = Sampler::start(subscriber.pid(), deadline);
            (publisher, pub_sampler, subscriber, sub_sampler)
        }
        Transport::Udp | Transport::Multicast => {
            if transport == Transport::Udp {
                sub_args.extend(["--listen".into(), "127.0.0.1:0".into()]);
            } else {
                sub_args.extend(["--group".into(), "239.255.0.1:0".into(), "--interface".into(), "127.0.0.1".into()]);
            }
            let mut subscriber = spawn(plan.subscriber, &sub_args)?;
            let sub_sampler = Sampler::start(subscriber.pid(), deadline);
            // UDP has no handshake: nothing is sent before the subscriber has bound (and joined).
            let addr = subscriber.try_listening_on(READY)?.to_string();
            if transport == Transport::Udp {
                pub_args.extend(["--udp".into(), addr]);
            } else {
                pub_args.extend(["--multicast".into(), addr, "--interface".into(), "127.0.0.1".into()]);
                pub_args.extend(["--ttl".into(), "0".into()]);
            }
            let publisher = spawn(plan.publisher, &pub_args)?;
            let pub_sampler = Sampler::start(publisher.pid(), deadline);
            (publisher, pub_sampler, subscriber, sub_sampler)
        }
        Transport::Nats | Transport::NatsCluster => {
            let site = site.as_ref().context("the NATS server")?;
            sub_args.extend([
                "--nats".into(),
                site.subscriber_url(),
                "--nats-subject".into(),
                crate::nats::SUBJECT.into(),
                // As deployed: what a loaded host drops on the live subscription (its tail and
                // END included) is read back from the stream, so the run ends and is exact.
                "--nats-stream".into(),
                crate::nats::STREAM.into(),
            ]);
            let sub_start = Instant::now();
            let mut subscriber = spawn(plan.subscriber, &sub_args)?;
            let sub_sampler = Sampler::start(subscriber.pid(), deadline);
            // A core subscription has what is published after it, at the publisher's server:
            // in a cluster, once the interest has crossed the route.
            subscriber.try_wait_until("\"subscribed over NATS\"", READY, |l| l.contains("subscribed over NATS"))?;
            site.wait_for_interest(crate::nats::SUBJECT)?;
            let mut publisher = spawn(plan.publisher, &pub_args)?;
            let pub_sampler = Sampler::start(publisher.pid(), deadline);
            // Connected, stream checked, source ready: the hot thread starts the stream.
            publisher.try_wait_until("\"hot thread\"", READY, |l| l.contains("hot thread"))?;
            streaming_after = Some(sub_start.elapsed());
            server_cpu_before = site.cpu_seconds();
            (publisher, pub_sampler, subscriber, sub_sampler)
        }
        Transport::All => bail!("one transport at a time"),
    };
    // The samplers return at each exit, before the harness reaps: see `procstat`.
    let pub_usage = pub_sampler.finish();
    finish(publisher, Duration::from_secs(10)).context("mdrelay-pub")?;
    let sub_usage = sub_sampler.finish();
    // A NATS subscriber may still be reading back from the stream what the live subject
    // dropped when the publisher is done; past that, its output says why it is still running.
    finish_subscriber(subscriber, Duration::from_secs(30)).context("mdrelay-sub")?;
    let sub: serde_json::Value = serde_json::from_slice(&std::fs::read(&sub_json)?)?;
    let publ: serde_json::Value = serde_json::from_slice(&std::fs::read(&pub_json)?)?;
    let messages_received = sub["messages"].as_u64().unwrap_or(0);
    let messages_sent = publ["totals"]["messages"].as_u64().unwrap_or(0);
    let frames_sent = publ["totals"]["frames"].as_u64().unwrap_or(0);
    let frames_lost = sub["gaps"].as_u64().unwrap_or(0);
    let frame_bytes = publ["frame_bytes"].as_f64().unwrap_or(0.0);
    let publisher_seconds = publ["seconds"].as_f64().unwrap_or(0.0);
    let subscriber_seconds = sub["elapsed_seconds"].as_f64().unwrap_or(0.0);
    let wall = match streaming_after {
        // From the first frame's publication to the subscriber's exit: the subscriber's run
        // less its wait for the publisher (connection, stream check, source) to begin.
        Some(waited) => subscriber_seconds - waited.as_secs_f64(),
        None if transport == Transport::Tcp => subscriber_seconds,
        None => publisher_seconds,
    };
    let per_second = |n: f64, s: f64| if s > 0.0 { n / s } else { 0.0 };
    let sent_rate = per_second(messages_sent as f64, publisher_seconds);
    let paced_rate = per_second(plan.units as f64, publisher_seconds);
    let delivered_rate = per_second(messages_received as f64, wall);
    let bytes_per_message = per_second(frame_bytes, messages_sent.max(1) as f64);
    // The histogram log holds every value; without it (an older subscriber), the report's
    // percentiles are what there is.
    let curve = match read_histogram_log(&hlog) {
        Ok(h) => curve(&h),
        Err(e) => {
            eprintln!("mdrelay-bench: {e:#}; plotting the report's percentiles");
            let p = Percentiles::from_report(&sub["latency_ns"]);
            vec![(50.0, p.p50), (90.0, p.p90), (99.0, p.p99), (99.9, p.p999), (99.99, p.p9999)]
        }
    };
    let nats = match &site {
        Some(site) => {
            let server_cpu = site.cpu_seconds() - server_cpu_before;
            Some(nats_figures(args, site, &publ, &sub, messages_sent, (wall, server_cpu), plan.dir))
        }
        None => None,
    };
    drop(site);
    Ok(Row {
        transport,
        format,
        profile: plan.profile.label(),
        coalesce_bytes: coalesce,
        protection,
        mode: if args.top_speed { "top-speed" } else { "latency" },
        requested_rate: (!args.top_speed).then_some(args.rate),
        sent_rate,
        paced_rate,
        delivered_rate,
        rate_reached: (!args.top_speed).then_some(paced_rate >= 0.97 * args.rate),
        messages_sent,
        messages_received,
        frames_sent,
        frames_lost,
        loss_percent: per_second(100.0 * frames_lost as f64, frames_sent.max(1) as f64),
        totals_match: sub["totals_match"].as_bool(),
        bytes_per_message,
        megabytes_per_second: delivered_rate * bytes_per_message / 1e6,
        publisher_seconds,
        subscriber_seconds,
        latency_ns: Percentiles::from_report(&sub["latency_ns"]),
        curve,
        p50_vs_floor: None,
        p99_vs_floor: None,
        publisher_cpu_percent: per_second(100.0 * pub_usage.cpu_seconds, publisher_seconds),
        publisher_cpu_ms_per_million: per_second(1e9 * pub_usage.cpu_seconds, messages_sent.max(1) as f64),
        publisher: pub_usage,
        subscriber: sub_usage,
        nats,
    })
}

/// A NATS run's figures from the two reports, and (at top speed) the floor `nats bench`
/// measures through the same server with messages of the same size; a floor that fails is
/// reported and left out, as the run's own figures stand without it.
fn nats_figures(
    args: &LoopbackArgs,
    site: &Site,
    publ: &serde_json::Value,
    sub: &serde_json::Value,
    market_messages: u64,
    (wall, server_cpu_seconds): (f64, f64),
    dir: &Path,
) -> NatsFigures {
    let messages = publ["nats"]["published"].as_u64().unwrap_or(0);
    let bytes = sub["bytes"].as_u64().unwrap_or(0);
    let per = |a: f64, b: f64| if b > 0.0 { a / b } else { 0.0 };
    // The bytes of the messages received, over the share of the messages that is: frames are
    // spread evenly enough over messages (each full to the budget) that the share of frames
    // received stands for it when some were lost.
    let frames_sent = publ["totals"]["frames"].as_u64().unwrap_or(0) as f64;
    let frames_received = sub["frames"].as_u64().unwrap_or(0) as f64;
    let received_share =
        if frames_received > 0.0 && frames_received < frames_sent { frames_received / frames_sent } else { 1.0 };
    // A message whose acknowledgement was late is published again, and a live subscriber may
    // get both copies: their bytes are taken out the same way, by the share of frames that were
    // duplicates.
    let duplicates = sub["duplicates"].as_u64().unwrap_or(0) as f64;
    let unique_share = if frames_received > 0.0 { frames_received / (frames_received + duplicates) } else { 1.0 };
    let message_bytes = per(bytes as f64 * unique_share, messages as f64 * received_share);
    let messages_per_second = per(messages as f64, wall);
    let floor = if args.top_speed && message_bytes >= 1.0 {
        let count = args.nats_bench_messages.unwrap_or(messages.max(5_000));
        match crate::nats::bench_floor(site, args.nats_storage, message_bytes.round() as usize, count, dir) {
            Ok(floor) => Some(floor),
            Err(e) => {
                eprintln!("mdrelay-bench: nats bench: {e:#}");
                None
            }
        }
    } else {
        None
    };
    NatsFigures {
        replicas: site.replicas(),
        storage: args.nats_storage,
        messages,
        message_bytes,
        market_messages_per_message: per(market_messages as f64, messages as f64),
        messages_per_second,
        server_cpu_seconds,
        vs_jetstream: floor.and_then(|f| f.jetstream_per_second).map(|rate| per(messages_per_second, rate)),
        vs_core: floor.and_then(|f| f.core_per_second).map(|rate| per(messages_per_second, rate)),
        floor,
    }
}

/// The receiving program's report of run `name`.
fn sub_json_of(dir: &Path, name: &str) -> PathBuf {
    dir.join(format!("sub-{name}.json"))
}

/// The receiving program's histogram log of run `name`.
fn hlog_of(dir: &Path, name: &str) -> PathBuf {
    dir.join(format!("sub-{name}.hlog"))
}

/// The relay's packet schedule for the source: frames (one per IEX segment, heartbeats
/// included) and the pacer's units (a segment's messages, or one for a segment without any, as
/// `mdrelay-pub`'s rate pacing counts them). The floor sends one ping per frame over the same
/// time, so it carries the same packet rate as the relay does.
pub(crate) fn frame_schedule(args: &LoopbackArgs) -> Result<(u64, u64)> {
    let (mut frames, mut units) = (0u64, 0u64);
    let mut count = |payload: &[u8]| {
        if let Ok(segment) = Segment::parse(payload) {
            frames += 1;
            units += (segment.blocks().count() as u64).max(1);
        }
    };
    match &args.capture {
        Some(path) => {
            let mut reader = CaptureReader::open(path).with_context(|| format!("reading {}", path.display()))?;
            while let Some(packet) = reader.next_packet()? {
                if let Ok(datagram) = link::udp_datagram(packet.link_type, packet.data) {
                    count(datagram.payload);
                }
            }
        }
        None => {
            let config = SynthConfig { messages: args.messages(), ..SynthConfig::default() };
            let mut day = SyntheticDay::new(config).context("the synthetic day")?;
            while let Some(segment) = day.next_segment() {
                count(segment.bytes);
            }
        }
    }
    Ok((frames.max(1), units.max(1)))
}

fn run_floor(args: &LoopbackArgs, transport: Transport, (frames, units): (u64, u64)) -> Result<FloorRow> {
    let rate = args.rate * frames as f64 / units as f64;
    // Over NATS a frame makes two TCP hops (to the server, then to the subscriber): the floor
    // is one, as for the TCP fan-out.
    let socket = if transport.is_nats() { Transport::Tcp } else { transport };
    let spec = FloorSpec { transport: socket, rate, count: frames.max(1_000), bytes: args.floor_bytes };
    let result = floor::run(spec).with_context(|| format!("the {} latency floor", transport.name()))?;
    let achieved_rate = if result.send_seconds > 0.0 { result.sent as f64 / result.send_seconds } else { 0.0 };
    Ok(FloorRow {
        transport,
        message_bytes: args.floor_bytes,
        requested_rate: rate,
        achieved_rate,
        rate_reached: achieved_rate >= 0.97 * rate,
        pings: result.sent,
        echoes: result.received,
        one_way_ns: Percentiles::of(&result.one_way),
        spread: spread(&result.part_p50_ns),
        part_p50_ns: result.part_p50_ns,
        curve: curve(&result.one_way),
    })
}

/// A load average as `uptime` writes it.
fn loads([one, five, fifteen]: [f64; 3]) -> String {
    format!("{one:.2} {five:.2} {fifteen:.2}")
}

/// The largest over the smallest of `values` (1 for fewer than two).
fn spread(values: &[u64]) -> f64 {
    match (values.iter().min(), values.iter().max()) {
        (Some(&min), Some(&max)) if min > 0 => max as f64 / min as f64,
        _ => 1.0,
    }
}

/// The host's CPU model, CPU count, kernel release and load.
pub(crate) fn machine() -> Machine {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let cpu = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name").and_then(|r| r.split_once(':')).map(|(_, v)| v.trim().to_string()))
        .unwrap_or_else(|| "unknown".into());
    Machine {
        cpu,
        cpus: std::thread::available_parallelism().map_or(0, usize::from),
        kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default().trim().to_string(),
        load_average: load_average(),
    }
}

/// The load average over 1, 5 and 15 minutes (zeros where /proc does not say).
pub(crate) fn load_average() -> [f64; 3] {
    let text = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let mut fields = text.split_whitespace().map(|f| f.parse().unwrap_or(0.0));
    [(); 3].map(|()| fields.next().unwrap_or(0.0))
}

/// How far apart the p50s of the floor's parts are (the largest over the smallest) beyond which
/// the table warns that the machine disturbed the floor: on a quiet machine they agree within
/// about 10 %.
pub const FLOOR_SPREAD_WARN: f64 = 1.25;

/// A progress bar over the steps, or a plain line per step when stderr is not a terminal.
struct Progress(ProgressBar);

impl Progress {
    fn new(steps: u64) -> Progress {
        let bar = ProgressBar::new(steps);
        let style = ProgressStyle::with_template("[{elapsed_precise}] {bar:30} {pos}/{len} {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar());
        bar.set_style(style);
        Progress(bar)
    }

    fn step(&self, what: &str) {
        if self.0.is_hidden() {
            eprintln!("  [{}/{}] {what}", self.0.position() + 1, self.0.length().unwrap_or(0));
        }
        self.0.set_message(what.to_string());
    }

    fn done(&self, what: &str) {
        self.0.inc(1);
        if self.0.is_hidden() {
            eprintln!("        {what}");
        } else {
            self.0.println(format!("  {what}"));
        }
    }
}

/// "100,000": thousands separated, as the tables print counts and rates.
pub(crate) fn thousands(v: f64) -> String {
    let digits = format!("{:.0}", v.max(0.0));
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

pub(crate) fn us(ns: u64) -> String {
    let us = ns as f64 / 1000.0;
    if us >= 100.0 { format!("{us:.0}") } else { format!("{us:.1}") }
}

fn ratio(r: Option<f64>) -> String {
    r.map_or("-".into(), |r| format!("{r:.2}×"))
}

/// KiB as MiB with one decimal.
pub(crate) fn mib(kib: u64) -> String {
    format!("{:.1}", kib as f64 / 1024.0)
}

/// The requested rate as reached, or plainly not: "78,000 of 100,000".
fn rate_text(achieved: f64, requested: f64, reached: bool) -> String {
    if reached {
        thousands(requested)
    } else {
        format!("{} of {} (not reached)", thousands(achieved), thousands(requested))
    }
}

fn latency_table(report: &Report, out: &mut String) {
    for floor_row in &report.floors {
        let t = floor_row.transport;
        let rate = report.rate.unwrap_or(0.0);
        let _ = writeln!(
            out,
            "\n### {} at {} msg/s (floor: {} pings/s, the relay's frame rate)\n",
            t.name(),
            thousands(rate),
            thousands(floor_row.requested_rate)
        );
        let _ = writeln!(
            out,
            "| row | profile | msg/s paced | messages | lost | totals | bytes/msg | p50 µs | p90 µs | p99 µs | p99.9 µs | p99.99 µs | max µs | p50 / floor | p99 / floor | pub CPU s | pub CPU % | pub CPU ms / M msg | pub RSS MiB | sub CPU s | sub RSS MiB |"
        );
        let _ = writeln!(out, "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
        let f = &floor_row.one_way_ns;
        let floor_name =
            if t.is_nats() { "floor (TCP socket ping-pong, ½ RTT)" } else { "floor (socket ping-pong, ½ RTT)" };
        let _ = writeln!(
            out,
            "| {floor_name} | - | {} pings/s | {} | {} | - | {} | {} | {} | {} | {} | {} | {} | 1.00× | 1.00× | - | - | - | - | - |",
            rate_text(floor_row.achieved_rate, floor_row.requested_rate, floor_row.rate_reached),
            thousands(floor_row.pings as f64),
            floor_row.pings - floor_row.echoes.min(floor_row.pings),
            floor_row.message_bytes,
            us(f.p50),
            us(f.p90),
            us(f.p99),
            us(f.p999),
            us(f.p9999),
            us(f.max)
        );
        let mut disturbed = None;
        if floor_row.spread > FLOOR_SPREAD_WARN {
            let parts: Vec<String> = floor_row.part_p50_ns.iter().map(|&ns| us(ns)).collect();
            disturbed = Some(format!(
                "\n**The floor was disturbed**: the p50 of its five parts, in order, was {} µs ({:.2}× apart, \
                 against about 1.1× on a quiet machine). Something else ran beside it; ratios to it are \
                 uncertain by as much.",
                parts.join(", "),
                floor_row.spread
            ));
        }
        for r in report.rows.iter().filter(|r| r.transport == t) {
            let l = &r.latency_ns;
            let mut format = if r.coalesce_bytes > 0 {
                format!("{} (coalesce {})", r.format, r.coalesce_bytes)
            } else {
                r.format.to_string()
            };
            if r.protection != ProtectionChoice::None {
                let _ = write!(format, " [{}]", r.protection.name());
            }
            let _ = writeln!(
                out,
                "| {format} | {} | {} | {} | {} | {} | {:.1} | {} | {} | {} | {} | {} | {} | {} | {} | {:.2} | {:.0} | {:.0} | {} | {:.2} | {} |",
                r.profile,
                rate_text(r.paced_rate, r.requested_rate.unwrap_or(0.0), r.rate_reached.unwrap_or(true)),
                thousands(r.messages_received as f64),
                r.frames_lost,
                r.totals_match.map_or("-", |b| if b { "match" } else { "DIFFER" }),
                r.bytes_per_message,
                us(l.p50),
                us(l.p90),
                us(l.p99),
                us(l.p999),
                us(l.p9999),
                us(l.max),
                ratio(r.p50_vs_floor),
                ratio(r.p99_vs_floor),
                r.publisher.cpu_seconds,
                r.publisher_cpu_percent,
                r.publisher_cpu_ms_per_million,
                mib(r.publisher.peak_rss_kib),
                r.subscriber.cpu_seconds,
                mib(r.subscriber.peak_rss_kib)
            );
        }
        if let Some(disturbed) = disturbed {
            let _ = writeln!(out, "{disturbed}");
        }
    }
    let _ = writeln!(
        out,
        "\n\"msg/s paced\" counts messages and, as `--rate` does, one for each frame without any (a heartbeat). \
         \"pub CPU %\" is the publisher's CPU over its stream's seconds, percent of one core; \
         \"pub CPU ms / M msg\" its CPU per million messages sent, comparable across rates."
    );
    if let Some(p) = &report.pacing_floor {
        let _ = writeln!(
            out,
            "\nPacing floor: a thread that only waits for each of {} frame times per second with `idle = {}` \
             in duty cycles of {} µs, as the publisher's hot thread does, woke {} times a second, used {:.0} % \
             of a core and sent p50 {} µs, p99 {} µs late. Publisher CPU above it is the relay's own work.",
            thousands(p.rate),
            p.idle,
            p.duty_cycle_s * 1e6,
            thousands(p.wakeups as f64 * p.rate / p.waits.max(1) as f64),
            p.cpu_percent,
            us(p.late_ns.p50),
            us(p.late_ns.p99)
        );
    }
}

fn throughput_table(report: &Report, out: &mut String) {
    let _ = writeln!(out, "\n### top speed\n");
    let _ = writeln!(
        out,
        "| transport | format | coalesce bytes | profile | sent | received | frames lost | msg/s delivered | MB/s | msg/s sent | bytes/msg | pub CPU s | pub CPU ms / M msg | pub RSS MiB | sub CPU s | sub RSS MiB |"
    );
    let _ = writeln!(out, "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for r in &report.rows {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} ({:.2} %) | {} | {:.0} | {} | {:.1} | {:.2} | {:.0} | {} | {:.2} | {} |",
            r.transport.name(),
            r.format,
            r.coalesce_bytes,
            r.profile,
            thousands(r.messages_sent as f64),
            thousands(r.messages_received as f64),
            r.frames_lost,
            r.loss_percent,
            thousands(r.delivered_rate),
            r.megabytes_per_second,
            thousands(r.sent_rate),
            r.bytes_per_message,
            r.publisher.cpu_seconds,
            r.publisher_cpu_ms_per_million,
            mib(r.publisher.peak_rss_kib),
            r.subscriber.cpu_seconds,
            mib(r.subscriber.peak_rss_kib)
        );
    }
}

/// The NATS rows: messages on the subject against `nats bench`, and the targets at top speed.
fn nats_table(report: &Report, out: &mut String) {
    let rows: Vec<(&Row, &NatsFigures)> = report.rows.iter().filter_map(|r| r.nats.as_ref().map(|n| (r, n))).collect();
    if rows.is_empty() {
        return;
    }
    let _ = writeln!(out, "\n### NATS messages (one relay datagram each) against `nats bench`\n");
    let _ = writeln!(
        out,
        "| transport | format | coalesce bytes | replicas | storage | market msg/s delivered | frames lost | totals | NATS messages | bytes/NATS msg | market msgs/NATS msg | NATS msg/s | nats bench core msg/s | nats bench JetStream msg/s | / JetStream | / core | p50 µs | p99 µs | pub CPU s | server CPU s | sub CPU s |"
    );
    let _ = writeln!(out, "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    let floor = |v: Option<f64>| v.map_or("-".to_string(), thousands);
    let share = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{:.0} %", 100.0 * v));
    for (r, n) in &rows {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {:.0} | {:.1} | {} | {} | {} | {} | {} | {} | {} | {:.2} | {:.2} | {:.2} |",
            r.transport.name(),
            r.format,
            r.coalesce_bytes,
            n.replicas,
            n.storage.name(),
            thousands(r.delivered_rate),
            r.frames_lost,
            r.totals_match.map_or("-", |b| if b { "match" } else { "DIFFER" }),
            thousands(n.messages as f64),
            n.message_bytes,
            n.market_messages_per_message,
            thousands(n.messages_per_second),
            floor(n.floor.and_then(|f| f.core_per_second)),
            floor(n.floor.and_then(|f| f.jetstream_per_second)),
            share(n.vs_jetstream),
            share(n.vs_core),
            us(r.latency_ns.p50),
            us(r.latency_ns.p99),
            r.publisher.cpu_seconds,
            n.server_cpu_seconds,
            r.subscriber.cpu_seconds
        );
    }
    let _ = writeln!(
        out,
        "\nNATS msg/s and market msg/s delivered count from the publisher's first frame to the subscriber's exit. \
         `nats bench` runs through the same server after mdrelay, one publisher and one subscriber, with messages \
         of mdrelay's average size: core NATS (`nats bench pub`) and JetStream (`nats bench js pub async`, stored \
         and acknowledged as mdrelay publishes)."
    );
    if report.mode != "top-speed" {
        return;
    }
    let _ = writeln!(out, "\nTargets:\n");
    for (r, n) in &rows {
        let what = format!("{} {} coalesce {}", r.transport.name(), r.format, r.coalesce_bytes);
        let exact = r.frames_lost == 0 && r.totals_match == Some(true) && r.messages_received == r.messages_sent;
        if r.transport == Transport::Nats && r.coalesce_bytes > 0 {
            let met = exact && r.delivered_rate >= 5e6;
            let _ = writeln!(
                out,
                "- {what}: ≥ 5 M market msg/s through one server, lossless and exact: {} msg/s, {}: **{}**",
                thousands(r.delivered_rate),
                if exact { "lossless and exact" } else { "NOT lossless and exact" },
                if met { "met" } else { "not met" }
            );
        }
        if let Some(v) = n.vs_jetstream {
            let _ = writeln!(
                out,
                "- {what}: NATS msg/s ≥ 80 % of `nats bench` JetStream msg/s at {:.0} bytes: {:.0} %: **{}** (of core NATS: {})",
                n.message_bytes,
                100.0 * v,
                if v >= 0.8 { "met" } else { "not met" },
                share(n.vs_core)
            );
        }
    }
}

fn check(args: &LoopbackArgs) -> Result<()> {
    if !(args.rate.is_finite() && args.rate > 0.0) {
        bail!("--rate {}: give a positive number of messages per second", args.rate);
    }
    if args.messages() == 0 {
        bail!("--messages 0: give at least one message");
    }
    if !(8..=1472).contains(&args.floor_bytes) {
        bail!("--floor-bytes {}: give 8 to 1472 (one datagram)", args.floor_bytes);
    }
    if args.coalesce_bytes.is_empty() {
        bail!("--coalesce-bytes: give at least one value");
    }
    if args.transport != Transport::Nats && args.nats_cluster {
        bail!("--nats-cluster: only with --transport nats");
    }
    if args.nats_bench_messages == Some(0) {
        bail!("--nats-bench-messages 0: give at least one message");
    }
    Ok(())
}

/// Runs the comparison, prints the table, writes the plots and the JSON.
pub fn run(args: &LoopbackArgs) -> Result<()> {
    check(args)?;
    let (publisher, subscriber) = relay_programs()?;
    let profile = ProfileUse {
        requested: args.profile,
        publisher: has_profile_flag(&publisher, &["run"]),
        subscriber: has_profile_flag(&subscriber, &[]),
    };
    if args.profile != Profile::Default && !(profile.publisher && profile.subscriber) {
        eprintln!("mdrelay-bench: profile applied: {}", profile.label());
    }
    let dir = tempfile::tempdir().context("a directory for the runs' reports")?;
    std::fs::create_dir_all(&args.plots).with_context(|| format!("creating {}", args.plots.display()))?;
    let formats = if args.formats.is_empty() { Format::ALL.to_vec() } else { args.formats.clone() };
    let mut transports = args.transport.each();
    if args.nats_cluster {
        transports.push(Transport::NatsCluster);
    }
    let source = match &args.capture {
        Some(p) => p.display().to_string(),
        None => format!("synthetic day of {} messages", thousands(args.messages() as f64)),
    };
    let mut pace = if args.top_speed { "top speed".to_string() } else { format!("{} msg/s", thousands(args.rate)) };
    if let Some(core) = args.hot_core {
        let _ = write!(pace, ", publisher's hot thread on CPU {core}");
    }
    if let Some(core) = args.sub_core {
        let _ = write!(pace, ", subscriber on CPU {core}");
    }
    eprintln!("loopback: {source} at {pace}, profile {}, one format at a time", profile.label());
    let floors_per_transport = u64::from(!args.top_speed);
    let steps = floors_per_transport
        + transports.len() as u64
            * (floors_per_transport + (formats.len() * args.coalesce_bytes.len() * args.protection.len()) as u64);
    let progress = Progress::new(steps);
    let mut report = Report {
        machine: machine(),
        mode: if args.top_speed { "top-speed" } else { "latency" },
        source,
        rate: (!args.top_speed).then_some(args.rate),
        profile_requested: args.profile,
        hot_core: args.hot_core,
        sub_core: args.sub_core,
        publisher_has_profile: profile.publisher,
        subscriber_has_profile: profile.subscriber,
        floors: Vec::new(),
        pacing_floor: None,
        rows: Vec::new(),
        plots: Vec::new(),
    };
    let schedule = if args.top_speed { (1, 1) } else { frame_schedule(args)? };
    if !args.top_speed {
        // The waits alone, at the relay's frame rate, with the idle strategy the publisher's
        // profile picks: what its CPU is compared with.
        let profile = match args.profile {
            Profile::Default => mdrelay_runtime::idle::Profile::Default,
            Profile::LowLatency => mdrelay_runtime::idle::Profile::LowLatency,
        };
        let idle = mdrelay_runtime::idle::pacing_idle(profile);
        let duty_cycle = args.duty_cycle.map_or(mdrelay_runtime::idle::duty_cycle(profile), Duration::from_secs_f64);
        let (frames, units) = schedule;
        let rate = args.rate * frames as f64 / units as f64;
        // At most 3 seconds of waits: enough for the percentiles, short beside the runs.
        let waits = frames.min((rate * 3.0) as u64).max(100);
        progress.step("pacing floor");
        let p = floor::pacing(rate, waits, idle, duty_cycle).context("the pacing floor")?;
        progress.done(&format!("pacing floor: {:.0} % of a core, late p50 {} µs", p.cpu_percent, us(p.late_ns.p50)));
        report.pacing_floor = Some(p);
    }
    for &transport in &transports {
        // The floor first, on the same quiet host the formats then get.
        let floor_row = if args.top_speed {
            None
        } else {
            progress.step(&format!("{}: latency floor", transport.name()));
            let row = run_floor(args, transport, schedule)?;
            progress.done(&format!(
                "{} floor: one-way p50 {} µs, p99 {} µs",
                transport.name(),
                us(row.one_way_ns.p50),
                us(row.one_way_ns.p99)
            ));
            Some(row)
        };
        for &coalesce in &args.coalesce_bytes {
            for (&protection, &format) in args.protection.iter().flat_map(|p| formats.iter().map(move |f| (p, f))) {
                progress.step(&format!("{}: {format} (coalesce {coalesce}, {})", transport.name(), protection.name()));
                let plan = Plan {
                    args,
                    transport,
                    format,
                    coalesce,
                    protection,
                    publisher: &publisher,
                    subscriber: &subscriber,
                    dir: dir.path(),
                    profile: &profile,
                    units: schedule.1,
                };
                let mut row =
                    run_one(&plan).with_context(|| format!("{} {format} (coalesce {coalesce})", transport.name()))?;
                if let Some(f) = &floor_row {
                    let over = |a: u64, b: u64| (b > 0).then(|| a as f64 / b as f64);
                    row.p50_vs_floor = over(row.latency_ns.p50, f.one_way_ns.p50);
                    row.p99_vs_floor = over(row.latency_ns.p99, f.one_way_ns.p99);
                }
                progress.done(&if args.top_speed {
                    format!(
                        "{} {format}: {} msg/s, {} lost",
                        transport.name(),
                        thousands(row.delivered_rate),
                        row.frames_lost
                    )
                } else {
                    format!(
                        "{} {format}: p50 {} µs ({}), p99 {} µs ({})",
                        transport.name(),
                        us(row.latency_ns.p50),
                        ratio(row.p50_vs_floor),
                        us(row.latency_ns.p99),
                        ratio(row.p99_vs_floor)
                    )
                });
                report.rows.push(row);
            }
        }
        if let Some(f) = floor_row {
            report.floors.push(f);
        }
    }
    progress.0.finish_and_clear();

    // Plots: latency per transport, or throughput of every run.
    if args.top_speed {
        let bars: Vec<Bar> = report
            .rows
            .iter()
            .map(|r| Bar {
                label: match (args.coalesce_bytes.len() > 1, args.protection.len() > 1) {
                    (true, _) => format!("{} {} c{}", r.transport.name(), r.format, r.coalesce_bytes),
                    (false, true) => format!("{} {} {}", r.transport.name(), r.format, r.protection.name()),
                    (false, false) => format!("{} {}", r.transport.name(), r.format),
                },
                mmsgs: r.delivered_rate / 1e6,
            })
            .collect();
        let path = args.plots.join("throughput.svg");
        plots::throughput(&path, &format!("mdrelay loopback top speed, {}", report.source), &bars)?;
        report.plots.push(path);
    } else {
        for f in &report.floors {
            let mut curves = vec![Curve { name: "floor (socket ping-pong)".into(), points: points(&f.curve) }];
            for r in report.rows.iter().filter(|r| r.transport == f.transport) {
                let name = match (args.coalesce_bytes.len() > 1, args.protection.len() > 1) {
                    (true, _) => format!("{} c{}", r.format, r.coalesce_bytes),
                    (false, true) => format!("{} {}", r.format, r.protection.name()),
                    (false, false) => r.format.to_string(),
                };
                curves.push(Curve { name, points: points(&r.curve) });
            }
            let path = args.plots.join(format!("latency-{}.svg", f.transport.name()));
            let title =
                format!("mdrelay loopback {}, {} msg/s, one-way latency", f.transport.name(), thousands(args.rate));
            plots::latency(&path, &title, &curves)?;
            report.plots.push(path);
        }
    }

    let mut table = String::new();
    let _ = writeln!(
        table,
        "mdrelay-bench loopback: {}, {}, profile {}; {} ({} CPUs), Linux {}; load average {} at the start, {} at the end",
        report.source,
        pace,
        profile.label(),
        report.machine.cpu,
        report.machine.cpus,
        report.machine.kernel,
        loads(report.machine.load_average),
        loads(load_average()),
    );
    if args.top_speed {
        throughput_table(&report, &mut table);
    } else {
        latency_table(&report, &mut table);
    }
    nats_table(&report, &mut table);
    let short: Vec<String> = report
        .rows
        .iter()
        .filter(|r| r.rate_reached == Some(false))
        .map(|r| {
            format!(
                "{} {}: {} of {} msg/s",
                r.transport.name(),
                r.format,
                thousands(r.paced_rate),
                thousands(r.requested_rate.unwrap_or(0.0))
            )
        })
        .collect();
    if !short.is_empty() {
        let _ = writeln!(table, "\nRate not reached: {}.", short.join("; "));
    }
    write_table_and_json(&table, &report, &args.plots, args.json.as_deref(), "loopback")?;
    for p in &report.plots {
        eprintln!("plot: {}", p.display());
    }
    Ok(())
}

/// Prints `table`, writes it to `NAME.md` in `plots` and `report` as JSON to `json` (by default
/// `NAME.json` in `plots`), and says on stderr where both went.
pub fn write_table_and_json(
    table: &str,
    report: &impl Serialize,
    plots: &Path,
    json: Option<&Path>,
    name: &str,
) -> Result<()> {
    print!("{table}");
    let table_path = plots.join(format!("{name}.md"));
    std::fs::write(&table_path, table).with_context(|| format!("writing {}", table_path.display()))?;
    let json_path = json.map_or_else(|| plots.join(format!("{name}.json")), Path::to_path_buf);
    std::fs::write(&json_path, serde_json::to_string_pretty(report)?)
        .with_context(|| format!("writing {}", json_path.display()))?;
    eprintln!("table: {}", table_path.display());
    eprintln!("json: {}", json_path.display());
    Ok(())
}

/// A curve in ns as plot points in µs.
fn points(curve: &[(f64, u64)]) -> Vec<(f64, f64)> {
    curve.iter().map(|&(p, ns)| (p, ns as f64 / 1000.0)).collect()
}
