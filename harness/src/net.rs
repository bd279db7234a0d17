//! Loopback addresses for tests: free ports, and an accept that gives up.
//!
//! A free port is free when asked for; something else may take it before the test binds it.
//! Prefer letting the program bind port 0 and reading its address from its log
//! ([`Process::serving_on`](crate::Process::serving_on),
//! [`Process::listening_on`](crate::Process::listening_on)) where it prints one.

use std::net::{TcpListener, TcpStream, UdpSocket};
use std::time::Duration;

/// A TCP port on 127.0.0.1 that was free a moment ago.
pub fn free_tcp_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("binding 127.0.0.1:0").port()
}

/// A UDP port on 127.0.0.1 that was free a moment ago.
pub fn free_udp_port() -> u16 {
    UdpSocket::bind("127.0.0.1:0").and_then(|s| s.local_addr()).expect("binding 127.0.0.1:0").port()
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
