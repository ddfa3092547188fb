//! `leasehold run`: a command as a single-active job.

use std::time::Duration;

use anyhow::{Context, anyhow};
use clap::Args;
use leasehold::{
    BoxStore, CancellationToken, Lease, LeaseConfig, LeaseName, Schedule, Scheduler, Store,
    StoreDownPolicy, Task, TaskContext, TryAcquire,
};

use crate::child::{self, ChildSpec};
use crate::{EXIT_BUSY, Failure};

#[derive(Args)]
pub struct RunArgs {
    /// Store URL: sqlite:PATH, redis://…, rediss://…, postgres://… [default: $LEASEHOLD_STORE,
    /// else sqlite:leasehold.db]
    #[arg(long)]
    store: Option<String>,
    /// The lease name, shared by every instance of this job.
    #[arg(long)]
    lease: String,
    /// Run once per interval (aligned to the epoch on the store's clock), e.g. 30s.
    #[arg(long, value_parser = crate::duration_arg, conflicts_with = "cron")]
    every: Option<Duration>,
    /// Run on a cron schedule with a seconds field, in UTC, e.g. "0 */5 * * * *".
    #[arg(long)]
    cron: Option<String>,
    /// Lease ttl: how long a crashed holder blocks others.
    #[arg(long, default_value = "15s", value_parser = crate::duration_arg)]
    ttl: Duration,
    /// Time between renewals [default: ttl/3].
    #[arg(long, value_parser = crate::duration_arg)]
    renew: Option<Duration>,
    /// Time between retries after a store error [default: ttl/15, at most 1s].
    #[arg(long, value_parser = crate::duration_arg)]
    retry: Option<Duration>,
    /// How long a running command may take to finish on shutdown or after SIGTERM.
    #[arg(long, default_value = "10s", value_parser = crate::duration_arg)]
    grace: Duration,
    /// What to do when the store cannot be reached: fail-closed (skip), fail-open (run anyway,
    /// warn), local (single-instance mode).
    #[arg(long, default_value = "fail-closed")]
    on_store_down: StoreDownPolicy,
    /// This instance's holder id [default: host:pid:random].
    #[arg(long)]
    holder: Option<String>,
    /// Without a schedule: wait for the lease instead of exiting 75 when it is busy.
    #[arg(long, conflicts_with_all = ["every", "cron"])]
    wait: bool,
    /// The command and its arguments.
    #[arg(last = true, required = true)]
    command: Vec<String>,
}

struct Settings {
    name: LeaseName,
    schedule: Option<Schedule>,
    config: LeaseConfig,
    holder: Option<leasehold::HolderId>,
}

fn settings(args: &RunArgs) -> Result<Settings, Failure> {
    let name = LeaseName::new(&args.lease).map_err(Failure::usage)?;
    let schedule = match (&args.every, &args.cron) {
        (Some(every), _) => Some(Schedule::every(*every).map_err(Failure::usage)?),
        (None, Some(expr)) => Some(Schedule::cron(expr).map_err(Failure::usage)?),
        (None, None) => None,
    };
    let mut config = LeaseConfig::new(args.ttl);
    if let Some(renew) = args.renew {
        config = config.renew_interval(renew);
        config.retry_interval = config.retry_interval.min(renew);
    }
    if let Some(retry) = args.retry {
        config = config.retry_interval(retry);
    }
    config.validate().map_err(Failure::usage)?;
    let holder = args
        .holder
        .as_deref()
        .map(leasehold::HolderId::new)
        .transpose()
        .map_err(Failure::usage)?;
    Ok(Settings {
        name,
        schedule,
        config,
        holder,
    })
}

/// The store, or `None` when it cannot be reached and the policy is `local`.
async fn open(args: &RunArgs) -> Result<Option<BoxStore>, Failure> {
    let url = leasehold_connect::store_url(args.store.clone());
    match leasehold_connect::open_store(&url).await {
        Ok(store) => Ok(Some(store)),
        Err(e @ leasehold_connect::OpenError::UnknownScheme { .. }) => Err(Failure::usage(e)),
        Err(e) if args.on_store_down == StoreDownPolicy::Local => {
            tracing::warn!(error = %e, "store unreachable; single-instance mode (--on-store-down local): every tick runs here");
            Ok(None)
        }
        Err(e)
            if args.on_store_down == StoreDownPolicy::FailOpen
                && args.every.is_none()
                && args.cron.is_none() =>
        {
            tracing::warn!(error = %e, "store unreachable; running the command without the lease (--on-store-down fail-open)");
            Ok(None)
        }
        Err(e) => Err(Failure::store(e)),
    }
}

pub async fn run(args: RunArgs) -> Result<u8, Failure> {
    let settings = settings(&args)?;
    let store = open(&args).await?;
    match settings.schedule.clone() {
        Some(schedule) => scheduled(args, settings, schedule, store).await,
        None => once(args, settings, store).await,
    }
}

fn base_env(lease: &LeaseName, holder: &str) -> Vec<(String, String)> {
    vec![
        ("LEASEHOLD_LEASE".into(), lease.to_string()),
        ("LEASEHOLD_HOLDER".into(), holder.to_owned()),
    ]
}

/// Completes on the first SIGTERM or SIGINT.
async fn termination() {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        tracing::error!("cannot install signal handlers; stop with SIGKILL");
        return std::future::pending().await;
    };
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM: shutting down"),
        _ = int.recv() => tracing::info!("SIGINT: shutting down"),
    }
}

/// Without a schedule: run the command once if we win the lease.
async fn once(args: RunArgs, s: Settings, store: Option<BoxStore>) -> Result<u8, Failure> {
    let Some(store) = store else {
        let holder = s.holder.map(|h| h.to_string()).unwrap_or_default();
        let spec = ChildSpec {
            argv: args.command,
            env: base_env(&s.name, &holder),
        };
        let status = child::run(&spec, CancellationToken::new(), args.grace).await?;
        return Ok(child::exit_code(status) as u8);
    };
    let mut lease = Lease::new(store, s.name.clone(), s.config).map_err(Failure::usage)?;
    if let Some(h) = s.holder {
        lease = lease.with_holder(h);
    }
    let guard = if args.wait {
        tokio::select! {
            g = lease.acquire() => g.map_err(Failure::store)?,
            () = termination() => return Ok(0),
        }
    } else {
        match lease.try_acquire().await {
            Ok(TryAcquire::Acquired(g)) => g,
            Ok(TryAcquire::Busy { holder, remaining }) => {
                eprintln!(
                    "leasehold: lease {} is held by {holder} for another {remaining:.1?}; not running",
                    s.name
                );
                return Ok(EXIT_BUSY);
            }
            Err(e) if args.on_store_down != StoreDownPolicy::FailClosed => {
                tracing::warn!(error = %e, policy = %args.on_store_down, "store unavailable; running without the lease");
                let spec = ChildSpec {
                    argv: args.command,
                    env: base_env(&s.name, lease.holder().as_str()),
                };
                let status = child::run(&spec, CancellationToken::new(), args.grace).await?;
                return Ok(child::exit_code(status) as u8);
            }
            Err(e) => return Err(Failure::store(e)),
        }
    };
    let mut env = base_env(&s.name, guard.holder().as_str());
    env.push(("LEASEHOLD_TOKEN".into(), guard.token().to_string()));
    let spec = ChildSpec {
        argv: args.command,
        env,
    };
    let stop = guard.cancellation_token();
    let on_signal = stop.clone();
    let grace = args.grace;
    let signals = tokio::spawn(async move {
        termination().await;
        // Give the command the grace period before it is told to stop.
        tokio::time::sleep(grace).await;
        on_signal.cancel();
    });
    let status = child::run(&spec, stop, args.grace).await;
    signals.abort();
    if let Some(reason) = guard.loss_reason() {
        tracing::error!(%reason, "lease lost while the command ran; it was stopped");
    }
    let _ = guard.release().await;
    Ok(child::exit_code(status?) as u8)
}

/// With a schedule: the scheduler runs the command once per tick on the leader.
async fn scheduled(
    args: RunArgs,
    s: Settings,
    schedule: Schedule,
    store: Option<BoxStore>,
) -> Result<u8, Failure> {
    let task_name = LeaseName::new(format!("{}:run", s.name)).map_err(|e| {
        Failure::usage(anyhow!(
            "{e} (a scheduled job also uses the name {}:run; shorten --lease)",
            s.name
        ))
    })?;
    let lease_name = s.name.clone();
    let grace = args.grace;
    let argv = args.command.clone();
    let task = Task::new(task_name, schedule, move |ctx: TaskContext| {
        let mut env = base_env(&lease_name, ctx.holder.as_str());
        if let Some(t) = ctx.token {
            env.push(("LEASEHOLD_TOKEN".into(), t.to_string()));
        }
        if let Some(slot) = ctx.slot {
            env.push(("LEASEHOLD_SLOT".into(), slot.to_string()));
        }
        let spec = ChildSpec {
            argv: argv.clone(),
            env,
        };
        async move {
            let status = child::run(&spec, ctx.cancel.clone(), grace).await?;
            match child::exit_code(status) {
                0 => Ok(()),
                code => Err(anyhow!("command exited with status {code}")),
            }
        }
    });
    let handle = match store {
        Some(store) => {
            let mut sched = Scheduler::new(store.clone())
                .lease_config(s.config)
                .leader_group(s.name.clone())
                .grace_period(grace)
                .on_store_down(args.on_store_down)
                .task(task);
            if let Some(h) = s.holder {
                sched = sched.holder(h);
            }
            tracing::info!(lease = %s.name, store = %store.describe(), policy = %args.on_store_down, "scheduling");
            sched.start(termination()).context("cannot start")?
        }
        None => {
            let mut sched = Scheduler::local().grace_period(grace).task(task);
            if let Some(h) = s.holder {
                sched = sched.holder(h);
            }
            sched.start(termination()).context("cannot start")?
        }
    };
    handle.wait().await;
    Ok(0)
}
