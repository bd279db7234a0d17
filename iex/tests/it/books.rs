//! Book state from the real DEEP capture equals the independent reference reader's
//! (`iexbook.py`): every symbol's levels, status and last trade, at the end of the capture and
//! part-way through it; and once every symbol's book has been as deep as it gets, applying
//! messages allocates nothing.

use mdrelay_harness::alloc::count_allocations;
use mdrelay_harness::{assert_books_match, expected, iex_data};
use mdrelay_iex::book::Books;
use mdrelay_iex::capture::CaptureReader;
use mdrelay_iex::iextp::Segment;
use mdrelay_iex::link;
use mdrelay_iex::message::Message;

/// The capture's messages applied in capture order, as the reference applies them: every
/// message block counts, and with `after`, applying stops after that many.
fn books_of(capture: &str, after: Option<u64>) -> Books {
    let mut books = Books::new();
    let mut reader = CaptureReader::open(iex_data().join(capture)).unwrap();
    let mut blocks = 0u64;
    while let Some(packet) = reader.next_packet().unwrap() {
        let Ok(datagram) = link::udp_datagram(packet.link_type, packet.data) else { continue };
        let Ok(segment) = Segment::parse(datagram.payload) else { continue };
        for block in segment.blocks() {
            if after.is_some_and(|n| blocks >= n) {
                return books;
            }
            let Ok(bytes) = block else { break };
            blocks += 1;
            let message = Message::parse(bytes).unwrap();
            books.apply(&message);
        }
    }
    books
}

fn check(books: &Books, reference: &str) {
    let ours = serde_json::to_value(books.to_reference_json("DEEP10.pcap.gz")).unwrap();
    let reference = expected(reference);
    assert_books_match(&ours, &reference, reference_name(&reference));
    assert_eq!(ours["messages_applied"], reference["messages_applied"]);
    assert_eq!(ours["file"], reference["file"]);
}

fn reference_name(reference: &serde_json::Value) -> &str {
    reference["file"].as_str().unwrap_or("the reference")
}

#[test]
fn deep10_books_at_the_end_equal_the_reference() {
    check(&books_of("DEEP10.pcap.gz", None), "DEEP10.book.json");
}

#[test]
fn deep10_books_after_200000_messages_equal_the_reference() {
    check(&books_of("DEEP10.pcap.gz", Some(200_000)), "DEEP10.book-after-200000.json");
}

#[test]
fn a_third_pass_over_the_day_allocates_nothing() {
    let mut payloads = Vec::new();
    let mut reader = CaptureReader::open(iex_data().join("DEEP10.pcap.gz")).unwrap();
    while let Some(packet) = reader.next_packet().unwrap() {
        if let Ok(datagram) = link::udp_datagram(packet.link_type, packet.data) {
            payloads.push(datagram.payload.to_vec());
        }
    }
    let apply_all = |books: &mut Books| {
        for payload in &payloads {
            let Ok(segment) = Segment::parse(payload) else { continue };
            for block in segment.blocks().flatten() {
                if let Ok(message) = Message::parse(block) {
                    books.apply(&message);
                }
            }
        }
    };
    let mut books = Books::new();
    apply_all(&mut books);
    let levels: usize = books.iter().map(|(_, b)| b.bids().len() + b.asks().len()).sum();
    assert!(levels > 500, "the day leaves books to keep: {levels} levels");
    // The day again, from the books it left: they may grow deeper than the first pass made them.
    apply_all(&mut books);
    // Once more: every level it sets was set (and its room made) in the passes before.
    let ((), allocations) = count_allocations(|| apply_all(&mut books));
    assert_eq!(allocations.count, 0, "{allocations:?}");
}

#[test]
fn the_memory_the_docs_state_per_symbol_and_per_level_holds() {
    // book.rs and docs/operations.md: about 350 bytes a symbol (its entry, its map slot), 16 a
    // level.
    let entry = std::mem::size_of::<(mdrelay_iex::Symbol, mdrelay_iex::SymbolBook)>();
    let slot = std::mem::size_of::<(mdrelay_iex::Symbol, u32)>() + 1;
    assert!(entry + slot <= 350, "{entry} + {slot} bytes a symbol");
    assert_eq!(std::mem::size_of::<mdrelay_iex::Level>(), 16);
}

#[test]
fn the_state_of_a_synthetic_day_of_10000_symbols_stays_within_the_stated_bound() {
    use mdrelay_iex::synth::{SynthConfig, SyntheticDay};
    use mdrelay_iex::{Aggregator, Symbol, SymbolAggregate, SymbolBook};
    let config = SynthConfig { messages: 1_000_000, symbols: 10_000, ..SynthConfig::default() };
    let mut day = SyntheticDay::new(config).unwrap();
    let (mut books, mut aggregates) = (Books::new(), Aggregator::new());
    while let Some(segment) = day.next_segment() {
        for block in Segment::parse(segment.bytes).unwrap().blocks() {
            let message = Message::parse(block.unwrap()).unwrap();
            books.apply(&message);
            aggregates.apply(&message);
        }
    }
    assert_eq!(books.len(), 10_000, "every symbol has state");
    let levels: usize = books.iter().map(|(_, b)| b.bids().len() + b.asks().len()).sum();
    // A symbol's book entry and map slot, its aggregates' entry and slot; a level 16 bytes, twice
    // over for what a growing vector may hold unused.
    let slot = std::mem::size_of::<(Symbol, u32)>() + 1;
    let per_symbol =
        std::mem::size_of::<(Symbol, SymbolBook)>() + std::mem::size_of::<(Symbol, SymbolAggregate)>() + 2 * slot;
    let held = books.len() * per_symbol + levels * 2 * std::mem::size_of::<mdrelay_iex::Level>();
    // docs/operations.md: the synthetic day at 10,000 symbols keeps under 12 MiB of state (8.0 MB
    // counted here: 120,381 levels).
    assert!(held < 12 << 20, "{} symbols, {levels} levels: {held} bytes", books.len());
}
