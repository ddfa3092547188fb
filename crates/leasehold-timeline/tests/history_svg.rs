//! The run history picture: well-formed SVG with one bar per run and one marker per miss, for
//! one run and for hundreds, with reasons and pauses labelled. With `LEASEHOLD_SVG_OUT=DIR` the
//! picture of hundreds is kept there to look at (`rsvg-convert` makes a PNG of it). Text from
//! the store with control characters in it is shown escaped, in a document that stays XML.

use leasehold::catalog::Pause;
use leasehold::history::{MissReason, RecordTrigger, RunOutcome, RunRecord, RunRequest};
use leasehold::text::{is_hidden, visible};
use leasehold_timeline::history_svg;

const T0: u64 = 1_796_342_400_000; // 2026-12-04T00:00:00Z
const MINUTE: u64 = 60_000;

fn run(slot: u64, outcome: RunOutcome) -> RunRecord {
    RunRecord::started(
        Some(slot),
        RecordTrigger::Timer,
        "host-a:42:x",
        None,
        slot + 5,
        None,
    )
    .ended(slot + 20_000, outcome)
}

fn titled<'a>(doc: &'a roxmltree::Document<'a>, element: &str) -> Vec<String> {
    doc.descendants()
        .filter(|n| n.has_tag_name(element))
        .filter_map(|n| n.children().find(|c| c.has_tag_name("title")))
        .map(|t| t.text().unwrap_or_default().to_owned())
        .collect()
}

fn texts<'a>(doc: &'a roxmltree::Document<'a>) -> Vec<(f64, f64, String)> {
    doc.descendants()
        .filter(|n| n.has_tag_name("text"))
        .map(|n| {
            let num = |a| n.attribute(a).unwrap().parse::<f64>().unwrap();
            (num("x"), num("y"), n.text().unwrap_or_default().to_owned())
        })
        .collect()
}

#[test]
fn one_run_is_one_bar_with_its_details() {
    let svg = history_svg("nightly", &[run(T0, RunOutcome::Ok)], T0 + MINUTE);
    let doc = roxmltree::Document::parse(&svg).expect("well-formed XML");
    assert_eq!(doc.root_element().tag_name().name(), "svg");
    let bars = titled(&doc, "rect");
    assert_eq!(bars.len(), 1, "{svg}");
    assert!(
        bars[0].starts_with("ok · slot 2026-12-04 00:00:00.000 UTC · timer · holder host-a:42:x"),
        "{}",
        bars[0]
    );
    assert!(titled(&doc, "path").is_empty());
    let words: Vec<String> = texts(&doc).into_iter().map(|t| t.2).collect();
    assert!(words.contains(&"Run history of nightly".to_owned()));
    assert!(
        words.contains(&"1 runs (1 ok), 0 slots missed, 0 paused".to_owned()),
        "{words:?}"
    );
    assert!(words.contains(&"ok".to_owned()), "a legend: {words:?}");
}

#[test]
fn hundreds_of_runs_and_misses_each_get_a_bar_or_a_marker_inside_the_plot() {
    let mut records = Vec::new();
    let mut misses = 0;
    for i in 0..400u64 {
        let slot = T0 + i * MINUTE;
        match i % 40 {
            7 => {
                records.push(RunRecord::missed(
                    slot,
                    1,
                    slot,
                    MissReason::StoreDown,
                    "host-b",
                ));
                misses += 1;
            }
            13 => {
                let mut paused = RunRecord::missed(slot, 1, slot, MissReason::NotClaimed, "host-b");
                paused.paused = Some(Pause {
                    by: "alice".into(),
                    reason: Some("deploy freeze".into()),
                    at_ms: slot - 1,
                });
                records.push(paused);
                misses += 1;
            }
            21 => records.push(run(
                slot,
                RunOutcome::Failed {
                    error: "exit status 3".into(),
                },
            )),
            // Its instance was killed mid-run: no end was recorded.
            33 => {
                let mut lost = run(slot, RunOutcome::Interrupted);
                lost.ended_ms = None;
                records.push(lost);
            }
            _ => records.push(run(slot, RunOutcome::Ok)),
        }
    }
    // A gap of 5 slots in one record, and a run still going.
    let end = T0 + 400 * MINUTE;
    records.push(RunRecord::missed(
        end,
        5,
        end + 4 * MINUTE,
        MissReason::NotClaimed,
        "host-c",
    ));
    misses += 1;
    records.push(RunRecord::started(
        None,
        RecordTrigger::Manual,
        "host-c",
        None,
        end + 5 * MINUTE,
        None,
    ));
    let runs = records
        .iter()
        .filter(|r| !matches!(r.outcome, RunOutcome::Missed { .. }))
        .count();
    let svg = history_svg("sweep", &records, end + 6 * MINUTE);
    if let Some(dir) = std::env::var_os("LEASEHOLD_SVG_OUT") {
        std::fs::write(std::path::Path::new(&dir).join("hundreds.svg"), &svg).unwrap();
    }
    let doc = roxmltree::Document::parse(&svg).expect("well-formed XML");
    let bars = titled(&doc, "rect");
    assert_eq!(bars.len(), runs);
    assert_eq!(
        bars.iter()
            .filter(|t| t.starts_with("failed: exit status 3"))
            .count(),
        10
    );
    assert_eq!(bars.iter().filter(|t| t.starts_with("running")).count(), 1);
    assert_eq!(
        bars.iter().filter(|t| t.starts_with("interrupted")).count(),
        10
    );
    let markers = titled(&doc, "path");
    assert_eq!(markers.len(), misses);
    assert_eq!(
        markers
            .iter()
            .filter(|t| t.contains("paused by alice: deploy freeze"))
            .count(),
        10
    );
    assert!(
        markers.iter().any(|t| t
            .starts_with("5 slots missed, 2026-12-04 06:40:00.000 to 2026-12-04 06:44:00.000 UTC")),
        "{markers:?}"
    );
    // Every bar is inside the plot and at least 2 px wide.
    let width: f64 = doc
        .root_element()
        .attribute("width")
        .unwrap()
        .parse()
        .unwrap();
    for bar in doc
        .descendants()
        .filter(|n| n.has_tag_name("rect") && n.children().any(|c| c.has_tag_name("title")))
    {
        let x: f64 = bar.attribute("x").unwrap().parse().unwrap();
        let w: f64 = bar.attribute("width").unwrap().parse().unwrap();
        assert!(
            x >= 90.0 && x + w <= width - 30.0 + 2.0 && w >= 2.0,
            "bar at {x} width {w}"
        );
    }
    // Labels under the markers never overlap: each starts after the one before ends.
    let lane = texts(&doc)
        .into_iter()
        .find(|t| t.2 == "missed: store-down")
        .unwrap()
        .1;
    let labels: Vec<(f64, f64, String)> = texts(&doc)
        .into_iter()
        .filter(|(_, y, _)| *y >= lane && *y < lane + 30.0)
        .collect();
    assert!(labels.len() >= 3, "{labels:?}");
    let mut rows: Vec<f64> = labels.iter().map(|l| l.1).collect();
    rows.sort_by(f64::total_cmp);
    rows.dedup();
    for row in rows {
        let in_row: Vec<_> = labels.iter().filter(|l| l.1 == row).collect();
        for pair in in_row.windows(2) {
            let (a, b) = (pair[0], pair[1]);
            assert!(b.0 >= a.0 + a.2.len() as f64 * 6.0, "{a:?} overlaps {b:?}");
        }
    }
    let labels: Vec<(f64, String)> = labels.into_iter().map(|(x, _, t)| (x, t)).collect();
    assert!(
        labels
            .iter()
            .any(|(_, t)| t == "paused by alice: deploy freeze"),
        "{labels:?}"
    );
    assert!(
        labels.iter().any(|(_, t)| t == "missed: store-down"),
        "{labels:?}"
    );
    assert!(
        labels.iter().any(|(_, t)| t == "5 missed: not-claimed"),
        "{labels:?}"
    );
}

#[test]
fn no_records_is_a_picture_that_says_so() {
    let svg = history_svg("idle", &[], T0);
    let doc = roxmltree::Document::parse(&svg).expect("well-formed XML");
    assert!(texts(&doc).iter().any(|t| t.2 == "no runs recorded"));
}

#[test]
fn names_and_errors_with_markup_are_escaped() {
    let svg = history_svg(
        "a<b>&c",
        &[run(
            T0,
            RunOutcome::Failed {
                error: "<oops> & \"x\"".into(),
            },
        )],
        T0,
    );
    let doc = roxmltree::Document::parse(&svg).expect("well-formed XML");
    assert!(titled(&doc, "rect")[0].starts_with("failed: <oops> & \"x\""));
    assert!(texts(&doc).iter().any(|t| t.2 == "Run history of a<b>&c"));
}

/// Every character the text rule names (controls, bidi controls, what XML forbids), with
/// markup around them.
fn hostile() -> String {
    let hidden: String = (0u32..=0x10ffff)
        .filter_map(char::from_u32)
        .filter(|&c| is_hidden(c))
        .collect();
    format!("<b>&{hidden}\"'")
}

/// Text from the store may hold anything (an older release, a hand-written row, a failure
/// text with a command's stderr): in every text the picture draws (title, labels, tooltips of
/// bars and markers) each such character is written visibly, and the document stays XML.
#[test]
fn every_control_character_in_every_drawn_text_is_shown_escaped_in_valid_xml() {
    let bad = hostile();
    let mut failed = run(T0, RunOutcome::Failed { error: bad.clone() });
    failed.holder = bad.clone();
    let mut cancelled = run(T0 + MINUTE, RunOutcome::Cancelled { why: bad.clone() });
    cancelled.trigger = Some(RecordTrigger::Manual);
    cancelled.request = Some(RunRequest {
        id: bad.clone(),
        by: bad.clone(),
    });
    let mut paused = RunRecord::missed(
        T0 + 2 * MINUTE,
        1,
        T0 + 2 * MINUTE,
        MissReason::NotClaimed,
        &bad,
    );
    paused.paused = Some(Pause {
        by: bad.clone(),
        reason: Some(bad.clone()),
        at_ms: T0,
    });
    let missed = RunRecord::missed(
        T0 + 3 * MINUTE,
        2,
        T0 + 4 * MINUTE,
        MissReason::Overlap,
        &bad,
    );
    let svg = history_svg(&bad, &[failed, cancelled, paused, missed], T0 + 5 * MINUTE);

    let doc = roxmltree::Document::parse(&svg).expect("well-formed XML");
    // The document's own line breaks are its only hidden characters.
    let raw: Vec<char> = svg.chars().filter(|&c| is_hidden(c) && c != '\n').collect();
    assert!(raw.is_empty(), "{raw:?}");
    let shown = visible(&bad).into_owned();
    assert!(shown.contains("\\x1b") && shown.contains("\\u{202e}") && shown.contains("\\0"));
    let bars = titled(&doc, "rect");
    assert_eq!(bars.len(), 2, "{bars:?}");
    assert!(
        bars[0].starts_with(&format!("failed: {shown} · ")),
        "{}",
        bars[0]
    );
    assert!(bars[0].contains(&format!("holder {shown}")), "{}", bars[0]);
    assert!(
        bars[1].starts_with(&format!("cancelled: {shown} · ")),
        "{}",
        bars[1]
    );
    assert!(
        bars[1].contains(&format!("asked by {shown}")),
        "{}",
        bars[1]
    );
    let markers = titled(&doc, "path");
    assert_eq!(markers.len(), 2, "{markers:?}");
    assert!(
        markers[0].contains(&format!("paused by {shown}: {shown} · recorded by {shown}")),
        "{}",
        markers[0]
    );
    assert!(
        markers[1].ends_with(&format!("recorded by {shown}")),
        "{}",
        markers[1]
    );
    let words: Vec<String> = texts(&doc).into_iter().map(|t| t.2).collect();
    assert!(
        words.contains(&format!("Run history of {shown}")),
        "{words:?}"
    );
    assert!(
        words.contains(&format!("paused by {shown}: {shown}")),
        "{words:?}"
    );
}
