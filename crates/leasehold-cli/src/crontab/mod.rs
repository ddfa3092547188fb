//! `leasehold crontab`: a whole crontab in one process, each line a task that runs on exactly
//! one of the replicas running the same file against the same store.
//!
//! - parse.rs reads the file (the format, the task names);
//! - check.rs is `--test`: each line's task and next firings;
//! - schedule.rs runs the lines on the library's Scheduler, and reloads them.

mod check;
pub mod parse;
mod schedule;

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, ValueEnum};
use leasehold::StoreDownPolicy;
use leasehold_serve::Listen;

use crate::failure::Failure;
use parse::{CatchUpKind, Defaults, Job, ParseError};

#[derive(Args)]
pub struct CrontabArgs {
    /// Crontab files (Vixie cron's and supercronic's format): every job line is a task. See
    /// docs/crontab.md for the format, the task names and the `# leasehold:` options.
    #[arg(required = true, value_name = "FILE")]
    files: Vec<PathBuf>,
    /// Check the files and print each line's task name, schedule, zone and next firings, then
    /// exit: 0 if every line is good, 2 at the first bad one (FILE:LINE:COLUMN and a caret).
    #[arg(long)]
    test: bool,
    /// With --test: print JSON ({"jobs": [{"name", "schedule", "fields", "time_zone",
    /// "command", "file", "line", "firings": [{"slot_ms", "utc", "local"}]}]}).
    #[arg(long, requires = "test")]
    json: bool,
    /// With --test: how many firings to show per line.
    #[arg(short = 'n', default_value_t = 3, requires = "test", value_parser = clap::value_parser!(u16).range(1..=1000))]
    n: u16,
    /// With --test: firings after this time instead of now (RFC 3339 in UTC, e.g.
    /// 2027-03-27T12:00:00Z).
    #[arg(long, requires = "test", value_parser = crate::next::from_arg)]
    after: Option<u64>,
    /// Store URL: sqlite:PATH, redis://…, rediss://…, postgres://…, etcd://…, mysql://…
    /// [default: $LEASEHOLD_STORE, else sqlite:leasehold.db]
    #[arg(long)]
    store: Option<String>,
    /// leader: one replica (the leader of --group) runs every line; spread: the lines are
    /// spread over the live replicas (each runs the lines it owns, about lines/replicas).
    #[arg(long, value_enum, default_value = "leader")]
    placement: Placement,
    /// The leader (or spread) group the replicas share. Two different crontabs on one store
    /// need two groups.
    #[arg(long, default_value = "crontab")]
    group: String,
    /// Every line's store-down policy unless its `# leasehold:` comment says otherwise:
    /// fail-closed (skip), fail-open (run anyway, warn), local (single-instance mode).
    #[arg(long)]
    on_store_down: Option<StoreDownPolicy>,
    /// Every line's catch-up policy unless its comment says otherwise: what happens to slots no
    /// replica ran when they were due: skip, latest (the default for cron) or all.
    #[arg(long, value_enum)]
    catch_up: Option<CatchUpArg>,
    /// With catch-up latest or all: how old a missed slot may be and still run [default: 1h].
    #[arg(long, value_parser = crate::durations::interval_arg)]
    catch_up_window: Option<Duration>,
    /// Lease ttl: how long a crashed replica blocks its lines (and, with leader placement,
    /// leadership).
    #[arg(long, default_value = "15s", value_parser = crate::durations::duration_arg)]
    ttl: Duration,
    /// How long a command has to exit after SIGTERM before its process group gets SIGKILL
    /// (also the lease's stop margin, as for `leasehold run`) [default: ttl/5]
    #[arg(long, value_parser = crate::durations::duration_arg)]
    grace: Option<Duration>,
    /// On SIGTERM or SIGINT, take no new slot and let running commands finish for up to this
    /// long (their leases are renewed meanwhile), then forward SIGTERM, and SIGKILL after
    /// --grace, as `leasehold run --drain`. A second SIGTERM or SIGINT forwards at once.
    /// [default: the ttl]
    #[arg(long, value_parser = crate::durations::duration_arg)]
    drain: Option<Duration>,
    /// This instance's holder id [default: host:pid:random].
    #[arg(long)]
    holder: Option<String>,
    /// Serve Prometheus metrics (GET /metrics) on IP:PORT or unix:/path/to.sock, as
    /// `leasehold run --metrics-listen`.
    #[arg(long, value_name = "ADDR")]
    metrics_listen: Option<Listen>,
    /// Keep the last N KiB of each run's stdout and stderr in its history record, as
    /// `leasehold run --output-tail` (0 to keep none, at most 64).
    #[arg(long, value_name = "N", default_value_t = 4, value_parser = crate::run::output_tail_arg)]
    output_tail: usize,
    /// How many run-history entries the store keeps for each line's task (runs and missed
    /// slots, newest first), 1 to 1000, as `leasehold run --history`.
    #[arg(long, value_name = "N", default_value_t = leasehold::history::DEFAULT_HISTORY_LIMIT, value_parser = crate::service::history_entries)]
    history: usize,
    /// How often the files are checked for changes (mtime and content); SIGHUP reloads at once.
    #[arg(long, default_value = "1s", value_parser = crate::durations::duration_arg, hide = true)]
    poll: Duration,
}

/// `--placement`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Placement {
    Leader,
    Spread,
}

/// `--catch-up`.
#[derive(Clone, Copy, Debug, ValueEnum)]
enum CatchUpArg {
    Skip,
    Latest,
    All,
}

impl CrontabArgs {
    fn defaults(&self) -> Defaults {
        Defaults {
            catch_up: self.catch_up.map(|c| match c {
                CatchUpArg::Skip => CatchUpKind::Skip,
                CatchUpArg::Latest => CatchUpKind::Latest,
                CatchUpArg::All => CatchUpKind::All,
            }),
            catch_up_window: self.catch_up_window,
            on_store_down: self.on_store_down,
        }
    }
}

/// Why the files could not be used.
enum LoadError {
    /// A file that cannot be read.
    Read(String),
    /// A line that cannot be used.
    Parse(ParseError),
}

impl LoadError {
    /// Says it on stderr: one line, and for a bad line the line itself with a caret.
    fn report(&self, context: &str) {
        match self {
            Self::Read(why) => crate::logging::error_line(&format!("{context}{why}")),
            Self::Parse(e) => {
                crate::logging::error_line(&format!("{context}{e}"));
                for line in e.excerpt() {
                    crate::logging::line(&format!("    {line}"));
                }
            }
        }
    }
}

/// The files as they are now: their text (for change detection) and their jobs, in order.
fn load(files: &[PathBuf], defaults: &Defaults) -> Result<(Vec<String>, Vec<Job>), LoadError> {
    let mut texts = Vec::with_capacity(files.len());
    let mut jobs: Vec<Job> = Vec::new();
    for path in files {
        let shown = path.display().to_string();
        let text = std::fs::read_to_string(path)
            .map_err(|e| LoadError::Read(format!("cannot read {shown}: {e}")))?;
        for job in parse::parse(&shown, &text, defaults).map_err(LoadError::Parse)? {
            if let Some(twin) = jobs.iter().find(|j| j.name == job.name) {
                return Err(LoadError::Parse(ParseError {
                    file: shown,
                    line: job.line,
                    column: 1,
                    text: text.lines().nth(job.line - 1).unwrap_or("").to_owned(),
                    message: format!(
                        "task name {} is taken by {}:{}: give this line another \
                         `# leasehold: name=…`",
                        job.name, twin.file, twin.line
                    ),
                }));
            }
            jobs.push(job);
        }
        texts.push(text);
    }
    Ok((texts, jobs))
}

pub async fn crontab(args: CrontabArgs) -> Result<u8, Failure> {
    let defaults = args.defaults();
    let (texts, jobs) = match load(&args.files, &defaults) {
        Ok(loaded) => loaded,
        Err(e) => {
            e.report("");
            return Ok(crate::failure::EXIT_USAGE);
        }
    };
    if args.test {
        return check::print(&jobs, &args);
    }
    schedule::run(args, texts, jobs).await
}
