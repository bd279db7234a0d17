//! `mdrelay-bench arbitration`: what A/B line arbitration costs a subscriber's receive path, in
//! ns per datagram received, against one line. The subscriber's own accounting runs on a
//! stream of one-frame datagrams: on one line, each frame through the session tracker; on two,
//! each frame's two copies through `Lines` (the line's window, then the merged one), with a
//! share of each line's datagrams dropped independently. Decoding is left out: it is the same
//! with one line or two (a second copy is never decoded), so the difference is arbitration.
//! Per-batch percentiles, both variants measured in one run, interleaved.

use anyhow::Result;
use clap::Args;
use hdrhistogram::Histogram;
use mdrelay_proto::relay::SessionTracker;
use mdrelay_proto::relay::client::{Line, Lines};
use quanta::Clock;

/// Arguments of `arbitration`.
#[derive(Debug, Args)]
pub struct ArbitrationArgs {
    /// Frames in the stream.
    #[arg(long, default_value_t = 4_000_000)]
    pub frames: u64,
    /// Datagrams per timed batch.
    #[arg(long, default_value_t = 1024)]
    pub batch: u64,
    /// Share of each line's datagrams dropped, percent.
    #[arg(long, default_value_t = 1)]
    pub loss: u32,
    /// Rounds of both variants, interleaved.
    #[arg(long, default_value_t = 5)]
    pub rounds: u32,
}

/// A deterministic generator (xorshift): the same drops in every round and variant.
struct Drops(u64);

impl Drops {
    fn dropped(&mut self, percent: u32) -> bool {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % 100 < u64::from(percent)
    }
}

/// Feeds the stream's frames, one copy per line in `lines` (each copy dropped at the loss
/// rate), to `receive`, timing each batch: ns per datagram received go to `per_datagram`.
/// Returns the frames `receive` took.
fn timed(
    args: &ArbitrationArgs,
    clock: &Clock,
    per_datagram: &mut Histogram<u64>,
    lines: &[Line],
    mut receive: impl FnMut(Line, u64) -> bool,
) -> u64 {
    let mut drops = Drops(0x9e37_79b9_7f4a_7c15);
    let mut taken = 0u64;
    let mut seq = 1;
    while seq <= args.frames {
        let start = clock.raw();
        let mut received = 0u64;
        for s in seq..(seq + args.batch).min(args.frames + 1) {
            for &line in lines {
                if drops.dropped(args.loss) {
                    continue;
                }
                received += 1;
                taken += u64::from(receive(line, s));
            }
        }
        let ns = clock.delta_as_nanos(start, clock.raw());
        if let Some(each) = ns.checked_div(received) {
            per_datagram.saturating_record(each.max(1));
        }
        seq += args.batch;
    }
    taken
}

/// One line: every frame through the session tracker.
fn one_line(args: &ArbitrationArgs, clock: &Clock, per_datagram: &mut Histogram<u64>) -> u64 {
    let mut tracker = SessionTracker::new();
    tracker.datagram(1, 1, 1);
    timed(args, clock, per_datagram, &[Line::A], |_, s| tracker.observe(s).take())
}

/// Two lines: each copy through its line's window, then the merged one.
fn two_lines(args: &ArbitrationArgs, clock: &Clock, per_datagram: &mut Histogram<u64>) -> u64 {
    let mut tracker = SessionTracker::new();
    tracker.datagram(1, 1, 1);
    let mut lines = Lines::new("a".into(), "b".into());
    timed(args, clock, per_datagram, &[Line::A, Line::B], |line, s| {
        lines.datagram(line);
        lines.observe(line, s, &mut tracker).is_some_and(|o| o.take())
    })
}

/// Runs both variants and prints their percentiles.
pub fn run(args: &ArbitrationArgs) -> Result<()> {
    anyhow::ensure!(args.frames > 0 && args.batch > 0 && args.loss <= 100, "give frames, batch > 0 and loss ≤ 100");
    let clock = Clock::new();
    let new = || Histogram::<u64>::new_with_bounds(1, 1_000_000_000, 3).expect("valid bounds");
    let (mut one, mut two) = (new(), new());
    let (mut taken_one, mut taken_two) = (0, 0);
    for _ in 0..args.rounds {
        taken_one = one_line(args, &clock, &mut one);
        taken_two = two_lines(args, &clock, &mut two);
    }
    println!(
        "A/B arbitration, {} frames, one frame per datagram, {} % of each line's datagrams dropped, {} rounds",
        args.frames, args.loss, args.rounds
    );
    println!();
    println!("| receive path | frames taken | ns/datagram p50 | p90 | p99 | p99.9 |");
    println!("|---|---|---|---|---|---|");
    for (name, taken, h) in [("one line", taken_one, &one), ("two lines (A/B)", taken_two, &two)] {
        println!(
            "| {name} | {taken} | {} | {} | {} | {} |",
            h.value_at_quantile(0.5),
            h.value_at_quantile(0.9),
            h.value_at_quantile(0.99),
            h.value_at_quantile(0.999)
        );
    }
    Ok(())
}
