//! Messages counted by their IEX type byte.

use std::collections::BTreeMap;

/// A count per message type byte: an array, so counting is an increment on the hot path.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TypeCounts(Box<[u64; 256]>);

impl Default for TypeCounts {
    fn default() -> Self {
        TypeCounts(Box::new([0; 256]))
    }
}

impl TypeCounts {
    /// No messages counted.
    pub fn new() -> TypeCounts {
        TypeCounts::default()
    }

    /// Counts one message of type `kind`.
    #[inline]
    pub fn add(&mut self, kind: u8) {
        self.0[usize::from(kind)] += 1;
    }

    /// Counts `n` messages of type `kind`.
    pub fn add_many(&mut self, kind: u8, n: u64) {
        let count = &mut self.0[usize::from(kind)];
        *count = count.saturating_add(n);
    }

    /// The types seen, with their counts, in type order.
    pub fn seen(&self) -> impl Iterator<Item = (u8, u64)> + '_ {
        (0..=u8::MAX).zip(self.0.iter().copied()).filter(|(_, n)| *n > 0)
    }

    /// The types seen and their counts, keyed by type byte (as END totals carry them).
    pub fn by_byte(&self) -> BTreeMap<u8, u64> {
        self.seen().collect()
    }

    /// The types seen and their counts, keyed by the type byte as a character (as reports and
    /// the reference reader name them).
    pub fn by_name(&self) -> BTreeMap<String, u64> {
        self.seen().map(|(k, n)| (char::from(k).to_string(), n)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_come_out_keyed_by_byte_and_by_name() {
        let mut c = TypeCounts::new();
        for k in [b'T', b'8', b'T', 0xff] {
            c.add(k);
        }
        assert_eq!(c.by_byte(), [(b'8', 1), (b'T', 2), (0xff, 1)].into_iter().collect());
        assert_eq!(c.by_name().get("T"), Some(&2));
        assert_eq!(c.by_name().get("\u{ff}"), Some(&1));
    }
}
