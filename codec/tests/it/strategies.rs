//! Proptest strategies for messages and batches, shared by the codec tests (`formats`,
//! `json_codec`, `filtered_decode`).

use mdrelay_codec::BatchHeader;
use mdrelay_iex::Symbol;
use mdrelay_iex::message::*;
use proptest::prelude::*;

/// A message to generate: a known one, or an unknown type with its bytes.
#[derive(Clone, Debug)]
pub enum Spec {
    /// A message of a known type.
    Known(Message<'static>),
    /// An unknown type: its type byte, then its bytes.
    Unknown(Vec<u8>),
}

pub fn symbol() -> impl Strategy<Value = Symbol> {
    "[A-Z][A-Z.+-]{0,7}".prop_map(|s| Symbol::new(&s).unwrap())
}

/// A message of a known type with every field arbitrary but the symbol: its IEX layout of random
/// bytes, the symbol put in at its place (bytes 10..18 of every type but S), decoded by the model.
pub fn known() -> impl Strategy<Value = Message<'static>> {
    (proptest::sample::select(kind::ALL.to_vec()), any::<[u8; 80]>(), symbol()).prop_map(|(k, mut bytes, symbol)| {
        bytes[0] = k;
        if k != kind::SYSTEM_EVENT {
            bytes[10..18].copy_from_slice(&symbol.0);
        }
        let len = mdrelay_iex::message::layout_len(k).unwrap();
        // A known type's layout holds only fixed-width fields: every byte string of its length
        // is a message, and the message borrows nothing.
        Message::parse(&bytes[..len]).unwrap().to_static().unwrap()
    })
}

pub fn spec() -> impl Strategy<Value = Spec> {
    let unknown = (
        any::<u8>().prop_filter("not a known type", |k| mdrelay_iex::message::layout_len(*k).is_none()),
        proptest::collection::vec(any::<u8>(), 0..120),
    )
        .prop_map(|(k, mut rest)| {
            rest.insert(0, k);
            Spec::Unknown(rest)
        });
    prop_oneof![9 => known().prop_map(Spec::Known), 1 => unknown]
}

pub fn header() -> impl Strategy<Value = BatchHeader> {
    (any::<u16>(), any::<u32>(), any::<u32>(), any::<i64>(), any::<i64>(), any::<i64>()).prop_map(
        |(protocol_id, channel_id, session_id, first_sequence, send_time, publish_time)| BatchHeader {
            protocol_id,
            channel_id,
            session_id,
            first_sequence,
            message_count: 0,
            send_time,
            publish_time,
        },
    )
}

pub fn messages(specs: &[Spec]) -> Vec<Message<'_>> {
    specs
        .iter()
        .map(|s| match s {
            Spec::Known(m) => *m,
            Spec::Unknown(bytes) => Message::Unknown(UnknownMessage { kind: bytes[0], bytes }),
        })
        .collect()
}
