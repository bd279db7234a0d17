//! `--book` and `--snapshot`: the final books and symbol state a subscriber writes, from a real
//! publisher replaying IEX's DEEP sample, equal to the independent reference reader's
//! (`iexbook.py`, `expected/DEEP10.book.json`), whole or for a symbol filter, and for a
//! subscriber that joins mid-stream with a snapshot, in several formats and protections, whose
//! report then equals the reference for the whole day (`expected/DEEP10.json`); a publisher
//! that keeps no state is said so and the joiner is judged from where it joined; a book path
//! that cannot be written is refused before connecting.

use mdrelay_harness::{
    NatsServer, Process, STEP, assert_aggregates, assert_books_match, expected, iex_data, json_file, publisher_bin,
    serial, shared, subscriber_bin,
};
use serde_json::Value;
use std::net::TcpListener;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The longest a relay of DEEP10 may take (a few seconds; far longer only if something hangs).
const RUN: Duration = Duration::from_secs(120);

fn text(path: &Path) -> String {
    path.display().to_string()
}

/// The book file of a subscriber that took the whole of DEEP10 over TCP, in `format`, with
/// `extra` arguments.
fn book_of_a_whole_stream(format: &str, extra: &[&str]) -> serde_json::Value {
    let dir = tempfile::tempdir().unwrap();
    let (book, json) = (dir.path().join("book.json"), dir.path().join("report.json"));
    let deep10 = text(&iex_data().join("DEEP10.pcap.gz"));
    let args = ["run", "--capture", &deep10, "--format", format, "--tcp", "127.0.0.1:0"];
    let mut publisher =
        Process::start(publisher_bin(), args.iter().chain(&["--wait-subscribers", "1", "--slow-subscriber", "block"]));
    let addr = publisher.serving_on().to_string();
    let (book_arg, json_arg) = (text(&book), text(&json));
    let sub_args = ["--tcp", &addr, "--book", &book_arg, "--json", &json_arg, "--report-interval", "0"];
    let subscriber = Process::start(subscriber_bin(), sub_args.iter().chain(extra));
    publisher.finish(RUN).assert_success();
    subscriber.finish(RUN).assert_success();
    let report = json_file(&json);
    assert_eq!(report["totals_match"], true, "the whole stream: {report}");
    json_file(&book)
}

#[test]
fn the_book_of_a_whole_stream_equals_the_reference_books() {
    let _shared = shared();
    let reference = expected("DEEP10.book.json");
    for format in ["sbe", "json"] {
        let ours = book_of_a_whole_stream(format, &[]);
        assert_books_match(&ours, &reference, &format!("{format}: --book"));
        assert_eq!(ours["messages_applied"], reference["messages_applied"], "{format}");
    }
}

#[test]
fn with_a_symbol_filter_the_book_holds_those_symbols_as_the_reference_has_them() {
    let _shared = shared();
    let reference = expected("DEEP10.book.json");
    let ours = book_of_a_whole_stream("flatbuffers", &["--symbols", "AA,CVS,NOPE"]);
    let symbols = ours["symbols"].as_object().unwrap();
    let names: Vec<_> = symbols.keys().map(String::as_str).collect();
    // NOPE has no state in DEEP10: a filter names symbols, it does not make state.
    assert_eq!(names, ["AA", "CVS"], "only the filter's symbols with state");
    for (symbol, state) in symbols {
        assert_eq!(Some(state), reference["symbols"].get(symbol), "{symbol}");
    }
}

#[test]
fn a_book_path_that_cannot_be_written_is_refused_before_connecting() {
    let _shared = shared();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let dir = tempfile::tempdir().unwrap();
    for path in [dir.path().join("missing/book.json"), dir.path().to_path_buf()] {
        let book = text(&path);
        let args = ["--tcp", &addr, "--book", &book, "--report-interval", "0", "--duration", "1"];
        let done = Process::start(subscriber_bin(), args).finish(STEP);
        assert_eq!(done.code(), Some(2), "{book}: the configuration's exit status: {done:?}");
        let says = format!("configuration error: book: cannot create {book}");
        assert!(done.stderr.contains(&says), "{book}: wanted {says:?}: {done:?}");
    }
    assert!(listener.accept().is_err(), "refused before connecting");
}

/// A key file of `byte` repeated, readable by its owner only.
fn key_file(dir: &Path, byte: u8) -> PathBuf {
    let path = dir.join("wire.key");
    std::fs::write(&path, format!("{byte:02x}").repeat(32) + "\n").unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    path
}

/// What a subscriber that joined mid-stream wrote: its report and its book file.
struct Joined {
    report: Value,
    book: Value,
    stderr: String,
}

/// DEEP10 paced at 400,000 messages a second in `format` under `protection` (`crc`, and a key
/// when `encrypted`), with `publisher_extra` arguments; an early subscriber starts it, and once
/// it has 5,000 frames a second one joins with `joiner_extra` (`--snapshot`, say). Both must end
/// well; the joiner's report and book are returned, after checking the early one took the whole
/// day.
fn join_mid_stream(
    format: &str,
    crc: bool,
    encrypted: bool,
    publisher_extra: &[&str],
    joiner_extra: &[&str],
) -> Joined {
    let dir = tempfile::tempdir().unwrap();
    let deep10 = text(&iex_data().join("DEEP10.pcap.gz"));
    let mut protection = format!("[protection]\ncrc = {crc}\n");
    let mut sub_protection: Vec<String> = if crc { vec!["--crc".into()] } else { vec![] };
    if encrypted {
        let key = text(&key_file(dir.path(), 0x5a));
        protection += &format!("key_file = {key:?}\n");
        sub_protection.extend(["--key-file".into(), key]);
    }
    let config = dir.path().join("publisher.toml");
    std::fs::write(&config, protection).unwrap();
    let config = text(&config);
    let args = ["run", "--config", &config, "--capture", &deep10, "--format", format, "--tcp", "127.0.0.1:0"];
    let pacing = ["--pacing", "rate", "--rate", "400000", "--wait-subscribers", "1", "--slow-subscriber", "block"];
    let mut publisher = Process::start(publisher_bin(), args.iter().chain(&pacing).chain(publisher_extra));
    let addr = publisher.serving_on().to_string();
    let early_json = text(&dir.path().join("early.json"));
    let early_args = ["--tcp", &addr, "--json", &early_json, "--report-interval", "100ms"];
    let mut early =
        Process::start(subscriber_bin(), early_args.iter().map(|s| s.to_string()).chain(sub_protection.clone()));
    early.wait_for_frames(5_000);
    let (book, json) = (text(&dir.path().join("book.json")), text(&dir.path().join("joiner.json")));
    let joiner_args = ["--tcp", &addr, "--book", &book, "--json", &json, "--report-interval", "0"];
    let joiner = Process::start(
        subscriber_bin(),
        joiner_args.iter().chain(joiner_extra).map(|s| s.to_string()).chain(sub_protection),
    );
    publisher.finish(RUN).assert_success();
    early.finish(RUN).assert_success();
    let joined = joiner.finish(RUN);
    joined.assert_success();
    let early_report = json_file(Path::new(&early_json));
    assert_eq!(early_report["totals_match"], true, "the early subscriber took the whole day: {early_report}");
    Joined { report: json_file(Path::new(&json)), book: json_file(Path::new(&book)), stderr: joined.stderr }
}

#[test]
fn a_late_joiner_with_a_snapshot_has_the_whole_days_books_and_report_in_every_protection() {
    let _serial = serial();
    let (books, day) = (expected("DEEP10.book.json"), expected("DEEP10.json"));
    for (format, crc, encrypted) in [("sbe", true, true), ("capnp-packed", false, false), ("json", true, false)] {
        let context = format!("{format}, crc {crc}, encrypted {encrypted}");
        let joined = join_mid_stream(format, crc, encrypted, &[], &["--snapshot"]);
        let r = &joined.report;
        let as_of = r["snapshot_as_of"].as_u64().unwrap_or_else(|| panic!("{context}: no snapshot: {r}"));
        assert!(as_of >= 5_000, "{context}: joined mid-stream, at frame {as_of}");
        assert_eq!(r["late_join_sequence"], Value::Null, "{context}: the snapshot stands for the frames before");
        assert_eq!((&r["totals_match"], &r["stream_complete"]), (&true.into(), &true.into()), "{context}: {r}");
        assert_aggregates(r, &day, &context);
        for key in ["messages", "message_types"] {
            assert_eq!(r[key], day[key], "{context}: {key}");
        }
        assert_eq!((&r["gaps"], &r["duplicates"]), (&0.into(), &0.into()), "{context}: no gap, no duplicate");
        assert_books_match(&joined.book, &books, &context);
        assert_eq!(joined.book["messages_applied"], books["messages_applied"], "{context}");
    }
}

#[test]
fn a_publisher_without_state_says_so_and_the_joiner_is_judged_from_where_it_joined() {
    let _serial = serial();
    let joined = join_mid_stream("sbe", false, false, &["--snapshots", "false"], &["--snapshot"]);
    let r = &joined.report;
    assert!(joined.stderr.contains("no snapshot: the publisher sent no snapshot"), "{}", joined.stderr);
    assert_eq!(r["snapshot_as_of"], Value::Null, "{r}");
    let first = r["late_join_sequence"].as_u64().unwrap_or_else(|| panic!("a late join: {r}"));
    assert!(first > 5_000, "joined at frame {first}");
    assert_eq!((&r["totals_match"], &r["stream_complete"]), (&false.into(), &true.into()), "{r}");
    // The book holds what the stream brought from the join on, not the day's.
    assert!(
        joined.book["messages_applied"].as_u64().unwrap()
            < expected("DEEP10.book.json")["messages_applied"].as_u64().unwrap()
    );
}

/// Greets `addr` as a subscriber asking for a snapshot, over a raw socket: the publisher sends the
/// snapshot and the stream to it, whether it reads or not.
fn ask_for_a_snapshot(addr: &str) -> std::net::TcpStream {
    use mdrelay_proto::relay::{Hello, Subscribe};
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(STEP)).unwrap();
    let mut hello = [0u8; Hello::LEN];
    s.read_exact(&mut hello).unwrap();
    s.write_all(&Subscribe { snapshot: true, ..Subscribe::new(false) }.to_bytes()).unwrap();
    s
}

#[test]
fn snapshot_askers_that_never_read_or_leave_at_once_cost_the_healthy_subscriber_nothing() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let deep10 = text(&iex_data().join("DEEP10.pcap.gz"));
    let args = ["run", "--capture", &deep10, "--format", "sbe", "--tcp", "127.0.0.1:0", "--wait-subscribers", "1"];
    let policy = ["--slow-subscriber", "disconnect", "--queue", "1024", "--pacing", "rate", "--rate", "300000"];
    let mut publisher = Process::start(publisher_bin(), args.iter().chain(&policy));
    let addr = publisher.serving_on().to_string();
    let json = text(&dir.path().join("healthy.json"));
    let mut healthy = Process::start(subscriber_bin(), ["--tcp", &addr, "--json", &json, "--report-interval", "100ms"]);
    healthy.wait_for_frames(2_000);
    // Twenty that ask and then never read a byte, twenty that ask and leave at once.
    let stalled: Vec<_> = (0..20).map(|_| ask_for_a_snapshot(&addr)).collect();
    for _ in 0..20 {
        drop(ask_for_a_snapshot(&addr));
    }
    let published = publisher.finish(RUN);
    published.assert_success();
    healthy.finish(RUN).assert_success();
    let built = published.stderr.matches("snapshot sent").count();
    assert!(built >= 20, "the stalled ones had their snapshots built and queued: {built}");
    let report = json_file(Path::new(&json));
    assert_eq!((&report["totals_match"], &report["gaps"]), (&true.into(), &0.into()), "{report}");
    assert_aggregates(&report, &expected("DEEP10.json"), "the healthy subscriber");
    drop(stalled);
}

/// Where late joiners take the stream from, besides the publisher's TCP port.
enum JoinOver {
    /// The TCP port: the snapshot comes on the connection.
    Tcp,
    /// The loopback multicast group, with the retransmission service: the snapshot comes from
    /// the service, the frames after it from the ring.
    Multicast,
    /// A NATS subject stored in a JetStream stream: the snapshot is asked of the publisher on
    /// its snapshot subject, and the live subject follows.
    Nats,
    /// A relay's TCP port: the relay keeps the state of what its upstream sent.
    Relay,
}

/// Frames of DEEP10 a joiner starts after, as an early subscriber counts them: after the
/// first frame; after about 100,000 and 200,000 messages (DEEP10 averages 3.2 messages a
/// frame); and about 4,000 frames (under a second here) before the `END` at frame 121,314.
const JOIN_POINTS: [u64; 4] = [1, 31_000, 62_000, 117_000];

/// DEEP10 paced at 20,000 messages a second (about 20 s) to TCP and, for `over`, to the loopback
/// multicast group with the retransmission service, to a NATS server, or through a relay; a
/// late joiner with `--snapshot` starts at each of [`JOIN_POINTS`] (as an early TCP subscriber
/// of the origin, or of the relay, counts frames). Each joiner's book equals the reference's at
/// the end and its report the reference for the whole day.
fn late_joiners_at_four_points(over: JoinOver) {
    let dir = tempfile::tempdir().unwrap();
    let deep10 = text(&iex_data().join("DEEP10.pcap.gz"));
    let (books, day) = (expected("DEEP10.book.json"), expected("DEEP10.json"));
    // The group's port: a free one, the same for every member and the publisher.
    let group = format!("239.255.43.9:{}", mdrelay_harness::free_udp_port());
    let service = format!("127.0.0.1:{}", mdrelay_harness::free_tcp_port());
    let nats = matches!(over, JoinOver::Nats).then(NatsServer::start);
    let nats_url = nats.as_ref().map(NatsServer::url).unwrap_or_default();
    let nats_config = text(&dir.path().join("nats.toml"));
    let mut args = vec!["run", "--capture", &deep10, "--format", "sbe", "--tcp", "127.0.0.1:0"];
    args.extend(["--wait-subscribers", "1", "--pacing", "rate", "--rate", "20000"]);
    match over {
        JoinOver::Multicast => {
            args.extend(["--multicast", &group, "--interface", "127.0.0.1", "--ttl", "0"]);
            args.extend(["--retransmit-listen", &service]);
        }
        JoinOver::Nats => {
            let file = format!("[nats]\nservers = [{nats_url:?}]\nsubject = \"md.late\"\nstream = \"LATE\"\n");
            std::fs::write(&nats_config, file).unwrap();
            args.extend(["--config", &nats_config]);
        }
        JoinOver::Tcp | JoinOver::Relay => {}
    }
    let mut publisher = Process::start(publisher_bin(), &args);
    let origin = publisher.serving_on().to_string();
    // Through a relay, the origin starts once the relay is in, and the relay once the early
    // subscriber is: the early subscriber counts the relay's frames, so a join point is one the
    // relay has reached (it runs a little behind its origin).
    let mut relay = matches!(over, JoinOver::Relay).then(|| {
        let args =
            ["run", "--upstream", &origin, "--format", "json", "--tcp", "127.0.0.1:0", "--wait-subscribers", "1"];
        Process::start(publisher_bin(), args)
    });
    let addr = match &mut relay {
        Some(relay) => relay.serving_on().to_string(),
        None => origin.clone(),
    };
    let early_json = text(&dir.path().join("early.json"));
    let mut early =
        Process::start(subscriber_bin(), ["--tcp", &addr, "--json", &early_json, "--report-interval", "50ms"]);
    let mut joiners = Vec::new();
    for point in JOIN_POINTS {
        let seen = early.wait_for_frames(point);
        let book = text(&dir.path().join(format!("book-{point}.json")));
        let json = text(&dir.path().join(format!("{point}.json")));
        let mut joiner_args: Vec<String> = match over {
            JoinOver::Tcp | JoinOver::Relay => vec!["--tcp".into(), addr.clone()],
            JoinOver::Multicast => {
                ["--group", &group, "--interface", "127.0.0.1", "--recovery", &service].map(String::from).to_vec()
            }
            JoinOver::Nats => {
                ["--nats", &nats_url, "--nats-subject", "md.late", "--nats-stream", "LATE"].map(String::from).to_vec()
            }
        };
        joiner_args
            .extend(["--snapshot", "--book", &book, "--json", &json, "--report-interval", "0"].map(String::from));
        joiners.push((point, seen, book, json, Process::start(subscriber_bin(), &joiner_args)));
    }
    publisher.finish(RUN).assert_success();
    if let Some(relay) = relay {
        relay.finish(RUN).assert_success();
    }
    early.finish(RUN).assert_success();
    assert_eq!(json_file(Path::new(&early_json))["totals_match"], true, "the early subscriber took the whole day");
    for (point, seen, book, json, joiner) in joiners {
        let context = format!("a joiner after frame {seen} (join point {point})");
        joiner.finish(RUN).assert_success();
        let r = json_file(Path::new(&json));
        let as_of = r["snapshot_as_of"].as_u64().unwrap_or_else(|| panic!("{context}: no snapshot: {r}"));
        assert!(as_of >= seen, "{context}: the snapshot is as of frame {as_of}, before the join");
        assert_eq!((&r["totals_match"], &r["stream_complete"]), (&true.into(), &true.into()), "{context}: {r}");
        assert_aggregates(&r, &day, &context);
        for key in ["messages", "message_types"] {
            assert_eq!(r[key], day[key], "{context}: {key}");
        }
        let book = json_file(Path::new(&book));
        assert_books_match(&book, &books, &context);
        assert_eq!(book["messages_applied"], books["messages_applied"], "{context}");
    }
}

#[test]
#[ignore = "long (about 20 s): .ci/run runs it with --ignored"]
fn late_joiners_over_tcp_after_1_100k_200k_messages_and_before_the_end_have_the_reference_state() {
    let _serial = serial();
    late_joiners_at_four_points(JoinOver::Tcp);
}

#[test]
#[ignore = "long (about 20 s): .ci/run runs it with --ignored"]
fn late_joiners_over_multicast_take_the_snapshot_from_the_retransmission_service_at_four_points() {
    let _serial = serial();
    late_joiners_at_four_points(JoinOver::Multicast);
}

#[test]
#[ignore = "long (about 20 s): .ci/run runs it with --ignored"]
fn late_joiners_over_nats_ask_the_publisher_for_the_snapshot_at_four_points() {
    let _serial = serial();
    late_joiners_at_four_points(JoinOver::Nats);
}

#[test]
#[ignore = "long (about 20 s): .ci/run runs it with --ignored"]
fn late_joiners_of_a_relay_take_the_relays_state_at_four_points() {
    let _serial = serial();
    late_joiners_at_four_points(JoinOver::Relay);
}

#[test]
#[ignore = "long (about 5 s): .ci/run runs it with --ignored"]
fn a_multicast_joiner_of_a_service_without_state_is_told_why_and_judged_from_where_it_joined() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let deep10 = text(&iex_data().join("DEEP10.pcap.gz"));
    let group = format!("239.255.43.10:{}", mdrelay_harness::free_udp_port());
    let service = format!("127.0.0.1:{}", mdrelay_harness::free_tcp_port());
    let mut args = vec!["run", "--capture", &deep10, "--format", "sbe", "--tcp", "127.0.0.1:0"];
    args.extend(["--wait-subscribers", "1", "--pacing", "rate", "--rate", "200000"]);
    args.extend(["--multicast", &group, "--interface", "127.0.0.1", "--ttl", "0"]);
    args.extend(["--retransmit-listen", &service, "--retransmit-snapshots", "false"]);
    let mut publisher = Process::start(publisher_bin(), &args);
    let origin = publisher.serving_on().to_string();
    let mut early = Process::start(subscriber_bin(), ["--tcp", &origin, "--report-interval", "50ms"]);
    early.wait_for_frames(10_000);
    let json = text(&dir.path().join("joiner.json"));
    let joiner_args = ["--group", &group, "--interface", "127.0.0.1", "--recovery", &service, "--snapshot"];
    let joiner =
        Process::start(subscriber_bin(), joiner_args.iter().chain(&["--json", &json, "--report-interval", "0"]));
    publisher.finish(RUN).assert_success();
    early.finish(RUN).assert_success();
    let joined = joiner.finish(RUN);
    joined.assert_success();
    let says = "no snapshot: 127.0.0.1";
    assert!(joined.stderr.contains(says) && joined.stderr.contains("keeps no state"), "{}", joined.stderr);
    let r = json_file(Path::new(&json));
    assert_eq!(r["snapshot_as_of"], Value::Null, "{r}");
    let first = r["late_join_sequence"].as_u64().unwrap_or_else(|| panic!("a late join: {r}"));
    assert!(first > 10_000, "joined at frame {first}");
    assert_eq!((&r["totals_match"], &r["stream_complete"]), (&false.into(), &true.into()), "{r}");
}

/// The frames of DEEP10 (one per IEX-TP segment, in capture order, from 1) at which the feed
/// restarts: its message sequence goes back, read here from the capture itself.
fn feed_restarts() -> Vec<u64> {
    let mut reader = mdrelay_iex::capture::CaptureReader::open(iex_data().join("DEEP10.pcap.gz")).unwrap();
    let (mut frame, mut restarts, mut last) = (0u64, Vec::new(), None);
    while let Ok(Some(packet)) = reader.next_packet() {
        let Ok(udp) = mdrelay_iex::link::udp_datagram(packet.link_type, packet.data) else { continue };
        let Ok(segment) = mdrelay_iex::iextp::Segment::parse(udp.payload) else { continue };
        frame += 1;
        // Heartbeats repeat the next sequence; a restart takes it back.
        let sequence = segment.header.first_sequence;
        if last.is_some_and(|last| sequence < last) {
            restarts.push(frame);
        }
        last = Some(sequence);
    }
    restarts
}

/// DEEP10 over TCP and multicast with the retransmission service, paced, under AES-GCM; `act` is
/// called with the publisher and its configuration file once the early subscriber has `at` frames, then a
/// TCP and a multicast joiner with `--snapshot` start at once. Both joiners' books equal the
/// reference's and their reports the whole day's; returns their snapshots' frames.
fn joiners_right_after(at: u64, act: impl FnOnce(&mut Process, &Path)) -> [u64; 2] {
    let dir = tempfile::tempdir().unwrap();
    let deep10 = text(&iex_data().join("DEEP10.pcap.gz"));
    let (books, day) = (expected("DEEP10.book.json"), expected("DEEP10.json"));
    let group = format!("239.255.43.11:{}", mdrelay_harness::free_udp_port());
    let service = format!("127.0.0.1:{}", mdrelay_harness::free_tcp_port());
    // Under AES-GCM: the snapshot's frames are sealed as the stream's.
    let key = text(&key_file(dir.path(), 0x3c));
    let config = dir.path().join("publisher.toml");
    std::fs::write(&config, format!("format = \"sbe\"\n[protection]\nkey_file = {key:?}\n")).unwrap();
    let config_arg = text(&config);
    let mut args = vec!["run", "--config", &config_arg, "--capture", &deep10, "--tcp", "127.0.0.1:0"];
    args.extend(["--wait-subscribers", "1", "--pacing", "rate", "--rate", "40000"]);
    args.extend(["--multicast", &group, "--interface", "127.0.0.1", "--ttl", "0", "--retransmit-listen", &service]);
    let mut publisher = Process::start(publisher_bin(), &args);
    let addr = publisher.serving_on().to_string();
    let mut early = Process::start(subscriber_bin(), ["--tcp", &addr, "--key-file", &key, "--report-interval", "20ms"]);
    early.wait_for_frames(at);
    act(&mut publisher, &config);
    let joiners: Vec<_> =
        [vec!["--tcp", &addr], vec!["--group", &group, "--interface", "127.0.0.1", "--recovery", &service]]
            .into_iter()
            .enumerate()
            .map(|(i, over)| {
                let (book, json) =
                    (text(&dir.path().join(format!("book{i}.json"))), text(&dir.path().join(format!("{i}.json"))));
                let args = over.into_iter().map(String::from).chain(
                    ["--key-file", &key, "--snapshot", "--book", &book, "--json", &json, "--report-interval", "0"]
                        .map(String::from),
                );
                (book, json, Process::start(subscriber_bin(), args.collect::<Vec<_>>()))
            })
            .collect();
    publisher.finish(RUN).assert_success();
    early.finish(RUN).assert_success();
    let mut as_of = [0; 2];
    for (i, (book, json, joiner)) in joiners.into_iter().enumerate() {
        let context = format!("{} joiner after frame {at}", ["the TCP", "the multicast"][i]);
        joiner.finish(RUN).assert_success();
        let r = json_file(Path::new(&json));
        as_of[i] = r["snapshot_as_of"].as_u64().unwrap_or_else(|| panic!("{context}: no snapshot: {r}"));
        assert_eq!((&r["totals_match"], &r["stream_complete"]), (&true.into(), &true.into()), "{context}: {r}");
        assert_aggregates(&r, &day, &context);
        assert_eq!(r["message_types"], day["message_types"], "{context}");
        let book = json_file(Path::new(&book));
        assert_books_match(&book, &books, &context);
        assert_eq!(book["messages_applied"], books["messages_applied"], "{context}");
    }
    as_of
}

#[test]
#[ignore = "long (about 10 s): .ci/run runs it with --ignored"]
fn snapshots_taken_across_a_sighup_format_switch_are_exact() {
    let _serial = serial();
    joiners_right_after(30_000, |publisher, config| {
        let switched = std::fs::read_to_string(config).unwrap().replace("\"sbe\"", "\"json\"");
        std::fs::write(config, switched).unwrap();
        publisher.signal(mdrelay_harness::Signal::SIGHUP);
        publisher.wait_for("SIGHUP: format changes at the next frame");
    });
}

#[test]
#[ignore = "long (about 20 s): .ci/run runs it with --ignored"]
fn snapshots_taken_right_after_a_feed_restart_are_exact() {
    let _serial = serial();
    let restarts = feed_restarts();
    assert_eq!(restarts.len(), 11, "DEEP10's README counts 11 restarts: {restarts:?}");
    // The restart nearest the middle of the day: joiners start as the early subscriber passes it.
    let restart = restarts[restarts.len() / 2];
    let as_of = joiners_right_after(restart, |_, _| {});
    for n in as_of {
        assert!(n >= restart, "as of frame {n}, after the restart at frame {restart}");
    }
}
