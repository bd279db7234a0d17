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

/// Builds the `SNAPSHOT` records of `copy` in `format`, sealed under `protection` for
/// `session`, each payload at most `record_bytes`, on a blocking thread (tens of milliseconds
/// of a core for a day of DEEP, which the connection's task must not spend): the records and
/// their size, or why there are none. Every way a snapshot goes out builds it here.
pub async fn build(
    copy: MarketState,
    format: mdrelay_codec::Format,
    protection: &mdrelay_proto::relay::protect::ProtectionSettings,
    session: u64,
    record_bytes: usize,
) -> Result<(Vec<Vec<u8>>, mdrelay_proto::relay::snapshot::SnapshotSize), String> {
    let mut protector = protection.protector(mdrelay_codec::DEFAULT_MAX_FRAME);
    let built = tokio::task::spawn_blocking(move || {
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
    match built {
        Ok(Ok(built)) => Ok(built),
        Ok(Err(error)) => Err(format!("snapshot not encodable: {error}")),
        Err(error) => Err(format!("snapshot not written: {error}")),
    }
}

/// Snapshots built at once, by the retransmission service or the NATS answerer: each is a copy
/// of the state and its records (about 2.5 MB for a day of DEEP) and milliseconds of a core;
/// more wait their turn, or are refused.
pub const SNAPSHOT_BUILDS: usize = 2;

/// The answer to a snapshot request that gets none: a `BUSY` record for frame 0 (no request
/// for frames names it), with the reason.
pub fn refusal_record(why: &str) -> Vec<u8> {
    mdrelay_proto::relay::control_record(
        mdrelay_proto::relay::RecordTag::Busy,
        mdrelay_codec::Format::Raw,
        0,
        why.as_bytes(),
    )
}
