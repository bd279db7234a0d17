//! Loss recovery for UDP and multicast subscribers: the bookkeeping of missing frames
//! ([`RecoveryBook`], no I/O) and the task that asks the publisher's retransmission service for
//! them over TCP ([`Client`]).
//!
//! The receive loop owns the book: every frame taken goes through it, so it knows which frames
//! are missing, asks for them (through the client's bounded channel, never waiting), and takes
//! the answers. The client task owns the TCP connection: it connects on the first request,
//! greets, forwards requests and hands every answer back; when the connection is lost it
//! reconnects with backoff on the next request. A service too full to take the connection says
//! BUSY instead of greeting: that is counted like any BUSY answer (and apart, as
//! `busy_at_connect`) and connected to again the same way. A connection the service closed for
//! asking nothing is made again at the next request, without a warning. Neither side ever waits
//! for the other: a request that does not fit the channel is asked again at its retry.
//!
//! Accounting is exact: a frame found missing is opened exactly once (ahead of the highest
//! frame, at the tail an END names, or below the lowest), and ends up recovered, filled late by
//! its original, or unrecoverable. A frame given up and then taken after all (its original came
//! late) moves from unrecoverable to filled late. So once everything still missing is given up,
//! the frames the stream counts as lost are exactly the unrecoverable ones.

use crate::buffer::{ReadBuf, read_some};
use hdrhistogram::Histogram;
use mdrelay_proto::clock::wall_clock_ns;
use mdrelay_proto::latency::{LatencySummary, latency_histogram};
use mdrelay_proto::relay::Protection;
use mdrelay_proto::relay::window::WINDOW;
use mdrelay_proto::relay::{
    GapList, HELLO_MAGIC, HandshakeError, Hello, Purpose, RecordHeader, RecordTag, RecoveryCounts, RecoveryPolicy,
    RetransmitRequest, Subscribe, parse_gone,
};
use mdrelay_proto::warn;
use serde::Serialize;
use std::io;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio::time::timeout;

/// Frames asked for in one request at most: the most a publisher serves per request
/// (`retransmit.max_range` is at most 65,535); it serves fewer when its own limit is lower, and
/// the rest is asked again at the retry.
pub const MAX_REQUEST_FRAMES: u32 = 65_535;
/// Requests sent per timer tick at most, so a burst of gaps cannot hold up the receive loop.
pub const MAX_REQUESTS_PER_TICK: usize = 256;
/// Requests waiting for the client task.
const ASK_QUEUE: usize = 1024;
/// Answers waiting for the receive loop: up to 64 `DATA` records of a publisher's 64 KiB.
const ANSWER_QUEUE: usize = 64;
/// Request bytes waiting for the socket before no more requests are taken from the queue.
const MAX_PENDING_OUT: usize = 64 << 10;
/// First wait before reconnecting; doubles up to [`MAX_BACKOFF`].
const INITIAL_BACKOFF: Duration = Duration::from_millis(50);
/// Longest wait between connection attempts: missing frames are worth little after a second.
const MAX_BACKOFF: Duration = Duration::from_secs(1);
/// A connection attempt that takes longer is abandoned (and retried).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// The service must greet, and take the answer, within this time.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest reason a `BUSY` or `REFUSE` record before the greeting may carry.
const MAX_REASON: usize = 4096;
/// Read buffer of the connection; grows (doubling) only for records larger than this.
const READ_BUFFER: usize = 128 << 10;
/// Largest answer record taken. A publisher's records hold up to 64 KiB of frames, or one frame
/// of a datagram's size at most; the bound keeps the answers queued to the loop within
/// [`ANSWER_QUEUE`] MiB whatever a service sends.
const MAX_ANSWER_RECORD: usize = 1 << 20;

/// When to ask, from the settings.
pub fn policy(delay: Duration, retry: Duration, attempts: u32) -> RecoveryPolicy {
    RecoveryPolicy {
        delay_ns: i64::try_from(delay.as_nanos()).unwrap_or(i64::MAX),
        retry_ns: i64::try_from(retry.as_nanos()).unwrap_or(i64::MAX),
        attempts,
        max_frames: MAX_REQUEST_FRAMES,
    }
}

fn plus(a: RecoveryCounts, b: RecoveryCounts) -> RecoveryCounts {
    RecoveryCounts {
        gaps_detected: a.gaps_detected + b.gaps_detected,
        frames_missing: a.frames_missing + b.frames_missing,
        frames_recovered: a.frames_recovered + b.frames_recovered,
        frames_filled_late: a.frames_filled_late + b.frames_filled_late,
        frames_unrecoverable: a.frames_unrecoverable + b.frames_unrecoverable,
        requests: a.requests + b.requests,
    }
}

/// The missing frames of the stream and what became of them, across sessions.
#[derive(Debug)]
pub struct RecoveryBook {
    gaps: GapList,
    policy: RecoveryPolicy,
    /// Counts of the gap lists of earlier sessions (or numberings).
    earlier: RecoveryCounts,
    /// The tracker's epoch the gap list belongs to.
    epoch: u64,
    /// Lowest frame taken in this epoch.
    low: Option<u64>,
    /// Every frame below this (and from `low` on) was taken or found missing.
    opened_to: u64,
    /// Frames given up and then taken after all: counted unrecoverable by the gap list, they
    /// are reported as filled late.
    arrived_after_give_up: u64,
    /// Frames given up, by cause (those out of attempts are the rest).
    given_up: GivenUp,
    /// Retransmitted frames not missing (any more): already there, given up, or of a request
    /// answered twice.
    redundant: u64,
    busy_answers: u64,
    busy_at_connect: u64,
    gone_frames: u64,
    requests_deferred: u64,
    connections: u64,
    latency: Histogram<u64>,
    /// The service cannot serve this subscriber: nothing more is asked.
    refused: bool,
}

impl RecoveryBook {
    /// A book that asks by `policy`.
    pub fn new(policy: RecoveryPolicy) -> RecoveryBook {
        RecoveryBook {
            gaps: GapList::new(),
            policy,
            earlier: RecoveryCounts::default(),
            epoch: 0,
            low: None,
            opened_to: 0,
            arrived_after_give_up: 0,
            given_up: GivenUp::default(),
            redundant: 0,
            busy_answers: 0,
            busy_at_connect: 0,
            gone_frames: 0,
            requests_deferred: 0,
            connections: 0,
            latency: latency_histogram(),
            refused: false,
        }
    }

    /// Every frame from `first` on is owed (`--from-start`: from the session's first), so the
    /// frames before the first one taken are missing too. Only before anything is taken.
    pub fn expect_from(&mut self, first: u64) {
        if self.low.is_none() {
            self.low = Some(first);
            self.opened_to = first;
        }
    }

    /// Follows the tracker's `epoch`: when sequence tracking started over (a publisher restart,
    /// a corrected numbering), the old numbers mean nothing any more and their gaps are given up.
    pub fn sync(&mut self, epoch: u64) {
        if epoch == self.epoch {
            return;
        }
        self.given_up.other_session += self.gaps.give_up_all();
        self.earlier = plus(self.earlier, self.gaps.counts());
        self.gaps = GapList::new();
        self.epoch = epoch;
        self.low = None;
        self.opened_to = 0;
    }

    /// A frame of the stream was taken (not a retransmission): opens the frames it shows
    /// missing, or closes the gap it fills. `highest` is the stream's highest frame now.
    pub fn original(&mut self, seq: u64, highest: Option<u64>, now: i64) {
        match self.low {
            None => {
                self.low = Some(seq);
                self.opened_to = seq.saturating_add(1);
            }
            Some(low) if seq < low => {
                // Below every frame so far: the frames in between were missing all along.
                self.gaps.open(seq + 1, low, now);
                self.low = Some(seq);
            }
            Some(_) if seq < self.opened_to => {
                if self.gaps.fill(seq, false, now).is_none() {
                    // Not open: it was given up (gone, out of attempts, too many gaps) and
                    // came after all.
                    self.arrived_after_give_up += 1;
                }
            }
            Some(_) => {
                self.gaps.open(self.opened_to, seq, now);
                self.opened_to = seq.saturating_add(1);
            }
        }
        self.slide(highest);
        self.refused_gives_up();
    }

    /// Once the service refused, a gap is given up as soon as it is found.
    fn refused_gives_up(&mut self) {
        if self.refused && !self.gaps.is_empty() {
            self.given_up.refused += self.gaps.give_up_all();
        }
    }

    /// A retransmitted frame arrived: true when it was missing (take it), false when it is not
    /// (do not).
    pub fn recovered(&mut self, seq: u64, now: i64) -> bool {
        match self.gaps.fill(seq, true, now) {
            Some(ns) => {
                self.latency.saturating_record(u64::try_from(ns).unwrap_or(0));
                true
            }
            None => {
                self.redundant += 1;
                false
            }
        }
    }

    /// Gives up the frames the stream's window no longer reaches (they could not be taken).
    pub fn slide(&mut self, highest: Option<u64>) {
        if let Some(high) = highest
            && high >= WINDOW
        {
            // Frames at or below `high - WINDOW` are too late for the window.
            self.given_up.too_old += self.gaps.give_up_below(high - (WINDOW - 1));
        }
    }

    /// The publisher's END: frames up to `next` were sent, so those not seen are missing.
    pub fn end(&mut self, next: u64, now: i64) {
        if self.low.is_some() && next > self.opened_to {
            self.gaps.open(self.opened_to, next, now);
            self.opened_to = next;
        }
        self.refused_gives_up();
    }

    /// The requests due now (none once the service refused).
    pub fn due(&mut self, now: i64, max: usize) -> Vec<RetransmitRequest> {
        if self.refused {
            self.refused_gives_up();
            return Vec::new();
        }
        self.gaps.due(now, &self.policy, max)
    }

    /// Retransmitted frames of another session than the stream's arrived: not taken.
    pub fn not_taken(&mut self, frames: u64) {
        self.redundant += frames;
    }

    /// A request could not be queued: it is asked again at its retry.
    pub fn deferred(&mut self) {
        self.requests_deferred += 1;
    }

    /// The service no longer holds `count` frames from `first`.
    pub fn gone(&mut self, first: u64, count: u64) {
        self.gone_frames = self.gone_frames.saturating_add(count);
        self.given_up.gone += self.gaps.give_up(first, first.saturating_add(count));
    }

    /// The service serves another session than the stream's: it cannot have these `count`
    /// frames from `first`.
    pub fn other_session(&mut self, first: u64, count: u64) {
        self.given_up.other_session += self.gaps.give_up(first, first.saturating_add(count));
    }

    /// The service was over its rate limit, or made this connection leave for another client;
    /// the frames are asked again at their retry.
    pub fn busy(&mut self) {
        self.busy_answers += 1;
    }

    /// The service answered a connection with BUSY (it was full); the frames are asked again at
    /// their retry, over a connection made with backoff.
    pub fn busy_at_connect(&mut self) {
        self.busy_answers += 1;
        self.busy_at_connect += 1;
    }

    /// A connection to the service was set up.
    pub fn connected(&mut self) {
        self.connections += 1;
    }

    /// The service will not serve this subscriber: everything missing is given up, and so is
    /// every gap found from now on.
    pub fn refuse(&mut self) {
        self.refused = true;
        self.refused_gives_up();
    }

    /// True once the service refused.
    pub fn is_refused(&self) -> bool {
        self.refused
    }

    /// Frames missing now and not given up on.
    pub fn missing(&self) -> u64 {
        self.gaps.open_frames()
    }

    /// True when nothing is missing.
    pub fn is_empty(&self) -> bool {
        self.gaps.is_empty()
    }

    /// Gives up everything still missing (the end of the run); returns how many frames.
    pub fn give_up_all(&mut self) -> u64 {
        let frames = self.gaps.give_up_all();
        self.given_up.at_end += frames;
        frames
    }

    /// The counts over every session, with frames given up and taken after all counted as
    /// filled late.
    pub fn counts(&self) -> RecoveryCounts {
        let mut c = plus(self.earlier, self.gaps.counts());
        c.frames_unrecoverable -= self.arrived_after_give_up.min(c.frames_unrecoverable);
        c.frames_filled_late += self.arrived_after_give_up;
        c
    }

    /// The report's `recovery` object.
    pub fn report(&self, server: &str) -> RecoveryReport {
        let c = self.counts();
        let all = plus(self.earlier, self.gaps.counts()).frames_unrecoverable;
        let g = self.given_up;
        let named = g.gone + g.too_old + g.other_session + g.refused + g.at_end;
        let causes = UnrecoverableCauses {
            gone: g.gone,
            too_old: g.too_old,
            out_of_attempts: all.saturating_sub(named),
            other_session: g.other_session,
            refused: g.refused,
            at_end: g.at_end,
        };
        RecoveryReport {
            enabled: true,
            server: Some(server.to_string()),
            gaps_detected: c.gaps_detected,
            frames_missing: c.frames_missing,
            frames_recovered: c.frames_recovered,
            frames_filled_late: c.frames_filled_late,
            frames_unrecoverable: c.frames_unrecoverable,
            unrecoverable_causes: causes,
            frames_still_missing: self.missing(),
            requests: c.requests,
            requests_deferred: self.requests_deferred,
            busy_answers: self.busy_answers,
            busy_at_connect: self.busy_at_connect,
            gone_frames: self.gone_frames,
            frames_redundant: self.redundant,
            connections: self.connections,
            refused: self.refused,
            latency_ns: LatencySummary::of(&self.latency),
        }
    }
}

/// Loss recovery in the report.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct RecoveryReport {
    /// Whether recovery was configured.
    pub enabled: bool,
    /// The retransmission service.
    pub server: Option<String>,
    /// Gaps found (runs of consecutive missing frames).
    pub gaps_detected: u64,
    /// Frames in those gaps.
    pub frames_missing: u64,
    /// Frames filled by a retransmission.
    pub frames_recovered: u64,
    /// Frames filled by their original arriving late.
    pub frames_filled_late: u64,
    /// Frames given up: gone from the publisher's ring, out of attempts, too old for the
    /// window, or still missing at the end. Equals the stream's `gaps` at the end of a run.
    pub frames_unrecoverable: u64,
    /// Why frames were given up (one given up and then taken after all, its original late,
    /// is counted here all the same).
    pub unrecoverable_causes: UnrecoverableCauses,
    /// Frames missing when the report was made and not given up (0 in a final report).
    pub frames_still_missing: u64,
    /// Requests sent.
    pub requests: u64,
    /// Requests that did not fit the queue to the service (asked again at their retry).
    pub requests_deferred: u64,
    /// BUSY answers from the service: requests over its rate limit, connections it was too full
    /// to take (`busy_at_connect`), and connections it made leave for another client.
    pub busy_answers: u64,
    /// Connections the service answered BUSY at once, being full (retried with backoff).
    pub busy_at_connect: u64,
    /// Frames the service answered GONE for.
    pub gone_frames: u64,
    /// Retransmitted frames that were not missing (any more): not taken.
    pub frames_redundant: u64,
    /// Connections to the service set up.
    pub connections: u64,
    /// The service refused this subscriber (or cannot serve it): recovery stopped.
    pub refused: bool,
    /// Time from a gap being seen to its frame's retransmission arriving.
    pub latency_ns: LatencySummary,
}

/// Frames given up, by cause, as the book counts them.
#[derive(Clone, Copy, Debug, Default)]
struct GivenUp {
    gone: u64,
    too_old: u64,
    other_session: u64,
    refused: u64,
    at_end: u64,
}

/// Why frames were given up.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct UnrecoverableCauses {
    /// The service answered GONE: its ring no longer held them.
    pub gone: u64,
    /// The sequence window moved past them: a retransmission could no longer be taken.
    pub too_old: u64,
    /// Asked for as many times as `recovery_attempts` allows without an answer, or found
    /// missing while too many gaps were open already.
    pub out_of_attempts: u64,
    /// Their session ended (a publisher restart) before they came, or the service serves
    /// another session.
    pub other_session: u64,
    /// The service refused this subscriber, or cannot serve it.
    pub refused: u64,
    /// Still missing when the run ended (after the linger, or at a stop).
    pub at_end: u64,
}

/// A request for the client task: frames of the stream's `session`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ask {
    /// The session the frames belong to.
    pub session: u64,
    /// The frames.
    pub request: RetransmitRequest,
}

/// What the client task hands back.
#[derive(Debug)]
pub enum Answer {
    /// A connection was set up; the service serves `session`.
    Connected {
        /// The service's address.
        peer: SocketAddr,
        /// The publisher session it serves.
        session: u64,
    },
    /// A `DATA` record of retransmitted frames of `session`.
    Data {
        /// The service's address.
        peer: SocketAddr,
        /// The session of the connection the record came on.
        session: u64,
        /// The record's header: format, frame count, first frame.
        header: RecordHeader,
        /// The frames.
        payload: Vec<u8>,
        /// Where the payload starts in the connection's bytes (from the greeting), for messages.
        offset: u64,
        /// When it was read, ns since the epoch.
        receive_time: i64,
    },
    /// `count` frames of `session` from `first` cannot be had.
    Gone {
        /// The session they belong to.
        session: u64,
        /// The first.
        first: u64,
        /// How many.
        count: u64,
    },
    /// The service serves another session than `session`, so it cannot have `count` frames
    /// from `first` (never asked: a publisher serves its own session only).
    OtherSession {
        /// The session the frames belong to.
        session: u64,
        /// The first.
        first: u64,
        /// How many.
        count: u64,
    },
    /// The request for frames from `first` was over the service's rate limit (or, with `first`
    /// 0, the service made this connection leave for another client).
    Busy {
        /// The request's first frame.
        first: u64,
    },
    /// The service was full when connected to, and said so instead of greeting: it is
    /// connected to again, with backoff, when there is something to ask.
    BusyAtConnect,
    /// The service will not serve this subscriber; do not ask again. The reason names it.
    Refused(String),
}

/// The receive loop's end of the client task; dropping it ends the task.
pub struct Client {
    asks: mpsc::Sender<Ask>,
    answers: mpsc::Receiver<Answer>,
    task: tokio::task::JoinHandle<()>,
}

impl Client {
    /// Starts the task for the service at `server` (`host:port`), expecting frames protected
    /// with `protection`; it connects on the first request.
    pub fn start(server: String, protection: Protection) -> Client {
        let (asks, ask_rx) = mpsc::channel(ASK_QUEUE);
        let (answer_tx, answers) = mpsc::channel(ANSWER_QUEUE);
        let task = tokio::spawn(serve(server, protection, ask_rx, answer_tx));
        Client { asks, answers, task }
    }

    /// Queues a request without waiting: false when the queue is full (or the task is gone).
    pub fn ask(&self, ask: Ask) -> bool {
        self.asks.try_send(ask).is_ok()
    }

    /// The next answer; `None` once the task has ended. Cancel-safe.
    pub async fn answer(&mut self) -> Option<Answer> {
        self.answers.recv().await
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Why a connection attempt or a connection ended.
enum Ended {
    /// Try again later.
    Retry(String),
    /// The service is full: try again later.
    Busy(String),
    /// The service closed the connection between answers, with nothing of ours unsent (it
    /// closes connections that ask nothing for a while): connect again at the next request,
    /// after the shortest backoff.
    Quiet,
    /// The service refuses: stop.
    Refused(String),
    /// The receive loop is gone.
    Closed,
}

/// The client task: connects when there is something to ask, and again after a loss.
async fn serve(server: String, protection: Protection, mut asks: mpsc::Receiver<Ask>, answers: mpsc::Sender<Answer>) {
    let mut backoff = INITIAL_BACKOFF;
    let mut pending: Option<Ask> = None;
    loop {
        if pending.is_none() {
            match asks.recv().await {
                Some(ask) => pending = Some(ask),
                None => return,
            }
        }
        let ended = match connect(&server, protection).await {
            Ok((stream, peer, hello)) => {
                tracing::info!(service = %peer, session = format_args!("{:#x}", hello.session), "recovery connection set up");
                if answers.send(Answer::Connected { peer, session: hello.session }).await.is_err() {
                    return;
                }
                let (ended, answered) = session(stream, peer, hello.session, &mut pending, &mut asks, &answers).await;
                if answered {
                    backoff = INITIAL_BACKOFF;
                }
                ended
            }
            Err(ended) => ended,
        };
        let busy = matches!(ended, Ended::Busy(_));
        match ended {
            Ended::Closed => return,
            Ended::Refused(why) => {
                let _ = answers.send(Answer::Refused(why)).await;
                return;
            }
            Ended::Quiet => {
                tracing::debug!(service = %server, "the retransmission service closed an idle connection");
                pending = None;
                // Something was answered, so this is the shortest wait: a service that keeps
                // closing connections still gets no more than one a backoff.
                tokio::time::sleep(backoff).await;
            }
            Ended::Busy(why) | Ended::Retry(why) => {
                if busy && answers.send(Answer::BusyAtConnect).await.is_err() {
                    return;
                }
                if warn::allow("recovery connection") {
                    tracing::warn!(service = %server, retry_in = ?backoff, "recovery connection: {why}");
                }
                // The next connection waits for the next request: the frames still missing are
                // asked again at their retry, and ones given up meanwhile need no connection.
                pending = None;
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(MAX_BACKOFF);
            }
        }
    }
}

/// Connects, reads the greeting and answers it for a recovery connection.
async fn connect(server: &str, protection: Protection) -> Result<(TcpStream, SocketAddr, Hello), Ended> {
    let mut stream = match timeout(CONNECT_TIMEOUT, TcpStream::connect(server)).await {
        Err(_) => return Err(Ended::Retry(format!("connecting took longer than {CONNECT_TIMEOUT:?}"))),
        Ok(Err(e)) => return Err(Ended::Retry(format!("cannot connect: {e}"))),
        Ok(Ok(s)) => s,
    };
    let peer = stream.peer_addr().map_err(|e| Ended::Retry(format!("connection lost at once: {e}")))?;
    // Requests are small and wanted at once.
    let _ = stream.set_nodelay(true);
    let hello = match timeout(HANDSHAKE_TIMEOUT, greeting(&mut stream, peer)).await {
        Err(_) => return Err(Ended::Retry(format!("{peer} sent no greeting within {HANDSHAKE_TIMEOUT:?}"))),
        Ok(r) => r?,
    };
    if hello.protocol_version < 2 {
        return Err(Ended::Refused(format!(
            "{peer} speaks relay protocol version {}, which has no retransmission service",
            hello.protocol_version
        )));
    }
    if hello.protection != protection {
        return Err(Ended::Refused(format!(
            "{peer} protects its frames with {} and this subscriber expects {protection}: configure the same [protection] on both",
            hello.protection
        )));
    }
    let answer = Subscribe { purpose: Purpose::Recovery, protection, ..Subscribe::new(false) }
        .negotiated(hello.protocol_version);
    match timeout(HANDSHAKE_TIMEOUT, stream.write_all(&answer.to_bytes())).await {
        Err(_) => Err(Ended::Retry(format!("{peer} does not read the subscription"))),
        Ok(Err(e)) => Err(Ended::Retry(format!("sending the subscription to {peer}: {e}"))),
        Ok(Ok(())) => Ok((stream, peer, hello)),
    }
}

/// Reads the greeting, or the `BUSY` or `REFUSE` record a service sends instead.
async fn greeting(stream: &mut TcpStream, peer: SocketAddr) -> Result<Hello, Ended> {
    let mut bytes = [0u8; Hello::LEN];
    let mut have = 0;
    while have < Hello::LEN {
        let n = read_into(stream, &mut bytes[have..])
            .await
            .map_err(|e| Ended::Retry(format!("reading the greeting of {peer} at byte {have}: {e}")))?;
        if n == 0 {
            return Err(Ended::Retry(format!("{peer} closed after {have} bytes of the greeting")));
        }
        have += n;
        if have >= RecordHeader::LEN && bytes[..8] != HELLO_MAGIC {
            // Not a greeting: a record saying why not, or something else altogether.
            if let Ok(header) = RecordHeader::parse(&bytes[..RecordHeader::LEN], MAX_REASON)
                && matches!(header.tag, RecordTag::Busy | RecordTag::Refuse)
            {
                let reason = reason(stream, &bytes[RecordHeader::LEN..have], header.length as usize).await;
                return Err(if header.tag == RecordTag::Busy {
                    Ended::Busy(format!("{peer} is busy: {reason}"))
                } else {
                    Ended::Refused(format!("{peer} refused the recovery connection: {reason}"))
                });
            }
            break;
        }
    }
    Hello::parse(&bytes[..have]).map_err(|e| match e {
        HandshakeError::Malformed(e) => {
            Ended::Refused(format!("{peer} is not an mdrelay retransmission service: {e} (check the recovery setting)"))
        }
        version => Ended::Refused(format!("retransmission service {peer}: {version}")),
    })
}

/// The UTF-8 reason of `length` (at most [`MAX_REASON`]) bytes, `start` of which were read.
async fn reason(stream: &mut TcpStream, start: &[u8], length: usize) -> String {
    let mut text = [0u8; MAX_REASON];
    let length = length.min(MAX_REASON);
    let mut have = start.len().min(length);
    text[..have].copy_from_slice(&start[..have]);
    while have < length {
        match read_into(stream, &mut text[have..length]).await {
            Ok(n) if n > 0 => have += n,
            _ => break,
        }
    }
    String::from_utf8_lossy(&text[..have]).into_owned()
}

/// Reads what the socket has into `into`; 0 when the peer closed.
async fn read_into(stream: &TcpStream, into: &mut [u8]) -> io::Result<usize> {
    loop {
        stream.readable().await?;
        match stream.try_read(into) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            other => return other,
        }
    }
}

/// One connection: requests out, answers back, until it is lost. Also says whether anything
/// was answered (a service that greets and then drops every connection is retried slower).
async fn session(
    stream: TcpStream,
    peer: SocketAddr,
    service_session: u64,
    pending: &mut Option<Ask>,
    asks: &mut mpsc::Receiver<Ask>,
    answers: &mpsc::Sender<Answer>,
) -> (Ended, bool) {
    let mut buf = ReadBuf::new(READ_BUFFER);
    let mut out: Vec<u8> = Vec::new();
    // Bytes of the connection read before `buf`'s first, for messages: the greeting came first.
    let mut offset = Hello::LEN as u64;
    let mut answered = false;
    if let Some(ask) = pending.take()
        && !queue(ask, service_session, &mut out, answers).await
    {
        return (Ended::Closed, answered);
    }
    loop {
        // Every whole record read.
        loop {
            let data = buf.data();
            if data.len() < RecordHeader::LEN {
                buf.reserve_for(RecordHeader::LEN, RecordHeader::LEN);
                break;
            }
            let header = match RecordHeader::parse(data, MAX_ANSWER_RECORD) {
                Ok(h) => h,
                Err(e) => {
                    let at = offset + e.offset as u64;
                    return (Ended::Retry(format!("bad record header from {peer} at byte {at}: {}", e.what)), answered);
                }
            };
            let total = RecordHeader::LEN + header.length as usize;
            if data.len() < total {
                buf.reserve_for(total, RecordHeader::LEN + MAX_ANSWER_RECORD);
                break;
            }
            let payload = &data[RecordHeader::LEN..total];
            let payload_at = offset + RecordHeader::LEN as u64;
            answered = true;
            let answer = match header.tag {
                RecordTag::Data => Some(Answer::Data {
                    peer,
                    session: service_session,
                    header,
                    payload: payload.to_vec(),
                    offset: payload_at,
                    receive_time: wall_clock_ns(),
                }),
                RecordTag::Gone => match parse_gone(payload) {
                    Ok(count) => Some(Answer::Gone { session: service_session, first: header.sequence, count }),
                    Err(e) => {
                        let at = payload_at + e.offset as u64;
                        return (
                            Ended::Retry(format!("bad GONE record from {peer} at byte {at}: {}", e.what)),
                            answered,
                        );
                    }
                },
                RecordTag::Busy => Some(Answer::Busy { first: header.sequence }),
                RecordTag::Refuse => {
                    let reason = String::from_utf8_lossy(payload);
                    return (Ended::Refused(format!("{peer} refused the recovery connection: {reason}")), answered);
                }
                other => {
                    if warn::allow("recovery record") {
                        tracing::warn!(service = %peer, at = offset, tag = ?other,
                            "a record a retransmission service does not send; skipped");
                    }
                    None
                }
            };
            offset += total as u64;
            buf.consume(total);
            if let Some(answer) = answer
                && answers.send(answer).await.is_err()
            {
                return (Ended::Closed, answered);
            }
        }

        if let Err(e) = flush(&stream, &mut out) {
            return (Ended::Retry(format!("sending requests to {peer}: {e}")), answered);
        }

        tokio::select! {
            biased;
            read = read_some(&stream, &mut buf) => match read {
                Ok(0) => {
                    if buf.is_empty() && out.is_empty() && answered {
                        return (Ended::Quiet, answered);
                    }
                    let why = if buf.is_empty() {
                        format!("{peer} closed the connection")
                    } else {
                        format!("{peer} closed the connection inside a record at byte {offset}")
                    };
                    return (Ended::Retry(why), answered);
                }
                Ok(_) => {}
                Err(e) => {
                    let at = offset + buf.len() as u64;
                    return (Ended::Retry(format!("reading from {peer} at byte {at}: {e}")), answered);
                }
            },
            ready = stream.writable(), if !out.is_empty() => {
                if let Err(e) = ready {
                    return (Ended::Retry(format!("sending requests to {peer}: {e}")), answered);
                }
            }
            ask = asks.recv(), if out.len() < MAX_PENDING_OUT => match ask {
                None => return (Ended::Closed, answered),
                Some(ask) => {
                    if !queue(ask, service_session, &mut out, answers).await {
                        return (Ended::Closed, answered);
                    }
                }
            },
        }
    }
}

/// Adds a request to the bytes going out; one for another session than the service's is
/// answered at once (the service cannot have those frames). False when the loop is gone.
async fn queue(ask: Ask, service_session: u64, out: &mut Vec<u8>, answers: &mpsc::Sender<Answer>) -> bool {
    if ask.session != service_session {
        let (first, count) = (ask.request.first, u64::from(ask.request.count));
        return answers.send(Answer::OtherSession { session: ask.session, first, count }).await.is_ok();
    }
    out.extend_from_slice(&ask.request.to_record());
    true
}

/// Writes what the socket takes now of `out`, without waiting.
fn flush(stream: &TcpStream, out: &mut Vec<u8>) -> io::Result<()> {
    let mut done = 0;
    let result = loop {
        if done == out.len() {
            break Ok(());
        }
        match stream.try_write(&out[done..]) {
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break Ok(()),
            Err(e) => break Err(e),
        }
    };
    out.drain(..done);
    result
}

#[cfg(test)]
mod tests {
    use super::*;
    use mdrelay_proto::relay::{Observed, SessionTracker};

    const POLICY: RecoveryPolicy = RecoveryPolicy { delay_ns: 0, retry_ns: 10, attempts: 3, max_frames: 8 };

    /// A tiny deterministic generator (xorshift), so the test needs no dependency.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }

        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }
    }

    /// A stream frame through the tracker and the book, as the pipeline takes it.
    fn original(t: &mut SessionTracker, b: &mut RecoveryBook, seq: u64, now: i64) -> bool {
        b.sync(t.epoch());
        let o = t.observe(seq);
        if o.take() {
            b.original(seq, t.highest(), now);
        }
        o.take()
    }

    /// A retransmitted frame, as the pipeline takes it.
    fn retransmitted(t: &mut SessionTracker, b: &mut RecoveryBook, seq: u64, now: i64) -> bool {
        b.sync(t.epoch());
        if !b.recovered(seq, now) {
            return false;
        }
        let o = t.observe_copy(seq);
        assert!(o.take(), "a missing frame is always new to the window: {seq} {o:?}");
        if matches!(o, Observed::InOrder | Observed::Gap(_)) {
            b.slide(t.highest());
        }
        true
    }

    #[test]
    fn lost_equals_unrecoverable_whatever_happens() {
        // Every outcome must occur over the seeds, or the test proves little.
        let mut outcomes = RecoveryCounts::default();
        let mut arrived_after_give_up = 0;
        for seed in 1..300u64 {
            let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
            let mut t = SessionTracker::new();
            let mut b = RecoveryBook::new(POLICY);
            let session = 7;
            let frames = 200 + rng.below(300);
            let mut late: Vec<u64> = Vec::new();
            let mut taken = std::collections::BTreeSet::new();
            let mut now = 0;
            let start = 1 + rng.below(3) * 100;
            for seq in start..start + frames {
                now += 1;
                assert_eq!(t.datagram(session, seq, 1), mdrelay_proto::relay::Admission::Take);
                // The first frame is always taken, so the stream's first frame is `start`.
                match if seq == start { 9 } else { rng.below(10) } {
                    // Lost for good, unless asked for.
                    0 => {}
                    // Late: arrives a little later.
                    1 => late.push(seq),
                    _ => {
                        if original(&mut t, &mut b, seq, now) {
                            taken.insert(seq);
                        }
                    }
                }
                if !late.is_empty() && rng.below(4) == 0 {
                    let s = late.remove(rng.below(late.len() as u64) as usize);
                    if original(&mut t, &mut b, s, now) {
                        assert!(taken.insert(s), "{s} taken twice");
                    }
                }
                // Some duplicates.
                if rng.below(20) == 0 && original(&mut t, &mut b, seq, now) {
                    assert!(taken.insert(seq), "{seq} taken twice");
                }
                // Ask, and answer some requests: served, gone, or not at all.
                for request in b.due(now, 16) {
                    for s in request.first..request.first + u64::from(request.count) {
                        let answer = rng.below(6);
                        if answer == 0 {
                            b.gone(s, 1);
                        } else if answer <= 2 && retransmitted(&mut t, &mut b, s, now) {
                            assert!(taken.insert(s), "{s} taken twice");
                        }
                    }
                }
                // A retransmission of something never asked for, or asked twice.
                if rng.below(30) == 0 {
                    let s = start + rng.below(frames);
                    if retransmitted(&mut t, &mut b, s, now) {
                        assert!(taken.insert(s), "{s} taken twice");
                    }
                }
            }
            // The end: frames missing at the tail too, then late ones arriving while lingering.
            let next = start + frames + rng.below(5);
            assert_eq!(t.end_datagram(session, next), mdrelay_proto::relay::Admission::Take);
            b.end(next, now);
            for s in late {
                if original(&mut t, &mut b, s, now) {
                    assert!(taken.insert(s), "{s} taken twice");
                }
            }
            b.give_up_all();
            let c = b.counts();
            assert_eq!(t.counts().lost, c.frames_unrecoverable, "seed {seed}: {c:?}");
            assert_eq!(
                c.frames_missing,
                c.frames_recovered + c.frames_filled_late + c.frames_unrecoverable,
                "seed {seed}: {c:?}"
            );
            assert_eq!(t.counts().lost, next - start - taken.len() as u64, "seed {seed}");
            outcomes = plus(outcomes, c);
            arrived_after_give_up += b.arrived_after_give_up;
        }
        assert!(outcomes.frames_recovered > 0 && outcomes.frames_filled_late > 0, "{outcomes:?}");
        assert!(outcomes.frames_unrecoverable > 0 && arrived_after_give_up > 0, "{outcomes:?}");
    }

    #[test]
    fn frames_below_the_first_seen_and_a_new_session_are_accounted() {
        let mut t = SessionTracker::new();
        let mut b = RecoveryBook::new(POLICY);
        t.datagram(1, 10, 1);
        assert!(original(&mut t, &mut b, 10, 0));
        assert!(original(&mut t, &mut b, 11, 0));
        // Frame 7 arrives late: 8 and 9 were missing all along.
        assert!(original(&mut t, &mut b, 7, 0));
        assert_eq!((b.missing(), t.counts().lost), (2, 2));
        assert!(retransmitted(&mut t, &mut b, 8, 5));
        assert!(!retransmitted(&mut t, &mut b, 8, 5), "a second copy is not taken");
        // A restarted publisher (confirmed by its second datagram): frame 9 is given up.
        assert_eq!(t.datagram(2, 1, 1), mdrelay_proto::relay::Admission::Hold);
        assert_eq!(t.datagram(2, 2, 1), mdrelay_proto::relay::Admission::TakeHeldThenThis);
        assert!(original(&mut t, &mut b, 1, 6));
        assert!(original(&mut t, &mut b, 2, 6));
        assert!(!retransmitted(&mut t, &mut b, 9, 7), "a frame of the old session");
        b.give_up_all();
        let c = b.counts();
        assert_eq!((c.frames_recovered, c.frames_unrecoverable, c.frames_missing), (1, 1, 2));
        assert_eq!(b.report("h:1").unrecoverable_causes.other_session, 1);
        assert_eq!(t.counts().lost, 1);
        assert_eq!(b.report("h:1").frames_redundant, 2);
    }

    #[test]
    fn from_the_start_the_frames_before_the_first_taken_are_missing() {
        let mut t = SessionTracker::new();
        let mut b = RecoveryBook::new(POLICY);
        t.expect_from(1);
        b.expect_from(1);
        t.datagram(1, 3, 1);
        assert!(original(&mut t, &mut b, 3, 0));
        assert_eq!((b.missing(), t.counts().lost), (2, 2));
        assert!(retransmitted(&mut t, &mut b, 1, 1));
        b.give_up_all();
        assert_eq!((t.counts().lost, b.counts().frames_unrecoverable, b.counts().frames_recovered), (1, 1, 1));
    }

    #[test]
    fn sequence_numbers_at_the_top_of_the_range_do_not_overflow() {
        let mut t = SessionTracker::new();
        let mut b = RecoveryBook::new(POLICY);
        t.datagram(1, u64::MAX - 3, 1);
        assert!(original(&mut t, &mut b, u64::MAX - 3, 0));
        assert!(original(&mut t, &mut b, u64::MAX, 0));
        b.end(u64::MAX, 0);
        assert_eq!(b.missing(), 2);
        assert!(retransmitted(&mut t, &mut b, u64::MAX - 1, 1));
        b.give_up_all();
        assert_eq!(t.counts().lost, b.counts().frames_unrecoverable);
    }

    #[test]
    fn a_jump_beyond_the_window_gives_up_what_the_window_cannot_hold() {
        let mut t = SessionTracker::new();
        let mut b = RecoveryBook::new(POLICY);
        t.datagram(1, 1, 1);
        assert!(original(&mut t, &mut b, 1, 0));
        let far = 1 + WINDOW + 100;
        assert!(original(&mut t, &mut b, far, 0));
        assert_eq!(b.missing(), WINDOW - 1);
        assert_eq!(b.counts().frames_unrecoverable, 100);
        assert_eq!(b.report("h:1").unrecoverable_causes.too_old, 100);
        b.give_up_all();
        assert_eq!(t.counts().lost, b.counts().frames_unrecoverable);
    }
}
