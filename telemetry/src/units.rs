//! Durations and sizes as people write them, in files, flags and the environment alike: a number
//! (seconds; bytes) or a number with its unit (`"250ms"`, `"5s"`, `"2m"`; `"64MiB"`, `"1GB"`).
//!
//! A setting keeps one unit in its name and docs (seconds, bytes) and accepts the others, so
//! `drain_timeout = 10`, `drain_timeout = "10s"` and `--drain-timeout 10000ms` are the same.

use serde::{Deserialize, Deserializer};

/// Seconds from text: a number (`"2.5"`) or a duration with units (`"250ms"`, `"1m 30s"`).
pub fn parse_seconds(text: &str) -> Result<f64, String> {
    let text = text.trim();
    if let Ok(seconds) = text.parse::<f64>() {
        return Ok(seconds);
    }
    humantime::parse_duration(text).map(|d| d.as_secs_f64()).map_err(|e| {
        format!("{text:?} is not a duration ({e}): give seconds (e.g. 2.5) or a number with its unit (250ms, 5s, 2m)")
    })
}

/// Bytes from text: a whole number (`"65536"`) or a size with units (`"64KiB"`, `"512MiB"`, `"1GB"`).
pub fn parse_bytes<T: TryFrom<u64>>(text: &str) -> Result<T, String> {
    let text = text.trim();
    let bytes = parse_size::parse_size(text).map_err(|e| {
        format!("{text:?} is not a size ({e}): give bytes (e.g. 65536) or a size with its unit (64KiB, 512MiB, 1GB)")
    })?;
    T::try_from(bytes).map_err(|_| format!("{text:?} ({bytes} bytes) is too large here"))
}

/// A duration as a file writes it: an integer, a float, or text with units.
#[derive(Deserialize)]
#[serde(untagged)]
enum SecondsValue {
    Int(i64),
    Float(f64),
    Text(String),
}

/// A size as a file writes it: an integer or text with units.
#[derive(Deserialize)]
#[serde(untagged)]
enum BytesValue {
    Int(i64),
    Text(String),
}

/// A number of seconds read from a file, with or without units; range checks belong to the setting.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Seconds(pub f64);

impl<'de> Deserialize<'de> for Seconds {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        match SecondsValue::deserialize(deserializer)? {
            SecondsValue::Int(n) => Ok(Seconds(n as f64)),
            SecondsValue::Float(f) => Ok(Seconds(f)),
            SecondsValue::Text(t) => parse_seconds(&t).map(Seconds).map_err(serde::de::Error::custom),
        }
    }
}

/// A number of bytes read from a file, with or without units; range checks belong to the setting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bytes(pub u64);

impl<'de> Deserialize<'de> for Bytes {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        match BytesValue::deserialize(deserializer)? {
            BytesValue::Int(n) => u64::try_from(n)
                .map(Bytes)
                .map_err(|_| serde::de::Error::custom(format!("{n} is negative: give a size in bytes"))),
            BytesValue::Text(t) => parse_bytes(&t).map(Bytes).map_err(serde::de::Error::custom),
        }
    }
}

/// `#[serde(default, deserialize_with = "option_seconds")]`: an optional duration in seconds.
pub fn option_seconds<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<f64>, D::Error> {
    Ok(Some(Seconds::deserialize(deserializer)?.0))
}

/// `#[serde(default, deserialize_with = "option_bytes")]`: an optional size in bytes, as the
/// field's integer type.
pub fn option_bytes<'de, D: Deserializer<'de>, T: TryFrom<u64>>(deserializer: D) -> Result<Option<T>, D::Error> {
    let Bytes(bytes) = Bytes::deserialize(deserializer)?;
    T::try_from(bytes).map(Some).map_err(|_| serde::de::Error::custom(format!("{bytes} bytes is too large here")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_take_numbers_and_units() {
        assert_eq!(parse_seconds("2.5"), Ok(2.5));
        assert_eq!(parse_seconds("250ms"), Ok(0.25));
        assert_eq!(parse_seconds("1m 30s"), Ok(90.0));
        assert!(parse_seconds("soon").unwrap_err().contains("\"soon\" is not a duration"));
        let file: std::collections::BTreeMap<String, Seconds> = toml::from_str("a = 5\nb = 0.5\nc = \"2m\"").unwrap();
        assert_eq!(file["a"], Seconds(5.0));
        assert_eq!(file["b"], Seconds(0.5));
        assert_eq!(file["c"], Seconds(120.0));
    }

    #[test]
    fn sizes_take_numbers_and_units() {
        assert_eq!(parse_bytes::<u64>("65536"), Ok(65_536));
        assert_eq!(parse_bytes::<u64>("64MiB"), Ok(64 << 20));
        assert_eq!(parse_bytes::<u64>("1GB"), Ok(1_000_000_000));
        assert!(parse_bytes::<u8>("1KiB").unwrap_err().contains("too large"));
        let file: std::collections::BTreeMap<String, Bytes> = toml::from_str("a = 4096\nb = \"16MiB\"").unwrap();
        assert_eq!(file["b"], Bytes(16 << 20));
        assert!(toml::from_str::<std::collections::BTreeMap<String, Bytes>>("a = -1").is_err());
    }
}
