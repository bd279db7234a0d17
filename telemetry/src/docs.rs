//! Shell completions and man pages, generated from the programs' own clap definitions, so they
//! can never list a flag the program does not take (or miss one it does).
//!
//! Both programs take the same two flags:
//! - `--generate-completions SHELL`: the completion script for bash, zsh, fish, elvish or
//!   PowerShell, on standard output;
//! - `--generate-man DIR`: roff man pages in DIR, one for the program and one per subcommand
//!   (`mdrelay-pub.1`, `mdrelay-pub-run.1`, ...), each with the sections clap_mangen writes, then
//!   ENVIRONMENT (every variable a flag reads, and the program's others) and EXIT STATUS (the
//!   program's statuses, from [`crate::exit`]).

use crate::exit::ExitStatus;
use anyhow::{Context, Result};
use clap_complete::Shell;
use roff::{Roff, bold, roman};
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
    /// Print the reference of every setting's flag and variable, as docs/operations.md has it
    /// (Markdown), and exit.
    #[arg(long, hide = true)]
    pub generate_settings_reference: bool,
}

impl DocArgs {
    /// Whether a documentation flag was given, so the program generates instead of running.
    pub fn requested(&self) -> bool {
        self.generate_completions.is_some() || self.generate_man.is_some() || self.generate_settings_reference
    }

    /// Writes what was asked for: completions to `out`, man pages into their directory. The
    /// pages' ENVIRONMENT section lists the variables the flags read and `environment` (the
    /// program's others: name, what it sets); EXIT STATUS lists `statuses`.
    pub fn generate(
        &self,
        mut command: clap::Command,
        statuses: &[ExitStatus],
        environment: &[(&str, &str)],
        out: &mut dyn Write,
    ) -> Result<()> {
        let name = command.get_name().to_string();
        if let Some(shell) = self.generate_completions {
            clap_complete::generate(shell, &mut command, name.clone(), out);
        }
        if self.generate_settings_reference {
            let mut command = command.clone();
            command.build();
            out.write_all(settings_reference(&command).as_bytes())?;
        }
        if let Some(dir) = &self.generate_man {
            if !dir.is_dir() {
                // An install step names the system's man directory; a missing one is a typo.
                anyhow::bail!("--generate-man: {} is not a directory", dir.display());
            }
            // Built as clap_mangen::generate_to builds it: with the help subcommand disabled,
            // so that `help` gets no page of its own.
            let mut command = command.disable_help_subcommand(true);
            command.build();
            let extra = Extra { statuses, environment };
            write_man_pages(&command, dir, &extra)
                .with_context(|| format!("--generate-man: cannot write the man pages into {}", dir.display()))?;
        }
        Ok(())
    }
}

/// The variables both programs read besides their flags': the log filter's.
pub const LOG_ENVIRONMENT: [(&str, &str); 2] = [
    (
        crate::logs::LOG_ENV,
        "The log filter when --log-level is not given (e.g. info, or warn,mdrelay_publisher=debug).",
    ),
    ("RUST_LOG", "The log filter when neither --log-level nor MDRELAY_LOG is given."),
];

/// The settings of `command` and of its subcommands (those of their flags that an environment
/// variable can give too) as Markdown tables, one per `--help` heading.
fn settings_reference(command: &clap::Command) -> String {
    let mut out = String::new();
    let mut commands = vec![command];
    commands.extend(command.get_subcommands().filter(|s| !s.is_hide_set()));
    for command in commands {
        let settings: Vec<&clap::Arg> =
            command.get_arguments().filter(|a| !a.is_hide_set() && a.get_env().is_some()).collect();
        let mut headings: Vec<Option<&str>> = Vec::new();
        for arg in &settings {
            if !headings.contains(&arg.get_help_heading()) {
                headings.push(arg.get_help_heading());
            }
        }
        for heading in headings {
            let name = command.get_bin_name().unwrap_or(command.get_name());
            out.push_str(&format!("\n#### `{name}`: {}\n\n", heading.unwrap_or("Options")));
            out.push_str("| Flag | Variable | Sets |\n|---|---|---|\n");
            for arg in settings.iter().filter(|a| a.get_help_heading() == heading) {
                let Some(long) = arg.get_long() else { continue };
                let value = match arg.get_value_names() {
                    Some(names) if arg.get_num_args().is_none_or(|n| n.takes_values()) => {
                        names.iter().map(|n| format!(" <{n}>")).collect::<String>()
                    }
                    _ => String::new(),
                };
                let env = arg.get_env().map(|e| e.to_string_lossy().into_owned()).unwrap_or_default();
                let help = arg.get_help().map(|h| h.to_string()).unwrap_or_default();
                let help = help.replace('|', "\\|").replace('\n', " ");
                out.push_str(&format!("| `--{long}{value}` | `{env}` | {help} |\n"));
            }
        }
    }
    out
}

/// The sections mdrelay adds to clap_mangen's.
struct Extra<'a> {
    statuses: &'a [ExitStatus],
    environment: &'a [(&'a str, &'a str)],
}

/// Writes the man page of `command` and of each of its subcommands into `dir`.
fn write_man_pages(command: &clap::Command, dir: &Path, extra: &Extra<'_>) -> std::io::Result<()> {
    for sub in command.get_subcommands().filter(|s| !s.is_hide_set()) {
        write_man_pages(sub, dir, extra)?;
    }
    let man = clap_mangen::Man::new(command.clone());
    let mut page = Vec::new();
    man.render_title(&mut page)?;
    man.render_name_section(&mut page)?;
    man.render_synopsis_section(&mut page)?;
    man.render_description_section(&mut page)?;
    if command.get_arguments().any(|a| !a.is_hide_set()) {
        man.render_options_section(&mut page)?;
    }
    if command.get_subcommands().any(|s| !s.is_hide_set()) {
        man.render_subcommands_section(&mut page)?;
    }
    // The after-help text is the exit statuses' table, which EXIT STATUS gives as a section.
    page.extend_from_slice(environment_section(command, extra.environment).render().as_bytes());
    page.extend_from_slice(exit_status_section(extra.statuses).render().as_bytes());
    if command.get_version().is_some() || command.get_long_version().is_some() {
        man.render_version_section(&mut page)?;
    }
    std::fs::write(dir.join(man.get_filename()), page)
}

/// ENVIRONMENT: each variable a flag reads (`MDRELAY_SUB_CONNECT`: as `--connect`), then the
/// program's others.
fn environment_section(command: &clap::Command, others: &[(&str, &str)]) -> Roff {
    let mut roff = Roff::new();
    roff.control("SH", ["ENVIRONMENT"]);
    if command.get_arguments().any(|a| a.get_env().is_some()) {
        roff.text([roman("Each flag below may be given as its variable instead; a flag on the command line wins.")]);
    }
    for arg in command.get_arguments().filter(|a| !a.is_hide_set()) {
        let (Some(env), Some(long)) = (arg.get_env(), arg.get_long()) else { continue };
        let help = arg.get_help().map(|h| h.to_string()).unwrap_or_default();
        roff.control("TP", []);
        roff.text([bold(env.to_string_lossy().into_owned())]);
        roff.text([roman(format!("As --{long}: {help}"))]);
    }
    for (name, what) in others {
        roff.control("TP", []);
        roff.text([bold(*name)]);
        roff.text([roman(*what)]);
    }
    roff
}

/// EXIT STATUS: the program's statuses and what each means.
fn exit_status_section(statuses: &[ExitStatus]) -> Roff {
    let mut roff = Roff::new();
    roff.control("SH", ["EXIT STATUS"]);
    for status in statuses {
        roff.control("TP", []);
        roff.text([bold(status.code().to_string())]);
        roff.text([roman(status.meaning())]);
    }
    roff
}
