//! The retransmission service's side of one client, without I/O: its requests read out of the
//! bytes it sends, within an idle deadline (a request must begin within the idle timeout of the
//! last answer) and a partial-request deadline (once begun, it must arrive whole within the
//! request timeout); the rate it may ask at ([`TokenBucket`]); and each request's answer out of
//! the ring ([`Answer`]): `GONE` for the frames the ring no longer holds (all at once), `DATA`
//! records of those held (at most the range limit; the rest is asked again), nothing for frames
//! not sent yet. A range past the end of the numbering, or of no frames, is answered with nothing
//! and counted as asking ahead: the answer never depends on a count beyond the ring's.

use super::super::ring::FrameRing;
use super::super::wire::{RecordHeader, RecordTag, RetransmitRequest, control_record, gone_payload};
use crate::backoff::duration_ns;
use mdrelay_codec::Format;
use std::fmt;
use std::time::Duration;

/// Bytes of one `REQUEST` record.
pub const REQUEST_LEN: usize = RecordHeader::LEN + RetransmitRequest::PAYLOAD;
/// Payload bytes per `DATA` record of an answer, and the bytes an answer is written in.
pub const ANSWER_BYTES: usize = 64 << 10;

/// How a client's connection ends, as far as its requests decide.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ClientEnd {
    /// It closed between requests.
    Closed,
    /// It asked nothing for the idle timeout.
    Idle,
    /// It began a request and did not finish it within the request timeout.
    RequestTimeout,
    /// It broke the protocol: the reason, to send in a `REFUSE` record.
    Refused(String),
    /// The connection failed.
    Failed(String),
}

/// What a [`RequestReader`] made of the bytes it was given.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RequestEvent {
    /// A whole request: answer it, then call [`RequestReader::answered`].
    Request(RetransmitRequest),
    /// A request for a snapshot of the state ([`RetransmitRequest::snapshot_record`]): answer
    /// it with `SNAPSHOT` records, then call [`RequestReader::answered`].
    Snapshot,
    /// The connection is over.
    Ended(ClientEnd),
}

/// Requests read from one client's bytes, one at a time.
#[derive(Debug)]
pub struct RequestReader {
    buf: [u8; REQUEST_LEN],
    have: usize,
    /// Where `buf[0]` is in the connection, for messages.
    offset: u64,
    idle_ns: i64,
    request_ns: i64,
    idle_until: i64,
    whole_by: Option<i64>,
    /// A request is waiting for its answer.
    answering: bool,
}

impl RequestReader {
    /// A client whose next byte is byte `offset` of the connection (the answer to the greeting
    /// came before), after its handshake at `now`.
    pub fn new(offset: u64, idle: Duration, request: Duration, now: i64) -> RequestReader {
        let idle_ns = duration_ns(idle);
        RequestReader {
            buf: [0; REQUEST_LEN],
            have: 0,
            offset,
            idle_ns,
            request_ns: duration_ns(request),
            idle_until: now.saturating_add(idle_ns),
            whole_by: None,
            answering: false,
        }
    }

    /// Where the next bytes go: never more than the request lacks, so nothing after it is read;
    /// empty while a request waits for its answer.
    pub fn read_buf(&mut self) -> &mut [u8] {
        if self.answering {
            return &mut [];
        }
        &mut self.buf[self.have..]
    }

    /// `n` bytes were read into [`RequestReader::read_buf`] at `now`; 0 means the client closed.
    pub fn received(&mut self, n: usize, now: i64) -> Option<RequestEvent> {
        if self.answering {
            return None;
        }
        if n == 0 {
            return Some(RequestEvent::Ended(if self.have == 0 {
                ClientEnd::Closed
            } else {
                ClientEnd::Failed(format!("the client closed inside a request, at byte {}", self.at()))
            }));
        }
        self.whole_by.get_or_insert(now.saturating_add(self.request_ns));
        let header_was_in = self.have >= RecordHeader::LEN;
        self.have = (self.have + n).min(REQUEST_LEN);
        if !header_was_in && self.have >= RecordHeader::LEN {
            // A record that is not a request is refused as soon as its header is in.
            if let Err(end) = self.check_header() {
                return Some(RequestEvent::Ended(end));
            }
        }
        if self.have < REQUEST_LEN {
            return None;
        }
        let request = self.check_header().and_then(|header| {
            RetransmitRequest::parse(&header, &self.buf[RecordHeader::LEN..]).map_err(|e| {
                let at = self.offset + (RecordHeader::LEN + e.offset) as u64;
                ClientEnd::Refused(format!("bad request at byte {at}: {}", e.what))
            })
        });
        Some(match request {
            Ok(request) => {
                self.answering = true;
                self.offset += REQUEST_LEN as u64;
                self.have = 0;
                self.whole_by = None;
                if RetransmitRequest::asks_snapshot(&self.buf[RecordHeader::LEN..]) {
                    RequestEvent::Snapshot
                } else {
                    RequestEvent::Request(request)
                }
            }
            Err(end) => RequestEvent::Ended(end),
        })
    }

    /// Reading failed with `error`.
    pub fn read_failed(&self, error: &dyn fmt::Display) -> ClientEnd {
        ClientEnd::Failed(format!("reading a request at byte {}: {error}", self.at()))
    }

    /// The request taken last was answered at `now`: the idle time counts from here.
    pub fn answered(&mut self, now: i64) {
        self.answering = false;
        self.idle_until = now.saturating_add(self.idle_ns);
    }

    /// When the connection times out: the partial request's deadline, else the idle one;
    /// `None` while a request is being answered.
    pub fn deadline(&self) -> Option<i64> {
        (!self.answering).then(|| self.whole_by.unwrap_or(self.idle_until))
    }

    /// The time is `now`: the end of the connection, if a deadline passed.
    pub fn on_timeout(&self, now: i64) -> Option<ClientEnd> {
        let deadline = self.deadline()?;
        (now >= deadline).then(|| if self.whole_by.is_some() { ClientEnd::RequestTimeout } else { ClientEnd::Idle })
    }

    /// The byte of the connection read next.
    fn at(&self) -> u64 {
        self.offset + self.have as u64
    }

    /// The header of the request being read, or the refusal of anything else.
    fn check_header(&self) -> Result<RecordHeader, ClientEnd> {
        // Nothing is allocated by the length: a request's size is fixed, and checked here.
        let header = RecordHeader::parse(&self.buf, u32::MAX as usize).map_err(|e| {
            ClientEnd::Refused(format!("bad request at byte {}: {}", self.offset + e.offset as u64, e.what))
        })?;
        if header.tag != RecordTag::Request || header.length as usize != RetransmitRequest::PAYLOAD {
            return Err(ClientEnd::Refused(format!(
                "a client sends only REQUEST records of {} bytes; this one sent {:?} of {} at byte {}",
                RetransmitRequest::PAYLOAD,
                header.tag,
                header.length,
                self.offset
            )));
        }
        Ok(header)
    }
}

/// Requests per second as a token bucket holding a second's worth, on the caller's clock.
#[derive(Clone, Copy, Debug)]
pub struct TokenBucket {
    tokens: f64,
    rate: f64,
    last: i64,
}

impl TokenBucket {
    /// `rate` per second, full at `now`.
    pub fn new(rate: u32, now: i64) -> TokenBucket {
        let rate = f64::from(rate);
        TokenBucket { tokens: rate, rate, last: now }
    }

    /// Whether one more is admitted at `now` (taking a token if so).
    pub fn admit(&mut self, now: i64) -> bool {
        let elapsed = now.saturating_sub(self.last).max(0) as f64 / 1e9;
        self.tokens = (self.tokens + elapsed * self.rate).min(self.rate);
        self.last = self.last.max(now);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

/// The `BUSY` record answering a request over `rate` requests per second.
pub fn throttled(request: &RetransmitRequest, rate: u32) -> Vec<u8> {
    let why = format!("over {rate} requests per second (retransmit.requests_per_second); ask again later");
    control_record(RecordTag::Busy, Format::Raw, request.first, why.as_bytes())
}

/// One request's answer, built out of the ring a part at a time, so the ring is locked for one
/// part's copy and the answer is written between parts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Answer {
    next: u64,
    end: u64,
    /// Whether the request named frames not sent yet (or past the end of the numbering).
    pub ahead: bool,
}

/// What one part of an answer held.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AnswerStep {
    /// Frames copied as DATA.
    pub sent: u64,
    /// Frames answered GONE.
    pub gone: u64,
    /// More is to come.
    pub more: bool,
}

impl Answer {
    /// The answer to `asked` against `ring`, at most `max_range` frames served; the `GONE`
    /// record for what the ring no longer holds is appended to `out` at once.
    pub fn new(ring: &FrameRing, asked: RetransmitRequest, max_range: u32, out: &mut Vec<u8>) -> (Answer, AnswerStep) {
        let count = u64::from(asked.count);
        let mut lookup = ring.lookup(asked.first, count);
        // What is not gone or held is not sent yet, also frames past the end of the
        // numbering, where the range's end saturates.
        let ahead = count > lookup.gone + lookup.held;
        lookup.held = lookup.held.min(u64::from(max_range));
        if lookup.gone > 0 {
            out.extend(control_record(RecordTag::Gone, Format::Raw, asked.first, &gone_payload(lookup.gone)));
        }
        let next = asked.first + lookup.gone;
        let answer = Answer { next, end: next + lookup.held, ahead };
        (answer, AnswerStep { sent: 0, gone: lookup.gone, more: answer.next < answer.end })
    }

    /// Appends the next records to `out` until it holds [`ANSWER_BYTES`] or the answer is
    /// whole. Frames that left the ring since the answer began are answered `GONE` after all.
    pub fn fill(&mut self, ring: &FrameRing, out: &mut Vec<u8>) -> AnswerStep {
        let mut step = AnswerStep::default();
        while self.next < self.end && out.len() < ANSWER_BYTES {
            match ring.copy_record(self.next, self.end - self.next, ANSWER_BYTES, out) {
                Some(after) => {
                    step.sent += after - self.next;
                    self.next = after;
                }
                None => {
                    let held = ring.first().clamp(self.next, self.end);
                    let gone = held.max(self.next + 1) - self.next;
                    out.extend(control_record(RecordTag::Gone, Format::Raw, self.next, &gone_payload(gone)));
                    step.gone += gone;
                    self.next += gone;
                }
            }
        }
        step.more = self.next < self.end;
        step
    }
}
