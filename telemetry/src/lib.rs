//! What `mdrelay-pub` and `mdrelay-sub` show an operator while they run, and how they sit on a
//! host, in one place so both programs behave alike:
//! - [`config_file`]: reading a configuration file, bounded to 1 MiB whatever the path is;
//! - [`cpu`]: the CPUs the process may use, and pinning a hot thread to one of them;
//! - [`docs`]: shell completions and man pages generated from the clap definitions;
//! - [`exit`]: the exit statuses, one table for both programs;
//! - [`logs`]: the log lines, plain for people or JSON for machines, at the level `--log-level`
//!   or `MDRELAY_LOG` names;
//! - [`prometheus`]: the Prometheus scrape endpoint (`[metrics] listen`), its settings, and the
//!   bridge from an HdrHistogram to a Prometheus histogram;
//! - [`units`]: durations and sizes with units (`"250ms"`, `"64MiB"`) in every setting;
//! - [`settings`]: settings laid from a file, environment variables and flags with each value's
//!   origin (`Layered`), and the resolved configuration as annotated TOML, for `--check` and
//!   reloads;
//! - [`service`]: systemd's notifications (ready, stopping, watchdog) for `Type=notify` units.
//!
//! The metrics themselves (names, labels, when they move) belong to each program: see
//! `mdrelay_publisher::metrics` and `mdrelay_subscriber::metrics`.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod config_file;
pub mod cpu;
pub mod docs;
pub mod exit;
pub mod logs;
pub mod prometheus;
pub mod service;
pub mod settings;
pub mod units;
