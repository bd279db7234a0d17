//! `mdrelay-bench loopback`: the relay end to end on this host, once per format, to choose one.
//!
//! For each format it starts a real `mdrelay-pub` and a real `mdrelay-sub` (the binaries beside
//! this one), streams the same data at the same fixed rate over loopback TCP, UDP or multicast,
//! and tabulates the subscriber's one-way latency percentiles, its totals check and the bytes
//! per message. At a fixed rate every format carries the same load, so the percentiles compare.

use anyhow::{Context, Result, bail};
use clap::{Args, ValueEnum};
use mdrelay_proto::codec::Format;
use serde::Serialize;
use std::net::{TcpListener, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Transports the comparison can run over.
#[derive(Debug, Clone, Copy, ValueEnum, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Transport {
    /// TCP to 127.0.0.1.
    Tcp,
    /// UDP unicast to 127.0.0.1.
    Udp,
    /// UDP multicast to 239.255.0.1 on interface 127.0.0.1.
    Multicast,
}

/// Arguments of `loopback`.
#[derive(Debug, Args)]
pub struct LoopbackArgs {
    /// Formats to compare (default: all).
    #[arg(long, value_delimiter = ',')]
    pub formats: Vec<Format>,
    /// Transport.
    #[arg(long, value_enum, default_value_t = Transport::Tcp)]
    pub transport: Transport,
    /// Replay this capture instead of the built-in synthetic day.
    #[arg(long)]
    pub capture: Option<PathBuf>,
    /// Synthetic day: messages.
    #[arg(long, default_value_t = 300_000)]
    pub messages: u64,
    /// Messages per second.
    #[arg(long, default_value_t = 100_000.0)]
    pub rate: f64,
    /// Write the table as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

/// One format's result.
#[derive(Debug, Serialize)]
pub struct Row {
    /// The format.
    pub format: Format,
    /// Messages the subscriber decoded.
    pub messages: u64,
    /// Whether the subscriber's counts equal the publisher's totals.
    pub totals_match: Option<bool>,
    /// Frames lost.
    pub gaps: u64,
    /// Frame bytes per message (publisher side).
    pub bytes_per_message: f64,
    /// One-way latency, ns.
    pub latency_ns: serde_json::Value,
}

fn sibling(name: &str) -> Result<PathBuf> {
    let exe = std::env::current_exe()?;
    let dir = exe.parent().context("no directory for the running binary")?;
    let path = dir.join(name);
    if !path.is_file() {
        // Under `cargo run`, build the two binaries of the relay in the same profile.
        if let Ok(cargo) = std::env::var("CARGO") {
            let release = dir.ends_with("release");
            let mut build = Command::new(cargo);
            build.args(["build", "--quiet", "-p", "mdrelay-publisher", "-p", "mdrelay-subscriber"]);
            if release {
                build.arg("--release");
            }
            let status = build.status().context("building mdrelay-pub and mdrelay-sub")?;
            if !status.success() {
                bail!("building mdrelay-pub and mdrelay-sub failed");
            }
        }
    }
    if !path.is_file() {
        bail!("{} not found beside {}; build the workspace first (cargo build --release)", name, exe.display());
    }
    Ok(path)
}

fn free_tcp_port() -> Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

fn free_udp_port() -> Result<u16> {
    Ok(UdpSocket::bind("127.0.0.1:0")?.local_addr()?.port())
}

struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn wait(child: &mut Killed, deadline: Instant, what: &str) -> Result<()> {
    loop {
        if let Some(status) = child.0.try_wait()? {
            if !status.success() {
                bail!("{what} exited with {status}");
            }
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("{what} did not finish in time");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn run_one(args: &LoopbackArgs, format: Format, publisher: &Path, subscriber: &Path, dir: &Path) -> Result<Row> {
    let sub_json = dir.join(format!("sub-{format}.json"));
    let pub_json = dir.join(format!("pub-{format}.json"));
    let mut pub_args: Vec<String> =
        vec!["run".into(), "--format".into(), format.name().into(), "--pacing".into(), "rate".into()];
    pub_args.extend(["--rate".into(), args.rate.to_string(), "--json".into(), pub_json.display().to_string()]);
    match &args.capture {
        Some(path) => pub_args.extend(["--capture".into(), path.display().to_string()]),
        None => pub_args.extend(["--messages".into(), args.messages.to_string()]),
    }
    let mut sub_args: Vec<String> =
        vec!["--json".into(), sub_json.display().to_string(), "--report-interval".into(), "0".into()];
    let quiet = |c: &mut Command| {
        c.stdout(Stdio::null()).stderr(Stdio::null()).env("MDRELAY_LOG", "warn");
    };
    let (publisher_child, subscriber_child);
    match args.transport {
        Transport::Tcp => {
            let port = free_tcp_port()?;
            pub_args.extend(["--tcp".into(), format!("127.0.0.1:{port}"), "--wait-subscribers".into(), "1".into()]);
            pub_args.extend(["--slow-subscriber".into(), "block".into()]);
            let mut p = Command::new(publisher);
            p.args(&pub_args);
            quiet(&mut p);
            publisher_child = Killed(p.spawn()?);
            sub_args.extend(["--connect".into(), format!("127.0.0.1:{port}")]);
            let mut s = Command::new(subscriber);
            s.args(&sub_args);
            quiet(&mut s);
            subscriber_child = Killed(s.spawn()?);
        }
        Transport::Udp | Transport::Multicast => {
            let port = free_udp_port()?;
            if args.transport == Transport::Udp {
                sub_args.extend(["--listen".into(), format!("127.0.0.1:{port}")]);
                pub_args.extend(["--udp".into(), format!("127.0.0.1:{port}")]);
            } else {
                sub_args.extend([
                    "--group".into(),
                    format!("239.255.0.1:{port}"),
                    "--interface".into(),
                    "127.0.0.1".into(),
                ]);
                pub_args.extend([
                    "--multicast".into(),
                    format!("239.255.0.1:{port}"),
                    "--interface".into(),
                    "127.0.0.1".into(),
                    "--ttl".into(),
                    "0".into(),
                ]);
            }
            let mut s = Command::new(subscriber);
            s.args(&sub_args);
            quiet(&mut s);
            subscriber_child = Killed(s.spawn()?);
            // UDP has no handshake: give the subscriber time to bind before anything is sent.
            std::thread::sleep(Duration::from_millis(300));
            let mut p = Command::new(publisher);
            p.args(&pub_args);
            quiet(&mut p);
            publisher_child = Killed(p.spawn()?);
        }
    }
    let (mut publisher_child, mut subscriber_child) = (publisher_child, subscriber_child);
    let deadline = Instant::now() + Duration::from_secs_f64(60.0 + args.messages as f64 / args.rate * 3.0);
    wait(&mut publisher_child, deadline, "mdrelay-pub")?;
    wait(&mut subscriber_child, deadline, "mdrelay-sub")?;
    let sub: serde_json::Value = serde_json::from_slice(&std::fs::read(&sub_json)?)?;
    let publ: serde_json::Value = serde_json::from_slice(&std::fs::read(&pub_json)?)?;
    let messages = sub["messages"].as_u64().unwrap_or(0);
    let frame_bytes = publ["frame_bytes"].as_f64().unwrap_or(0.0);
    let sent = publ["totals"]["messages"].as_f64().unwrap_or(1.0).max(1.0);
    Ok(Row {
        format,
        messages,
        totals_match: sub["totals_match"].as_bool(),
        gaps: sub["gaps"].as_u64().unwrap_or(0),
        bytes_per_message: frame_bytes / sent,
        latency_ns: sub["latency_ns"].clone(),
    })
}

fn us(v: &serde_json::Value, key: &str) -> String {
    v[key].as_f64().map_or_else(|| "-".into(), |ns| format!("{:.1}", ns / 1000.0))
}

/// Runs the comparison and prints the table.
pub fn run(args: &LoopbackArgs) -> Result<()> {
    let publisher = sibling("mdrelay-pub")?;
    let subscriber = sibling("mdrelay-sub")?;
    let dir = std::env::temp_dir().join(format!("mdrelay-loopback-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let formats = if args.formats.is_empty() { Format::ALL.to_vec() } else { args.formats.clone() };
    let source = match &args.capture {
        Some(p) => p.display().to_string(),
        None => format!("synthetic day of {} messages", args.messages),
    };
    eprintln!("loopback {:?}: {source} at {} messages/s, one format at a time", args.transport, args.rate);
    let mut rows = Vec::new();
    for format in formats {
        let row = run_one(args, format, &publisher, &subscriber, &dir).with_context(|| format!("format {format}"))?;
        eprintln!("  {format}: done");
        rows.push(row);
    }
    let _ = std::fs::remove_dir_all(&dir);
    println!(
        "| format | messages | totals match | frames lost | bytes/message | p50 µs | p90 µs | p99 µs | p99.9 µs | p99.99 µs | max µs |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    for r in &rows {
        let l = &r.latency_ns;
        println!(
            "| {} | {} | {} | {} | {:.1} | {} | {} | {} | {} | {} | {} |",
            r.format,
            r.messages,
            r.totals_match.map_or("-".into(), |b| if b { "yes".to_string() } else { "NO".to_string() }),
            r.gaps,
            r.bytes_per_message,
            us(l, "p50"),
            us(l, "p90"),
            us(l, "p99"),
            us(l, "p999"),
            us(l, "p9999"),
            us(l, "max")
        );
    }
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&rows)?)?;
    }
    Ok(())
}
