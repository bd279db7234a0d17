//! Sockets: UDP and multicast sockets set up as the subscriber always has (SO_REUSEADDR for
//! multicast, a large receive buffer, the group joined on its interface), TCP connections with a
//! time limit, and the clocks the machines are fed.
//!
//! Sockets are tokio's: the drivers read and write with `try_` calls, which cannot wait, and
//! wait for readiness (or time) when there is nothing to do.

use crate::error::Error;
use crate::settings::Transport;
use socket2::{Domain, Protocol, SockRef, Socket, Type};
use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::time::Duration;
use tokio::net::{TcpStream, UdpSocket};

/// Microseconds the kernel busy-polls the device queue on a receive with no data (SO_BUSY_POLL):
/// the value the kernel's documentation suggests for a start.
pub(crate) const BUSY_POLL_US: u32 = 50;

/// A TCP connection being made, kept across cancelled waits.
pub(crate) type Connecting = Pin<Box<dyn Future<Output = Result<(TcpStream, SocketAddr), String>> + Send>>;

/// The monotonic clock the machines are fed (ns since the subscriber started), and the wall
/// clock frames are stamped with.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Clock {
    base: tokio::time::Instant,
}

impl Clock {
    pub fn new() -> Clock {
        Clock { base: tokio::time::Instant::now() }
    }

    /// Now, ns since the start.
    pub fn now(&self) -> i64 {
        i64::try_from(self.base.elapsed().as_nanos()).unwrap_or(i64::MAX)
    }

    /// The instant `ns` after the start.
    pub fn instant(&self, ns: i64) -> tokio::time::Instant {
        self.base + Duration::from_nanos(u64::try_from(ns).unwrap_or(0))
    }

    /// The wall clock, ns since the Unix epoch.
    pub fn wall(&self) -> i64 {
        mdrelay_runtime::clock::wall_clock_ns()
    }

    /// Sleeps until `at` (ns after the start), or for ever when there is no such time.
    pub async fn sleep_until(self, at: Option<i64>) {
        match at {
            Some(at) => tokio::time::sleep_until(self.instant(at)).await,
            None => std::future::pending().await,
        }
    }
}

/// A wait of ns (the machines') as a `Duration`.
pub(crate) fn shown(ns: i64) -> Duration {
    Duration::from_nanos(u64::try_from(ns).unwrap_or(0))
}

/// How writing a machine's pending bytes to its socket ended.
pub(crate) enum Written {
    /// Nothing is left to write.
    Drained,
    /// The socket is full: wait for room.
    Blocked,
    /// A write failed.
    Failed(io::Error),
}

/// Writes what `machine` has pending (`pending`) to `fd`, telling it of each write
/// (`transmitted`), until nothing is left, the socket is full or a write fails; how it ended,
/// and whether anything was written.
pub(crate) fn write_pending<M>(
    fd: &TcpStream,
    machine: &mut M,
    pending: for<'a> fn(&'a M) -> &'a [u8],
    transmitted: fn(&mut M, usize),
) -> (Written, bool) {
    let mut moved = false;
    loop {
        let bytes = pending(machine);
        if bytes.is_empty() {
            return (Written::Drained, moved);
        }
        match fd.try_write(bytes) {
            Ok(n) => {
                transmitted(machine, n);
                moved = true;
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return (Written::Blocked, moved),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return (Written::Failed(e), moved),
        }
    }
}

/// A connection to `address` (`host:port`, resolved now) within `timeout`, made non-blocking.
pub(crate) fn connect(address: String, timeout: Duration, receive_buffer: Option<usize>) -> Connecting {
    Box::pin(async move {
        let connect = tokio::net::TcpStream::connect(address.as_str());
        let stream = match tokio::time::timeout(timeout, connect).await {
            Err(_) => return Err(format!("cannot connect to {address}: no connection within {timeout:?}")),
            Ok(Err(error)) => return Err(format!("cannot connect to {address}: {error}")),
            Ok(Ok(stream)) => stream,
        };
        let peer = stream.peer_addr().map_err(|e| format!("cannot connect to {address}: {e}"))?;
        // Echoes and requests are small; sending them at once matters more than packing them.
        let _ = stream.set_nodelay(true);
        if let Some(bytes) = receive_buffer {
            let _ = SockRef::from(&stream).set_recv_buffer_size(bytes);
        }
        Ok((stream, peer))
    })
}

/// Resolves `address` (`host:port`) within `timeout`: a name that does not resolve at the start
/// is a configuration to fix, not a publisher that is away.
pub(crate) async fn resolve(address: &str, timeout: Duration) -> Result<(), Error> {
    let unreachable = |reason: String| Error::Unreachable { address: address.to_string(), reason };
    match tokio::time::timeout(timeout, tokio::net::lookup_host(address)).await {
        Err(_) => Err(unreachable(format!("resolving the host took longer than {timeout:?}"))),
        Ok(Err(error)) => {
            Err(unreachable(format!("cannot resolve the host: {error}; check the name (or give an IP address)")))
        }
        Ok(Ok(mut addrs)) => match addrs.next() {
            Some(_) => Ok(()),
            None => Err(unreachable("the name resolves to no address".into())),
        },
    }
}

/// What a UDP socket was set up with.
#[derive(Debug)]
pub(crate) struct Opened {
    pub socket: UdpSocket,
    /// The receive buffer the kernel granted (Linux reports twice the usable size).
    pub granted: usize,
}

/// Opens the socket of a UDP or multicast line (`setting` names it in errors).
pub(crate) fn open_udp(
    transport: &Transport,
    setting: &'static str,
    receive_buffer: Option<usize>,
) -> Result<Opened, Error> {
    let io = |context: &str, source: io::Error| Error::Io { context: format!("{setting}: {context}"), source };
    let (bind, multicast) = match transport {
        Transport::Udp(addr) => (*addr, None),
        // Bound to the group address, the socket gets only this group's datagrams, not those of
        // every group (or unicast) sent to the same port.
        Transport::Multicast { group, interface } => (*group, Some((*group, *interface))),
        Transport::Tcp(_) | Transport::Nats { .. } => return Err(Error::config(setting, "not a UDP transport")),
    };
    let socket = Socket::new(Domain::for_address(bind), Type::DGRAM, Some(Protocol::UDP))
        .map_err(|e| io("cannot open a UDP socket", e))?;
    // Several subscribers on one host can join the same group and port. A unicast port is one
    // receiver's: with SO_REUSEADDR a second subscriber would bind it too and silently take the
    // datagrams from the first, so it is refused instead.
    if multicast.is_some() {
        socket.set_reuse_address(true).map_err(|e| io("cannot set SO_REUSEADDR", e))?;
    }
    if let Some(bytes) = receive_buffer {
        set_receive_buffer(&socket, bytes);
    }
    socket.bind(&bind.into()).map_err(|source| Error::Bind { setting, address: bind, source })?;
    if let Some((group, interface)) = multicast {
        let IpAddr::V4(ip) = group.ip() else { return Err(Error::config(setting, format!("{group} is not IPv4"))) };
        socket.join_multicast_v4(&ip, &interface).map_err(|source| Error::Join {
            setting,
            group,
            interface,
            source,
        })?;
    }
    socket.set_nonblocking(true).map_err(|e| io("cannot make the socket non-blocking", e))?;
    let granted = socket.recv_buffer_size().unwrap_or(0);
    let socket =
        UdpSocket::from_std(socket.into()).map_err(|e| io("cannot register the socket with the runtime", e))?;
    Ok(Opened { socket, granted })
}

/// Asks for a receive buffer of `bytes`: SO_RCVBUFFORCE passes net.core.rmem_max but needs
/// CAP_NET_ADMIN; otherwise SO_RCVBUF, which the kernel caps at rmem_max.
fn set_receive_buffer(socket: &Socket, bytes: usize) {
    use nix::sys::socket::{setsockopt, sockopt::RcvBufForce};
    if setsockopt(socket, RcvBufForce, &bytes).is_err() {
        let _ = socket.set_recv_buffer_size(bytes);
    }
}

/// Sets SO_BUSY_POLL; false when the kernel refuses it (raising it above net.core.busy_read
/// needs CAP_NET_ADMIN), since receiving works without it.
pub(crate) fn busy_poll(socket: SockRef<'_>) -> bool {
    socket.set_busy_poll(BUSY_POLL_US).is_ok()
}
