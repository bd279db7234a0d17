//! The publisher's handshake on byte slices and a fake clock: every branch, the answer cut at
//! every offset, silence past the deadline, and any bytes at all without a panic.

use super::handshake::*;
use super::testing::bytes_and_cuts;
use crate::relay::protect::Protection;
use crate::relay::wire::{HandshakeError, Hello, Purpose, RecordHeader, RecordTag, Resume, Subscribe};
use mdrelay_codec::Format;
use proptest::prelude::*;
use std::time::Duration;

const S: i64 = 1_000_000_000;
const CRC: Protection = Protection { crc: true, encrypted: false };

fn hello() -> Hello {
    Hello::new(Format::Sbe, 0x5e55_1011, 1, 42)
}

fn config(serves: Purpose, protection: Protection) -> HandshakeConfig {
    HandshakeConfig { serves, protection, timeout: Duration::from_secs(2), setting: "tcp.handshake_timeout" }
}

fn stream_port() -> ServerHandshake {
    ServerHandshake::new(&hello(), config(Purpose::Stream, Protection::NONE), 10 * S)
}

/// Feeds `bytes` in pieces cut at `cuts`, as a driver reads: never more than `read_buf` offers.
/// Returns the bytes taken.
fn feed(hs: &mut ServerHandshake, bytes: &[u8], cuts: &[usize]) -> usize {
    let mut taken = 0;
    let mut start = 0;
    for end in cuts.iter().copied().chain([bytes.len()]) {
        while start < end {
            let room = hs.read_buf();
            if room.is_empty() {
                return taken;
            }
            let n = room.len().min(end - start);
            room[..n].copy_from_slice(&bytes[start..start + n]);
            hs.received(n);
            start += n;
            taken += n;
        }
    }
    taken
}

fn answer(resume: Resume, purpose: Purpose, protection: Protection) -> Vec<u8> {
    Subscribe { protocol_version: 2, echo: true, purpose, resume, protection, snapshot: false }.to_bytes()
}

fn refusal(hs: &ServerHandshake) -> Refusal {
    match hs.outcome() {
        Some(Err(r)) => r.clone(),
        other => panic!("not refused: {other:?}"),
    }
}

#[test]
fn greets_first_with_the_protection_and_key_check_it_was_given() {
    let hello = hello().protected(CRC, [1, 2, 3, 4]);
    let mut hs = ServerHandshake::new(&hello, config(Purpose::Stream, CRC), 0);
    assert_eq!(hs.transmit(), &hello.to_bytes()[..]);
    assert_eq!(Hello::parse(hs.transmit()).unwrap().key_check, [1, 2, 3, 4]);
    hs.transmitted(10);
    assert_eq!(hs.transmit(), &hello.to_bytes()[10..]);
    hs.transmitted(100);
    assert!(hs.transmit().is_empty());
    assert_eq!(hs.deadline(), Some(2 * S));
}

#[test]
fn a_version_2_answer_is_admitted_with_its_resume_point_and_echo_wish() {
    let mut hs = stream_port();
    let bytes = answer(Resume::From(7), Purpose::Stream, Protection::NONE);
    assert_eq!(feed(&mut hs, &bytes, &[]), Subscribe::V2_LEN);
    let subscribe = hs.outcome().unwrap().clone().unwrap();
    assert_eq!((subscribe.resume, subscribe.echo, subscribe.protocol_version), (Resume::From(7), true, 2));
    assert_eq!((hs.answer_len(), hs.deadline()), (Subscribe::V2_LEN, None));
    assert!(hs.read_buf().is_empty(), "nothing more is read once decided");
}

#[test]
fn a_version_1_answer_is_16_bytes_and_what_follows_it_is_not_read() {
    let mut hs = stream_port();
    let mut bytes = Subscribe::new(false).negotiated(1).to_bytes();
    assert_eq!(bytes.len(), Subscribe::LEN);
    bytes.extend([0xee; 40]);
    assert_eq!(feed(&mut hs, &bytes, &[]), Subscribe::LEN);
    let subscribe = hs.take_outcome().unwrap().unwrap();
    assert_eq!((subscribe.protocol_version, subscribe.resume, subscribe.echo), (1, Resume::Live, false));
    assert_eq!(hs.answer_len(), Subscribe::LEN);
}

#[test]
fn bad_magic_is_not_a_subscriber() {
    let mut hs = stream_port();
    let mut bytes = answer(Resume::Live, Purpose::Stream, Protection::NONE);
    bytes[..8].copy_from_slice(b"GET / HT");
    // Decided at 16 bytes: the rest is not waited for.
    assert_eq!(feed(&mut hs, &bytes, &[]), Subscribe::LEN);
    let r = refusal(&hs);
    assert!(matches!(r, Refusal::NotASubscriber(_)));
    assert!(r.to_string().contains("its first bytes are [47, 45, 54, 20"), "{r}");
}

#[test]
fn versions_too_old_and_too_new_are_refused_with_both_sides_named() {
    for version in [0u16, 3, u16::MAX] {
        let mut hs = stream_port();
        let mut bytes = answer(Resume::Live, Purpose::Stream, Protection::NONE);
        bytes[8..10].copy_from_slice(&version.to_le_bytes());
        feed(&mut hs, &bytes, &[]);
        let r = refusal(&hs);
        assert_eq!(r, Refusal::Version(HandshakeError::Version { protocol: version, schema: None }));
        let text = r.to_string();
        assert!(text.contains(&format!("version {version}")) && text.contains("versions 1 to 2"), "{text}");
    }
}

#[test]
fn a_malformed_field_of_a_version_2_answer_is_refused() {
    let mut hs = stream_port();
    let mut bytes = answer(Resume::Live, Purpose::Stream, Protection::NONE);
    bytes[12] = 9; // no such purpose
    feed(&mut hs, &bytes, &[]);
    assert!(refusal(&hs).to_string().contains("unknown connection purpose 9"));
}

#[test]
fn each_port_refuses_the_other_ports_clients() {
    let mut hs = stream_port();
    feed(&mut hs, &answer(Resume::Live, Purpose::Recovery, Protection::NONE), &[]);
    assert_eq!(refusal(&hs), Refusal::WrongPort { serves: Purpose::Stream });
    assert!(refusal(&hs).to_string().contains("retransmit.listen"));
    let mut hs = ServerHandshake::new(&hello(), config(Purpose::Recovery, Protection::NONE), 0);
    feed(&mut hs, &answer(Resume::Live, Purpose::Stream, Protection::NONE), &[]);
    assert_eq!(refusal(&hs), Refusal::WrongPort { serves: Purpose::Recovery });
    assert!(refusal(&hs).to_string().starts_with("this is the retransmission port"));
    // A version-1 answer is always for the stream: the retransmission port refuses it.
    let mut hs = ServerHandshake::new(&hello(), config(Purpose::Recovery, Protection::NONE), 0);
    feed(&mut hs, &Subscribe::new(false).negotiated(1).to_bytes(), &[]);
    assert_eq!(refusal(&hs), Refusal::WrongPort { serves: Purpose::Recovery });
}

#[test]
fn a_protection_mismatch_is_refused_naming_both_sides() {
    let encrypted = Protection { crc: false, encrypted: true };
    for (ours, theirs) in [(CRC, Protection::NONE), (Protection::NONE, CRC), (encrypted, CRC)] {
        let mut hs = ServerHandshake::new(&hello(), config(Purpose::Stream, ours), 0);
        feed(&mut hs, &answer(Resume::Live, Purpose::Stream, theirs), &[]);
        let r = refusal(&hs);
        assert_eq!(r, Refusal::ProtectionMismatch { ours, theirs });
        let text = r.to_string();
        assert!(text.contains(&ours.to_string()) && text.contains(&theirs.to_string()), "{text}");
    }
    let mut hs = ServerHandshake::new(&hello(), config(Purpose::Stream, CRC), 0);
    feed(&mut hs, &answer(Resume::Live, Purpose::Stream, CRC), &[]);
    assert!(matches!(hs.outcome(), Some(Ok(_))));
}

#[test]
fn an_answer_cut_at_every_offset_gives_the_same_outcome() {
    let whole = answer(Resume::From(99), Purpose::Stream, Protection::NONE);
    let mut expected = stream_port();
    feed(&mut expected, &whole, &[]);
    for a in 1..whole.len() {
        for b in a..whole.len() {
            let mut hs = stream_port();
            assert_eq!(feed(&mut hs, &whole, &[a, b]), whole.len());
            assert_eq!(hs.outcome(), expected.outcome(), "cut at {a} and {b}");
        }
    }
}

#[test]
fn an_answer_cut_off_by_the_peer_at_every_offset_is_refused_as_closed() {
    let whole = answer(Resume::Live, Purpose::Stream, Protection::NONE);
    for cut in 0..whole.len() {
        let mut hs = stream_port();
        feed(&mut hs, &whole[..cut], &[]);
        assert_eq!(hs.outcome(), None, "undecided at {cut}");
        hs.received(0);
        assert_eq!(refusal(&hs).to_string(), "connection closed during the handshake: early eof");
    }
    let mut hs = stream_port();
    hs.failed(&"Connection reset by peer (os error 104)");
    assert_eq!(
        refusal(&hs).to_string(),
        "connection closed during the handshake: Connection reset by peer (os error 104)"
    );
}

#[test]
fn silence_past_the_deadline_is_refused_and_not_before() {
    let mut hs = stream_port();
    feed(&mut hs, &answer(Resume::Live, Purpose::Stream, Protection::NONE)[..20], &[]);
    let deadline = hs.deadline().unwrap();
    assert_eq!(deadline, 12 * S);
    hs.on_timeout(deadline - 1);
    assert_eq!(hs.outcome(), None);
    hs.on_timeout(deadline);
    let r = refusal(&hs);
    assert_eq!(r.to_string(), "no answer to the greeting within 2s (tcp.handshake_timeout)");
    assert_eq!(hs.deadline(), None);
    // Decided: later bytes change nothing.
    hs.received(12);
    assert_eq!(refusal(&hs), r);
}

#[test]
fn busy_and_refusal_bytes_say_why() {
    let bytes = busy_greeting(&hello(), "at the limit");
    assert_eq!(Hello::parse(&bytes).unwrap(), hello());
    let header = RecordHeader::parse(&bytes[Hello::LEN..], 1 << 20).unwrap();
    assert_eq!((header.tag, header.format, header.sequence), (RecordTag::Busy, Format::Sbe, 42));
    assert_eq!(&bytes[Hello::LEN + RecordHeader::LEN..], b"at the limit");
    let refuse = refusal_record(Format::Capnp, "no");
    let header = RecordHeader::parse(&refuse, 1 << 20).unwrap();
    assert_eq!((header.tag, header.format, header.length), (RecordTag::Refuse, Format::Capnp, 2));
}

proptest! {
    /// Whatever a peer sends, in whatever pieces, the handshake takes at most one answer's
    /// bytes, decides at most once, and never panics.
    #[test]
    fn any_bytes_in_any_pieces_never_panic((mut bytes, cuts) in bytes_and_cuts(80), prefix in any::<bool>()) {
        if prefix {
            // Mostly well-formed: a real answer's start, so the later checks are reached.
            let real = answer(Resume::From(3), Purpose::Stream, Protection::NONE);
            let n = real.len().min(bytes.len());
            bytes[..n.min(10)].copy_from_slice(&real[..n.min(10)]);
        }
        let mut hs = stream_port();
        let taken = feed(&mut hs, &bytes, &cuts);
        prop_assert!(taken <= Subscribe::V2_LEN);
        if taken < bytes.len() {
            prop_assert!(hs.outcome().is_some());
        }
        hs.received(0);
        hs.on_timeout(i64::MAX);
        prop_assert!(hs.outcome().is_some());
    }
}
