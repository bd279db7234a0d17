//! Relay chaining from a NATS subject: the stream another publisher's `[nats]` output feeds, as
//! this publisher's source, so a relay at the edge of a NATS distribution tree re-publishes it
//! over TCP or multicast on its LAN (docs/chaining.md).
//!
//! The subject is read by `mdrelay-client`'s NATS source, as `mdrelay-sub --nats` reads it: a
//! live core subscription, each message one relay datagram taken by proto's datagram receiver;
//! with `stream`, the JetStream stream that stores the subject is replayed first (`from_start`),
//! and whatever the client repairs from it comes as frames that fill a gap. Each frame's segment
//! is rebuilt ([`Relayed`]) with the origin's stamp and number, as from a TCP upstream, and the
//! relay adopts the upstream's session (from the first datagram, before its outputs are built).
//!
//! A relay's TCP subscribers take numbers that only go up, while a repaired frame comes after
//! later ones: proto's [`InOrder`] gate holds the frames after a gap, at most `repair_wait`, so
//! a repair in time goes out in its place; past that the frames go on without it, and the
//! missing frames are a gap downstream (a repair later still is dropped and counted). Without
//! a stream nothing can repair a gap, and `repair_wait` is 0.
//!
//! A relay more than a window behind the subject (stopped, or cut by the server as a slow
//! consumer) catches up from the stream in order (the client's catch-up), so its frames still go
//! downstream in their order and none is given up as too old.
//!
//! The relay ends with an error naming the subject when it cannot go on: no server within
//! `give_up_after`, no frame within it at start, nothing new on the subject nor in the stream
//! for it once the stream started (at least [`MIN_SILENCE`]: a publisher that died without its
//! END), an upstream that restarted (a new session), or a subscription the client ended.
//! Reconnection to another server of the cluster is the NATS client's own, for ever.

use crate::config::NatsUpstream as Settings;
use crate::item::Item;
use crate::relayed::{Relayed, StreamEnd, Upstream, UpstreamSummary};
use crate::stop::Stop;
use mdrelay_client::{Builder, ErrorKind, Event, Frame, OwnedFrame, RecoveryEvent, Subscriber, Waited};
use mdrelay_proto::backoff::duration_ns;
use mdrelay_proto::relay::client::{FrameInfo, Origin, Place, PlaceAt};
use mdrelay_proto::relay::{InOrder, Offered};
use mdrelay_telemetry::exit::{ExitStatus, WithExitStatus};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The longest one wait for the subject lasts once the stream has begun: the run's stop wakes it
/// (a wake handle registered with the stop), the subscriber gives up on a silent subject itself,
/// and the gate's deadline shortens it; this bound only keeps it finite.
const LONGEST_WAIT: Duration = Duration::from_secs(3600);
/// Frames held for gaps at most at once; past it the first gap is given up (DEEP10 at its peak
/// sends about 30,000 frames a second: several seconds of them).
const MAX_HELD: usize = 1 << 17;
/// Wait between attempts to reach the servers at start.
const RETRY: Duration = Duration::from_millis(500);
/// The least time a started stream may bring nothing new before the relay gives up on it
/// (`give_up_after` may be 0, which means at once only for reaching the servers).
const MIN_SILENCE: Duration = Duration::from_secs(1);

/// A NATS subject as a source of segments.
pub struct NatsUpstream {
    settings: Settings,
    /// "nats SUBJECT on URLS", for logs and the summary.
    name: String,
    stop: Arc<Stop>,
    subscriber: Subscriber,
    relayed: Relayed,
    /// Frames after a gap, waiting for it to be repaired.
    gate: InOrder<OwnedFrame>,
    /// Where the gate's clock starts.
    epoch: Instant,
    session: Option<u64>,
    /// Frames handed on.
    frames: u64,
    /// How the stream ended, and what the upstream's END said.
    end: StreamEnd,
}

impl NatsUpstream {
    /// Subscribes to the subject (trying to reach a server for `give_up_after`) and waits for
    /// its first datagram, so the upstream's session is known before this publisher's outputs
    /// are built; `stop` ends the waits.
    pub fn connect(settings: Settings, stop: Arc<Stop>) -> anyhow::Result<NatsUpstream> {
        let name = format!("nats {} on {}", settings.subject, settings.servers.join(","));
        let started = Instant::now();
        let mut builder = Builder::nats(settings.servers.join(","), settings.subject.clone())
            .crc(settings.crc)
            .frame_bytes(true)
            .from_start(settings.from_start)
            .give_up_after(settings.give_up_after.max(MIN_SILENCE));
        if let Some(stream) = &settings.stream {
            builder = builder.nats_stream(stream.clone());
        }
        builder = builder.nats_auth(&settings.auth);
        if let Some(ca) = &settings.tls_ca_file {
            builder = builder.nats_tls_ca_file(ca);
        }
        let subscriber = loop {
            match builder.clone().build() {
                Ok(subscriber) => break subscriber,
                Err(e) if e.kind() == ErrorKind::Unreachable && started.elapsed() < settings.give_up_after => {
                    tracing::warn!(upstream = %name, error = %e, "NATS servers out of reach; retrying");
                }
                Err(e) => {
                    let status =
                        if e.kind() == ErrorKind::Config { ExitStatus::Config } else { ExitStatus::UpstreamLost };
                    // The client's settings by the names they have in this file.
                    let setting = match e.setting() {
                        Some("nats_stream") => "source.upstream.stream",
                        Some("nats_creds_file") => "source.upstream.creds_file",
                        Some("nats_nkey_file") => "source.upstream.nkey_file",
                        Some("nats_user" | "nats_password_file") => {
                            "source.upstream.user / source.upstream.password_file"
                        }
                        Some("nats_tls_ca_file") => "source.upstream.tls_ca_file",
                        _ => "source.upstream.nats",
                    };
                    return Err(anyhow::anyhow!("{setting}: upstream {name}: {e}")).exit_status(status);
                }
            }
            if stop.wait(RETRY) {
                anyhow::bail!("stopped before the upstream {name} was reached");
            }
        };
        // The stop ends the subscriber's waits at once.
        let wake = subscriber.wake_handle();
        stop.on_set(move || wake.wake());
        tracing::info!(upstream = %name, stream = ?settings.stream, from_start = settings.from_start,
            "subscribed; waiting for the upstream's first frame");
        let repair_wait = duration_ns(settings.repair_wait);
        let mut source = NatsUpstream {
            relayed: Relayed::new(name.clone()),
            gate: InOrder::new(repair_wait, MAX_HELD),
            name,
            stop,
            subscriber,
            epoch: Instant::now(),
            session: None,
            frames: 0,
            end: StreamEnd::default(),
            settings,
        };
        while source.session.is_none() {
            if source.end.ended {
                let why = source.end.error.take().unwrap_or_else(|| format!("upstream {}: no stream", source.name));
                return Err(anyhow::anyhow!(why)).exit_status(ExitStatus::UpstreamLost);
            }
            if source.stop.is_set() {
                anyhow::bail!("stopped before the upstream {} sent a frame", source.name);
            }
            if started.elapsed() > source.settings.give_up_after {
                return Err(anyhow::anyhow!(
                    "upstream {}: no frame within {:?} (source.upstream.give_up_after); is its publisher running?",
                    source.name,
                    source.settings.give_up_after
                ))
                .exit_status(ExitStatus::UpstreamLost);
            }
            source.step(source.settings.give_up_after.saturating_sub(started.elapsed()));
        }
        tracing::info!(upstream = %source.name, session = format_args!("{:#x}", source.session()),
            "upstream greeted: this relay carries its session and sequence numbers");
        Ok(source)
    }

    /// The gate's clock: ns since this source was made.
    fn now(&self) -> i64 {
        duration_ns(self.epoch.elapsed())
    }

    /// One turn: the frames whose turn came handed on; else one event from the subscriber (or a
    /// wait for one, up to `longest` or the gate's deadline, ended at once by the stop).
    fn step(&mut self, longest: Duration) {
        if self.pop_due() {
            return;
        }
        let now = self.now();
        let wait = match self.gate.deadline() {
            Some(deadline) => longest.min(Duration::from_nanos(deadline.saturating_sub(now).max(0).unsigned_abs())),
            None => longest,
        };
        let NatsUpstream { subscriber, relayed, gate, frames, .. } = self;
        let waited = subscriber.next_event_timeout(wait);
        let event = match waited {
            Ok(Waited::Event(Event::Frame(frame))) => {
                match gate.offer(frame.sequence()) {
                    Offered::Now => *frames += u64::from(hand_on(relayed, &frame)),
                    Offered::Hold => gate.hold(frame.sequence(), frame.to_owned_frame(), now),
                    Offered::Late => {
                        if mdrelay_iex::warn::allow("upstream late") {
                            tracing::warn!(upstream = %relayed.connect, sequence = frame.sequence(),
                                "frame repaired after its place downstream had passed; dropped");
                        }
                    }
                }
                return;
            }
            Ok(Waited::Event(event)) => event.map_frame(|_| ()),
            Ok(Waited::TimedOut) => return,
            Ok(Waited::Finished) => {
                if !self.end.ended {
                    let why = format!("upstream {}: the subscription ended before the stream did", self.name);
                    self.lost(why);
                }
                return;
            }
            Err(e) => {
                let why = format!("upstream {}: {e}", self.name);
                self.lost(why);
                return;
            }
        };
        self.handle(event);
    }

    /// Hands on every frame held whose turn has come; whether one was.
    fn pop_due(&mut self) -> bool {
        let now = self.now();
        let mut any = false;
        while let Some((_, frame)) = self.gate.pop(now) {
            self.frames += u64::from(hand_on_owned(&mut self.relayed, &frame));
            any = true;
        }
        any
    }

    /// What the subscriber said besides frames.
    fn handle(&mut self, event: Event<()>) {
        match event {
            Event::SessionStarted { session, .. } => {
                self.session.get_or_insert(session);
            }
            Event::Restarted { old, new } => {
                let why = format!(
                    "upstream {} restarted (session {old:#x}, now {new:#x}): this relay's frames cannot follow a new numbering",
                    self.name
                );
                self.lost(why);
            }
            Event::FormatChanged { from, to } => match from {
                Some(old) => tracing::info!(upstream = %self.name, from = %old, %to, "upstream format switch"),
                None => tracing::info!(upstream = %self.name, format = %to, "upstream format"),
            },
            Event::Gap { first, count } if mdrelay_iex::warn::allow("upstream gap") => {
                let wait = self.settings.repair_wait;
                tracing::warn!(upstream = %self.name, first, count, ?wait,
                    "frames missing upstream; the frames after them wait for a repair this long at most");
            }
            // What the client could not repair will not come: the frames held go on without it.
            Event::GivenUp { .. } => self.gate.release(),
            Event::Recovery(RecoveryEvent::CatchingUp { from, ahead }) => {
                tracing::warn!(upstream = %self.name, from, ahead,
                    "more than a window behind the subject: catching up from the stream in order")
            }
            Event::Recovery(RecoveryEvent::CaughtUp { frames }) => {
                tracing::info!(upstream = %self.name, frames, "caught up: frames taken from the stream in order")
            }
            Event::Recovery(RecoveryEvent::EndAhead { next_sequence }) => tracing::warn!(upstream = %self.name,
                next_sequence, "end of stream far ahead of the frames the stream holds: taken once nothing new comes for give_up_after"),
            Event::End(end) => {
                tracing::info!(upstream = %self.name, next_sequence = end.next_sequence,
                    totals = ?end.totals.as_ref().map(|t| (t.frames, t.messages)), "upstream end of stream");
                self.end.end_sequence = Some(end.next_sequence);
                self.end.totals = end.totals;
                self.gate.release();
                self.pop_due();
                self.end.finish("end", None);
            }
            Event::Skipped(skipped) if mdrelay_iex::warn::allow("upstream skipped") => {
                tracing::warn!(upstream = %self.name, ?skipped, "received and not taken");
            }
            _ => {}
        }
    }

    /// The upstream cannot go on: what is held goes on, then the stream ends with `why`.
    fn lost(&mut self, why: String) {
        tracing::error!(upstream = %self.name, "{why}; the relay's stream ends here");
        self.gate.release();
        self.pop_due();
        self.end.finish("failed", Some(why));
    }
}

impl Upstream for NatsUpstream {
    fn session(&self) -> u64 {
        self.session.unwrap_or_default()
    }

    fn describe(&self) -> String {
        format!("upstream publisher {} (session {:#x})", self.name, self.session())
    }

    fn end(&self) -> &StreamEnd {
        &self.end
    }

    fn counts(&self) -> UpstreamSummary {
        let c = self.subscriber.counters();
        let gate = self.gate.counts();
        UpstreamSummary {
            frames: self.frames,
            gaps: gate.skipped,
            duplicates: c.duplicates + gate.late,
            decode_errors: c.decode_errors,
            undelimited_records: c.undelimited_payloads,
            invalid_records: c.invalid_packets,
            protocol_violations: 0,
            crc_failures: c.protection.crc_failures,
            format_switches: c.format_switches,
            formats_seen: c.formats_seen.iter().copied().collect(),
            reconnects: 0,
            resumes: 0,
            bytes: c.bytes,
            refused: false,
            ..UpstreamSummary::handed_on(self.name.clone(), self.session(), &self.relayed, &self.end)
        }
    }

    fn relayed(&self) -> &Relayed {
        &self.relayed
    }

    fn next_item(&mut self) -> Option<Item<'_>> {
        self.relayed.release();
        loop {
            if self.stop.is_set() {
                if !self.end.ended {
                    self.end.finish("stopped", None);
                }
                return None;
            }
            if self.relayed.has_ready() {
                break;
            }
            if self.end.ended {
                return None;
            }
            self.step(LONGEST_WAIT);
        }
        self.relayed.next_item()
    }
}

/// Where a frame from the subject is, for the frame visitor (a datagram has no stream bytes).
fn frame_info(sequence: u64, format: mdrelay_codec::Format, receive_time: i64) -> FrameInfo {
    FrameInfo { sequence, format, origin: Origin::Stream, index: 0, receive_time, at: PlaceAt(Place::Datagram(0), 0) }
}

/// A frame in its turn, rebuilt into `relayed`; whether it was (a frame that did not decode is
/// a gap downstream, as from a TCP upstream).
fn hand_on(relayed: &mut Relayed, frame: &Frame<'_>) -> bool {
    let (Some(header), Some(bytes)) = (frame.header(), frame.bytes()) else { return false };
    let info = frame_info(frame.sequence(), frame.format(), frame.receive_time());
    relayed.decoded(&info, bytes, header, frame.messages());
    true
}

/// A frame that waited for a gap, rebuilt into `relayed` in its turn.
fn hand_on_owned(relayed: &mut Relayed, frame: &OwnedFrame) -> bool {
    let (Some(header), Some(bytes)) = (frame.header(), frame.bytes()) else { return false };
    let info = frame_info(frame.sequence(), frame.format(), frame.receive_time());
    relayed.decoded(&info, bytes, header, frame.messages().iter().map(|m| m.as_message()));
    true
}
