//! `mdrelay-sub` over NATS, against a real `nats-server` and an `mdrelay-pub` with a `[nats]`
//! output: DEEP10 to a live subscriber and, after the run, to one replaying the JetStream
//! stream from the start; both reports equal to the independent reference in ../shared.

use std::time::Duration;

use mdrelay_harness::{
    NatsServer, Process, assert_aggregates, expected, iex_data, json_file, publisher_bin, subscriber_bin,
};

const RUN: Duration = Duration::from_secs(120);

#[test]
fn deep10_over_nats_live_and_from_the_start_matches_the_reference() {
    let server = NatsServer::start();
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("pub.toml");
    std::fs::write(
        &config,
        format!(
            "format = \"capnp\"\n[source]\ncapture = \"{}\"\n[pacing]\nmode = \"rate\"\nrate = 300000\n\
             [batching]\ncoalesce_bytes = 8192\n[nats]\nservers = [\"{}\"]\nsubject = \"md.sub\"\nstream = \"SUB\"\n",
            iex_data().join("DEEP10.pcap.gz").display(),
            server.url()
        ),
    )
    .unwrap();
    let reference = expected("DEEP10.json");
    let live_json = dir.path().join("live.json");
    let url = server.url();
    let nats = ["--nats", url.as_str(), "--nats-subject", "md.sub", "--report-interval", "0"];
    let mut live = Process::start(subscriber_bin(), nats.iter().chain(&["--json", live_json.to_str().unwrap()]));
    live.wait_for("subscribed over NATS");
    let publisher = Process::start(publisher_bin(), ["run", "--config", config.to_str().unwrap()]);
    assert_eq!(live.finish(RUN).code(), Some(0));
    publisher.finish(RUN).assert_success();
    assert_aggregates(&json_file(&live_json), &reference, "mdrelay-sub on the live subject");

    let late_json = dir.path().join("late.json");
    let late_args = ["--from-start", "--nats-stream", "SUB", "--json", late_json.to_str().unwrap()];
    let late = Process::start(subscriber_bin(), nats.iter().chain(&late_args));
    assert_eq!(late.finish(RUN).code(), Some(0));
    assert_aggregates(&json_file(&late_json), &reference, "mdrelay-sub replaying the stream from the start");
}
