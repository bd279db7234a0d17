//! The progress bars of a capture replay, `inspect`, `synth` and `convert`: drawn on a terminal,
//! absent when stderr is piped (scripts, logs and the other tests see exactly what they saw
//! before the bars).

use crate::common::beside_others_in_tempdir;
use mdrelay_iex::inspect::inspect_file;
use std::fs::File;
use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Longest any one command may take; a debug build writes 200,000 messages in about a second.
const DEADLINE: Duration = Duration::from_secs(120);

/// What a finished command printed.
struct Printed {
    stdout: String,
    stderr: String,
}

/// Waits for `child` until [`DEADLINE`], killing it and failing past that; asserts it succeeded.
fn wait_ok(mut child: std::process::Child, what: &str) {
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("waiting for mdrelay-pub") {
            break status;
        }
        if started.elapsed() > DEADLINE {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what} still running after {DEADLINE:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    assert!(status.success(), "{what} failed: {status}");
}

/// Runs `mdrelay-pub args` with stdout and stderr sent to files (pipes, as far as a bar can tell:
/// not a terminal), so nothing blocks on a full pipe while the deadline is watched.
fn run_piped(args: &[&str], dir: &Path) -> Printed {
    let out_path = dir.join("stdout");
    let err_path = dir.join("stderr");
    let child = Command::new(mdrelay_harness::publisher_bin())
        .args(args)
        .env_remove("MDRELAY_LOG")
        .stdin(Stdio::null())
        .stdout(File::create(&out_path).unwrap())
        .stderr(File::create(&err_path).unwrap())
        .spawn()
        .expect("starting mdrelay-pub");
    wait_ok(child, &format!("mdrelay-pub {}", args.join(" ")));
    Printed { stdout: std::fs::read_to_string(out_path).unwrap(), stderr: std::fs::read_to_string(err_path).unwrap() }
}

/// Fails when `text` holds what a progress bar draws: escape sequences, carriage returns, bar
/// and spinner characters.
fn assert_no_bar(text: &str, what: &str) {
    let drawn = text.chars().find(|c| matches!(c, '\x1b' | '\r' | '█' | '░' | '\u{2800}'..='\u{28ff}'));
    assert_eq!(drawn, None, "{what} drew a progress bar on a stderr that is not a terminal: {text:?}");
}

#[test]
fn without_a_terminal_the_tools_print_only_their_usual_lines() {
    let (_shared, dir) = beside_others_in_tempdir();
    let capture = mdrelay_harness::iex_data().join("TOPS16.pcap.gz");
    let capture_arg = capture.to_str().unwrap();

    // inspect: the report on stdout, as the library's inspect_file makes it; nothing on stderr.
    let inspected = run_piped(&["inspect", "--json", capture_arg], dir.path());
    assert_no_bar(&inspected.stderr, "inspect");
    assert_eq!(inspected.stderr, "", "inspect prints nothing on stderr when all is well");
    let printed: serde_json::Value = serde_json::from_str(&inspected.stdout).expect("inspect --json prints JSON");
    let library = serde_json::to_value(inspect_file(&capture).unwrap()).unwrap();
    assert_eq!(printed, library, "inspect's report is the one inspect_file makes");

    // synth: its one summary line.
    let synthetic = dir.path().join("day.pcap");
    let synthetic_arg = synthetic.to_str().unwrap();
    let synthesized = run_piped(&["synth", "--messages", "200000", "--out", synthetic_arg], dir.path());
    assert_no_bar(&synthesized.stderr, "synth");
    let lines: Vec<&str> = synthesized.stderr.lines().collect();
    assert_eq!(lines.len(), 1, "synth prints one line: {:?}", synthesized.stderr);
    assert!(lines[0].starts_with("wrote 200000 messages in "), "{:?}", lines[0]);
    assert_eq!(inspect_file(&synthetic).unwrap().messages, 200_000, "synth wrote the messages asked for");

    // convert: its one summary line.
    let converted = dir.path().join("converted.pcapng");
    let converted_arg = converted.to_str().unwrap();
    let copied = run_piped(&["convert", capture_arg, "--out", converted_arg, "--container", "pcapng"], dir.path());
    assert_no_bar(&copied.stderr, "convert");
    let packets = library["packets"].as_u64().unwrap();
    assert_eq!(copied.stderr, format!("copied {packets} packets to {converted_arg}\n"));
}

/// Runs `mdrelay-pub args` with stderr on a pseudo-terminal and `env`; returns what it drew there.
fn run_on_terminal(args: &[&str], env: &[(&str, &str)]) -> String {
    use nix::pty::{Winsize, openpty};
    let size = Winsize { ws_row: 40, ws_col: 120, ws_xpixel: 0, ws_ypixel: 0 };
    let pty = openpty(&size, None).expect("opening a pseudo-terminal");
    let mut command = Command::new(mdrelay_harness::publisher_bin());
    command
        .args(args)
        .env_remove("MDRELAY_LOG")
        // A terminal that can draw, whatever the caller's (`TERM=dumb` in an editor's shell or a
        // stripped environment would hide the bar this checks for).
        .env("TERM", "xterm-256color")
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::from(pty.slave));
    let child = command.spawn().expect("starting mdrelay-pub");
    // The child holds the terminal now: with the parent's copy closed, reading ends (EIO on
    // Linux) once the child exits.
    drop(command);
    let (sender, received) = mpsc::channel();
    let mut master = File::from(pty.master);
    std::thread::spawn(move || {
        let mut drawn = Vec::new();
        let mut buf = [0u8; 4096];
        while let Ok(n) = master.read(&mut buf) {
            if n == 0 {
                break;
            }
            drawn.extend_from_slice(&buf[..n]);
        }
        let _ = sender.send(drawn);
    });
    wait_ok(child, &format!("mdrelay-pub {} on a terminal", args.join(" ")));
    let drawn = received.recv_timeout(DEADLINE).expect("the terminal's output ends when mdrelay-pub exits");
    String::from_utf8_lossy(&drawn).into_owned()
}

#[test]
fn on_a_terminal_synth_draws_a_progress_bar() {
    let (_shared, dir) = beside_others_in_tempdir();
    let out = dir.path().join("day.pcap");
    let drawn = run_on_terminal(&["synth", "--messages", "200000", "--out", out.to_str().unwrap()], &[]);
    // The bar shows the total, with separators the summary line does not use.
    assert!(drawn.contains("200,000 messages"), "no progress bar on the terminal: {drawn:?}");
    assert!(drawn.contains('\x1b'), "the bar is drawn with escape sequences: {drawn:?}");
    assert!(drawn.contains("wrote 200000 messages in "), "the summary follows the bar: {drawn:?}");
}

#[test]
fn a_capture_replay_draws_its_progress_on_a_terminal_with_log_lines_whole_around_it() {
    let _shared = mdrelay_harness::shared();
    let capture = mdrelay_harness::iex_data().join("DEEP10.pcap.gz");
    let udp = format!("127.0.0.1:{}", mdrelay_harness::free_udp_port());
    let args = ["run", "--capture", capture.to_str().unwrap(), "--udp", &udp, "--pacing", "rate", "--rate", "400000"];
    let drawn = run_on_terminal(&args, &[("MDRELAY_LOG", "info")]);
    // Bytes of the file against its size, and messages relayed.
    let size = std::fs::metadata(&capture).unwrap().len();
    assert!(drawn.contains(" messages"), "no progress bar on the terminal: {drawn:?}");
    assert!(drawn.contains("MiB") || drawn.contains("KiB"), "the bar counts bytes: {drawn:?}");
    assert!(drawn.contains('\x1b'), "the bar is drawn with escape sequences: {drawn:?}");
    assert!(size > 1 << 20, "DEEP10 is megabytes, so the bar has time to be drawn");
    // Log lines are written around the bar, each whole on a line of its own.
    for message in ["publishing", "end of stream"] {
        let line =
            drawn.lines().find(|l| l.contains(message)).unwrap_or_else(|| panic!("no {message:?} line: {drawn:?}"));
        assert!(line.contains("INFO"), "{message:?} is not a whole log line: {line:?}");
    }

    // Piped, the same replay draws nothing.
    let dir = tempfile::tempdir().unwrap();
    let piped = run_piped(&args, dir.path());
    assert_no_bar(&piped.stderr, "run --capture");
    assert!(piped.stdout.starts_with("published "), "{:?}", piped.stdout);
}
