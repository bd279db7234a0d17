//! Fixed-point prices and space-padded symbols, the two value types every IEX message carries.

use std::fmt;

/// A price as IEX sends it: a signed integer with 4 implied decimal places ($1 = 10,000).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
#[serde(transparent)]
#[repr(transparent)]
pub struct Price(pub i64);

impl Price {
    /// Units of the raw integer per dollar.
    pub const SCALE: i64 = 10_000;

    /// The price from whole cents (used by the synthetic generator).
    pub const fn from_cents(cents: i64) -> Price {
        Price(cents * 100)
    }
}

impl fmt::Display for Price {
    /// Prints dollars with all four decimals, e.g. `50.0500` or `-0.0001`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let sign = if self.0 < 0 { "-" } else { "" };
        let abs = self.0.unsigned_abs();
        let scale = Price::SCALE as u64;
        write!(f, "{sign}{}.{:04}", abs / scale, abs % scale)
    }
}

/// A ticker symbol: 8 ASCII bytes, padded on the right with spaces, exactly as on the wire.
///
/// Ordering is byte-wise on the padded form, which for printable ASCII is the same order as
/// comparing the trimmed strings (space sorts before every printable character).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
#[repr(transparent)]
pub struct Symbol(pub [u8; 8]);

impl std::hash::Hash for Symbol {
    /// One u64 write: the derived hash of a byte array also hashes its length and goes byte-wise,
    /// which costs more than the map lookup it feeds on the aggregation hot path.
    #[inline]
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        state.write_u64(u64::from_le_bytes(self.0));
    }
}

impl Symbol {
    /// The symbol for `text`, padded with spaces; `None` if it is longer than 8 bytes or not ASCII.
    pub fn new(text: &str) -> Option<Symbol> {
        if text.len() > 8 || !text.is_ascii() {
            return None;
        }
        let mut bytes = [b' '; 8];
        bytes[..text.len()].copy_from_slice(text.as_bytes());
        Some(Symbol(bytes))
    }

    /// The bytes without the trailing space padding.
    pub fn trimmed(&self) -> &[u8] {
        let end = self.0.iter().rposition(|&b| b != b' ').map_or(0, |i| i + 1);
        &self.0[..end]
    }

    /// The trimmed symbol as text; bytes outside ASCII become U+FFFD, as a lenient ASCII decoder does.
    pub fn to_text(&self) -> String {
        self.trimmed().iter().map(|&b| if b.is_ascii() { b as char } else { '\u{FFFD}' }).collect()
    }
}

impl fmt::Display for Symbol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_text())
    }
}

impl fmt::Debug for Symbol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Symbol({:?})", self.to_text())
    }
}

impl serde::Serialize for Symbol {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.to_text())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn price_prints_as_dollars() {
        assert_eq!(Price(500_500).to_string(), "50.0500");
        assert_eq!(Price(7_499).to_string(), "0.7499");
        assert_eq!(Price(-1).to_string(), "-0.0001");
        assert_eq!(Price(i64::MIN).to_string(), "-922337203685477.5808");
    }

    #[test]
    fn symbol_pads_and_trims() {
        let s = Symbol::new("BF.B").unwrap();
        assert_eq!(&s.0, b"BF.B    ");
        assert_eq!(s.trimmed(), b"BF.B");
        assert_eq!(s.to_string(), "BF.B");
        assert!(Symbol::new("TOOLONGSYM").is_none());
        assert!(Symbol::new("AA") < Symbol::new("AA-"));
        assert_eq!(Symbol([0xff, b'A', b' ', b' ', b' ', b' ', b' ', b' ']).to_text(), "\u{FFFD}A");
    }
}
