//! The TCP server's tasks: accepting, the handshake, and one task per subscriber that writes its
//! queue to the socket and reads its echoes.
//!
//! - A connection counts against `tcp.max_connections` from accept to close; beyond it, the
//!   peer is greeted and told BUSY (retry later) at once, without a task.
//! - The handshake has `tcp.handshake_timeout`; until it completes, the connection has no queue
//!   and gets no frames, so a silent or hostile peer can neither hold the stream back nor make
//!   the publisher keep records for it.
//! - After it, the subscriber joins the hot path's [`Fanout`](crate::fanout::Fanout), which
//!   fills its queue. The task writes the queue with vectored writes straight from the shared
//!   records (no per-connection copy), writes a FORMAT record before the first record of each
//!   new format, and after the queue closes writes END, shuts down its side and waits briefly
//!   for the last echoes.
//! - A subscriber cut off for slowness is reset (SO_LINGER 0): its socket is gone at once, with
//!   whatever was queued in the kernel.
//! - Accept errors (out of file descriptors, say) back off from 1 ms to 1 s.

use crate::config::Tcp;
use crate::fanout::{Joined, Shared, SubscriberStats};
use crate::stats::Echoes;
use bytes::{Buf, Bytes};
use mdrelay_proto::codec::Format;
use mdrelay_proto::relay::echo::EchoGate;
use mdrelay_proto::relay::{Echo, HandshakeError, Hello, RecordHeader, RecordTag, Subscribe, control_record};
use std::collections::VecDeque;
use std::io::{self, IoSlice};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Records taken from the queue for one vectored write.
const BATCH: usize = 64;
/// How long a finished subscriber's last echoes are waited for.
const LAST_ECHOES: Duration = Duration::from_secs(2);

/// Everything a connection task needs.
#[derive(Clone)]
pub struct Server {
    /// Shared with the hot path.
    pub shared: Arc<Shared>,
    /// Where handshaken subscribers go.
    pub joins: std::sync::mpsc::Sender<Joined>,
    /// Echo checks and round trips.
    pub echoes: Arc<Echoes>,
    /// The settings.
    pub tcp: Tcp,
    /// Cancelled to cut every connection off at once (the end of the drain time).
    pub abort: CancellationToken,
    /// Tracks connection tasks, for shutdown.
    pub tracker: TaskTracker,
}

/// Accepts connections until `stop` is cancelled.
pub async fn serve(listener: TcpListener, server: Server, stop: CancellationToken) {
    let live = Arc::new(AtomicUsize::new(0));
    let mut backoff = Duration::from_millis(1);
    loop {
        let accepted = tokio::select! {
            _ = stop.cancelled() => return,
            accepted = listener.accept() => accepted,
        };
        let (stream, peer) = match accepted {
            Ok(a) => a,
            Err(error) => {
                server.shared.counters.accept_errors.fetch_add(1, Ordering::Relaxed);
                if mdrelay_proto::warn::allow("accept") {
                    tracing::warn!(%error, retry_in = ?backoff, "accept failed");
                }
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tokio::time::sleep(backoff) => {}
                }
                backoff = (backoff * 2).min(Duration::from_secs(1));
                continue;
            }
        };
        backoff = Duration::from_millis(1);
        server.shared.counters.connections.fetch_add(1, Ordering::Relaxed);
        if live.load(Ordering::Relaxed) >= server.tcp.max_connections {
            busy(&stream, peer, &server);
            continue;
        }
        live.fetch_add(1, Ordering::Relaxed);
        let live = LiveGuard(live.clone());
        let server2 = server.clone();
        server.tracker.spawn(async move {
            let _live = live;
            connection(stream, peer, server2).await;
        });
    }
}

/// Decrements the live connection count when a connection task ends, however it ends.
struct LiveGuard(Arc<AtomicUsize>);

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
    let mut bytes =
        Hello::new(position.format(), shared.session, shared.stream, position.next_sequence()).to_bytes().to_vec();
    bytes.extend(control_record(RecordTag::Busy, position.format(), position.next_sequence(), reason.as_bytes()));
    let _ = stream.try_write(&bytes);
    if mdrelay_proto::warn::allow("busy") {
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
    let stats = SubscriberStats::new(peer.to_string());
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
            if mdrelay_proto::warn::allow("handshake") {
                tracing::warn!(%peer, %reason, "subscriber refused");
            }
            let record = control_record(RecordTag::Refuse, server.shared.position.format(), 0, reason.as_bytes());
            let _ = stream.try_write(&record);
            stats.refuse(reason);
            return;
        }
    };
    let (queue, records) = mpsc::channel(server.tcp.queue);
    let queued_bytes = Arc::new(AtomicU64::new(0));
    let kill = server.abort.child_token();
    let joined = Joined { stats: stats.clone(), queue, queued_bytes: queued_bytes.clone(), kill: kill.clone() };
    tracing::info!(%peer, echo = subscribe.echo, "subscriber connected");
    if server.joins.send(joined).is_err() {
        // The hot path is gone: the stream has ended. `records` reads as closed below.
    }
    let mut out = Outgoing { records, queued_bytes, batch: VecDeque::new(), format: None };
    let mut incoming = Incoming { buf: Vec::with_capacity(1024), gate: EchoGate::default() };
    match subscriber(&stream, &mut out, &mut incoming, &server, &stats, &kill).await {
        Ok(Ended::Stream) => {}
        Ok(Ended::Killed) => reset(stream),
        Ok(Ended::PeerClosed) => tracing::info!(%peer, "subscriber closed the connection"),
        Err(error) => tracing::info!(%peer, %error, "subscriber connection ended"),
    }
}

/// Greets the peer and reads its answer within the handshake timeout; the reason to refuse it
/// otherwise.
async fn handshake(stream: &mut TcpStream, server: &Server) -> Result<Subscribe, String> {
    let shared = &server.shared;
    let position = &shared.position;
    let hello = Hello::new(position.format(), shared.session, shared.stream, position.next_sequence());
    let timeout = server.tcp.handshake_timeout;
    let exchange = async {
        stream.write_all(&hello.to_bytes()).await?;
        let mut answer = [0u8; Subscribe::LEN];
        stream.read_exact(&mut answer).await?;
        Ok::<_, io::Error>(answer)
    };
    let answer = match tokio::time::timeout(timeout, exchange).await {
        Err(_) => return Err(format!("no answer to the greeting within {timeout:?} (tcp.handshake_timeout)")),
        Ok(Err(e)) => return Err(format!("connection closed during the handshake: {e}")),
        Ok(Ok(answer)) => answer,
    };
    Subscribe::parse(&answer).map_err(|e| match e {
        HandshakeError::Malformed(e) => format!("not an mdrelay subscriber: {e}"),
        version => version.to_string(),
    })
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

/// The subscriber's side of the fanout: its queue, and the records taken from it.
struct Outgoing {
    records: mpsc::Receiver<Bytes>,
    queued_bytes: Arc<AtomicU64>,
    /// Records being written: the front may be partly written. Each with the bytes it counts
    /// against the queue's limit.
    batch: VecDeque<(Bytes, u64)>,
    /// The format of the last DATA record queued for writing.
    format: Option<Format>,
}

impl Outgoing {
    /// Queues `record` for writing, after a FORMAT record when it is the first of a new format.
    fn take(&mut self, record: Bytes) {
        let counted = record.len() as u64 + crate::fanout::RECORD_OVERHEAD;
        if let Ok(header) = RecordHeader::parse(&record, usize::MAX) {
            match header.tag {
                RecordTag::Format => self.format = Some(header.format),
                RecordTag::Data if self.format != Some(header.format) => {
                    self.format = Some(header.format);
                    let announce = control_record(RecordTag::Format, header.format, header.sequence, &[]);
                    self.batch.push_back((Bytes::from(announce), 0));
                }
                _ => {}
            }
        }
        self.batch.push_back((record, counted));
    }

    /// Writes what the socket takes now; counts fully written records off the queue's bytes.
    fn write_some(&mut self, stream: &TcpStream) -> io::Result<()> {
        loop {
            if self.batch.is_empty() {
                return Ok(());
            }
            let mut slices = [IoSlice::new(&[]); BATCH];
            let n = self.batch.len().min(BATCH);
            for (slot, (bytes, _)) in slices.iter_mut().zip(&self.batch) {
                *slot = IoSlice::new(bytes);
            }
            let mut written = match stream.try_write_vectored(&slices[..n]) {
                Ok(0) => return Err(io::Error::new(io::ErrorKind::WriteZero, "the socket took no bytes")),
                Ok(w) => w,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) => return Err(e),
            };
            while written > 0 {
                let Some((front, counted)) = self.batch.front_mut() else { break };
                if written >= front.len() {
                    written -= front.len();
                    self.queued_bytes.fetch_sub(*counted, Ordering::Relaxed);
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
    buf: Vec<u8>,
    gate: EchoGate,
}

/// Bytes of one ECHO record.
const ECHO_RECORD: usize = RecordHeader::LEN + Echo::LEN;

impl Incoming {
    /// Reads what the socket has; `Ok(false)` when the peer closed. Checks every whole ECHO record;
    /// anything else is a protocol violation.
    fn read_some(&mut self, stream: &TcpStream, server: &Server, stats: &SubscriberStats) -> io::Result<bool> {
        let mut chunk = [0u8; 4096];
        loop {
            match stream.try_read(&mut chunk) {
                Ok(0) => return Ok(false),
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) => return Err(e),
            }
        }
        let mut at = 0;
        while self.buf.len() - at >= RecordHeader::LEN {
            let header = RecordHeader::parse(&self.buf[at..], Echo::LEN).map_err(|e| {
                io::Error::new(io::ErrorKind::InvalidData, format!("bad record from the subscriber: {e}"))
            })?;
            if header.tag != RecordTag::Echo || header.length as usize != Echo::LEN {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!(
                        "a subscriber sends only ECHO records, this one sent {:?} of {} bytes",
                        header.tag, header.length
                    ),
                ));
            }
            if self.buf.len() - at < ECHO_RECORD {
                break;
            }
            let echo = Echo::parse(&self.buf[at + RecordHeader::LEN..at + ECHO_RECORD])
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))?;
            match self.gate.admit(&server.echoes.sent, &echo) {
                Ok(()) => server.echoes.round_trips.record(echo.publish_time),
                Err(why) => {
                    stats.echo_rejected();
                    server.echoes.rejected.fetch_add(1, Ordering::Relaxed);
                    if mdrelay_proto::warn::allow("echo") {
                        tracing::warn!(peer = %stats.peer, %why, "echo rejected");
                    }
                }
            }
            at += ECHO_RECORD;
        }
        self.buf.drain(..at);
        Ok(true)
    }
}

/// Writes the subscriber's records until its queue closes, reading its echoes meanwhile.
async fn subscriber(
    stream: &TcpStream,
    out: &mut Outgoing,
    incoming: &mut Incoming,
    server: &Server,
    stats: &SubscriberStats,
    kill: &CancellationToken,
) -> io::Result<Ended> {
    let mut open = true;
    while open || !out.batch.is_empty() {
        if out.batch.is_empty() {
            tokio::select! {
                biased;
                _ = kill.cancelled() => return Ok(Ended::Killed),
                record = out.records.recv() => match record {
                    Some(record) => out.take(record),
                    None => open = false,
                },
                ready = stream.readable() => {
                    ready?;
                    if !read_or_violation(stream, incoming, server, stats)? {
                        return Ok(Ended::PeerClosed);
                    }
                }
            }
            while out.batch.len() < BATCH {
                match out.records.try_recv() {
                    Ok(record) => out.take(record),
                    Err(_) => break,
                }
            }
            continue;
        }
        out.write_some(stream)?;
        if out.batch.is_empty() {
            continue;
        }
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
        }
    }
    if stats.disconnected_slow() {
        return Ok(Ended::Killed);
    }
    // The queue closed: the stream ended (or the hot path dropped this subscriber, which only
    // happens with a kill). END, then an orderly close after the last echoes.
    if let Some(end) = server.shared.end.get() {
        out.batch.push_back((end.clone(), 0));
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
    let _ = socket2::SockRef::from(stream).shutdown(std::net::Shutdown::Write);
    let last_echoes = async {
        loop {
            stream.readable().await?;
            if !read_or_violation(stream, incoming, server, stats)? {
                return Ok::<_, io::Error>(());
            }
        }
    };
    tokio::select! {
        _ = kill.cancelled() => return Ok(Ended::Killed),
        _ = tokio::time::timeout(LAST_ECHOES, last_echoes) => {}
    }
    Ok(Ended::Stream)
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
            if mdrelay_proto::warn::allow("protocol violation") {
                tracing::warn!(peer = %stats.peer, error = %e, "subscriber disconnected");
            }
            Err(e)
        }
        other => other,
    }
}
