//! Per-symbol entries in a dense table, found by symbol: the shape both the aggregates and the
//! books keep their state in.
//!
//! A small direct-mapped cache sits in front of the hash map: the symbols that trade and quote at
//! any moment are few (20 in a day of DEEP), and one multiply and compare finds them, where a
//! hash map probe costs several times that on every message.

use crate::price::Symbol;
use rustc_hash::FxHashMap;

/// Entries in the direct-mapped symbol cache in front of the hash map.
const CACHE: usize = 256;
/// A cache entry's slot when it holds nothing.
const NO_SLOT: u32 = u32::MAX;

/// One `T` per symbol seen, in the order the symbols were first seen.
#[derive(Clone, Debug)]
pub(crate) struct SymbolTable<T> {
    slots: FxHashMap<Symbol, u32>,
    entries: Vec<(Symbol, T)>,
    cache: Box<[(u64, u32); CACHE]>,
}

impl<T> Default for SymbolTable<T> {
    fn default() -> Self {
        SymbolTable { slots: FxHashMap::default(), entries: Vec::new(), cache: Box::new([(0, NO_SLOT); CACHE]) }
    }
}

impl<T> SymbolTable<T> {
    /// The symbol's entry, made with `new` when the symbol is first seen.
    #[inline(always)]
    pub fn entry(&mut self, symbol: Symbol, new: impl FnOnce() -> T) -> &mut T {
        let key = u64::from_le_bytes(symbol.0);
        // Fibonacci hashing: the top bits of the product spread similar tickers apart.
        let line = (key.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - CACHE.trailing_zeros())) as usize;
        let (cached, slot) = self.cache[line];
        let slot = if cached == key && slot != NO_SLOT { slot } else { self.slot_slow(symbol, line, new) };
        &mut self.entries[slot as usize].1
    }

    #[cold]
    #[inline(never)]
    fn slot_slow(&mut self, symbol: Symbol, line: usize, new: impl FnOnce() -> T) -> u32 {
        let next = self.entries.len() as u32;
        let slot = *self.slots.entry(symbol).or_insert(next);
        if slot == next {
            self.entries.push((symbol, new()));
        }
        self.cache[line] = (u64::from_le_bytes(symbol.0), slot);
        slot
    }

    /// The symbol's entry, if it was seen.
    pub fn get(&self, symbol: &Symbol) -> Option<&T> {
        self.slots.get(symbol).map(|&slot| &self.entries[slot as usize].1)
    }

    /// Every entry, in the order the symbols were first seen.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = &(Symbol, T)> {
        self.entries.iter()
    }

    /// How many symbols were seen.
    pub fn len(&self) -> usize {
        self.entries.len()
    }
}
