//! Named presets of the programs' command-line arguments that tests repeat, and [`words`] to
//! turn a command line written as one string into the arguments a process is started with.
//!
//! A test writes `words(&format!("run --capture {deep10} {TCP_LOSSLESS_ONE_SUBSCRIBER} {PACED_100K}"))`:
//! the paths the tests pass (temporary directories, `../shared`) hold no white space.

/// The words of `args`, split at white space: the arguments of a command line written as one string.
pub fn words(args: &str) -> Vec<&str> {
    args.split_whitespace().collect()
}

/// A lossless TCP server on a free loopback port that waits for one subscriber and blocks on slow ones.
pub const TCP_LOSSLESS_ONE_SUBSCRIBER: &str = "--tcp 127.0.0.1:0 --wait-subscribers 1 --slow-subscriber block";

/// A lossless TCP server on every address of a host (an emulated one), waiting for one subscriber and blocking on slow ones.
pub const TCP_LOSSLESS_ONE_SUBSCRIBER_ANY_ADDRESS: &str =
    "--tcp 0.0.0.0:0 --wait-subscribers 1 --slow-subscriber block";

/// Paced at 100,000 frames a second.
pub const PACED_100K: &str = "--pacing rate --rate 100000";

/// Paced at 40,000 frames a second: DEEP10 lasts a few seconds.
pub const PACED_40K: &str = "--pacing rate --rate 40000";

/// The retransmission service on a free loopback port.
pub const RETRANSMIT_ON_LOOPBACK: &str = "--retransmit-listen 127.0.0.1:0";

/// A subscriber that prints no interval reports, only its final one.
pub const NO_INTERVAL_REPORTS: &str = "--report-interval 0";
