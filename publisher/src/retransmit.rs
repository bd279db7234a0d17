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
//!
//! Places go to clients that ask. A connection that asks nothing for `retransmit.idle_timeout`
//! is closed, one that begins a request and does not finish it within [`REQUEST_TIMEOUT`] too,
//! and when every place is taken a newcomer takes the place of the connection idle the longest
//! ([`ServiceSlots`], once it has been idle for [`EVICTION_GRACE`]), which is told `BUSY` with
//! the reason. So connections that complete the handshake and then say nothing can never keep a
//! subscriber from its frames; only when every place was asked from within the grace is a
//! newcomer told `BUSY` at once.

use crate::config::Retransmit;
use crate::ring::{SharedRing, lock};
use crate::tcp::Acceptor;
use mdrelay_proto::codec::Format;
use mdrelay_proto::relay::recovery::{Entered, ServiceSlots};
use mdrelay_proto::relay::{
    Purpose, RecordHeader, RecordTag, RetransmitRequest, Subscribe, control_record, gone_payload,
};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

/// Time a client has to answer the greeting.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);
/// Time a request may take to arrive whole once its first byte has: a request is 24 bytes, in
/// one segment, so only a client that stops in the middle takes longer.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);
/// A connection that has asked for nothing for this long may be made to leave for a newcomer
/// when the service is full: long enough for a client that has just connected to send its
/// first request, short enough that silent connections keep no one out for long.
pub const EVICTION_GRACE: Duration = Duration::from_secs(1);
/// Time an answer may take to write: a client that reads nothing for this long is cut off.
const WRITE_TIMEOUT: Duration = Duration::from_secs(5);
/// Payload bytes per `DATA` record of an answer.
const RECORD_BYTES: usize = 64 << 10;
/// A request record's bytes.
const REQUEST_LEN: usize = RecordHeader::LEN + RetransmitRequest::PAYLOAD;

/// Counters over every connection to the service.
#[derive(Debug, Default)]
pub struct RetransmitCounters {
    connections: AtomicU64,
    refused: AtomicU64,
    busy_at_connect: AtomicU64,
    evicted: AtomicU64,
    idle_timeouts: AtomicU64,
    request_timeouts: AtomicU64,
    requests: AtomicU64,
    throttled: AtomicU64,
    frames_sent: AtomicU64,
    frames_gone: AtomicU64,
    requests_ahead: AtomicU64,
    bytes_sent: AtomicU64,
    accept_errors: AtomicU64,
}

/// The service's figures, for the run's summary.
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct RetransmitSummary {
    /// Connections accepted.
    pub connections: u64,
    /// Connections refused (busy at connect, handshake, version, protocol violation).
    pub refused: u64,
    /// Of those, told BUSY at connect: every place was held by a client that had asked within
    /// the eviction grace.
    pub busy_at_connect: u64,
    /// Connections that made way for a newcomer while the service was full, being the one idle
    /// the longest (told BUSY).
    pub evicted: u64,
    /// Connections closed for asking nothing for `retransmit.idle_timeout`.
    pub idle_timeouts: u64,
    /// Connections closed for leaving a request unfinished past the request timeout.
    pub request_timeouts: u64,
    /// Requests received.
    pub requests: u64,
    /// Requests over the rate limit, answered BUSY.
    pub throttled: u64,
    /// Frames retransmitted.
    pub frames_sent: u64,
    /// Frames asked for that the ring no longer held (answered GONE).
    pub frames_gone: u64,
    /// Requests naming frames not sent yet (those frames are not answered); each request counts
    /// once, however many frames it names.
    pub requests_ahead: u64,
    /// Bytes of answers written.
    pub bytes_sent: u64,
    /// The ring's bound, bytes.
    pub ring_bytes: usize,
    /// Oldest and next frame of the ring at the end.
    pub ring_first: u64,
    /// See `ring_first`.
    pub ring_next: u64,
}

/// The places of connections, with a token per holder cancelled when it is made to leave.
type Slots = Arc<Mutex<ServiceSlots<CancellationToken>>>;

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
            busy_at_connect: load(&c.busy_at_connect),
            evicted: load(&c.evicted),
            idle_timeouts: load(&c.idle_timeouts),
            request_timeouts: load(&c.request_timeouts),
            requests: load(&c.requests),
            throttled: load(&c.throttled),
            frames_sent: load(&c.frames_sent),
            frames_gone: load(&c.frames_gone),
            requests_ahead: load(&c.requests_ahead),
            bytes_sent: load(&c.bytes_sent),
            ring_bytes: ring.limit(),
            ring_first: ring.first(),
            ring_next: ring.next(),
        }
    }
}

/// A connection's place, given back when its task ends, however it ends; and the service's
/// clock, on which the places' idle times are kept.
struct Place {
    slots: Slots,
    slot: u64,
    epoch: Instant,
    /// Cancelled when the connection is made to leave for a newcomer.
    evicted: CancellationToken,
}

impl Place {
    fn now(&self) -> i64 {
        nanos_since(self.epoch)
    }

    fn slots(&self) -> std::sync::MutexGuard<'_, ServiceSlots<CancellationToken>> {
        lock_slots(&self.slots)
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        let slot = self.slot;
        self.slots().leave(slot);
    }
}

fn nanos_since(epoch: Instant) -> i64 {
    i64::try_from(epoch.elapsed().as_nanos()).unwrap_or(i64::MAX)
}

/// Locks the places; every update is a single insert, removal or store, so a task that
/// panicked while holding the lock left them consistent and the poison is ignored.
fn lock_slots(slots: &Slots) -> std::sync::MutexGuard<'_, ServiceSlots<CancellationToken>> {
    slots.lock().unwrap_or_else(|e| e.into_inner())
}

/// Accepts connections until `stop` is cancelled; connection tasks end at `stop` too.
pub async fn serve(listener: TcpListener, service: Service, stop: CancellationToken) {
    let epoch = Instant::now();
    let grace = i64::try_from(EVICTION_GRACE.as_nanos()).unwrap_or(i64::MAX);
    let slots: Slots = Arc::new(Mutex::new(ServiceSlots::new(service.settings.max_connections, grace)));
    let mut acceptor = Acceptor::new(listener);
    let counters = &service.counters;
    while let Some((stream, peer)) =
        acceptor.next(&stop, "retransmission service: accept failed", &counters.accept_errors).await
    {
        counters.connections.fetch_add(1, Ordering::Relaxed);
        let evicted = CancellationToken::new();
        let entered = lock_slots(&slots).enter(nanos_since(epoch), evicted.clone());
        let slot = match entered {
            Entered::Admitted { slot, evicted: made_way } => {
                if let Some(token) = made_way {
                    counters.evicted.fetch_add(1, Ordering::Relaxed);
                    token.cancel();
                }
                slot
            }
            Entered::Full(_) => {
                counters.refused.fetch_add(1, Ordering::Relaxed);
                counters.busy_at_connect.fetch_add(1, Ordering::Relaxed);
                let reason = format!(
                    "the retransmission service is at its limit of {} connections (retransmit.max_connections), each of which asked within {EVICTION_GRACE:?}; retry later",
                    service.settings.max_connections
                );
                let _ = stream.try_write(&control_record(RecordTag::Busy, Format::Raw, 0, reason.as_bytes()));
                if mdrelay_proto::warn::allow("retransmit busy") {
                    tracing::warn!(%peer, limit = service.settings.max_connections, "retransmission client told BUSY: every place is in use");
                }
                continue;
            }
        };
        let place = Place { slots: slots.clone(), slot, epoch, evicted };
        let task_service = service.clone();
        let task_stop = stop.clone();
        // Every line the connection logs names the client through this span, once.
        let span = tracing::info_span!("recovery_client", %peer);
        service.tracker.spawn(
            async move {
                tokio::select! {
                    _ = task_stop.cancelled() => {}
                    () = client(stream, &task_service, place) => {}
                }
            }
            .instrument(span),
        );
    }
}

/// How a connection ended.
enum Ended {
    /// The client closed, between requests.
    Closed,
    /// It asked nothing for `retransmit.idle_timeout`.
    Idle,
    /// It began a request and did not finish it within [`REQUEST_TIMEOUT`].
    RequestTimeout,
    /// It made way for a newcomer.
    Evicted,
    /// It was refused: the handshake failed, or it broke the protocol. The reason is sent.
    Refused(String),
    /// The connection failed (reset, an answer not read in time).
    Failed(String),
}

/// One client from accept to close: the connection, then what it is told and counted.
async fn client(mut stream: TcpStream, service: &Service, place: Place) {
    let counters = &service.counters;
    let tell = |tag: RecordTag, why: &str| control_record(tag, Format::Raw, 0, why.as_bytes());
    match connection(&mut stream, service, &place).await {
        Ended::Closed => tracing::debug!("retransmission client closed the connection"),
        Ended::Idle => {
            counters.idle_timeouts.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(idle_timeout = ?service.settings.idle_timeout, "retransmission client idle: closed");
            let _ = stream.shutdown().await;
        }
        Ended::RequestTimeout => {
            counters.request_timeouts.fetch_add(1, Ordering::Relaxed);
            if mdrelay_proto::warn::allow("retransmit request timeout") {
                tracing::warn!(timeout = ?REQUEST_TIMEOUT, "retransmission client left a request unfinished: closed");
            }
            drop(place);
            crate::tcp::close_after_refusal(stream).await;
        }
        Ended::Evicted => {
            let why = format!(
                "the retransmission service is full (retransmit.max_connections = {}) and this connection had been idle the longest; reconnect to ask again",
                service.settings.max_connections
            );
            if mdrelay_proto::warn::allow("retransmit evicted") {
                tracing::info!("retransmission client made way for a newcomer (idle the longest)");
            }
            let _ = stream.try_write(&tell(RecordTag::Busy, &why));
            drop(place);
            crate::tcp::close_after_refusal(stream).await;
        }
        Ended::Refused(why) => {
            counters.refused.fetch_add(1, Ordering::Relaxed);
            if mdrelay_proto::warn::allow("retransmit connection") {
                tracing::info!(%why, "retransmission client refused");
            }
            let _ = stream.try_write(&tell(RecordTag::Refuse, &why));
            drop(place);
            crate::tcp::close_after_refusal(stream).await;
        }
        Ended::Failed(why) => {
            if mdrelay_proto::warn::allow("retransmit connection") {
                tracing::info!(%why, "retransmission connection ended");
            }
        }
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

/// One client: handshake, then requests answered in order until it closes or has to go.
async fn connection(stream: &mut TcpStream, service: &Service, place: &Place) -> Ended {
    let _ = stream.set_nodelay(true);
    let (format, next) = {
        let ring = lock(&service.ring);
        (ring.next().checked_sub(1).and_then(|last| ring.format_of(last)).unwrap_or(service.format), ring.next())
    };
    let hello = crate::fanout::hello(service.session, service.stream, service.guard, format, next);
    let subscribe = tokio::select! {
        biased;
        _ = place.evicted.cancelled() => return Ended::Evicted,
        greeted = crate::tcp::greet(stream, &hello, HANDSHAKE_TIMEOUT, "5 s") => match greeted {
            Ok(s) => s,
            Err(why) => return Ended::Refused(why),
        },
    };
    if let Some(why) = crate::fanout::protection_mismatch(service.guard, subscribe.protection) {
        return Ended::Refused(why);
    }
    if subscribe.purpose != Purpose::Recovery {
        return Ended::Refused(
            "this is the retransmission port; subscribe to the stream on the publisher's TCP port".into(),
        );
    }
    tracing::info!("retransmission client connected");
    let mut limit = RateLimit::new(service.settings.requests_per_second);
    let mut answer = Vec::with_capacity(RECORD_BYTES + RecordHeader::LEN);
    // Bytes of the connection read so far, for messages: the answer to the greeting came first.
    let mut offset = Subscribe::len_of(subscribe.protocol_version) as u64;
    place.slots().answered(place.slot, place.now());
    loop {
        let asked = match next_request(stream, service, place, offset).await {
            Ok(asked) => asked,
            Err(ended) => return ended,
        };
        offset += REQUEST_LEN as u64;
        place.slots().asked(place.slot);
        service.counters.requests.fetch_add(1, Ordering::Relaxed);
        answer.clear();
        let answered = if limit.admit() {
            answer_request(service, asked, stream, &mut answer).await
        } else {
            service.counters.throttled.fetch_add(1, Ordering::Relaxed);
            let why = format!(
                "over {} requests per second (retransmit.requests_per_second); ask again later",
                service.settings.requests_per_second
            );
            answer.extend(control_record(RecordTag::Busy, Format::Raw, asked.first, why.as_bytes()));
            write(stream, &answer, service).await
        };
        if let Err(why) = answered {
            return Ended::Failed(why);
        }
        place.slots().answered(place.slot, place.now());
    }
}

/// Reads the next request: it must begin within the idle timeout (counted from the last answer)
/// and, once begun, arrive whole within [`REQUEST_TIMEOUT`]. A record that is not a request is
/// refused as soon as its header is in, naming the byte of the connection (`offset`: where it
/// starts) that is wrong.
async fn next_request(
    stream: &mut TcpStream,
    service: &Service,
    place: &Place,
    offset: u64,
) -> Result<RetransmitRequest, Ended> {
    let mut request = [0u8; REQUEST_LEN];
    let mut have = 0;
    let idle_until = tokio::time::Instant::now() + service.settings.idle_timeout;
    let mut whole_by = None;
    while have < REQUEST_LEN {
        let deadline = whole_by.unwrap_or(idle_until);
        let read = tokio::select! {
            biased;
            _ = place.evicted.cancelled() => return Err(Ended::Evicted),
            _ = tokio::time::sleep_until(deadline) => {
                return Err(if whole_by.is_some() { Ended::RequestTimeout } else { Ended::Idle });
            }
            read = stream.read(&mut request[have..]) => read,
        };
        match read {
            Ok(0) if have == 0 => return Err(Ended::Closed),
            Ok(0) => {
                return Err(Ended::Failed(format!(
                    "the client closed inside a request, at byte {}",
                    offset + have as u64
                )));
            }
            Ok(n) => {
                whole_by.get_or_insert_with(|| tokio::time::Instant::now() + REQUEST_TIMEOUT);
                let header_was_in = have >= RecordHeader::LEN;
                have += n;
                if !header_was_in && have >= RecordHeader::LEN {
                    check_header(&request, offset)?;
                }
            }
            Err(e) => return Err(Ended::Failed(format!("reading a request at byte {}: {e}", offset + have as u64))),
        }
    }
    let header = check_header(&request, offset)?;
    RetransmitRequest::parse(&header, &request[RecordHeader::LEN..]).map_err(|e| {
        let at = offset + (RecordHeader::LEN + e.offset) as u64;
        Ended::Refused(format!("bad request at byte {at}: {}", e.what))
    })
}

/// The header of a request record, or the refusal of anything else.
fn check_header(request: &[u8], offset: u64) -> Result<RecordHeader, Ended> {
    // Nothing is allocated by the length: a request's size is fixed, and checked here.
    let header = RecordHeader::parse(request, u32::MAX as usize)
        .map_err(|e| Ended::Refused(format!("bad request at byte {}: {}", offset + e.offset as u64, e.what)))?;
    if header.tag != RecordTag::Request || header.length as usize != RetransmitRequest::PAYLOAD {
        return Err(Ended::Refused(format!(
            "a client sends only REQUEST records of {} bytes; this one sent {:?} of {} at byte {offset}",
            RetransmitRequest::PAYLOAD,
            header.tag,
            header.length
        )));
    }
    Ok(header)
}

/// Answers one admitted request, a record at a time.
async fn answer_request(
    service: &Service,
    asked: RetransmitRequest,
    stream: &mut TcpStream,
    answer: &mut Vec<u8>,
) -> Result<(), String> {
    let counters = &service.counters;
    let count = u64::from(asked.count);
    // What is gone is said at once, however much; the range limit bounds the frames served.
    let mut lookup = lock(&service.ring).lookup(asked.first, count);
    // The frames after those gone and held are not sent yet, also those past the end of the
    // numbering, where the range's end saturates.
    if count > lookup.gone + lookup.held {
        counters.requests_ahead.fetch_add(1, Ordering::Relaxed);
    }
    lookup.held = lookup.held.min(u64::from(service.settings.max_range));
    if lookup.gone > 0 {
        counters.frames_gone.fetch_add(lookup.gone, Ordering::Relaxed);
        answer.extend(control_record(RecordTag::Gone, Format::Raw, asked.first, &gone_payload(lookup.gone)));
    }
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
