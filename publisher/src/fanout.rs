//! The TCP fanout: one bounded queue of records shared by every subscriber, fed by the hot path.
//!
//! The hot path appends each sealed record, encoded once, to a ring of `tcp.queue` records (a
//! tokio broadcast channel); each subscriber's task reads the ring at its own pace and writes to
//! its socket. The hot path never waits for a task and shares no lock with one across a wait:
//! the ring's own short critical sections, and the try-lock of a socket it writes into (below),
//! are the only synchronisation. Memory is the ring's,
//! whatever the number of subscribers: 2,000 subscribers that stopped reading hold no more than
//! one does.
//!
//! A subscriber that falls a whole ring behind is slow, and the policy decides in its task:
//! `drop` skips it ahead to the oldest record still held (the frames in between are counted as
//! dropped for it, and it sees them as a gap), `disconnect` resets its connection. Under `block`
//! the hot path waits instead, before overwriting a record some subscriber has not read, with the
//! stop flag checked.
//!
//! A subscriber joins the ring when its handshake completes, from the next record on; until then
//! it takes nothing from the stream and holds nothing back.
//!
//! Paced (`tcp.hot_writes`), the hot path also writes each record straight into the socket of a
//! subscriber that is current and has room ([`HotSocket`], decided by
//! [`mdrelay_proto::relay::server::Handover`]): the record then reaches the subscriber without
//! waiting for its task to wake. The task still takes every record from the ring (and skips
//! those written), so the queue, the policies and the accounts are as without.

use crate::config::{SlowPolicy, Tcp};
use bytes::Bytes;
use mdrelay_codec::Format;
use mdrelay_proto::relay::Sealed;
use mdrelay_proto::relay::server::{Handover, HandoverTaken, Wrote};
use mdrelay_runtime::idle::YieldGate;
use std::collections::VecDeque;
use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};
use tokio::sync::{Semaphore, broadcast};

/// Subscriber summaries kept for the run's report; older ones are counted, not listed, so a
/// stream of short connections cannot grow the publisher's memory.
pub const KEPT_SUMMARIES: usize = 256;

/// Where the stream is, for greetings: written by the hot path, read by connection tasks.
#[derive(Debug)]
pub struct Position {
    next_sequence: AtomicU64,
    format: AtomicU8,
}

impl Position {
    /// The stream before its first frame.
    pub fn new(format: Format) -> Position {
        Position { next_sequence: AtomicU64::new(1), format: AtomicU8::new(format.id()) }
    }

    /// The next frame's sequence number.
    pub fn next_sequence(&self) -> u64 {
        self.next_sequence.load(Ordering::Relaxed)
    }

    /// The next frame's format.
    pub fn format(&self) -> Format {
        Format::from_id(self.format.load(Ordering::Relaxed)).unwrap_or(Format::Raw)
    }

    /// Notes where the stream is.
    pub fn set(&self, next_sequence: u64, format: Format) {
        self.next_sequence.store(next_sequence, Ordering::Relaxed);
        self.format.store(format.id(), Ordering::Relaxed);
    }
}

/// One subscriber's figures, shared by its task and the run's report.
#[derive(Debug)]
pub struct SubscriberStats {
    /// The subscriber's address.
    pub peer: String,
    first_sequence: AtomicU64,
    dropped_frames: AtomicU64,
    disconnected_slow: AtomicBool,
    echoes_rejected: AtomicU64,
    refused: OnceLock<String>,
    /// Admitted and not yet gone, for the metrics.
    connected: AtomicBool,
    /// Records queued for it that its task has not taken, as of the task's last take.
    queued: AtomicU64,
    /// Frames dropped over every subscriber of the run.
    dropped_total: Arc<AtomicU64>,
}

/// `first_sequence` before the subscriber's first record.
const NOT_STARTED: u64 = u64::MAX;

impl SubscriberStats {
    /// Figures for a new connection from `peer`; frames dropped for it are added to
    /// `dropped_total` too.
    pub fn new(peer: String, dropped_total: Arc<AtomicU64>) -> Arc<SubscriberStats> {
        Arc::new(SubscriberStats {
            peer,
            first_sequence: AtomicU64::new(NOT_STARTED),
            dropped_frames: AtomicU64::new(0),
            disconnected_slow: AtomicBool::new(false),
            echoes_rejected: AtomicU64::new(0),
            refused: OnceLock::new(),
            connected: AtomicBool::new(false),
            queued: AtomicU64::new(0),
            dropped_total,
        })
    }

    /// Notes that the handshake failed, and why.
    pub fn refuse(&self, reason: String) {
        let _ = self.refused.set(reason);
    }

    /// Notes the first frame offered to the subscriber.
    pub fn started_at(&self, sequence: u64) {
        let _ = self.first_sequence.compare_exchange(NOT_STARTED, sequence, Ordering::Relaxed, Ordering::Relaxed);
    }

    /// Counts frames dropped for the subscriber, and in the run's total.
    pub fn dropped(&self, frames: u64) {
        self.dropped_frames.fetch_add(frames, Ordering::Relaxed);
        self.dropped_total.fetch_add(frames, Ordering::Relaxed);
    }

    /// Notes whether the subscriber is admitted and connected.
    pub fn set_connected(&self, connected: bool) {
        self.connected.store(connected, Ordering::Relaxed);
    }

    /// Notes how many records wait for the subscriber's task in the shared queue.
    pub fn set_queued(&self, records: usize) {
        self.queued.store(records as u64, Ordering::Relaxed);
    }

    /// Notes that the subscriber was cut off for being slow.
    pub fn disconnect_slow(&self) {
        self.disconnected_slow.store(true, Ordering::Relaxed);
    }

    /// Whether the subscriber was cut off for being slow.
    pub fn disconnected_slow(&self) -> bool {
        self.disconnected_slow.load(Ordering::Relaxed)
    }

    /// Counts an echo that failed its check.
    pub fn echo_rejected(&self) {
        self.echoes_rejected.fetch_add(1, Ordering::Relaxed);
    }

    fn summary(&self) -> SubscriberSummary {
        let first = self.first_sequence.load(Ordering::Relaxed);
        SubscriberSummary {
            peer: self.peer.clone(),
            first_sequence: (first != NOT_STARTED).then_some(first),
            dropped_frames: self.dropped_frames.load(Ordering::Relaxed),
            disconnected_slow: self.disconnected_slow.load(Ordering::Relaxed),
            echoes_rejected: self.echoes_rejected.load(Ordering::Relaxed),
            refused: self.refused.get().cloned(),
        }
    }
}

/// What the publisher knows about one subscriber, for its summary.
#[derive(Debug, Default, serde::Serialize, Clone, PartialEq, Eq)]
pub struct SubscriberSummary {
    /// The subscriber's address.
    pub peer: String,
    /// Sequence number of the first frame offered to it (none if it never got that far).
    pub first_sequence: Option<u64>,
    /// Frames skipped because it was a whole queue behind (`drop` policy).
    pub dropped_frames: u64,
    /// Disconnected for being slow (`disconnect` policy).
    pub disconnected_slow: bool,
    /// Echoes it sent that named no frame sent to it, or repeated one.
    pub echoes_rejected: u64,
    /// Refused at the handshake, with the reason.
    pub refused: Option<String>,
}

/// The most recent subscribers' figures, and how many older ones were left out.
#[derive(Debug, Default)]
pub struct Summaries {
    recent: Mutex<VecDeque<Arc<SubscriberStats>>>,
    omitted: AtomicU64,
}

impl Summaries {
    /// Keeps `stats` for the report, forgetting the oldest beyond [`KEPT_SUMMARIES`].
    pub fn keep(&self, stats: Arc<SubscriberStats>) {
        let mut recent = self.recent.lock().unwrap_or_else(|e| e.into_inner());
        if recent.len() == KEPT_SUMMARIES {
            recent.pop_front();
            self.omitted.fetch_add(1, Ordering::Relaxed);
        }
        recent.push_back(stats);
    }

    /// Calls `each` with the records queued for every connected subscriber among the kept ones
    /// (the most recent [`KEPT_SUMMARIES`]).
    pub fn queued(&self, mut each: impl FnMut(u64)) {
        let recent = self.recent.lock().unwrap_or_else(|e| e.into_inner());
        for s in recent.iter().filter(|s| s.connected.load(Ordering::Relaxed)) {
            each(s.queued.load(Ordering::Relaxed));
        }
    }

    /// The kept summaries, oldest first, and how many older ones were left out.
    pub fn report(&self) -> (Vec<SubscriberSummary>, u64) {
        let recent = self.recent.lock().unwrap_or_else(|e| e.into_inner());
        (recent.iter().map(|s| s.summary()).collect(), self.omitted.load(Ordering::Relaxed))
    }
}

/// Counters over every connection of the run.
#[derive(Debug, Default)]
pub struct ServerCounters {
    /// Connections accepted.
    pub connections: AtomicU64,
    /// Connections told to retry later: the connection limit was reached.
    pub busy: AtomicU64,
    /// Handshakes that failed: wrong bytes, another version, silence past the timeout.
    pub handshake_failures: AtomicU64,
    /// Subscribers disconnected for being slow.
    pub disconnects_slow: AtomicU64,
    /// Subscribers disconnected for sending what the protocol does not allow.
    pub protocol_violations: AtomicU64,
    /// Accept calls that failed (e.g. out of file descriptors).
    pub accept_errors: AtomicU64,
    /// Frames skipped for subscribers a whole queue behind, over every subscriber (shared with
    /// each subscriber's figures, which add to it).
    pub dropped_frames: Arc<AtomicU64>,
    /// Subscribers admitted and still connected.
    pub subscribers: AtomicU64,
    /// Subscribers that resumed and were owed frames from the ring.
    pub replays: AtomicU64,
    /// Resuming subscribers cut off for leaving a replay chunk untaken `tcp.replay_timeout`
    /// (counted in `disconnects_slow` too).
    pub replay_timeouts: AtomicU64,
    /// Records the hot thread wrote straight into subscribers' sockets (`tcp.hot_writes`).
    pub hot_writes: AtomicU64,
}

/// [`ServerCounters`] read at one moment, for reports.
#[derive(Debug, Default, Clone, Copy, serde::Serialize, PartialEq, Eq)]
pub struct ConnectionCounts {
    /// Connections accepted.
    pub connections: u64,
    /// Connections told to retry later: the connection limit was reached.
    pub busy: u64,
    /// Handshakes that failed: wrong bytes, another version, silence past the timeout.
    pub handshake_failures: u64,
    /// Subscribers disconnected for being slow.
    pub disconnects_slow: u64,
    /// Subscribers disconnected for sending what the protocol does not allow.
    pub protocol_violations: u64,
    /// Accept calls that failed (e.g. out of file descriptors).
    pub accept_errors: u64,
    /// Frames skipped for subscribers a whole queue behind, over every subscriber.
    pub dropped_frames: u64,
    /// Subscribers admitted and still connected.
    pub subscribers: u64,
    /// Subscribers that resumed and were owed frames from the ring.
    pub replays: u64,
    /// Resuming subscribers cut off for leaving a replay chunk untaken `tcp.replay_timeout`
    /// (counted in `disconnects_slow` too).
    pub replay_timeouts: u64,
    /// Records the hot thread wrote straight into subscribers' sockets (`tcp.hot_writes`); the
    /// subscribers' tasks wrote the rest.
    pub hot_writes: u64,
}

impl ServerCounters {
    /// The counts now.
    pub fn snapshot(&self) -> ConnectionCounts {
        let n = |a: &AtomicU64| a.load(Ordering::Relaxed);
        ConnectionCounts {
            connections: n(&self.connections),
            busy: n(&self.busy),
            handshake_failures: n(&self.handshake_failures),
            disconnects_slow: n(&self.disconnects_slow),
            protocol_violations: n(&self.protocol_violations),
            accept_errors: n(&self.accept_errors),
            dropped_frames: n(&self.dropped_frames),
            subscribers: n(&self.subscribers),
            replays: n(&self.replays),
            replay_timeouts: n(&self.replay_timeouts),
            hot_writes: n(&self.hot_writes),
        }
    }
}

/// What the hot path and the connection tasks share.
#[derive(Debug)]
pub struct Shared {
    /// The publisher's session, in every greeting.
    pub session: u64,
    /// The stream number, in every greeting.
    pub stream: u32,
    /// Where the stream is.
    pub position: Position,
    /// The ring subscribers join; it closes (and joining fails) when the stream ends.
    pub feed: broadcast::WeakSender<Bytes>,
    /// The END record, once the stream has ended, for subscribers that join after it was sent.
    pub end: OnceLock<Bytes>,
    /// Every subscriber's figures.
    pub summaries: Summaries,
    /// Counters over connections.
    pub counters: ServerCounters,
    /// The slow-subscriber policy, for the metrics' labels.
    pub policy: SlowPolicy,
    /// How frames are protected, and the key check, for every greeting.
    pub guard: Guard,
    /// What resuming subscribers share: the replay budget and the turn.
    pub replays: ReplayShare,
    /// The hot path writes paced records into current subscribers' sockets (`tcp.hot_writes`,
    /// off at top speed).
    pub hot_writes: bool,
    /// The sockets of subscribers the hot path may write to, and a count of changes to the
    /// list, so the hot path copies it only when it changed.
    hot_sockets: Mutex<Vec<Arc<HotSocket>>>,
    hot_sockets_changed: AtomicU64,
}

impl Shared {
    /// Lets the hot path write to a subscriber's socket (a duplicate of `stream`'s descriptor)
    /// while its task says so; the guard takes it away, and closes the duplicate, when dropped.
    pub fn hot_socket(self: &Arc<Shared>, stream: std::net::TcpStream) -> HotSocketGuard {
        let socket = Arc::new(HotSocket {
            open: AtomicBool::new(false),
            state: Mutex::new(HotState { handover: Handover::default(), socket: Some(stream) }),
        });
        lock(&self.hot_sockets).push(socket.clone());
        self.hot_sockets_changed.fetch_add(1, Ordering::Release);
        HotSocketGuard { shared: self.clone(), socket }
    }
}

/// One subscriber's socket as its task and the hot path share it.
#[derive(Debug)]
pub struct HotSocket {
    /// The handover is open, as of the last change: read without the lock, so the hot path
    /// passes over the sockets of subscribers that are behind (or stalled) at the cost of a load.
    open: AtomicBool,
    state: Mutex<HotState>,
}

/// Who writes the socket next, and the socket (none once the task is done with it).
#[derive(Debug)]
struct HotState {
    handover: Handover,
    socket: Option<std::net::TcpStream>,
}

impl HotSocket {
    /// Runs `change` on the handover under the lock, and notes whether it is open after it.
    fn change<T>(&self, change: impl FnOnce(&mut Handover) -> T) -> T {
        let mut state = lock(&self.state);
        let result = change(&mut state.handover);
        self.open.store(state.handover.is_open(), Ordering::Relaxed);
        result
    }

    /// The hot path's write of `sealed`, if the subscriber is owed it next and its task is not
    /// holding the socket: whether anything was written.
    fn write(&self, sealed: &Sealed) -> bool {
        if !self.open.load(Ordering::Relaxed) {
            return false;
        }
        // Held by the task: it is writing, and the record is its own.
        let Ok(mut state) = self.state.try_lock() else { return false };
        let first = sealed.first_sequence;
        if !state.handover.offer(sealed.format, first) {
            return false;
        }
        let wrote = match state.socket.as_ref().map(|mut s| s.write(&sealed.bytes)) {
            Some(Ok(n)) if n == sealed.bytes.len() => Wrote::Whole,
            Some(Ok(n)) if n > 0 => Wrote::Part(n),
            // Would block, or failed: the task finds out which at its own write.
            _ => Wrote::Nothing,
        };
        state.handover.wrote(first, sealed.next_sequence(), wrote);
        self.open.store(state.handover.is_open(), Ordering::Relaxed);
        wrote != Wrote::Nothing
    }
}

/// A subscriber's [`HotSocket`], for its task: unregistered and its duplicate descriptor closed
/// when dropped, before the task closes (or resets) the connection.
#[derive(Debug)]
pub struct HotSocketGuard {
    shared: Arc<Shared>,
    socket: Arc<HotSocket>,
}

impl HotSocketGuard {
    /// The task took the DATA record of frames `first..next`: what it is to write of it.
    pub fn taken(&self, first: u64, next: u64) -> HandoverTaken {
        self.socket.change(|h| h.taken(first, next))
    }

    /// Frames before this one were written whole by the hot path.
    pub fn written_until(&self) -> u64 {
        lock(&self.socket.state).handover.written_until()
    }

    /// The task has written everything it took: the hot path may write from frame `next` of
    /// `format` on.
    pub fn open(&self, format: Format, next: u64) {
        self.socket.change(|h| h.open(format, next));
    }

    /// The task writes something of its own (END, a control record).
    pub fn close(&self) {
        self.socket.change(Handover::close);
    }
}

impl Drop for HotSocketGuard {
    fn drop(&mut self) {
        {
            let mut state = lock(&self.socket.state);
            state.handover.close();
            self.socket.open.store(false, Ordering::Relaxed);
            state.socket = None;
        }
        lock(&self.shared.hot_sockets).retain(|s| !Arc::ptr_eq(s, &self.socket));
        self.shared.hot_sockets_changed.fetch_add(1, Ordering::Release);
    }
}

/// At most this many subscribers' sockets are written by the hot path per record; the others'
/// tasks write theirs. Each write is a system call on the thread that paces the stream: a few
/// keep the records on time, hundreds would make them late.
pub const HOT_WRITERS: usize = 16;

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

/// What resuming subscribers share. Replays are copies out of the frame ring, made per
/// subscriber: the budget bounds their memory over every subscriber, however many resume and
/// whether or not they read, and the turn keeps them from crowding out the live records.
#[derive(Debug)]
pub struct ReplayShare {
    /// A permit per byte of replay chunks allocated and not yet written, over every resuming
    /// subscriber (`tcp.replay_bytes`).
    pub budget: Arc<Semaphore>,
    /// The budget's size, in bytes.
    pub budget_bytes: usize,
    /// Held by the one subscriber building and writing a replay chunk, until the runtime has
    /// run what else was ready: replays take turns, a chunk each, and live records go between.
    pub turn: Semaphore,
    /// Chunk buffers written and free to be filled again: never more than the budget had out
    /// at once, and reused instead of freed, so a wave of replays does not fragment the heap.
    pub spares: Arc<Mutex<Vec<Vec<u8>>>>,
}

impl ReplayShare {
    /// A budget of `bytes` (at least one) and a turn.
    pub fn new(bytes: usize) -> ReplayShare {
        let bytes = bytes.clamp(1, Semaphore::MAX_PERMITS);
        ReplayShare {
            budget: Arc::new(Semaphore::new(bytes)),
            budget_bytes: bytes,
            turn: Semaphore::new(1),
            spares: Arc::default(),
        }
    }
}

/// How a publisher protects its frames, and its session's key check: what its greetings say.
pub type Guard = (mdrelay_proto::relay::Protection, [u8; mdrelay_proto::relay::protect::KEY_CHECK_LEN]);

/// A greeting, with the publisher's frame protection, when the stream is at `format` and
/// `next_sequence`.
pub fn hello(
    session: u64,
    stream: u32,
    guard: Guard,
    format: Format,
    next_sequence: u64,
) -> mdrelay_proto::relay::Hello {
    mdrelay_proto::relay::Hello::new(format, session, stream, next_sequence).protected(guard.0, guard.1)
}

/// The shared queue's sending side and its policy, owned by the hot path.
pub struct Fanout {
    shared: Arc<Shared>,
    sender: Option<broadcast::Sender<Bytes>>,
    policy: SlowPolicy,
    capacity: usize,
    /// Under `block`: bytes the slowest subscriber may leave unread (`tcp.queue_bytes`).
    capacity_bytes: usize,
    /// Under `block`: records that can be sent before the ring must be looked at again, since
    /// each send adds at most one unread record.
    room: usize,
    /// Under `block`: bytes that can be sent before the ring must be looked at again.
    room_bytes: usize,
    /// Bytes sent through each of the last records sent, by record number modulo its length
    /// (longer than the ring, so the oldest unread record's entry is never overwritten): the
    /// unread bytes are the difference of two entries.
    sent_through: Vec<u64>,
    /// Records sent, and their bytes.
    sent: u64,
    sent_bytes: u64,
    /// Under `block`: when the ring was first found full, and when that was last logged.
    full_since: Option<(Instant, Instant)>,
    /// The hot path's copy of the sockets it may write to, as of `hot_sockets_seen` changes.
    hot_sockets: Vec<Arc<HotSocket>>,
    hot_sockets_seen: u64,
    /// Whether a hot write is followed by a yield (not while other tasks compete for the CPU).
    yield_gate: YieldGate,
}

impl Fanout {
    /// The fanout of the configured server for `session` and `stream`, starting in `format`,
    /// and the state its connection tasks share.
    /// Records are written into subscribers' sockets by the hot path when `paced` and
    /// `tcp.hot_writes` say so.
    pub fn new(
        tcp: &Tcp,
        session: u64,
        stream: u32,
        format: Format,
        guard: Guard,
        paced: bool,
    ) -> (Fanout, Arc<Shared>) {
        let (sender, _) = broadcast::channel(tcp.queue);
        let shared = Arc::new(Shared {
            session,
            stream,
            position: Position::new(format),
            feed: sender.downgrade(),
            end: OnceLock::new(),
            summaries: Summaries::default(),
            counters: ServerCounters::default(),
            policy: tcp.slow_subscriber,
            guard,
            replays: ReplayShare::new(tcp.replay_bytes),
            hot_writes: paced && tcp.hot_writes,
            hot_sockets: Mutex::default(),
            hot_sockets_changed: AtomicU64::new(0),
        });
        let fanout = Fanout {
            shared: shared.clone(),
            sender: Some(sender),
            policy: tcp.slow_subscriber,
            capacity: tcp.queue,
            capacity_bytes: tcp.queue_bytes,
            room: 0,
            room_bytes: 0,
            sent_through: if tcp.slow_subscriber == SlowPolicy::Block {
                vec![0; 2 * tcp.queue.next_power_of_two()]
            } else {
                Vec::new()
            },
            sent: 0,
            sent_bytes: 0,
            full_since: None,
            hot_sockets: Vec::new(),
            hot_sockets_seen: 0,
            yield_gate: YieldGate::default(),
        };
        (fanout, shared)
    }

    /// Whether the hot path writes records into current subscribers' sockets.
    pub fn hot_writes(&self) -> bool {
        self.shared.hot_writes
    }

    /// Subscribers that completed the handshake and take records now.
    pub fn subscriber_count(&self) -> usize {
        self.sender.as_ref().map_or(0, broadcast::Sender::receiver_count)
    }

    /// Notes where the stream is, for greetings.
    pub fn set_position(&self, next_sequence: u64, format: Format) {
        self.shared.position.set(next_sequence, format);
    }

    /// Appends a sealed record for every subscriber. Under `block`, first waits (until `stop`)
    /// while some subscriber has not read the record it would overwrite.
    pub fn send(&mut self, sealed: &Sealed, stop: &AtomicBool) {
        self.wait_for_room(sealed.bytes.len(), stop);
        if self.shared.hot_writes {
            self.write_to_current(sealed);
        }
        if let Some(sender) = &self.sender {
            // No subscriber: nobody to send to, which is no error.
            let _ = sender.send(sealed.bytes.clone());
            self.count_sent(sealed.bytes.len());
        }
        self.set_position(sealed.next_sequence(), sealed.format);
    }

    /// Notes a record of `len` bytes sent, for the unread bytes under `block`.
    fn count_sent(&mut self, len: usize) {
        if self.sent_through.is_empty() {
            return;
        }
        self.sent += 1;
        self.sent_bytes += len as u64;
        let at = (self.sent % self.sent_through.len() as u64) as usize;
        self.sent_through[at] = self.sent_bytes;
    }

    /// Bytes of the last `unread` records sent.
    fn unread_bytes(&self, unread: usize) -> u64 {
        let before = self.sent.saturating_sub(unread as u64);
        if before == 0 || self.sent_through.is_empty() {
            return self.sent_bytes;
        }
        self.sent_bytes - self.sent_through[(before % self.sent_through.len() as u64) as usize]
    }

    /// Writes `sealed` into the sockets of subscribers that are owed it next and whose tasks
    /// are idle, as far as each socket takes it without blocking; each task writes whatever is
    /// left. Written before the record is queued, so it leaves before the tasks wake for it.
    fn write_to_current(&mut self, sealed: &Sealed) {
        let changed = self.shared.hot_sockets_changed.load(Ordering::Acquire);
        if changed != self.hot_sockets_seen {
            self.hot_sockets_seen = changed;
            self.hot_sockets.clone_from(&lock(&self.shared.hot_sockets));
        }
        let mut written = 0;
        for socket in &self.hot_sockets {
            if written == HOT_WRITERS as u64 {
                break;
            }
            written += u64::from(socket.write(sealed));
        }
        if written > 0 {
            self.shared.counters.hot_writes.fetch_add(written, Ordering::Relaxed);
            // A subscriber the write woke on this CPU runs now instead of after the rest of
            // the duty cycle's burst; with no such task the call returns at once. Not while
            // other tasks compete for the CPU: there each yield can cost a time slice.
            let began = Instant::now();
            if self.yield_gate.open(began) {
                std::thread::yield_now();
                self.yield_gate.yielded(began, Instant::now());
            }
        }
    }

    /// Under `block`, waits until the slowest subscriber has room for a record of `len` bytes:
    /// fewer than `tcp.queue` records and, with it, at most `tcp.queue_bytes` bytes unread (a
    /// record larger than that goes once nothing is unread).
    fn wait_for_room(&mut self, len: usize, stop: &AtomicBool) {
        if self.policy != SlowPolicy::Block {
            return;
        }
        let Some(sender) = &self.sender else { return };
        if self.room > 0 && self.room_bytes >= len {
            self.room -= 1;
            self.room_bytes -= len;
            return;
        }
        let mut waited = 0u32;
        loop {
            let unread = sender.len();
            let unread_bytes = usize::try_from(self.unread_bytes(unread)).unwrap_or(usize::MAX);
            let fits = unread == 0 || unread_bytes.saturating_add(len) <= self.capacity_bytes;
            if (unread < self.capacity && fits) || sender.receiver_count() == 0 {
                self.room = self.capacity.saturating_sub(unread).saturating_sub(1);
                self.room_bytes = self.capacity_bytes.saturating_sub(unread_bytes.saturating_add(len));
                self.full_since = None;
                return;
            }
            if stop.load(Ordering::Relaxed) {
                // The stream is ending on request: the slowest subscriber loses the oldest record.
                return;
            }
            let now = Instant::now();
            // Said after a second of waiting, then every 5 s.
            let (since, logged) =
                self.full_since.get_or_insert((now, now.checked_sub(Duration::from_secs(4)).unwrap_or(now)));
            if now.duration_since(*logged) >= Duration::from_secs(5) {
                *logged = now;
                tracing::warn!(
                    waiting_s = now.duration_since(*since).as_secs(),
                    queue = self.capacity,
                    queue_bytes = self.capacity_bytes,
                    "waiting for a subscriber a whole queue behind (slow_subscriber = block): every subscriber waits with it"
                );
            }
            // Spin briefly (a writer usually frees room within microseconds), then sleep in
            // growing steps up to a millisecond: a stalled subscriber costs no CPU.
            waited = waited.saturating_add(1);
            match waited {
                0..=64 => std::hint::spin_loop(),
                65..=128 => std::thread::yield_now(),
                n => std::thread::sleep(Duration::from_micros(u64::from((n - 128).min(20)) * 50)),
            }
        }
    }

    /// Ends the stream with `end` (under `block`, after every subscriber has room for it), then
    /// closes the ring: each task writes what it has left, and END last.
    pub fn end(&mut self, end: Bytes, stop: &AtomicBool) {
        let _ = self.shared.end.set(end.clone());
        self.wait_for_room(end.len(), stop);
        if let Some(sender) = self.sender.take() {
            let _ = sender.send(end);
        }
    }
}
