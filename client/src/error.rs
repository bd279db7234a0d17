//! What can go wrong, as a typed enum that says what to do ([`Error`]), and its kind for
//! programs that branch on it ([`ErrorKind`]).

use mdrelay_proto::relay::Protection;
use std::io;
use std::net::SocketAddr;

/// Why a subscriber could not be built or its stream ended without the publisher's end of
/// stream. Each error names the peer (or the local address, or the setting) it is about.
///
/// What to do, by kind:
/// - [`ErrorKind::WrongKey`], [`ErrorKind::ProtectionMismatch`]: give both sides the same
///   protection settings and key; another connection would get the same answer.
/// - [`ErrorKind::Version`]: use releases of the publisher and this library that share a
///   protocol version.
/// - [`ErrorKind::Refused`], [`ErrorKind::NotAPublisher`]: check the address (a retransmission
///   port, another program's port) or the publisher's logs for the reason given.
/// - [`ErrorKind::Unreachable`]: the publisher's name does not resolve, or no connection could
///   be made within [`Builder::give_up_after`](crate::Builder::give_up_after) (without it, a
///   publisher that is away is connected to again and again).
/// - [`ErrorKind::AddrInUse`], [`ErrorKind::Bind`]: another program (another subscriber?) holds
///   the port, or the address is not this host's.
/// - [`ErrorKind::Config`]: a setting is out of range or does not fit the transport.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The publisher encrypts its frames with another key than the one given.
    #[error("publisher {peer} encrypts with another key than this subscriber's: give both the same key")]
    WrongKey {
        /// The publisher.
        peer: SocketAddr,
    },
    /// The publisher protects its frames otherwise than this subscriber expects.
    #[error(
        "publisher {peer} protects its frames with {publisher} and this subscriber expects {subscriber}: configure the same protection (crc, key) on both"
    )]
    ProtectionMismatch {
        /// The publisher.
        peer: SocketAddr,
        /// The publisher's protection.
        publisher: Protection,
        /// What this subscriber was built to expect.
        subscriber: Protection,
    },
    /// The publisher speaks a relay protocol (or schema) version this library does not.
    #[error("publisher {peer}: {detail}")]
    Version {
        /// The publisher.
        peer: SocketAddr,
        /// The publisher's protocol version.
        protocol: u16,
        /// The publisher's schema version, where its greeting carries one.
        schema: Option<u16>,
        /// The whole explanation, with the versions this library speaks.
        detail: String,
    },
    /// The publisher refused the subscription, with its reason.
    #[error("{peer} refused the subscription: {reason}")]
    Refused {
        /// The publisher (or the service that refused).
        peer: SocketAddr,
        /// The reason it gave.
        reason: String,
    },
    /// The peer is not an mdrelay publisher: its first bytes are not a greeting.
    #[error("{peer} is not an mdrelay publisher: {detail}")]
    NotAPublisher {
        /// The peer.
        peer: SocketAddr,
        /// What was wrong, and at which byte.
        detail: String,
    },
    /// The publisher's address does not resolve, or no connection could be made within the
    /// limit set.
    #[error("{address}: {reason}")]
    Unreachable {
        /// The address as given to the builder.
        address: String,
        /// Why.
        reason: String,
    },
    /// A socket could not be bound to a local address (another program holds the port, or the
    /// address is not this host's).
    #[error("{setting}: cannot bind {address}: {source}")]
    Bind {
        /// The builder setting the address came from.
        setting: &'static str,
        /// The local address.
        address: SocketAddr,
        /// The system's error.
        source: io::Error,
    },
    /// A multicast group could not be joined on the interface given.
    #[error("{setting}: cannot join {group} on interface {interface}: {source}")]
    Join {
        /// The builder setting the group came from.
        setting: &'static str,
        /// The group.
        group: SocketAddr,
        /// The local interface.
        interface: std::net::Ipv4Addr,
        /// The system's error.
        source: io::Error,
    },
    /// A setting that cannot be used, named as the builder method that set it.
    #[error("{setting}: {reason}")]
    Config {
        /// The setting (the builder method's name).
        setting: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// The stream ended for a reason another connection would not mend.
    #[error("{peer}: {reason}")]
    Ended {
        /// The publisher.
        peer: String,
        /// Why.
        reason: String,
    },
    /// The system failed in a way none of the above covers (starting the runtime, a socket
    /// option).
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The system's error.
        source: io::Error,
    },
}

/// What kind of [`Error`] it is, for programs that branch on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// [`Error::WrongKey`].
    WrongKey,
    /// [`Error::ProtectionMismatch`].
    ProtectionMismatch,
    /// [`Error::Version`].
    Version,
    /// [`Error::Refused`].
    Refused,
    /// [`Error::NotAPublisher`].
    NotAPublisher,
    /// [`Error::Unreachable`].
    Unreachable,
    /// [`Error::Bind`] because another socket holds the address.
    AddrInUse,
    /// [`Error::Bind`] for another reason, or [`Error::Join`].
    Bind,
    /// [`Error::Config`].
    Config,
    /// [`Error::Ended`].
    Ended,
    /// [`Error::Io`].
    Io,
}

impl Error {
    /// The kind of error.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::WrongKey { .. } => ErrorKind::WrongKey,
            Error::ProtectionMismatch { .. } => ErrorKind::ProtectionMismatch,
            Error::Version { .. } => ErrorKind::Version,
            Error::Refused { .. } => ErrorKind::Refused,
            Error::NotAPublisher { .. } => ErrorKind::NotAPublisher,
            Error::Unreachable { .. } => ErrorKind::Unreachable,
            Error::Bind { source, .. } if source.kind() == io::ErrorKind::AddrInUse => ErrorKind::AddrInUse,
            Error::Bind { .. } | Error::Join { .. } => ErrorKind::Bind,
            Error::Config { .. } => ErrorKind::Config,
            Error::Ended { .. } => ErrorKind::Ended,
            Error::Io { .. } => ErrorKind::Io,
        }
    }

    /// The remote peer the error is about, when it is one the subscriber reached.
    pub fn peer(&self) -> Option<SocketAddr> {
        match self {
            Error::WrongKey { peer }
            | Error::ProtectionMismatch { peer, .. }
            | Error::Version { peer, .. }
            | Error::Refused { peer, .. }
            | Error::NotAPublisher { peer, .. } => Some(*peer),
            _ => None,
        }
    }

    /// The builder setting the error is about, for [`Error::Config`], [`Error::Bind`] and
    /// [`Error::Join`].
    pub fn setting(&self) -> Option<&'static str> {
        match self {
            Error::Config { setting, .. } | Error::Bind { setting, .. } | Error::Join { setting, .. } => Some(setting),
            _ => None,
        }
    }

    /// A configuration error of `setting`.
    pub(crate) fn config(setting: &'static str, reason: impl Into<String>) -> Error {
        Error::Config { setting, reason: reason.into() }
    }
}

#[cfg(test)]
mod tests {
    /// The variants of `enum name` in this file's source, in order.
    fn variants(source: &str, name: &str) -> Vec<String> {
        let start = source.find(&format!("pub enum {name} {{")).expect("the enum is in the source");
        let body = &source[start..];
        let body = &body[body.find('{').unwrap() + 1..body.find("\n}").unwrap()];
        body.lines()
            .map(str::trim)
            .filter(|line| line.chars().next().is_some_and(|c| c.is_ascii_uppercase()))
            .map(|line| line.split([',', ' ', '{', '(']).next().unwrap().to_string())
            .collect()
    }

    #[test]
    fn the_readme_explains_every_error_kind() {
        let kinds = variants(include_str!("error.rs"), "ErrorKind");
        assert!(kinds.len() >= 11 && kinds.contains(&"AddrInUse".to_string()), "parsed {kinds:?}");
        let readme = include_str!("../README.md");
        let rows: Vec<&str> = readme.lines().filter(|line| line.starts_with("| `")).collect();
        for kind in &kinds {
            assert!(
                rows.iter().any(|row| row.starts_with(&format!("| `{kind}` |"))),
                "README.md's error table has no row for ErrorKind::{kind}"
            );
        }
        let listed = rows.iter().filter(|row| kinds.iter().any(|k| row.starts_with(&format!("| `{k}` |")))).count();
        assert_eq!(listed, kinds.len(), "one row per kind");
    }
}
