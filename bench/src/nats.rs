//! The NATS side of `loopback --transport nats`: the server (or three-node cluster) each run
//! gets, the publisher's `[nats]` section, and the floor `nats bench` (natscli) measures through
//! the same server with messages of the size mdrelay's were.
//!
//! Each run gets a fresh server, so no stream, store or subscription of an earlier run weighs on
//! it. The subscriber connects to the node the publisher does not (in a cluster), so frames
//! cross a route as they would between hosts; JetStream stores every message, replicated three
//! times in the cluster.
//!
//! The floor is what NATS itself moves between one publisher and one subscriber with messages of
//! that size: `nats bench pub` (core NATS, nothing stored) and `nats bench js pub async`
//! (JetStream, stored and acknowledged, as mdrelay publishes), each read by `nats bench sub`.
//! A publisher starts only once the server that it publishes to lists the subscriber's interest
//! (`/subsz`), so nothing is published before anyone listens.

use anyhow::{Context, Result, anyhow, bail};
use clap::ValueEnum;
use mdrelay_harness::{NatsCluster, NatsServer, nats_tool};
use serde::Serialize;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The subject mdrelay publishes to in a run.
pub const SUBJECT: &str = "mdrelay.bench";
/// The JetStream stream that stores it.
pub const STREAM: &str = "MDRELAY_BENCH";
/// How long the subscriber's interest may take to reach the publisher's server.
const INTEREST: Duration = Duration::from_secs(10);
/// How long a new cluster's JetStream nodes may take to see each other as current.
const PEERS: Duration = Duration::from_secs(30);

/// JetStream storage for the runs' streams.
#[derive(Debug, Clone, Copy, ValueEnum, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum NatsStorage {
    /// On disk, as `[nats] storage = "file"` (the default there too).
    File,
    /// In memory.
    Memory,
}

impl NatsStorage {
    /// The name in `[nats] storage` and natscli's `--storage`.
    pub fn name(self) -> &'static str {
        match self {
            NatsStorage::File => "file",
            NatsStorage::Memory => "memory",
        }
    }
}

/// A server, or a cluster, started for one run and stopped when dropped.
pub enum Site {
    /// One server (boxed: a server's state is ten times a cluster's list of them).
    Single(Box<NatsServer>),
    /// Three nodes: the publisher on the first, the subscriber on the second.
    Cluster(NatsCluster),
}

impl Site {
    /// Starts one server, or a three-node cluster, and waits until it is ready.
    pub fn start(cluster: bool) -> Result<Site> {
        // The harness's helpers fail by panicking, as tests want; a benchmark says why and exits.
        let started = std::panic::catch_unwind(|| {
            if cluster { Site::Cluster(NatsCluster::start()) } else { Site::Single(Box::new(NatsServer::start())) }
        });
        let site = started.map_err(|panic| {
            let why = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            anyhow!("starting nats-server: {why}")
        })?;
        if let Site::Cluster(cluster) = &site {
            wait_for_peers(cluster)?;
        }
        Ok(site)
    }

    /// The node the publisher publishes to.
    fn publisher_node(&self) -> &NatsServer {
        match self {
            Site::Single(server) => server,
            Site::Cluster(cluster) => &cluster.nodes[0],
        }
    }

    /// The node the subscriber reads from.
    fn subscriber_node(&self) -> &NatsServer {
        match self {
            Site::Single(server) => server,
            Site::Cluster(cluster) => &cluster.nodes[1],
        }
    }

    /// The publisher's server URL.
    pub fn publisher_url(&self) -> String {
        self.publisher_node().url()
    }

    /// The subscriber's server URL.
    pub fn subscriber_url(&self) -> String {
        self.subscriber_node().url()
    }

    /// CPU time the server (every node of a cluster) has used so far, seconds.
    pub fn cpu_seconds(&self) -> f64 {
        let nodes: Vec<&NatsServer> = match self {
            Site::Single(server) => vec![&**server],
            Site::Cluster(cluster) => cluster.nodes.iter().collect(),
        };
        nodes.iter().filter_map(|n| crate::procstat::snapshot(n.pid())).map(|s| s.cpu_seconds).sum()
    }

    /// Copies of each stored message.
    pub fn replicas(&self) -> usize {
        match self {
            Site::Single(_) => 1,
            Site::Cluster(cluster) => cluster.nodes.len(),
        }
    }

    /// Waits until the publisher's server has an interest in `subject` (the subscriber's, which
    /// in a cluster comes over a route some time after the subscriber subscribed).
    pub fn wait_for_interest(&self, subject: &str) -> Result<()> {
        let monitor = self.publisher_node().monitor();
        let deadline = Instant::now() + INTEREST;
        loop {
            let listed = match self {
                // The server's own subscriptions.
                Site::Single(_) => {
                    let subsz = json_get(monitor, &format!("/subsz?subs=1&test={subject}"))?;
                    subsz["total"].as_u64().unwrap_or(0) > 0
                }
                // What the other nodes told this one over the routes.
                Site::Cluster(_) => {
                    let routez = json_get(monitor, "/routez?subs=1")?;
                    routez["routes"].as_array().into_iter().flatten().any(|route| {
                        route["subscriptions_list"]
                            .as_array()
                            .into_iter()
                            .flatten()
                            .any(|s| s.as_str() == Some(subject))
                    })
                }
            };
            if listed {
                return Ok(());
            }
            if Instant::now() >= deadline {
                bail!("no subscription to {subject} reached the server at {monitor} within {INTEREST:?}");
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// The publisher's `[nats]` section for this site.
    pub fn publisher_section(&self, storage: NatsStorage) -> String {
        format!(
            "[nats]\nservers = [\"{}\"]\nsubject = \"{SUBJECT}\"\nstream = \"{STREAM}\"\nstorage = \"{}\"\nreplicas = {}\n\
             slow_server = \"block\"\n",
            self.publisher_url(),
            storage.name(),
            self.replicas()
        )
    }
}

/// Waits until JetStream's metadata leader sees every other node as current: a leader is
/// elected before that, and a stream of three replicas created then finds "no suitable peers".
fn wait_for_peers(cluster: &NatsCluster) -> Result<()> {
    let deadline = Instant::now() + PEERS;
    let others = cluster.nodes.len() - 1;
    loop {
        let ready = cluster.nodes.iter().any(|node| {
            let Ok(jsz) = json_get(node.monitor(), "/jsz") else { return false };
            let replicas = jsz["meta_cluster"]["replicas"].as_array().cloned().unwrap_or_default();
            replicas.len() == others && replicas.iter().all(|r| r["current"] == true)
        });
        if ready {
            return Ok(());
        }
        if Instant::now() >= deadline {
            bail!("the NATS cluster's JetStream peers were not all current within {PEERS:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A JSON document from the server's HTTP monitoring port.
fn json_get(addr: SocketAddr, path: &str) -> Result<serde_json::Value> {
    let body = http_get(addr, path)?;
    serde_json::from_str(&body).with_context(|| format!("{addr}{path} is not JSON: {body}"))
}

/// A body from the server's HTTP monitoring port (HTTP/1.0: the server closes when done).
fn http_get(addr: SocketAddr, path: &str) -> Result<String> {
    let mut stream =
        TcpStream::connect_timeout(&addr, Duration::from_secs(2)).with_context(|| format!("connecting to {addr}"))?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    stream.write_all(format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())?;
    let mut response = String::new();
    stream.read_to_string(&mut response).with_context(|| format!("reading {path} from {addr}"))?;
    let (head, body) =
        response.split_once("\r\n\r\n").ok_or_else(|| anyhow!("{addr}{path}: no HTTP header in {response:?}"))?;
    if !head.starts_with("HTTP/1.1 200") && !head.starts_with("HTTP/1.0 200") {
        bail!("{addr}{path}: {}", head.lines().next().unwrap_or_default());
    }
    Ok(body.to_string())
}

/// What `nats bench` moved from one publisher to one subscriber.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct BenchFloor {
    /// Bytes per message.
    pub message_bytes: usize,
    /// Messages sent.
    pub messages: u64,
    /// Core NATS: messages per second the subscriber received (none when it did not receive
    /// them all: a core subscriber the server found too slow is cut off).
    pub core_per_second: Option<f64>,
    /// JetStream (asynchronous publish, stored and acknowledged): messages per second the
    /// subscriber received (none when it did not receive them all).
    pub jetstream_per_second: Option<f64>,
}

/// A natscli process, killed if still running when dropped.
struct Cli(Child, String);

impl Cli {
    fn spawn(server: &str, args: &[String], out: &Path) -> Result<Cli> {
        let log = std::fs::File::create(out).with_context(|| format!("creating {}", out.display()))?;
        let child = Command::new(nats_tool("nats"))
            .args(["--server", server, "--no-context"])
            .args(args)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("starting nats (natscli)")?;
        Ok(Cli(child, format!("nats {}", args.join(" "))))
    }

    /// Waits for a successful exit within `limit`; fails with what it printed otherwise.
    fn finish(&mut self, limit: Duration, out: &Path) -> Result<()> {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = self.0.try_wait()? {
                if status.success() {
                    return Ok(());
                }
                let printed = std::fs::read_to_string(out).unwrap_or_default();
                bail!("{}: {status}\n{printed}", self.1);
            }
            if Instant::now() >= deadline {
                let printed = std::fs::read_to_string(out).unwrap_or_default();
                bail!("{}: still running after {limit:?}; killed\n{printed}", self.1);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Cli {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `nats bench` through `site`: core NATS, then JetStream (a stream of the run's storage and
/// the site's replicas), `messages` messages of `bytes` bytes each time.
pub fn bench_floor(site: &Site, storage: NatsStorage, bytes: usize, messages: u64, dir: &Path) -> Result<BenchFloor> {
    // Each measured on its own: one that fails leaves the other standing.
    let measured = |what: &str, result: Result<f64>| match result {
        Ok(rate) => Some(rate),
        Err(e) => {
            eprintln!("mdrelay-bench: nats bench ({what}): {e:#}");
            None
        }
    };
    let core = measured("core", bench_once(site, "floor.core", &["pub".into()], bytes, messages, dir));
    // Room for every message and a margin: the stream refuses what is over its limit.
    let max_bytes = (bytes as u64 + 256) * messages * 2 + (64 << 20);
    let js = [
        "js".into(),
        "pub".into(),
        "async".into(),
        "--create".into(),
        "--stream".into(),
        "FLOOR".into(),
        "--storage".into(),
        storage.name().into(),
        "--replicas".into(),
        site.replicas().to_string(),
        "--maxbytes".into(),
        format!("{max_bytes}B"),
    ];
    let jetstream = measured("JetStream", bench_once(site, "floor.js", &js, bytes, messages, dir));
    if core.is_none() && jetstream.is_none() {
        bail!("neither floor run received every message");
    }
    Ok(BenchFloor { message_bytes: bytes, messages, core_per_second: core, jetstream_per_second: jetstream })
}

/// One `nats bench sub` with one publisher (`pub_command`, e.g. `pub` or `js pub async`) on
/// `subject`: the messages per second the subscriber received.
fn bench_once(
    site: &Site,
    subject: &str,
    pub_command: &[String],
    bytes: usize,
    messages: u64,
    dir: &Path,
) -> Result<f64> {
    let common =
        ["--msgs".to_string(), messages.to_string(), "--size".into(), format!("{bytes}B"), "--no-progress".into()];
    let name = subject.replace('.', "-");
    let csv = dir.join(format!("{name}-sub.csv"));
    let _ = std::fs::remove_file(&csv);
    let sub_out = dir.join(format!("{name}-sub.out"));
    let pub_out = dir.join(format!("{name}-pub.out"));
    let mut sub_args = vec!["bench".to_string(), "sub".into(), subject.into()];
    sub_args.extend(common.iter().cloned());
    sub_args.extend(["--csv".into(), csv.display().to_string()]);
    let mut subscriber = Cli::spawn(&site.subscriber_url(), &sub_args, &sub_out)?;
    site.wait_for_interest(subject)?;
    let mut pub_args = vec!["bench".to_string()];
    pub_args.extend(pub_command.iter().cloned());
    pub_args.push(subject.into());
    pub_args.extend(common.iter().cloned());
    // Bounded by what the slowest rate seen (a few thousand large messages a second) takes; a
    // subscriber cut off as too slow would wait for ever.
    let limit = Duration::from_secs(15) + Duration::from_millis(messages);
    let mut publisher = Cli::spawn(&site.publisher_url(), &pub_args, &pub_out)?;
    publisher.finish(limit, &pub_out)?;
    subscriber.finish(limit, &sub_out)?;
    let text = std::fs::read_to_string(&csv).with_context(|| format!("reading {}", csv.display()))?;
    per_second_from_csv(&text).with_context(|| format!("{}: {text}", csv.display()))
}

/// MsgsPerSec of the first data row of natscli's CSV (`#RunID,ClientID,MsgCount,MsgBytes,MsgsPerSec,...`).
fn per_second_from_csv(text: &str) -> Result<f64> {
    let mut lines = text.lines();
    let header = lines.next().ok_or_else(|| anyhow!("empty"))?;
    let column =
        header.split(',').position(|c| c.trim() == "MsgsPerSec").ok_or_else(|| anyhow!("no MsgsPerSec column"))?;
    let row = lines.find(|l| !l.trim().is_empty()).ok_or_else(|| anyhow!("no data row"))?;
    let value = row.split(',').nth(column).ok_or_else(|| anyhow!("a short row: {row}"))?;
    value.trim().parse().map_err(|e| anyhow!("MsgsPerSec {value:?}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn natscli_csv_gives_its_messages_per_second() {
        let csv = "#RunID,ClientID,MsgCount,MsgBytes,MsgsPerSec,BytesPerSec,DurationSecs\n\
                   b5XH,S0,20000,760000000,7349,279285170.795984,2.721233\n";
        assert_eq!(per_second_from_csv(csv).unwrap(), 7349.0);
        assert!(per_second_from_csv("#RunID,ClientID\nx,y\n").is_err());
        assert!(per_second_from_csv("").is_err());
    }
}
