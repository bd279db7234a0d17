//! Log lines: `--log-format plain|json`, and the level from `--log-level`, else `MDRELAY_LOG`,
//! else `RUST_LOG`, else the program's default.
//!
//! Context is carried by spans, not repeated on every event: a publisher's connection task runs
//! in `subscriber{peer=...}`, its hot path in `session{id=...}`, so every line they log names
//! them once. Plain lines show the spans before the message; JSON lines carry them as `span`
//! (the innermost) and `spans` (all, outermost first), with the event's own fields flattened in.

use anyhow::{Context, Result, bail};
use indicatif::ProgressBar;
use std::io::{IsTerminal, Write};
use std::sync::Mutex;
use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::MakeWriter;

/// How log lines are written.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// One line of text per event, for people (coloured on a terminal).
    #[default]
    Plain,
    /// One JSON object per line, for journald, Loki, Elasticsearch and the like.
    Json,
}

/// The logging flags both programs take.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct LogArgs {
    /// Log lines as plain text (for people) or JSON objects, one per line (for machines).
    #[arg(long, value_enum, global = true, default_value_t = LogFormat::Plain)]
    pub log_format: LogFormat,
    /// Log level or filter: error, warn, info, debug, trace, or directives such as
    /// "info,mdrelay_publisher::tcp=debug" [default: MDRELAY_LOG, else the program's own].
    #[arg(long, global = true, value_name = "FILTER")]
    pub log_level: Option<String>,
}

/// The environment variable that sets the log filter when `--log-level` is not given.
pub const LOG_ENV: &str = "MDRELAY_LOG";

/// The filter `args` and the environment ask for; `default` when neither says anything. A filter
/// that does not parse is an error naming where it came from, not a silent fallback: an operator
/// who asked for debug logs and got none would look in the wrong place.
pub fn filter(args: &LogArgs, default: &str) -> Result<EnvFilter> {
    if let Some(level) = &args.log_level {
        return EnvFilter::try_new(level).with_context(|| format!("--log-level: {level:?} is not a log filter"));
    }
    for var in [LOG_ENV, "RUST_LOG"] {
        match std::env::var(var) {
            Ok(value) if !value.trim().is_empty() => {
                return EnvFilter::try_new(&value).with_context(|| {
                    format!("{var}: {value:?} is not a log filter (e.g. info, or warn,mdrelay_publisher=debug)")
                });
            }
            Ok(_) => {}
            Err(std::env::VarError::NotPresent) => {}
            Err(std::env::VarError::NotUnicode(_)) => bail!("{var} is not valid UTF-8"),
        }
    }
    Ok(EnvFilter::new(default))
}

/// The progress bar on stderr now, if any: log lines are written with it cleared, then it is
/// drawn again below them, instead of a line landing in the middle of the bar.
static PROGRESS: Mutex<Option<ProgressBar>> = Mutex::new(None);

/// Makes `bar` the progress bar log lines go around (`None`: there is none any more).
pub fn set_progress(bar: Option<ProgressBar>) {
    *PROGRESS.lock().unwrap_or_else(|e| e.into_inner()) = bar;
}

/// Stderr, around the progress bar (see [`set_progress`]).
#[derive(Clone, Copy, Default)]
pub struct Stderr;

impl<'a> MakeWriter<'a> for Stderr {
    type Writer = Stderr;

    fn make_writer(&'a self) -> Stderr {
        Stderr
    }
}

impl Write for Stderr {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        // The formatter writes each event whole, so a line is never split around a redraw.
        let bar = PROGRESS.lock().unwrap_or_else(|e| e.into_inner()).clone();
        match bar {
            Some(bar) if !bar.is_hidden() => bar.suspend(|| std::io::stderr().write_all(buf)).map(|()| buf.len()),
            _ => std::io::stderr().write(buf),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        std::io::stderr().flush()
    }
}

/// Installs the log writer on stderr; `with_target` adds the module path to plain lines.
pub fn init(args: &LogArgs, default: &str, with_target: bool) -> Result<()> {
    let filter = filter(args, default)?;
    let installed = match args.log_format {
        LogFormat::Plain => tracing_subscriber::fmt()
            .with_writer(Stderr)
            .with_ansi(std::io::stderr().is_terminal())
            .with_target(with_target)
            .with_env_filter(filter)
            .try_init(),
        LogFormat::Json => tracing_subscriber::fmt()
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .with_span_list(true)
            .with_writer(Stderr)
            .with_target(true)
            .with_env_filter(filter)
            .try_init(),
    };
    installed.map_err(|e| anyhow::anyhow!("cannot install the log writer: {e}"))
}
