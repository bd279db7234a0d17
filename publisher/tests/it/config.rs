//! The example configurations parse and pass their checks; bad settings fail naming the setting.

use crate::common::run_with_config;
use mdrelay_harness::{Process, STEP, publisher_bin};

fn root() -> std::path::PathBuf {
    std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

#[test]
fn every_publisher_example_checks() {
    let mut seen = 0;
    for entry in std::fs::read_dir(root().join("config")).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        if name.starts_with("sub-") || !name.ends_with(".toml") {
            continue;
        }
        let file = mdrelay_publisher::config::read_file(&path).unwrap_or_else(|e| panic!("{name}: {e:#}"));
        file.check().unwrap_or_else(|e| panic!("{name}: {e:#}"));
        seen += 1;
    }
    assert!(seen >= 3, "the loopback TCP, loopback multicast and two-host examples");
}

fn failure(toml: &str, extra: &[&str]) -> String {
    let output = run_with_config(toml, extra);
    // A configuration error's exit (not a crash), before anything is served.
    assert_eq!(output.code(), Some(2), "{toml} should fail: {output:?}");
    assert!(!output.stderr.contains("serving subscribers"), "{output:?}");
    output.stderr
}

#[test]
fn bad_settings_fail_at_start_naming_the_setting() {
    let e = failure("format = \"sbe\"\nfromat = 1\n[tcp]\n", &[]);
    assert!(e.contains("fromat") && e.contains("line 2") && e.contains("pub.toml"), "{e}");
    let e = failure("format = \"avro\"\n[tcp]\n", &[]);
    assert!(e.contains("unknown format") && e.contains("avro") && e.contains("brec"), "{e}");
    let e = failure("[tcp]\nlisten = \"localhost\"\n", &[]);
    assert!(e.contains("tcp.listen"), "{e}");
    let e = failure("[udp]\ndestinations = [\"127.0.0.1:9000\", \"239.255.0.1:9000\"]\n", &[]);
    assert!(e.contains("udp.destinations[1]") && e.contains("multicast"), "{e}");
    let e = failure("[multicast]\ngroup = \"127.0.0.1:9000\"\n", &[]);
    assert!(e.contains("multicast.group") && e.contains("not a multicast"), "{e}");
    let e = failure("format = \"raw\"\n", &[]);
    assert!(e.contains("no transport"), "{e}");
    let e = failure("[tcp]\n", &["--format", "xml"]);
    assert!(e.contains("xml"), "{e}");
    // The ring, the retransmission service and line B: absurd values are refused by name.
    for (toml, names) in [
        ("[tcp]\n[retransmit]\nring_bytes = 1_000_000_000_000_000\n", &["retransmit.ring_bytes", "out of range"][..]),
        ("[tcp]\n[retransmit]\nlisten = \"127.0.0.1:9101\"\nmax_range = 0\n", &["retransmit.max_range"]),
        (
            "[tcp]\n[retransmit]\nlisten = \"127.0.0.1:9101\"\nrequests_per_second = 0\n",
            &["retransmit.requests_per_second"],
        ),
        ("[tcp]\n[retransmit]\nlisten = \"127.0.0.1:9101\"\nlinger = -1\n", &["retransmit.linger"]),
        ("[tcp]\n[retransmit]\nlisten = \"here\"\n", &["retransmit.listen"]),
        (
            "[tcp]\n[retransmit]\nlisten = \"127.0.0.1:9101\"\nring_bytes = 0\n",
            &["retransmit.listen", "ring_bytes above 0"],
        ),
        (
            "[tcp]\nlisten = \"127.0.0.1:9100\"\n[retransmit]\nlisten = \"127.0.0.1:9100\"\n",
            &["retransmit.listen", "own port"],
        ),
        ("[tcp]\n[cpu]\nio_threads = 0\n", &["cpu.io_threads", "out of range"]),
        // Read with its section's other keys, the bad one is named, not a neighbour tried alone.
        (
            "[tcp]\n[source.live]\ngroup = \"239.255.21.4\"\nlisten = \"junk\"\n",
            &["source.live.listen (", "pub.toml, line 4)", "not an address:port"],
        ),
        ("[tcp]\nhandshake_timeout = \"1h\"\n", &["tcp.handshake_timeout", "out of range", "0.01 to 300 seconds"]),
        ("[tcp]\n[pacing]\nduty_cycle = \"nan\"\n", &["pacing.duty_cycle", "out of range"]),
        ("[nats]\nmax_age = -1\n", &["nats.max_age", "out of range"]),
        ("[tcp]\n[cpu]\nio_threads = 100000\n", &["cpu.io_threads", "out of range"]),
        ("[multicast_b]\ngroup = \"239.255.1.1:9300\"\n", &["multicast_b", "line A"]),
        (
            "[multicast]\ngroup = \"239.255.1.1:9300\"\n[multicast_b]\ngroup = \"239.255.1.1:9300\"\n",
            &["multicast_b.group", "line A's group"],
        ),
        (
            "[multicast]\ngroup = \"239.255.1.1:9300\"\n[multicast_b]\ngroup = \"10.0.0.1:9300\"\n",
            &["multicast_b.group", "not a multicast"],
        ),
    ] {
        let e = failure(toml, &[]);
        assert!(names.iter().all(|n| e.contains(n)), "{toml}: {e}");
    }
}

#[test]
fn absurd_counts_are_refused_naming_the_setting_and_its_range() {
    let max = u64::MAX.to_string();
    for (toml, flags, names) in [
        ("[tcp]\n[pacing]\nloops = 18446744073709551615\n", &[][..], &["pacing.loops", "out of range"][..]),
        ("[tcp]\n", &["--loops", max.as_str()], &["pacing.loops", "(--loops)", "out of range"]),
        // Within TOML's integers, the setting's own range is named.
        ("[tcp]\n[pacing]\nloops = 2000000000\n", &[], &["pacing.loops", "out of range", "1000000000"]),
        ("[tcp]\n", &["--max-messages", "2000000000000"], &["pacing.max_messages", "1000000000000"]),
        ("[tcp]\n", &["--synthetic-messages", "20000000000"], &["source.synthetic.messages", "10000000000"]),
        ("[tcp]\n[pacing]\nmax_messages = 18446744073709551615\n", &[], &["pacing.max_messages", "out of range"]),
        ("[tcp]\n", &["--max-messages", max.as_str()], &["pacing.max_messages", "out of range"]),
        (
            "[tcp]\n[source.synthetic]\nmessages = 18446744073709551615\n",
            &[],
            &["source.synthetic.messages", "out of range"],
        ),
        ("[tcp]\n", &["--messages", max.as_str()], &["source.synthetic.messages", "out of range"]),
    ] {
        let e = failure(toml, flags);
        assert!(names.iter().all(|n| e.contains(n)), "{toml} {flags:?}: {e}");
    }
}

#[test]
fn bad_nats_settings_fail_at_start_naming_the_setting() {
    let e = failure("[nats]\nsubject = \"md.>\"\n", &[]);
    assert!(e.contains("nats.subject") && e.contains("wildcards"), "{e}");
    let e = failure("[nats]\nstream = \"a.b\"\n", &[]);
    assert!(e.contains("nats.stream"), "{e}");
    let e = failure("[nats]\nmax_pending_acks = 0\n", &[]);
    assert!(e.contains("nats.max_pending_acks"), "{e}");
    let e = failure("[nats]\nreplicas = 9\n", &[]);
    assert!(e.contains("nats.replicas"), "{e}");
    let e = failure("[nats]\nuser = \"feed\"\n", &[]);
    assert!(e.contains("nats.user") && e.contains("password"), "{e}");
    let e = failure("[nats]\ncreds_file = \"a.creds\"\nnkey_file = \"b.nk\"\n", &[]);
    assert!(e.contains("nats.creds_file") && e.contains("one kind of credentials"), "{e}");
    let e = failure("[nats]\nservers = []\n", &[]);
    assert!(e.contains("nats.servers"), "{e}");
    let e = failure("[nats]\nslow_server = \"later\"\n", &[]);
    assert!(e.contains("slow_server") || e.contains("later"), "{e}");
}

/// `mdrelay-pub run --check` with the configuration `toml`, `flags` and `env`, to its exit.
fn check(toml: &str, flags: &[&str], env: &[(&str, &str)]) -> (mdrelay_harness::Finished, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("pub.toml");
    std::fs::write(&path, toml).unwrap();
    let name = path.to_str().unwrap().to_string();
    let mut args = vec!["run", "--check", "--config", name.as_str()];
    args.extend_from_slice(flags);
    (Process::spawn(publisher_bin(), &args, env).unwrap().finish(STEP), name)
}

/// A configuration's values, without the origins `--check` writes beside them.
fn values(text: &str) -> toml::Table {
    toml::from_str(text).unwrap_or_else(|e| panic!("{e}: {text}"))
}

#[test]
fn check_prints_every_setting_with_where_it_came_from() {
    let file = "format = \"capnp\"\n[tcp]\nlisten = \"127.0.0.1:0\"\ndrain_timeout = \"250ms\"\n\
                [retransmit]\nring_bytes = \"1MiB\"\n";
    let (done, path) = check(file, &["--pacing", "rate", "--rate", "5000"], &[("MDRELAY_PUB_LOOPS", "3")]);
    done.assert_success();
    let out = &done.stdout;
    for line in [
        format!("format = \"capnp\"  # {path}, line 1"),
        format!("drain_timeout = 0.25  # {path}, line 4"),
        format!("ring_bytes = 1048576  # {path}, line 6"),
        "rate = 5000.0  # --rate".to_string(),
        "mode = \"rate\"  # --pacing".to_string(),
        "loops = 3  # MDRELAY_PUB_LOOPS".to_string(),
        "stream = 1  # default".to_string(),
        "queue = 65536  # default".to_string(),
    ] {
        assert!(out.lines().any(|l| l == line), "{line:?} in:\n{out}");
    }
    // No endpoint: no `[metrics]` heading with nothing under it.
    assert!(!out.contains("[metrics]"), "{out}");
    // The text printed is a configuration file giving the same settings.
    let (again, _) = check(out, &[], &[]);
    again.assert_success();
    assert_eq!(values(&again.stdout), values(out));
}

#[test]
fn natscli_variables_give_the_nats_servers_and_credentials_nothing_else_gives() {
    let dir = tempfile::tempdir().unwrap();
    let creds = dir.path().join("feed.creds");
    std::fs::write(&creds, "").unwrap();
    let creds = creds.to_str().unwrap();
    let env = [("NATS_URL", "nats://198.18.0.9:4222,nats://198.18.0.10:4222"), ("NATS_CREDS", creds)];
    let (done, _) = check("[nats]\nsubject = \"md.env\"\n", &[], &env);
    done.assert_success();
    let out = &done.stdout;
    let servers = "servers = [\"nats://198.18.0.9:4222\", \"nats://198.18.0.10:4222\"]  # NATS_URL";
    assert!(out.lines().any(|l| l == servers), "{servers:?} in:\n{out}");
    let creds_line = format!("creds_file = \"{creds}\"  # NATS_CREDS");
    assert!(out.lines().any(|l| l == creds_line), "{creds_line:?} in:\n{out}");
    // The file's own servers win.
    let (done, path) = check("[nats]\nservers = [\"nats://127.0.0.1:4333\"]\n", &[], &env);
    done.assert_success();
    let own = format!("servers = [\"nats://127.0.0.1:4333\"]  # {path}, line 2");
    assert!(done.stdout.lines().any(|l| l == own), "{own:?} in:\n{}", done.stdout);
}

#[test]
fn a_bad_value_is_named_with_where_it_came_from() {
    let tcp = "[tcp]\nlisten = \"127.0.0.1:0\"\n";
    let (done, path) = check(&format!("{tcp}queue = 3\n"), &[], &[]);
    assert_eq!(done.code(), Some(2), "{done:?}");
    assert!(done.stderr.contains(&format!("tcp.queue ({path}, line 3): 3 is out of range")), "{}", done.stderr);
    let (done, _) = check(tcp, &["--pacing", "rate", "--rate", "0"], &[]);
    assert_eq!(done.code(), Some(2), "{done:?}");
    assert!(done.stderr.contains("pacing.rate (--rate): 0 is out of range"), "{}", done.stderr);
    let (done, _) = check(tcp, &["--pacing", "rate"], &[("MDRELAY_PUB_RATE", "0")]);
    assert_eq!(done.code(), Some(2), "{done:?}");
    assert!(done.stderr.contains("pacing.rate (MDRELAY_PUB_RATE): 0 is out of range"), "{}", done.stderr);
    // Units: a duration and a size that do not read are refused, naming the flag.
    let (done, _) = check(tcp, &["--drain-timeout", "a while"], &[]);
    assert_eq!(done.code(), Some(2), "{done:?}");
    assert!(done.stderr.contains("--drain-timeout") && done.stderr.contains("is not a duration"), "{}", done.stderr);
    let (done, path) = check(&format!("{tcp}[retransmit]\nring_bytes = \"lots\"\n"), &[], &[]);
    assert_eq!(done.code(), Some(2), "{done:?}");
    assert!(done.stderr.contains(&path) && done.stderr.contains("is not a size"), "{}", done.stderr);
}

#[test]
fn flags_renamed_for_one_family_keep_their_earlier_names() {
    let tcp = "[tcp]\nlisten = \"127.0.0.1:0\"\n";
    let (earlier, _) = check(tcp, &["--symbols", "20", "--messages", "200000", "--seed", "9"], &[]);
    let (today, _) =
        check(tcp, &["--synthetic-symbols", "20", "--synthetic-messages", "200000", "--synthetic-seed", "9"], &[]);
    earlier.assert_success();
    assert_eq!(values(&earlier.stdout), values(&today.stdout));
    assert!(today.stdout.contains("symbols = 20  # --synthetic-symbols"), "{}", today.stdout);
}

#[test]
fn flags_set_their_settings_by_one_rule_and_a_flag_with_nothing_to_apply_to_is_refused() {
    let tcp = "[tcp]\nlisten = \"127.0.0.1:0\"\n";
    // A flag of an output or source that is not there is named, not ignored.
    for (flags, env, named) in [
        (&["--ttl", "3"][..], &[][..], "multicast.ttl (--ttl): given, but there is no multicast"),
        (
            &["--upstream-crc", "true"],
            &[],
            "source.upstream.crc (--upstream-crc): given, but there is no source.upstream",
        ),
        (&[], &[("MDRELAY_PUB_LIVE_GROUP", "239.255.0.9")], "source.live.group (MDRELAY_PUB_LIVE_GROUP): given"),
        (&["--interface-b", "127.0.0.1"], &[], "multicast_b.interface (--interface-b): given"),
        (&["--max-datagram", "1200"], &[], "udp.max_datagram (--max-datagram): given, but there is no UDP output"),
        (
            &["--capture", "x.pcap", "--synthetic-seed", "7"],
            &[],
            "given with a flag of source.capture; give one source",
        ),
    ] {
        let (done, _) = check(tcp, flags, env);
        assert_eq!(done.code(), Some(2), "{flags:?} {env:?}: {done:?}");
        assert!(done.stderr.contains(named), "{flags:?} {env:?}: {}", done.stderr);
    }
    // A flag of another kind of source replaces the file's; one of the same kind keeps the file's
    // other settings of that kind.
    let live = format!("{tcp}[source.live]\nlisten = \"127.0.0.1:9\"\ngroup = \"239.255.0.9\"\n");
    let (done, path) = check(&live, &["--live", "127.0.0.1:10"], &[]);
    done.assert_success();
    assert!(done.stdout.contains("listen = \"127.0.0.1:10\"  # --live"), "{}", done.stdout);
    assert!(done.stdout.contains(&format!("group = \"239.255.0.9\"  # {path}, line 5")), "{}", done.stdout);
    let (done, _) = check(&live, &["--synthetic-seed", "7"], &[]);
    done.assert_success();
    let resolved = values(&done.stdout);
    assert_eq!(resolved["source"].as_table().unwrap().keys().collect::<Vec<_>>(), ["synthetic"], "{}", done.stdout);
    assert_eq!(resolved["source"]["synthetic"]["seed"].as_integer(), Some(7));
    // --max-datagram is every UDP output's (the file's [multicast] had its own); line B's TTL is
    // line A's unless set.
    let lines = format!(
        "{tcp}[udp]\ndestinations = [\"127.0.0.1:9400\"]\n[multicast]\ngroup = \"239.255.1.1:9300\"\nmax_datagram = 900\n\
         [multicast_b]\ngroup = \"239.255.1.2:9300\"\n"
    );
    let (done, _) = check(&lines, &["--max-datagram", "1200", "--ttl", "4"], &[]);
    done.assert_success();
    let resolved = values(&done.stdout);
    for output in ["udp", "multicast"] {
        assert_eq!(resolved[output]["max_datagram"].as_integer(), Some(1200), "{output}: {}", done.stdout);
    }
    assert_eq!(resolved["multicast_b"]["ttl"].as_integer(), Some(4), "{}", done.stdout);
    assert!(done.stdout.contains("ttl = 4  # line A's, --ttl"), "{}", done.stdout);
}

/// Every setting of `run`, from its key in the file, its environment variable and its flag,
/// gives the same value, and `--check` names where each came from. The flags are those the
/// program lists in its settings reference (as docs/operations.md shows them): a flag added
/// without a sample here fails the test.
#[test]
fn every_setting_is_the_same_from_the_file_its_variable_and_its_flag() {
    let capture = root().join("../shared/data/iex/DEEP10.pcap.gz");
    let capture = capture.to_str().unwrap();
    const TCP: &[&str] = &["--tcp", "127.0.0.1:0"];
    const LIVE: &[&str] = &["--tcp", "127.0.0.1:0", "--live", "127.0.0.1:9"];
    const UPSTREAM: &[&str] = &["--tcp", "127.0.0.1:0", "--upstream", "127.0.0.1:9"];
    const MULTICAST: &[&str] = &["--multicast", "239.255.0.1:9300"];
    const LINE_B: &[&str] = &["--multicast", "239.255.0.1:9300", "--multicast-b", "239.255.0.2:9300"];
    const RETRANSMIT: &[&str] = &["--tcp", "127.0.0.1:0", "--retransmit-listen", "127.0.0.1:0"];
    // flag: (its setting, the value as a flag or variable writes it, as the file does, the
    // flags it goes with)
    let samples: &[(&str, &str, &str, &str, &[&str])] = &[
        ("format", "format", "json", "\"json\"", TCP),
        ("stream", "stream", "7", "7", TCP),
        ("profile", "profile", "low-latency", "\"low-latency\"", TCP),
        ("idle", "pacing.idle", "backoff", "\"backoff\"", TCP),
        ("hot-core", "cpu.hot_core", "0", "0", TCP),
        ("io-threads", "cpu.io_threads", "2", "2", TCP),
        ("capture", "source.capture", capture, "CAPTURE", TCP),
        ("synthetic-messages", "source.synthetic.messages", "5000", "5000", TCP),
        ("synthetic-symbols", "source.synthetic.symbols", "20", "20", TCP),
        ("synthetic-seed", "source.synthetic.seed", "7", "7", TCP),
        ("live", "source.live.listen", "127.0.0.1:9", "\"127.0.0.1:9\"", TCP),
        ("live-group", "source.live.group", "239.255.0.9", "\"239.255.0.9\"", LIVE),
        ("live-interface", "source.live.interface", "127.0.0.1", "\"127.0.0.1\"", LIVE),
        ("idle-timeout", "source.live.idle_timeout", "5s", "5", LIVE),
        ("upstream", "source.upstream.connect", "127.0.0.1:9", "\"127.0.0.1:9\"", TCP),
        ("upstream-connect-timeout", "source.upstream.connect_timeout", "3", "3", UPSTREAM),
        ("upstream-handshake-timeout", "source.upstream.handshake_timeout", "3", "3", UPSTREAM),
        ("upstream-reconnect-max", "source.upstream.reconnect_max", "2s", "2", UPSTREAM),
        ("upstream-give-up-after", "source.upstream.give_up_after", "60", "60", UPSTREAM),
        ("upstream-idle-timeout", "source.upstream.idle_timeout", "20", "20", UPSTREAM),
        ("upstream-crc", "source.upstream.crc", "true", "true", UPSTREAM),
        ("pacing", "pacing.mode", "rate", "\"rate\"", TCP),
        ("speed", "pacing.speed", "10", "10.0", &["--tcp", "127.0.0.1:0", "--pacing", "original"]),
        ("rate", "pacing.rate", "5000", "5000.0", &["--tcp", "127.0.0.1:0", "--pacing", "rate"]),
        ("loops", "pacing.loops", "3", "3", TCP),
        ("max-messages", "pacing.max_messages", "500", "500", TCP),
        ("duration", "pacing.duration", "10m", "600", TCP),
        ("coalesce-bytes", "batching.coalesce_bytes", "1400", "1400", TCP),
        ("wide-datagrams", "batching.wide_datagrams", "false", "false", TCP),
        ("max-datagram", "udp.max_datagram", "1200", "1200", &["--udp", "127.0.0.1:9300"]),
        ("tcp", "tcp.listen", "127.0.0.1:9200", "\"127.0.0.1:9200\"", &[]),
        ("queue", "tcp.queue", "4096", "4096", TCP),
        ("queue-bytes", "tcp.queue_bytes", "4MiB", "4194304", TCP),
        ("slow-subscriber", "tcp.slow_subscriber", "disconnect", "\"disconnect\"", TCP),
        ("wait-subscribers", "tcp.wait_subscribers", "2", "2", TCP),
        ("max-connections", "tcp.max_connections", "8", "8", TCP),
        ("handshake-timeout", "tcp.handshake_timeout", "3", "3", TCP),
        ("replay-bytes", "tcp.replay_bytes", "1MiB", "1048576", TCP),
        ("replay-timeout", "tcp.replay_timeout", "4", "4", TCP),
        ("drain-timeout", "tcp.drain_timeout", "250ms", "0.25", TCP),
        ("snapshots", "tcp.snapshots", "false", "false", TCP),
        ("hot-writes", "tcp.hot_writes", "false", "false", TCP),
        ("max-gap", "pacing.max_gap", "2", "2", TCP),
        ("duty-cycle", "pacing.duty_cycle", "1ms", "0.001", TCP),
        ("udp", "udp.destinations", "127.0.0.1:9300", "[\"127.0.0.1:9300\"]", &[]),
        ("multicast", "multicast.group", "239.255.0.1:9300", "\"239.255.0.1:9300\"", &[]),
        ("interface", "multicast.interface", "127.0.0.1", "\"127.0.0.1\"", MULTICAST),
        ("ttl", "multicast.ttl", "3", "3", MULTICAST),
        ("multicast-loop", "multicast.loopback", "false", "false", MULTICAST),
        ("multicast-b", "multicast_b.group", "239.255.0.2:9300", "\"239.255.0.2:9300\"", MULTICAST),
        ("interface-b", "multicast_b.interface", "127.0.0.1", "\"127.0.0.1\"", LINE_B),
        ("ttl-b", "multicast_b.ttl", "4", "4", LINE_B),
        ("multicast-loop-b", "multicast_b.loopback", "false", "false", LINE_B),
        ("ring-bytes", "retransmit.ring_bytes", "1MiB", "1048576", TCP),
        ("retransmit-listen", "retransmit.listen", "127.0.0.1:9101", "\"127.0.0.1:9101\"", TCP),
        ("retransmit-max-range", "retransmit.max_range", "1000", "1000", RETRANSMIT),
        ("retransmit-rate", "retransmit.requests_per_second", "50", "50", RETRANSMIT),
        ("retransmit-max-connections", "retransmit.max_connections", "4", "4", RETRANSMIT),
        ("retransmit-idle-timeout", "retransmit.idle_timeout", "30", "30", RETRANSMIT),
        ("retransmit-linger", "retransmit.linger", "3", "3", RETRANSMIT),
        ("retransmit-snapshots", "retransmit.snapshots", "false", "false", RETRANSMIT),
        ("metrics-listen", "metrics.listen", "127.0.0.1:9901", "\"127.0.0.1:9901\"", TCP),
        ("metrics-hold", "metrics.hold", "30s", "30", &["--tcp", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:9901"]),
    ];
    // Not settings of the file: the file itself, and --synthetic, whose setting is a section.
    let not_compared = ["config", "synthetic"];
    let reference = Process::start(publisher_bin(), ["--generate-settings-reference"]).finish(STEP);
    reference.assert_success();
    let mut flags = Vec::new();
    for line in reference.stdout.lines().filter(|l| l.starts_with("| `--")) {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        let flag = cells[1].trim_matches('`').trim_start_matches("--").split(' ').next().unwrap().to_string();
        let variable = cells[2].trim_matches('`').to_string();
        if variable.starts_with("MDRELAY_PUB_") && !not_compared.contains(&flag.as_str()) {
            flags.push((flag, variable));
        }
    }
    assert!(flags.len() >= 55, "the reference lists the flags: {}", reference.stdout);
    for (flag, variable) in &flags {
        let (_, key, text, toml, with) =
            samples.iter().find(|s| s.0 == flag).unwrap_or_else(|| panic!("--{flag}: a setting without a sample here"));
        let toml = toml.replace("CAPTURE", &format!("{capture:?}"));
        let (section, leaf) = key.rsplit_once('.').unwrap_or(("", key));
        let file = match section {
            "" => format!("# {key}\n{leaf} = {toml}\n"),
            section => format!("# {key}\n[{section}]\n{leaf} = {toml}\n"),
        };
        let line = if section.is_empty() { 2 } else { 3 };
        let run = |text: &str, flags: Vec<&str>, env: &[(&str, &str)]| {
            let (done, path) = check(text, &flags, env);
            assert!(done.status.success(), "--{flag} {flags:?} {env:?}: {done:?}");
            (done.stdout, path)
        };
        let with = || with.iter().copied();
        let (from_file, path) = run(&file, with().collect(), &[]);
        let (from_variable, _) = run("", with().collect(), &[(variable.as_str(), *text)]);
        let flag_args = format!("--{flag}");
        let (from_flag, _) = run("", with().chain([flag_args.as_str(), *text]).collect(), &[]);
        let value =
            |stdout: &str| key.split('.').try_fold(toml::Value::Table(values(stdout)), |v, p| v.get(p).cloned());
        assert!(value(&from_file).is_some(), "{key}: not in --check's output:\n{from_file}");
        for (stdout, origin) in [
            (&from_file, format!("{path}, line {line}")),
            (&from_variable, variable.clone()),
            (&from_flag, flag_args.clone()),
        ] {
            assert_eq!(value(stdout), value(&from_file), "{key} from {origin}:\n{stdout}");
            let named =
                stdout.lines().any(|l| l.starts_with(&format!("{leaf} = ")) && l.ends_with(&format!("  # {origin}")));
            assert!(named, "{key}: no line naming {origin} in:\n{stdout}");
        }
    }
}
