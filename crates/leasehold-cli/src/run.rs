//! `leasehold run`: a command as a single-active job.

use std::time::Duration;

use anyhow::anyhow;
use clap::{Args, ValueEnum};
use leasehold::catalog::TaskSource;
use leasehold::store::Metered;
use leasehold::{
    BoxStore, CancellationToken, CatchUp, Lease, LeaseConfig, LeaseError, LeaseName, Schedule,
    Scheduler, Store, StoreDownPolicy, Task, TaskContext, TryAcquire,
};

use leasehold_serve::Listen;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::service::{serve_metrics, termination};

use crate::child::{self, ChildSpec, Ended, Stops};
use crate::failure::{EXIT_BUSY, Failure};

#[derive(Args)]
pub struct RunArgs {
    /// Store URL: sqlite:PATH, redis://…, rediss://…, postgres://…, etcd://…, mysql://…
    /// [default: $LEASEHOLD_STORE, else sqlite:leasehold.db]
    #[arg(long)]
    store: Option<String>,
    /// The lease name, shared by every instance of this job.
    #[arg(long)]
    lease: String,
    /// Run once per interval (aligned to the epoch on the store's clock), e.g. 30s.
    #[arg(long, value_parser = crate::durations::interval_arg, conflicts_with = "cron")]
    every: Option<Duration>,
    /// Run on a cron schedule: five fields as in crontab ("0 3 * * *"), six with seconds
    /// first ("*/10 * * * * *"), or a macro (@daily). Check it with `leasehold next`.
    #[arg(long)]
    cron: Option<String>,
    /// The IANA time zone of --cron's times, e.g. Europe/Berlin [default: UTC, or the
    /// expression's CRON_TZ= prefix]. Daylight saving: a time the clock skips runs once at
    /// the change, a time it repeats runs once, the first time.
    #[arg(long, requires = "cron")]
    tz: Option<String>,
    /// Lease ttl: how long a crashed holder blocks others.
    #[arg(long, default_value = "15s", value_parser = crate::durations::duration_arg)]
    ttl: Duration,
    /// Time between renewals [default: ttl/3].
    #[arg(long, value_parser = crate::durations::duration_arg)]
    renew: Option<Duration>,
    /// Time between retries after a store error [default: ttl/15, at most 1s].
    #[arg(long, value_parser = crate::durations::duration_arg)]
    retry: Option<Duration>,
    /// How long the command has to exit after SIGTERM before its process group gets SIGKILL.
    /// It is also the lease's stop margin: when renewals have failed until only this much of
    /// the lease is left, the command is stopped, so it is gone before the lease can pass to
    /// anyone else. On shutdown (after --drain, with a schedule) `leasehold` forwards SIGTERM
    /// and is done within it. [default: ttl/5]
    #[arg(long, value_parser = crate::durations::duration_arg)]
    grace: Option<Duration>,
    /// With a schedule: on SIGTERM or SIGINT, take no new slot and let a running command finish
    /// for up to this long (the lease is renewed meanwhile; should it be lost or start
    /// expiring, the command is stopped as at any time), then forward SIGTERM, and SIGKILL after
    /// --grace. A second SIGTERM or SIGINT forwards at once. 0 forwards the first at once.
    /// [default: the ttl]
    #[arg(long, value_parser = crate::durations::duration_arg)]
    drain: Option<Duration>,
    /// What to do when the store cannot be reached: fail-closed (skip), fail-open (run anyway,
    /// warn), local (single-instance mode).
    #[arg(long, default_value = "fail-closed")]
    on_store_down: StoreDownPolicy,
    /// With a schedule: what happens to slots no instance ran when they were due (a crashed
    /// leader, a store outage): skip them, run the latest one, or run all of them in order.
    /// [default: skip for --every, latest for --cron]
    #[arg(long, value_enum)]
    catch_up: Option<CatchUpArg>,
    /// With --catch-up latest or all: how old a missed slot may be and still run.
    #[arg(long, default_value = "1h", value_parser = crate::durations::interval_arg)]
    catch_up_window: Duration,
    /// This instance's holder id [default: host:pid:random].
    #[arg(long)]
    holder: Option<String>,
    /// With a schedule: how many run-history entries the store keeps for the task (runs and
    /// missed slots, newest first), 1 to 1000.
    #[arg(long, value_name = "N", default_value_t = leasehold::history::DEFAULT_HISTORY_LIMIT, value_parser = crate::service::history_entries)]
    history: usize,
    /// With a schedule: keep the last N KiB of each run's stdout and stderr (interleaved as
    /// read) in its history record, for `leasehold history NAME --output` and the page; 0 to
    /// keep none, at most 64. The output still reaches this process's stdout and stderr, through
    /// pipes (the command's are then not a terminal). Passwords are taken out: the store
    /// URL's wherever they appear, and any URL's `user:password@`.
    #[arg(long, value_name = "N", default_value_t = 4, value_parser = output_tail_arg)]
    output_tail: usize,
    /// Serve Prometheus metrics (GET /metrics, nothing else, no token) on IP:PORT or
    /// unix:/path/to.sock while running, e.g. 127.0.0.1:9464. On a loopback address it answers
    /// only requests whose Host is a loopback address or localhost. See docs/metrics.md.
    #[arg(long, value_name = "ADDR")]
    metrics_listen: Option<Listen>,
    /// With a schedule: how long the store may go unreached from the start before `run` gives
    /// up with exit 69 (a typo in a host or port fails instead of retrying forever); once it
    /// has answered, outages are retried without end, as --on-store-down says. `forever`
    /// keeps retrying from the start too (a store that comes up after its clients).
    #[arg(long, default_value = "60s", value_name = "DURATION|forever", value_parser = connect_timeout_arg)]
    connect_timeout: ConnectTimeout,
    /// Each run's time limit, e.g. 10m: at it the command gets SIGTERM, then SIGKILL after
    /// --grace. With a schedule the run is recorded `timed-out` (and retried under --retries);
    /// without one `run` exits 124, as timeout(1) does.
    #[arg(long, value_name = "DURATION", value_parser = crate::policies::timeout_arg)]
    timeout: Option<Duration>,
    /// With a schedule: how many times a `failed` or `timed-out` run of a slot is tried again
    /// (0 to 100), on this instance while it holds the lease, never past the next slot (a
    /// retry that would start after it is dropped and recorded). The command sees its attempt
    /// in LEASEHOLD_ATTEMPT (1, 2, …); `leasehold history` shows each attempt.
    #[arg(long, value_name = "N", default_value = "0", value_parser = crate::policies::retries_arg)]
    retries: u32,
    /// With --retries: the wait before the first retry, doubling with each further one up to
    /// MAX [default: 1s,1m], each cut by a jitter (the same on every instance) to between half
    /// and all of it. E.g. 10s or 10s,5m.
    #[arg(long, value_name = "D[,MAX]", value_parser = crate::policies::backoff_arg)]
    retry_backoff: Option<leasehold::Backoff>,
    /// With a schedule: put each slot's start off by up to this (at most 30m), by an amount
    /// derived from the lease name and the slot, the same on every instance and never half the
    /// way to the next slot, so that many tasks on one schedule (every hour at :00) do not all
    /// start at once. The run is still the slot's (LEASEHOLD_SLOT names it). E.g. 5m.
    #[arg(long, value_name = "DURATION", value_parser = crate::policies::jitter_arg)]
    jitter: Option<Duration>,
    /// With a schedule: what becomes of a run that was cut off (this instance killed mid-run,
    /// its lease lost, a --drain that ran out): `rerun` (the default) has the next instance to
    /// hold the task run that slot once more, after the slot it was granted, with
    /// LEASEHOLD_TRIGGER=retry and LEASEHOLD_ATTEMPT=2 (at least once for interrupted runs);
    /// `skip` leaves it.
    #[arg(long, value_name = "rerun|skip", default_value = "rerun", value_parser = crate::policies::on_interrupt_arg)]
    on_interrupt: leasehold::OnInterrupt,
    /// With a schedule: what a slot that falls while a run of the task is going does (the
    /// instance running it decides; each slot still runs once fleet-wide). `skip` (the
    /// default): recorded missed, reason overlap. `buffer-one`: runs once the run ends; further
    /// slots meanwhile are skipped. `buffer-all`: every such slot runs after it, in order, at
    /// most 16 waiting (beyond, skipped). `replace`: the run going gets SIGTERM (SIGKILL after
    /// --grace), is recorded cancelled, and the new slot runs. `allow`: the slot runs at once
    /// beside the run going, under a lease of its own (NAME/slot/SLOT) and fencing token.
    #[arg(long, value_name = "POLICY", default_value = "skip", value_parser = crate::policies::overlap_arg)]
    overlap: leasehold::Overlap,
    /// Without a schedule: wait for the lease instead of exiting 75 when it is busy.
    #[arg(long, conflicts_with_all = ["every", "cron"])]
    wait: bool,
    /// The command and its arguments.
    #[arg(last = true, required = true)]
    command: Vec<String>,
}

/// `--catch-up`.
#[derive(Clone, Copy, Debug, ValueEnum)]
enum CatchUpArg {
    Skip,
    Latest,
    All,
}

/// `--connect-timeout`: how long a scheduled run waits for its store's first answer, or
/// forever.
#[derive(Clone, Copy, Debug)]
struct ConnectTimeout(Option<Duration>);

fn connect_timeout_arg(text: &str) -> Result<ConnectTimeout, String> {
    match text.trim() {
        "forever" => Ok(ConnectTimeout(None)),
        t => crate::durations::duration_arg(t).map(|d| ConnectTimeout(Some(d))),
    }
}

/// Completes once the store has answered (a refusal is an answer: the scheduler handles
/// those), or with the last error when `limit` passes first.
async fn first_answer(
    store: &BoxStore,
    limit: Duration,
    retry: Duration,
) -> Option<leasehold::StoreError> {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        let error = match tokio::time::timeout_at(deadline, store.now_millis()).await {
            Ok(Ok(_)) => return None,
            Ok(Err(e)) if !e.is_transient() => return None,
            Ok(Err(e)) => e,
            Err(_) => leasehold::StoreError::Timeout(limit),
        };
        if tokio::time::Instant::now() + retry >= deadline {
            return Some(error);
        }
        tokio::time::sleep(retry).await;
    }
}

/// `--output-tail`: KiB, 0 to 64.
pub fn output_tail_arg(text: &str) -> Result<usize, String> {
    match text.trim().parse::<usize>() {
        Ok(kib @ 0..=64) => Ok(kib),
        _ => Err(format!("{text:?} is not a number of KiB from 0 to 64")),
    }
}

/// What `--output-tail KIB` keeps of a command run against `store_url` (none for 0).
pub fn output_tail(kib: usize, store_url: &str) -> Option<child::OutputTail> {
    (kib > 0).then(|| child::OutputTail {
        keep: kib * 1024,
        redact: std::sync::Arc::new(crate::tail::Redactor::for_store_url(store_url)),
    })
}

/// At most this many missed slots run in one catch-up with `--catch-up all`.
const CATCH_UP_MAX: usize = 100;

struct Settings {
    name: LeaseName,
    run_policy: leasehold::RunPolicy,
    schedule: Option<Schedule>,
    catch_up: Option<CatchUp>,
    config: LeaseConfig,
    holder: Option<leasehold::HolderId>,
}

fn settings(args: &RunArgs) -> Result<Settings, Failure> {
    let name = LeaseName::new(&args.lease).map_err(Failure::usage)?;
    let schedule = match (&args.every, &args.cron) {
        (Some(every), _) => Some(Schedule::every(*every).map_err(Failure::usage)?),
        (None, Some(expr)) => Some(
            match &args.tz {
                Some(zone) => Schedule::cron_in(expr, zone),
                None => Schedule::cron(expr),
            }
            .map_err(Failure::usage)?,
        ),
        (None, None) => None,
    };
    let catch_up = match (args.catch_up, &schedule) {
        (Some(_), None) => {
            return Err(Failure::usage(anyhow!(
                "--catch-up needs a schedule (--every or --cron)"
            )));
        }
        (None, _) => None,
        (Some(CatchUpArg::Skip), _) => Some(CatchUp::Skip),
        (Some(CatchUpArg::Latest), _) => Some(CatchUp::Latest {
            window: args.catch_up_window,
        }),
        (Some(CatchUpArg::All), _) => Some(CatchUp::All {
            window: args.catch_up_window,
            max: CATCH_UP_MAX,
        }),
    };
    if args.drain.is_some() && schedule.is_none() {
        return Err(Failure::usage(anyhow!(
            "--drain needs a schedule (--every or --cron)"
        )));
    }
    let mut config = LeaseConfig::new(args.ttl);
    if let Some(renew) = args.renew {
        config = config.renew_interval(renew);
        config.retry_interval = config.retry_interval.min(renew);
    }
    if let Some(retry) = args.retry {
        config = config.retry_interval(retry);
    }
    if let Some(grace) = args.grace {
        config = config.stop_margin(grace);
    }
    config.validate().map_err(|e| match e {
        leasehold::ConfigError::StopMarginTooLarge { stop, room } => Failure::usage(anyhow!(
            "--grace {stop:?} leaves no time to renew: it must be below {room:?} \
             (ttl − renew − drift margin); raise --ttl or lower --grace"
        )),
        e => Failure::usage(e),
    })?;
    if schedule.is_none() && (args.retries > 0 || args.retry_backoff.is_some()) {
        return Err(Failure::usage(anyhow!(
            "--retries and --retry-backoff need a schedule (--every or --cron)"
        )));
    }
    if schedule.is_none() && args.jitter.is_some() {
        return Err(Failure::usage(anyhow!(
            "--jitter needs a schedule (--every or --cron): it spreads the starts of slots"
        )));
    }
    if schedule.is_none() && args.overlap != leasehold::Overlap::Skip {
        return Err(Failure::usage(anyhow!(
            "--overlap needs a schedule (--every or --cron): it decides slots that fall while a \
             run is going"
        )));
    }
    let run_policy =
        crate::policies::run_policy(args.timeout, args.retries, args.retry_backoff, args.jitter)
            .on_interrupt(args.on_interrupt)
            .overlap(args.overlap);
    let holder = holder_arg(args.holder.as_deref())?;
    Ok(Settings {
        name,
        run_policy,
        schedule,
        catch_up,
        config,
        holder,
    })
}

/// `--holder`, checked.
pub fn holder_arg(holder: Option<&str>) -> Result<Option<leasehold::HolderId>, Failure> {
    holder
        .map(leasehold::HolderId::new)
        .transpose()
        .map_err(Failure::usage)
}

fn warn_if_default_store(args: &RunArgs) {
    crate::service::warn_if_no_store(args.store.as_deref());
}

/// With a schedule: the store, connecting in the background if its server is not reachable
/// yet, so the scheduler starts during an outage and applies `--on-store-down` from the first
/// tick.
async fn open_scheduled(args: &RunArgs) -> Result<BoxStore, Failure> {
    let url = leasehold_connect::store_url(args.store.clone());
    leasehold_connect::open_store_lazy(&url)
        .await
        .map_err(Failure::open)
}

/// Without a schedule: the store, or `None` when it cannot be reached and the policy lets the
/// command run without it. A store that refuses (credentials, permissions) is never "down".
async fn open(args: &RunArgs) -> Result<Option<BoxStore>, Failure> {
    let url = leasehold_connect::store_url(args.store.clone());
    match leasehold_connect::open_store(&url).await {
        Ok(store) => Ok(Some(store)),
        Err(e) if e.is_transient() && args.on_store_down != StoreDownPolicy::FailClosed => {
            tracing::warn!(error = %crate::failure::one_line(&e.into()), policy = %args.on_store_down, "store unreachable; running the command without the lease");
            Ok(None)
        }
        Err(e) => Err(Failure::open(e)),
    }
}

pub async fn run(args: RunArgs) -> Result<u8, Failure> {
    let settings = settings(&args)?;
    warn_if_default_store(&args);
    let metered = match &args.metrics_listen {
        Some(listen) => {
            serve_metrics(listen).await?;
            true
        }
        None => false,
    };
    // With metrics, every store call is counted and timed too.
    let meter = |store: BoxStore| {
        if metered {
            BoxStore::new(Metered::new(store))
        } else {
            store
        }
    };
    match settings.schedule.clone() {
        Some(schedule) => {
            let store = meter(open_scheduled(&args).await?);
            scheduled(args, settings, schedule, store).await
        }
        None => {
            let store = open(&args).await?.map(meter);
            once(args, settings, store).await
        }
    }
}

fn base_env(lease: &LeaseName, holder: &str) -> Vec<(String, String)> {
    vec![
        ("LEASEHOLD_LEASE".into(), lease.to_string()),
        ("LEASEHOLD_HOLDER".into(), holder.to_owned()),
        // The command's parent is its supervisor; this is the process to signal.
        ("LEASEHOLD_PID".into(), std::process::id().to_string()),
    ]
}

/// A token cancelled on the first SIGTERM or SIGINT, and the task that watches for them.
fn shutdown_token() -> (CancellationToken, tokio::task::JoinHandle<()>) {
    let token = CancellationToken::new();
    let on_signal = token.clone();
    let task = tokio::spawn(async move {
        termination().await;
        on_signal.cancel();
    });
    (token, task)
}

/// The exit status for a command that ended: its own, except that a command this process had to
/// stop gives 124 at its --timeout (as timeout(1)) and 143 (terminated) on shutdown, whether
/// SIGTERM or SIGKILL ended it.
fn exit_status(ended: Ended, timed_out: bool) -> u8 {
    match (ended.stopped_by_us, timed_out) {
        (true, true) => EXIT_TIMED_OUT,
        (true, false) => 143,
        _ => u8::try_from(ended.code).unwrap_or(1),
    }
}

/// The exit status of a command stopped at its --timeout, without a schedule.
const EXIT_TIMED_OUT: u8 = 124;

/// A stop for a command run once: `shutdown`, or `timeout` after now. Tells whether the timeout
/// was the one that fired.
fn stop_with_timeout(
    shutdown: &CancellationToken,
    timeout: Option<Duration>,
) -> (
    CancellationToken,
    std::sync::Arc<std::sync::atomic::AtomicBool>,
) {
    let stop = shutdown.child_token();
    let fired = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    if let Some(limit) = timeout {
        let (stop, fired) = (stop.clone(), fired.clone());
        tokio::spawn(async move {
            tokio::select! {
                () = stop.cancelled() => {}
                () = tokio::time::sleep(limit) => {
                    if !stop.is_cancelled() {
                        fired.store(true, std::sync::atomic::Ordering::SeqCst);
                        stop.cancel();
                        tracing::warn!("the command reached its --timeout");
                    }
                }
            }
        });
    }
    (stop, fired)
}

/// Runs the command with no lease (the store is down and the policy allows it).
async fn unleased(args: RunArgs, s: Settings, holder: &str) -> Result<u8, Failure> {
    let env = base_env(&s.name, holder);
    let (ended, timed_out) = run_command(args.command, env, &s, None).await;
    Ok(exit_status(ended?, timed_out))
}

/// Runs `argv` with `env` once, stopped when this process is asked to stop, at the --timeout,
/// or (with `lease`: a guard's deadline updates and its expiring signal) as the lease ends:
/// how it ended, and whether the timeout stopped it.
async fn run_command(
    argv: Vec<String>,
    env: Vec<(String, String)>,
    s: &Settings,
    lease: Option<(watch::Receiver<Instant>, CancellationToken)>,
) -> (anyhow::Result<Ended>, bool) {
    let spec = ChildSpec {
        argv,
        env,
        output: None,
    };
    let (shutdown, signals) = shutdown_token();
    let (stop, timed_out) = stop_with_timeout(&shutdown, s.run_policy.timeout);
    let (deadline, expiring) = lease.unzip();
    let stops = Stops {
        grace: s.config.stop_margin,
        deadline,
        expiring,
        requested: Some(stop.clone()),
    };
    let ended = child::run(&spec, stops).await;
    stop.cancel();
    signals.abort();
    (ended, timed_out.load(std::sync::atomic::Ordering::SeqCst))
}

/// A refusal (wrong key type, no permission) ends the run with exit 78; other errors with 69.
fn acquire_failure(e: LeaseError) -> Failure {
    let transient = e.is_transient();
    Failure::store(e, transient)
}

/// Without a schedule: run the command once if we win the lease.
async fn once(args: RunArgs, s: Settings, store: Option<BoxStore>) -> Result<u8, Failure> {
    let Some(store) = store else {
        let holder = s.holder.as_ref().map(|h| h.to_string()).unwrap_or_default();
        return unleased(args, s, &holder).await;
    };
    let mut lease = Lease::new(store, s.name.clone(), s.config).map_err(Failure::usage)?;
    if let Some(h) = s.holder.clone() {
        lease = lease.with_holder(h);
    }
    let guard = if args.wait {
        tokio::select! {
            g = lease.acquire() => g.map_err(acquire_failure)?,
            () = termination() => return Ok(0),
        }
    } else {
        match lease.try_acquire().await {
            Ok(TryAcquire::Acquired(g)) => g,
            Ok(TryAcquire::Busy { holder, remaining }) => {
                crate::logging::line(&format!(
                    "leasehold: lease {} is held by {holder} for another {remaining:.1?}; not running",
                    s.name
                ));
                return Ok(EXIT_BUSY);
            }
            Err(e) if e.is_transient() && args.on_store_down != StoreDownPolicy::FailClosed => {
                tracing::warn!(error = %crate::failure::one_line(&e.into()), policy = %args.on_store_down, "store unavailable; running without the lease");
                let holder = lease.holder().to_string();
                return unleased(args, s, &holder).await;
            }
            Err(e) => return Err(acquire_failure(e)),
        }
    };
    let mut env = base_env(&s.name, guard.holder().as_str());
    env.push(("LEASEHOLD_TOKEN".into(), guard.token().to_string()));
    let lease = (guard.deadline_updates(), guard.cancellation_token());
    let (ended, timed_out) = run_command(args.command, env, &s, Some(lease)).await;
    let reason = guard
        .loss_reason()
        .unwrap_or(leasehold::LossReason::Expired);
    let _ = guard.release().await;
    let ended = ended?;
    // A run cut short by the lease is a failure whatever the command then returned (a
    // `trap 'exit 0' TERM` must not turn it into a success): the command's own status stands
    // only when the lease was held until it ended.
    if ended.lease_ended {
        return Err(Failure::from(anyhow!(
            "lease lost while the command ran: {} ({reason}); the command was stopped",
            s.name
        )));
    }
    Ok(exit_status(ended, timed_out))
}

/// A scheduled command: what it runs and how it is stopped.
pub struct CommandRun {
    /// The name the command sees as `LEASEHOLD_LEASE`.
    pub lease: LeaseName,
    /// Program and arguments.
    pub argv: Vec<String>,
    /// Environment before the `LEASEHOLD_*` variables.
    pub env: Vec<(String, String)>,
    /// How long it has after SIGTERM (the lease's stop margin).
    pub grace: Duration,
    /// Its timeout and retries.
    pub policy: leasehold::RunPolicy,
    /// Keep the end of its output in each run's record.
    pub output: Option<child::OutputTail>,
}

/// A task that runs `command` once per slot, supervised (src/child.rs) by its task lease: for
/// `run --every/--cron` and every line of `crontab`. With `log_as`, the run's log lines carry
/// that task name first.
pub fn command_task(
    name: LeaseName,
    schedule: Schedule,
    command: CommandRun,
    log_as: Option<&LeaseName>,
) -> Task {
    let span = log_as.map(|task| tracing::info_span!("task", name = %task));
    let policy = command.policy;
    let task = Task::new(name, schedule, move |ctx: TaskContext| {
        let mut env = command.env.clone();
        env.extend(base_env(&command.lease, ctx.holder.as_str()));
        if let Some(t) = ctx.token {
            env.push(("LEASEHOLD_TOKEN".into(), t.to_string()));
        }
        if let Some(slot) = ctx.slot {
            env.push(("LEASEHOLD_SLOT".into(), slot.to_string()));
        }
        env.push(("LEASEHOLD_TRIGGER".into(), ctx.trigger.as_str().into()));
        env.push(("LEASEHOLD_ATTEMPT".into(), ctx.attempt.to_string()));
        let spec = ChildSpec {
            argv: command.argv.clone(),
            env,
            output: command.output.clone(),
        };
        let grace = command.grace;
        let run = async move {
            // The run's cancel token fires when the lease starts expiring (a stop margin, the
            // grace, before its deadline) or on shutdown: SIGTERM then, SIGKILL before the
            // deadline. Should the scheduler abort the run instead, dropping it kills the group.
            // The task lease's deadline goes to the supervisor, which stops the command by it
            // should this process be frozen.
            let ended = child::run(
                &spec,
                Stops {
                    grace,
                    deadline: ctx.lease_deadline(),
                    expiring: None,
                    requested: Some(ctx.cancel.clone()),
                },
            )
            .await?;
            if let Some(output) = ended.output {
                ctx.keep_output(output);
            }
            if ended.lease_ended {
                // The supervisor stopped the command by the deadline before this process saw the
                // lease run out (it was frozen): whatever the command returned, not a success.
                return Err(anyhow!(
                    "the task lease ran out while the command ran: the command was stopped"
                ));
            }
            match ended.code {
                0 => Ok(()),
                code => Err(anyhow!("command exited with status {code}")),
            }
        };
        let span = span.clone().unwrap_or_else(tracing::Span::none);
        tracing::Instrument::instrument(run, span)
    });
    task.with_run_policy(policy)
}

/// With a schedule: the scheduler runs the command once per tick on the leader.
async fn scheduled(
    args: RunArgs,
    s: Settings,
    schedule: Schedule,
    store: BoxStore,
) -> Result<u8, Failure> {
    let task_name = LeaseName::new(format!("{}:run", s.name)).map_err(|e| {
        Failure::usage(anyhow!(
            "{e} (a scheduled job also uses the name {}:run; shorten --lease)",
            s.name
        ))
    })?;
    let retry = s.config.retry_interval;
    let mut task = command_task(
        task_name,
        schedule,
        CommandRun {
            lease: s.name.clone(),
            argv: args.command.clone(),
            env: Vec::new(),
            grace: s.config.stop_margin,
            policy: s.run_policy,
            output: output_tail(
                args.output_tail,
                &leasehold_connect::store_url(args.store.clone()),
            ),
        },
        None,
    );
    if let Some(policy) = s.catch_up {
        task = task.catch_up(policy);
    }
    // Shutdown drains a running command (up to --drain), then stops it (SIGTERM, SIGKILL
    // after the grace period).
    let mut sched = Scheduler::new(store.clone())
        .lease_config(s.config)
        .leader_group(s.name.clone())
        .on_store_down(args.on_store_down)
        .registered_as(TaskSource::Run)
        .history_limit(args.history)
        .task(task);
    if let Some(h) = s.holder {
        sched = sched.holder(h);
    }
    // The first firing due, as this host's clock sees it.
    let first = s
        .schedule
        .as_ref()
        .and_then(|schedule| schedule.next_after(crate::history::local_now_ms()))
        .map_or_else(|| "none".to_owned(), crate::history::time);
    tracing::info!(lease = %s.name, store = %store.describe(), policy = %args.on_store_down, first_slot = %first, "scheduling");
    let draining = crate::drain::start(sched, args.drain.unwrap_or(s.config.ttl))
        .map_err(|e| Failure::usage(anyhow!("cannot start: {e}")))?;
    let handle = &draining.handle;
    if let ConnectTimeout(Some(limit)) = args.connect_timeout {
        let never = tokio::select! {
            () = handle.wait() => None,
            never = first_answer(&store, limit, retry) => never,
        };
        if let Some(error) = never {
            handle.shutdown().await;
            return Err(Failure::store(
                anyhow::Error::new(error).context(format!(
                    "never connected to {} within --connect-timeout {}",
                    store.describe(),
                    humantime::format_duration(limit)
                )),
                true,
            )
            .next_step(
                "start the server, or correct the host and port in --store or \
                 LEASEHOLD_STORE (--connect-timeout forever keeps retrying)",
            ));
        }
    }
    handle.wait().await;
    match handle.failure() {
        Some(reason) => Err(Failure::store(
            anyhow!("giving up, the store keeps refusing: {reason}"),
            false,
        )),
        None => Ok(0),
    }
}
