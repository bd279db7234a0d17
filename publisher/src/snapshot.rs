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
