//! TCP: connect to a publisher, handshake, read records; reconnect with capped exponential
//! backoff when the connection is refused or lost (each attempt logged). A reconnection to the
//! same publisher run resumes after the last frame received (protocol version 2: the publisher
//! replays what its ring holds from there), and `--from-start` asks for the session from its
//! first frame.
//!
//! Each record's numbers must fit the connection's stream (proto's [`Continuity`]): a header
//! changed on the way is a protocol violation (counted with the invalid packets, and logged),
//! which drops the connection before anything of that record is taken; the next connection
//! resumes after the last frame received, so nothing is lost while the publisher's ring holds it.
//!
//! Records are read into one reusable [`ReadBuf`] with as many bytes per read as the socket
//! has, and parsed out of it: no per-record allocation, and a record's payload starts 8-aligned
//! in memory (see [`crate::buffer`]). Reads use `readable` + `try_read`, which are cancel-safe,
//! so the same loop also serves report ticks, stops and the echo records going back.

use crate::buffer::{ReadBuf, read_some};
use crate::control::{Control, Event, RunError, Stop};
use crate::frames::{Origin, Payload, Pipeline, Place};
use crate::poll::Poller;
use mdrelay_proto::clock::wall_clock_ns as now_ns;
use mdrelay_proto::codec::Format;
use mdrelay_proto::idle::IdleStrategy;
use mdrelay_proto::relay::{
    Continuity, Echo, Greeted, HandshakeError, Hello, MAX_RECORD, RecordHeader, RecordTag, Resume, Subscribe, Totals,
    Verdict,
};
use std::io;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio::time::{Instant, timeout, timeout_at};
use tracing::Instrument;

/// First wait before reconnecting; doubles up to the configured cap.
const INITIAL_BACKOFF: Duration = Duration::from_millis(100);
/// A connection attempt that takes longer is abandoned (and retried).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// A publisher must greet within this time after accepting.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Starting size of the read buffer; it grows (doubling) only for records larger than this.
const READ_BUFFER: usize = 256 << 10;
/// Echo bytes waiting to be written before further echoes are dropped (the publisher is not
/// reading them); bounded so a stalled way back costs neither memory nor the data flow.
const MAX_PENDING_ECHOES: usize = 1 << 20;
/// Bytes of one ECHO record.
const ECHO_RECORD: usize = RecordHeader::LEN + Echo::LEN;

/// How one connection ended.
enum Ended {
    /// Stop the run.
    Stop(Stop),
    /// The connection is gone; reconnect. `greeted`: the handshake had succeeded.
    Lost { why: String, greeted: bool },
}

/// Connects to `addr` and receives until a stop, reconnecting as needed. A host name that does
/// not resolve at start is a configuration the user must fix, not a publisher that is away: it
/// fails the run (later attempts resolve again, so a name that moves is followed).
pub async fn run(
    addr: &str,
    reconnect_max: Duration,
    receive: Receive,
    pipeline: &mut Pipeline,
    control: &mut Control,
) -> Result<Stop, RunError> {
    let resolve = tokio::net::lookup_host(addr);
    match control.run(pipeline, timeout(CONNECT_TIMEOUT, resolve)).await {
        Err(stop) => return Ok(stop),
        Ok(Ok(Ok(addrs))) => {
            if addrs.count() == 0 {
                return Err(RunError::Fatal(anyhow::anyhow!("connect: {addr} resolves to no address")));
            }
        }
        Ok(Ok(Err(error))) => {
            return Err(RunError::Fatal(anyhow::anyhow!(
                "connect: cannot resolve the host of {addr}: {error}; check the name (or give an IP address)"
            )));
        }
        Ok(Err(_)) => {
            return Err(RunError::Fatal(anyhow::anyhow!(
                "connect: resolving the host of {addr} took longer than {CONNECT_TIMEOUT:?}"
            )));
        }
    }
    let mut buf = ReadBuf::new(READ_BUFFER);
    let mut warned_v1 = false;
    let mut backoff = INITIAL_BACKOFF.min(reconnect_max);
    let mut connected_before = false;
    let mut attempt = 0u64;
    loop {
        attempt += 1;
        let connect = timeout(CONNECT_TIMEOUT, TcpStream::connect(addr));
        let connected = match control.run(pipeline, connect).await {
            Ok(r) => r,
            Err(stop) => return Ok(stop),
        };
        match connected {
            Ok(Ok(stream)) => {
                let peer = stream.peer_addr().unwrap_or_else(|_| SocketAddr::from(([0, 0, 0, 0], 0)));
                if connected_before {
                    pipeline.stats.reconnects += 1;
                    tracing::info!(publisher = %peer, attempt, "reconnected");
                } else {
                    tracing::info!(publisher = %peer, attempt, "connected");
                }
                connected_before = true;
                attempt = 0;
                // Every line the connection logs names the publisher through this span, once.
                let span = tracing::info_span!("publisher", %peer);
                let ended = connection(stream, peer, receive, &mut buf, &mut warned_v1, pipeline, control)
                    .instrument(span)
                    .await?;
                match ended {
                    Ended::Stop(stop) => return Ok(stop),
                    Ended::Lost { why, greeted } => {
                        if greeted {
                            backoff = INITIAL_BACKOFF.min(reconnect_max);
                        }
                        tracing::warn!(publisher = %peer, retry_in = ?backoff, "connection lost: {why}; reconnecting");
                    }
                }
            }
            Ok(Err(error)) => {
                tracing::warn!(publisher = addr, attempt, retry_in = ?backoff, %error, "connection failed; retrying");
            }
            Err(_) => {
                tracing::warn!(publisher = addr, attempt, retry_in = ?backoff, "connection attempt timed out after {CONNECT_TIMEOUT:?}; retrying");
            }
        }
        if let Err(stop) = control.run(pipeline, tokio::time::sleep(backoff)).await {
            return Ok(stop);
        }
        backoff = (backoff * 2).min(reconnect_max);
    }
}

/// Checks a greeting and says why it cannot be accepted.
fn check_greeting(bytes: &[u8], peer: SocketAddr) -> Result<Hello, RunError> {
    Hello::parse(bytes).map_err(|e| match e {
        HandshakeError::Malformed(e) => RunError::Refused(format!("{peer} is not an mdrelay publisher: {e}")),
        version => RunError::Refused(format!("publisher {peer}: {version}")),
    })
}

/// Refuses a publisher that protects its frames otherwise than configured here, or with another
/// key: told at the handshake, not by every frame failing.
fn check_protection(hello: &Hello, peer: SocketAddr, pipeline: &mut Pipeline) -> Result<(), RunError> {
    let Some(unsealer) = &mut pipeline.unsealer else { return Ok(()) };
    let ours = unsealer.protection();
    if hello.protection != ours {
        return Err(RunError::Refused(format!(
            "publisher {peer} protects its frames with {} and this subscriber expects {ours}: configure the same [protection] (crc, key_file) on both",
            hello.protection
        )));
    }
    if ours.encrypted && hello.key_check != unsealer.key_check(hello.session) {
        return Err(RunError::Refused(format!(
            "publisher {peer} encrypts with another key than protection.key_file: give both the same key file"
        )));
    }
    Ok(())
}

/// Where to ask the publisher to start, after `greeted`: after the last frame received when
/// this is the same publisher run (its ring fills what was missed while away), from the
/// session's first frame for `--from-start` before anything was received, else live.
fn resume_from(greeted: Greeted, pipeline: &Pipeline) -> Resume {
    match (greeted, pipeline.tracker.highest()) {
        (Greeted::Same, Some(high)) => Resume::From(high.saturating_add(1)),
        _ if pipeline.from_start() && pipeline.first_frame().is_none() => Resume::From(1),
        _ => Resume::Live,
    }
}

/// One connection: handshake, then records until a stop or the connection is lost.
/// `warned_v1`: a version-1 publisher's missing resume was already reported.
async fn connection(
    mut stream: TcpStream,
    peer: SocketAddr,
    receive: Receive,
    buf: &mut ReadBuf,
    warned_v1: &mut bool,
    pipeline: &mut Pipeline,
    control: &mut Control,
) -> Result<Ended, RunError> {
    let lost = |why: String, greeted: bool| Ok(Ended::Lost { why, greeted });
    let lost_with_echoes = |why: String, out: &EchoOut, pipeline: &mut Pipeline| {
        pipeline.stats.echoes_dropped += out.unsent();
        Ok(Ended::Lost { why, greeted: true })
    };
    buf.clear();
    // Echo records are small; sending them at once matters more than packing them.
    let _ = stream.set_nodelay(true);
    if receive.busy_poll {
        crate::cpu::busy_poll(&stream, "tcp");
    }

    // The greeting.
    let deadline = Instant::now() + HANDSHAKE_TIMEOUT;
    while buf.len() < Hello::LEN {
        buf.reserve_for(Hello::LEN, Hello::LEN);
        let read = match control.run(pipeline, timeout_at(deadline, read_some(&stream, buf))).await {
            Ok(r) => r,
            Err(stop) => return Ok(Ended::Stop(stop)),
        };
        match read {
            Err(_) => return lost(format!("no greeting within {HANDSHAKE_TIMEOUT:?}"), false),
            Ok(Ok(0)) => return lost(format!("closed after {} bytes of the greeting", buf.len()), false),
            Ok(Ok(n)) => pipeline.stats.bytes += n as u64,
            Ok(Err(e)) => return lost(format!("reading the greeting: {e}"), false),
        }
    }
    let hello = check_greeting(&buf.data()[..Hello::LEN], peer)?;
    check_protection(&hello, peer, pipeline)?;
    buf.consume(Hello::LEN);
    let mut stream_offset = Hello::LEN as u64;
    let greeted = pipeline.tracker.greeted(hello.session, hello.next_sequence);
    if let Greeted::Restarted { old } = greeted {
        tracing::warn!(
            old_session = format_args!("{old:#x}"),
            new_session = format_args!("{:#x}", hello.session),
            "publisher restarted: sequence tracking starts over"
        );
    }
    tracing::info!(session = format_args!("{:#x}", hello.session), stream = hello.stream,
        format = %hello.format, next_sequence = hello.next_sequence, version = hello.protocol_version, "greeted");
    pipeline.format(hello.format, peer);

    let echo = pipeline.echoes_wanted();
    let wanted = resume_from(greeted, pipeline);
    let protection = pipeline.unsealer.as_ref().map(|u| u.protection()).unwrap_or_default();
    let subscribe = Subscribe { resume: wanted, protection, ..Subscribe::new(echo) }.negotiated(hello.protocol_version);
    // A resume counts once the publisher's first record starts the stream where it was asked
    // to: a publisher without a ring serves the live stream instead.
    let mut resuming = None;
    match (wanted, subscribe.resume) {
        (Resume::From(from), Resume::From(_)) => {
            if greeted == Greeted::Same && pipeline.tracker.highest().is_some() {
                resuming = Some(from);
                tracing::info!(from, "resuming after the last frame received");
            } else {
                tracing::info!(from, "asking for the session from its first frame");
            }
        }
        (Resume::From(_), Resume::Live) if !*warned_v1 => {
            *warned_v1 = true;
            tracing::warn!(
                version = hello.protocol_version,
                "the publisher speaks relay protocol version {}: it cannot resume a stream or send it from the start; frames missed while away are lost",
                hello.protocol_version
            );
        }
        _ => {}
    }
    let answer = subscribe.to_bytes();
    match control.run(pipeline, timeout(HANDSHAKE_TIMEOUT, stream.write_all(&answer))).await {
        Err(stop) => return Ok(Ended::Stop(stop)),
        Ok(Err(_)) => return lost("the publisher does not read the subscription".into(), false),
        Ok(Ok(Err(e))) => return lost(format!("sending the subscription: {e}"), false),
        Ok(Ok(Ok(()))) => {}
    }

    let mut continuity = Continuity::new(match subscribe.resume {
        Resume::From(from) => Some(from),
        Resume::Live => None,
    });
    let mut out = EchoOut::default();
    let mut scratch = ReadBuf::new(0);
    let mut receive_time = now_ns();
    let mut poller = Poller::new(receive.idle);
    loop {
        // Every whole record in the buffer.
        loop {
            let data = buf.data();
            if data.len() < RecordHeader::LEN {
                buf.reserve_for(RecordHeader::LEN, RecordHeader::LEN);
                break;
            }
            let header = match RecordHeader::parse(data, MAX_RECORD) {
                Ok(h) => h,
                Err(e) => {
                    pipeline.stats.invalid_packets += 1;
                    // The stream's framing is lost: only a new connection finds it again.
                    let why =
                        format!("bad record header at stream byte {}: {}", stream_offset + e.offset as u64, e.what);
                    return lost_with_echoes(why, &out, pipeline);
                }
            };
            let total = RecordHeader::LEN + header.length as usize;
            if data.len() < total {
                buf.reserve_for(total, RecordHeader::LEN + MAX_RECORD);
                break;
            }
            // A record that skips ahead is believed once the next record's header follows on.
            let mut verdict = continuity.check(&header, None);
            if verdict == Verdict::NeedNext {
                let Some(after) = data.get(total..).filter(|after| after.len() >= RecordHeader::LEN) else {
                    buf.reserve_for(total + RecordHeader::LEN, 2 * RecordHeader::LEN + MAX_RECORD);
                    break;
                };
                match RecordHeader::parse(after, MAX_RECORD) {
                    Ok(after) => verdict = continuity.check(&header, Some(&after)),
                    Err(e) => {
                        pipeline.stats.invalid_packets += 1;
                        let at = stream_offset + total as u64 + e.offset as u64;
                        return lost_with_echoes(
                            format!("bad record header at stream byte {at}: {}", e.what),
                            &out,
                            pipeline,
                        );
                    }
                }
            }
            if let Verdict::Violation(violation) = verdict {
                pipeline.stats.invalid_packets += 1;
                pipeline.stats.echoes_dropped += out.unsent();
                tracing::warn!(at = stream_offset, sequence = violation.sequence, expected = ?violation.expected,
                    "protocol violation at stream byte {stream_offset}: {violation}; dropping the connection to resume after the last frame received");
                // Not a healthy connection lost: the wait before the next one keeps growing, so
                // a publisher that keeps breaking its numbering is not reconnected to in a loop.
                return Ok(Ended::Lost {
                    why: format!("protocol violation at stream byte {stream_offset}"),
                    greeted: false,
                });
            }
            let mut payload = &data[RecordHeader::LEN..total];
            // Raw frames are read byte by byte; other formats may read words in place (Cap'n
            // Proto does), so they get an aligned copy when a preceding record broke alignment.
            if header.format != Format::Raw && payload.as_ptr() as usize % 8 != 0 {
                payload = scratch.hold(payload);
            }
            match header.tag {
                RecordTag::Data => pipeline.protected_data(
                    Payload {
                        origin: Origin::Stream,
                        peer,
                        format: header.format,
                        bytes: payload,
                        first_sequence: header.sequence,
                        declared_frames: usize::from(header.frame_count),
                        receive_time,
                        place: Place::Stream(stream_offset + RecordHeader::LEN as u64),
                    },
                    hello.session,
                ),
                RecordTag::Format => {
                    // The first record names the first frame offered to this subscriber.
                    pipeline.tracker.expect_from(header.sequence);
                    pipeline.format(header.format, peer);
                    match resuming.take() {
                        Some(from) if from == header.sequence => pipeline.stats.resumes += 1,
                        Some(from) => tracing::warn!(
                            asked = from,
                            offered = header.sequence,
                            "the publisher could not resume (it keeps no ring of frames): the frames sent while away are lost"
                        ),
                        None => {}
                    }
                }
                RecordTag::End => {
                    pipeline.tracker.end(header.sequence);
                    match Totals::parse(payload) {
                        Ok(totals) => {
                            tracing::info!(frames = totals.frames, messages = totals.messages, "end of stream");
                            pipeline.stats.publisher_totals = Some(totals);
                        }
                        Err(e) => {
                            pipeline.stats.invalid_packets += 1;
                            tracing::warn!(at = stream_offset + RecordHeader::LEN as u64 + e.offset as u64,
                                error = %e.what, "end of stream with unreadable totals");
                        }
                    }
                    queue_echoes(pipeline, &mut out);
                    let _ = flush(&stream, &mut out, pipeline);
                    return Ok(Ended::Stop(Stop::End));
                }
                RecordTag::Refuse => {
                    let reason = String::from_utf8_lossy(payload);
                    return Err(RunError::Refused(format!("publisher {peer} refused the subscription: {reason}")));
                }
                RecordTag::Busy => {
                    let reason = String::from_utf8_lossy(payload);
                    return lost(format!("the publisher is busy: {reason}"), false);
                }
                RecordTag::Request | RecordTag::Gone => {
                    // Records of a recovery connection: a publisher never sends them on the
                    // stream. The length still frames them, so the stream goes on.
                    pipeline.stats.invalid_packets += 1;
                    if mdrelay_proto::warn::allow("recovery record on the stream") {
                        tracing::warn!(at = stream_offset, tag = ?header.tag,
                            "a recovery record on the stream connection; skipped");
                    }
                }
                RecordTag::Echo => {
                    if mdrelay_proto::warn::allow("echo from publisher") {
                        tracing::debug!(at = stream_offset, "ECHO record from the publisher ignored");
                    }
                }
            }
            stream_offset += total as u64;
            buf.consume(total);
            if pipeline.count_reached() {
                queue_echoes(pipeline, &mut out);
                let _ = flush(&stream, &mut out, pipeline);
                return Ok(Ended::Stop(Stop::Count));
            }
        }

        queue_echoes(pipeline, &mut out);
        if let Err(e) = flush(&stream, &mut out, pipeline) {
            return lost_with_echoes(format!("sending echoes: {e}"), &out, pipeline);
        }

        // Parked, the loop waits for the socket beside ticks, stops and room for echoes; busy, it
        // reads the socket at once and looks at the rest only every few dozen rounds, after
        // giving the runtime a turn (see crate::poll).
        let park = poller.park();
        if park || poller.housekeeping_due() {
            if !park {
                tokio::task::yield_now().await;
            }
            tokio::select! {
                biased;
                event = control.next() => match event {
                    Event::Tick => pipeline.tick(),
                    Event::Metrics => pipeline.export_metrics(),
                    Event::Stop(stop) => return Ok(Ended::Stop(stop)),
                },
                ready = stream.writable(), if !out.is_empty() && park => {
                    if let Err(e) = ready {
                        return lost_with_echoes(format!("sending echoes: {e}"), &out, pipeline);
                    }
                }
                read = read_some(&stream, buf), if park => match read {
                    Ok(0) => return lost_with_echoes(closed(buf, stream_offset), &out, pipeline),
                    Ok(n) => {
                        receive_time = now_ns();
                        pipeline.stats.bytes += n as u64;
                        poller.after(n);
                    }
                    Err(e) => {
                        let why = format!("reading at stream byte {}: {e}", stream_offset + buf.len() as u64);
                        return lost_with_echoes(why, &out, pipeline);
                    }
                },
                _ = std::future::ready(()), if !park => {}
            }
        }
        if !park {
            // Busy: whatever the socket has now, without waiting. Echoes that did not fit are
            // flushed again at the top of the next round.
            if buf.spare().is_empty() {
                // reserve_for guarantees room; reading into nothing would look like end of stream.
                return lost_with_echoes("read buffer full".into(), &out, pipeline);
            }
            match stream.try_read(buf.spare()) {
                Ok(0) => return lost_with_echoes(closed(buf, stream_offset), &out, pipeline),
                Ok(n) => {
                    buf.commit(n);
                    receive_time = now_ns();
                    pipeline.stats.bytes += n as u64;
                    poller.after(n);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => poller.after(0),
                Err(e) => {
                    let why = format!("reading at stream byte {}: {e}", stream_offset + buf.len() as u64);
                    return lost_with_echoes(why, &out, pipeline);
                }
            }
        }
    }
}

/// Why a connection that read end of file is lost: between records or inside one.
fn closed(buf: &ReadBuf, stream_offset: u64) -> String {
    if buf.is_empty() {
        "the publisher closed the connection without an end of stream".to_string()
    } else {
        format!("the publisher closed the connection inside a record at stream byte {stream_offset}")
    }
}

/// How the receive loop waits for data, and the socket options that go with it.
#[derive(Clone, Copy, Debug, Default)]
pub struct Receive {
    /// The idle strategy (see [`crate::poll`]).
    pub idle: IdleStrategy,
    /// Set SO_BUSY_POLL on the connection.
    pub busy_poll: bool,
}

/// Moves the pipeline's echoes into ECHO records waiting in `out`, dropping them (counted)
/// while too much is already waiting.
fn queue_echoes(pipeline: &mut Pipeline, out: &mut EchoOut) {
    if pipeline.echoes.is_empty() {
        return;
    }
    let format = pipeline.current_format().unwrap_or(Format::Raw);
    for echo in pipeline.echoes.drain(..) {
        if out.pending.len() + ECHO_RECORD > MAX_PENDING_ECHOES {
            pipeline.stats.echoes_dropped += 1;
            continue;
        }
        let header = RecordHeader {
            tag: RecordTag::Echo,
            format,
            frame_count: 0,
            length: Echo::LEN as u32,
            sequence: echo.sequence,
        };
        out.pending.extend_from_slice(&header.to_bytes());
        out.pending.extend_from_slice(&echo.to_bytes());
    }
}

/// ECHO records waiting to go back to the publisher.
#[derive(Default)]
struct EchoOut {
    /// Bytes not yet written; the front may be the rest of a partly written record.
    pending: Vec<u8>,
    /// Bytes written on this connection: records are 32 bytes back to back, so this tells how
    /// many records went out whole.
    written: u64,
}

impl EchoOut {
    fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }

    /// Echoes still waiting (a partly written one included), when the connection is lost.
    fn unsent(&self) -> u64 {
        (self.pending.len() as u64).div_ceil(ECHO_RECORD as u64)
    }
}

/// Writes what the socket takes now of the pending echoes without waiting; counts the records
/// fully written.
fn flush(stream: &TcpStream, out: &mut EchoOut, pipeline: &mut Pipeline) -> io::Result<()> {
    let mut done = 0;
    let result = loop {
        if done == out.pending.len() {
            break Ok(());
        }
        match stream.try_write(&out.pending[done..]) {
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break Ok(()),
            Err(e) => break Err(e),
        }
    };
    let records_before = out.written / ECHO_RECORD as u64;
    out.written += done as u64;
    pipeline.stats.echoes_sent += out.written / ECHO_RECORD as u64 - records_before;
    out.pending.drain(..done);
    result
}
