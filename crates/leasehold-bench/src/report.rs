//! The figures of one run, printed as aligned tables or as JSON.

use std::fmt::Write as _;
use std::time::Duration;

use serde::{Serialize, Serializer};
use serde_json::Value;

use crate::stats::{Figure, Spread};

/// What a row of the operations table measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Kind {
    /// A leasehold operation.
    Lease,
    /// The store's floor: the cheapest round trip of the same client.
    Floor,
    /// A peer crate doing the same job.
    Peer,
}

/// A target from the issue and whether this run met it.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Target {
    pub(crate) text: String,
    pub(crate) pass: bool,
}

impl Target {
    pub(crate) fn new(text: impl Into<String>, pass: bool) -> Self {
        Self {
            text: text.into(),
            pass,
        }
    }

    /// [`cell`](Self::cell) of a target if there is one, else empty.
    fn cell_of(target: &Option<Self>) -> String {
        target.as_ref().map_or_else(String::new, Self::cell)
    }

    fn cell(&self) -> String {
        format!("{} {}", if self.pass { "PASS" } else { "MISS" }, self.text)
    }
}

/// `figure p50 / floor p50`, taken within one run.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Ratio {
    pub(crate) floor: String,
    pub(crate) p50: f64,
}

/// One row of the operations table.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct OpRow {
    pub(crate) store: String,
    #[serde(rename = "operation")]
    pub(crate) op: String,
    pub(crate) kind: Kind,
    pub(crate) figure: Figure,
    pub(crate) ratio: Option<Ratio>,
    /// Microseconds the store's server spent per call (Redis: `INFO commandstats`), where
    /// measured.
    #[serde(rename = "server_us_per_call", skip_serializing_if = "Option::is_none")]
    pub(crate) server_us: Option<f64>,
    pub(crate) target: Option<Target>,
}

/// One row of the sidecar table: requests to `leasehold serve` on loopback.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct SidecarRow {
    #[serde(rename = "request")]
    pub(crate) op: String,
    /// Keep-alive connections sending at once.
    pub(crate) clients: usize,
    pub(crate) figure: Figure,
    /// p50 less `GET /healthz`'s p50 with as many connections, in µs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) vs_floor_us: Option<f64>,
    /// The store server's time per request of the pass, in µs.
    #[serde(
        rename = "server_us_per_request",
        skip_serializing_if = "Option::is_none"
    )]
    pub(crate) server_us: Option<f64>,
    pub(crate) target: Option<Target>,
}

/// The sidecar's resident set over many requests.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct SidecarMemoryRow {
    /// Requests answered between the two readings (after a warm-up).
    pub(crate) requests: usize,
    pub(crate) rss_before_bytes: u64,
    pub(crate) rss_after_bytes: u64,
    pub(crate) target: Target,
}

/// Many leases held by one process in a [`leasehold::LeaseSession`].
#[derive(Debug, Clone, Serialize)]
pub(crate) struct HeldRow {
    pub(crate) store: String,
    pub(crate) held: usize,
    /// The session's renewal interval.
    #[serde(rename = "renew_interval_ms", serialize_with = "millis")]
    pub(crate) interval: Duration,
    /// Renewal passes over all leases seen while watched.
    #[serde(rename = "passes_watched")]
    pub(crate) passes: f64,
    /// `renew_many` calls per renewal interval.
    pub(crate) calls_per_interval: f64,
    pub(crate) leases_per_call: f64,
    /// CPU time of the whole process per renewal interval.
    pub(crate) cpu_ms_per_interval: f64,
    /// Renewals per second, one `renew` call per lease.
    #[serde(rename = "one_by_one_per_sec")]
    pub(crate) one_by_one: Spread,
    /// How many leases the one-by-one rate was measured over, per round.
    pub(crate) one_by_one_sample: usize,
    /// Renewals per second within one `renew_many` call.
    #[serde(rename = "renew_many_per_sec")]
    pub(crate) batched: Spread,
    /// Leases in that call.
    pub(crate) renew_many_leases: usize,
    /// Milliseconds that call took.
    pub(crate) renew_many_ms: Spread,
    /// How many times more renewals per second `renew_many` made than one-by-one calls.
    pub(crate) speedup: f64,
    pub(crate) target: Target,
}

/// Tasks spread over instances: how many each owns once all see each other.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct PlacementRow {
    pub(crate) tasks: usize,
    pub(crate) instances: usize,
    pub(crate) min: usize,
    pub(crate) max: usize,
    pub(crate) mean: f64,
    /// From the first start until every instance saw all and each task had one owner.
    #[serde(rename = "settled_ms", serialize_with = "millis")]
    pub(crate) settled_in: Duration,
    pub(crate) target: Target,
}

/// Takeover latency on one store by one path.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct TakeoverRow {
    pub(crate) store: String,
    /// `graceful` or `expiry`.
    pub(crate) path: &'static str,
    pub(crate) trials: usize,
    pub(crate) p50_ms: f64,
    pub(crate) max_ms: f64,
    /// What the figure measures.
    pub(crate) measures: String,
    pub(crate) target: Option<Target>,
}

/// Resident memory per held lease.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct MemoryRow {
    pub(crate) store: String,
    /// How the leases were held: `Lease` (a renewer task per guard) or `LeaseSession`.
    #[serde(rename = "held_by")]
    pub(crate) how: &'static str,
    pub(crate) leases: usize,
    pub(crate) rss_before_bytes: u64,
    pub(crate) rss_after_bytes: u64,
    /// The growth of the resident set divided by the leases.
    pub(crate) bytes_per_lease: f64,
    /// Bytes per lease less the memory store's own record (measured alone in the same run):
    /// what the holder process pays when the records live in a server.
    #[serde(rename = "bytes_per_lease_without_store_record")]
    pub(crate) without_store: Option<f64>,
    pub(crate) target: Option<Target>,
}

/// A store that could not be benchmarked.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Failure {
    pub(crate) store: String,
    /// The error and its causes.
    pub(crate) error: String,
}

/// Everything one run measured.
#[derive(Debug, Clone, Default, Serialize)]
pub(crate) struct Report {
    pub(crate) run_id: String,
    pub(crate) rounds: usize,
    #[serde(rename = "ops_per_round")]
    pub(crate) ops: usize,
    pub(crate) quick: bool,
    pub(crate) operations: Vec<OpRow>,
    /// Only with a Redis store measured: a report without it keeps 0.1.0's shape.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(crate) sidecar: Vec<SidecarRow>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) sidecar_memory: Option<SidecarMemoryRow>,
    pub(crate) held_renewal: Vec<HeldRow>,
    pub(crate) takeover: Vec<TakeoverRow>,
    pub(crate) memory: Vec<MemoryRow>,
    pub(crate) placement: Option<PlacementRow>,
    /// Stores that could not be benchmarked, with the error.
    pub(crate) failures: Vec<Failure>,
    /// How figures were obtained, where it is not obvious.
    pub(crate) notes: Vec<String>,
}

impl Report {
    /// Every target with its figure's name.
    pub(crate) fn targets(&self) -> Vec<(String, &Target)> {
        let mut out = Vec::new();
        for r in &self.operations {
            if let Some(t) = &r.target {
                out.push((format!("{} {}", r.store, r.op), t));
            }
        }
        for r in &self.sidecar {
            if let Some(t) = &r.target {
                out.push((format!("sidecar {} × {}", r.op, r.clients), t));
            }
        }
        if let Some(m) = &self.sidecar_memory {
            out.push((
                format!("sidecar RSS over {} requests", fmt_count(m.requests as f64)),
                &m.target,
            ));
        }
        for r in &self.held_renewal {
            out.push((format!("{} renew {} held", r.store, r.held), &r.target));
        }
        for r in &self.takeover {
            if let Some(t) = &r.target {
                out.push((format!("{} {} takeover", r.store, r.path), t));
            }
        }
        if let Some(p) = &self.placement {
            out.push((
                format!("{} tasks spread over {} instances", p.tasks, p.instances),
                &p.target,
            ));
        }
        for m in &self.memory {
            if let Some(t) = &m.target {
                out.push((format!("memory per lease held by {}", m.how), t));
            }
        }
        out
    }

    /// The report as one JSON object (the `--json` output).
    pub(crate) fn json(&self) -> serde_json::Result<Value> {
        let targets = self
            .targets()
            .into_iter()
            .map(|(figure, target)| NamedTarget { figure, target })
            .collect();
        serde_json::to_value(ReportJson {
            report: self,
            targets,
        })
    }

    pub(crate) fn table(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "leasehold bench: run {}, {} rounds of {} sequential operations per figure; \
             median of the rounds with (min–max); ratios are p50 ÷ the floor's p50 in this run",
            self.run_id, self.rounds, self.ops
        );
        if !self.operations.is_empty() {
            section(
                &mut out,
                "\n",
                &[
                    "store",
                    "operation",
                    "ops/s",
                    "p50",
                    "p99",
                    "p50 vs floor",
                    "server",
                    "target",
                ],
                &self.operations,
                |r| {
                    vec![
                        r.store.clone(),
                        match r.kind {
                            Kind::Lease => r.op.clone(),
                            Kind::Floor => format!("{} (floor)", r.op),
                            Kind::Peer => format!("{} (peer)", r.op),
                        },
                        fmt_rate_spread(&r.figure.ops_per_sec),
                        fmt_us_spread(&r.figure.p50_us),
                        fmt_us_spread(&r.figure.p99_us),
                        r.ratio
                            .as_ref()
                            .map_or_else(String::new, |x| format!("{:.2}× {}", x.p50, x.floor)),
                        fmt_server(r.server_us),
                        Target::cell_of(&r.target),
                    ]
                },
            );
            if self.operations.iter().any(|r| r.server_us.is_some()) {
                out.push_str(
                    "  server: the store server's own time per call (Redis: INFO commandstats \
                     around one untimed pass of each)\n",
                );
            }
        }
        if !self.sidecar.is_empty() {
            section(
                &mut out,
                "\nthe sidecar: leasehold serve on loopback over the redis store, keep-alive \
                 HTTP/1.1 connections sending one request at a time each\n",
                &[
                    "request",
                    "connections",
                    "requests/s",
                    "p50",
                    "p99",
                    "p50 over /healthz",
                    "server",
                    "target",
                ],
                &self.sidecar,
                |r| {
                    vec![
                        r.op.clone(),
                        r.clients.to_string(),
                        fmt_rate_spread(&r.figure.ops_per_sec),
                        fmt_us_spread(&r.figure.p50_us),
                        fmt_us_spread(&r.figure.p99_us),
                        r.vs_floor_us
                            .map_or_else(String::new, |us| format!("{us:+.0}µs")),
                        fmt_server(r.server_us),
                        Target::cell_of(&r.target),
                    ]
                },
            );
        }
        if let Some(m) = &self.sidecar_memory {
            let mib = |b: u64| b as f64 / f64::from(1u32 << 20);
            out.push_str(&format!(
                "sidecar resident set over {} requests (64 connections: acquire, keepalive, \
                 release, tick): {:.1} → {:.1} MiB, {:+.1} MiB   {}\n",
                fmt_count(m.requests as f64),
                mib(m.rss_before_bytes),
                mib(m.rss_after_bytes),
                mib(m.rss_after_bytes) - mib(m.rss_before_bytes),
                m.target.cell()
            ));
        }
        if !self.held_renewal.is_empty() {
            section(
                &mut out,
                "
leases held by one process in a LeaseSession (renewed together)
",
                &[
                    "store",
                    "held",
                    "interval",
                    "calls/interval",
                    "leases/call",
                    "CPU/interval",
                    "target",
                ],
                &self.held_renewal,
                |r| {
                    vec![
                        r.store.clone(),
                        fmt_count(r.held as f64),
                        format!("{} ms", r.interval.as_millis()),
                        format!("{:.2}", r.calls_per_interval),
                        fmt_count(r.leases_per_call),
                        format!("{:.0} ms", r.cpu_ms_per_interval),
                        r.target.cell(),
                    ]
                },
            );
            section(
                &mut out,
                "
renewals/s: one renew call per lease vs one renew_many call
",
                &["store", "one by one", "renew_many", "one call", "speedup"],
                &self.held_renewal,
                |r| {
                    vec![
                        r.store.clone(),
                        format!(
                            "{} (over {})",
                            fmt_rate_spread(&r.one_by_one),
                            fmt_count(r.one_by_one_sample as f64)
                        ),
                        fmt_rate_spread(&r.batched),
                        format!(
                            "{} for {}",
                            fmt_ms_spread(&r.renew_many_ms),
                            fmt_count(r.renew_many_leases as f64)
                        ),
                        format!("{:.1}×", r.speedup),
                    ]
                },
            );
            out.push_str(
                "  calls/interval: renew_many calls the session made per renewal interval while \
                 watched (counted by a pass-through store wrapper); CPU/interval: user + system \
                 time of the whole bench process over the watched intervals, per interval\n",
            );
        }
        if !self.takeover.is_empty() {
            section(
                &mut out,
                "\ntakeover\n",
                &["store", "after", "trials", "p50", "max", "target"],
                &self.takeover,
                |r| {
                    vec![
                        r.store.clone(),
                        r.path.to_owned(),
                        r.trials.to_string(),
                        format!("{:.2}ms", r.p50_ms),
                        format!("{:.2}ms", r.max_ms),
                        Target::cell_of(&r.target),
                    ]
                },
            );
            let mut seen = Vec::new();
            for r in &self.takeover {
                if !seen.contains(&r.path) {
                    seen.push(r.path);
                    let _ = writeln!(out, "  {}: {}", r.path, r.measures);
                }
            }
        }
        if !self.memory.is_empty() {
            let store = &self.memory[0].store;
            section(
                &mut out,
                format!("\nmemory per held lease (guards on the {store} store)\n"),
                &[
                    "held by",
                    "leases",
                    "RSS",
                    "per lease",
                    "without the store's record",
                    "target",
                ],
                &self.memory,
                |m| {
                    vec![
                        m.how.to_owned(),
                        fmt_count(m.leases as f64),
                        format!(
                            "{:.1} → {:.1} MiB",
                            m.rss_before_bytes as f64 / 1048576.0,
                            m.rss_after_bytes as f64 / 1048576.0
                        ),
                        format!("{:.0} B", m.bytes_per_lease),
                        m.without_store
                            .map_or_else(String::new, |b| format!("{b:.0} B")),
                        Target::cell_of(&m.target),
                    ]
                },
            );
        }
        if let Some(p) = &self.placement {
            let _ = writeln!(
                out,
                "\ntasks spread over instances (Scheduler::spread, memory store, one process)\n\
                 {} tasks on {} instances: min {}, max {}, mean {:.1} per instance, settled in \
                 {} ms   {}",
                p.tasks,
                p.instances,
                p.min,
                p.max,
                p.mean,
                p.settled_in.as_millis(),
                p.target.cell()
            );
        }
        let targets = self.targets();
        if !targets.is_empty() {
            let passed = targets.iter().filter(|(_, t)| t.pass).count();
            let _ = writeln!(
                out,
                "\ntargets: {passed} PASS, {} MISS",
                targets.len() - passed
            );
            for (figure, t) in targets.iter().filter(|(_, t)| !t.pass) {
                let _ = writeln!(out, "  MISS {figure}: {}", t.text);
            }
        }
        for Failure { store, error } in &self.failures {
            let _ = writeln!(out, "\n{store}: not benchmarked: {error}");
        }
        if !self.notes.is_empty() {
            out.push_str("\nnotes\n");
            for n in &self.notes {
                let _ = writeln!(out, "  - {n}");
            }
        }
        out
    }
}

/// The JSON form of a report: its fields, and every target with its figure's name.
#[derive(Serialize)]
struct ReportJson<'a> {
    #[serde(flatten)]
    report: &'a Report,
    targets: Vec<NamedTarget<'a>>,
}

#[derive(Serialize)]
struct NamedTarget<'a> {
    figure: String,
    #[serde(flatten)]
    target: &'a Target,
}

/// A duration as whole milliseconds.
fn millis<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_u64(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// `title`, then a table of `items` under `headers`, a row each.
fn section<T>(
    out: &mut String,
    title: impl AsRef<str>,
    headers: &[&str],
    items: &[T],
    row: impl Fn(&T) -> Vec<String>,
) {
    out.push_str(title.as_ref());
    out.push_str(&table(headers, items.iter().map(row).collect()));
}

/// Left-aligned columns, two spaces apart, a rule under the header.
pub(crate) fn table(headers: &[&str], rows: Vec<Vec<String>>) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let mut line = |cells: &mut dyn Iterator<Item = &str>| {
        let mut s = String::new();
        for (i, (cell, w)) in cells.zip(&widths).enumerate() {
            if i > 0 {
                s.push_str("  ");
            }
            s.push_str(cell);
            s.extend(std::iter::repeat_n(' ', w - cell.chars().count()));
        }
        out.push_str(s.trim_end());
        out.push('\n');
    };
    line(&mut headers.iter().copied());
    let rules: Vec<String> = widths.iter().map(|&w| "-".repeat(w)).collect();
    line(&mut rules.iter().map(String::as_str));
    for row in &rows {
        line(&mut row.iter().map(String::as_str));
    }
    out
}

/// `12,345`.
pub(crate) fn fmt_count(v: f64) -> String {
    let digits = format!("{:.0}", v.max(0.0));
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn fmt_rate_spread(s: &Spread) -> String {
    format!(
        "{} ({}–{})",
        fmt_count(s.median),
        fmt_count(s.min),
        fmt_count(s.max)
    )
}

/// Microseconds below 1 ms, else milliseconds; min and max in the median's unit.
fn fmt_us_spread(s: &Spread) -> String {
    if s.median < 1000.0 {
        let f = |v: f64| {
            if v < 10.0 {
                format!("{v:.1}")
            } else {
                format!("{v:.0}")
            }
        };
        format!("{}µs ({}–{})", f(s.median), f(s.min), f(s.max))
    } else {
        let f = |v: f64| format!("{:.2}", v / 1000.0);
        format!("{}ms ({}–{})", f(s.median), f(s.min), f(s.max))
    }
}

/// A server time per call, or nothing where none was measured.
fn fmt_server(us: Option<f64>) -> String {
    us.map_or_else(String::new, |us| format!("{us:.1}µs"))
}

fn fmt_ms_spread(s: &Spread) -> String {
    format!("{:.1}ms ({:.1}–{:.1})", s.median, s.min, s.max)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn formats_numbers_and_aligns_columns() {
        assert_eq!(fmt_count(0.0), "0");
        assert_eq!(fmt_count(999.4), "999");
        assert_eq!(fmt_count(1234.0), "1,234");
        assert_eq!(fmt_count(1234567.0), "1,234,567");
        let s = Spread {
            median: 45.2,
            min: 9.5,
            max: 120.0,
        };
        assert_eq!(fmt_us_spread(&s), "45µs (9.5–120)");
        let s = Spread {
            median: 1500.0,
            min: 1200.0,
            max: 2000.0,
        };
        assert_eq!(fmt_us_spread(&s), "1.50ms (1.20–2.00)");
        let t = table(
            &["a", "bb"],
            vec![
                vec!["µµµ".into(), "x".into()],
                vec!["z".into(), "yyy".into()],
            ],
        );
        assert_eq!(t, "a    bb\n---  ---\nµµµ  x\nz    yyy\n");
    }

    #[test]
    fn json_keeps_the_hand_written_field_names() {
        let spread = Spread {
            median: 2.0,
            min: 1.0,
            max: 3.0,
        };
        let figure = Figure {
            ops_per_sec: spread,
            p50_us: spread,
            p99_us: spread,
            rounds: 2,
            ops_per_round: 10,
        };
        let target = Target::new("p50 ≤ 1 ms", true);
        let report = Report {
            run_id: "r".into(),
            rounds: 2,
            ops: 10,
            quick: true,
            operations: vec![OpRow {
                store: "redis".into(),
                op: "acquire".into(),
                kind: Kind::Lease,
                figure,
                ratio: Some(Ratio {
                    floor: "PING".into(),
                    p50: 1.5,
                }),
                server_us: None,
                target: Some(target.clone()),
            }],
            sidecar: Vec::new(),
            sidecar_memory: None,
            held_renewal: vec![HeldRow {
                store: "redis".into(),
                held: 100,
                interval: Duration::from_millis(1000),
                passes: 3.0,
                calls_per_interval: 1.0,
                leases_per_call: 100.0,
                cpu_ms_per_interval: 4.0,
                one_by_one: spread,
                one_by_one_sample: 50,
                batched: spread,
                renew_many_leases: 100,
                renew_many_ms: spread,
                speedup: 1.0,
                target: target.clone(),
            }],
            takeover: vec![TakeoverRow {
                store: "redis".into(),
                path: "graceful",
                trials: 5,
                p50_ms: 0.5,
                max_ms: 0.9,
                measures: "m".into(),
                target: None,
            }],
            memory: vec![MemoryRow {
                store: "memory".into(),
                how: "Lease",
                leases: 10,
                rss_before_bytes: 1000,
                rss_after_bytes: 2000,
                bytes_per_lease: 100.0,
                without_store: Some(50.0),
                target: None,
            }],
            placement: Some(PlacementRow {
                tasks: 100,
                instances: 10,
                min: 8,
                max: 12,
                mean: 10.0,
                settled_in: Duration::from_millis(1500),
                target: target.clone(),
            }),
            failures: vec![Failure {
                store: "etcd".into(),
                error: "connect to etcd://127.0.0.1:1".into(),
            }],
            notes: vec!["n".into()],
        };
        let spread = json!({ "median": 2.0, "min": 1.0, "max": 3.0 });
        let target = json!({ "text": "p50 ≤ 1 ms", "pass": true });
        // The object the hand-written `json!` built before serde.
        let expected = json!({
            "run_id": "r", "rounds": 2, "ops_per_round": 10, "quick": true,
            "operations": [{
                "store": "redis", "operation": "acquire", "kind": "lease",
                "figure": {
                    "ops_per_sec": spread, "p50_us": spread, "p99_us": spread,
                    "rounds": 2, "ops_per_round": 10,
                },
                "ratio": { "floor": "PING", "p50": 1.5 }, "target": target,
            }],
            "held_renewal": [{
                "store": "redis", "held": 100, "renew_interval_ms": 1000, "passes_watched": 3.0,
                "calls_per_interval": 1.0, "leases_per_call": 100.0, "cpu_ms_per_interval": 4.0,
                "one_by_one_per_sec": spread, "one_by_one_sample": 50,
                "renew_many_per_sec": spread, "renew_many_leases": 100, "renew_many_ms": spread,
                "speedup": 1.0, "target": target,
            }],
            "takeover": [{
                "store": "redis", "path": "graceful", "trials": 5, "p50_ms": 0.5, "max_ms": 0.9,
                "measures": "m", "target": null,
            }],
            "memory": [{
                "store": "memory", "held_by": "Lease", "leases": 10, "rss_before_bytes": 1000,
                "rss_after_bytes": 2000, "bytes_per_lease": 100.0,
                "bytes_per_lease_without_store_record": 50.0, "target": null,
            }],
            "placement": {
                "tasks": 100, "instances": 10, "min": 8, "max": 12, "mean": 10.0,
                "settled_ms": 1500, "target": target,
            },
            "targets": [
                { "figure": "redis acquire", "text": "p50 ≤ 1 ms", "pass": true },
                { "figure": "redis renew 100 held", "text": "p50 ≤ 1 ms", "pass": true },
                { "figure": "100 tasks spread over 10 instances", "text": "p50 ≤ 1 ms", "pass": true },
            ],
            "failures": [{ "store": "etcd", "error": "connect to etcd://127.0.0.1:1" }],
            "notes": ["n"],
        });
        assert_eq!(report.json().unwrap(), expected);
    }
}
