//! `leasehold`: run any command as a single-active job across machines.

mod child;
mod demo;
mod fleet;
mod history;
mod link;
mod logging;
mod next;
mod output;
mod run;
mod serve;
mod status;
mod supervise;

use std::process::ExitCode;
use std::time::Duration;

use clap::{CommandFactory, Parser, Subcommand};

/// Exit status when the lease is held by someone else (`run` without a schedule).
pub const EXIT_BUSY: u8 = 75;
/// Exit status when the store cannot be reached (and the policy does not allow running anyway).
pub const EXIT_STORE_DOWN: u8 = 69;
/// Exit status of `pause`, `resume`, `trigger` for a task the store's catalog does not have
/// (sysexits' EX_NOINPUT).
pub const EXIT_UNKNOWN_TASK: u8 = 66;
/// Exit status of `trigger` when no instance runs the task: nobody would take it (EX_NOHOST).
pub const EXIT_NO_INSTANCE: u8 = 68;
/// Exit status of `trigger --wait` when the run did not end in time (as `timeout`'s).
pub const EXIT_NOT_ENDED: u8 = 124;
/// Exit status for bad input.
pub const EXIT_USAGE: u8 = 2;
/// Exit status when the store keeps refusing the lease (a key of the wrong type, no permission,
/// scripts disabled): retrying cannot fix it, so `run` gives up (sysexits' EX_CONFIG).
pub const EXIT_REFUSED: u8 = 78;

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
    Status(status::StatusArgs),
    /// Pause a task on every instance, from their next tick: its slots are recorded as paused
    /// and never caught up; a run already going finishes. Exits 66 for an unknown task.
    Pause(fleet::PauseArgs),
    /// Lift a task's pause: its next slot runs.
    Resume(fleet::ResumeArgs),
    /// Ask whichever instance runs a task to run it once, as soon as it can (--wait: and print
    /// how it ended). Exits 66 for an unknown task, 68 when no instance runs it, 124 when the
    /// run did not end within --wait.
    Trigger(fleet::TriggerArgs),
    /// The sidecar: an HTTP API (JSON, OpenAPI at /openapi.json) for leases, leadership and
    /// gated ticks, for applications in any language; Prometheus metrics at /metrics.
    Serve(serve::ServeArgs),
    /// Show a task's recent runs (slot, trigger, holder, duration, outcome) and missed slots,
    /// as a table, JSON or a timeline picture (--svg).
    History(history::HistoryArgs),
    /// Show the next firings of a cron expression (local time and UTC), to check it before
    /// deploying it.
    Next(next::NextArgs),
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

/// The longest ttl, renew, retry or grace period: a day. A ttl is how long a crashed holder
/// blocks everyone else, so a longer one is a typo rather than a plan; the bound also keeps every
/// deadline (`now + ttl`) far from the clock's range.
pub const MAX_LEASE_DURATION: Duration = Duration::from_secs(24 * 3600);
/// The longest `--every`: 366 days. A longer interval would not fire in a process's lifetime;
/// calendar schedules belong in `--cron`.
pub const MAX_INTERVAL: Duration = Duration::from_secs(366 * 24 * 3600);

/// Parses a duration: humantime's forms (`500ms`, `30s`, `5m`, `1h30m`, `2d`), or a bare number
/// of seconds.
fn parse_duration(text: &str) -> Result<Duration, String> {
    let t = text.trim();
    if let Ok(secs) = t.parse::<u64>() {
        return Ok(Duration::from_secs(secs));
    }
    humantime::parse_duration(t).map_err(|e| format!("invalid duration {t:?}: {e}"))
}

fn bounded(text: &str, max: Duration) -> Result<Duration, String> {
    let d = parse_duration(text)?;
    if d > max {
        return Err(format!(
            "{:?} is above the maximum of {}",
            text.trim(),
            humantime::format_duration(max)
        ));
    }
    Ok(d)
}

/// A lease timing flag (`--ttl`, `--renew`, `--retry`, `--grace`, and the helpers' durations):
/// at most [`MAX_LEASE_DURATION`].
pub fn duration_arg(s: &str) -> Result<Duration, String> {
    bounded(s, MAX_LEASE_DURATION)
}

/// A schedule interval (`--every`): at most [`MAX_INTERVAL`].
pub fn interval_arg(s: &str) -> Result<Duration, String> {
    bounded(s, MAX_INTERVAL)
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

/// An error with the exit status it maps to.
#[derive(Debug)]
pub struct Failure {
    code: u8,
    error: anyhow::Error,
}

impl Failure {
    /// `error` with exit status `code`.
    pub fn with_code(code: u8, error: impl Into<anyhow::Error>) -> Self {
        Self {
            code,
            error: error.into(),
        }
    }

    /// Bad input: exit 2.
    pub fn usage(error: impl Into<anyhow::Error>) -> Self {
        Self {
            code: EXIT_USAGE,
            error: error.into(),
        }
    }

    /// A store that could not be used: exit 69 if retrying may help (unreachable, too slow),
    /// else 78 (it refuses: credentials, permissions, a key of the wrong type).
    pub fn store(error: impl Into<anyhow::Error>, transient: bool) -> Self {
        Self {
            code: if transient {
                EXIT_STORE_DOWN
            } else {
                EXIT_REFUSED
            },
            error: error.into(),
        }
    }

    /// A store URL that could not be opened: exit 2 for a URL that can never work (unknown
    /// scheme, unparsable), else as [`store`](Self::store). The one mapping of open errors.
    pub fn open(error: leasehold_connect::OpenError) -> Self {
        if error.is_bad_url() {
            return Self::usage(error);
        }
        let transient = error.is_transient();
        Self::store(error, transient)
    }

    /// An operation the store could not answer, as [`store`](Self::store), with `context`
    /// (what was being done) in front of the store's own message.
    pub fn store_op(error: leasehold::StoreError, context: String) -> Self {
        let transient = error.is_transient();
        Self::store(anyhow::Error::new(error).context(context), transient)
    }
}

impl From<anyhow::Error> for Failure {
    fn from(error: anyhow::Error) -> Self {
        Self { code: 1, error }
    }
}

/// An error and its causes on one line, each cause once: a cause whose text is already in the
/// line (a message quoting its driver's error, a driver repeating itself) is left out.
pub fn one_line(error: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in error.chain() {
        let text = cause.to_string().replace('\n', " ");
        let text = text.trim();
        if text.is_empty() || line.contains(text) {
            continue;
        }
        if !line.is_empty() {
            line.push_str(": ");
        }
        line.push_str(text);
    }
    line
}

/// Starts a tokio runtime (with its I/O and timers) from `builder`; if it cannot, says so on
/// stderr and returns the exit status.
fn start_runtime(
    builder: &mut tokio::runtime::Builder,
) -> Result<tokio::runtime::Runtime, ExitCode> {
    builder.enable_all().build().map_err(|e| {
        logging::error_line(&format!("cannot start the runtime: {e}"));
        exit(1)
    })
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
            Command::Status(args) => status::status(args).await,
            Command::Pause(args) => fleet::pause(args).await,
            Command::Resume(args) => fleet::resume(args).await,
            Command::Trigger(args) => fleet::trigger(args).await,
            Command::History(args) => history::history(args).await,
            Command::Next(args) => next::next(args),
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
        Err(Failure { code, error }) => {
            // One line a person can act on: the error and its causes, joined.
            logging::error_line(&one_line(&error));
            code
        }
    };
    exit(code)
}

/// Exits with `code` once stderr has taken the last lines, or after half a second if it does not
/// take them (a reader that stopped reading must not keep the process alive).
fn exit(code: u8) -> ExitCode {
    logging::drain(Duration::from_millis(500));
    ExitCode::from(code)
}
