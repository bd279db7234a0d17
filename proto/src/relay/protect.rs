//! Per-frame integrity and confidentiality on the wire: an optional CRC-32C, and optional
//! authenticated encryption (AES-256-GCM) under a pre-shared key.
//!
//! A protected frame is the codec's frame behind a 4-byte length and before its checks:
//!
//! ```text
//! [body length: u32 LE] [body: the frame, or its ciphertext] [tag: 16 bytes, if encrypted] [crc: u32 LE, if CRC]
//! ```
//!
//! - **Per frame, not per record or datagram.** A frame is sealed once, on the publisher's hot
//!   path, and the same bytes go to every TCP subscriber, every datagram line and the
//!   retransmission ring, whatever records or datagrams they are grouped into. Sealing per
//!   record would cost one pass per subscriber, and would need a nonce per record that differs
//!   between subscribers whose records group the frames differently.
//! - **Keys and nonces.** Each publisher session has its own key, derived from the pre-shared
//!   key and the session with HKDF-SHA256; a frame's 96-bit nonce is its sequence number (8
//!   bytes), its format id (1) and three zero bytes. So no counter has to be kept, and a
//!   (key, nonce) pair repeats only for the same frame of the same session and format, whose
//!   bytes are the same (a retransmission, or the other line of an A/B pair). A receiver
//!   rebuilds the key and nonce from the record or datagram header, so a header changed on the
//!   way (another sequence, another session, another format) fails authentication like a changed
//!   body does, and a frame replayed from an older session fails unless its header is replayed
//!   too (which the subscriber then refuses as an older session).
//! - **The CRC** covers the length and everything after it (the ciphertext and tag, when
//!   encrypted): a flipped bit is caught before the cipher is run, and without a key.
//! - **The key check** ([`Protector::key_check`]) is the first bytes of the session key's tag of
//!   an empty message under a nonce no frame uses: a greeting carries it so a subscriber with
//!   another key is told so at the handshake, not by every frame failing.
//!
//! Nothing here trusts the length: it is checked against the frame limit before anything is
//! copied, and a short or over-long protected frame is an error naming the offset.

use aes_gcm::aead::consts::U12;
use aes_gcm::aead::{AeadInPlace, KeyInit};
use aes_gcm::{Aes256Gcm, Tag};
use mdrelay_codec::Format;

/// A GCM nonce: 96 bits.
type Nonce = aes_gcm::Nonce<U12>;
use std::borrow::Cow;
use std::fmt;

/// Bytes of the length before the body.
pub const LEN_PREFIX: usize = 4;
/// Bytes of the authentication tag after an encrypted body.
pub const TAG_LEN: usize = 16;
/// Bytes of the CRC-32C at the end.
pub const CRC_LEN: usize = 4;
/// Bytes of a key.
pub const KEY_LEN: usize = 32;
/// Bytes of a greeting's key check.
pub const KEY_CHECK_LEN: usize = 4;

/// The nonce's format byte for an `END`'s totals: no format has this id.
const END_DOMAIN: u8 = 0xf0;

/// The nonce's format byte for a snapshot's frames: no format has this id either.
const SNAPSHOT_DOMAIN: u8 = 0xf1;

/// Frames one snapshot may have: their index takes the nonce's last three bytes.
pub const MAX_SNAPSHOT_FRAMES: u32 = 1 << 24;

/// HKDF's salt: separates the session keys from any other use of the pre-shared key.
const KDF_SALT: &[u8] = b"mdrelay wire protection v1";

/// What protects each frame; both off is the unprotected wire.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Protection {
    /// A CRC-32C after each frame.
    pub crc: bool,
    /// Authenticated encryption of each frame.
    pub encrypted: bool,
}

impl Protection {
    /// No protection.
    pub const NONE: Protection = Protection { crc: false, encrypted: false };
    const CRC_BIT: u8 = 1;
    const ENCRYPTED_BIT: u8 = 2;

    /// Whether frames are wrapped at all.
    pub const fn any(self) -> bool {
        self.crc || self.encrypted
    }

    /// Bytes added to each frame.
    pub const fn overhead(self) -> usize {
        if !self.any() {
            return 0;
        }
        LEN_PREFIX + if self.encrypted { TAG_LEN } else { 0 } + if self.crc { CRC_LEN } else { 0 }
    }

    /// The flag bits carried in greetings and datagram headers.
    pub const fn bits(self) -> u8 {
        (if self.crc { Protection::CRC_BIT } else { 0 }) | (if self.encrypted { Protection::ENCRYPTED_BIT } else { 0 })
    }

    /// The protection of flag bits from [`Protection::bits`]; `None` if other bits are set.
    pub const fn from_bits(bits: u8) -> Option<Protection> {
        if bits & !(Protection::CRC_BIT | Protection::ENCRYPTED_BIT) != 0 {
            return None;
        }
        Some(Protection { crc: bits & Protection::CRC_BIT != 0, encrypted: bits & Protection::ENCRYPTED_BIT != 0 })
    }
}

impl fmt::Display for Protection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match (self.crc, self.encrypted) {
            (false, false) => "none",
            (true, false) => "crc32c",
            (false, true) => "encrypted",
            (true, true) => "crc32c+encrypted",
        })
    }
}

/// A pre-shared key. Its `Debug` shows no byte of it.
#[derive(Clone, PartialEq, Eq)]
pub struct WireKey([u8; KEY_LEN]);

impl fmt::Debug for WireKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("WireKey(..)")
    }
}

/// The most bytes a key file may hold: the key's 64 hex digits and room for white space.
pub const MAX_KEY_FILE: usize = 1024;

/// Why a key file cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    /// The file cannot be read.
    #[error("key file {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// The file holds something else than a key.
    #[error(
        "key file {path}: {what}; it must hold 32 random bytes as 64 hex digits (e.g. `openssl rand -hex 32 > {path}`)"
    )]
    Malformed {
        /// The file.
        path: String,
        /// What is wrong.
        what: String,
    },
    /// Others than its owner can read the file.
    #[error("key file {path} can be read by others than its owner (mode {mode:o}): `chmod 600 {path}`")]
    Exposed {
        /// The file.
        path: String,
        /// Its permission bits.
        mode: u32,
    },
}

impl WireKey {
    /// A key of these bytes.
    pub const fn new(bytes: [u8; KEY_LEN]) -> WireKey {
        WireKey(bytes)
    }

    /// The key's bytes, for this crate's other uses of a key (message ids); never shown.
    pub(crate) const fn bytes(&self) -> &[u8; KEY_LEN] {
        &self.0
    }

    /// The key in `text`: 64 hex digits, surrounding whitespace ignored.
    pub fn parse_hex(text: &str) -> Result<WireKey, String> {
        let text = text.trim();
        if text.len() != 2 * KEY_LEN {
            return Err(format!("{} characters where 64 hex digits were expected", text.len()));
        }
        let mut key = [0u8; KEY_LEN];
        for (i, pair) in text.as_bytes().chunks_exact(2).enumerate() {
            let digits = std::str::from_utf8(pair).ok().and_then(|p| u8::from_str_radix(p, 16).ok());
            key[i] = digits.ok_or_else(|| format!("{:?} at character {} is not two hex digits", pair, 2 * i))?;
        }
        Ok(WireKey(key))
    }

    /// The key a key file holds, from what the caller read of it: its permission bits (`None`
    /// where the system has none) and its first bytes (at most [`MAX_KEY_FILE`] + 1 are
    /// needed to tell a key from something larger). A key file is 64 hex digits, readable by its
    /// owner only (as ssh insists of private keys: a key others can read protects nothing).
    /// Reading the file is the caller's: this crate does no I/O.
    pub fn from_key_file(path: &str, mode: Option<u32>, contents: &[u8]) -> Result<WireKey, KeyError> {
        let path = path.to_string();
        if let Some(mode) = mode.map(|mode| mode & 0o777)
            && mode & 0o077 != 0
        {
            return Err(KeyError::Exposed { path, mode });
        }
        if contents.len() > MAX_KEY_FILE {
            return Err(KeyError::Malformed { path, what: format!("over {MAX_KEY_FILE} bytes is no key") });
        }
        let text = std::str::from_utf8(contents)
            .map_err(|_| KeyError::Malformed { path: path.clone(), what: "not text".to_string() })?;
        WireKey::parse_hex(text).map_err(|what| KeyError::Malformed { path, what })
    }
}

/// `[protection]` in either program's configuration file. The key itself is never on the
/// command line (where `ps` shows it), only the file holding it, here.
#[derive(Debug, Clone, Default, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct ProtectionSection {
    /// A CRC-32C after every frame (default false).
    #[serde(default)]
    pub crc: bool,
    /// A file holding the pre-shared key (64 hex digits, mode 600): frames are encrypted and
    /// authenticated with it. Relative paths are from the working directory.
    pub key_file: Option<std::path::PathBuf>,
}

/// The protection settings, checked: the key read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProtectionSettings {
    /// A CRC-32C after every frame.
    pub crc: bool,
    /// The pre-shared key, if frames are encrypted.
    pub key: Option<WireKey>,
    /// Where the key came from, for messages.
    pub key_file: Option<std::path::PathBuf>,
}

impl From<&ProtectionSettings> for ProtectionSection {
    /// The section that gives these settings (the key by its file, never the key itself).
    fn from(settings: &ProtectionSettings) -> ProtectionSection {
        ProtectionSection { crc: settings.crc, key_file: settings.key_file.clone() }
    }
}

impl ProtectionSettings {
    /// What these settings apply.
    pub fn protection(&self) -> Protection {
        Protection { crc: self.crc, encrypted: self.key.is_some() }
    }

    /// A protector for these settings, refusing frames over `max_frame` bytes.
    pub fn protector(&self, max_frame: usize) -> Protector {
        Protector::new(self.crc, self.key.as_ref(), max_frame)
    }
}

/// Why a protected frame was refused. The frame is dropped and counted; the stream goes on.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ProtectError {
    /// The bytes end inside the protected frame, or its length is over the limit.
    #[error("protected frame: {what} at byte {offset}")]
    Malformed {
        /// Byte offset within the protected frame.
        offset: usize,
        /// What was wrong.
        what: Cow<'static, str>,
    },
    /// The CRC-32C does not match: the bytes changed on the way.
    #[error("protected frame: CRC-32C {found:#010x} where the bytes give {computed:#010x}")]
    Crc {
        /// The CRC carried.
        found: u32,
        /// The CRC of the bytes received.
        computed: u32,
    },
    /// Authentication failed: another key, another session or sequence than the header says
    /// (a replay, or a spoofed sender), or changed bytes.
    #[error("protected frame: authentication failed (another key, a replayed or forged frame, or changed bytes)")]
    Authentication,
}

/// Seals and opens frames under one [`Protection`] (and key, when encrypted). Holds no buffer:
/// sealing appends to the caller's, opening decrypts into the caller's.
#[derive(Clone)]
pub struct Protector {
    protection: Protection,
    key: Option<WireKey>,
    /// The last session's key: a publisher has one session, a subscriber sees a new one only
    /// when its publisher restarts, so one derivation per session.
    session_cipher: Option<(u64, Aes256Gcm)>,
    max_frame: usize,
}

impl fmt::Debug for Protector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Protector").field("protection", &self.protection).finish_non_exhaustive()
    }
}

impl Protector {
    /// A protector with a CRC if `crc`, and encryption under `key` if one is given; frames over
    /// `max_frame` bytes are refused.
    pub fn new(crc: bool, key: Option<&WireKey>, max_frame: usize) -> Protector {
        Protector {
            protection: Protection { crc, encrypted: key.is_some() },
            key: key.cloned(),
            session_cipher: None,
            max_frame,
        }
    }

    /// No protection: frames pass as they are.
    pub fn none() -> Protector {
        Protector { protection: Protection::NONE, key: None, session_cipher: None, max_frame: usize::MAX }
    }

    /// The protection applied.
    pub fn protection(&self) -> Protection {
        self.protection
    }

    fn nonce(sequence: u64, format: u8) -> Nonce {
        let mut n = [0u8; 12];
        n[..8].copy_from_slice(&sequence.to_le_bytes());
        n[8] = format;
        n.into()
    }

    /// The nonce of frame `index` of a snapshot as of frame `as_of`: the snapshot's domain byte
    /// and the index where a stream frame's nonce has its format and three zero bytes, so no
    /// snapshot frame shares a nonce with a stream frame, an `END` or another snapshot's frame.
    fn snapshot_nonce(as_of: u64, index: u32) -> Nonce {
        let mut n = [0u8; 12];
        n[..8].copy_from_slice(&as_of.to_le_bytes());
        n[8] = SNAPSHOT_DOMAIN;
        n[9..].copy_from_slice(&index.to_le_bytes()[..3]);
        n.into()
    }

    /// The cipher of `session`'s key, derived on the first use of each session.
    fn cipher(&mut self, session: u64) -> Option<&Aes256Gcm> {
        let key = self.key.as_ref()?;
        if self.session_cipher.as_ref().is_none_or(|(s, _)| *s != session) {
            let mut session_key = [0u8; KEY_LEN];
            // 32 bytes is far below HKDF-SHA256's 8,160-byte limit: expand cannot fail.
            let _ = hkdf::Hkdf::<sha2::Sha256>::new(Some(KDF_SALT), &key.0)
                .expand(&session.to_le_bytes(), &mut session_key);
            self.session_cipher = Some((session, Aes256Gcm::new((&session_key).into())));
        }
        self.session_cipher.as_ref().map(|(_, c)| c)
    }

    /// What a greeting carries so a subscriber can tell whether it holds the same key: the
    /// first bytes of the session key's tag of an empty message under a nonce no frame has
    /// (its format byte is 255). Zero when not encrypted.
    pub fn key_check(&mut self, session: u64) -> [u8; KEY_CHECK_LEN] {
        let Some(cipher) = self.cipher(session) else { return [0; KEY_CHECK_LEN] };
        let tag = cipher.encrypt_in_place_detached(&Nonce::from([0xff; 12]), b"key check", &mut []).unwrap_or_default();
        let mut check = [0u8; KEY_CHECK_LEN];
        check.copy_from_slice(&tag[..KEY_CHECK_LEN]);
        check
    }

    /// Appends `frame`, protected, to `out`. Unprotected, the frame is appended as it is.
    #[inline]
    pub fn seal(&mut self, session: u64, sequence: u64, format: Format, frame: &[u8], out: &mut Vec<u8>) {
        self.seal_nonce(session, Protector::nonce(sequence, format.id()), frame, out);
    }

    /// Appends an `END`'s totals (whose sequence is the next frame's), protected, to `out`: a
    /// nonce of its own, so a sender without the key cannot end a subscriber's stream.
    pub fn seal_end(&mut self, session: u64, next_sequence: u64, totals: &[u8], out: &mut Vec<u8>) {
        self.seal_nonce(session, Protector::nonce(next_sequence, END_DOMAIN), totals, out);
    }

    /// Opens an `END`'s totals sealed by [`Protector::seal_end`].
    pub fn open_end<'a>(
        &mut self,
        session: u64,
        next_sequence: u64,
        sealed: &'a [u8],
        scratch: &'a mut Vec<u8>,
    ) -> Result<&'a [u8], ProtectError> {
        self.open_nonce(session, Protector::nonce(next_sequence, END_DOMAIN), sealed, scratch)
    }

    /// Appends frame `index` (below [`MAX_SNAPSHOT_FRAMES`]) of a snapshot as of frame `as_of`,
    /// protected, to `out`, under a nonce of its own.
    pub fn seal_snapshot(&mut self, session: u64, as_of: u64, index: u32, frame: &[u8], out: &mut Vec<u8>) {
        self.seal_nonce(session, Protector::snapshot_nonce(as_of, index), frame, out);
    }

    /// Opens a snapshot frame sealed by [`Protector::seal_snapshot`].
    pub fn open_snapshot<'a>(
        &mut self,
        session: u64,
        as_of: u64,
        index: u32,
        sealed: &'a [u8],
        scratch: &'a mut Vec<u8>,
    ) -> Result<&'a [u8], ProtectError> {
        self.open_nonce(session, Protector::snapshot_nonce(as_of, index), sealed, scratch)
    }

    #[inline]
    fn seal_nonce(&mut self, session: u64, nonce: Nonce, frame: &[u8], out: &mut Vec<u8>) {
        if !self.protection.any() {
            out.extend_from_slice(frame);
            return;
        }
        let start = out.len();
        // Frames are limited far below 4 GiB (the codecs' limit is 16 MiB).
        out.extend_from_slice(&(frame.len() as u32).to_le_bytes());
        out.extend_from_slice(frame);
        let crc = self.protection.crc;
        if let Some(cipher) = self.cipher(session) {
            let body = &mut out[start + LEN_PREFIX..];
            // Fails only for a message over the cipher's 64 GiB limit.
            let tag = cipher.encrypt_in_place_detached(&nonce, &[], body).unwrap_or_default();
            out.extend_from_slice(&tag);
        }
        if crc {
            let crc = crc32c::crc32c(&out[start..]);
            out.extend_from_slice(&crc.to_le_bytes());
        }
    }

    /// The length of the protected frame at the start of `buf`; `None` while more bytes are
    /// needed; an error for a body over the frame limit (before anything is read past the
    /// length). Unprotected frames are delimited by their codec instead.
    #[inline]
    pub fn sealed_len(&self, buf: &[u8]) -> Result<Option<usize>, ProtectError> {
        let Some(prefix) = buf.first_chunk::<LEN_PREFIX>() else { return Ok(None) };
        let body = u32::from_le_bytes(*prefix) as usize;
        if body > self.max_frame {
            return Err(ProtectError::Malformed {
                offset: 0,
                what: format!("body of {body} bytes exceeds the {}-byte frame limit", self.max_frame).into(),
            });
        }
        let len = body + self.protection.overhead();
        Ok((buf.len() >= len).then_some(len))
    }

    /// Checks and opens one protected frame (exactly the bytes [`Protector::sealed_len`]
    /// delimited) of `session`, `sequence` and `format`: the frame itself, from `sealed` when
    /// only a CRC protects it, else decrypted into `scratch`.
    #[inline]
    pub fn open<'a>(
        &mut self,
        session: u64,
        sequence: u64,
        format: Format,
        sealed: &'a [u8],
        scratch: &'a mut Vec<u8>,
    ) -> Result<&'a [u8], ProtectError> {
        self.open_nonce(session, Protector::nonce(sequence, format.id()), sealed, scratch)
    }

    #[inline]
    fn open_nonce<'a>(
        &mut self,
        session: u64,
        nonce: Nonce,
        sealed: &'a [u8],
        scratch: &'a mut Vec<u8>,
    ) -> Result<&'a [u8], ProtectError> {
        if !self.protection.any() {
            return Ok(sealed);
        }
        let short = |what: &'static str| ProtectError::Malformed { offset: sealed.len(), what: what.into() };
        let Some(len) = self.sealed_len(sealed)? else { return Err(short("the bytes end inside the protected frame")) };
        if len != sealed.len() {
            return Err(ProtectError::Malformed {
                offset: len,
                what: format!("{} bytes after the protected frame", sealed.len() - len).into(),
            });
        }
        let mut covered = sealed;
        if self.protection.crc {
            let (rest, crc) = sealed.split_at(sealed.len() - CRC_LEN);
            let found = u32::from_le_bytes(crc.try_into().expect("4 bytes"));
            let computed = crc32c::crc32c(rest);
            if found != computed {
                return Err(ProtectError::Crc { found, computed });
            }
            covered = rest;
        }
        let body = &covered[LEN_PREFIX..];
        let Some(cipher) = self.cipher(session) else { return Ok(body) };
        let (ciphertext, tag) = body.split_at(body.len() - TAG_LEN);
        scratch.clear();
        scratch.extend_from_slice(ciphertext);
        cipher
            .decrypt_in_place_detached(&nonce, &[], scratch, Tag::from_slice(tag))
            .map_err(|_| ProtectError::Authentication)?;
        Ok(scratch)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(byte: u8) -> WireKey {
        WireKey::new([byte; KEY_LEN])
    }

    fn every_protection() -> Vec<Protector> {
        let k = key(7);
        vec![
            Protector::new(true, None, 1 << 20),
            Protector::new(false, Some(&k), 1 << 20),
            Protector::new(true, Some(&k), 1 << 20),
        ]
    }

    #[test]
    fn frames_round_trip_under_every_protection_and_unprotected_ones_pass_as_they_are() {
        let frame: Vec<u8> = (0..=255).collect();
        let mut scratch = Vec::new();
        for mut p in every_protection().into_iter().chain([Protector::none()]) {
            let mut out = vec![0xEE; 3];
            p.seal(9, 42, Format::Sbe, &frame, &mut out);
            let sealed = &out[3..];
            assert_eq!(sealed.len(), frame.len() + p.protection().overhead(), "{}", p.protection());
            if p.protection().any() {
                assert_eq!(p.sealed_len(sealed).unwrap(), Some(sealed.len()));
                for cut in 0..sealed.len() {
                    assert_eq!(p.sealed_len(&sealed[..cut]).unwrap(), None, "cut at {cut}");
                }
            }
            if p.protection().encrypted {
                assert!(!sealed.windows(16).any(|w| w == &frame[16..32]), "the body is not sent in the clear");
            }
            assert_eq!(p.open(9, 42, Format::Sbe, sealed, &mut scratch).unwrap(), frame);
        }
    }

    #[test]
    fn every_flipped_bit_is_caught_by_the_crc_or_the_tag() {
        let frame = b"a frame of some length, with bytes to flip".to_vec();
        let mut scratch = Vec::new();
        for mut p in every_protection() {
            let mut sealed = Vec::new();
            p.seal(1, 2, Format::Capnp, &frame, &mut sealed);
            for bit in 0..sealed.len() * 8 {
                let mut bad = sealed.clone();
                bad[bit / 8] ^= 1 << (bit % 8);
                let opened = match p.sealed_len(&bad) {
                    Ok(Some(len)) if len == bad.len() => {
                        p.open(1, 2, Format::Capnp, &bad, &mut scratch).map(<[u8]>::to_vec)
                    }
                    Ok(_) => continue,
                    Err(e) => Err(e),
                };
                assert!(opened.is_err(), "{}: bit {bit} went through", p.protection());
                if p.protection().crc && bit / 8 >= LEN_PREFIX {
                    assert!(matches!(opened, Err(ProtectError::Crc { .. })), "{}: bit {bit}", p.protection());
                }
            }
        }
    }

    #[test]
    fn another_key_session_sequence_or_format_fails_authentication() {
        let frame = b"price level update".to_vec();
        let mut sealer = Protector::new(false, Some(&key(1)), 1 << 20);
        let mut sealed = Vec::new();
        sealer.seal(100, 5, Format::FlatBuffers, &frame, &mut sealed);
        let mut scratch = Vec::new();
        let mut other_key = Protector::new(false, Some(&key(2)), 1 << 20);
        assert_eq!(
            other_key.open(100, 5, Format::FlatBuffers, &sealed, &mut scratch),
            Err(ProtectError::Authentication)
        );
        for (session, sequence, format) in
            [(99, 5, Format::FlatBuffers), (100, 6, Format::FlatBuffers), (100, 5, Format::Sbe)]
        {
            let opened = sealer.open(session, sequence, format, &sealed, &mut scratch);
            assert_eq!(opened, Err(ProtectError::Authentication), "{session} {sequence} {format}");
        }
        assert_eq!(sealer.open(100, 5, Format::FlatBuffers, &sealed, &mut scratch).unwrap(), frame);
    }

    #[test]
    fn the_key_check_tells_keys_apart_and_the_length_is_checked_before_reading() {
        let mut a = Protector::new(false, Some(&key(1)), 64);
        assert_eq!(a.key_check(3), Protector::new(true, Some(&key(1)), 64).key_check(3));
        assert_ne!(a.key_check(3), Protector::new(false, Some(&key(2)), 64).key_check(3));
        assert_ne!(a.key_check(3), a.key_check(4), "per session");
        assert_eq!(Protector::new(true, None, 64).key_check(3), [0; KEY_CHECK_LEN]);
        let huge = u32::MAX.to_le_bytes();
        assert!(matches!(a.sealed_len(&huge), Err(ProtectError::Malformed { offset: 0, .. })));
        let mut sealed = Vec::new();
        a.seal(1, 1, Format::Raw, &[1, 2, 3], &mut sealed);
        sealed.push(0);
        assert!(matches!(a.open(1, 1, Format::Raw, &sealed, &mut Vec::new()), Err(ProtectError::Malformed { .. })));
    }

    #[test]
    fn protection_bits_round_trip_and_unknown_bits_are_refused() {
        for crc in [false, true] {
            for encrypted in [false, true] {
                let p = Protection { crc, encrypted };
                assert_eq!(Protection::from_bits(p.bits()), Some(p));
            }
        }
        assert_eq!(Protection::from_bits(4), None);
    }

    #[test]
    fn key_files_must_be_64_hex_digits_readable_by_their_owner_only() {
        let key = format!("{}\n", "ab".repeat(32));
        let e = WireKey::from_key_file("wire.key", Some(0o100644), key.as_bytes()).unwrap_err().to_string();
        assert!(e.contains("chmod 600") && e.contains("wire.key"), "{e}");
        assert_eq!(
            WireKey::from_key_file("wire.key", Some(0o100600), key.as_bytes()).unwrap(),
            WireKey::new([0xab; KEY_LEN])
        );
        assert_eq!(WireKey::from_key_file("wire.key", None, key.as_bytes()).unwrap(), WireKey::new([0xab; KEY_LEN]));
        let e = WireKey::from_key_file("wire.key", Some(0o600), b"not a key").unwrap_err().to_string();
        assert!(e.contains("64 hex digits") && e.contains("openssl rand -hex 32"), "{e}");
        let e = WireKey::from_key_file("wire.key", Some(0o600), &[b'a'; MAX_KEY_FILE + 1]).unwrap_err().to_string();
        assert!(e.contains("over 1024 bytes"), "{e}");
        let e = WireKey::from_key_file("wire.key", Some(0o600), &[0xff; 64]).unwrap_err().to_string();
        assert!(e.contains("not text"), "{e}");
    }
}
