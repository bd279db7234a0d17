//! The NATS output against hostile and careless peers of its stream, on real `nats-server`
//! processes, real publishers and subscribers:
//! - a rogue allowed to publish on the subject reads the session from the first message and
//!   publishes junk under the message ids of 500 frames ahead and of the END, as they were once
//!   made (session and sequence): the ids are keyed now, its junk takes none of them, and a late
//!   `--from-start` subscriber replays every frame and the END;
//! - a rogue that holds the id key (`nats.id_key_file`) makes the real ids and takes them first:
//!   the publisher reads back what the stream holds under each, finds another message, counts it
//!   (`taken`, a warning, a metric an alert reads) and publishes its own again under a new id, so
//!   the stream still holds every frame and the END;
//! - two relays of one origin sharing the id key store each frame once;
//! - the stream deleted mid-run is created again and the run ends; a stream full under
//!   `discard new` ends the run with exit 1, naming the stream and its limit, with the report
//!   written;
//! - a frozen server: the publisher's memory stays within `nats.queue_bytes` of what it was.

use crate::common::{alone_in_tempdir, beside_others_in_tempdir};
use hmac::{Hmac, Mac};
use mdrelay_harness::cli_args::words;
use mdrelay_harness::{
    Finished, NatsServer, Process, Signal, assert_aggregates, expected, free_tcp_port, iex_data, json_file, nats_cli,
    nats_stream_state, publisher_bin, subscriber_bin,
};
use mdrelay_proto::relay::{DatagramHeader, DatagramKind};
use serde_json::Value;
use sha2::Sha256;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The longest a DEEP10 run here may take (seconds when nothing hangs).
const RUN: Duration = Duration::from_secs(120);

/// How long a late subscriber may take to replay DEEP10 from the stream.
const REPLAY: Duration = Duration::from_secs(90);

const SUBJECT: &str = "md.hostile";
const STREAM: &str = "HOSTILE";

/// The frame whose id the rogues take first, and how many after it: far enough into DEEP10 at
/// [`RATE`] that the rogue is done before the publisher gets there.
const FIRST_TAKEN: u64 = 60_000;
const TAKEN_FRAMES: u64 = 500;

/// Messages a second: DEEP10 (392k messages, 121k frames) in about 4 s.
const RATE: u32 = 100_000;

/// The default of `nats.queue_bytes` (docs/operations.md, "NATS output").
const QUEUE_BYTES_DEFAULT: u64 = 64 << 20;

fn deep10() -> PathBuf {
    iex_data().join("DEEP10.pcap.gz")
}

/// DEEP10's frames (one per segment).
fn deep10_frames() -> u64 {
    expected("DEEP10.json")["segments"].as_u64().unwrap()
}

/// A publisher configuration of DEEP10 in SBE into `[nats]` at `url` (SUBJECT, STREAM) with
/// `pacing` (its section's keys), one frame a message unless `more` says otherwise; `nats` and
/// `more` add keys to `[nats]` and sections after it.
fn publisher_config(dir: &Path, url: &str, pacing: &str, nats: &str, more: &str) -> PathBuf {
    let text = format!(
        "format = \"sbe\"\n[source]\ncapture = \"{}\"\n[pacing]\n{pacing}\n[nats]\nservers = [\"{url}\"]\n\
         subject = \"{SUBJECT}\"\nstream = \"{STREAM}\"\n{nats}\n{more}",
        deep10().display()
    );
    let path = dir.join("pub.toml");
    std::fs::write(&path, text).unwrap();
    path
}

fn paced() -> String {
    format!("mode = \"rate\"\nrate = {RATE}")
}

fn run_publisher(config: &Path, json: &Path) -> Process {
    Process::start(publisher_bin(), ["run", "--config", config.to_str().unwrap(), "--json", json.to_str().unwrap()])
}

/// `mdrelay-sub` replaying the stream from its first message, after the run: how it ended and
/// its report. Bounded: a subscriber waiting for an END the stream does not hold fails here.
fn replay_from_start(url: &str, dir: &Path) -> (Finished, Value) {
    let json = dir.join("replay.json");
    let args = ["--nats", url, "--nats-subject", SUBJECT, "--nats-stream", STREAM, "--from-start", "--json"];
    let replay = Process::start(subscriber_bin(), args.iter().copied().chain([json.to_str().unwrap()]));
    let finished = replay.try_finish(REPLAY).unwrap_or_else(|f| panic!("the replay from the stream's start: {f}"));
    assert_eq!(finished.code(), Some(0), "{finished:?}");
    (finished, json_file(&json))
}

/// Asserts a subscriber's report is all of DEEP10, its END included.
fn assert_whole(report: &Value, context: &str) {
    let reference = expected("DEEP10.json");
    assert_aggregates(report, &reference, context);
    assert_eq!(report["messages"], reference["messages"], "{context}: {report}");
    assert_eq!(report["frames"], deep10_frames(), "{context}: {report}");
    assert_eq!(report["gaps"], 0, "{context}: {report}");
    assert_eq!(report["totals_match"], true, "{context}: the END came, and its totals match: {report}");
}

/// A 32-byte key as 64 hex digits in a file only its owner reads.
fn key_file(dir: &Path, byte: u8) -> (PathBuf, [u8; 32]) {
    use std::os::unix::fs::PermissionsExt;
    let key = [byte; 32];
    let path = dir.join("ids.key");
    std::fs::write(&path, key.iter().map(|b| format!("{b:02x}")).collect::<String>() + "\n").unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    (path, key)
}

/// A message id as docs/protocol.md ("NATS message ids") defines it: the session in 16 hex
/// digits, the first frame's sequence (`end` for an END), `.generation` past the first, and the
/// first 8 bytes of HMAC-SHA256 under `key` of the label, the session, the kind, the sequence and
/// the generation.
fn keyed_id(key: &[u8; 32], session: u64, end: bool, sequence: u64, generation: u32) -> String {
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(key).unwrap();
    mac.update(b"mdrelay nats message id v1");
    mac.update(&session.to_le_bytes());
    mac.update(&[u8::from(end)]);
    mac.update(&sequence.to_le_bytes());
    mac.update(&generation.to_le_bytes());
    let tag: String = mac.finalize().into_bytes()[..8].iter().map(|b| format!("{b:02x}")).collect();
    let what = if end { "end".to_string() } else { sequence.to_string() };
    let what = if generation == 0 { what } else { format!("{what}.{generation}") };
    format!("{session:016x}-{what}-{tag}")
}

/// The ids a message had before they were keyed: the session and the first sequence, `end` for
/// the END.
fn predictable_id(session: u64, end: bool, sequence: u64) -> String {
    if end { format!("{session:016x}-end") } else { format!("{session:016x}-{sequence}") }
}

/// A peer allowed to publish on the subject: it reads the stream's first message and publishes
/// junk under ids of its choosing.
struct Rogue {
    runtime: tokio::runtime::Runtime,
    client: async_nats::Client,
    subscription: Option<async_nats::Subscriber>,
}

impl Rogue {
    /// Subscribed to the subject, before the publisher starts.
    fn listen(url: &str) -> Rogue {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let (client, subscription) = runtime.block_on(async {
            let client = tokio::time::timeout(Duration::from_secs(10), async_nats::connect(url))
                .await
                .expect("the rogue connects in time")
                .expect("the rogue connects");
            let subscription = client.subscribe(SUBJECT).await.unwrap();
            client.flush().await.unwrap();
            (client, subscription)
        });
        Rogue { runtime, client, subscription: Some(subscription) }
    }

    /// The first message's session and `Nats-Msg-Id`, as anyone reading the subject sees them.
    fn first_message(&mut self) -> (u64, String) {
        let mut subscription = self.subscription.take().expect("read once");
        self.runtime.block_on(async {
            use futures_util::StreamExt;
            let message = tokio::time::timeout(Duration::from_secs(30), subscription.next())
                .await
                .expect("the first message comes in time")
                .expect("the subscription is open");
            let header = DatagramHeader::parse(&message.payload).expect("the first message is a datagram");
            let id = message.headers.as_ref().and_then(|h| h.get("Nats-Msg-Id")).map(|v| v.to_string());
            (header.session, id.unwrap_or_default())
        })
    }

    /// Publishes junk to the stream under each of `ids`, and returns the stream sequence each
    /// was stored at (none may be a duplicate: the rogue is first to each id).
    fn publish_junk(&self, ids: &[String]) -> Vec<u64> {
        self.runtime.block_on(async {
            let js = async_nats::jetstream::new(self.client.clone());
            let mut stored = Vec::new();
            for (i, id) in ids.iter().enumerate() {
                let mut headers = async_nats::HeaderMap::new();
                headers.insert("Nats-Msg-Id", id.as_str());
                let junk = bytes::Bytes::from(format!("junk {i}"));
                let ack = js.publish_with_headers(SUBJECT, headers, junk).await.unwrap();
                let ack = tokio::time::timeout(Duration::from_secs(10), ack.into_future())
                    .await
                    .expect("acknowledged in time")
                    .expect("stored");
                assert!(!ack.duplicate, "the rogue came too late for {id}: the publisher's message is stored");
                stored.push(ack.sequence);
            }
            stored
        })
    }
}

/// The stream's last message, as the stream holds it.
fn last_stored(url: &str) -> async_nats::jetstream::message::StreamMessage {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    runtime.block_on(async {
        let client = async_nats::connect(url).await.unwrap();
        let js = async_nats::jetstream::new(client);
        let stream = js.get_stream(STREAM).await.unwrap();
        stream.get_last_raw_message_by_subject(SUBJECT).await.unwrap()
    })
}

/// The stream's messages, by natscli.
fn stored_messages(url: &str) -> u64 {
    nats_stream_state(url, STREAM).unwrap_or_else(|e| panic!("{e}"))["messages"].as_u64().unwrap()
}

/// Junk published under the ids of the 500 frames from [`FIRST_TAKEN`] and of the END, made by
/// `id` from (session, END?, sequence), once the rogue has read the session; the publisher's
/// summary after the run.
fn attack(rogue: &mut Rogue, publisher: Process, json: &Path, id: impl Fn(u64, bool, u64) -> String) -> Value {
    let (session, first_id) = rogue.first_message();
    assert!(first_id.starts_with(&format!("{session:016x}-")), "an id names its session: {first_id}");
    let mut ids: Vec<String> = (FIRST_TAKEN..FIRST_TAKEN + TAKEN_FRAMES).map(|seq| id(session, false, seq)).collect();
    // The END names the frame after the last.
    ids.push(id(session, true, deep10_frames() + 1));
    let stored = rogue.publish_junk(&ids);
    let last = *stored.iter().max().unwrap();
    // One frame a message: the publisher had not reached the first frame attacked yet.
    assert!(last < FIRST_TAKEN, "the junk was stored in time (up to stream sequence {last})");
    let finished = publisher.finish(RUN);
    assert_eq!(finished.code(), Some(0), "{finished:?}");
    json_file(json)
}

#[test]
#[ignore = "long (over 3 s here): .ci/run runs it with --ignored"]
fn a_rogue_that_reads_the_session_cannot_erase_frames_or_the_end_from_the_stream() {
    let (_shared, dir) = beside_others_in_tempdir();
    let server = NatsServer::start();
    let json = dir.path().join("pub.json");
    let mut rogue = Rogue::listen(&server.url());
    let publisher = run_publisher(&publisher_config(dir.path(), &server.url(), &paced(), "", ""), &json);
    let summary = attack(&mut rogue, publisher, &json, predictable_id);
    let frames = deep10_frames();
    let nats = &summary["nats"];
    // Before: 501 duplicates, the real frames and END dropped by the server as copies of the junk.
    assert_eq!(nats["duplicates"], 0, "no id of the publisher's was taken: {nats}");
    assert_eq!(nats["taken"], 0, "{nats}");
    assert_eq!(nats["published"], frames + 1, "{nats}");
    assert_eq!(nats["acknowledged"], frames + 1, "{nats}");
    assert_eq!(stored_messages(&server.url()), frames + 1 + TAKEN_FRAMES + 1, "every frame, the END, and the junk");
    let (_, replay) = replay_from_start(&server.url(), dir.path());
    assert_whole(&replay, "replayed from the stream after the rogue");
}

#[test]
#[ignore = "long (over 3 s here): .ci/run runs it with --ignored"]
fn messages_whose_ids_a_key_holder_took_are_counted_and_published_again_under_new_ids() {
    let (_shared, dir) = beside_others_in_tempdir();
    let server = NatsServer::start();
    let (key_path, key) = key_file(dir.path(), 0x5a);
    let json = dir.path().join("pub.json");
    let metrics_port = free_tcp_port();
    let config = publisher_config(
        dir.path(),
        &server.url(),
        &paced(),
        &format!("id_key_file = \"{}\"", key_path.display()),
        &format!("[metrics]\nlisten = \"127.0.0.1:{metrics_port}\"\nhold = 60"),
    );
    let mut rogue = Rogue::listen(&server.url());
    let mut publisher = run_publisher(&config, &json);
    let (session, first_id) = rogue.first_message();
    assert_eq!(first_id, keyed_id(&key, session, false, 1, 0), "the first message's id, as documented");
    let mut ids: Vec<String> =
        (FIRST_TAKEN..FIRST_TAKEN + TAKEN_FRAMES).map(|seq| keyed_id(&key, session, false, seq, 0)).collect();
    ids.push(keyed_id(&key, session, true, deep10_frames() + 1, 0));
    let stored = rogue.publish_junk(&ids);
    assert!(*stored.iter().max().unwrap() < FIRST_TAKEN, "the junk was stored in time: {stored:?}");
    let warned = publisher.wait_for_within("another message holds its id", RUN);
    assert!(warned.contains("WARN"), "{warned}");
    publisher.wait_for_within("metrics endpoint stays up", RUN);
    let scraped = mdrelay_harness::scrape(([127, 0, 0, 1], metrics_port).into()).unwrap();
    publisher.signal(Signal::SIGTERM);
    let finished = publisher.finish(RUN);
    assert_eq!(finished.code(), Some(0), "{finished:?}");
    let summary = json_file(&json);
    let frames = deep10_frames();
    let nats = &summary["nats"];
    assert_eq!(nats["taken"], TAKEN_FRAMES + 1, "each message whose id the junk holds: {nats}");
    assert_eq!(nats["duplicates"], 0, "{nats}");
    assert_eq!(nats["published"], frames + 1, "{nats}");
    assert_eq!(nats["acknowledged"], frames + 1, "each stored once, under a new id: {nats}");
    assert_eq!(
        scraped.get("mdrelay_pub_nats_messages_total", "outcome=\"taken\""),
        Some((TAKEN_FRAMES + 1) as f64),
        "{}",
        scraped.text
    );
    // The alerts on the NATS output read series a NATS publisher serves.
    let served = scraped.names();
    for name in mdrelay_harness::alert_queries().iter().filter(|n| n.starts_with("mdrelay_pub_nats_")) {
        assert!(served.contains(name), "an alert reads {name}, not served: {served:?}");
    }
    assert_eq!(stored_messages(&server.url()), frames + 1 + TAKEN_FRAMES + 1, "every frame, the END, and the junk");
    let end = last_stored(&server.url());
    let header = DatagramHeader::parse(&end.payload).expect("the last message is the publisher's");
    assert_eq!((header.kind, header.sequence), (DatagramKind::End, frames + 1), "the stream ends with the END");
    let end_id = end.headers.get("Nats-Msg-Id").map(|v| v.to_string());
    assert_eq!(end_id, Some(keyed_id(&key, session, true, frames + 1, 1)), "the END under its second id");
    let (_, replay) = replay_from_start(&server.url(), dir.path());
    assert_whole(&replay, "replayed from the stream after the ids were taken");
}

#[test]
#[ignore = "long (over 3 s here): .ci/run runs it with --ignored"]
fn two_relays_of_one_origin_sharing_the_id_key_store_each_frame_once() {
    let (_shared, dir) = beside_others_in_tempdir();
    let server = NatsServer::start();
    let (key_path, _) = key_file(dir.path(), 0x3c);
    let tops16 = iex_data().join("TOPS16.pcap.gz");
    let segments = expected("TOPS16.json")["segments"].as_u64().unwrap();
    let mut origin = Process::start(
        publisher_bin(),
        words(&format!(
            "run --capture {} --tcp 127.0.0.1:0 --wait-subscribers 2 --slow-subscriber block --pacing rate \
             --rate 50000",
            tops16.display()
        )),
    );
    let origin_addr = origin.serving_on();
    let relay = |name: &str| {
        let toml = format!(
            "format = \"sbe\"\n[source.upstream]\nconnect = \"{origin_addr}\"\n[nats]\nservers = [\"{}\"]\n\
             subject = \"{SUBJECT}\"\nstream = \"{STREAM}\"\nid_key_file = \"{}\"\n",
            server.url(),
            key_path.display()
        );
        let config = dir.path().join(format!("{name}.toml"));
        std::fs::write(&config, toml).unwrap();
        let json = dir.path().join(format!("{name}.json"));
        (run_publisher(&config, &json), json)
    };
    let (first, first_json) = relay("relay-1");
    let (second, second_json) = relay("relay-2");
    origin.finish(RUN).assert_success();
    for (relay, json) in [(first, &first_json), (second, &second_json)] {
        let finished = relay.finish(RUN);
        assert_eq!(finished.code(), Some(0), "{finished:?}");
        let nats = &json_file(json)["nats"];
        assert_eq!(nats["published"], segments + 1, "{nats}");
        assert_eq!(nats["acknowledged"], segments + 1, "{nats}");
        assert_eq!(nats["taken"], 0, "the other relay's copies are the same bytes: {nats}");
    }
    let duplicates: u64 =
        [&first_json, &second_json].iter().map(|j| json_file(j)["nats"]["duplicates"].as_u64().unwrap()).sum();
    assert_eq!(duplicates, segments + 1, "each message stored by one relay, found stored by the other");
    assert_eq!(stored_messages(&server.url()), segments + 1, "each frame and the END stored once");
}

#[test]
#[ignore = "long (over 3 s here): .ci/run runs it with --ignored"]
fn a_stream_deleted_mid_run_is_created_again_and_the_run_ends() {
    let (_shared, dir) = beside_others_in_tempdir();
    let server = NatsServer::start();
    let json = dir.path().join("pub.json");
    let sub_json = dir.path().join("sub.json");
    let mut live = Process::start(
        subscriber_bin(),
        ["--nats", &server.url(), "--nats-subject", SUBJECT, "--report-interval", "0", "--json"]
            .into_iter()
            .chain([sub_json.to_str().unwrap()]),
    );
    live.wait_for("subscribed over NATS");
    let mut publisher = run_publisher(&publisher_config(dir.path(), &server.url(), &paced(), "", ""), &json);
    publisher.wait_for("publishing to NATS");
    let deadline = Instant::now() + Duration::from_secs(60);
    while nats_stream_state(&server.url(), STREAM).ok().and_then(|s| s["messages"].as_u64()).unwrap_or(0) < 30_000 {
        assert!(Instant::now() < deadline, "the stream did not fill");
        std::thread::sleep(Duration::from_millis(50));
    }
    nats_cli(&server.url(), &["stream", "rm", STREAM, "-f"]).unwrap_or_else(|e| panic!("{e}"));
    let deleted = Instant::now();
    // Before: still publishing the same messages again 60 s later, as many times as it could.
    let finished = publisher.try_finish(Duration::from_secs(60)).unwrap_or_else(|f| panic!("{f}"));
    let ended_in = deleted.elapsed();
    assert_eq!(finished.code(), Some(0), "{finished:?}");
    assert!(finished.stderr.contains("created again"), "the log says so: {finished:?}");
    let summary = json_file(&json);
    let frames = deep10_frames();
    let nats = &summary["nats"];
    assert_eq!(nats["stream_recreations"], 1, "{nats}");
    assert_eq!(nats["published"], frames + 1, "{nats}");
    assert_eq!(nats["acknowledged"], frames + 1, "{nats}");
    // What was in flight at the deletion is published again, each message a few times at most.
    let retries = nats["retries"].as_u64().unwrap();
    assert!(retries < 4 * 4096, "{retries} retries: {nats}");
    // The stream created again ends with the END.
    let end = last_stored(&server.url());
    let header = DatagramHeader::parse(&end.payload).expect("a datagram");
    assert_eq!((header.kind, header.sequence), (DatagramKind::End, frames + 1), "the stream holds the END");
    let live = live.try_finish(Duration::from_secs(30)).unwrap_or_else(|f| panic!("the live subscriber: {f}"));
    assert_eq!(live.code(), Some(0), "{live:?}");
    assert_whole(&json_file(&sub_json), "the live subscriber");
    eprintln!("ended {ended_in:?} after the deletion, {retries} retries");
}

#[test]
#[ignore = "long (over 3 s here): .ci/run runs it with --ignored"]
fn a_full_stream_that_discards_new_messages_ends_the_run_naming_its_limit_with_the_report() {
    let _shared = mdrelay_harness::shared();
    let server = NatsServer::start();
    let limit = 1000;
    let max_msgs = limit.to_string();
    nats_cli(
        &server.url(),
        &["stream", "add", STREAM, "--subjects", SUBJECT, "--max-msgs", &max_msgs, "--discard", "new", "--defaults"],
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("pub.json");
    let started = Instant::now();
    let finished = run_publisher(&publisher_config(dir.path(), &server.url(), "mode = \"top-speed\"", "", ""), &json)
        .try_finish(Duration::from_secs(60))
        .unwrap_or_else(|f| panic!("{f}"));
    eprintln!("ended after {:?}", started.elapsed());
    assert_eq!(finished.code(), Some(1), "a run-time failure: {finished:?}");
    let error = finished.stderr.lines().find(|l| l.starts_with("mdrelay-pub: error:")).expect("an error line");
    for needed in [STREAM, "max_msgs", &max_msgs, "discard new"] {
        assert!(error.contains(needed), "the error names {needed}: {error}");
    }
    let summary = json_file(&json);
    assert_eq!(summary["nats"]["acknowledged"], limit, "what the stream took: {summary}");
    assert!(summary["error"].as_str().is_some_and(|e| e.contains(STREAM)), "the report says why: {summary}");
    assert_eq!(stored_messages(&server.url()), limit);
}

/// The resident memory of process `pid`, in bytes.
fn rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).expect("VmRSS");
    line.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap() * 1024
}

#[test]
#[ignore = "long (over 3 s here): .ci/run runs it with --ignored"]
fn a_frozen_server_holds_the_publishers_memory_within_queue_bytes() {
    let (_serial, dir) = alone_in_tempdir();
    let server = NatsServer::start();
    let json = dir.path().join("pub.json");
    // Messages of up to 64 KiB, DEEP10 over and over: the queue's 65,536 messages alone could
    // hold 4 GiB.
    let config = publisher_config(
        dir.path(),
        &server.url(),
        "mode = \"top-speed\"\nloops = 0",
        "",
        "[batching]\ncoalesce_bytes = 65536",
    );
    let mut publisher = run_publisher(&config, &json);
    publisher.wait_for("publishing to NATS");
    let deadline = Instant::now() + Duration::from_secs(60);
    while nats_stream_state(&server.url(), STREAM).ok().and_then(|s| s["messages"].as_u64()).unwrap_or(0) < 1000 {
        assert!(Instant::now() < deadline, "the stream did not fill");
        std::thread::sleep(Duration::from_millis(50));
    }
    let before = rss(publisher.pid());
    server.signal(Signal::SIGSTOP);
    let frozen = Instant::now();
    // What the queue may hold, and room for the client's buffers and the allocator.
    let bound = before + QUEUE_BYTES_DEFAULT + (32 << 20);
    let mut highest = before;
    let mut full_at = None;
    while frozen.elapsed() < Duration::from_secs(30) {
        highest = highest.max(rss(publisher.pid()));
        if highest > bound {
            break;
        }
        if full_at.is_none()
            && publisher
                .try_wait_until("the queue full", Duration::from_millis(100), |l| l.contains("NATS queue is full"))
                .is_ok()
        {
            full_at = Some(Instant::now());
        }
        // Two seconds more once the queue is full: it stays so, and the memory with it.
        if full_at.is_some_and(|t| t.elapsed() > Duration::from_secs(2)) {
            break;
        }
    }
    server.signal(Signal::SIGCONT);
    let mib = |b: u64| b as f64 / f64::from(1 << 20);
    eprintln!(
        "RSS {:.0} MiB before the freeze, {:.0} MiB at most while frozen ({:.1} s)",
        mib(before),
        mib(highest),
        frozen.elapsed().as_secs_f64()
    );
    assert!(
        highest <= bound,
        "the publisher grew from {:.0} MiB to {:.0} MiB with the server frozen, past {:.0} MiB",
        mib(before),
        mib(highest),
        mib(bound)
    );
    assert!(full_at.is_some(), "the queue filled and the log said so");
    publisher.signal(Signal::SIGINT);
    let finished = publisher.finish(RUN);
    assert_eq!(finished.code(), Some(0), "{finished:?}");
    let nats = &json_file(&json)["nats"];
    assert_eq!(nats["published"], nats["acknowledged"], "everything queued was stored in the end: {nats}");
}
