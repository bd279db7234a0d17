//! The README's and the docs' walkthroughs hold as written, against the programs of this build:
//! - every `mdrelay-pub` / `mdrelay-sub` command line in a fenced shell block of README.md and
//!   docs/*.md, and in the comments of config/*.toml, checks with the real program (`--check`:
//!   the configuration resolved as a run would, without binding or opening anything); the
//!   publisher's capture tools' flags are in their `--help`;
//! - every configuration (config/*.toml, and each ```toml block of the docs) loads with the real
//!   loader of the program it is for;
//! - every project path the docs, the examples' comments and the manifests' comments name exists;
//! - every flag and key in the command reference's tables is one the program takes;
//! - the client's error kinds are all listed, and the README's Rust example compiles (it is a
//!   function below, compared with the README's text) and runs against a publisher;
//! - no step signals processes by name (`pkill`, `killall`: every publisher on the host).
//!
//! What runs for real: the "Two terminals on one host" walkthrough over TCP, format switch by
//! SIGHUP included, in a network namespace of its own (so its fixed port 9100 meets nothing of
//! the host's), and the Rust example. The two-host steps run for real in
//! publisher/tests/it/two_hosts.rs (as root, across emulated hosts); here they, the multicast
//! walkthrough (a minute of replay) and the systemd steps are checked for parse only.

use mdrelay_harness::{Process, STEP, publisher_bin, shared, subscriber_bin};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// The project root, where the README, `docs/` and `config/` are.
fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..").canonicalize().unwrap()
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// README.md and docs/*.md, relative to the root, with their text.
fn documents() -> Vec<(String, String)> {
    let mut names = vec!["README.md".to_string()];
    let mut docs: Vec<String> = std::fs::read_dir(root().join("docs"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".md"))
        .map(|n| format!("docs/{n}"))
        .collect();
    docs.sort();
    names.extend(docs);
    names.into_iter().map(|n| (n.clone(), read(&root().join(&n)))).collect()
}

/// The example configurations, config/*.toml, sorted.
fn example_configs() -> Vec<PathBuf> {
    let mut paths: Vec<PathBuf> = std::fs::read_dir(root().join("config"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "toml"))
        .collect();
    paths.sort();
    assert!(paths.len() >= 9, "the examples README's layout table lists: {paths:?}");
    paths
}

/// A fenced code block: its document, the line of its opening fence (from 1), its info string
/// (`toml`, `rust`, empty) and its lines, each with its own line number.
struct Block {
    document: String,
    line: usize,
    info: String,
    lines: Vec<(usize, String)>,
}

fn blocks() -> Vec<Block> {
    let mut out = Vec::new();
    for (document, text) in documents() {
        let mut open: Option<Block> = None;
        for (i, line) in text.lines().enumerate() {
            let trimmed = line.trim_start();
            if let Some(info) = trimmed.strip_prefix("```") {
                match open.take() {
                    Some(block) => out.push(block),
                    None => {
                        open = Some(Block {
                            document: document.clone(),
                            line: i + 1,
                            info: info.trim().to_string(),
                            lines: Vec::new(),
                        })
                    }
                }
            } else if let Some(block) = open.as_mut() {
                block.lines.push((i + 1, trimmed.to_string()));
            }
        }
        assert!(open.is_none(), "{document}: a code block is never closed");
    }
    out
}

/// Splits a command line into words as the shell would for these simple lines: white space
/// separates, single and double quotes group (without expansions).
fn words(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut word = String::new();
    let mut in_word = false;
    let mut quote: Option<char> = None;
    for c in line.chars() {
        match quote {
            Some(q) if c == q => quote = None,
            Some(_) => word.push(c),
            None if c == '\'' || c == '"' => {
                quote = Some(c);
                in_word = true;
            }
            None if c.is_whitespace() => {
                if in_word {
                    out.push(std::mem::take(&mut word));
                    in_word = false;
                }
            }
            None => {
                word.push(c);
                in_word = true;
            }
        }
    }
    if in_word {
        out.push(word);
    }
    out
}

/// The commands of shell blocks (no info string, or `sh`), continuation lines joined, each with
/// where it is.
fn shell_commands() -> Vec<(String, String)> {
    let mut out = Vec::new();
    for block in blocks().into_iter().filter(|b| b.info.is_empty() || b.info == "sh") {
        let mut pending: Option<(usize, String)> = None;
        for (line, text) in block.lines {
            let (start, mut joined) = pending.take().unwrap_or((line, String::new()));
            joined.push_str(&text);
            match joined.strip_suffix('\\') {
                Some(head) => pending = Some((start, format!("{head} "))),
                None => out.push((format!("{}:{start}", block.document), joined)),
            }
        }
    }
    out
}

/// Which of the two programs a word runs, if it is one of them (by name or path).
fn program(word: &str) -> Option<&'static str> {
    let name = word.rsplit('/').next()?;
    ["mdrelay-pub", "mdrelay-sub"].into_iter().find(|p| *p == name)
}

/// The invocations of either program in a command line: the program and its arguments, where it
/// is run (the line's first word, or after `deploy/netns-hosts.sh exec HOST`), not named as an
/// argument (`install ... mdrelay-pub /usr/local/bin/`). Comments, a trailing `&`, pipes and
/// `&&` end the arguments.
fn invocations(line: &str) -> Vec<(&'static str, Vec<String>)> {
    let mut out = Vec::new();
    let line = line.split(" #").next().unwrap_or(line);
    for segment in line.split(" | ").flat_map(|s| s.split(" && ")).flat_map(|s| s.split("; ")) {
        let mut words = words(segment.trim().trim_end_matches('&'));
        if words.first().is_some_and(|w| w.ends_with("netns-hosts.sh")) && words.get(1).is_some_and(|w| w == "exec") {
            words.drain(..3.min(words.len()));
        }
        if let Some(p) = words.first().and_then(|w| program(w)) {
            out.push((p, words[1..].to_vec()));
        }
    }
    out
}

/// A configuration file a step names by its bare name (as copied to a host: `two-host-pub.toml`),
/// mapped to the project's example of that name; other arguments unchanged.
fn project_paths(args: &[String]) -> Vec<String> {
    args.iter()
        .map(|a| {
            let example = root().join("config").join(a);
            if a.ends_with(".toml") && !a.contains('/') && example.is_file() {
                example.to_string_lossy().into_owned()
            } else {
                a.clone()
            }
        })
        .collect()
}

/// Runs `program` with `args` in the project root and returns what it did.
fn run_in_root(program: &str, args: &[String]) -> mdrelay_harness::Finished {
    let bin = if program == "mdrelay-pub" { publisher_bin() } else { subscriber_bin() };
    let mut command = Command::new(bin);
    command.args(args).current_dir(root());
    Process::spawn_command(program, command).unwrap().finish(STEP)
}

/// The `--help` of a program (the publisher's: the top level's and each subcommand's).
fn help(program: &str, subcommand: Option<&str>) -> String {
    let mut args: Vec<String> = subcommand.into_iter().map(str::to_string).collect();
    args.push("--help".into());
    let done = run_in_root(program, &args);
    done.assert_success();
    done.stdout
}

/// The long flags a text names (`--check`, `--record-rotate-size`).
fn flags_in(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let bytes = text.as_bytes();
    let mut i = 0;
    while let Some(at) = text[i..].find("--") {
        let start = i + at;
        let before = start.checked_sub(1).map(|b| bytes[b]);
        let mut end = start + 2;
        while end < bytes.len()
            && (bytes[end].is_ascii_lowercase() || bytes[end].is_ascii_digit() || bytes[end] == b'-')
        {
            end += 1;
        }
        let flag = text[start..end].trim_end_matches('-');
        if flag.len() > 3
            && bytes[start + 2].is_ascii_lowercase()
            && !before.is_some_and(|b| b.is_ascii_alphanumeric() || b == b'-')
        {
            out.push(flag.to_string());
        }
        i = end.max(start + 2);
    }
    out
}

/// Whether `help` lists `flag` as a flag of its own (not as the start of a longer one).
fn help_lists(help: &str, flag: &str) -> bool {
    help.match_indices(flag).any(|(at, _)| {
        let next = help[at + flag.len()..].chars().next();
        !next.is_some_and(|c| c.is_ascii_alphanumeric() || c == '-')
    })
}

#[test]
fn every_documented_command_checks_with_the_program() {
    let _shared = shared();
    let mut sources = shell_commands();
    // The examples' own comments say how to run them.
    for path in example_configs() {
        let name = format!("config/{}", path.file_name().unwrap().to_string_lossy());
        for (i, line) in read(&path).lines().enumerate() {
            // A comment's command, after its label (`host A: mdrelay-pub ...`) and before prose
            // (`(or join ...)`, `(start first: ...)`).
            let Some(comment) = line.strip_prefix('#') else { continue };
            let comment = comment.split("  (").next().unwrap();
            let Some(at) = comment.find("mdrelay-pub ").or_else(|| comment.find("mdrelay-sub ")) else { continue };
            let start = comment[..at].rfind(|c: char| c.is_whitespace() || c == ':').map_or(0, |s| s + 1);
            sources.push((format!("{name}:{}", i + 1), comment[start..].to_string()));
        }
    }
    let mut checked = 0;
    let mut tools = 0;
    for (at, line) in &sources {
        for (program, args) in invocations(line) {
            if program == "mdrelay-pub" && args.first().is_some_and(|a| a != "run" && !a.starts_with('-')) {
                // The capture tools: their flags are the subcommand's.
                let sub = &args[0];
                let help = help(program, Some(sub.as_str()));
                for flag in args.iter().filter(|a| a.starts_with("--")) {
                    assert!(help_lists(&help, flag), "{at}: `{program} {sub}` takes no {flag}: {line}");
                }
                tools += 1;
                continue;
            }
            if args.iter().any(|a| a.starts_with("--generate-") || a == "--version" || a == "--help") {
                // Ends before any configuration; cli.rs runs these.
                continue;
            }
            let mut args = project_paths(&args);
            args.push("--check".into());
            let done = run_in_root(program, &args);
            assert_eq!(done.code(), Some(0), "{at}: {line}\nchecks as `{program} {}`: {done:?}", args.join(" "));
            checked += 1;
        }
    }
    // The README's own walkthroughs, the two-host steps, docs/recording.md's and the examples'.
    assert!(checked >= 30, "only {checked} commands found: the extraction has broken");
    assert!(tools >= 1, "docs/recording.md's inspect");
}

#[test]
fn no_step_signals_processes_by_name() {
    for (at, line) in shell_commands() {
        let words = words(&line);
        for broad in ["pkill", "killall"] {
            assert!(
                !words.iter().any(|w| w == broad),
                "{at}: {line}: signals every process of that name on the host; use its pid, a pid file or systemctl"
            );
        }
    }
}

/// Loads a configuration with the program it is for, trying it alone and with a transport
/// from a flag (a fragment of a file may name none); the program's messages when none loads.
fn load(program: &str, path: &Path) -> Result<(), String> {
    let path = path.to_string_lossy().into_owned();
    let tries: Vec<Vec<&str>> = if program == "mdrelay-pub" {
        vec![vec!["run", "--config", path.as_str()], vec!["run", "--config", path.as_str(), "--tcp", "127.0.0.1:9100"]]
    } else {
        vec![vec!["--config", path.as_str()], vec!["--config", path.as_str(), "--connect", "127.0.0.1:9100"]]
    };
    let mut errors = String::new();
    for args in tries {
        let mut args: Vec<String> = args.into_iter().map(str::to_string).collect();
        args.push("--check".into());
        let done = run_in_root(program, &args);
        if done.code() == Some(0) {
            return Ok(());
        }
        errors.push_str(&done.stderr);
    }
    Err(errors)
}

#[test]
fn every_documented_configuration_loads() {
    let _shared = shared();
    for path in example_configs() {
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let program = if name.starts_with("sub-") { "mdrelay-sub" } else { "mdrelay-pub" };
        let args: Vec<String> = if program == "mdrelay-pub" {
            vec!["run".into(), "--config".into(), path.to_string_lossy().into_owned(), "--check".into()]
        } else {
            vec!["--config".into(), path.to_string_lossy().into_owned(), "--check".into()]
        };
        let done = run_in_root(program, &args);
        assert_eq!(done.code(), Some(0), "config/{name} with {program}: {done:?}");
    }
    // The docs' TOML, written out and loaded by the program that takes it.
    let dir = tempfile::tempdir().unwrap();
    let mut loaded = 0;
    for block in blocks().into_iter().filter(|b| b.info == "toml") {
        let path = dir.path().join(format!("block-{}.toml", block.line));
        let text: String = block.lines.iter().map(|(_, l)| format!("{l}\n")).collect();
        std::fs::write(&path, &text).unwrap();
        let publisher = load("mdrelay-pub", &path);
        let subscriber = load("mdrelay-sub", &path);
        assert!(
            publisher.is_ok() || subscriber.is_ok(),
            "{}:{}: loads with neither program:\n{text}\nmdrelay-pub: {}\nmdrelay-sub: {}",
            block.document,
            block.line,
            publisher.unwrap_err(),
            subscriber.unwrap_err()
        );
        loaded += 1;
    }
    assert!(loaded >= 2, "docs/operations.md's `--check` output and its recording settings");
}

/// Project paths in a text: words starting with a top-level directory of the project (or
/// `../shared/`), up to the first character no path here has.
fn project_paths_in(text: &str) -> Vec<String> {
    const TOPS: &[&str] = &[
        ".ci/",
        "proto/",
        "client/",
        "publisher/",
        "subscriber/",
        "bench/",
        "harness/",
        "fuzz/",
        "buildinfo/",
        "telemetry/",
        "config/",
        "deploy/",
        "docs/",
        "python/",
        "../shared/",
    ];
    let mut out = Vec::new();
    for top in TOPS {
        for (at, _) in text.match_indices(top) {
            let before = text[..at].chars().next_back();
            if before.is_some_and(|c| c.is_ascii_alphanumeric() || "_-./~$".contains(c)) {
                continue;
            }
            let rest = &text[at..];
            let end = rest.find(|c: char| !(c.is_ascii_alphanumeric() || "_-./@*".contains(c))).unwrap_or(rest.len());
            let path = rest[..end].trim_end_matches(['.', ',', ':', ';']);
            out.push(path.to_string());
        }
    }
    out
}

/// Whether `path` (relative to `base`) exists; a `*` matches within one name.
fn exists(base: &Path, path: &str) -> bool {
    match path.split_once('*') {
        None => base.join(path).exists(),
        Some((head, tail)) => {
            let (dir, prefix) = head.rsplit_once('/').unwrap_or(("", head));
            std::fs::read_dir(base.join(dir)).is_ok_and(|entries| {
                entries.flatten().any(|e| {
                    let name = e.file_name().to_string_lossy().into_owned();
                    name.starts_with(prefix) && name.ends_with(tail) && name.len() >= prefix.len() + tail.len()
                })
            })
        }
    }
}

/// Words of prose that read as paths and are not (`publisher/subscriber`).
const NOT_PATHS: &[&str] = &["publisher/subscriber"];

#[test]
fn every_path_named_exists() {
    let root = root();
    let mut missing = Vec::new();
    let mut missing_own = Vec::new();
    let mut seen = 0;
    let mut check = |at: String, base: &Path, text: &str| {
        for path in project_paths_in(text) {
            if NOT_PATHS.contains(&path.as_str()) {
                continue;
            }
            seen += 1;
            if !exists(base, &path) && !exists(&root, &path) {
                missing.push(format!("{at}: {path}"));
            }
        }
    };
    for (document, text) in documents() {
        for (i, line) in text.lines().enumerate() {
            check(format!("{document}:{}", i + 1), &root, line);
        }
    }
    for path in example_configs() {
        for (i, line) in read(&path).lines().enumerate() {
            check(format!("{}:{}", path.display(), i + 1), &root, line);
        }
    }
    // The manifests' comments, whose paths may be the crate's own (`tests/it/nats.rs`).
    let mut manifests = vec![root.join("Cargo.toml"), root.join("python/Cargo.toml")];
    for dir in ["proto", "client", "publisher", "subscriber", "bench", "harness", "fuzz", "buildinfo", "telemetry"] {
        manifests.push(root.join(dir).join("Cargo.toml"));
    }
    for manifest in manifests {
        let base = manifest.parent().unwrap().to_path_buf();
        for (i, line) in read(&manifest).lines().enumerate() {
            let Some((_, comment)) = line.split_once('#') else { continue };
            check(format!("{}:{}", manifest.display(), i + 1), &base, comment);
            // A crate's own paths: `tests/...`, `src/...`, `examples/...`, `benches/...`.
            for word in comment.split(|c: char| c.is_whitespace() || "(),;:`".contains(c)) {
                let word = word.trim_end_matches('.');
                if ["tests/", "src/", "examples/", "benches/"].iter().any(|p| word.starts_with(p))
                    && !exists(&base, word)
                {
                    missing_own.push(format!("{}:{}: {word}", manifest.display(), i + 1));
                }
            }
        }
    }
    assert!(seen >= 100, "only {seen} paths found: the extraction has broken");
    missing.extend(missing_own);
    assert!(missing.is_empty(), "paths named that do not exist:\n{}", missing.join("\n"));
}

/// A section of the README from its heading to the next heading of the same or a higher level.
fn readme_section(heading: &str) -> String {
    let readme = read(&root().join("README.md"));
    let start = readme.find(&format!("\n{heading}\n")).unwrap_or_else(|| panic!("the README has {heading:?}"));
    let level = heading.split(' ').next().unwrap();
    let body = &readme[start + heading.len() + 2..];
    let end = body
        .match_indices("\n#")
        .find(|(at, _)| {
            let hashes = body[at + 1..].chars().take_while(|c| *c == '#').count();
            hashes <= level.len()
        })
        .map_or(body.len(), |(at, _)| at);
    body[..end].to_string()
}

/// The rows of the markdown tables of a text, split into cells (`\|` is a `|` within a cell).
fn table_rows(text: &str) -> Vec<Vec<String>> {
    text.lines()
        .filter(|l| l.starts_with('|') && !l.starts_with("|---"))
        .map(|l| {
            let cells = l.replace("\\|", "\u{1}");
            cells.trim_matches('|').split('|').map(|c| c.replace('\u{1}', "|").trim().to_string()).collect()
        })
        .collect()
}

/// The keys a reference row's first cell names, as (section, key): `[pacing] speed / rate`,
/// `format`, (`[metrics] listen`, `hold`); a section alone (`[nats]`) is (section, "").
fn keys_in(cell: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut section = String::new();
    for (i, span) in cell.split('`').enumerate() {
        if i % 2 == 0 || span.starts_with('-') {
            continue;
        }
        if let Some(rest) = span.strip_prefix('[') {
            let (name, keys) = rest.split_once(']').unwrap_or_else(|| panic!("a section in {cell}"));
            section = name.to_string();
            let keys: Vec<&str> = keys.split('/').map(str::trim).filter(|k| !k.is_empty()).collect();
            if keys.is_empty() {
                out.push((section.clone(), String::new()));
            }
            out.extend(keys.into_iter().map(|k| (section.clone(), k.to_string())));
        } else if span.chars().all(|c| c.is_ascii_lowercase() || c == '_') {
            out.push((section.clone(), span.to_string()));
        }
    }
    out
}

/// Whether the program's configuration file takes `key` in `section`: a file giving it a value
/// no setting takes must fail on the value, not as an unknown field (a section alone: a key
/// of no section must fail as unknown within it).
fn takes_key(program: &str, dir: &Path, section: &str, key: &str) -> Result<(), String> {
    let (probe, value) = if key.is_empty() { ("no_such_key", "1") } else { (key, "[[1]]") };
    let text =
        if section.is_empty() { format!("{probe} = {value}\n") } else { format!("[{section}]\n{probe} = {value}\n") };
    let path = dir.join(format!("{}-{section}-{probe}.toml", program));
    std::fs::write(&path, &text).unwrap();
    let path = path.to_string_lossy().into_owned();
    let mut args = if program == "mdrelay-pub" { vec!["run".to_string()] } else { vec![] };
    args.extend(["--config".to_string(), path, "--check".to_string()]);
    let done = run_in_root(program, &args);
    let unknown = |name: &str| done.stderr.contains(&format!("unknown field `{name}`"));
    let known = done.code() == Some(2)
        && if key.is_empty() { unknown(probe) && !unknown(section.rsplit('.').next().unwrap()) } else { !unknown(key) };
    if known { Ok(()) } else { Err(format!("{text}-> {done:?}")) }
}

#[test]
fn the_command_reference_names_the_programs_flags_and_keys() {
    let _shared = shared();
    let dir = tempfile::tempdir().unwrap();
    let pub_help = help("mdrelay-pub", Some("run")) + &help("mdrelay-pub", None);
    let sub_help = help("mdrelay-sub", None);
    let mut counts = Vec::new();
    for (heading, program, help) in [
        ("### `mdrelay-pub run`: the relay", "mdrelay-pub", &pub_help),
        ("### `mdrelay-sub`", "mdrelay-sub", &sub_help),
    ] {
        let rows = table_rows(&readme_section(heading));
        let (mut flags, mut keys) = (0, 0);
        for row in rows.iter().skip(1) {
            let row_text = row.join(" | ");
            // Flags are in code spans; a span naming the publisher's command (`run --capture`,
            // in the subscriber's table) is checked against the publisher's.
            for span in row_text.split('`').skip(1).step_by(2) {
                let (owner, owner_help) = if span.starts_with("run ") || span.starts_with("mdrelay-pub ") {
                    ("mdrelay-pub", &pub_help)
                } else {
                    (program, help)
                };
                for flag in flags_in(span) {
                    assert!(help_lists(owner_help, &flag), "{heading}: {owner} --help lists no {flag}: | {row_text} |");
                    flags += 1;
                }
            }
            for (section, key) in keys_in(&row[0]) {
                takes_key(program, dir.path(), &section, &key)
                    .unwrap_or_else(|e| panic!("{heading}: {program} takes no [{section}] {key:?}: {e}"));
                keys += 1;
            }
        }
        counts.push((program, flags, keys));
    }
    // Both tables, whole: every setting of each program has a row.
    for (program, flags, keys) in counts {
        assert!(
            flags >= 40 && keys >= 30,
            "{program}: {flags} flags and {keys} keys found: the table or its parsing broke"
        );
    }
}

#[test]
fn the_readme_lists_every_client_error_kind() {
    let source = read(&root().join("client/src/error.rs"));
    let body = source.split("pub enum ErrorKind {").nth(1).expect("client/src/error.rs defines ErrorKind");
    let body = &body[..body.find("\n}").unwrap()];
    let variants: Vec<&str> = body
        .lines()
        .map(str::trim)
        .filter(|l| !l.starts_with("//") && !l.starts_with('#') && !l.is_empty())
        .map(|l| l.trim_end_matches(','))
        .collect();
    assert!(variants.len() >= 11, "{variants:?}");
    let readme = read(&root().join("README.md"));
    let section = &readme[readme.find("## In your own program").expect("the client's section")..];
    for variant in variants {
        assert!(section.contains(&format!("`{variant}`")), "the README's client section lists no ErrorKind::{variant}");
    }
}

/// The README's Rust example, as a function of the address it connects to: the body between the
/// markers is the README's block with `address` for its `"127.0.0.1:9100"`, and the README's `?`
/// returns the client's error.
fn readme_example(address: &str) -> Result<(), mdrelay_client::Error> {
    // readme-example:begin
    let mut subscriber = mdrelay_client::Builder::tcp(address).symbols(["AAPL"]).build()?;
    while let Some(event) = subscriber.next_event()? {
        if let mdrelay_client::Event::Frame(frame) = event {
            for message in frame.messages() {
                println!("{} {message:?}", frame.sequence());
            }
        }
    }
    // readme-example:end
    Ok(())
}

#[test]
fn the_readme_rust_example_is_this_one_and_runs() {
    let readme = read(&root().join("README.md"));
    let block = blocks()
        .into_iter()
        .filter(|b| b.info == "rust")
        .map(|b| b.lines.iter().map(|(_, l)| l.trim().to_string()).collect::<Vec<_>>())
        .collect::<Vec<_>>();
    assert_eq!(block.len(), 1, "the docs' Rust blocks: each must be a function here");
    let this = read(&PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/it/readme.rs"));
    let begin = this.find("// readme-example:begin\n").unwrap() + "// readme-example:begin\n".len();
    let end = this.find("    // readme-example:end").unwrap();
    let here: Vec<String> = this[begin..end]
        .lines()
        .map(|l| l.trim().replace("Builder::tcp(address)", "Builder::tcp(\"127.0.0.1:9100\")"))
        .collect();
    assert_eq!(block[0], here, "README.md's Rust example differs from readme_example here");
    assert!(readme.contains("Builder::tcp(\"127.0.0.1:9100\")"));

    // It runs: a publisher's short synthetic day, received to its end.
    let _shared = shared();
    let mut publisher = Process::start(
        publisher_bin(),
        ["run", "--tcp", "127.0.0.1:0", "--synthetic-messages", "20000", "--wait-subscribers", "1"],
    );
    let address = publisher.serving_on().to_string();
    readme_example(&address).expect("the README's example receives the whole stream");
    publisher.finish(STEP).assert_success();
}

/// A network namespace of its own with its loopback up, held by a process until dropped.
struct Namespace(Process);

impl Namespace {
    fn new() -> Namespace {
        let mut command = Command::new("unshare");
        command.args(["--net", "bash", "-c", "ip link set lo up && echo ready >&2 && exec sleep 600"]);
        let mut holder = Process::spawn_command("netns", command).expect("unshare (util-linux)");
        holder.wait_for("ready");
        Namespace(holder)
    }

    /// Runs a README command with bash in `work`, inside the namespace.
    fn run(&self, work: &Path, command: &str) -> Process {
        let mut nsenter = Command::new("nsenter");
        nsenter.args(["--net", &format!("--target={}", self.0.pid()), "--", "bash", "-c", command]).current_dir(work);
        Process::spawn_command(command, nsenter).unwrap_or_else(|e| panic!("{command}: {e}"))
    }
}

impl Drop for Namespace {
    fn drop(&mut self) {
        self.0.signal(mdrelay_harness::Signal::SIGKILL);
    }
}

#[test]
#[ignore = "long (over 3 s here): .ci/run runs it with --ignored"]
fn the_two_terminal_walkthrough_runs_as_written() {
    let _shared = shared();
    let section = readme_section("## Two terminals on one host");
    let commands: Vec<String> = shell_commands()
        .into_iter()
        .filter(|(at, _)| at.starts_with("README.md:"))
        .map(|(_, c)| c)
        .filter(|c| section.contains(c.as_str()))
        .collect();
    let Some([publisher_step, subscriber_step, reload_step]) = commands.get(..3) else {
        panic!("the section's first steps: publisher, subscriber, SIGHUP: {commands:?}")
    };
    // The README's edit: `format = "sbe"` to "capnp" in the publisher's file.
    assert!(section.contains("edit `format = \"sbe\"` in `config/loopback-tcp.toml` to\n`\"capnp\"`"), "{section}");

    // A project tree of its own: the examples copied (the step edits one), the binaries this
    // build's at the paths the README names.
    let work = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(work.path().join("config")).unwrap();
    std::fs::create_dir_all(work.path().join("target/release")).unwrap();
    for path in example_configs() {
        std::fs::copy(&path, work.path().join("config").join(path.file_name().unwrap())).unwrap();
    }
    std::os::unix::fs::symlink(publisher_bin(), work.path().join("target/release/mdrelay-pub")).unwrap();
    std::os::unix::fs::symlink(subscriber_bin(), work.path().join("target/release/mdrelay-sub")).unwrap();
    let netns = Namespace::new();

    let mut publisher = netns.run(work.path(), publisher_step);
    publisher.wait_for("serving subscribers over TCP");
    let mut subscriber = netns.run(work.path(), subscriber_step);
    subscriber.wait_for("connected");
    publisher.wait_for("subscriber admitted");
    let file = work.path().join("config/loopback-tcp.toml");
    let text = read(&file);
    assert!(text.contains("format = \"sbe\""), "{text}");
    std::fs::write(&file, text.replacen("format = \"sbe\"", "format = \"capnp\"", 1)).unwrap();
    let reload = netns.run(work.path(), reload_step).finish(STEP);
    assert_eq!(reload.code(), Some(0), "{reload_step}: {reload:?}");
    publisher.wait_for("SIGHUP: format changes at the next frame");

    let publisher = publisher.finish(Duration::from_secs(120));
    assert_eq!(publisher.code(), Some(0), "{publisher:?}");
    assert!(publisher.stdout.contains("final format capnp"), "{publisher:?}");
    let subscriber = subscriber.finish(STEP);
    assert_eq!(subscriber.code(), Some(0), "{subscriber:?}");
    let report: serde_json::Value = serde_json::from_str(&read(&work.path().join("sub-loopback-tcp.json"))).unwrap();
    assert_eq!(report["totals_match"], true, "{report}");
    assert_eq!(report["gaps"], 0, "{report}");
    assert_eq!(report["format_switches"], 1, "{report}");
    assert_eq!(report["formats_seen"], serde_json::json!(["sbe", "capnp"]), "{report}");
}

/// The `.rs` files under `dir`, recursively (no `target/`).
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        if path.is_dir() && path.file_name().is_some_and(|n| n != "target") {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|x| x == "rs") {
            out.push(path);
        }
    }
}

#[test]
fn the_readme_counts_the_long_tests() {
    let readme = read(&root().join("README.md")).split_whitespace().collect::<Vec<_>>().join(" ");
    let (before, _) = readme.split_once(" tests that take more than 3 seconds here").expect("the README counts them");
    let said: usize = before.rsplit(' ').next().unwrap().parse().expect("a number of tests");
    let mut files = Vec::new();
    // Every member of the workspace, as its Cargo.toml lists them.
    let manifest: toml::Table = toml::from_str(&read(&root().join("Cargo.toml"))).expect("the workspace's Cargo.toml");
    for crate_dir in manifest["workspace"]["members"].as_array().expect("members") {
        rust_files(&root().join(crate_dir.as_str().expect("a member's folder")), &mut files);
    }
    let marker = concat!("#[ignore = \"", "long");
    let counted: usize = files.iter().map(|f| read(f).matches(marker).count()).sum();
    assert_eq!(said, counted, "the README's count of long tests (`{marker}`) against the sources");
}
