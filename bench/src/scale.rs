//! `mdrelay-bench scale`: the memory-and-scale run. A long synthetic capture (50 million
//! messages by default) is replayed at top speed over TCP to two subscribers, losslessly
//! (`--slow-subscriber block`), while the resident memory and CPU time of all three processes
//! are read from /proc every `--sample-ms` and the subscribers print their throughput per
//! interval (`--report-interval`, the same period).
//!
//! It answers two questions a short run cannot: does any process's memory grow with the length
//! of the stream (a leak, or a buffer that follows the data instead of being bounded), and does
//! the throughput hold from start to end. Both are judged against stated bounds (see
//! [`RSS_BOUND`] and [`THROUGHPUT_BOUND`]) and reported, not enforced: the host, shared or not,
//! decides the figures. The run fails only when a subscriber did not receive exactly what the
//! publisher sent, or a process failed.
//!
//! The capture is written by the real `mdrelay-pub synth` into a temporary directory removed
//! afterwards (about 72 bytes a message: 3.6 GB for the default), unless `--capture` names one.
//! The samples go to a markdown table (`scale.md`) and a plot (`scale.svg`) in `--plots`, and
//! with the summary to `--json`. Every child process is killed when the run fails, times out
//! (`--timeout`) or is interrupted (Ctrl-C, SIGTERM, SIGHUP).

use crate::loopback::{Machine, machine, mib, relay_programs, thousands};
use crate::plots::{self, Curve};
use crate::procstat::{self, Snapshot};
use anyhow::{Context, Result, bail};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use mdrelay_codec::Format;
use mdrelay_harness::process::{Finished, Process};
use nix::sys::signal::{SigSet, Signal};
use serde::Serialize;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Arguments of `scale`.
#[derive(Debug, Args)]
pub struct ScaleArgs {
    /// Messages in the synthetic capture written for the run.
    #[arg(long, default_value_t = 50_000_000, conflicts_with = "capture")]
    pub messages: u64,
    /// Replay this existing capture instead of writing a synthetic one (nothing is written).
    #[arg(long)]
    pub capture: Option<PathBuf>,
    /// Wire format the publisher relays in.
    #[arg(long, default_value_t = Format::Sbe)]
    pub format: Format,
    /// Milliseconds between samples; also the subscribers' report interval (50 to 60000).
    #[arg(long, default_value_t = 1000)]
    pub sample_ms: u64,
    /// Seconds the whole run may take, the capture's writing included; then it is stopped.
    #[arg(long, default_value_t = 1800)]
    pub timeout: u64,
    /// Write everything measured, and the summary, as JSON to this file.
    #[arg(long, default_value = "target/mdrelay-bench/scale.json")]
    pub json: PathBuf,
    /// Directory for the table (scale.md) and the plot (scale.svg).
    #[arg(long, default_value = "target/mdrelay-bench")]
    pub plots: PathBuf,
}

/// RSS is flat when, after the first 10 % of the run, no sample exceeds the first sample taken
/// after it by more than this many KiB or [`RSS_BOUND_PERCENT`] of it, whichever is larger. The
/// first 10 % is warm-up: the publisher's queue, the retransmission ring and socket buffers fill
/// at the start and are bounded after; growth past it follows the stream's length.
const RSS_BOUND_KIB: u64 = 8 * 1024;
/// See [`RSS_BOUND_KIB`].
const RSS_BOUND_PERCENT: f64 = 10.0;
/// The warm-up share of the run, in which RSS is sampled but not judged.
const WARM_UP: f64 = 0.1;
/// The RSS bound as the report states it.
pub const RSS_BOUND: &str = "after the first 10 % of the run, no sample exceeds the first sample after it \
     by more than 8 MiB or 10 %, whichever is larger";
/// Throughput is steady when every full interval of each subscriber is within this many
/// percent of that subscriber's median interval.
const THROUGHPUT_BOUND_PERCENT: f64 = 25.0;
/// The throughput bound as the report states it.
pub const THROUGHPUT_BOUND: &str = "every full interval of each subscriber within ±25 % of its median; the first \
     interval with data and the last may be partial, and are not counted";

/// How long a process may take to print a readiness line.
const READY: Duration = Duration::from_secs(30);
/// How long the others may run on once one of the three has exited: a subscriber whose
/// publisher is gone reconnects forever, and a publisher blocked on a subscriber that died
/// would wait for it.
const EXIT_GRACE: Duration = Duration::from_secs(60);
/// How long the last drain of an exited subscriber waits for the end of its stderr: its lines
/// are in the pipe already, so this is only a bound.
const EXIT_DRAIN: Duration = Duration::from_secs(5);
/// How often a wait that is not a sample looks at the clock and for an interruption.
const POLL: Duration = Duration::from_millis(100);
/// About what a synthetic capture takes per message (2 M messages: 143 MB), for the error
/// that says why writing one may have failed.
const SYNTH_BYTES_PER_MESSAGE: f64 = 72.0;

/// The three processes, in the order of the samples and the tables.
const NAMES: [&str; 3] = ["mdrelay-pub", "sub1", "sub2"];

/// One interval line of a subscriber: its throughput over one report period.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Interval {
    /// Seconds since the subscriber started, at the interval's end (to 0.1 s, as printed).
    pub elapsed: f64,
    /// Seconds since the publisher started, on this benchmark's clock (the subscriber's start
    /// plus `elapsed`): the plot's time axis.
    pub t: f64,
    /// Messages per second over the interval, as the subscriber measured it.
    pub rate: f64,
    /// Messages received since the start.
    pub messages: u64,
    /// Frames received since the start: frames per second tell a relay that slowed down from
    /// data whose messages per frame changed.
    pub frames: u64,
}

/// What /proc said about the three processes at one moment, and what the subscribers reported.
#[derive(Debug, Clone, Serialize)]
pub struct Sample {
    /// Seconds since the publisher started.
    pub t: f64,
    /// `mdrelay-pub`, then each subscriber (none once reaped).
    pub processes: [Option<Snapshot>; 3],
    /// Each subscriber's msg/s over the intervals it reported since the previous sample (the
    /// mean when it reported more than one; none when it reported none).
    pub rates: [Option<f64>; 2],
    /// Each subscriber's messages received, by its latest interval line.
    pub messages: [u64; 2],
}

/// One process's resident memory over the run.
#[derive(Debug, Clone, Serialize)]
pub struct RssSummary {
    /// `mdrelay-pub`, `sub1` or `sub2`.
    pub process: String,
    /// The first sample after the warm-up, KiB.
    pub first_kib: Option<u64>,
    /// The last sample while all three ran, KiB.
    pub last_kib: Option<u64>,
    /// The largest sample, KiB.
    pub max_kib: Option<u64>,
    /// Last minus first, KiB.
    pub growth_kib: Option<i64>,
    /// Last over first, percent.
    pub growth_percent: Option<f64>,
    /// The largest sample after the warm-up minus the first after it, KiB: what the bound judges.
    pub excursion_kib: Option<i64>,
    /// The bound on the excursion, KiB.
    pub bound_kib: Option<u64>,
    /// Whether the excursion is within the bound.
    pub flat: bool,
    /// The peak resident set the kernel recorded (VmHWM), KiB.
    pub peak_kib: Option<u64>,
    /// CPU seconds, at the exit (or the last sample).
    pub cpu_seconds: f64,
}

/// One subscriber's throughput over the run.
#[derive(Debug, Clone, Serialize)]
pub struct ThroughputSummary {
    /// `sub1` or `sub2`.
    pub subscriber: String,
    /// Interval lines it printed.
    pub intervals: usize,
    /// Of which full (see [`THROUGHPUT_BOUND`]), and judged.
    pub full_intervals: usize,
    /// Slowest full interval, msg/s.
    pub min: Option<f64>,
    /// Median full interval, msg/s.
    pub p50: Option<f64>,
    /// Fastest full interval, msg/s.
    pub max: Option<f64>,
    /// The farthest a full interval is from the median, percent of it.
    pub max_deviation_percent: Option<f64>,
    /// Whether every full interval is within the bound (none without a full interval).
    pub steady: Option<bool>,
    /// Messages over its whole run (connection and end included), msg/s.
    pub overall_rate: f64,
}

/// The verdicts and the figures behind them.
#[derive(Debug, Serialize)]
pub struct Summary {
    /// Seconds since the publisher started at which the warm-up ends and RSS is judged.
    pub warm_up_until: f64,
    /// Per process.
    pub rss: Vec<RssSummary>,
    /// The bound.
    pub rss_bound: &'static str,
    /// Whether every process's RSS stayed within it.
    pub rss_flat: bool,
    /// Per subscriber.
    pub throughput: Vec<ThroughputSummary>,
    /// The bound.
    pub throughput_bound: &'static str,
    /// Whether both subscribers' throughput stayed within it (none without full intervals).
    pub throughput_steady: Option<bool>,
    /// Messages the publisher sent over its stream's seconds.
    pub overall_rate: f64,
}

/// What one subscriber received, from its final report.
#[derive(Debug, Serialize)]
pub struct SubscriberResult {
    /// `sub1` or `sub2`.
    pub name: String,
    /// Messages decoded.
    pub messages: u64,
    /// Frames decoded.
    pub frames: u64,
    /// Frames it never received.
    pub gaps: u64,
    /// Whether its counts equal the totals the publisher announced.
    pub totals_match: Option<bool>,
    /// Why it stopped (`end` at the end of the stream).
    pub stop_reason: String,
    /// Its run, seconds.
    pub elapsed_seconds: f64,
    /// Its interval lines, in order.
    pub intervals: Vec<Interval>,
}

/// Everything a run measured.
#[derive(Debug, Serialize)]
pub struct ScaleReport {
    /// The host.
    pub machine: Machine,
    /// The relay's format.
    pub format: Format,
    /// What was replayed.
    pub source: String,
    /// The capture's size, bytes.
    pub capture_bytes: u64,
    /// Milliseconds between samples.
    pub sample_ms: u64,
    /// Seconds spent writing the capture (none when one was given).
    pub synth_seconds: Option<f64>,
    /// Seconds from the publisher's start to the last exit.
    pub run_seconds: f64,
    /// Messages the publisher sent.
    pub publisher_messages: u64,
    /// Frames the publisher sent.
    pub publisher_frames: u64,
    /// The publisher's stream, seconds.
    pub publisher_seconds: f64,
    /// Each subscriber.
    pub subscribers: Vec<SubscriberResult>,
    /// Whether both subscribers received exactly what the publisher sent.
    pub delivered: bool,
    /// What did not match, when something did not.
    pub problems: Vec<String>,
    /// The samples, in time order.
    pub samples: Vec<Sample>,
    /// The verdicts.
    pub summary: Summary,
    /// The table written.
    pub table: PathBuf,
    /// The plot written.
    pub plot: PathBuf,
}

fn check(args: &ScaleArgs) -> Result<()> {
    if args.messages == 0 {
        bail!("--messages 0: give at least one message");
    }
    // Each sample reads the subscribers' output through the harness, whose answer when no new
    // line has come carries everything printed so far; much shorter periods would spend the
    // measured host's CPU on the measurement.
    if !(50..=60_000).contains(&args.sample_ms) {
        bail!("--sample-ms {}: give 50 to 60000 milliseconds", args.sample_ms);
    }
    if args.timeout == 0 {
        bail!("--timeout 0: give the seconds the run may take");
    }
    if let Some(path) = &args.capture {
        let meta = std::fs::metadata(path).with_context(|| format!("--capture {}", path.display()))?;
        if !meta.is_file() {
            bail!("--capture {}: not a file", path.display());
        }
    }
    Ok(())
}

/// The run's limits: its deadline, and whether it was interrupted.
struct Limits {
    deadline: Instant,
    timeout: u64,
    interrupted: Arc<AtomicBool>,
}

impl Limits {
    /// Fails once the run is interrupted or out of time; the caller's `?` then drops (kills)
    /// every child process and removes the temporary directory.
    fn check(&self) -> Result<()> {
        if self.interrupted.load(Ordering::Relaxed) {
            bail!("interrupted: the processes are stopped and the temporary files removed");
        }
        if Instant::now() >= self.deadline {
            bail!("--timeout {}: the run took longer; the processes are stopped", self.timeout);
        }
        Ok(())
    }

    /// Sleeps until `until`, looking at the limits every [`POLL`].
    fn sleep_until(&self, until: Instant) -> Result<()> {
        loop {
            self.check()?;
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(());
            }
            std::thread::sleep(left.min(POLL));
        }
    }

    /// Time left, at most `cap`.
    fn left(&self, cap: Duration) -> Duration {
        self.deadline.saturating_duration_since(Instant::now()).min(cap)
    }
}

/// Takes SIGINT, SIGTERM and SIGHUP on a thread of their own, so an interrupted run stops its
/// children and removes its multi-gigabyte capture instead of dying with both left behind. The
/// first signal sets the returned flag, which the run looks at every [`POLL`] at most; a second
/// one ends the process at once. Call before any thread starts: they inherit the mask (child
/// processes do not, std resets it).
fn catch_interrupts() -> Result<Arc<AtomicBool>> {
    let mut set = SigSet::empty();
    for signal in [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP] {
        set.add(signal);
    }
    set.thread_block().context("blocking SIGINT, SIGTERM and SIGHUP for the signal thread")?;
    let flag = Arc::new(AtomicBool::new(false));
    let seen = Arc::clone(&flag);
    std::thread::spawn(move || {
        if let Ok(signal) = set.wait() {
            eprintln!("\nmdrelay-bench: {signal}: stopping the run (again to quit at once)");
            seen.store(true, Ordering::Relaxed);
        }
        if set.wait().is_ok() {
            std::process::exit(130);
        }
    });
    Ok(flag)
}

/// Waits (up to `limit`) for a process /proc shows has exited; fails with its output unless its
/// status is one of `statuses`.
fn reap(process: Process, limit: Duration, what: &str, statuses: &[i32]) -> Result<Finished> {
    let finished = process.try_finish(limit).with_context(|| what.to_string())?;
    if !finished.code().is_some_and(|code| statuses.contains(&code)) {
        bail!("{what} failed: {finished:?}");
    }
    Ok(finished)
}

/// Whether `pid` has exited: a zombie, or reaped already.
fn exited(pid: u32) -> bool {
    procstat::snapshot(pid).is_none_or(|s| s.exited)
}

/// Writes `messages` messages to `out` with `mdrelay-pub synth`, showing the file's growth.
fn synthesize(publisher: &Path, messages: u64, out: &Path, limits: &Limits, progress: &Progress) -> Result<f64> {
    let started = Instant::now();
    let args =
        ["synth".to_string(), "--messages".into(), messages.to_string(), "--out".into(), out.display().to_string()];
    let process = Process::spawn(publisher, &args, &[]).with_context(|| format!("starting {}", publisher.display()))?;
    let expected = messages as f64 * SYNTH_BYTES_PER_MESSAGE;
    while !exited(process.pid()) {
        let written = std::fs::metadata(out).map_or(0, |m| m.len());
        progress.say(&format!("writing the capture: {} of about {}", gb(written as f64), gb(expected)));
        limits.sleep_until(Instant::now() + POLL)?;
    }
    let finished = process.try_finish(Duration::from_secs(10)).context("mdrelay-pub synth")?;
    if !finished.status.success() {
        let dir = out.parent().unwrap_or(Path::new("."));
        bail!(
            "mdrelay-pub synth --messages {messages} --out {} failed; {} messages take about {} (is there room in {}? \
             --capture replays an existing capture instead): {finished:?}",
            out.display(),
            thousands(messages as f64),
            gb(expected),
            dir.display()
        );
    }
    Ok(started.elapsed().as_secs_f64())
}

/// A subscriber's interval line as an [`Interval`] (`t` left at `elapsed`). The line reads
/// `mdrelay-sub [    1.0s]    2192284 msg/s  frames F (+f)  messages M  ...`.
fn parse_interval(line: &str) -> Option<Interval> {
    let rest = &line[line.find("mdrelay-sub [")? + "mdrelay-sub [".len()..];
    let (elapsed, rest) = rest.split_once("s]")?;
    let (rate, rest) = rest.split_once("msg/s")?;
    let mut words = rest.split_whitespace();
    let mut after = |key: &str| -> Option<u64> {
        words.find(|w| *w == key)?;
        words.next()?.parse().ok()
    };
    let frames = after("frames")?;
    let messages = after("messages")?;
    let elapsed = elapsed.trim().parse().ok()?;
    Some(Interval { elapsed, t: elapsed, rate: rate.trim().parse().ok()?, messages, frames })
}

/// Takes the interval lines `subscriber` has printed since the last call: without waiting while
/// it runs; once it has exited, every line up to the end of its stderr.
fn drain(subscriber: &mut Process, started_at: f64, exited: bool, into: &mut Vec<Interval>) -> Vec<f64> {
    // Its stderr is read by a thread of the harness, which may not have passed on the last lines
    // when the process is seen gone: a drain that did not wait for the end of the stream would
    // lose them (a short run's every line). The end comes when the pipe closes, at its exit.
    let wait = if exited { EXIT_DRAIN } else { Duration::ZERO };
    let mut rates = Vec::new();
    // The harness answers "no such line yet" (or "exited": the end of its stderr) with an error;
    // either ends the batch.
    while let Ok(line) = subscriber.try_wait_until("an interval line", wait, |l| parse_interval(l).is_some()) {
        if let Some(interval) = parse_interval(&line) {
            into.push(Interval { t: started_at + interval.elapsed, ..interval });
            rates.push(interval.rate);
        }
    }
    rates
}

/// One of the three processes as the sampler follows it.
struct Watched {
    pid: u32,
    /// The latest snapshot: the final CPU time once it has exited.
    last: Option<Snapshot>,
    /// When it was first seen exited, seconds since the publisher started.
    exited_at: Option<f64>,
}

impl Watched {
    fn new(pid: u32) -> Watched {
        Watched { pid, last: None, exited_at: None }
    }

    /// Looks at /proc; `t` is now, seconds since the publisher started.
    fn look(&mut self, t: f64) -> Option<Snapshot> {
        if self.exited_at.is_some() {
            return None;
        }
        match procstat::snapshot(self.pid) {
            Some(s) => {
                if s.exited {
                    self.exited_at = Some(t);
                }
                // Keep the last memory figures a zombie no longer has; take its final CPU time.
                let peak = s.peak_rss_kib.or(self.last.and_then(|l| l.peak_rss_kib));
                self.last = Some(Snapshot { peak_rss_kib: peak, ..s });
                Some(s)
            }
            None => {
                // Reaped before a sample saw it as a zombie: its last sample is what there is.
                self.exited_at = Some(t);
                None
            }
        }
    }
}

/// The progress line: messages received against the capture's, with the latest memory figures;
/// a plain line every ten seconds instead when stderr is not a terminal.
struct Progress {
    bar: ProgressBar,
    last_plain: Option<Instant>,
}

impl Progress {
    fn new() -> Progress {
        let bar = ProgressBar::new_spinner();
        bar.set_style(
            ProgressStyle::with_template("[{elapsed_precise}] {msg}")
                .unwrap_or_else(|_| ProgressStyle::default_spinner()),
        );
        Progress { bar, last_plain: None }
    }

    /// What is going on now.
    fn say(&self, what: &str) {
        self.bar.set_message(what.to_string());
        self.bar.tick();
    }

    /// A step done: kept above the progress line, or printed.
    fn done(&self, what: &str) {
        if self.bar.is_hidden() {
            eprintln!("  {what}");
        } else {
            self.bar.println(format!("  {what}"));
        }
    }

    /// From here on a bar over `total` messages, or a count when it is not known.
    fn relaying(&self, total: Option<u64>) {
        let template = match total {
            Some(_) => "[{elapsed_precise}] {bar:30} {percent:>3}% {msg}",
            None => "[{elapsed_precise}] {msg}",
        };
        self.bar.set_style(ProgressStyle::with_template(template).unwrap_or_else(|_| ProgressStyle::default_bar()));
        if let Some(total) = total {
            self.bar.set_length(total);
        }
    }

    /// The latest figures.
    fn update(&mut self, received: u64, what: String) {
        self.bar.set_position(received);
        if self.bar.is_hidden() && self.last_plain.is_none_or(|at| at.elapsed() >= Duration::from_secs(10)) {
            eprintln!("  {what}");
            self.last_plain = Some(Instant::now());
        }
        self.bar.set_message(what);
    }
}

/// Runs the scale test, prints the table and the summary, writes the table, the plot and the JSON.
pub fn run(args: &ScaleArgs) -> Result<()> {
    check(args)?;
    // First, before any thread: see `catch_interrupts`.
    let interrupted = catch_interrupts()?;
    let began = Instant::now();
    let limits = Limits { deadline: began + Duration::from_secs(args.timeout), timeout: args.timeout, interrupted };
    let (publisher_bin, subscriber_bin) = relay_programs()?;
    std::fs::create_dir_all(&args.plots).with_context(|| format!("creating {}", args.plots.display()))?;
    if let Some(parent) = args.json.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
    }
    // Declared before the processes, so it is removed after they are killed.
    let dir = tempfile::Builder::new().prefix("mdrelay-scale-").tempdir().context("a temporary directory")?;
    let mut progress = Progress::new();

    // 1. The capture.
    let (capture, synth_seconds, source) = match &args.capture {
        Some(path) => (path.clone(), None, path.display().to_string()),
        None => {
            let path = dir.path().join("synthetic.pcap");
            let seconds = synthesize(&publisher_bin, args.messages, &path, &limits, &progress)?;
            (path, Some(seconds), format!("synthetic capture of {} messages", thousands(args.messages as f64)))
        }
    };
    let capture_bytes = std::fs::metadata(&capture).with_context(|| format!("{}", capture.display()))?.len();
    progress.done(&format!(
        "capture: {source}, {} ({} bytes){}",
        gb(capture_bytes as f64),
        thousands(capture_bytes as f64),
        synth_seconds.map_or(String::new(), |s| format!(", written in {s:.1} s"))
    ));

    // 2. The relay, sampled until all three processes have exited.
    let mut relay = Relay::start(&publisher_bin, &subscriber_bin, &capture, args, dir.path(), &progress)?;
    progress.relaying(args.capture.is_none().then_some(args.messages));
    let sampled = relay.sample_until_exit(Duration::from_millis(args.sample_ms), &limits, &mut progress)?;
    progress.bar.finish_and_clear();

    // 3. Exit statuses, the final reports, and whether both subscribers got everything.
    let delivery = relay.finish(sampled.intervals, &limits)?;
    let mut problems = delivery.problems();
    if args.capture.is_none() && delivery.publisher_messages != args.messages {
        problems.push(format!(
            "mdrelay-pub sent {} messages of the capture's {}",
            thousands(delivery.publisher_messages as f64),
            thousands(args.messages as f64)
        ));
    }

    // 4. The summary, the table, the plot and the JSON.
    let watched = &sampled.watched;
    let final_cpu = watched.each_ref().map(|w| w.last.map_or(0.0, |s| s.cpu_seconds));
    let peaks = watched.each_ref().map(|w| w.last.and_then(|s| s.peak_rss_kib));
    let summary = summarize(
        &sampled.samples,
        &delivery.subscribers,
        final_cpu,
        peaks,
        delivery.publisher_messages,
        delivery.publisher_seconds,
    );
    let report = ScaleReport {
        machine: machine(),
        format: args.format,
        source,
        capture_bytes,
        sample_ms: args.sample_ms,
        synth_seconds,
        run_seconds: sampled.run_seconds,
        publisher_messages: delivery.publisher_messages,
        publisher_frames: delivery.publisher_frames,
        publisher_seconds: delivery.publisher_seconds,
        subscribers: delivery.subscribers,
        delivered: problems.is_empty(),
        problems,
        samples: sampled.samples,
        summary,
        table: args.plots.join("scale.md"),
        plot: args.plots.join("scale.svg"),
    };
    write_outputs(&report, &args.json)?;
    eprintln!("whole run: {:.1} s", began.elapsed().as_secs_f64());
    if !report.problems.is_empty() {
        bail!("the subscribers did not receive what the publisher sent: {}", report.problems.join("; "));
    }
    Ok(())
}

/// The publisher and both subscribers, running.
struct Relay {
    /// When the publisher was started: the samples' clock.
    t0: Instant,
    publisher: Process,
    subscribers: [Process; 2],
    /// When each subscriber was started, seconds after `t0`: its interval lines count from there.
    sub_started: [f64; 2],
    pub_json: PathBuf,
    sub_json: [PathBuf; 2],
}

/// What the sampling saw.
struct Sampled {
    samples: Vec<Sample>,
    intervals: [Vec<Interval>; 2],
    watched: [Watched; 3],
    /// From the publisher's start to the last exit.
    run_seconds: f64,
}

/// The publisher's totals and each subscriber's final report.
struct Delivery {
    publisher_messages: u64,
    publisher_frames: u64,
    publisher_seconds: f64,
    /// Frames the publisher dropped, per subscriber it names.
    dropped: Vec<(String, u64)>,
    subscribers: Vec<SubscriberResult>,
}

impl Relay {
    /// Starts the publisher on `capture`, then both subscribers once it serves, and returns
    /// when both have been greeted (the publisher starts sending once both are connected).
    fn start(
        publisher_bin: &Path,
        subscriber_bin: &Path,
        capture: &Path,
        args: &ScaleArgs,
        dir: &Path,
        progress: &Progress,
    ) -> Result<Relay> {
        let pub_json = dir.join("pub.json");
        let sub_json = [dir.join("sub1.json"), dir.join("sub2.json")];
        let pub_args = [
            "run",
            "--capture",
            &capture.display().to_string(),
            "--pacing",
            "top-speed",
            "--format",
            args.format.name(),
            "--tcp",
            "127.0.0.1:0",
            "--wait-subscribers",
            "2",
            // Lossless: the slower subscriber sets the pace instead of missing frames.
            "--slow-subscriber",
            "block",
            "--json",
            &pub_json.display().to_string(),
        ]
        .map(String::from);
        let spawn = |bin: &Path, args: &[String]| {
            Process::spawn(bin, args, &[]).with_context(|| format!("starting {}", bin.display()))
        };
        progress.say("starting mdrelay-pub");
        let t0 = Instant::now();
        let mut publisher = spawn(publisher_bin, &pub_args)?;
        let addr = publisher.try_serving_on(READY).context("mdrelay-pub")?;
        let report_interval = format!("{}", args.sample_ms as f64 / 1000.0);
        let sub_args = |json: &Path| {
            [
                "--connect",
                &addr.to_string(),
                "--json",
                &json.display().to_string(),
                "--report-interval",
                &report_interval,
            ]
            .map(String::from)
        };
        let started_1 = t0.elapsed().as_secs_f64();
        let sub1 = spawn(subscriber_bin, &sub_args(&sub_json[0]))?;
        let started_2 = t0.elapsed().as_secs_f64();
        let sub2 = spawn(subscriber_bin, &sub_args(&sub_json[1]))?;
        let mut subscribers = [sub1, sub2];
        for (i, s) in subscribers.iter_mut().enumerate() {
            s.try_wait_until("\"greeted\"", READY, |l| l.contains("greeted")).with_context(|| NAMES[i + 1])?;
        }
        progress.done(&format!("relaying at top speed over TCP {addr} to two subscribers, format {}", args.format));
        Ok(Relay { t0, publisher, subscribers, sub_started: [started_1, started_2], pub_json, sub_json })
    }

    /// Samples every `period` until all three processes have exited: /proc for each, and the
    /// interval lines the subscribers printed meanwhile.
    fn sample_until_exit(&mut self, period: Duration, limits: &Limits, progress: &mut Progress) -> Result<Sampled> {
        let pids = [self.publisher.pid(), self.subscribers[0].pid(), self.subscribers[1].pid()];
        let mut watched = pids.map(Watched::new);
        let mut drained = [false; 2];
        let mut intervals: [Vec<Interval>; 2] = Default::default();
        let mut samples: Vec<Sample> = Vec::new();
        let mut next = Instant::now();
        loop {
            limits.check()?;
            let t = self.t0.elapsed().as_secs_f64();
            // /proc first: a subscriber the draining below finds exited is reaped there, and its
            // final CPU time is only readable before.
            let processes = [watched[0].look(t), watched[1].look(t), watched[2].look(t)];
            let mut rates = [None; 2];
            for i in 0..2 {
                if drained[i] {
                    continue;
                }
                // Exited before this drain: the drain reads its every line.
                let exited = watched[i + 1].exited_at.is_some();
                let new = drain(&mut self.subscribers[i], self.sub_started[i], exited, &mut intervals[i]);
                rates[i] = (!new.is_empty()).then(|| new.iter().sum::<f64>() / new.len() as f64);
                drained[i] = exited;
            }
            let messages = [0, 1].map(|i| intervals[i].last().map_or(0, |l| l.messages));
            samples.push(Sample { t, processes, rates, messages });
            progress.update(messages[0].min(messages[1]), progress_text(&samples, &intervals));
            if watched.iter().all(|w| w.exited_at.is_some()) {
                return Ok(Sampled { samples, intervals, watched, run_seconds: self.t0.elapsed().as_secs_f64() });
            }
            if let Some(first) = watched.iter().filter_map(|w| w.exited_at).reduce(f64::min)
                && t - first > EXIT_GRACE.as_secs_f64()
            {
                let names = |gone: bool| {
                    (0..3).filter(|&i| watched[i].exited_at.is_some() == gone).map(|i| NAMES[i]).collect::<Vec<_>>()
                };
                bail!(
                    "{} exited at {first:.1} s and {} still ran {} s later: stopped",
                    names(true).join(" and "),
                    names(false).join(" and "),
                    EXIT_GRACE.as_secs()
                );
            }
            // A late sample (a slow /proc read on a busy host) skips the slots it missed
            // instead of taking them back to back.
            let now = Instant::now();
            while next <= now {
                next += period;
            }
            limits.sleep_until(next)?;
        }
    }

    /// Reaps the three processes (failing unless each succeeded) and reads their reports;
    /// `intervals` are the subscribers' lines, kept with their results.
    fn finish(self, intervals: [Vec<Interval>; 2], limits: &Limits) -> Result<Delivery> {
        let limit = limits.left(Duration::from_secs(30));
        reap(self.publisher, limit, NAMES[0], &[0])?;
        // A subscriber that lost frames ends with 5 (stream incomplete); `problems` says what.
        for (i, s) in self.subscribers.into_iter().enumerate() {
            reap(s, limit, NAMES[i + 1], &[0, 5])?;
        }
        let publ = read_json(&self.pub_json)?;
        let dropped = publ["subscribers"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|s| (s["peer"].as_str().unwrap_or("?").to_string(), s["dropped_frames"].as_u64().unwrap_or(0)))
            .collect();
        let mut subscribers = Vec::new();
        for ((name, path), intervals) in NAMES[1..].iter().zip(&self.sub_json).zip(intervals) {
            let sub = read_json(path)?;
            subscribers.push(SubscriberResult {
                name: name.to_string(),
                messages: sub["messages"].as_u64().unwrap_or(0),
                frames: sub["frames"].as_u64().unwrap_or(0),
                gaps: sub["gaps"].as_u64().unwrap_or(0),
                totals_match: sub["totals_match"].as_bool(),
                stop_reason: sub["stop_reason"].as_str().unwrap_or("").to_string(),
                elapsed_seconds: sub["elapsed_seconds"].as_f64().unwrap_or(0.0),
                intervals,
            });
        }
        Ok(Delivery {
            publisher_messages: publ["totals"]["messages"].as_u64().unwrap_or(0),
            publisher_frames: publ["totals"]["frames"].as_u64().unwrap_or(0),
            publisher_seconds: publ["seconds"].as_f64().unwrap_or(0.0),
            dropped,
            subscribers,
        })
    }
}

impl Delivery {
    /// What does not match between the publisher's totals and each subscriber's report.
    fn problems(&self) -> Vec<String> {
        let (messages, frames) = (self.publisher_messages, self.publisher_frames);
        let mut problems = Vec::new();
        if messages == 0 {
            problems.push("mdrelay-pub reports no messages sent".to_string());
        }
        for (peer, dropped) in self.dropped.iter().filter(|(_, d)| *d > 0) {
            problems.push(format!("mdrelay-pub dropped {dropped} frames of subscriber {peer}"));
        }
        for s in &self.subscribers {
            if s.messages != messages || s.frames != frames || s.gaps != 0 || s.totals_match != Some(true) {
                problems.push(format!(
                    "{} received {} of {} messages and {} of {} frames, {} gaps, totals match: {}, stopped by {:?}",
                    s.name,
                    thousands(s.messages as f64),
                    thousands(messages as f64),
                    thousands(s.frames as f64),
                    thousands(frames as f64),
                    s.gaps,
                    s.totals_match.map_or("not reported", |m| if m { "yes" } else { "no" }),
                    s.stop_reason
                ));
            }
        }
        problems
    }
}

/// Prints the table and writes it, the plot and the JSON.
fn write_outputs(report: &ScaleReport, json: &Path) -> Result<()> {
    let memory: Vec<Curve> = (0..3)
        .map(|i| Curve {
            name: NAMES[i].to_string(),
            points: report
                .samples
                .iter()
                .filter_map(|s| Some((s.t, s.processes[i]?.rss_kib? as f64 / 1024.0)))
                .collect(),
        })
        .collect();
    let throughput: Vec<Curve> = report
        .subscribers
        .iter()
        .map(|s| Curve { name: s.name.clone(), points: s.intervals.iter().map(|i| (i.t, i.rate / 1e6)).collect() })
        .collect();
    let title = format!("mdrelay scale: {}, {}, top speed to two subscribers", report.source, report.format);
    plots::over_time(&report.plot, &title, &memory, &throughput)?;
    let text = table(report);
    print!("{text}");
    std::fs::write(&report.table, &text).with_context(|| format!("writing {}", report.table.display()))?;
    std::fs::write(json, serde_json::to_string_pretty(report)?)
        .with_context(|| format!("writing {}", json.display()))?;
    eprintln!("table: {}", report.table.display());
    eprintln!("plot: {}", report.plot.display());
    eprintln!("json: {}", json.display());
    Ok(())
}

fn read_json(path: &Path) -> Result<serde_json::Value> {
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    serde_json::from_slice(&bytes).with_context(|| format!("parsing {}", path.display()))
}

/// The summary of `samples` and the subscribers' intervals; `cpu` and `peaks` per process.
fn summarize(
    samples: &[Sample],
    subscribers: &[SubscriberResult],
    cpu: [f64; 3],
    peaks: [Option<u64>; 3],
    publisher_messages: u64,
    publisher_seconds: f64,
) -> Summary {
    // The run, for memory, is while all three ran; its first 10 % is warm-up.
    let running: Vec<&Sample> =
        samples.iter().filter(|s| s.processes.iter().all(|p| p.is_some_and(|p| p.rss_kib.is_some()))).collect();
    let (start, end) = (running.first().map_or(0.0, |s| s.t), running.last().map_or(0.0, |s| s.t));
    let warm_up_until = start + WARM_UP * (end - start);
    let judged: Vec<&Sample> = running.iter().copied().filter(|s| s.t >= warm_up_until).collect();
    let rss: Vec<RssSummary> = (0..3)
        .map(|i| {
            let kib = |s: &Sample| s.processes[i].and_then(|p| p.rss_kib);
            let first = judged.first().and_then(|s| kib(s));
            let last = running.last().and_then(|s| kib(s));
            let after = judged.iter().filter_map(|s| kib(s)).max();
            let bound = first.map(|f| RSS_BOUND_KIB.max((f as f64 * RSS_BOUND_PERCENT / 100.0) as u64));
            let excursion = first.zip(after).map(|(f, a)| a as i64 - f as i64);
            let growth = first.zip(last).map(|(f, l)| l as i64 - f as i64);
            RssSummary {
                process: NAMES[i].to_string(),
                first_kib: first,
                last_kib: last,
                max_kib: samples.iter().filter_map(kib).max(),
                growth_kib: growth,
                growth_percent: first.zip(growth).filter(|(f, _)| *f > 0).map(|(f, g)| 100.0 * g as f64 / f as f64),
                excursion_kib: excursion,
                bound_kib: bound,
                flat: excursion.zip(bound).is_some_and(|(e, b)| e <= b as i64),
                peak_kib: peaks[i],
                cpu_seconds: cpu[i],
            }
        })
        .collect();
    let throughput: Vec<ThroughputSummary> = subscribers.iter().map(throughput_of).collect();
    let verdicts: Vec<Option<bool>> = throughput.iter().map(|t| t.steady).collect();
    let throughput_steady =
        if verdicts.iter().all(Option::is_some) { Some(verdicts.iter().all(|v| *v == Some(true))) } else { None };
    Summary {
        warm_up_until,
        rss_flat: rss.iter().all(|r| r.flat),
        rss,
        rss_bound: RSS_BOUND,
        throughput,
        throughput_bound: THROUGHPUT_BOUND,
        throughput_steady,
        overall_rate: per_second(publisher_messages as f64, publisher_seconds),
    }
}

/// The throughput figures of one subscriber's full intervals: those after the first interval
/// with data (data began inside it) and before the last (the stream's end may fall in it).
fn throughput_of(s: &SubscriberResult) -> ThroughputSummary {
    let v = &s.intervals;
    let full: Vec<f64> = match (v.iter().position(|i| i.rate > 0.0), v.iter().rposition(|i| i.rate > 0.0)) {
        (Some(first), Some(last)) if last > first + 1 => v[first + 1..last].iter().map(|i| i.rate).collect(),
        _ => Vec::new(),
    };
    let mut sorted = full.clone();
    sorted.sort_by(f64::total_cmp);
    let p50 = median(&sorted);
    let deviation =
        p50.filter(|m| *m > 0.0).map(|m| full.iter().map(|r| 100.0 * (r - m).abs() / m).fold(0.0, f64::max));
    ThroughputSummary {
        subscriber: s.name.clone(),
        intervals: v.len(),
        full_intervals: full.len(),
        min: sorted.first().copied(),
        p50,
        max: sorted.last().copied(),
        max_deviation_percent: deviation,
        steady: if full.is_empty() { None } else { Some(deviation.is_some_and(|d| d <= THROUGHPUT_BOUND_PERCENT)) },
        overall_rate: per_second(s.messages as f64, s.elapsed_seconds),
    }
}

/// The median of sorted values (the mean of the middle two of an even count).
fn median(sorted: &[f64]) -> Option<f64> {
    let n = sorted.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(sorted[n / 2]),
        _ => Some((sorted[n / 2 - 1] + sorted[n / 2]) / 2.0),
    }
}

fn per_second(n: f64, seconds: f64) -> f64 {
    if seconds > 0.0 { n / seconds } else { 0.0 }
}

/// The progress line's figures: memory of each process and the latest rates.
fn progress_text(samples: &[Sample], intervals: &[Vec<Interval>; 2]) -> String {
    let Some(s) = samples.last() else { return String::new() };
    let rss = |i: usize| s.processes[i].and_then(|p| p.rss_kib).map_or("-".to_string(), mib);
    let rate = |i: usize| intervals[i].last().map_or("-".to_string(), |l| format!("{:.2}", l.rate / 1e6));
    format!(
        "{:.0} s  {} messages  RSS MiB pub {} sub1 {} sub2 {}  M msg/s {} / {}",
        s.t,
        thousands(s.messages[0].min(s.messages[1]) as f64),
        rss(0),
        rss(1),
        rss(2),
        rate(0),
        rate(1)
    )
}

/// The markdown: header, the samples, and the summary with its verdicts.
fn table(report: &ScaleReport) -> String {
    let mut out = String::new();
    let m = &report.machine;
    let _ = writeln!(
        out,
        "mdrelay-bench scale: {} ({}), format {}, top speed over TCP to two subscribers (--slow-subscriber block); \
         {} ({} CPUs), Linux {}",
        report.source,
        gb(report.capture_bytes as f64),
        report.format,
        m.cpu,
        m.cpus,
        m.kernel
    );
    let _ = writeln!(out, "\n### samples, every {} ms\n", report.sample_ms);
    let _ = writeln!(out, "| time s | pub RSS MiB | sub1 RSS MiB | sub2 RSS MiB | sub1 msg/s | sub2 msg/s |");
    let _ = writeln!(out, "|---|---|---|---|---|---|");
    for s in &report.samples {
        let rss = |i: usize| s.processes[i].and_then(|p| p.rss_kib).map_or("-".to_string(), mib);
        let rate = |i: usize| s.rates[i].map_or("-".to_string(), thousands);
        let _ = writeln!(out, "| {:.1} | {} | {} | {} | {} | {} |", s.t, rss(0), rss(1), rss(2), rate(0), rate(1));
    }
    let sm = &report.summary;
    let _ = writeln!(out, "\n### memory (warm-up until {:.1} s)\n", sm.warm_up_until);
    let _ = writeln!(
        out,
        "| process | RSS first MiB | last MiB | max MiB | growth MiB | growth % | excursion MiB | bound MiB | flat | peak (VmHWM) MiB | CPU s |"
    );
    let _ = writeln!(out, "|---|---|---|---|---|---|---|---|---|---|---|");
    let opt = |v: Option<u64>| v.map_or("-".to_string(), mib);
    let signed = |v: Option<i64>| v.map_or("-".to_string(), |k| format!("{:+.1}", k as f64 / 1024.0));
    for r in &sm.rss {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {:.1} |",
            r.process,
            opt(r.first_kib),
            opt(r.last_kib),
            opt(r.max_kib),
            signed(r.growth_kib),
            r.growth_percent.map_or("-".to_string(), |p| format!("{p:+.1}")),
            signed(r.excursion_kib),
            opt(r.bound_kib),
            if r.flat { "yes" } else { "NO" },
            opt(r.peak_kib),
            r.cpu_seconds
        );
    }
    let _ = writeln!(out, "\n### throughput\n");
    let _ = writeln!(
        out,
        "| subscriber | intervals | full | min msg/s | p50 msg/s | max msg/s | max deviation % | steady | overall msg/s | messages |"
    );
    let _ = writeln!(out, "|---|---|---|---|---|---|---|---|---|---|");
    let rate = |v: Option<f64>| v.map_or("-".to_string(), thousands);
    for (t, s) in sm.throughput.iter().zip(&report.subscribers) {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            t.subscriber,
            t.intervals,
            t.full_intervals,
            rate(t.min),
            rate(t.p50),
            rate(t.max),
            t.max_deviation_percent.map_or("-".to_string(), |d| format!("{d:.1}")),
            verdict(t.steady),
            thousands(t.overall_rate),
            thousands(s.messages as f64)
        );
    }
    let _ = writeln!(
        out,
        "\nmdrelay-pub sent {} messages ({} frames) in {:.1} s: {} msg/s overall; run {:.1} s{}.",
        thousands(report.publisher_messages as f64),
        thousands(report.publisher_frames as f64),
        report.publisher_seconds,
        thousands(sm.overall_rate),
        report.run_seconds,
        report.synth_seconds.map_or(String::new(), |s| format!(", capture written in {s:.1} s"))
    );
    let _ = writeln!(
        out,
        "Delivered: {}.",
        if report.delivered {
            "both subscribers received exactly what mdrelay-pub sent".to_string()
        } else {
            format!("NO: {}", report.problems.join("; "))
        }
    );
    let _ = writeln!(out, "RSS flat: {}. Bound: {}.", if sm.rss_flat { "yes" } else { "NO" }, sm.rss_bound);
    let _ = writeln!(out, "Throughput steady: {}. Bound: {}.", verdict(sm.throughput_steady), sm.throughput_bound);
    out
}

fn verdict(v: Option<bool>) -> &'static str {
    match v {
        Some(true) => "yes",
        Some(false) => "NO",
        None => "- (no full interval: a longer run, or a shorter --sample-ms)",
    }
}

/// Bytes as "3.61 GB" (10^9) or "143.3 MB".
fn gb(bytes: f64) -> String {
    if bytes >= 1e9 { format!("{:.2} GB", bytes / 1e9) } else { format!("{:.1} MB", bytes / 1e6) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interval_lines_parse_and_other_lines_do_not() {
        let line = "mdrelay-sub [     0.5s]    2192284 msg/s  frames 416947 (+416947)  messages 1100643  \
                    latency p50 20.12ms p99 63.14ms max 66.55ms  gaps 0";
        let parsed = parse_interval(line).unwrap();
        assert_eq!(
            (parsed.elapsed, parsed.rate, parsed.messages, parsed.frames),
            (0.5, 2_192_284.0, 1_100_643, 416_947)
        );
        let idle = "mdrelay-sub [    12.0s]          0 msg/s  frames 0 (+0)  messages 0  latency -  gaps 0";
        assert_eq!(parse_interval(idle), Some(Interval { elapsed: 12.0, t: 12.0, rate: 0.0, messages: 0, frames: 0 }));
        assert_eq!(parse_interval("2026-01-01T00:00:00Z  INFO greeted publisher=127.0.0.1:1"), None);
        assert_eq!(parse_interval("mdrelay-sub: tcp 127.0.0.1:1, stopped by end after 0.9 s"), None);
    }

    fn interval(rate: f64) -> Interval {
        Interval { elapsed: 0.0, t: 0.0, rate, messages: 0, frames: 0 }
    }

    fn subscriber(rates: &[f64]) -> SubscriberResult {
        SubscriberResult {
            name: "sub1".into(),
            messages: 1000,
            frames: 10,
            gaps: 0,
            totals_match: Some(true),
            stop_reason: "end".into(),
            elapsed_seconds: 2.0,
            intervals: rates.iter().map(|&r| interval(r)).collect(),
        }
    }

    #[test]
    fn throughput_counts_only_full_intervals_and_judges_them_against_the_median() {
        // Idle before the data, a partial first interval, four full ones, a partial last.
        let t = throughput_of(&subscriber(&[0.0, 0.0, 10.0, 100.0, 110.0, 90.0, 104.0, 30.0]));
        assert_eq!((t.intervals, t.full_intervals), (8, 4));
        assert_eq!((t.min, t.p50, t.max), (Some(90.0), Some(102.0), Some(110.0)));
        assert_eq!(t.steady, Some(true));
        assert_eq!(t.overall_rate, 500.0);
        // A stall in the middle is a full interval, and not steady.
        let t = throughput_of(&subscriber(&[5.0, 100.0, 0.0, 100.0, 100.0, 5.0]));
        assert_eq!((t.full_intervals, t.steady), (4, Some(false)));
        // Too short to have a full interval: no verdict.
        let t = throughput_of(&subscriber(&[0.0, 50.0, 20.0]));
        assert_eq!((t.full_intervals, t.steady, t.p50), (0, None, None));
    }

    fn sample(t: f64, rss: [Option<u64>; 3]) -> Sample {
        let p = |kib: Option<u64>| Some(Snapshot { rss_kib: kib, exited: kib.is_none(), ..Snapshot::default() });
        Sample { t, processes: rss.map(p), rates: [None; 2], messages: [0; 2] }
    }

    #[test]
    fn rss_is_judged_after_the_warm_up_against_the_larger_bound() {
        // The publisher grows during the warm-up (t < 1), then stays; sub1 grows by 7 MiB
        // (under 8 MiB); sub2 keeps growing, 20 MiB past its first sample after the warm-up.
        let mut samples: Vec<Sample> = (0..=10)
            .map(|k| {
                let t = f64::from(k);
                let publ = if k == 0 { 10_000 } else { 300_000 };
                let sub1 = 20_000 + u64::try_from(k).unwrap() * 700;
                let sub2 = 20_000 + u64::try_from(k).unwrap() * 2_048;
                sample(t, [Some(publ), Some(sub1), Some(sub2)])
            })
            .collect();
        // After the exits: not part of the run.
        samples.push(sample(11.0, [None, None, None]));
        let s = summarize(&samples, &[], [1.0, 2.0, 3.0], [None; 3], 1000, 2.0);
        assert_eq!(s.warm_up_until, 1.0);
        let [publ, sub1, sub2] = [&s.rss[0], &s.rss[1], &s.rss[2]];
        assert_eq!(
            (publ.first_kib, publ.last_kib, publ.max_kib, publ.growth_kib),
            (Some(300_000), Some(300_000), Some(300_000), Some(0))
        );
        // 10 % of 300 000 KiB is above 8 MiB.
        assert_eq!((publ.bound_kib, publ.flat), (Some(30_000), true));
        assert_eq!((sub1.excursion_kib, sub1.bound_kib, sub1.flat), (Some(6_300), Some(8_192), true));
        assert_eq!((sub2.excursion_kib, sub2.flat), (Some(18_432), false));
        assert!(!s.rss_flat);
        assert_eq!(s.overall_rate, 500.0);
        assert_eq!(s.throughput_steady, Some(true), "no subscribers: nothing unsteady");
    }
}
