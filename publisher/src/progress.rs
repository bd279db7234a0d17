//! Progress bars on stderr: a capture replay in `run`, and `inspect`, `synth`, `convert`.
//!
//! indicatif hides a bar when stderr is not a terminal, so a piped, logged or systemd run prints
//! exactly what it printed before there were bars. While a bar is up, log lines are written
//! around it (`mdrelay_telemetry::logs::set_progress`) instead of through it.

use indicatif::{HumanCount, ProgressBar, ProgressDrawTarget, ProgressFinish, ProgressStyle};
use std::io::Read;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// Packets or segments between two updates of a progress bar: a day of IEX is tens of millions
/// of them, so the bar still moves many times a second while its cost stays out of the loop.
pub const PROGRESS_EVERY: u64 = 4096;

/// A progress bar on stderr in `template`, which log lines go around until [`finish`].
pub fn progress_bar(len: Option<u64>, template: &str) -> ProgressBar {
    // Cleared when dropped too: an error line then starts on a line of its own.
    let bar = ProgressBar::with_draw_target(len, ProgressDrawTarget::stderr()).with_finish(ProgressFinish::AndClear);
    bar.set_style(ProgressStyle::with_template(template).expect("the progress templates are valid"));
    // Drawn at once, so even a short run shows what it is doing.
    bar.tick();
    mdrelay_telemetry::logs::set_progress(Some(bar.clone()));
    bar
}

/// Removes `bar`, so the lines that follow stand alone.
pub fn finish(bar: &ProgressBar) {
    mdrelay_telemetry::logs::set_progress(None);
    bar.finish_and_clear();
}

/// Counts the bytes read from a capture file. For a gzipped capture these are compressed bytes,
/// which is what the file's size, the bar's total, counts too.
pub struct Counted<R> {
    inner: R,
    read: Arc<AtomicU64>,
}

impl<R> Counted<R> {
    /// `inner`, adding what is read from it to `read`.
    pub fn new(inner: R, read: Arc<AtomicU64>) -> Counted<R> {
        Counted { inner, read }
    }
}

impl<R: Read> Read for Counted<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        // Relaxed: the bar only needs a recent count, and reads are of 64 KiB or more.
        self.read.fetch_add(n as u64, Ordering::Relaxed);
        Ok(n)
    }
}

/// Progress through a capture: bytes of the file read against its size, and packets done.
pub struct CaptureProgress {
    bar: ProgressBar,
    read: Arc<AtomicU64>,
}

impl CaptureProgress {
    /// `bar` showing the bytes counted in `read`.
    pub fn new(bar: ProgressBar, read: Arc<AtomicU64>) -> CaptureProgress {
        CaptureProgress { bar, read }
    }

    /// Shows `packets` done and the bytes read so far; call every [`PROGRESS_EVERY`] packets.
    pub fn update(&self, packets: u64) {
        self.bar.set_position(self.read.load(Ordering::Relaxed));
        self.bar.set_message(format!("{} packets", HumanCount(packets)));
    }

    /// Removes the bar, so the summary lines that follow stand alone.
    pub fn finish(&self) {
        finish(&self.bar);
    }
}

/// A capture replay's bar in `run`: bytes of the capture read in this pass, messages relayed,
/// and the pass, when stderr is a terminal.
pub struct ReplayProgress {
    bar: ProgressBar,
    read: Arc<AtomicU64>,
}

impl ReplayProgress {
    /// A bar over `size` bytes a pass (none: a spinner), fed by `read`; `None` unless stderr is
    /// a terminal, so the hot path does not even format a message otherwise.
    pub fn new(size: Option<u64>, read: Arc<AtomicU64>) -> Option<ReplayProgress> {
        if !std::io::IsTerminal::is_terminal(&std::io::stderr()) {
            return None;
        }
        let template = match size {
            Some(_) => "{spinner} {bytes}/{total_bytes} {wide_bar} {binary_bytes_per_sec}  {msg}  {eta} left",
            None => "{spinner} {bytes} {binary_bytes_per_sec}  {msg}  {elapsed}",
        };
        Some(ReplayProgress { bar: progress_bar(size, template), read })
    }

    /// Shows where the replay is: `messages` relayed so far, in pass `pass`.
    pub fn update(&self, messages: u64, pass: u64) {
        self.bar.set_position(self.read.load(Ordering::Relaxed));
        if pass > 1 {
            self.bar.set_message(format!("{} messages, pass {pass}", HumanCount(messages)));
        } else {
            self.bar.set_message(format!("{} messages", HumanCount(messages)));
        }
    }

    /// Removes the bar before the run's summary.
    pub fn finish(&self) {
        finish(&self.bar);
    }
}
