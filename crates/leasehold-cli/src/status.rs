//! `leasehold status`: who holds which lease.

use std::time::Duration;

use clap::Args;
use leasehold::fleet::Fleet;
use leasehold::overview::{self, LeaseSummary, TaskState, TaskSummary as FleetTask};
use leasehold::{BoxStore, LeaseName, Schedule, Store};

use leasehold::history::{RunOutcome, RunRecord};

use crate::failure::Failure;
use crate::output::outln;
use crate::{fleet, history};

/// The most leases `status` without names lists.
const LEASE_LIMIT: usize = 1000;

#[derive(Args)]
pub struct StatusArgs {
    /// Store URL [default: $LEASEHOLD_STORE, else sqlite:leasehold.db]
    #[arg(long)]
    store: Option<String>,
    /// Lease names to show (a scheduled job `NAME` also has `NAME:run`, held while it runs).
    /// Without names: every task in the store's catalog, the leases and the groups.
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
    if names.is_empty() {
        return fleet_status(store, args.json).await;
    }
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
            // As given until the catalog below says how it is shown.
            tasks.push(TaskSummary::of(task, name.to_string(), &records, now_ms));
        }
    }
    // The catalog says what the history cannot: a task paused (or not yet due) before it ever
    // ran, and who paused one that did.
    let fleet = Fleet::new(store.clone());
    for name in &names {
        let Ok(found) = overview::task(&fleet, name, 0).await else {
            continue;
        };
        let Ok(task) = LeaseName::new(&found.task.name) else {
            continue;
        };
        match tasks.iter_mut().find(|t| t.task == task) {
            Some(t) => {
                t.shown = found.task.shown_name().to_owned();
                t.paused = found.task.paused;
            }
            None => tasks.push(TaskSummary::of_catalog(task, &found.task)),
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
        crate::output::json(&doc)?;
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
            .map(|t| t.shown.len())
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
        outln!("")?;
        outln!(
            "{:<width$}  {:<24}  {:<24}  {zone_head}LAST OUTCOME",
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
                t.shown,
                t.last_run
                    .as_ref()
                    .and_then(|r| r.started_ms)
                    .map_or_else(dash, history::time),
                t.next_due.map_or_else(dash, history::time),
                t.last_run.as_ref().map_or_else(dash, history::outcome),
            )?;
            if let Some(pause) = &t.paused {
                let reason = pause
                    .reason
                    .as_deref()
                    .map(|r| format!(": {}", leasehold::text::visible(r)))
                    .unwrap_or_default();
                outln!(
                    "{:<width$}  paused by {} at {}{reason}",
                    "",
                    leasehold::text::visible(&pause.by),
                    history::time(pause.at_ms)
                )?;
            }
        }
    }
    Ok(0)
}

/// A task's last run and next due slot, from its history.
struct TaskSummary {
    /// The name its records are filed under.
    task: LeaseName,
    /// The name it is shown by ([`leasehold::fleet::shown_name`]).
    shown: String,
    last_run: Option<RunRecord>,
    /// The newest runs that failed in a row.
    consecutive_failures: u64,
    last_success_ms: Option<u64>,
    schedule: Option<Schedule>,
    next_due: Option<u64>,
    /// Who paused it, when and why, as the catalog says.
    paused: Option<leasehold::catalog::Pause>,
}

impl TaskSummary {
    fn of(task: LeaseName, shown: String, records: &[RunRecord], now_ms: u64) -> Self {
        let last_run = records
            .iter()
            .filter(|r| !matches!(r.outcome, RunOutcome::Missed { .. }))
            .max_by_key(|r| r.started_ms)
            .cloned();
        let schedule = overview::recorded_schedule(records);
        Self {
            task,
            shown,
            last_run,
            consecutive_failures: overview::consecutive_failures(records),
            last_success_ms: overview::last_success_ms(records),
            next_due: schedule.as_ref().and_then(|s| s.next_after(now_ms)),
            schedule,
            paused: None,
        }
    }

    /// A task in the catalog with no history yet.
    fn of_catalog(task: LeaseName, found: &FleetTask) -> Self {
        Self {
            task,
            shown: found.shown_name().to_owned(),
            last_run: None,
            consecutive_failures: 0,
            last_success_ms: None,
            schedule: found
                .definition
                .as_ref()
                .and_then(|d| overview::schedule_of_text(&d.schedule)),
            next_due: found.next_slot_ms,
            paused: found.paused.clone(),
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
            "consecutive_failures": self.consecutive_failures,
            "last_success_ms": self.last_success_ms,
            "next_due_ms": self.next_due,
            "time_zone": self.time_zone(),
            "next_due_local": self.next_due_local(),
            "paused": self.paused,
        })
    }
}

/// `leasehold status` without names: every task in the store's catalog, the leases, and the
/// leader groups (`leasehold::overview`, as the sidecar's GET /v1/tasks answers it).
async fn fleet_status(store: BoxStore, json: bool) -> Result<u8, Failure> {
    let fleet = Fleet::new(store);
    let list = overview::tasks(&fleet).await.map_err(fleet::failure)?;
    let leases = overview::leases(&fleet, LEASE_LIMIT)
        .await
        .map_err(fleet::failure)?
        .leases;
    let groups = groups(&list.tasks, &leases);
    let kind = |name: &str| match () {
        () if list.tasks.iter().any(|t| t.name == name) => "task",
        () if groups.iter().any(|g| g.name == name) => "group",
        () => "lease",
    };
    if json {
        let leases: Vec<_> = leases
            .iter()
            .map(|l| {
                let mut v = serde_json::to_value(l).unwrap_or_default();
                v["kind"] = kind(&l.name).into();
                v
            })
            .collect();
        let doc = serde_json::json!({
            "store": fleet.store().describe(),
            "now_ms": list.now_ms,
            "tasks": list.tasks,
            "leases": leases,
            "groups": groups.iter().map(Group::json).collect::<Vec<_>>(),
        });
        crate::output::json(&doc)?;
        return Ok(0);
    }
    // Each task by the name people know it by, unless another task has that name.
    let shown = |name: &str| -> String {
        let Some(t) = list.tasks.iter().find(|t| t.name == name) else {
            return name.to_owned();
        };
        match t.shown_name() {
            s if s != t.name && list.tasks.iter().any(|o| o.name == s) => t.name.clone(),
            s => s.to_owned(),
        }
    };
    outln!("store: {}", fleet.store().describe())?;
    if list.tasks.is_empty() {
        outln!("no tasks in the catalog")?;
    } else {
        let width = column(list.tasks.iter().map(|t| shown(&t.name).len()), "TASK");
        let sched = column(
            list.tasks
                .iter()
                .map(|t| t.definition.as_ref().map_or(1, |d| d.schedule.len())),
            "SCHEDULE",
        );
        outln!(
            "{:<width$}  {:<13}  {:<sched$}  {:<9}  {:<24}  {:<11}  {:<24}  MISSED 24H",
            "TASK",
            "STATE",
            "SCHEDULE",
            "INSTANCES",
            "LAST RUN (UTC)",
            "OUTCOME",
            "NEXT SLOT (UTC)",
        )?;
        for t in &list.tasks {
            let live = t.instances.iter().filter(|i| i.live).count();
            let dash = || "-".to_owned();
            let state = match t.state {
                TaskState::Failing => format!("failing ({})", t.consecutive_failures),
                state => state.as_str().to_owned(),
            };
            outln!(
                "{:<width$}  {:<13}  {:<sched$}  {:<9}  {:<24}  {:<11}  {:<24}  {}",
                shown(&t.name),
                state,
                t.definition.as_ref().map_or("-", |d| d.schedule.as_str()),
                format!("{live}/{}", t.instances.len()),
                t.last_run
                    .as_ref()
                    .and_then(|r| r.started_ms)
                    .map_or_else(dash, history::time),
                t.last_run.as_ref().map_or("-", |r| r.outcome.as_str()),
                t.next_slot_ms.map_or_else(dash, history::time),
                t.missed_24h,
            )?;
            let live: Vec<String> = t
                .instances
                .iter()
                .filter(|i| i.live)
                .map(|i| match &i.via {
                    Some(via) => format!("{} via {via}", i.instance),
                    None => i.instance.clone(),
                })
                .collect();
            if !live.is_empty() {
                outln!("{:<width$}  instances: {}", "", live.join(", "))?;
            }
            if t.consecutive_failures > 0 {
                let since = t
                    .last_success_ms
                    .map_or("no success recorded".to_owned(), |ms| {
                        format!("last success {}", history::time(ms))
                    });
                let error = t.last_run.as_ref().and_then(|r| r.error.as_deref());
                outln!(
                    "{:<width$}  {} failed in a row, {since}{}",
                    "",
                    t.consecutive_failures,
                    error
                        .map(|e| format!("; last error: {e}"))
                        .unwrap_or_default()
                )?;
            }
            if let Some(p) = &t.paused {
                let reason = p
                    .reason
                    .as_deref()
                    .map(|r| format!(": {r}"))
                    .unwrap_or_default();
                outln!(
                    "{:<width$}  paused by {} at {}{reason}",
                    "",
                    p.by,
                    history::time(p.at_ms)
                )?;
            }
            if let Some(q) = &t.trigger {
                outln!(
                    "{:<width$}  run {} asked for by {}, not taken yet",
                    "",
                    q.id,
                    q.by
                )?;
            }
        }
    }
    if !leases.is_empty() {
        let width = column(leases.iter().map(|l| l.name.len()), "LEASE");
        outln!("")?;
        outln!(
            "{:<width$}  {:<5}  {:>20}  {:>10}  HOLDER",
            "LEASE",
            "KIND",
            "TOKEN",
            "REMAINING"
        )?;
        for l in &leases {
            outln!(
                "{:<width$}  {:<5}  {:>20}  {:>10}  {}",
                l.name,
                kind(&l.name),
                l.token.as_deref().unwrap_or("-"),
                l.remaining_ms.map_or("-".to_owned(), |ms| format!(
                    "{:.1?}",
                    Duration::from_millis(ms)
                )),
                l.holder.as_deref().unwrap_or("-"),
            )?;
        }
    }
    if !groups.is_empty() {
        let width = column(groups.iter().map(|g| g.name.len()), "GROUP");
        outln!("")?;
        outln!("{:<width$}  {:<40}  TASKS", "GROUP", "LEADER")?;
        for g in &groups {
            outln!(
                "{:<width$}  {:<40}  {}",
                g.name,
                g.leader.as_deref().unwrap_or("-"),
                g.tasks
                    .iter()
                    .map(|t| shown(t))
                    .collect::<Vec<_>>()
                    .join(", ")
            )?;
        }
    }
    Ok(0)
}

/// A leader group: the tasks gated on it and its leader now.
struct Group {
    name: String,
    leader: Option<String>,
    token: Option<String>,
    tasks: Vec<String>,
}

impl Group {
    fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "name": self.name,
            "leader": self.leader,
            "token": self.token,
            "tasks": self.tasks,
        })
    }
}

fn groups(tasks: &[FleetTask], leases: &[LeaseSummary]) -> Vec<Group> {
    let mut groups: Vec<Group> = Vec::new();
    for t in tasks {
        let Some(name) = t.definition.as_ref().and_then(|d| d.leader_group.clone()) else {
            continue;
        };
        match groups.iter_mut().find(|g| g.name == name) {
            Some(g) => g.tasks.push(t.name.clone()),
            None => {
                let lease = leases.iter().find(|l| l.name == name);
                groups.push(Group {
                    leader: lease.and_then(|l| l.holder.clone()),
                    token: lease.and_then(|l| l.token.clone()),
                    tasks: vec![t.name.clone()],
                    name,
                });
            }
        }
    }
    groups.sort_by(|a, b| a.name.cmp(&b.name));
    groups
}

/// A column's width: its widest entry (given as lengths) or its head.
fn column(lengths: impl Iterator<Item = usize>, head: &str) -> usize {
    lengths.max().unwrap_or(0).max(head.len())
}
