//! `leasehold pause`, `resume`, `trigger` and `forget`: fleet-wide control of a task through the store
//! (`leasehold::fleet::Fleet`), the same records the sidecar's HTTP API and the library act on.

use std::time::Duration;

use clap::Args;
use leasehold::catalog::SlotRange;
use leasehold::fleet::{Fleet, FleetError};
use leasehold::history::RunOutcome;
use leasehold::{BoxStore, LeaseName, Store, text};

use crate::durations::duration_arg;
use crate::failure::{
    EXIT_BUSY, EXIT_NO_INSTANCE, EXIT_NOT_ENDED, EXIT_REFUSED, EXIT_TASK_LIVE, EXIT_UNKNOWN_TASK,
    EXIT_USAGE, Failure,
};
use crate::history;
use crate::output::outln;

#[derive(Args)]
pub struct PauseArgs {
    /// Store URL [default: $LEASEHOLD_STORE, else sqlite:leasehold.db]
    #[arg(long)]
    store: Option<String>,
    /// The task: a library task's name, the sidecar's {task}, or the --lease of `leasehold run`
    /// (also known by its catalog name, `NAME:run`).
    name: String,
    /// Why (shown by `leasehold status` and `history`, and recorded with each paused slot):
    /// one line of at most 2,000 bytes, no control or bidi characters.
    #[arg(long)]
    reason: Option<String>,
    /// Who pauses (default: $USER@HOST): one line of at most 200 bytes.
    #[arg(long)]
    by: Option<String>,
}

#[derive(Args)]
pub struct ResumeArgs {
    /// Store URL [default: $LEASEHOLD_STORE, else sqlite:leasehold.db]
    #[arg(long)]
    store: Option<String>,
    /// The task (as for pause).
    name: String,
}

#[derive(Args)]
pub struct TriggerArgs {
    /// Store URL [default: $LEASEHOLD_STORE, else sqlite:leasehold.db]
    #[arg(long)]
    store: Option<String>,
    /// The task (as for pause).
    name: String,
    /// Who asks (default: $USER@HOST): one line of at most 200 bytes.
    #[arg(long)]
    by: Option<String>,
    /// Wait for the run to end (at most DURATION, given as `--wait=DURATION`, default 10m) and
    /// print its outcome; exit 0 if it succeeded, 1 if not, 124 if it did not end in time.
    // `require_equals`: a bare `--wait` followed by the task's name must not take the name for
    // a duration.
    #[arg(long, value_name = "DURATION", num_args = 0..=1, require_equals = true, default_missing_value = "10m", value_parser = duration_arg)]
    wait: Option<Duration>,
    /// Backfill: run each slot of the task's schedule from FROM to TO (both included) that has
    /// no ok run in its history, oldest first, one at a time, as trigger `backfill`. FROM and
    /// TO: RFC 3339 (2027-03-01T00:00:00Z, or a date: 2027-03-01), slot milliseconds since the
    /// epoch (LEASEHOLD_SLOT's form), or `now` (the store's clock) for TO. At most 1000 slots;
    /// TO not after now. E.g. --slots 2027-03-01T00:00:00Z..2027-03-02T00:00:00Z
    #[arg(long, value_name = "FROM..TO", value_parser = slots_arg)]
    slots: Option<SlotsArg>,
}

/// `--slots FROM..TO` as typed.
#[derive(Debug, Clone, Copy)]
pub struct SlotsArg {
    from: u64,
    /// `None`: `now`, the store's clock.
    to: Option<u64>,
}

fn slots_arg(text: &str) -> Result<SlotsArg, String> {
    let (from, to) = text.split_once("..").ok_or_else(|| {
        format!("{text:?} is not a range FROM..TO (e.g. 2027-03-01T00:00:00Z..now)")
    })?;
    let to = match to.trim() {
        "now" => None,
        to => Some(time_arg(to)?),
    };
    Ok(SlotsArg {
        from: time_arg(from)?,
        to,
    })
}

/// A time as typed: slot milliseconds since the epoch, or RFC 3339 (a date alone is its
/// midnight UTC).
fn time_arg(text: &str) -> Result<u64, String> {
    let text = text.trim();
    if let Ok(ms) = text.parse::<u64>() {
        return Ok(ms);
    }
    let midnight = format!("{text}T00:00:00Z");
    let is_date = text.len() == 10 && text.as_bytes().get(4) == Some(&b'-');
    crate::next::from_arg(if is_date { &midnight } else { text })
}

#[derive(Args)]
pub struct ForgetArgs {
    /// Store URL [default: $LEASEHOLD_STORE, else sqlite:leasehold.db]
    #[arg(long)]
    store: Option<String>,
    /// The task (as for pause).
    name: String,
    /// Remove its run history too (kept by default: `leasehold history` still reads it).
    #[arg(long)]
    history: bool,
}

/// The exit status and message of a fleet operation that failed.
pub fn failure(error: FleetError) -> Failure {
    let code = match &error {
        FleetError::UnknownTask(_) => EXIT_UNKNOWN_TASK,
        FleetError::NoInstance(_) => EXIT_NO_INSTANCE,
        FleetError::NoCatalog(_) => EXIT_REFUSED,
        FleetError::NotEnded { .. } => EXIT_NOT_ENDED,
        FleetError::Contended(_) => EXIT_BUSY,
        FleetError::Live { .. } => EXIT_TASK_LIVE,
        FleetError::TriggerWaiting { .. } => EXIT_BUSY,
        // A range that cannot be run: bad input, as documented for `trigger --slots`.
        FleetError::BadRange { .. }
        | FleetError::FutureRange { .. }
        | FleetError::TooManySlots { .. } => EXIT_USAGE,
        FleetError::NoBackfill { .. } => EXIT_REFUSED,
        // A --by or --reason the text rule refuses (leasehold::text): bad input.
        FleetError::Text(_) => EXIT_USAGE,
        FleetError::Store(e) => {
            let transient = e.is_transient();
            return Failure::store(anyhow::Error::new(error), transient);
        }
        _ => 1,
    };
    Failure::with_code(code, error)
}

async fn open(store: Option<String>, name: &str) -> Result<(Fleet<BoxStore>, LeaseName), Failure> {
    let name = LeaseName::new(name).map_err(Failure::usage)?;
    Ok((Fleet::new(history::open(store).await?), name))
}

/// `$USER@HOST`, for who paused or asked.
fn operator(by: Option<String>) -> String {
    by.unwrap_or_else(|| {
        let user = std::env::var("USER").unwrap_or_else(|_| "cli".to_owned());
        format!(
            "{user}@{}",
            leasehold::catalog::InstanceInfo::current().host
        )
    })
}

/// Refuses a `--by` or `--reason` the text rule refuses before the store is opened (the fleet
/// checks them too, for every door).
fn check_text(by: &str, reason: Option<&str>) -> Result<(), Failure> {
    let checked = text::BY
        .check(by)
        .and_then(|()| reason.map_or(Ok(()), |r| text::REASON.check(r)));
    checked.map_err(|e| failure(FleetError::Text(e)))
}

pub async fn pause(args: PauseArgs) -> Result<u8, Failure> {
    let by = operator(args.by);
    check_text(&by, args.reason.as_deref())?;
    let (fleet, name) = open(args.store, &args.name).await?;
    let view = fleet.task(&name).await.map_err(failure)?;
    let (task, shown) = (&view.name, view.shown_name());
    let pause = fleet
        .pause(task, &by, args.reason.as_deref())
        .await
        .map_err(failure)?;
    let reason = pause
        .reason
        .as_deref()
        .map(|r| format!(": {r}"))
        .unwrap_or_default();
    let already = if pause.by == by { "" } else { "already " };
    outln!(
        "{shown} is {already}paused (by {} at {}{reason}); its slots are recorded as paused until `leasehold resume {shown}`",
        pause.by,
        history::time(pause.at_ms),
    )?;
    Ok(0)
}

pub async fn resume(args: ResumeArgs) -> Result<u8, Failure> {
    let (fleet, name) = open(args.store, &args.name).await?;
    let view = fleet.task(&name).await.map_err(failure)?;
    let shown = view.shown_name();
    match fleet.resume(&view.name).await.map_err(failure)? {
        true => outln!("{shown} resumed: its next slot runs")?,
        false => outln!("{shown} was not paused")?,
    }
    Ok(0)
}

pub async fn trigger(args: TriggerArgs) -> Result<u8, Failure> {
    let by = operator(args.by);
    check_text(&by, None)?;
    let (fleet, name) = open(args.store, &args.name).await?;
    let view = fleet.task(&name).await.map_err(failure)?;
    let (task, shown) = (&view.name, view.shown_name());
    if let Some(slots) = args.slots {
        return backfill(&fleet, (task, shown), &by, slots, args.wait).await;
    }
    let request = fleet.trigger(task, &by).await.map_err(failure)?;
    outln!(
        "{shown}: run {} asked for by {} (an instance takes it within a third of its ttl; it lapses at {})",
        request.id,
        request.by,
        history::time(request.expires_ms),
    )?;
    let Some(limit) = args.wait else {
        return Ok(0);
    };
    let run = fleet
        .wait_for_run(task, &request, limit)
        .await
        .map_err(failure)?;
    let took = run
        .duration()
        .map(|d| format!(" in {d:.1?}"))
        .unwrap_or_default();
    let token = run
        .token
        .map(|t| format!(", token {t}"))
        .unwrap_or_default();
    outln!(
        "{shown}: run {} ended {}{took} (holder {}{token})",
        request.id,
        history::outcome(&run),
        run.holder
    )?;
    Ok(match run.outcome {
        RunOutcome::Ok => 0,
        _ => 1,
    })
}

/// `trigger --slots`: `task` is the catalog's name, `shown` the one people see.
async fn backfill(
    fleet: &Fleet<BoxStore>,
    (task, shown): (&LeaseName, &str),
    by: &str,
    slots: SlotsArg,
    wait: Option<Duration>,
) -> Result<u8, Failure> {
    let to_ms = match slots.to {
        Some(to) => to,
        None => fleet
            .store()
            .now_millis()
            .await
            .map_err(|e| failure(FleetError::Store(e)))?,
    };
    let range = SlotRange {
        from_ms: slots.from,
        to_ms,
    };
    let backfill = fleet.backfill(task, by, range).await.map_err(failure)?;
    let span = match (backfill.slots.first(), backfill.slots.last()) {
        (Some(&first), Some(&last)) => {
            format!(" ({} to {})", history::time(first), history::time(last))
        }
        _ => String::new(),
    };
    let ran = backfill.slots.len() - backfill.to_run.len();
    let Some(request) = &backfill.request else {
        outln!(
            "{shown}: the range holds {} slots{span}, each already ran ok: nothing to backfill",
            backfill.slots.len()
        )?;
        return Ok(0);
    };
    outln!(
        "{shown}: backfill {} asked for by {}: {} of {} slots{span} to run ({ran} already ran ok); an instance takes it within a third of its ttl (it lapses at {})",
        request.id,
        request.by,
        backfill.to_run.len(),
        backfill.slots.len(),
        history::time(request.expires_ms),
    )?;
    let Some(limit) = wait else {
        return Ok(0);
    };
    let runs = fleet
        .wait_for_backfill(task, &backfill, limit)
        .await
        .map_err(failure)?;
    for run in &runs {
        outln!(
            "{shown}: slot {} {}",
            run.slot.map_or_else(|| "-".to_owned(), history::time),
            history::outcome(run)
        )?;
    }
    let failed = runs.iter().filter(|r| r.outcome != RunOutcome::Ok).count();
    outln!(
        "{shown}: backfill {} ended: {} slots run, {failed} not ok",
        request.id,
        runs.len()
    )?;
    Ok(u8::from(failed > 0))
}

pub async fn forget(args: ForgetArgs) -> Result<u8, Failure> {
    let (fleet, name) = open(args.store, &args.name).await?;
    // Named as shown while the catalog still lists it; one no longer listed, as given.
    let shown = match fleet.task(&name).await {
        Ok(view) => view.shown_name().to_owned(),
        Err(_) => name.to_string(),
    };
    fleet.forget(&name, args.history).await.map_err(failure)?;
    let history = match args.history {
        true => "its history removed",
        false => "its history kept (`leasehold history` reads it; --history removes it)",
    };
    outln!("{shown} forgotten: out of the catalog with its control record; {history}")?;
    Ok(0)
}
