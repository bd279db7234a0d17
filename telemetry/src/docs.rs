//! Shell completions and man pages, generated from the programs' own clap definitions, so they
//! can never list a flag the program does not take (or miss one it does).
//!
//! Both programs take the same two flags:
//! - `--generate-completions SHELL`: the completion script for bash, zsh, fish, elvish or
//!   PowerShell, on standard output;
//! - `--generate-man DIR`: roff man pages in DIR, one for the program and one per subcommand
//!   (`mdrelay-pub.1`, `mdrelay-pub-run.1`, ...).

use anyhow::{Context, Result};
use clap_complete::Shell;
use std::io::Write;
use std::path::{Path, PathBuf};

/// The documentation flags both programs take.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct DocArgs {
    /// Print the shell completion script for SHELL (bash, zsh, fish, elvish, powershell) and exit.
    #[arg(long, value_name = "SHELL", value_enum)]
    pub generate_completions: Option<Shell>,
    /// Write the man pages (the program's and one per subcommand) into DIR and exit.
    #[arg(long, value_name = "DIR")]
    pub generate_man: Option<PathBuf>,
}

impl DocArgs {
    /// Whether a documentation flag was given, so the program generates instead of running.
    pub fn requested(&self) -> bool {
        self.generate_completions.is_some() || self.generate_man.is_some()
    }

    /// Writes what was asked for: completions to `out`, man pages into their directory.
    pub fn generate(&self, mut command: clap::Command, out: &mut dyn Write) -> Result<()> {
        let name = command.get_name().to_string();
        if let Some(shell) = self.generate_completions {
            clap_complete::generate(shell, &mut command, name.clone(), out);
        }
        if let Some(dir) = &self.generate_man {
            write_man_pages(command, dir)?;
        }
        Ok(())
    }
}

/// Writes the man pages of `command` and of each of its subcommands into `dir`, which must exist
/// (an install step names the system's man directory; a missing one is a typo, not a request).
fn write_man_pages(command: clap::Command, dir: &Path) -> Result<()> {
    if !dir.is_dir() {
        anyhow::bail!("--generate-man: {} is not a directory", dir.display());
    }
    // Not built first: generate_to builds it with the help subcommand disabled, which a build
    // beforehand would defeat (a page per `help` pseudo-subcommand).
    clap_mangen::generate_to(command, dir)
        .with_context(|| format!("--generate-man: cannot write the man pages into {}", dir.display()))
}
