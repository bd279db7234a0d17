//! The TCP server: any number of subscribers, each with its own bounded queue of records, so a
//! slow subscriber never slows the others (unless the `block` policy asks for exactly that).
//!
//! The hot path hands each record (an `Arc`-shared `Bytes`, encoded once) to [`Fanout::send`],
//! which offers it to every subscriber's queue under the chosen policy. A task per subscriber
//! greets it, checks its answer, then writes its queue to the socket and reads its echoes.

use crate::config::{SlowPolicy, Tcp};
use crate::stats::RoundTrips;
use bytes::Bytes;
use mdrelay_proto::codec::Format;
use mdrelay_proto::relay::{self, Echo, Hello, RecordHeader, RecordTag, Subscribe};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufWriter};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;

/// How long a control record (format switch, end of stream) waits for room in a queue.
pub const RELIABLE_SEND_TIMEOUT: Duration = Duration::from_secs(5);

/// How long a connecting subscriber has to answer the greeting.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);

/// What the publisher knows about one subscriber, for its summary.
#[derive(Debug, Default, serde::Serialize, Clone)]
pub struct SubscriberSummary {
    /// The subscriber's address.
    pub peer: String,
    /// Sequence number of the first frame offered to it.
    pub first_sequence: u64,
    /// Frames skipped because its queue was full (`drop` policy).
    pub dropped_frames: u64,
    /// Disconnected for being slow (`disconnect` policy).
    pub disconnected_slow: bool,
    /// Refused at the handshake, with the reason.
    pub refused: Option<String>,
}

struct Subscriber {
    id: u64,
    tx: mpsc::Sender<Bytes>,
    ready: Arc<AtomicBool>,
    summary: Arc<Mutex<SubscriberSummary>>,
}

/// A subscriber just registered: its greeting and the receiving end of its queue.
struct Registration {
    hello: Hello,
    rx: mpsc::Receiver<Bytes>,
    ready: Arc<AtomicBool>,
    summary: Arc<Mutex<SubscriberSummary>>,
    id: u64,
}

struct State {
    subscribers: Vec<Subscriber>,
    next_sequence: u64,
    format: Format,
    closed: bool,
    next_id: u64,
}

/// The set of connected subscribers, shared by the hot path and the server's tasks.
pub struct Fanout {
    state: Mutex<State>,
    policy: SlowPolicy,
    queue: usize,
    session: u64,
    stream: u32,
    summaries: Mutex<Vec<Arc<Mutex<SubscriberSummary>>>>,
    /// Disconnects for slowness.
    pub disconnects: AtomicU64,
}

impl Fanout {
    /// A fanout for the configured server.
    pub fn new(tcp: &Tcp, format: Format, session: u64, stream: u32) -> Arc<Fanout> {
        Arc::new(Fanout {
            state: Mutex::new(State { subscribers: Vec::new(), next_sequence: 1, format, closed: false, next_id: 0 }),
            policy: tcp.slow,
            queue: tcp.queue,
            session,
            stream,
            summaries: Mutex::new(Vec::new()),
            disconnects: AtomicU64::new(0),
        })
    }

    /// Subscribers that completed the handshake.
    pub fn ready(&self) -> usize {
        self.state.lock().expect("fanout lock").subscribers.iter().filter(|s| s.ready.load(Ordering::Acquire)).count()
    }

    /// Offers a record to every subscriber. `frames` frames starting at `sequence` are in it;
    /// `next_sequence` is the number of the frame after it.
    pub fn send(&self, record: Bytes, frames: u64, next_sequence: u64, format: Format) {
        let mut state = self.state.lock().expect("fanout lock");
        state.next_sequence = next_sequence;
        state.format = format;
        let policy = self.policy;
        state.subscribers.retain(|sub| match sub.tx.try_send(record.clone()) {
            Ok(()) => true,
            Err(mpsc::error::TrySendError::Closed(_)) => false,
            Err(mpsc::error::TrySendError::Full(record)) => match policy {
                SlowPolicy::Drop => {
                    sub.summary.lock().expect("summary lock").dropped_frames += frames;
                    true
                }
                SlowPolicy::Disconnect => {
                    let mut summary = sub.summary.lock().expect("summary lock");
                    summary.disconnected_slow = true;
                    tracing::warn!(peer = %summary.peer, "subscriber too slow; disconnected");
                    self.disconnects.fetch_add(1, Ordering::Relaxed);
                    false
                }
                // The hot path runs on its own thread, outside the runtime, so it may block.
                SlowPolicy::Block => sub.tx.blocking_send(record).is_ok(),
            },
        });
    }

    /// Sends a record every subscriber must get (format switch, end of stream), waiting for room
    /// in each queue, but not forever: a subscriber that takes no record for
    /// [`RELIABLE_SEND_TIMEOUT`] is stalled and is disconnected.
    pub fn send_reliably(&self, record: Bytes, next_sequence: u64, format: Format) {
        let mut state = self.state.lock().expect("fanout lock");
        state.next_sequence = next_sequence;
        state.format = format;
        let deadline = std::time::Instant::now() + RELIABLE_SEND_TIMEOUT;
        state.subscribers.retain(|sub| {
            loop {
                match sub.tx.try_send(record.clone()) {
                    Ok(()) => return true,
                    Err(mpsc::error::TrySendError::Closed(_)) => return false,
                    Err(mpsc::error::TrySendError::Full(_)) if std::time::Instant::now() < deadline => {
                        std::thread::sleep(Duration::from_millis(1));
                    }
                    Err(mpsc::error::TrySendError::Full(_)) => {
                        let mut summary = sub.summary.lock().expect("summary lock");
                        summary.disconnected_slow = true;
                        tracing::warn!(peer = %summary.peer, "subscriber stalled; disconnected");
                        self.disconnects.fetch_add(1, Ordering::Relaxed);
                        return false;
                    }
                }
            }
        });
    }

    /// Closes every queue: the tasks write what is queued, then close their sockets.
    pub fn close(&self) {
        let mut state = self.state.lock().expect("fanout lock");
        state.closed = true;
        state.subscribers.clear();
    }

    /// What happened to each subscriber.
    pub fn summaries(&self) -> Vec<SubscriberSummary> {
        self.summaries.lock().expect("summaries lock").iter().map(|s| s.lock().expect("summary lock").clone()).collect()
    }

    fn register(&self, peer: SocketAddr) -> Option<Registration> {
        let mut state = self.state.lock().expect("fanout lock");
        if state.closed {
            return None;
        }
        let (tx, rx) = mpsc::channel(self.queue);
        let ready = Arc::new(AtomicBool::new(false));
        let summary = Arc::new(Mutex::new(SubscriberSummary {
            peer: peer.to_string(),
            first_sequence: state.next_sequence,
            ..Default::default()
        }));
        self.summaries.lock().expect("summaries lock").push(summary.clone());
        let id = state.next_id;
        state.next_id += 1;
        state.subscribers.push(Subscriber { id, tx, ready: ready.clone(), summary: summary.clone() });
        let hello = Hello {
            protocol_version: relay::PROTOCOL_VERSION,
            format: state.format,
            schema_version: relay::SCHEMA_VERSION,
            session: self.session,
            stream: self.stream,
            next_sequence: state.next_sequence,
        };
        Some(Registration { hello, rx, ready, summary, id })
    }

    fn remove(&self, id: u64) {
        self.state.lock().expect("fanout lock").subscribers.retain(|s| s.id != id);
    }
}

/// Accepts subscribers until the fanout closes.
pub async fn serve(listener: TcpListener, fanout: Arc<Fanout>, round_trips: Arc<RoundTrips>) {
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Some(Registration { hello, rx, ready, summary, id }) = fanout.register(peer) else {
            return;
        };
        tracing::info!(%peer, next_sequence = hello.next_sequence, "subscriber connected");
        let fanout = fanout.clone();
        let round_trips = round_trips.clone();
        tokio::spawn(async move {
            if let Err(e) = subscriber(stream, peer, hello, rx, ready, summary, round_trips).await {
                tracing::info!(%peer, error = %e, "subscriber connection ended");
            }
            fanout.remove(id);
        });
    }
}

fn record(tag: RecordTag, format: Format, sequence: u64, payload: &[u8]) -> Vec<u8> {
    let header = RecordHeader { tag, format, frame_count: 0, length: payload.len() as u32, sequence };
    let mut out = header.to_bytes().to_vec();
    out.extend_from_slice(payload);
    out
}

async fn subscriber(
    stream: TcpStream,
    peer: SocketAddr,
    hello: Hello,
    mut rx: mpsc::Receiver<Bytes>,
    ready: Arc<AtomicBool>,
    summary: Arc<Mutex<SubscriberSummary>>,
    round_trips: Arc<RoundTrips>,
) -> std::io::Result<()> {
    stream.set_nodelay(true)?;
    let (mut reader, writer) = stream.into_split();
    let mut writer = BufWriter::with_capacity(256 * 1024, writer);
    writer.write_all(&hello.to_bytes()).await?;
    writer.flush().await?;
    let mut answer = [0u8; Subscribe::LEN];
    let refusal = match tokio::time::timeout(HANDSHAKE_TIMEOUT, reader.read_exact(&mut answer)).await {
        Err(_) => Some(format!("no answer to the greeting within {HANDSHAKE_TIMEOUT:?}")),
        Ok(Err(e)) => Some(format!("connection closed during the handshake: {e}")),
        Ok(Ok(_)) => match Subscribe::parse(&answer) {
            Err(e) => Some(format!("not an mdrelay subscriber: {e}")),
            Ok(s) if s.protocol_version != relay::PROTOCOL_VERSION => Some(format!(
                "subscriber speaks relay protocol version {}, this publisher speaks {}; use matching releases",
                s.protocol_version,
                relay::PROTOCOL_VERSION
            )),
            Ok(_) => None,
        },
    };
    if let Some(reason) = refusal {
        tracing::warn!(%peer, %reason, "subscriber refused");
        summary.lock().expect("summary lock").refused = Some(reason.clone());
        let _ =
            writer.write_all(&record(RecordTag::Refuse, hello.format, hello.next_sequence, reason.as_bytes())).await;
        let _ = writer.flush().await;
        return Ok(());
    }
    ready.store(true, Ordering::Release);
    // Echoes come back on the same connection; read them beside the writes.
    let echo_reader = tokio::spawn(async move {
        let mut header = [0u8; RecordHeader::LEN];
        let mut body = [0u8; Echo::LEN];
        loop {
            if reader.read_exact(&mut header).await.is_err() {
                return;
            }
            let Ok(h) = RecordHeader::parse(&header, Echo::LEN) else {
                tracing::warn!(%peer, "unexpected bytes from subscriber; no longer reading its echoes");
                return;
            };
            if h.tag != RecordTag::Echo || h.length as usize != Echo::LEN || reader.read_exact(&mut body).await.is_err()
            {
                return;
            }
            if let Ok(echo) = Echo::parse(&body) {
                round_trips.record(echo.publish_time);
            }
        }
    });
    while let Some(record) = rx.recv().await {
        writer.write_all(&record).await?;
        // Coalesce writes while more records are already queued; flush when caught up.
        while let Ok(more) = rx.try_recv() {
            writer.write_all(&more).await?;
            if writer.buffer().len() > 128 * 1024 {
                break;
            }
        }
        writer.flush().await?;
    }
    writer.flush().await?;
    writer.into_inner().shutdown().await?;
    // Give the subscriber a moment to send its last echoes, then stop reading.
    let _ = tokio::time::timeout(Duration::from_secs(2), echo_reader).await;
    Ok(())
}
