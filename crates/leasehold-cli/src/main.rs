//! `leasehold`: run any command as a single-active job across machines.

mod child;
mod crontab;
mod demo;
mod drain;
mod durations;
mod failure;
mod fleet;
mod generate;
mod history;
mod link;
mod logging;
mod next;
mod output;
mod policies;
mod reaper;
mod run;
mod serve;
mod service;
mod status;
mod supervise;
mod tail;
mod trim;

use std::process::ExitCode;
use std::time::Duration;

use clap::{CommandFactory, Parser, Subcommand};

use crate::durations::parse_duration;
use crate::failure::{EXIT_USAGE, Failure, exit, report, start_runtime};

/// `leasehold --version`: the release and the commit it was built from (`unknown` when the
/// source had no git metadata; see build.rs).
const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("LEASEHOLD_COMMIT"),
    ")"
);

#[derive(Parser)]
#[command(name = "leasehold", version = VERSION, about = "Run any command as a single-active job across machines", long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run COMMAND on exactly one of all instances that run the same lease: once per tick with
    /// --every/--cron, else once if the lease is free (a distributed flock; exits 75 if busy).
    Run(run::RunArgs),
    /// Without names: every task in the store's catalog (state, schedule, instances, last run,
    /// next slot), the leases and the leader groups. With names: holder, fencing token and
    /// remaining time of those leases.
    ///
    /// Exits 66 when the store does not exist (a SQLite path with no file): only run, serve
    /// and demo create one, so a mistyped path fails instead of answering from a new, empty
    /// store. Exits 78 for a file that is not a leasehold store, left as it was.
    Status(status::StatusArgs),
    /// Pause a task on every instance, from their next tick: its slots are recorded as paused
    /// and never caught up; a run already going finishes. Exits 66 for an unknown task.
    ///
    /// A paused task still runs when triggered (`leasehold trigger`), as `kubectl create job
    /// --from` runs a suspended CronJob: the pause holds its schedule, not an explicit run.
    ///
    /// Exits 66 when the store does not exist (a SQLite path with no file): only run, serve
    /// and demo create one, so a mistyped path fails instead of answering from a new, empty
    /// store. Exits 78 for a file that is not a leasehold store, left as it was.
    Pause(fleet::PauseArgs),
    /// Lift a task's pause: its next slot runs.
    ///
    /// Exits 66 when the store does not exist (a SQLite path with no file): only run, serve
    /// and demo create one, so a mistyped path fails instead of answering from a new, empty
    /// store. Exits 78 for a file that is not a leasehold store, left as it was.
    Resume(fleet::ResumeArgs),
    /// Ask whichever instance runs a task to run it once, as soon as it can (--wait: and print
    /// how it ended). Exits 66 for an unknown task, 68 when no instance runs it, 124 when the
    /// run did not end within --wait.
    ///
    /// A paused task runs too, as `kubectl create job --from` runs a suspended CronJob: the
    /// pause holds its schedule, not an explicit run, and stays after it. Triggers made while
    /// one is waiting to be taken (fifty at once from a script, say) are that one request:
    /// each is answered with its id and who asked first, and the task runs once. A trigger
    /// made once the run has been taken asks for another run.
    ///
    /// Backfill, --slots FROM..TO: each slot of the task's schedule in the range that has no
    /// ok run in its history runs, oldest first, one at a time, each holding the task lease,
    /// as trigger `backfill` (LEASEHOLD_TRIGGER=backfill, LEASEHOLD_SLOT the slot); the same
    /// backfill again runs nothing. E.g.
    /// `leasehold trigger nightly --slots 2027-03-01..2027-03-08T00:00:00Z --wait=1h`. Exits 2
    /// for a range that ends before it starts, ends after now, or holds more than 1000 slots;
    /// 78 for a task that cannot be backfilled (run by an application through the sidecar, or
    /// registered by a release before backfill); 75 while another trigger waits to be taken.
    ///
    /// Exits 66 when the store does not exist (a SQLite path with no file): only run, serve
    /// and demo create one, so a mistyped path fails instead of answering from a new, empty
    /// store. Exits 78 for a file that is not a leasehold store, left as it was.
    Trigger(fleet::TriggerArgs),
    /// Remove a task no instance runs from the store's catalog, with its control record (a
    /// pause, a pending trigger); its history is kept unless --history. Exits 77, removing
    /// nothing, while an instance still runs it (stop it first: a task whose instances stopped
    /// without unregistering, killed say, is refused until their heartbeat expires, at most a
    /// ttl later); 66 for a task the catalog does not have.
    ///
    /// Exits 66 when the store does not exist (a SQLite path with no file). Exits 78 for a
    /// file that is not a leasehold store, left as it was.
    Forget(fleet::ForgetArgs),
    /// Run a whole crontab (Vixie cron's or supercronic's format) in one process: every line
    /// a task that runs on exactly one of the replicas running the same file against the same
    /// store. Reloads on SIGHUP and when a file changes; `--test` checks the files and prints
    /// each line's task name and next firings. See docs/crontab.md.
    Crontab(crontab::CrontabArgs),
    /// The sidecar: an HTTP API (JSON, OpenAPI at /openapi.json) for leases, leadership and
    /// gated ticks, for applications in any language; Prometheus metrics at /metrics.
    Serve(serve::ServeArgs),
    /// Show a task's recent runs (slot, trigger, holder, duration, outcome) and missed slots,
    /// as a table, JSON or a timeline picture (--svg).
    ///
    /// Exits 66 when the store does not exist (a SQLite path with no file): only run, serve
    /// and demo create one, so a mistyped path fails instead of answering from a new, empty
    /// store. Exits 78 for a file that is not a leasehold store, left as it was.
    History(history::HistoryArgs),
    /// Show the next firings of a cron expression (local time and UTC), to check it before
    /// deploying it.
    Next(next::NextArgs),
    /// Print a completion script for bash, zsh or fish, e.g.
    /// `leasehold completions bash > ~/.local/share/bash-completion/completions/leasehold`.
    Completions(generate::CompletionsArgs),
    /// Print the manual page leasehold(1) (`leasehold man | man -l -`), or write a page for
    /// every command into a directory (--dir).
    Man(generate::ManArgs),
    /// Watch three instances share one SQLite file: one runs each tick, a killed leader is
    /// replaced, a stopped one hands over at once.
    Demo(demo::DemoArgs),
    /// Fault-injection run: replicas under kills, pauses, dropped connections and store
    /// restarts; reports overlaps, duplicate slots and stale fenced writes (all must be 0).
    #[cfg(feature = "chaos")]
    Chaos(leasehold_chaos::ChaosArgs),
    /// Latency and throughput of acquire, renew, release and handoff per store, next to the
    /// store's own floor measured in the same run.
    #[cfg(feature = "bench")]
    Bench(leasehold_bench::BenchArgs),
    /// The command demo and chaos replicas (and the tests) run: a fenced write of the run's
    /// token plus a ledger line describing the run (reads the LEASEHOLD_* variables).
    #[command(hide = true)]
    Witness(leasehold_witness::WitnessArgs),
    /// Internal: the process `run` starts its command under, which ties the command's process
    /// group to the life of `leasehold` (see src/child.rs).
    #[command(hide = true)]
    Supervise(supervise::SuperviseArgs),
}

fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("LEASEHOLD_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        // A log line that cannot be written is dropped; see src/logging.rs.
        .with_writer(logging::LossyStderr)
        .log_internal_errors(false)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_target(false)
        .compact()
        .init();
}

/// A chaos run's error: exit 2 for a flag it cannot use (also when found once the run had
/// started, e.g. `--postgres-bin`), 1 for the rest.
#[cfg(feature = "chaos")]
fn chaos_failure(error: leasehold_chaos::ChaosError) -> Failure {
    use leasehold_chaos::ChaosError;
    let bad_flag = |e: &ChaosError| matches!(e, ChaosError::Usage(_) | ChaosError::PostgresUrl(_));
    let usage = match &error {
        ChaosError::Run { source, .. } => bad_flag(source),
        e => bad_flag(e),
    };
    match usage {
        true => Failure::usage(error),
        false => Failure::from(anyhow::Error::new(error)),
    }
}

/// `supervise` is dispatched before the runtime starts.
fn unreachable_supervise() -> Result<u8, Failure> {
    Err(Failure::usage(anyhow::anyhow!(
        "supervise is internal to leasehold run"
    )))
}

/// clap's error message on one line: what is wrong, with the lines that name it (the missing
/// arguments, a tip), without the usage block, and where to read more (`leasehold run --help`).
fn usage_error(rendered: &str, args: &[String]) -> String {
    let message = rendered.split("\nUsage: ").next().unwrap_or(rendered);
    let mut line = String::new();
    for part in message.lines().map(str::trim) {
        if part.is_empty() || part.starts_with("For more information") {
            continue;
        }
        if !line.is_empty() {
            line.push_str(if part.starts_with("tip:") { "; " } else { " " });
        }
        line.push_str(part);
    }
    let line = line.strip_prefix("error: ").unwrap_or(&line);
    let line = match wait_without_equals(args) {
        Some(duration) => format!("{line}; write --wait={duration} (its value follows an =)"),
        None => line.to_owned(),
    };
    // No global option takes a value, so the first word that is not an option names the
    // subcommand, if it is one.
    let help = match args.iter().skip(1).find(|a| !a.starts_with('-')) {
        Some(sub) if Cli::command().find_subcommand(sub).is_some() => {
            format!("leasehold {sub} --help")
        }
        _ => "leasehold --help".to_owned(),
    };
    format!("{line} (see {help})")
}

/// The duration after a bare `--wait` of `trigger` (`trigger NAME --wait 20s`), where clap
/// reads `20s` as a second name: `--wait` takes its value only after an `=`, so that
/// `trigger --wait NAME` never reads the name as a duration.
fn wait_without_equals(args: &[String]) -> Option<&str> {
    if args.iter().skip(1).find(|a| !a.starts_with('-'))? != "trigger" {
        return None;
    }
    args.windows(2)
        .find(|pair| pair[0] == "--wait" && parse_duration(&pair[1]).is_ok())
        .map(|pair| pair[1].as_str())
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) if e.kind() == clap::error::ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
            // `leasehold` alone: clap would print the whole help as the error.
            let commands: Vec<String> = Cli::command()
                .get_subcommands()
                .filter(|c| !c.is_hide_set())
                .map(|c| c.get_name().to_owned())
                .collect();
            logging::error_line(&format!(
                "a command is required: {} (see leasehold --help)",
                commands.join(", ")
            ));
            return exit(EXIT_USAGE);
        }
        Err(e) if e.use_stderr() => {
            let args: Vec<String> = std::env::args().collect();
            logging::error_line(&usage_error(&e.to_string(), &args));
            return exit(EXIT_USAGE);
        }
        Err(e) => {
            // --help and --version.
            let _ = e.print();
            return ExitCode::SUCCESS;
        }
    };
    if let Command::Supervise(args) = cli.command {
        // No logging and no multi-threaded runtime: it only waits for two things.
        return supervise::main(args);
    }
    init_logging();
    let threads = match &cli.command {
        Command::Serve(args) => args.threads,
        _ => 2,
    };
    let runtime =
        match start_runtime(tokio::runtime::Builder::new_multi_thread().worker_threads(threads)) {
            Ok(rt) => rt,
            Err(code) => return code,
        };
    let result = runtime.block_on(async {
        match cli.command {
            Command::Run(args) => run::run(args).await,
            Command::Crontab(args) => crontab::crontab(args).await,
            Command::Status(args) => status::status(args).await,
            Command::Pause(args) => fleet::pause(args).await,
            Command::Resume(args) => fleet::resume(args).await,
            Command::Trigger(args) => fleet::trigger(args).await,
            Command::Forget(args) => fleet::forget(args).await,
            Command::History(args) => history::history(args).await,
            Command::Next(args) => next::next(args),
            Command::Completions(args) => generate::completions(args, Cli::command()),
            Command::Man(args) => generate::man(args, Cli::command()),
            Command::Serve(args) => serve::serve(args).await,
            Command::Demo(args) => demo::demo(args).await,
            #[cfg(feature = "chaos")]
            Command::Chaos(args) => leasehold_chaos::run(args).await.map_err(chaos_failure),
            #[cfg(feature = "bench")]
            Command::Bench(args) => leasehold_bench::run(args).await.map_err(|e| match e {
                leasehold_bench::BenchError::Usage(_) => Failure::usage(e),
                e => Failure::from(anyhow::Error::new(e)),
            }),
            Command::Witness(args) => leasehold_witness::run(args)
                .await
                .map_err(|e| Failure::from(anyhow::Error::new(e))),
            Command::Supervise(_) => unreachable_supervise(),
        }
    });
    // Background renewers and pollers must not keep the process alive.
    runtime.shutdown_timeout(Duration::from_millis(200));
    let code = match result {
        Ok(code) => code,
        // The reader went away (`| head -1`): nothing to say, and nobody to say it to.
        Err(Failure { error, .. }) if error.is::<output::StdoutClosed>() => 0,
        Err(Failure {
            code,
            error,
            next_step,
        }) => {
            logging::error_line(&report(&error, next_step.as_deref()));
            code
        }
    };
    exit(code)
}
