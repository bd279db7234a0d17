//! An edge relay of a NATS subject that falls far behind, with real processes, a real
//! `nats-server` and real signals: the edge (`[source.upstream] nats` with its JetStream
//! stream) is stopped (SIGSTOP) for 20 s, past its origin's end, and the server cuts it as a
//! slow consumer, more than a window of 65,536 frames behind; run again, it catches up from the
//! stream in order, and it and its TCP leaf end with the whole of DEEP10 (the leaf's aggregates
//! against the independent reference in ../shared).

use crate::common::{alone_in_tempdir, json_paths, publisher_with_config};
use mdrelay_harness::process::field;
use mdrelay_harness::{
    NatsServer, Process, Signal, assert_aggregates, expected, iex_data, json_file, lines_other_than_intervals,
    subscriber_bin,
};
use std::path::Path;
use std::time::{Duration, Instant};

/// The longest the origin's run may take.
const RUN: Duration = Duration::from_secs(120);
/// How long the edge and its leaf may take to end once the stream has nothing more to give.
const ENDS_WITHIN: Duration = Duration::from_secs(60);

#[test]
#[ignore = "long (over 3 s here): .ci/run runs it with --ignored"]
fn an_edge_stopped_past_its_origins_end_catches_up_from_the_stream_and_its_leaf_ends_whole() {
    let (_serial, dir) = alone_in_tempdir();
    let server = NatsServer::start();
    let url = server.url();
    let reference = expected("DEEP10.json");
    let [origin_json, edge_json, leaf_json] = json_paths(dir.path(), ["origin", "edge", "leaf"]);
    // The edge subscribes before the origin publishes, and waits for its TCP leaf.
    let edge_toml = format!(
        "format = \"sbe\"\n[source.upstream]\nnats = [\"{url}\"]\nsubject = \"md.behind\"\nstream = \"BEHIND\"\n\
         give_up_after = 120\n\
         [tcp]\nlisten = \"127.0.0.1:0\"\nwait_subscribers = 1\nslow_subscriber = \"block\"\n"
    );
    let mut edge = publisher_with_config(dir.path(), "edge.toml", &edge_toml, &edge_json);
    edge.wait_for_within("waiting for the upstream's first frame", RUN);
    // The origin: DEEP10 at 40,000 messages a second (about 10 s), one frame a message.
    let origin_toml = format!(
        "format = \"raw\"\n[source]\ncapture = \"{}\"\n[pacing]\nmode = \"rate\"\nrate = 40000\n\
         [nats]\nservers = [\"{url}\"]\nsubject = \"md.behind\"\nstream = \"BEHIND\"\n",
        iex_data().join("DEEP10.pcap.gz").display()
    );
    let origin = publisher_with_config(dir.path(), "origin.toml", &origin_toml, &origin_json);
    let greeted = edge.wait_for_within("upstream greeted", RUN);
    let hex = field(&greeted, "session").expect("the session is logged");
    let session = u64::from_str_radix(hex.trim_start_matches("0x"), 16).unwrap();
    let edge_addr = edge.try_serving_on(RUN).unwrap_or_else(|f| panic!("{f}")).to_string();
    let mut leaf = Process::start(
        subscriber_bin(),
        ["--connect", edge_addr.as_str(), "--report-interval", "0.2", "--json", leaf_json.as_str()],
    );
    // Stopped for 20 s once its leaf has 10,000 frames, past the origin's end: the server cuts
    // it as a slow consumer (its writes to the edge block for more than 10 s), so the edge
    // misses most of the subject and the END.
    leaf.wait_for_frames(10_000);
    edge.signal(Signal::SIGSTOP);
    let stopped = Instant::now();
    origin.finish(RUN).assert_success();
    std::thread::sleep(Duration::from_secs(20).saturating_sub(stopped.elapsed()));
    edge.signal(Signal::SIGCONT);
    let edge_done = edge.ends_on_its_own(ENDS_WITHIN, "the edge", None);
    let leaf_done = leaf.ends_on_its_own(ENDS_WITHIN, "the edge's TCP leaf", None);
    let (origin_report, edge_report) = (json_file(Path::new(&origin_json)), json_file(Path::new(&edge_json)));
    let context = format!("the edge: {edge_report}\nlog:\n{}", edge_done.stderr);
    assert_eq!(edge_done.code(), Some(0), "{context}");
    let u = &edge_report["upstream"];
    let frames = &origin_report["totals"]["frames"];
    assert_eq!(u["session"], session, "{context}");
    assert_eq!(&u["frames"], frames, "{context}: every frame of the origin taken");
    assert_eq!(u["gaps"], 0, "{context}");
    assert_eq!(u["stop_reason"], "end", "{context}: the origin's END came through NATS");
    for line in edge_done.stderr.lines().filter(|l| l.contains("catching up") || l.contains("caught up")) {
        eprintln!("the edge: {line}");
    }
    assert_eq!(&edge_report["totals"]["frames"], frames, "{context}: every frame re-published");

    let leaf_report = json_file(Path::new(&leaf_json));
    let context =
        format!("the edge's TCP leaf: {leaf_report}\nlog:\n{}", lines_other_than_intervals(&leaf_done.stderr));
    assert_eq!(leaf_done.code(), Some(0), "{context}");
    assert_aggregates(&leaf_report, &reference, &context);
    assert_eq!(leaf_report["messages"], reference["messages"], "{context}: every message arrives");
    assert_eq!(leaf_report["gaps"], 0, "{context}");
    assert_eq!(leaf_report["totals_match"], true, "{context}: the leaf's counts equal the origin's totals");
    assert_eq!(&leaf_report["frames"], frames, "{context}");
    assert_eq!(leaf_report["stop_reason"], "end", "{context}");
}
