//! What the datagram drivers (UDP and multicast, NATS) do alike with their [`DatagramReceiver`]:
//! the events they take the same way, what they keep of the publisher's END, and the end of
//! the run.

use crate::collect::Collector;
use crate::counters::Counters;
use crate::error::Error;
use crate::event::{End, Event, Notice, RecoveryEvent, Skipped};
use crate::settings::Checked;
use mdrelay_proto::relay::Totals;
use mdrelay_proto::relay::client::{
    DatagramConfig, DatagramEvent, DatagramReceiver, Quiet, ReaderConfig, RecoveryConfig,
};

/// The machine's configuration from the settings, with echoes every `echo_every` frames and the
/// A/B lines' names, as the transport has them.
pub(crate) fn config(settings: &Checked, echo_every: Option<u64>, lines: Option<(String, String)>) -> DatagramConfig {
    DatagramConfig {
        reader: ReaderConfig {
            crc: settings.protection.crc,
            key: settings.key.clone(),
            symbols: settings.symbols.clone(),
            echo_every,
            ..ReaderConfig::default()
        },
        from_start: settings.from_start,
        lines,
        recovery: settings.recovery.as_ref().map(|r| RecoveryConfig {
            delay: r.delay,
            retry: r.retry,
            attempts: r.attempts,
            linger: r.linger,
        }),
        snapshot: settings.snapshot,
    }
}

/// What a datagram driver holds for the machine, borrowed together.
pub(crate) struct Parts<'a> {
    /// The machine.
    pub receiver: &'a mut DatagramReceiver,
    /// What is kept of its END.
    pub notes: &'a mut EndNotes,
    /// What the driver took since the caller was last given something.
    pub quiet: &'a mut Quiet,
}

/// A driver whose frames a [`DatagramReceiver`] puts in order: what [`begin_round`] and [`pump`]
/// need of it, and what they do alike.
pub(crate) trait DatagramDriver {
    /// The machine, what is kept of its END, and what was taken quietly.
    fn parts(&mut self) -> Parts<'_>;

    /// Stops what the driver runs beside the machine (connections, tasks): the run is over.
    fn stop(&mut self);

    /// What was counted, with what the collector counted.
    fn counters_with(&self, out: &Collector) -> Counters;

    /// The caller's event for one of the machine's events only this driver takes (`None`:
    /// nothing to tell).
    fn own_notice(&mut self, event: DatagramEvent, out: &mut Collector) -> Option<Notice>;

    /// Before the machine's events are taken.
    fn before_pump(&mut self, _out: &mut Collector) {}

    /// The error the stream ended with, once, if it ended with one.
    fn take_error(&mut self) -> Option<Error> {
        None
    }

    /// The stream ended.
    fn is_finished(&mut self) -> bool {
        self.parts().notes.is_run_over()
    }

    /// Ends the run (the machine finished, or the stream is closed now): what is still held or
    /// missing is given up, and the driver's own parts stop (once).
    fn close(&mut self, out: &mut Collector) {
        let Parts { receiver, notes, .. } = self.parts();
        if notes.finish_run(receiver, out) {
            self.stop();
        }
    }
}

/// The start of each round of a datagram driver's step: the machine's events taken, and the
/// step's result when it is over (an error, something for the caller, or the run over). When
/// the driver has taken a turn's worth that gave the caller nothing it first yields, so the
/// caller's deadline, a select!'s other branches and the runtime's timers run before the next.
pub(crate) async fn begin_round(driver: &mut impl DatagramDriver, out: &mut Collector) -> Option<Result<(), Error>> {
    loop {
        driver.before_pump(out);
        pump(driver, out);
        if let Some(error) = driver.take_error() {
            return Some(Err(error));
        }
        if out.has_items() || driver.is_finished() {
            driver.parts().quiet.produced();
            return Some(Ok(()));
        }
        if !driver.parts().quiet.turn_due() {
            return None;
        }
        tokio::task::yield_now().await;
    }
}

/// Takes the machine's events: the ones every datagram driver takes alike here, the others by
/// the driver's [`DatagramDriver::own_notice`].
fn pump(driver: &mut impl DatagramDriver, out: &mut Collector) {
    loop {
        let Parts { receiver, notes, .. } = driver.parts();
        let Some(event) = receiver.poll_event(out) else { break };
        let notice = match event {
            DatagramEvent::End { next_sequence, totals, .. } => {
                notes.ended(next_sequence, totals);
                continue;
            }
            DatagramEvent::Snapshot(snapshot) => {
                notes.snapshot = Some((snapshot.state.as_of, snapshot.totals.clone()));
                Event::Snapshot(crate::event::Snapshot::new(snapshot))
            }
            DatagramEvent::SnapshotMissing { why } => Event::SnapshotMissing { reason: why },
            DatagramEvent::Finished => {
                driver.close(out);
                let counters = driver.counters_with(out);
                driver.parts().notes.finished(&counters)
            }
            other => match datagram_notice(other).map_or_else(|other| driver.own_notice(other, out), Some) {
                Some(notice) => notice,
                None => continue,
            },
        };
        out.notice(notice);
    }
    let Parts { receiver, notes, .. } = driver.parts();
    notes.note_given_up(receiver, out);
}

/// What a datagram driver (UDP or NATS) keeps of the publisher's END until the machine
/// finishes, and the frames given up it has told of.
#[derive(Debug, Default)]
pub(crate) struct EndNotes {
    end: Option<(u64, Totals)>,
    /// The snapshot taken: its frame and the stream's totals up to it, which the end's verdict
    /// counts with what was taken after it.
    pub snapshot: Option<(u64, Totals)>,
    /// Frames given up so far, to tell when more are.
    given_up: u64,
    /// The run is over: nothing more is given up or repaired.
    run_over: bool,
}

impl EndNotes {
    /// The publisher's END arrived: it is told when the machine finishes.
    pub fn ended(&mut self, next_sequence: u64, totals: Totals) {
        self.end = Some((next_sequence, totals));
    }

    /// The machine finished: the end of the stream, complete when `counters` match the END.
    pub fn finished(&mut self, counters: &Counters) -> Notice {
        let (next_sequence, totals) = match self.end.take() {
            Some((next, totals)) => (next, Some(totals)),
            None => (0, None),
        };
        let complete = totals.as_ref().is_some_and(|t| match &self.snapshot {
            Some((as_of, before)) => counters.matches_after_snapshot(t, *as_of, before),
            None => counters.matches(t),
        });
        Event::End(End { totals, next_sequence, complete })
    }

    /// The run is over: what is still held or missing is given up, and told of. True the first
    /// time only, when the driver has its own parts to stop.
    pub fn finish_run(&mut self, receiver: &mut DatagramReceiver, out: &mut Collector) -> bool {
        if self.run_over {
            return false;
        }
        self.run_over = true;
        receiver.finish_run();
        self.note_given_up(receiver, out);
        true
    }

    /// Whether the run is over.
    pub fn is_run_over(&self) -> bool {
        self.run_over
    }

    /// Tells of frames given up since the last look.
    pub fn note_given_up(&mut self, receiver: &DatagramReceiver, out: &mut Collector) {
        let Some(book) = receiver.reader().book() else { return };
        let now = book.counts().frames_unrecoverable;
        if now > self.given_up {
            out.notice(Event::GivenUp { frames: now - self.given_up });
        }
        // A frame given up and then taken after all leaves the count: followed down too.
        self.given_up = now;
    }
}

/// The event a datagram machine's event is for the caller, for the events that need nothing of
/// the driver's (the session, restarts, what was skipped, frames a store or service no longer
/// has); the others back.
fn datagram_notice(event: DatagramEvent) -> Result<Notice, DatagramEvent> {
    Ok(match event {
        DatagramEvent::RecoveryGone { first, count } => Event::Recovery(RecoveryEvent::Gone { first, count }),
        DatagramEvent::SessionStarted { session, peer } => Event::SessionStarted { session, peer },
        DatagramEvent::Restarted { old, new, .. } => Event::Restarted { old, new },
        DatagramEvent::Held { session, sequence, peer } => Event::Skipped(Skipped::Held { peer, session, sequence }),
        DatagramEvent::NotRelay { peer, len, .. } => {
            Event::Skipped(Skipped::Invalid { peer, len, what: "not a relay datagram".into() })
        }
        DatagramEvent::BadHeader { peer, len, error } => {
            Event::Skipped(Skipped::Invalid { peer, len, what: error.to_string() })
        }
        DatagramEvent::Refused { peer, sequence, why, .. } => {
            Event::Skipped(Skipped::Protection { at: format!("datagram from {peer}"), first: sequence, why })
        }
        DatagramEvent::UnreadableEnd { peer, at, error } => {
            Event::Skipped(Skipped::End { peer, what: format!("its totals cannot be read at byte {at}: {error}") })
        }
        DatagramEvent::ForeignEnd { peer, session, next_sequence } => Event::Skipped(Skipped::End {
            peer,
            what: format!("of session {session:#x} up to frame {next_sequence}: it does not fit the stream"),
        }),
        other => return Err(other),
    })
}
