//! Snapshots for late joiners, on the publisher's side (`tcp.snapshots`).
//!
//! The hot thread keeps the state of exactly the frames it has handed to the TCP fanout
//! ([`StateKeeper`]): a frame's messages wait with it while it sits in a coalescing run, and are
//! applied once the run is published, after the ring's mark has moved past it. So the state is
//! never ahead of the mark, and a subscriber that asks for a snapshot can take a copy of it under
//! the ring's lock and join as a resume from the frame after it: the ring replays what was
//! published since, and the live records follow, with no gap and no duplicate
//! ([`join_with_snapshot`](crate::tcp)).

use mdrelay_iex::message::{Message, UnknownMessage};
use mdrelay_proto::relay::RecordHeader;
use mdrelay_proto::relay::snapshot::MarketState;
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

/// The state shared between the hot thread, which applies frames, and the connections, which
/// copy it for their snapshots.
pub type SharedState = Arc<Mutex<MarketState>>;

/// The hot thread's side of the state: frames encoded and not yet published, then applied.
pub struct StateKeeper {
    shared: SharedState,
    /// The messages of the frames not yet published, back to back.
    pending: Vec<Message<'static>>,
    /// Those frames: their sequence and where their messages end in `pending`.
    frames: VecDeque<(u64, usize)>,
}

impl StateKeeper {
    /// A keeper of `shared`.
    pub fn new(shared: SharedState) -> StateKeeper {
        StateKeeper { shared, pending: Vec::new(), frames: VecDeque::new() }
    }

    /// Frame `sequence` with `messages` was encoded: held until it is published.
    #[inline]
    pub fn frame(&mut self, sequence: u64, messages: &[Message<'_>]) {
        self.pending.extend(messages.iter().map(held));
        self.frames.push_back((sequence, self.pending.len()));
    }

    /// Every frame before `next_sequence` was published: applied to the shared state.
    pub fn published(&mut self, next_sequence: u64) {
        let mut applied = 0;
        if self.frames.front().is_some_and(|(sequence, _)| *sequence < next_sequence) {
            let mut state = self.shared.lock().unwrap_or_else(|e| e.into_inner());
            while let Some(&(sequence, end)) = self.frames.front() {
                if sequence >= next_sequence {
                    break;
                }
                state.apply_frame(sequence, &self.pending[applied..end]);
                applied = end;
                self.frames.pop_front();
            }
        }
        if applied > 0 {
            self.pending.drain(..applied);
            for (_, end) in &mut self.frames {
                *end -= applied;
            }
        }
    }
}

/// A message as the keeper holds it: an unknown message's bytes are not kept (the state counts
/// it by type and applies nothing of it).
fn held(message: &Message<'_>) -> Message<'static> {
    match *message {
        Message::Unknown(u) => Message::Unknown(UnknownMessage { kind: u.kind, bytes: &[] }),
        Message::SystemEvent(m) => Message::SystemEvent(m),
        Message::SecurityDirectory(m) => Message::SecurityDirectory(m),
        Message::TradingStatus(m) => Message::TradingStatus(m),
        Message::RetailLiquidityIndicator(m) => Message::RetailLiquidityIndicator(m),
        Message::OperationalHaltStatus(m) => Message::OperationalHaltStatus(m),
        Message::ShortSalePriceTestStatus(m) => Message::ShortSalePriceTestStatus(m),
        Message::SecurityEvent(m) => Message::SecurityEvent(m),
        Message::PriceLevelUpdate(m) => Message::PriceLevelUpdate(m),
        Message::QuoteUpdate(m) => Message::QuoteUpdate(m),
        Message::TradeReport(m) => Message::TradeReport(m),
        Message::TradeBreak(m) => Message::TradeBreak(m),
        Message::OfficialPrice(m) => Message::OfficialPrice(m),
        Message::AuctionInformation(m) => Message::AuctionInformation(m),
    }
}

/// What answering snapshot requests over NATS needs (`nats.snapshots`).
#[derive(Clone)]
pub struct NatsSnapshots {
    /// The state, as the hot thread keeps it.
    pub state: SharedState,
    /// How frames are sealed: a snapshot's are sealed as the stream's.
    pub protection: mdrelay_proto::relay::protect::ProtectionSettings,
    /// The stream's format (a [`mdrelay_codec::Format::id`]), as the controls set it.
    pub format: Arc<std::sync::atomic::AtomicU8>,
    /// The greeting's fields: the session, stream number and protection.
    pub session: u64,
    /// See `session`.
    pub stream: u32,
    /// See `session`.
    pub guard: crate::fanout::Guard,
}

/// Answers snapshot requests on [`nats_snapshot_subject`] of `subject` until the connection
/// ends: to the request's reply subject, the publisher's greeting, then the `SNAPSHOT`
/// records, each at most the server's `max_payload`. A snapshot is built by one of
/// [`crate::retransmit::SNAPSHOT_BUILDS`] at a time; a request that finds none free is told
/// `BUSY` (a record for frame 0 with the reason), as is one over the state's limits.
///
/// Request/reply rather than the latest snapshot kept in JetStream: a snapshot is as of the
/// moment it is asked for, so the live subject takes over from the frame after it with nothing
/// to bridge, and nothing is built or stored while nobody joins.
///
/// [`nats_snapshot_subject`]: mdrelay_proto::relay::snapshot::nats_snapshot_subject
pub async fn answer_nats(
    client: async_nats::Client,
    subject: String,
    nats: NatsSnapshots,
    counts: Arc<crate::nats::NatsCounters>,
) {
    use futures_util::StreamExt;
    use std::sync::atomic::Ordering;
    let asked_on = mdrelay_proto::relay::snapshot::nats_snapshot_subject(&subject);
    let mut requests = match client.subscribe(asked_on.clone()).await {
        Ok(requests) => requests,
        Err(error) => {
            tracing::warn!(subject = %asked_on, %error, "cannot answer snapshot requests over NATS");
            return;
        }
    };
    tracing::info!(subject = %asked_on, "answering snapshot requests over NATS");
    let builds = Arc::new(tokio::sync::Semaphore::new(crate::retransmit::SNAPSHOT_BUILDS));
    while let Some(request) = requests.next().await {
        let Some(reply) = request.reply else {
            counts.snapshots_refused.fetch_add(1, Ordering::Relaxed);
            continue;
        };
        let format =
            mdrelay_codec::Format::from_id(nats.format.load(Ordering::Relaxed)).unwrap_or(mdrelay_codec::Format::Raw);
        let Ok(permit) = builds.clone().try_acquire_owned() else {
            counts.snapshots_refused.fetch_add(1, Ordering::Relaxed);
            let busy = format!("snapshot not sent: {} are being built", crate::retransmit::SNAPSHOT_BUILDS);
            let answer = [hello(&nats, format, 0), refusal(&busy)];
            tokio::spawn(send(client.clone(), reply, answer.into()));
            continue;
        };
        let (client, nats, counts) = (client.clone(), nats.clone(), counts.clone());
        tokio::spawn(async move {
            let _permit = permit;
            let copy = nats.state.lock().unwrap_or_else(|e| e.into_inner()).clone();
            let as_of = copy.as_of;
            let record_bytes = client.server_info().max_payload.saturating_sub(RecordHeader::LEN).max(1 << 10);
            let mut protector = nats.protection.protector(mdrelay_codec::DEFAULT_MAX_FRAME);
            let session = nats.session;
            let written = tokio::task::spawn_blocking(move || {
                let mut records = Vec::new();
                let mut codec = mdrelay_codec::Codec::new(format, mdrelay_codec::Limits::default());
                let now = mdrelay_runtime::clock::wall_clock_ns();
                mdrelay_proto::relay::snapshot::write_snapshot_within(
                    &copy,
                    &mut codec,
                    &mut protector,
                    session,
                    now,
                    record_bytes,
                    &mut records,
                )
                .map(|size| (records, size))
            })
            .await;
            let mut answer = vec![hello(&nats, format, as_of.saturating_add(1))];
            match written {
                Ok(Ok((records, size))) => {
                    answer.extend(records.into_iter().map(bytes::Bytes::from));
                    counts.snapshots_sent.fetch_add(1, Ordering::Relaxed);
                    tracing::info!(
                        as_of,
                        symbols = size.symbols,
                        frames = size.frames,
                        bytes = size.bytes,
                        "snapshot sent over NATS"
                    );
                }
                Ok(Err(error)) => {
                    counts.snapshots_refused.fetch_add(1, Ordering::Relaxed);
                    answer.push(refusal(&format!("snapshot not encodable: {error}")));
                }
                Err(error) => {
                    counts.snapshots_refused.fetch_add(1, Ordering::Relaxed);
                    answer.push(refusal(&format!("snapshot not written: {error}")));
                }
            }
            send(client, reply, answer).await;
        });
    }
}

/// The publisher's greeting, first of every answer: the requester learns the session the
/// snapshot's frames are sealed for, and the publisher's protection.
fn hello(nats: &NatsSnapshots, format: mdrelay_codec::Format, next: u64) -> bytes::Bytes {
    bytes::Bytes::copy_from_slice(&crate::fanout::hello(nats.session, nats.stream, nats.guard, format, next).to_bytes())
}

/// A `BUSY` record for frame 0 (no request for frames names it): no snapshot, and why.
fn refusal(why: &str) -> bytes::Bytes {
    let record = mdrelay_proto::relay::control_record(
        mdrelay_proto::relay::RecordTag::Busy,
        mdrelay_codec::Format::Raw,
        0,
        why.as_bytes(),
    );
    bytes::Bytes::from(record)
}

/// Publishes an answer's messages to the requester's reply subject, in order.
async fn send(client: async_nats::Client, reply: async_nats::Subject, answer: Vec<bytes::Bytes>) {
    for message in answer {
        if let Err(error) = client.publish(reply.clone(), message).await {
            tracing::warn!(%error, "snapshot answer not sent");
            return;
        }
    }
    let _ = client.flush().await;
}
