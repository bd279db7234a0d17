//! Opening protected frames before anything else reads them: a record's or datagram's frames
//! are checked (CRC-32C) and decrypted (AES-256-GCM) into a plain copy with the same layout, so
//! the frame reader reads plain frames whatever the protection (ported from the subscriber). A datagram is opened
//! before its session and sequence are believed: a sender without the key cannot move the
//! stream's accounting.

use crate::relay::protect::{KEY_CHECK_LEN, ProtectError, Protection, Protector, WireKey};
use crate::relay::wire::{DatagramHeader, DatagramKind};
use mdrelay_codec::{DEFAULT_MAX_FRAME, Format};
use serde::Serialize;

/// What protection refused, by reason.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ProtectionCounts {
    /// Records or datagrams whose CRC-32C did not match, or (with a CRC) whose protected frames
    /// did not fit their payload: changed on the way.
    pub crc_failures: u64,
    /// Records or datagrams that failed authentication (another key, forged, or changed).
    pub authentication_failures: u64,
    /// Datagrams of a session older than the stream's (replayed), refused unread.
    pub replayed_datagrams: u64,
    /// Datagrams protected otherwise than this subscriber expects (an unprotected sender when a
    /// key is set, say), refused unread.
    pub mismatched_datagrams: u64,
    /// Frames in the records and datagrams refused (they show as gaps, and recovery asks for
    /// them where it is on).
    pub frames_refused: u64,
}

/// Opens records and datagrams under the subscriber's protection settings.
pub struct Unsealer {
    protector: Protector,
    /// A decrypted frame.
    scratch: Vec<u8>,
    /// The opened record payload or datagram.
    plain: Vec<u8>,
    /// The counts.
    pub counts: ProtectionCounts,
}

impl Unsealer {
    /// An unsealer expecting a CRC-32C if `crc`, and encryption under `key` if one is given.
    pub fn new(crc: bool, key: Option<&WireKey>) -> Unsealer {
        Unsealer {
            protector: Protector::new(crc, key, DEFAULT_MAX_FRAME),
            scratch: Vec::new(),
            plain: Vec::new(),
            counts: ProtectionCounts::default(),
        }
    }

    /// The protection expected.
    pub fn protection(&self) -> Protection {
        self.protector.protection()
    }

    /// The key check of `session` under this subscriber's key (zero without one).
    pub fn key_check(&mut self, session: u64) -> [u8; KEY_CHECK_LEN] {
        self.protector.key_check(session)
    }

    /// The length of the protected frame at the start of `bytes` (see [`Protector::sealed_len`]).
    pub fn sealed_len(&self, bytes: &[u8]) -> Result<Option<usize>, ProtectError> {
        self.protector.sealed_len(bytes)
    }

    /// One protected frame of `session`, `sequence` and `format`, checked and opened, without
    /// counting a refusal (a relay's reader treats one as a protocol violation).
    pub fn open_one<'a>(
        &'a mut self,
        session: u64,
        sequence: u64,
        format: Format,
        sealed: &'a [u8],
    ) -> Result<&'a [u8], ProtectError> {
        self.protector.open(session, sequence, format, sealed, &mut self.scratch)
    }

    fn refused(&mut self, e: &ProtectError, frames: u64) {
        // A protected frame whose length does not fit its payload was changed on the way too:
        // counted with what would have caught it had the length been whole.
        let crc = match e {
            ProtectError::Crc { .. } => true,
            ProtectError::Authentication => false,
            ProtectError::Malformed { .. } => self.protection().crc,
        };
        if crc {
            self.counts.crc_failures += 1;
        } else {
            self.counts.authentication_failures += 1;
        }
        self.counts.frames_refused += frames;
    }

    /// The plain frames of a record's or datagram's payload of `count` protected frames of
    /// `format`, the first numbered `first_sequence`, of `session`: checked and decrypted, back
    /// to back. Any frame failing refuses the whole payload (counted).
    pub fn frames<'a>(
        &'a mut self,
        session: u64,
        first_sequence: u64,
        format: Format,
        count: u64,
        bytes: &'a [u8],
    ) -> Result<&'a [u8], ProtectError> {
        if !self.protection().any() {
            return Ok(bytes);
        }
        let mut plain = std::mem::take(&mut self.plain);
        plain.clear();
        let opened = self.open_frames(session, first_sequence, format, count, bytes, &mut plain);
        self.plain = plain;
        opened.map(|()| self.plain.as_slice())
    }

    /// Appends the opened frames of `bytes` to `out`.
    fn open_frames(
        &mut self,
        session: u64,
        first_sequence: u64,
        format: Format,
        count: u64,
        bytes: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<(), ProtectError> {
        let mut rest = bytes;
        for i in 0..count {
            let opened = match self.protector.sealed_len(rest) {
                Ok(Some(len)) => self
                    .protector
                    .open(session, first_sequence.wrapping_add(i), format, &rest[..len], &mut self.scratch)
                    .map(|frame| {
                        out.extend_from_slice(frame);
                        len
                    }),
                Ok(None) => Err(ProtectError::Malformed {
                    offset: bytes.len() - rest.len(),
                    what: format!("the payload ends inside protected frame {i} of {count}").into(),
                }),
                Err(e) => Err(e),
            };
            match opened {
                Ok(len) => rest = &rest[len..],
                Err(e) => {
                    self.refused(&e, count);
                    return Err(e);
                }
            }
        }
        Ok(())
    }

    /// `d` with its frames (or its END totals) opened, its header kept, if its protection is
    /// this subscriber's and it opens; `current` is the stream's session so far. Refusals are
    /// counted; the error says why.
    pub fn datagram<'a>(
        &'a mut self,
        d: &'a [u8],
        header: &DatagramHeader,
        current: Option<u64>,
    ) -> Result<&'a [u8], String> {
        let expected = self.protection();
        if header.protection != expected {
            self.counts.mismatched_datagrams += 1;
            self.counts.frames_refused += u64::from(header.frame_count);
            return Err(format!("protected with {}, this subscriber expects {expected}", header.protection));
        }
        if !expected.any() || header.kind == DatagramKind::Echo {
            return Ok(d);
        }
        // Encrypted, a session is its start time: an older one is past, and its datagrams,
        // authentic as they are, are replays.
        if expected.encrypted
            && let Some(current) = current
            && header.session < current
        {
            self.counts.replayed_datagrams += 1;
            self.counts.frames_refused += u64::from(header.frame_count);
            return Err(format!("of session {:#x}, older than the stream's {current:#x}: replayed", header.session));
        }
        let payload = &d[header.len_on_wire()..];
        let mut plain = std::mem::take(&mut self.plain);
        plain.clear();
        plain.extend_from_slice(&d[..header.len_on_wire()]);
        let opened = match header.kind {
            DatagramKind::Data => {
                let count = u64::from(header.frame_count);
                self.open_frames(header.session, header.sequence, header.format, count, payload, &mut plain)
            }
            _ => match self.protector.open_end(header.session, header.sequence, payload, &mut self.scratch) {
                Ok(totals) => {
                    plain.extend_from_slice(totals);
                    Ok(())
                }
                Err(e) => {
                    self.refused(&e, 0);
                    Err(e)
                }
            },
        };
        self.plain = plain;
        match opened {
            Ok(()) => Ok(&self.plain),
            Err(e) => Err(e.to_string()),
        }
    }
}
