//! The TCP fanout, owned by the hot path: the list of subscribers and the slow-subscriber
//! policies.
//!
//! The hot thread owns the subscriber list outright; no lock is shared with the runtime's tasks.
//! A connection task that completes its handshake sends a [`Joined`] over a channel, which the
//! hot thread drains between frames ([`Fanout::admit`]); a subscriber leaves when its task drops
//! its queue, which the hot thread notices at its next offer. So accepting, handshaking and
//! leaving never wait for the hot path, and the hot path never waits for them: it waits only
//! for a full queue under `block`, and then only on that queue, with the stop flag checked.
//!
//! Each subscriber's queue is bounded in records and in bytes. Records are `Bytes` encoded once
//! and shared by every queue, so memory is bounded by what the slowest queue holds, not by the
//! number of subscribers.

use crate::config::{SlowPolicy, Tcp};
use bytes::Bytes;
use mdrelay_proto::codec::Format;
use mdrelay_proto::relay::{RecordTag, Sealed, control_record};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// Bytes a queued record is charged beyond its own: its handle and queue slot. Without it, a
/// queue of tiny records would hold far more memory than its byte limit says.
pub const RECORD_OVERHEAD: u64 = 64;

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

    fn set(&self, next_sequence: u64, format: Format) {
        self.next_sequence.store(next_sequence, Ordering::Relaxed);
        self.format.store(format.id(), Ordering::Relaxed);
    }
}

/// One subscriber's figures, shared by its task, the hot path and the run's report.
#[derive(Debug)]
pub struct SubscriberStats {
    /// The subscriber's address.
    pub peer: String,
    first_sequence: AtomicU64,
    dropped_frames: AtomicU64,
    disconnected_slow: AtomicBool,
    echoes_rejected: AtomicU64,
    refused: OnceLock<String>,
}

/// `first_sequence` before the subscriber is admitted.
const NOT_ADMITTED: u64 = u64::MAX;

impl SubscriberStats {
    /// Figures for a new connection from `peer`.
    pub fn new(peer: String) -> Arc<SubscriberStats> {
        Arc::new(SubscriberStats {
            peer,
            first_sequence: AtomicU64::new(NOT_ADMITTED),
            dropped_frames: AtomicU64::new(0),
            disconnected_slow: AtomicBool::new(false),
            echoes_rejected: AtomicU64::new(0),
            refused: OnceLock::new(),
        })
    }

    /// Notes that the handshake failed, and why.
    pub fn refuse(&self, reason: String) {
        let _ = self.refused.set(reason);
    }

    /// Counts an echo that failed its check.
    pub fn echo_rejected(&self) {
        self.echoes_rejected.fetch_add(1, Ordering::Relaxed);
    }

    /// Whether the hot path cut this subscriber off for being slow.
    pub fn disconnected_slow(&self) -> bool {
        self.disconnected_slow.load(Ordering::Relaxed)
    }

    fn summary(&self) -> SubscriberSummary {
        let first = self.first_sequence.load(Ordering::Relaxed);
        SubscriberSummary {
            peer: self.peer.clone(),
            first_sequence: (first != NOT_ADMITTED).then_some(first),
            dropped_frames: self.dropped_frames.load(Ordering::Relaxed),
            disconnected_slow: self.disconnected_slow(),
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
    /// Frames skipped because its queue was full (`drop` policy).
    pub dropped_frames: u64,
    /// Disconnected for being slow (`disconnect` policy).
    pub disconnected_slow: bool,
    /// Echoes it sent that named no frame sent to it, or repeated one.
    pub echoes_rejected: u64,
    /// Refused at the handshake, with the reason.
    pub refused: Option<String>,
}

/// The most recent subscribers' figures, and counts over every connection.
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

    /// The kept summaries, oldest first, and how many older ones were left out.
    pub fn report(&self) -> (Vec<SubscriberSummary>, u64) {
        let recent = self.recent.lock().unwrap_or_else(|e| e.into_inner());
        (recent.iter().map(|s| s.summary()).collect(), self.omitted.load(Ordering::Relaxed))
    }
}

/// Counters over every connection of the run.
#[derive(Debug, Default, serde::Serialize)]
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
    /// The END record, once the stream has ended; a queue that closes after it is set ends with it.
    pub end: OnceLock<Bytes>,
    /// Every subscriber's figures.
    pub summaries: Summaries,
    /// Counters over connections.
    pub counters: ServerCounters,
}

impl Shared {
    /// The state of a server for `session` and `stream`, starting in `format`.
    pub fn new(session: u64, stream: u32, format: Format) -> Arc<Shared> {
        Arc::new(Shared {
            session,
            stream,
            position: Position::new(format),
            end: OnceLock::new(),
            summaries: Summaries::default(),
            counters: ServerCounters::default(),
        })
    }
}

/// A subscriber that completed its handshake, on its way to the hot path.
#[derive(Debug)]
pub struct Joined {
    /// Its figures.
    pub stats: Arc<SubscriberStats>,
    /// Its queue of records.
    pub queue: mpsc::Sender<Bytes>,
    /// Bytes in its queue (and its task's hands), not yet written.
    pub queued_bytes: Arc<AtomicU64>,
    /// Cancelled to cut it off at once.
    pub kill: CancellationToken,
}

struct Active {
    joined: Joined,
    /// When its queue was first found full under `block`, and when that was last logged.
    full_since: Option<(Instant, Instant)>,
}

/// What became of one offer.
enum Offer {
    Queued,
    Skipped,
    Gone,
    CutOff,
}

/// The subscriber list and its policies, owned by the hot path.
pub struct Fanout {
    shared: Arc<Shared>,
    joins: std::sync::mpsc::Receiver<Joined>,
    subscribers: Vec<Active>,
    policy: SlowPolicy,
    queue_bytes: u64,
}

impl Fanout {
    /// A fanout for the configured server, fed by `joins`.
    pub fn new(tcp: &Tcp, shared: Arc<Shared>, joins: std::sync::mpsc::Receiver<Joined>) -> Fanout {
        Fanout { shared, joins, subscribers: Vec::new(), policy: tcp.slow, queue_bytes: tcp.queue_bytes }
    }

    /// Subscribers that completed the handshake and take frames now.
    pub fn subscriber_count(&self) -> usize {
        self.subscribers.len()
    }

    /// Notes where the stream is, for greetings.
    pub fn set_position(&self, next_sequence: u64, format: Format) {
        self.shared.position.set(next_sequence, format);
    }

    /// Takes in the subscribers that completed their handshake: each is offered frames from
    /// `next_sequence` on, and first gets a FORMAT record that says so. Returns the count.
    pub fn admit(&mut self, next_sequence: u64, format: Format) -> usize {
        while let Ok(joined) = self.joins.try_recv() {
            let first = Bytes::from(control_record(RecordTag::Format, format, next_sequence, &[]));
            joined.queued_bytes.fetch_add(first.len() as u64 + RECORD_OVERHEAD, Ordering::Relaxed);
            // A new queue has room for its first record; a closed one is dropped at the next offer.
            if joined.queue.try_send(first).is_ok() {
                joined.stats.first_sequence.store(next_sequence, Ordering::Relaxed);
                tracing::info!(peer = %joined.stats.peer, first_sequence = next_sequence, "subscriber admitted");
                self.subscribers.push(Active { joined, full_since: None });
            }
        }
        self.subscribers.len()
    }

    /// Offers a sealed record to every subscriber under the policy. Under `block`, waits for room
    /// in a full queue until `stop` is set.
    pub fn send(&mut self, sealed: &Sealed, stop: &AtomicBool) {
        let mut i = 0;
        while i < self.subscribers.len() {
            let offer = Fanout::offer(&mut self.subscribers[i], sealed, self.policy, self.queue_bytes, stop);
            match offer {
                Offer::Queued | Offer::Skipped => i += 1,
                Offer::Gone => {
                    self.subscribers.swap_remove(i);
                }
                Offer::CutOff => {
                    let active = self.subscribers.swap_remove(i);
                    let stats = &active.joined.stats;
                    stats.disconnected_slow.store(true, Ordering::Relaxed);
                    self.shared.counters.disconnects_slow.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(peer = %stats.peer, queued_bytes = active.joined.queued_bytes.load(Ordering::Relaxed),
                        "subscriber too slow: its queue is full; disconnected (slow_subscriber = disconnect)");
                    active.joined.kill.cancel();
                }
            }
        }
    }

    fn offer(active: &mut Active, sealed: &Sealed, policy: SlowPolicy, queue_bytes: u64, stop: &AtomicBool) -> Offer {
        let len = sealed.bytes.len() as u64 + RECORD_OVERHEAD;
        let joined = &active.joined;
        let mut waited = 0u32;
        loop {
            if joined.queue.is_closed() {
                return Offer::Gone;
            }
            let queued = joined.queued_bytes.load(Ordering::Relaxed);
            // An empty queue takes any record, so a record above the byte limit still moves.
            if queued == 0 || queued + len <= queue_bytes {
                match joined.queue.try_send(sealed.bytes.clone()) {
                    Ok(()) => {
                        joined.queued_bytes.fetch_add(len, Ordering::Relaxed);
                        active.full_since = None;
                        return Offer::Queued;
                    }
                    Err(mpsc::error::TrySendError::Closed(_)) => return Offer::Gone,
                    Err(mpsc::error::TrySendError::Full(_)) => {}
                }
            }
            match policy {
                SlowPolicy::Drop => {
                    joined.stats.dropped_frames.fetch_add(sealed.frames, Ordering::Relaxed);
                    return Offer::Skipped;
                }
                SlowPolicy::Disconnect => return Offer::CutOff,
                SlowPolicy::Block => {}
            }
            if stop.load(Ordering::Relaxed) {
                // The stream is ending on request: do not wait for this subscriber any more.
                joined.stats.dropped_frames.fetch_add(sealed.frames, Ordering::Relaxed);
                return Offer::Skipped;
            }
            let now = Instant::now();
            // Said after a second of waiting, then every 5 s.
            let (since, logged) =
                active.full_since.get_or_insert((now, now.checked_sub(Duration::from_secs(4)).unwrap_or(now)));
            if now.duration_since(*logged) >= Duration::from_secs(5) {
                *logged = now;
                tracing::warn!(peer = %joined.stats.peer, waiting_s = now.duration_since(*since).as_secs(),
                    "waiting for a subscriber whose queue is full (slow_subscriber = block): every subscriber waits with it");
            }
            // Spin briefly (the writer usually frees room within microseconds), then sleep in
            // growing steps up to a millisecond: a stalled subscriber costs no CPU.
            waited = waited.saturating_add(1);
            match waited {
                0..=64 => std::hint::spin_loop(),
                65..=128 => std::thread::yield_now(),
                n => std::thread::sleep(Duration::from_micros(u64::from((n - 128).min(20)) * 50)),
            }
        }
    }

    /// Ends the stream: every queue closes after its last record, and each subscriber's task
    /// writes `end` then. Subscribers still joining get `end` alone.
    pub fn end(&mut self, end: Bytes) {
        let _ = self.shared.end.set(end);
        // Closing the queues is dropping their senders; joins still in flight close too.
        self.subscribers.clear();
        while self.joins.try_recv().is_ok() {}
    }
}
