//! Relay chaining through NATS, with real processes and a real `nats-server`: DEEP10 from
//! ../shared, every leaf's aggregates compared with the independent reference output.
//!
//! - The edge of a NATS distribution tree: an origin publishes into a NATS subject (stored in a
//!   JetStream stream); a relay takes the subject as its upstream (`[source.upstream] nats`) and
//!   re-publishes it over TCP and multicast on its LAN (loopback here); a TCP leaf and a
//!   multicast leaf end exact, with the origin's session and numbers. After the run, a second
//!   edge replays the stream from its first frame (`from_start`) to a TCP leaf, exact too.
//! - The reverse: a relay whose upstream is another publisher's TCP stream publishes into NATS
//!   (`[nats]` output); `mdrelay-sub --nats` ends exact.
//! - An edge with a user and password file: refused credentials are a configuration error naming
//!   its own keys; the right ones replay the session to a TCP leaf, exact.

use crate::common::{
    assert_leaf_exact, beside_others_in_tempdir, deep10, json_paths, logged_session, path, publisher_with_config,
};
use mdrelay_harness::cli_args::{PACED_100K, TCP_LOSSLESS_ONE_SUBSCRIBER, words};
use mdrelay_harness::process::field;
use mdrelay_harness::{
    Finished, NatsServer, Process, STEP, expected, free_tcp_port, json_file, loopback_group_subscriber, publisher_bin,
    shared, subscriber_bin,
};
use serde_json::Value;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

/// The longest one DEEP10 run through the chain may take (a few seconds paced; far longer only if
/// something hangs).
const RUN: Duration = Duration::from_secs(180);

/// The multicast group of the edge's LAN (other test binaries use 239.255.42.x and .43.x).
const EDGE_GROUP: &str = "239.255.44.1:0";

/// The JSON report `json` of a process that exited with 0.
fn report(finished: &Finished, json: &str, context: &str) -> Value {
    assert_eq!(finished.code(), Some(0), "{context}: {finished:?}");
    json_file(Path::new(json))
}

/// Asserts an edge relay's summary: the origin's session and numbering, nothing missing or
/// late, the upstream's END taken, and every frame re-published.
fn assert_edge(edge: &Value, origin: &Value, session: u64, context: &str) {
    let u = &edge["upstream"];
    let frames = &origin["totals"]["frames"];
    assert_eq!(u["session"], session, "{context}: the origin's session: {u}");
    assert_eq!(u["first_sequence"], 1, "{context}: the origin's numbers: {u}");
    assert_eq!(&u["last_sequence"], frames, "{context}: {u}");
    assert_eq!(&u["frames"], frames, "{context}: {u}");
    for zero in ["gaps", "duplicates", "decode_errors", "unrepresentable_frames", "negative_latencies"] {
        assert_eq!(u[zero], 0, "{context}: {zero}: {u}");
    }
    assert_eq!(u["stop_reason"], "end", "{context}: {u}");
    assert!(u["connect"].as_str().unwrap().starts_with("nats md.edge on nats://"), "{context}: {u}");
    assert_eq!(&edge["totals"]["frames"], frames, "{context}: every frame re-published");
    assert_eq!(edge["totals"]["messages"], origin["totals"]["messages"], "{context}");
    assert_eq!(u["totals"]["frames"], *frames, "{context}: the origin's END came through NATS: {u}");
}

/// The origin: DEEP10 in raw into `[nats]` on `url` (subject md.edge, stream EDGE), paced at
/// 100,000 messages a second, frames coalesced into NATS messages of up to 8 KiB.
fn origin_config(url: &str) -> String {
    format!(
        "format = \"raw\"\n[source]\ncapture = \"{}\"\n[pacing]\nmode = \"rate\"\nrate = 100000\n\
         [batching]\ncoalesce_bytes = 8192\n\
         [nats]\nservers = [\"{url}\"]\nsubject = \"md.edge\"\nstream = \"EDGE\"\n",
        deep10()
    )
}

#[test]
#[ignore = "long (over 3 s here): .ci/run runs it with --ignored"]
fn deep10_from_a_nats_subject_through_an_edge_relay_reaches_tcp_and_multicast_leaves_exact() {
    let (_shared, dir) = beside_others_in_tempdir();
    let server = NatsServer::start();
    let url = server.url();
    let reference = expected("DEEP10.json");
    let [origin_json, edge_json, tcp_json, group_json, replay_edge_json, replay_json] =
        json_paths(dir.path(), ["origin", "edge", "tcp-leaf", "group-leaf", "replay-edge", "replay-leaf"]);
    // The multicast leaf first: bound and joined before the edge sends to the group; it
    // recovers a datagram lost on a loaded host from the edge's retransmission service.
    let recovery = format!("127.0.0.1:{}", free_tcp_port());
    let mut group_leaf = loopback_group_subscriber(EDGE_GROUP, &recovery, &group_json);
    let group = group_leaf.listening_on().to_string();
    // The edge subscribes before the origin publishes, so it takes the subject from its first
    // frame; it serves once that frame has told it the session, and waits for its TCP leaf.
    let edge_toml = format!(
        "format = \"sbe\"\n[source.upstream]\nnats = [\"{url}\"]\nsubject = \"md.edge\"\nstream = \"EDGE\"\n\
         give_up_after = 120\n\
         [tcp]\nlisten = \"127.0.0.1:0\"\nwait_subscribers = 1\nslow_subscriber = \"block\"\n\
         [multicast]\ngroup = \"{group}\"\ninterface = \"127.0.0.1\"\nttl = 0\nloopback = true\n\
         [retransmit]\nlisten = \"{recovery}\"\n"
    );
    let mut edge = publisher_with_config(dir.path(), "edge.toml", &edge_toml, &edge_json);
    edge.wait_for_within("waiting for the upstream's first frame", RUN);
    let origin = publisher_with_config(dir.path(), "origin.toml", &origin_config(&url), &origin_json);
    let edge_session = logged_session(&mut edge, "upstream greeted", RUN);
    let edge_addr = edge.try_serving_on(RUN).unwrap_or_else(|f| panic!("{f}")).to_string();
    let tcp_leaf = Process::start(
        subscriber_bin(),
        ["--connect", edge_addr.as_str(), "--report-interval", "0", "--json", tcp_json.as_str()],
    );
    origin.finish(RUN).assert_success();
    edge.finish(RUN).assert_success();
    let tcp_report = report(&tcp_leaf.finish(RUN), &tcp_json, "the edge's TCP leaf");
    let group_report = report(&group_leaf.finish(RUN), &group_json, "the edge's multicast leaf");
    let (origin_report, edge_report) = (json_file(Path::new(&origin_json)), json_file(Path::new(&edge_json)));

    assert_eq!(origin_report["totals"]["messages"], reference["messages"], "the origin sent every message");
    assert_edge(&edge_report, &origin_report, edge_session, "the live edge");
    assert_eq!(edge_report["upstream"]["formats_seen"], serde_json::json!(["raw"]), "the origin's format");
    assert_leaf_exact(&tcp_report, &reference, "the edge's TCP leaf");
    assert_leaf_exact(&group_report, &reference, "the edge's multicast leaf");
    for (leaf, context) in [(&tcp_report, "TCP leaf"), (&group_report, "multicast leaf")] {
        assert_eq!(leaf["frames"], origin_report["totals"]["frames"], "{context}: one frame per origin frame");
        assert_eq!(leaf["formats_seen"], serde_json::json!(["sbe"]), "{context}: the edge's own format");
    }
    // The edge's hop latency is origin-to-edge; the TCP leaf's, measured against the same
    // origin stamps, is never below it.
    let edge_latency = &edge_report["upstream"]["latency_ns"];
    assert_eq!(edge_latency["count"], origin_report["totals"]["frames"], "every frame measured: {edge_latency}");
    let p50 = |l: &Value| l["p50"].as_u64().unwrap_or_else(|| panic!("no p50 in {l}"));
    assert!(p50(edge_latency) > 0 && p50(edge_latency) <= p50(&tcp_report["latency_ns"]), "{edge_latency}");
    eprintln!(
        "origin → NATS → edge: p50 {} ns; → TCP leaf: p50 {} ns",
        p50(edge_latency),
        p50(&tcp_report["latency_ns"])
    );

    // After the run, an edge that replays the stream from its first frame (a late edge, or one
    // restarted) gives its leaf the whole session too.
    let replay_toml = format!(
        "format = \"capnp\"\n[source.upstream]\nnats = [\"{url}\"]\nsubject = \"md.edge\"\nstream = \"EDGE\"\n\
         from_start = true\n[tcp]\nlisten = \"127.0.0.1:0\"\nwait_subscribers = 1\nslow_subscriber = \"block\"\n"
    );
    let mut replay_edge = publisher_with_config(dir.path(), "replay.toml", &replay_toml, &replay_edge_json);
    let replay_session = logged_session(&mut replay_edge, "upstream greeted", RUN);
    let replay_addr = replay_edge.try_serving_on(RUN).unwrap_or_else(|f| panic!("{f}")).to_string();
    let replay_leaf = Process::start(
        subscriber_bin(),
        ["--connect", replay_addr.as_str(), "--report-interval", "0", "--json", replay_json.as_str()],
    );
    replay_edge.finish(RUN).assert_success();
    let replay_report = report(&replay_leaf.finish(STEP), &replay_json, "the replaying edge's leaf");
    assert_edge(&json_file(Path::new(&replay_edge_json)), &origin_report, replay_session, "the replaying edge");
    assert_eq!(replay_session, edge_session, "one session, live or replayed");
    assert_leaf_exact(&replay_report, &reference, "the replaying edge's TCP leaf");
}

#[test]
#[ignore = "long (over 3 s here): .ci/run runs it with --ignored"]
fn a_relay_of_a_tcp_upstream_publishes_into_nats_and_a_nats_subscriber_ends_exact() {
    let (_shared, dir) = beside_others_in_tempdir();
    let server = NatsServer::start();
    let url = server.url();
    let reference = expected("DEEP10.json");
    let [origin_json, relay_json, sub_json] = json_paths(dir.path(), ["origin", "relay", "sub"]);
    // The origin waits for its one subscriber, the relay; the relay publishes every frame it
    // takes into NATS as it comes; the NATS subscriber is on the subject before either starts.
    let mut origin = Process::start(
        publisher_bin(),
        words(&format!(
            "run --capture {} --format flatbuffers {TCP_LOSSLESS_ONE_SUBSCRIBER} {PACED_100K} --json {origin_json}",
            deep10()
        )),
    );
    let origin_addr: SocketAddr = origin.serving_on();
    let mut sub = Process::start(
        subscriber_bin(),
        ["--nats", url.as_str(), "--nats-subject", "md.relayed", "--report-interval", "0", "--json", &sub_json],
    );
    sub.wait_for("subscribed over NATS");
    let relay_toml = format!(
        "format = \"sbe\"\n[source.upstream]\nconnect = \"{origin_addr}\"\n[batching]\ncoalesce_bytes = 8192\n\
         [nats]\nservers = [\"{url}\"]\nsubject = \"md.relayed\"\nstream = \"RELAYED\"\n"
    );
    let mut relay = publisher_with_config(dir.path(), "relay.toml", &relay_toml, &relay_json);
    let relay_session = logged_session(&mut relay, "upstream greeted", RUN);
    origin.finish(RUN).assert_success();
    relay.finish(RUN).assert_success();
    let sub_done = sub.finish(RUN);
    let sub_report = report(&sub_done, &sub_json, "the NATS subscriber");
    let (origin_report, relay_report) = (json_file(Path::new(&origin_json)), json_file(Path::new(&relay_json)));

    assert_leaf_exact(&sub_report, &reference, "the relay's NATS subscriber");
    assert_eq!(sub_report["frames"], origin_report["totals"]["frames"], "one frame per origin frame");
    assert_eq!(sub_report["formats_seen"], serde_json::json!(["sbe"]), "the relay's own format");
    let u = &relay_report["upstream"];
    assert_eq!(u["session"], relay_session, "{u}");
    assert_eq!(u["gaps"], 0, "{u}");
    assert_eq!(relay_report["nats"]["dropped"], 0, "{relay_report}");
    let sub_session = {
        let line = sub_done.stderr.lines().find(|l| l.contains("publisher session")).expect("the subscriber logs it");
        field(line, "session").map(|hex| u64::from_str_radix(hex.trim_start_matches("0x"), 16).unwrap())
    };
    assert_eq!(sub_session, Some(relay_session), "the origin's session, through the relay and NATS");
}

#[test]
#[ignore = "long (over 3 s here): .ci/run runs it with --ignored"]
fn an_edge_authenticates_to_its_servers_and_refused_credentials_name_the_setting() {
    let _shared = shared();
    let server = NatsServer::start_with(&["--user", "feed", "--pass", "right"]);
    let url = server.url();
    let reference = expected("DEEP10.json");
    let dir = tempfile::tempdir().unwrap();
    let (right, wrong) = (path(dir.path(), "right"), path(dir.path(), "wrong"));
    std::fs::write(&right, "right\n").unwrap();
    std::fs::write(&wrong, "wrong\n").unwrap();
    let credentials = |file: &str| format!("user = \"feed\"\npassword_file = \"{file}\"\n");
    // The origin, with the user's password, stores the whole session.
    let origin_json = path(dir.path(), "origin.json");
    let origin_toml = format!("{}{}", origin_config(&url), credentials(&right));
    publisher_with_config(dir.path(), "origin.toml", &origin_toml, &origin_json).finish(RUN).assert_success();
    let edge_toml = |file: &str| {
        format!(
            "format = \"sbe\"\n[source.upstream]\nnats = [\"{url}\"]\nsubject = \"md.edge\"\nstream = \"EDGE\"\n\
             from_start = true\n{}[tcp]\nlisten = \"127.0.0.1:0\"\nwait_subscribers = 1\nslow_subscriber = \"block\"\n",
            credentials(file)
        )
    };
    // A wrong password: a configuration error naming the edge's own keys, at once.
    let refused = publisher_with_config(dir.path(), "wrong.toml", &edge_toml(&wrong), &path(dir.path(), "wrong.json"))
        .finish(RUN);
    assert_eq!(refused.code(), Some(2), "{refused:?}");
    assert!(refused.stderr.contains("source.upstream.user / source.upstream.password_file"), "{}", refused.stderr);
    // The right one: the edge replays the session to its TCP leaf, exact.
    let (edge_json, leaf_json) = (path(dir.path(), "edge.json"), path(dir.path(), "leaf.json"));
    let mut edge = publisher_with_config(dir.path(), "edge.toml", &edge_toml(&right), &edge_json);
    let session = logged_session(&mut edge, "upstream greeted", RUN);
    let addr = edge.try_serving_on(RUN).unwrap_or_else(|f| panic!("{f}")).to_string();
    let leaf =
        Process::start(subscriber_bin(), ["--connect", addr.as_str(), "--report-interval", "0", "--json", &leaf_json]);
    edge.finish(RUN).assert_success();
    let leaf_report = report(&leaf.finish(STEP), &leaf_json, "the authenticated edge's TCP leaf");
    assert_edge(
        &json_file(Path::new(&edge_json)),
        &json_file(Path::new(&origin_json)),
        session,
        "the authenticated edge",
    );
    assert_leaf_exact(&leaf_report, &reference, "the authenticated edge's TCP leaf");
}
