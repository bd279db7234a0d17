//! `mdrelay-sub`'s configuration as a user meets it: the messages for bad settings (exit code
//! 2), and the example files under config/.

use crate::common::subscriber;
use mdrelay_harness::{Finished, Process, STEP, subscriber_bin};
use mdrelay_subscriber::config::Application;
use mdrelay_telemetry::exit::ExitStatus;
use std::path::PathBuf;

fn config_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../config")
}

fn run_with_file(text: &str, extra: &[&str]) -> (Finished, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sub.toml");
    std::fs::write(&path, text).unwrap();
    let path = path.to_str().unwrap().to_string();
    let mut args = vec!["--config", path.as_str()];
    args.extend_from_slice(extra);
    (subscriber(&args).finish(STEP), path)
}

#[test]
fn an_unknown_key_fails_naming_the_file_the_key_and_the_line() {
    let (done, path) =
        run_with_file("connect = \"127.0.0.1:9100\"\nreport_interval = 1\nreconect_max_seconds = 2\n", &[]);
    assert_eq!(done.code(), Some(2), "{done:?}");
    assert!(done.stderr.contains(&path), "{}", done.stderr);
    assert!(done.stderr.contains("reconect_max_seconds") && done.stderr.contains("line 3"), "{}", done.stderr);
}

#[test]
fn bad_settings_fail_at_start_naming_the_setting() {
    let cases: &[(&str, &[&str], &str)] = &[
        (
            "udp = \"239.255.0.1:9300\"\n",
            &[],
            "udp (PATH, line 1): 239.255.0.1 is a multicast address; join a group with multicast",
        ),
        (
            "listen = \"239.255.0.1:9300\"\n",
            &[],
            "udp (PATH, line 1, under its earlier name listen (now udp)): 239.255.0.1 is a multicast address",
        ),
        ("multicast = \"127.0.0.1:9300\"\n", &[], "multicast (PATH, line 1): 127.0.0.1 is not a multicast address"),
        (
            "multicast = \"239.255.0.1:9300\"\ninterface = \"eth0\"\n",
            &[],
            "interface (PATH, line 2): \"eth0\" is not an IPv4 address",
        ),
        ("tcp = \"127.0.0.1\"\n", &[], "tcp (PATH, line 1): \"127.0.0.1\" is not host:port"),
        ("udp = \"not an address\"\n", &[], "udp (PATH, line 1): \"not an address\" is not an address:port"),
        ("symbols = [\"AAPL\"]\n", &[], "no transport given: give one of tcp, udp, multicast or nats"),
        ("tcp = \"127.0.0.1:9100\"\nmulticast = \"239.255.0.1:9300\"\n", &[], "tcp is given too: give one transport"),
        (
            "tcp = \"127.0.0.1:9100\"\nformat = \"sbe\"\n",
            &[],
            "format (PATH, line 2): the subscriber has no format setting",
        ),
        ("tcp = \"127.0.0.1:9100\"\nlatency = \"both\"\n", &[], "latency (PATH, line 2): unknown variant `both`"),
        ("tcp = \"127.0.0.1:9100\"\necho_every = 0\n", &[], "echo_every (PATH, line 2): must be at least 1"),
        (
            "tcp = \"127.0.0.1:9100\"\n",
            &["--udp", "127.0.0.1:0", "--multicast", "239.255.0.1:1"],
            "multicast (--multicast): udp is given too: give one transport",
        ),
        ("tcp = \"127.0.0.1:9100\"\n", &["--duration", "-1"], "duration (--duration): -1 seconds is out of range"),
        ("tcp = \"127.0.0.1:9100\"\n", &["--format", "sbe"], "the format comes from the publisher"),
        (
            "tcp = \"127.0.0.1:9100\"\n",
            &["--recovery", "127.0.0.1:9400"],
            "recovery (--recovery): a TCP subscriber resumes",
        ),
        (
            "udp = \"127.0.0.1:0\"\nrecovery = \"127.0.0.1:9400\"\n",
            &["--recovery-attempts", "0"],
            "recovery_attempts (--recovery-attempts): 0 is out of range (1 to 1000)",
        ),
        (
            "udp = \"127.0.0.1:0\"\n",
            &["--recovery-linger", "3"],
            "recovery_linger (--recovery-linger): only used with recovery",
        ),
        (
            "udp = \"127.0.0.1:0\"\n",
            &["--line-b", "239.1.1.1:1"],
            "line_b (--line-b): 239.1.1.1 is a multicast address",
        ),
    ];
    // PATH: the file's path. Each setting is named as the publisher names its own: the key, then
    // where it came from.
    for (text, flags, needle) in cases {
        let (done, path) = run_with_file(text, flags);
        let needle = needle.replace("PATH", &path);
        assert_eq!(done.code(), Some(2), "{text:?} {flags:?}: {done:?}");
        assert!(done.stderr.contains(&needle), "{text:?} {flags:?}: expected {needle:?} in:\n{}", done.stderr);
    }
    // A value from the environment is named by its variable, not by the flag it stands for; a
    // flag's suggestion is a flag.
    let env = [("MDRELAY_SUB_RECOVERY_ATTEMPTS", "0")];
    let args = ["--udp", "127.0.0.1:0", "--recovery", "127.0.0.1:9400"];
    let done = Process::spawn(subscriber_bin(), args, &env).unwrap().finish(STEP);
    assert_eq!(done.code(), Some(2), "{done:?}");
    let needle = "recovery_attempts (MDRELAY_SUB_RECOVERY_ATTEMPTS): 0 is out of range (1 to 1000)";
    assert!(done.stderr.contains(needle), "expected {needle:?} in:\n{}", done.stderr);
    let done = subscriber(&["--listen", "239.255.0.1:9300"]).finish(STEP);
    let needle = "udp (--listen, under its earlier name listen (now udp)): 239.255.0.1 is a multicast address; join \
                  a group with multicast";
    assert!(done.stderr.contains(needle), "expected {needle:?} in:\n{}", done.stderr);
}

#[test]
fn the_example_files_are_valid() {
    let mut seen = 0;
    for entry in std::fs::read_dir(config_dir()).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        if !(name.starts_with("sub-") && name.ends_with(".toml")) {
            continue;
        }
        seen += 1;
        let done = subscriber(&["--config", path.to_str().unwrap(), "--check"]).finish(STEP);
        assert!(done.status.success(), "{name}: {done:?}");
        // What --check prints is itself a configuration, giving the same settings.
        let printed = done.stdout.clone();
        assert!(printed.starts_with("# mdrelay-sub: the configuration"), "{name}: {printed}");
        let (again, _) = run_with_file(&printed, &["--check"]);
        assert!(again.status.success(), "{name}: {again:?}");
        assert_eq!(values(&again.stdout), values(&printed), "{name}");
    }
    assert!(seen >= 3, "the example subscriber configurations are missing");
}

#[test]
fn check_prints_the_recovery_and_line_b_settings() {
    let args = [
        "--udp",
        "127.0.0.1:9200",
        "--listen-b",
        "127.0.0.1:9201",
        "--recovery",
        "127.0.0.1:9400",
        "--recovery-delay-ms",
        "3",
        "--check",
    ];
    let env = [("MDRELAY_SUB_RECOVERY_ATTEMPTS", "4")];
    let done = Process::spawn(subscriber_bin(), args, &env).unwrap().finish(STEP);
    assert!(done.status.success(), "{done:?}");
    for needle in [
        "recovery = \"127.0.0.1:9400\"  # --recovery",
        "recovery_attempts = 4  # MDRELAY_SUB_RECOVERY_ATTEMPTS",
        "recovery_delay = 0.003  # --recovery-delay-ms, under its earlier name recovery_delay_ms",
        "recovery_retry = 0.05  # default",
        "recovery_linger = 2.0  # default",
        "line_b = \"127.0.0.1:9201\"  # --listen-b, under its earlier name listen_b (now line_b)",
    ] {
        assert!(done.stdout.contains(needle), "{needle:?} in:\n{}", done.stdout);
    }
    // No endpoint: no `[metrics]` heading with nothing under it.
    assert!(!done.stdout.contains("[metrics]"), "{}", done.stdout);
}

#[test]
fn check_takes_natscli_credentials_when_nothing_else_gives_them() {
    let dir = tempfile::tempdir().unwrap();
    let (creds, seed) = (dir.path().join("feed.creds"), dir.path().join("seed.nk"));
    std::fs::write(&creds, "").unwrap();
    std::fs::write(&seed, "").unwrap();
    let (creds, seed) = (creds.to_str().unwrap(), seed.to_str().unwrap());
    let env = [("NATS_CREDS", creds)];
    let done =
        Process::spawn(subscriber_bin(), ["--nats", "nats://127.0.0.1:4222", "--check"], &env).unwrap().finish(STEP);
    assert!(done.status.success(), "{done:?}");
    let line = format!("nats_creds_file = \"{creds}\"  # NATS_CREDS");
    assert!(done.stdout.lines().any(|l| l == line), "{line:?} in:\n{}", done.stdout);
    // Credentials of its own keep NATS_CREDS out; so does a transport other than NATS.
    let own = ["--nats", "nats://127.0.0.1:4222", "--nats-nkey-file", seed, "--check"];
    let done = Process::spawn(subscriber_bin(), own, &env).unwrap().finish(STEP);
    assert!(done.status.success() && !done.stdout.contains("NATS_CREDS"), "{done:?}");
    let tcp = Process::spawn(subscriber_bin(), ["--connect", "127.0.0.1:9100", "--check"], &env).unwrap().finish(STEP);
    assert!(tcp.status.success() && !tcp.stdout.contains("nats_creds_file"), "{tcp:?}");
}

/// A configuration's values, without the origins `--check` writes beside them.
fn values(text: &str) -> toml::Table {
    toml::from_str(text).unwrap_or_else(|e| panic!("{e}: {text}"))
}

#[test]
fn configuration_and_usage_errors_exit_2() {
    let missing = subscriber(&["--config", "/nonexistent/mdrelay/sub.toml"]).finish(STEP);
    assert_eq!(missing.code(), Some(2), "{missing:?}");
    assert!(missing.stderr.contains("/nonexistent/mdrelay/sub.toml"), "{missing:?}");
    for (case, text, flags, needle) in [
        ("a TOML syntax error", "connect = \n", &[][..], "line 1"),
        ("an unknown key", "connect = \"127.0.0.1:9100\"\nconect = 1\n", &[], "conect"),
        (
            "a misspelt key",
            "connect = \"127.0.0.1:9100\"\nreport_intervall = 1\n",
            &[],
            "did you mean `report_interval`?",
        ),
        ("an out-of-range value", "connect = \"127.0.0.1:9100\"\n", &["--duration", "-1"], "--duration"),
        ("a bad flag value", "connect = \"127.0.0.1:9100\"\n", &["--report-interval", "often"], "often"),
        ("an unknown flag", "connect = \"127.0.0.1:9100\"\n", &["--conect", "x"], "--conect"),
    ] {
        let (done, _) = run_with_file(text, flags);
        assert_eq!(done.code(), Some(2), "{case}: {done:?}");
        assert!(done.stderr.contains(needle), "{case}: {needle:?} in {done:?}");
    }
}

#[test]
fn a_port_in_use_exits_1() {
    let taken = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let done = subscriber(&["--listen", &addr, "--report-interval", "0"]).finish(STEP);
    assert_eq!(done.code(), Some(1), "{done:?}");
    assert!(done.stderr.contains(&addr), "{done:?}");
}

#[test]
fn a_peer_that_is_not_a_publisher_is_refused_with_exit_3() {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let http = std::thread::spawn(move || {
        let mut s = mdrelay_harness::accept_within(&listener, STEP);
        let _ = s.write_all(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
        let _ = s.read(&mut [0u8; 64]);
    });
    let done = subscriber(&["--connect", &addr, "--report-interval", "0"]).finish(STEP);
    http.join().unwrap();
    assert_eq!(done.code(), Some(3), "{done:?}");
    assert!(done.stderr.contains("not an mdrelay publisher") && done.stderr.contains(&addr), "{done:?}");
}

#[test]
fn help_lists_the_exit_statuses() {
    let done = subscriber(&["--help"]).finish(STEP);
    done.assert_success();
    let help = done.stdout.split_once("Exit status:").map(|(_, table)| table).unwrap_or_else(|| panic!("{done:?}"));
    for code in ["0", "1", "2", "3"] {
        assert!(
            help.lines().any(|l| l.trim_start().strip_prefix(code).is_some_and(|rest| rest.starts_with("  "))),
            "exit status {code} in {help}"
        );
    }
    assert!(!help.contains("130"), "the subscriber has no immediate stop: {help}");
}

#[test]
fn check_refuses_a_log_filter_that_a_run_refuses() {
    // A port nothing listens on: a run that got past its configuration would fail otherwise.
    let connect = ["--connect", "127.0.0.1:1"];
    for (case, flags, env) in
        [("--log-level", &["--log-level", "mdrelay=loud"][..], "info"), ("MDRELAY_LOG", &[][..], "mdrelay=loud")]
    {
        let start = |check: bool| {
            let mut args: Vec<&str> = connect.iter().chain(flags).copied().collect();
            if check {
                args.push("--check");
            }
            Process::spawn(subscriber_bin(), &args, &[("MDRELAY_LOG", env)]).unwrap().finish(STEP)
        };
        let (run, check) = (start(false), start(true));
        assert_eq!(run.code(), Some(2), "{case}: a run refuses the filter: {run:?}");
        assert_eq!(check.code(), Some(2), "{case}: --check refuses it as the run does: {check:?}");
        for done in [&run, &check] {
            assert!(done.stderr.contains(case) && done.stderr.contains("not a log filter"), "{case}: {}", done.stderr);
        }
    }
}

#[test]
fn settings_named_in_earlier_releases_are_still_read_as_the_same_settings() {
    let earlier = "listen = \"127.0.0.1:9200\"\nrecovery = \"127.0.0.1:9400\"\ncount = 500\n\
                   reconnect_max_seconds = 3\nrecovery_delay_ms = 7\nrecovery_retry_ms = 40\ncore = 0\n";
    let today = "listen = \"127.0.0.1:9200\"\nrecovery = \"127.0.0.1:9400\"\nmax_messages = 500\n\
                 reconnect_max = \"3s\"\nrecovery_delay = \"7ms\"\nrecovery_retry = 0.04\nhot_core = 0\n";
    let (old, _) = run_with_file(earlier, &["--check"]);
    let (new, _) = run_with_file(today, &["--check"]);
    assert!(old.status.success() && new.status.success(), "{old:?}\n{new:?}");
    assert_eq!(values(&old.stdout), values(&new.stdout), "the earlier names mean what the new ones do");
    for needle in ["max_messages = 500", "recovery_delay = 0.007", "recovery_retry = 0.04"] {
        assert!(new.stdout.contains(needle), "{needle:?} in {}", new.stdout);
    }
    assert!(old.stdout.contains("line 3, under its earlier name count (now max_messages)"), "{}", old.stdout);
    // A TCP subscriber's reconnection wait, under its earlier name too.
    let (old, _) = run_with_file("connect = \"h:1\"\nreconnect_max_seconds = 3\n", &["--check"]);
    let (new, _) = run_with_file("tcp = \"h:1\"\nreconnect_max = \"3s\"\n", &["--check"]);
    assert_eq!(values(&old.stdout), values(&new.stdout), "{old:?}\n{new:?}");
    assert!(new.stdout.contains("reconnect_max = 3.0"), "{}", new.stdout);
    // The earlier flags too.
    let flags = |args: &[&str]| {
        let base = ["--listen", "127.0.0.1:9200", "--recovery", "127.0.0.1:9400", "--check"];
        subscriber(&base.iter().chain(args).copied().collect::<Vec<_>>()).finish(STEP)
    };
    let old = flags(&["--count", "500", "--recovery-delay-ms", "7", "--reconnect-max-seconds", "3"]);
    let new = flags(&["--max-messages", "500", "--recovery-delay", "7ms", "--reconnect-max", "3000ms"]);
    assert!(old.status.success(), "{old:?}");
    assert_eq!(values(&old.stdout), values(&new.stdout));
    // One setting under both names is refused, naming the one to keep.
    let (both, _) = run_with_file(&format!("{today}recovery_delay_ms = 7\n"), &[]);
    assert_eq!(both.code(), Some(2), "{both:?}");
    assert!(both.stderr.contains("the same setting twice") && both.stderr.contains("keep recovery_delay"), "{both:?}");
}

#[test]
fn durations_take_units_and_a_bad_one_is_named_with_its_line() {
    let (done, path) = run_with_file("connect = \"127.0.0.1:9100\"\nreport_interval = \"soon\"\n", &[]);
    assert_eq!(done.code(), Some(2), "{done:?}");
    assert!(done.stderr.contains(&path) && done.stderr.contains("line 2"), "{}", done.stderr);
    assert!(done.stderr.contains("\"soon\" is not a duration"), "{}", done.stderr);
    let flag = subscriber(&["--connect", "127.0.0.1:9100", "--duration", "a while"]).finish(STEP);
    assert_eq!(flag.code(), Some(2), "{flag:?}");
    assert!(flag.stderr.contains("--duration") && flag.stderr.contains("is not a duration"), "{}", flag.stderr);
}

/// The flags both programs take for the same thing, spelled alike in each one's `--help`.
const SHARED_FLAGS: &[&str] = &[
    "-c, --config",
    "--check",
    "--profile",
    "--idle",
    "--hot-core",
    "--max-messages",
    "--duration",
    "--metrics-listen",
    "--metrics-hold",
    "--log-format",
    "--log-level",
    "--generate-completions",
    "--generate-man",
];

#[test]
fn both_programs_spell_shared_settings_alike_and_generate_their_docs() {
    let publisher = |args: &[&str]| Process::start(mdrelay_harness::publisher_bin(), args).finish(STEP);
    // The publisher's settings are `run`'s; the documentation flags are the program's.
    let pub_help = publisher(&["run", "--help"]).stdout + &publisher(&["--help"]).stdout;
    let sub_help = subscriber(&["--help"]).finish(STEP).stdout;
    for flag in SHARED_FLAGS {
        for (program, help) in [("mdrelay-pub", &pub_help), ("mdrelay-sub", &sub_help)] {
            assert!(help.contains(flag), "{program} --help lists {flag}: {help}");
        }
    }
    // Flags are grouped under headings by section, and a kind of value has one placeholder in
    // both programs.
    for heading in ["Source:", "Pacing:", "TCP:", "UDP and multicast:", "Retransmission:", "Latency and CPU:"] {
        assert!(pub_help.contains(heading), "mdrelay-pub run --help has a heading {heading}: {pub_help}");
    }
    for heading in ["Transport:", "NATS:", "Recovery:", "Recording:", "Latency and CPU:", "Metrics:"] {
        assert!(sub_help.contains(heading), "mdrelay-sub --help has a heading {heading}: {sub_help}");
    }
    for flag in
        ["--metrics-listen <ADDR:PORT>", "--hot-core <N>", "--json <FILE>", "--idle <STRATEGY>", "--profile <PROFILE>"]
    {
        for (program, help) in [("mdrelay-pub", &pub_help), ("mdrelay-sub", &sub_help)] {
            assert!(help.contains(flag), "{program} --help writes {flag}: {help}");
        }
    }
    // Every setting's flag can be given in the environment too, by a name of the program's own.
    assert!(pub_help.contains("[env: MDRELAY_PUB_HOT_CORE=]"), "{pub_help}");
    assert!(sub_help.contains("[env: MDRELAY_SUB_HOT_CORE=]"), "{sub_help}");
    // Man pages: the program's, and one per subcommand of the publisher's.
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().to_str().unwrap();
    publisher(&["--generate-man", out]).assert_success();
    subscriber(&["--generate-man", out]).finish(STEP).assert_success();
    for (page, flag) in
        [("mdrelay-pub.1", "generate\\-man"), ("mdrelay-pub-run.1", "hot\\-core"), ("mdrelay-sub.1", "hot\\-core")]
    {
        let text = std::fs::read_to_string(dir.path().join(page)).unwrap_or_else(|e| panic!("{page}: {e}"));
        assert!(text.starts_with(".ie") || text.contains(".TH"), "{page} is a man page");
        assert!(text.contains(flag), "{page} documents {flag}");
    }
    // Each page ends with the variables the program reads and its exit statuses, as sections.
    for (page, variables, statuses) in [
        (
            "mdrelay-pub-run.1",
            &["MDRELAY_PUB_HOT_CORE", "NATS_URL", "NATS_CREDS", "MDRELAY_LOG"][..],
            ExitStatus::PUBLISHER,
        ),
        ("mdrelay-sub.1", &["MDRELAY_SUB_HOT_CORE", "NATS_CREDS", "MDRELAY_LOG"][..], ExitStatus::SUBSCRIBER),
    ] {
        let text = std::fs::read_to_string(dir.path().join(page)).unwrap();
        let environment = text.split(".SH ENVIRONMENT").nth(1).unwrap_or_else(|| panic!("{page}: {text}"));
        let (environment, exit) =
            environment.split_once(".SH \"EXIT STATUS\"").unwrap_or_else(|| panic!("{page}: {text}"));
        for variable in variables {
            assert!(environment.contains(variable), "{page}: {variable} in {environment}");
        }
        for status in ExitStatus::ALL {
            let listed = exit.contains(&format!("\\fB{}\\fR", status.code()));
            assert_eq!(listed, statuses.contains(&status), "{page}: exit status {} in {exit}", status.code());
        }
    }
    let missing = subscriber(&["--generate-man", "/nonexistent/mdrelay/man1"]).finish(STEP);
    assert_eq!(missing.code(), Some(1), "{missing:?}");
    assert!(missing.stderr.contains("/nonexistent/mdrelay/man1 is not a directory"), "{missing:?}");
    // Completions that bash loads, offering the flags.
    for (program, bin) in
        [("mdrelay-pub", mdrelay_harness::publisher_bin()), ("mdrelay-sub", mdrelay_harness::subscriber_bin())]
    {
        let script = Process::start(&bin, ["--generate-completions", "bash"]).finish(STEP);
        script.assert_success();
        assert!(script.stdout.contains("--hot-core"), "{program}: {}", script.stdout);
        let path = dir.path().join(format!("{program}.bash"));
        std::fs::write(&path, &script.stdout).unwrap();
        let load = format!("source {} && complete -p {program}", path.display());
        let loaded = Process::start("bash", ["-c", load.as_str()]).finish(STEP);
        assert!(loaded.status.success() && loaded.stdout.contains(program), "{program}: {loaded:?}");
    }
}

/// docs/operations.md's reference of every setting's flag and variable is what the programs
/// print from their own definitions; `MDRELAY_UPDATE_DOCS=1` writes it there instead.
#[test]
fn the_settings_reference_in_the_docs_is_the_programs_own() {
    let mut generated = String::new();
    for bin in [mdrelay_harness::publisher_bin(), mdrelay_harness::subscriber_bin()] {
        let out = Process::start(&bin, ["--generate-settings-reference"]).finish(STEP);
        out.assert_success();
        assert!(out.stdout.contains("| `--hot-core <N>` |"), "{}", out.stdout);
        generated.push_str(&out.stdout);
    }
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/operations.md");
    let text = std::fs::read_to_string(&path).unwrap();
    let (begin, end) = (
        "<!-- settings reference: generated, see the test that checks it -->\n",
        "<!-- end of the settings reference -->",
    );
    let (head, rest) = text.split_once(begin).expect("docs/operations.md has the settings reference's start marker");
    let (written, tail) = rest.split_once(end).expect("docs/operations.md has the settings reference's end marker");
    if std::env::var_os("MDRELAY_UPDATE_DOCS").is_some() {
        std::fs::write(&path, format!("{head}{begin}{generated}\n{end}{tail}")).unwrap();
        return;
    }
    assert_eq!(
        written.trim(),
        generated.trim(),
        "docs/operations.md's settings reference is not what the programs print: run this test with MDRELAY_UPDATE_DOCS=1"
    );
}

/// A value for each setting, as a flag or variable writes it and as the file does, with the
/// flags of the transport (and settings) it goes with.
struct Sample {
    key: &'static str,
    text: &'static str,
    toml: &'static str,
    with: &'static [&'static str],
}

const TCP: &[&str] = &["--tcp", "h:1"];
const UDP_RECOVERY: &[&str] = &["--udp", "127.0.0.1:9200", "--recovery", "127.0.0.1:9101"];
const NATS: &[&str] = &["--nats", "nats://127.0.0.1:4222", "--nats-stream", "MD"];

/// Every setting, from its key in the file, its environment variable and its flag, gives the
/// same value, and `--check` names where each came from. The list is the settings structs'
/// fields: a setting added without a sample here fails the test.
#[test]
fn every_setting_is_the_same_from_the_file_its_variable_and_its_flag() {
    use mdrelay_telemetry::settings::field_names;
    let dir = tempfile::tempdir().unwrap();
    let file = |name: &str, text: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
        path.to_str().unwrap().to_string()
    };
    let (creds, seed, password, ca) = (file("a.creds", ""), file("s.nk", ""), file("pw", "secret"), file("ca.pem", ""));
    let key_file = file("wire.key", &"5a".repeat(32));
    let leak = |s: String| -> &'static str { Box::leak(s.into_boxed_str()) };
    let quoted = |s: &str| -> &'static str { leak(format!("{s:?}")) };
    let samples = [
        Sample { key: "tcp", text: "h:1", toml: "\"h:1\"", with: &[] },
        Sample { key: "udp", text: "127.0.0.1:9200", toml: "\"127.0.0.1:9200\"", with: &[] },
        Sample { key: "multicast", text: "239.255.0.1:9300", toml: "\"239.255.0.1:9300\"", with: &[] },
        Sample {
            key: "interface",
            text: "127.0.0.1",
            toml: "\"127.0.0.1\"",
            with: &["--multicast", "239.255.0.1:9300"],
        },
        Sample { key: "nats", text: "nats://127.0.0.1:4222", toml: "\"nats://127.0.0.1:4222\"", with: &[] },
        Sample { key: "nats_subject", text: "md.deep", toml: "\"md.deep\"", with: NATS },
        Sample { key: "nats_stream", text: "MD2", toml: "\"MD2\"", with: &["--nats", "nats://127.0.0.1:4222"] },
        Sample { key: "nats_start_at", text: "2026-11-26T14:30:00Z", toml: "\"2026-11-26T14:30:00Z\"", with: NATS },
        Sample { key: "nats_creds_file", text: leak(creds.clone()), toml: quoted(&creds), with: NATS },
        Sample { key: "nats_nkey_file", text: leak(seed.clone()), toml: quoted(&seed), with: NATS },
        Sample {
            key: "nats_user",
            text: "feed",
            toml: "\"feed\"",
            with: leak_args(&[NATS, &["--nats-password-file", &password]]),
        },
        Sample {
            key: "nats_password_file",
            text: leak(password.clone()),
            toml: quoted(&password),
            with: leak_args(&[NATS, &["--nats-user", "feed"]]),
        },
        Sample { key: "nats_tls_ca_file", text: leak(ca.clone()), toml: quoted(&ca), with: NATS },
        Sample { key: "nats_pending_messages", text: "256", toml: "256", with: NATS },
        Sample { key: "nats_name", text: "desk-3", toml: "\"desk-3\"", with: NATS },
        Sample {
            key: "line_b",
            text: "127.0.0.1:9201",
            toml: "\"127.0.0.1:9201\"",
            with: &["--udp", "127.0.0.1:9200"],
        },
        Sample {
            key: "interface_b",
            text: "127.0.0.1",
            toml: "\"127.0.0.1\"",
            with: &["--multicast", "239.255.0.1:9300", "--line-b", "239.255.0.2:9300"],
        },
        Sample {
            key: "recovery",
            text: "127.0.0.1:9101",
            toml: "\"127.0.0.1:9101\"",
            with: &["--udp", "127.0.0.1:9200"],
        },
        Sample { key: "recovery_delay", text: "7ms", toml: "\"7ms\"", with: UDP_RECOVERY },
        Sample { key: "recovery_retry", text: "0.07", toml: "0.07", with: UDP_RECOVERY },
        Sample { key: "recovery_attempts", text: "7", toml: "7", with: UDP_RECOVERY },
        Sample { key: "recovery_linger", text: "3", toml: "3", with: UDP_RECOVERY },
        Sample { key: "resume", text: "false", toml: "false", with: TCP },
        Sample { key: "from_start", text: "true", toml: "true", with: TCP },
        Sample { key: "snapshot", text: "true", toml: "true", with: TCP },
        Sample { key: "symbols", text: "AAPL,IBM", toml: "[\"AAPL\", \"IBM\"]", with: TCP },
        Sample { key: "crc", text: "true", toml: "true", with: TCP },
        Sample { key: "key_file", text: leak(key_file.clone()), toml: quoted(&key_file), with: TCP },
        Sample { key: "echo_every", text: "10", toml: "10", with: &["--tcp", "h:1", "--latency", "round-trip"] },
        Sample { key: "reconnect_max", text: "3s", toml: "\"3s\"", with: TCP },
        Sample { key: "give_up_after", text: "90", toml: "90", with: TCP },
        Sample { key: "connect_timeout", text: "1500ms", toml: "1.5", with: TCP },
        Sample { key: "receive_buffer", text: "8MiB", toml: "8388608", with: &["--udp", "127.0.0.1:9200"] },
        Sample { key: "profile", text: "low-latency", toml: "\"low-latency\"", with: TCP },
        Sample { key: "idle", text: "backoff", toml: "\"backoff\"", with: TCP },
        Sample { key: "busy_poll", text: "true", toml: "true", with: TCP },
        Sample { key: "latency", text: "round-trip", toml: "\"round-trip\"", with: TCP },
        Sample { key: "report_interval", text: "250ms", toml: "0.25", with: TCP },
        Sample { key: "json", text: "out.json", toml: "\"out.json\"", with: TCP },
        Sample { key: "histogram_log", text: "out.hlog", toml: "\"out.hlog\"", with: TCP },
        Sample { key: "book", text: "book.json", toml: "\"book.json\"", with: TCP },
        Sample { key: "max_messages", text: "500", toml: "500", with: TCP },
        Sample { key: "duration", text: "10m", toml: "600", with: TCP },
        Sample { key: "record", text: "day.pcap.gz", toml: "\"day.pcap.gz\"", with: TCP },
        Sample { key: "record_overwrite", text: "true", toml: "true", with: &["--tcp", "h:1", "--record", "d.pcap"] },
        Sample {
            key: "record_rotate_size",
            text: "1MiB",
            toml: "\"1MiB\"",
            with: &["--tcp", "h:1", "--record", "d.pcap"],
        },
        Sample {
            key: "record_rotate_interval",
            text: "1h",
            toml: "3600",
            with: &["--tcp", "h:1", "--record", "d.pcap"],
        },
        Sample {
            key: "record_max_files",
            text: "3",
            toml: "3",
            with: &["--tcp", "h:1", "--record", "d.pcap", "--record-rotate-size", "1MiB"],
        },
        Sample { key: "hot_core", text: "0", toml: "0", with: TCP },
        Sample { key: "metrics.listen", text: "127.0.0.1:9901", toml: "\"127.0.0.1:9901\"", with: TCP },
        Sample {
            key: "metrics.hold",
            text: "30s",
            toml: "30",
            with: &["--tcp", "h:1", "--metrics-listen", "127.0.0.1:9901"],
        },
    ];
    // The settings that are no flag: the subscriber keeps frames' bytes only when it records.
    let not_flags = ["frame_bytes"];
    let fields = field_names::<mdrelay_client::Settings>().iter().chain(field_names::<Application>());
    for field in fields.filter(|field| !not_flags.contains(field)) {
        let sampled = samples.iter().any(|s| s.key == *field || s.key.split('.').next() == Some(*field));
        assert!(sampled, "{field}: a setting without a sample here");
    }
    let check = |args: Vec<String>, env: Vec<(String, String)>| {
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let done =
            Process::spawn(subscriber_bin(), args.iter().chain([&"--check".to_string()]), &env).unwrap().finish(STEP);
        assert!(done.status.success(), "{args:?}: {done:?}");
        done.stdout
    };
    // A switch its variable turns off sets nothing.
    let off = check(TCP.iter().map(|s| s.to_string()).collect(), vec![("MDRELAY_SUB_CRC".into(), "false".into())]);
    assert!(off.lines().any(|l| l == "crc = false  # default"), "{off}");
    for sample in &samples {
        let with = || sample.with.iter().map(|s| s.to_string());
        let (leaf, flag) = (sample.key.rsplit('.').next().unwrap(), sample.key.replace(['_', '.'], "-"));
        let variable = format!("MDRELAY_SUB_{}", sample.key.replace('.', "_").to_uppercase());
        let config = file("sub.toml", &format!("# {}\n{} = {}\n", sample.key, sample.key, sample.toml));
        let switch =
            sample.text == "true" && ["from_start", "snapshot", "crc", "record_overwrite"].contains(&sample.key);
        let flag_args: Vec<String> = match switch {
            true => vec![format!("--{flag}")],
            false => vec![format!("--{flag}"), sample.text.to_string()],
        };
        let ways = [
            (check(with().chain(["--config".into(), config.clone()]).collect(), vec![]), format!("{config}, line 2")),
            (check(with().collect(), vec![(variable.clone(), sample.text.to_string())]), variable.clone()),
            (check(with().chain(flag_args).collect(), vec![]), format!("--{flag}")),
        ];
        let value = |stdout: &str| {
            let table = values(stdout);
            sample.key.split('.').try_fold(toml::Value::Table(table), |v, part| v.get(part).cloned())
        };
        let from_file = value(&ways[0].0);
        assert!(from_file.is_some(), "{}: not in --check's output:\n{}", sample.key, ways[0].0);
        for (stdout, origin) in &ways {
            assert_eq!(value(stdout), from_file, "{} from {origin}:\n{stdout}", sample.key);
            let named = stdout
                .lines()
                .any(|line| line.starts_with(&format!("{leaf} = ")) && line.ends_with(&format!("  # {origin}")));
            assert!(named, "{}: no line naming {origin} in:\n{stdout}", sample.key);
        }
    }
}

/// `parts` as one list that lives for the test.
fn leak_args(parts: &[&[&str]]) -> &'static [&'static str] {
    let all: Vec<&'static str> =
        parts.iter().flat_map(|p| p.iter()).map(|s| &*Box::leak(s.to_string().into_boxed_str())).collect();
    Box::leak(all.into_boxed_slice())
}
