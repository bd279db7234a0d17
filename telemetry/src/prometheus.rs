//! The Prometheus scrape endpoint: `[metrics] listen = "127.0.0.1:9900"` (off unless set).
//!
//! The exporter (metrics-exporter-prometheus) renders the text format; the endpoint serves it
//! over HTTP (hyper), with `/healthz` and `/readyz` beside it, from a thread and runtime of its
//! own, so a scrape never competes with a program's hot loop or its runtime, and a slow or
//! stuck scraper holds up nothing but itself. Its connections are few and short ([`endpoint`]:
//! one request each, in time, at most [`MAX_CONNECTIONS`] at once), so no client can exhaust
//! the process's file descriptors or memory. Updates on the hot paths are atomic operations on
//! handles taken once; rendering happens only when scraped.

pub mod endpoint;

pub use endpoint::{ANSWER_TIMEOUT, EndpointLimits, MAX_CONNECTIONS, REQUEST_TIMEOUT};

use anyhow::{Context, Result, bail};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use metrics_util::MetricKindMask;
use serde::Deserialize;
use std::net::SocketAddr;
use std::time::Duration;

/// `[metrics]` in either program's configuration file; its flags (`--metrics-listen`,
/// `--metrics-hold`) are the publisher's, identified by their keys.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, serde::Serialize, clap::Args)]
#[serde(deny_unknown_fields)]
#[command(next_help_heading = "Metrics and report")]
pub struct MetricsSection {
    /// Serve Prometheus metrics on this address:port (e.g. "127.0.0.1:9900"); none: no endpoint.
    #[arg(id = "metrics.listen", long = "metrics-listen", value_name = "ADDR:PORT")]
    pub listen: Option<String>,
    /// Seconds the endpoint stays up after the run ends, so the last scrape sees the final
    /// counts (default 0: the program exits at once).
    #[serde(default, deserialize_with = "crate::units::option_seconds")]
    #[arg(id = "metrics.hold", long = "metrics-hold", value_name = "DURATION", value_parser = crate::units::parse_seconds)]
    pub hold: Option<f64>,
}

impl MetricsSection {
    /// Whether the section sets nothing: no endpoint (what a resolved configuration leaves out).
    pub fn is_off(&self) -> bool {
        self.listen.is_none() && self.hold.is_none()
    }
}

impl From<Option<MetricsSettings>> for MetricsSection {
    /// The section that gives these settings: none, or the endpoint and its hold.
    fn from(settings: Option<MetricsSettings>) -> MetricsSection {
        MetricsSection { listen: settings.map(|m| m.listen.to_string()), hold: settings.map(|m| m.hold.as_secs_f64()) }
    }
}

/// The endpoint's settings, checked.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MetricsSettings {
    /// Where the endpoint listens.
    pub listen: SocketAddr,
    /// How long it stays up after the run.
    pub hold: Duration,
}

/// Longest `metrics.hold`: a few scrape intervals; longer looks like a hang at shutdown.
pub const MAX_HOLD_SECONDS: f64 = 600.0;

/// Bucket bounds (seconds) of every latency histogram (`*_latency_seconds`): 1 µs to 10 s in
/// 1-2.5-5 steps. Buckets, not a summary: Prometheus adds histograms of many subscribers
/// together (`histogram_quantile` over `sum by (le)`), which summaries' quantiles cannot be, and
/// a histogram with nothing in it has no quantile to show, where the exporter's empty summary
/// showed every quantile as 0.
pub const LATENCY_BUCKETS: [f64; 22] = [
    1e-6, 2.5e-6, 5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1, 0.25, 0.5,
    1.0, 2.5, 5.0, 10.0,
];

/// A gauge not updated for this long is dropped from the scrape: a departed subscriber's queue
/// depth is not reported forever. Every gauge a program keeps is refreshed well within it.
pub const GAUGE_IDLE: Duration = Duration::from_secs(30);

impl MetricsSection {
    /// Checks the section; `listen` and `hold` given on the command line win over the file's.
    pub fn check(self, listen: Option<String>, hold: Option<f64>) -> Result<Option<MetricsSettings>> {
        let Some(text) = listen.or(self.listen) else {
            if hold.or(self.hold).is_some() {
                bail!("metrics.hold: set metrics.listen too; without an endpoint there is nothing to hold");
            }
            return Ok(None);
        };
        let listen: SocketAddr = text
            .parse()
            .with_context(|| format!("metrics.listen: {text:?} is not an address:port (e.g. 127.0.0.1:9900)"))?;
        let hold = hold.or(self.hold).unwrap_or(0.0);
        if !(hold.is_finite() && (0.0..=MAX_HOLD_SECONDS).contains(&hold)) {
            bail!("metrics.hold: {hold} is out of range: give a number from 0 to {MAX_HOLD_SECONDS} seconds");
        }
        Ok(Some(MetricsSettings { listen, hold: Duration::from_secs_f64(hold) }))
    }
}

/// Starts the endpoint and makes it the process's metrics recorder. Call it once, before any
/// runtime is entered on this thread: the endpoint runs on a thread and runtime of its own. An
/// address that cannot be bound is an error naming it.
///
/// The endpoint answers `GET /metrics` (the scrape), `/healthz` (200 while the process runs) and
/// `/readyz` (200 while it does its job, see [`crate::service::is_ready`]; 503 before and after),
/// for load balancers and orchestrators; anything else is 404. Each connection serves one
/// request within the limits of [`EndpointLimits::for_this_process`] (see [`endpoint`]).
///
/// Returns `mdrelay_build_info{program, version, revision}` (`0.1.0`, and the git commit built),
/// set to 1: the caller sets it again with its other gauges, since a gauge not set for
/// [`GAUGE_IDLE`] leaves the scrape.
pub fn serve(
    settings: &MetricsSettings,
    program: &'static str,
    version: &'static str,
    revision: &'static str,
) -> Result<metrics::Gauge> {
    let cannot = || format!("metrics.listen: cannot serve metrics on {}", settings.listen);
    let listener = std::net::TcpListener::bind(settings.listen).with_context(cannot)?;
    listener.set_nonblocking(true).with_context(cannot)?;
    let recorder = PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Suffix("_latency_seconds".to_string()), &LATENCY_BUCKETS)
        .context("metrics: latency buckets")?
        .idle_timeout(MetricKindMask::GAUGE, Some(GAUGE_IDLE))
        .build_recorder();
    let handle = recorder.handle();
    metrics::set_global_recorder(recorder).map_err(|e| anyhow::anyhow!("metrics: {e}"))?;
    let limits = EndpointLimits::for_this_process();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("metrics: cannot start the endpoint's runtime")?;
    std::thread::Builder::new()
        .name("mdrelay-metrics".into())
        .spawn(move || runtime.block_on(serve_endpoint(listener, handle, limits)))
        .context("metrics: cannot start the endpoint's thread")?;
    metrics::describe_gauge!(
        "mdrelay_build_info",
        "Always 1; the labels name the program, its version and the git commit built (revision)."
    );
    let info =
        metrics::gauge!("mdrelay_build_info", "program" => program, "version" => version, "revision" => revision);
    info.set(1.0);
    tracing::info!(
        listen = %settings.listen,
        max_connections = limits.max_connections,
        request_timeout = ?limits.request_timeout,
        "serving Prometheus metrics, /healthz and /readyz"
    );
    Ok(info)
}

/// How often the exporter drops idle gauges and rolls its buckets over.
const UPKEEP_EVERY: Duration = Duration::from_secs(5);

/// Runs the endpoint, and the exporter's upkeep beside it.
async fn serve_endpoint(listener: std::net::TcpListener, handle: PrometheusHandle, limits: EndpointLimits) {
    let upkeep = handle.clone();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(UPKEEP_EVERY);
        loop {
            tick.tick().await;
            upkeep.run_upkeep();
        }
    });
    endpoint::run(listener, handle, limits).await;
}

/// Keeps the process (and so the endpoint) up for `hold` after the run, so the next scrape sees
/// the final counts; SIGINT or SIGTERM ends the wait at once. Call it inside a runtime.
pub async fn hold(hold: Duration) {
    if hold.is_zero() {
        return;
    }
    use tokio::signal::unix::{SignalKind, signal};
    // Listened for before the line is logged: a signal sent on seeing the line ends the wait.
    let (Ok(mut int), Ok(mut term)) = (signal(SignalKind::interrupt()), signal(SignalKind::terminate())) else {
        tracing::info!(?hold, "metrics endpoint stays up with the final counts (metrics.hold)");
        // Without handlers the default actions end the process on a signal anyway.
        tokio::time::sleep(hold).await;
        return;
    };
    tracing::info!(?hold, "metrics endpoint stays up with the final counts (metrics.hold)");
    tokio::select! {
        _ = tokio::time::sleep(hold) => {}
        _ = int.recv() => {}
        _ = term.recv() => {}
    }
}

/// Feeds a histogram with what a run's HdrHistogram of nanoseconds gained since the last export:
/// the hot path records into its own histogram, and this copies the difference now and then.
#[derive(Default)]
pub struct HistogramExport {
    exported: Option<hdrhistogram::Histogram<u64>>,
}

impl HistogramExport {
    /// Nothing exported yet.
    pub fn new() -> HistogramExport {
        HistogramExport::default()
    }

    /// Records into `summary` (a latency histogram) what `run` holds beyond what the last call saw.
    pub fn export(&mut self, summary: &metrics::Histogram, run: &hdrhistogram::Histogram<u64>) {
        let mut new = run.clone();
        // A run's histogram only grows; one that does not contain the last (another run's,
        // other bounds) is exported whole.
        if let Some(exported) = &self.exported
            && new.subtract(exported).is_err()
        {
            new = run.clone();
        }
        record_interval(summary, &new);
        self.exported = Some(run.clone());
    }
}

/// Feeds one interval of an HdrHistogram of nanoseconds into a histogram in seconds. Values are
/// recorded per distinct bucket, so the cost is per bucket, not per sample, and the hot path
/// keeps recording into its own histogram.
pub fn record_interval(summary: &metrics::Histogram, nanos: &hdrhistogram::Histogram<u64>) {
    for bucket in nanos.iter_recorded() {
        let count = usize::try_from(bucket.count_at_value()).unwrap_or(usize::MAX);
        summary.record_many(nanos.highest_equivalent(bucket.value_iterated_to()) as f64 * 1e-9, count);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unset_endpoint_is_off_and_a_hold_without_it_is_refused() {
        assert_eq!(MetricsSection::default().check(None, None).unwrap(), None);
        let error = MetricsSection { listen: None, hold: Some(5.0) }.check(None, None).unwrap_err();
        assert!(error.to_string().contains("metrics.hold"), "{error}");
    }

    #[test]
    fn absurd_settings_are_refused_by_name() {
        for (listen, hold) in
            [("nonsense", 0.0), ("127.0.0.1:9900", -1.0), ("127.0.0.1:9900", f64::NAN), ("127.0.0.1:9900", 1e9)]
        {
            let section = MetricsSection { listen: Some(listen.into()), hold: Some(hold) };
            let error = section.check(None, None).unwrap_err().to_string();
            assert!(error.starts_with("metrics."), "{listen} {hold}: {error}");
        }
    }

    #[test]
    fn the_command_line_wins_over_the_file() {
        let section = MetricsSection { listen: Some("127.0.0.1:1".into()), hold: Some(1.0) };
        let settings = section.check(Some("127.0.0.1:2".into()), Some(2.0)).unwrap().unwrap();
        assert_eq!(settings.listen.port(), 2);
        assert_eq!(settings.hold, Duration::from_secs(2));
    }
}
