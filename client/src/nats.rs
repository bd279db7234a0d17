//! The NATS driver: each message on the stream's subject is one relay datagram (header, then
//! frames, protected as on UDP), taken by [`DatagramReceiver`] exactly as from a UDP socket.
//!
//! Live, the messages come from a core subscription. From the start ([`Builder::from_start`]
//! with [`Builder::nats_stream`]), the live subscription is made first and its messages wait,
//! while JetStream's ordered consumer replays the stream from its first message up to the last
//! one stored when the replay began; then the waiting messages, then the live ones. What both
//! delivered is a duplicate the frame accounting drops, so the hand-over has no gap and hands
//! no frame out twice.
//!
//! Every wait is on a stream of messages or a sleep, so a wait that is dropped loses nothing.
//!
//! [`Builder::from_start`]: crate::Builder::from_start
//! [`Builder::nats_stream`]: crate::Builder::nats_stream

use crate::collect::Collector;
use crate::counters::Counters;
use crate::error::Error;
use crate::event::{End, Event};
use crate::net::Clock;
use crate::settings::Settings;
use crate::udp::datagram_notice;
use async_nats::jetstream::consumer::pull;
use bytes::Bytes;
use futures_util::StreamExt;
use mdrelay_proto::relay::Totals;
use mdrelay_proto::relay::client::{DatagramConfig, DatagramEvent, DatagramReceiver, Origin, ReaderConfig};
use std::collections::VecDeque;
use std::net::{Ipv4Addr, SocketAddr};

/// Live messages held while the replay catches up, at most; past it the live subscription is
/// not read (the server holds, then cuts a consumer that slow, which is counted as lost).
const MAX_HELD: usize = 1 << 20;

/// The replay of a stream from its start.
struct Replay {
    messages: pull::Ordered,
    /// The last stream sequence stored when the replay began: the hand-over point.
    until: u64,
}

/// A NATS subscription's driver.
pub(crate) struct NatsDriver {
    receiver: DatagramReceiver,
    live: async_nats::Subscriber,
    replay: Option<Replay>,
    held: VecDeque<Bytes>,
    /// The server, as the machine's peer (messages have no address of their own).
    peer: SocketAddr,
    end: Option<(u64, Totals)>,
    clock: Clock,
    finished: bool,
}

impl std::fmt::Debug for NatsDriver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NatsDriver").field("peer", &self.peer).field("replaying", &self.replay.is_some()).finish()
    }
}

impl NatsDriver {
    /// Connects, subscribes, and (from the start) begins the replay.
    pub async fn start(
        servers: &[String],
        subject: &str,
        stream: Option<&str>,
        settings: &Settings,
        clock: Clock,
    ) -> Result<NatsDriver, Error> {
        let unreachable = |reason: String| Error::Unreachable { address: servers.join(","), reason };
        let addrs: Vec<async_nats::ServerAddr> = servers
            .iter()
            .map(|url| url.parse().map_err(|e| Error::config("nats", format!("{url:?}: {e}"))))
            .collect::<Result<_, _>>()?;
        let client = async_nats::ConnectOptions::new()
            .name("mdrelay-client")
            .max_reconnects(None)
            .connection_timeout(settings.connect_timeout)
            .connect(addrs)
            .await
            .map_err(|e| unreachable(e.to_string()))?;
        let info = client.server_info();
        let peer = format!("{}:{}", info.host, info.port)
            .parse()
            .unwrap_or(SocketAddr::from((Ipv4Addr::UNSPECIFIED, info.port)));
        // The live subscription first: whatever is published from now on is in it.
        let live = client.subscribe(subject.to_string()).await.map_err(|e| unreachable(e.to_string()))?;
        let replay = match (settings.from_start, stream) {
            (true, Some(name)) => start_replay(&client, name, subject).await?,
            _ => None,
        };
        let config = DatagramConfig {
            reader: ReaderConfig {
                crc: settings.protection.crc,
                key: settings.key.clone(),
                symbols: settings.symbols.clone(),
                ..ReaderConfig::default()
            },
            from_start: settings.from_start,
            lines: None,
            recovery: None,
        };
        Ok(NatsDriver {
            receiver: DatagramReceiver::new(config),
            live,
            replay,
            held: VecDeque::new(),
            peer,
            end: None,
            clock,
            finished: false,
        })
    }

    /// The stream ended.
    pub fn is_finished(&self) -> bool {
        self.finished
    }

    /// Moves messages until the machine has something for the caller, or the stream is over.
    pub async fn step(&mut self, out: &mut Collector) -> Result<(), Error> {
        loop {
            self.pump(out);
            if out.has_items() || self.finished {
                return Ok(());
            }
            let now = self.clock.now();
            if let Some(deadline) = self.receiver.deadline()
                && deadline <= now
            {
                self.receiver.on_timeout(now);
                continue;
            }
            if self.replay.is_none()
                && let Some(message) = self.held.pop_front()
            {
                self.take(&message, out);
                continue;
            }
            self.wait(out).await?;
        }
    }

    /// Waits for a message (the replay's first, then the live ones) or the machine's deadline.
    async fn wait(&mut self, out: &mut Collector) -> Result<(), Error> {
        let clock = self.clock;
        let deadline = self.receiver.deadline();
        let sleep = async move {
            match deadline {
                Some(d) => tokio::time::sleep_until(clock.instant(d)).await,
                None => std::future::pending().await,
            }
        };
        let hold_more = self.held.len() < MAX_HELD;
        match &mut self.replay {
            Some(replay) => {
                tokio::select! {
                    replayed = replay.messages.next() => match replayed {
                        Some(Ok(message)) => {
                            // Caught up: the subject's last message when the replay began, or
                            // nothing pending (the live subscription has all that follows).
                            let done = message.info().map_or(true, |i| i.stream_sequence >= replay.until || i.pending == 0);
                            self.take(&message.message.payload.clone(), out);
                            if done {
                                self.replay = None;
                            }
                        }
                        Some(Err(e)) => {
                            return Err(Error::Io {
                                context: format!("replaying the NATS stream from its start: {e}"),
                                source: std::io::Error::other(e.to_string()),
                            });
                        }
                        None => self.replay = None,
                    },
                    live = self.live.next(), if hold_more => match live {
                        Some(message) => self.held.push_back(message.payload),
                        None => return Err(self.closed()),
                    },
                    _ = sleep => {}
                }
            }
            None => {
                tokio::select! {
                    live = self.live.next() => match live {
                        Some(message) => self.take(&message.payload, out),
                        None => return Err(self.closed()),
                    },
                    _ = sleep => {}
                }
            }
        }
        Ok(())
    }

    /// The subscription ended without the stream's end: the client was closed.
    fn closed(&self) -> Error {
        Error::Io {
            context: format!("the NATS subscription from {} ended before the stream did", self.peer),
            source: std::io::Error::from(std::io::ErrorKind::ConnectionAborted),
        }
    }

    /// One message into the machine.
    fn take(&mut self, payload: &[u8], out: &mut Collector) {
        let now = self.clock.now();
        out.stream_peer = Some(self.peer);
        self.receiver.datagram(Origin::Stream, payload, self.peer, now, self.clock.wall(), out);
        // Echoes have no way back over a subject: the publisher reads none.
        while self.receiver.next_echo().is_some() {}
    }

    /// Takes the machine's events.
    fn pump(&mut self, out: &mut Collector) {
        while let Some(event) = self.receiver.poll_event(out) {
            let notice = match event {
                DatagramEvent::End { next_sequence, totals, .. } => {
                    self.end = Some((next_sequence, totals));
                    continue;
                }
                DatagramEvent::Finished => {
                    self.finish_run(out);
                    let (next_sequence, totals) = match self.end.take() {
                        Some((next, totals)) => (next, Some(totals)),
                        None => (0, None),
                    };
                    let complete = totals.as_ref().is_some_and(|t| self.counters_with(out).matches(t));
                    Event::End(End { totals, next_sequence, complete })
                }
                other => match datagram_notice(other) {
                    Some(notice) => notice,
                    None => continue,
                },
            };
            out.notice(notice);
        }
    }

    /// The run is over.
    fn finish_run(&mut self, _out: &mut Collector) {
        if !self.finished {
            self.finished = true;
            self.receiver.finish_run();
        }
    }

    /// Ends the stream now.
    pub fn close(&mut self, out: &mut Collector) {
        self.finish_run(out);
    }

    /// What was counted, with what the collector counted.
    pub fn counters_with(&self, out: &Collector) -> Counters {
        let d = self.receiver.counts();
        let reader = self.receiver.reader();
        Counters {
            bytes: d.bytes,
            invalid_packets: d.invalid_packets,
            datagrams: d.datagrams,
            publisher_totals: self.receiver.publisher_totals().cloned(),
            ..Counters::of_reader(reader, &out.tally, Default::default())
        }
    }
}

/// The ordered consumer over the whole stream, and where it hands over to the live
/// subscription; `None` when the stream holds nothing yet.
async fn start_replay(client: &async_nats::Client, name: &str, subject: &str) -> Result<Option<Replay>, Error> {
    let not_found = |e: String| Error::config("nats_stream", format!("{name:?}: {e}"));
    let js = async_nats::jetstream::new(client.clone());
    let stream = js.get_stream(name).await.map_err(|e| not_found(e.to_string()))?;
    // The subject's last message now; none: nothing to replay.
    let Ok(last) = stream.get_last_raw_message_by_subject(subject).await else { return Ok(None) };
    let until = last.sequence;
    let consumer = stream
        .create_consumer(pull::OrderedConfig {
            filter_subject: subject.to_string(),
            deliver_policy: async_nats::jetstream::consumer::DeliverPolicy::All,
            ..Default::default()
        })
        .await
        .map_err(|e| not_found(e.to_string()))?;
    let messages = consumer.messages().await.map_err(|e| not_found(e.to_string()))?;
    Ok(Some(Replay { messages, until }))
}
