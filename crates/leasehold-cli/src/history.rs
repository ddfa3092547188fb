//! `leasehold history`: what ran for a task, and which slots did not run and why.

use std::path::PathBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::anyhow;
use clap::Args;
use leasehold::fleet::Fleet;
use leasehold::history::{RetryNote, RunOutcome, RunRecord};
use leasehold::{BoxStore, LeaseName, Store};

use crate::failure::Failure;
use crate::output::outln;

#[derive(Args)]
pub struct HistoryArgs {
    /// Store URL [default: $LEASEHOLD_STORE, else sqlite:leasehold.db]
    #[arg(long)]
    store: Option<String>,
    /// The task: a library task's name, or the `--lease` of a `leasehold run --every/--cron`
    /// job (whose runs are filed under `NAME:run`, which is accepted too).
    task: String,
    /// How many entries to show, newest first [default: 20; with --svg, all the store keeps]
    #[arg(long)]
    limit: Option<usize>,
    /// Print JSON (`{"task": NAME, "runs": [records, newest first]}`) instead of a table.
    #[arg(long, conflicts_with = "svg")]
    json: bool,
    /// Write the history as a timeline picture (SVG) to FILE instead of printing a table: runs
    /// as bars on a UTC time axis coloured by outcome, missed and paused slots marked with
    /// their reason; hover a bar or marker for its slot, holder, token and duration.
    #[arg(long, value_name = "FILE")]
    svg: Option<PathBuf>,
    /// Print each run's kept output (`leasehold run --output-tail`, the library's
    /// `keep_output`, the sidecar's `done`) under its row, each line indented after `| `, with
    /// control characters escaped. (`--json` always carries it, as `output`.)
    #[arg(long, conflicts_with = "svg")]
    output: bool,
}

/// Entries a picture shows when --limit is not given: more than any store keeps by default.
const SVG_LIMIT: usize = 1000;

/// The store of a command that reads or controls it (`status`, `history`, `pause`, `resume`,
/// `trigger`): never created, so a mistyped SQLite path exits 66 naming the file.
pub async fn open(store: Option<String>) -> Result<BoxStore, Failure> {
    let url = leasehold_connect::store_url(store);
    leasehold_connect::open_existing_store(&url)
        .await
        .map_err(Failure::open)
}

/// The task's history, newest first: under `name`, or, if that has none and `name` is a
/// `leasehold run` lease, under `name:run`. `None` when the store keeps no history.
pub async fn records(
    store: &BoxStore,
    name: &LeaseName,
    limit: usize,
) -> Result<Option<(LeaseName, Vec<RunRecord>)>, Failure> {
    let read = |task: LeaseName| async move {
        match leasehold::history::read(store, &task, limit).await {
            Ok(records) => Ok(Some((task, records))),
            Err(leasehold::StoreError::Unsupported(_)) => Ok(None),
            Err(e) => Err(Failure::store_op(
                e,
                format!("cannot read the history of {task}"),
            )),
        }
    };
    let found = read(name.clone()).await?;
    if matches!(&found, Some((_, r)) if !r.is_empty()) || name.as_str().ends_with(":run") {
        return Ok(found);
    }
    match LeaseName::new(format!("{name}:run")) {
        Ok(run_task) => match read(run_task).await? {
            Some((task, r)) if !r.is_empty() => Ok(Some((task, r))),
            _ => Ok(found),
        },
        Err(_) => Ok(found),
    }
}

/// The name the task `given` (whose records are filed under `task`) is shown by
/// ([`leasehold::fleet::shown_name`]): as the catalog says, else as given.
pub async fn shown(store: &BoxStore, given: &LeaseName, task: &LeaseName) -> String {
    match Fleet::new(store.clone()).task(task).await {
        Ok(view) if &view.name == task => view.shown_name().to_owned(),
        _ => given.to_string(),
    }
}

pub async fn history(args: HistoryArgs) -> Result<u8, Failure> {
    let name = LeaseName::new(&args.task).map_err(Failure::usage)?;
    let limit = match (args.limit, &args.svg) {
        (Some(0), _) => return Err(Failure::usage(anyhow!("--limit must be at least 1"))),
        (Some(n), _) => n,
        (None, Some(_)) => SVG_LIMIT,
        (None, None) => 20,
    };
    let store = open(args.store).await?;
    let Some((task, records)) = records(&store, &name, limit).await? else {
        return Err(Failure::usage(anyhow!(
            "the {} store keeps no run history",
            store.describe()
        )));
    };
    let shown = shown(&store, &name, &task).await;
    if let Some(path) = &args.svg {
        let now = store.now_millis().await.unwrap_or_else(|_| local_now_ms());
        let picture = leasehold_timeline::history_svg(&shown, &records, now);
        std::fs::write(path, picture)
            .map_err(|e| anyhow!("cannot write {}: {e}", path.display()))?;
        outln!(
            "wrote {}: {} entries of {shown}",
            path.display(),
            records.len()
        )?;
        return Ok(0);
    }
    if args.json {
        // `slot_ms` and `duration_ms` as `status --json` and the API name them, beside the
        // record's own fields (`slot` stays for scripts written against earlier releases).
        // `task` is the name the records are filed under, exact, as everywhere in JSON.
        let runs: Vec<serde_json::Value> = records
            .iter()
            .map(|r| {
                let mut run = serde_json::to_value(r).unwrap_or_default();
                if let Some(run) = run.as_object_mut() {
                    if let Some(slot) = r.slot {
                        run.insert("slot_ms".into(), slot.into());
                    }
                    if let Some(took) = r.duration() {
                        run.insert("duration_ms".into(), (took.as_millis() as u64).into());
                    }
                }
                run
            })
            .collect();
        let doc = serde_json::json!({ "task": task.as_str(), "runs": runs });
        crate::output::json(&doc)?;
        return Ok(0);
    }
    outln!("task: {shown}   store: {}", store.describe())?;
    if records.is_empty() {
        outln!("no runs recorded")?;
        return Ok(0);
    }
    outln!(
        "{:<24}  {:<9}  {:<28}  {:>9}  OUTCOME",
        "SLOT (UTC)",
        "TRIGGER",
        "HOLDER",
        "DURATION"
    )?;
    for r in &records {
        let when = r.slot.or(r.started_ms).map_or("-".to_owned(), time);
        let trigger = r.trigger.map_or("-".to_owned(), |t| t.to_string());
        let duration = match (&r.outcome, r.duration()) {
            (RunOutcome::Missed { .. } | RunOutcome::Running, _) | (_, None) => "-".to_owned(),
            (_, Some(d)) => format!("{:.1?}", d),
        };
        outln!(
            "{when:<24}  {trigger:<9}  {:<28}  {duration:>9}  {}{}",
            r.holder,
            outcome(r),
            attempt(r)
        )?;
        if let Some(output) = r.output.as_deref().filter(|_| args.output) {
            // One escaped line per line printed: a newline in the output cannot forge a row.
            for line in output.strip_suffix('\n').unwrap_or(output).split('\n') {
                outln!("    | {line}")?;
            }
        }
    }
    Ok(0)
}

/// `2026-12-03T03:00:00.000Z`.
pub fn time(ms: u64) -> String {
    humantime::format_rfc3339_millis(UNIX_EPOCH + Duration::from_millis(ms)).to_string()
}

/// The outcome and its detail, on one line.
pub fn outcome(r: &RunRecord) -> String {
    if let (Some(pause), RunOutcome::Missed { .. }) = (&r.paused, &r.outcome) {
        let reason = pause
            .reason
            .as_deref()
            .map(|r| format!(": {r}"))
            .unwrap_or_default();
        return format!("paused by {}{reason}", pause.by);
    }
    match (&r.outcome, r.error()) {
        (
            RunOutcome::Missed {
                count,
                last_slot,
                reason,
            },
            _,
        ) if *count > 1 => format!("missed {count} slots to {}: {reason}", time(*last_slot)),
        (RunOutcome::Missed { reason, .. }, _) => format!("missed: {reason}"),
        (_, Some(error)) => format!("{}: {error}", r.word()),
        (_, None) => r.word().to_owned(),
    }
}

/// For a task with retries: which attempt the run was, and what became of the next one.
pub fn attempt(r: &RunRecord) -> String {
    let Some(attempt) = r.attempt else {
        return String::new();
    };
    match r.retry {
        Some(RetryNote::AtMs(at)) => format!(" (attempt {attempt}; retry at {})", time(at)),
        Some(RetryNote::DroppedBeforeSlot(next)) => format!(
            " (attempt {attempt}; retry dropped: the next slot, {}, came first)",
            time(next)
        ),
        _ => format!(" (attempt {attempt})"),
    }
}

/// The local wall clock, for a store that cannot tell its own.
pub fn local_now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

#[cfg(test)]
mod tests {
    use leasehold::history::{RecordTrigger, RetryNote, RunRecord};

    #[test]
    fn an_attempt_is_shown_with_what_became_of_its_retry() {
        let mut r = RunRecord::started(Some(0), RecordTrigger::Timer, "a", None, 0, None);
        assert_eq!(super::attempt(&r), "", "a task without retries shows none");
        r.attempt = Some(2);
        assert_eq!(super::attempt(&r), " (attempt 2)");
        r.retry = Some(RetryNote::AtMs(1_500));
        assert_eq!(
            super::attempt(&r),
            " (attempt 2; retry at 1970-01-01T00:00:01.500Z)"
        );
        r.retry = Some(RetryNote::DroppedBeforeSlot(60_000));
        assert_eq!(
            super::attempt(&r),
            " (attempt 2; retry dropped: the next slot, 1970-01-01T00:01:00.000Z, came first)"
        );
    }
}
