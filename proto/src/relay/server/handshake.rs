//! The publisher's side of a TCP handshake, on the stream port and on the retransmission port:
//! the greeting to send, then the answer read and checked, within a deadline.
//!
//! The driver writes [`ServerHandshake::transmit`] (saying how much went with
//! [`ServerHandshake::transmitted`]), reads into [`ServerHandshake::read_buf`] and says how many
//! bytes came with [`ServerHandshake::received`] (0: the peer closed), and calls
//! [`ServerHandshake::on_timeout`] at [`ServerHandshake::deadline`], until
//! [`ServerHandshake::outcome`] is decided. `read_buf` is never longer than what the answer
//! still lacks (its first 16 bytes say its version and so its length), so nothing after the
//! answer (a request that follows at once) is read here.

use crate::backoff::duration_ns;
use crate::relay::protect::Protection;
use crate::relay::wire::{HandshakeError, Hello, Purpose, RecordTag, Subscribe, control_record};
use mdrelay_codec::Format;
use std::fmt;
use std::time::Duration;

/// What a port serves and how long its handshake may take.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HandshakeConfig {
    /// The purpose this port serves: an answer asking for the other is refused.
    pub serves: Purpose,
    /// The frames' protection: a subscriber expecting other protection is refused.
    pub protection: Protection,
    /// Time from the start of the handshake to the whole answer.
    pub timeout: Duration,
    /// The setting `timeout` comes from, for the refusal's text.
    pub setting: &'static str,
}

/// Why a handshake did not admit the peer; its text is the reason sent in the `REFUSE` record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// The answer is not a subscriber's answer (magic, a field out of range).
    NotASubscriber(String),
    /// An answer of a protocol version this build does not speak.
    Version(HandshakeError),
    /// The answer asks for what the other port serves.
    WrongPort {
        /// What this port serves.
        serves: Purpose,
    },
    /// The subscriber expects other frame protection than the publisher's.
    ProtectionMismatch {
        /// The publisher's.
        ours: Protection,
        /// The subscriber's.
        theirs: Protection,
    },
    /// No whole answer within the timeout.
    TimedOut {
        /// The timeout.
        timeout: Duration,
        /// Its setting.
        setting: &'static str,
    },
    /// The connection closed or failed before the answer was whole.
    Closed(String),
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::NotASubscriber(e) => write!(f, "not an mdrelay subscriber: {e}"),
            Refusal::Version(e) => write!(f, "{e}"),
            Refusal::WrongPort { serves: Purpose::Stream } => {
                f.write_str("this is the stream port; retransmission requests go to the port in retransmit.listen")
            }
            Refusal::WrongPort { serves: Purpose::Recovery } => {
                f.write_str("this is the retransmission port; subscribe to the stream on the publisher's TCP port")
            }
            Refusal::ProtectionMismatch { ours, theirs } => write!(
                f,
                "this publisher's frames are protected with {ours} and the subscriber expects {theirs}: configure the same [protection] (crc, key_file) on both"
            ),
            Refusal::TimedOut { timeout, setting } => {
                write!(f, "no answer to the greeting within {timeout:?} ({setting})")
            }
            Refusal::Closed(e) => write!(f, "connection closed during the handshake: {e}"),
        }
    }
}

impl Refusal {
    /// A refusal from a parse error of the answer.
    fn of(e: HandshakeError) -> Refusal {
        match e {
            HandshakeError::Malformed(e) => Refusal::NotASubscriber(e.to_string()),
            version => Refusal::Version(version),
        }
    }
}

/// The refusal of a subscriber expecting `theirs` by a publisher protecting with `ours`, if they
/// differ.
pub fn protection_mismatch(ours: Protection, theirs: Protection) -> Option<Refusal> {
    (ours != theirs).then_some(Refusal::ProtectionMismatch { ours, theirs })
}

/// The bytes told to a connection over the limit: the greeting, then a `BUSY` record with the
/// reason (named by the greeting's format and next frame).
pub fn busy_greeting(hello: &Hello, reason: &str) -> Vec<u8> {
    let mut bytes = hello.to_bytes().to_vec();
    bytes.extend(control_record(RecordTag::Busy, hello.format, hello.next_sequence, reason.as_bytes()));
    bytes
}

/// The `REFUSE` record telling a peer why it is refused.
pub fn refusal_record(format: Format, reason: &str) -> Vec<u8> {
    control_record(RecordTag::Refuse, format, 0, reason.as_bytes())
}

/// One handshake on the publisher's side.
#[derive(Debug)]
pub struct ServerHandshake {
    config: HandshakeConfig,
    greeting: [u8; Hello::LEN],
    sent: usize,
    answer: [u8; Subscribe::V2_LEN],
    have: usize,
    /// The answer's length once its version is known.
    want: usize,
    deadline: i64,
    outcome: Option<Result<Subscribe, Refusal>>,
}

impl ServerHandshake {
    /// A handshake begun at `now` that greets with `hello`.
    pub fn new(hello: &Hello, config: HandshakeConfig, now: i64) -> ServerHandshake {
        let deadline = now.saturating_add(duration_ns(config.timeout));
        ServerHandshake {
            config,
            greeting: hello.to_bytes(),
            sent: 0,
            answer: [0; Subscribe::V2_LEN],
            have: 0,
            want: Subscribe::LEN,
            deadline,
            outcome: None,
        }
    }

    /// The greeting's bytes not yet written.
    pub fn transmit(&self) -> &[u8] {
        &self.greeting[self.sent..]
    }

    /// `n` bytes of [`ServerHandshake::transmit`] were written.
    pub fn transmitted(&mut self, n: usize) {
        self.sent = (self.sent + n).min(Hello::LEN);
    }

    /// Where the next bytes of the answer go: no more than it still lacks, empty once decided.
    pub fn read_buf(&mut self) -> &mut [u8] {
        if self.outcome.is_some() {
            return &mut [];
        }
        &mut self.answer[self.have..self.want]
    }

    /// `n` bytes were read into [`ServerHandshake::read_buf`]; 0 means the peer closed. Bytes
    /// that come before the driver's timer fires count, however close to the deadline.
    pub fn received(&mut self, n: usize) {
        if self.outcome.is_some() {
            return;
        }
        if n == 0 {
            self.outcome = Some(Err(Refusal::Closed("early eof".into())));
            return;
        }
        self.have = (self.have + n).min(self.want);
        if self.have < self.want {
            return;
        }
        if self.want == Subscribe::LEN {
            match Subscribe::parse_version(&self.answer[..Subscribe::LEN]) {
                Ok(version) => self.want = Subscribe::len_of(version),
                Err(e) => {
                    self.outcome = Some(Err(Refusal::of(e)));
                    return;
                }
            }
            if self.have < self.want {
                return;
            }
        }
        self.outcome = Some(self.check());
    }

    /// Reading or writing failed with `error`: the handshake is over.
    pub fn failed(&mut self, error: &dyn fmt::Display) {
        if self.outcome.is_none() {
            self.outcome = Some(Err(Refusal::Closed(error.to_string())));
        }
    }

    /// The whole answer, checked: purpose first (a client at the wrong port), then protection.
    fn check(&self) -> Result<Subscribe, Refusal> {
        let subscribe = Subscribe::parse(&self.answer[..self.want]).map_err(Refusal::of)?;
        if subscribe.purpose != self.config.serves {
            return Err(Refusal::WrongPort { serves: self.config.serves });
        }
        if let Some(refusal) = protection_mismatch(self.config.protection, subscribe.protection) {
            return Err(refusal);
        }
        Ok(subscribe)
    }

    /// When the handshake times out, while it is undecided.
    pub fn deadline(&self) -> Option<i64> {
        self.outcome.is_none().then_some(self.deadline)
    }

    /// The time is `now`: past the deadline, an undecided handshake is refused.
    pub fn on_timeout(&mut self, now: i64) {
        if self.outcome.is_none() && now >= self.deadline {
            self.outcome = Some(Err(Refusal::TimedOut { timeout: self.config.timeout, setting: self.config.setting }));
        }
    }

    /// The answer (admitted) or the refusal, once decided.
    pub fn outcome(&self) -> Option<&Result<Subscribe, Refusal>> {
        self.outcome.as_ref()
    }

    /// Takes the outcome, once decided.
    pub fn take_outcome(&mut self) -> Option<Result<Subscribe, Refusal>> {
        self.outcome.take()
    }

    /// Bytes of the answer read: where the connection's next byte is.
    pub fn answer_len(&self) -> usize {
        self.have
    }
}
