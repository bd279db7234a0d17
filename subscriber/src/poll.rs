//! How the receive loop waits for data: the idle strategy (`idle`, `--idle`) turned into
//! "poll the non-blocking socket again" or "wait for the kernel to say it is readable".
//!
//! `sleep` waits on readiness (epoll, through the runtime) every time: no CPU while the
//! network is quiet, and a wake-up as late as the scheduler makes it. `spin` and `yield`
//! never wait: the loop reads the non-blocking socket over and over on its own thread, with
//! a pause instruction or a `sched_yield` between empty reads, and gives the runtime a turn
//! every [`HOUSEKEEPING_ROUNDS`] rounds, so report ticks, `--duration`, signals, echoes and the
//! recovery task are served while it spins. `backoff` polls like `spin`, then like `yield`,
//! for a few dozen empty reads after each datagram, then waits on readiness.

use mdrelay_proto::idle::{IdleStrategy, Idler, Step};

/// Busy rounds between the runtime's turns (its timers, signals and other tasks run only when
/// the loop awaits something that is not ready): a few tens of microseconds of spinning.
pub const HOUSEKEEPING_ROUNDS: u32 = 64;

/// The receive loop's waiting state.
#[derive(Debug)]
pub struct Poller {
    idler: Idler,
    /// The next wait is on readiness.
    parking: bool,
    /// Busy rounds since the runtime's last turn.
    rounds: u32,
}

impl Poller {
    /// A poller for `strategy`.
    pub fn new(strategy: IdleStrategy) -> Poller {
        Poller { idler: Idler::new(strategy), parking: strategy == IdleStrategy::Sleep, rounds: 0 }
    }

    /// True when this round waits for readiness; false when it reads the socket without waiting.
    pub fn park(&self) -> bool {
        self.parking
    }

    /// Whether this busy round should give the runtime its turn; counts the round.
    pub fn housekeeping_due(&mut self) -> bool {
        self.rounds = self.rounds.wrapping_add(1);
        self.rounds % HOUSEKEEPING_ROUNDS == 0
    }

    /// After a round's reads: `taken` payloads arrived. Data resets the strategy; an empty
    /// round spins, yields, or switches to waiting for readiness, as the strategy says.
    pub fn after(&mut self, taken: usize) {
        if taken > 0 {
            self.idler.reset();
            self.parking = self.idler.strategy() == IdleStrategy::Sleep;
            return;
        }
        match self.idler.next_step() {
            Step::Spin => std::hint::spin_loop(),
            Step::Yield => std::thread::yield_now(),
            Step::Park(_) => self.parking = true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sleep_always_parks_and_busy_strategies_never_do() {
        let mut p = Poller::new(IdleStrategy::Sleep);
        assert!(p.park());
        p.after(3);
        assert!(p.park());
        for s in [IdleStrategy::Spin, IdleStrategy::Yield] {
            let mut p = Poller::new(s);
            for _ in 0..1000 {
                p.after(0);
            }
            assert!(!p.park(), "{s}");
        }
    }

    #[test]
    fn backoff_parks_after_its_busy_turns_and_polls_again_after_data() {
        let mut p = Poller::new(IdleStrategy::Backoff);
        let mut busy = 0;
        while !p.park() {
            p.after(0);
            busy += 1;
        }
        assert!(busy > 1 && busy < 1000, "{busy}");
        p.after(1);
        assert!(!p.park());
    }
}
