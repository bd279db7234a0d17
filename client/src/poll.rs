//! How the drivers wait for data: the idle strategy turned into "read the non-blocking sockets
//! again" or "wait for the kernel to say one is readable".
//!
//! `sleep` waits on readiness every time: no CPU while the network is quiet. `spin` and `yield`
//! never wait: the driver reads the non-blocking sockets over and over, with a pause
//! instruction or a `sched_yield` between empty reads, and gives the runtime a turn every
//! [`HOUSEKEEPING_ROUNDS`] rounds, so other tasks on it still run. `backoff` polls like `spin`,
//! then like `yield`, for a few dozen empty reads after data, then waits on readiness.

use mdrelay_runtime::idle::{IdleStrategy, Idler, Step};

/// Busy rounds between the runtime's turns: a few tens of microseconds of spinning.
pub(crate) const HOUSEKEEPING_ROUNDS: u32 = 64;

/// A driver's waiting state.
#[derive(Debug)]
pub(crate) struct Poller {
    idler: Idler,
    /// The next wait is on readiness.
    parking: bool,
    /// Busy rounds since the runtime's last turn.
    rounds: u32,
}

/// What an empty round does next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Idle {
    /// Read again at once.
    Poll,
    /// Give the runtime its turn, then read again.
    Yield,
    /// Wait for readiness (or the next deadline).
    Park,
}

impl Poller {
    /// A poller for `strategy`.
    pub fn new(strategy: IdleStrategy) -> Poller {
        Poller { idler: Idler::new(strategy), parking: strategy == IdleStrategy::Sleep, rounds: 0 }
    }

    /// Data came: busy strategies poll again.
    pub fn data(&mut self) {
        self.idler.reset();
        self.parking = self.idler.strategy() == IdleStrategy::Sleep;
    }

    /// Nothing came this round: what to do.
    pub fn empty(&mut self) -> Idle {
        if self.parking {
            return Idle::Park;
        }
        match self.idler.next_step() {
            Step::Spin => std::hint::spin_loop(),
            Step::Yield => std::thread::yield_now(),
            Step::Park(_) => {
                self.parking = true;
                return Idle::Park;
            }
        }
        self.rounds = self.rounds.wrapping_add(1);
        if self.rounds.is_multiple_of(HOUSEKEEPING_ROUNDS) { Idle::Yield } else { Idle::Poll }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sleep_always_parks_busy_strategies_never_do_and_backoff_does_after_its_turns() {
        let mut p = Poller::new(IdleStrategy::Sleep);
        assert_eq!(p.empty(), Idle::Park);
        p.data();
        assert_eq!(p.empty(), Idle::Park);
        for s in [IdleStrategy::Spin, IdleStrategy::Yield] {
            let mut p = Poller::new(s);
            let rounds: Vec<Idle> = (0..1000).map(|_| p.empty()).collect();
            assert!(!rounds.contains(&Idle::Park), "{s}");
            assert_eq!(rounds.iter().filter(|r| **r == Idle::Yield).count(), 1000 / HOUSEKEEPING_ROUNDS as usize);
        }
        let mut p = Poller::new(IdleStrategy::Backoff);
        let busy = (0..1000).take_while(|_| p.empty() != Idle::Park).count();
        assert!(busy > 1 && busy < 1000, "{busy}");
        p.data();
        assert_ne!(p.empty(), Idle::Park);
    }
}
