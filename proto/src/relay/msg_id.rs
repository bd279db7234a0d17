//! The ids a publisher gives its messages in a JetStream stream (`Nats-Msg-Id`), and what a
//! duplicate acknowledgement of one means, without I/O.
//!
//! JetStream stores one message per id within the stream's duplicate window and acknowledges
//! any later one as a duplicate without storing it. Ids that anyone could work out (the session
//! and a sequence number, which every message shows) let whoever may publish on the subject
//! take the ids of frames not yet published, and the stream then drops the real frames as
//! copies of the junk. So an id ends with a tag only a holder of the id key can make:
//! HMAC-SHA256, under the key, of a label, the session, the datagram's kind, its sequence and a
//! generation (docs/protocol.md, "NATS message ids", gives the bytes).
//!
//! The key is random for each run unless the operator gives one (`nats.id_key_file`): a run
//! then stores each message once however often it publishes it (a retry), and relays of one
//! origin that share a key store each of its frames once between them.
//!
//! A duplicate acknowledgement names the stream sequence of the message already stored under
//! the id. The publisher reads that message back and [`judge_duplicate`] tells its own copy (a
//! retry whose first acknowledgement was lost, or the same bytes from a relay sharing the key)
//! from another message holding the id ([`Duplicate::Taken`]); a taken message is published
//! again under the id of the next generation, which the other cannot know either.

use crate::relay::{DatagramHeader, DatagramKind, WireKey};
use hmac::{Hmac, Mac};
use sha2::Sha256;
use std::fmt;

/// Bytes of an id key.
pub const ID_KEY_LEN: usize = 32;

/// What the MAC of every id starts with: ids are not tags of any other use of the key.
pub const ID_LABEL: &[u8] = b"mdrelay nats message id v1";

/// Bytes of the MAC an id carries (as twice as many hex digits): 64 bits, which a publisher
/// without the key would have to guess by publishing, one guess a message.
pub const ID_TAG_LEN: usize = 8;

/// Makes the ids of one publisher's messages under its key.
#[derive(Clone)]
pub struct MessageIds {
    key: [u8; ID_KEY_LEN],
}

impl fmt::Debug for MessageIds {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("MessageIds(..)")
    }
}

impl MessageIds {
    /// Ids under `key` (the operator's, shared by the relays of one origin).
    pub fn new(key: [u8; ID_KEY_LEN]) -> MessageIds {
        MessageIds { key }
    }

    /// Ids under a key read from a key file (`nats.id_key_file`), as frame protection's are.
    pub fn keyed(key: &WireKey) -> MessageIds {
        MessageIds::new(*key.bytes())
    }

    /// The id of the message `datagram` in its `generation` (0 first, one more each time
    /// another message was found under the previous one); `None` for bytes that are not a
    /// datagram.
    pub fn of(&self, datagram: &[u8], generation: u32) -> Option<String> {
        DatagramHeader::parse(datagram).ok().map(|header| self.id(&header, generation))
    }

    /// The id of a datagram with `header` in its `generation`: the session as 16 hex digits,
    /// the first frame's sequence (`end` for an END), `.generation` past the first, and the tag
    /// as 16 hex digits, joined by `-`.
    pub fn id(&self, header: &DatagramHeader, generation: u32) -> String {
        let end = header.kind == DatagramKind::End;
        let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(&self.key).expect("HMAC takes a key of any length");
        mac.update(ID_LABEL);
        mac.update(&header.session.to_le_bytes());
        mac.update(&[header.kind as u8]);
        mac.update(&header.sequence.to_le_bytes());
        mac.update(&generation.to_le_bytes());
        let tag = mac.finalize().into_bytes();
        let mut id = format!("{:016x}-", header.session);
        if end {
            id.push_str("end");
        } else {
            id.push_str(&header.sequence.to_string());
        }
        if generation > 0 {
            id.push_str(&format!(".{generation}"));
        }
        id.push('-');
        for byte in &tag[..ID_TAG_LEN] {
            id.push_str(&format!("{byte:02x}"));
        }
        id
    }
}

/// Whose message a stream holds under an id that was acknowledged as a duplicate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Duplicate {
    /// The same bytes on the same subject: this message, stored before (a retry whose first
    /// acknowledgement was lost), or a relay of the same origin sharing the key. Nothing lost.
    Ours,
    /// Another message: whoever published it took the id, and this message is not stored.
    Taken,
}

/// Judges the message a stream holds under the id of `ours` (published to `subject`): the
/// stored message's subject and payload.
pub fn judge_duplicate(ours: &[u8], subject: &str, stored_subject: &str, stored: &[u8]) -> Duplicate {
    if subject == stored_subject && ours == stored { Duplicate::Ours } else { Duplicate::Taken }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::relay::DATAGRAM_VERSION;
    use mdrelay_codec::Format;

    fn header(kind: DatagramKind, session: u64, sequence: u64) -> DatagramHeader {
        DatagramHeader {
            version: DATAGRAM_VERSION,
            format: Format::Sbe,
            kind,
            frame_count: u32::from(kind == DatagramKind::Data),
            protection: Default::default(),
            session,
            sequence,
        }
    }

    #[test]
    fn an_id_names_the_session_and_sequence_and_ends_with_the_keys_tag() {
        let ids = MessageIds::new([7; ID_KEY_LEN]);
        let data = ids.id(&header(DatagramKind::Data, 0xab, 42), 0);
        let (named, tag) = data.rsplit_once('-').unwrap();
        assert_eq!(named, "00000000000000ab-42");
        assert_eq!(tag.len(), 2 * ID_TAG_LEN);
        assert!(tag.chars().all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase()), "{tag}");
        let end = ids.id(&header(DatagramKind::End, 0xab, 43), 0);
        assert!(end.starts_with("00000000000000ab-end-"), "{end}");
        assert!(ids.id(&header(DatagramKind::Data, 0xab, 42), 2).starts_with("00000000000000ab-42.2-"));
        assert!(ids.id(&header(DatagramKind::End, 0xab, 43), 1).starts_with("00000000000000ab-end.1-"));
        assert_eq!(ids.of(&header(DatagramKind::Data, 0xab, 42).to_bytes(), 0), Some(data));
        assert_eq!(ids.of(b"not a datagram", 0), None);
    }

    #[test]
    fn the_tag_is_the_documented_hmac() {
        // RFC 4231's first HMAC-SHA256 case, through the same construction: the key 20 bytes of
        // 0x0b and "Hi There" give b0344c61d8db3853..., so the code MACs exactly what it is given.
        let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(&[0x0b; 20]).unwrap();
        mac.update(b"Hi There");
        assert_eq!(&mac.finalize().into_bytes()[..8], &[0xb0, 0x34, 0x4c, 0x61, 0xd8, 0xdb, 0x38, 0x53]);
        // And an id's tag covers the label, session, kind, sequence and generation, in order.
        let key = [0x11; ID_KEY_LEN];
        let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(&key).unwrap();
        mac.update(ID_LABEL);
        mac.update(&5u64.to_le_bytes());
        mac.update(&[DatagramKind::Data as u8]);
        mac.update(&9u64.to_le_bytes());
        mac.update(&3u32.to_le_bytes());
        let tag: String = mac.finalize().into_bytes()[..8].iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(
            MessageIds::new(key).id(&header(DatagramKind::Data, 5, 9), 3),
            format!("0000000000000005-9.3-{tag}")
        );
    }

    #[test]
    fn the_examples_of_the_protocol_reference_are_these_ids() {
        // docs/protocol.md, "NATS message ids": the key of the bytes 0 to 31, session 0xab.
        let ids = MessageIds::new(std::array::from_fn(|i| i as u8));
        assert_eq!(ids.id(&header(DatagramKind::Data, 0xab, 42), 0), "00000000000000ab-42-743472c10b7d79a3");
        assert_eq!(ids.id(&header(DatagramKind::End, 0xab, 43), 0), "00000000000000ab-end-5667aa1caa1d47b0");
        assert_eq!(ids.id(&header(DatagramKind::Data, 0xab, 42), 1), "00000000000000ab-42.1-6804b488bfe7f9a9");
    }

    #[test]
    fn ids_differ_by_key_kind_sequence_session_and_generation() {
        let (a, b) = (MessageIds::new([1; ID_KEY_LEN]), MessageIds::new([2; ID_KEY_LEN]));
        let h = header(DatagramKind::Data, 1, 100);
        let base = a.id(&h, 0);
        assert_eq!(a.id(&h, 0), base, "one key, one id: a retry is stored once");
        for other in [
            b.id(&h, 0),
            a.id(&h, 1),
            a.id(&header(DatagramKind::Data, 1, 101), 0),
            a.id(&header(DatagramKind::Data, 2, 100), 0),
            a.id(&header(DatagramKind::End, 1, 100), 0),
        ] {
            assert_ne!(other, base);
        }
        let (one, other) = (MessageIds::new([1; ID_KEY_LEN]), MessageIds::new([2; ID_KEY_LEN]));
        assert_ne!(one.id(&h, 0), other.id(&h, 0), "each key its own ids");
        assert_eq!(format!("{a:?}"), "MessageIds(..)", "the key is not shown");
    }

    #[test]
    fn a_stored_copy_is_ours_only_with_the_same_subject_and_bytes() {
        assert_eq!(judge_duplicate(b"frames", "md.1", "md.1", b"frames"), Duplicate::Ours);
        assert_eq!(judge_duplicate(b"frames", "md.1", "md.1", b"junk"), Duplicate::Taken);
        assert_eq!(judge_duplicate(b"frames", "md.1", "md.2", b"frames"), Duplicate::Taken);
        assert_eq!(judge_duplicate(b"frames", "md.1", "md.1", b""), Duplicate::Taken);
    }
}
