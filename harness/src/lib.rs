//! Process harness for mdrelay's tests and benchmarks.
//!
//! - [`process`]: a binary run as a child process, its stderr read line by line as it comes, so
//!   a test waits for the readiness lines the programs print instead of sleeping;
//! - [`bins`]: the paths of `mdrelay-pub`, `mdrelay-sub`, `mdrelay-bench` and examples from the running
//!   build, built on demand;
//! - [`net`]: free loopback ports, an accept with a deadline, proxies that cut or change a
//!   publisher's stream, and a lossy UDP link;
//! - [`nats`]: real `nats-server` processes, one or a three-node JetStream cluster;
//! - [`netns`]: emulated hosts on this machine (network namespaces), processes started on them,
//!   and injected loss with a record of every datagram dropped;
//! - [`data`]: the shared IEX captures and their independent reference outputs;
//! - [`report`]: reading JSON reports and comparing them with the references;
//! - [`scrape`]: Prometheus scrapes over HTTP, parsed into samples;
//! - [`formats`]: the wire formats a test covers;
//! - [`serial`]: one process-heavy test at a time, or side by side tests that never meet one;
//! - [`service`]: systemd's notification socket, played by the test;
//! - [`alloc`]: a counting global allocator, for tests that assert what is (not) allocated;
//! - [`tools`]: the pinned NATS tools, built on first use by `.ci/nats.sh`;
//! - [`version`]: `--version` checked against git.

#![deny(unsafe_code)]
#![warn(missing_docs)]

#[allow(unsafe_code)]
pub mod alloc;
pub mod bins;
pub mod cli_args;
pub mod data;
pub mod formats;
pub mod nats;
pub mod net;
pub mod netns;
pub mod process;
pub mod receive;
pub mod report;
pub mod scrape;
pub mod serial;
pub mod service;
pub mod tools;
pub mod version;

pub use bins::{bench_bin, example_bin, loopback_group_subscriber, publisher_bin, subscriber_bin};
pub use data::{deep10_tcp_config, expected, iex_data, reference_output, reference_reader};
pub use formats::formats;
pub use nats::{NatsCluster, NatsServer, nats_cli, nats_stream_state, nats_tool};
pub use net::{
    LossyLink, accept_within, cutting_proxy, delaying_proxy, free_tcp_port, free_udp_port, mangling_proxy, mix,
};
pub use netns::{Host, Hosts, Line};
pub use process::{Failure, Finished, Process, STEP, Signal, lines_other_than_intervals};
pub use report::{assert_aggregates, assert_books_match, assert_matches_reference, json_file};
pub use scrape::{Scrape, alert_queries, dashboard_queries, get, scrape};
pub use serial::{serial, shared};
pub use service::NotifySocket;
