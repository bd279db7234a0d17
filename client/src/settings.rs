//! The settings a [`Builder`](crate::Builder) checked, as the drivers take them.

use crate::NatsAuth;
use mdrelay_proto::codec::SymbolFilter;
use mdrelay_proto::idle::IdleStrategy;
use mdrelay_proto::relay::{Protection, WireKey};
use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::time::{Duration, SystemTime};

/// Where the stream comes from, checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Transport {
    /// TCP to `host:port`.
    Tcp(String),
    /// UDP to this local address.
    Udp(SocketAddr),
    /// Multicast: the group and port, joined on the interface.
    Multicast { group: SocketAddr, interface: Ipv4Addr },
    /// NATS: the servers' URLs, the subject, and the JetStream stream that stores it.
    Nats { servers: Vec<String>, subject: String, stream: Option<String> },
}

/// Recovery's settings, checked.
#[derive(Clone, Debug)]
pub(crate) struct RecoverySettings {
    pub server: String,
    pub delay: Duration,
    pub retry: Duration,
    pub attempts: u32,
    pub linger: Duration,
}

/// NATS's own settings, checked (without the nats feature, checked and not used: only
/// Builder::nats sets them).
#[derive(Clone, Debug, Default)]
#[cfg_attr(not(feature = "nats"), allow(dead_code))]
pub(crate) struct NatsSettings {
    /// Replay the JetStream stream from its first message stored at or after this time.
    pub start_at: Option<SystemTime>,
    pub auth: NatsAuth,
    /// CA certificates (PEM) to check the servers' certificates with; TLS is required.
    pub tls_ca_file: Option<PathBuf>,
    /// Messages held for the subscription at most (async-nats's default when none).
    pub pending_messages: Option<usize>,
}

/// Every setting, checked.
#[derive(Clone, Debug)]
pub(crate) struct Settings {
    pub transport: Transport,
    pub line_b: Option<Transport>,
    pub recovery: Option<RecoverySettings>,
    pub resume: bool,
    pub from_start: bool,
    pub symbols: Option<SymbolFilter>,
    pub protection: Protection,
    pub key: Option<WireKey>,
    pub echo_every: Option<u64>,
    pub reconnect_max: Duration,
    pub give_up_after: Option<Duration>,
    pub connect_timeout: Duration,
    pub receive_buffer: Option<usize>,
    pub idle: IdleStrategy,
    pub busy_poll: bool,
    pub frame_bytes: bool,
    #[cfg_attr(not(feature = "nats"), allow(dead_code))]
    pub nats: NatsSettings,
}
