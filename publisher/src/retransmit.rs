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
use crate::tcp::{Acceptor, Clock};
use mdrelay_codec::Format;
use mdrelay_proto::relay::recovery::{Entered, ServiceSlots};
use mdrelay_proto::relay::server::{
    ANSWER_BYTES, Answer, ClientEnd, HandshakeConfig, RequestEvent, RequestReader, ServerHandshake, TokenBucket,
    throttled,
};
use mdrelay_proto::relay::snapshot::RECORD_BYTES;
use mdrelay_proto::relay::{Purpose, RecordHeader, RecordTag, RetransmitRequest, control_record};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
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
/// The reason a publisher that keeps no state gives for not sending a snapshot.
const NO_STATE: &str = "this publisher keeps no state for snapshots (retransmit.snapshots = false)";

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
    snapshots_sent: AtomicU64,
    snapshots_refused: AtomicU64,
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
    /// Snapshots of the state sent to subscribers joining with one.
    pub snapshots_sent: u64,
    /// Snapshot requests not answered with one: no state kept, the rate limit, or the state
    /// not encodable.
    pub snapshots_refused: u64,
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
    /// The state of the frames sent, for subscribers that join with a snapshot
    /// (`retransmit.snapshots`).
    pub state: Option<crate::snapshot::SharedState>,
    /// How frames are sealed: a snapshot's are sealed as the stream's.
    pub protection: mdrelay_proto::relay::protect::ProtectionSettings,
    /// Snapshots built at once ([`crate::snapshot::SNAPSHOT_BUILDS`]).
    pub snapshot_builds: Arc<tokio::sync::Semaphore>,
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
            snapshots_sent: load(&c.snapshots_sent),
            snapshots_refused: load(&c.snapshots_refused),
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
    clock: Clock,
    /// Cancelled when the connection is made to leave for a newcomer.
    evicted: CancellationToken,
}

impl Place {
    fn now(&self) -> i64 {
        self.clock.now()
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

/// Locks the places; every update is a single insert, removal or store, so a task that
/// panicked while holding the lock left them consistent and the poison is ignored.
fn lock_slots(slots: &Slots) -> std::sync::MutexGuard<'_, ServiceSlots<CancellationToken>> {
    slots.lock().unwrap_or_else(|e| e.into_inner())
}

/// Accepts connections until `stop` is cancelled; connection tasks end at `stop` too.
pub async fn serve(listener: TcpListener, service: Service, stop: CancellationToken) {
    let clock = Clock::new();
    let grace = i64::try_from(EVICTION_GRACE.as_nanos()).unwrap_or(i64::MAX);
    let slots: Slots = Arc::new(Mutex::new(ServiceSlots::new(service.settings.max_connections, grace)));
    let mut acceptor = Acceptor::new(listener);
    let counters = &service.counters;
    while let Some((stream, peer)) =
        acceptor.next(&stop, "retransmission service: accept failed", &counters.accept_errors).await
    {
        counters.connections.fetch_add(1, Ordering::Relaxed);
        let evicted = CancellationToken::new();
        let entered = lock_slots(&slots).enter(clock.now(), evicted.clone());
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
                if mdrelay_iex::warn::allow("retransmit busy") {
                    tracing::warn!(%peer, limit = service.settings.max_connections, "retransmission client told BUSY: every place is in use");
                }
                continue;
            }
        };
        let place = Place { slots: slots.clone(), slot, clock, evicted };
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
            if mdrelay_iex::warn::allow("retransmit request timeout") {
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
            if mdrelay_iex::warn::allow("retransmit evicted") {
                tracing::info!("retransmission client made way for a newcomer (idle the longest)");
            }
            let _ = stream.try_write(&tell(RecordTag::Busy, &why));
            drop(place);
            crate::tcp::close_after_refusal(stream).await;
        }
        Ended::Refused(why) => {
            counters.refused.fetch_add(1, Ordering::Relaxed);
            if mdrelay_iex::warn::allow("retransmit connection") {
                tracing::info!(%why, "retransmission client refused");
            }
            let _ = stream.try_write(&tell(RecordTag::Refuse, &why));
            drop(place);
            crate::tcp::close_after_refusal(stream).await;
        }
        Ended::Failed(why) => {
            if mdrelay_iex::warn::allow("retransmit connection") {
                tracing::info!(%why, "retransmission connection ended");
            }
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
    let config = HandshakeConfig {
        serves: Purpose::Recovery,
        protection: service.guard.0,
        timeout: HANDSHAKE_TIMEOUT,
        setting: "5 s",
    };
    let clock = place.clock;
    let handshake = ServerHandshake::new(&hello, config, clock.now());
    let (_, answer_len) = tokio::select! {
        biased;
        _ = place.evicted.cancelled() => return Ended::Evicted,
        greeted = crate::tcp::greet(stream, handshake, &clock) => match greeted {
            Ok(greeted) => greeted,
            Err(why) => return Ended::Refused(why.to_string()),
        },
    };
    tracing::info!("retransmission client connected");
    let rate = service.settings.requests_per_second;
    let mut limit = TokenBucket::new(rate, clock.now());
    let mut answer = Vec::with_capacity(ANSWER_BYTES + RecordHeader::LEN);
    // Bytes of the connection read so far, for messages: the answer to the greeting came first.
    let mut requests =
        RequestReader::new(answer_len as u64, service.settings.idle_timeout, REQUEST_TIMEOUT, clock.now());
    place.slots().answered(place.slot, place.now());
    loop {
        let asked = match next_request(stream, &mut requests, place).await {
            Ok(asked) => asked,
            Err(ended) => return ended,
        };
        place.slots().asked(place.slot);
        service.counters.requests.fetch_add(1, Ordering::Relaxed);
        answer.clear();
        let admitted = limit.admit(clock.now());
        if !admitted {
            service.counters.throttled.fetch_add(1, Ordering::Relaxed);
        }
        let answered = match asked {
            Asked::Frames(asked) if admitted => answer_request(service, asked, stream, &mut answer).await,
            Asked::Frames(asked) => {
                answer.extend(throttled(&asked, rate));
                write(stream, &answer, service).await
            }
            Asked::Snapshot if admitted => answer_snapshot(service, stream).await,
            Asked::Snapshot => {
                service.counters.snapshots_refused.fetch_add(1, Ordering::Relaxed);
                let why = format!("snapshot not sent: over the rate limit ({rate} requests a second)");
                write(stream, &crate::snapshot::refusal_record(&why), service).await
            }
        };
        if let Err(why) = answered {
            return Ended::Failed(why);
        }
        let now = clock.now();
        requests.answered(now);
        place.slots().answered(place.slot, now);
    }
}

impl From<ClientEnd> for Ended {
    fn from(end: ClientEnd) -> Ended {
        match end {
            ClientEnd::Closed => Ended::Closed,
            ClientEnd::Idle => Ended::Idle,
            ClientEnd::RequestTimeout => Ended::RequestTimeout,
            ClientEnd::Refused(why) => Ended::Refused(why),
            ClientEnd::Failed(why) => Ended::Failed(why),
        }
    }
}

/// Reads the next request as `requests` decides (its deadlines, its checks), or the end of the
/// connection.
async fn next_request(stream: &mut TcpStream, requests: &mut RequestReader, place: &Place) -> Result<Asked, Ended> {
    loop {
        let deadline = place.clock.instant(requests.deadline().unwrap_or(i64::MAX));
        let read = tokio::select! {
            biased;
            _ = place.evicted.cancelled() => return Err(Ended::Evicted),
            _ = tokio::time::sleep_until(deadline) => None,
            read = stream.read(requests.read_buf()) => Some(read),
        };
        let event = match read {
            None => match requests.on_timeout(place.now()) {
                Some(end) => return Err(end.into()),
                None => continue,
            },
            Some(Ok(n)) => requests.received(n, place.now()),
            Some(Err(e)) => return Err(requests.read_failed(&e).into()),
        };
        match event {
            Some(RequestEvent::Request(asked)) => return Ok(Asked::Frames(asked)),
            Some(RequestEvent::Snapshot) => return Ok(Asked::Snapshot),
            Some(RequestEvent::Ended(end)) => return Err(end.into()),
            None => {}
        }
    }
}

/// What a client asked for.
enum Asked {
    /// Frames from the ring.
    Frames(RetransmitRequest),
    /// A snapshot of the state.
    Snapshot,
}

/// Answers a snapshot request with the state as of the last frame it took: `SNAPSHOT` records,
/// written as the TCP stream's are. The state is never ahead of the ring, so the frames after
/// it are there to be asked for. The copy is taken under the state's lock, and encoded on a
/// blocking thread, [`crate::snapshot::SNAPSHOT_BUILDS`] at a time.
async fn answer_snapshot(service: &Service, stream: &mut TcpStream) -> Result<(), String> {
    let counters = &service.counters;
    let Some(state) = &service.state else {
        counters.snapshots_refused.fetch_add(1, Ordering::Relaxed);
        return write(stream, &crate::snapshot::refusal_record(NO_STATE), service).await;
    };
    // Held while the snapshot is built, not while it is written: a client that does not read
    // holds its own records (until the write timeout cuts it off), not the others' turns.
    let Ok(permit) = service.snapshot_builds.acquire().await else { return Err("shutting down".into()) };
    let copy = state.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let format = {
        let ring = lock(&service.ring);
        ring.format_of(copy.as_of).unwrap_or(service.format)
    };
    let as_of = copy.as_of;
    let built = crate::snapshot::build(copy, format, &service.protection, service.session, RECORD_BYTES).await;
    drop(permit);
    match built {
        Ok((records, size)) => {
            for record in &records {
                write(stream, record, service).await?;
            }
            counters.snapshots_sent.fetch_add(1, Ordering::Relaxed);
            tracing::info!(as_of, symbols = size.symbols, frames = size.frames, bytes = size.bytes, "snapshot sent");
            Ok(())
        }
        Err(why) => refuse_snapshot(service, stream, as_of, why).await,
    }
}

/// Tells the client why no snapshot comes, and counts it.
async fn refuse_snapshot(service: &Service, stream: &mut TcpStream, as_of: u64, why: String) -> Result<(), String> {
    tracing::warn!(as_of, %why, "snapshot refused");
    service.counters.snapshots_refused.fetch_add(1, Ordering::Relaxed);
    write(stream, &crate::snapshot::refusal_record(&why), service).await
}

/// Answers one admitted request, a part at a time: the ring is locked for one part's copy.
async fn answer_request(
    service: &Service,
    asked: RetransmitRequest,
    stream: &mut TcpStream,
    answer: &mut Vec<u8>,
) -> Result<(), String> {
    let counters = &service.counters;
    let (mut plan, first) = Answer::new(&lock(&service.ring), asked, service.settings.max_range, answer);
    if plan.ahead {
        counters.requests_ahead.fetch_add(1, Ordering::Relaxed);
    }
    counters.frames_gone.fetch_add(first.gone, Ordering::Relaxed);
    let mut more = first.more;
    while more {
        let step = plan.fill(&lock(&service.ring), answer);
        counters.frames_sent.fetch_add(step.sent, Ordering::Relaxed);
        counters.frames_gone.fetch_add(step.gone, Ordering::Relaxed);
        more = step.more;
        if answer.len() >= ANSWER_BYTES {
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
