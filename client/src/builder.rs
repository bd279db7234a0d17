//! The settings of a subscriber ([`Builder`]), checked once when it is built: a bad setting fails
//! there, with an [`Error::Config`] naming the builder method that set it.

use crate::error::Error;
use crate::nats_auth::{NatsAuth, nats_config};
use crate::settings::{NatsSettings, RecoverySettings, Settings, Transport};
use crate::subscriber::{AsyncSubscriber, Subscriber};
use mdrelay_proto::Symbol;
use mdrelay_proto::codec::SymbolFilter;
use mdrelay_proto::idle::{IdleStrategy, Profile};
use mdrelay_proto::relay::{Protection, WireKey};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::time::{Duration, SystemTime};

/// Default cap of the wait between TCP connection attempts (they start at 100 ms and double).
pub const DEFAULT_RECONNECT_MAX: Duration = Duration::from_secs(5);
/// Default time for a TCP connection to be made (and a name resolved).
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Default receive buffer asked of the kernel for UDP and multicast sockets: deep enough to ride
/// out a scheduling hiccup at full rate.
pub const DEFAULT_RECEIVE_BUFFER: usize = 16 << 20;
/// Default wait after a gap is seen before its frames are asked for (reordering often fills it).
pub const DEFAULT_RECOVERY_DELAY: Duration = Duration::from_millis(5);
/// Default wait before a request without an answer is asked again.
pub const DEFAULT_RECOVERY_RETRY: Duration = Duration::from_millis(50);
/// Default number of requests for one gap before it is given up.
pub const DEFAULT_RECOVERY_ATTEMPTS: u32 = 10;
/// Default wait after the end of the stream for frames still missing.
pub const DEFAULT_RECOVERY_LINGER: Duration = Duration::from_secs(2);
/// NATS with a JetStream stream: default wait after a gap is seen before it is read from the
/// stream (one connection delivers in order, so a gap is a loss; the wait lets the stream store
/// the frames that follow it).
#[cfg_attr(docsrs, doc(cfg(feature = "nats")))]
pub const DEFAULT_NATS_REPAIR_DELAY: Duration = Duration::from_millis(20);
/// NATS with a JetStream stream: default wait before frames still missing are read again. It
/// doubles with each read (and is at least twice as long as reads take), to 2 s: frames lost
/// with a stream's leader are stored only once published again, after an election, and must
/// then be read before the live subject takes them out of the window (the publisher runs at
/// most half a window ahead of what is stored; at 12,000 frames a second the other half lasts
/// 2.7 s).
#[cfg_attr(docsrs, doc(cfg(feature = "nats")))]
pub const DEFAULT_NATS_REPAIR_RETRY: Duration = Duration::from_millis(250);
/// NATS with a JetStream stream: default number of reads of a gap before it is given up
/// (about 18 s of reads at the default retry: an election and a publication again fit).
#[cfg_attr(docsrs, doc(cfg(feature = "nats")))]
pub const DEFAULT_NATS_REPAIR_ATTEMPTS: u32 = 12;
/// NATS with a JetStream stream: default wait after the end of the stream for frames still
/// missing.
#[cfg_attr(docsrs, doc(cfg(feature = "nats")))]
pub const DEFAULT_NATS_REPAIR_LINGER: Duration = Duration::from_secs(10);
/// NATS: default [`Builder::give_up_after`], how long a stream that has started may bring
/// nothing new (no frame on the subject nor, with a stream, in its tail) before the subscriber
/// gives up on it. Past a stream leader's election (about 18 s of repairs) and far past the
/// publisher's own silences (an IEX feed sends a heartbeat every second).
#[cfg_attr(docsrs, doc(cfg(feature = "nats")))]
pub const DEFAULT_NATS_GIVE_UP_AFTER: Duration = Duration::from_secs(30);

/// How the stream arrives, as given to the builder.
#[derive(Clone, Debug)]
enum TransportSpec {
    Tcp(String),
    Udp(String),
    Multicast {
        group: String,
        interface: String,
    },
    // Made by Builder::nats only, which the nats feature brings.
    #[cfg_attr(not(feature = "nats"), allow(dead_code))]
    Nats {
        servers: String,
        subject: String,
    },
}

/// Where the frame protection key comes from.
#[derive(Clone, Debug)]
enum KeySource {
    File(PathBuf),
    Key(WireKey),
}

/// Settings of a subscriber: the transport first ([`Builder::tcp`], [`Builder::udp`],
/// [`Builder::multicast`]), then anything else, then [`Builder::build`] for the blocking
/// [`Subscriber`] or [`Builder::build_async`] for the [`AsyncSubscriber`].
///
/// ```no_run
/// # fn main() -> Result<(), mdrelay_client::Error> {
/// use std::time::Duration;
/// let subscriber = mdrelay_client::Builder::multicast("239.255.0.1:9300", "192.0.2.10")
///     .line_b("239.255.1.1:9300")
///     .interface_b("198.51.100.10")
///     .recovery("192.0.2.1:9101")
///     .recovery_retry(Duration::from_millis(20))
///     .symbols(["AAPL", "IBM"])
///     .build()?;
/// # drop(subscriber);
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug)]
#[must_use = "a builder does nothing until it is built"]
pub struct Builder {
    transport: TransportSpec,
    line_b: Option<String>,
    interface_b: Option<String>,
    recovery: Option<String>,
    recovery_delay: Option<Duration>,
    recovery_retry: Option<Duration>,
    recovery_attempts: Option<u32>,
    recovery_linger: Option<Duration>,
    resume: Option<bool>,
    from_start: bool,
    symbols: Option<Vec<String>>,
    crc: bool,
    key: Option<KeySource>,
    key_twice: bool,
    echo_every: Option<u64>,
    reconnect_max: Option<Duration>,
    give_up_after: Option<Duration>,
    connect_timeout: Option<Duration>,
    receive_buffer: Option<usize>,
    profile: Profile,
    idle: Option<IdleStrategy>,
    busy_poll: Option<bool>,
    frame_bytes: bool,
    nats_stream: Option<String>,
    nats_start_at: Option<SystemTime>,
    nats_creds_file: Option<PathBuf>,
    nats_nkey_file: Option<PathBuf>,
    nats_user: Option<String>,
    nats_password_file: Option<PathBuf>,
    nats_tls_ca_file: Option<PathBuf>,
    nats_pending_messages: Option<usize>,
}

impl Builder {
    fn new(transport: TransportSpec) -> Builder {
        Builder {
            transport,
            line_b: None,
            interface_b: None,
            recovery: None,
            recovery_delay: None,
            recovery_retry: None,
            recovery_attempts: None,
            recovery_linger: None,
            resume: None,
            from_start: false,
            symbols: None,
            crc: false,
            key: None,
            key_twice: false,
            echo_every: None,
            reconnect_max: None,
            give_up_after: None,
            connect_timeout: None,
            receive_buffer: None,
            profile: Profile::Default,
            idle: None,
            busy_poll: None,
            frame_bytes: false,
            nats_stream: None,
            nats_start_at: None,
            nats_creds_file: None,
            nats_nkey_file: None,
            nats_user: None,
            nats_password_file: None,
            nats_tls_ca_file: None,
            nats_pending_messages: None,
        }
    }

    /// TCP to a publisher at `address` (`host:port`; the name is resolved at each connection
    /// attempt). A lost connection is made again, waiting from 100 ms doubling up to
    /// [`Builder::reconnect_max`], and resumes after the last frame received.
    pub fn tcp(address: impl Into<String>) -> Builder {
        Builder::new(TransportSpec::Tcp(address.into()))
    }

    /// UDP datagrams sent to the local `address` (`addr:port`; port 0 picks a free port, see
    /// [`Subscriber::local_addrs`]).
    pub fn udp(address: impl Into<String>) -> Builder {
        Builder::new(TransportSpec::Udp(address.into()))
    }

    /// UDP multicast: the IPv4 `group` (`group:port`), joined on the local interface whose
    /// address is `interface` (`0.0.0.0`: the system's choice).
    pub fn multicast(group: impl Into<String>, interface: impl Into<String>) -> Builder {
        Builder::new(TransportSpec::Multicast { group: group.into(), interface: interface.into() })
    }

    /// NATS: the messages of `subject` on the servers `servers` (comma-separated URLs,
    /// `nats://host:port`; the client fails over among them and reconnects for ever), each one
    /// relay datagram as a publisher's `[nats]` output sends it. With [`Builder::nats_stream`]
    /// and [`Builder::from_start`], the stream is replayed from JetStream first.
    #[cfg(feature = "nats")]
    #[cfg_attr(docsrs, doc(cfg(feature = "nats")))]
    pub fn nats(servers: impl Into<String>, subject: impl Into<String>) -> Builder {
        Builder::new(TransportSpec::Nats { servers: servers.into(), subject: subject.into() })
    }

    /// NATS: the JetStream stream that stores the subject (the publisher's `nats.stream`), from
    /// which [`Builder::from_start`] and [`Builder::nats_start_at`] replay and from which gaps
    /// in the live subject are repaired (the [`Builder::recovery_delay`], retry, attempts and
    /// linger settings apply, with NATS's defaults: [`DEFAULT_NATS_REPAIR_DELAY`] and the rest).
    #[cfg(feature = "nats")]
    #[cfg_attr(docsrs, doc(cfg(feature = "nats")))]
    pub fn nats_stream(mut self, stream: impl Into<String>) -> Builder {
        self.nats_stream = Some(stream.into());
        self
    }

    /// NATS with [`Builder::nats_stream`]: start with the stream's first message stored at or
    /// after `time` (a late joiner that wants the last minutes, say), replayed and then handed
    /// over to the live subject without a gap or a duplicate, as [`Builder::from_start`] is.
    /// The frames before it are not owed (the subscriber joined late).
    #[cfg(feature = "nats")]
    #[cfg_attr(docsrs, doc(cfg(feature = "nats")))]
    pub fn nats_start_at(mut self, time: SystemTime) -> Builder {
        self.nats_start_at = Some(time);
        self
    }

    /// NATS: authenticate with a `.creds` file (JWT and nkey seed), as the publisher's
    /// `nats.creds_file`.
    #[cfg(feature = "nats")]
    #[cfg_attr(docsrs, doc(cfg(feature = "nats")))]
    pub fn nats_creds_file(mut self, path: impl Into<PathBuf>) -> Builder {
        self.nats_creds_file = Some(path.into());
        self
    }

    /// NATS: authenticate with the nkey seed in this file, as the publisher's `nats.nkey_file`.
    #[cfg(feature = "nats")]
    #[cfg_attr(docsrs, doc(cfg(feature = "nats")))]
    pub fn nats_nkey_file(mut self, path: impl Into<PathBuf>) -> Builder {
        self.nats_nkey_file = Some(path.into());
        self
    }

    /// NATS: authenticate as this user, with [`Builder::nats_password_file`] (the publisher's
    /// `nats.user`).
    #[cfg(feature = "nats")]
    #[cfg_attr(docsrs, doc(cfg(feature = "nats")))]
    pub fn nats_user(mut self, user: impl Into<String>) -> Builder {
        self.nats_user = Some(user.into());
        self
    }

    /// NATS: the file holding [`Builder::nats_user`]'s password (white space around it is
    /// trimmed), as the publisher's `nats.password_file`.
    #[cfg(feature = "nats")]
    #[cfg_attr(docsrs, doc(cfg(feature = "nats")))]
    pub fn nats_password_file(mut self, path: impl Into<PathBuf>) -> Builder {
        self.nats_password_file = Some(path.into());
        self
    }

    /// NATS: messages the client holds for the subscription, at most, while the program does
    /// not read them (16 to 16 Mi, default 65,536, async-nats's); past it the client drops them
    /// as a slow consumer's and the gap is repaired from [`Builder::nats_stream`] (or counted
    /// lost). Lower it to bound memory when the program may stall.
    #[cfg(feature = "nats")]
    #[cfg_attr(docsrs, doc(cfg(feature = "nats")))]
    pub fn nats_pending_messages(mut self, messages: usize) -> Builder {
        self.nats_pending_messages = Some(messages);
        self
    }

    /// NATS: check the servers' TLS certificates with the CA certificates (PEM) in this file,
    /// and require TLS, as the publisher's `nats.tls_ca_file`.
    #[cfg(feature = "nats")]
    #[cfg_attr(docsrs, doc(cfg(feature = "nats")))]
    pub fn nats_tls_ca_file(mut self, path: impl Into<PathBuf>) -> Builder {
        self.nats_tls_ca_file = Some(path.into());
        self
    }

    /// NATS: the credentials, checked already (a program that reads them from settings of its
    /// own, as the publisher's NATS upstream does); the same as the matching one of
    /// [`Builder::nats_creds_file`], [`Builder::nats_nkey_file`], or [`Builder::nats_user`] with
    /// [`Builder::nats_password_file`], and it replaces what they set.
    #[cfg(feature = "nats")]
    #[cfg_attr(docsrs, doc(cfg(feature = "nats")))]
    pub fn nats_auth(mut self, auth: &NatsAuth) -> Builder {
        (self.nats_creds_file, self.nats_nkey_file, self.nats_user, self.nats_password_file) = auth.to_settings();
        self
    }

    /// A second line (A/B) carrying the same datagrams: a local `addr:port` for UDP, a
    /// `group:port` for multicast. Each frame is taken from whichever line delivers it first;
    /// the other copy is counted as arbitrated.
    pub fn line_b(mut self, address: impl Into<String>) -> Builder {
        self.line_b = Some(address.into());
        self
    }

    /// Multicast: the local interface to join line B's group on (default `0.0.0.0`).
    pub fn interface_b(mut self, interface: impl Into<String>) -> Builder {
        self.interface_b = Some(interface.into());
        self
    }

    /// UDP and multicast: ask the publisher's retransmission service at `address` (`host:port`,
    /// its `retransmit.listen`) for missing frames.
    pub fn recovery(mut self, address: impl Into<String>) -> Builder {
        self.recovery = Some(address.into());
        self
    }

    /// Recovery: wait this long after a gap is seen before asking (0 to 10 s, default 5 ms).
    pub fn recovery_delay(mut self, delay: Duration) -> Builder {
        self.recovery_delay = Some(delay);
        self
    }

    /// Recovery: ask again after this long without an answer (1 ms to 60 s, default 50 ms); the
    /// wait doubles with each further unanswered request for the same frames, up to 8 times.
    pub fn recovery_retry(mut self, retry: Duration) -> Builder {
        self.recovery_retry = Some(retry);
        self
    }

    /// Recovery: requests per gap before it is given up (1 to 1,000, default 10).
    pub fn recovery_attempts(mut self, attempts: u32) -> Builder {
        self.recovery_attempts = Some(attempts);
        self
    }

    /// Recovery: after the end of the stream, wait this long at most for frames still missing
    /// (0 to 600 s, default 2 s).
    pub fn recovery_linger(mut self, linger: Duration) -> Builder {
        self.recovery_linger = Some(linger);
        self
    }

    /// TCP: whether a reconnection to the same publisher run asks for the frames after the last
    /// one received (default true), or takes the stream live from where it is.
    pub fn resume(mut self, resume: bool) -> Builder {
        self.resume = Some(resume);
        self
    }

    /// The session from its first frame: over TCP asked of the publisher (replayed from its
    /// ring), over UDP owed (frames before the first received count as missing, and recovery
    /// asks for them).
    pub fn from_start(mut self, from_start: bool) -> Builder {
        self.from_start = from_start;
        self
    }

    /// Decode only these symbols' messages (1 to 8 ASCII characters each); the others are
    /// skipped while decoding, as early as the format allows, and only counted by type (see
    /// [`Frame::skipped`](crate::Frame::skipped)).
    pub fn symbols<I, S>(mut self, symbols: I) -> Builder
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.symbols = Some(symbols.into_iter().map(Into::into).collect());
        self
    }

    /// The publisher adds a CRC-32C to every frame (its `[protection] crc = true`).
    pub fn crc(mut self, crc: bool) -> Builder {
        self.crc = crc;
        self
    }

    /// The publisher encrypts every frame with the key in this file (64 hex digits, readable by
    /// its owner only, as the publisher's `[protection] key_file`).
    pub fn key_file(mut self, path: impl Into<PathBuf>) -> Builder {
        self.key_twice |= self.key.is_some();
        self.key = Some(KeySource::File(path.into()));
        self
    }

    /// The publisher encrypts every frame with this key.
    pub fn key(mut self, key: WireKey) -> Builder {
        self.key_twice |= self.key.is_some();
        self.key = Some(KeySource::Key(key));
        self
    }

    /// Round-trip latency: echo every `n`th frame's publish time back to the publisher, which
    /// measures the round trip on its own clock (`n` at least 1).
    pub fn echo_every(mut self, n: u64) -> Builder {
        self.echo_every = Some(n);
        self
    }

    /// TCP: the longest wait between connection attempts (10 ms to 1 day, default 5 s).
    pub fn reconnect_max(mut self, max: Duration) -> Builder {
        self.reconnect_max = Some(max);
        self
    }

    /// TCP: give up with [`ErrorKind::Unreachable`](crate::ErrorKind::Unreachable) when no
    /// connection could be made, or every one was told BUSY, for this long (10 ms to 1 day),
    /// counted from the first attempt that failed since the last connection whose stream
    /// started; by default a subscriber tries for ever.
    #[cfg_attr(
        feature = "nats",
        doc = r"
NATS: once the stream has started, give up on it with
[`ErrorKind::Ended`](crate::ErrorKind::Ended) when nothing new came for this long: no
new frame on the subject and, with [`Builder::nats_stream`], none in the stream's tail,
which is read whenever the subject is quiet (a server out of reach answers nothing, and
is waited for; a server that answers after more than a quarter of this limit was stalled,
and the limit starts again from its answer). What is missing then is given up, and
counted. An end of stream far ahead of the frames the stream holds (frames a publisher
dropped) is taken at that point instead, unless a frame of its session came after it.
Default [`DEFAULT_NATS_GIVE_UP_AFTER`]."
    )]
    pub fn give_up_after(mut self, limit: Duration) -> Builder {
        self.give_up_after = Some(limit);
        self
    }

    /// TCP: time for a connection to be made, the name resolved included (10 ms to 1 day,
    /// default 10 s).
    pub fn connect_timeout(mut self, timeout: Duration) -> Builder {
        self.connect_timeout = Some(timeout);
        self
    }

    /// The receive buffer asked of the kernel for each socket (4 KiB to 1 GiB; default 16 MiB
    /// for UDP and multicast, the system's for TCP). Above `net.core.rmem_max` it is granted only
    /// to a process with CAP_NET_ADMIN.
    pub fn receive_buffer(mut self, bytes: usize) -> Builder {
        self.receive_buffer = Some(bytes);
        self
    }

    /// A set of choices made together: [`Profile::LowLatency`] busy-polls the sockets
    /// ([`IdleStrategy::Spin`], SO_BUSY_POLL); settings given explicitly override it.
    pub fn profile(mut self, profile: Profile) -> Builder {
        self.profile = profile;
        self
    }

    /// How waiting for data is done: [`IdleStrategy::Sleep`] (the default) waits for the kernel
    /// to say a socket is readable; `Spin` and `Yield` read the non-blocking sockets over and
    /// over (a core), `Backoff` does so for a few dozen empty reads after data, then waits.
    pub fn idle(mut self, idle: IdleStrategy) -> Builder {
        self.idle = Some(idle);
        self
    }

    /// SO_BUSY_POLL on the sockets (on with the low-latency profile); a kernel that refuses it
    /// is counted in [`Counters::busy_poll_refused`](crate::Counters::busy_poll_refused).
    pub fn busy_poll(mut self, busy_poll: bool) -> Builder {
        self.busy_poll = Some(busy_poll);
        self
    }

    /// Keep each frame's bytes (opened, as the format encodes them) for
    /// [`Frame::bytes`](crate::Frame::bytes), as a recorder needs them: one copy per frame.
    pub fn frame_bytes(mut self, keep: bool) -> Builder {
        self.frame_bytes = keep;
        self
    }

    /// Checks the settings, binds the sockets (UDP, multicast) or resolves the publisher's name
    /// (TCP), and returns the blocking subscriber, which runs a current-thread runtime of its
    /// own. Nothing is received until [`Subscriber::next_event`] is called.
    pub fn build(self) -> Result<Subscriber, Error> {
        let settings = self.settings()?;
        Subscriber::start(settings)
    }

    /// As [`Builder::build`], for use inside a tokio runtime (with I/O and time enabled).
    pub async fn build_async(self) -> Result<AsyncSubscriber, Error> {
        let settings = self.settings()?;
        AsyncSubscriber::start(settings).await
    }

    /// The settings checked.
    pub(crate) fn settings(self) -> Result<Settings, Error> {
        let tcp = matches!(self.transport, TransportSpec::Tcp(_));
        let nats = matches!(self.transport, TransportSpec::Nats { .. });
        let transport = match &self.transport {
            TransportSpec::Tcp(address) => {
                check_host_port(address).map_err(|why| Error::config("tcp", format!("{address:?} {why}")))?;
                Transport::Tcp(address.clone())
            }
            TransportSpec::Udp(address) => Transport::Udp(listen_addr(address, "udp", "multicast")?),
            TransportSpec::Multicast { group, interface } => {
                let group = multicast_group(group, "multicast")?;
                Transport::Multicast { group, interface: interface_addr(interface, "multicast")? }
            }
            TransportSpec::Nats { servers, subject } => {
                let servers: Vec<String> =
                    servers.split(',').map(str::trim).filter(|s| !s.is_empty()).map(String::from).collect();
                if servers.is_empty() {
                    return Err(Error::config("nats", "no server URL given (nats://host:port, comma-separated)"));
                }
                let wildcard = subject.split('.').any(|t| t.is_empty() || t == "*" || t == ">");
                if wildcard || subject.contains(char::is_whitespace) {
                    return Err(Error::config(
                        "nats",
                        format!(
                            "{subject:?} is not one stream's subject (dot-separated tokens, no wildcards or spaces)"
                        ),
                    ));
                }
                if self.from_start && self.nats_stream.is_none() {
                    return Err(Error::config(
                        "from_start",
                        "over NATS the start is replayed from JetStream: give the stream with nats_stream",
                    ));
                }
                Transport::Nats { servers, subject: subject.clone(), stream: self.nats_stream.clone() }
            }
        };
        if !nats {
            for (setting, set) in [
                ("nats_stream", self.nats_stream.is_some()),
                ("nats_start_at", self.nats_start_at.is_some()),
                ("nats_creds_file", self.nats_creds_file.is_some()),
                ("nats_nkey_file", self.nats_nkey_file.is_some()),
                ("nats_user", self.nats_user.is_some()),
                ("nats_password_file", self.nats_password_file.is_some()),
                ("nats_tls_ca_file", self.nats_tls_ca_file.is_some()),
                ("nats_pending_messages", self.nats_pending_messages.is_some()),
            ] {
                if set {
                    return Err(Error::config(setting, "only used with a NATS subscriber (Builder::nats)"));
                }
            }
        }
        let nats_settings = self.nats_settings()?;
        let not_tcp = |setting: &'static str, what: &str| {
            Error::config(setting, format!("{what} is for UDP and multicast; a TCP subscriber has one connection"))
        };
        let only_tcp = |setting: &'static str| {
            Error::config(setting, "only used over TCP (UDP and multicast have no connection to make)")
        };
        let line_b = match (&transport, self.line_b.as_deref()) {
            (_, None) => None,
            (Transport::Tcp(_), Some(_)) => return Err(not_tcp("line_b", "a second line (A/B)")),
            (Transport::Nats { .. }, Some(_)) => {
                return Err(Error::config("line_b", "a second line (A/B) is for UDP and multicast, not NATS"));
            }
            (Transport::Udp(a), Some(b)) => {
                let b = listen_addr(b, "line_b", "multicast")?;
                if *a == b && b.port() != 0 {
                    return Err(Error::config(
                        "line_b",
                        format!("{b} is line A's address too; line B needs an address or port of its own"),
                    ));
                }
                Some(Transport::Udp(b))
            }
            (Transport::Multicast { group: a, .. }, Some(b)) => {
                let group = multicast_group(b, "line_b")?;
                if *a == group && group.port() != 0 {
                    return Err(Error::config(
                        "line_b",
                        format!(
                            "{group} is line A's group and port too; line B needs another group or port (a socket bound to a group and port receives it from every interface)"
                        ),
                    ));
                }
                let interface = match &self.interface_b {
                    Some(i) => interface_addr(i, "interface_b")?,
                    None => Ipv4Addr::UNSPECIFIED,
                };
                Some(Transport::Multicast { group, interface })
            }
        };
        if self.interface_b.is_some() && !matches!(line_b, Some(Transport::Multicast { .. })) {
            return Err(Error::config(
                "interface_b",
                "an interface for line B is only used with a multicast line B (line_b on a multicast subscriber)",
            ));
        }
        let recovery = match (&self.recovery, &transport) {
            (None, Transport::Nats { stream: Some(stream), .. }) => {
                // Gaps are repaired from the stream, by the same book as a retransmission
                // service's, with NATS's defaults.
                let ms = Duration::from_millis;
                Some(RecoverySettings {
                    server: format!("JetStream stream {stream}"),
                    delay: ranged(self.recovery_delay, "recovery_delay", Duration::ZERO, ms(10_000))?
                        .unwrap_or(DEFAULT_NATS_REPAIR_DELAY),
                    retry: ranged(self.recovery_retry, "recovery_retry", ms(1), ms(60_000))?
                        .unwrap_or(DEFAULT_NATS_REPAIR_RETRY),
                    attempts: attempts(self.recovery_attempts)?.unwrap_or(DEFAULT_NATS_REPAIR_ATTEMPTS),
                    linger: ranged(self.recovery_linger, "recovery_linger", Duration::ZERO, Duration::from_secs(600))?
                        .unwrap_or(DEFAULT_NATS_REPAIR_LINGER),
                })
            }
            (None, _) => None,
            (Some(_), _) if nats => {
                return Err(Error::config(
                    "recovery",
                    "the retransmission service is for UDP and multicast subscribers, not NATS",
                ));
            }
            (Some(_), _) if tcp => {
                return Err(Error::config(
                    "recovery",
                    "a TCP subscriber resumes from the publisher's ring when it reconnects; the retransmission service is for UDP and multicast subscribers",
                ));
            }
            (Some(server), _) => {
                check_host_port(server).map_err(|why| Error::config("recovery", format!("{server:?} {why}")))?;
                let ms = Duration::from_millis;
                Some(RecoverySettings {
                    server: server.clone(),
                    delay: ranged(self.recovery_delay, "recovery_delay", Duration::ZERO, ms(10_000))?
                        .unwrap_or(DEFAULT_RECOVERY_DELAY),
                    retry: ranged(self.recovery_retry, "recovery_retry", ms(1), ms(60_000))?
                        .unwrap_or(DEFAULT_RECOVERY_RETRY),
                    attempts: attempts(self.recovery_attempts)?.unwrap_or(DEFAULT_RECOVERY_ATTEMPTS),
                    linger: ranged(self.recovery_linger, "recovery_linger", Duration::ZERO, Duration::from_secs(600))?
                        .unwrap_or(DEFAULT_RECOVERY_LINGER),
                })
            }
        };
        if recovery.is_none() {
            let given = [
                ("recovery_delay", self.recovery_delay.is_some()),
                ("recovery_retry", self.recovery_retry.is_some()),
                ("recovery_attempts", self.recovery_attempts.is_some()),
                ("recovery_linger", self.recovery_linger.is_some()),
            ];
            if let Some((setting, _)) = given.iter().find(|(_, set)| *set) {
                return Err(Error::config(
                    setting,
                    "only used with recovery (the publisher's retransmission service, or a NATS subscriber's JetStream stream), which is not set",
                ));
            }
        }
        if !tcp {
            for (setting, set) in [
                ("resume", self.resume.is_some()),
                ("reconnect_max", self.reconnect_max.is_some()),
                ("give_up_after", self.give_up_after.is_some() && !nats),
                ("connect_timeout", self.connect_timeout.is_some() && !nats),
            ] {
                if set {
                    return Err(only_tcp(setting));
                }
            }
        }
        let day = Duration::from_secs(86_400);
        let tens_of_ms = Duration::from_millis(10);
        let reconnect_max =
            ranged(self.reconnect_max, "reconnect_max", tens_of_ms, day)?.unwrap_or(DEFAULT_RECONNECT_MAX);
        let give_up_after = ranged(self.give_up_after, "give_up_after", tens_of_ms, day)?
            .or(nats.then_some(DEFAULT_NATS_GIVE_UP_AFTER));
        let connect_timeout =
            ranged(self.connect_timeout, "connect_timeout", tens_of_ms, day)?.unwrap_or(DEFAULT_CONNECT_TIMEOUT);
        let symbols = match self.symbols {
            None => None,
            Some(list) if list.is_empty() => {
                return Err(Error::config("symbols", "the list is empty; leave it out to receive every symbol"));
            }
            Some(list) => {
                let mut out = Vec::with_capacity(list.len());
                for text in list {
                    let trimmed = text.trim();
                    let symbol = Symbol::new(trimmed).filter(|_| !trimmed.is_empty()).ok_or_else(|| {
                        Error::config("symbols", format!("{text:?} is not a symbol (1 to 8 ASCII characters)"))
                    })?;
                    out.push(symbol);
                }
                Some(SymbolFilter::new(out))
            }
        };
        if self.key_twice {
            return Err(Error::config("key", "both key and key_file were given; give one"));
        }
        let key = match self.key {
            None => None,
            Some(KeySource::Key(key)) => Some(key),
            Some(KeySource::File(path)) => Some(
                WireKey::read_file(&path).map_err(|e| Error::config("key_file", format!("{}: {e}", path.display())))?,
            ),
        };
        let echo_every = match self.echo_every {
            Some(0) => return Err(Error::config("echo_every", "must be at least 1 (1 echoes every frame)")),
            other => other,
        };
        let receive_buffer = match self.receive_buffer {
            Some(n) if !(4 << 10..=1 << 30).contains(&n) => {
                return Err(Error::config("receive_buffer", format!("{n} bytes is out of range (4 KiB to 1 GiB)")));
            }
            Some(n) => Some(n),
            None if tcp || nats => None,
            None => Some(DEFAULT_RECEIVE_BUFFER),
        };
        let low_latency = self.profile == Profile::LowLatency;
        let idle = self.idle.unwrap_or(if low_latency { IdleStrategy::Spin } else { IdleStrategy::Sleep });
        Ok(Settings {
            transport,
            line_b,
            recovery,
            resume: self.resume.unwrap_or(true),
            from_start: self.from_start,
            symbols,
            protection: Protection { crc: self.crc, encrypted: key.is_some() },
            key,
            echo_every,
            reconnect_max,
            give_up_after,
            connect_timeout,
            receive_buffer,
            idle,
            busy_poll: self.busy_poll.unwrap_or(low_latency),
            frame_bytes: self.frame_bytes,
            nats: nats_settings,
        })
    }

    /// NATS's own settings checked (whether they fit the transport was checked before).
    fn nats_settings(&self) -> Result<NatsSettings, Error> {
        if let Some(time) = self.nats_start_at {
            if self.nats_stream.is_none() {
                return Err(Error::config(
                    "nats_start_at",
                    "the start is replayed from JetStream: give the stream with nats_stream",
                ));
            }
            if self.from_start {
                return Err(Error::config("nats_start_at", "give from_start or a start time, not both"));
            }
            if time.duration_since(SystemTime::UNIX_EPOCH).is_err() {
                return Err(Error::config("nats_start_at", "the time is before 1970"));
            }
        }
        let auth = NatsAuth::from_settings(
            self.nats_creds_file.clone(),
            self.nats_nkey_file.clone(),
            self.nats_user.clone(),
            self.nats_password_file.clone(),
        )
        .map_err(nats_config)?;
        for (setting, path) in [
            ("nats_creds_file", &self.nats_creds_file),
            ("nats_nkey_file", &self.nats_nkey_file),
            ("nats_password_file", &self.nats_password_file),
            ("nats_tls_ca_file", &self.nats_tls_ca_file),
        ] {
            if let Some(path) = path
                && !path.is_file()
            {
                return Err(Error::config(setting, format!("{} is not a file", path.display())));
            }
        }
        if let Some(n) = self.nats_pending_messages
            && !(16..=1 << 24).contains(&n)
        {
            return Err(Error::config("nats_pending_messages", format!("{n} is out of range (16 to 16 Mi)")));
        }
        Ok(NatsSettings {
            start_at: self.nats_start_at,
            auth,
            tls_ca_file: self.nats_tls_ca_file.clone(),
            pending_messages: self.nats_pending_messages,
        })
    }
}

/// Recovery's attempts, when within range.
fn attempts(value: Option<u32>) -> Result<Option<u32>, Error> {
    match value {
        Some(n) if !(1..=1000).contains(&n) => {
            Err(Error::config("recovery_attempts", format!("{n} is out of range (1 to 1000)")))
        }
        other => Ok(other),
    }
}

/// `value` when within `min..=max`.
fn ranged(
    value: Option<Duration>,
    setting: &'static str,
    min: Duration,
    max: Duration,
) -> Result<Option<Duration>, Error> {
    match value {
        Some(v) if v < min || v > max => {
            Err(Error::config(setting, format!("{v:?} is out of range ({min:?} to {max:?})")))
        }
        other => Ok(other),
    }
}

/// Whether `value` is a `host:port` that can be connected to (an IP address and port, or a
/// name and port; the name is not resolved here), as [`Builder::tcp`] and [`Builder::recovery`]
/// check it; why not, to follow the value in a message (`"h" is not host:port (...)`).
///
/// ```
/// assert!(mdrelay_client::check_host_port("localhost:9100").is_ok());
/// assert_eq!(mdrelay_client::check_host_port("localhost"), Err("is not host:port (the port is missing)"));
/// ```
pub fn check_host_port(value: &str) -> Result<(), &'static str> {
    if let Ok(addr) = value.parse::<SocketAddr>() {
        return if addr.port() == 0 { Err("is not host:port (port 0 cannot be connected to)") } else { Ok(()) };
    }
    let Some((host, port)) = value.rsplit_once(':') else {
        return Err("is not host:port (the port is missing)");
    };
    if host.is_empty() {
        return Err("is not host:port (the host is missing)");
    }
    if host.contains(':') && !(host.starts_with('[') && host.ends_with(']')) {
        return Err("is not host:port (write an IPv6 address in brackets, e.g. \"[::1]:9100\")");
    }
    if host.contains(char::is_whitespace) {
        return Err("is not host:port (the host contains a space)");
    }
    match port.parse::<u16>() {
        Ok(0) => Err("is not host:port (port 0 cannot be connected to)"),
        Ok(_) => Ok(()),
        Err(_) => Err("is not host:port (the port is not a number from 1 to 65535)"),
    }
}

fn listen_addr(value: &str, setting: &'static str, group_setting: &str) -> Result<SocketAddr, Error> {
    let addr: SocketAddr = value.parse().map_err(|_| {
        Error::config(setting, format!("{value:?} is not an address:port (e.g. \"0.0.0.0:9200\" or \"[::]:9200\")"))
    })?;
    if addr.ip().is_multicast() {
        return Err(Error::config(
            setting,
            format!("{} is a multicast address; join a group with {group_setting}", addr.ip()),
        ));
    }
    Ok(addr)
}

fn multicast_group(value: &str, setting: &'static str) -> Result<SocketAddr, Error> {
    let addr: SocketAddr = value
        .parse()
        .map_err(|_| Error::config(setting, format!("{value:?} is not a group:port (e.g. \"239.255.0.1:9300\")")))?;
    match addr.ip() {
        IpAddr::V4(ip) if ip.is_multicast() => Ok(addr),
        IpAddr::V4(ip) => Err(Error::config(
            setting,
            format!("{ip} is not a multicast address (224.0.0.0/4); for unicast UDP use Builder::udp"),
        )),
        IpAddr::V6(_) => {
            Err(Error::config(setting, format!("{addr} is IPv6; only IPv4 multicast groups are supported")))
        }
    }
}

fn interface_addr(value: &str, setting: &'static str) -> Result<Ipv4Addr, Error> {
    let ip: Ipv4Addr = value.parse().map_err(|_| {
        Error::config(
            setting,
            format!("{value:?} is not an IPv4 address (the local interface's address, e.g. \"127.0.0.1\")"),
        )
    })?;
    if ip.is_multicast() {
        return Err(Error::config(
            setting,
            format!("{ip} is a multicast address; give the local interface's own address"),
        ));
    }
    Ok(ip)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorKind;

    fn setting(b: Builder) -> &'static str {
        match b.settings() {
            Err(e) => {
                assert_eq!(e.kind(), ErrorKind::Config, "{e}");
                e.setting().expect("a configuration error names its setting")
            }
            Ok(s) => panic!("accepted: {s:?}"),
        }
    }

    #[test]
    #[cfg(feature = "nats")]
    fn give_up_after_is_for_tcp_and_nats_with_a_default_over_nats() {
        let nats = || Builder::nats("nats://127.0.0.1:4222", "md.x");
        let ms = Duration::from_millis;
        assert_eq!(nats().settings().unwrap().give_up_after, Some(DEFAULT_NATS_GIVE_UP_AFTER));
        assert_eq!(nats().give_up_after(ms(500)).settings().unwrap().give_up_after, Some(ms(500)));
        assert_eq!(setting(nats().give_up_after(ms(5))), "give_up_after");
        assert_eq!(Builder::tcp("h:1").settings().unwrap().give_up_after, None, "TCP tries for ever by default");
        assert_eq!(setting(Builder::udp("127.0.0.1:0").give_up_after(ms(500))), "give_up_after");
    }

    #[test]
    fn every_bad_setting_is_named() {
        let udp = || Builder::udp("127.0.0.1:0");
        let ms = Duration::from_millis;
        assert_eq!(setting(Builder::tcp("nohost")), "tcp");
        assert_eq!(setting(Builder::tcp("host:0")), "tcp");
        assert_eq!(setting(Builder::udp("239.1.1.1:5")), "udp");
        assert_eq!(setting(Builder::multicast("127.0.0.1:5", "0.0.0.0")), "multicast");
        assert_eq!(setting(Builder::multicast("239.1.1.1:5", "eth0")), "multicast");
        assert_eq!(setting(Builder::tcp("h:1").line_b("127.0.0.1:1")), "line_b");
        assert_eq!(setting(Builder::udp("127.0.0.1:7").line_b("127.0.0.1:7")), "line_b");
        assert_eq!(setting(udp().interface_b("127.0.0.1")), "interface_b");
        assert_eq!(setting(Builder::tcp("h:1").recovery("h:2")), "recovery");
        assert_eq!(setting(udp().recovery("h")), "recovery");
        assert_eq!(setting(udp().recovery_retry(ms(5))), "recovery_retry");
        assert_eq!(setting(udp().recovery("h:1").recovery_retry(ms(0))), "recovery_retry");
        assert_eq!(setting(udp().recovery("h:1").recovery_delay(ms(10_001))), "recovery_delay");
        assert_eq!(setting(udp().recovery("h:1").recovery_attempts(0)), "recovery_attempts");
        assert_eq!(setting(udp().recovery("h:1").recovery_linger(Duration::from_secs(601))), "recovery_linger");
        assert_eq!(setting(udp().resume(false)), "resume");
        assert_eq!(setting(udp().reconnect_max(ms(100))), "reconnect_max");
        assert_eq!(setting(Builder::tcp("h:1").reconnect_max(ms(1))), "reconnect_max");
        assert_eq!(setting(Builder::tcp("h:1").give_up_after(ms(1))), "give_up_after");
        assert_eq!(setting(udp().give_up_after(ms(100))), "give_up_after");
        assert_eq!(setting(udp().symbols(Vec::<String>::new())), "symbols");
        assert_eq!(setting(udp().symbols(["TOOLONGSYM"])), "symbols");
        assert_eq!(setting(udp().echo_every(0)), "echo_every");
        assert_eq!(setting(udp().receive_buffer(10)), "receive_buffer");
        assert_eq!(setting(udp().key_file("/nonexistent/key")), "key_file");
        assert_eq!(setting(udp().key(WireKey::parse_hex(&"11".repeat(32)).unwrap()).key_file("/k")), "key");
    }

    #[test]
    fn defaults_and_profiles() {
        let s = Builder::tcp("localhost:9100").settings().unwrap();
        assert_eq!(s.transport, Transport::Tcp("localhost:9100".into()));
        assert!(s.resume && !s.from_start && s.receive_buffer.is_none());
        assert_eq!((s.idle, s.busy_poll, s.reconnect_max), (IdleStrategy::Sleep, false, DEFAULT_RECONNECT_MAX));
        let s = Builder::multicast("239.255.0.1:9300", "127.0.0.1")
            .line_b("239.255.0.2:9300")
            .recovery("127.0.0.1:9101")
            .profile(Profile::LowLatency)
            .idle(IdleStrategy::Backoff)
            .settings()
            .unwrap();
        assert_eq!((s.idle, s.busy_poll), (IdleStrategy::Backoff, true), "an explicit setting beats the profile's");
        assert_eq!(s.receive_buffer, Some(DEFAULT_RECEIVE_BUFFER));
        let r = s.recovery.unwrap();
        assert_eq!(
            (r.delay, r.retry, r.attempts, r.linger),
            (DEFAULT_RECOVERY_DELAY, DEFAULT_RECOVERY_RETRY, 10, DEFAULT_RECOVERY_LINGER)
        );
        assert_eq!(
            s.line_b,
            Some(Transport::Multicast { group: "239.255.0.2:9300".parse().unwrap(), interface: Ipv4Addr::UNSPECIFIED })
        );
    }
}
