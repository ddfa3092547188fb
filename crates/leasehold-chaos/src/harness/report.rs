//! The end of a run: check the ledger, measure takeovers, write report.json and timeline.svg.

use leasehold::store::BoxError;

use super::*;
use crate::check::WithOk;

/// p50 (nearest rank) and max of samples, in ms.
pub(super) fn p50_max(samples: &[u64]) -> Option<(u64, u64)> {
    let mut v = samples.to_vec();
    v.sort_unstable();
    let p50 = *v.get(v.len().div_ceil(2).checked_sub(1)?)?;
    Some((p50, *v.last()?))
}

/// The time from `at_ms` until the poller first saw someone other than `old` hold the lease.
fn takeover_ms(tenures: &[Tenure], at_ms: u64, old: &str, limit_ms: u64) -> Option<(u64, String)> {
    tenures
        .iter()
        .find(|t| t.from_ms >= at_ms && t.holder != old)
        .map(|t| (t.from_ms - at_ms, t.holder.clone()))
        .filter(|(d, _)| *d <= limit_ms)
}

/// report.json: the settings, the checker's counts, and what each fault did.
#[derive(Debug, Serialize)]
struct Report<'a> {
    ok: bool,
    store: &'static str,
    seed: u64,
    lease: &'a str,
    replicas: usize,
    duration_ms: u64,
    ttl_ms: u64,
    every_ms: u64,
    work_ms: u64,
    faults_requested: usize,
    check: WithOk<'a>,
    unreadable_ledger_lines: usize,
    fencing_checks: Vec<FencingJson<'a>>,
    /// Per fault kind.
    takeover_ms: BTreeMap<&'static str, TakeoverStats<'a>>,
    takeovers: Vec<TakeoverJson<'a>>,
    faults_by_kind: BTreeMap<&'static str, usize>,
    faults: &'a [FaultRecord],
    store_restarts: Vec<RestartJson<'a>>,
    store_loss_windows: &'a [LossWindow],
    poller: PollerJson,
    replicas_started: usize,
    notes: &'a [String],
}

/// A fencing check and what became of the paused command's write.
#[derive(Debug, Serialize)]
struct FencingJson<'a> {
    #[serde(flatten)]
    check: &'a FencingCheck,
    outcome: &'static str,
    run_start_ms: Option<u64>,
    write_ms: Option<u64>,
    paused_mid_work: bool,
}

/// Takeover times of one fault kind.
#[derive(Debug, Serialize)]
struct TakeoverStats<'a> {
    n: usize,
    p50: u64,
    max: u64,
    samples: &'a [u64],
}

/// A kill or graceful stop, and who took over how soon.
#[derive(Debug, Serialize)]
struct TakeoverJson<'a> {
    #[serde(flatten)]
    probe: &'a TakeoverProbe,
    new_holder: Option<String>,
    takeover_ms: Option<u64>,
}

/// The tokens before and after one store restart.
#[derive(Debug, Serialize)]
struct RestartJson<'a> {
    at_ms: u64,
    before: TokensRead<'a>,
    after: TokensRead<'a>,
    kept: bool,
}

/// `{"leader", "task"}`, or `{"error"}` when the store did not answer.
#[derive(Debug, Serialize)]
#[serde(untagged)]
enum TokensRead<'a> {
    Read(Tokens),
    Failed { error: &'a str },
}

impl<'a> From<&'a Result<Tokens, String>> for TokensRead<'a> {
    fn from(t: &'a Result<Tokens, String>) -> Self {
        match t {
            Ok(t) => Self::Read(*t),
            Err(error) => Self::Failed { error },
        }
    }
}

/// The harness's own view of the lease.
#[derive(Debug, Serialize)]
struct PollerJson {
    polls: u64,
    errors: u64,
    tenures: usize,
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// At most this many missed slots are drawn on the timeline.
const MISSED_DRAWN: usize = 5_000;

/// A run's tooltip: its slot (the firing's scheduled time, and how long after the picture's
/// start), token, holder and pid.
fn run_detail(e: &LedgerEntry, start_ms: u64) -> String {
    let slot = match e.slot {
        Some(s) if s >= start_ms => format!("slot {s} (+{:.3}s)", (s - start_ms) as f64 / 1000.0),
        Some(s) => format!("slot {s}"),
        None => "no slot".into(),
    };
    let token = e.token.map_or("-".into(), |t| t.to_string());
    format!(
        "{slot}, token {token}, {} pid {}, {}..{} ms",
        e.holder, e.pid, e.start_ms, e.end_ms
    )
}

struct Line {
    what: String,
    value: String,
    required: &'static str,
    ok: Option<bool>,
}

fn line(
    what: impl Into<String>,
    value: impl ToString,
    required: &'static str,
    ok: Option<bool>,
) -> Line {
    Line {
        what: what.into(),
        value: value.to_string(),
        required,
        ok,
    }
}

impl Harness {
    pub(super) fn report(&self) -> Result<u8> {
        let (entries, unreadable) =
            ledger::read(&self.ledger).map_err(|source| ChaosError::Ledger {
                path: self.ledger.clone(),
                source,
            })?;
        let checked: CheckReport = check::check(&entries, &self.loss, self.s.every);
        let tenures = &self.polled.tenures;

        // Fencing checks: what the paused command's write became.
        let fencing: Vec<(FencingCheck, &'static str, Option<&LedgerEntry>)> = self
            .checks
            .iter()
            .map(|c| {
                let write = entries.iter().find(|e| e.pid == c.pid);
                let newer = c.fence_max_at_resume.is_some_and(|m| m > c.token);
                let outcome = match (write.map(|e| e.fenced), newer) {
                    (Some(Fenced::Rejected), true) => "rejected",
                    (Some(Fenced::Accepted), true) => "ACCEPTED",
                    (Some(Fenced::Accepted), false) => "accepted (no newer write yet)",
                    (Some(Fenced::Aborted), _) => "aborted before its write",
                    (Some(Fenced::Rejected), false) => "rejected",
                    (None, _) => "no write (command gone)",
                };
                (c.clone(), outcome, write)
            })
            .collect();
        let fenced_ok = fencing.iter().filter(|(_, o, _)| *o == "rejected").count();

        // Takeovers.
        let limit = u64::try_from((self.s.ttl * 10).as_millis()).unwrap_or(u64::MAX);
        let mut takeovers: BTreeMap<FaultKind, Vec<u64>> = BTreeMap::new();
        let mut probes_json = Vec::new();
        for p in &self.probes {
            let t = takeover_ms(tenures, p.at_ms, &p.old_holder, limit);
            if let Some((d, _)) = &t {
                takeovers.entry(p.kind).or_default().push(*d);
            }
            probes_json.push(TakeoverJson {
                probe: p,
                takeover_ms: t.as_ref().map(|(d, _)| *d),
                new_holder: t.map(|(_, h)| h),
            });
        }

        // Faults by kind.
        let mut by_kind: BTreeMap<FaultKind, usize> = BTreeMap::new();
        for f in self.faults.iter().filter(|f| !f.skipped) {
            *by_kind.entry(f.kind).or_default() += 1;
        }
        let injected: usize = by_kind.values().sum();
        let skipped = self.faults.iter().filter(|f| f.skipped).count();

        let mut lines = vec![
            line("executions", checked.executions, "", None),
            line("  writes accepted", checked.accepted, "", None),
            line("  stopped before their write", checked.aborted, "", None),
            line(
                "overlapping runs, both writes accepted",
                checked.overlapping_accepted,
                "= 0",
                Some(checked.overlapping_accepted == 0),
            ),
            line(
                "overlapping runs, any outcome (info)",
                checked.raw_overlaps,
                "",
                None,
            ),
            line(
                "duplicate slots (a slot run twice, any outcome)",
                checked.duplicate_slots,
                "= 0",
                Some(checked.duplicate_slots == 0),
            ),
            line(
                "slots run again after a cut-off run (retry, newer token)",
                format!(
                    "{} ({} after an accepted write)",
                    checked.reruns, checked.reruns_after_accepted
                ),
                "",
                None,
            ),
            line(
                "stale fenced writes accepted",
                checked.stale_accepted,
                "= 0",
                Some(checked.stale_accepted == 0),
            ),
            line(
                "stale fenced writes rejected",
                checked.stale_rejected,
                "",
                None,
            ),
            line(
                "paused holder's stale write rejected",
                format!("{fenced_ok} of {}", fencing.len()),
                ">= 1",
                Some(fenced_ok >= 1),
            ),
            line(
                "missed slots",
                format!(
                    "{} (of firings every {})",
                    checked.missed_slots,
                    ms(self.s.every)
                ),
                "",
                None,
            ),
        ];
        if checked.unfenced_accepted > 0 {
            lines.push(line(
                "writes accepted without a token",
                checked.unfenced_accepted,
                "= 0",
                Some(false),
            ));
        }
        if !self.loss.is_empty() {
            lines.push(line(
                "  excused after store restart: overlaps",
                checked.overlapping_accepted_excused,
                "",
                None,
            ));
            lines.push(line(
                "  excused after store restart: duplicate slots",
                checked.duplicate_slots_excused,
                "",
                None,
            ));
        }
        // A durable store keeps the lease through a crash; Redis without persistence forgets it,
        // and a failover keeps it only if it was replicated.
        let durable = matches!(
            self.s.store,
            StoreKind::Postgres | StoreKind::Etcd | StoreKind::Mysql
        );
        let kept = self.restarts.iter().filter(|r| r.kept()).count();
        if !self.restarts.is_empty() {
            if durable {
                lines.push(line(
                    "leases kept across store restarts",
                    format!("{kept} of {}", self.restarts.len()),
                    "all",
                    Some(kept == self.restarts.len()),
                ));
            } else {
                lines.push(line(
                    "leases kept across store restarts (info)",
                    format!(
                        "{kept} of {} ({})",
                        self.restarts.len(),
                        if matches!(
                            self.s.store,
                            StoreKind::RedisSentinel | StoreKind::RedisCluster
                        ) {
                            "a failover keeps what was replicated"
                        } else {
                            "no persistence: forgotten"
                        }
                    ),
                    "",
                    None,
                ));
            }
        }
        lines.push(line(
            "executions recorded",
            checked.executions,
            "> 0",
            Some(checked.executions > 0),
        ));
        for kind in [FaultKind::Kill, FaultKind::Terminate] {
            let label = if kind == FaultKind::Kill {
                "takeover after SIGKILL"
            } else {
                "takeover after SIGTERM (graceful)"
            };
            let value = match p50_max(takeovers.get(&kind).map_or(&[][..], Vec::as_slice)) {
                Some((p50, max)) => {
                    format!("p50 {p50} ms, max {max} ms (n={})", takeovers[&kind].len())
                }
                None => "-".into(),
            };
            lines.push(line(label, value, "", None));
        }
        let kinds: Vec<String> = by_kind.iter().map(|(k, n)| format!("{k} {n}")).collect();
        lines.push(line(
            "faults injected",
            format!("{injected} ({})", kinds.join(", ")),
            ">= --faults",
            Some(injected >= self.s.faults),
        ));
        if skipped > 0 {
            lines.push(line("faults skipped", skipped, "", None));
        }
        let ok = checked.ok()
            && (!durable || kept == self.restarts.len())
            && fenced_ok >= 1
            && checked.executions > 0
            && injected >= self.s.faults
            && unreadable == 0;
        if unreadable > 0 {
            lines.push(line(
                "unreadable ledger lines",
                unreadable,
                "= 0",
                Some(false),
            ));
        }

        // The table.
        let width = lines.iter().map(|l| l.what.len()).max().unwrap_or(0);
        println!();
        println!(
            "chaos report: store {}, seed {}, lease {}",
            self.s.store.as_str(),
            self.s.seed,
            self.lease
        );
        for l in &lines {
            let verdict = match l.ok {
                Some(true) => "ok",
                Some(false) => "FAIL",
                None => "",
            };
            println!(
                "  {:<width$}  {:<40} {:<11} {verdict}",
                l.what, l.value, l.required
            );
        }
        for v in &checked.violations {
            println!("  violation: {v}");
        }
        for (c, outcome, write) in &fencing {
            let run = match write {
                Some(e) if e.start_ms < c.paused_ms => format!(
                    "run {}..{} ms, paused {} ms into its work",
                    e.start_ms,
                    e.end_ms,
                    c.paused_ms - e.start_ms
                ),
                Some(e) => format!("run {}..{} ms, paused while starting", e.start_ms, e.end_ms),
                None => "no ledger line".into(),
            };
            println!(
                "  fencing check: {} paused with token {} (pid {}; {run}), fence at {} on resume: {outcome}",
                c.holder,
                c.token,
                c.pid,
                c.fence_max_at_resume.map_or("-".into(), |m| m.to_string())
            );
        }
        for n in &self.notes {
            println!("  note: {n}");
        }

        // report.json
        let report = Report {
            ok,
            store: self.s.store.as_str(),
            seed: self.s.seed,
            lease: &self.lease,
            replicas: self.s.replicas,
            duration_ms: millis(self.s.duration),
            ttl_ms: millis(self.s.ttl),
            every_ms: millis(self.s.every),
            work_ms: millis(self.s.work),
            faults_requested: self.s.faults,
            check: checked.with_ok(),
            unreadable_ledger_lines: unreadable,
            fencing_checks: fencing
                .iter()
                .map(|(c, outcome, write)| FencingJson {
                    check: c,
                    outcome,
                    run_start_ms: write.map(|e| e.start_ms),
                    write_ms: write.map(|e| e.end_ms),
                    paused_mid_work: write.is_some_and(|e| e.start_ms < c.paused_ms),
                })
                .collect(),
            takeover_ms: takeovers
                .iter()
                .map(|(k, v)| {
                    let (p50, max) = p50_max(v).unwrap_or_default();
                    let stats = TakeoverStats {
                        n: v.len(),
                        p50,
                        max,
                        samples: v,
                    };
                    (k.as_str(), stats)
                })
                .collect(),
            takeovers: probes_json,
            faults_by_kind: by_kind.iter().map(|(k, n)| (k.as_str(), *n)).collect(),
            faults: &self.faults,
            store_restarts: self
                .restarts
                .iter()
                .map(|r| RestartJson {
                    at_ms: r.at_ms,
                    before: (&r.before).into(),
                    after: (&r.after).into(),
                    kept: r.kept(),
                })
                .collect(),
            store_loss_windows: &self.loss,
            poller: PollerJson {
                polls: self.polled.polls,
                errors: self.polled.errors,
                tenures: tenures.len(),
            },
            replicas_started: self.replicas.len() + self.retired.len(),
            notes: &self.notes,
        };
        let report_path = self.out.join("report.json");
        serde_json::to_string_pretty(&report)
            .map_err(BoxError::from)
            .and_then(|json| Ok(std::fs::write(&report_path, json + "\n")?))
            .map_err(|source| ChaosError::Report {
                path: report_path.clone(),
                source,
            })?;

        // timeline.svg
        let all: Vec<&Replica> = self.retired.iter().chain(self.replicas.iter()).collect();
        let start_ms = all
            .iter()
            .map(|r| r.started_ms)
            .min()
            .unwrap_or_else(epoch_ms);
        let end_ms = all
            .iter()
            .filter_map(|r| r.ended_ms)
            .max()
            .unwrap_or_else(epoch_ms);
        let row_of = |h: &str| Replica::row_of(h).filter(|r| *r < self.s.replicas);
        let timeline = Timeline {
            title: format!(
                "leasehold chaos: {} replicas on {}, ttl {}, every {}, {} faults, seed {}",
                self.s.replicas,
                self.s.store.as_str(),
                ms(self.s.ttl),
                ms(self.s.every),
                injected,
                self.s.seed
            ),
            start_ms,
            end_ms,
            rows: (0..self.s.replicas)
                .map(|r| format!("replica {r}"))
                .collect(),
            lifetimes: all
                .iter()
                .map(|r| Span {
                    row: r.row,
                    from_ms: r.started_ms,
                    to_ms: r.ended_ms.unwrap_or(end_ms),
                    class: format!("{} ({})", r.holder, r.exit.as_deref().unwrap_or("running")),
                    detail: String::new(),
                })
                .collect(),
            tenures: tenures
                .iter()
                .filter_map(|t| {
                    Some(Span {
                        row: row_of(&t.holder)?,
                        from_ms: t.from_ms,
                        to_ms: t.to_ms,
                        class: format!("{} holds the lease, token {}", t.holder, t.token),
                        detail: String::new(),
                    })
                })
                .collect(),
            runs: entries
                .iter()
                .filter_map(|e: &LedgerEntry| {
                    Some(Span {
                        row: row_of(&e.holder)?,
                        from_ms: e.start_ms,
                        to_ms: e.end_ms,
                        class: e.fenced.as_str().to_owned(),
                        detail: run_detail(e, start_ms),
                    })
                })
                .collect(),
            faults: self
                .faults
                .iter()
                .filter(|f| !f.skipped)
                .map(|f| Marker {
                    at_ms: f.at_ms,
                    until_ms: f.until_ms,
                    kind: f.kind.as_str().to_owned(),
                    label: match &f.target {
                        Some(t) => format!("{} {t}", f.kind),
                        None => f.kind.to_string(),
                    },
                })
                .collect(),
            missed: check::missed_slots(
                &entries.iter().filter_map(|e| e.slot).collect(),
                self.s.every,
                MISSED_DRAWN,
            )
            .1,
        };
        let svg_path = self.out.join("timeline.svg");
        std::fs::write(&svg_path, timeline.render()).map_err(|e| ChaosError::Report {
            path: svg_path.clone(),
            source: e.into(),
        })?;
        println!();
        println!(
            "{}: {} and {}",
            if ok { "PASS" } else { "FAIL" },
            report_path.display(),
            svg_path.display()
        );
        Ok(if ok { 0 } else { 1 })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn p50_and_max() {
        assert_eq!(p50_max(&[]), None);
        assert_eq!(p50_max(&[7]), Some((7, 7)));
        assert_eq!(p50_max(&[30, 10, 20]), Some((20, 30)));
        assert_eq!(p50_max(&[40, 10, 30, 20]), Some((20, 40)));
    }

    #[test]
    fn takeover_is_the_first_other_holder_after_the_fault() {
        let t = |holder: &str, from_ms| Tenure {
            holder: holder.into(),
            token: 1,
            from_ms,
            to_ms: from_ms + 10,
        };
        let tenures = [
            t("r0.0", 100),
            t("r0.0", 900),
            t("r1.0", 1150),
            t("r2.0", 1300),
        ];
        assert_eq!(
            takeover_ms(&tenures, 1000, "r0.0", 5000),
            Some((150, "r1.0".into()))
        );
        assert_eq!(
            takeover_ms(&tenures, 1000, "r1.0", 5000),
            Some((300, "r2.0".into()))
        );
        assert_eq!(takeover_ms(&tenures, 1000, "r0.0", 100), None);
    }

    fn keys(v: &serde_json::Value) -> Vec<&str> {
        let mut k: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
        k.sort_unstable();
        k
    }

    #[test]
    fn report_json_keeps_its_field_names() {
        let checked = CheckReport::default();
        let fencing = FencingCheck {
            holder: "r0.0".into(),
            pid: 7,
            token: 3,
            paused_ms: 10,
            resumed_ms: 20,
            fence_max_at_resume: Some(4),
        };
        let probe = TakeoverProbe {
            kind: FaultKind::Kill,
            at_ms: 30,
            old_holder: "r1.0".into(),
        };
        let faults = [FaultRecord {
            kind: FaultKind::StoreRestart,
            at_ms: 40,
            until_ms: Some(50),
            target: None,
            detail: "d".into(),
            skipped: false,
        }];
        let before = Ok(Tokens {
            leader: Some(5),
            task: None,
        });
        let after = Err("down".to_owned());
        let loss = [LossWindow {
            from_ms: 1,
            to_ms: 2,
        }];
        let samples = [150];
        let notes = ["n".to_owned()];
        let report = Report {
            ok: true,
            store: "redis",
            seed: 1,
            lease: "chaos-x",
            replicas: 5,
            duration_ms: 90_000,
            ttl_ms: 1000,
            every_ms: 500,
            work_ms: 100,
            faults_requested: 10,
            check: checked.with_ok(),
            unreadable_ledger_lines: 0,
            fencing_checks: vec![FencingJson {
                check: &fencing,
                outcome: "rejected",
                run_start_ms: Some(5),
                write_ms: Some(25),
                paused_mid_work: true,
            }],
            takeover_ms: [(
                "kill",
                TakeoverStats {
                    n: 1,
                    p50: 150,
                    max: 150,
                    samples: &samples,
                },
            )]
            .into(),
            takeovers: vec![TakeoverJson {
                probe: &probe,
                new_holder: Some("r2.0".into()),
                takeover_ms: Some(150),
            }],
            faults_by_kind: [("store-restart", 1)].into(),
            faults: &faults,
            store_restarts: vec![RestartJson {
                at_ms: 40,
                before: (&before).into(),
                after: (&after).into(),
                kept: false,
            }],
            store_loss_windows: &loss,
            poller: PollerJson {
                polls: 100,
                errors: 1,
                tenures: 3,
            },
            replicas_started: 6,
            notes: &notes,
        };
        let v = serde_json::to_value(&report).unwrap();
        assert_eq!(
            keys(&v),
            [
                "check",
                "duration_ms",
                "every_ms",
                "faults",
                "faults_by_kind",
                "faults_requested",
                "fencing_checks",
                "lease",
                "notes",
                "ok",
                "poller",
                "replicas",
                "replicas_started",
                "seed",
                "store",
                "store_loss_windows",
                "store_restarts",
                "takeover_ms",
                "takeovers",
                "ttl_ms",
                "unreadable_ledger_lines",
                "work_ms",
            ]
        );
        assert_eq!(v["check"], checked.to_json());
        assert_eq!(v["check"]["ok"], true);
        assert_eq!(
            keys(&v["fencing_checks"][0]),
            [
                "fence_max_at_resume",
                "holder",
                "outcome",
                "paused_mid_work",
                "paused_ms",
                "pid",
                "resumed_ms",
                "run_start_ms",
                "token",
                "write_ms",
            ]
        );
        assert_eq!(
            v["takeover_ms"],
            serde_json::json!({"kill": {"n": 1, "p50": 150, "max": 150, "samples": [150]}})
        );
        assert_eq!(
            v["takeovers"][0],
            serde_json::json!({"kind": "kill", "at_ms": 30, "old_holder": "r1.0",
                               "new_holder": "r2.0", "takeover_ms": 150})
        );
        assert_eq!(v["faults_by_kind"], serde_json::json!({"store-restart": 1}));
        assert_eq!(
            v["faults"][0],
            serde_json::json!({"kind": "store-restart", "at_ms": 40, "until_ms": 50,
                               "target": null, "detail": "d", "skipped": false})
        );
        assert_eq!(
            v["store_restarts"][0],
            serde_json::json!({"at_ms": 40, "before": {"leader": 5, "task": null},
                               "after": {"error": "down"}, "kept": false})
        );
        assert_eq!(
            v["store_loss_windows"],
            serde_json::json!([{"from_ms": 1, "to_ms": 2}])
        );
        assert_eq!(
            v["poller"],
            serde_json::json!({"polls": 100, "errors": 1, "tenures": 3})
        );
        assert_eq!(v["notes"], serde_json::json!(["n"]));
    }
}
