//! What the client machines' tests share: a peer, records built with the wire structures, and
//! feeding a connection its bytes cut where a test says.

use super::connection::{ConnectionEvent, StreamConnection};
use crate::codec::Format;
use crate::relay::wire::{RecordHeader, RecordTag};
use rand::{Rng, SeedableRng};
use rand_pcg::Pcg32;
use std::net::SocketAddr;

/// The publisher every test talks to.
pub(crate) fn peer() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 9100))
}

/// A whole record: header and payload.
pub(crate) fn record(tag: RecordTag, format: Format, frames: u16, sequence: u64, payload: &[u8]) -> Vec<u8> {
    let header = RecordHeader { tag, format, frame_count: frames, length: payload.len() as u32, sequence };
    let mut out = header.to_bytes().to_vec();
    out.extend_from_slice(payload);
    out
}

/// Cut points splitting `len` bytes at random (sorted, distinct, inside the bytes).
pub(crate) fn random_cuts(len: usize, seed: u64) -> Vec<usize> {
    let mut rng = Pcg32::seed_from_u64(seed);
    let mut cuts: Vec<usize> =
        (0..rng.random_range(0..=len.min(64))).map(|_| rng.random_range(1..len.max(2))).collect();
    cuts.sort_unstable();
    cuts.dedup();
    cuts
}

/// Every event as its `Debug` text: comparable across runs whatever the buffer held. What the
/// connection has to write is taken as written after each event, as a driver that writes at
/// once does.
pub(crate) fn drain(conn: &mut StreamConnection, out: &mut Vec<String>) {
    while let Some(event) = conn.poll_event() {
        let last = matches!(event, ConnectionEvent::Closed(_));
        out.push(format!("{event:?}"));
        let written = conn.transmit().len();
        conn.transmitted(written);
        if last {
            break;
        }
    }
}

/// Feeds `bytes` to `conn` in pieces cut at `cuts`, at time `now`, polling every event after
/// each piece (as a driver does); then `eof` closes the input. The answer and echoes are taken
/// as written at once.
pub(crate) fn feed(conn: &mut StreamConnection, bytes: &[u8], cuts: &[usize], now: i64, eof: bool) -> Vec<String> {
    let mut events = Vec::new();
    let mut start = 0;
    for end in cuts.iter().copied().chain([bytes.len()]) {
        let mut piece = &bytes[start.min(end)..end];
        start = end;
        while !piece.is_empty() {
            let room = conn.read_buf();
            if room.is_empty() {
                drain(conn, &mut events);
                if conn.read_buf().is_empty() {
                    return events;
                }
                continue;
            }
            let n = room.len().min(piece.len());
            room[..n].copy_from_slice(&piece[..n]);
            conn.received(n, now);
            piece = &piece[n..];
            drain(conn, &mut events);
        }
    }
    if eof {
        conn.received(0, now);
    }
    drain(conn, &mut events);
    events
}
