//! Checking the round-trip echoes subscribers send back: an echo counts only when it names a
//! frame this publisher sent, with the publish time it was sent with, and comes after the echoes
//! its sender sent before. A forged, replayed or stale echo is rejected, so round-trip figures
//! are made of real round trips.

use super::wire::Echo;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering, fence};

/// A slot's sequence number while it is being rewritten.
const WRITING: u64 = u64::MAX;

#[derive(Debug)]
struct Slot {
    sequence: AtomicU64,
    publish_time: AtomicI64,
}

/// The publish times of the last frames sent, written by the hot path and read by the tasks
/// that receive echoes. Each slot is a tiny sequence lock made of atomics: a reader that races
/// a rewrite sees the slot as being written and rejects the echo, never a torn pair.
#[derive(Debug)]
pub struct SentLog {
    slots: Box<[Slot]>,
    mask: u64,
}

/// Why an echo was not counted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum EchoRejected {
    /// No frame with that sequence number is remembered: never sent, or too long ago.
    #[error("echo of frame {0}, which was not sent or is too old to check")]
    Unknown(u64),
    /// The frame was sent with another publish time.
    #[error("echo of frame {0} with a publish time it was not sent with")]
    WrongTime(u64),
    /// Not after the sender's previous echo: a replay or a duplicate.
    #[error("echo of frame {0} does not follow the previous echo (frame {1})")]
    NotAfter(u64, u64),
}

impl SentLog {
    /// A log of the last `capacity` frames (rounded up to a power of two).
    pub fn new(capacity: usize) -> SentLog {
        let capacity = capacity.max(1).next_power_of_two();
        let slots = (0..capacity)
            .map(|_| Slot { sequence: AtomicU64::new(WRITING), publish_time: AtomicI64::new(0) })
            .collect();
        SentLog { slots, mask: capacity as u64 - 1 }
    }

    fn slot(&self, sequence: u64) -> &Slot {
        // The mask keeps the index below the slice's length.
        &self.slots[(sequence & self.mask) as usize]
    }

    /// Notes that frame `sequence` went out with `publish_time`.
    pub fn record(&self, sequence: u64, publish_time: i64) {
        let slot = self.slot(sequence);
        slot.sequence.store(WRITING, Ordering::Relaxed);
        fence(Ordering::Release);
        slot.publish_time.store(publish_time, Ordering::Relaxed);
        slot.sequence.store(sequence, Ordering::Release);
    }

    /// Whether `echo` names a frame sent with that publish time.
    pub fn check(&self, echo: &Echo) -> Result<(), EchoRejected> {
        if echo.sequence == WRITING {
            return Err(EchoRejected::Unknown(echo.sequence));
        }
        let slot = self.slot(echo.sequence);
        let before = slot.sequence.load(Ordering::Acquire);
        let time = slot.publish_time.load(Ordering::Relaxed);
        fence(Ordering::Acquire);
        let after = slot.sequence.load(Ordering::Relaxed);
        if before != echo.sequence || after != echo.sequence {
            return Err(EchoRejected::Unknown(echo.sequence));
        }
        if time != echo.publish_time {
            return Err(EchoRejected::WrongTime(echo.sequence));
        }
        Ok(())
    }
}

/// One echo sender's state: its echoes must name frames in increasing order.
#[derive(Clone, Copy, Debug, Default)]
pub struct EchoGate {
    last: Option<u64>,
}

impl EchoGate {
    /// Checks `echo` against `log` and this sender's previous echo; remembers it when it passes.
    pub fn admit(&mut self, log: &SentLog, echo: &Echo) -> Result<(), EchoRejected> {
        if let Some(last) = self.last
            && echo.sequence <= last
        {
            return Err(EchoRejected::NotAfter(echo.sequence, last));
        }
        log.check(echo)?;
        self.last = Some(echo.sequence);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_echoes_of_frames_sent_count_once_each() {
        let log = SentLog::new(4);
        for seq in 1..=6 {
            log.record(seq, 1000 + seq as i64);
        }
        let mut gate = EchoGate::default();
        let echo = |sequence: u64, publish_time: i64| Echo { sequence, publish_time };
        assert_eq!(gate.admit(&log, &echo(2, 1002)), Err(EchoRejected::Unknown(2)), "overwritten");
        assert_eq!(gate.admit(&log, &echo(4, 1)), Err(EchoRejected::WrongTime(4)));
        assert_eq!(gate.admit(&log, &echo(4, 1004)), Ok(()));
        assert_eq!(gate.admit(&log, &echo(4, 1004)), Err(EchoRejected::NotAfter(4, 4)), "a replay");
        assert_eq!(gate.admit(&log, &echo(9, 1009)), Err(EchoRejected::Unknown(9)), "not sent yet");
        assert_eq!(gate.admit(&log, &echo(u64::MAX, 0)), Err(EchoRejected::Unknown(u64::MAX)));
        assert_eq!(gate.admit(&log, &echo(6, 1006)), Ok(()));
    }
}
