//! The NATS driver: each message on the stream's subject is one relay datagram (header, then
//! frames, protected as on UDP), taken by [`DatagramReceiver`] exactly as from a UDP socket.
//!
//! Live, the messages come from a core subscription. From the start ([`Builder::from_start`]
//! with [`Builder::nats_stream`]) or from a time ([`Builder::nats_start_at`]), the live
//! subscription is made first and its messages wait, while JetStream's ordered consumer replays
//! the stream from its first message (or the first stored at or after the time) up to the last
//! one stored when the replay began; then the waiting messages, then the live ones. What both
//! delivered is a duplicate the frame accounting drops, so the hand-over has no gap and hands
//! no frame out twice.
//!
//! # Gaps repaired from JetStream
//!
//! A gap in the live subject (the server cut a connection too slow to read, a reconnection, a
//! subscription whose queue overflowed) is found by the receiver's recovery book as over UDP,
//! and the book's requests go to the stream instead of a retransmission service. One stream
//! message is one datagram of several frames, so the stream's sequence is not the relay's: the
//! datagram carrying a missing frame is found by bisection over the stream's sequence, each step
//! one direct get of "the subject's first message at or after this sequence" whose relay header
//! says which frames it carries (`proto`'s [`StoreSearch`] decides where to look; every datagram
//! read is remembered as an anchor, so the next gap starts from the closest ones), then the
//! range is read forward, a direct get per message with up to [`READ_AHEAD`] in flight, until its
//! last frame is passed, and on past it for frames missing between the datagrams read (a
//! publisher whose acknowledgement failed publishes again, so its datagram is stored after
//! later ones). Direct gets were chosen over an ordered consumer per gap: they need no
//! consumer on the server (a burst of gaps would make one each), any replica answers them, and a
//! search needs single reads anyway; a stream without `allow_direct` is read through the
//! stream's message API instead.
//!
//! Bounds: the reads run in a task of their own and their datagrams come back through a short
//! queue that the driver reads between live messages, so a repair never holds the live subject
//! up for longer than one datagram's decoding. Frames older than the stream's first message of
//! the session (its limits removed them) are given up as gone at once; frames past its last are
//! asked again at the retry, and given up after the attempts ([`Builder::recovery_attempts`]);
//! frames the window can no longer take are given up as too old; at the end, the linger bounds
//! the wait. A range read once is not read again. Without a stream, a gap is counted lost.
//!
//! A gap is found when a later message arrives, so a tail lost on the live subject (its END
//! included) would never be: while the subject is quiet for [`TAIL_PROBE`], a task of its own
//! (not behind the repairs) reads the subject's last stored message and hands it to the machine
//! ([`DatagramReceiver::stored_tail`]), which takes it as if it had come live when it is newer
//! than anything taken (a later frame, or the END), opening the gap behind it, and otherwise
//! counts it as the stream's word that nothing new came ([`Builder::give_up_after`]: a stream
//! that has started and brings nothing new that long is given up, with
//! [`Error::Ended`]). The read's round trip goes with it: a slow answer comes from a server that
//! was stalled, with the publisher's messages perhaps queued behind the read, and is not taken
//! as silence.
//!
//! # Catching up
//!
//! A subscriber more than a window behind (a process stopped for seconds, a connection the
//! server cut as a slow consumer's) learns it from a message far ahead, live or at the tail, or
//! one that would take its window past a gap still open. Repairs would give those frames up as
//! too old: the machine asks for a catch-up instead ([`DatagramReceiver::next_catch_up`]). A task finds the datagram carrying the first frame
//! missing by the same bisection as a repair, and starts an ordered consumer from there up to
//! the subject's last message; the driver takes its messages in order, as a replay from the
//! start, while the live messages wait (the message that showed the gap first), then hands
//! them over. Each decision is the machine's: what counts as behind, how often a catch-up may
//! be asked, what the stream's messages prove.
//!
//! A read in order that brings nothing for two seconds with messages still to come has stalled
//! (JetStream's ordered consumer can stop delivering under load, with no error): a catch-up
//! then ends and repairs fill the rest; a replay the subscriber asked for is read again from
//! after its last message, by a new consumer.
//!
//! Every wait is on a stream of messages, a queue or a sleep, so a wait that is dropped loses
//! nothing.
//!
//! [`Builder::from_start`]: crate::Builder::from_start
//! [`Builder::nats_stream`]: crate::Builder::nats_stream
//! [`Builder::nats_start_at`]: crate::Builder::nats_start_at
//! [`Builder::recovery_attempts`]: crate::Builder::recovery_attempts
//! [`Builder::give_up_after`]: crate::Builder::give_up_after

use crate::collect::Collector;
use crate::counters::Counters;
use crate::datagram::{self, DatagramDriver, EndNotes, Parts};
use crate::error::Error;
use crate::event::{Event, Notice, RecoveryEvent};
use crate::nats_auth::nats_config;
use crate::net::Clock;
use crate::settings::Checked;
use async_nats::jetstream::consumer::{DeliverPolicy, pull};
use async_nats::jetstream::message::StreamMessage;
use async_nats::jetstream::stream::{DirectGetErrorKind, LastRawMessageErrorKind, Stream as JetStream};
use bytes::Bytes;
use futures_util::{FutureExt, StreamExt};
use mdrelay_proto::relay::client::{
    CatchUp, DatagramEvent, DatagramReceiver, Origin, Quiet, SNAPSHOT_WAIT, StoreSearch, StoreStep, Stored,
};
use mdrelay_proto::relay::snapshot::nats_snapshot_subject;
use mdrelay_proto::relay::wire::{DatagramHeader, DatagramKind, Hello, RecordHeader, RecordTag, RetransmitRequest};
use std::collections::VecDeque;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use tokio::sync::mpsc;

/// Live messages held while the replay catches up, at most; past it the live subscription is
/// not read (the server holds, then cuts a consumer that slow, which is counted as lost).
const MAX_HELD: usize = 1 << 20;
/// Ranges waiting for the repair task; more are asked again at their retry.
const REPAIR_REQUESTS: usize = 1024;
/// Datagrams read from the stream waiting for the driver: the task waits when it is full.
const REPAIRED_QUEUE: usize = 256;
/// Direct gets in flight together while a missing range is read forward.
const READ_AHEAD: usize = 64;
/// With a stream, how long the live subject may be quiet before its last stored message is
/// read, in case the tail was lost.
pub(crate) const TAIL_PROBE: std::time::Duration = std::time::Duration::from_millis(500);

/// How long a read of the stream in order may bring nothing before it is taken as stalled.
///
/// JetStream's ordered consumer can stop delivering with messages still pending (a pull the
/// server dropped under load: seen here with the server and the reader short of CPU, for
/// minutes, with no error and no missed heartbeat). Its own recovery waits for two missed
/// heartbeats, which a stalled pull does not produce. A stalled catch-up ends (repairs fill
/// the rest by direct gets); a stalled replay is started again after its last message.
const REPLAY_STALL: std::time::Duration = std::time::Duration::from_secs(2);

/// Bytes of a snapshot's records at most: a snapshot of ten thousand symbols' books is a few
/// megabytes; an answer past this is no snapshot.
const MAX_SNAPSHOT_BYTES: usize = 256 << 20;

/// A snapshot asked of the publisher: the session its frames are sealed for and its `SNAPSHOT`
/// records, or why there is none.
type SnapshotAnswer = Result<(u64, Vec<Bytes>), String>;

/// A read of the stream in order: a replay from its start or from a time, or a catch-up.
struct Replay {
    messages: pull::Ordered,
    /// The stream and subject read, to start the read again after a stall.
    stream: JetStream,
    subject: String,
    /// The last stream sequence stored when the replay began: the hand-over point.
    until: u64,
    /// The stream sequence of the last message read (before the first: the one before it).
    read_to: u64,
    /// When a message last came (ns of the driver's clock; at first, when the read began).
    moved_at: i64,
    /// A catch-up (a read that fails ends it, and repairs fill what is missing), not a replay
    /// the subscriber asked for (a read that fails ends the stream).
    catch_up: bool,
}

/// Where catch-ups read: the stream, and the subject in it.
#[derive(Clone)]
struct StoreSource {
    jetstream: async_nats::jetstream::Context,
    stream: String,
    subject: String,
    fetches: Arc<AtomicU64>,
}

/// The subject's last stored message, read while the live subject is quiet.
#[derive(Debug)]
enum TailRead {
    /// At its stream position.
    Stored(u64, Bytes),
    /// The stream holds none of the subject.
    Nothing,
    /// It could not be read now (no answer is no word on the stream).
    Unreadable,
}

/// What the repair task hands back.
#[derive(Debug)]
enum Repaired {
    /// A datagram read from the stream.
    Datagram(Bytes),
    /// Frames the stream does not hold.
    Gone { session: u64, first: u64, count: u64 },
}

/// What the driver asks of the repair task: a missing range of a session.
type Ask = (u64, RetransmitRequest);

/// The task that reads missing frames from the stream, and its queues.
struct Repairs {
    requests: mpsc::Sender<Ask>,
    repaired: mpsc::Receiver<Repaired>,
    fetches: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
    /// The stream, for the report.
    server: String,
}

impl Drop for Repairs {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A NATS subscription's driver.
pub(crate) struct NatsDriver {
    receiver: DatagramReceiver,
    live: async_nats::Subscriber,
    replay: Option<Replay>,
    held: VecDeque<Bytes>,
    repairs: Option<Repairs>,
    /// Where catch-ups read (with a stream).
    source: Option<StoreSource>,
    /// The task finding where a catch-up starts.
    catching_up: Option<tokio::task::JoinHandle<Option<Replay>>>,
    /// The snapshot asked for, on its way.
    snapshot: Option<tokio::task::JoinHandle<SnapshotAnswer>>,
    /// The read of the stream's tail under way: the stream (looked up once found) and what
    /// it holds last.
    tail_read: Option<tokio::task::JoinHandle<(Option<JetStream>, TailRead)>>,
    /// The stream, once a read of its tail found it.
    tail_stream: Option<JetStream>,
    /// When the read of the tail under way was sent (a slow answer is not the stream's silence).
    tail_asked_at: i64,
    /// The subject and where it is read, for errors.
    name: String,
    /// The stream was given up: the error to end it with.
    gave_up: Option<Error>,
    /// When the live subject last delivered (ns of the clock).
    live_at: i64,
    /// The server, as the machine's peer (messages have no address of their own).
    peer: SocketAddr,
    notes: EndNotes,
    clock: Clock,
    /// Connections made to a server of the cluster, the first included.
    connections: Arc<AtomicU64>,
    /// Messages taken that gave the caller nothing: past a budget the driver yields, so a
    /// subject flooded with messages that produce no event cannot hold the caller's deadline.
    quiet: Quiet,
}

impl Drop for NatsDriver {
    fn drop(&mut self) {
        if let Some(task) = &self.catching_up {
            task.abort();
        }
        if let Some(task) = &self.tail_read {
            task.abort();
        }
        if let Some(task) = &self.snapshot {
            task.abort();
        }
    }
}

impl std::fmt::Debug for NatsDriver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NatsDriver")
            .field("peer", &self.peer)
            .field("replaying", &self.replay.is_some())
            .field("repairing", &self.repairs.is_some())
            .field("catching_up", &self.catching_up.is_some())
            .finish()
    }
}

impl NatsDriver {
    /// Connects, subscribes, and (from the start or a time) begins the replay.
    pub async fn start(
        servers: &[String],
        subject: &str,
        stream: Option<&str>,
        settings: &Checked,
        clock: Clock,
    ) -> Result<NatsDriver, Error> {
        let connections = Arc::new(AtomicU64::new(0));
        let client = connect(servers, settings, connections.clone()).await?;
        let unreachable = |reason: String| Error::Unreachable { address: servers.join(","), reason };
        let info = client.server_info();
        let peer = format!("{}:{}", info.host, info.port)
            .parse()
            .unwrap_or(SocketAddr::from((Ipv4Addr::UNSPECIFIED, info.port)));
        // The live subscription first: whatever is published from now on is in it.
        let live = client.subscribe(subject.to_string()).await.map_err(|e| unreachable(e.to_string()))?;
        // The subscription is only queued to the server: a round trip makes sure the server has
        // it, so a subscriber built before its publisher starts misses nothing.
        client.flush().await.map_err(|e| unreachable(e.to_string()))?;
        // Asked once the live subscription is in place: the publisher's state as of frame n, and
        // the live subject from n + 1 on.
        let snapshot = settings.snapshot.then(|| tokio::spawn(request_snapshot(client.clone(), subject.to_string())));
        let jetstream = async_nats::jetstream::new(client.clone());
        let start = match (settings.from_start, settings.nats.start_at) {
            (true, _) => Some(DeliverPolicy::All),
            (false, Some(time)) => Some(DeliverPolicy::ByStartTime { start_time: time.into() }),
            _ => None,
        };
        let mut replay = match (stream, start) {
            // A replay needs the stream now; live, it is looked up when a gap is (the
            // subscriber may start before the publisher creates it).
            (Some(name), Some(policy)) => {
                let not_found = |e: String| Error::config("nats_stream", format!("{name:?}: {e}"));
                let js = jetstream.get_stream(name).await.map_err(|e| not_found(e.to_string()))?;
                start_replay(&js, subject, policy, false).await?
            }
            _ => None,
        };
        let repairs = match (stream, &settings.recovery) {
            (Some(name), Some(recovery)) => {
                Some(start_repairs(jetstream.clone(), name, subject, recovery.server.clone()))
            }
            _ => None,
        };
        let source = match (stream, &repairs) {
            (Some(name), Some(repairs)) => Some(StoreSource {
                jetstream,
                stream: name.to_string(),
                subject: subject.to_string(),
                fetches: repairs.fetches.clone(),
            }),
            _ => None,
        };
        let config = datagram::config(settings, None, None);
        let mut receiver =
            DatagramReceiver::new(config).with_store_recovery().with_give_up_after(settings.give_up_after);
        if let Some(replay) = &mut replay {
            replay.moved_at = clock.now();
            receiver.store_read_began();
        }
        let name = match stream {
            Some(stream) => format!("NATS subject {subject} (stream {stream}) on {}", servers.join(",")),
            None => format!("NATS subject {subject} on {}", servers.join(",")),
        };
        Ok(NatsDriver {
            receiver,
            live,
            replay,
            held: VecDeque::new(),
            source,
            catching_up: None,
            snapshot,
            tail_read: None,
            tail_stream: None,
            tail_asked_at: 0,
            name,
            gave_up: None,
            repairs,
            live_at: clock.now(),
            peer,
            notes: EndNotes::default(),
            clock,
            connections,
            quiet: Quiet::new(),
        })
    }

    /// Moves messages until the machine has something for the caller, or the stream is over.
    pub async fn step(&mut self, out: &mut Collector) -> Result<(), Error> {
        loop {
            // Messages that give nothing go on (held ones included), with a yield to the
            // runtime now and then.
            if let Some(result) = datagram::begin_round(self, out).await {
                return result;
            }
            let now = self.clock.now();
            if let Some(deadline) = self.receiver.deadline()
                && deadline <= now
            {
                self.receiver.on_timeout(now);
                self.ask_repairs();
                continue;
            }
            if !self.holding() && !self.held.is_empty() {
                // What came live meanwhile goes behind what is held, so the subscription's
                // pending limit is not reached while the held messages are taken.
                while self.held.len() < MAX_HELD
                    && let Some(Some(message)) = self.live.next().now_or_never()
                {
                    self.live_at = now;
                    self.held.push_back(message.payload);
                }
                if let Some(message) = self.held.pop_front() {
                    self.take(&message, out);
                }
                continue;
            }
            self.wait(out).await?;
        }
    }

    /// Whether the live messages are held: a replay or a catch-up is under way.
    fn holding(&self) -> bool {
        self.replay.is_some() || self.receiver.reading_store()
    }

    /// Starts finding where `catch_up` reads from (the machine is told when the store cannot be
    /// read).
    fn start_catch_up(&mut self, catch_up: CatchUp) {
        match &self.source {
            Some(source) => self.catching_up = Some(tokio::spawn(find_catch_up(source.clone(), catch_up))),
            None => self.receiver.store_read_ended(self.clock.now()),
        }
    }

    /// A replay or a catch-up is over: the held messages come next.
    fn replay_over(&mut self) {
        self.replay = None;
        self.receiver.store_read_ended(self.clock.now());
    }

    /// The read in order brought nothing for [`REPLAY_STALL`]: a catch-up ends (repairs fill
    /// what it did not read), a replay is read again from after its last message, by a new
    /// ordered consumer (the live messages are still held meanwhile).
    fn replay_stalled(&mut self) {
        let Some(replay) = self.replay.take() else { return };
        if replay.catch_up {
            self.receiver.store_read_ended(self.clock.now());
            return;
        }
        let Replay { stream, subject, read_to, .. } = replay;
        self.catching_up = Some(tokio::spawn(async move {
            let policy = DeliverPolicy::ByStartSequence { start_sequence: read_to.saturating_add(1) };
            start_replay(&stream, &subject, policy, false).await.ok().flatten()
        }));
    }

    /// The publisher's answer to the snapshot request, into the machine.
    fn snapshot_answered(&mut self, answer: SnapshotAnswer) {
        match answer {
            Ok((session, records)) => {
                let source = format!("the snapshot answer on {}", self.name);
                for record in &records {
                    // Checked whole by the task that read them.
                    if let Ok(header) = RecordHeader::parse(record, record.len()) {
                        self.receiver.snapshot_record(&header, &record[RecordHeader::LEN..], session, &source);
                    }
                }
                if self.receiver.awaiting_snapshot() {
                    self.receiver.snapshot_unavailable(format!("{source} ended before the snapshot's closing record"));
                }
            }
            Err(why) => self.receiver.snapshot_unavailable(why),
        }
    }

    /// Hands the ranges the book asks for to the repair task; a range that does not fit its
    /// queue is asked again at its retry.
    fn ask_repairs(&mut self) {
        while let Some((session, range)) = self.receiver.next_store_request() {
            if let Some(repairs) = &self.repairs {
                let _ = repairs.requests.try_send((session, range));
            }
        }
    }

    /// Waits for a message (the replay's or catch-up's first, then the live ones), a repaired
    /// datagram, where a catch-up starts, or the machine's deadline.
    async fn wait(&mut self, out: &mut Collector) -> Result<(), Error> {
        let clock = self.clock;
        let sleep = clock.sleep_until(self.receiver.deadline());
        let holding = self.holding();
        let hold_more = self.held.len() < MAX_HELD;
        // Quiet for TAIL_PROBE (not while reading the stream in order: that reads it anyway).
        let probe_at = self.live_at.saturating_add(TAIL_PROBE.as_nanos() as i64);
        let probing = self.source.is_some() && !holding && self.tail_read.is_none() && self.receiver.wants_tail();
        let quiet = clock.sleep_until(probing.then_some(probe_at));
        // A read in order that brings nothing for REPLAY_STALL has stalled.
        let stall_at = self.replay.as_ref().map(|r| r.moved_at.saturating_add(REPLAY_STALL.as_nanos() as i64));
        let stalled = clock.sleep_until(stall_at);
        let NatsDriver { replay, live, repairs, catching_up, tail_read, snapshot, .. } = self;
        let answered = async {
            match snapshot {
                Some(task) => task.await.unwrap_or_else(|e| Err(e.to_string())),
                None => std::future::pending().await,
            }
        };
        let replayed = async {
            match replay {
                Some(replay) => replay.messages.next().await,
                None => std::future::pending().await,
            }
        };
        let repaired = async {
            match repairs {
                Some(r) => r.repaired.recv().await,
                None => std::future::pending().await,
            }
        };
        let found = async {
            match catching_up {
                Some(task) => task.await.ok().flatten(),
                None => std::future::pending().await,
            }
        };
        let tail = async {
            match tail_read {
                Some(task) => task.await.unwrap_or((None, TailRead::Unreadable)),
                None => std::future::pending().await,
            }
        };
        enum Woke {
            Replayed(Option<Result<Box<async_nats::jetstream::Message>, String>>),
            Live(Option<async_nats::Message>),
            Repaired(Option<Repaired>),
            Found(Option<Box<Replay>>),
            Tail(Box<(Option<JetStream>, TailRead)>),
            Slept,
            Quiet,
            Stalled,
            Answered(SnapshotAnswer),
        }
        let woke = tokio::select! {
            replayed = replayed => Woke::Replayed(replayed.map(|r| r.map(Box::new).map_err(|e| e.to_string()))),
            live = live.next(), if !holding || hold_more => Woke::Live(live),
            repaired = repaired => Woke::Repaired(repaired),
            found = found => Woke::Found(found.map(Box::new)),
            tail = tail => Woke::Tail(Box::new(tail)),
            _ = sleep => Woke::Slept,
            _ = quiet => Woke::Quiet,
            _ = stalled => Woke::Stalled,
            answer = answered => Woke::Answered(answer),
        };
        match woke {
            Woke::Replayed(Some(Ok(message))) => {
                let until = self.replay.as_ref().map_or(0, |r| r.until);
                // Caught up: the subject's last message when the replay began, or nothing
                // pending (the live subscription has all that follows).
                let done = message.info().map_or(true, |i| i.stream_sequence >= until || i.pending == 0);
                if let (Some(replay), Ok(info)) = (self.replay.as_mut(), message.info()) {
                    replay.read_to = info.stream_sequence;
                    replay.moved_at = self.clock.now();
                }
                self.take(&message.message.payload, out);
                if done && self.replay.is_some() {
                    self.replay_over();
                }
            }
            Woke::Replayed(Some(Err(e))) => {
                // A catch-up that cannot read on ends: repairs fill what it did not read.
                if self.replay.as_ref().is_some_and(|r| r.catch_up) {
                    self.replay_over();
                    return Ok(());
                }
                return Err(Error::Io {
                    context: format!("replaying the NATS stream: {e}"),
                    source: std::io::Error::other(e),
                });
            }
            Woke::Replayed(None) => self.replay_over(),
            Woke::Live(Some(message)) if holding => {
                self.live_at = self.clock.now();
                self.held.push_back(message.payload)
            }
            Woke::Live(Some(message)) => {
                self.live_at = self.clock.now();
                self.take(&message.payload, out)
            }
            Woke::Live(None) => return Err(self.closed()),
            Woke::Found(found) => {
                self.catching_up = None;
                match found {
                    Some(mut replay) => {
                        replay.moved_at = self.clock.now();
                        self.replay = Some(*replay);
                    }
                    // Nothing stored from there, or the stream cannot be read now: the live
                    // messages go on, and repairs fill what they can.
                    None => self.receiver.store_read_ended(self.clock.now()),
                }
            }
            Woke::Repaired(Some(Repaired::Datagram(bytes))) => {
                // Recovered frames name where they came from: the server that answered.
                out.recovery_peer = Some(self.peer);
                self.receiver.store_datagram(&bytes, self.clock.now(), self.clock.wall(), out);
            }
            Woke::Repaired(Some(Repaired::Gone { session, first, count })) => {
                self.receiver.store_gone(session, first, count);
            }
            Woke::Tail(tail) => {
                let (stream, read) = *tail;
                self.tail_read = None;
                self.tail_stream = stream;
                match read {
                    TailRead::Stored(position, payload) => {
                        let now = self.clock.now();
                        out.stream_peer = Some(self.peer);
                        let asked_at = self.tail_asked_at;
                        self.receiver.stored_tail(position, &payload, self.peer, asked_at, now, self.clock.wall(), out);
                        self.after_taking(&payload);
                    }
                    TailRead::Nothing => self.receiver.store_holds_nothing(self.tail_asked_at, self.clock.now()),
                    TailRead::Unreadable => {}
                }
            }
            // The task ended (it cannot read the stream any more): what is missing is given
            // up at its attempts.
            Woke::Repaired(None) => self.repairs = None,
            Woke::Slept => {}
            Woke::Stalled => self.replay_stalled(),
            Woke::Answered(answer) => {
                self.snapshot = None;
                self.snapshot_answered(answer);
            }
            Woke::Quiet => {
                // The tail is read by a task of its own (a round trip the live subject does not
                // wait for, nor does it wait behind repairs); the next read is a quiet period
                // after its answer.
                self.live_at = self.clock.now();
                self.tail_asked_at = self.live_at;
                if let Some(source) = &self.source {
                    self.tail_read = Some(tokio::spawn(read_tail(source.clone(), self.tail_stream.take())));
                }
            }
        }
        Ok(())
    }

    /// The subscription ended without the stream's end: the client was closed.
    fn closed(&self) -> Error {
        Error::Io {
            context: format!("the NATS subscription from {} ended before the stream did", self.peer),
            source: std::io::Error::from(std::io::ErrorKind::ConnectionAborted),
        }
    }

    /// One message into the machine.
    fn take(&mut self, payload: &Bytes, out: &mut Collector) {
        self.quiet.took();
        self.quiet.received(payload.len());
        let now = self.clock.now();
        out.stream_peer = Some(self.peer);
        // A catch-up's frames that fill a gap are recovered: from the server that answered.
        out.recovery_peer = Some(self.peer);
        self.receiver.datagram(Origin::Stream, payload, self.peer, now, self.clock.wall(), out);
        self.after_taking(payload);
    }

    /// After a message went into the machine: the machine may have asked for a catch-up
    /// instead of taking it (it is then given again after the catch-up, first).
    fn after_taking(&mut self, payload: &Bytes) {
        // Echoes have no way back over a subject: the publisher reads none.
        while self.receiver.next_echo().is_some() {}
        if let Some(catch_up) = self.receiver.next_catch_up() {
            self.held.push_front(payload.clone());
            self.start_catch_up(catch_up);
        }
    }
}

impl DatagramDriver for NatsDriver {
    fn parts(&mut self) -> Parts<'_> {
        Parts { receiver: &mut self.receiver, notes: &mut self.notes, quiet: &mut self.quiet }
    }

    /// The stream given up (`give_up_after`).
    fn take_error(&mut self) -> Option<Error> {
        self.gave_up.take()
    }

    /// The repairs, the catch-up and the read of the stream's tail stop.
    fn stop(&mut self) {
        if let Some(repairs) = &self.repairs {
            repairs.task.abort();
        }
        if let Some(task) = self.catching_up.take() {
            task.abort();
        }
        if let Some(task) = self.tail_read.take() {
            task.abort();
        }
    }

    fn counters_with(&self, out: &Collector) -> Counters {
        let d = self.receiver.counts();
        let reader = self.receiver.reader();
        let server = self.repairs.as_ref().map_or("JetStream", |r| r.server.as_str());
        let connections = self.connections.load(Ordering::Relaxed);
        Counters {
            bytes: d.bytes,
            invalid_packets: d.invalid_packets,
            datagrams: d.datagrams,
            publisher_totals: self.receiver.publisher_totals().cloned(),
            recovery: reader.book().map(|b| b.report(server)),
            repair_fetches: self.repairs.as_ref().map_or(0, |r| r.fetches.load(Ordering::Relaxed)),
            connections,
            reconnects: connections.saturating_sub(1),
            ..Counters::of_reader(reader, &out.tally, Default::default())
        }
    }

    fn own_notice(&mut self, event: DatagramEvent, out: &mut Collector) -> Option<Notice> {
        Some(match event {
            DatagramEvent::Behind { from, ahead, .. } => Event::Recovery(RecoveryEvent::CatchingUp { from, ahead }),
            DatagramEvent::CaughtUp { frames } => Event::Recovery(RecoveryEvent::CaughtUp { frames }),
            DatagramEvent::EndAhead { next_sequence, .. } => Event::Recovery(RecoveryEvent::EndAhead { next_sequence }),
            DatagramEvent::GaveUp { silent, given_up } => {
                self.close(out);
                let limit = std::time::Duration::from_nanos(silent.max(0).unsigned_abs());
                let in_stream = if self.source.is_some() { " nor in the stream's last message" } else { "" };
                self.gave_up = Some(Error::Ended {
                    peer: self.name.clone(),
                    reason: format!(
                        "no new frame for {limit:.1?} on the subject{in_stream}, and no end of stream (give_up_after): \
                         given up, with {given_up} frames still missing"
                    ),
                });
                return None;
            }
            _ => return None,
        })
    }
}

/// Connects to the servers with the credentials and TLS asked for, counting every connection
/// made (the client's reconnections to any server of the cluster included) in `connections`;
/// credentials or TLS the server refuses are a [`Error::Config`] naming the setting.
async fn connect(
    servers: &[String],
    settings: &Checked,
    connections: Arc<AtomicU64>,
) -> Result<async_nats::Client, Error> {
    let unreachable = |reason: String| Error::Unreachable { address: servers.join(","), reason };
    let addrs: Vec<async_nats::ServerAddr> = servers
        .iter()
        .map(|url| url.parse().map_err(|e| Error::config("nats", format!("{url:?}: {e}"))))
        .collect::<Result<_, _>>()?;
    let options = crate::nats::connect_options(&settings.nats.auth, settings.nats.tls_ca_file.as_deref())
        .await
        .map_err(nats_config)?;
    let mut options = options
        .name(settings.nats.name.as_deref().unwrap_or("mdrelay-client"))
        .max_reconnects(None)
        .connection_timeout(settings.connect_timeout)
        .event_callback(move |event| {
            if matches!(event, async_nats::Event::Connected) {
                connections.fetch_add(1, Ordering::Relaxed);
            }
            std::future::ready(())
        });
    if let Some(n) = settings.nats.pending_messages {
        options = options.subscription_capacity(n);
    }
    options.connect(addrs).await.map_err(|e| match crate::nats::connect_error(&e, &settings.nats.auth) {
        Some(fault) => nats_config(fault),
        None => unreachable(e.to_string()),
    })
}

/// The ordered consumer over the stream from `policy`'s start, and where it hands over to the
/// live subscription (`catch_up`: see [`Replay`]); `None` when the stream holds nothing from
/// there yet.
async fn start_replay(
    stream: &JetStream,
    subject: &str,
    policy: DeliverPolicy,
    catch_up: bool,
) -> Result<Option<Replay>, Error> {
    let name = stream.cached_info().config.name.clone();
    let not_found = |e: String| Error::config("nats_stream", format!("{name:?}: {e}"));
    // The subject's last message now; none: nothing to replay.
    let Ok(last) = stream.get_last_raw_message_by_subject(subject).await else { return Ok(None) };
    match policy {
        // Nothing stored from that time, or position, on: the live subject has it all.
        DeliverPolicy::ByStartTime { start_time } if last.time < start_time => return Ok(None),
        DeliverPolicy::ByStartSequence { start_sequence } if last.sequence < start_sequence => return Ok(None),
        _ => {}
    }
    let consumer = stream
        .create_consumer(pull::OrderedConfig {
            filter_subject: subject.to_string(),
            deliver_policy: policy,
            ..Default::default()
        })
        .await
        .map_err(|e| not_found(e.to_string()))?;
    let messages = consumer.messages().await.map_err(|e| not_found(e.to_string()))?;
    let read_to = match policy {
        DeliverPolicy::ByStartSequence { start_sequence } => start_sequence.saturating_sub(1),
        _ => 0,
    };
    Ok(Some(Replay {
        messages,
        stream: stream.clone(),
        subject: subject.to_string(),
        until: last.sequence,
        read_to,
        moved_at: 0,
        catch_up,
    }))
}

/// Where a catch-up reads from: the datagram carrying frame `from` of the session (or, when the
/// stream no longer holds it, the session's first stored after it), found by the bisection a
/// repair starts with, and the ordered consumer from there; `None` when the stream holds nothing
/// from there or cannot be read now.
async fn find_catch_up(source: StoreSource, catch_up: CatchUp) -> Option<Replay> {
    let StoreSource { jetstream, stream, subject, fetches } = source;
    let mut stream = jetstream.get_stream(&stream).await.ok()?;
    let direct = stream.cached_info().config.allow_direct;
    let positions = subject_positions(&mut stream, &subject, direct).await;
    let mut search = StoreSearch::new();
    let from = catch_up.from;
    let mut step = search.begin(catch_up.session, from, from.saturating_add(1), positions);
    let start = loop {
        step = match step {
            StoreStep::Look(position) => {
                fetches.fetch_add(1, Ordering::Relaxed);
                let found = at_or_after(&stream, &subject, position, direct).await.ok()?;
                search.looked(position, found.as_ref().map(stored))
            }
            // The search reads the range from here: where the catch-up starts.
            StoreStep::Read(position) => break position,
            _ => return None,
        };
    };
    let policy = DeliverPolicy::ByStartSequence { start_sequence: start };
    start_replay(&stream, &subject, policy, true).await.ok().flatten()
}

/// Asks the publisher of `subject` for a snapshot ([`nats_snapshot_subject`]) and reads its
/// answer: its greeting, then `SNAPSHOT` records up to the closing one, each checked, within
/// [`SNAPSHOT_WAIT`] in all and [`MAX_SNAPSHOT_BYTES`].
async fn request_snapshot(client: async_nats::Client, subject: String) -> SnapshotAnswer {
    let asked_on = nats_snapshot_subject(&subject);
    let inbox = client.new_inbox();
    let mut answers = client.subscribe(inbox.clone()).await.map_err(|e| format!("subscribing to {inbox}: {e}"))?;
    client
        .publish_with_reply(asked_on.clone(), inbox, Bytes::new())
        .await
        .map_err(|e| format!("asking on {asked_on}: {e}"))?;
    let _ = client.flush().await;
    let deadline = tokio::time::Instant::now() + SNAPSHOT_WAIT;
    let silent = || {
        format!(
            "no publisher answered on {asked_on} within {SNAPSHOT_WAIT:?} (one without nats.snapshots, or of an earlier build, does not)"
        )
    };
    let mut next = async || match tokio::time::timeout_at(deadline, answers.next()).await {
        Ok(Some(message)) if message.status.is_some_and(|s| s == async_nats::StatusCode::NO_RESPONDERS) => {
            Err(format!("no publisher answers snapshot requests on {asked_on}"))
        }
        Ok(Some(message)) => Ok(message.payload),
        Ok(None) => Err(format!("the answer on {asked_on} ended")),
        Err(_) => Err(silent()),
    };
    let hello = next().await?;
    let hello =
        Hello::parse(&hello).map_err(|e| format!("the answer on {asked_on} is no publisher's greeting: {e}"))?;
    let (mut records, mut bytes) = (Vec::new(), 0usize);
    loop {
        let record = next().await?;
        let header = RecordHeader::parse(&record, MAX_SNAPSHOT_BYTES)
            .map_err(|e| format!("a record of the answer on {asked_on}: {e}"))?;
        if record.len() != RecordHeader::LEN + header.length as usize {
            return Err(format!(
                "a record of the answer on {asked_on} says {} bytes and holds {}",
                header.length,
                record.len() - RecordHeader::LEN
            ));
        }
        match header.tag {
            RecordTag::Busy => {
                let reason = String::from_utf8_lossy(&record[RecordHeader::LEN..]);
                return Err(format!("{asked_on}: {reason}"));
            }
            RecordTag::Snapshot => {}
            tag => return Err(format!("a {tag:?} record in the answer on {asked_on}")),
        }
        bytes += record.len();
        if bytes > MAX_SNAPSHOT_BYTES {
            return Err(format!("the answer on {asked_on} is over {MAX_SNAPSHOT_BYTES} bytes"));
        }
        let last = header.frame_count == 0;
        records.push(record);
        if last {
            return Ok((hello.session, records));
        }
    }
}

/// Starts the task that reads missing frames from the stream.
fn start_repairs(jetstream: async_nats::jetstream::Context, name: &str, subject: &str, server: String) -> Repairs {
    let (requests, asked) = mpsc::channel(REPAIR_REQUESTS);
    let (answers, repaired) = mpsc::channel(REPAIRED_QUEUE);
    let fetches = Arc::new(AtomicU64::new(0));
    let task = tokio::spawn(repair(jetstream, name.to_string(), subject.to_string(), asked, answers, fetches.clone()));
    Repairs { requests, repaired, fetches, task, server }
}

/// The repair task: each range asked for is found in the stream and read (see the module's
/// documentation); it ends when the driver is gone.
async fn repair(
    jetstream: async_nats::jetstream::Context,
    name: String,
    subject: String,
    mut asked: mpsc::Receiver<Ask>,
    answers: mpsc::Sender<Repaired>,
    fetches: Arc<AtomicU64>,
) {
    let mut search = StoreSearch::new();
    // Looked up now, while the cluster is whole: the lookup is answered by the stream's leader,
    // which the failure that opens a gap may have taken (its successor takes seconds to be
    // elected, long enough for the gap to leave the window).
    let mut found_stream: Option<JetStream> = jetstream.get_stream(&name).await.ok();
    while let Some(ask) = asked.recv().await {
        if found_stream.is_none() {
            // Not there (yet): the range is asked again at its retry.
            found_stream = jetstream.get_stream(&name).await.ok();
        }
        let (session, request) = ask;
        let Some(stream) = &mut found_stream else { continue };
        let direct = stream.cached_info().config.allow_direct;
        let end = request.first.saturating_add(u64::from(request.count));
        // A range read once is not read again.
        let Some((first, end)) = search.delivered(session, request.first, end) else { continue };
        let positions = subject_positions(stream, &subject, direct).await;
        let mut step = search.begin(session, first, end, positions);
        loop {
            step = match step {
                StoreStep::Look(position) => {
                    fetches.fetch_add(1, Ordering::Relaxed);
                    // A read that failed (a server lost, a leader being elected) is no answer:
                    // taken as "nothing there" it would end the search with frames said gone.
                    // The range is asked again at its retry.
                    let Ok(found) = at_or_after(stream, &subject, position, direct).await else { break };
                    search.looked(position, found.as_ref().map(stored))
                }
                StoreStep::Read(position) => {
                    match read_forward(stream, &subject, position, direct, &mut search, &answers, &fetches).await {
                        Forward::Next(step) => step,
                        Forward::Unreadable => break,
                        Forward::DriverGone => return,
                    }
                }
                StoreStep::Gone { first, count } => {
                    if answers.send(Repaired::Gone { session, first, count }).await.is_err() {
                        return;
                    }
                    search.after_gone()
                }
                StoreStep::NotStored | StoreStep::Done => break,
            };
        }
    }
}

/// The stream positions of the subject's first and last stored messages, the bounds of a
/// search; none when it holds none or they cannot be read now (the range is asked again at its
/// retry).
///
/// With direct gets, any replica answers, so a search goes on while the stream's leader is
/// lost and another is elected; the stream's info (its leader's answer) is the fallback.
async fn subject_positions(stream: &mut JetStream, subject: &str, direct: bool) -> Option<(u64, u64)> {
    if direct {
        let first = stream.direct_get_next_for_subject(subject, Some(1)).await.ok()?;
        let last = stream.direct_get_last_for_subject(subject).await.ok()?;
        return Some((first.sequence, last.sequence));
    }
    match stream.info().await {
        Ok(info) if info.state.messages > 0 => Some((info.state.first_sequence, info.state.last_sequence)),
        _ => None,
    }
}

/// Reads the subject's last stored message, looking the stream up first unless `found`.
async fn read_tail(source: StoreSource, found: Option<JetStream>) -> (Option<JetStream>, TailRead) {
    let stream = match found {
        Some(stream) => stream,
        None => match source.jetstream.get_stream(&source.stream).await {
            Ok(stream) => stream,
            Err(_) => return (None, TailRead::Unreadable),
        },
    };
    let read = last_stored(&stream, &source.subject).await;
    (Some(stream), read)
}

/// The subject's last stored message and its stream position.
async fn last_stored(stream: &JetStream, subject: &str) -> TailRead {
    let last = if stream.cached_info().config.allow_direct {
        match stream.direct_get_last_for_subject(subject).await {
            Ok(last) => last,
            Err(e) if matches!(e.kind(), DirectGetErrorKind::NotFound) => return TailRead::Nothing,
            Err(_) => return TailRead::Unreadable,
        }
    } else {
        match stream.get_last_raw_message_by_subject(subject).await {
            Ok(last) => last,
            Err(e) if matches!(e.kind(), LastRawMessageErrorKind::NoMessageFound) => return TailRead::Nothing,
            Err(_) => return TailRead::Unreadable,
        }
    };
    TailRead::Stored(last.sequence, last.payload)
}

/// How a forward read ended.
enum Forward {
    /// The search's next step after the range (or the session's END) was passed.
    Next(StoreStep),
    /// A read failed: the range is asked again at its retry.
    Unreadable,
    /// The driver is gone.
    DriverGone,
}

/// Reads the stream forward from `position` until the search says stop, handing each datagram
/// to the driver in stream order.
///
/// A direct get is a round trip, and one at a time the read went at about 7,000 messages a
/// second here: too slow to catch up with a live stream of 100,000 frames a second before its
/// window passed the gap. So the reads of the next positions are in flight together, in order;
/// their number doubles with every message read, up to [`READ_AHEAD`], so a gap of one message
/// costs no more than a read or two past it. A read answered by a message further on than asked
/// (other subjects' messages in between) makes the reads of the positions it passed redundant:
/// their answers are dropped.
async fn read_forward(
    stream: &JetStream,
    subject: &str,
    position: u64,
    direct: bool,
    search: &mut StoreSearch,
    answers: &mpsc::Sender<Repaired>,
    fetches: &AtomicU64,
) -> Forward {
    let mut in_flight = futures_util::stream::FuturesOrdered::new();
    let mut ahead = 1usize;
    // The next position to ask for, and the one the search wants next.
    let mut asked = position;
    let mut wanted = position;
    loop {
        while in_flight.len() < ahead {
            let at = asked;
            in_flight.push_back(async move { (at, at_or_after(stream, subject, at, direct).await) });
            fetches.fetch_add(1, Ordering::Relaxed);
            asked = asked.saturating_add(1);
        }
        let Some((at, found)) = in_flight.next().await else { return Forward::Unreadable };
        if at < wanted {
            continue;
        }
        let Ok(found) = found else { return Forward::Unreadable };
        let header = found.as_ref().map(stored);
        if let Some(message) = found
            && header.is_some_and(|h| search.wanted(&h))
            && answers.send(Repaired::Datagram(message.payload)).await.is_err()
        {
            return Forward::DriverGone;
        }
        match search.read(header) {
            StoreStep::Read(next) => {
                wanted = next;
                if wanted >= asked {
                    // Past everything in flight: start again from there.
                    in_flight.clear();
                    asked = wanted;
                }
                ahead = (ahead * 2).min(READ_AHEAD);
            }
            step => return Forward::Next(step),
        }
    }
}

/// The subject's first message stored at or after `position`; none when the stream says there
/// is none; an error when it cannot be read now.
async fn at_or_after(
    stream: &JetStream,
    subject: &str,
    position: u64,
    direct: bool,
) -> Result<Option<StreamMessage>, ()> {
    if direct {
        match stream.direct_get_next_for_subject(subject, Some(position)).await {
            Ok(message) => Ok(Some(message)),
            Err(e) if matches!(e.kind(), DirectGetErrorKind::NotFound) => Ok(None),
            Err(_) => Err(()),
        }
    } else {
        match stream.raw_message_builder().sequence(position).next_by_subject(subject).send().await {
            Ok(message) => Ok(Some(message)),
            Err(e) if matches!(e.kind(), LastRawMessageErrorKind::NoMessageFound) => Ok(None),
            Err(_) => Err(()),
        }
    }
}

/// A stream message's place and relay header; one that is no relay datagram is of no session.
fn stored(message: &StreamMessage) -> Stored {
    match DatagramHeader::parse_datagram(&message.payload) {
        Ok(h) => Stored {
            position: message.sequence,
            session: h.session,
            sequence: h.sequence,
            frames: if h.kind == DatagramKind::Data { u64::from(h.frame_count) } else { 0 },
        },
        Err(_) => Stored { position: message.sequence, session: 0, sequence: 0, frames: 0 },
    }
}
