//! Loopback addresses for tests: free ports, an accept that gives up, and proxies that break
//! a publisher's TCP stream on the way (cut it, or change a record).
//!
//! A free port is free when asked for; something else may take it before the test binds it.
//! Prefer letting the program bind port 0 and reading its address from its log
//! ([`Process::serving_on`](crate::Process::serving_on),
//! [`Process::listening_on`](crate::Process::listening_on)) where it prints one.

use mdrelay_proto::relay::{Hello, RecordHeader};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::thread::JoinHandle;
use std::time::Duration;

/// A TCP port on 127.0.0.1 that was free a moment ago, and that no other test of this process
/// is given.
pub fn free_tcp_port() -> u16 {
    unused_port(|port| TcpListener::bind(("127.0.0.1", port)).is_ok()).unwrap_or_else(|| {
        TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("binding 127.0.0.1:0").port()
    })
}

/// A UDP port on 127.0.0.1 that was free a moment ago, and that no other test of this process
/// is given.
pub fn free_udp_port() -> u16 {
    unused_port(|port| UdpSocket::bind(("127.0.0.1", port)).is_ok()).unwrap_or_else(|| {
        UdpSocket::bind("127.0.0.1:0").and_then(|s| s.local_addr()).expect("binding 127.0.0.1:0").port()
    })
}

/// A port below the kernel's ephemeral range for which `free` holds, from a counter no two calls
/// of this process share; `None` when the range leaves no room below it.
///
/// A port the kernel picked for `bind(0)` is released before the test's server binds it, and
/// in between any `connect` or `bind(0)` on the machine may be given it (tests running side by
/// side make many): a NATS node then fails to start. Below the ephemeral range only explicit
/// binds take ports, so one handed out here stays free unless another program asks for it by
/// number. Each test process starts at its own offset (its pid).
fn unused_port(free: impl Fn(u16) -> bool) -> Option<u16> {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    const LOWEST: u32 = 10_000;
    let ephemeral_start = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next()?.parse::<u32>().ok())
        .unwrap_or(32_768);
    let span = ephemeral_start.checked_sub(LOWEST).filter(|&span| span >= 1_000)?;
    let offset = std::process::id().wrapping_mul(7_919) % span;
    (0..span).find_map(|_| {
        let port = LOWEST + (offset + NEXT.fetch_add(1, Ordering::Relaxed)) % span;
        let port = u16::try_from(port).ok()?;
        free(port).then_some(port)
    })
}

/// Accepts one connection within `limit`, then sets `limit` as its read and write timeouts, so
/// a peer that goes quiet fails the test instead of hanging it; panics when nobody connects.
pub fn accept_within(listener: &TcpListener, limit: Duration) -> TcpStream {
    // SO_RCVTIMEO bounds a blocking accept on Linux: no polling loop needed.
    socket2::SockRef::from(listener).set_read_timeout(Some(limit)).expect("setting SO_RCVTIMEO");
    let (stream, _) = listener.accept().unwrap_or_else(|e| panic!("nobody connected within {limit:?}: {e}"));
    stream.set_read_timeout(Some(limit)).expect("setting the read timeout");
    stream.set_write_timeout(Some(limit)).expect("setting the write timeout");
    stream
}

/// A proxy on loopback for `connections` connections to `target`. Bytes from the client go on as
/// they are; each connection's bytes from `target` are handed to `forward(n, from_target,
/// to_client)` on a thread of their own (`n` counts connections from 0), which decides what
/// reaches the client and when. Returns the address to connect to and the accepting thread, which
/// ends once the last connection is set up (or fails the test when one does not come within
/// [`crate::STEP`]).
fn proxy<F>(target: SocketAddr, connections: usize, forward: F) -> (SocketAddr, JoinHandle<()>)
where
    F: Fn(usize, TcpStream, TcpStream) + Send + Sync + 'static,
{
    let listener = TcpListener::bind("127.0.0.1:0").expect("binding 127.0.0.1:0");
    let addr = listener.local_addr().expect("the proxy's address");
    let forward = std::sync::Arc::new(forward);
    let thread = std::thread::spawn(move || {
        for n in 0..connections {
            let client = accept_within(&listener, crate::STEP);
            let upstream =
                TcpStream::connect(target).unwrap_or_else(|e| panic!("the proxy cannot reach {target}: {e}"));
            let (mut c_read, mut u_write) = (client.try_clone().unwrap(), upstream.try_clone().unwrap());
            std::thread::spawn(move || {
                let _ = std::io::copy(&mut c_read, &mut u_write);
            });
            let forward = forward.clone();
            std::thread::spawn(move || forward(n, upstream, client));
        }
    });
    (addr, thread)
}

/// A proxy on loopback that forwards the first two connections to `target`, cutting the first
/// after `cut_after` bytes from `target` (both ways shut down, as a broken link would); returns
/// the address to connect to and the thread, which ends after the second connection is set up
/// (or fails the test when it does not come within [`crate::STEP`]).
pub fn cutting_proxy(target: SocketAddr, cut_after: usize) -> (SocketAddr, JoinHandle<()>) {
    proxy(target, 2, move |n, mut u_read, mut c_write| {
        let mut buf = [0u8; 16384];
        let mut sent = 0;
        while let Ok(k) = u_read.read(&mut buf) {
            if k == 0 || c_write.write_all(&buf[..k]).is_err() {
                break;
            }
            sent += k;
            if n == 0 && sent >= cut_after {
                break;
            }
        }
        let _ = c_write.shutdown(std::net::Shutdown::Both);
        let _ = u_read.shutdown(std::net::Shutdown::Both);
    })
}

/// A proxy on loopback that forwards `connections` connections to `target`, record by record
/// from `target` to the client: after the greeting, each relay record (header and payload) is
/// handed to `mangle` with the connection's number (0 for the first) before it goes on, so a
/// test can change a header or flip a bit where it wants. The other way is copied as it is.
/// Returns the address to connect to and the thread, which ends once the last connection is set
/// up (or fails the test when it does not come within [`crate::STEP`]).
pub fn mangling_proxy<F>(target: SocketAddr, connections: usize, mangle: F) -> (SocketAddr, JoinHandle<()>)
where
    F: FnMut(usize, &mut Vec<u8>) + Send + 'static,
{
    let mangle = std::sync::Mutex::new(mangle);
    proxy(target, connections, move |n, upstream, mut c_write| {
        let mut u_read = std::io::BufReader::new(upstream);
        let mut greeting = [0u8; Hello::LEN];
        if u_read.read_exact(&mut greeting).is_ok() && c_write.write_all(&greeting).is_ok() {
            let mut record = vec![0u8; RecordHeader::LEN];
            loop {
                record.truncate(RecordHeader::LEN);
                if u_read.read_exact(&mut record).is_err() {
                    break;
                }
                let length = u32::from_le_bytes(record[4..8].try_into().unwrap()) as usize;
                record.resize(RecordHeader::LEN + length, 0);
                if u_read.read_exact(&mut record[RecordHeader::LEN..]).is_err() {
                    break;
                }
                (mangle.lock().unwrap_or_else(|e| e.into_inner()))(n, &mut record);
                if c_write.write_all(&record).is_err() {
                    break;
                }
            }
        }
        let _ = c_write.shutdown(std::net::Shutdown::Both);
        let _ = u_read.get_ref().shutdown(std::net::Shutdown::Both);
    })
}

/// A proxy on loopback that forwards one connection to `target` and holds every byte from
/// `target` for `delay` before it goes on to the client, as a far or loaded service would; the
/// other way is copied as it is. Returns the address to connect to and the thread, which ends
/// once the connection is set up (or fails the test when it does not come within
/// [`crate::STEP`]); the forwarding ends with the connection.
pub fn delaying_proxy(target: SocketAddr, delay: Duration) -> (SocketAddr, JoinHandle<()>) {
    proxy(target, 1, move |_, mut u_read, mut c_write| {
        // Read on a thread of its own, so bytes are stamped when they arrive, not when the
        // writer is done sleeping for earlier ones.
        let (held, due) = std::sync::mpsc::channel::<(std::time::Instant, Vec<u8>)>();
        std::thread::spawn(move || {
            let mut buf = [0u8; 16384];
            while let Ok(k) = u_read.read(&mut buf) {
                if k == 0 || held.send((std::time::Instant::now() + delay, buf[..k].to_vec())).is_err() {
                    break;
                }
            }
        });
        for (at, bytes) in due {
            std::thread::sleep(at.saturating_duration_since(std::time::Instant::now()));
            if c_write.write_all(&bytes).is_err() {
                break;
            }
        }
        let _ = c_write.shutdown(std::net::Shutdown::Both);
    })
}

/// A splitmix64 step: a lossy link's hash of a frame number, so the frames dropped are spread
/// like random loss and the same on every run.
pub fn mix(seq: u64) -> u64 {
    let mut z = seq.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A lossy link on loopback: forwards every datagram it receives to the address given with
/// [`LossyLink::forward_to`], except the relay `DATA` datagrams whose first frame `drop` picks
/// (by sequence number; see [`mix`] for a spread like random loss); `END` and anything else
/// always pass. Runs until [`LossyLink::dropped`], which returns the frames it dropped.
pub struct LossyLink {
    /// Where the publisher sends to.
    pub addr: SocketAddr,
    to: std::sync::mpsc::Sender<SocketAddr>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: JoinHandle<std::collections::BTreeSet<u64>>,
}

impl LossyLink {
    /// A link on 127.0.0.1 dropping the datagrams `drop` says to, with a 16 MiB receive buffer.
    pub fn start(drop: impl Fn(u64) -> bool + Send + 'static) -> LossyLink {
        use std::sync::atomic::Ordering;
        let socket = UdpSocket::bind("127.0.0.1:0").expect("binding 127.0.0.1:0");
        // Forced past net.core.rmem_max when running as root (as CI does); asked for otherwise.
        if nix::sys::socket::setsockopt(&socket, nix::sys::socket::sockopt::RcvBufForce, &(16 << 20)).is_err() {
            let _ = socket2::SockRef::from(&socket).set_recv_buffer_size(16 << 20);
        }
        let addr = socket.local_addr().expect("the link's address");
        let (to, target) = std::sync::mpsc::channel::<SocketAddr>();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stopped = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut dropped = std::collections::BTreeSet::new();
            let Ok(target) = target.recv_timeout(Duration::from_secs(120)) else { return dropped };
            socket.set_read_timeout(Some(Duration::from_millis(100))).expect("setting a read timeout");
            let mut buf = vec![0u8; 65_536];
            while !stopped.load(Ordering::Relaxed) {
                let Ok(n) = socket.recv(&mut buf) else { continue };
                if let Ok(h) = mdrelay_proto::relay::DatagramHeader::parse(&buf[..n])
                    && h.kind == mdrelay_proto::relay::DatagramKind::Data
                    && drop(h.sequence)
                {
                    dropped.extend(h.sequence..h.sequence + u64::from(h.frame_count));
                    continue;
                }
                let _ = socket.send_to(&buf[..n], target);
            }
            dropped
        });
        LossyLink { addr, to, stop, thread }
    }

    /// Starts forwarding to `target` (once the receiver is bound).
    pub fn forward_to(&self, target: SocketAddr) {
        self.to.send(target).expect("the link is running");
    }

    /// Stops forwarding; the frames dropped.
    pub fn dropped(self) -> std::collections::BTreeSet<u64> {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.thread.join().expect("the link's thread")
    }
}
