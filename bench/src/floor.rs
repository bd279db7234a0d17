//! The latency floor of `loopback`: what a plain socket round trip costs on this host, with no
//! relay in between, so every format's latency can be read as a multiple of it.
//!
//! Three threads and one socket hop each way, over the same transport and with the same socket
//! options as the relay (loopback, TCP_NODELAY, the publisher's 4 MiB send buffer and the
//! subscriber's 16 MiB receive buffer for UDP, TTL 0 and loopback delivery for multicast):
//!
//! - a sender paces fixed-size pings at the given rate (`loopback` gives the relay's frames per
//!   second, so both put the same packet rate through the stack) exactly as the publisher paces
//!   segments (sleep until shortly before the due time, then spin with yields), and stamps
//!   nothing: ping `i` is due at `start + i / rate`;
//! - an echo thread sends every byte it receives straight back;
//! - a receiver takes the echoes and records half of (receive time − due time) as the one-way
//!   time. Measured from the due time, like the relay's publish time, so a late send counts.
//!
//! Open loop: the sender never waits for an echo, as the publisher never waits for a subscriber.

use crate::latency::{Percentiles, Transport};
use anyhow::{Context, Result, bail};
use hdrhistogram::Histogram;
use mdrelay_runtime::idle::{IdleStrategy, Idler};
use socket2::{Domain, Protocol, Socket, Type};
use std::io::{ErrorKind, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

/// The publisher's UDP send buffer (`publisher/src/udp.rs`).
const SEND_BUFFER: usize = 4 << 20;
/// The subscriber's UDP receive buffer (`subscriber/src/udp.rs`).
const RECEIVE_BUFFER: usize = 16 << 20;
/// The publisher's pacer spins (with yields) for the last stretch of a wait; so does the floor.
const SPIN: Duration = Duration::from_micros(120);
/// The multicast group the relay's loopback runs use.
const GROUP: Ipv4Addr = Ipv4Addr::new(239, 255, 0, 1);
/// How long echoes still in flight are waited for after the last ping.
const LINGER: Duration = Duration::from_secs(2);

/// What to measure.
#[derive(Debug, Clone, Copy)]
pub struct FloorSpec {
    /// The transport.
    pub transport: Transport,
    /// Pings per second.
    pub rate: f64,
    /// Pings in all.
    pub count: u64,
    /// Bytes per ping, about a relay frame.
    pub bytes: usize,
}

/// What was measured.
pub struct FloorResult {
    /// One-way time (half the round trip), ns.
    pub one_way: Histogram<u64>,
    /// The p50 one-way time of each of [`PARTS`] equal parts of the pings, in order, ns: apart
    /// from noise they agree, so their spread tells how much the machine disturbed the floor.
    pub part_p50_ns: Vec<u64>,
    /// Pings sent.
    pub sent: u64,
    /// Echoes received.
    pub received: u64,
    /// From the first ping's due time to the last ping's send, seconds.
    pub send_seconds: f64,
}

/// A histogram of ns, with the subscriber's bounds (1 ns to an hour, 3 digits).
pub fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 3_600_000_000_000, 3).expect("valid bounds")
}

/// Runs the ping-pong of `spec` and returns its one-way times.
pub fn run(spec: FloorSpec) -> Result<FloorResult> {
    if spec.bytes < 8 || spec.bytes > 1472 {
        bail!("--floor-bytes {}: give 8 to 1472 (one datagram)", spec.bytes);
    }
    match spec.transport {
        Transport::Tcp => tcp(spec),
        Transport::Udp | Transport::Multicast => udp(spec),
        Transport::Nats | Transport::NatsCluster => bail!("the floor of a NATS run is TCP's (one hop of the two)"),
        Transport::All => bail!("the floor runs one transport at a time"),
    }
}

/// Sleeps until shortly before `target`, then spins with yields, as the publisher's pacer does.
fn wait_until(target: Instant) {
    loop {
        let now = Instant::now();
        if now >= target {
            return;
        }
        let left = target - now;
        if left > SPIN * 2 {
            thread::sleep(left - SPIN);
        } else {
            thread::yield_now();
        }
    }
}

/// The due time of ping `i`.
fn due(start: Instant, rate: f64, i: u64) -> Instant {
    start + Duration::from_secs_f64(i as f64 / rate)
}

/// Sends `spec.count` pings through `send`, each on its due time; returns the seconds taken.
fn pace(spec: FloorSpec, start: Instant, mut send: impl FnMut(&[u8]) -> std::io::Result<()>) -> Result<f64> {
    let mut ping = vec![0x5au8; spec.bytes];
    for i in 0..spec.count {
        wait_until(due(start, spec.rate, i));
        ping[..8].copy_from_slice(&i.to_le_bytes());
        send(&ping).context("sending a ping")?;
    }
    Ok(start.elapsed().as_secs_f64())
}

/// The floor's pings in this many consecutive parts, each with a histogram of its own.
pub const PARTS: usize = 5;

/// One-way times, over all the pings and per part of them.
struct OneWay {
    all: Histogram<u64>,
    parts: Vec<Histogram<u64>>,
}

impl OneWay {
    fn new() -> OneWay {
        OneWay { all: histogram(), parts: (0..PARTS).map(|_| histogram()).collect() }
    }

    /// Records the echo of ping `index` received at `now`.
    fn record(&mut self, spec: FloorSpec, start: Instant, index: u64, now: Instant) {
        let round_trip = now.saturating_duration_since(due(start, spec.rate, index));
        let ns = (round_trip.as_nanos() as u64 / 2).max(1);
        self.all.saturating_record(ns);
        let part = (index.saturating_mul(PARTS as u64) / spec.count.max(1)).min(PARTS as u64 - 1);
        self.parts[part as usize].saturating_record(ns);
    }

    /// The whole histogram, and each part's p50 (parts without an echo left out).
    fn finish(self) -> (Histogram<u64>, Vec<u64>) {
        let parts = self.parts.iter().filter(|h| !h.is_empty()).map(|h| h.value_at_quantile(0.5)).collect();
        (self.all, parts)
    }
}

/// Takes echoes on a thread of its own until all `spec.count` are in, the connection ends, or
/// [`LINGER`] has passed since `sent_all`; returns the one-way times and the echoes received.
/// `receive` waits for one read and records what it brought: `Some(echoes)`, or `None` at the
/// end of the stream.
fn receive_echoes(
    spec: FloorSpec,
    sent_all: &Arc<AtomicBool>,
    mut receive: impl FnMut(&mut OneWay) -> Result<Option<u64>> + Send + 'static,
) -> thread::JoinHandle<Result<(OneWay, u64)>> {
    let sent_all = Arc::clone(sent_all);
    thread::spawn(move || {
        let mut h = OneWay::new();
        let mut received = 0u64;
        let mut done_at: Option<Instant> = None;
        while received < spec.count {
            let Some(echoes) = receive(&mut h)? else { break };
            received += echoes;
            if sent_all.load(Ordering::Relaxed) {
                let at = *done_at.get_or_insert_with(Instant::now);
                if at.elapsed() > LINGER {
                    break;
                }
            }
        }
        Ok((h, received))
    })
}

fn tcp(spec: FloorSpec) -> Result<FloorResult> {
    let listener = TcpListener::bind("127.0.0.1:0").context("binding the floor's TCP listener")?;
    let addr = listener.local_addr()?;
    let echo = thread::spawn(move || -> std::io::Result<()> {
        let (mut stream, _) = listener.accept()?;
        stream.set_nodelay(true)?;
        let mut buf = vec![0u8; 64 << 10];
        loop {
            let n = stream.read(&mut buf)?;
            if n == 0 {
                return Ok(());
            }
            stream.write_all(&buf[..n])?;
        }
    });
    let stream = TcpStream::connect(addr).context("connecting the floor's TCP client")?;
    stream.set_nodelay(true)?;
    let mut reader = stream.try_clone()?;
    reader.set_read_timeout(Some(Duration::from_millis(100)))?;
    let start = Instant::now() + Duration::from_millis(10);
    let sent_all = Arc::new(AtomicBool::new(false));
    let mut buf = vec![0u8; 64 << 10];
    let mut pending: Vec<u8> = Vec::with_capacity(64 << 10);
    let receiver = receive_echoes(spec, &sent_all, move |h| match reader.read(&mut buf) {
        Ok(0) => Ok(None),
        Ok(n) => {
            let now = Instant::now();
            pending.extend_from_slice(&buf[..n]);
            let whole = pending.len() / spec.bytes * spec.bytes;
            let mut received = 0;
            for ping in pending[..whole].chunks_exact(spec.bytes) {
                let index = u64::from_le_bytes(ping[..8].try_into().expect("8 bytes"));
                h.record(spec, start, index, now);
                received += 1;
            }
            pending.drain(..whole);
            Ok(Some(received))
        }
        Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => Ok(Some(0)),
        Err(e) => Err(e).context("reading echoes"),
    });
    let mut writer = &stream;
    let send_seconds = pace(spec, start, |ping| writer.write_all(ping))?;
    sent_all.store(true, Ordering::Relaxed);
    let (one_way, received) = receiver.join().expect("the floor's receiver panicked")?;
    let (one_way, part_p50_ns) = one_way.finish();
    // Closing our side ends the echo thread's loop.
    let _ = stream.shutdown(std::net::Shutdown::Both);
    let _ = echo.join();
    Ok(FloorResult { one_way, part_p50_ns, sent: spec.count, received, send_seconds })
}

/// A UDP socket on loopback with the relay's options: `receive` joined to the group for
/// multicast, and the relay's send and receive buffer sizes.
fn udp_socket(multicast: bool) -> Result<UdpSocket> {
    let socket = Socket::new(Domain::IPV4, Type::DGRAM, Some(Protocol::UDP))?;
    let _ = socket.set_send_buffer_size(SEND_BUFFER);
    // As the subscriber: past net.core.rmem_max when allowed (root), else capped by it.
    if nix::sys::socket::setsockopt(&socket, nix::sys::socket::sockopt::RcvBufForce, &RECEIVE_BUFFER).is_err() {
        let _ = socket.set_recv_buffer_size(RECEIVE_BUFFER);
    }
    if multicast {
        socket.set_reuse_address(true)?;
        socket.bind(&SocketAddr::from((Ipv4Addr::UNSPECIFIED, 0)).into())?;
        socket.join_multicast_v4(&GROUP, &Ipv4Addr::LOCALHOST).context("joining 239.255.0.1 on 127.0.0.1")?;
        socket.set_multicast_if_v4(&Ipv4Addr::LOCALHOST)?;
        socket.set_multicast_ttl_v4(0)?;
        socket.set_multicast_loop_v4(true)?;
    } else {
        socket.bind(&SocketAddr::from((Ipv4Addr::LOCALHOST, 0)).into())?;
    }
    Ok(socket.into())
}

fn udp(spec: FloorSpec) -> Result<FloorResult> {
    let multicast = spec.transport == Transport::Multicast;
    let client = udp_socket(multicast).context("the floor's UDP client")?;
    let server = udp_socket(multicast).context("the floor's UDP echo")?;
    // Over multicast both ways go to the group, each side on its own port.
    let to = |s: &UdpSocket| -> Result<SocketAddr> {
        let port = s.local_addr()?.port();
        Ok(if multicast { SocketAddr::from((GROUP, port)) } else { SocketAddr::from((Ipv4Addr::LOCALHOST, port)) })
    };
    let (to_server, to_client) = (to(&server)?, to(&client)?);
    let stop = Arc::new(AtomicBool::new(false));
    server.set_read_timeout(Some(Duration::from_millis(100)))?;
    let echo = {
        let stop = Arc::clone(&stop);
        thread::spawn(move || -> std::io::Result<()> {
            let mut buf = vec![0u8; 65536];
            while !stop.load(Ordering::Relaxed) {
                match server.recv_from(&mut buf) {
                    Ok((n, _)) => {
                        server.send_to(&buf[..n], to_client)?;
                    }
                    Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
                    Err(e) => return Err(e),
                }
            }
            Ok(())
        })
    };
    let reader = client.try_clone()?;
    reader.set_read_timeout(Some(Duration::from_millis(100)))?;
    let start = Instant::now() + Duration::from_millis(10);
    let sent_all = Arc::new(AtomicBool::new(false));
    let mut buf = vec![0u8; 65536];
    let receiver = receive_echoes(spec, &sent_all, move |h| match reader.recv_from(&mut buf) {
        Ok((n, _)) if n >= 8 => {
            let now = Instant::now();
            let index = u64::from_le_bytes(buf[..8].try_into().expect("8 bytes"));
            h.record(spec, start, index, now);
            Ok(Some(1))
        }
        Ok(_) => Ok(Some(0)),
        Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => Ok(Some(0)),
        Err(e) => Err(e).context("receiving echoes"),
    });
    let sent = pace(spec, start, |ping| client.send_to(ping, to_server).map(drop));
    sent_all.store(true, Ordering::Relaxed);
    let joined = receiver.join().expect("the floor's receiver panicked");
    stop.store(true, Ordering::Relaxed);
    let echoed = echo.join().expect("the floor's echo panicked");
    let send_seconds = sent?;
    let (one_way, received) = joined?;
    let (one_way, part_p50_ns) = one_way.finish();
    echoed.context("echoing")?;
    Ok(FloorResult { one_way, part_p50_ns, sent: spec.count, received, send_seconds })
}

/// The pacing floor: a thread that does nothing but wait for each frame's due time, as the
/// publisher's hot thread does, with the same idle strategy and timer slack. Its CPU is what
/// the waits alone cost at that frame rate on this host; the publisher's CPU above it is the
/// relay's own work (encoding, handing records to the sockets' thread, the writes).
#[derive(Debug, Clone, serde::Serialize)]
pub struct PacingFloor {
    /// The idle strategy waited with.
    pub idle: IdleStrategy,
    /// The duty cycle waited in, seconds: due times within it of a wake-up need no wait.
    pub duty_cycle_s: f64,
    /// Due times per second.
    pub rate: f64,
    /// Due times waited for.
    pub waits: u64,
    /// The thread's CPU (user + system) over the run, percent of one core.
    pub cpu_percent: f64,
    /// How late each wait returned after its due time, ns (an early one counts as on time).
    pub late_ns: Percentiles,
    /// Wake-ups: waits that slept, yielded or spun rather than finding their time within the
    /// duty cycle.
    pub wakeups: u64,
}

/// Waits for `count` due times `1 / rate` apart with `idle`, in duty cycles of `duty_cycle`
/// as the publisher's pacer does, on a thread of its own.
pub fn pacing(rate: f64, count: u64, idle: IdleStrategy, duty_cycle: Duration) -> Result<PacingFloor> {
    let worker = thread::Builder::new().name("pacing-floor".into()).spawn(move || -> Result<PacingFloor> {
        // As the publisher's hot thread: the kernel's default 50 µs slack would make every
        // sleep end late on purpose.
        let _ = nix::sys::prctl::set_timerslack(1);
        let mut idler = Idler::new(idle);
        let mut late = histogram();
        let cpu_before = thread_cpu_seconds()?;
        let start = Instant::now();
        let mut wakeups = 0;
        for i in 1..=count {
            let due = start + Duration::from_secs_f64(i as f64 / rate);
            if idler.wait_until_within(due, idler.duty_window(duty_cycle)) {
                wakeups += 1;
            }
            let _ = late.record(u64::try_from(due.elapsed().as_nanos()).unwrap_or(u64::MAX).max(1));
        }
        let wall = start.elapsed().as_secs_f64();
        let cpu = thread_cpu_seconds()? - cpu_before;
        Ok(PacingFloor {
            idle,
            duty_cycle_s: duty_cycle.as_secs_f64(),
            rate,
            waits: count,
            wakeups,
            cpu_percent: if wall > 0.0 { 100.0 * cpu / wall } else { 0.0 },
            late_ns: Percentiles::of(&late),
        })
    })?;
    worker.join().map_err(|_| anyhow::anyhow!("the pacing floor's thread panicked"))?
}

/// The calling thread's user + system CPU time, seconds, from /proc/thread-self/stat.
fn thread_cpu_seconds() -> Result<f64> {
    let text = std::fs::read_to_string("/proc/thread-self/stat").context("reading /proc/thread-self/stat")?;
    // Fields start after the command name's closing parenthesis; utime and stime are the 12th
    // and 13th after it, in clock ticks.
    let rest = text.rfind(')').map(|i| &text[i + 1..]).unwrap_or_default();
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| fields.get(i).and_then(|f| f.parse::<u64>().ok());
    let (Some(utime), Some(stime)) = (ticks(11), ticks(12)) else {
        bail!("/proc/thread-self/stat: no utime and stime in {text:?}");
    };
    Ok((utime + stime) as f64 / crate::procstat::ticks_per_second())
}
