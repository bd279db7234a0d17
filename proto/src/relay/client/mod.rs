//! The client side of the relay protocol as state machines without I/O, fed bytes and time (ns
//! on a monotonic base the driver chooses), in the way quinn-proto holds QUIC: the drivers (the
//! subscriber, a relay's upstream, the client library) only move bytes between sockets and these
//! machines, and keep the timers they ask for.
//!
//! - [`connection`]: one TCP connection for any purpose ([`StreamConnection`]): handshake,
//!   version negotiation, protection checks, records;
//! - [`stream`]: one TCP stream across connections ([`StreamClient`]): when to connect, where to
//!   resume, restarts, when to give up;
//! - [`datagram`]: the UDP and multicast side ([`DatagramReceiver`]): protection, held datagrams,
//!   END, A/B lines, and loss recovery over a connection to the retransmission service;
//! - [`frames`]: a payload of frames in, per frame out ([`FrameReader`]): protection opened,
//!   frames delimited, accounted for and decoded;
//! - [`lines`]: two A/B lines merged into one stream ([`Lines`]);
//! - [`store`]: missing frames found in a store of datagrams numbered by its own positions
//!   (JetStream) ([`StoreSearch`]);
//! - [`book`]: the missing frames and what became of them ([`RecoveryBook`]);
//! - [`unseal`]: protected frames and datagrams opened before anything reads them;
//! - [`buffer`]: the connection's read buffer, 8-aligned and grown only as bytes arrive;
//! - [`quiet`]: input that gives the program nothing, bounded, so its caller always gets a turn
//!   ([`Quiet`]).

pub mod book;
pub mod buffer;
pub mod connection;
pub mod datagram;
pub mod frames;
pub mod lines;
pub mod quiet;
pub mod store;
pub mod stream;
#[cfg(test)]
pub(crate) mod testing;
pub mod unseal;

pub use book::{RecoveryBook, RecoveryReport, UnrecoverableCauses};
pub use connection::{
    CloseReason, Closed, ConnectionConfig, ConnectionCounts, ConnectionEvent, Disposition, ResumePlan, Role, Start,
    StreamConnection,
};
pub use datagram::{
    CATCH_UP_INTERVAL, CatchUp, DatagramConfig, DatagramCounts, DatagramEvent, DatagramReceiver, RecoveryAction,
    RecoveryConfig, SNAPSHOT_HOLD_BYTES, SNAPSHOT_WAIT,
};
pub use frames::{
    Anomaly, FormatChange, FrameCheckFailure, FrameCounts, FrameInfo, FrameReader, FrameVisitor, Origin, Payload,
    PayloadOutcome, Place, PlaceAt, ReaderConfig, ReaderMode,
};
pub use lines::{Line, LineReport, Lines, LinesReport};
pub use quiet::Quiet;
pub use store::{StoreSearch, StoreStep, Stored};
pub use stream::{ClientAction, ClientCounts, ClientEvent, EndOfStream, Finish, StreamClient, StreamClientConfig};
pub use unseal::{ProtectionCounts, Unsealer};
