//! Reading a configuration file, the same way in both programs: bounded to
//! [`MAX_CONFIG_BYTES`] whatever the path is (a huge file, `/dev/zero`, a pipe that never ends),
//! checked as what was opened (fstat, not a second look by path), and with errors that name the
//! file and what was wrong with it. A reload (the publisher's SIGHUP) also refuses anything but
//! a regular file, without waiting for it.

use anyhow::{Context, Result, bail};
use std::fs::FileType;
use std::io::Read;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::Path;

/// The largest configuration file read, in bytes: a configuration takes a few KiB, so a file
/// past this is the wrong file, and is refused before it is read.
pub const MAX_CONFIG_BYTES: u64 = 1 << 20;

/// When a configuration file is read, which decides what it may be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reading {
    /// At start: any file that reads, a pipe (`--config <(...)`) included. No signal handler is
    /// installed yet, so a signal still ends a wait for a pipe's writer.
    AtStart,
    /// On SIGHUP: a regular file only (a symlink to one is followed), opened without waiting
    /// for a FIFO's writer, so a reload never waits on something that is not a file.
    Reload,
}

/// The text of the configuration file `path`: at most [`MAX_CONFIG_BYTES`], UTF-8. A directory
/// is refused; on reload, anything fstat does not call a regular file is.
pub fn read_text(path: &Path, reading: Reading) -> Result<String> {
    let name = path.display();
    let mut options = std::fs::OpenOptions::new();
    options.read(true);
    if reading == Reading::Reload {
        // Opening a FIFO for reading waits for a writer, unless non-blocking; reads of a regular
        // file ignore the flag.
        options.custom_flags(nix::fcntl::OFlag::O_NONBLOCK.bits());
    }
    let file = options.open(path).map_err(|error| {
        // A socket cannot be opened at all: say what it is rather than "no such device".
        match std::fs::metadata(path) {
            Ok(metadata) if metadata.file_type().is_socket() => anyhow::anyhow!("{name} is a socket, not a file"),
            _ => anyhow::Error::new(error).context(format!("cannot read {name}")),
        }
    })?;
    // fstat of what was opened: a file swapped in after a check by path cannot slip through.
    let metadata = file.metadata().with_context(|| format!("cannot read {name}"))?;
    let kind = metadata.file_type();
    if reading == Reading::Reload && !kind.is_file() {
        bail!(
            "{name} is not a regular file ({}): a reload reads only a regular file, or a symlink to one",
            kind_name(kind)
        );
    }
    if kind.is_dir() {
        bail!("{name} is a directory, not a configuration file");
    }
    if kind.is_file() && metadata.len() > MAX_CONFIG_BYTES {
        bail!("{name} is {} bytes, more than a configuration file may be ({MAX_CONFIG_BYTES} bytes)", metadata.len());
    }
    // Bounded again while reading: a pipe or a device has no size, and a file may grow.
    let mut bytes = Vec::new();
    file.take(MAX_CONFIG_BYTES + 1).read_to_end(&mut bytes).with_context(|| format!("cannot read {name}"))?;
    if bytes.len() as u64 > MAX_CONFIG_BYTES {
        bail!("{name} holds more than a configuration file may ({MAX_CONFIG_BYTES} bytes)");
    }
    String::from_utf8(bytes)
        .map_err(|e| anyhow::anyhow!("{name}: not UTF-8 text (byte {} is not)", e.utf8_error().valid_up_to()))
}

/// What a file that is not a regular file is, for a message refusing it: "a FIFO", "a socket".
pub fn kind_name(kind: FileType) -> &'static str {
    /// Whether a file type is of one kind.
    type IsKind = fn(&FileType) -> bool;
    const KINDS: [(IsKind, &str); 7] = [
        (FileType::is_file, "a regular file"),
        (FileType::is_dir, "a directory"),
        (FileType::is_symlink, "a symbolic link"),
        (FileType::is_fifo, "a FIFO"),
        (FileType::is_socket, "a socket"),
        (FileType::is_char_device, "a character device"),
        (FileType::is_block_device, "a block device"),
    ];
    KINDS.iter().find(|(is, _)| is(&kind)).map_or("not a file", |&(_, name)| name)
}

/// toml's message for a file that does not parse; for an unknown key, with the known key
/// nearest to it ("did you mean `rate`?"), as clap answers an unknown flag.
pub fn toml_error_message(error: &toml::de::Error) -> String {
    let message = error.to_string().trim_end().to_string();
    match did_you_mean(error.message()) {
        Some(near) => format!("{message}\ndid you mean `{near}`?"),
        None => message,
    }
}

/// The known key nearest to the unknown one in serde's "unknown field `x`, expected one of `a`,
/// `b`" (or "expected `a` or `b`"), when one is near enough (see [`nearest`]).
pub(crate) fn did_you_mean(message: &str) -> Option<&str> {
    let rest = message.strip_prefix("unknown field `")?;
    let (unknown, rest) = rest.split_once('`')?;
    let (_, expected) = rest.split_once("expected")?;
    nearest(unknown, expected.split('`').skip(1).step_by(2))
}

/// The name of `known` nearest to `unknown`, when one is near enough: Jaro-Winkler similarity
/// over 0.8, which clap's threshold (0.7) would let through typos of short keys that are other
/// words.
pub fn nearest<'a>(unknown: &str, known: impl Iterator<Item = &'a str>) -> Option<&'a str> {
    known
        .map(|known| (strsim::jaro_winkler(unknown, known), known))
        .filter(|(similarity, _)| *similarity > 0.8)
        .max_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(_, known)| known)
}

#[cfg(test)]
mod tests {
    #[test]
    fn an_unknown_key_is_answered_with_the_nearest_known_one() {
        #[derive(serde::Deserialize, Debug)]
        #[serde(deny_unknown_fields)]
        #[allow(dead_code)] // Read by serde only.
        struct Pacing {
            mode: Option<String>,
            rate: Option<u32>,
            speed: Option<f64>,
        }
        let near = toml::from_str::<Pacing>("mode = \"rate\"\nrtae = 5\n").unwrap_err();
        let message = toml_error_message(&near);
        assert!(message.contains("line 2") && message.ends_with("did you mean `rate`?"), "{message}");
        let far = toml::from_str::<Pacing>("colour = 5\n").unwrap_err();
        assert!(!toml_error_message(&far).contains("did you mean"), "{}", toml_error_message(&far));
        assert_eq!(did_you_mean("unknown field `sped`, expected `speed` or `rate`"), Some("speed"));
        assert_eq!(did_you_mean("invalid type: string, expected u32"), None);
    }

    use super::*;
    use std::time::Duration;

    #[test]
    fn a_file_is_read_up_to_the_bound_and_refused_past_it_naming_its_size() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("at.toml");
        std::fs::write(&path, "x".repeat(MAX_CONFIG_BYTES as usize)).unwrap();
        for reading in [Reading::AtStart, Reading::Reload] {
            assert_eq!(read_text(&path, reading).unwrap().len() as u64, MAX_CONFIG_BYTES);
        }
        let over = dir.path().join("over.toml");
        std::fs::write(&over, "x".repeat(MAX_CONFIG_BYTES as usize + 1)).unwrap();
        for reading in [Reading::AtStart, Reading::Reload] {
            let e = read_text(&over, reading).unwrap_err().to_string();
            assert_eq!(
                e,
                format!("{} is 1048577 bytes, more than a configuration file may be (1048576 bytes)", over.display())
            );
        }
    }

    #[test]
    fn a_device_without_end_is_read_only_up_to_the_bound() {
        let e = read_text(Path::new("/dev/zero"), Reading::AtStart).unwrap_err().to_string();
        assert_eq!(e, "/dev/zero holds more than a configuration file may (1048576 bytes)");
        let e = read_text(Path::new("/dev/zero"), Reading::Reload).unwrap_err().to_string();
        assert!(e.contains("is not a regular file (a character device)"), "{e}");
    }

    #[test]
    fn what_is_not_a_configuration_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let e = read_text(dir.path(), Reading::AtStart).unwrap_err().to_string();
        assert_eq!(e, format!("{} is a directory, not a configuration file", dir.path().display()));
        let e = read_text(dir.path(), Reading::Reload).unwrap_err().to_string();
        assert!(e.contains("is not a regular file (a directory)"), "{e}");
        let socket = dir.path().join("sock");
        let _listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
        let e = read_text(&socket, Reading::AtStart).unwrap_err().to_string();
        assert_eq!(e, format!("{} is a socket, not a file", socket.display()));
        let text = dir.path().join("text.toml");
        std::fs::write(&text, b"a = 1\n\xfe").unwrap();
        let e = read_text(&text, Reading::AtStart).unwrap_err().to_string();
        assert_eq!(e, format!("{}: not UTF-8 text (byte 6 is not)", text.display()));
        let e = format!("{:#}", read_text(&dir.path().join("missing"), Reading::AtStart).unwrap_err());
        assert!(e.starts_with(&format!("cannot read {}: ", dir.path().join("missing").display())), "{e}");
    }

    /// A FIFO named `name` in `dir`, made with mkfifo.
    fn make_fifo(dir: &Path, name: &str) -> std::path::PathBuf {
        let fifo = dir.join(name);
        let made = std::process::Command::new("mkfifo").arg(&fifo).status().unwrap();
        assert!(made.success());
        fifo
    }

    #[test]
    fn a_reload_refuses_a_fifo_without_waiting_for_a_writer() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = make_fifo(dir.path(), "pub.toml");
        assert!(std::fs::metadata(&fifo).unwrap().file_type().is_fifo());
        let reading = fifo.clone();
        let (done, result) = std::sync::mpsc::channel();
        std::thread::spawn(move || done.send(read_text(&reading, Reading::Reload).map_err(|e| e.to_string())));
        let outcome = result.recv_timeout(Duration::from_secs(30));
        if outcome.is_err() {
            // Still waiting in open(): a writer lets it go before the test fails.
            let _ = std::fs::OpenOptions::new().write(true).open(&fifo);
        }
        let e = outcome.expect("a reload does not wait for a FIFO's writer").unwrap_err();
        assert!(e.contains("is not a regular file (a FIFO)"), "{e}");
    }

    #[test]
    fn a_pipe_at_start_is_read_within_the_bound() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = make_fifo(dir.path(), "sub.toml");
        let writing = fifo.clone();
        let writer = std::thread::spawn(move || std::fs::write(writing, "connect = \"h:1\"\n"));
        assert_eq!(read_text(&fifo, Reading::AtStart).unwrap(), "connect = \"h:1\"\n");
        writer.join().unwrap().unwrap();
    }
}
