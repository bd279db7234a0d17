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
//! included) would never be: while the subject is quiet for [`TAIL_PROBE`], the repair task
//! reads the subject's last stored message, and the driver takes it as if it had come live when
//! it is of the session being received and newer than anything taken (a later frame, or the
//! END), which opens the gap behind it. A stored message is taken once: one the machine refuses
//! (a forgery) is counted once, not at every probe.
//!
//! Every wait is on a stream of messages, a queue or a sleep, so a wait that is dropped loses
//! nothing.
//!
//! [`Builder::from_start`]: crate::Builder::from_start
//! [`Builder::nats_stream`]: crate::Builder::nats_stream
//! [`Builder::nats_start_at`]: crate::Builder::nats_start_at
//! [`Builder::recovery_attempts`]: crate::Builder::recovery_attempts

use crate::collect::Collector;
use crate::counters::Counters;
use crate::error::Error;
use crate::net::Clock;
use crate::settings::{NatsAuth, Settings};
use crate::udp::{EndNotes, datagram_notice};
use async_nats::jetstream::consumer::{DeliverPolicy, pull};
use async_nats::jetstream::message::StreamMessage;
use async_nats::jetstream::stream::{DirectGetErrorKind, LastRawMessageErrorKind, Stream as JetStream};
use bytes::Bytes;
use futures_util::StreamExt;
use mdrelay_proto::relay::client::{
    DatagramConfig, DatagramEvent, DatagramReceiver, Origin, ReaderConfig, RecoveryConfig, StoreSearch, StoreStep,
    Stored,
};
use mdrelay_proto::relay::wire::{DatagramHeader, DatagramKind, RetransmitRequest};
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

/// What the driver knows of the stream's tail, read while the live subject is quiet.
#[derive(Default)]
struct Tail {
    /// Session and next frame after the newest datagram taken (nothing is probed before the
    /// first); whether its END was.
    newest: Option<(u64, u64)>,
    end_taken: bool,
    /// The stream position of the last message the probe handed over: a message read again is
    /// not taken again (one the machine refused, a forgery, would be counted at every probe).
    probed: Option<u64>,
    /// A probe is asked for and not answered yet.
    asked: bool,
}

impl Tail {
    /// Notes a datagram taken from the live subject, the replay or the probe.
    fn taken(&mut self, payload: &[u8]) {
        let Ok(h) = DatagramHeader::parse(payload) else { return };
        match h.kind {
            DatagramKind::Data => {
                let next = h.sequence.saturating_add(u64::from(h.frame_count));
                match self.newest {
                    Some((session, newest)) if session == h.session && newest >= next => {}
                    _ => self.newest = Some((h.session, next)),
                }
            }
            _ => self.end_taken = true,
        }
    }

    /// Whether the tail is worth reading: something was taken, and not the END yet.
    fn wanted(&self) -> bool {
        !self.end_taken && self.newest.is_some() && !self.asked
    }

    /// Whether the subject's last stored message, at `position`, is newer than everything
    /// taken. The header is only a hint: the machine checks the message's protection when it
    /// is taken, and a message is taken once whatever it turns out to be.
    fn newer(&mut self, position: u64, payload: &[u8]) -> bool {
        if self.probed == Some(position) {
            return false;
        }
        let Ok(h) = DatagramHeader::parse(payload) else { return false };
        let Some((session, next)) = self.newest else { return false };
        // Only the session being received: a stream also keeps earlier sessions, whose END
        // must not end this one, and a new session comes live anyway.
        let newer = h.session == session
            && match h.kind {
                DatagramKind::Data => h.sequence.saturating_add(u64::from(h.frame_count)) > next,
                // The END, not taken yet (the probe stops once it is).
                _ => true,
            };
        if newer {
            self.probed = Some(position);
        }
        newer
    }
}

/// The replay of a stream from its start, or from a time.
struct Replay {
    messages: pull::Ordered,
    /// The last stream sequence stored when the replay began: the hand-over point.
    until: u64,
}

/// What the repair task hands back.
#[derive(Debug)]
enum Repaired {
    /// A datagram read from the stream.
    Datagram(Bytes),
    /// Frames the stream does not hold.
    Gone { session: u64, first: u64, count: u64 },
    /// The subject's last stored message, at its stream position (none: nothing stored, or it
    /// could not be read now).
    Tail(Option<(u64, Bytes)>),
}

/// What the driver asks of the repair task.
#[derive(Debug)]
enum Ask {
    /// A missing range of a session.
    Range(u64, RetransmitRequest),
    /// The subject's last stored message.
    Tail,
}

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
    /// The stream's tail, read (with a stream) while the live subject is quiet.
    tail: Tail,
    /// When the live subject last delivered (ns of the clock).
    live_at: i64,
    /// The server, as the machine's peer (messages have no address of their own).
    peer: SocketAddr,
    notes: EndNotes,
    clock: Clock,
    /// Connections made to a server of the cluster, the first included.
    connections: Arc<AtomicU64>,
    finished: bool,
}

impl std::fmt::Debug for NatsDriver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NatsDriver")
            .field("peer", &self.peer)
            .field("replaying", &self.replay.is_some())
            .field("repairing", &self.repairs.is_some())
            .finish()
    }
}

impl NatsDriver {
    /// Connects, subscribes, and (from the start or a time) begins the replay.
    pub async fn start(
        servers: &[String],
        subject: &str,
        stream: Option<&str>,
        settings: &Settings,
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
        let jetstream = async_nats::jetstream::new(client.clone());
        let start = match (settings.from_start, settings.nats.start_at) {
            (true, _) => Some(DeliverPolicy::All),
            (false, Some(time)) => Some(DeliverPolicy::ByStartTime { start_time: time.into() }),
            _ => None,
        };
        let replay = match (stream, start) {
            // A replay needs the stream now; live, it is looked up when a gap is (the
            // subscriber may start before the publisher creates it).
            (Some(name), Some(policy)) => {
                let not_found = |e: String| Error::config("nats_stream", format!("{name:?}: {e}"));
                let js = jetstream.get_stream(name).await.map_err(|e| not_found(e.to_string()))?;
                start_replay(&js, subject, policy).await?
            }
            _ => None,
        };
        let repairs = match (stream, &settings.recovery) {
            (Some(name), Some(recovery)) => Some(start_repairs(jetstream, name, subject, recovery.server.clone())),
            _ => None,
        };
        let config = DatagramConfig {
            reader: ReaderConfig {
                crc: settings.protection.crc,
                key: settings.key.clone(),
                symbols: settings.symbols.clone(),
                ..ReaderConfig::default()
            },
            from_start: settings.from_start,
            lines: None,
            recovery: settings.recovery.as_ref().map(|r| RecoveryConfig {
                delay: r.delay,
                retry: r.retry,
                attempts: r.attempts,
                linger: r.linger,
            }),
        };
        Ok(NatsDriver {
            receiver: DatagramReceiver::new(config).with_store_recovery(),
            live,
            replay,
            held: VecDeque::new(),
            tail: Tail::default(),
            repairs,
            live_at: clock.now(),
            peer,
            notes: EndNotes::default(),
            clock,
            connections,
            finished: false,
        })
    }

    /// The stream ended.
    pub fn is_finished(&self) -> bool {
        self.finished
    }

    /// Moves messages until the machine has something for the caller, or the stream is over.
    pub async fn step(&mut self, out: &mut Collector) -> Result<(), Error> {
        loop {
            self.pump(out);
            if out.has_items() || self.finished {
                return Ok(());
            }
            let now = self.clock.now();
            if let Some(deadline) = self.receiver.deadline()
                && deadline <= now
            {
                self.receiver.on_timeout(now);
                self.ask_repairs();
                continue;
            }
            if self.replay.is_none()
                && let Some(message) = self.held.pop_front()
            {
                self.take(&message, out);
                continue;
            }
            self.wait(out).await?;
        }
    }

    /// Hands the ranges the book asks for to the repair task; a range that does not fit its
    /// queue is asked again at its retry.
    fn ask_repairs(&mut self) {
        while let Some((session, range)) = self.receiver.next_store_request() {
            if let Some(repairs) = &self.repairs {
                let _ = repairs.requests.try_send(Ask::Range(session, range));
            }
        }
    }

    /// Waits for a message (the replay's first, then the live ones), a repaired datagram, or
    /// the machine's deadline.
    async fn wait(&mut self, out: &mut Collector) -> Result<(), Error> {
        let clock = self.clock;
        let deadline = self.receiver.deadline();
        let sleep = async move {
            match deadline {
                Some(d) => tokio::time::sleep_until(clock.instant(d)).await,
                None => std::future::pending().await,
            }
        };
        let hold_more = self.held.len() < MAX_HELD;
        // Quiet for TAIL_PROBE (not while replaying: the replay reads the stream anyway).
        let probe_at = self.live_at.saturating_add(TAIL_PROBE.as_nanos() as i64);
        let probing = self.repairs.is_some() && self.replay.is_none() && self.tail.wanted();
        let quiet = async move {
            if probing { tokio::time::sleep_until(clock.instant(probe_at)).await } else { std::future::pending().await }
        };
        let repaired = async {
            match &mut self.repairs {
                Some(r) => r.repaired.recv().await,
                None => std::future::pending().await,
            }
        };
        enum Woke {
            Replayed(Option<Result<Box<async_nats::jetstream::Message>, String>>),
            Live(Option<async_nats::Message>),
            Repaired(Option<Repaired>),
            Slept,
            Quiet,
        }
        let woke = match &mut self.replay {
            Some(replay) => {
                tokio::select! {
                    replayed = replay.messages.next() => Woke::Replayed(replayed.map(|r| r.map(Box::new).map_err(|e| e.to_string()))),
                    live = self.live.next(), if hold_more => Woke::Live(live),
                    repaired = repaired => Woke::Repaired(repaired),
                    _ = sleep => Woke::Slept,
                }
            }
            None => {
                tokio::select! {
                    live = self.live.next() => Woke::Live(live),
                    repaired = repaired => Woke::Repaired(repaired),
                    _ = sleep => Woke::Slept,
                    _ = quiet => Woke::Quiet,
                }
            }
        };
        match woke {
            Woke::Replayed(Some(Ok(message))) => {
                let until = self.replay.as_ref().map_or(0, |r| r.until);
                // Caught up: the subject's last message when the replay began, or nothing
                // pending (the live subscription has all that follows).
                let done = message.info().map_or(true, |i| i.stream_sequence >= until || i.pending == 0);
                self.take(&message.message.payload.clone(), out);
                if done {
                    self.replay = None;
                }
            }
            Woke::Replayed(Some(Err(e))) => {
                return Err(Error::Io {
                    context: format!("replaying the NATS stream: {e}"),
                    source: std::io::Error::other(e),
                });
            }
            Woke::Replayed(None) => self.replay = None,
            Woke::Live(Some(message)) if self.replay.is_some() => {
                self.live_at = self.clock.now();
                self.held.push_back(message.payload)
            }
            Woke::Live(Some(message)) => {
                self.live_at = self.clock.now();
                self.take(&message.payload, out)
            }
            Woke::Live(None) => return Err(self.closed()),
            Woke::Repaired(Some(Repaired::Datagram(bytes))) => {
                // Recovered frames name where they came from: the server that answered.
                out.recovery_peer = Some(self.peer);
                self.receiver.store_datagram(&bytes, self.clock.now(), self.clock.wall(), out);
            }
            Woke::Repaired(Some(Repaired::Gone { session, first, count })) => {
                self.receiver.store_gone(session, first, count);
            }
            Woke::Repaired(Some(Repaired::Tail(last))) => {
                if let Some((position, payload)) = last
                    && self.tail.newer(position, &payload)
                {
                    self.take(&payload, out);
                }
                self.tail.asked = false;
            }
            // The task ended (it cannot read the stream any more): what is missing is given
            // up at its attempts.
            Woke::Repaired(None) => self.repairs = None,
            Woke::Slept => {}
            Woke::Quiet => {
                // The tail is read by the repair task (a round trip the live subject does not
                // wait for); the next probe is a quiet period after its answer.
                self.live_at = self.clock.now();
                if let Some(repairs) = &self.repairs {
                    self.tail.asked = repairs.requests.try_send(Ask::Tail).is_ok();
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
    fn take(&mut self, payload: &[u8], out: &mut Collector) {
        let now = self.clock.now();
        out.stream_peer = Some(self.peer);
        self.tail.taken(payload);
        self.receiver.datagram(Origin::Stream, payload, self.peer, now, self.clock.wall(), out);
        // Echoes have no way back over a subject: the publisher reads none.
        while self.receiver.next_echo().is_some() {}
    }

    /// Takes the machine's events.
    fn pump(&mut self, out: &mut Collector) {
        while let Some(event) = self.receiver.poll_event(out) {
            let notice = match event {
                DatagramEvent::End { next_sequence, totals, .. } => {
                    self.notes.ended(next_sequence, totals);
                    continue;
                }
                DatagramEvent::Finished => {
                    self.finish_run(out);
                    let counters = self.counters_with(out);
                    self.notes.finished(&counters)
                }
                other => match datagram_notice(other) {
                    Some(notice) => notice,
                    None => continue,
                },
            };
            out.notice(notice);
        }
        self.notes.note_given_up(&self.receiver, out);
    }

    /// The run is over: what is still missing is given up, and the repairs stop.
    fn finish_run(&mut self, out: &mut Collector) {
        if !self.finished {
            self.finished = true;
            self.receiver.finish_run();
            self.notes.note_given_up(&self.receiver, out);
            if let Some(repairs) = &self.repairs {
                repairs.task.abort();
            }
        }
    }

    /// Ends the stream now.
    pub fn close(&mut self, out: &mut Collector) {
        self.finish_run(out);
    }

    /// What was counted, with what the collector counted.
    pub fn counters_with(&self, out: &Collector) -> Counters {
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
}

/// Connects to the servers with the credentials and TLS asked for, counting every connection
/// made (the client's reconnections to any server of the cluster included) in `connections`;
/// credentials or TLS the server refuses are a [`Error::Config`] naming the setting.
async fn connect(
    servers: &[String],
    settings: &Settings,
    connections: Arc<AtomicU64>,
) -> Result<async_nats::Client, Error> {
    let unreachable = |reason: String| Error::Unreachable { address: servers.join(","), reason };
    let addrs: Vec<async_nats::ServerAddr> = servers
        .iter()
        .map(|url| url.parse().map_err(|e| Error::config("nats", format!("{url:?}: {e}"))))
        .collect::<Result<_, _>>()?;
    let mut options = async_nats::ConnectOptions::new()
        .name("mdrelay-client")
        .max_reconnects(None)
        .connection_timeout(settings.connect_timeout)
        .event_callback(move |event| {
            if matches!(event, async_nats::Event::Connected) {
                connections.fetch_add(1, Ordering::Relaxed);
            }
            std::future::ready(())
        });
    let setting = match &settings.nats.auth {
        NatsAuth::None => "nats",
        NatsAuth::Creds(path) => {
            options = options
                .credentials_file(path)
                .await
                .map_err(|e| Error::config("nats_creds_file", format!("{}: {e}", path.display())))?;
            "nats_creds_file"
        }
        NatsAuth::Nkey(path) => {
            options = options.nkey(secret("nats_nkey_file", path)?);
            "nats_nkey_file"
        }
        NatsAuth::UserPassword(user, path) => {
            options = options.user_and_password(user.clone(), secret("nats_password_file", path)?);
            "nats_password_file"
        }
    };
    if let Some(n) = settings.nats.pending_messages {
        options = options.subscription_capacity(n);
    }
    if let Some(ca) = &settings.nats.tls_ca_file {
        options = options.add_root_certificates(ca.clone()).require_tls(true);
    }
    options.connect(addrs).await.map_err(|e| {
        use async_nats::ConnectErrorKind as Kind;
        match e.kind() {
            Kind::Authentication | Kind::AuthorizationViolation => {
                Error::config(setting, format!("the NATS server refused the credentials: {e}"))
            }
            Kind::Tls => Error::config("nats_tls_ca_file", format!("TLS with the NATS server failed: {e}")),
            _ => unreachable(e.to_string()),
        }
    })
}

/// A secret from a file, the white space around it trimmed.
fn secret(setting: &'static str, path: &std::path::Path) -> Result<String, Error> {
    std::fs::read_to_string(path)
        .map(|text| text.trim().to_string())
        .map_err(|e| Error::config(setting, format!("cannot read {}: {e}", path.display())))
}

/// The ordered consumer over the stream from `policy`'s start, and where it hands over to the
/// live subscription; `None` when the stream holds nothing from there yet.
async fn start_replay(stream: &JetStream, subject: &str, policy: DeliverPolicy) -> Result<Option<Replay>, Error> {
    let name = stream.cached_info().config.name.clone();
    let not_found = |e: String| Error::config("nats_stream", format!("{name:?}: {e}"));
    // The subject's last message now; none: nothing to replay.
    let Ok(last) = stream.get_last_raw_message_by_subject(subject).await else { return Ok(None) };
    if let DeliverPolicy::ByStartTime { start_time } = policy
        && last.time < start_time
    {
        // Nothing stored from that time on: the live subject has it all.
        return Ok(None);
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
    Ok(Some(Replay { messages, until: last.sequence }))
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
        let (session, request) = match ask {
            Ask::Range(session, request) => (session, request),
            Ask::Tail => {
                let last = match &found_stream {
                    Some(stream) => last_stored(stream, &subject).await,
                    None => None,
                };
                if answers.send(Repaired::Tail(last)).await.is_err() {
                    return;
                }
                continue;
            }
        };
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

/// The subject's last stored message and its stream position; none when there is none or it
/// cannot be read now.
async fn last_stored(stream: &JetStream, subject: &str) -> Option<(u64, Bytes)> {
    let last = if stream.cached_info().config.allow_direct {
        stream.direct_get_last_for_subject(subject).await.ok()?
    } else {
        stream.get_last_raw_message_by_subject(subject).await.ok()?
    };
    Some((last.sequence, last.payload))
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
    match DatagramHeader::parse(&message.payload) {
        Ok(h) => Stored {
            position: message.sequence,
            session: h.session,
            sequence: h.sequence,
            frames: if h.kind == DatagramKind::Data { u64::from(h.frame_count) } else { 0 },
        },
        Err(_) => Stored { position: message.sequence, session: 0, sequence: 0, frames: 0 },
    }
}
