//! The retransmission service: UDP subscribers ask over TCP for frames they missed, and get them
//! from the ring in their original format.
//!
//! It listens on a port of its own (`retransmit.listen`), not the stream's: a UDP-only publisher
//! has no stream port, the two can be firewalled and limited apart, and a flood of requests
//! cannot take the stream's connection slots. The handshake is the stream's (greeting, answer,
//! versions negotiated); a version-1 subscriber cannot ask and is refused with the reason.
//!
//! Every request is answered in order: `GONE` for the frames the ring no longer holds (all of
//! them at once), `DATA` records for the frames held (at most `retransmit.max_range` per request;
//! the rest is asked again), nothing for frames not sent yet, and `BUSY`
//! for a request over the connection's rate (`retransmit.requests_per_second`, as a token
//! bucket with a second's burst). A connection that does not read its answers is cut off after
//! a few seconds, so answers never pile up: each is built, written and dropped before the next
//! request is read. Memory is the ring plus one answer per connection.

use crate::config::Retransmit;
use crate::engine::{SharedRing, lock};
use crate::tcp::{Acceptor, LiveGuard};
use mdrelay_proto::codec::Format;
use mdrelay_proto::relay::{Purpose, RecordHeader, RecordTag, RetransmitRequest, control_record, gone_payload};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

/// Time a client has to answer the greeting.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);
/// Time an answer may take to write: a client that reads nothing for this long is cut off.
const WRITE_TIMEOUT: Duration = Duration::from_secs(5);
/// Payload bytes per `DATA` record of an answer.
const RECORD_BYTES: usize = 64 << 10;

/// Counters over every connection to the service.
#[derive(Debug, Default)]
pub struct RetransmitCounters {
    connections: AtomicU64,
    refused: AtomicU64,
    requests: AtomicU64,
    throttled: AtomicU64,
    frames_sent: AtomicU64,
    frames_gone: AtomicU64,
    frames_ahead: AtomicU64,
    bytes_sent: AtomicU64,
    accept_errors: AtomicU64,
}

/// The service's figures, for the run's summary.
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct RetransmitSummary {
    /// Connections accepted.
    pub connections: u64,
    /// Connections refused (limit, handshake, version, protocol violation).
    pub refused: u64,
    /// Requests received.
    pub requests: u64,
    /// Requests over the rate limit, answered BUSY.
    pub throttled: u64,
    /// Frames retransmitted.
    pub frames_sent: u64,
    /// Frames asked for that the ring no longer held (answered GONE).
    pub frames_gone: u64,
    /// Frames asked for that were not sent yet (not answered).
    pub frames_ahead: u64,
    /// Bytes of answers written.
    pub bytes_sent: u64,
    /// The ring's bound, bytes.
    pub ring_bytes: usize,
    /// Oldest and next frame of the ring at the end.
    pub ring_first: u64,
    /// See `ring_first`.
    pub ring_next: u64,
}

/// What the service's tasks share.
#[derive(Clone)]
pub struct Service {
    /// The frames.
    pub ring: SharedRing,
    /// The settings.
    pub settings: Retransmit,
    /// The publisher's session: requests are for frames of this session.
    pub session: u64,
    /// The stream number, for the greeting.
    pub stream: u32,
    /// The configured format, for a greeting before the first frame.
    pub format: Format,
    /// The frames' protection, for the greeting.
    pub guard: crate::fanout::Guard,
    /// Counters.
    pub counters: Arc<RetransmitCounters>,
    /// Tracks connection tasks, for shutdown.
    pub tracker: TaskTracker,
}

impl Service {
    /// The figures so far.
    pub fn summary(&self) -> RetransmitSummary {
        let c = &self.counters;
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let ring = lock(&self.ring);
        RetransmitSummary {
            connections: load(&c.connections),
            refused: load(&c.refused),
            requests: load(&c.requests),
            throttled: load(&c.throttled),
            frames_sent: load(&c.frames_sent),
            frames_gone: load(&c.frames_gone),
            frames_ahead: load(&c.frames_ahead),
            bytes_sent: load(&c.bytes_sent),
            ring_bytes: ring.limit(),
            ring_first: ring.first(),
            ring_next: ring.next(),
        }
    }
}

/// Accepts connections until `stop` is cancelled; connection tasks end at `stop` too.
pub async fn serve(listener: TcpListener, service: Service, stop: CancellationToken) {
    let live = Arc::new(AtomicUsize::new(0));
    let mut acceptor = Acceptor::new(listener);
    let counters = &service.counters;
    while let Some((stream, peer)) =
        acceptor.next(&stop, "retransmission service: accept failed", &counters.accept_errors).await
    {
        counters.connections.fetch_add(1, Ordering::Relaxed);
        let Some(guard) = LiveGuard::enter(&live, service.settings.max_connections) else {
            counters.refused.fetch_add(1, Ordering::Relaxed);
            let reason = format!(
                "the retransmission service is at its limit of {} connections (retransmit.max_connections); retry later",
                service.settings.max_connections
            );
            let _ = stream.try_write(&control_record(RecordTag::Busy, Format::Raw, 0, reason.as_bytes()));
            continue;
        };
        let task_service = service.clone();
        let task_stop = stop.clone();
        // Every line the connection logs names the client through this span, once.
        let span = tracing::info_span!("recovery_client", %peer);
        service.tracker.spawn(
            async move {
                let _guard = guard;
                tokio::select! {
                    _ = task_stop.cancelled() => {}
                    ended = connection(stream, &task_service) => {
                        if let Err(why) = ended {
                            if mdrelay_proto::warn::allow("retransmit connection") {
                                tracing::info!(%why, "retransmission connection ended");
                            }
                        }
                    }
                }
            }
            .instrument(span),
        );
    }
}

/// Requests per second as a token bucket holding a second's worth.
struct RateLimit {
    tokens: f64,
    rate: f64,
    last: Instant,
}

impl RateLimit {
    fn new(rate: u32) -> RateLimit {
        let rate = f64::from(rate);
        RateLimit { tokens: rate, rate, last: Instant::now() }
    }

    fn admit(&mut self) -> bool {
        let now = Instant::now();
        self.tokens = (self.tokens + now.duration_since(self.last).as_secs_f64() * self.rate).min(self.rate);
        self.last = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

/// One client: handshake, then requests answered in order until it closes.
async fn connection(mut stream: TcpStream, service: &Service) -> Result<(), String> {
    let _ = stream.set_nodelay(true);
    let (format, next) = {
        let ring = lock(&service.ring);
        (ring.next().checked_sub(1).and_then(|last| ring.format_of(last)).unwrap_or(service.format), ring.next())
    };
    let hello = crate::fanout::hello(service.session, service.stream, service.guard, format, next);
    let refuse = |why: String| {
        service.counters.refused.fetch_add(1, Ordering::Relaxed);
        why
    };
    let subscribe = match crate::tcp::greet(&mut stream, &hello, HANDSHAKE_TIMEOUT, "5 s").await {
        Ok(s) => s,
        Err(why) => {
            let _ = stream.try_write(&control_record(RecordTag::Refuse, Format::Raw, 0, why.as_bytes()));
            return Err(refuse(why));
        }
    };
    if let Some(why) = crate::fanout::protection_mismatch(service.guard, subscribe.protection) {
        let _ = stream.try_write(&control_record(RecordTag::Refuse, Format::Raw, 0, why.as_bytes()));
        return Err(refuse(why));
    }
    if subscribe.purpose != Purpose::Recovery {
        let why = "this is the retransmission port; subscribe to the stream on the publisher's TCP port".to_string();
        let _ = stream.try_write(&control_record(RecordTag::Refuse, Format::Raw, 0, why.as_bytes()));
        return Err(refuse(why));
    }
    tracing::info!("retransmission client connected");
    let mut limit = RateLimit::new(service.settings.requests_per_second);
    let mut request = [0u8; RecordHeader::LEN + RetransmitRequest::PAYLOAD];
    let mut answer = Vec::with_capacity(RECORD_BYTES + RecordHeader::LEN);
    loop {
        match stream.read_exact(&mut request[..RecordHeader::LEN]).await {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(e) => return Err(format!("reading a request: {e}")),
        }
        let header = RecordHeader::parse(&request, RetransmitRequest::PAYLOAD)
            .map_err(|e| refuse(format!("bad request header: {e}")))?;
        if header.tag != RecordTag::Request || header.length as usize != RetransmitRequest::PAYLOAD {
            return Err(refuse(format!(
                "a client sends only REQUEST records of {} bytes; this one sent {:?} of {}",
                RetransmitRequest::PAYLOAD,
                header.tag,
                header.length
            )));
        }
        stream.read_exact(&mut request[RecordHeader::LEN..]).await.map_err(|e| format!("reading a request: {e}"))?;
        let asked = RetransmitRequest::parse(&header, &request[RecordHeader::LEN..])
            .map_err(|e| refuse(format!("bad request: {e}")))?;
        service.counters.requests.fetch_add(1, Ordering::Relaxed);
        answer.clear();
        if !limit.admit() {
            service.counters.throttled.fetch_add(1, Ordering::Relaxed);
            let why = format!(
                "over {} requests per second (retransmit.requests_per_second); ask again later",
                service.settings.requests_per_second
            );
            answer.extend(control_record(RecordTag::Busy, Format::Raw, asked.first, why.as_bytes()));
            write(&mut stream, &answer, service).await?;
            continue;
        }
        answer_request(service, asked, &mut stream, &mut answer).await?;
    }
}

/// Answers one admitted request, a record at a time.
async fn answer_request(
    service: &Service,
    asked: RetransmitRequest,
    stream: &mut TcpStream,
    answer: &mut Vec<u8>,
) -> Result<(), String> {
    let counters = &service.counters;
    // What is gone is said at once, however much; the range limit bounds the frames served.
    let mut lookup = lock(&service.ring).lookup(asked.first, u64::from(asked.count));
    lookup.held = lookup.held.min(u64::from(service.settings.max_range));
    if lookup.gone > 0 {
        counters.frames_gone.fetch_add(lookup.gone, Ordering::Relaxed);
        answer.extend(control_record(RecordTag::Gone, Format::Raw, asked.first, &gone_payload(lookup.gone)));
    }
    counters.frames_ahead.fetch_add(lookup.ahead, Ordering::Relaxed);
    let mut next = asked.first + lookup.gone;
    let end = next + lookup.held;
    while next < end {
        let copied = lock(&service.ring).copy_record(next, end - next, RECORD_BYTES, answer);
        match copied {
            Some(after) => {
                counters.frames_sent.fetch_add(after - next, Ordering::Relaxed);
                next = after;
            }
            None => {
                // Left the ring while the answer was written: gone after all.
                let held = lock(&service.ring).first().clamp(next, end);
                let gone = held.max(next + 1) - next;
                counters.frames_gone.fetch_add(gone, Ordering::Relaxed);
                answer.extend(control_record(RecordTag::Gone, Format::Raw, next, &gone_payload(gone)));
                next += gone;
            }
        }
        if answer.len() >= RECORD_BYTES {
            write(stream, answer, service).await?;
            answer.clear();
        }
    }
    if !answer.is_empty() {
        write(stream, answer, service).await?;
    }
    Ok(())
}

/// Writes an answer within [`WRITE_TIMEOUT`].
async fn write(stream: &mut TcpStream, bytes: &[u8], service: &Service) -> Result<(), String> {
    match tokio::time::timeout(WRITE_TIMEOUT, stream.write_all(bytes)).await {
        Err(_) => Err(format!("the client read nothing for {WRITE_TIMEOUT:?}; cut off")),
        Ok(Err(e)) => Err(format!("writing an answer: {e}")),
        Ok(Ok(())) => {
            service.counters.bytes_sent.fetch_add(bytes.len() as u64, Ordering::Relaxed);
            Ok(())
        }
    }
}
