//! mdrelay's publisher: replays IEX captures (or relays a live IEX-TP feed) over TCP, UDP
//! unicast and UDP multicast in the wire format its configuration names.
//!
//! Layout:
//! - [`config`]: the TOML file and its checks;
//! - [`run`]: the `run` command: runtime, signals, summary;
//! - [`engine`]: the hot path on its own thread: source → pacing → encoding → outputs;
//! - [`source`]: capture files, synthetic days, live UDP feeds;
//! - [`item`]: what every source yields: a segment, its time, a relayed frame's origin;
//! - [`upstream`]: another publisher's TCP stream as the source (relay chaining);
//! - [`cpu`]: the hot thread's timer slack (its core: `mdrelay_telemetry::cpu`);
//! - [`pacing`]: original timing, fixed rate, top speed, anchored against drift;
//! - [`fanout`]: the subscriber list, owned by the hot path, with the slow-subscriber policies;
//! - [`tcp`]: the server's tasks: accepting, handshakes, writing each subscriber's queue, and
//!   replaying the ring to a subscriber that resumes;
//! - [`udp`]: unicast and multicast datagrams with the relay header, on one line or two (A/B);
//! - [`nats`]: datagrams published to a NATS subject stored in a JetStream stream;
//! - [`retransmit`]: the retransmission service over TCP, answering from the ring of last frames;
//! - [`ring`]: that ring of last frames, as the hot path and the tasks share it;
//! - [`snapshot`]: the state of the frames published, for subscribers that join with a snapshot;
//! - [`stats`]: echoes checked against the frames sent, and round trips;
//! - [`metrics`]: the Prometheus metrics, copied from the hot path's and the tasks' own counts;
//! - [`progress`]: progress bars on a terminal (capture replay and the capture tools);
//! - [`commands`]: the capture tools (`inspect`, `synth`, `convert`, `demo`).

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod commands;
pub mod config;
pub mod cpu;
pub mod engine;
pub mod fanout;
pub mod item;
pub mod metrics;
pub mod nats;
pub mod pacing;
pub mod progress;
pub mod relayed;
pub mod retransmit;
pub mod ring;
pub mod run;
pub mod snapshot;
pub mod source;
pub mod stats;
pub mod stop;
pub mod tcp;
pub mod udp;
pub mod upstream;
pub mod upstream_nats;
