//! `leasehold`: run any command as a single-active job across machines.

mod child;
mod demo;
mod record;
mod run;
mod status;

use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};

/// Exit status when the lease is held by someone else (`run` without a schedule).
pub const EXIT_BUSY: u8 = 75;
/// Exit status when the store cannot be reached (and the policy does not allow running anyway).
pub const EXIT_STORE_DOWN: u8 = 69;
/// Exit status for bad input.
pub const EXIT_USAGE: u8 = 2;

#[derive(Parser)]
#[command(name = "leasehold", version, about = "Run any command as a single-active job across machines", long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run COMMAND on exactly one of all instances that run the same lease: once per tick with
    /// --every/--cron, else once if the lease is free (a distributed flock; exits 75 if busy).
    Run(run::RunArgs),
    /// Show holder, fencing token and remaining time of leases.
    Status(status::StatusArgs),
    /// Watch three instances share one SQLite file: one runs each tick, a killed leader is
    /// replaced, a stopped one hands over at once.
    Demo(demo::DemoArgs),
    /// Fault-injection run: replicas under kills, pauses, dropped connections and store
    /// restarts; reports overlaps, duplicate slots and stale fenced writes (all must be 0).
    Chaos(leasehold_chaos::ChaosArgs),
    /// Latency and throughput of acquire, renew, release and handoff per store, next to the
    /// store's own floor measured in the same run.
    Bench(leasehold_bench::BenchArgs),
    /// The command chaos replicas run: a fenced write plus a ledger line.
    #[command(hide = true)]
    Witness(leasehold_chaos::WitnessArgs),
    /// Append one JSON line describing the current run to FILE (a witness ledger for demos and
    /// tests; reads the LEASEHOLD_* variables).
    #[command(hide = true)]
    Record(record::RecordArgs),
}

/// A duration flag: `500ms`, `30s`, `5m`, `1h`, `1m30s`, or seconds.
pub fn duration_arg(s: &str) -> Result<Duration, String> {
    leasehold::parse_duration(s)
}

fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("LEASEHOLD_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
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
    /// Bad input: exit 2.
    pub fn usage(error: impl Into<anyhow::Error>) -> Self {
        Self {
            code: EXIT_USAGE,
            error: error.into(),
        }
    }

    /// The store could not be reached: exit 69.
    pub fn store(error: impl Into<anyhow::Error>) -> Self {
        Self {
            code: EXIT_STORE_DOWN,
            error: error.into(),
        }
    }
}

impl From<anyhow::Error> for Failure {
    fn from(error: anyhow::Error) -> Self {
        Self { code: 1, error }
    }
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) if e.use_stderr() => {
            // clap's first line says what is wrong; the usage block after it is noise here.
            let rendered = e.to_string();
            let first = rendered.lines().next().unwrap_or("invalid arguments");
            let first = first.strip_prefix("error: ").unwrap_or(first);
            eprintln!("leasehold: error: {first} (see leasehold --help)");
            return ExitCode::from(EXIT_USAGE);
        }
        Err(e) => {
            // --help and --version.
            let _ = e.print();
            return ExitCode::SUCCESS;
        }
    };
    init_logging();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("leasehold: error: cannot start the runtime: {e}");
            return ExitCode::from(1);
        }
    };
    let result = runtime.block_on(async {
        match cli.command {
            Command::Run(args) => run::run(args).await,
            Command::Status(args) => status::status(args).await,
            Command::Demo(args) => demo::demo(args).await,
            Command::Record(args) => record::record(args).await,
            Command::Chaos(args) => leasehold_chaos::run(args).await.map_err(Failure::from),
            Command::Bench(args) => leasehold_bench::run(args).await.map_err(Failure::from),
            Command::Witness(args) => leasehold_chaos::witness(args).await.map_err(Failure::from),
        }
    });
    // Background renewers and pollers must not keep the process alive.
    runtime.shutdown_timeout(Duration::from_millis(200));
    match result {
        Ok(code) => ExitCode::from(code),
        Err(Failure { code, error }) => {
            // One line a person can act on: the error and its causes, joined.
            let message = format!("{error:#}").replace('\n', " ");
            eprintln!("leasehold: error: {message}");
            ExitCode::from(code)
        }
    }
}
