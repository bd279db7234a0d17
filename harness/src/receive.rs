//! What the client's and the subscriber's tests share when they play the other end: a fake
//! publisher that greets one subscriber over TCP and then floods or refuses it, and a stream
//! message read back from JetStream with natscli.

use crate::net::accept_within;
use crate::process::STEP;
use mdrelay_codec::Format;
use mdrelay_proto::relay::{Hello, RecordHeader, RecordTag, Subscribe};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// A fake publisher on a free loopback port, on a thread of its own: it accepts one subscriber
/// (within [`STEP`]), greets it as the SBE publisher of `session`, reads its answer (a version-2
/// SUBSCRIBE) and hands the connection (reads timing out after [`STEP`]) and that answer to `then`.
pub fn fake_publisher<T: Send + 'static>(
    session: u64,
    then: impl FnOnce(TcpStream, [u8; Subscribe::V2_LEN]) -> T + Send + 'static,
) -> (SocketAddr, JoinHandle<T>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let peer = std::thread::spawn(move || {
        let mut s = accept_within(&listener, STEP);
        s.set_read_timeout(Some(STEP)).unwrap();
        s.write_all(&Hello::new(Format::Sbe, session, 1, 1).to_bytes()).unwrap();
        let mut answer = [0u8; Subscribe::V2_LEN];
        s.read_exact(&mut answer).unwrap();
        then(s, answer)
    });
    (addr, peer)
}

/// Writes `record` over and over to `s` until the peer leaves or `limit` passes: the bytes
/// written, and whether it ran out of time with the peer still there.
pub fn flood(s: &mut TcpStream, record: &[u8], limit: Duration) -> (u64, bool) {
    let burst: Vec<u8> = record.iter().copied().cycle().take(record.len() * (1 << 16)).collect();
    let started = Instant::now();
    let mut bytes = 0u64;
    while started.elapsed() < limit {
        match s.write(&burst) {
            Ok(n) => bytes += n as u64,
            Err(_) => return (bytes, false),
        }
    }
    (bytes, true)
}

/// Refuses the subscription on `s` with `reason`, the REFUSE record declaring `declared` bytes
/// of it, then holds the connection until the subscriber leaves.
pub fn refuse(mut s: TcpStream, reason: &[u8], declared: u32) {
    let header =
        RecordHeader { tag: RecordTag::Refuse, format: Format::Sbe, frame_count: 0, length: declared, sequence: 0 };
    // The subscriber may leave after the first bytes: what it does not read is not sent.
    let _ = s.write_all(&header.to_bytes()).and_then(|()| s.write_all(reason));
    let _ = s.read_to_end(&mut Vec::new());
}

/// A JetStream stream's message at `position`, read with natscli from the server at `url`: the
/// JSON natscli prints of it, and the message's data.
pub fn stored_message(url: &str, stream: &str, position: u64) -> (serde_json::Value, Vec<u8>) {
    let text = crate::nats_cli(url, &["stream", "get", stream, &position.to_string(), "--json"]).unwrap();
    let json: serde_json::Value = serde_json::from_str(&text).unwrap();
    let data = base64_decode(json["data"].as_str().unwrap());
    (json, data)
}

/// Standard base64 (natscli's message data, the interval log's histograms), decoded without
/// another dependency.
pub fn base64_decode(text: &str) -> Vec<u8> {
    let value = |c: u8| match c {
        b'A'..=b'Z' => c - b'A',
        b'a'..=b'z' => c - b'a' + 26,
        b'0'..=b'9' => c - b'0' + 52,
        b'+' => 62,
        b'/' => 63,
        _ => panic!("not base64: {c}"),
    };
    let clean: Vec<u8> = text.bytes().filter(|&c| c != b'=').collect();
    let mut out = Vec::new();
    for chunk in clean.chunks(4) {
        let n = chunk.iter().enumerate().fold(0u32, |n, (i, &c)| n | (u32::from(value(c)) << (18 - 6 * i)));
        out.extend_from_slice(&n.to_be_bytes()[1..chunk.len()]);
    }
    out
}
