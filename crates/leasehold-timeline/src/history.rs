//! A task's run history as a picture: runs as bars on a UTC time axis coloured by outcome,
//! missed and paused slots as markers with their reason, a legend and a summary line.

use std::collections::BTreeSet;

use leasehold::history::{MissReason, Outcome, RecordTrigger, RunOutcome, RunRecord};

use crate::draw::{AxisLabels, LEGEND_ROW, Svg, Swatch, TimeScale, legend_rows, utc_minute};

const WIDTH: f64 = 1200.0;
const LEFT: f64 = 90.0;
const RIGHT: f64 = 30.0;
const PLOT: f64 = WIDTH - LEFT - RIGHT;
const LEGEND_TOP: f64 = 56.0;
const LEGEND_COLUMN: f64 = 155.0;
const LANE: f64 = 44.0;
/// The misses' lane holds the markers and two rows of labels under them.
const MISSES_LANE: f64 = 58.0;
const LABEL_ROWS: [f64; 2] = [31.0, 49.0];
/// How manual runs stand out from timer and catch-up runs.
const MANUAL_OUTLINE: &str = r#"stroke="black" stroke-width="1""#;
/// Roughly how wide a character of the 11 px labels is, to keep labels from overlapping.
const CHAR: f64 = 6.2;

/// A colour and what it means in the legend, for bars and markers alike.
struct Kind(&'static str, &'static str);

const OK: Kind = Kind("#2ca02c", "ok");
const FAILED: Kind = Kind("#d62728", "failed");
const CANCELLED: Kind = Kind("#ff7f0e", "cancelled");
const TIMED_OUT: Kind = Kind("#9467bd", "timed-out");
const RUNNING: Kind = Kind("#1f77b4", "running (no end yet)");
const INTERRUPTED: Kind = Kind("#222222", "interrupted (its instance went away)");
/// An outcome this release does not know (a newer writer's).
const OTHER: Kind = Kind("#c7c7c7", "other");
const NOT_CLAIMED: Kind = Kind("#e377c2", "missed: not claimed");
const STORE_DOWN: Kind = Kind("#7f7f7f", "missed: store down");
const OVERLAP: Kind = Kind("#bcbd22", "missed: overlap");
const OUTSIDE_WINDOW: Kind = Kind("#17becf", "missed: outside window");
const PAUSED: Kind = Kind("#393b79", "paused");

fn kind(record: &RunRecord) -> &'static Kind {
    if record.paused.is_some() {
        return &PAUSED;
    }
    match record.result() {
        Some(Outcome::Ok) => return &OK,
        Some(Outcome::Failed) => return &FAILED,
        Some(Outcome::TimedOut) => return &TIMED_OUT,
        Some(Outcome::Cancelled) => return &CANCELLED,
        Some(Outcome::Interrupted) => return &INTERRUPTED,
        _ => {}
    }
    match &record.outcome {
        RunOutcome::Missed { reason, .. } => match reason {
            MissReason::StoreDown => &STORE_DOWN,
            MissReason::Overlap => &OVERLAP,
            MissReason::OutsideCatchUpWindow => &OUTSIDE_WINDOW,
            _ => &NOT_CLAIMED,
        },
        RunOutcome::Running => &RUNNING,
        _ => &OTHER,
    }
}

/// A run's place on the axis: from its start (else its slot) to its end (else `now_ms` while it
/// runs, else its start).
fn run_span(r: &RunRecord, now_ms: u64) -> Option<(u64, u64)> {
    let from = r.started_ms.or(r.slot)?;
    let to = match (&r.outcome, r.ended_ms) {
        (_, Some(end)) => end,
        (RunOutcome::Running, None) => now_ms,
        _ => from,
    };
    Some((from, to.max(from)))
}

/// A missed record's slots: its first and last.
fn miss_span(r: &RunRecord) -> Option<(u64, u64)> {
    match r.outcome {
        RunOutcome::Missed { last_slot, .. } => {
            let first = r.slot?;
            Some((first, last_slot.max(first)))
        }
        _ => None,
    }
}

fn ms_text(ms: u64) -> String {
    utc_minute(ms) + &format!(":{:02}.{:03}", ms / 1000 % 60, ms % 1000)
}

fn run_title(r: &RunRecord) -> String {
    let mut parts = vec![match r.error() {
        Some(error) => format!("{}: {error}", r.word()),
        None => r.word().to_owned(),
    }];
    if let Some(slot) = r.slot {
        parts.push(format!("slot {} UTC", ms_text(slot)));
    }
    if let Some(trigger) = r.trigger {
        parts.push(trigger.to_string());
    }
    if let Some(request) = &r.request {
        parts.push(format!("asked by {}", request.by));
    }
    parts.push(format!("holder {}", r.holder));
    if let Some(token) = r.token {
        parts.push(format!("token {token}"));
    }
    if let Some(d) = r.duration() {
        parts.push(format!("{:.1?}", d));
    }
    parts.join(" · ")
}

/// A miss's label under its marker: the reason, or who paused it and why.
fn miss_label(r: &RunRecord) -> String {
    if let Some(pause) = &r.paused {
        return match &pause.reason {
            Some(why) => format!("paused by {}: {why}", pause.by),
            None => format!("paused by {}", pause.by),
        };
    }
    match &r.outcome {
        RunOutcome::Missed {
            count, reason: why, ..
        } if *count > 1 => format!("{count} missed: {}", why.as_str()),
        RunOutcome::Missed { reason: why, .. } => format!("missed: {}", why.as_str()),
        _ => String::new(),
    }
}

fn miss_title(r: &RunRecord) -> String {
    let mut text = match &r.outcome {
        RunOutcome::Missed {
            count,
            last_slot,
            reason,
        } if *count > 1 => format!(
            "{count} slots missed, {} to {} UTC: {reason}",
            ms_text(r.slot.unwrap_or_default()),
            ms_text(*last_slot)
        ),
        RunOutcome::Missed { reason, .. } => format!(
            "slot {} UTC missed: {reason}",
            ms_text(r.slot.unwrap_or_default())
        ),
        _ => String::new(),
    };
    if let Some(pause) = &r.paused {
        text = format!(
            "slot {} UTC paused by {}{}",
            ms_text(r.slot.unwrap_or_default()),
            pause.by,
            pause
                .reason
                .as_deref()
                .map(|why| format!(": {why}"))
                .unwrap_or_default()
        );
    }
    text + &format!(" · recorded by {}", r.holder)
}

/// Where the lanes and the axis go, under a legend of `legend_rows` rows.
struct Layout {
    runs: f64,
    misses: f64,
    axis: f64,
    height: f64,
}

impl Layout {
    fn new(legend_rows: usize) -> Self {
        let runs = LEGEND_TOP + legend_rows as f64 * LEGEND_ROW + 20.0;
        let misses = runs + LANE + 10.0;
        let axis = misses + MISSES_LANE + 12.0;
        Self {
            runs,
            misses,
            axis,
            height: axis + 50.0,
        }
    }
}

/// The legend: the kinds `records` show, in a fixed order, and the manual runs' outline.
fn legend(records: &[RunRecord]) -> Vec<Swatch<'static>> {
    let kinds: BTreeSet<&'static str> = records.iter().map(|r| kind(r).1).collect();
    let mut legend: Vec<Swatch> = [
        &OK,
        &FAILED,
        &TIMED_OUT,
        &CANCELLED,
        &INTERRUPTED,
        &RUNNING,
        &OTHER,
        &NOT_CLAIMED,
        &STORE_DOWN,
        &OVERLAP,
        &OUTSIDE_WINDOW,
        &PAUSED,
    ]
    .into_iter()
    .filter(|k| kinds.contains(k.1))
    .map(|k| (k.0, "", k.1))
    .collect();
    let manual = |r: &RunRecord| {
        r.trigger == Some(RecordTrigger::Manual) && !matches!(r.outcome, RunOutcome::Missed { .. })
    };
    if records.iter().any(manual) {
        legend.push(("white", MANUAL_OUTLINE, "outlined: manual run"));
    }
    legend
}

/// `task`'s history (`records`, any order) as an SVG picture. `now_ms` ends the bars of runs
/// still going. The picture is the same width for one record or hundreds: bars stay at least
/// 2 px wide, and a label that would overlap the one before is left out (its marker keeps its
/// colour and tooltip).
pub fn history_svg(task: &str, records: &[RunRecord], now_ms: u64) -> String {
    let runs: Vec<(&RunRecord, (u64, u64))> = records
        .iter()
        .filter(|r| !matches!(r.outcome, RunOutcome::Missed { .. }))
        .filter_map(|r| Some((r, run_span(r, now_ms)?)))
        .collect();
    let misses: Vec<(&RunRecord, (u64, u64))> = records
        .iter()
        .filter_map(|r| Some((r, miss_span(r)?)))
        .collect();
    let legend = legend(records);
    let at = Layout::new(legend_rows(legend.len(), LEGEND_COLUMN, PLOT));
    let mut svg = Svg::new(WIDTH, at.height, 11.0);
    svg.text(
        LEFT,
        22.0,
        r#"font-size="15" font-weight="bold""#,
        &format!("Run history of {task}"),
    );
    let spans = runs.iter().chain(&misses).map(|(_, s)| *s);
    let (Some(first), Some(last)) = (spans.clone().map(|s| s.0).min(), spans.map(|s| s.1).max())
    else {
        svg.text(LEFT, 44.0, "", "no runs recorded");
        return svg.finish();
    };
    svg.text(LEFT, 42.0, "", &summary(&runs, &misses));
    svg.legend(LEFT, LEGEND_TOP, LEGEND_COLUMN, PLOT, &legend);

    // A margin either side, so the first and last runs are not on the frame.
    let pad = ((last - first) / 30).max(2_000);
    let scale = TimeScale::new(first.saturating_sub(pad), last + pad, LEFT, PLOT);
    for (top, height, label) in [(at.runs, LANE, "runs"), (at.misses, MISSES_LANE, "missed")] {
        svg.rect(LEFT, top, PLOT, height, "#f4f4f4", "", "");
        svg.text(8.0, top + height / 2.0 + 4.0, "", label);
    }
    for (r, (from, to)) in &runs {
        let outline = if r.trigger == Some(RecordTrigger::Manual) {
            MANUAL_OUTLINE
        } else {
            ""
        };
        svg.rect(
            scale.x(*from),
            at.runs + 8.0,
            scale.width(*from, *to, 2.0),
            LANE - 16.0,
            kind(r).0,
            outline,
            &run_title(r),
        );
    }
    let mut misses = misses;
    misses.sort_by_key(|(_, span)| *span);
    // Labels go in the first of two rows where they do not overlap the label before them.
    let mut free_from = [f64::MIN; LABEL_ROWS.len()];
    for (r, (from, to)) in &misses {
        let colour = kind(r).0;
        let x = scale.x(*from);
        if to > from {
            let w = scale.width(*from, *to, 2.0);
            svg.rect(x, at.misses + 10.0, w, 4.0, colour, "", "");
        }
        svg.marker(x, at.misses + 14.0, colour, &miss_title(r));
        let label = miss_label(r);
        // Labels near the right edge end there (the width as drawn, hidden characters escaped).
        let width = leasehold::text::visible(&label).chars().count() as f64 * CHAR;
        let label_x = (x - 3.0).min(WIDTH - 4.0 - width);
        if let Some(row) = free_from.iter().position(|free| label_x >= *free) {
            let attrs = format!(r#"fill="{colour}""#);
            svg.text(label_x, at.misses + LABEL_ROWS[row], &attrs, &label);
            free_from[row] = label_x + width + 8.0;
        }
    }
    let (from, to) = (utc_minute(first), utc_minute(last));
    let caption = if from[..10] == to[..10] {
        format!("time (UTC) on {}", &from[..10])
    } else {
        format!("time (UTC), {from} to {to}")
    };
    svg.axis(&scale, at.axis, AxisLabels::Utc, &caption);
    svg.finish()
}

/// `12 runs (10 ok, 2 failed), 3 slots missed, 1 paused`.
fn summary(runs: &[(&RunRecord, (u64, u64))], misses: &[(&RunRecord, (u64, u64))]) -> String {
    let mut text = format!("{} runs", runs.len());
    let detail: Vec<String> = [
        "ok",
        "failed",
        "timed-out",
        "cancelled",
        "interrupted",
        "running",
    ]
    .into_iter()
    .map(|o| (runs.iter().filter(|(r, _)| r.word() == o).count(), o))
    .filter(|(n, _)| *n > 0)
    .map(|(n, o)| format!("{n} {o}"))
    .collect();
    if !detail.is_empty() {
        text += &format!(" ({})", detail.join(", "));
    }
    let paused = misses.iter().filter(|(r, _)| r.paused.is_some()).count();
    let missed: u64 = misses
        .iter()
        .filter(|(r, _)| r.paused.is_none())
        .map(|(r, _)| match r.outcome {
            RunOutcome::Missed { count, .. } => count,
            _ => 0,
        })
        .sum();
    text + &format!(", {missed} slots missed, {paused} paused")
}
