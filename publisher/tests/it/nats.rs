//! The NATS output against real `nats-server` processes: every frame of DEEP10 stored in the
//! JetStream stream once (counted by natscli, against the reference's segment count), across a
//! server restart mid-stream; a stream that is missing or does not fit, and refused
//! credentials, as configuration errors (exit 2) naming the setting; credentials that are
//! taken (an nkey, a `.creds` file of a server in operator mode) carry the whole session.

use crate::common::beside_others_in_tempdir;
use mdrelay_harness::cli_args::{NO_INTERVAL_REPORTS, words};
use std::path::Path;
use std::time::{Duration, Instant};

use mdrelay_harness::{NatsServer, Process, expected, iex_data, nats_tool, publisher_bin, subscriber_bin};

/// Runs natscli against `server` with `args` (bounded to 30 s); its stdout, or a panic.
fn nats(server: &str, args: &[&str]) -> String {
    mdrelay_harness::nats_cli(server, args).unwrap_or_else(|failure| panic!("{failure}"))
}

/// The stream's state (`messages`, `first_seq`, ...) from `nats stream info --json`.
fn stream_state(server: &str, stream: &str) -> serde_json::Value {
    mdrelay_harness::nats_stream_state(server, stream).unwrap_or_else(|failure| panic!("{failure}"))
}

/// A publisher configuration: DEEP10 in SBE to `[nats]` with `nats` (its keys), at `rate`
/// messages per second (0: top speed), one frame per message.
fn config(dir: &Path, rate: u32, nats: &str) -> std::path::PathBuf {
    let pacing = if rate == 0 { "mode = \"top-speed\"".to_string() } else { format!("mode = \"rate\"\nrate = {rate}") };
    let text = format!(
        "format = \"sbe\"\n[source]\ncapture = \"{}\"\n[pacing]\n{pacing}\n[nats]\n{nats}\n",
        iex_data().join("DEEP10.pcap.gz").display()
    );
    let path = dir.join("pub.toml");
    std::fs::write(&path, text).unwrap();
    path
}

fn run_publisher(config: &Path, json: &Path) -> Process {
    Process::start(publisher_bin(), ["run", "--config", config.to_str().unwrap(), "--json", json.to_str().unwrap()])
}

#[test]
fn every_frame_is_stored_once_in_the_stream() {
    let (_shared, dir) = beside_others_in_tempdir();
    let server = NatsServer::start();
    let settings = format!("servers = [\"{}\"]\nsubject = \"md.deep\"\nstream = \"DEEP\"", server.url());
    let json = dir.path().join("summary.json");
    let finished = run_publisher(&config(dir.path(), 0, &settings), &json).finish(Duration::from_secs(120));
    finished.assert_success();
    let segments = expected("DEEP10.json")["segments"].as_u64().unwrap();
    let state = stream_state(&server.url(), "DEEP");
    // One message per frame (no coalescing), and the END.
    assert_eq!(state["messages"].as_u64(), Some(segments + 1), "stream state: {state}");
    let summary = mdrelay_harness::json_file(&json);
    assert_eq!(summary["nats"]["published"].as_u64(), Some(segments + 1), "summary: {summary}");
    assert_eq!(summary["nats"]["acknowledged"].as_u64(), Some(segments + 1), "summary: {summary}");
    assert_eq!(summary["nats"]["dropped"].as_u64(), Some(0));
    assert!(finished.stdout.contains("NATS:"), "the printed summary has a NATS line:\n{}", finished.stdout);
}

#[test]
#[ignore = "long (over 3 s here): .ci/run runs it with --ignored"]
fn a_server_restart_mid_stream_loses_nothing_and_duplicates_nothing() {
    let _shared = mdrelay_harness::shared();
    let mut server = NatsServer::start();
    let dir = tempfile::tempdir().unwrap();
    let metrics_port = mdrelay_harness::free_tcp_port();
    let settings = format!(
        "servers = [\"{}\"]\nsubject = \"md.deep\"\nstream = \"DEEP\"\n[metrics]\nlisten = \
         \"127.0.0.1:{metrics_port}\"\nhold = 60",
        server.url()
    );
    let json = dir.path().join("summary.json");
    let mut publisher = run_publisher(&config(dir.path(), 100_000, &settings), &json);
    publisher.wait_for("publishing to NATS");
    // A quarter of the way in (about a second at this rate), the server dies and comes back.
    let url = server.url();
    let deadline = Instant::now() + Duration::from_secs(30);
    while stream_state(&url, "DEEP")["messages"].as_u64().unwrap_or(0) < 30_000 {
        assert!(Instant::now() < deadline, "the stream did not fill");
        std::thread::sleep(Duration::from_millis(50));
    }
    server.kill();
    std::thread::sleep(Duration::from_millis(500));
    server.restart();
    publisher.wait_for_within("metrics endpoint stays up", Duration::from_secs(180));
    let scraped = mdrelay_harness::scrape(([127, 0, 0, 1], metrics_port).into()).unwrap();
    publisher.signal(mdrelay_harness::Signal::SIGTERM);
    let finished = publisher.finish(Duration::from_secs(30));
    finished.assert_success();
    let segments = expected("DEEP10.json")["segments"].as_u64().unwrap();
    assert_eq!(
        scraped.get("mdrelay_pub_nats_messages_total", "outcome=\"published\""),
        Some((segments + 1) as f64),
        "the scrape counts every message published once"
    );
    assert!(scraped.get("mdrelay_pub_nats_reconnects_total", "").unwrap_or(0.0) >= 1.0, "the reconnect is scraped");
    assert_eq!(scraped.get("mdrelay_pub_nats_acks_pending", ""), Some(0.0), "nothing is left unacknowledged");
    let state = stream_state(&server.url(), "DEEP");
    assert_eq!(state["messages"].as_u64(), Some(segments + 1), "every frame stored once: {state}");
    let summary = mdrelay_harness::json_file(&json);
    assert!(summary["nats"]["reconnects"].as_u64().unwrap() >= 1, "the reconnect is counted: {summary}");
}

#[test]
fn a_missing_stream_without_creation_is_a_configuration_error() {
    let (_shared, dir) = beside_others_in_tempdir();
    let server = NatsServer::start();
    let settings = format!("servers = [\"{}\"]\nstream = \"ABSENT\"\ncreate_stream = false", server.url());
    let finished =
        run_publisher(&config(dir.path(), 0, &settings), &dir.path().join("s.json")).finish(Duration::from_secs(60));
    assert_eq!(finished.code(), Some(2), "stderr: {}", finished.stderr);
    assert!(finished.stderr.contains("nats.stream") && finished.stderr.contains("ABSENT"), "{}", finished.stderr);
}

#[test]
fn a_stream_with_other_settings_is_refused_by_setting() {
    let _shared = mdrelay_harness::shared();
    let server = NatsServer::start();
    nats(&server.url(), &["stream", "add", "MEM", "--subjects", "md.>", "--storage", "memory", "--defaults"]);
    let dir = tempfile::tempdir().unwrap();
    let settings = format!("servers = [\"{}\"]\nsubject = \"md.x\"\nstream = \"MEM\"", server.url());
    let finished =
        run_publisher(&config(dir.path(), 0, &settings), &dir.path().join("s.json")).finish(Duration::from_secs(60));
    assert_eq!(finished.code(), Some(2), "stderr: {}", finished.stderr);
    assert!(finished.stderr.contains("nats.storage"), "{}", finished.stderr);
    assert_eq!(stream_state(&server.url(), "MEM")["messages"].as_u64(), Some(0), "nothing was published");
}

#[test]
fn refused_credentials_name_the_setting() {
    let _shared = mdrelay_harness::shared();
    let server = NatsServer::start_with(&["--user", "feed", "--pass", "right"]);
    let dir = tempfile::tempdir().unwrap();
    let password = dir.path().join("password");
    std::fs::write(&password, "wrong\n").unwrap();
    let settings =
        format!("servers = [\"{}\"]\nuser = \"feed\"\npassword_file = \"{}\"", server.url(), password.display());
    let finished =
        run_publisher(&config(dir.path(), 0, &settings), &dir.path().join("s.json")).finish(Duration::from_secs(60));
    assert_eq!(finished.code(), Some(2), "stderr: {}", finished.stderr);
    assert!(
        finished.stderr.contains("nats.password_file") && finished.stderr.contains("refused the credentials"),
        "{}",
        finished.stderr
    );
}

/// A server whose only user is the nkey `user` (its public key), with JetStream.
fn nkey_server(dir: &Path, user: &str) -> NatsServer {
    let config = dir.join("server.conf");
    std::fs::write(&config, format!("authorization {{\n  users = [ {{ nkey: \"{user}\" }} ]\n}}\n")).unwrap();
    NatsServer::start_with(&["-c", config.to_str().unwrap()])
}

#[test]
fn an_nkey_the_server_does_not_know_is_refused_naming_the_setting_and_its_own_is_taken() {
    let (_shared, dir) = beside_others_in_tempdir();
    let known = nkeys::KeyPair::new_user();
    let server = nkey_server(dir.path(), &known.public_key());
    let seed_file = dir.path().join("user.nk");
    let settings = |seed: &Path| {
        format!(
            "servers = [\"{}\"]\nsubject = \"md.nk\"\nstream = \"NK\"\nnkey_file = \"{}\"",
            server.url(),
            seed.display()
        )
    };

    std::fs::write(&seed_file, nkeys::KeyPair::new_user().seed().unwrap() + "\n").unwrap();
    let finished = run_publisher(&config(dir.path(), 0, &settings(&seed_file)), &dir.path().join("s.json"))
        .finish(Duration::from_secs(60));
    assert_eq!(finished.code(), Some(2), "another user's seed: {}", finished.stderr);
    assert!(finished.stderr.contains("nats.nkey_file"), "{}", finished.stderr);

    std::fs::write(&seed_file, "SUAnotaseed\n").unwrap();
    let finished = run_publisher(&config(dir.path(), 0, &settings(&seed_file)), &dir.path().join("s.json"))
        .finish(Duration::from_secs(60));
    assert_eq!(finished.code(), Some(2), "a malformed seed: {}", finished.stderr);
    assert!(finished.stderr.contains("nats.nkey_file"), "{}", finished.stderr);

    // The known user's seed: the whole stream is stored.
    std::fs::write(&seed_file, known.seed().unwrap() + "\n").unwrap();
    let json = dir.path().join("ok.json");
    run_publisher(&config(dir.path(), 0, &settings(&seed_file)), &json)
        .finish(Duration::from_secs(120))
        .assert_success();
    let segments = expected("DEEP10.json")["segments"].as_u64().unwrap();
    let summary = mdrelay_harness::json_file(&json);
    assert_eq!(summary["nats"]["acknowledged"].as_u64(), Some(segments + 1), "summary: {summary}");
}

/// A server in operator mode and two `.creds` files, made by `nats-creds` (harness/nats-creds,
/// built by `.ci/nats.sh` with the NATS project's JWT library): `user.creds`, a user of an
/// account the server knows (with JetStream), and `stranger.creds`, one of an account it does
/// not.
#[test]
fn a_creds_file_of_a_known_account_is_taken_and_a_strangers_is_refused_naming_the_setting() {
    let (_shared, dir) = beside_others_in_tempdir();
    let made = std::process::Command::new(nats_tool("nats-creds")).arg(dir.path()).output().unwrap();
    assert!(made.status.success(), "nats-creds: {}", String::from_utf8_lossy(&made.stderr));
    let server = NatsServer::start_with(&["-c", dir.path().join("server.conf").to_str().unwrap()]);
    let settings = |creds: &str| {
        format!(
            "servers = [\"{}\"]\nsubject = \"md.creds\"\nstream = \"CREDS\"\ncreds_file = \"{}\"",
            server.url(),
            dir.path().join(creds).display()
        )
    };
    let refused = run_publisher(&config(dir.path(), 0, &settings("stranger.creds")), &dir.path().join("s.json"))
        .finish(Duration::from_secs(60));
    assert_eq!(refused.code(), Some(2), "another account's user: {}", refused.stderr);
    assert!(refused.stderr.contains("nats.creds_file"), "{}", refused.stderr);
    // The known user publishes the whole session; a subscriber with the same file replays it.
    run_publisher(&config(dir.path(), 0, &settings("user.creds")), &dir.path().join("ok.json"))
        .finish(Duration::from_secs(120))
        .assert_success();
    let json = dir.path().join("sub.json");
    let creds = dir.path().join("user.creds");
    let replayed = Process::start(
        subscriber_bin(),
        words(&format!(
            "--nats {} --nats-subject md.creds --nats-stream CREDS --from-start --nats-creds-file {} \
            {NO_INTERVAL_REPORTS} --json {}",
            server.url(),
            creds.display(),
            json.display()
        )),
    )
    .finish(Duration::from_secs(120));
    replayed.assert_success();
    let report = mdrelay_harness::json_file(&json);
    let reference = expected("DEEP10.json");
    mdrelay_harness::assert_aggregates(&report, &reference, "replayed with user.creds");
    assert_eq!(report["messages"], reference["messages"], "{report}");
    assert_eq!(report["totals_match"], true, "{report}");
}

/// The file itself: missing, or not a credentials file, refused before any connection, naming
/// the setting.
#[test]
fn a_creds_file_that_is_missing_or_malformed_is_refused_naming_the_setting() {
    let (_shared, dir) = beside_others_in_tempdir();
    let server = NatsServer::start();
    let malformed = dir.path().join("bad.creds");
    std::fs::write(&malformed, "this is not a credentials file\n").unwrap();
    for (name, creds) in [("missing", dir.path().join("absent.creds")), ("malformed", malformed)] {
        let settings = format!("servers = [\"{}\"]\ncreds_file = \"{}\"", server.url(), creds.display());
        let finished = run_publisher(&config(dir.path(), 0, &settings), &dir.path().join("s.json"))
            .finish(Duration::from_secs(60));
        assert_eq!(finished.code(), Some(2), "{name}: {}", finished.stderr);
        assert!(
            finished.stderr.contains("nats.creds_file") && finished.stderr.contains(&creds.display().to_string()),
            "{name}: {}",
            finished.stderr
        );
    }
}
