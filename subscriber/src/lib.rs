//! mdrelay's subscriber (`mdrelay-sub`). It receives a publisher's stream over TCP, UDP unicast
//! or UDP multicast, follows the wire format the publisher announces (switching mid-stream without a
//! restart), aggregates volume and high/low prices per symbol, tracks frame loss, duplicates and
//! reordering, measures one-way latency (and echoes publish times back in round-trip mode), and
//! reports at intervals and at the end, as text and JSON.
//!
//! Layout:
//! - [`config`]: the TOML file and command-line flags, validated into `Settings`;
//! - [`control`]: report ticks, `--duration`, Ctrl-C / SIGTERM: what interrupts receiving;
//! - [`poll`]: the idle strategy of the receive loop: busy-polling or waiting for readiness;
//! - [`cpu`]: pinning the receive thread, SO_BUSY_POLL;
//! - [`tcp`]: connect, handshake, records, reconnection with backoff and resume, ECHO records;
//! - [`udp`]: the sockets (unicast or multicast, one line or two), datagrams, publisher sessions,
//!   echo datagrams, and the loop's side of loss recovery;
//! - [`lines`]: A/B lines: each line's accounting, and the merged stream's copies arbitrated;
//! - [`recovery`]: the missing frames' bookkeeping, and the task that asks the publisher's
//!   retransmission service for them;
//! - [`buffer`]: the reusable, 8-aligned read buffer, and the TCP read into it;
//! - [`frames`]: codecs per format, walking and decoding frames, frame accounting, the report
//!   ticks;
//! - [`stats`]: counters, aggregates, latency histograms, the text and JSON reports;
//! - [`histlog`]: the HdrHistogram interval log;
//! - [`metrics`]: the Prometheus metrics, copied from the loop's counts once a second;
//! - [`record`]: `--record`, the frames taken written to a pcap / pcapng capture file.
//!
//! Frame accounting (sessions, loss, duplicates, reordering) and the warning budget are
//! `mdrelay_proto::relay::SessionTracker` and `mdrelay_proto::warn`.
//!
//! Exit codes: 0 after a normal stop (end of stream, `--count`, `--duration`, a signal);
//! 1 when the transport cannot be set up, or when `--record` stopped on a write error (the run
//! goes on and its report is whole; the file is not); 2 for a configuration error; 3 when the publisher
//! refuses the subscriber or speaks another protocol version.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod buffer;
pub mod config;
pub mod control;
pub mod cpu;
pub mod frames;
pub mod histlog;
pub mod lines;
pub mod metrics;
pub mod poll;
pub mod record;
pub mod recovery;
pub mod stats;
pub mod tcp;
pub mod udp;
pub mod unseal;
