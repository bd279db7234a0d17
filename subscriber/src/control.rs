//! What interrupts receiving, whatever the transport: the report ticker, the `--duration`
//! deadline and Ctrl-C / SIGTERM. The receive loop waits on [`Control::next`] beside the
//! subscriber's next event, so a report or a stop is never held up by a quiet network.

use std::pin::Pin;
use std::time::Duration;
use tokio::signal::unix::{Signal, SignalKind, signal};
use tokio::time::{Instant, Interval, MissedTickBehavior, Sleep};

/// Why a run stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stop {
    /// The publisher's end of stream.
    End,
    /// `--count` messages arrived.
    Count,
    /// `--duration` passed.
    Duration,
    /// Ctrl-C or SIGTERM.
    Signal,
}

impl Stop {
    /// The name in reports.
    pub fn name(self) -> &'static str {
        match self {
            Stop::End => "end",
            Stop::Count => "count",
            Stop::Duration => "duration",
            Stop::Signal => "signal",
        }
    }
}

/// What ends a run other than a [`Stop`]; the final report is printed all the same.
#[derive(Debug)]
pub enum RunError {
    /// The publisher refused the subscriber, or speaks another protocol: exit code 3.
    Refused(String),
    /// A setting the transport could not use (NATS credentials the server refuses, say): exit
    /// code 2.
    Config(String),
    /// The transport could not be set up (e.g. the address cannot be bound): exit code 1.
    Fatal(anyhow::Error),
}

/// Something to act on between reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    /// A report period passed.
    Tick,
    /// Time to copy the counts into the metrics endpoint.
    Metrics,
    /// Stop now.
    Stop(Stop),
}

/// The ticker, the deadline and the signals.
pub struct Control {
    ticker: Option<Interval>,
    metrics: Option<Interval>,
    /// One timer for the whole run: `next` is polled once per read, and a timer made afresh on
    /// each poll would cost a timer-wheel insertion and removal every time.
    deadline: Option<Pin<Box<Sleep>>>,
    interrupt: Signal,
    terminate: Signal,
}

impl Control {
    /// Ticks every `report` (if set), stops after `duration`; installs the signal handlers, so
    /// it must run inside the runtime.
    pub fn new(report: Option<Duration>, duration: Option<Duration>) -> std::io::Result<Control> {
        let start = Instant::now();
        let ticker = report.map(|period| {
            let mut t = tokio::time::interval_at(start + period, period);
            // A late tick (a long burst of data) is not made up for with a flurry of short intervals.
            t.set_missed_tick_behavior(MissedTickBehavior::Delay);
            t
        });
        let control = Control {
            ticker,
            metrics: None,
            deadline: duration.map(|d| Box::pin(tokio::time::sleep_until(start + d))),
            interrupt: signal(SignalKind::interrupt())?,
            terminate: signal(SignalKind::terminate())?,
        };
        // Scripts and tests wait for this line before signalling.
        tracing::info!("signal handlers installed");
        Ok(control)
    }

    /// Also ticks [`Event::Metrics`] every `every`.
    pub fn with_metrics(mut self, every: Duration) -> Control {
        let mut t = tokio::time::interval_at(Instant::now() + every, every);
        t.set_missed_tick_behavior(MissedTickBehavior::Delay);
        self.metrics = Some(t);
        self
    }

    /// The next event; cancel-safe, so it can sit in a `select!` beside a socket read.
    pub async fn next(&mut self) -> Event {
        let ticker = &mut self.ticker;
        let deadline = &mut self.deadline;
        let has_deadline = deadline.is_some();
        let has_ticker = ticker.is_some();
        let metrics = &mut self.metrics;
        let has_metrics = metrics.is_some();
        tokio::select! {
            _ = self.interrupt.recv() => Event::Stop(Stop::Signal),
            _ = self.terminate.recv() => Event::Stop(Stop::Signal),
            _ = async { deadline.as_mut().expect("guarded").as_mut().await }, if has_deadline => {
                Event::Stop(Stop::Duration)
            }
            _ = async { ticker.as_mut().expect("guarded").tick().await }, if has_ticker => Event::Tick,
            _ = async { metrics.as_mut().expect("guarded").tick().await }, if has_metrics => Event::Metrics,
        }
    }
}
