//! What a subscriber sends back, on byte slices: echoes whole and cut at every offset, and
//! anything else refused, without a panic whatever the bytes.

use super::echoes::*;
use crate::relay::wire::{Echo, RecordHeader, RecordTag, control_record};
use mdrelay_codec::Format;
use proptest::prelude::*;

fn echo(sequence: u64) -> Echo {
    Echo { sequence, publish_time: 1_000 + sequence as i64 }
}

fn echo_record(e: Echo) -> Vec<u8> {
    control_record(RecordTag::Echo, Format::Raw, e.sequence, &e.to_bytes())
}

#[test]
fn echoes_cut_at_every_offset_come_out_whole_and_once() {
    let mut bytes = echo_record(echo(1));
    bytes.extend(echo_record(echo(2)));
    for cut in 0..=bytes.len() {
        let mut reader = EchoReader::new();
        let mut seen = Vec::new();
        reader.received(&bytes[..cut], |e| seen.push(e)).unwrap();
        assert!(reader.pending() < ECHO_RECORD, "at most a partial record is kept");
        reader.received(&bytes[cut..], |e| seen.push(e)).unwrap();
        assert_eq!(seen, [echo(1), echo(2)], "cut at {cut}");
        assert_eq!(reader.pending(), 0);
    }
}

#[test]
fn anything_but_an_echo_is_a_violation_once_its_header_is_in() {
    let mut reader = EchoReader::new();
    let data = control_record(RecordTag::Data, Format::Sbe, 1, &[0; 16]);
    // The header alone is enough to refuse it.
    let why = reader.received(&data[..RecordHeader::LEN], |_| panic!("not an echo")).unwrap_err();
    assert_eq!(why, "a subscriber sends only ECHO records, this one sent Data of 16 bytes");
    let mut reader = EchoReader::new();
    let short = control_record(RecordTag::Echo, Format::Raw, 1, &[0; 8]);
    assert!(reader.received(&short, |_| {}).unwrap_err().contains("sent Echo of 8 bytes"));
    let mut reader = EchoReader::new();
    let why = reader.received(&[0xff; RecordHeader::LEN], |_| {}).unwrap_err();
    assert!(why.starts_with("bad record from the subscriber"), "{why}");
    // Echoes before the violation were handed on.
    let mut reader = EchoReader::new();
    let mut bytes = echo_record(echo(5));
    bytes.extend(&data);
    let mut seen = Vec::new();
    assert!(reader.received(&bytes, |e| seen.push(e)).is_err());
    assert_eq!(seen, [echo(5)]);
}

proptest! {
    /// Any bytes in any two pieces: never a panic, never more than a partial record kept.
    #[test]
    fn any_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..200), cut in 0usize..200, echo_tag in any::<bool>()) {
        let mut bytes = bytes;
        if echo_tag && !bytes.is_empty() {
            bytes[0] = RecordTag::Echo as u8;
        }
        let cut = cut.min(bytes.len());
        let mut reader = EchoReader::new();
        if reader.received(&bytes[..cut], |_| {}).is_ok() {
            prop_assert!(reader.pending() < ECHO_RECORD);
            let _ = reader.received(&bytes[cut..], |_| {});
        }
    }
}
