//! `leasehold status`: who holds which lease.

use clap::Args;
use leasehold::{LeaseName, Schedule, Store};

use leasehold::history::{RunOutcome, RunRecord};

use crate::output::outln;
use crate::{Failure, history};

#[derive(Args)]
pub struct StatusArgs {
    /// Store URL [default: $LEASEHOLD_STORE, else sqlite:leasehold.db]
    #[arg(long)]
    store: Option<String>,
    /// Lease names to show (a scheduled job `NAME` also has `NAME:run`, held while it runs).
    #[arg(required = true)]
    names: Vec<String>,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

pub async fn status(args: StatusArgs) -> Result<u8, Failure> {
    let names = args
        .names
        .iter()
        .map(LeaseName::new)
        .collect::<Result<Vec<_>, _>>()
        .map_err(Failure::usage)?;
    let store = history::open(args.store).await?;
    let mut rows = Vec::new();
    let mut tasks = Vec::new();
    let now_ms = match store.now_millis().await {
        Ok(ms) => ms,
        Err(_) => history::local_now_ms(),
    };
    for name in &names {
        let state = store
            .inspect(name)
            .await
            .map_err(|e| Failure::store_op(e, format!("cannot read lease {name}")))?;
        rows.push((name, state));
        if let Some((task, records)) = history::records(&store, name, 50).await?
            && !records.is_empty()
            && !tasks.iter().any(|t: &TaskSummary| t.task == task)
        {
            tasks.push(TaskSummary::of(task, &records, now_ms));
        }
    }
    if args.json {
        let leases: Vec<_> = rows
            .iter()
            .map(|(name, state)| match state {
                Some(s) => serde_json::json!({
                    "name": name.as_str(),
                    "held": s.holder.is_some(),
                    "holder": s.holder.as_ref().map(|h| h.as_str()),
                    "token": s.token.get().to_string(),
                    "remaining_ms": s.remaining.as_millis() as u64,
                }),
                None => serde_json::json!({
                    "name": name.as_str(), "held": false, "holder": null, "token": null, "remaining_ms": 0,
                }),
            })
            .collect();
        let tasks: Vec<_> = tasks.iter().map(TaskSummary::json).collect();
        let doc =
            serde_json::json!({ "store": store.describe(), "leases": leases, "tasks": tasks });
        outln!("{doc}")?;
        return Ok(0);
    }
    outln!("store: {}", store.describe())?;
    let width = names
        .iter()
        .map(|n| n.as_str().len())
        .max()
        .unwrap_or(4)
        .max(5);
    outln!(
        "{:<width$}  {:<7}  {:>20}  {:>10}  HOLDER",
        "LEASE",
        "STATE",
        "TOKEN",
        "REMAINING"
    )?;
    for (name, state) in rows {
        match state {
            Some(s) => {
                let (st, holder) = match &s.holder {
                    Some(h) => ("held", h.as_str().to_owned()),
                    None => ("free", "-".to_owned()),
                };
                outln!(
                    "{:<width$}  {st:<7}  {:>20}  {:>10}  {holder}",
                    name.as_str(),
                    s.token.get(),
                    if s.holder.is_some() {
                        format!("{:.1?}", s.remaining)
                    } else {
                        "-".to_owned()
                    },
                )?;
            }
            None => outln!(
                "{:<width$}  {:<7}  {:>20}  {:>10}  -",
                name.as_str(),
                "never",
                "-",
                "-"
            )?,
        }
    }
    if !tasks.is_empty() {
        let width = tasks
            .iter()
            .map(|t| t.task.as_str().len())
            .max()
            .unwrap_or(4)
            .max(4);
        // The zone column only when a cron task has one (interval slots have no zone).
        let zoned = tasks.iter().any(|t| t.time_zone().is_some());
        let zone_head = if zoned {
            format!("{:<42}  ", "NEXT DUE (TASK'S ZONE)")
        } else {
            String::new()
        };
        outln!(
            "\n{:<width$}  {:<24}  {:<24}  {zone_head}LAST OUTCOME",
            "TASK",
            "LAST RUN (UTC)",
            "NEXT DUE (UTC)"
        )?;
        for t in &tasks {
            let dash = || "-".to_owned();
            let local = match (zoned, t.next_due_local(), t.time_zone()) {
                (false, ..) => String::new(),
                (true, Some(local), Some(zone)) => format!("{:<42}  ", format!("{local} {zone}")),
                (true, ..) => format!("{:<42}  ", "-"),
            };
            outln!(
                "{:<width$}  {:<24}  {:<24}  {local}{}",
                t.task.as_str(),
                t.last_run
                    .as_ref()
                    .and_then(|r| r.started_ms)
                    .map_or_else(dash, history::time),
                t.next_due.map_or_else(dash, history::time),
                t.last_run.as_ref().map_or_else(dash, history::outcome),
            )?;
        }
    }
    Ok(0)
}

/// A task's last run and next due slot, from its history.
struct TaskSummary {
    task: LeaseName,
    last_run: Option<RunRecord>,
    schedule: Option<Schedule>,
    next_due: Option<u64>,
}

impl TaskSummary {
    fn of(task: LeaseName, records: &[RunRecord], now_ms: u64) -> Self {
        let last_run = records
            .iter()
            .filter(|r| !matches!(r.outcome, RunOutcome::Missed { .. }))
            .max_by_key(|r| r.started_ms)
            .cloned();
        let schedule = history::schedule(records);
        Self {
            task,
            last_run,
            next_due: schedule.as_ref().and_then(|s| s.next_after(now_ms)),
            schedule,
        }
    }

    /// A cron task's zone (UTC unless it names one); none for interval tasks.
    fn time_zone(&self) -> Option<&str> {
        match self.schedule.as_ref()? {
            Schedule::Cron(c) => Some(c.time_zone()),
            _ => None,
        }
    }

    /// The next due slot as the wall-clock time of a cron task's zone.
    fn next_due_local(&self) -> Option<String> {
        match self.schedule.as_ref()? {
            Schedule::Cron(c) => c.local_time(self.next_due?),
            _ => None,
        }
    }

    fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "task": self.task.as_str(),
            "last_run": self.last_run,
            "next_due_ms": self.next_due,
            "time_zone": self.time_zone(),
            "next_due_local": self.next_due_local(),
        })
    }
}
