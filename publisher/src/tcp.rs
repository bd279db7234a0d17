//! The TCP server's tasks: accepting, the handshake, and one task per subscriber that writes its
//! queue to the socket and reads its echoes.
//!
//! - A connection counts against `tcp.max_connections` from accept to close; beyond it, the
//!   peer is greeted and told BUSY (retry later) at once, without a task.
//! - The handshake has `tcp.handshake_timeout`; until it completes, the connection has no queue
//!   and gets no frames, so a silent or hostile peer can neither hold the stream back nor make
//!   the publisher keep records for it.
//! - After it, the subscriber joins the shared queue of the [`Fanout`](crate::fanout::Fanout)
//!   from the next record on. The task writes records with vectored writes straight from the
//!   shared buffers (no per-connection copy), a FORMAT record before the first record and before
//!   each record of a new format, and after END shuts down its side and reads the last echoes
//!   until the subscriber closes (or the drain time runs out).
//! - A subscriber a whole queue behind is slow: under `drop` it skips ahead (the frames skipped
//!   are counted for it), under `disconnect` it is reset (SO_LINGER 0): its socket is gone at
//!   once, with whatever was queued in the kernel.
//! - A subscriber that resumes is replayed the frames it missed from the frame ring, a chunk
//!   of at most [`REPLAY_CHUNK`] bytes at a time. A chunk is built only when the replay budget
//!   (`tcp.replay_bytes`, over every resuming subscriber) has room for it, and its bytes go back
//!   when the socket has taken it all: subscribers that resume and never read hold the budget,
//!   not a chunk each. One that leaves a chunk untaken `tcp.replay_timeout` is cut off as slow.
//! - Replays take turns, one chunk each, and the runtime runs what else is ready (the live
//!   records of other subscribers) before the turn passes on: dozens of replays add one chunk's
//!   work, not dozens, before a live record is written.
//! - Accept errors (out of file descriptors, say) back off from 1 ms to 1 s.

use crate::config::{SlowPolicy, Tcp};
use crate::fanout::{HotSocketGuard, ReplayShare, Shared, SubscriberStats};
use crate::ring::{SharedRing, lock};
use crate::stats::Echoes;
use bytes::{Buf, Bytes};
use mdrelay_proto::relay::echo::EchoGate;
use mdrelay_proto::relay::server::{
    EchoReader, FeedStep, HandoverTaken, HandshakeConfig, Join, Refusal, ReplayCursor, ReplayFill, ServerHandshake,
    SubscriberFeed, busy_greeting, plan_join, refusal_record,
};
use mdrelay_proto::relay::snapshot::RECORD_BYTES;
use mdrelay_proto::relay::{Purpose, Resume, Subscribe};
use std::collections::VecDeque;
use std::io::{self, IoSlice};
use std::net::SocketAddr;
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::OwnedSemaphorePermit;
use tokio::sync::broadcast::{self, error::RecvError, error::TryRecvError};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

/// Records taken from the queue for one vectored write.
const BATCH: usize = 64;
/// How often a subscriber whose socket is full is checked for having fallen a queue behind.
const LAG_CHECK: Duration = Duration::from_millis(50);

/// Everything a connection task needs.
#[derive(Clone)]
pub struct Server {
    /// Shared with the hot path.
    pub shared: Arc<Shared>,
    /// Echo checks and round trips.
    pub echoes: Arc<Echoes>,
    /// The settings.
    pub tcp: Tcp,
    /// Cancelled to cut every connection off at once (the end of the drain time).
    pub abort: CancellationToken,
    /// Tracks connection tasks, for shutdown.
    pub tracker: TaskTracker,
    /// The last frames, for subscribers that resume.
    pub ring: Option<SharedRing>,
    /// The state of the frames published, for subscribers that join with a snapshot.
    pub state: Option<crate::snapshot::SharedState>,
    /// How frames are sealed: a snapshot's are sealed as the stream's.
    pub protection: mdrelay_proto::relay::protect::ProtectionSettings,
}

/// Accepts connections until `stop` is cancelled.
pub async fn serve(listener: TcpListener, server: Server, stop: CancellationToken) {
    let live = Arc::new(AtomicUsize::new(0));
    let mut acceptor = Acceptor::new(listener);
    let counters = &server.shared.counters;
    while let Some((stream, peer)) = acceptor.next(&stop, "accept failed", &counters.accept_errors).await {
        counters.connections.fetch_add(1, Ordering::Relaxed);
        let Some(live) = LiveGuard::enter(&live, server.tcp.max_connections) else {
            busy(&stream, peer, &server);
            continue;
        };
        let server2 = server.clone();
        // Every line the connection logs names its peer through this span, once.
        let span = tracing::info_span!("subscriber", %peer);
        server.tracker.spawn(
            async move {
                let _live = live;
                connection(stream, peer, server2).await;
            }
            .instrument(span),
        );
    }
}

/// Accepts from a listener, backing off from 1 ms to 1 s after an accept error (out of file
/// descriptors, say) instead of spinning on it.
pub struct Acceptor {
    listener: TcpListener,
    backoff: Duration,
}

impl Acceptor {
    /// Accepts from `listener`.
    pub fn new(listener: TcpListener) -> Acceptor {
        Acceptor { listener, backoff: Duration::from_millis(1) }
    }

    /// The next connection; `None` once `stop` is cancelled. Errors are counted in `errors`
    /// and logged as `what` (within the warning budget).
    pub async fn next(
        &mut self,
        stop: &CancellationToken,
        what: &'static str,
        errors: &AtomicU64,
    ) -> Option<(TcpStream, SocketAddr)> {
        loop {
            let accepted = tokio::select! {
                _ = stop.cancelled() => return None,
                accepted = self.listener.accept() => accepted,
            };
            match accepted {
                Ok(a) => {
                    self.backoff = Duration::from_millis(1);
                    return Some(a);
                }
                Err(error) => {
                    errors.fetch_add(1, Ordering::Relaxed);
                    if mdrelay_iex::warn::allow(what) {
                        tracing::warn!(%error, retry_in = ?self.backoff, "{what}");
                    }
                    tokio::select! {
                        _ = stop.cancelled() => return None,
                        _ = tokio::time::sleep(self.backoff) => {}
                    }
                    self.backoff = (self.backoff * 2).min(Duration::from_secs(1));
                }
            }
        }
    }
}

/// A place among at most a limit of live connections, given back when the connection's task
/// ends, however it ends.
pub struct LiveGuard(Arc<AtomicUsize>);

impl LiveGuard {
    /// A place in `live` if fewer than `limit` are taken.
    pub fn enter(live: &Arc<AtomicUsize>, limit: usize) -> Option<LiveGuard> {
        if live.load(Ordering::Relaxed) >= limit {
            return None;
        }
        live.fetch_add(1, Ordering::Relaxed);
        Some(LiveGuard(live.clone()))
    }
}

impl Drop for LiveGuard {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Greets and turns away a connection over the limit, without waiting for anything: what does
/// not fit the socket's empty send buffer at once is not sent.
fn busy(stream: &TcpStream, peer: SocketAddr, server: &Server) {
    server.shared.counters.busy.fetch_add(1, Ordering::Relaxed);
    let shared = &server.shared;
    let position = &shared.position;
    let reason = format!(
        "this publisher is at its limit of {} connections (tcp.max_connections); retry later",
        server.tcp.max_connections
    );
    let hello =
        crate::fanout::hello(shared.session, shared.stream, shared.guard, position.format(), position.next_sequence());
    let _ = stream.try_write(&busy_greeting(&hello, &reason));
    if mdrelay_iex::warn::allow("busy") {
        tracing::warn!(%peer, limit = server.tcp.max_connections, "connection refused: at the connection limit");
    }
}

/// Cuts the connection off now: a reset, not an orderly close, so nothing queued in the kernel
/// is delivered after the decision.
fn reset(stream: TcpStream) {
    let _ = socket2::SockRef::from(&stream).set_linger(Some(Duration::ZERO));
    drop(stream);
}

/// One connection: handshake, then the subscriber's records out and echoes in.
async fn connection(mut stream: TcpStream, peer: SocketAddr, server: Server) {
    let stats = SubscriberStats::new(peer.to_string(), server.shared.counters.dropped_frames.clone());
    server.shared.summaries.keep(stats.clone());
    let _ = stream.set_nodelay(true);
    let subscribe = tokio::select! {
        _ = server.abort.cancelled() => return reset(stream),
        answer = handshake(&mut stream, &server) => answer,
    };
    let subscribe = match subscribe {
        Ok(s) => s,
        Err(reason) => {
            server.shared.counters.handshake_failures.fetch_add(1, Ordering::Relaxed);
            if mdrelay_iex::warn::allow("handshake") {
                tracing::warn!(%reason, "subscriber refused");
            }
            let _ = stream.try_write(&refusal_record(server.shared.position.format(), &reason.to_string()));
            stats.refuse(reason.to_string());
            close_after_refusal(stream).await;
            return;
        }
    };
    let kill = server.abort.child_token();
    let mut out = match (subscribe.snapshot, subscribe.resume) {
        (true, Resume::Live) => join_with_snapshot(&server).await,
        _ => join(&server, subscribe.resume),
    };
    match out.replay.map(|r| r.range()) {
        Some((from, to)) => tracing::info!(echo = subscribe.echo, from, to, "subscriber admitted, resuming"),
        None => tracing::info!(echo = subscribe.echo, "subscriber admitted"),
    }
    let _admitted = Admitted::enter(&server.shared, &stats);
    if server.shared.hot_writes {
        // A duplicate descriptor of the same socket: none (too many open files) only means
        // this subscriber's task writes every record itself.
        out.hot = stream.as_fd().try_clone_to_owned().ok().map(|fd| server.shared.hot_socket(fd.into()));
    }
    let mut incoming = Incoming { echoes: EchoReader::new(), gate: EchoGate::default() };
    let link = Link { stream: &stream, server: &server, stats: &stats, kill: &kill };
    let ended = subscriber(link, &mut out, &mut incoming).await;
    // The hot path's duplicate is closed before the connection is closed or reset; what it
    // wrote counts as sent, for the frames a cut-off subscriber is said to have lost.
    if let Some(hot) = out.hot.take() {
        out.feed.delivered_until(hot.written_until());
    }
    match ended {
        Ok(Ended::Stream) => {}
        Ok(Ended::Killed) => {
            // Cut off at the end of the drain time: what it was never given is dropped for it.
            if !stats.disconnected_slow()
                && let Some(next) = out.feed.next()
            {
                stats.dropped(server.shared.position.next_sequence().saturating_sub(next));
            }
            reset(stream)
        }
        Ok(Ended::PeerClosed) => tracing::info!("subscriber closed the connection"),
        Err(error) => tracing::info!(%error, "subscriber connection ended"),
    }
}

/// An admitted subscriber, counted as connected until its task ends, however it ends.
struct Admitted<'a>(&'a Shared, &'a SubscriberStats);

impl<'a> Admitted<'a> {
    fn enter(shared: &'a Shared, stats: &'a SubscriberStats) -> Admitted<'a> {
        shared.counters.subscribers.fetch_add(1, Ordering::Relaxed);
        stats.set_connected(true);
        Admitted(shared, stats)
    }
}

impl Drop for Admitted<'_> {
    fn drop(&mut self) {
        self.0.counters.subscribers.fetch_sub(1, Ordering::Relaxed);
        self.1.set_connected(false);
    }
}

/// Closes a refused connection so that the peer can read the reason: closing with bytes of its
/// unread (the rest of whatever it sent) would reset the connection, and a reset discards the
/// reason before the peer reads it. So our side is shut down first, and what the peer still
/// sends is read and dropped until it closes, for a second and 64 KiB at most.
pub(crate) async fn close_after_refusal(mut stream: TcpStream) {
    let _ = stream.shutdown().await;
    let drain = async {
        let mut sink = [0u8; 4096];
        let mut left = 64usize << 10;
        while left > 0 {
            match stream.read(&mut sink).await {
                Ok(0) | Err(_) => return,
                Ok(n) => left = left.saturating_sub(n),
            }
        }
    };
    let _ = tokio::time::timeout(Duration::from_secs(1), drain).await;
}

/// Greets the peer and reads its answer within the handshake timeout; the reason to refuse it
/// otherwise.
async fn handshake(stream: &mut TcpStream, server: &Server) -> Result<Subscribe, Refusal> {
    let shared = &server.shared;
    let position = &shared.position;
    let hello =
        crate::fanout::hello(shared.session, shared.stream, shared.guard, position.format(), position.next_sequence());
    let config = HandshakeConfig {
        serves: Purpose::Stream,
        protection: shared.guard.0,
        timeout: server.tcp.handshake_timeout,
        setting: "tcp.handshake_timeout",
    };
    let clock = Clock::new();
    greet(stream, ServerHandshake::new(&hello, config, clock.now()), &clock).await.map(|(subscribe, _)| subscribe)
}

/// The drivers' monotonic clock for the server machines: ns since it was made.
#[derive(Clone, Copy, Debug)]
pub struct Clock {
    epoch: Instant,
}

impl Default for Clock {
    fn default() -> Clock {
        Clock::new()
    }
}

impl Clock {
    /// A clock starting now.
    pub fn new() -> Clock {
        Clock { epoch: Instant::now() }
    }

    /// Now, ns since the start.
    pub fn now(&self) -> i64 {
        mdrelay_proto::backoff::duration_ns(self.epoch.elapsed())
    }

    /// The instant `ns` after the start (far in the future when out of range).
    pub fn instant(&self, ns: i64) -> Instant {
        let far = self.epoch + Duration::from_secs(86_400 * 365);
        self.epoch.checked_add(Duration::from_nanos(ns.max(0).unsigned_abs())).unwrap_or(far)
    }
}

/// Runs `handshake` on `stream`: writes the greeting and reads the answer until the machine
/// decides, or its deadline passes. The answer and the bytes it took, or the refusal.
pub async fn greet(
    stream: &mut TcpStream,
    mut handshake: ServerHandshake,
    clock: &Clock,
) -> Result<(Subscribe, usize), Refusal> {
    let deadline = handshake.deadline().unwrap_or(i64::MAX);
    let exchange = async {
        let greeting = handshake.transmit();
        let len = greeting.len();
        stream.write_all(greeting).await?;
        handshake.transmitted(len);
        while handshake.outcome().is_none() {
            let n = stream.read(handshake.read_buf()).await?;
            handshake.received(n);
        }
        Ok::<_, io::Error>(())
    };
    match tokio::time::timeout_at(clock.instant(deadline), exchange).await {
        Err(_) => handshake.on_timeout(clock.now().max(deadline)),
        Ok(Err(e)) => handshake.failed(&e),
        Ok(Ok(())) => {}
    }
    let len = handshake.answer_len();
    match handshake.take_outcome() {
        Some(Ok(subscribe)) => Ok((subscribe, len)),
        Some(Err(refusal)) => Err(refusal),
        None => Err(Refusal::Closed("the handshake ended undecided".into())),
    }
}

/// Joins the fanout from the next record on (once the stream has ended there is nothing to join,
/// and the subscriber gets END alone). A subscriber that resumes from a frame joins under the
/// ring's lock, with the replay it is owed: the frames from the one it asked for (or the oldest
/// still held) up to the ring's mark, the first frame not yet handed to the fanout; records of
/// the fanout that start below the mark are skipped, as the replay covers them.
fn join(server: &Server, resume: Resume) -> Outgoing {
    let (Resume::From(from), Some(ring)) = (resume, &server.ring) else {
        return subscribed(server);
    };
    let held = lock(ring);
    let mut out = subscribed(server);
    let resumed = resuming(server, &held, from);
    drop(held);
    if let Some(resumed) = resumed {
        resumed.start(&mut out, server);
    }
    out
}

/// A subscriber's place in the fanout from the next record on.
fn subscribed(server: &Server) -> Outgoing {
    let mut out = Outgoing::new(None, server.tcp.slow_subscriber);
    out.records = server.shared.feed.upgrade().map(|feed| feed.subscribe());
    out
}

/// A resume from frame `from` planned under the ring's lock (`held`): `None` when the frame was
/// not sent yet (the subscriber's numbers are not this publisher's), and it is served live.
fn resuming(server: &Server, held: &mdrelay_proto::relay::FrameRing, from: u64) -> Option<Resumed> {
    let plan = plan_join(held, from, server.shared.position.format());
    let Some((feed, format_record)) = SubscriberFeed::resuming(&plan) else {
        if let Join::Ahead { from, mark } = plan {
            tracing::warn!(from, next = mark, "resume from a frame not sent yet; served live instead");
        }
        return None;
    };
    Some(Resumed { feed, format_record, plan })
}

/// A resume planned: the `FORMAT` record naming the frame asked for, the feed after it, and the
/// replay owed.
struct Resumed {
    feed: SubscriberFeed,
    format_record: Vec<u8>,
    plan: Join,
}

impl Resumed {
    /// Starts `out` on the resume. The first frame owed is the one asked for: frames the ring
    /// no longer holds count as lost.
    fn start(self, out: &mut Outgoing, server: &Server) {
        server.shared.counters.replays.fetch_add(1, Ordering::Relaxed);
        out.batch.push_back(Bytes::from(self.format_record));
        out.feed = self.feed;
        out.replay = ReplayCursor::of(&self.plan);
    }
}

/// Joins with a snapshot: a copy of the state, taken under the ring's lock, then the stream from
/// the frame after it as a resume from there (the ring replays what was published since the
/// state's frame; the state is never ahead of the ring's mark). The snapshot is written on a
/// blocking thread, so other subscribers' writes do not wait for it. Without state or a ring,
/// should the ring no longer hold the frame after the state, or should the snapshot not encode,
/// the subscriber joins live without one, which its client reports.
async fn join_with_snapshot(server: &Server) -> Outgoing {
    let (Some(state), Some(ring)) = (&server.state, &server.ring) else {
        return join(server, Resume::Live);
    };
    let (mut out, resumed, copy) = {
        let held = lock(ring);
        // The hot thread never waits for the ring's lock while it holds the state's.
        let copy = state.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let out = subscribed(server);
        match resuming(server, &held, copy.as_of.saturating_add(1)) {
            Some(resumed) if resumed.plan.gone() == 0 => (out, resumed, copy),
            _ => {
                tracing::warn!(
                    as_of = copy.as_of,
                    "the ring no longer holds the frames after the state; joined live without a snapshot"
                );
                return out;
            }
        }
    };
    let (format, session, as_of) = (server.shared.position.format(), server.shared.session, copy.as_of);
    let started = std::time::Instant::now();
    match crate::snapshot::build(copy, format, &server.protection, session, RECORD_BYTES).await {
        Ok((records, size)) => {
            tracing::info!(
                as_of,
                symbols = size.symbols,
                messages = size.messages,
                frames = size.frames,
                bytes = size.bytes,
                took = ?started.elapsed(),
                "snapshot sent"
            );
            out.batch.extend(records.into_iter().map(Bytes::from));
            resumed.start(&mut out, server);
        }
        Err(why) => tracing::warn!(as_of, %why, "joined live without a snapshot"),
    }
    out
}

/// Bytes of one replay chunk, record headers included: what a resuming subscriber is given from
/// the ring per turn, and what it holds of the replay budget (unless one frame is larger).
pub const REPLAY_CHUNK: usize = 64 << 10;

/// The memory of one replay chunk: its buffer and its share of the budget, given back when the
/// last record of the chunk has been written (or the connection is gone). The buffer goes back
/// to the spares, to be filled again.
struct ChunkOwner {
    buf: Vec<u8>,
    _permit: OwnedSemaphorePermit,
    spares: Arc<Mutex<Vec<Vec<u8>>>>,
}

impl AsRef<[u8]> for ChunkOwner {
    fn as_ref(&self) -> &[u8] {
        &self.buf
    }
}

impl Drop for ChunkOwner {
    fn drop(&mut self) {
        // Only chunk-sized buffers: one a larger frame needed is let go.
        if self.buf.capacity() == REPLAY_CHUNK {
            let mut buf = std::mem::take(&mut self.buf);
            buf.clear();
            self.spares.lock().unwrap_or_else(|e| e.into_inner()).push(buf);
        }
    }
}

/// What building a replay chunk came to, for the driver.
enum Chunk {
    /// Records were taken for writing.
    Built,
    /// The next frame alone needs this many bytes, more than the room given.
    Needs(usize),
    /// Nothing is left to replay.
    Done,
}

/// How a subscriber's connection ended.
enum Ended {
    /// The stream ended and the subscriber got all that was queued, and END.
    Stream,
    /// Cut off (slow, or the drain time ran out).
    Killed,
    /// The subscriber went away.
    PeerClosed,
}

/// The subscriber's side of the fanout: its place in the shared queue, and the records taken
/// from it.
struct Outgoing {
    /// `None` when the stream had ended before the subscriber joined.
    records: Option<broadcast::Receiver<Bytes>>,
    policy: SlowPolicy,
    /// Records being written: the front may be partly written.
    batch: VecDeque<Bytes>,
    /// What it has been sent: formats, the next frame, the hand-over from the replay.
    feed: SubscriberFeed,
    /// Frames still to replay from the ring, for a subscriber that resumed.
    replay: Option<ReplayCursor>,
    /// When the replay chunk in `batch` must have been taken whole, while it has not.
    replay_deadline: Option<Instant>,
    /// The socket as the hot path may write to it while this subscriber is current
    /// (`tcp.hot_writes`).
    hot: Option<HotSocketGuard>,
}

/// What came from the shared queue.
enum Taken {
    /// Records were taken (or nothing was ready).
    Some,
    /// The subscriber was a whole queue behind and the policy is to cut it off.
    CutOff,
    /// The queue is closed and drained: the stream is over.
    Closed,
}

impl Outgoing {
    /// A subscriber's side of the queue, from `records` on (none: the stream has ended).
    fn new(records: Option<broadcast::Receiver<Bytes>>, policy: SlowPolicy) -> Outgoing {
        Outgoing {
            records,
            policy,
            batch: VecDeque::new(),
            feed: SubscriberFeed::live(),
            replay: None,
            replay_deadline: None,
            hot: None,
        }
    }

    /// Takes `record` for writing (a control record, a DATA record, or a run of consecutive DATA
    /// records of one format from the fanout): a FORMAT record first when it is the first record
    /// or the first of a new format; frames skipped before it (the subscriber fell a whole queue
    /// behind) are counted as dropped for it.
    /// A DATA record the hot path wrote whole is only accounted; one it wrote in part is
    /// written from where it stopped.
    fn take(&mut self, mut record: Bytes, stats: &SubscriberStats) {
        if let Some(hot) = &self.hot {
            self.feed.delivered_until(hot.written_until());
        }
        match self.feed.take(&record, self.replay.is_some()) {
            FeedStep::Skip => return,
            FeedStep::Data { format_record, dropped, first } => {
                stats.started_at(first);
                if dropped > 0 {
                    stats.dropped(dropped);
                }
                let next = self.feed.next().unwrap_or(first);
                match self.hot.as_ref().map(|hot| hot.taken(first, next)) {
                    Some(HandoverTaken::Written) => return,
                    Some(HandoverTaken::From(written)) => record.advance(written.min(record.len())),
                    Some(HandoverTaken::Own) | None => {
                        if let Some(announce) = format_record {
                            self.batch.push_back(Bytes::from(announce));
                        }
                    }
                }
            }
            FeedStep::End { dropped } => {
                if dropped > 0 {
                    stats.dropped(dropped);
                }
                if let Some(hot) = &self.hot {
                    hot.close();
                }
            }
            FeedStep::Other => {
                if let Some(hot) = &self.hot {
                    hot.close();
                }
            }
        }
        self.batch.push_back(record);
    }

    /// Everything taken is written, nothing is replayed: the hot path may write the next record
    /// this subscriber is owed.
    fn open_to_hot_writes(&self) {
        if let (Some(hot), Some(format), Some(next), false) =
            (&self.hot, self.feed.format(), self.feed.next(), self.feed.ended() || self.replaying())
        {
            hot.open(format, next);
        }
    }

    /// Whether frames are still owed from the ring.
    fn replaying(&self) -> bool {
        self.replay.is_some()
    }

    /// Takes the next replay records from the ring into one chunk of at most `permit`'s bytes
    /// (headers included), a buffer from `share`'s spares; frames that left the ring since the
    /// subscriber joined are skipped (and counted as dropped for it). A first frame larger than
    /// the permit is taken alone when the permit is the whole budget, else its need is returned.
    fn build_replay_chunk(
        &mut self,
        ring: &SharedRing,
        permit: OwnedSemaphorePermit,
        share: &ReplayShare,
        stats: &SubscriberStats,
    ) -> Chunk {
        let Some(replay) = &mut self.replay else { return Chunk::Done };
        let room = permit.num_permits();
        let filled = {
            let held = lock(ring);
            replay.fill(&held, room, room >= share.budget_bytes, |size| {
                let spare =
                    (size <= REPLAY_CHUNK).then(|| share.spares.lock().unwrap_or_else(|e| e.into_inner()).pop());
                spare.flatten().unwrap_or_else(|| Vec::with_capacity(size.max(REPLAY_CHUNK)))
            })
        };
        let (buf, records) = match filled {
            ReplayFill::Needs(need) => return Chunk::Needs(need),
            ReplayFill::Done => {
                // Nothing left: replayed, or gone from the ring (the gap is counted at the next
                // record taken).
                self.replay = None;
                return Chunk::Done;
            }
            ReplayFill::Built { buf, records } => (buf, records),
        };
        let finished = replay.is_finished();
        let chunk = Bytes::from_owner(ChunkOwner { buf, _permit: permit, spares: share.spares.clone() });
        for range in records {
            self.take(chunk.slice(range), stats);
        }
        if finished {
            self.replay = None;
        }
        Chunk::Built
    }

    /// Waits for the next record (cancel-safe) and takes it with those ready behind it.
    async fn next_records(&mut self, stats: &SubscriberStats) -> Taken {
        let Some(records) = &mut self.records else { return Taken::Closed };
        let first = records.recv().await;
        let mut taken = match first {
            Ok(record) => {
                self.take(record, stats);
                Taken::Some
            }
            Err(RecvError::Lagged(_)) => self.lagged(),
            Err(RecvError::Closed) => return Taken::Closed,
        };
        while matches!(taken, Taken::Some) && self.batch.len() < BATCH {
            let Some(records) = &mut self.records else { break };
            match records.try_recv() {
                Ok(record) => self.take(record, stats),
                Err(TryRecvError::Lagged(_)) => taken = self.lagged(),
                Err(TryRecvError::Empty | TryRecvError::Closed) => break,
            }
        }
        if let Some(records) = &self.records {
            stats.set_queued(records.len());
        }
        taken
    }

    /// Whether records this subscriber has not read were overwritten: it is more than a whole
    /// queue (`queue` records, rounded up to a power of two as the ring is) behind.
    fn behind_by_a_queue(&self, queue: usize) -> bool {
        self.records.as_ref().is_some_and(|r| r.len() > queue.next_power_of_two())
    }

    /// The subscriber fell a whole queue behind: under `disconnect` it is cut off; otherwise it
    /// goes on from the oldest record still queued (the gap is counted when that record comes).
    fn lagged(&mut self) -> Taken {
        match self.policy {
            SlowPolicy::Disconnect => Taken::CutOff,
            SlowPolicy::Drop | SlowPolicy::Block => Taken::Some,
        }
    }

    /// Writes what the socket takes now.
    fn write_some(&mut self, stream: &TcpStream) -> io::Result<()> {
        loop {
            if self.batch.is_empty() {
                return Ok(());
            }
            let mut slices = [IoSlice::new(&[]); BATCH];
            let n = self.batch.len().min(BATCH);
            for (slot, bytes) in slices.iter_mut().zip(&self.batch) {
                *slot = IoSlice::new(bytes);
            }
            let mut written = match stream.try_write_vectored(&slices[..n]) {
                Ok(0) => return Err(io::Error::new(io::ErrorKind::WriteZero, "the socket took no bytes")),
                Ok(w) => w,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) => return Err(e),
            };
            while written > 0 {
                let Some(front) = self.batch.front_mut() else { break };
                if written >= front.len() {
                    written -= front.len();
                    self.batch.pop_front();
                } else {
                    front.advance(written);
                    written = 0;
                }
            }
        }
    }
}

/// What the subscriber sends: echo records only.
struct Incoming {
    echoes: EchoReader,
    gate: EchoGate,
}

impl Incoming {
    /// Reads what the socket has; `Ok(false)` when the peer closed. Checks every whole ECHO record;
    /// anything else is a protocol violation.
    fn read_some(&mut self, stream: &TcpStream, server: &Server, stats: &SubscriberStats) -> io::Result<bool> {
        let mut chunk = [0u8; 4096];
        // At most 16 chunks per call, so a subscriber that floods us cannot keep this task from
        // yielding; the socket stays readable and the rest is read at the next turn. Each chunk
        // is parsed before the next is read: what is kept is a partial record at most.
        for _ in 0..16 {
            match stream.try_read(&mut chunk) {
                Ok(0) => return Ok(false),
                Ok(n) => self.take_echoes(&chunk[..n], server, stats)?,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(true),
                Err(e) => return Err(e),
            }
        }
        Ok(true)
    }

    /// Checks and records every whole ECHO record `bytes` complete.
    fn take_echoes(&mut self, bytes: &[u8], server: &Server, stats: &SubscriberStats) -> io::Result<()> {
        let gate = &mut self.gate;
        self.echoes
            .received(bytes, |echo| match gate.admit(&server.echoes.sent, &echo) {
                Ok(()) => server.echoes.round_trips.record(echo.publish_time),
                Err(why) => {
                    stats.echo_rejected();
                    server.echoes.rejected.fetch_add(1, Ordering::Relaxed);
                    if mdrelay_iex::warn::allow("echo") {
                        tracing::warn!(%why, "echo rejected");
                    }
                }
            })
            .map_err(|why| io::Error::new(io::ErrorKind::InvalidData, why))
    }
}

/// What every part of a subscriber's task works through: its socket, the server, its counts, and
/// the drain time's kill.
#[derive(Clone, Copy)]
struct Link<'a> {
    stream: &'a TcpStream,
    server: &'a Server,
    stats: &'a SubscriberStats,
    kill: &'a CancellationToken,
}

/// Writes the subscriber's records until END, reading its echoes meanwhile.
async fn subscriber(link: Link<'_>, out: &mut Outgoing, incoming: &mut Incoming) -> io::Result<Ended> {
    let Link { stream, server, stats, kill } = link;
    let mut open = true;
    // When to look next whether the subscriber is a whole queue behind (see below).
    let mut lag_due = Instant::now() + LAG_CHECK;
    while open || !out.batch.is_empty() || out.replaying() {
        if out.batch.is_empty() {
            // A replay chunk the socket took whole: its memory went back to the budget.
            out.replay_deadline = None;
            if out.replaying() {
                if let Some(ended) = replay_turn(link, out, incoming).await? {
                    return Ok(ended);
                }
                continue;
            }
            out.open_to_hot_writes();
            tokio::select! {
                biased;
                _ = kill.cancelled() => return Ok(Ended::Killed),
                taken = out.next_records(stats) => match taken {
                    Taken::Some => {}
                    Taken::CutOff => {
                        disconnect_slow(server, stats);
                        return Ok(Ended::Killed);
                    }
                    Taken::Closed => open = false,
                },
                ready = stream.readable() => {
                    ready?;
                    if !read_or_violation(stream, incoming, server, stats)? {
                        return Ok(Ended::PeerClosed);
                    }
                }
            }
            continue;
        }
        if out.replay_deadline.is_some() {
            // The rest of a replay chunk: written in a turn too, or replays to subscribers that
            // read slowly would all write at once whenever their sockets took more.
            let turn = tokio::select! {
                biased;
                _ = kill.cancelled() => return Ok(Ended::Killed),
                turn = server.shared.replays.turn.acquire() => turn.map_err(|_| turn_closed())?,
            };
            out.write_some(stream)?;
            tokio::task::yield_now().await;
            drop(turn);
        } else {
            out.write_some(stream)?;
        }
        if out.batch.is_empty() {
            continue;
        }
        // The socket is full. Under `disconnect`, look now and then whether the subscriber has
        // fallen a whole queue behind while it does not read: it would only find out at its
        // next read from the queue, which a subscriber that never reads never makes. The time
        // is kept across turns of the loop: a socket that wakes its writer often (its send
        // buffer growing, a byte at a time taken) must not put the look off for ever.
        let lag_check = async {
            if out.policy == SlowPolicy::Disconnect {
                tokio::time::sleep_until(lag_due).await;
            } else {
                std::future::pending::<()>().await;
            }
        };
        // A replay chunk it leaves untaken holds the budget every resuming subscriber shares.
        let replay_deadline = out.replay_deadline;
        let replay_due = async {
            match replay_deadline {
                Some(deadline) => tokio::time::sleep_until(deadline).await,
                None => std::future::pending::<()>().await,
            }
        };
        tokio::select! {
            biased;
            _ = kill.cancelled() => return Ok(Ended::Killed),
            ready = stream.writable() => ready?,
            ready = stream.readable() => {
                ready?;
                if !read_or_violation(stream, incoming, server, stats)? {
                    return Ok(Ended::PeerClosed);
                }
            }
            _ = lag_check => {
                lag_due = Instant::now() + LAG_CHECK;
                if out.behind_by_a_queue(server.tcp.queue) {
                    disconnect_slow(server, stats);
                    return Ok(Ended::Killed);
                }
            }
            _ = replay_due => {
                replay_timed_out(server, stats);
                return Ok(Ended::Killed);
            }
        }
    }
    // The stream is over. A subscriber that joined after END was sent gets it now.
    if !out.feed.ended() {
        if let Some(end) = server.shared.end.get() {
            out.batch.push_back(end.clone());
        }
        while !out.batch.is_empty() {
            out.write_some(stream)?;
            if out.batch.is_empty() {
                break;
            }
            tokio::select! {
                _ = kill.cancelled() => return Ok(Ended::Killed),
                ready = stream.writable() => ready?,
            }
        }
    }
    // Our side is done. Read until the subscriber closes (after END): closing with its last
    // echoes unread would make the kernel reset the connection, and a reset discards what is
    // still in our send buffer, END included, for a subscriber that is behind. The drain
    // timeout (the kill) bounds the wait.
    let _ = socket2::SockRef::from(stream).shutdown(std::net::Shutdown::Write);
    loop {
        tokio::select! {
            _ = kill.cancelled() => return Ok(Ended::Killed),
            ready = stream.readable() => {
                ready?;
                if !read_or_violation(stream, incoming, server, stats)? {
                    return Ok(Ended::Stream);
                }
            }
        }
    }
}

/// One turn of a replay: room in the replay budget for the next chunk (waiting behind the
/// subscribers that asked first), then the turn. The chunk is built from the ring and written as
/// far as the socket takes it; then the task yields, still holding the turn, so the runtime runs
/// whatever else is ready (other subscribers' live records) and polls its sockets before the next
/// replay gets a chunk. `Some` when the connection ended meanwhile.
async fn replay_turn(link: Link<'_>, out: &mut Outgoing, incoming: &mut Incoming) -> io::Result<Option<Ended>> {
    let Link { stream, server, stats, kill } = link;
    let Some(ring) = &server.ring else {
        out.replay = None;
        return Ok(None);
    };
    let share = &server.shared.replays;
    let mut want = REPLAY_CHUNK.min(share.budget_bytes);
    loop {
        // Pinned across the reads below, so the subscriber keeps its place in the budget's queue.
        let acquire = share.budget.clone().acquire_many_owned(u32::try_from(want).unwrap_or(u32::MAX));
        tokio::pin!(acquire);
        let permit = loop {
            tokio::select! {
                biased;
                _ = kill.cancelled() => return Ok(Some(Ended::Killed)),
                permit = &mut acquire => break permit.map_err(|_| turn_closed())?,
                ready = stream.readable() => {
                    ready?;
                    if !read_or_violation(stream, incoming, server, stats)? {
                        return Ok(Some(Ended::PeerClosed));
                    }
                }
            }
        };
        let turn = tokio::select! {
            biased;
            _ = kill.cancelled() => return Ok(Some(Ended::Killed)),
            turn = share.turn.acquire() => turn.map_err(|_| turn_closed())?,
        };
        match out.build_replay_chunk(ring, permit, share, stats) {
            // A frame larger than a chunk: wait for its size (the turn goes meanwhile).
            Chunk::Needs(need) => want = need.min(share.budget_bytes),
            Chunk::Done => return Ok(None),
            Chunk::Built => {
                out.replay_deadline = Some(Instant::now() + server.tcp.replay_timeout);
                out.write_some(stream)?;
                if out.batch.is_empty() {
                    out.replay_deadline = None;
                }
                tokio::task::yield_now().await;
                drop(turn);
                return Ok(None);
            }
        }
    }
}

/// The replay budget's or turn's semaphore was closed (it never is).
fn turn_closed() -> io::Error {
    io::Error::other("the replay budget was closed")
}

/// Notes and logs that a resuming subscriber left a replay chunk untaken for
/// `tcp.replay_timeout`: it is cut off as slow, and the chunk's bytes go back to the budget.
fn replay_timed_out(server: &Server, stats: &SubscriberStats) {
    stats.disconnect_slow();
    server.shared.counters.disconnects_slow.fetch_add(1, Ordering::Relaxed);
    server.shared.counters.replay_timeouts.fetch_add(1, Ordering::Relaxed);
    if mdrelay_iex::warn::allow("replay timeout") {
        tracing::warn!(
            replay_timeout = ?server.tcp.replay_timeout,
            "resuming subscriber left a replay chunk untaken (tcp.replay_timeout): disconnected as slow"
        );
    }
}

/// Notes and logs that a subscriber a whole queue behind is cut off.
fn disconnect_slow(server: &Server, stats: &SubscriberStats) {
    stats.disconnect_slow();
    server.shared.counters.disconnects_slow.fetch_add(1, Ordering::Relaxed);
    if mdrelay_iex::warn::allow("slow subscriber") {
        tracing::warn!(
            queue = server.tcp.queue,
            "subscriber a whole queue behind: disconnected (slow_subscriber = disconnect)"
        );
    }
}

/// Reads echoes; a protocol violation disconnects the subscriber (counted).
fn read_or_violation(
    stream: &TcpStream,
    incoming: &mut Incoming,
    server: &Server,
    stats: &SubscriberStats,
) -> io::Result<bool> {
    match incoming.read_some(stream, server, stats) {
        Err(e) if e.kind() == io::ErrorKind::InvalidData => {
            server.shared.counters.protocol_violations.fetch_add(1, Ordering::Relaxed);
            if mdrelay_iex::warn::allow("protocol violation") {
                tracing::warn!(error = %e, "subscriber disconnected");
            }
            Err(e)
        }
        other => other,
    }
}

#[cfg(test)]
mod tests {
    //! The three slow-subscriber policies against an in-process fanout: the hot path's side
    //! (`Fanout::send`) and a subscriber's side (`Outgoing`), without sockets; and replay chunks
    //! against the replay budget.

    use super::*;
    use crate::config::Tcp;
    use crate::fanout::Fanout;
    use mdrelay_codec::Format;
    use mdrelay_proto::relay::{Coalescer, Envelope, Sealed};
    use mdrelay_proto::relay::{RecordHeader, RecordTag};
    use std::sync::atomic::{AtomicBool, AtomicU64};

    fn tcp(queue: usize, slow: SlowPolicy) -> Tcp {
        Tcp {
            listen: "127.0.0.1:0".parse().unwrap(),
            queue,
            queue_bytes: 1 << 20,
            slow_subscriber: slow,
            wait_subscribers: 0,
            max_connections: 8,
            handshake_timeout: Duration::from_secs(1),
            drain_timeout: Duration::from_secs(1),
            replay_bytes: 1 << 20,
            replay_timeout: Duration::from_secs(1),
            hot_writes: false,
            snapshots: false,
        }
    }

    /// `n` records of one 10-byte frame each, frames 1 to `n`.
    fn records(n: u64) -> Vec<Sealed> {
        let mut c = Coalescer::new(Envelope::Record, 0);
        let mut out = Vec::new();
        for seq in 1..=n {
            c.push(seq, Format::Sbe, &[seq as u8; 10], |s| out.push(s)).unwrap();
        }
        out
    }

    fn outgoing(fanout: &Fanout, shared: &Shared, policy: SlowPolicy) -> Outgoing {
        assert_eq!(fanout.subscriber_count(), 0);
        Outgoing::new(shared.feed.upgrade().map(|feed| feed.subscribe()), policy)
    }

    /// A fanout with a queue of 16 under `policy`, and one subscriber's stats and side of it.
    fn one_subscriber(policy: SlowPolicy) -> (Fanout, Arc<Shared>, Arc<SubscriberStats>, Outgoing) {
        let (fanout, shared) = Fanout::new(&tcp(16, policy), 1, 1, Format::Sbe, Default::default(), false);
        let stats = SubscriberStats::new("test".into(), Default::default());
        let out = outgoing(&fanout, &shared, policy);
        (fanout, shared, stats, out)
    }

    /// Takes everything the subscriber can take now; the headers of what it would write.
    fn drain(out: &mut Outgoing, stats: &SubscriberStats) -> (Vec<RecordHeader>, bool) {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let mut cut_off = false;
        runtime.block_on(async {
            while out.records.as_ref().is_some_and(|r| !r.is_empty()) {
                if let Taken::CutOff = out.next_records(stats).await {
                    cut_off = true;
                    break;
                }
            }
        });
        let headers = out.batch.iter().map(|b| RecordHeader::parse(b, usize::MAX).unwrap()).collect();
        (headers, cut_off)
    }

    #[test]
    fn drop_skips_a_subscriber_a_queue_behind_and_counts_what_it_missed() {
        let stop = AtomicBool::new(false);
        let (mut fanout, shared, stats, mut out) = one_subscriber(SlowPolicy::Drop);
        for r in records(40) {
            fanout.send(&r, &stop);
        }
        let (headers, cut_off) = drain(&mut out, &stats);
        assert!(!cut_off);
        // A FORMAT record names the first frame it gets: the oldest still in the ring.
        assert_eq!((headers[0].tag, headers[0].sequence), (RecordTag::Format, 25));
        let data: Vec<u64> = headers[1..].iter().map(|h| h.sequence).collect();
        assert_eq!(data, (25..=40).collect::<Vec<_>>());
        // The first record taken sets where it starts; a gap after that is counted.
        for r in records(60).into_iter().skip(50) {
            fanout.send(&r, &stop);
        }
        drain(&mut out, &stats);
        // Frames 41 to 50 never reached it.
        assert_eq!(stats_summary(&shared, &stats).dropped_frames, 10);
    }

    #[test]
    fn runs_of_records_are_written_whole_and_counted_by_their_last_record() {
        let stop = AtomicBool::new(false);
        let (mut fanout, shared, stats, mut out) = one_subscriber(SlowPolicy::Drop);
        let mut c = Coalescer::new(Envelope::Record, 0).with_runs(8);
        let mut runs = Vec::new();
        // Frames 1-20, then 31-40: the break ends a run.
        for seq in (1..=20).chain(31..=40) {
            c.push(seq, Format::Sbe, &[seq as u8; 10], |s| runs.push(s)).unwrap();
        }
        c.flush(|s| runs.push(s));
        assert_eq!(runs.iter().map(|r| r.envelopes).collect::<Vec<_>>(), [8, 8, 4, 8, 2]);
        for r in &runs {
            fanout.send(r, &stop);
        }
        let (headers, _) = drain(&mut out, &stats);
        // One FORMAT record, then each run as one piece, as the fanout handed it over.
        assert_eq!((headers[0].tag, headers[0].sequence), (RecordTag::Format, 1));
        assert_eq!(out.batch.len(), 1 + runs.len());
        for (written, run) in out.batch.iter().skip(1).zip(&runs) {
            assert_eq!(written, &run.bytes);
        }
        // The frames after each run's last record are expected next: 21-30 never came.
        assert_eq!(out.feed.next(), Some(41));
        assert_eq!(stats_summary(&shared, &stats).dropped_frames, 10);
    }

    fn stats_summary(shared: &Shared, stats: &Arc<SubscriberStats>) -> crate::fanout::SubscriberSummary {
        shared.summaries.keep(stats.clone());
        shared.summaries.report().0.pop().unwrap()
    }

    #[test]
    fn disconnect_cuts_off_a_subscriber_a_queue_behind() {
        let stop = AtomicBool::new(false);
        let (mut fanout, _shared, stats, mut out) = one_subscriber(SlowPolicy::Disconnect);
        let all = records(40);
        for r in &all[..16] {
            fanout.send(r, &stop);
        }
        assert!(!out.behind_by_a_queue(16), "a full queue is not yet behind");
        assert!(!drain(&mut out, &stats).1, "a whole queue, read in time, is fine");
        for r in &all[16..] {
            fanout.send(r, &stop);
        }
        assert!(out.behind_by_a_queue(16));
        assert!(drain(&mut out, &stats).1, "more than a queue behind: cut off");
    }

    #[test]
    fn block_waits_for_the_slowest_subscriber_and_stops_waiting_on_stop() {
        let stop = Arc::new(AtomicBool::new(false));
        let (fanout, shared, stats, mut out) = one_subscriber(SlowPolicy::Block);
        let sent = Arc::new(AtomicU64::new(0));
        let hot = {
            let (stop, sent) = (stop.clone(), sent.clone());
            let mut fanout = fanout;
            std::thread::spawn(move || {
                for r in records(40) {
                    fanout.send(&r, &stop);
                    sent.fetch_add(1, Ordering::Relaxed);
                }
                fanout
            })
        };
        // Reading as the hot path fills the ring: every record arrives, none is skipped.
        let mut seen = Vec::new();
        while seen.len() < 40 {
            let (headers, cut_off) = drain(&mut out, &stats);
            assert!(!cut_off);
            seen.extend(headers.iter().filter(|h| h.tag == RecordTag::Data).map(|h| h.sequence));
            out.batch.clear();
            std::thread::yield_now();
        }
        assert_eq!(seen, (1..=40).collect::<Vec<_>>());
        let mut fanout = hot.join().unwrap();
        assert_eq!(stats_summary(&shared, &stats).dropped_frames, 0);
        // A subscriber that stops reading holds the hot path only until stop is set.
        for r in records(100).into_iter().skip(40) {
            if sent.load(Ordering::Relaxed) == 40 + 16 {
                stop.store(true, Ordering::Relaxed);
            }
            fanout.send(&r, &stop);
            sent.fetch_add(1, Ordering::Relaxed);
        }
        assert_eq!(sent.load(Ordering::Relaxed), 100);
    }

    #[test]
    fn block_bounds_what_a_subscriber_leaves_unread_in_bytes_too() {
        let stop = Arc::new(AtomicBool::new(false));
        let mut settings = tcp(4096, SlowPolicy::Block);
        settings.queue_bytes = 64 << 10;
        let (fanout, shared) = Fanout::new(&settings, 1, 1, Format::Sbe, Default::default(), false);
        // A subscriber that joined and reads nothing.
        let _out = outgoing(&fanout, &shared, SlowPolicy::Block);
        let mut c = Coalescer::new(Envelope::Record, 0);
        let mut big = Vec::new();
        for seq in 1..=50 {
            c.push(seq, Format::Sbe, &[7u8; 10 << 10], |s| big.push(s)).unwrap();
        }
        let sent = Arc::new(AtomicU64::new(0));
        let hot = {
            let (stop, sent) = (stop.clone(), sent.clone());
            let mut fanout = fanout;
            std::thread::spawn(move || {
                for r in &big {
                    fanout.send(r, &stop);
                    sent.fetch_add(1, Ordering::Relaxed);
                }
            })
        };
        std::thread::sleep(Duration::from_millis(300));
        // Six records of 10 KiB and their headers fit 64 KiB; the queue's 4,096 entries would
        // have taken all fifty.
        assert_eq!(sent.load(Ordering::Relaxed), 6, "the hot path waits once 64 KiB are unread");
        stop.store(true, Ordering::Relaxed);
        hot.join().unwrap();
        assert_eq!(sent.load(Ordering::Relaxed), 50);
    }

    /// A replay of `frames` frames of `len` bytes each, frames 1 on, up to the ring's mark.
    fn replaying(frames: u64, len: usize) -> (SharedRing, Outgoing) {
        let ring: SharedRing = Arc::new(Mutex::new(mdrelay_proto::relay::FrameRing::new(64 << 20)));
        {
            let mut held = lock(&ring);
            for seq in 1..=frames {
                held.push(seq, Format::Sbe, &vec![seq as u8; len]);
            }
            held.set_published(frames + 1);
        }
        // As `join` leaves it: the FORMAT record written, the replay owed.
        let mut out = Outgoing::new(None, SlowPolicy::Drop);
        let join = Join::Replay { from: 1, first: 1, end: frames + 1, format: Format::Sbe };
        out.feed = SubscriberFeed::resuming(&join).unwrap().0;
        out.replay = ReplayCursor::of(&join);
        (ring, out)
    }

    /// The DATA records in `batch`: (first frame, frames), each checked to hold whole frames.
    fn data_records(batch: &VecDeque<Bytes>, len: usize) -> Vec<(u64, u64)> {
        let mut records = Vec::new();
        for bytes in batch {
            let header = RecordHeader::parse(bytes, usize::MAX).unwrap();
            if header.tag == RecordTag::Data {
                assert_eq!(bytes.len(), RecordHeader::LEN + usize::from(header.frame_count) * len);
                records.push((header.sequence, u64::from(header.frame_count)));
            }
        }
        records
    }

    #[test]
    fn replay_chunks_hold_the_budget_until_written_and_reuse_their_buffers() {
        let share = ReplayShare::new(2 * REPLAY_CHUNK);
        let stats = SubscriberStats::new("test".into(), Default::default());
        let (ring, mut out) = replaying(2000, 100);
        let mut replayed = Vec::new();
        loop {
            let permit = share.budget.clone().try_acquire_many_owned(REPLAY_CHUNK as u32).unwrap();
            match out.build_replay_chunk(&ring, permit, &share, &stats) {
                Chunk::Built => {}
                Chunk::Done => break,
                Chunk::Needs(n) => panic!("100-byte frames fit a chunk, yet {n} bytes were asked for"),
            }
            // The chunk holds its share of the budget while any of it is unwritten.
            assert_eq!(share.budget.available_permits(), REPLAY_CHUNK);
            assert!(out.batch.iter().map(Bytes::len).sum::<usize>() <= REPLAY_CHUNK);
            replayed.extend(data_records(&out.batch, 100));
            assert!(out.batch.iter().all(|b| RecordHeader::parse(b, usize::MAX).unwrap().tag == RecordTag::Data));
            out.batch.clear();
            assert_eq!(share.budget.available_permits(), 2 * REPLAY_CHUNK, "written whole: given back");
            // One buffer, filled again each time.
            assert_eq!(share.spares.lock().unwrap().len(), 1);
        }
        assert!(!out.replaying());
        // Every frame once, in order: each record starts where the last one ended.
        let mut next = 1;
        for (first, frames) in replayed {
            assert_eq!(first, next);
            next += frames;
        }
        assert_eq!(next, 2001);
        assert_eq!(stats_summary(&out_shared(), &stats).dropped_frames, 0);
    }

    #[test]
    fn a_frame_larger_than_a_chunk_waits_for_its_size_and_goes_alone() {
        let share = ReplayShare::new(4 * REPLAY_CHUNK);
        let stats = SubscriberStats::new("test".into(), Default::default());
        let big = REPLAY_CHUNK + 1000;
        let (ring, mut out) = replaying(3, big);
        let permit = share.budget.clone().try_acquire_many_owned(REPLAY_CHUNK as u32).unwrap();
        let need = match out.build_replay_chunk(&ring, permit, &share, &stats) {
            Chunk::Needs(need) => need,
            _ => panic!("a frame larger than the permit needs more"),
        };
        assert_eq!(need, RecordHeader::LEN + big);
        assert!(out.batch.is_empty() && out.replaying(), "nothing taken meanwhile");
        assert_eq!(share.budget.available_permits(), 4 * REPLAY_CHUNK);
        let permit = share.budget.clone().try_acquire_many_owned(need as u32).unwrap();
        assert!(matches!(out.build_replay_chunk(&ring, permit, &share, &stats), Chunk::Built));
        assert_eq!(data_records(&out.batch, big), [(1, 1)]);
        out.batch.clear();
        assert_eq!(share.budget.available_permits(), 4 * REPLAY_CHUNK);
        assert!(share.spares.lock().unwrap().is_empty(), "a buffer of another size is let go");
    }

    /// The state a fanout's subscribers share, for reading a subscriber's summary.
    fn out_shared() -> Arc<Shared> {
        Fanout::new(&tcp(16, SlowPolicy::Drop), 1, 1, Format::Sbe, Default::default(), false).1
    }
}
