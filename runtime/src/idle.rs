//! Idle strategies: how a hot thread waits when it has nothing to do, or until a deadline.
//!
//! The names are Aeron's. `spin` gives the lowest wake-up latency and burns a core; `yield`
//! burns it too but lets other runnable threads on that core go first; `sleep` costs almost
//! nothing while waiting but wakes as late as the kernel's timers allow (tens of microseconds
//! in a virtual machine, more with the default 50 µs timer slack); `backoff` spins a little,
//! yields a little, then sleeps, and before a known deadline sleeps until just before it and
//! spins the rest, which keeps the CPU low and the wake-up on time.
//!
//! Nothing here does I/O: the callers own their sockets, and a caller that waits for a socket
//! rather than for time (the subscriber) takes [`Idler::next_step`] and parks its own way.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;
use std::time::{Duration, Instant};

/// How a thread waits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize, Serialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum IdleStrategy {
    /// Busy spin: the lowest latency, a whole core.
    Spin,
    /// Spin with `sched_yield` between looks: a whole core, shared with runnable threads.
    Yield,
    /// Spin, then yield, then sleep with growing sleeps; before a deadline, sleep until just
    /// before it and spin the rest.
    #[default]
    Backoff,
    /// Plain sleeps (or, for a socket, the kernel's readiness wait).
    Sleep,
}

impl IdleStrategy {
    /// Every strategy, in the order of the documentation.
    pub const ALL: [IdleStrategy; 4] =
        [IdleStrategy::Spin, IdleStrategy::Yield, IdleStrategy::Backoff, IdleStrategy::Sleep];

    /// The name in configuration files and flags.
    pub fn name(self) -> &'static str {
        match self {
            IdleStrategy::Spin => "spin",
            IdleStrategy::Yield => "yield",
            IdleStrategy::Backoff => "backoff",
            IdleStrategy::Sleep => "sleep",
        }
    }

    /// True when the strategy never gives its core away for long (spin, yield): a thread
    /// using it takes a whole core.
    pub fn busy(self) -> bool {
        matches!(self, IdleStrategy::Spin | IdleStrategy::Yield)
    }
}

/// `Display` of each type given as its `name()`: the name in configuration files and flags.
macro_rules! display_as_name {
    ($($named:ty),+) => {
        $(impl fmt::Display for $named {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.name())
            }
        })+
    };
}

display_as_name!(IdleStrategy, Profile);

impl FromStr for IdleStrategy {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        IdleStrategy::ALL
            .into_iter()
            .find(|i| i.name() == s)
            .ok_or_else(|| format!("{s:?} is not an idle strategy: give spin, yield, backoff or sleep"))
    }
}

/// A set of choices made together: the programs map each profile to their own settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize, Serialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum Profile {
    /// Low CPU: waits sleep or park on the kernel.
    #[default]
    Default,
    /// The lowest latency: spin, busy-poll sockets, pin hot threads to their cores.
    LowLatency,
}

impl Profile {
    /// The name in configuration files and flags.
    pub fn name(self) -> &'static str {
        match self {
            Profile::Default => "default",
            Profile::LowLatency => "low-latency",
        }
    }
}

/// The publisher's `[pacing] idle` under `profile`: `backoff`, or `spin` for low latency. A
/// function rather than a method: `Profile` is part of the client library's API, these are not.
pub fn pacing_idle(profile: Profile) -> IdleStrategy {
    match profile {
        Profile::Default => IdleStrategy::Backoff,
        Profile::LowLatency => IdleStrategy::Spin,
    }
}

/// The publisher's `[pacing] duty_cycle` under `profile`. Default: long enough that at market
/// rates a wake-up sends several segments (a wake-up costs tens of microseconds of CPU on a
/// virtual machine), short against what a replay's consumer acts on (docs/idle.md).
/// Low-latency: none, each segment at its time.
pub fn duty_cycle(profile: Profile) -> Duration {
    match profile {
        Profile::Default => Duration::from_millis(1),
        Profile::LowLatency => Duration::ZERO,
    }
}

impl FromStr for Profile {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "default" => Ok(Profile::Default),
            "low-latency" => Ok(Profile::LowLatency),
            _ => Err(format!("{s:?} is not a profile: give default or low-latency")),
        }
    }
}

/// `backoff`: idle turns spent spinning before yielding. A spin turn is a pause instruction
/// plus the caller's own look (a clock read here, a non-blocking receive in the subscriber),
/// so this is a few microseconds: work that comes back at once is caught without a syscall.
pub const BACKOFF_SPINS: u32 = 32;
/// `backoff`: idle turns spent yielding after spinning (about 0.5 µs each on a 2 vCPU KVM
/// guest, measured), before parking.
pub const BACKOFF_YIELDS: u32 = 8;
/// `backoff`: the first park; each one after doubles, up to [`MAX_PARK`].
pub const MIN_PARK: Duration = Duration::from_micros(50);
/// `backoff`: the longest park, which bounds how late an idle thread notices new work.
pub const MAX_PARK: Duration = Duration::from_millis(1);
/// `sleep`: every idle turn parks this long.
pub const SLEEP_PARK: Duration = Duration::from_micros(100);

/// `backoff`'s first guess of how late a sleep wakes: the default timer slack (50 µs) plus a
/// little. The measured lateness replaces it within a few dozen sleeps.
const INITIAL_LATENESS: Duration = Duration::from_micros(60);
/// Added to the lateness estimate: the share of wake-ups later than the estimate then lands
/// within a microsecond or two of the deadline instead of past it.
const LATENESS_GUARD: Duration = Duration::from_micros(2);
/// A sleep shorter than this is not worth its syscall and wake-up: the rest is spun.
const MIN_SLEEP: Duration = Duration::from_micros(5);
/// The estimate never exceeds this: above it, waits between market data packets (50 µs at
/// 20,000 messages/s) would never sleep, and without sleeps the estimate could not come down.
const MAX_LATENESS: Duration = Duration::from_micros(100);
/// `backoff`, last stretch before a deadline: spin while this little is left, yield above it.
const SPIN_STRETCH: Duration = Duration::from_micros(3);

/// What to do on one idle turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Spin once (a pause instruction), then look again.
    Spin,
    /// Yield the CPU once, then look again.
    Yield,
    /// Park: sleep this long, or wait for readiness when the caller waits for a socket.
    Park(Duration),
}

/// A strategy's state: where a run of idle turns is, and how late sleeps wake.
#[derive(Debug, Clone)]
pub struct Idler {
    strategy: IdleStrategy,
    /// Idle turns since the last work.
    turns: u32,
    /// The next park's length (`backoff`).
    park: Duration,
    /// How late a sleep wakes, estimated from the sleeps so far (`backoff`).
    lateness: Duration,
}

impl Idler {
    /// An idler for `strategy`.
    pub fn new(strategy: IdleStrategy) -> Idler {
        Idler { strategy, turns: 0, park: MIN_PARK, lateness: INITIAL_LATENESS }
    }

    /// The strategy.
    pub fn strategy(&self) -> IdleStrategy {
        self.strategy
    }

    /// How late a sleep is expected to wake (`backoff`'s estimate, from measured sleeps).
    pub fn lateness(&self) -> Duration {
        self.lateness
    }

    /// Work was found: the next idle run starts from its first step.
    pub fn reset(&mut self) {
        self.turns = 0;
        self.park = MIN_PARK;
    }

    /// The step for this idle turn, counting it.
    pub fn next_step(&mut self) -> Step {
        let turn = self.turns;
        self.turns = self.turns.saturating_add(1);
        match self.strategy {
            IdleStrategy::Spin => Step::Spin,
            IdleStrategy::Yield => Step::Yield,
            IdleStrategy::Sleep => Step::Park(SLEEP_PARK),
            IdleStrategy::Backoff if turn < BACKOFF_SPINS => Step::Spin,
            IdleStrategy::Backoff if turn < BACKOFF_SPINS + BACKOFF_YIELDS => Step::Yield,
            IdleStrategy::Backoff => {
                let park = self.park;
                self.park = (self.park * 2).min(MAX_PARK);
                Step::Park(park)
            }
        }
    }

    /// One idle turn with nothing to wait for but time: spins, yields or sleeps.
    pub fn idle(&mut self) {
        match self.next_step() {
            Step::Spin => std::hint::spin_loop(),
            Step::Yield => std::thread::yield_now(),
            Step::Park(d) => std::thread::sleep(d),
        }
    }

    /// Waits until `target`, the strategy's way; returns at once when it has passed.
    pub fn wait_until(&mut self, target: Instant) {
        let _ = self.wait_until_within(target, Duration::ZERO);
    }

    /// How early a duty cycle of `duty_cycle` may let work go out. Under `backoff` a duty cycle
    /// is at least the learned lateness, so that the thread never spins or yields through a wait
    /// it could not sleep (the work goes now instead). Zero is no duty cycle: each piece of work
    /// at its time, spinning the last of each wait as before.
    pub fn duty_window(&self, duty_cycle: Duration) -> Duration {
        match self.strategy {
            IdleStrategy::Backoff if !duty_cycle.is_zero() => {
                duty_cycle.max(self.lateness + LATENESS_GUARD + MIN_SLEEP)
            }
            _ => duty_cycle,
        }
    }

    /// Waits until `early` before `target` at the latest, the strategy's way: a sleep aims at
    /// `target` itself (by the learned lateness), and whatever is left of the wait after it
    /// within `early` is not spun. Returns at once when that moment has passed; says whether
    /// it waited at all.
    pub fn wait_until_within(&mut self, target: Instant, early: Duration) -> bool {
        let mut waited = false;
        loop {
            let now = Instant::now();
            let Some(left) = target.checked_duration_since(now).filter(|left| *left > early) else {
                return waited;
            };
            waited = true;
            match self.strategy {
                IdleStrategy::Spin => std::hint::spin_loop(),
                IdleStrategy::Yield => std::thread::yield_now(),
                IdleStrategy::Sleep => std::thread::sleep(left - early),
                IdleStrategy::Backoff => {
                    let margin = self.lateness + LATENESS_GUARD;
                    if left > margin + MIN_SLEEP {
                        let asked = left - margin;
                        std::thread::sleep(asked);
                        self.observe(now.elapsed().saturating_sub(asked));
                    } else if left - early > SPIN_STRETCH {
                        std::thread::yield_now();
                    } else {
                        std::hint::spin_loop();
                    }
                }
            }
        }
    }

    /// Takes one sleep's lateness into the estimate: up faster (a late wake costs latency) than
    /// down (an early one costs only a little spinning), so the estimate sits in the upper part
    /// of what sleeps do; one observation counts for at most twice the estimate, so a thread
    /// preempted for a millisecond on a busy host does not make the following waits spin.
    fn observe(&mut self, late: Duration) {
        let late = late.min(self.lateness * 2);
        if late > self.lateness {
            self.lateness += (late - self.lateness) / 8;
        } else {
            self.lateness -= (self.lateness - late) / 16;
        }
        self.lateness = self.lateness.min(MAX_LATENESS);
    }
}

/// A yield slower than this found other tasks waiting for the CPU besides the one the write
/// woke: a woken subscriber takes its frames in tens of microseconds, a competing task its
/// whole time slice (milliseconds).
pub const SLOW_YIELD: Duration = Duration::from_micros(250);
/// How long yields stop after the first slow one.
pub const FIRST_YIELD_PAUSE: Duration = Duration::from_millis(10);
/// The longest pause: under lasting contention one yield a second is tried, which costs at
/// most one time slice a second.
pub const MAX_YIELD_PAUSE: Duration = Duration::from_secs(1);

/// Whether a hot thread yields after waking a reader on its CPU (so that the reader runs now,
/// not after the rest of the thread's burst). On an idle CPU the yield hands over to that
/// reader and returns within microseconds; on a CPU other tasks compete for, each yield can
/// cost a whole time slice, and a thread yielding thousands of times a second falls seconds
/// behind. So a slow yield stops yields for a pause that doubles with each slow one (from
/// [`FIRST_YIELD_PAUSE`] to [`MAX_YIELD_PAUSE`]); a quick one turns yields on again and halves
/// the next pause, so a CPU whose competition comes and goes is not yielded on often. Fed the
/// times, it reads no clock itself.
#[derive(Debug, Clone)]
pub struct YieldGate {
    /// No yield before this (none: yields are on).
    paused_until: Option<Instant>,
    /// The next pause's length.
    pause: Duration,
}

impl Default for YieldGate {
    fn default() -> YieldGate {
        YieldGate { paused_until: None, pause: FIRST_YIELD_PAUSE }
    }
}

impl YieldGate {
    /// Whether to yield at `now`.
    pub fn open(&self, now: Instant) -> bool {
        self.paused_until.is_none_or(|until| now >= until)
    }

    /// A yield begun at `began` returned at `ended`.
    pub fn yielded(&mut self, began: Instant, ended: Instant) {
        if ended.saturating_duration_since(began) < SLOW_YIELD {
            self.paused_until = None;
            self.pause = (self.pause / 2).max(FIRST_YIELD_PAUSE);
            return;
        }
        self.paused_until = Some(ended + self.pause);
        self.pause = (self.pause * 2).min(MAX_YIELD_PAUSE);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_bad_ones_are_explained() {
        for s in IdleStrategy::ALL {
            assert_eq!(s.name().parse::<IdleStrategy>(), Ok(s));
        }
        let e = "fast".parse::<IdleStrategy>().unwrap_err();
        assert!(e.contains("spin, yield, backoff or sleep"), "{e}");
        assert_eq!("low-latency".parse::<Profile>(), Ok(Profile::LowLatency));
        assert!("quick".parse::<Profile>().is_err());
    }

    #[test]
    fn backoff_spins_then_yields_then_parks_longer_each_time_up_to_the_cap() {
        let mut idler = Idler::new(IdleStrategy::Backoff);
        let steps: Vec<Step> = (0..BACKOFF_SPINS + BACKOFF_YIELDS + 10).map(|_| idler.next_step()).collect();
        assert!(steps[..BACKOFF_SPINS as usize].iter().all(|s| *s == Step::Spin));
        assert!(
            steps[BACKOFF_SPINS as usize..(BACKOFF_SPINS + BACKOFF_YIELDS) as usize].iter().all(|s| *s == Step::Yield)
        );
        let parks: Vec<Duration> = steps
            .iter()
            .filter_map(|s| match s {
                Step::Park(d) => Some(*d),
                _ => None,
            })
            .collect();
        assert_eq!(parks[0], MIN_PARK);
        assert_eq!(parks[1], MIN_PARK * 2);
        assert_eq!(*parks.last().unwrap(), MAX_PARK);
        idler.reset();
        assert_eq!(idler.next_step(), Step::Spin);
    }

    #[test]
    fn busy_strategies_never_park() {
        for strategy in [IdleStrategy::Spin, IdleStrategy::Yield] {
            let mut idler = Idler::new(strategy);
            assert!((0..1000).all(|_| !matches!(idler.next_step(), Step::Park(_))));
        }
    }

    #[test]
    fn every_strategy_waits_until_the_deadline() {
        for strategy in IdleStrategy::ALL {
            let mut idler = Idler::new(strategy);
            let start = Instant::now();
            for i in 1..=20u32 {
                let target = start + Duration::from_micros(200) * i;
                idler.wait_until(target);
                assert!(Instant::now() >= target, "{strategy}");
            }
        }
    }

    #[test]
    fn the_lateness_estimate_rises_fast_falls_slowly_and_is_bounded() {
        let mut idler = Idler::new(IdleStrategy::Backoff);
        for _ in 0..200 {
            idler.observe(Duration::from_micros(20));
        }
        let settled = idler.lateness();
        assert!(settled < Duration::from_micros(25), "{settled:?}");
        // A preempted sleep moves it by an eighth of the estimate at most.
        idler.observe(Duration::from_secs(1));
        assert!(idler.lateness() <= settled + settled / 8 + Duration::from_nanos(1), "{:?}", idler.lateness());
        for _ in 0..1000 {
            idler.observe(Duration::from_secs(1));
        }
        assert_eq!(idler.lateness(), MAX_LATENESS);
    }
    #[test]
    fn quick_yields_go_on_and_slow_ones_pause_yields_for_doubling_times() {
        let start = Instant::now();
        let at = |micros: u64| start + Duration::from_micros(micros);
        let mut gate = YieldGate::default();
        assert!(gate.open(at(0)));
        gate.yielded(at(0), at(40));
        assert!(gate.open(at(41)), "a quick yield keeps yields on");
        // A slow one: no yield for 10 ms after it returned.
        gate.yielded(at(100), at(3_100));
        assert!(!gate.open(at(3_101)) && !gate.open(at(13_099)));
        assert!(gate.open(at(13_100)));
        // Slow again when tried: 20 ms, then 40 ms, ... up to a second.
        gate.yielded(at(13_100), at(16_000));
        assert!(!gate.open(at(35_999)) && gate.open(at(36_000)));
        let mut now = 36_000;
        for _ in 0..12 {
            gate.yielded(at(now), at(now + 5_000));
            now += 5_000;
            while !gate.open(at(now)) {
                now += 1_000;
            }
        }
        gate.yielded(at(now), at(now + 5_000));
        assert!(!gate.open(at(now + 5_000 + 999_000)) && gate.open(at(now + 5_000 + 1_000_000)), "at most a second");
        // A quick one ends the pause and halves the next: a slow one after it pauses 500 ms.
        let later = now + 2_000_000;
        gate.yielded(at(later), at(later + 10));
        assert!(gate.open(at(later + 20)));
        gate.yielded(at(later + 100), at(later + 1_100));
        assert!(!gate.open(at(later + 1_100 + 499_999)) && gate.open(at(later + 1_100 + 500_000)));
        // Quick yields bring the pause back down to 10 ms, no lower.
        let later = later + 1_000_000;
        for i in 0..10 {
            gate.yielded(at(later + i * 100), at(later + i * 100 + 10));
        }
        gate.yielded(at(later + 2_000), at(later + 3_000));
        assert!(!gate.open(at(later + 3_000 + 9_999)) && gate.open(at(later + 3_000 + 10_000)));
    }
}
