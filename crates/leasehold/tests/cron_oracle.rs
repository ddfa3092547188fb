//! Differential test (issue 27): thousands of random cron expressions (five and six fields,
//! names, steps, ranges, lists) and random instants in five zones, half of them within hours
//! of a daylight-saving change; `Schedule::next_after` against Python's croniter with zoneinfo
//! (tests/cron_oracle/oracle.py, from PyPI at the versions pinned beside it, in a virtualenv
//! this test makes under target/).
//!
//! - Against croniter's wall times turned into instants by zoneinfo under leasehold's
//!   daylight-saving rule: every answer must agree.
//! - Against croniter's own zone-aware answer: they differ only where croniter's
//!   daylight-saving handling differs from the rule leasehold documents (it fires a repeated
//!   wall time on both occurrences, in some zones and for some expressions); each difference
//!   must be of that kind, and the test prints how many there were.
//!
//! `LEASEHOLD_CRON_ORACLE_SEED` replays a seed, `LEASEHOLD_CRON_ORACLE_CASES` sets the count.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use chrono::{DateTime, Offset, TimeZone, Utc};
use chrono_tz::Tz;
use leasehold::Schedule;

const ZONES: [&str; 5] = [
    "Europe/Berlin",
    "America/New_York",
    "Australia/Lord_Howe",
    "Asia/Kolkata",
    "UTC",
];
/// 2000-01-01 and 2040-01-01, seconds since the epoch.
const FROM: i64 = 946_684_800;
const UNTIL: i64 = 2_208_988_800;

fn oracle_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/cron_oracle")
}

/// The virtualenv's python, made (or remade when the requirements change) on first use.
fn python() -> PathBuf {
    let venv = Path::new(env!("CARGO_TARGET_TMPDIR")).join("cron-oracle-venv");
    let python = venv.join("bin/python");
    let requirements = oracle_dir().join("requirements.txt");
    let wanted = std::fs::read_to_string(&requirements).unwrap();
    let stamp = venv.join("requirements.installed");
    if std::fs::read_to_string(&stamp).ok().as_deref() == Some(wanted.as_str()) {
        return python;
    }
    let run = |cmd: &mut Command| {
        let out = cmd.output().unwrap_or_else(|e| {
            panic!("cannot run {cmd:?}: {e} (scripts/stores.sh installs python3 and venv)")
        });
        assert!(
            out.status.success(),
            "{cmd:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    let _ = std::fs::remove_dir_all(&venv);
    run(Command::new("python3").arg("-m").arg("venv").arg(&venv));
    run(Command::new(&python)
        .args([
            "-m",
            "pip",
            "install",
            "-q",
            "--disable-pip-version-check",
            "-r",
        ])
        .arg(&requirements));
    std::fs::write(&stamp, wanted).unwrap();
    python
}

/// A random field: `*`, `*/k`, a value, a range, a stepped range, `a/k`, or a list of those.
/// Values of month and day-of-week fields are sometimes names.
fn field(rng: &mut fastrand::Rng, lo: u16, hi: u16, names: &[&str], dow: bool) -> String {
    let name = |rng: &mut fastrand::Rng, v: u16, end: bool| -> String {
        if names.is_empty() || !rng.bool() {
            return v.to_string();
        }
        match (dow, v) {
            (true, 7) if end => "SUN".to_owned(),
            (true, 7) => "7".to_owned(),
            (true, _) => names[usize::from(v)].to_owned(),
            (false, _) => names[usize::from(v - lo)].to_owned(),
        }
    };
    let step = |rng: &mut fastrand::Rng| rng.u16(1..=(hi - lo).max(2) / 2 + 1);
    // Ranges of two values or more: croniter 7.0.0 misreads one-value ranges (`26-26` in the
    // seconds field as every second, `2-2/6` as 1,7), which leasehold reads as crontab does
    // (the value itself; see the unit test one_value_ranges_are_that_value).
    let range = |rng: &mut fastrand::Rng| {
        let a = rng.u16(lo..hi);
        let b = rng.u16(a + 1..=hi);
        (a, b)
    };
    let item = |rng: &mut fastrand::Rng| match rng.u8(0..4) {
        0 => {
            let v = rng.u16(lo..=hi);
            name(rng, v, false)
        }
        1 => {
            let (a, b) = range(rng);
            format!("{}-{}", name(rng, a, false), name(rng, b, true))
        }
        2 => {
            let (a, b) = range(rng);
            format!("{a}-{b}/{}", step(rng))
        }
        _ => format!(
            "{}/{}",
            rng.u16(lo..=hi.min(if dow { 6 } else { hi })),
            step(rng)
        ),
    };
    match rng.u8(0..10) {
        0..=2 => "*".to_owned(),
        3 => format!("*/{}", step(rng)),
        4..=7 => item(rng),
        _ => {
            let n = rng.usize(2..=3);
            (0..n).map(|_| item(rng)).collect::<Vec<_>>().join(",")
        }
    }
}

const MONTHS: [&str; 12] = [
    "JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC",
];
const DAYS: [&str; 7] = ["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"];

fn expression(rng: &mut fastrand::Rng) -> String {
    let mut fields = Vec::new();
    if rng.bool() {
        // Seconds: mostly 0 or a few values, so six-field expressions are not all every-second.
        fields.push(if rng.bool() {
            "0".to_owned()
        } else {
            field(rng, 0, 59, &[], false)
        });
    }
    fields.push(field(rng, 0, 59, &[], false));
    fields.push(field(rng, 0, 23, &[], false));
    fields.push(field(rng, 1, 31, &[], false));
    fields.push(field(rng, 1, 12, &MONTHS, false));
    fields.push(field(rng, 0, 7, &DAYS, true));
    fields.join(" ")
}

/// The instants in [FROM, UNTIL) where the zone's offset changes.
fn changes(zone: Tz) -> Vec<i64> {
    let offset = |t: i64| {
        zone.offset_from_utc_datetime(&DateTime::from_timestamp(t, 0).unwrap().naive_utc())
            .fix()
            .local_minus_utc()
    };
    let mut out = Vec::new();
    let mut t = FROM;
    while t < UNTIL {
        // A day apart: no zone here changes twice within one.
        let next = t + 86_400;
        if offset(t) != offset(next) {
            let (mut lo, mut hi) = (t, next);
            while hi - lo > 1 {
                let mid = lo + (hi - lo) / 2;
                if offset(mid) == offset(t) {
                    lo = mid;
                } else {
                    hi = mid;
                }
            }
            out.push(hi);
        }
        t = next;
    }
    out
}

struct Case {
    expr: String,
    zone: &'static str,
    t_ms: u64,
    ours: Option<u64>,
}

#[test]
fn next_firings_agree_with_croniter_and_zoneinfo() {
    let seed = std::env::var("LEASEHOLD_CRON_ORACLE_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20_270_328);
    let count: usize = std::env::var("LEASEHOLD_CRON_ORACLE_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(5000);
    println!("seed {seed}, {count} cases (LEASEHOLD_CRON_ORACLE_SEED replays)");
    let mut rng = fastrand::Rng::with_seed(seed);
    let changes: Vec<Vec<i64>> = ZONES.iter().map(|z| changes(z.parse().unwrap())).collect();

    let mut cases = Vec::with_capacity(count);
    while cases.len() < count {
        let expr = expression(&mut rng);
        let zi = rng.usize(0..ZONES.len());
        let zone = ZONES[zi];
        let t = match changes[zi].as_slice() {
            near if !near.is_empty() && rng.bool() => {
                near[rng.usize(0..near.len())] + rng.i64(-4 * 3600..=4 * 3600)
            }
            _ => rng.i64(FROM..UNTIL),
        };
        let t_ms = t as u64 * 1000 + rng.u64(0..1000);
        let ours = match Schedule::cron_in(&expr, zone) {
            Ok(s) => s.next_after(t_ms),
            Err(leasehold::ScheduleError::NeverFires(_)) => None,
            Err(e) => panic!("{expr:?} in {zone}: {e}"),
        };
        cases.push(Case {
            expr,
            zone,
            t_ms,
            ours,
        });
    }

    let mut child = Command::new(python())
        .arg(oracle_dir().join("oracle.py"))
        .env("PYTHONTZPATH", "") // zoneinfo reads the pinned tzdata package, not the host's
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let input: String = cases
        .iter()
        .map(|c| {
            format!(
                "{}\n",
                serde_json::json!({"expr": c.expr, "zone": c.zone, "t": c.t_ms / 1000})
            )
        })
        .collect();
    let writer = std::thread::spawn(move || stdin.write_all(input.as_bytes()).unwrap());
    let answers: Vec<serde_json::Value> = BufReader::new(child.stdout.take().unwrap())
        .lines()
        .map(|l| serde_json::from_str(&l.unwrap()).unwrap())
        .collect();
    writer.join().unwrap();
    assert!(child.wait().unwrap().success(), "oracle.py failed");
    assert_eq!(answers.len(), cases.len());

    let secs = |v: &serde_json::Value| v.as_i64().map(|s| s as u64 * 1000);
    let show = |ms: Option<u64>, zone: &str| {
        ms.map_or("none".to_owned(), |ms| {
            let utc = DateTime::from_timestamp_millis(ms as i64).unwrap();
            let tz: Tz = zone.parse().unwrap();
            format!(
                "{} ({})",
                utc.with_timezone(&tz).to_rfc3339(),
                utc.to_rfc3339()
            )
        })
    };
    let (mut mismatches, mut refused, mut croniter_differs) = (Vec::new(), 0, Vec::new());
    for (c, a) in cases.iter().zip(&answers) {
        if let Some(error) = a["error"].as_str() {
            // croniter gives up after 50 years without a match; anything else is a refusal.
            if error.starts_with("CroniterBadDateError")
                && c.ours.is_none_or(|f| f > c.t_ms + 50 * 365 * 86_400_000)
            {
                continue;
            }
            refused += 1;
            mismatches.push(format!("{} in {}: croniter: {error}", c.expr, c.zone));
            continue;
        }
        let (rule, raw) = (secs(&a["rule"]), secs(&a["raw"]));
        let at = DateTime::<Utc>::from_timestamp_millis(c.t_ms as i64).unwrap();
        if c.ours != rule {
            mismatches.push(format!(
                "{:?} in {} after {}: ours {}, croniter+zoneinfo {}",
                c.expr,
                c.zone,
                at.to_rfc3339(),
                show(c.ours, c.zone),
                show(rule, c.zone)
            ));
        } else if c.ours != raw {
            croniter_differs.push((c, a, raw));
        }
    }
    assert!(
        mismatches.is_empty(),
        "{} of {} cases disagree ({refused} refused by croniter), seed {seed}:\n{}",
        mismatches.len(),
        cases.len(),
        mismatches[..mismatches.len().min(30)].join("\n")
    );

    // croniter's own answers differ only where its rules differ from leasehold's documented
    // ones: (a) a day field allowing every day, which croniter counts as `*` only when the
    // other day field's text has a `*`; (b) the second occurrence of a repeated wall time,
    // which croniter fires too (in some zones, for some expressions); (c) a wall time skipped
    // by a change forward, which croniter drops for some expressions where leasehold fires it
    // at the change.
    let (mut day_rule, mut repeated, mut skipped) = (0, 0, 0);
    for (c, a, _) in &croniter_differs {
        if a["full_day_field"] == true && secs(&a["raw_ruled"]) == c.ours {
            day_rule += 1;
            continue;
        }
        let raw = &secs(&a["raw_ruled"]);
        let tz: Tz = c.zone.parse().unwrap();
        let offset = |ms: u64| {
            tz.offset_from_utc_datetime(
                &DateTime::from_timestamp_millis(ms as i64)
                    .unwrap()
                    .naive_utc(),
            )
            .fix()
            .local_minus_utc()
        };
        let ours = c.ours.expect("croniter + zoneinfo agreed on a firing");
        let second_occurrence = raw.is_some_and(|raw| {
            let wall = DateTime::from_timestamp_millis(raw as i64)
                .unwrap()
                .with_timezone(&tz)
                .naive_local();
            matches!(
                tz.from_local_datetime(&wall),
                chrono::LocalResult::Ambiguous(first, second)
                    if second.timestamp_millis() as u64 == raw
                        && first.timestamp_millis() as u64 <= ours
            )
        });
        let at_a_change_forward =
            offset(ours - 1000) < offset(ours) && raw.is_none_or(|r| r > ours);
        if second_occurrence && raw.is_some_and(|r| r < ours) {
            repeated += 1;
        } else if at_a_change_forward {
            skipped += 1;
        } else {
            panic!(
                "{:?} in {} after {}: ours {}, croniter {}: not a documented difference",
                c.expr,
                c.zone,
                DateTime::from_timestamp_millis(c.t_ms as i64)
                    .unwrap()
                    .to_rfc3339(),
                show(c.ours, c.zone),
                show(*raw, c.zone)
            );
        }
    }
    println!(
        "{} cases agree with croniter + zoneinfo under leasehold's rules; croniter's own answer \
         differs in {}: {day_rule} by its day-field rule, {repeated} firing a repeated wall \
         time twice, {skipped} dropping a skipped wall time",
        cases.len(),
        croniter_differs.len()
    );
}
