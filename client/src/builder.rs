//! A subscriber's [`Builder`]: one method per [`Settings`] field, checked once when it is built:
//! a bad setting fails there, with an [`Error::Config`] naming the setting.

use crate::error::Error;
#[cfg(feature = "nats")]
use crate::nats_auth::NatsAuth;
use crate::settings::Settings;
use crate::subscriber::{AsyncSubscriber, Subscriber};
use mdrelay_proto::relay::WireKey;
use mdrelay_runtime::idle::{IdleStrategy, Profile};
use std::path::PathBuf;
use std::time::Duration;
#[cfg(feature = "nats")]
use std::time::SystemTime;

/// Settings of a subscriber ([`Settings`], one method per field): the transport first
/// ([`Builder::tcp`], [`Builder::udp`], [`Builder::multicast`], or [`Builder::from_settings`]),
/// then anything else, then [`Builder::build`] for the blocking
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
    settings: Settings,
}

impl Builder {
    /// A builder over settings read from elsewhere (a file, keyword arguments); its methods
    /// change them further.
    pub fn from_settings(settings: Settings) -> Builder {
        Builder { settings }
    }

    /// The settings given so far, not checked yet.
    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// TCP to a publisher at `address` (`host:port`; the name is resolved at each connection
    /// attempt). A lost connection is made again, waiting from 100 ms doubling up to
    /// [`Builder::reconnect_max`], and resumes after the last frame received.
    pub fn tcp(address: impl Into<String>) -> Builder {
        Builder::from_settings(Settings { tcp: Some(address.into()), ..Settings::default() })
    }

    /// UDP datagrams sent to the local `address` (`addr:port`; port 0 picks a free port, see
    /// [`Subscriber::local_addrs`]).
    pub fn udp(address: impl Into<String>) -> Builder {
        Builder::from_settings(Settings { udp: Some(address.into()), ..Settings::default() })
    }

    /// UDP multicast: the IPv4 `group` (`group:port`), joined on the local interface whose
    /// address is `interface` (`0.0.0.0`: the system's choice).
    pub fn multicast(group: impl Into<String>, interface: impl Into<String>) -> Builder {
        Builder::from_settings(Settings {
            multicast: Some(group.into()),
            interface: Some(interface.into()),
            ..Settings::default()
        })
    }

    /// NATS: the messages of `subject` on the servers `servers` (comma-separated URLs,
    /// `nats://host:port`; the client fails over among them and reconnects for ever), each one
    /// relay datagram as a publisher's `[nats]` output sends it. With [`Builder::nats_stream`]
    /// and [`Builder::from_start`], the stream is replayed from JetStream first.
    #[cfg(feature = "nats")]
    #[cfg_attr(docsrs, doc(cfg(feature = "nats")))]
    pub fn nats(servers: impl Into<String>, subject: impl Into<String>) -> Builder {
        Builder::from_settings(Settings {
            nats: Some(servers.into()),
            nats_subject: Some(subject.into()),
            ..Settings::default()
        })
    }

    /// Sets [`Settings::nats_stream`].
    #[cfg(feature = "nats")]
    #[cfg_attr(docsrs, doc(cfg(feature = "nats")))]
    pub fn nats_stream(mut self, stream: impl Into<String>) -> Builder {
        self.settings.nats_stream = Some(stream.into());
        self
    }

    /// Sets [`Settings::nats_start_at`].
    #[cfg(feature = "nats")]
    #[cfg_attr(docsrs, doc(cfg(feature = "nats")))]
    pub fn nats_start_at(mut self, time: SystemTime) -> Builder {
        self.settings.nats_start_at = Some(time);
        self
    }

    /// Sets [`Settings::nats_creds_file`].
    #[cfg(feature = "nats")]
    #[cfg_attr(docsrs, doc(cfg(feature = "nats")))]
    pub fn nats_creds_file(mut self, path: impl Into<PathBuf>) -> Builder {
        self.settings.nats_creds_file = Some(path.into());
        self
    }

    /// Sets [`Settings::nats_nkey_file`].
    #[cfg(feature = "nats")]
    #[cfg_attr(docsrs, doc(cfg(feature = "nats")))]
    pub fn nats_nkey_file(mut self, path: impl Into<PathBuf>) -> Builder {
        self.settings.nats_nkey_file = Some(path.into());
        self
    }

    /// Sets [`Settings::nats_user`].
    #[cfg(feature = "nats")]
    #[cfg_attr(docsrs, doc(cfg(feature = "nats")))]
    pub fn nats_user(mut self, user: impl Into<String>) -> Builder {
        self.settings.nats_user = Some(user.into());
        self
    }

    /// Sets [`Settings::nats_password_file`].
    #[cfg(feature = "nats")]
    #[cfg_attr(docsrs, doc(cfg(feature = "nats")))]
    pub fn nats_password_file(mut self, path: impl Into<PathBuf>) -> Builder {
        self.settings.nats_password_file = Some(path.into());
        self
    }

    /// Sets [`Settings::nats_pending_messages`].
    #[cfg(feature = "nats")]
    #[cfg_attr(docsrs, doc(cfg(feature = "nats")))]
    pub fn nats_pending_messages(mut self, messages: usize) -> Builder {
        self.settings.nats_pending_messages = Some(messages);
        self
    }

    /// Sets [`Settings::nats_name`].
    #[cfg(feature = "nats")]
    #[cfg_attr(docsrs, doc(cfg(feature = "nats")))]
    pub fn nats_name(mut self, name: impl Into<String>) -> Builder {
        self.settings.nats_name = Some(name.into());
        self
    }

    /// Sets [`Settings::nats_tls_ca_file`].
    #[cfg(feature = "nats")]
    #[cfg_attr(docsrs, doc(cfg(feature = "nats")))]
    pub fn nats_tls_ca_file(mut self, path: impl Into<PathBuf>) -> Builder {
        self.settings.nats_tls_ca_file = Some(path.into());
        self
    }

    /// NATS: the credentials, checked already (a program that reads them from settings of its
    /// own, as the publisher's NATS upstream does); the same as the matching one of
    /// [`Builder::nats_creds_file`], [`Builder::nats_nkey_file`], or [`Builder::nats_user`] with
    /// [`Builder::nats_password_file`], and it replaces what they set.
    #[cfg(feature = "nats")]
    #[cfg_attr(docsrs, doc(cfg(feature = "nats")))]
    pub fn nats_auth(mut self, auth: &NatsAuth) -> Builder {
        let s = &mut self.settings;
        (s.nats_creds_file, s.nats_nkey_file, s.nats_user, s.nats_password_file) = auth.to_settings();
        self
    }

    /// Sets [`Settings::line_b`].
    pub fn line_b(mut self, address: impl Into<String>) -> Builder {
        self.settings.line_b = Some(address.into());
        self
    }

    /// Sets [`Settings::interface_b`].
    pub fn interface_b(mut self, interface: impl Into<String>) -> Builder {
        self.settings.interface_b = Some(interface.into());
        self
    }

    /// Sets [`Settings::recovery`].
    pub fn recovery(mut self, address: impl Into<String>) -> Builder {
        self.settings.recovery = Some(address.into());
        self
    }

    /// Sets [`Settings::recovery_delay`].
    pub fn recovery_delay(mut self, delay: Duration) -> Builder {
        self.settings.recovery_delay = Some(delay);
        self
    }

    /// Sets [`Settings::recovery_retry`].
    pub fn recovery_retry(mut self, retry: Duration) -> Builder {
        self.settings.recovery_retry = Some(retry);
        self
    }

    /// Sets [`Settings::recovery_attempts`].
    pub fn recovery_attempts(mut self, attempts: u32) -> Builder {
        self.settings.recovery_attempts = Some(attempts);
        self
    }

    /// Sets [`Settings::recovery_linger`].
    pub fn recovery_linger(mut self, linger: Duration) -> Builder {
        self.settings.recovery_linger = Some(linger);
        self
    }

    /// Sets [`Settings::resume`].
    pub fn resume(mut self, resume: bool) -> Builder {
        self.settings.resume = Some(resume);
        self
    }

    /// Sets [`Settings::snapshot`].
    pub fn snapshot(mut self, snapshot: bool) -> Builder {
        self.settings.snapshot = snapshot;
        self
    }

    /// Sets [`Settings::from_start`].
    pub fn from_start(mut self, from_start: bool) -> Builder {
        self.settings.from_start = from_start;
        self
    }

    /// Sets [`Settings::symbols`].
    pub fn symbols<I, S>(mut self, symbols: I) -> Builder
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.settings.symbols = Some(symbols.into_iter().map(Into::into).collect());
        self
    }

    /// Sets [`Settings::crc`].
    pub fn crc(mut self, crc: bool) -> Builder {
        self.settings.crc = crc;
        self
    }

    /// Sets [`Settings::key_file`].
    pub fn key_file(mut self, path: impl Into<PathBuf>) -> Builder {
        self.settings.key_file = Some(path.into());
        self
    }

    /// Sets [`Settings::key`].
    pub fn key(mut self, key: WireKey) -> Builder {
        self.settings.key = Some(key);
        self
    }

    /// Sets [`Settings::echo_every`].
    pub fn echo_every(mut self, n: u64) -> Builder {
        self.settings.echo_every = Some(n);
        self
    }

    /// Sets [`Settings::reconnect_max`].
    pub fn reconnect_max(mut self, max: Duration) -> Builder {
        self.settings.reconnect_max = Some(max);
        self
    }

    /// Sets [`Settings::give_up_after`].
    pub fn give_up_after(mut self, limit: Duration) -> Builder {
        self.settings.give_up_after = Some(limit);
        self
    }

    /// Sets [`Settings::connect_timeout`].
    pub fn connect_timeout(mut self, timeout: Duration) -> Builder {
        self.settings.connect_timeout = Some(timeout);
        self
    }

    /// Sets [`Settings::receive_buffer`].
    pub fn receive_buffer(mut self, bytes: usize) -> Builder {
        self.settings.receive_buffer = Some(bytes);
        self
    }

    /// Sets [`Settings::profile`].
    pub fn profile(mut self, profile: Profile) -> Builder {
        self.settings.profile = profile;
        self
    }

    /// Sets [`Settings::idle`].
    pub fn idle(mut self, idle: IdleStrategy) -> Builder {
        self.settings.idle = Some(idle);
        self
    }

    /// Sets [`Settings::busy_poll`].
    pub fn busy_poll(mut self, busy_poll: bool) -> Builder {
        self.settings.busy_poll = Some(busy_poll);
        self
    }

    /// Sets [`Settings::frame_bytes`].
    pub fn frame_bytes(mut self, keep: bool) -> Builder {
        self.settings.frame_bytes = keep;
        self
    }

    /// Checks the settings, binds the sockets (UDP, multicast) or resolves the publisher's name
    /// (TCP), and returns the blocking subscriber, which runs a current-thread runtime of its
    /// own. Nothing is received until [`Subscriber::next_event`] is called.
    pub fn build(self) -> Result<Subscriber, Error> {
        Subscriber::start(self.settings.checked()?)
    }

    /// As [`Builder::build`], for use inside a tokio runtime (with I/O and time enabled).
    pub async fn build_async(self) -> Result<AsyncSubscriber, Error> {
        AsyncSubscriber::start(self.settings.checked()?).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorKind;
    #[cfg(feature = "nats")]
    use crate::settings::DEFAULT_NATS_GIVE_UP_AFTER;
    use crate::settings::{Checked, Transport};
    use crate::settings::{DEFAULT_RECEIVE_BUFFER, DEFAULT_RECONNECT_MAX};
    use crate::settings::{DEFAULT_RECOVERY_DELAY, DEFAULT_RECOVERY_LINGER, DEFAULT_RECOVERY_RETRY};
    use std::net::Ipv4Addr;

    impl Builder {
        fn checked(self) -> Result<Checked, Error> {
            self.settings.checked()
        }
    }

    fn setting(b: Builder) -> &'static str {
        match b.checked() {
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
        assert_eq!(nats().checked().unwrap().give_up_after, Some(DEFAULT_NATS_GIVE_UP_AFTER));
        assert_eq!(nats().give_up_after(ms(500)).checked().unwrap().give_up_after, Some(ms(500)));
        assert_eq!(setting(nats().give_up_after(ms(5))), "give_up_after");
        assert_eq!(Builder::tcp("h:1").checked().unwrap().give_up_after, None, "TCP tries for ever by default");
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
        assert_eq!(setting(Builder::multicast("239.1.1.1:5", "eth0")), "interface");
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
        let s = Builder::tcp("localhost:9100").checked().unwrap();
        assert_eq!(s.transport, Transport::Tcp("localhost:9100".into()));
        assert!(s.resume && !s.from_start && s.receive_buffer.is_none());
        assert_eq!((s.idle, s.busy_poll, s.reconnect_max), (IdleStrategy::Sleep, false, DEFAULT_RECONNECT_MAX));
        let s = Builder::multicast("239.255.0.1:9300", "127.0.0.1")
            .line_b("239.255.0.2:9300")
            .recovery("127.0.0.1:9101")
            .profile(Profile::LowLatency)
            .idle(IdleStrategy::Backoff)
            .checked()
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
