//! `leasehold completions` and `leasehold man`: shell completion scripts and manual pages,
//! generated from the command definition itself, so they always list the flags this binary has.

use std::path::PathBuf;

use anyhow::Context;
use clap::{Args, ValueEnum};

use crate::failure::Failure;
use crate::output;

/// The shells `leasehold completions` writes a script for.
#[derive(Clone, Copy, ValueEnum)]
pub enum CompletionShell {
    Bash,
    Zsh,
    Fish,
}

#[derive(Args)]
pub struct CompletionsArgs {
    /// The shell to complete for.
    shell: CompletionShell,
}

#[derive(Args)]
pub struct ManArgs {
    /// Write a page for every command into this directory (leasehold.1, leasehold-run.1, ...)
    /// instead of printing leasehold(1).
    #[arg(long)]
    dir: Option<PathBuf>,
}

/// Prints the completion script for `args.shell` of `command`.
pub fn completions(args: CompletionsArgs, command: clap::Command) -> Result<u8, Failure> {
    let shell = match args.shell {
        CompletionShell::Bash => clap_complete::Shell::Bash,
        CompletionShell::Zsh => clap_complete::Shell::Zsh,
        CompletionShell::Fish => clap_complete::Shell::Fish,
    };
    let name = command.get_name().to_owned();
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut visible(command), name, &mut script);
    output::raw(&script)?;
    Ok(0)
}

/// Prints leasehold(1), or writes every command's page into `args.dir`.
pub fn man(args: ManArgs, command: clap::Command) -> Result<u8, Failure> {
    match args.dir {
        Some(dir) => {
            std::fs::create_dir_all(&dir)
                .and_then(|()| clap_mangen::generate_to(command, &dir))
                .with_context(|| format!("cannot write the manual pages into {}", dir.display()))?;
        }
        None => {
            let mut page = Vec::new();
            clap_mangen::Man::new(command)
                .render(&mut page)
                .context("cannot render the manual page")?;
            output::raw(&page)?;
        }
    }
    Ok(0)
}

/// `command` without its hidden subcommands (the internal `witness` and `supervise`), which
/// clap_complete would otherwise offer. The top level has no arguments of its own beyond
/// --help and --version, which clap adds again.
fn visible(command: clap::Command) -> clap::Command {
    let shown: Vec<clap::Command> = command
        .get_subcommands()
        .filter(|c| !c.is_hide_set())
        .cloned()
        .collect();
    let mut kept = clap::Command::new(command.get_name().to_owned())
        .subcommand_required(true)
        .subcommands(shown);
    if let Some(version) = command.get_version() {
        kept = kept.version(version.to_owned());
    }
    if let Some(about) = command.get_about() {
        kept = kept.about(about.clone());
    }
    kept
}
