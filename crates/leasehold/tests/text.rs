//! Free text through the library's door (`leasehold::text`): a pause or trigger whose `by` or
//! `reason` holds a control or bidi character, or is over its limit, is a typed error and
//! writes nothing; text a program writes (a job's error) and a pause an older release stored
//! without limits are cut to their limits in the history, never refused.

use std::time::Duration;

use leasehold::catalog::{Control, Pause};
use leasehold::fleet::{Fleet, FleetError};
use leasehold::history::RunOutcome;
use leasehold::text::{self, TextError};
use leasehold::{
    Catalog, HolderId, LeaseConfig, LeaseName, MemoryStore, Schedule, Scheduler, SchedulerHandle,
    Task,
};

const SEC: Duration = Duration::from_secs(1);

/// Every character the rule refuses in a one-line field that the issue names: ESC, BEL, CR,
/// LF, NUL, DEL, a C1 control and U+202E.
const HOSTILE: [char; 8] = [
    '\u{1b}', '\u{7}', '\r', '\n', '\0', '\u{7f}', '\u{9b}', '\u{202e}',
];

fn name(s: &str) -> LeaseName {
    LeaseName::new(s).unwrap()
}

/// One instance running `sweep` every 10 s, whose job fails with `error` (if any).
fn instance(store: &MemoryStore, error: Option<String>) -> SchedulerHandle {
    Scheduler::new(store.clone())
        .holder(HolderId::new("app-1").unwrap())
        .lease_config(LeaseConfig::new(SEC * 6))
        .task(Task::new(
            name("sweep"),
            Schedule::every(SEC * 10).unwrap(),
            move |_| {
                let error = error.clone();
                async move {
                    match error {
                        Some(e) => Err(std::io::Error::other(e)),
                        None => Ok(()),
                    }
                }
            },
        ))
        .start(std::future::pending())
        .unwrap()
}

fn refused<T: std::fmt::Debug>(result: Result<T, FleetError>) -> TextError {
    match result {
        Err(FleetError::Text(e)) => e,
        other => panic!("not a text error: {other:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn a_pause_or_trigger_with_hidden_characters_or_over_its_limit_is_refused() {
    let store = MemoryStore::new();
    let _app = instance(&store, None);
    tokio::time::sleep(SEC).await;
    let fleet = Fleet::new(store.clone());
    let sweep = name("sweep");
    for ch in HOSTILE {
        let bad = format!("ops{ch}x");
        let e = refused(fleet.pause(&sweep, &bad, None).await);
        assert_eq!(
            e,
            TextError::Hidden {
                field: "by",
                ch,
                at: 3
            }
        );
        let e = refused(fleet.pause(&sweep, "ops", Some(&bad)).await);
        assert_eq!(e.field(), "reason");
        let e = refused(fleet.trigger(&sweep, &bad).await);
        assert_eq!(e.field(), "by");
    }
    let long_reason = "r".repeat(120_000);
    let e = refused(fleet.pause(&sweep, "ops", Some(&long_reason)).await);
    assert_eq!(
        e.to_string(),
        "reason is 120000 bytes long, the limit is 2000"
    );
    let long_by = "b".repeat(text::BY.max + 1);
    assert_eq!(refused(fleet.trigger(&sweep, &long_by).await).field(), "by");
    // Nothing was written: no pause, no trigger.
    let view = fleet.task(&sweep).await.unwrap();
    assert!(view.paused.is_none() && view.trigger.is_none(), "{view:?}");
    // At the limits, and with text that is merely not ASCII, it is accepted as written.
    let reason = format!("vendor → down {}", "é".repeat(900));
    assert!(reason.len() <= text::REASON.max);
    let by = "o".repeat(text::BY.max);
    let pause = fleet.pause(&sweep, &by, Some(&reason)).await.unwrap();
    assert_eq!((pause.by, pause.reason), (by, Some(reason)));
}

#[tokio::test(start_paused = true)]
async fn a_jobs_long_error_and_an_old_releases_long_pause_are_cut_in_the_history() {
    let store = MemoryStore::new();
    // 120 KB of stderr, with newlines and an escape sequence: kept as written up to the limit.
    let stderr = format!("line one\n\u{1b}[2Jline two\n{}", "x".repeat(120_000));
    let app = instance(&store, Some(stderr.clone()));
    tokio::time::sleep(SEC * 15).await;
    let records = app.history("sweep", 10).await.unwrap();
    let error = records
        .iter()
        .find_map(|r| match &r.outcome {
            RunOutcome::Failed { error } => Some(error.clone()),
            _ => None,
        })
        .unwrap_or_else(|| panic!("a failed run: {records:?}"));
    assert!(error.len() <= text::FAILURE.max, "{} bytes", error.len());
    let kept = error.split('…').next().unwrap();
    assert!(kept.len() > 1900 && stderr.starts_with(kept), "{error}");
    assert!(error.ends_with(&format!("… [{} bytes cut]", stderr.len() - kept.len())));

    // A pause an older release wrote, with no limits: every paused slot repeats it, cut.
    let pause = Pause {
        by: "b".repeat(10_000),
        reason: Some("r".repeat(120_000)),
        at_ms: 0,
    };
    let control = Control {
        paused: Some(pause),
        trigger: None,
    };
    let read = store.control(&name("sweep")).await.unwrap();
    let version = read.control.map(|c| c.version);
    store
        .set_control(&name("sweep"), version, &control.to_json())
        .await
        .unwrap()
        .unwrap();
    tokio::time::sleep(SEC * 30).await;
    let records = app.history("sweep", 10).await.unwrap();
    let paused: Vec<&Pause> = records.iter().filter_map(|r| r.paused.as_ref()).collect();
    assert!(paused.len() >= 2, "{records:?}");
    for p in paused {
        assert!(p.by.len() <= text::BY.max, "by {} bytes", p.by.len());
        let reason = p.reason.as_deref().unwrap();
        assert!(
            reason.len() <= text::REASON.max,
            "reason {} bytes",
            reason.len()
        );
        assert!(reason.starts_with("rrrr") && reason.ends_with(" bytes cut]"));
    }
}

/// A job's kept output reaches its run's history record whatever the run's outcome, cut to its
/// last `text::OUTPUT` bytes (the end survives, from a character boundary); a run that keeps
/// none records none.
#[tokio::test(start_paused = true)]
async fn a_jobs_kept_output_is_recorded_cut_to_its_end() {
    let store = MemoryStore::new();
    // 3-byte characters, so the limit falls inside one.
    let long = format!("start\n{}\n\u{1b}[31mthe end", "€".repeat(40_000));
    let kept = long.clone();
    let app = Scheduler::new(store.clone())
        .holder(HolderId::new("app-1").unwrap())
        .lease_config(LeaseConfig::new(SEC * 6))
        .task(Task::new(
            name("sweep"),
            Schedule::every(SEC * 10).unwrap(),
            move |ctx: leasehold::TaskContext| {
                let kept = kept.clone();
                async move {
                    if ctx.slot.is_some_and(|s| s / 10_000 % 2 == 0) {
                        ctx.keep_output("replaced");
                        ctx.keep_output(kept);
                        Err(std::io::Error::other("boom"))
                    } else {
                        Ok(())
                    }
                }
            },
        ))
        .start(std::future::pending())
        .unwrap();
    tokio::time::sleep(SEC * 35).await;
    let records = app.history("sweep", 10).await.unwrap();
    app.shutdown().await;
    let ended: Vec<_> = records.iter().filter(|r| r.result().is_some()).collect();
    assert!(ended.len() >= 3, "{records:?}");
    for r in ended {
        let even = r.slot.unwrap() / 10_000 % 2 == 0;
        match (&r.output, even) {
            (Some(output), true) => {
                assert!(matches!(r.outcome, RunOutcome::Failed { .. }));
                assert!(output.len() <= text::OUTPUT.max, "{}", output.len());
                assert!(output.len() > text::OUTPUT.max - 3, "{}", output.len());
                assert!(long.ends_with(output.as_str()));
                assert!(output.ends_with("\u{1b}[31mthe end"));
            }
            (None, false) => assert_eq!(r.outcome, RunOutcome::Ok),
            other => panic!("{other:?}: {r:?}"),
        }
    }
}
