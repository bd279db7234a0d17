//! mdrelay's subscriber (`mdrelay-sub`). It receives a publisher's stream over TCP, UDP unicast,
//! UDP multicast or NATS, follows the wire format the publisher announces (switching mid-stream without a
//! restart), aggregates volume and high/low prices per symbol, tracks frame loss, duplicates and
//! reordering, measures one-way latency (and echoes publish times back in round-trip mode), and
//! reports at intervals and at the end, as text and JSON.
//!
//! It is an application of `mdrelay-client`: the library receives (connections, handshakes,
//! resume, records and datagrams, protection, frame accounting, A/B lines, loss recovery,
//! echoes, the idle strategy) and hands over the frames with their typed messages and what
//! happened to the stream; this crate aggregates, reports, records and exports metrics.
//!
//! Layout:
//! - [`config`]: the TOML file, environment variables and flags laid into one `Config`: the
//!   library's receive `Settings` and the subscriber's own, checked once;
//! - [`control`]: report ticks, `--duration`, Ctrl-C / SIGTERM: what interrupts receiving;
//! - [`cpu`]: pinning the receive thread;
//! - [`receive`]: the library's subscriber built from the settings, and the loop that takes its
//!   events into the statistics, the recording, the metrics and the log;
//! - [`stats`]: counters, aggregates, latency histograms, the text and JSON reports;
//! - [`histlog`]: the HdrHistogram interval log;
//! - [`metrics`]: the Prometheus metrics, copied from the loop's counts once a second;
//! - [`record`]: `--record`, the frames taken written to a pcap / pcapng capture file.
//!
//! Exit codes: 0 after a normal stop (end of stream, `--count`, `--duration`, a signal);
//! 1 when the transport cannot be set up, or when `--record` stopped on a write error (the run
//! goes on and its report is whole; the file is not); 2 for a configuration error; 3 when the publisher
//! refuses the subscriber or speaks another protocol version.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod config;
pub mod control;
pub mod cpu;
pub mod histlog;
pub mod metrics;
pub mod receive;
pub mod record;
pub mod stats;
