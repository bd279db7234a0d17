//! NATS output: every datagram the coalescer seals (relay header, then frames, protected as on
//! UDP) is published to one subject, stored in a JetStream stream. Subscribers read it with the
//! same datagram code as UDP, and JetStream's copy serves late joiners and repairs.
//!
//! The hot thread never waits on the server: it hands each message to a bounded queue
//! ([`NatsOut`]); a task on the runtime publishes from it with at most `max_pending_acks`
//! messages unacknowledged, and publishes again any message whose acknowledgement failed or
//! timed out, or was still awaited when the connection was lost (at once on the new
//! connection: a server restarted, a cluster node lost). The queue is bounded in messages
//! (`nats.queue`) and in bytes (`nats.queue_bytes`, which counts the messages awaiting their
//! acknowledgement too, since each is kept to be published again); when either is reached it
//! follows `nats.slow_server`: wait for room, drop and count, or fail the run. A server not up
//! yet at the start is the same as a slow one (the queue fills while it is away).
//!
//! Every message carries a `Nats-Msg-Id` keyed with this run's id key, or the operator's
//! (`nats.id_key_file`), so the stream keeps one copy whatever is sent twice and nobody without
//! the key can take an id ahead of the publisher ([`MessageIds`]). A duplicate acknowledgement
//! is checked: the message the stream holds under the id is read back, and one that is not
//! this message (its id was taken) is counted and published again under a new id.
//!
//! JetStream's answers are told apart: a publication nobody answered because the stream is
//! gone (deleted) makes the task look the stream up and create it again when `create_stream`
//! allows; a refusal that another try cannot mend (a full stream that discards new messages, a
//! sealed one, a message over its size limit) ends the run with an error naming the stream and
//! its limits; anything else (no acknowledgement in time, a lost connection, a cluster electing
//! a leader) is published again.
//!
//! A new message is taken only while the frames published since the oldest message not yet
//! stored stay within half a subscriber's window ([`Unstored`]): a stream without a leader for
//! a while (its node lost, an election) holds the live subject back, where it would otherwise
//! run past what subscribers can still repair once the messages published again are stored.
//!
//! The END has a way of its own to the task, so the hot thread never waits to hand it over;
//! the task publishes it once everything before it is acknowledged, since a subscriber ends on
//! it and a message published again after it would come too late.

use crate::config::{Nats, NatsRetention, NatsStorage, SlowServerPolicy};
use anyhow::{Context, Result, anyhow};
use async_nats::jetstream::context::{PublishError, PublishErrorKind};
use async_nats::jetstream::{self, ErrorCode, stream};
use bytes::Bytes;
use futures_util::StreamExt;
use futures_util::future::{BoxFuture, FutureExt};
use futures_util::stream::FuturesUnordered;
use mdrelay_client::NatsSetting;
use mdrelay_client::nats::{connect_error, connect_options};
use mdrelay_codec::Format;
use mdrelay_proto::relay::{DatagramHeader, Duplicate, MessageIds, Protector, RecordHeader, Unstored, judge_duplicate};
use mdrelay_telemetry::exit::{ExitStatus, WithExitStatus};
use std::future::IntoFuture;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::mpsc::{self, error::TrySendError};
use tokio::sync::oneshot;

/// How long the publishing task has at the end of the stream to have everything acknowledged.
const DRAIN: Duration = Duration::from_secs(30);

/// How long it has after a run that failed (`slow_server = "fail"`, a stream that refuses the
/// messages): what a server takes at once is delivered, but the run does not wait [`DRAIN`] for
/// the server that failed it (one never reached held a failed publisher up for 32 s).
const FAILED_DRAIN: Duration = Duration::from_secs(2);

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

/// How long a look-up of the stream (after a publication no stream answered) or of its limits
/// (to name them in an error) may take.
const LOOKUP: Duration = Duration::from_secs(5);

/// The stream is looked up at most this often while publications go unanswered (those in flight
/// when it was deleted, or while a cluster elects its leader, are published again meanwhile).
const LOOKUP_EVERY: Duration = Duration::from_secs(1);

/// The NATS output's counts, shared by the hot thread, the publishing task and the metrics.
#[derive(Debug, Default)]
pub struct NatsCounters {
    /// Messages handed to the client (first publications).
    pub published: AtomicU64,
    /// Messages JetStream acknowledged as stored.
    pub acknowledged: AtomicU64,
    /// Acknowledged as duplicates whose stored copy is this message: a retry whose first
    /// acknowledgement was lost, or a relay of the same origin sharing the id key.
    pub duplicates: AtomicU64,
    /// Acknowledged as duplicates of another message: someone took the id. Each is published
    /// again under a new id.
    pub taken: AtomicU64,
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
    /// Times the stream was found deleted and created again.
    pub stream_recreations: AtomicU64,
    /// Bytes of messages held for the server: queued, or published and not yet acknowledged
    /// (at most `nats.queue_bytes`, but for one larger message alone).
    pub held_bytes: AtomicU64,
    /// Snapshots sent to subscribers that asked for one (`nats.snapshots`).
    pub snapshots_sent: AtomicU64,
    /// Snapshot requests refused: too many at once, no reply subject, or the state not
    /// encodable.
    pub snapshots_refused: AtomicU64,
}

/// The NATS output's counts at the end of a run.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct NatsSummary {
    /// Messages published (first publications).
    pub published: u64,
    /// Messages JetStream acknowledged.
    pub acknowledged: u64,
    /// Acknowledged as duplicates of a stored id, the stored copy this message.
    pub duplicates: u64,
    /// Acknowledged as duplicates of another message under the id: published again under a new
    /// one.
    pub taken: u64,
    /// Publications repeated after a failure or a missing acknowledgement.
    pub retries: u64,
    /// Messages dropped for a full queue.
    pub dropped: u64,
    /// Connections after the first.
    pub reconnects: u64,
    /// Connections lost.
    pub disconnects: u64,
    /// Times the stream was found deleted and created again.
    pub stream_recreations: u64,
    /// Snapshots sent to subscribers that asked for one.
    pub snapshots_sent: u64,
    /// Snapshot requests refused.
    pub snapshots_refused: u64,
    /// Messages published and not yet acknowledged, now (a gauge: the metrics', not the
    /// summary's).
    #[serde(skip)]
    pub pending_acks: u64,
    /// Bytes of messages held for the server, now (a gauge, as `pending_acks`).
    #[serde(skip)]
    pub held_bytes: u64,
}

impl NatsCounters {
    /// The counts now.
    pub fn summary(&self) -> NatsSummary {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        NatsSummary {
            published: get(&self.published),
            acknowledged: get(&self.acknowledged),
            duplicates: get(&self.duplicates),
            taken: get(&self.taken),
            retries: get(&self.retries),
            dropped: get(&self.dropped),
            reconnects: get(&self.reconnects),
            disconnects: get(&self.disconnects),
            stream_recreations: get(&self.stream_recreations),
            snapshots_sent: get(&self.snapshots_sent),
            snapshots_refused: get(&self.snapshots_refused),
            pending_acks: get(&self.pending_acks),
            held_bytes: get(&self.held_bytes),
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
    /// Bytes of messages held for the server at most (`counters.held_bytes`).
    queue_bytes: u64,
    session: u64,
    counters: Arc<NatsCounters>,
    failure: Failure,
    /// Set once the task is gone or the policy failed the run; the engine ends with it.
    failed: bool,
    /// The last message found the queue full: the log says so once when it fills.
    full: bool,
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
    /// With `snapshots`, it answers snapshot requests too (`answer_snapshots`).
    pub async fn start(
        settings: &Nats,
        session: u64,
        snapshots: Option<crate::snapshot::NatsSnapshots>,
    ) -> Result<(NatsOut, NatsTask)> {
        let counters = Arc::new(NatsCounters::default());
        let (connections_tx, connections) = tokio::sync::watch::channel(0u64);
        let client = connect(settings, &counters, Arc::new(connections_tx)).await?;
        if let Some(snapshots) = snapshots {
            let subject = settings.subject().to_string();
            tokio::spawn(answer_snapshots(client.clone(), subject, snapshots, counters.clone()));
        }
        let js = jetstream::new(client.clone());
        let checked = if client.connection_state() == async_nats::connection::State::Connected {
            ensure_stream(&js, settings).await?;
            true
        } else {
            tracing::warn!(servers = ?settings.servers(), "NATS server not reachable yet; publishing when it is");
            false
        };
        let (tx, rx) = mpsc::channel(settings.queue);
        let (end_tx, end_rx) = oneshot::channel();
        let failure: Failure = Arc::default();
        let ids = settings.id_key.as_ref().map_or_else(|| MessageIds::new(rand::random()), MessageIds::keyed);
        let task = Publisher {
            settings: settings.clone(),
            js,
            client,
            counters: counters.clone(),
            stream_checked: checked,
            connections,
            ids,
            looked_up: None,
        };
        let task_failure = failure.clone();
        let handle = tokio::spawn(async move {
            let mut rx = rx;
            if let Err(e) = task.run(&mut rx, end_rx).await {
                tracing::error!(error = %format!("{e:#}"), "NATS publishing stopped");
                *task_failure.lock().unwrap_or_else(|p| p.into_inner()) = Some(e);
            }
            // Closed only now: the hot thread finds the queue closed and takes the failure, which
            // must be there by then (it found a generic "task stopped" before, now and then).
            drop(rx);
        });
        tracing::info!(servers = ?settings.servers(), subject = %settings.subject(), stream = %settings.stream(), "publishing to NATS");
        let out = NatsOut {
            tx: Some(tx),
            end: Some(end_tx),
            policy: settings.slow_server,
            queue_bytes: settings.queue_bytes,
            session,
            counters: counters.clone(),
            failure: failure.clone(),
            failed: false,
            full: false,
        };
        Ok((out, NatsTask { handle, failure, counters }))
    }

    /// Queues one sealed datagram; under `block`, waits for room (the stop flag ends the wait).
    /// The queue is full at `nats.queue` messages, or when the message would take the bytes held
    /// for the server past `nats.queue_bytes` (one larger message goes alone).
    pub fn send(&mut self, message: Bytes, stop: &AtomicBool) {
        let Some(tx) = &self.tx else { return };
        let len = message.len() as u64;
        let held = &self.counters.held_bytes;
        let mut message = message;
        loop {
            let before = held.load(Ordering::Acquire);
            let refused = if before == 0 || before + len <= self.queue_bytes {
                // Counted before it is in the queue: the task takes it off once stored, which can
                // only be after this.
                held.fetch_add(len, Ordering::AcqRel);
                match tx.try_send(message) {
                    Ok(()) => {
                        self.full = false;
                        return;
                    }
                    Err(TrySendError::Closed(_)) => {
                        held.fetch_sub(len, Ordering::AcqRel);
                        self.failed = true;
                        self.close();
                        return;
                    }
                    Err(TrySendError::Full(back)) => {
                        held.fetch_sub(len, Ordering::AcqRel);
                        back
                    }
                }
            } else {
                message
            };
            if !self.full {
                self.full = true;
                if self.policy != SlowServerPolicy::Fail && mdrelay_iex::warn::allow("nats queue full") {
                    let fate = match self.policy {
                        SlowServerPolicy::Block => "the stream waits for room",
                        _ => "messages are dropped and counted until there is room",
                    };
                    tracing::warn!(
                        queued_bytes = before,
                        queue_bytes = self.queue_bytes,
                        policy = self.policy.name(),
                        "NATS queue is full (nats.queue messages or nats.queue_bytes bytes, queued or awaiting acknowledgement): the server takes messages slower than they come; {fate}"
                    );
                }
            }
            match self.policy {
                SlowServerPolicy::Drop => {
                    self.counters.dropped.fetch_add(1, Ordering::Relaxed);
                    return;
                }
                SlowServerPolicy::Fail => {
                    self.failure.lock().unwrap_or_else(|p| p.into_inner()).get_or_insert_with(|| {
                        anyhow!("nats: the server takes messages slower than they come (queue full: nats.queue messages or nats.queue_bytes bytes; nats.slow_server = \"fail\")")
                    });
                    self.failed = true;
                    self.close();
                    return;
                }
                SlowServerPolicy::Block => {
                    if stop.load(Ordering::Relaxed) {
                        return;
                    }
                    message = refused;
                    std::thread::sleep(Duration::from_micros(50));
                }
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
    /// Waits for the task to publish everything queued and have it acknowledged (bounded): for
    /// [`DRAIN`] after a whole stream, for [`FAILED_DRAIN`] after a run that failed (`run_failed`).
    pub async fn finish(self, run_failed: bool) -> Result<()> {
        let limit = if run_failed { FAILED_DRAIN } else { DRAIN + ACK_TIMEOUT };
        let abort = self.handle.abort_handle();
        match tokio::time::timeout(limit, self.handle).await {
            Ok(_) => {}
            // The run's own error says why it failed.
            Err(_) if run_failed => abort.abort(),
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
        let mut options = connect_options(&settings.auth, settings.tls_ca_file.as_deref())
            .await
            .map_err(|e| anyhow!("nats.{e}"))
            .exit_status(ExitStatus::Config)?
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
        Ok::<_, anyhow::Error>(options)
    };
    let servers: Vec<async_nats::ServerAddr> = settings
        .servers()
        .iter()
        .enumerate()
        .map(|(i, url)| {
            url.parse().map_err(|e| anyhow!("nats.servers[{i}]: {url}: {e}")).exit_status(ExitStatus::Config)
        })
        .collect::<Result<_>>()?;
    match options().await?.connect(servers.clone()).await {
        Ok(client) => Ok(client),
        Err(e) => {
            if let Some(fault) = connect_error(&e, &settings.auth) {
                let error = match fault.setting {
                    NatsSetting::Credentials => anyhow!("nats (no credentials given): {}", fault.reason),
                    _ => anyhow!("nats.{fault}"),
                };
                return Err(error).exit_status(ExitStatus::Config);
            }
            if matches!(e.kind(), async_nats::ConnectErrorKind::ServerParse | async_nats::ConnectErrorKind::Dns) {
                return Err(anyhow!("nats.servers: {e}")).exit_status(ExitStatus::Config);
            }
            Ok(options().await?.retry_on_initial_connect().connect(servers).await?)
        }
    }
}

/// The stream configuration the settings ask for.
fn wanted_stream(settings: &Nats) -> stream::Config {
    stream::Config {
        name: settings.stream().to_string(),
        subjects: vec![settings.subject().to_string()],
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
    match js.get_stream(&settings.stream()).await {
        Ok(mut existing) => {
            let info = existing.info().await.with_context(|| format!("nats.stream: reading {}", settings.stream()))?;
            let have = &info.config;
            if !have.subjects.iter().any(|s| subject_matches(s, settings.subject())) {
                return Err(anyhow!(
                    "nats.subject: stream {} stores {:?}, not {}; give a subject it stores, or another nats.stream",
                    settings.stream(),
                    have.subjects,
                    settings.subject()
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
                    settings.stream()
                ))
                .exit_status(ExitStatus::Config);
            }
            tracing::info!(stream = %settings.stream(), messages = info.state.messages, "JetStream stream found");
            Ok(())
        }
        Err(e) => {
            let missing = matches!(e.kind(), jetstream::context::GetStreamErrorKind::JetStream(ref j)
                if j.error_code() == jetstream::ErrorCode::STREAM_NOT_FOUND);
            if !missing {
                return Err(anyhow!("nats.stream: cannot look up {}: {e}", settings.stream()));
            }
            if !settings.create_stream {
                return Err(anyhow!(
                    "nats.stream: stream {} does not exist and nats.create_stream is false; create it, or let the publisher",
                    settings.stream()
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
                        tracing::warn!(stream = %settings.stream(), "JetStream not ready to create the stream ({e}); asking again");
                        tokio::time::sleep(wait).await;
                        wait = (wait * 2).min(std::time::Duration::from_secs(2));
                    }
                    Err(e) => {
                        return Err(anyhow!("nats.stream: cannot create {}: {e}", settings.stream()))
                            .exit_status(ExitStatus::Config);
                    }
                }
            }
            tracing::info!(stream = %settings.stream(), subject = %settings.subject(), "JetStream stream created");
            Ok(())
        }
    }
}

/// The publishing task.
struct Publisher {
    settings: Nats,
    js: jetstream::Context,
    client: async_nats::Client,
    counters: Arc<NatsCounters>,
    stream_checked: bool,
    connections: Connections,
    /// The messages' ids, under this run's key or the operator's.
    ids: MessageIds,
    /// When the stream was last looked up after a publication no stream answered.
    looked_up: Option<tokio::time::Instant>,
}

/// What a look-up of the stream found, after a publication no stream answered.
enum Looked {
    /// The stream is there (a leader was being elected, or the server was slow), or the look-up
    /// itself got no answer: publishing goes on.
    There,
    /// The stream was gone, and is created again.
    Created,
    /// The stream is gone, and cannot be created again: the run ends.
    Gone(anyhow::Error),
}

/// A message on its way into the stream, until it is stored.
struct Flight {
    /// The datagram.
    message: Bytes,
    /// Its position, for [`Unstored::stored`].
    at: u64,
    /// Its id's generation: one more each time another message was found under its id.
    generation: u32,
    /// Whether its bytes count in `held_bytes` (every message but the END, which bypasses the
    /// queue).
    held: bool,
}

/// What became of a publication, or of reading back what the stream holds under its id.
#[derive(Debug)]
enum Outcome {
    /// Stored under its id.
    Stored,
    /// Acknowledged as a duplicate: the stream holds a message under its id, at this sequence.
    Duplicate(u64),
    /// The message the stream holds under its id is this one.
    Ours,
    /// The stream holds another message under its id.
    Taken,
    /// The message under its id could not be read back (the reason): taken for this one's own
    /// copy, as every duplicate was before ids were checked, rather than published again for ever.
    Unchecked(String),
    /// No stream answered (no responders, or no acknowledgement in time): published again, and
    /// the stream looked up (deleted, or a leader being elected).
    Unanswered(String),
    /// To be published again after the wait: the reason, and the wait.
    Again(String, Duration),
    /// JetStream refuses it, and would refuse it again: the reason.
    Refused(String),
}

/// A publication's or a read-back's end.
type Done = (Flight, Outcome);

impl Publisher {
    async fn run(mut self, rx: &mut mpsc::Receiver<Bytes>, mut end_rx: oneshot::Receiver<Bytes>) -> Result<()> {
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
        let mut flights = FuturesUnordered::new();
        // The stream's look-up, one at a time, beside the publications.
        let mut lookups: FuturesUnordered<BoxFuture<'static, Looked>> = FuturesUnordered::new();
        let max = self.settings.max_pending_acks;
        // How far the live subject has run past what the stream stores: held within what a
        // subscriber's window can still repair.
        let mut unstored = Unstored::new();
        let mut held_back = false;
        let mut open = true;
        // The END waits until everything before it is stored: a subscriber ends on it, so a
        // message published again after it would come too late.
        let mut end: Option<Bytes> = None;
        while open || !flights.is_empty() || end.is_some() {
            if flights.is_empty()
                && let Some(end) = end.take()
            {
                let at = unstored.published(0);
                let flight = Flight { message: end, at, generation: 0, held: false };
                let sent = self.publish_in_order(flight).await;
                flights.push(sent);
                continue;
            }
            let holding = open && !unstored.may_publish();
            if holding != held_back {
                held_back = holding;
                if holding && mdrelay_iex::warn::allow("nats unstored") {
                    tracing::warn!(
                        frames = unstored.ahead(),
                        "the stream has not stored frames this far back; publishing waits for it, so that subscribers can still repair them"
                    );
                }
            }
            tokio::select! {
                biased;
                Some(looked) = lookups.next(), if !lookups.is_empty() => match looked {
                    Looked::There => {}
                    Looked::Created => {
                        self.counters.stream_recreations.fetch_add(1, Ordering::Relaxed);
                        tracing::warn!(
                            stream = %self.settings.stream(),
                            "the stream was deleted while the publisher ran, and is created again: the messages it held are gone, and late joiners and repairs find only what is published from now on"
                        );
                    }
                    Looked::Gone(e) => return Err(e),
                },
                Some((flight, outcome)) = flights.next(), if !flights.is_empty() => {
                    let (flight, outcome): Done = (flight, outcome);
                    self.counters.pending_acks.fetch_sub(1, Ordering::Relaxed);
                    if matches!(outcome, Outcome::Unanswered(_)) && lookups.is_empty() && self.may_look_up() {
                        lookups.push(self.look_up_stream());
                    }
                    match self.settle(flight, outcome, &mut unstored).await {
                        Ok(Some(next)) => flights.push(next),
                        Ok(None) => {}
                        Err(e) => {
                            self.count_the_stored(&mut flights, &mut unstored).await;
                            return Err(e);
                        }
                    }
                }
                message = rx.recv(), if open && flights.len() < max && unstored.may_publish() => match message {
                    Some(message) => {
                        self.counters.published.fetch_add(1, Ordering::Relaxed);
                        let at = unstored.published(frames_of(&message));
                        // Handed to the client here, not when the set of futures polls it:
                        // futures polled in any order would publish in any order.
                        let flight = Flight { message, at, generation: 0, held: true };
                        let sent = self.publish_in_order(flight).await;
                        flights.push(sent);
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

    /// What a publication's (or a read-back's) outcome leads to: nothing more once the message
    /// is stored, else the next step on its way; an error ends the run.
    async fn settle(
        &self,
        mut flight: Flight,
        outcome: Outcome,
        unstored: &mut Unstored,
    ) -> Result<Option<BoxFuture<'static, Done>>> {
        let counters = &self.counters;
        let stored = |flight: &Flight, unstored: &mut Unstored| {
            unstored.stored(flight.at);
            counters.acknowledged.fetch_add(1, Ordering::Relaxed);
            if flight.held {
                counters.held_bytes.fetch_sub(flight.message.len() as u64, Ordering::AcqRel);
            }
        };
        Ok(Some(match outcome {
            Outcome::Stored => {
                stored(&flight, unstored);
                return Ok(None);
            }
            Outcome::Ours => {
                stored(&flight, unstored);
                counters.duplicates.fetch_add(1, Ordering::Relaxed);
                return Ok(None);
            }
            Outcome::Unchecked(reason) => {
                stored(&flight, unstored);
                counters.duplicates.fetch_add(1, Ordering::Relaxed);
                if mdrelay_iex::warn::allow("nats duplicate unchecked") {
                    tracing::warn!(
                        error = %reason,
                        stream = %self.settings.stream(),
                        "a duplicate acknowledgement could not be checked, and is taken for this message's own copy; the publisher's NATS user needs $JS.API.STREAM.MSG.GET.<stream> to tell it from a message that took its id"
                    );
                }
                return Ok(None);
            }
            Outcome::Duplicate(sequence) => self.read_back(flight, sequence),
            Outcome::Taken => {
                counters.taken.fetch_add(1, Ordering::Relaxed);
                let id = self.ids.of(&flight.message, flight.generation).unwrap_or_default();
                flight.generation += 1;
                if mdrelay_iex::warn::allow("nats id taken") {
                    tracing::warn!(
                        id,
                        stream = %self.settings.stream(),
                        "another message holds its id in the stream, so this one was not stored: someone who may publish on the subject holds nats.id_key_file, or relays sharing it publish different bytes; publishing it again under a new id"
                    );
                }
                self.publish(flight, Duration::ZERO)
            }
            Outcome::Unanswered(reason) => self.again(flight, &reason, RETRY_WAIT),
            Outcome::Again(reason, wait) => self.again(flight, &reason, wait),
            Outcome::Refused(reason) => return Err(self.refusal(&reason).await),
        }))
    }

    /// Before a run that failed ends: counts as acknowledged what the stream stored of the
    /// publications still in flight. JetStream answers in order, but the set of flights hands
    /// the answers over in any order, so a refusal can come before the acknowledgements of the
    /// messages ahead of it; without this the report counted fewer than the stream holds.
    /// Nothing is published again; bounded by [`FAILED_DRAIN`].
    async fn count_the_stored(
        &self,
        flights: &mut FuturesUnordered<BoxFuture<'static, Done>>,
        unstored: &mut Unstored,
    ) {
        let until = tokio::time::Instant::now() + FAILED_DRAIN;
        while let Ok(Some((flight, outcome))) = tokio::time::timeout_at(until, flights.next()).await {
            self.counters.pending_acks.fetch_sub(1, Ordering::Relaxed);
            if matches!(outcome, Outcome::Stored | Outcome::Ours | Outcome::Unchecked(_)) {
                unstored.stored(flight.at);
                self.counters.acknowledged.fetch_add(1, Ordering::Relaxed);
            }
            if flight.held {
                self.counters.held_bytes.fetch_sub(flight.message.len() as u64, Ordering::AcqRel);
            }
        }
    }

    /// Publishes a message again after `wait`, counted and logged as a retry.
    fn again(&self, flight: Flight, reason: &str, wait: Duration) -> BoxFuture<'static, Done> {
        self.counters.retries.fetch_add(1, Ordering::Relaxed);
        if mdrelay_iex::warn::allow("nats retry") {
            tracing::warn!(error = %reason, "NATS publication not acknowledged; publishing it again");
        }
        self.publish(flight, wait)
    }

    /// Whether the stream may be looked up now: once a [`LOOKUP_EVERY`] at most.
    fn may_look_up(&mut self) -> bool {
        let now = tokio::time::Instant::now();
        if self.looked_up.is_some_and(|at| now.duration_since(at) < LOOKUP_EVERY) {
            return false;
        }
        self.looked_up = Some(now);
        true
    }

    /// Looks the stream up after a publication no stream answered, and creates it again if it
    /// is gone and `create_stream` allows.
    fn look_up_stream(&self) -> BoxFuture<'static, Looked> {
        let js = self.js.clone();
        let settings = self.settings.clone();
        async move {
            let stream = &settings.stream();
            let missing = match tokio::time::timeout(LOOKUP, js.get_stream(stream)).await {
                Ok(Err(e)) => matches!(e.kind(), jetstream::context::GetStreamErrorKind::JetStream(ref j)
                    if j.error_code() == ErrorCode::STREAM_NOT_FOUND),
                // There, or not answered: a server or cluster not ready, as passing as the silence.
                _ => false,
            };
            if !missing {
                return Looked::There;
            }
            if !settings.create_stream {
                return Looked::Gone(anyhow!(
                    "nats.stream: stream {stream} no longer exists (deleted while the publisher ran), and nats.create_stream is false: nothing stores the subject {}; create the stream again, or let the publisher (nats.create_stream = true)",
                    settings.subject()
                ));
            }
            match ensure_stream(&js, &settings).await {
                Ok(()) => Looked::Created,
                Err(e) => Looked::Gone(e.context(format!("nats.stream: stream {stream} was deleted while the publisher ran"))),
            }
        }
        .boxed()
    }

    /// The error a refusal ends the run with: the stream, JetStream's reason, and the stream's
    /// limits and contents as it answers now.
    async fn refusal(&self, reason: &str) -> anyhow::Error {
        let stream = &self.settings.stream();
        let limits = async {
            let mut found = self.js.get_stream(stream).await.ok()?;
            let info = found.info().await.ok()?;
            let c = &info.config;
            let limit = |n: i64| if n < 0 { "unlimited".to_string() } else { n.to_string() };
            let discard = match c.discard {
                stream::DiscardPolicy::New => "discard new: at a limit it refuses new messages",
                stream::DiscardPolicy::Old => "discard old",
            };
            Some(format!(
                "; it holds {} messages ({} bytes), its limits: max_msgs {}, max_bytes {}, max_msgs_per_subject {}, max_msg_size {}, {discard}",
                info.state.messages,
                info.state.bytes,
                limit(c.max_messages),
                limit(c.max_bytes),
                limit(c.max_messages_per_subject),
                limit(i64::from(c.max_message_size)),
            ))
        };
        let limits = tokio::time::timeout(LOOKUP, limits).await.ok().flatten().unwrap_or_default();
        anyhow!(
            "nats.stream: JetStream refuses to store messages in stream {stream}: {reason}{limits}; raise the stream's limits, let it discard old messages, or give another nats.stream"
        )
    }

    /// Hands `flight` to the client now, in the order of the calls, and returns the wait for its
    /// acknowledgement: first publications go out in the stream's order (a subscriber reads the
    /// subject as one ordered stream), while the acknowledgements are awaited together.
    async fn publish_in_order(&self, flight: Flight) -> BoxFuture<'static, Done> {
        self.counters.pending_acks.fetch_add(1, Ordering::Relaxed);
        let mut connections = self.connections.clone();
        let sent_on = *connections.borrow_and_update();
        let headers = headers(&self.ids, &flight);
        let sent =
            self.js.publish_with_headers(self.settings.subject().to_string(), headers, flight.message.clone()).await;
        settled(flight, sent, connections, sent_on).boxed()
    }

    /// Publishes `flight` again after `delay` and awaits its acknowledgement, as one future: a
    /// retry waits without holding up the others (its frames may come after later ones, which
    /// a subscriber takes as a late datagram, as over UDP).
    fn publish(&self, flight: Flight, delay: Duration) -> BoxFuture<'static, Done> {
        self.counters.pending_acks.fetch_add(1, Ordering::Relaxed);
        let js = self.js.clone();
        let subject = self.settings.subject().to_string();
        let mut connections = self.connections.clone();
        let headers = headers(&self.ids, &flight);
        async move {
            if !delay.is_zero() {
                tokio::time::sleep(delay).await;
            }
            // The connection it goes out on (or, while disconnected, the next one).
            let sent_on = *connections.borrow_and_update();
            let sent = js.publish_with_headers(subject, headers, flight.message.clone()).await;
            settled(flight, sent, connections, sent_on).await
        }
        .boxed()
    }

    /// Reads back the message the stream holds at `sequence`, under `flight`'s id, and judges
    /// whose it is.
    fn read_back(&self, flight: Flight, sequence: u64) -> BoxFuture<'static, Done> {
        self.counters.pending_acks.fetch_add(1, Ordering::Relaxed);
        let js = self.js.clone();
        let stream = self.settings.stream().to_string();
        let subject = self.settings.subject().to_string();
        async move {
            let read = async {
                let stream = js.get_stream_no_info(&stream).await.map_err(|e| e.to_string())?;
                match stream.get_raw_message(sequence).await {
                    Ok(stored) => Ok(Some(stored)),
                    // Removed since: nothing of this message is stored under its id.
                    Err(e) if e.kind() == stream::LastRawMessageErrorKind::NoMessageFound => Ok(None),
                    Err(e) => Err(e.to_string()),
                }
            };
            let outcome = match tokio::time::timeout(ACK_TIMEOUT, read).await {
                Ok(Ok(Some(stored))) => {
                    match judge_duplicate(&flight.message, &subject, stored.subject.as_str(), &stored.payload) {
                        Duplicate::Ours => Outcome::Ours,
                        Duplicate::Taken => Outcome::Taken,
                    }
                }
                Ok(Ok(None)) => Outcome::Taken,
                Ok(Err(e)) => Outcome::Unchecked(format!("reading back message {sequence} of the stream: {e}")),
                Err(_) => Outcome::Unchecked(format!(
                    "reading back message {sequence} of the stream: no answer within {} s",
                    ACK_TIMEOUT.as_secs()
                )),
            };
            (flight, outcome)
        }
        .boxed()
    }
}

/// The frames a datagram carries (0 for an `END`, or bytes that are not a datagram).
fn frames_of(datagram: &[u8]) -> u64 {
    DatagramHeader::parse(datagram).map_or(0, |h| u64::from(h.frame_count))
}

/// The headers of a message: its deduplication id.
fn headers(ids: &MessageIds, flight: &Flight) -> async_nats::HeaderMap {
    let mut headers = async_nats::HeaderMap::new();
    if let Some(id) = ids.of(&flight.message, flight.generation) {
        headers.insert("Nats-Msg-Id", id.as_str());
    }
    headers
}

/// What a failed publication means: no stream, a refusal for good, or another try.
fn outcome_of(e: &PublishError) -> Outcome {
    let reason = e.to_string();
    match e.kind() {
        PublishErrorKind::StreamNotFound => Outcome::Unanswered(reason),
        PublishErrorKind::MaxPayloadExceeded => Outcome::Refused(format!(
            "{reason} (the server's max_payload; lower nats.max_message or batching.coalesce_bytes)"
        )),
        PublishErrorKind::Other => {
            let answer = std::error::Error::source(e).and_then(|s| s.downcast_ref::<jetstream::Error>());
            match answer {
                Some(answer) if !worth_another_try(answer.error_code()) => Outcome::Refused(answer.to_string()),
                _ => Outcome::Again(reason, RETRY_WAIT),
            }
        }
        _ => Outcome::Again(reason, RETRY_WAIT),
    }
}

/// Whether JetStream's error answer to a publication may change if the message is published
/// again: a cluster not ready (no leader, an election, a member changing), or an id still being
/// stored from an earlier publication, or a server too busy. Every other answer (a full stream
/// that discards new messages, a sealed one, a message over its size limit, an account out of
/// resources) is the stream's configuration, and another try would be refused the same way.
fn worth_another_try(code: ErrorCode) -> bool {
    matches!(
        code,
        ErrorCode::CLUSTER_NOT_AVAILABLE
            | ErrorCode::CLUSTER_NOT_LEADER
            | ErrorCode::CLUSTER_NOT_ASSIGNED
            | ErrorCode::CLUSTER_NOT_ACTIVE
            | ErrorCode::CLUSTER_NO_PEERS
            | ErrorCode::CLUSTER_INCOMPLETE
            | ErrorCode::CLUSTER_PEER_NOT_MEMBER
            | ErrorCode::CLUSTER_SERVER_NOT_MEMBER
            | ErrorCode::CLUSTER_SERVER_MEMBER_CHANGE_INFLIGHT
            | ErrorCode::STREAM_DUPLICATE_MESSAGE_CONFLICT
            | ErrorCode::STREAM_TOO_MANY_REQUESTS
    )
}

/// `flight` with the outcome of its publication, `sent` on connection `sent_on`: its
/// acknowledgement awaited ([`await_ack`]), or why the client did not take it.
async fn settled(
    flight: Flight,
    sent: Result<jetstream::context::PublishAckFuture, PublishError>,
    connections: Connections,
    sent_on: u64,
) -> Done {
    let outcome = match sent {
        Ok(ack) => await_ack(ack, connections, sent_on).await,
        Err(e) => outcome_of(&e),
    };
    (flight, outcome)
}

/// Awaits the acknowledgement of a message sent on connection `sent_on`.
async fn await_ack(ack: jetstream::context::PublishAckFuture, mut connections: Connections, sent_on: u64) -> Outcome {
    tokio::select! {
        acked = tokio::time::timeout(ACK_TIMEOUT, ack.into_future()) => match acked {
            Ok(Ok(ack)) if ack.duplicate => Outcome::Duplicate(ack.sequence),
            Ok(Ok(_)) => Outcome::Stored,
            Ok(Err(e)) => outcome_of(&e),
            Err(_) => Outcome::Unanswered(format!("no acknowledgement within {} s", ACK_TIMEOUT.as_secs())),
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
            Outcome::Again("the connection was lost before the acknowledgement".to_string(), Duration::ZERO)
        }
    }
}

/// Answers snapshot requests on [`nats_snapshot_subject`] of `subject` until the connection
/// ends: to the request's reply subject, the publisher's greeting, then the `SNAPSHOT`
/// records, each at most the server's `max_payload`. A snapshot is built by one of
/// [`crate::snapshot::SNAPSHOT_BUILDS`] at a time; a request that finds none free is told
/// `BUSY` (a record for frame 0 with the reason), as is one over the state's limits.
///
/// Request/reply rather than the latest snapshot kept in JetStream: a snapshot is as of the
/// moment it is asked for, so the live subject takes over from the frame after it with nothing
/// to bridge, and nothing is built or stored while nobody joins.
///
/// [`nats_snapshot_subject`]: mdrelay_proto::relay::snapshot::nats_snapshot_subject
async fn answer_snapshots(
    client: async_nats::Client,
    subject: String,
    nats: crate::snapshot::NatsSnapshots,
    counts: Arc<NatsCounters>,
) {
    use futures_util::StreamExt;
    use std::sync::atomic::Ordering;
    let asked_on = mdrelay_proto::relay::snapshot::nats_snapshot_subject(&subject);
    let mut requests = match client.subscribe(asked_on.clone()).await {
        Ok(requests) => requests,
        Err(error) => {
            tracing::warn!(subject = %asked_on, %error, "cannot answer snapshot requests over NATS");
            return;
        }
    };
    tracing::info!(subject = %asked_on, "answering snapshot requests over NATS");
    let builds = Arc::new(tokio::sync::Semaphore::new(crate::snapshot::SNAPSHOT_BUILDS));
    while let Some(request) = requests.next().await {
        let Some(reply) = request.reply else {
            counts.snapshots_refused.fetch_add(1, Ordering::Relaxed);
            continue;
        };
        let format =
            mdrelay_codec::Format::from_id(nats.format.load(Ordering::Relaxed)).unwrap_or(mdrelay_codec::Format::Raw);
        let Ok(permit) = builds.clone().try_acquire_owned() else {
            counts.snapshots_refused.fetch_add(1, Ordering::Relaxed);
            let busy = format!("snapshot not sent: {} are being built", crate::snapshot::SNAPSHOT_BUILDS);
            let answer = [hello(&nats, format, 0), snapshot_refusal(&busy)];
            tokio::spawn(send(client.clone(), reply, answer.into()));
            continue;
        };
        let (client, nats, counts) = (client.clone(), nats.clone(), counts.clone());
        tokio::spawn(async move {
            let _permit = permit;
            let copy = nats.state.lock().unwrap_or_else(|e| e.into_inner()).clone();
            let as_of = copy.as_of;
            let record_bytes = client.server_info().max_payload.saturating_sub(RecordHeader::LEN).max(1 << 10);
            let built = crate::snapshot::build(copy, format, &nats.protection, nats.session, record_bytes).await;
            let mut answer = vec![hello(&nats, format, as_of.saturating_add(1))];
            match built {
                Ok((records, size)) => {
                    answer.extend(records.into_iter().map(bytes::Bytes::from));
                    counts.snapshots_sent.fetch_add(1, Ordering::Relaxed);
                    tracing::info!(
                        as_of,
                        symbols = size.symbols,
                        frames = size.frames,
                        bytes = size.bytes,
                        "snapshot sent over NATS"
                    );
                }
                Err(why) => {
                    counts.snapshots_refused.fetch_add(1, Ordering::Relaxed);
                    answer.push(snapshot_refusal(&why));
                }
            }
            send(client, reply, answer).await;
        });
    }
}

/// The publisher's greeting, first of every answer: the requester learns the session the
/// snapshot's frames are sealed for, and the publisher's protection.
fn hello(nats: &crate::snapshot::NatsSnapshots, format: mdrelay_codec::Format, next: u64) -> bytes::Bytes {
    bytes::Bytes::copy_from_slice(&crate::fanout::hello(nats.session, nats.stream, nats.guard, format, next).to_bytes())
}

/// [`crate::snapshot::refusal_record`] as a message.
fn snapshot_refusal(why: &str) -> bytes::Bytes {
    bytes::Bytes::from(crate::snapshot::refusal_record(why))
}

/// Publishes an answer's messages to the requester's reply subject, in order.
async fn send(client: async_nats::Client, reply: async_nats::Subject, answer: Vec<bytes::Bytes>) {
    for message in answer {
        if let Err(error) = client.publish(reply.clone(), message).await {
            tracing::warn!(%error, "snapshot answer not sent");
            return;
        }
    }
    let _ = client.flush().await;
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

    /// JetStream's error answer to a publication, as the server sends it.
    fn answer(code: u64, description: &str) -> PublishError {
        let json = format!(r#"{{"code":503,"err_code":{code},"description":"{description}"}}"#);
        let error: jetstream::Error = serde_json::from_str(&json).unwrap();
        PublishError::with_source(PublishErrorKind::Other, error)
    }

    #[test]
    fn a_full_stream_or_a_sealed_one_refuses_for_good_and_a_cluster_not_ready_is_tried_again() {
        // `discard new` at max_msgs, a message over max_msg_size, a sealed stream: the same again.
        for (code, what) in [
            (10077, "maximum messages exceeded"),
            (10054, "message size exceeds maximum allowed"),
            (10109, "invalid operation on sealed stream"),
        ] {
            match outcome_of(&answer(code, what)) {
                Outcome::Refused(reason) => {
                    assert!(reason.contains(what) && reason.contains(&code.to_string()), "{reason}")
                }
                other => panic!("{code}: {other:?}"),
            }
        }
        // A cluster electing a leader, an id still being stored, a server too busy: another try.
        for code in [10008, 10009, 10158, 10167] {
            assert!(matches!(outcome_of(&answer(code, "not now")), Outcome::Again(_, RETRY_WAIT)), "{code}");
        }
        assert!(matches!(outcome_of(&PublishError::new(PublishErrorKind::TimedOut)), Outcome::Again(..)));
        assert!(matches!(outcome_of(&PublishError::new(PublishErrorKind::BrokenPipe)), Outcome::Again(..)));
        // An answer that is not JetStream's: another try, as before.
        assert!(matches!(outcome_of(&PublishError::new(PublishErrorKind::Other)), Outcome::Again(..)));
        assert!(matches!(outcome_of(&PublishError::new(PublishErrorKind::StreamNotFound)), Outcome::Unanswered(_)));
        assert!(matches!(
            outcome_of(&PublishError::new(PublishErrorKind::MaxPayloadExceeded)),
            Outcome::Refused(reason) if reason.contains("nats.max_message")
        ));
    }

    #[test]
    fn a_message_carries_its_keyed_id_in_its_generation() {
        let header = DatagramHeader {
            version: DATAGRAM_VERSION,
            format: Format::Sbe,
            kind: mdrelay_proto::relay::DatagramKind::Data,
            frame_count: 3,
            protection: Default::default(),
            session: 0xab,
            sequence: 42,
        };
        let ids = MessageIds::new([9; 32]);
        let flight =
            |generation| Flight { message: Bytes::copy_from_slice(&header.to_bytes()), at: 0, generation, held: true };
        for generation in [0, 1] {
            let sent = headers(&ids, &flight(generation));
            let id = sent.get("Nats-Msg-Id").map(|v| v.to_string());
            assert_eq!(id, Some(ids.id(&header, generation)));
        }
        let junk = Flight { message: Bytes::from_static(b"garbage"), at: 0, generation: 0, held: true };
        assert!(headers(&ids, &junk).get("Nats-Msg-Id").is_none(), "no datagram, no id");
    }
}
