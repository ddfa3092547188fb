//! Run policies (issue 39): a run's timeout and the retries of a failed or timed-out one, on a
//! paused clock with the in-memory store.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use leasehold::history::{Outcome, RetryNote, RunOutcome, RunRecord};
use leasehold::{
    Backoff, HolderId, LeaseConfig, LeaseName, MemoryStore, Schedule, Scheduler, SchedulerHandle,
    Task, TaskContext,
};

const SEC: Duration = Duration::from_secs(1);

/// What each call of a job saw: its slot and attempt.
type Calls = Arc<Mutex<Vec<(Option<u64>, u32)>>>;

/// How a job's attempt behaves.
#[derive(Clone, Copy)]
enum Act {
    Ok,
    Fail,
    /// Waits until cancelled, then returns.
    Hang,
}

/// A task on `every` whose attempt `n` of each slot does `acts(n)`.
fn task(name: &str, every: Duration, calls: &Calls, acts: fn(u32) -> Act) -> Task {
    let calls = calls.clone();
    Task::new(
        LeaseName::new(name).unwrap(),
        Schedule::every(every).unwrap(),
        move |ctx: TaskContext| {
            calls.lock().unwrap().push((ctx.slot, ctx.attempt));
            async move {
                match acts(ctx.attempt) {
                    Act::Ok => Ok(()),
                    Act::Fail => Err(format!("attempt {} failed", ctx.attempt)),
                    Act::Hang => {
                        ctx.cancel.cancelled().await;
                        Ok(())
                    }
                }
            }
        },
    )
}

fn start(store: &MemoryStore, task: Task) -> SchedulerHandle {
    Scheduler::new(store.clone())
        .holder(HolderId::new("a").unwrap())
        .lease_config(LeaseConfig::new(SEC * 15))
        .grace_period(SEC)
        .task(task)
        .start(std::future::pending())
        .unwrap()
}

/// The history of `name`'s ended runs (not misses, not one still running), oldest first.
async fn runs(handle: &SchedulerHandle, name: &str) -> Vec<RunRecord> {
    let mut records: Vec<RunRecord> = handle
        .history(name, 100)
        .await
        .unwrap()
        .into_iter()
        .filter(|r| r.trigger.is_some() && r.result().is_some())
        .collect();
    records.reverse();
    records
}

/// The records of the first slot that ran.
fn first_slot(records: Vec<RunRecord>) -> Vec<RunRecord> {
    let slot = records.first().and_then(|r| r.slot);
    records.into_iter().filter(|r| r.slot == slot).collect()
}

fn ms(d: Duration) -> u64 {
    d.as_millis() as u64
}

/// A job that hangs is cancelled at its timeout and recorded `timed-out` (kept as `cancelled`
/// in `outcome`, which 0.1.0 reads); without retries the next slot runs as usual.
#[tokio::test(start_paused = true)]
async fn a_hanging_job_is_cancelled_at_its_timeout_and_recorded_timed_out() {
    let store = MemoryStore::new();
    let calls = Calls::default();
    let t = task("hang", SEC * 10, &calls, |_| Act::Hang).timeout(SEC * 2);
    let handle = start(&store, t);
    tokio::time::sleep(SEC * 25).await;
    let records = runs(&handle, "hang").await;
    assert!(records.len() >= 2, "{records:#?}");
    for r in &records {
        assert_eq!(r.result(), Some(Outcome::TimedOut), "{r:?}");
        assert_eq!(r.word(), "timed-out");
        assert!(
            matches!(r.outcome, RunOutcome::Cancelled { .. }),
            "{:?}",
            r.outcome
        );
        assert_eq!(r.duration(), Some(SEC * 2), "{r:?}");
        assert_eq!(r.error(), Some("timeout reached (2s)"));
        assert_eq!(r.attempt, None, "no retries: records keep their shape");
        assert_eq!(r.retry, None);
    }
    assert!(records[0].to_json().contains(r#""outcome":"cancelled""#));
    assert_eq!(records[1].slot.unwrap() - records[0].slot.unwrap(), 10_000);
    handle.shutdown().await;
}

/// Fails twice, then succeeds, with 3 retries: three attempts of one slot in the history (1 and
/// 2 failed, 3 ok), each retry started exactly its backoff after the attempt before ended, and
/// the job told its attempt number.
#[tokio::test(start_paused = true)]
async fn failing_twice_then_succeeding_gives_three_attempts_with_their_backoff() {
    let store = MemoryStore::new();
    let calls = Calls::default();
    let (base, max) = (Duration::from_millis(500), SEC * 2);
    let t = task("flaky", SEC * 60, &calls, |n| {
        if n < 3 { Act::Fail } else { Act::Ok }
    })
    .retries(3)
    .retry_backoff(base, max);
    let handle = start(&store, t);
    tokio::time::sleep(SEC * 65).await;
    let records = first_slot(runs(&handle, "flaky").await);
    assert_eq!(records.len(), 3, "{records:#?}");
    let slot = records[0].slot.unwrap();
    let words: Vec<(u32, &str)> = records.iter().map(|r| (r.attempt(), r.word())).collect();
    assert_eq!(words, [(1, "failed"), (2, "failed"), (3, "ok")]);
    assert!(records.iter().all(|r| r.slot == Some(slot)));
    let backoff = Backoff::new(base, Some(max));
    let task_name = LeaseName::new("flaky").unwrap();
    for pair in records.windows(2) {
        let (before, after) = (&pair[0], &pair[1]);
        let wait = backoff.delay(&task_name, Some(slot), after.attempt());
        assert_eq!(
            after.started_ms.unwrap() - before.ended_ms.unwrap(),
            ms(wait),
            "attempt {} waited its backoff",
            after.attempt()
        );
        assert_eq!(
            before.retry,
            Some(RetryNote::AtMs(after.started_ms.unwrap()))
        );
    }
    // The first retry waits within [base/2, base), the second within [base, 2·base).
    let first = records[1].started_ms.unwrap() - records[0].ended_ms.unwrap();
    let second = records[2].started_ms.unwrap() - records[1].ended_ms.unwrap();
    assert!((250..500).contains(&first), "{first}");
    assert!((500..1000).contains(&second), "{second}");
    assert_eq!(records[2].retry, None);
    let seen: Vec<(Option<u64>, u32)> = calls.lock().unwrap().clone();
    assert_eq!(
        seen[..3],
        [(Some(slot), 1), (Some(slot), 2), (Some(slot), 3)]
    );
    handle.shutdown().await;
}

/// A retry that would start at or after the next slot is not run: the failed attempt records it
/// as dropped before that slot, and the next slot starts again from attempt 1.
#[tokio::test(start_paused = true)]
async fn a_retry_that_would_pass_the_next_slot_is_not_run() {
    let store = MemoryStore::new();
    let calls = Calls::default();
    // A backoff of at least 10 s on a 10 s schedule: no retry fits before the next slot.
    let t = task("late", SEC * 10, &calls, |_| Act::Fail)
        .retries(2)
        .retry_backoff(SEC * 20, SEC * 20);
    let handle = start(&store, t);
    tokio::time::sleep(SEC * 25).await;
    let records = runs(&handle, "late").await;
    assert!(records.len() >= 2, "{records:#?}");
    for r in &records {
        assert_eq!(r.attempt(), 1);
        assert_eq!(r.word(), "failed");
        let next = r.slot.unwrap() + 10_000;
        assert_eq!(r.retry, Some(RetryNote::DroppedBeforeSlot(next)), "{r:?}");
    }
    let seen = calls.lock().unwrap().clone();
    assert!(seen.iter().all(|&(_, attempt)| attempt == 1), "{seen:?}");
    assert!(
        seen.len() >= 2 && seen.len() <= 3,
        "one call per slot: {seen:?}"
    );
    handle.shutdown().await;
}

/// A timed-out attempt is retried like a failed one.
#[tokio::test(start_paused = true)]
async fn a_timed_out_attempt_is_retried() {
    let store = MemoryStore::new();
    let calls = Calls::default();
    let t = task("slow", SEC * 60, &calls, |n| {
        if n == 1 { Act::Hang } else { Act::Ok }
    })
    .timeout(SEC * 3)
    .retries(1)
    .retry_backoff(SEC, SEC);
    let handle = start(&store, t);
    tokio::time::sleep(SEC * 70).await;
    let records = first_slot(runs(&handle, "slow").await);
    let words: Vec<(u32, &str)> = records.iter().map(|r| (r.attempt(), r.word())).collect();
    assert_eq!(words, [(1, "timed-out"), (2, "ok")], "{records:#?}");
    assert_eq!(records[0].duration(), Some(SEC * 3));
    let wait = records[1].started_ms.unwrap() - records[0].ended_ms.unwrap();
    assert!((500..1000).contains(&wait), "{wait}");
    handle.shutdown().await;
}

/// A job that ignores its cancellation at the timeout is aborted a stop margin later, and is
/// `timed-out` too.
#[tokio::test(start_paused = true)]
async fn a_job_ignoring_its_timeout_is_aborted_and_recorded_timed_out() {
    let store = MemoryStore::new();
    let t = Task::new(
        LeaseName::new("stubborn").unwrap(),
        Schedule::every(SEC * 60).unwrap(),
        |_ctx: TaskContext| async move {
            std::future::pending::<()>().await;
            Ok::<(), std::io::Error>(())
        },
    )
    .timeout(SEC * 2);
    let handle = start(&store, t);
    tokio::time::sleep(SEC * 70).await;
    let records = first_slot(runs(&handle, "stubborn").await);
    assert_eq!(records.len(), 1, "{records:#?}");
    assert_eq!(records[0].outcome, RunOutcome::Aborted);
    assert_eq!(records[0].result(), Some(Outcome::TimedOut));
    handle.shutdown().await;
}

/// Two instances on one store: every attempt of a slot runs on the instance that claimed it,
/// one after the other, and the other instance runs nothing of that slot meanwhile.
#[tokio::test(start_paused = true)]
async fn retries_stay_on_the_instance_that_holds_the_task() {
    let store = MemoryStore::new();
    // (holder, slot, attempt, start, end) of every call.
    type Seen = Arc<
        Mutex<
            Vec<(
                String,
                Option<u64>,
                u32,
                tokio::time::Instant,
                tokio::time::Instant,
            )>,
        >,
    >;
    let seen = Seen::default();
    let make = |holder: &str| {
        let seen = seen.clone();
        let t = Task::new(
            LeaseName::new("shared").unwrap(),
            Schedule::every(SEC * 30).unwrap(),
            move |ctx: TaskContext| {
                let seen = seen.clone();
                async move {
                    let start = tokio::time::Instant::now();
                    tokio::time::sleep(SEC).await;
                    let ok = ctx.attempt >= 3;
                    let end = tokio::time::Instant::now();
                    seen.lock().unwrap().push((
                        ctx.holder.to_string(),
                        ctx.slot,
                        ctx.attempt,
                        start,
                        end,
                    ));
                    if ok { Ok(()) } else { Err("not yet") }
                }
            },
        )
        .retries(3)
        .retry_backoff(SEC, SEC * 4);
        Scheduler::new(store.clone())
            .holder(HolderId::new(holder).unwrap())
            .lease_config(LeaseConfig::new(SEC * 15))
            .task(t)
            .start(std::future::pending())
            .unwrap()
    };
    let (a, b) = (make("a"), make("b"));
    tokio::time::sleep(SEC * 95).await;
    let seen = seen.lock().unwrap().clone();
    let mut slots: Vec<Option<u64>> = seen.iter().map(|s| s.1).collect();
    slots.dedup();
    assert!(slots.len() >= 3, "{seen:?}");
    let last = slots.last().copied();
    for slot in slots {
        let of_slot: Vec<_> = seen.iter().filter(|s| s.1 == slot).collect();
        let attempts: Vec<u32> = of_slot.iter().map(|s| s.2).collect();
        // The last slot may still be going when the test looks.
        let expected: &[u32] = if Some(slot) == last {
            &[1, 2, 3][..attempts.len().min(3)]
        } else {
            &[1, 2, 3]
        };
        assert_eq!(attempts, expected, "{seen:?}");
        assert!(
            of_slot.iter().all(|s| s.0 == of_slot[0].0),
            "one holder: {seen:?}"
        );
    }
    for pair in seen.windows(2) {
        assert!(pair[0].4 <= pair[1].3, "never two calls at once: {seen:?}");
    }
    a.shutdown().await;
    b.shutdown().await;
}

/// Every attempt is a run in the metrics; retries and dropped retries are counted by task.
#[test]
fn attempts_retries_and_dropped_retries_are_counted() {
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics::with_local_recorder(&recorder, || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .start_paused(true)
            .build()
            .unwrap();
        runtime.block_on(async {
            let store = MemoryStore::new();
            let calls = Calls::default();
            let flaky = task("counted", SEC * 60, &calls, |n| {
                if n < 3 { Act::Fail } else { Act::Ok }
            })
            .retries(3)
            .retry_backoff(SEC, SEC);
            let late = task("dropped", SEC * 60, &calls, |_| Act::Fail)
                .retries(1)
                // At least 65 s, after jitter: past the next slot.
                .retry_backoff(SEC * 130, SEC * 130);
            let handle = Scheduler::new(store)
                .holder(HolderId::new("a").unwrap())
                .lease_config(LeaseConfig::new(SEC * 15))
                .task(flaky)
                .task(late)
                .start(std::future::pending())
                .unwrap();
            tokio::time::sleep(SEC * 65).await;
            handle.shutdown().await;
        });
    });
    let mut counted = std::collections::BTreeMap::new();
    for (key, _, _, value) in snapshotter.snapshot().into_vec() {
        let name = key.key().name();
        if !matches!(
            name,
            "leasehold_runs_total"
                | "leasehold_run_retries_total"
                | "leasehold_retries_dropped_total"
        ) {
            continue;
        }
        let labels: Vec<String> = key
            .key()
            .labels()
            .filter(|l| l.key() != "trigger")
            .map(|l| format!("{}={}", l.key(), l.value()))
            .collect();
        if let DebugValue::Counter(n) = value {
            counted.insert(format!("{name}{{{}}}", labels.join(",")), n);
        }
    }
    let at_least = |key: &str, n: u64| {
        assert!(
            counted.get(key).is_some_and(|&c| c >= n),
            "{key} at least {n}: {counted:#?}"
        )
    };
    // The first slot of each: three attempts of `counted` (two of them retries), one of
    // `dropped` whose retry would have passed the next slot.
    at_least("leasehold_runs_total{task=counted,outcome=failed}", 2);
    at_least("leasehold_runs_total{task=counted,outcome=ok}", 1);
    at_least("leasehold_run_retries_total{task=counted}", 2);
    at_least("leasehold_retries_dropped_total{task=dropped}", 1);
    assert_eq!(
        counted.get("leasehold_run_retries_total{task=dropped}"),
        None,
        "{counted:#?}"
    );
}

/// Jitter: two instances of a task on every 60 s with up to 20 s of jitter. Each slot runs
/// once, as the slot due (not a late or catch-up one), started when the slot's own delay says:
/// the same delay both instances compute, different from slot to slot.
#[tokio::test(start_paused = true)]
async fn jitter_puts_each_slot_off_by_its_own_delay_on_whichever_instance_runs_it() {
    let store = MemoryStore::new();
    let calls: Calls = Arc::default();
    let make = || task("spread", SEC * 60, &calls, |_| Act::Ok).jitter(SEC * 20);
    let policy = make().run_policy();
    let handles: Vec<SchedulerHandle> = ["a", "b"]
        .iter()
        .map(|holder| {
            Scheduler::new(store.clone())
                .holder(HolderId::new(*holder).unwrap())
                .lease_config(LeaseConfig::new(SEC * 15))
                .task(make())
                .start(std::future::pending())
                .unwrap()
        })
        .collect();
    tokio::time::sleep(SEC * 60 * 6 + SEC * 30).await;
    let records = runs(&handles[0], "spread").await;
    assert!(records.len() >= 5, "{records:?}");
    let name = LeaseName::new("spread").unwrap();
    let schedule = Schedule::every(SEC * 60).unwrap();
    let mut delays = std::collections::HashSet::new();
    for r in &records {
        let slot = r.slot.unwrap();
        assert_eq!(
            r.trigger,
            Some(leasehold::history::RecordTrigger::Timer),
            "{r:?}"
        );
        let expected = ms(policy.start_delay(&name, &schedule, slot));
        let started = r.started_ms.unwrap() - slot;
        assert!(
            started >= expected && started <= expected + 50,
            "slot {slot}: started {started} ms after it, its delay is {expected} ms"
        );
        delays.insert(expected);
    }
    assert!(
        delays.len() > 2,
        "the delay differs from slot to slot: {delays:?}"
    );
    let mut slots: Vec<u64> = records.iter().map(|r| r.slot.unwrap()).collect();
    slots.dedup();
    assert_eq!(slots.len(), records.len(), "no slot twice: {records:?}");
    assert!(
        slots.windows(2).all(|w| w[1] == w[0] + 60_000),
        "no slot missed: {slots:?}"
    );
}
