//! The TCP fanout: one bounded queue of records shared by every subscriber, fed by the hot path.
//!
//! The hot path appends each sealed record, encoded once, to a ring of `tcp.queue` records (a
//! tokio broadcast channel); each subscriber's task reads the ring at its own pace and writes to
//! its socket. The hot path never waits for a task and shares no lock with one across a wait:
//! the ring's own short critical sections are the only synchronisation. Memory is the ring's,
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

use crate::config::{SlowPolicy, Tcp};
use bytes::Bytes;
use mdrelay_codec::Format;
use mdrelay_proto::relay::Sealed;
use std::collections::VecDeque;
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
    /// Under `block`: records that can be sent before the ring must be looked at again, since
    /// each send adds at most one unread record.
    room: usize,
    /// Under `block`: when the ring was first found full, and when that was last logged.
    full_since: Option<(Instant, Instant)>,
}

impl Fanout {
    /// The fanout of the configured server for `session` and `stream`, starting in `format`,
    /// and the state its connection tasks share.
    pub fn new(tcp: &Tcp, session: u64, stream: u32, format: Format, guard: Guard) -> (Fanout, Arc<Shared>) {
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
        });
        let fanout = Fanout {
            shared: shared.clone(),
            sender: Some(sender),
            policy: tcp.slow_subscriber,
            capacity: tcp.queue,
            room: 0,
            full_since: None,
        };
        (fanout, shared)
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
        self.wait_for_room(stop);
        if let Some(sender) = &self.sender {
            // No subscriber: nobody to send to, which is no error.
            let _ = sender.send(sealed.bytes.clone());
        }
        self.set_position(sealed.next_sequence(), sealed.format);
    }

    fn wait_for_room(&mut self, stop: &AtomicBool) {
        if self.policy != SlowPolicy::Block {
            return;
        }
        let Some(sender) = &self.sender else { return };
        if self.room > 0 {
            self.room -= 1;
            return;
        }
        let mut waited = 0u32;
        loop {
            let unread = sender.len();
            if unread < self.capacity || sender.receiver_count() == 0 {
                self.room = self.capacity - unread.min(self.capacity);
                self.room = self.room.saturating_sub(1);
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
        self.wait_for_room(stop);
        if let Some(sender) = self.sender.take() {
            let _ = sender.send(end);
        }
    }
}
