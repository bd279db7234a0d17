//! `Builder::snapshot`: a program that joins a real publisher mid-stream gets the state as of a
//! frame, then every frame after it; the books it keeps from there equal the independent
//! reference reader's for the whole day (`iexbook.py`, `expected/DEEP10.book.json`), the day's
//! traded volume is the reference's, and the end says the stream is complete.

use crate::common::*;
use mdrelay_client::{Books, Builder, Event, Waited};
use mdrelay_harness::{assert_books_match, expected, shared};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

#[test]
fn a_program_that_joins_with_a_snapshot_keeps_the_whole_days_books() {
    let _shared = shared();
    let deep10 = capture("DEEP10");
    let args = ["--capture", &deep10, "--format", "protobuf", "--tcp", "127.0.0.1:0", "--slow-subscriber", "block"];
    let pacing = ["--wait-subscribers", "1", "--pacing", "rate", "--rate", "400000"];
    let mut publisher = publisher(&args.iter().chain(&pacing).copied().collect::<Vec<_>>());
    let address = publisher.serving_on().to_string();
    // An early subscriber starts the stream and reads it to the end; the program joins once it
    // has taken 5,000 frames.
    let frames = Arc::new(AtomicU64::new(0));
    let early = {
        let (address, frames) = (address.clone(), frames.clone());
        thread::spawn(move || {
            let mut early = Builder::tcp(address).build().unwrap();
            while let Some(event) = early.next_event().unwrap() {
                if let Event::Frame(_) = event {
                    frames.fetch_add(1, Ordering::Relaxed);
                }
            }
        })
    };
    let started = Instant::now();
    while frames.load(Ordering::Relaxed) < 5_000 {
        assert!(started.elapsed() < RUN, "the early subscriber took no 5,000 frames");
        thread::sleep(Duration::from_millis(5));
    }
    let mut late = Builder::tcp(&address).snapshot(true).build().unwrap();
    let (mut books, mut as_of, mut volume, mut first, mut end) = (None::<Books>, None, 0u64, None, None);
    while end.is_none() {
        assert!(started.elapsed() < RUN, "no end of stream");
        match late.next_event_timeout(Duration::from_secs(1)).unwrap() {
            Waited::Event(Event::Snapshot(snapshot)) => {
                assert!(books.is_none(), "one snapshot");
                as_of = Some(snapshot.as_of());
                volume = snapshot.aggregates().map(|(_, a)| a.trade_volume).sum();
                books = Some(snapshot.books().clone());
            }
            Waited::Event(Event::Frame(frame)) => {
                let books = books.as_mut().expect("the snapshot comes before the frames");
                first.get_or_insert(frame.sequence());
                for message in frame.messages() {
                    if let mdrelay_client::Message::TradeReport(t) = message {
                        volume += u64::from(t.size);
                    }
                }
                books.extend(frame.messages());
            }
            Waited::Event(Event::End(e)) => end = Some(e),
            Waited::Event(Event::SnapshotMissing { reason }) => panic!("no snapshot: {reason}"),
            Waited::Event(_) | Waited::TimedOut => {}
            Waited::Finished => break,
        }
    }
    let as_of = as_of.expect("a snapshot");
    assert!(as_of >= 5_000, "joined mid-stream: the snapshot is as of frame {as_of}");
    assert_eq!(first, Some(as_of + 1), "the stream goes on from the frame after the snapshot's");
    assert!(end.expect("an end").complete, "the snapshot and the frames after it are the whole stream");
    let reference = expected("DEEP10.json");
    assert_eq!(Some(volume), reference["total_trade_volume"].as_u64());
    let ours = serde_json::to_value(books.unwrap().to_reference_json("DEEP10.pcap.gz")).unwrap();
    let reference_books = expected("DEEP10.book.json");
    assert_books_match(&ours, &reference_books, "a program joining with a snapshot");
    assert_eq!(ours["messages_applied"], reference_books["messages_applied"]);
    early.join().unwrap();
    publisher.finish(mdrelay_harness::STEP).assert_success();
}

#[test]
fn books_kept_over_the_first_200000_messages_equal_the_reference_there() {
    let _shared = shared();
    let deep10 = capture("DEEP10");
    let args = ["--capture", &deep10, "--format", "sbe", "--tcp", "127.0.0.1:0", "--wait-subscribers", "1"];
    let mut publisher = publisher(&args.iter().chain(&["--slow-subscriber", "block"]).copied().collect::<Vec<_>>());
    let mut subscriber = Builder::tcp(publisher.serving_on().to_string()).build().unwrap();
    let mut books = Books::new();
    while books.messages_applied() < 200_000 {
        match subscriber.next_event().unwrap() {
            Some(Event::Frame(frame)) => {
                let left = 200_000 - books.messages_applied();
                books.extend(frame.messages().take(left as usize));
            }
            Some(_) => {}
            None => panic!("the stream ended after {} messages", books.messages_applied()),
        }
    }
    subscriber.close();
    let ours = serde_json::to_value(books.to_reference_json("DEEP10.pcap.gz")).unwrap();
    let reference = expected("DEEP10.book-after-200000.json");
    assert_books_match(&ours, &reference, "the client's books after 200,000 messages");
    assert_eq!(ours["messages_applied"], reference["messages_applied"]);
    publisher.finish(RUN).assert_success();
}

#[cfg(feature = "nats")]
/// Fires `count` snapshot requests at once on the publisher's snapshot subject of `subject`,
/// and reads the first record after the greeting of each answer: how many were snapshots and
/// how many refusals (with their reasons).
fn flood_of_nats_requests(url: &str, subject: &str, count: usize) -> (usize, Vec<String>) {
    use futures_util::StreamExt;
    use mdrelay_proto::relay::{RecordHeader, RecordTag};
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    runtime.block_on(async {
        let client = async_nats::connect(url).await.unwrap();
        let asked_on = mdrelay_proto::relay::snapshot::nats_snapshot_subject(subject);
        let mut inboxes = Vec::new();
        for _ in 0..count {
            let inbox = client.new_inbox();
            let answers = client.subscribe(inbox.clone()).await.unwrap();
            client.publish_with_reply(asked_on.clone(), inbox, bytes::Bytes::new()).await.unwrap();
            inboxes.push(answers);
        }
        client.flush().await.unwrap();
        let (mut snapshots, mut refused) = (0, Vec::new());
        for mut answers in inboxes {
            let mut next = async || tokio::time::timeout(RUN, answers.next()).await.unwrap().unwrap().payload;
            let _greeting = next().await;
            let record = next().await;
            let header = RecordHeader::parse(&record, record.len()).unwrap();
            match header.tag {
                RecordTag::Snapshot => snapshots += 1,
                RecordTag::Busy => refused.push(String::from_utf8_lossy(&record[RecordHeader::LEN..]).into_owned()),
                tag => panic!("a {tag:?} record answering a snapshot request"),
            }
        }
        (snapshots, refused)
    })
}

#[cfg(feature = "nats")]
#[test]
#[ignore = "long (about 5 s): .ci/run runs it with --ignored"]
fn a_flood_of_snapshot_requests_over_nats_is_refused_past_two_builds_and_a_joiner_after_it_gets_its_snapshot() {
    let _serial = mdrelay_harness::serial();
    let dir = tempfile::tempdir().unwrap();
    let server = mdrelay_harness::NatsServer::start();
    let url = server.url();
    let config = dir.path().join("nats.toml");
    std::fs::write(&config, format!("[nats]\nservers = [{url:?}]\nsubject = \"md.flood\"\nstream = \"FLOOD\"\n"))
        .unwrap();
    let (config, deep10) = (config.display().to_string(), capture("DEEP10"));
    let json = dir.path().join("pub.json").display().to_string();
    let args = ["--config", &config, "--capture", &deep10, "--format", "sbe", "--json", &json];
    let mut publisher =
        publisher(&args.iter().chain(&["--pacing", "rate", "--rate", "100000"]).copied().collect::<Vec<_>>());
    publisher.wait_for("answering snapshot requests over NATS");
    thread::sleep(Duration::from_millis(500));
    let asked = 60;
    let (snapshots, refused) = flood_of_nats_requests(&url, "md.flood", asked);
    assert!(snapshots >= 2, "{snapshots} snapshots, refused: {refused:?}");
    assert!(!refused.is_empty() && refused.iter().all(|r| r.contains("being built")), "{refused:?}");
    // After the flood, a joiner is answered and takes the rest of the day from its snapshot.
    let mut late = Builder::nats(url, "md.flood").nats_stream("FLOOD").snapshot(true).build().unwrap();
    let started = Instant::now();
    let (mut as_of, mut end) = (None, None);
    while end.is_none() {
        assert!(started.elapsed() < RUN, "no end of stream");
        match late.next_event_timeout(Duration::from_secs(1)).unwrap() {
            Waited::Event(Event::Snapshot(snapshot)) => as_of = Some(snapshot.as_of()),
            Waited::Event(Event::SnapshotMissing { reason }) => panic!("no snapshot: {reason}"),
            Waited::Event(Event::End(e)) => end = Some(e),
            Waited::Event(_) | Waited::TimedOut => {}
            Waited::Finished => break,
        }
    }
    assert!(as_of.is_some_and(|n| n > 1), "{as_of:?}");
    assert!(end.expect("an end").complete, "the snapshot and the frames after it are the whole stream");
    publisher.finish(RUN).assert_success();
    let summary = mdrelay_harness::json_file(std::path::Path::new(&json));
    let n = &summary["nats"];
    assert_eq!(n["snapshots_refused"], refused.len() as u64, "{n}");
    assert_eq!(n["snapshots_sent"], snapshots as u64 + 1, "{n}");
}
