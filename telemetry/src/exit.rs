//! The exit statuses of `mdrelay-pub` and `mdrelay-sub`, defined once: both programs end through
//! [`ExitStatus`], their `--help` prints [`help`], docs/operations.md has the same table, and
//! the systemd units keep the statuses a restart would not mend ([`ExitStatus::restart_mends`])
//! from restarting the service. A test holds the three to one another.
//!
//! An error carries its status with it ([`WithExitStatus::exit_status`]): the place that knows
//! what went wrong (reading the configuration, a peer's refusal) says so, and `main` reads it
//! back with [`ExitStatus::of`]. An error that carries none is a run-time failure (1).

use std::fmt;

/// How a run ended, as the process's exit status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExitStatus {
    /// 0: the run ended as asked.
    Success,
    /// 1: something failed at run time; a restart may mend it.
    Failure,
    /// 2: the configuration or the command line is wrong; a restart would not mend it.
    Config,
    /// 3: the peer refused this program, or speaks another protocol; a restart would not mend it.
    Refused,
    /// 4: a relay's upstream publisher was lost for good; a restart reconnects.
    UpstreamLost,
    /// 5: the subscriber's stream ended (its END came) without all of it: frames missing or
    /// given up, counts that differ from the END's, or a stream cut short. Running again does
    /// not bring that stream's frames back.
    Incomplete,
    /// 130: a second SIGINT or SIGTERM stopped the publisher at once.
    Interrupted,
}

impl ExitStatus {
    /// Every status, in the order of the table.
    pub const ALL: [ExitStatus; 7] = [
        ExitStatus::Success,
        ExitStatus::Failure,
        ExitStatus::Config,
        ExitStatus::Refused,
        ExitStatus::UpstreamLost,
        ExitStatus::Incomplete,
        ExitStatus::Interrupted,
    ];

    /// The statuses `mdrelay-pub` ends with: it judges no stream it receives by its END (a
    /// relay hands its upstream's END on, with the truncation flag, to its own subscribers).
    pub const PUBLISHER: &'static [ExitStatus] = &[
        ExitStatus::Success,
        ExitStatus::Failure,
        ExitStatus::Config,
        ExitStatus::Refused,
        ExitStatus::UpstreamLost,
        ExitStatus::Interrupted,
    ];

    /// The statuses `mdrelay-sub` ends with: it has no upstream of its own, and one signal
    /// always ends it with its report.
    pub const SUBSCRIBER: &'static [ExitStatus] =
        &[ExitStatus::Success, ExitStatus::Failure, ExitStatus::Config, ExitStatus::Refused, ExitStatus::Incomplete];

    /// The exit code.
    pub const fn code(self) -> u8 {
        match self {
            ExitStatus::Success => 0,
            ExitStatus::Failure => 1,
            ExitStatus::Config => 2,
            ExitStatus::Refused => 3,
            ExitStatus::UpstreamLost => 4,
            ExitStatus::Incomplete => 5,
            ExitStatus::Interrupted => 130,
        }
    }

    /// What the status means, in one line: `--help` and the table in docs/operations.md say
    /// this.
    pub const fn meaning(self) -> &'static str {
        match self {
            ExitStatus::Success => "normal stop: the end of the stream, a limit reached, or one SIGINT or SIGTERM",
            ExitStatus::Failure => {
                "run-time failure: an address in use, a host name that does not resolve, a write that failed"
            }
            ExitStatus::Config => "configuration or usage error: the file, a setting or a flag; named in the message",
            ExitStatus::Refused => {
                "refused by the peer: another protocol version, other frame protection or key, or a refusal"
            }
            ExitStatus::UpstreamLost => {
                "upstream lost for good: a relay's upstream not reached within give_up_after, or restarted"
            }
            ExitStatus::Incomplete => {
                "stream incomplete: the END's totals were not met (frames missing or given up, counts that differ)"
            }
            ExitStatus::Interrupted => "stopped at once by a second SIGINT or SIGTERM, without the stream's END",
        }
    }

    /// Whether running the program again, unchanged, may mend what the status reports: false
    /// for a configuration error and a refusal, which would only happen again, and for an
    /// incomplete stream, which is over (running again does not bring its frames back, and
    /// would write over its report); the units therefore do not restart these.
    pub const fn restart_mends(self) -> bool {
        !matches!(self, ExitStatus::Config | ExitStatus::Refused | ExitStatus::Incomplete)
    }

    /// The status `error` carries: the outermost one given with [`WithExitStatus::exit_status`],
    /// else [`ExitStatus::Failure`].
    pub fn of(error: &anyhow::Error) -> ExitStatus {
        error.chain().find_map(|e| e.downcast_ref::<Classified>()).map_or(ExitStatus::Failure, |c| c.status)
    }
}

impl From<ExitStatus> for std::process::ExitCode {
    fn from(status: ExitStatus) -> Self {
        std::process::ExitCode::from(status.code())
    }
}

/// The "Exit status:" section of a program's `--help`, for `statuses`.
pub fn help(statuses: &[ExitStatus]) -> String {
    let mut text = String::from("Exit status:\n");
    for status in statuses {
        text.push_str(&format!("  {:<3}  {}\n", status.code(), status.meaning()));
    }
    text.push_str("(docs/operations.md: the table, and which of them systemd restarts)");
    text
}

/// An error with the status the run ends with. It shows as the error it wraps, message and
/// causes alike, so classifying an error changes nothing an operator reads.
pub struct Classified {
    status: ExitStatus,
    error: anyhow::Error,
}

impl fmt::Display for Classified {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.error, f)
    }
}

impl fmt::Debug for Classified {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.error, f)
    }
}

impl std::error::Error for Classified {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.error.source()
    }
}

/// Gives an error the status the run ends with.
pub trait WithExitStatus<T> {
    /// The error, if any, carrying `status`.
    fn exit_status(self, status: ExitStatus) -> anyhow::Result<T>;
}

impl<T, E: Into<anyhow::Error>> WithExitStatus<T> for Result<T, E> {
    fn exit_status(self, status: ExitStatus) -> anyhow::Result<T> {
        self.map_err(|error| anyhow::Error::new(Classified { status, error: error.into() }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use anyhow::Context;

    fn failing() -> anyhow::Result<()> {
        Err(anyhow::anyhow!("cannot read pub.toml")).context("in /etc/mdrelay/pub.toml")
    }

    #[test]
    fn a_status_survives_context_and_leaves_the_message_as_it_was() {
        let plain = failing().unwrap_err();
        assert_eq!(ExitStatus::of(&plain), ExitStatus::Failure);
        let classified = failing().exit_status(ExitStatus::Config).unwrap_err();
        assert_eq!(ExitStatus::of(&classified), ExitStatus::Config);
        assert_eq!(format!("{classified:#}"), format!("{plain:#}"));
        assert_eq!(classified.to_string(), plain.to_string());
        let wrapped = Err::<(), _>(classified).context("starting the relay").unwrap_err();
        assert_eq!(ExitStatus::of(&wrapped), ExitStatus::Config);
        assert_eq!(format!("{wrapped:#}"), "starting the relay: in /etc/mdrelay/pub.toml: cannot read pub.toml");
        // The outermost status is the one that counts.
        let again = Err::<(), _>(wrapped).exit_status(ExitStatus::Refused).unwrap_err();
        assert_eq!(ExitStatus::of(&again), ExitStatus::Refused);
    }

    #[test]
    fn codes_are_distinct_and_help_lists_each_once() {
        let mut codes: Vec<u8> = ExitStatus::ALL.iter().map(|s| s.code()).collect();
        codes.dedup();
        assert_eq!(codes.len(), ExitStatus::ALL.len());
        let help = help(ExitStatus::SUBSCRIBER);
        for status in ExitStatus::SUBSCRIBER {
            assert!(help.contains(&format!("  {:<3}  {}", status.code(), status.meaning())), "{help}");
        }
        assert!(!help.contains("130"), "{help}");
    }

    /// docs/operations.md has the table, the units restart exactly what a restart may mend, and
    /// the README's sentence agrees.
    #[test]
    fn the_docs_and_the_units_agree_with_the_table() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let read = |path: &str| std::fs::read_to_string(root.join(path)).unwrap_or_else(|e| panic!("{path}: {e}"));
        let operations = read("docs/operations.md");
        for status in ExitStatus::ALL {
            let row = format!("| {} | {} |", status.code(), status.meaning());
            assert!(operations.lines().any(|l| l.starts_with(&row)), "docs/operations.md lacks the row {row}");
        }
        let kept: Vec<String> =
            ExitStatus::ALL.iter().filter(|s| !s.restart_mends()).map(|s| s.code().to_string()).collect();
        for unit in ["deploy/systemd/mdrelay-pub.service", "deploy/systemd/mdrelay-sub@.service"] {
            let text = read(unit);
            let line = text
                .lines()
                .find_map(|l| l.strip_prefix("RestartPreventExitStatus="))
                .unwrap_or_else(|| panic!("{unit}: no RestartPreventExitStatus"));
            assert_eq!(line.split_whitespace().collect::<Vec<_>>(), kept, "{unit}");
        }
        let readme = read("README.md").split_whitespace().collect::<Vec<_>>().join(" ");
        for status in ExitStatus::ALL {
            let phrase = format!("{} {}", status.code(), status.meaning().split(':').next().unwrap());
            assert!(readme.contains(&phrase), "README.md lacks {phrase:?}");
        }
    }
}
