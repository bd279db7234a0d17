//! NATS across emulated hosts (`deploy/netns-hosts.sh`, its NATS variant): a nats-server on each
//! host, clustered over line A's bridge, with nftables dropping a share of the route's TCP
//! segments between the publisher's host and the subscriber's. The publisher publishes DEEP10 on
//! host 1's server into a JetStream stream of three replicas (each frame acknowledged once a
//! majority of the three hosts stored it, over the lossy routes); a subscriber on host 3's server
//! then replays the stream from its first frame. TCP retransmits what the rules drop, so the loss
//! is delay on the route, never a missing frame: the subscriber ends exact against the
//! independent reference, and the kernel's counters show the drops happened.
//!
//! The subscriber replays after the run rather than joining mid-stream: a live subscription made
//! on host 3 reaches host 1's server only once the route carries its interest, which the loss
//! delays; frames published meanwhile are a gap that only a repair from the stream fills.
//!
//! The network is built under a unique prefix and taken down however the test ends (the servers
//! with it). Needs root, nftables and nats-server (`bash .ci/nats.sh`), as CI has.

use crate::common::alone_on_emulated_hosts;
use mdrelay_harness::cli_args::{NO_INTERVAL_REPORTS, words};
use mdrelay_harness::netns::{Host, Hosts};
use mdrelay_harness::{assert_aggregates, expected, iex_data, json_file, publisher_bin, subscriber_bin};
use std::path::Path;
use std::time::Duration;

/// The longest one DEEP10 run may take (a few seconds paced; retransmissions add some).
const RUN: Duration = Duration::from_secs(240);
/// Share of the route's segments dropped, each way between host 1 and host 3.
const ROUTE_LOSS: &str = "5";

/// Route segments the rules of `host` dropped so far on line A.
fn route_drops(hosts: &Hosts, host: Host) -> u64 {
    let out = hosts.script_ok(&["nats-counter", host.name()], RUN);
    out.split_whitespace()
        .find_map(|w| w.strip_prefix("a=")?.parse().ok())
        .unwrap_or_else(|| panic!("nats-counter {}: no a=N in {out:?}", host.name()))
}

#[test]
#[ignore = "long (over 3 s here): .ci/run runs it with --ignored"]
fn deep10_published_on_one_hosts_server_reaches_a_subscriber_on_another_exact_despite_route_loss() {
    let (_serial, hosts, dir) = alone_on_emulated_hosts();
    let store = dir.path().join("nats");
    let store = store.to_str().unwrap();
    hosts.script_ok(&["nats-up", store], RUN);
    for (host, peer) in [(Host::Pub, Host::Sub2), (Host::Sub2, Host::Pub)] {
        hosts.script_ok(&["nats-loss", host.name(), ROUTE_LOSS, peer.name()], RUN);
    }
    let url = |host: Host| format!("nats://{}:4222", host.addr(mdrelay_harness::netns::Line::A));
    let config = dir.path().join("pub.toml");
    std::fs::write(
        &config,
        format!(
            "format = \"sbe\"\n[source]\ncapture = \"{}\"\n[pacing]\nmode = \"rate\"\nrate = 100000\n\
             [batching]\ncoalesce_bytes = 8192\n\
             [nats]\nservers = [\"{}\"]\nsubject = \"md.hosts\"\nstream = \"HOSTS\"\nreplicas = 3\n",
            iex_data().join("DEEP10.pcap.gz").display(),
            url(Host::Pub)
        ),
    )
    .unwrap();
    let pub_json = dir.path().join("pub.json").display().to_string();
    let sub_json = dir.path().join("sub.json").display().to_string();
    let publisher =
        hosts.start(Host::Pub, publisher_bin(), ["run", "--config", config.to_str().unwrap(), "--json", &pub_json]);
    // Every frame acknowledged by the stream, the END included, before the publisher exits.
    publisher.finish(RUN).assert_success();
    let sub2_url = url(Host::Sub2);
    let subscriber = hosts.start(
        Host::Sub2,
        subscriber_bin(),
        words(&format!(
            "--nats {sub2_url} --nats-subject md.hosts --nats-stream HOSTS --from-start {NO_INTERVAL_REPORTS} \
            --json {sub_json}"
        )),
    );
    let done = subscriber.finish(RUN);
    assert_eq!(done.code(), Some(0), "the subscriber on host 3: {done:?}");
    let drops = (route_drops(&hosts, Host::Pub), route_drops(&hosts, Host::Sub2));
    hosts.script_ok(&["nats-down", store], RUN);

    let reference = expected("DEEP10.json");
    let (sub, origin) = (json_file(Path::new(&sub_json)), json_file(Path::new(&pub_json)));
    assert_aggregates(&sub, &reference, "the subscriber on host 3");
    assert_eq!(sub["messages"], reference["messages"], "every message: {sub}");
    assert_eq!(sub["message_types"], reference["message_types"]);
    assert_eq!(sub["frames"], origin["totals"]["frames"], "every frame the publisher sent");
    assert_eq!((&sub["gaps"], &sub["duplicates"]), (&0.into(), &0.into()), "{sub}");
    assert_eq!(sub["totals_match"], true, "{sub}");
    assert_eq!(origin["nats"]["dropped"], 0, "{origin}");
    assert!(drops.0 > 0 && drops.1 > 0, "the rules dropped route segments both ways: {drops:?}");
    eprintln!("route segments dropped: {} arriving on host 1, {} arriving on host 3", drops.0, drops.1);
}
