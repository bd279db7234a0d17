//! The NATS output against a three-node JetStream cluster (R3 stream) of real `nats-server`
//! processes: the publisher connected to node 1, a subscriber (`mdrelay-sub --nats`) on each
//! of the other nodes, and one node SIGKILLed mid-stream: a subscriber's, then the publisher's.
//! Everyone reconnects, and both subscribers' reports equal the independent reference.

use std::path::{Path, PathBuf};
use std::time::Duration;

use mdrelay_harness::{
    Finished, NatsCluster, Process, Signal, assert_aggregates, expected, iex_data, json_file, publisher_bin,
    subscriber_bin,
};
use serde_json::Value;

/// A whole relay through the cluster, bounded for a loaded machine.
const RUN: Duration = Duration::from_secs(180);

const SUBJECT: &str = "md.cluster";
const STREAM: &str = "CLUSTER";

/// A publisher configuration: `capture` at `rate` messages per second, coalesced up to 8 KiB a
/// message, into an R3 stream through `servers`.
fn publisher_config(dir: &Path, capture: &str, rate: u32, servers: &[String]) -> PathBuf {
    let servers = servers.iter().map(|s| format!("{s:?}")).collect::<Vec<_>>().join(", ");
    let text = format!(
        "format = \"sbe\"\n[source]\ncapture = \"{}\"\n[pacing]\nmode = \"rate\"\nrate = {rate}\n\
         [batching]\ncoalesce_bytes = 8192\n[nats]\nservers = [{servers}]\nsubject = \"{SUBJECT}\"\n\
         stream = \"{STREAM}\"\nreplicas = 3\n",
        iex_data().join(capture).display()
    );
    let path = dir.join("pub.toml");
    std::fs::write(&path, text).unwrap();
    path
}

/// `mdrelay-sub` on the node at `url`, writing its report to `json`, with interval lines.
fn subscriber(url: &str, json: &Path) -> Process {
    let mut process = Process::start(
        subscriber_bin(),
        [
            "--nats",
            url,
            "--nats-subject",
            SUBJECT,
            "--nats-stream",
            STREAM,
            "--json",
            json.to_str().unwrap(),
            "--report-interval",
            "0.2",
        ],
    );
    process.wait_for("subscribed over NATS");
    process
}

/// The subscriber's report, after a successful exit.
fn report(finished: Finished, json: &Path) -> Value {
    assert_eq!(finished.code(), Some(0), "{finished:?}");
    json_file(json)
}

/// The subscriber got the whole of `reference`, and the publisher's END agrees with it.
fn assert_exact(report: &Value, reference: &Value, context: &str) {
    assert_aggregates(report, reference, context);
    assert_eq!(report["messages"], reference["messages"], "{context}: {report}");
    assert_eq!(report["gaps"], 0, "{context}: {report}");
    assert_eq!(report["totals_match"], true, "{context}: {report}");
}

#[test]
fn a_subscribers_node_killed_mid_stream_leaves_every_subscriber_exact() {
    let cluster = NatsCluster::start();
    let dir = tempfile::tempdir().unwrap();
    let urls: Vec<String> = cluster.nodes.iter().map(|n| n.url()).collect();
    let config = publisher_config(dir.path(), "DEEP10.pcap.gz", 40_000, &urls[..1]);
    let (json_a, json_b) = (dir.path().join("a.json"), dir.path().join("b.json"));
    let a = subscriber(&urls[1], &json_a);
    let mut b = subscriber(&urls[2], &json_b);
    let summary = dir.path().join("pub.json");
    let publisher = Process::start(
        publisher_bin(),
        ["run", "--config", config.to_str().unwrap(), "--json", summary.to_str().unwrap()],
    );
    // A quarter of the way in, subscriber B's node dies.
    b.wait_for_frames(30_000);
    cluster.nodes[2].signal(Signal::SIGKILL);
    publisher.finish(RUN).assert_success();
    let reference = expected("DEEP10.json");
    assert_exact(&report(a.finish(RUN), &json_a), &reference, "subscriber on a surviving node");
    let b = report(b.finish(RUN), &json_b);
    assert_exact(&b, &reference, "subscriber whose node was killed");
    let published = json_file(&summary);
    assert_eq!(published["nats"]["dropped"], 0, "{published}");
}

#[test]
fn the_publishers_node_killed_mid_stream_is_failed_over_and_every_subscriber_is_exact() {
    let cluster = NatsCluster::start();
    let dir = tempfile::tempdir().unwrap();
    let urls: Vec<String> = cluster.nodes.iter().map(|n| n.url()).collect();
    let config = publisher_config(dir.path(), "DEEP10.pcap.gz", 40_000, &urls[..1]);
    let (json_a, json_b) = (dir.path().join("a.json"), dir.path().join("b.json"));
    let mut a = subscriber(&urls[1], &json_a);
    let b = subscriber(&urls[2], &json_b);
    let summary = dir.path().join("pub.json");
    let publisher = Process::start(
        publisher_bin(),
        ["run", "--config", config.to_str().unwrap(), "--json", summary.to_str().unwrap()],
    );
    a.wait_for_frames(30_000);
    cluster.nodes[0].signal(Signal::SIGKILL);
    let published = publisher.finish(RUN);
    published.assert_success();
    let reference = expected("DEEP10.json");
    assert_exact(&report(a.finish(RUN), &json_a), &reference, "subscriber A");
    assert_exact(&report(b.finish(RUN), &json_b), &reference, "subscriber B");
    let summary = json_file(&summary);
    let nats = &summary["nats"];
    assert!(nats["reconnects"].as_u64().unwrap() >= 1, "the fail-over is counted: {summary}");
    assert_eq!(nats["dropped"], 0, "{summary}");
    assert_eq!(nats["acknowledged"], nats["published"], "every message acknowledged: {summary}");
    // Each message stored once, whatever was published twice around the fail-over.
    let info = mdrelay_harness::nats_cli(&urls[1], &["stream", "info", STREAM, "--json"]).unwrap();
    let info: Value = serde_json::from_str(&info).unwrap();
    assert_eq!(info["state"]["messages"], nats["published"], "{info}");
}
