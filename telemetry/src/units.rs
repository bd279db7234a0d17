//! Durations and sizes as people write them, in files, flags and the environment alike: a number
//! (seconds; bytes) or a number with its unit (`"250ms"`, `"5s"`, `"2m"`; `"64MiB"`, `"1GB"`).
//!
//! A setting keeps one unit in its name and docs (seconds, bytes) and accepts the others, so
//! `drain_timeout = 10`, `drain_timeout = "10s"` and `--drain-timeout 10000ms` are the same.
//!
//! The `*_within` readers are a setting's type and bounds in one attribute
//! (`#[serde(deserialize_with = "units::seconds_within::<_, 10, 300_000>")]`): a value out of
//! bounds is refused as it is read, with the range, and the settings layer adds the setting's
//! name and origin. Bounds are const generics, so seconds are given in milliseconds.

use serde::{Deserialize, Deserializer, Serializer};
use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

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

/// A duration from text, as [`parse_seconds`] reads it: not negative, and finite.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let seconds = parse_seconds(text)?;
    Duration::try_from_secs_f64(seconds).map_err(|_| format!("{text:?} is not a duration of 0 seconds or more"))
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

/// A duration in seconds (units allowed) from `LOW_MS` to `HIGH_MS` milliseconds.
pub fn seconds_within<'de, D: Deserializer<'de>, const LOW_MS: u64, const HIGH_MS: u64>(
    deserializer: D,
) -> Result<Duration, D::Error> {
    let Seconds(v) = Seconds::deserialize(deserializer)?;
    let (low, high) = (LOW_MS as f64 / 1000.0, HIGH_MS as f64 / 1000.0);
    if !(v.is_finite() && (low..=high).contains(&v)) {
        return Err(serde::de::Error::custom(format!(
            "{v} is out of range: give a number from {low} to {high} seconds"
        )));
    }
    Ok(Duration::from_secs_f64(v))
}

/// `serialize_with` of a duration read by [`seconds_within`]: seconds, as a file writes them.
pub fn as_seconds<S: Serializer>(duration: &Duration, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_f64(duration.as_secs_f64())
}

/// `serialize_with` of an optional duration: seconds, or left out.
pub fn as_option_seconds<S: Serializer>(duration: &Option<Duration>, serializer: S) -> Result<S::Ok, S::Error> {
    match duration {
        Some(duration) => serializer.serialize_some(&duration.as_secs_f64()),
        None => serializer.serialize_none(),
    }
}

/// A whole number from `LOW` to `HIGH`, as the field's integer type.
pub fn whole_within<'de, D: Deserializer<'de>, T: TryFrom<u64>, const LOW: u64, const HIGH: u64>(
    deserializer: D,
) -> Result<T, D::Error> {
    let v = i128::from(i64::deserialize(deserializer)?);
    in_range::<D, T, LOW, HIGH>(v)
}

/// A size in bytes (units allowed) from `LOW` to `HIGH`, as the field's integer type.
pub fn bytes_within<'de, D: Deserializer<'de>, T: TryFrom<u64>, const LOW: u64, const HIGH: u64>(
    deserializer: D,
) -> Result<T, D::Error> {
    let Bytes(v) = Bytes::deserialize(deserializer)?;
    in_range::<D, T, LOW, HIGH>(i128::from(v))
}

/// `v` as `T` when it is from `LOW` to `HIGH`; else the range, as every bounded count says it.
fn in_range<'de, D: Deserializer<'de>, T: TryFrom<u64>, const LOW: u64, const HIGH: u64>(
    v: i128,
) -> Result<T, D::Error> {
    u64::try_from(v).ok().filter(|v| (LOW..=HIGH).contains(v)).and_then(|v| T::try_from(v).ok()).ok_or_else(|| {
        serde::de::Error::custom(format!("{v} is out of range: give a whole number from {LOW} to {HIGH}"))
    })
}

/// An address and port (`127.0.0.1:9100`, `[::1]:9100`).
pub fn address<'de, D: Deserializer<'de>>(deserializer: D) -> Result<SocketAddr, D::Error> {
    let text = String::deserialize(deserializer)?;
    text.trim()
        .parse()
        .map_err(|_| serde::de::Error::custom(format!("{text:?} is not an address:port (e.g. 127.0.0.1:9100)")))
}

/// An optional address and port, as [`address`].
pub fn option_address<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<SocketAddr>, D::Error> {
    address(deserializer).map(Some)
}

/// Unicast addresses and ports, as [`address`].
pub fn addresses<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<SocketAddr>, D::Error> {
    let texts = Vec::<String>::deserialize(deserializer)?;
    texts
        .iter()
        .map(|text| {
            text.trim()
                .parse()
                .map_err(|_| serde::de::Error::custom(format!("{text:?} is not an address:port (e.g. 127.0.0.1:9100)")))
        })
        .collect()
}

/// An IPv4 address (an interface's, a group's).
pub fn ipv4<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Ipv4Addr, D::Error> {
    let text = String::deserialize(deserializer)?;
    text.trim().parse().map_err(|_| serde::de::Error::custom(format!("{text:?} is not an IPv4 address")))
}

/// An optional IPv4 address, as [`ipv4`].
pub fn option_ipv4<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<Ipv4Addr>, D::Error> {
    ipv4(deserializer).map(Some)
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

    #[derive(Debug, Deserialize)]
    struct Bounded {
        #[serde(default, deserialize_with = "whole_within::<_, u16, 16, 1024>")]
        queue: u16,
        #[serde(default, deserialize_with = "bytes_within::<_, usize, 1024, 65_536>")]
        ring: usize,
        #[serde(default, deserialize_with = "seconds_within::<_, 10, 300_000>")]
        timeout: Duration,
        #[serde(default, deserialize_with = "option_address")]
        listen: Option<SocketAddr>,
    }

    #[test]
    fn bounded_values_are_read_with_their_units_and_refused_with_their_range() {
        let read: Bounded =
            toml::from_str("queue = 64\nring = \"2KiB\"\ntimeout = \"250ms\"\nlisten = \"127.0.0.1:9\"").unwrap();
        assert_eq!((read.queue, read.ring, read.timeout), (64, 2048, Duration::from_millis(250)));
        assert_eq!(read.listen, Some("127.0.0.1:9".parse().unwrap()));
        let refused = |text: &str| toml::from_str::<Bounded>(text).unwrap_err().message().to_string();
        assert_eq!(refused("queue = 8"), "8 is out of range: give a whole number from 16 to 1024");
        assert_eq!(refused("queue = -1"), "-1 is out of range: give a whole number from 16 to 1024");
        assert_eq!(refused("ring = \"1MiB\""), "1048576 is out of range: give a whole number from 1024 to 65536");
        assert_eq!(refused("timeout = 0"), "0 is out of range: give a number from 0.01 to 300 seconds");
        assert_eq!(refused("timeout = \"nan\""), "NaN is out of range: give a number from 0.01 to 300 seconds");
        assert!(refused("listen = \"here\"").contains("\"here\" is not an address:port"));
    }
}
