//! The endpoint's connections: accepted, served one request each, and cut off in time, so no
//! client can take the process's file descriptors or memory, or keep a scraper out.
//!
//! - **One exchange per connection** (HTTP/1.1, every answer says `Connection: close`): the
//!   request must arrive whole within [`REQUEST_TIMEOUT`] of connecting, and the answer be
//!   taken within [`ANSWER_TIMEOUT`] of the request; then the connection is closed. A client
//!   that connects and says nothing, or sends its request a byte a second, is closed at
//!   [`REQUEST_TIMEOUT`]; one that does not read its answer, at [`ANSWER_TIMEOUT`].
//! - **Places:** at most [`EndpointLimits::max_connections`] connections at once
//!   ([`MAX_CONNECTIONS`], or an eighth of the files the process may open when that is fewer),
//!   far below the process's limit of open files, so the relay's own sockets never run short
//!   because of the endpoint. When every place is taken, a newcomer takes the place of the
//!   connection that has waited longest for its request or left its answer untaken
//!   (`ServiceSlots`, as the retransmission service does), once that is [`EVICTION_GRACE`];
//!   otherwise it is answered `503` and closed at once. A scraper sends its request as soon as
//!   it connects, so connections that say nothing cannot keep Prometheus out.
//! - **Memory:** a request is read into at most [`READ_BUFFER`] bytes; an answer is the
//!   rendered text, taken within its timeout or dropped with the connection.
//!
//! `mdrelay_endpoint_connections_total` counts the connections accepted and
//! `mdrelay_endpoint_connections_closed_total{reason}` those turned away or cut off
//! ([`Closed`]).

use http_body_util::Full;
use hyper::body::Bytes;
use mdrelay_proto::relay::recovery::{Entered, ServiceSlots};
use metrics_exporter_prometheus::PrometheusHandle;
use std::io::Write;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

/// Most connections the endpoint serves at once: Prometheus servers, a few people with curl and
/// an orchestrator's probes each need one for milliseconds.
pub const MAX_CONNECTIONS: usize = 16;
/// Time a connection has to send its whole request after connecting.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// Time a client has to take its answer after its request came: Prometheus's default scrape
/// timeout.
pub const ANSWER_TIMEOUT: Duration = Duration::from_secs(10);
/// A connection that has waited this long for its request (or left its answer untaken this
/// long) may be made to leave for a newcomer when every place is taken: long enough for a
/// scraper that has just connected to send its request.
pub const EVICTION_GRACE: Duration = Duration::from_secs(1);
/// Bytes of a request read at most (hyper's smallest read buffer): a GET is a few hundred.
pub const READ_BUFFER: usize = 8192;

/// What a newcomer is told when every place is taken and none can be made free.
const BUSY_ANSWER: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: text/plain\r\ncontent-length: 49\r\n\
    retry-after: 1\r\nconnection: close\r\n\r\nbusy: every connection to this endpoint is taken\n";

/// How many connections the endpoint serves and how long each may take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EndpointLimits {
    /// Connections served at once.
    pub max_connections: usize,
    /// Time to send the whole request, from connecting.
    pub request_timeout: Duration,
    /// Time to take the answer, from the request.
    pub answer_timeout: Duration,
    /// Time a connection must have waited before a newcomer may take its place.
    pub eviction_grace: Duration,
}

impl EndpointLimits {
    /// The limits for a process that may open `open_files` files at once: [`MAX_CONNECTIONS`],
    /// or an eighth of the files when that is fewer (at least one), so the endpoint never holds
    /// more than a small part of them.
    pub fn for_open_files(open_files: u64) -> EndpointLimits {
        let share = usize::try_from(open_files / 8).unwrap_or(usize::MAX);
        EndpointLimits {
            max_connections: share.clamp(1, MAX_CONNECTIONS),
            request_timeout: REQUEST_TIMEOUT,
            answer_timeout: ANSWER_TIMEOUT,
            eviction_grace: EVICTION_GRACE,
        }
    }

    /// The limits for this process, from its soft limit of open files (`RLIMIT_NOFILE`);
    /// [`MAX_CONNECTIONS`] when it cannot be read.
    pub fn for_this_process() -> EndpointLimits {
        use nix::sys::resource::{Resource, getrlimit};
        let open_files = getrlimit(Resource::RLIMIT_NOFILE).map_or(u64::MAX, |(soft, _)| soft);
        EndpointLimits::for_open_files(open_files)
    }
}

/// Why the endpoint turned a connection away or cut it off: the `reason` label of
/// `mdrelay_endpoint_connections_closed_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Closed {
    /// Every place was taken by a connection within its grace: answered 503 at once.
    Busy,
    /// It made way for a newcomer, having waited the longest without a request (or without
    /// taking its answer).
    Evicted,
    /// Its request did not arrive whole within [`EndpointLimits::request_timeout`].
    RequestTimeout,
    /// Its answer was not taken within [`EndpointLimits::answer_timeout`].
    AnswerTimeout,
}

impl Closed {
    /// Every reason, in the order of the docs.
    pub const ALL: [Closed; 4] = [Closed::Busy, Closed::Evicted, Closed::RequestTimeout, Closed::AnswerTimeout];

    /// The label value.
    pub const fn label(self) -> &'static str {
        match self {
            Closed::Busy => "busy",
            Closed::Evicted => "evicted",
            Closed::RequestTimeout => "request_timeout",
            Closed::AnswerTimeout => "answer_timeout",
        }
    }
}

/// Where a connection is in its one exchange, and so when it is cut off.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Exchange {
    /// Connected at this time; the request has not come whole.
    Requesting(Instant),
    /// The request came whole at this time; the answer is being written.
    Answering(Instant),
}

impl Exchange {
    /// When the connection is cut off if it has not ended by then.
    fn deadline(self, limits: &EndpointLimits) -> Instant {
        match self {
            Exchange::Requesting(at) => at + limits.request_timeout,
            Exchange::Answering(at) => at + limits.answer_timeout,
        }
    }

    /// Why it is cut off at its deadline.
    fn timed_out(self) -> Closed {
        match self {
            Exchange::Requesting(_) => Closed::RequestTimeout,
            Exchange::Answering(_) => Closed::AnswerTimeout,
        }
    }
}

/// What every connection's task shares.
struct Shared {
    handle: PrometheusHandle,
    process: metrics_process::Collector,
    limits: EndpointLimits,
    /// The places, holding each connection's way to be told to leave.
    places: Mutex<ServiceSlots<oneshot::Sender<()>>>,
    /// The clock the places are kept on starts here.
    origin: Instant,
    accepted: metrics::Counter,
    closed: [metrics::Counter; 4],
}

impl Shared {
    /// Now, in ns on the places' clock.
    fn now_ns(&self) -> i64 {
        i64::try_from(self.origin.elapsed().as_nanos()).unwrap_or(i64::MAX)
    }

    fn places(&self) -> MutexGuard<'_, ServiceSlots<oneshot::Sender<()>>> {
        // A task that panicked holding the lock left the places as they were between calls.
        self.places.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn count(&self, closed: Closed) {
        self.closed[Closed::ALL.iter().position(|c| *c == closed).unwrap_or(0)].increment(1);
    }
}

/// Serves the endpoint on `listener` within `limits` until the process exits.
pub(super) async fn run(listener: std::net::TcpListener, handle: PrometheusHandle, limits: EndpointLimits) {
    let listener = match tokio::net::TcpListener::from_std(listener) {
        Ok(listener) => listener,
        Err(error) => {
            tracing::error!(%error, "metrics endpoint: cannot take the listener");
            return;
        }
    };
    metrics::describe_counter!("mdrelay_endpoint_connections_total", "Connections accepted by the metrics endpoint.");
    metrics::describe_counter!(
        "mdrelay_endpoint_connections_closed_total",
        "Metrics endpoint connections turned away (busy), made to leave for a newcomer (evicted), or cut off for a \
         request or an answer that took too long (request_timeout, answer_timeout)."
    );
    // The process's CPU, memory and descriptors, read from /proc when scraped.
    let process = metrics_process::Collector::default();
    process.describe();
    let shared = Arc::new(Shared {
        handle,
        process,
        limits,
        places: Mutex::new(ServiceSlots::new(
            limits.max_connections,
            i64::try_from(limits.eviction_grace.as_nanos()).unwrap_or(i64::MAX),
        )),
        origin: Instant::now(),
        accepted: metrics::counter!("mdrelay_endpoint_connections_total"),
        closed: Closed::ALL
            .map(|c| metrics::counter!("mdrelay_endpoint_connections_closed_total", "reason" => c.label())),
    });
    // Served from the start, at 0, so rules over them see the series before anything happens.
    shared.accepted.increment(0);
    for counter in &shared.closed {
        counter.increment(0);
    }
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(error) => {
                // Out of descriptors, say: try again shortly instead of spinning.
                tracing::warn!(%error, "metrics endpoint: accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        shared.accepted.increment(1);
        let (leave, told_to_leave) = oneshot::channel();
        let entered = shared.places().enter(shared.now_ns(), leave);
        match entered {
            Entered::Full(_) => {
                shared.count(Closed::Busy);
                // One write on a fresh socket, whose send buffer is empty: it never waits.
                if let Ok(mut socket) = stream.into_std() {
                    let _ = socket.write(BUSY_ANSWER);
                }
            }
            Entered::Admitted { slot, evicted } => {
                // Dropping its sender tells the connection that made way to leave.
                drop(evicted);
                tokio::spawn(exchange(stream, slot, told_to_leave, shared.clone()));
            }
        }
    }
}

/// One connection's exchange: a request, its answer, then the connection is closed; cut off at
/// its deadline or when told to leave.
async fn exchange(stream: tokio::net::TcpStream, slot: u64, told_to_leave: oneshot::Receiver<()>, shared: Arc<Shared>) {
    let state = Arc::new(Mutex::new(Exchange::Requesting(Instant::now())));
    let service = {
        let (shared, state) = (shared.clone(), state.clone());
        hyper::service::service_fn(move |request: hyper::Request<hyper::body::Incoming>| {
            *state.lock().unwrap_or_else(|e| e.into_inner()) = Exchange::Answering(Instant::now());
            let path = request.uri().path();
            if path == "/metrics" {
                shared.process.collect();
            }
            let response = respond(&shared.handle, path);
            // The answer is handed over: from now on a client that leaves it untaken may be
            // made to leave after the grace, as one that asks nothing.
            let now = shared.now_ns();
            shared.places().answered(slot, now);
            std::future::ready(Ok::<_, std::convert::Infallible>(response))
        })
    };
    let io = hyper_util::rt::TokioIo::new(stream);
    let connection = hyper::server::conn::http1::Builder::new()
        .keep_alive(false)
        .max_buf_size(READ_BUFFER)
        .serve_connection(io, service);
    tokio::pin!(connection);
    tokio::pin!(told_to_leave);
    let closed = loop {
        let now = *state.lock().unwrap_or_else(|e| e.into_inner());
        let deadline = now.deadline(&shared.limits);
        tokio::select! {
            _ = &mut connection => break None,
            _ = &mut told_to_leave => break Some(Closed::Evicted),
            () = tokio::time::sleep_until(deadline.into()) => {
                // The request may have come meanwhile, which moves the deadline on.
                let exchange = *state.lock().unwrap_or_else(|e| e.into_inner());
                if exchange.deadline(&shared.limits) <= Instant::now() {
                    break Some(exchange.timed_out());
                }
            }
        }
    };
    shared.places().leave(slot);
    if let Some(closed) = closed {
        shared.count(closed);
    }
}

/// The process's CPU time, user and system, in seconds: a counter, as Prometheus's own clients
/// serve it.
const CPU_SECONDS: &str = "process_cpu_seconds_total";

/// The scrape's text from the exporter's rendering. The collector keeps [`CPU_SECONDS`] as a
/// gauge (metrics-process's `use-gauge-on-cpu-seconds-total`): the facade's counters hold
/// integers, and one cut the CPU time to whole seconds, so a process busy for 0.9 s showed 0.
/// The value only grows, so it is served typed as the counter it is; a gauge named `_total`
/// would also break the naming conventions `promtool check metrics` enforces.
fn exposition(mut rendered: String) -> String {
    let gauge = format!("# TYPE {CPU_SECONDS} gauge\n");
    if let Some(at) = rendered.find(&gauge) {
        rendered.replace_range(at..at + gauge.len(), &format!("# TYPE {CPU_SECONDS} counter\n"));
    }
    rendered
}

/// The answer to a GET of `path`.
fn respond(handle: &PrometheusHandle, path: &str) -> hyper::Response<Full<Bytes>> {
    let (status, content_type, body) = match path {
        "/metrics" => (200, "text/plain; version=0.0.4", exposition(handle.render())),
        "/healthz" => (200, "text/plain", "ok\n".to_string()),
        "/readyz" if crate::service::is_ready() => (200, "text/plain", "ready\n".to_string()),
        "/readyz" => (503, "text/plain", "not ready\n".to_string()),
        _ => (404, "text/plain", "not found: try /metrics, /healthz or /readyz\n".to_string()),
    };
    let mut response = hyper::Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = hyper::StatusCode::from_u16(status).unwrap_or(hyper::StatusCode::INTERNAL_SERVER_ERROR);
    response.headers_mut().insert(hyper::header::CONTENT_TYPE, hyper::header::HeaderValue::from_static(content_type));
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cap_is_a_small_share_of_the_files_the_process_may_open() {
        for (open_files, cap) in [(u64::MAX, 16), (1 << 20, 16), (20_000, 16), (256, 16), (64, 8), (9, 1), (0, 1)] {
            assert_eq!(EndpointLimits::for_open_files(open_files).max_connections, cap, "{open_files} files");
        }
        let limits = EndpointLimits::for_this_process();
        assert!((1..=MAX_CONNECTIONS).contains(&limits.max_connections));
    }

    #[test]
    fn a_connection_has_the_request_timeout_to_ask_and_the_answer_timeout_from_its_request() {
        let limits = EndpointLimits::for_open_files(1024);
        let connected = Instant::now();
        let waiting = Exchange::Requesting(connected);
        assert_eq!(waiting.deadline(&limits), connected + REQUEST_TIMEOUT);
        assert_eq!(waiting.timed_out(), Closed::RequestTimeout);
        // A request at the last moment has the whole answer timeout from then on.
        let asked = connected + REQUEST_TIMEOUT - Duration::from_millis(1);
        let answering = Exchange::Answering(asked);
        assert_eq!(answering.deadline(&limits), asked + ANSWER_TIMEOUT);
        assert!(answering.deadline(&limits) > waiting.deadline(&limits), "a deadline only moves on");
        assert_eq!(answering.timed_out(), Closed::AnswerTimeout);
    }

    #[test]
    fn the_cpu_time_is_served_as_a_counter_with_its_fraction() {
        let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
        let handle = recorder.handle();
        let process = metrics_process::Collector::default();
        metrics::with_local_recorder(&recorder, || {
            process.describe();
            process.collect();
            // Another gauge whose name ends as the CPU's does keeps its type.
            metrics::gauge!("other_process_cpu_seconds_total").set(1.5);
        });
        let text = exposition(handle.render());
        let types: Vec<&str> = text.lines().filter(|l| l.starts_with("# TYPE ")).collect();
        assert!(types.contains(&"# TYPE process_cpu_seconds_total counter"), "{text}");
        assert!(types.contains(&"# TYPE other_process_cpu_seconds_total gauge"), "{text}");
        assert_eq!(types.iter().filter(|l| l.contains(" process_cpu_seconds_total ")).count(), 1, "{text}");
        // Served as the collector read it: a float, never cut to an integer by a counter.
        let served: f64 = text
            .lines()
            .find_map(|l| l.strip_prefix("process_cpu_seconds_total "))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no CPU time in:\n{text}"));
        assert!(served >= 0.0, "{served}");
        // Nothing else is touched.
        assert_eq!(exposition("# TYPE x gauge\nx 1\n".into()), "# TYPE x gauge\nx 1\n");
    }

    #[test]
    fn the_busy_answer_is_whole_http() {
        let text = std::str::from_utf8(BUSY_ANSWER).unwrap();
        let (head, body) = text.split_once("\r\n\r\n").unwrap();
        assert!(head.starts_with("HTTP/1.1 503 "));
        let length: usize =
            head.lines().find_map(|l| l.strip_prefix("content-length: ")).and_then(|n| n.parse().ok()).unwrap();
        assert_eq!(length, body.len());
        assert_eq!(Closed::ALL.map(Closed::label), ["busy", "evicted", "request_timeout", "answer_timeout"]);
    }
}
