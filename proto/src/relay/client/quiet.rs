//! Work that gives the program nothing, bounded ([`Quiet`]).
//!
//! A peer decides what arrives, and some of it yields nothing for the program: a `FORMAT` record
//! of the format already in use, sent over and over; records or datagrams a receiver skips
//! without a word; messages on a subject that are all duplicates. Taken one after the other as
//! fast as they come, such input would keep a driver busy for as long as the peer likes, and
//! its caller's deadline, report ticks, signals and cancellation would never get their turn.
//!
//! So every receiver counts the units of input (records, datagrams, messages) and bytes it took
//! since it last gave its caller something (an event or a frame), and owes the caller a turn
//! once [`QUIET_UNITS`] units or [`QUIET_BYTES`] bytes were taken without one: the machine says
//! so ([`StreamClient`](super::StreamClient) with an event; the datagram drivers ask
//! [`Quiet::turn_due`] themselves), and the driver then yields to its runtime, or looks at its
//! stop flag, before it goes on. The flood is still taken, at full speed between turns; nothing
//! is dropped.

/// Units of input (records, datagrams, messages) taken without anything for the caller before
/// it is owed a turn. A few microseconds of work on one core.
pub const QUIET_UNITS: u32 = 1024;
/// Bytes taken without anything for the caller before it is owed a turn: a few reads, however
/// the bytes are cut into units (one record of 64 MiB is one unit).
pub const QUIET_BYTES: usize = 1 << 20;

/// The input taken since the caller was last given something: see the module's documentation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Quiet {
    units: u32,
    bytes: usize,
    turns: u64,
}

impl Quiet {
    /// Nothing taken yet.
    pub fn new() -> Quiet {
        Quiet::default()
    }

    /// The caller was given something (an event, a frame): the count starts over.
    pub fn produced(&mut self) {
        self.units = 0;
        self.bytes = 0;
    }

    /// One unit of input was taken that gave the caller nothing.
    pub fn took(&mut self) {
        self.units = self.units.saturating_add(1);
    }

    /// `n` bytes of input arrived (counted whether or not they make a whole unit yet).
    pub fn received(&mut self, n: usize) {
        self.bytes = self.bytes.saturating_add(n);
    }

    /// Whether the caller is owed its turn now; when it is, the count starts over and the turn
    /// is counted.
    pub fn turn_due(&mut self) -> bool {
        if self.units < QUIET_UNITS && self.bytes < QUIET_BYTES {
            return false;
        }
        self.produced();
        self.turns += 1;
        true
    }

    /// Turns owed so far: how often input that gave nothing went on for a whole budget.
    pub fn turns(&self) -> u64 {
        self.turns
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_turn_is_due_after_a_budget_of_units_or_bytes_without_output_and_output_starts_it_over() {
        let mut q = Quiet::new();
        for _ in 0..QUIET_UNITS - 1 {
            q.took();
            assert!(!q.turn_due());
        }
        q.produced();
        for _ in 0..QUIET_UNITS - 1 {
            q.took();
        }
        assert!(!q.turn_due(), "output started the count over");
        q.took();
        assert!(q.turn_due());
        assert!(!q.turn_due(), "the turn starts the count over");
        q.received(QUIET_BYTES - 1);
        assert!(!q.turn_due());
        q.received(1);
        assert!(q.turn_due(), "one huge unit is a turn's worth of bytes");
        assert_eq!(q.turns(), 2);
    }
}
