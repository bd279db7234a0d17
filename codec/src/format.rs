//! The wire formats by name and number: what configuration files, the command line, relay
//! headers and handshakes say to choose one.

use std::borrow::Cow;
use std::fmt;
use std::str::FromStr;

/// A wire format, chosen at run time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Format {
    /// The IEX-TP segment as received, behind the publisher's 8-byte send timestamp.
    Raw,
    /// FIX Simple Binary Encoding, one template per message type behind the standard header.
    Sbe,
    /// FlatBuffers, size-prefixed.
    FlatBuffers,
    /// Cap'n Proto with the standard stream framing (segment table).
    Capnp,
    /// Cap'n Proto, packed.
    CapnpPacked,
    /// Newline-delimited JSON, one object per frame.
    Json,
    /// Protocol Buffers (prost), length-delimited.
    Protobuf,
    /// brec packets: hot message types as blocks, rare ones in the payload.
    Brec,
}

impl Format {
    /// Every format, in a fixed order.
    pub const ALL: [Format; 8] = [
        Format::Raw,
        Format::Sbe,
        Format::FlatBuffers,
        Format::Capnp,
        Format::CapnpPacked,
        Format::Json,
        Format::Protobuf,
        Format::Brec,
    ];

    /// The name used in configuration files and on the command line.
    pub const fn name(self) -> &'static str {
        match self {
            Format::Raw => "raw",
            Format::Sbe => "sbe",
            Format::FlatBuffers => "flatbuffers",
            Format::Capnp => "capnp",
            Format::CapnpPacked => "capnp-packed",
            Format::Json => "json",
            Format::Protobuf => "protobuf",
            Format::Brec => "brec",
        }
    }

    /// The format's number in relay headers and handshakes.
    pub const fn id(self) -> u8 {
        match self {
            Format::Raw => 0,
            Format::Sbe => 1,
            Format::FlatBuffers => 2,
            Format::Capnp => 3,
            Format::CapnpPacked => 4,
            Format::Json => 5,
            Format::Protobuf => 6,
            Format::Brec => 7,
        }
    }

    /// The format for a number from [`Format::id`], if it is one of [`Format::ALL`].
    pub const fn from_id(id: u8) -> Option<Format> {
        let all = Format::ALL;
        let mut i = 0;
        while i < all.len() {
            if all[i].id() == id {
                return Some(all[i]);
            }
            i += 1;
        }
        None
    }
}

impl fmt::Display for Format {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A format name that is not one of [`Format::ALL`].
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown format {0:?}: expected one of raw, sbe, flatbuffers, capnp, capnp-packed, json, protobuf, brec")]
pub struct UnknownFormat(pub String);

impl FromStr for Format {
    type Err = UnknownFormat;
    fn from_str(s: &str) -> Result<Format, UnknownFormat> {
        Format::ALL.into_iter().find(|f| f.name() == s).ok_or_else(|| UnknownFormat(s.to_string()))
    }
}

impl serde::Serialize for Format {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

impl<'de> serde::Deserialize<'de> for Format {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Format, D::Error> {
        let name = <Cow<'de, str>>::deserialize(d)?;
        name.parse().map_err(serde::de::Error::custom)
    }
}
