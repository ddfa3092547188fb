//! Running a crontab: every line a task of one Scheduler, each gated across the replicas, and
//! reloads (SIGHUP, or a file whose content changed) applied to the running scheduler.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::anyhow;
use leasehold::catalog::TaskSource;
use leasehold::store::Metered;
use leasehold::{
    BoxStore, LeaseConfig, LeaseName, Scheduler, SchedulerHandle, Store, StoreDownPolicy,
};
use tokio::sync::Mutex;

use super::parse::Job;
use super::{CrontabArgs, Placement, load};
use crate::child::OutputTail;
use crate::failure::Failure;
use crate::run::{CommandRun, command_task};

/// What every line's command is given: its grace period, and how much of its output is kept.
#[derive(Clone)]
struct Commands {
    grace: Duration,
    output: Option<OutputTail>,
}

/// The task of one line: `SHELL -c COMMAND` with the line's environment.
fn task_of(job: &Job, commands: &Commands) -> leasehold::Task {
    let mut task = command_task(
        job.name.clone(),
        job.schedule.clone(),
        CommandRun {
            lease: job.name.clone(),
            argv: vec![job.shell.clone(), "-c".into(), job.command.clone()],
            env: job.env.clone(),
            grace: commands.grace,
            policy: job.run_policy,
            output: commands.output.clone(),
        },
        Some(&job.name),
    );
    if let Some(policy) = job.catch_up {
        task = task.catch_up(policy);
    }
    if let Some(policy) = job.on_store_down {
        task = task.on_store_down(policy);
    }
    task
}

fn lease_config(args: &CrontabArgs) -> Result<LeaseConfig, Failure> {
    let mut config = LeaseConfig::new(args.ttl);
    if let Some(grace) = args.grace {
        config = config.stop_margin(grace);
    }
    config.validate().map_err(|e| match e {
        leasehold::ConfigError::StopMarginTooLarge { stop, room } => Failure::usage(anyhow!(
            "--grace {stop:?} leaves no time to renew: it must be below {room:?}; raise --ttl \
             or lower --grace"
        )),
        e => Failure::usage(e),
    })?;
    Ok(config)
}

pub async fn run(args: CrontabArgs, texts: Vec<String>, jobs: Vec<Job>) -> Result<u8, Failure> {
    let config = lease_config(&args)?;
    let group = LeaseName::new(&args.group).map_err(Failure::usage)?;
    let holder = crate::run::holder_arg(args.holder.as_deref())?;
    crate::service::warn_if_no_store(args.store.as_deref());
    if let Some(listen) = &args.metrics_listen {
        crate::service::serve_metrics(listen).await?;
    }
    let url = leasehold_connect::store_url(args.store.clone());
    let mut store = leasehold_connect::open_store_lazy(&url)
        .await
        .map_err(Failure::open)?;
    if args.metrics_listen.is_some() {
        store = BoxStore::new(Metered::new(store));
    }
    crate::reaper::start_if_init();
    let policy = args.on_store_down.unwrap_or(StoreDownPolicy::FailClosed);
    // Shutdown drains running commands (up to --drain), as `leasehold run` does.
    let mut sched = Scheduler::new(store.clone())
        .lease_config(config)
        .on_store_down(policy)
        .registered_as(TaskSource::Crontab)
        .history_limit(args.history);
    sched = match args.placement {
        Placement::Leader => sched.leader_group(group.clone()),
        Placement::Spread => sched.spread(group.clone()),
    };
    if let Some(h) = holder {
        sched = sched.holder(h);
    }
    let commands = Commands {
        grace: config.stop_margin,
        output: crate::run::output_tail(args.output_tail, &url),
    };
    for job in &jobs {
        sched = sched.task(task_of(job, &commands));
    }
    tracing::info!(store = %store.describe(), placement = ?args.placement, group = %group, lines = jobs.len(), "running the crontab");
    let drain = args.drain.unwrap_or(config.ttl);
    let draining = crate::drain::start(sched, drain)
        .map_err(|e| Failure::usage(anyhow!("cannot start: {e}")))?;
    let handle = draining.handle.clone();
    let reloads = tokio::spawn(reload_loop(handle.clone(), args, texts, jobs, commands));
    handle.wait().await;
    reloads.abort();
    match handle.failure() {
        Some(reason) => Err(Failure::store(
            anyhow!("giving up, the store keeps refusing: {reason}"),
            false,
        )),
        None => Ok(0),
    }
}

/// Completes on SIGHUP, or never if its handler cannot be installed (then the files are still
/// watched).
async fn hangups() -> Option<tokio::signal::unix::Signal> {
    use tokio::signal::unix::{SignalKind, signal};
    match signal(SignalKind::hangup()) {
        Ok(s) => Some(s),
        Err(e) => {
            tracing::warn!(error = %e, "cannot handle SIGHUP; reloading only on file changes");
            None
        }
    }
}

/// Reloads on SIGHUP and when a file's content changes, until the process stops.
async fn reload_loop(
    handle: SchedulerHandle,
    args: CrontabArgs,
    mut texts: Vec<String>,
    jobs: Vec<Job>,
    commands: Commands,
) {
    let mut hup = hangups().await;
    let defaults = args.defaults();
    let mut running: HashMap<LeaseName, Job> =
        jobs.into_iter().map(|j| (j.name.clone(), j)).collect();
    let names = Names::default();
    // The last refusal, so a bad file is reported once per change, not every poll.
    let mut refused: Option<Vec<String>> = None;
    let mut poll = tokio::time::interval(args.poll);
    poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let asked = tokio::select! {
            () = async {
                match hup.as_mut() {
                    Some(s) => { s.recv().await; }
                    None => std::future::pending().await,
                }
            } => true,
            _ = poll.tick() => false,
        };
        if asked {
            tracing::info!("SIGHUP: reloading the crontab");
        } else if current_texts(&args.files).as_ref() == Some(&texts) {
            continue;
        }
        let now = current_texts(&args.files);
        match load(&args.files, &defaults) {
            Ok((new_texts, new_jobs)) => {
                refused = None;
                texts = new_texts;
                apply(&handle, &names, &mut running, new_jobs, &commands);
            }
            Err(e) => {
                if asked || refused != now {
                    e.report("reload refused, the lines loaded before keep running: ");
                }
                refused = now.clone();
                // A file that changed back to what runs is no change.
                if let Some(now) = now {
                    texts = now;
                }
            }
        }
    }
}

/// The files' text now; `None` if one cannot be read.
fn current_texts(files: &[PathBuf]) -> Option<Vec<String>> {
    files
        .iter()
        .map(|f| std::fs::read_to_string(f).ok())
        .collect()
}

/// One lock per task name: the changes to one task (removed, then added back, say) happen in
/// order, each after the one before has finished.
#[derive(Default, Clone)]
struct Names(Arc<std::sync::Mutex<HashMap<LeaseName, Arc<Mutex<()>>>>>);

impl Names {
    fn of(&self, name: &LeaseName) -> Arc<Mutex<()>> {
        let mut map = self.0.lock().unwrap_or_else(|p| p.into_inner());
        map.entry(name.clone()).or_default().clone()
    }
}

/// Applies a reloaded file: new lines start, removed lines stop taking slots and leave once
/// their run has ended, changed lines are replaced (the old one's run ends first).
fn apply(
    handle: &SchedulerHandle,
    names: &Names,
    running: &mut HashMap<LeaseName, Job>,
    jobs: Vec<Job>,
    commands: &Commands,
) {
    let mut wanted: HashMap<LeaseName, Job> =
        jobs.into_iter().map(|j| (j.name.clone(), j)).collect();
    let (mut added, mut removed, mut changed) = (0, 0, 0);
    for (name, old) in running.iter() {
        let new = wanted.get(name);
        if new.is_some_and(|new| new.same_as(old)) {
            continue;
        }
        let replacement = new.cloned();
        match &replacement {
            Some(_) => changed += 1,
            None => removed += 1,
        }
        let (handle, lock, name) = (handle.clone(), names.of(name), name.clone());
        let commands = commands.clone();
        tokio::spawn(async move {
            let _turn = lock.lock_owned().await;
            match handle.remove_task(name.as_str()).await {
                Ok(()) => tracing::info!(task = %name, "line removed from the crontab: stopped"),
                Err(e) => tracing::warn!(task = %name, error = %e, "cannot remove the line"),
            }
            if let Some(job) = replacement {
                add(&handle, &job, &commands);
            }
        });
    }
    for (name, job) in &wanted {
        if running.contains_key(name) {
            continue;
        }
        added += 1;
        let (handle, lock, job) = (handle.clone(), names.of(name), job.clone());
        let commands = commands.clone();
        tokio::spawn(async move {
            let _turn = lock.lock_owned().await;
            add(&handle, &job, &commands);
        });
    }
    tracing::info!(
        lines = wanted.len(),
        added,
        removed,
        changed,
        "crontab reloaded"
    );
    std::mem::swap(running, &mut wanted);
}

fn add(handle: &SchedulerHandle, job: &Job, commands: &Commands) {
    match handle.add_task(task_of(job, commands)) {
        Ok(()) => {
            tracing::info!(task = %job.name, file = %job.file, line = job.line, "line added to the crontab")
        }
        Err(e) => tracing::warn!(task = %job.name, error = %e, "cannot add the line"),
    }
}
