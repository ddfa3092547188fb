//! The checker: what the ledger says about the guarantees.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use serde::Serialize;
use serde_json::Value;

use leasehold_witness::ledger::{Fenced, LedgerEntry};

/// A stretch of time in which the store lost acknowledged writes (the harness restarted its own
/// Redis without persistence). Overlaps and duplicate slots that begin inside one are a documented
/// non-guarantee: they are reported, as excused, and do not fail the run. Fencing must hold even
/// there.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct LossWindow {
    /// Start, ms since the Unix epoch.
    pub from_ms: u64,
    /// End, ms since the Unix epoch.
    pub to_ms: u64,
}

impl LossWindow {
    fn contains(&self, ms: u64) -> bool {
        self.from_ms <= ms && ms <= self.to_ms
    }
}

/// What the checker found. The first three counts must be zero.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct CheckReport {
    /// Runs in the ledger (every outcome).
    pub executions: usize,
    /// Runs whose write was accepted.
    pub accepted: usize,
    /// Runs stopped (SIGTERM) before their write.
    pub aborted: usize,
    /// Pairs of runs that overlap in time and both had their write accepted, outside store
    /// write-loss windows. Must be 0.
    pub overlapping_accepted: usize,
    /// Such pairs that began inside a store write-loss window (a documented non-guarantee).
    pub overlapping_accepted_excused: usize,
    /// Pairs of runs of any outcome that overlap in time (information: a paused holder that
    /// resumes overlaps the new holder in wall time, and must be fenced).
    pub raw_overlaps: usize,
    /// Extra runs of a slot that had already run, whatever either run's write became
    /// (accepted, refused by the fence, or stopped before it), outside write-loss windows.
    /// Must be 0.
    pub duplicate_slots: usize,
    /// Such duplicates inside a store write-loss window.
    pub duplicate_slots_excused: usize,
    /// Runs of a slot again after its run was cut off (trigger `retry`, under a newer token
    /// than every earlier run of the slot): not duplicates (issue 38).
    pub reruns: usize,
    /// Of those, runs again of a slot whose earlier write had been accepted: the run was cut
    /// off after its work and before its end was recorded (at least once, information).
    pub reruns_after_accepted: usize,
    /// Accepted writes whose token was below one accepted before them. Must be 0.
    pub stale_accepted: usize,
    /// Writes refused by the fence.
    pub stale_rejected: usize,
    /// Accepted writes that carried no token or no slot.
    pub unfenced_accepted: usize,
    /// Lowest slot seen: the scheduled time of the earliest firing that ran, ms since the Unix
    /// epoch on the store's clock.
    pub first_slot: Option<u64>,
    /// Highest slot seen.
    pub last_slot: Option<u64>,
    /// Firings of the schedule between the first slot and the last with no run at all.
    pub missed_slots: usize,
    /// Up to 20 human-readable descriptions of each violation found.
    pub violations: Vec<String>,
}

impl CheckReport {
    /// Whether every guarantee the ledger can show held.
    pub fn ok(&self) -> bool {
        self.overlapping_accepted == 0
            && self.duplicate_slots == 0
            && self.stale_accepted == 0
            && self.unfenced_accepted == 0
    }

    /// The report as JSON: its fields, and `ok`.
    pub fn to_json(&self) -> Value {
        serde_json::to_value(self.with_ok()).unwrap_or_default()
    }

    /// The report with its verdict, as report.json holds it.
    pub(crate) fn with_ok(&self) -> WithOk<'_> {
        WithOk {
            report: self,
            ok: self.ok(),
        }
    }

    fn note(&mut self, what: String) {
        if self.violations.len() < 20 {
            self.violations.push(what);
        }
    }
}

/// A [`CheckReport`]'s fields and its verdict `ok`, serialized side by side.
#[derive(Debug, Serialize)]
pub(crate) struct WithOk<'a> {
    #[serde(flatten)]
    report: &'a CheckReport,
    ok: bool,
}

fn describe(e: &LedgerEntry) -> String {
    format!(
        "slot {} token {} by {} (pid {}, {}..{} ms, {})",
        e.slot.map_or("-".into(), |s| s.to_string()),
        e.token.map_or("-".into(), |t| t.to_string()),
        e.holder,
        e.pid,
        e.start_ms,
        e.end_ms,
        e.fenced.as_str()
    )
}

/// Checks a ledger, given in the order it was written (the order of the fence's decisions).
///
/// `every` is the interval of the schedule the ledger's runs came from (the `--every` the
/// replicas were given). A slot is the firing's scheduled time in ms since the Unix epoch, and an
/// interval schedule fires at every multiple of `every`, so two slots that ran `k` intervals apart
/// leave `k - 1` missed slots between them. (Slots that are firing indexes, the scheduler's
/// older meaning, are counted alike with `every` = 1 ms.)
pub fn check(entries: &[LedgerEntry], loss: &[LossWindow], every: Duration) -> CheckReport {
    let mut r = CheckReport {
        executions: entries.len(),
        ..CheckReport::default()
    };
    let excused = |ms: u64| loss.iter().any(|w| w.contains(ms));

    // Fencing, in decision order.
    let mut max_accepted: Option<u64> = None;
    for e in entries {
        match e.fenced {
            Fenced::Accepted => {
                r.accepted += 1;
                match (e.token, e.slot) {
                    (Some(token), Some(_)) => {
                        if max_accepted.is_some_and(|max| token < max) {
                            r.stale_accepted += 1;
                            r.note(format!(
                                "stale write accepted: {} after token {}",
                                describe(e),
                                max_accepted.unwrap_or_default()
                            ));
                        }
                        max_accepted = max_accepted.max(Some(token));
                    }
                    _ => {
                        r.unfenced_accepted += 1;
                        r.note(format!(
                            "write accepted without token or slot: {}",
                            describe(e)
                        ));
                    }
                }
            }
            Fenced::Rejected => r.stale_rejected += 1,
            Fenced::Aborted => r.aborted += 1,
        }
    }

    // Overlaps: sweep over runs sorted by start.
    let mut by_start: Vec<&LedgerEntry> = entries.iter().collect();
    by_start.sort_by_key(|e| (e.start_ms, e.end_ms));
    for (i, a) in by_start.iter().enumerate() {
        for b in &by_start[i + 1..] {
            if b.start_ms >= a.end_ms {
                break;
            }
            if !a.overlaps(b) {
                continue;
            }
            r.raw_overlaps += 1;
            if a.fenced == Fenced::Accepted && b.fenced == Fenced::Accepted {
                if excused(b.start_ms) {
                    r.overlapping_accepted_excused += 1;
                } else {
                    r.overlapping_accepted += 1;
                    r.note(format!(
                        "overlapping accepted runs: {} and {}",
                        describe(a),
                        describe(b)
                    ));
                }
            }
        }
    }

    // Duplicate slots: every execution of a slot after its first, whatever its write's fate
    // (a slot runs at most once; a second run the fence refused still ran), except a run
    // again of a cut-off run: trigger `retry` under a newer token than every earlier run.
    let mut slots: BTreeMap<u64, Vec<&LedgerEntry>> = BTreeMap::new();
    for e in entries {
        if let Some(slot) = e.slot {
            slots.entry(slot).or_default().push(e);
        }
    }
    for runs in slots.values_mut() {
        runs.sort_by_key(|e| (e.start_ms, e.end_ms));
        for (i, dup) in runs.iter().enumerate().skip(1) {
            let earlier = &runs[..i];
            let newer = |e: &&LedgerEntry| e.token.is_some() && e.token < dup.token;
            if dup.trigger == "retry" && earlier.iter().all(newer) {
                r.reruns += 1;
                if earlier.iter().any(|e| e.fenced == Fenced::Accepted) {
                    r.reruns_after_accepted += 1;
                }
            } else if excused(dup.start_ms) {
                r.duplicate_slots_excused += 1;
            } else {
                r.duplicate_slots += 1;
                r.note(format!(
                    "slot run twice: {} and {}",
                    describe(runs[0]),
                    describe(dup)
                ));
            }
        }
    }

    // Missed slots: firings with no run of any outcome.
    let seen: BTreeSet<u64> = entries.iter().filter_map(|e| e.slot).collect();
    r.first_slot = seen.first().copied();
    r.last_slot = seen.last().copied();
    r.missed_slots = missed_slots(&seen, every, 0).0;
    r
}

/// The firings of an interval schedule between the first and the last of `seen` that are not in
/// `seen`: how many, and the scheduled times (ms) of the first `list` of them. The gap between
/// two consecutive slots that ran is a number of intervals; one that is not a whole number (a
/// schedule changed mid-run) is rounded to the nearest.
pub(crate) fn missed_slots(
    seen: &BTreeSet<u64>,
    every: Duration,
    list: usize,
) -> (usize, Vec<u64>) {
    let step = u64::try_from(every.as_millis()).unwrap_or(u64::MAX).max(1);
    let (mut count, mut times) = (0usize, Vec::new());
    let mut slots = seen.iter().copied();
    let Some(mut prev) = slots.next() else {
        return (0, times);
    };
    for next in slots {
        let gap = next - prev;
        let firings = gap / step + u64::from(gap % step >= step.div_ceil(2));
        let missed = firings.saturating_sub(1);
        count = count.saturating_add(usize::try_from(missed).unwrap_or(usize::MAX));
        for k in 1..=missed {
            if times.len() >= list {
                break;
            }
            times.push(prev + k * step);
        }
        prev = next;
    }
    (count, times)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The replicas' interval.
    const EVERY: Duration = Duration::from_millis(500);

    /// The slot of the `i`-th firing of the test schedule: its time in ms since the epoch.
    fn slot(i: u64) -> u64 {
        1_700_000_000_000 + i * 500
    }

    /// A run of the `i`-th firing.
    fn run(i: u64, token: u64, start: u64, end: u64, fenced: Fenced) -> LedgerEntry {
        LedgerEntry {
            task: "t".into(),
            slot: Some(slot(i)),
            token: Some(token),
            holder: format!("r{token}"),
            trigger: "timer".into(),
            pid: 1000 + u32::try_from(i).unwrap(),
            start_ms: start,
            end_ms: end,
            fenced,
            fence_max: None,
        }
    }

    fn clean() -> Vec<LedgerEntry> {
        vec![
            run(10, 1, 5000, 5100, Fenced::Accepted),
            run(11, 2, 5500, 5600, Fenced::Accepted),
            run(12, 3, 6000, 6100, Fenced::Accepted),
            // slot 13 missed (takeover), 14 ran
            run(14, 4, 7000, 7100, Fenced::Accepted),
        ]
    }

    #[test]
    fn a_clean_ledger_passes() {
        let r = check(&clean(), &[], EVERY);
        assert!(r.ok(), "{r:?}");
        assert_eq!(r.executions, 4);
        assert_eq!(r.accepted, 4);
        assert_eq!(r.raw_overlaps, 0);
        assert_eq!(r.missed_slots, 1);
        assert_eq!(
            (r.first_slot, r.last_slot),
            (Some(slot(10)), Some(slot(14)))
        );
        assert!(r.violations.is_empty());
    }

    #[test]
    fn overlapping_accepted_runs_are_detected() {
        let mut l = clean();
        l.push(run(15, 5, 7050, 7150, Fenced::Accepted));
        let r = check(&l, &[], EVERY);
        assert!(!r.ok());
        assert_eq!(r.overlapping_accepted, 1);
        assert_eq!(r.raw_overlaps, 1);
        assert_eq!(r.violations.len(), 1);
    }

    #[test]
    fn a_fenced_stale_holder_overlaps_but_passes() {
        let mut l = clean();
        // A holder that claimed slot 13 with token 3 is paused from 6500 to 8000, and writes
        // after token 4: refused. Its slot ran once, so it is no duplicate.
        l.push(run(13, 3, 6500, 8000, Fenced::Rejected));
        let r = check(&l, &[], EVERY);
        assert!(r.ok(), "{r:?}");
        assert_eq!(r.stale_rejected, 1);
        assert_eq!(r.raw_overlaps, 1);
        assert_eq!(r.overlapping_accepted, 0);
        assert_eq!(r.duplicate_slots, 0);
    }

    #[test]
    fn a_cut_off_run_run_again_under_a_newer_token_is_no_duplicate() {
        let mut l = clean();
        let mut again = run(14, 5, 7200, 7300, Fenced::Accepted);
        again.trigger = "retry".into();
        l.push(again.clone());
        let r = check(&l, &[], EVERY);
        assert!(r.ok(), "{r:?}");
        assert_eq!(
            (r.reruns, r.reruns_after_accepted, r.duplicate_slots),
            (1, 1, 0)
        );
        // Under the token of the run it repeats, or an older one: a duplicate.
        let mut l = clean();
        again.token = Some(4);
        l.push(again);
        let r = check(&l, &[], EVERY);
        assert_eq!((r.reruns, r.duplicate_slots), (0, 1));
    }

    #[test]
    fn duplicate_slots_are_detected() {
        let mut l = clean();
        l.push(run(14, 5, 7200, 7300, Fenced::Accepted));
        let r = check(&l, &[], EVERY);
        assert!(!r.ok());
        assert_eq!(r.duplicate_slots, 1);
        assert_eq!(r.overlapping_accepted, 0);
    }

    #[test]
    fn a_slot_run_twice_is_a_duplicate_even_when_the_fence_refused_one_write() {
        // Slot 14 ran with token 4 (accepted), then ran again with a stale token: the fence
        // refused the second write, but the slot still ran twice.
        let mut l = clean();
        l.push(run(14, 3, 7200, 7300, Fenced::Rejected));
        let r = check(&l, &[], EVERY);
        assert!(!r.ok(), "{r:?}");
        assert_eq!(r.duplicate_slots, 1);
        assert_eq!((r.stale_rejected, r.stale_accepted), (1, 0));
        assert_eq!(r.overlapping_accepted, 0);
        assert_eq!(r.violations.len(), 1, "{:?}", r.violations);
        // Aborted before its write: it ran all the same.
        let mut l = clean();
        l.push(run(12, 5, 7200, 7250, Fenced::Aborted));
        assert_eq!(check(&l, &[], EVERY).duplicate_slots, 1);
        // Three runs of one slot: two duplicates.
        l.push(run(12, 6, 7400, 7450, Fenced::Accepted));
        assert_eq!(check(&l, &[], EVERY).duplicate_slots, 2);
    }

    #[test]
    fn overlapping_executions_are_counted_whatever_their_fate() {
        // Two runs of different slots at once: both accepted is a violation...
        let mut l = clean();
        l.push(run(15, 5, 7050, 7150, Fenced::Accepted));
        let r = check(&l, &[], EVERY);
        assert_eq!((r.raw_overlaps, r.overlapping_accepted), (1, 1));
        assert_eq!(r.duplicate_slots, 0);
        // ...one refused by the fence is an overlap the fence caught.
        let mut l = clean();
        l.push(run(15, 3, 7050, 7150, Fenced::Rejected));
        let r = check(&l, &[], EVERY);
        assert!(r.ok(), "{r:?}");
        assert_eq!((r.raw_overlaps, r.overlapping_accepted), (1, 0));
        // Two overlapping runs of the same slot: an overlap and a duplicate.
        let mut l = clean();
        l.push(run(14, 3, 7050, 7150, Fenced::Rejected));
        let r = check(&l, &[], EVERY);
        assert!(!r.ok(), "{r:?}");
        assert_eq!((r.raw_overlaps, r.duplicate_slots), (1, 1));
    }

    #[test]
    fn a_clean_ledger_has_no_duplicates_or_overlaps() {
        let r = check(&clean(), &[], EVERY);
        assert_eq!(
            (r.duplicate_slots, r.duplicate_slots_excused),
            (0, 0),
            "{r:?}"
        );
        assert_eq!((r.raw_overlaps, r.overlapping_accepted), (0, 0));
    }

    #[test]
    fn stale_accepted_writes_are_detected() {
        let mut l = clean();
        l.push(run(15, 3, 7500, 7600, Fenced::Accepted));
        let r = check(&l, &[], EVERY);
        assert!(!r.ok());
        assert_eq!(r.stale_accepted, 1);
    }

    #[test]
    fn writes_without_tokens_are_violations() {
        let mut l = clean();
        let mut e = run(15, 9, 7500, 7600, Fenced::Accepted);
        e.token = None;
        l.push(e);
        assert_eq!(check(&l, &[], EVERY).unfenced_accepted, 1);
    }

    #[test]
    fn store_write_loss_excuses_overlaps_and_duplicates_but_not_stale_writes() {
        let mut l = clean();
        l.push(run(14, 50, 7050, 7150, Fenced::Accepted));
        let loss = [LossWindow {
            from_ms: 7000,
            to_ms: 9000,
        }];
        let r = check(&l, &loss, EVERY);
        assert!(r.ok(), "{r:?}");
        assert_eq!(r.overlapping_accepted_excused, 1);
        assert_eq!(r.duplicate_slots_excused, 1);
        l.push(run(16, 40, 8000, 8100, Fenced::Accepted));
        assert_eq!(check(&l, &loss, EVERY).stale_accepted, 1);
    }

    #[test]
    fn missed_slots_are_the_gaps_between_ms_slots_in_intervals() {
        // Firings 10, 11, 12 and 14 ran: one missed. Slots are 500 ms apart, not 1.
        assert_eq!(check(&clean(), &[], EVERY).missed_slots, 1);
        let mut l = clean();
        // An outage: firings 15 to 23 missed, 24 ran.
        l.push(run(24, 5, 12_000, 12_100, Fenced::Accepted));
        let r = check(&l, &[], EVERY);
        assert_eq!(r.missed_slots, 1 + 9);
        assert_eq!(r.last_slot, Some(slot(24)));
        // A duplicate or an aborted run is a run: it fills its slot, and adds no missed slot.
        l.push(run(20, 6, 13_000, 13_050, Fenced::Aborted));
        l.push(run(24, 7, 14_000, 14_100, Fenced::Rejected));
        assert_eq!(check(&l, &[], EVERY).missed_slots, 1 + 5 + 3);
        // The times of the missed firings, and a cap on how many are listed.
        let seen: BTreeSet<u64> = [slot(0), slot(1), slot(4), slot(6)].into();
        assert_eq!(
            missed_slots(&seen, EVERY, 10),
            (3, vec![slot(2), slot(3), slot(5)])
        );
        assert_eq!(missed_slots(&seen, EVERY, 1), (3, vec![slot(2)]));
        // A gap that is not whole intervals is rounded to the nearest.
        let seen: BTreeSet<u64> = [slot(0), slot(3) + 200].into();
        assert_eq!(missed_slots(&seen, EVERY, 0).0, 2);
        let seen: BTreeSet<u64> = [slot(0), slot(3) + 300].into();
        assert_eq!(missed_slots(&seen, EVERY, 0).0, 3);
        // No slot or one slot: nothing missed.
        assert_eq!(missed_slots(&BTreeSet::new(), EVERY, 10), (0, vec![]));
        assert_eq!(missed_slots(&[slot(3)].into(), EVERY, 10), (0, vec![]));
    }

    #[test]
    fn index_slots_count_with_a_one_ms_step() {
        let mut l = clean();
        for e in &mut l {
            e.slot = e.slot.map(|s| (s - slot(0)) / 500);
        }
        let r = check(&l, &[], Duration::from_millis(1));
        assert_eq!((r.first_slot, r.last_slot), (Some(10), Some(14)));
        assert_eq!(r.missed_slots, 1);
    }

    #[test]
    fn aborted_runs_count_as_runs_not_writes() {
        let mut l = clean();
        l.push(run(13, 5, 6500, 6550, Fenced::Aborted));
        let r = check(&l, &[], EVERY);
        assert!(r.ok());
        assert_eq!((r.aborted, r.missed_slots), (1, 0));
    }

    #[test]
    fn the_report_json_keeps_its_fields_and_ok() {
        let r = check(&clean(), &[], EVERY);
        let v = r.to_json();
        let keys: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
        assert_eq!(
            keys,
            [
                "aborted",
                "accepted",
                "duplicate_slots",
                "duplicate_slots_excused",
                "executions",
                "first_slot",
                "last_slot",
                "missed_slots",
                "ok",
                "overlapping_accepted",
                "overlapping_accepted_excused",
                "raw_overlaps",
                "reruns",
                "reruns_after_accepted",
                "stale_accepted",
                "stale_rejected",
                "unfenced_accepted",
                "violations",
            ]
        );
        assert_eq!(v["ok"], true);
        assert_eq!(v["executions"], 4);
        assert_eq!(v["first_slot"], slot(10));
        assert_eq!(v["violations"], serde_json::json!([]));
        let mut l = clean();
        l.push(run(14, 3, 7200, 7300, Fenced::Rejected));
        let v = check(&l, &[], EVERY).to_json();
        assert_eq!(
            (&v["ok"], &v["duplicate_slots"]),
            (&false.into(), &1.into())
        );
        assert_eq!(v["violations"].as_array().unwrap().len(), 1);
    }
}
