//! The subscriber's symbol filter, as the decoders apply it: on the symbol's 8 bytes, read before
//! the rest of the message so that messages of other symbols cost as little as the format allows.

use mdrelay_iex::message::Message;
use mdrelay_iex::price::Symbol;

/// A set of symbols; a filtered decode visits only their messages.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SymbolFilter {
    /// The symbols' bytes as little-endian integers, sorted and without repeats: one integer
    /// comparison per symbol tried instead of a byte-slice comparison.
    keys: Vec<u64>,
}

impl SymbolFilter {
    /// A filter holding `symbols` (repeats are fine).
    pub fn new(symbols: impl IntoIterator<Item = Symbol>) -> SymbolFilter {
        let mut keys: Vec<u64> = symbols.into_iter().map(|s| u64::from_le_bytes(s.0)).collect();
        keys.sort_unstable();
        keys.dedup();
        SymbolFilter { keys }
    }

    /// The symbols, sorted.
    pub fn symbols(&self) -> impl Iterator<Item = Symbol> + '_ {
        self.keys.iter().map(|k| Symbol(k.to_le_bytes()))
    }

    /// Whether the symbol with these (space-padded) bytes is in the filter.
    #[inline]
    pub fn matches(&self, symbol: [u8; 8]) -> bool {
        let key = u64::from_le_bytes(symbol);
        // A filter holds one or a few symbols: a scan beats a binary search up to about eight.
        if self.keys.len() <= 8 { self.keys.contains(&key) } else { self.keys.binary_search(&key).is_ok() }
    }

    /// Whether `message` has a symbol and it is in the filter.
    #[inline]
    pub fn matches_message(&self, message: &Message<'_>) -> bool {
        message.symbol().is_some_and(|s| self.matches(s.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_exactly_its_symbols_however_many() {
        for n in [1usize, 3, 8, 9, 40] {
            let names: Vec<String> = (0..n).map(|i| format!("S{i}")).collect();
            let filter = SymbolFilter::new(names.iter().chain(names.iter()).map(|s| Symbol::new(s).unwrap()));
            assert_eq!(filter.symbols().count(), n);
            for name in &names {
                assert!(filter.matches(Symbol::new(name).unwrap().0), "{name} of {n}");
            }
            assert!(!filter.matches(Symbol::new("ZZZZ").unwrap().0));
            assert!(!filter.matches(Symbol::new("S").unwrap().0), "a prefix is another symbol");
        }
        assert!(!SymbolFilter::new([]).matches(Symbol::new("A").unwrap().0));
    }
}
