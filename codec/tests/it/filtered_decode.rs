//! Filter before decode: in every format, a filtered decode visits exactly the messages of the
//! filter's symbols, in order, and hands every other message's type byte to `skip`, in order; on
//! the real captures it gives the reference's figures for the filtered symbols and counts every
//! message of every type.

use mdrelay_codec::FormatCodec;
use mdrelay_codec::{Codec, Limits, SymbolFilter};
use mdrelay_harness::{expected, formats, iex_data};
use mdrelay_iex::inspect::InspectReport;
use mdrelay_iex::message::Message;
use mdrelay_iex::{Aggregator, Symbol};
use proptest::prelude::*;
use std::collections::BTreeMap;

use crate::strategies::{header, messages, spec, symbol};

/// What a decode saw, in order: a visited message (its Debug text) or a skipped type byte.
#[derive(Debug, PartialEq)]
enum Seen {
    Visited(String),
    Skipped(u8),
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn a_filtered_decode_visits_the_filters_symbols_and_skips_the_rest_in_order(
        header in header(),
        specs in proptest::collection::vec(spec(), 0..60),
        picks in proptest::collection::vec(any::<prop::sample::Index>(), 0..4),
        stranger in symbol(),
    ) {
        let messages = messages(&specs);
        let symbols: Vec<Symbol> = messages.iter().filter_map(Message::symbol).collect();
        let mut chosen: Vec<Symbol> = picks.iter().filter(|_| !symbols.is_empty()).map(|i| symbols[i.index(symbols.len())]).collect();
        chosen.push(stranger);
        let filter = SymbolFilter::new(chosen);
        let expected: Vec<Seen> = messages
            .iter()
            .map(|m| if filter.matches_message(m) { Seen::Visited(format!("{m:?}")) } else { Seen::Skipped(m.kind()) })
            .collect();
        for format in formats() {
            let mut codec = Codec::new(format, Limits::default());
            let mut frame = Vec::new();
            codec.encode(&header, &messages, &mut frame).unwrap();
            let seen = std::cell::RefCell::new(Vec::new());
            let decoded = codec
                .decode_filtered(
                    &frame,
                    &filter,
                    |m| seen.borrow_mut().push(Seen::Visited(format!("{m:?}"))),
                    |k| seen.borrow_mut().push(Seen::Skipped(k)),
                )
                .unwrap_or_else(|e| panic!("{format}: {e}"));
            prop_assert_eq!(&seen.into_inner(), &expected, "{}", format);
            let full = codec.decode(&frame, |_| {}).unwrap();
            prop_assert_eq!(decoded, full, "{}: the header", format);
        }
    }
}

#[test]
fn the_real_captures_filtered_to_a_few_symbols_give_the_references_figures_for_them() {
    for (capture, reference) in [("DEEP10.pcap.gz", "DEEP10.json"), ("TOPS16.pcap.gz", "TOPS16.json")] {
        let reference = expected(reference);
        let symbols = reference["symbols"].as_object().expect("the reference lists its symbols");
        // The busiest symbol, the first and the last: the filter holds three, as a desk's would.
        let busiest = symbols.iter().max_by_key(|(_, s)| s["trades"].as_u64().unwrap_or(0)).unwrap().0;
        let names: Vec<&String> = [busiest, symbols.keys().next().unwrap(), symbols.keys().next_back().unwrap()].into();
        let filter = SymbolFilter::new(names.iter().map(|n| Symbol::new(n).unwrap()));
        for format in formats() {
            let context = format!("{capture} through {format} filtered to {names:?}");
            let aggregator = std::cell::RefCell::new(Aggregator::new());
            let types = std::cell::RefCell::new(BTreeMap::<String, u64>::new());
            let count = |k: u8| *types.borrow_mut().entry(char::from(k).to_string()).or_insert(0) += 1;
            crate::each_frame(
                &iex_data().join(capture),
                &mut Codec::new(format, Limits::default()),
                |codec, _, frame| {
                    let visit = |m: &Message<'_>| {
                        count(m.kind());
                        aggregator.borrow_mut().apply(m);
                    };
                    codec.decode_filtered(frame, &filter, visit, count).unwrap_or_else(|e| panic!("{context}: {e}"));
                },
            );
            let report = InspectReport { symbols: aggregator.borrow().active(), ..InspectReport::default() };
            let report = serde_json::to_value(&report).unwrap();
            let active = report["symbols"].as_object().expect("the report lists its symbols");
            assert_eq!(active.len(), names.len(), "{context}: every filtered symbol, no other");
            for name in &names {
                assert_eq!(active[name.as_str()], symbols[name.as_str()], "{context}: {name}");
            }
            // Every message counted by its type, filtered out or not.
            assert_eq!(serde_json::json!(*types.borrow()), reference["message_types"], "{context}");
        }
    }
}
