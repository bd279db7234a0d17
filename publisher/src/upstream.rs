//! Relay chaining: another mdrelay publisher's TCP stream as this publisher's source, so relays
//! form a distribution tree across hosts (docs/chaining.md).
//!
//! The relay is a subscriber of its upstream, speaking the relay protocol as `mdrelay-sub` does:
//! greeting, answer, then `FORMAT`, `DATA` and `END` records. It follows the upstream's format,
//! switches included, decodes every frame and rebuilds the IEX-TP segment it carried
//! ([`Resegmenter`](mdrelay_codec::resegment::Resegmenter): a raw frame's segment is kept byte
//! for byte), which the engine then publishes in this relay's own format and transports.
//!
//! Each frame keeps the origin's publish time and sequence number
//! ([`Origin`](crate::item::Origin)): a leaf measures
//! origin-to-leaf latency, and a gap anywhere upstream stays a gap downstream. The relay adopts
//! the upstream's session too (it connects before its outputs are built), so a leaf sees one
//! session through the whole chain. Each hop measures its own latency: receipt time minus the
//! origin's publish time.
//!
//! This module is a driver. Every decision is made by proto's client machines: a
//! [`StreamClient`] in the relay's role, over one `StreamConnection` per connection and a
//! `FrameReader` in its ordered mode. They check the handshake (an encrypted upstream, a CRC
//! setting that differs, a new session), walk the records (each bounded before anything is read
//! into memory, each checked against the connection's continuity), check each frame's CRC-32C
//! with `crc`, decide whether an `END` fits the stream, where a new connection resumes (the frame
//! after the last one handed on; protocol version 2), and when to connect again and when to give
//! up: at once after losing a connection that worked, then with a doubling wait; after a
//! protocol violation (a record that does not fit, a frame that fails its CRC) after a wait that
//! grows while violations follow without a frame taken, giving up after `give_up_after`, as for
//! an upstream out of reach. The hot thread only moves bytes and time between a blocking socket
//! and the machine (each wait, for bytes, a connection or the next attempt, ends at once when
//! the run stops: it waits on the stop's descriptor beside the socket), rebuilds each frame's
//! segment, and logs what the machine reports.
//!
//! The relay ends with an error naming the upstream when it cannot go on: no connection within
//! `give_up_after`, or an upstream that restarted (a new session, whose numbering the relay's
//! frames cannot follow). Its own stream then ends with its `END` and totals, so its subscribers
//! stop instead of waiting; the summary and the exit status say why. That END says the stream was
//! cut short ([`Totals::truncated`]), so no leaf reports its totals as matching; after the
//! upstream's own END, the relay's END carries the upstream's totals
//! ([`TcpUpstream::end_totals`]).
//!
//! [`Upstream`] is what the engine sees of either this TCP upstream or a NATS subject
//! ([`crate::upstream_nats`]).

use crate::config::{Upstream as TcpSettings, check_not_self};
use crate::item::Item;
use crate::relayed::{Relayed, StreamEnd};
pub use crate::relayed::{Upstream, UpstreamSource, UpstreamSummary};
use crate::stop::{Stop, wait_readable};
use mdrelay_proto::backoff::duration_ns;
use mdrelay_proto::relay::client::{
    ClientAction, ClientEvent, Disposition, Finish, Start, StreamClient, StreamClientConfig,
};
use mdrelay_runtime::clock::wall_clock_ns;
use mdrelay_telemetry::exit::{ExitStatus, WithExitStatus};
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::os::fd::AsFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// TCP keepalive: an upstream host that vanished without closing (power, cable) is noticed
/// within about `KEEPALIVE_IDLE + KEEPALIVE_RETRIES × KEEPALIVE_INTERVAL` of silence.
const KEEPALIVE_IDLE: Duration = Duration::from_secs(5);
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(1);
const KEEPALIVE_RETRIES: u32 = 5;

/// Another publisher's TCP stream as a source of segments.
pub struct TcpUpstream {
    settings: TcpSettings,
    /// Addresses of this publisher's own servers, by setting: never an upstream.
    own: Vec<(&'static str, SocketAddr)>,
    stop: Arc<Stop>,
    /// Every decision about the stream.
    client: StreamClient,
    socket: Option<TcpStream>,
    relayed: Relayed,
    /// Where the machine's clock starts.
    epoch: Instant,
    /// How the stream ended, and what the upstream's END said.
    end: StreamEnd,
    refused: bool,
    /// Still in [`TcpUpstream::connect`]: how the stream ends is its caller's error, not a
    /// log line.
    starting: bool,
}

impl TcpUpstream {
    /// Connects to the upstream (trying for `give_up_after`) and completes the handshake, so its
    /// session is known before this publisher's outputs are built; `own` are this publisher's
    /// servers, which must not be the upstream; `stop` ends the attempts.
    pub fn connect(
        settings: TcpSettings,
        own: Vec<(&'static str, SocketAddr)>,
        stop: Arc<Stop>,
    ) -> anyhow::Result<TcpUpstream> {
        let client = StreamClient::new(StreamClientConfig::relay(
            settings.connect.clone(),
            settings.crc,
            settings.reconnect_max,
            settings.give_up_after,
            settings.handshake_timeout,
            settings.idle_timeout,
        ));
        let mut source = TcpUpstream {
            relayed: Relayed::new(settings.connect.clone()),
            settings,
            own,
            stop,
            client,
            socket: None,
            epoch: Instant::now(),
            end: StreamEnd::default(),
            refused: false,
            starting: true,
        };
        while source.client.session().is_none() {
            if source.end.ended {
                let status = if source.refused { ExitStatus::Refused } else { ExitStatus::UpstreamLost };
                let why = source
                    .end
                    .error
                    .take()
                    .unwrap_or_else(|| format!("upstream {}: no stream", source.settings.connect));
                return Err(anyhow::anyhow!(why)).exit_status(status);
            }
            if source.stop.is_set() {
                anyhow::bail!("stopped before the upstream {} was reached", source.settings.connect);
            }
            source.step();
        }
        source.starting = false;
        Ok(source)
    }

    /// The machine's clock: ns since this source was made.
    fn now(&self) -> i64 {
        duration_ns(self.epoch.elapsed())
    }

    /// One turn: the machine's events handled (its frames rebuilt, its answer written) until
    /// frames wait to be handed on, a greeting was taken, or records that gave nothing went on
    /// for the machine's budget (so the caller looks at the stop flag, whatever the upstream
    /// sends); else what it asks for next: a connection, a wait, or a read.
    fn step(&mut self) {
        while let Some(event) = self.client.poll_event(&mut self.relayed) {
            let turn = matches!(event, ClientEvent::Greeted { .. } | ClientEvent::Quiet);
            self.handle(event);
            self.flush();
            if turn || self.relayed.has_ready() {
                return;
            }
        }
        if self.end.ended {
            return;
        }
        self.flush();
        match self.client.poll_action(self.now()) {
            ClientAction::Connect => self.open(),
            ClientAction::Wait(until) => {
                let left = until.saturating_sub(self.now());
                if left > 0 {
                    self.stop.wait(Duration::from_nanos(left.unsigned_abs()));
                }
            }
            ClientAction::Run => self.read(),
            ClientAction::Finished => {
                if let Some(finish) = self.client.finished().cloned() {
                    self.finished(finish);
                }
            }
        }
    }

    /// Writes what the connection has to write (the answer), blocking up to the handshake time.
    fn flush(&mut self) {
        let TcpUpstream { socket: Some(socket), client, epoch, .. } = self else { return };
        let pending = client.transmit();
        if pending.is_empty() {
            return;
        }
        let written = pending.len();
        match socket.write_all(pending) {
            Ok(()) => client.transmitted(written),
            Err(error) => client.write_failed(&error, duration_ns(epoch.elapsed())),
        }
    }

    /// Waits for the socket to have bytes, the machine's next deadline or the stop, whichever
    /// comes first; reads what the socket has, then tells the machine the time.
    fn read(&mut self) {
        let TcpUpstream { socket: Some(socket), client, epoch, stop, .. } = self else { return };
        if client.read_buf().is_empty() {
            // The connection is over: its events say how.
            return;
        }
        let now = duration_ns(epoch.elapsed());
        let left =
            client.deadline().map(|deadline| Duration::from_nanos(deadline.saturating_sub(now).max(0).unsigned_abs()));
        let readable = match wait_readable(&[socket.as_fd(), stop.fd()], left) {
            Ok(ready) => ready.contains(&0),
            Err(e) => {
                client.read_failed(&e, now);
                return;
            }
        };
        if readable {
            let read = socket.read(client.read_buf());
            let now = duration_ns(epoch.elapsed());
            match read {
                Ok(n) => client.received(n, now, wall_clock_ns()),
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut | io::ErrorKind::Interrupted
                    ) => {}
                Err(e) => client.read_failed(&e, now),
            }
        }
        let now = duration_ns(epoch.elapsed());
        if client.deadline().is_some_and(|deadline| now >= deadline) {
            client.on_timeout(now);
        }
    }

    /// One attempt, as the machine asks: resolve, check the address is not this publisher's,
    /// connect a socket and hand it to the machine (which then reads the greeting).
    fn open(&mut self) {
        self.socket = None;
        let connect = self.settings.connect.clone();
        let addrs: Vec<SocketAddr> = match connect.to_socket_addrs() {
            Ok(addrs) => addrs.collect(),
            Err(e) => return self.client.connect_failed(&format!("cannot resolve {connect}: {e}"), self.now()),
        };
        if addrs.is_empty() {
            return self.client.connect_failed(&format!("{connect} resolves to no address"), self.now());
        }
        for addr in &addrs {
            if let Err(e) = check_not_self(*addr, &self.own) {
                return self.client.give_up(format!("{e:#}"));
            }
        }
        let mut last = String::new();
        let mut connected = None;
        for addr in &addrs {
            match connect_unless_stopped(addr, self.settings.connect_timeout, &self.stop) {
                Ok(None) => return,
                Ok(Some(stream)) => {
                    connected = Some((stream, *addr));
                    break;
                }
                Err(e) if e.kind() == io::ErrorKind::TimedOut => {
                    last = format!(
                        "connecting to {addr} took longer than {:?} (source.upstream.connect_timeout)",
                        self.settings.connect_timeout
                    );
                }
                Err(e) => last = format!("connecting to {addr}: {e}"),
            }
        }
        let Some((stream, peer)) = connected else { return self.client.connect_failed(&last, self.now()) };
        let keepalive = socket2::TcpKeepalive::new()
            .with_time(KEEPALIVE_IDLE)
            .with_interval(KEEPALIVE_INTERVAL)
            .with_retries(KEEPALIVE_RETRIES);
        let _ = socket2::SockRef::from(&stream).set_tcp_keepalive(&keepalive);
        // Reads wait on the socket's readiness beside the stop (`read`), so they need no timeout.
        let timeouts = stream.set_write_timeout(Some(self.settings.handshake_timeout));
        if let Err(e) = timeouts {
            return self.client.connect_failed(&format!("upstream {peer}: {e}"), self.now());
        }
        self.socket = Some(stream);
        self.relayed.peer = Some(peer);
        self.client.connected(peer, self.now());
    }

    /// Logs what the machine reports, and keeps what the summary needs.
    fn handle(&mut self, event: ClientEvent) {
        let connect = self.settings.connect.as_str();
        let peer = self.relayed.peer();
        match event {
            ClientEvent::Greeted { hello, resume, first } => {
                if let Start::ResumeUnsupported { version } = resume {
                    tracing::warn!(upstream = %peer, version,
                        "the upstream speaks relay protocol version {version}: it cannot resume; frames sent while away are a gap downstream");
                }
                if first {
                    tracing::info!(upstream = %peer, session = format_args!("{:#x}", hello.session), stream = hello.stream,
                        format = %hello.format, next_sequence = hello.next_sequence, version = hello.protocol_version,
                        "upstream greeted: this relay carries its session and sequence numbers");
                }
            }
            ClientEvent::Reconnected { attempt } => tracing::info!(upstream = %connect, attempt, "reconnected"),
            // A relay does not ask its upstream for a snapshot: its state follows what it relays.
            ClientEvent::Snapshot(_) | ClientEvent::SnapshotMissing { .. } => {}
            ClientEvent::Resumed { from } => {
                tracing::info!(upstream = %peer, from, "resumed after the last frame received");
            }
            ClientEvent::ResumeFailed { asked, offered } => {
                tracing::warn!(upstream = %peer, asked, offered,
                    "the upstream could not resume there (its ring no longer holds those frames): they stay a gap downstream");
            }
            ClientEvent::OutOfPlace { tag, at } => {
                if mdrelay_iex::warn::allow("upstream record") {
                    tracing::warn!(upstream = %peer, at, tag = ?tag, "record out of place on the stream; skipped");
                }
            }
            ClientEvent::Violation { violation, at } => {
                tracing::warn!(upstream = %peer, at, sequence = violation.sequence, expected = ?violation.expected,
                    "protocol violation at stream byte {at}: {violation}; dropping the connection to resume after the last frame received");
            }
            ClientEvent::FrameCheckFailed { sequence, at, error } => {
                tracing::warn!(upstream = %peer, at, sequence, %error,
                    "frame changed on the way; dropping the connection to resume from this frame");
            }
            ClientEvent::End(end) => {
                if end.believed {
                    self.end.end_sequence = Some(end.next_sequence);
                } else if mdrelay_iex::warn::allow("upstream end") {
                    let expected = self.client.reader().ordered_next().unwrap_or(1);
                    tracing::warn!(upstream = %peer, next_sequence = end.next_sequence, expected,
                        "END names a next frame that does not fit the stream; ignored");
                }
                match end.totals {
                    Ok(totals) => {
                        tracing::info!(upstream = %peer, frames = totals.frames, messages = totals.messages,
                            "upstream end of stream");
                        self.end.totals = Some(totals);
                    }
                    Err((at, e)) => {
                        tracing::warn!(upstream = %peer, at, error = %e.what, "upstream end of stream with unreadable totals");
                    }
                }
            }
            ClientEvent::ConnectFailed { why, attempt, retry_in } => {
                // A handshake that failed leaves nothing to keep open through the wait.
                self.socket = None;
                let why = why.unwrap_or_default();
                tracing::warn!(upstream = %connect, attempt, retry_in = ?shown(retry_in), "{why}; retrying");
            }
            ClientEvent::Lost { closed, retry_in } => {
                self.socket = None;
                if closed.reason.disposition() == Disposition::Violation {
                    tracing::info!(upstream = %connect, retry_in = ?shown(retry_in), "reconnecting after a protocol violation");
                }
                tracing::warn!(upstream = %connect, "connection lost: {}; reconnecting", closed.why);
            }
            ClientEvent::Finished(finish) => self.finished(finish),
            // The caller's turn (see `step`): nothing to log.
            ClientEvent::Quiet => {}
            // A relay's connections are logged when greeted; a restart ends it (Finished).
            ClientEvent::Connected { .. } | ClientEvent::Restarted { .. } => {}
        }
    }

    /// The stream is over, as the machine decided.
    fn finished(&mut self, finish: Finish) {
        self.socket = None;
        let why = match finish {
            Finish::End => return self.finish("end", None),
            Finish::Refused(closed) => {
                self.refused = true;
                closed.why
            }
            Finish::Fatal(why) => why,
        };
        if !self.starting {
            tracing::error!(upstream = %self.settings.connect, "{why}; the relay's stream ends here");
        }
        self.finish("failed", Some(why));
    }

    fn finish(&mut self, reason: &'static str, error: Option<String>) {
        self.end.finish(reason, error);
        self.socket = None;
    }
}

impl Upstream for TcpUpstream {
    fn session(&self) -> u64 {
        self.client.session().unwrap_or_default()
    }

    fn describe(&self) -> String {
        format!("upstream publisher {} (session {:#x})", self.settings.connect, self.session())
    }

    fn end(&self) -> &StreamEnd {
        &self.end
    }

    fn counts(&self) -> UpstreamSummary {
        let client = self.client.counts();
        let reader = self.client.reader();
        let frames = reader.counts();
        UpstreamSummary {
            frames: frames.frames_decoded,
            gaps: frames.ordered.gaps,
            duplicates: frames.ordered.duplicates,
            decode_errors: frames.decode_errors,
            undelimited_records: frames.undelimited_payloads,
            invalid_records: client.connection.out_of_place + client.connection.unreadable_totals,
            protocol_violations: client.connection.violations,
            crc_failures: frames.frame_check_failures,
            format_switches: reader.format_switches(),
            formats_seen: reader.formats_seen().clone(),
            reconnects: client.reconnects,
            resumes: client.resumes,
            bytes: client.connection.bytes,
            refused: self.refused,
            ..UpstreamSummary::handed_on(self.settings.connect.clone(), self.session(), &self.relayed, &self.end)
        }
    }

    fn relayed(&self) -> &Relayed {
        &self.relayed
    }

    fn next_item(&mut self) -> Option<Item<'_>> {
        self.relayed.release();
        let ready = loop {
            if self.stop.is_set() {
                if !self.end.ended {
                    self.finish("stopped", None);
                }
                return None;
            }
            // Frames read before an END (or a loss for good) are handed on first.
            if let Some(ready) = self.relayed.take() {
                break ready;
            }
            if self.end.ended {
                return None;
            }
            self.step();
        };
        let bytes = &self.relayed.bytes[ready.start..ready.end];
        Some(Item { time_ns: ready.time_ns, bytes, origin: Some(ready.origin) })
    }
}

/// Connects to `addr` within `timeout`, unless the stop comes first (`Ok(None)`: the caller
/// looks at the stop next). A timeout is `TimedOut`, as `TcpStream::connect_timeout` gives it.
fn connect_unless_stopped(addr: &SocketAddr, timeout: Duration, stop: &Stop) -> io::Result<Option<TcpStream>> {
    use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
    use socket2::{Domain, Socket, Type};
    let socket = Socket::new(Domain::for_address(*addr), Type::STREAM, None)?;
    socket.set_nonblocking(true)?;
    match socket.connect(&(*addr).into()) {
        Ok(()) => {}
        Err(e) if e.raw_os_error() == Some(nix::libc::EINPROGRESS) => {
            let deadline = Instant::now() + timeout;
            loop {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Err(io::Error::from(io::ErrorKind::TimedOut));
                }
                let ms = left.as_millis().clamp(1, i32::MAX as u128) as i32;
                let mut fds =
                    [PollFd::new(socket.as_fd(), PollFlags::POLLOUT), PollFd::new(stop.fd(), PollFlags::POLLIN)];
                match poll(&mut fds, PollTimeout::try_from(ms).unwrap_or(PollTimeout::MAX)) {
                    Ok(_) | Err(nix::errno::Errno::EINTR) => {}
                    Err(e) => return Err(e.into()),
                }
                if stop.is_set() {
                    return Ok(None);
                }
                if fds[0].revents().is_some_and(|r| !r.is_empty()) {
                    break;
                }
            }
            if let Some(e) = socket.take_error()? {
                return Err(e);
            }
        }
        Err(e) => return Err(e),
    }
    socket.set_nonblocking(false)?;
    Ok(Some(socket.into()))
}

/// A wait of ns as `Debug` shows a duration (`100ms`), as the relay has always logged it.
fn shown(ns: i64) -> Duration {
    Duration::from_nanos(ns.max(0).unsigned_abs())
}
