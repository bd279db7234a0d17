//! NATS output: every datagram the coalescer seals (relay header, then frames, protected as on
//! UDP) is published to one subject, stored in a JetStream stream. Subscribers read it with the
//! same datagram code as UDP, and JetStream's copy serves late joiners and repairs.
//!
//! The hot thread never waits on the server: it hands each message to a bounded queue
//! ([`NatsOut`]); a task on the runtime publishes from it with at most `max_pending_acks`
//! messages unacknowledged, and publishes again any message whose acknowledgement failed or
//! timed out, or was still awaited when the connection was lost (at once on the new
//! connection: a server restarted, a cluster node lost). Every message carries `Nats-Msg-Id` =
//! session and first sequence, so the stream keeps one copy whatever is sent twice. A full
//! queue follows `nats.slow_server`: wait for room, drop and count, or fail the run; a server
//! not up yet at the start is the same as a slow one (the queue fills while it is away).
//!
//! A new message is taken only while the frames published since the oldest message not yet
//! stored stay within half a subscriber's window ([`Unstored`]): a stream without a leader for
//! a while (its node lost, an election) holds the live subject back, where it would otherwise
//! run past what subscribers can still repair once the messages published again are stored.
//!
//! The END has a way of its own to the task, so the hot thread never waits to hand it over;
//! the task publishes it once everything before it is acknowledged, since a subscriber ends on
//! it and a message published again after it would come too late.

use crate::config::{Nats, NatsAuth, NatsRetention, NatsStorage, SlowServerPolicy};
use anyhow::{Context, Result, anyhow};
use async_nats::jetstream::{self, stream};
use bytes::Bytes;
use futures_util::StreamExt;
use futures_util::future::{BoxFuture, FutureExt};
use futures_util::stream::FuturesUnordered;
use mdrelay_proto::codec::Format;
use mdrelay_proto::relay::{DatagramHeader, DatagramKind, Protector, Unstored};
use mdrelay_telemetry::exit::{ExitStatus, WithExitStatus};
use std::future::IntoFuture;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::mpsc::{self, error::TrySendError};
use tokio::sync::oneshot;

/// How long the publishing task has at the end of the stream to have everything acknowledged.
const DRAIN: Duration = Duration::from_secs(30);

/// How long one acknowledgement may take before the message is published again. JetStream
/// answers in milliseconds; one that does not come went to a stream leader that died, and the
/// message is stored only once published again. A subscriber that missed it live can repair it
/// while it is within its 65,536-frame window, about 5 s at 12,000 frames a second: 5 s here
/// (as before) put the copy past it.
const ACK_TIMEOUT: Duration = Duration::from_secs(2);

/// How long the connection stays open once the END is stored.
const END_LINGER: Duration = Duration::from_secs(1);

/// Wait between two publications of a message the server did not take.
const RETRY_WAIT: Duration = Duration::from_millis(100);

/// The NATS output's counts, shared by the hot thread, the publishing task and the metrics.
#[derive(Debug, Default)]
pub struct NatsCounters {
    /// Messages handed to the client (first publications).
    pub published: AtomicU64,
    /// Messages JetStream acknowledged as stored.
    pub acknowledged: AtomicU64,
    /// Acknowledged as duplicates: the stream had that id already (a retry, or another
    /// publisher of the same session).
    pub duplicates: AtomicU64,
    /// Publications that failed or were not acknowledged in time, each published again.
    pub retries: AtomicU64,
    /// Messages dropped because the queue was full (`slow_server = "drop"`).
    pub dropped: AtomicU64,
    /// Messages published and not yet acknowledged.
    pub pending_acks: AtomicU64,
    /// Connections made to a server after the first (fail-over, server restarts).
    pub reconnects: AtomicU64,
    /// Connections lost.
    pub disconnects: AtomicU64,
}

/// The NATS output's counts at the end of a run.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct NatsSummary {
    /// Messages published (first publications).
    pub published: u64,
    /// Messages JetStream acknowledged.
    pub acknowledged: u64,
    /// Acknowledged as duplicates of a stored id.
    pub duplicates: u64,
    /// Publications repeated after a failure or a missing acknowledgement.
    pub retries: u64,
    /// Messages dropped for a full queue.
    pub dropped: u64,
    /// Connections after the first.
    pub reconnects: u64,
    /// Connections lost.
    pub disconnects: u64,
}

impl NatsCounters {
    /// The counts now.
    pub fn summary(&self) -> NatsSummary {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        NatsSummary {
            published: get(&self.published),
            acknowledged: get(&self.acknowledged),
            duplicates: get(&self.duplicates),
            retries: get(&self.retries),
            dropped: get(&self.dropped),
            reconnects: get(&self.reconnects),
            disconnects: get(&self.disconnects),
        }
    }
}

/// What the publishing task reports when it stops before the end of the stream.
type Failure = Arc<Mutex<Option<anyhow::Error>>>;

/// Connections made so far: a publication still unacknowledged when the count moves was sent on
/// a connection that is gone, and its acknowledgement will never come.
type Connections = tokio::sync::watch::Receiver<u64>;

/// The hot thread's side: a bounded queue to the publishing task.
pub struct NatsOut {
    tx: Option<mpsc::Sender<Bytes>>,
    /// The END's own way to the task: never dropped and never waited for, whatever the queue.
    end: Option<oneshot::Sender<Bytes>>,
    policy: SlowServerPolicy,
    session: u64,
    counters: Arc<NatsCounters>,
    failure: Failure,
    /// Set once the task is gone or the policy failed the run; the engine ends with it.
    failed: bool,
}

/// The publishing task, to be awaited after the stream's end.
pub struct NatsTask {
    handle: tokio::task::JoinHandle<()>,
    failure: Failure,
    /// The counts, for the summary and the metrics.
    pub counters: Arc<NatsCounters>,
}

impl NatsOut {
    /// Connects to the servers, checks (or creates) the stream, and starts the publishing task.
    /// A server not up yet is waited for in the background; refused credentials and a stream
    /// that does not fit are configuration errors (exit 2), named by setting.
    pub async fn start(settings: &Nats, session: u64) -> Result<(NatsOut, NatsTask)> {
        let counters = Arc::new(NatsCounters::default());
        let (connections_tx, connections) = tokio::sync::watch::channel(0u64);
        let client = connect(settings, &counters, Arc::new(connections_tx)).await?;
        let js = jetstream::new(client.clone());
        let checked = if client.connection_state() == async_nats::connection::State::Connected {
            ensure_stream(&js, settings).await?;
            true
        } else {
            tracing::warn!(servers = ?settings.servers, "NATS server not reachable yet; publishing when it is");
            false
        };
        let (tx, rx) = mpsc::channel(settings.queue);
        let (end_tx, end_rx) = oneshot::channel();
        let failure: Failure = Arc::default();
        let task = Publisher {
            settings: settings.clone(),
            js,
            client,
            counters: counters.clone(),
            stream_checked: checked,
            connections,
        };
        let task_failure = failure.clone();
        let handle = tokio::spawn(async move {
            if let Err(e) = task.run(rx, end_rx).await {
                tracing::error!(error = %format!("{e:#}"), "NATS publishing stopped");
                *task_failure.lock().unwrap_or_else(|p| p.into_inner()) = Some(e);
            }
        });
        tracing::info!(servers = ?settings.servers, subject = %settings.subject, stream = %settings.stream, "publishing to NATS");
        let out = NatsOut {
            tx: Some(tx),
            end: Some(end_tx),
            policy: settings.slow_server,
            session,
            counters: counters.clone(),
            failure: failure.clone(),
            failed: false,
        };
        Ok((out, NatsTask { handle, failure, counters }))
    }

    /// Queues one sealed datagram; under `block`, waits for room (the stop flag ends the wait).
    pub fn send(&mut self, message: Bytes, stop: &AtomicBool) {
        let Some(tx) = &self.tx else { return };
        let mut message = message;
        loop {
            match tx.try_send(message) {
                Ok(()) => return,
                Err(TrySendError::Closed(_)) => {
                    self.failed = true;
                    self.close();
                    return;
                }
                Err(TrySendError::Full(back)) => match self.policy {
                    SlowServerPolicy::Drop => {
                        self.counters.dropped.fetch_add(1, Ordering::Relaxed);
                        return;
                    }
                    SlowServerPolicy::Fail => {
                        self.failure.lock().unwrap_or_else(|p| p.into_inner()).get_or_insert_with(|| {
                            anyhow!("nats: the server takes messages slower than they come (queue full; nats.slow_server = \"fail\")")
                        });
                        self.failed = true;
                        self.close();
                        return;
                    }
                    SlowServerPolicy::Block => {
                        if stop.load(Ordering::Relaxed) {
                            return;
                        }
                        message = back;
                        std::thread::sleep(Duration::from_micros(50));
                    }
                },
            }
        }
    }

    /// The error the run ends with, once the output failed.
    pub fn failure(&mut self) -> Option<anyhow::Error> {
        if !self.failed {
            return None;
        }
        let taken = self.failure.lock().unwrap_or_else(|p| p.into_inner()).take();
        Some(taken.unwrap_or_else(|| anyhow!("nats: the publishing task stopped")))
    }

    /// Hands the END datagram (the totals) to the task and closes the queue: the task publishes
    /// what is queued, then the END once everything before it is acknowledged. The END is not
    /// dropped (it says the stream is whole), nor does the hot thread wait for a slow or frozen
    /// server to take it, whatever `slow_server` says.
    pub fn end(&mut self, format: Format, next_sequence: u64, totals: &[u8], protector: &mut Protector) {
        let datagram = crate::udp::end_datagram(self.session, format, next_sequence, totals, protector);
        // The END first, then the queue closed: the task looks for the END when it finds the
        // queue closed, and the other order let it find nothing now and then (a loaded host),
        // so it stopped without publishing the END and subscribers waited for it for ever.
        if self.tx.is_some()
            && let Some(end) = self.end.take()
        {
            // The task is gone if this fails, and `failure` says why.
            let _ = end.send(datagram);
        }
        self.close();
    }

    /// Closes the queue and the END's way: the task publishes what it has and stops.
    fn close(&mut self) {
        self.tx = None;
        self.end = None;
    }
}

impl NatsTask {
    /// Waits for the task to publish everything queued and have it acknowledged (bounded).
    pub async fn finish(self) -> Result<()> {
        match tokio::time::timeout(DRAIN + ACK_TIMEOUT, self.handle).await {
            Ok(_) => {}
            Err(_) => return Err(anyhow!("nats: messages still unacknowledged {} s after the end", DRAIN.as_secs())),
        }
        match self.failure.lock().unwrap_or_else(|p| p.into_inner()).take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

/// Connects with the configured credentials. A refusal of the credentials fails at once; an
/// unreachable server is retried in the background (the client reconnects for ever).
async fn connect(
    settings: &Nats,
    counters: &Arc<NatsCounters>,
    connections: Arc<tokio::sync::watch::Sender<u64>>,
) -> Result<async_nats::Client> {
    let options = || async {
        let mut options = async_nats::ConnectOptions::new()
            .name("mdrelay-pub")
            .max_reconnects(None)
            .connection_timeout(Duration::from_secs(2));
        let event_counters = counters.clone();
        let connected_once = Arc::new(AtomicBool::new(false));
        let event_connections = connections.clone();
        options = options.event_callback(move |event| {
            let counters = event_counters.clone();
            let connected_once = connected_once.clone();
            let connections = event_connections.clone();
            async move {
                match event {
                    async_nats::Event::Connected => {
                        if connected_once.swap(true, Ordering::Relaxed) {
                            counters.reconnects.fetch_add(1, Ordering::Relaxed);
                        }
                        connections.send_modify(|n| *n += 1);
                        tracing::info!("NATS connected");
                    }
                    async_nats::Event::Disconnected => {
                        counters.disconnects.fetch_add(1, Ordering::Relaxed);
                        tracing::warn!("NATS connection lost; reconnecting");
                    }
                    other => tracing::info!(event = %other, "NATS"),
                }
            }
        });
        options = match &settings.auth {
            NatsAuth::None => options,
            NatsAuth::Creds(path) => options
                .credentials_file(path)
                .await
                .with_context(|| format!("nats.creds_file: cannot read {}", path.display()))
                .exit_status(ExitStatus::Config)?,
            NatsAuth::Nkey(path) => {
                let seed = read_secret("nats.nkey_file", path)?;
                options.nkey(seed)
            }
            NatsAuth::UserPassword(user, path) => {
                let password = read_secret("nats.password_file", path)?;
                options.user_and_password(user.clone(), password)
            }
        };
        if let Some(ca) = &settings.tls_ca_file {
            if !ca.is_file() {
                return Err(anyhow!("nats.tls_ca_file: {} is not a file", ca.display()))
                    .exit_status(ExitStatus::Config);
            }
            options = options.add_root_certificates(ca.clone()).require_tls(true);
        }
        Ok::<_, anyhow::Error>(options)
    };
    let servers: Vec<async_nats::ServerAddr> = settings
        .servers
        .iter()
        .enumerate()
        .map(|(i, url)| {
            url.parse().map_err(|e| anyhow!("nats.servers[{i}]: {url}: {e}")).exit_status(ExitStatus::Config)
        })
        .collect::<Result<_>>()?;
    match options().await?.connect(servers.clone()).await {
        Ok(client) => Ok(client),
        Err(e) => {
            use async_nats::ConnectErrorKind as Kind;
            let setting = match settings.auth {
                NatsAuth::None => "nats (no credentials given)",
                NatsAuth::Creds(_) => "nats.creds_file",
                NatsAuth::Nkey(_) => "nats.nkey_file",
                NatsAuth::UserPassword(..) => "nats.user / nats.password_file",
            };
            match e.kind() {
                Kind::Authentication | Kind::AuthorizationViolation => {
                    Err(anyhow!("{setting}: the NATS server refused the credentials: {e}"))
                        .exit_status(ExitStatus::Config)
                }
                Kind::Tls => Err(anyhow!("nats.tls_ca_file: TLS with the NATS server failed: {e}"))
                    .exit_status(ExitStatus::Config),
                Kind::ServerParse | Kind::Dns => Err(anyhow!("nats.servers: {e}")).exit_status(ExitStatus::Config),
                _ => Ok(options().await?.retry_on_initial_connect().connect(servers).await?),
            }
        }
    }
}

/// A secret from a file, its surrounding white space trimmed.
fn read_secret(setting: &str, path: &std::path::Path) -> Result<String> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("{setting}: cannot read {}", path.display()))
        .exit_status(ExitStatus::Config)?;
    Ok(text.trim().to_string())
}

/// The stream configuration the settings ask for.
fn wanted_stream(settings: &Nats) -> stream::Config {
    stream::Config {
        name: settings.stream.clone(),
        subjects: vec![settings.subject.clone()],
        storage: match settings.storage {
            NatsStorage::File => stream::StorageType::File,
            NatsStorage::Memory => stream::StorageType::Memory,
        },
        retention: match settings.retention {
            NatsRetention::Limits => stream::RetentionPolicy::Limits,
            NatsRetention::Interest => stream::RetentionPolicy::Interest,
        },
        num_replicas: settings.replicas,
        max_age: settings.max_age,
        max_bytes: if settings.max_bytes == 0 { -1 } else { i64::try_from(settings.max_bytes).unwrap_or(i64::MAX) },
        duplicate_window: settings.duplicate_window,
        // Repairs and late joiners read single messages directly from any replica.
        allow_direct: true,
        ..Default::default()
    }
}

/// Whether `pattern` (a stream's subject, with `*` and `>` wildcards) takes `subject`.
fn subject_matches(pattern: &str, subject: &str) -> bool {
    let mut wanted = subject.split('.');
    for token in pattern.split('.') {
        match (token, wanted.next()) {
            (">", Some(_)) => return true,
            ("*", Some(_)) => {}
            (t, Some(s)) if t == s => {}
            _ => return false,
        }
    }
    wanted.next().is_none()
}

/// How long a stream's creation is asked again while the cluster is not ready for it.
const CREATE_STREAM_PATIENCE: std::time::Duration = std::time::Duration::from_secs(30);

/// True for the answers of a cluster not ready yet (no answer in time, no leader, no peers to
/// place replicas on), as opposed to a stream that cannot be made as configured.
fn cluster_not_ready(e: &jetstream::context::CreateStreamError) -> bool {
    use jetstream::ErrorCode;
    use jetstream::context::CreateStreamErrorKind as Kind;
    match e.kind() {
        Kind::TimedOut | Kind::JetStreamUnavailable => true,
        Kind::JetStream(j) => matches!(
            j.error_code(),
            ErrorCode::CLUSTER_NO_PEERS
                | ErrorCode::CLUSTER_NOT_ACTIVE
                | ErrorCode::CLUSTER_NOT_ASSIGNED
                | ErrorCode::CLUSTER_NOT_AVAILABLE
                | ErrorCode::CLUSTER_NOT_LEADER
        ),
        _ => false,
    }
}

/// Checks that the stream exists with settings that fit, or creates it; a mismatch names the
/// setting and both values.
async fn ensure_stream(js: &jetstream::Context, settings: &Nats) -> Result<()> {
    let wanted = wanted_stream(settings);
    match js.get_stream(&settings.stream).await {
        Ok(mut existing) => {
            let info = existing.info().await.with_context(|| format!("nats.stream: reading {}", settings.stream))?;
            let have = &info.config;
            if !have.subjects.iter().any(|s| subject_matches(s, &settings.subject)) {
                return Err(anyhow!(
                    "nats.subject: stream {} stores {:?}, not {}; give a subject it stores, or another nats.stream",
                    settings.stream,
                    have.subjects,
                    settings.subject
                ))
                .exit_status(ExitStatus::Config);
            }
            let mismatch = if have.storage != wanted.storage {
                Some(("nats.storage", format!("{:?}", have.storage), format!("{:?}", wanted.storage)))
            } else if have.retention != wanted.retention {
                Some(("nats.retention", format!("{:?}", have.retention), format!("{:?}", wanted.retention)))
            } else if have.num_replicas != wanted.num_replicas {
                Some(("nats.replicas", have.num_replicas.to_string(), wanted.num_replicas.to_string()))
            } else {
                None
            };
            if let Some((setting, theirs, ours)) = mismatch {
                return Err(anyhow!(
                    "{setting}: stream {} exists with {theirs}, the configuration says {ours}; change the setting or the stream",
                    settings.stream
                ))
                .exit_status(ExitStatus::Config);
            }
            tracing::info!(stream = %settings.stream, messages = info.state.messages, "JetStream stream found");
            Ok(())
        }
        Err(e) => {
            let missing = matches!(e.kind(), jetstream::context::GetStreamErrorKind::JetStream(ref j)
                if j.error_code() == jetstream::ErrorCode::STREAM_NOT_FOUND);
            if !missing {
                return Err(anyhow!("nats.stream: cannot look up {}: {e}", settings.stream));
            }
            if !settings.create_stream {
                return Err(anyhow!(
                    "nats.stream: stream {} does not exist and nats.create_stream is false; create it, or let the publisher",
                    settings.stream
                ))
                .exit_status(ExitStatus::Config);
            }
            // A cluster that has just started (or is electing a leader) times out or has no
            // peers to place the replicas on yet: asked again for a while before giving up.
            let started = tokio::time::Instant::now();
            let mut wait = std::time::Duration::from_millis(100);
            loop {
                match js.create_stream(wanted.clone()).await {
                    Ok(_) => break,
                    Err(e) if cluster_not_ready(&e) && started.elapsed() < CREATE_STREAM_PATIENCE => {
                        tracing::warn!(stream = %settings.stream, "JetStream not ready to create the stream ({e}); asking again");
                        tokio::time::sleep(wait).await;
                        wait = (wait * 2).min(std::time::Duration::from_secs(2));
                    }
                    Err(e) => {
                        return Err(anyhow!("nats.stream: cannot create {}: {e}", settings.stream))
                            .exit_status(ExitStatus::Config);
                    }
                }
            }
            tracing::info!(stream = %settings.stream, subject = %settings.subject, "JetStream stream created");
            Ok(())
        }
    }
}

/// The `Nats-Msg-Id` of a datagram: its session and first sequence (`end` for the END).
fn message_id(datagram: &[u8]) -> Option<String> {
    let header = DatagramHeader::parse(datagram).ok()?;
    Some(match header.kind {
        DatagramKind::End => format!("{:016x}-end", header.session),
        _ => format!("{:016x}-{}", header.session, header.sequence),
    })
}

/// The publishing task.
struct Publisher {
    settings: Nats,
    js: jetstream::Context,
    client: async_nats::Client,
    counters: Arc<NatsCounters>,
    stream_checked: bool,
    connections: Connections,
}

/// An acknowledgement awaited: the message again if it has to be published again, with the
/// reason and how long to wait before doing so.
/// The message's position comes along, for [`Unstored::stored`].
type Acked = (Bytes, u64, Result<jetstream::publish::PublishAck, (String, Duration)>);

impl Publisher {
    async fn run(mut self, mut rx: mpsc::Receiver<Bytes>, mut end_rx: oneshot::Receiver<Bytes>) -> Result<()> {
        if !self.stream_checked {
            // Bounded only by the stop of the run: a server that never comes is waited for (the
            // queue fills, and `slow_server` decides).
            loop {
                match ensure_stream(&self.js, &self.settings).await {
                    Ok(()) => break,
                    Err(e) if ExitStatus::of(&e) == ExitStatus::Config => return Err(e),
                    Err(e) => {
                        tracing::debug!(error = %e, "stream not checked yet");
                        tokio::time::sleep(RETRY_WAIT).await;
                    }
                }
            }
            self.stream_checked = true;
        }
        let mut acks = FuturesUnordered::new();
        let max = self.settings.max_pending_acks;
        // How far the live subject has run past what the stream stores: held within what a
        // subscriber's window can still repair.
        let mut unstored = Unstored::new();
        let mut held_back = false;
        let mut open = true;
        // The END waits until everything before it is stored: a subscriber ends on it, so a
        // message published again after it would come too late.
        let mut end: Option<Bytes> = None;
        while open || !acks.is_empty() || end.is_some() {
            if acks.is_empty()
                && let Some(end) = end.take()
            {
                let at = unstored.published(0);
                let acked = self.publish_in_order(end, at).await;
                acks.push(acked);
                continue;
            }
            let holding = open && !unstored.may_publish();
            if holding != held_back {
                held_back = holding;
                if holding && mdrelay_proto::warn::allow("nats unstored") {
                    tracing::warn!(
                        frames = unstored.ahead(),
                        "the stream has not stored frames this far back; publishing waits for it, so that subscribers can still repair them"
                    );
                }
            }
            tokio::select! {
                biased;
                Some((message, at, result)) = acks.next(), if !acks.is_empty() => {
                    let (message, at, result): Acked = (message, at, result);
                    self.counters.pending_acks.fetch_sub(1, Ordering::Relaxed);
                    match result {
                        Ok(ack) => {
                            unstored.stored(at);
                            self.counters.acknowledged.fetch_add(1, Ordering::Relaxed);
                            if ack.duplicate {
                                self.counters.duplicates.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                        Err((e, retry_wait)) => {
                            self.counters.retries.fetch_add(1, Ordering::Relaxed);
                            if mdrelay_proto::warn::allow("nats retry") {
                                tracing::warn!(error = %e, "NATS publication not acknowledged; publishing it again");
                            }
                            acks.push(self.publish(message, at, retry_wait));
                        }
                    }
                }
                message = rx.recv(), if open && acks.len() < max && unstored.may_publish() => match message {
                    Some(message) => {
                        self.counters.published.fetch_add(1, Ordering::Relaxed);
                        let at = unstored.published(frames_of(&message));
                        // Handed to the client here, not when the set of futures polls it:
                        // futures polled in any order would publish in any order.
                        let acked = self.publish_in_order(message, at).await;
                        acks.push(acked);
                    }
                    None => {
                        open = false;
                        // Handed over before the queue closed (so this does not wait); missing
                        // if the run failed, when its sender is gone.
                        end = (&mut end_rx).await.ok();
                        if end.is_some() {
                            self.counters.published.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                },
            }
        }
        // Everything is acknowledged: nothing is left in the client's buffers either.
        let _ = tokio::time::timeout(DRAIN, self.client.flush()).await;
        // Connected a little longer: a publisher that closed its connection as soon as the END
        // was stored left subscribers on other nodes of a cluster without the END now and then
        // (its delivery to them is core NATS, at most once), and they waited for it for ever.
        tokio::time::sleep(END_LINGER).await;
        Ok(())
    }

    /// Hands `message` to the client now, in the order of the calls, and returns the wait for
    /// its acknowledgement: first publications go out in the stream's order (a subscriber reads
    /// the subject as one ordered stream), while the acknowledgements are awaited together.
    async fn publish_in_order(&self, message: Bytes, at: u64) -> BoxFuture<'static, Acked> {
        self.counters.pending_acks.fetch_add(1, Ordering::Relaxed);
        let mut connections = self.connections.clone();
        let sent_on = *connections.borrow_and_update();
        let sent =
            self.js.publish_with_headers(self.settings.subject.clone(), headers(&message), message.clone()).await;
        async move {
            let result = match sent {
                Ok(ack) => await_ack(ack, connections, sent_on).await,
                Err(e) => Err((e.to_string(), RETRY_WAIT)),
            };
            (message, at, result)
        }
        .boxed()
    }

    /// Publishes `message` again after `delay` and awaits its acknowledgement, as one future: a
    /// retry waits without holding up the others (its frames may come after later ones, which
    /// a subscriber takes as a late datagram, as over UDP).
    fn publish(&self, message: Bytes, at: u64, delay: Duration) -> BoxFuture<'static, Acked> {
        self.counters.pending_acks.fetch_add(1, Ordering::Relaxed);
        let js = self.js.clone();
        let subject = self.settings.subject.clone();
        let mut connections = self.connections.clone();
        async move {
            if !delay.is_zero() {
                tokio::time::sleep(delay).await;
            }
            // The connection it goes out on (or, while disconnected, the next one).
            let sent_on = *connections.borrow_and_update();
            let result = match js.publish_with_headers(subject, headers(&message), message.clone()).await {
                Ok(ack) => await_ack(ack, connections, sent_on).await,
                Err(e) => Err((e.to_string(), RETRY_WAIT)),
            };
            (message, at, result)
        }
        .boxed()
    }
}

/// The frames a datagram carries (0 for an `END`, or bytes that are not a datagram).
fn frames_of(datagram: &[u8]) -> u64 {
    DatagramHeader::parse(datagram).map_or(0, |h| u64::from(h.frame_count))
}

/// The headers of a message: its deduplication id.
fn headers(message: &[u8]) -> async_nats::HeaderMap {
    let mut headers = async_nats::HeaderMap::new();
    if let Some(id) = message_id(message) {
        headers.insert("Nats-Msg-Id", id.as_str());
    }
    headers
}

/// Awaits the acknowledgement of a message sent on connection `sent_on`: an error says why it
/// must be published again, and how long to wait first.
async fn await_ack(
    ack: jetstream::context::PublishAckFuture,
    mut connections: Connections,
    sent_on: u64,
) -> Result<jetstream::publish::PublishAck, (String, Duration)> {
    tokio::select! {
        acked = tokio::time::timeout(ACK_TIMEOUT, ack.into_future()) => match acked {
            Ok(Ok(ack)) => Ok(ack),
            Ok(Err(e)) => Err((e.to_string(), RETRY_WAIT)),
            Err(_) => Err((format!("no acknowledgement within {} s", ACK_TIMEOUT.as_secs()), RETRY_WAIT)),
        },
        // A new connection: the one it went out on is gone, and with it the acknowledgement.
        // Published again at once on the new one (the stream keeps one copy), instead of after
        // the acknowledgement's time-out.
        _ = async {
            if connections.wait_for(|now| *now != sent_on).await.is_err() {
                // The client is gone; its acknowledgements time out as they are.
                std::future::pending::<()>().await;
            }
        } => {
            Err(("the connection was lost before the acknowledgement".to_string(), Duration::ZERO))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mdrelay_proto::relay::DATAGRAM_VERSION;

    #[test]
    fn subjects_match_as_nats_matches_them() {
        assert!(subject_matches("mdrelay.1", "mdrelay.1"));
        assert!(subject_matches("mdrelay.*", "mdrelay.1"));
        assert!(subject_matches("mdrelay.>", "mdrelay.1.a"));
        assert!(subject_matches(">", "a"));
        assert!(!subject_matches("mdrelay.*", "mdrelay.1.a"));
        assert!(!subject_matches("mdrelay.1", "mdrelay.2"));
        assert!(!subject_matches("mdrelay.1.a", "mdrelay.1"));
        assert!(!subject_matches("mdrelay.>", "mdrelay"));
    }

    #[test]
    fn a_message_id_names_the_session_and_first_frame() {
        let header = DatagramHeader {
            version: DATAGRAM_VERSION,
            format: Format::Sbe,
            kind: DatagramKind::Data,
            frame_count: 3,
            protection: Default::default(),
            session: 0xab,
            sequence: 42,
        };
        assert_eq!(message_id(&header.to_bytes()).as_deref(), Some("00000000000000ab-42"));
        let end = DatagramHeader { kind: DatagramKind::End, frame_count: 0, ..header };
        assert_eq!(message_id(&end.to_bytes()).as_deref(), Some("00000000000000ab-end"));
        assert_eq!(message_id(b"garbage"), None);
    }
}
