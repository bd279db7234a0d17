//! Real `nats-server` processes for tests: one server or a three-node JetStream cluster on free
//! loopback ports, each node with its own store directory, ready when the server says so (and,
//! in a cluster, when JetStream has a metadata leader), stopped by pid when dropped.
//!
//! The server and natscli are the pinned versions `.ci/nats.sh` builds from the Go module proxy
//! into a cache outside the clone; the first test that needs them on a machine without them
//! builds them with that script ([`crate::tools`]).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::net::free_tcp_port;
use crate::process::{Process, Signal};

/// The version `.ci/nats.sh` installs; the servers' startup line is checked against it.
pub const NATS_SERVER_VERSION: &str = "2.15.2";

/// How long a server may take to be ready (a cluster elects its JetStream leader within it).
const READY: Duration = Duration::from_secs(30);

/// The path of `program` (`nats-server`, `nats`, `nats-creds`) in the tools cache, built there
/// by `.ci/nats.sh` first when missing or out of date; panics with the script's output when
/// that build fails. Not looked up on `PATH`: a server of another version there would fail
/// the version check of every test.
pub fn nats_tool(program: &str) -> PathBuf {
    crate::tools::nats_tools_bin().join(program)
}

/// A store directory removed when dropped.
struct StoreDir(PathBuf);

impl StoreDir {
    fn new(name: &str) -> StoreDir {
        let dir = std::env::temp_dir().join(format!("mdrelay-nats-{}-{name}", crate::netns::unique_prefix()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("creating {}: {e}", dir.display()));
        StoreDir(dir)
    }
}

impl Drop for StoreDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// One `nats-server` with JetStream, on loopback.
pub struct NatsServer {
    name: String,
    client_port: u16,
    monitor_port: u16,
    args: Vec<String>,
    store: StoreDir,
    process: Option<Process>,
    /// Lines that say the node is ready, beyond "Server is ready".
    also_wait_for: Option<&'static str>,
}

impl NatsServer {
    /// Starts a single server with JetStream and waits until it is ready.
    pub fn start() -> NatsServer {
        NatsServer::start_with(&[])
    }

    /// Starts a single server with JetStream and `extra` arguments (`--user`, `--pass`, ...).
    pub fn start_with(extra: &[&str]) -> NatsServer {
        let extra: Vec<String> = extra.iter().map(|a| a.to_string()).collect();
        let mut server = NatsServer::configure("single", &extra, None);
        server.launch();
        server
    }

    fn configure(name: &str, extra: &[String], also_wait_for: Option<&'static str>) -> NatsServer {
        let client_port = free_tcp_port();
        let monitor_port = free_tcp_port();
        let store = StoreDir::new(name);
        let mut args: Vec<String> = vec![
            "-a".into(),
            "127.0.0.1".into(),
            "-p".into(),
            client_port.to_string(),
            "-m".into(),
            monitor_port.to_string(),
            "-n".into(),
            name.into(),
            "-js".into(),
            "-sd".into(),
            store.0.display().to_string(),
        ];
        args.extend_from_slice(extra);
        NatsServer { name: name.into(), client_port, monitor_port, args, store, process: None, also_wait_for }
    }

    fn spawn(&mut self) {
        let mut command = Command::new(nats_tool("nats-server"));
        command.args(&self.args);
        let process = Process::spawn_command(&format!("nats-server {}", self.name), command)
            .unwrap_or_else(|e| panic!("starting nats-server {}: {e}", self.name));
        self.process = Some(process);
    }

    fn wait_ready(&mut self) {
        let also = self.also_wait_for;
        let process = self.process.as_mut().expect("started");
        let banner = process.wait_for_within("Version:", READY);
        assert!(
            banner.contains(NATS_SERVER_VERSION),
            "nats-server {}: expected version {NATS_SERVER_VERSION}, it says: {banner}",
            self.name
        );
        process.wait_for_within("Server is ready", READY);
        if let Some(line) = also {
            process.wait_for_within(line, READY);
        }
    }

    fn launch(&mut self) {
        self.spawn();
        self.wait_ready();
    }

    /// The client URL (`nats://127.0.0.1:PORT`).
    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.client_port)
    }

    /// The client address.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.client_port))
    }

    /// The HTTP monitoring address (`/varz`, `/jsz`, `/healthz`).
    pub fn monitor(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.monitor_port))
    }

    /// Waits until the cluster's routes have told this node of interest in `subject` from at
    /// least `nodes` other nodes (`/routez?subs=1`), so what is published here reaches
    /// subscribers there from the first message: a subscription is acknowledged by its own
    /// server before the other nodes hear of it. Panics after 10 s with what the node knows.
    pub fn wait_for_route_interest(&self, subject: &str, nodes: usize) {
        let quoted = format!("\"{subject}\"");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            let body = crate::scrape::get(self.monitor(), "/routez?subs=1").map(|(_, body)| body);
            let known = body.as_ref().map_or(0, |body| body.matches(&quoted).count());
            if known >= nodes {
                return;
            }
            if std::time::Instant::now() >= deadline {
                panic!("{}: interest in {subject} from {known} of {nodes} nodes after 10 s: {body:?}", self.name);
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }

    /// The node's JetStream store directory (kept across restarts).
    pub fn store(&self) -> &Path {
        &self.store.0
    }

    /// The server's pid; panics when it is stopped.
    pub fn pid(&self) -> u32 {
        self.process.as_ref().expect("the server is running").pid()
    }

    /// Sends `signal` to the server (SIGKILL to crash it, SIGSTOP to freeze it).
    pub fn signal(&self, signal: Signal) {
        self.process.as_ref().expect("the server is running").signal(signal);
    }

    /// Kills the server at once (SIGKILL) and reaps it; the store stays for a restart.
    pub fn kill(&mut self) {
        // Dropping a process kills and reaps it, and does not panic when it has already exited
        // (a node that failed to start, dropped while its test unwinds).
        drop(self.process.take());
    }

    /// Starts the server again on the same ports and store, and waits until it is ready.
    pub fn restart(&mut self) {
        self.kill();
        self.launch();
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Three `nats-server` nodes routed to each other, JetStream clustered (R3 streams possible).
pub struct NatsCluster {
    /// The nodes, in the order their URLs are listed.
    pub nodes: Vec<NatsServer>,
}

impl NatsCluster {
    /// Starts three nodes and waits until each is ready and JetStream has a metadata leader.
    pub fn start() -> NatsCluster {
        let cluster_ports: Vec<u16> = (0..3).map(|_| free_tcp_port()).collect();
        let routes = cluster_ports.iter().map(|port| format!("nats://127.0.0.1:{port}")).collect::<Vec<_>>().join(",");
        let cluster_name = format!("mdrelay-{}", crate::netns::unique_prefix());
        let mut nodes: Vec<NatsServer> = cluster_ports
            .iter()
            .enumerate()
            .map(|(i, port)| {
                let extra = [
                    "--cluster_name".to_string(),
                    cluster_name.clone(),
                    "--cluster".into(),
                    format!("nats://127.0.0.1:{port}"),
                    "--routes".into(),
                    routes.clone(),
                ];
                NatsServer::configure(&format!("n{}", i + 1), &extra, Some("metadata leader"))
            })
            .collect();
        // All three first: JetStream elects its leader only when a quorum is up.
        for node in &mut nodes {
            node.spawn();
        }
        for node in &mut nodes {
            node.wait_ready();
        }
        NatsCluster { nodes }
    }

    /// Every node's client URL, comma-separated (as a client's server list).
    pub fn urls(&self) -> String {
        self.nodes.iter().map(NatsServer::url).collect::<Vec<_>>().join(",")
    }
}

/// A stream's `state` object (`messages`, `first_seq`, `last_seq`, ...) from `nats stream info
/// --json`, or what went wrong.
pub fn nats_stream_state(servers: &str, stream: &str) -> Result<serde_json::Value, String> {
    let info = nats_cli(servers, &["stream", "info", stream, "--json"])?;
    let info: serde_json::Value = serde_json::from_str(&info).map_err(|e| format!("stream info is not JSON: {e}"))?;
    Ok(info["state"].clone())
}

/// Runs natscli (`nats`) against `servers` with `args`, bounded to 30 s: its stdout, or what it
/// printed when it failed or took too long. Its output is read while it runs: one larger than a
/// pipe holds (a stored message of 64 KiB, in base64) would otherwise block it until the bound.
pub fn nats_cli(servers: &str, args: &[&str]) -> Result<String, String> {
    use std::io::Read;
    let mut child = Command::new(nats_tool("nats"))
        .args(["--server", servers, "--timeout", "10s"])
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| format!("starting nats: {e}"))?;
    let drain = |pipe: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut text = Vec::new();
            if let Some(mut pipe) = pipe {
                let _ = pipe.read_to_end(&mut text);
            }
            String::from_utf8_lossy(&text).into_owned()
        })
    };
    let stdout = drain(child.stdout.take().map(|p| Box::new(p) as Box<dyn Read + Send>));
    let stderr = drain(child.stderr.take().map(|p| Box::new(p) as Box<dyn Read + Send>));
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = child.try_wait().map_err(|e| e.to_string())? {
            break status;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!("nats {args:?} took over 30 s"));
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let stdout = stdout.join().unwrap_or_default();
    if !status.success() {
        return Err(format!("nats {args:?}: {status}\n{stdout}\n{}", stderr.join().unwrap_or_default()));
    }
    Ok(stdout)
}
