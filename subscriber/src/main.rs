//! `mdrelay-sub`: the subscriber's command line; the work is in the `mdrelay_subscriber` library.

#![forbid(unsafe_code)]

use clap::FromArgMatches;
use mdrelay_subscriber::config::{Cli, Config, JsonTarget, command};
use mdrelay_subscriber::control::{Control, RunError};
use mdrelay_subscriber::histlog::HistogramLog;
use mdrelay_subscriber::metrics::{EXPORT_EVERY, SubscriberMetrics};
use mdrelay_subscriber::receive::Pipeline;
use mdrelay_subscriber::record::Recorder;
use mdrelay_telemetry::exit::{self, ExitStatus};
use std::fs::File;
use std::io::Write;
use std::process::ExitCode;
use std::time::SystemTime;

fn main() -> ExitCode {
    // `--version` names the git commit built (build.rs), so a report can be traced to its code.
    let command = command().version(env!("MDRELAY_VERSION")).after_help(exit::help(ExitStatus::SUBSCRIBER));
    let matches = command.clone().get_matches();
    let mut cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    cli.given = mdrelay_telemetry::settings::GivenFlag::all(&command, &matches);
    if cli.docs.requested() {
        let [log, rust_log] = mdrelay_telemetry::docs::LOG_ENVIRONMENT;
        let environment = [
            log,
            rust_log,
            ("NATS_CREDS", "natscli's: the .creds file of a NATS subscriber, when no credentials are given."),
        ];
        let out = &mut std::io::stdout().lock();
        return match cli.docs.generate(command, ExitStatus::SUBSCRIBER, &environment, out) {
            Ok(()) => ExitStatus::Success.into(),
            Err(error) => {
                eprintln!("mdrelay-sub: error: {error:#}");
                ExitStatus::Failure.into()
            }
        };
    }
    let check = cli.check;
    let log = cli.log.clone();
    let (config, layers) = match Config::load(&cli) {
        Ok(s) => s,
        Err(error) => {
            eprintln!("mdrelay-sub: configuration error: {error}");
            return ExitStatus::Config.into();
        }
    };
    if check {
        // `--check` refuses what a run refuses: the log filter (flag or environment) too.
        if let Err(error) = mdrelay_telemetry::logs::filter(&log, "info") {
            eprintln!("mdrelay-sub: configuration error: {error:#}");
            return ExitStatus::Config.into();
        }
        let title = "mdrelay-sub: the configuration this run would use";
        let table = match toml::Table::try_from(config.effective()) {
            Ok(table) => table,
            Err(error) => {
                eprintln!("mdrelay-sub: error: the configuration is not TOML: {error}");
                return ExitStatus::Failure.into();
            }
        };
        print!(
            "{}",
            mdrelay_telemetry::settings::annotated(title, &table, &|key| layers.origin(key).map(String::from))
        );
        return ExitStatus::Success.into();
    }
    if let Err(error) = mdrelay_telemetry::logs::init(&log, "info", false) {
        eprintln!("mdrelay-sub: configuration error: {error:#}");
        return ExitStatus::Config.into();
    }
    // Before the runtime exists, so the exporter gets a thread and runtime of its own.
    let build_info = match &config.metrics() {
        Some(m) => match mdrelay_telemetry::prometheus::serve(
            m,
            "mdrelay-sub",
            env!("CARGO_PKG_VERSION"),
            env!("MDRELAY_REVISION"),
        ) {
            Ok(gauge) => Some(gauge),
            Err(error) => {
                eprintln!("mdrelay-sub: error: {error:#}");
                return ExitStatus::Failure.into();
            }
        },
        None => None,
    };
    // One stream, one consumer: a current-thread runtime keeps every counter on one thread
    // without locks or cross-thread wake-ups, and leaves the other core to the publisher or the
    // kernel's network processing on the same host. Decoding is sequential per stream anyway.
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(r) => r,
        Err(error) => {
            eprintln!("mdrelay-sub: error: cannot start the runtime: {error}");
            return ExitStatus::Failure.into();
        }
    };
    runtime.block_on(run(config, build_info)).into()
}

/// Receives until a stop and prints the final report; returns the exit status.
async fn run(config: Config, build_info: Option<metrics::Gauge>) -> ExitStatus {
    let started = tokio::time::Instant::now().into_std();
    // Outputs are opened before receiving, so an unwritable path fails at start, not after a
    // day of data.
    let json_target = config.json();
    let mut json_file = match &json_target {
        Some(JsonTarget::File(path)) => match File::create(path) {
            Ok(f) => Some(f),
            Err(error) => {
                eprintln!("mdrelay-sub: configuration error: json: cannot create {}: {error}", path.display());
                return ExitStatus::Config;
            }
        },
        _ => None,
    };
    let mut book_file = match &config.app.book {
        Some(path) => match File::create(path) {
            Ok(f) => Some((path.clone(), f)),
            Err(error) => {
                eprintln!("mdrelay-sub: configuration error: book: cannot create {}: {error}", path.display());
                return ExitStatus::Config;
            }
        },
        None => None,
    };
    let histogram_log = match &config.app.histogram_log {
        Some(path) => match HistogramLog::create(path, SystemTime::now()) {
            Ok(log) => Some(log),
            Err(error) => {
                eprintln!("mdrelay-sub: configuration error: {error:#}");
                return ExitStatus::Config;
            }
        },
        None => None,
    };
    let recorder = match &config.record() {
        Some(record) => match Recorder::create(record, &config.receive) {
            Ok(recorder) => Some(recorder),
            Err(error) => {
                eprintln!("mdrelay-sub: configuration error: record: {error:#}");
                return ExitStatus::Config;
            }
        },
        None => None,
    };
    // This runs on the thread that receives (a current-thread runtime): pinning it pins the
    // receive loop, and the runtime's helper threads started later keep the whole machine.
    if let Some(core) = config.app.hot_core
        && let Err(error) = mdrelay_subscriber::cpu::pin_current_thread(core)
    {
        eprintln!("mdrelay-sub: error: core: cannot pin the receive thread to CPU {core}: {error}");
        return ExitStatus::Failure;
    }
    // The effective settings hold the profile's idle strategy and busy polling.
    let r = &config.receive;
    let (idle, busy_poll) = (r.idle.unwrap_or_default(), r.busy_poll.unwrap_or_default());
    tracing::info!(profile = %r.profile, %idle, core = ?config.app.hot_core, busy_poll, "receive loop");
    let mut pipeline = Pipeline::new(&config, histogram_log, started);
    pipeline.recorder = recorder;
    pipeline.metrics = build_info.map(SubscriberMetrics::new);
    let metrics = config.metrics();
    let control = Control::new(config.report_interval(), config.duration())
        .map(|c| if metrics.is_some() { c.with_metrics(EXPORT_EVERY) } else { c });
    let result = match control {
        Err(error) => Err(RunError::Fatal(anyhow::anyhow!("cannot install the signal handlers: {error}"))),
        Ok(mut control) => {
            mdrelay_telemetry::service::spawn_watchdog();
            mdrelay_subscriber::receive::run(&config, &mut pipeline, &mut control).await
        }
    };
    mdrelay_telemetry::service::stopping();
    let (stop_reason, code) = match result {
        Ok(stop) => (stop.name(), ExitStatus::Success),
        Err(RunError::Refused(message)) => {
            eprintln!("mdrelay-sub: {message}");
            ("refused", ExitStatus::Refused)
        }
        Err(RunError::Config(message)) => {
            eprintln!("mdrelay-sub: configuration error: {message}");
            ("error", ExitStatus::Config)
        }
        Err(RunError::Fatal(error)) => {
            eprintln!("mdrelay-sub: error: {error:#}");
            ("error", ExitStatus::Failure)
        }
    };
    let report = pipeline.finish(stop_reason);
    // A run that otherwise ended well but did not get the whole stream its END counts says so
    // in its status, so a script or a service manager can tell without reading the report.
    let incomplete = if code == ExitStatus::Success { report.incomplete() } else { None };
    let code = if incomplete.is_some() { ExitStatus::Incomplete } else { code };
    // A recording that stopped on a write error (a full disk) did not stop the run, whose
    // report is whole; the exit code still says the file is not.
    let code = if report.record.as_ref().is_some_and(|r| r.error.is_some()) { failed(code) } else { code };
    if let Some(late) = report.late_join_sequence {
        tracing::info!(first_sequence = late, "joined late: counts cover the frames from this sequence on");
    }

    // With the JSON on stdout, the text goes to stderr so stdout stays one JSON document.
    let text = report.to_string();
    if json_target == Some(JsonTarget::Stdout) {
        eprint!("{text}");
    } else {
        print!("{text}");
    }
    if let Some(why) = &incomplete {
        eprintln!("mdrelay-sub: stream incomplete (exit status {}): {why}", ExitStatus::Incomplete.code());
    }
    let json = match serde_json::to_string_pretty(&report) {
        Ok(j) => j,
        Err(error) => {
            eprintln!("mdrelay-sub: error: cannot serialize the report: {error}");
            return failed(code);
        }
    };
    match (&json_target, &mut json_file) {
        (Some(JsonTarget::Stdout), _) => {
            let mut out = std::io::stdout().lock();
            if writeln!(out, "{json}").and_then(|_| out.flush()).is_err() {
                return failed(code);
            }
        }
        (Some(JsonTarget::File(path)), Some(file)) => {
            if let Err(error) = writeln!(file, "{json}").and_then(|_| file.sync_all()) {
                eprintln!("mdrelay-sub: error: json: cannot write {}: {error}", path.display());
                return failed(code);
            }
        }
        _ => {}
    }
    if let (Some((path, file)), Some(books)) = (&mut book_file, pipeline.stats.books()) {
        // The reference reader names its capture; here the stream's source stands in its place.
        let mut out = std::io::BufWriter::new(&mut *file);
        let written = serde_json::to_writer(&mut out, &books.to_reference_json(&report.transport))
            .map_err(std::io::Error::from)
            .and_then(|_| writeln!(out))
            .and_then(|_| out.flush());
        drop(out);
        let written = written.and_then(|_| file.sync_all());
        if let Err(error) = written {
            eprintln!("mdrelay-sub: error: book: cannot write {}: {error}", path.display());
            return failed(code);
        }
    }
    if let Some(m) = &metrics {
        mdrelay_telemetry::prometheus::hold(m.hold).await;
    }
    code
}

/// `code`, unless the run had otherwise succeeded: then a failure, since part of its output is
/// missing.
fn failed(code: ExitStatus) -> ExitStatus {
    if code == ExitStatus::Success { ExitStatus::Failure } else { code }
}
