//! Cron expressions as crontab writes them, evaluated in an IANA time zone.
//!
//! The text is checked here, field by field, so that a mistake is named with its field and
//! that field's allowed values; names are turned into numbers in their own field only. The
//! checked expression is then handed to `croner`, which finds the wall-clock times it names.
//! Which instant a wall-clock time is (the daylight-saving rules) is decided here, with the
//! IANA database that `chrono-tz` compiles in: it is the same on every replica of one build,
//! and the host's zone is never read.

use std::fmt;

use chrono::{DateTime, NaiveDateTime, TimeZone, Utc};
use chrono_tz::Tz;

use crate::scheduling::schedule_error::{CronField, CronProblem, ScheduleError};

const SIX: [CronField; 6] = [
    CronField::Second,
    CronField::Minute,
    CronField::Hour,
    CronField::DayOfMonth,
    CronField::Month,
    CronField::DayOfWeek,
];

/// The macros, as six fields.
fn expand_macro(word: &str) -> Result<&'static str, CronProblem> {
    Ok(match word.to_ascii_lowercase().as_str() {
        "@yearly" | "@annually" => "0 0 0 1 1 *",
        "@monthly" => "0 0 0 1 * *",
        "@weekly" => "0 0 0 * * 0",
        "@daily" | "@midnight" => "0 0 0 * * *",
        "@hourly" => "0 0 * * * *",
        "@reboot" => return Err(CronProblem::Reboot),
        _ => return Err(CronProblem::UnknownMacro(word.to_owned())),
    })
}

/// One field checked, with names turned into numbers and `?` into `*`: croner's syntax.
fn normalize(field: CronField, text: &str) -> Result<String, CronProblem> {
    let bad = |detail: String| CronProblem::Field {
        field,
        text: text.to_owned(),
        detail,
    };
    let day_field = matches!(field, CronField::DayOfMonth | CronField::DayOfWeek);
    if text == "*" || (day_field && text == "?") {
        return Ok("*".to_owned());
    }
    let mut items = Vec::new();
    for item in text.split(',') {
        if item.is_empty() {
            return Err(bad("an empty list item".to_owned()));
        }
        items.push(normalize_item(field, item).map_err(bad)?);
    }
    // A day field that allows every day restricts nothing, however it is written (`1-31`,
    // `*/1`, `MON-SUN`, `0-7`): it counts as `*`, so it does not switch the other day field
    // into the either-or rule.
    if day_field {
        let (first, last) = match field {
            CronField::DayOfMonth => (1, 31),
            _ => (0, 6),
        };
        let every: u64 = (first..=last).map(|d| 1u64 << d).sum();
        if items
            .iter()
            .map(|i| plain_days(field, i))
            .fold(0, |a, b| a | b)
            & every
            == every
        {
            return Ok("*".to_owned());
        }
    }
    Ok(items.join(","))
}

/// The days a normalized item of a day field allows by number (a bit per day, Sunday 0 also
/// for 7); none for `L` and `#`, which depend on the month.
fn plain_days(field: CronField, item: &str) -> u64 {
    if item == "L" || item.contains('#') {
        return 0;
    }
    let (lo, hi) = field.range();
    let (range, step) = item.split_once('/').unwrap_or((item, "1"));
    let step: u16 = step.parse().unwrap_or(1).max(1);
    let (a, b) = match range.split_once('-') {
        _ if range == "*" => (lo, hi),
        Some((a, b)) => (a.parse().unwrap_or(hi), b.parse().unwrap_or(lo)),
        None => {
            let a = range.parse().unwrap_or(hi);
            (a, a)
        }
    };
    (a..=b)
        .step_by(usize::from(step))
        .map(|d| {
            1u64 << (if field == CronField::DayOfWeek {
                d % 7
            } else {
                d
            })
        })
        .fold(0, |acc, bit| acc | bit)
}

fn normalize_item(field: CronField, item: &str) -> Result<String, String> {
    if field == CronField::DayOfMonth && item.eq_ignore_ascii_case("L") {
        return Ok("L".to_owned());
    }
    if field == CronField::DayOfWeek {
        let upper = item.to_ascii_uppercase();
        let nth = match upper.split_once('#') {
            Some((day, "L")) => Some((day, "L".to_owned())),
            Some((day, n)) => match n.parse::<u8>() {
                Ok(n @ 1..=5) => Some((day, n.to_string())),
                _ => return Err(format!("{item:?}: # takes 1-5 or L after it")),
            },
            None => upper.strip_suffix('L').map(|day| (day, "L".to_owned())),
        };
        if let Some((day, nth)) = nth {
            if day.is_empty() {
                return Err(format!("{item:?} needs a weekday first (FRI#2, 5L)"));
            }
            return Ok(format!("{}#{nth}", value(field, day, false)?));
        }
    }
    let (base, step) = match item.split_once('/') {
        Some((base, step)) => match step.parse::<u16>() {
            Ok(s) if s >= 1 => (base, Some(s)),
            _ => return Err(format!("the step {step:?} must be a whole number from 1")),
        },
        None => (item, None),
    };
    if base == "*" {
        return match step {
            Some(step) => Ok(format!("*/{step}")),
            None => Err("* stands alone or before a step (*/15), not in a list".to_owned()),
        };
    }
    if base.is_empty() {
        return Err(format!(
            "{item:?} needs a start before the step (*/15, 5/15)"
        ));
    }
    let range = match base.split_once('-') {
        Some((a, b)) => {
            let (a, b) = (value(field, a, false)?, value(field, b, true)?);
            if a > b {
                let sunday = if field == CronField::DayOfWeek {
                    " (7 is Sunday too, so FRI-SUN is 5-7)"
                } else {
                    ""
                };
                return Err(format!(
                    "the range {base} runs backwards; write it low to high, as two ranges if \
                     it wraps{sunday}"
                ));
            }
            format!("{a}-{b}")
        }
        None => {
            let a = match value(field, base, false)? {
                7 if field == CronField::DayOfWeek => 0,
                a => a,
            };
            match step {
                // `a/step` runs from a to the field's end (the week's: Saturday), as in
                // the seconds-first form this crate took before, and in Quartz.
                Some(_) => {
                    let end = if field == CronField::DayOfWeek {
                        6
                    } else {
                        field.range().1
                    };
                    format!("{a}-{end}")
                }
                None => a.to_string(),
            }
        }
    };
    Ok(match step {
        Some(step) => format!("{range}/{step}"),
        None => range,
    })
}

/// A number or a name of `field`; Sunday at the end of a range is 7, so `FRI-SUN` works.
fn value(field: CronField, text: &str, range_end: bool) -> Result<u16, String> {
    let (lo, hi) = field.range();
    if let Some(i) = field
        .names()
        .iter()
        .position(|n| n.eq_ignore_ascii_case(text))
    {
        let i = i as u16;
        return Ok(match field {
            CronField::Month => i + 1,
            _ if range_end && i == 0 => 7,
            _ => i,
        });
    }
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(match field.names() {
            [] => format!("{text:?} is not a number"),
            _ => format!("{text:?} is not a number or a name"),
        });
    }
    match text.parse::<u16>() {
        Ok(v) if (lo..=hi).contains(&v) => Ok(v),
        _ => Err(format!("{text} is out of range")),
    }
}

/// A time zone by its IANA name.
pub(crate) fn zone(name: &str) -> Result<Tz, ScheduleError> {
    name.parse::<Tz>().map_err(|_| ScheduleError::UnknownZone {
        zone: name.to_owned(),
        suggestion: chrono_tz::TZ_VARIANTS
            .iter()
            .find(|tz| tz.name().eq_ignore_ascii_case(name))
            .map(|tz| tz.name().to_owned()),
    })
}

/// A parsed cron expression and the zone its wall-clock times are in.
#[derive(Clone)]
pub struct CronSchedule {
    /// The expression as written, with `CRON_TZ=ZONE ` before it unless the zone is UTC.
    canonical: String,
    zone: Tz,
    cron: croner::Cron,
}

impl CronSchedule {
    /// Parses `expr` (a `CRON_TZ=ZONE` prefix allowed) in `zone`, or in the prefix's zone, or
    /// in UTC.
    pub(crate) fn parse(expr: &str, zone: Option<&str>) -> Result<Self, ScheduleError> {
        let bad = |problem: CronProblem| ScheduleError::BadCron {
            expr: expr.to_owned(),
            problem,
        };
        let mut text = expr.trim();
        let mut prefix = None;
        if let Some(rest) = text.strip_prefix("CRON_TZ=") {
            let (name, fields) = rest.split_once(char::is_whitespace).unwrap_or((rest, ""));
            prefix = Some(name);
            text = fields.trim_start();
        }
        let zone = match (prefix, zone) {
            (Some(p), Some(z)) if p != z => {
                return Err(bad(CronProblem::TwoZones {
                    prefix: p.to_owned(),
                    given: z.to_owned(),
                }));
            }
            (Some(name), _) | (None, Some(name)) => self::zone(name)?,
            (None, None) => Tz::UTC,
        };
        let fields: Vec<&str> = if text.starts_with('@') {
            expand_macro(text).map_err(bad)?.split(' ').collect()
        } else {
            text.split_whitespace().collect()
        };
        let offset = match fields.len() {
            5 => 1,
            6 | 7 => 0,
            found => return Err(bad(CronProblem::FieldCount { found })),
        };
        let mut normalized = Vec::with_capacity(7);
        if offset == 1 {
            normalized.push("0".to_owned());
        }
        for (i, text) in fields.iter().enumerate() {
            let field = SIX.get(i + offset).copied().unwrap_or(CronField::Year);
            normalized.push(normalize(field, text).map_err(bad)?);
        }
        // What croner still refuses after the checks above is a gap in them: say what it said.
        let cron = croner::parser::CronParser::builder()
            .seconds(croner::parser::Seconds::Required)
            .build()
            .parse(&normalized.join(" "))
            .map_err(|e| bad(CronProblem::Other(e.to_string())))?;
        let canonical = if zone == Tz::UTC {
            text.to_owned()
        } else {
            format!("CRON_TZ={} {text}", zone.name())
        };
        Ok(Self {
            canonical,
            zone,
            cron,
        })
    }

    /// The expression, with a `CRON_TZ=ZONE` prefix unless its zone is UTC: parsing it again
    /// with [`Schedule::cron`](crate::Schedule::cron) gives the same schedule.
    pub fn expr(&self) -> &str {
        &self.canonical
    }

    /// The IANA name of the zone the expression's wall-clock times are in (`UTC` by default).
    pub fn time_zone(&self) -> &str {
        self.zone.name()
    }

    /// An instant (ms since the Unix epoch) as the wall-clock time of the schedule's zone, in
    /// RFC 3339 with the offset in force then: `2027-03-28T03:00:00+02:00`.
    pub fn local_time(&self, ms: u64) -> Option<String> {
        let at = DateTime::from_timestamp_millis(i64::try_from(ms).ok()?)?;
        Some(
            at.with_timezone(&self.zone)
                .to_rfc3339_opts(chrono::SecondsFormat::AutoSi, false),
        )
    }

    /// The first firing strictly after second `ts` (seconds since the epoch).
    pub(crate) fn next_after_secs(&self, ts: i64) -> Option<i64> {
        let mut wall = self.last_wall_at_or_before(ts)?;
        // Wall times after that one are instants after `ts` (see last_wall_at_or_before); the
        // loop only guards against a zone whose changes come closer together than that
        // reasoning assumes.
        loop {
            wall = self.cron.find_next_occurrence(&wall, false).ok()?;
            let at = self.instant(wall)?;
            if at > ts {
                return Some(at);
            }
        }
    }

    /// The latest firing at or before second `ts`.
    pub(crate) fn latest_at_or_before_secs(&self, ts: i64) -> Option<i64> {
        let mut wall = self.last_wall_at_or_before(ts)?;
        let mut inclusive = true;
        loop {
            wall = self.cron.find_previous_occurrence(&wall, inclusive).ok()?;
            inclusive = false;
            let at = self.instant(wall)?;
            if at <= ts {
                return Some(at);
            }
        }
    }

    /// The instant a wall-clock time fires at (the daylight-saving rules):
    /// - a wall time that occurs once: that instant;
    /// - one that occurs twice (the clock went back): the first;
    /// - one that does not occur (the clock jumped over it): the instant of that jump, the
    ///   first whose wall time is past it.
    ///
    /// So wall times map to instants in order, and the wall times a change skipped all map to
    /// one instant (one firing).
    fn instant(&self, wall: NaiveDateTime) -> Option<i64> {
        match self.zone.from_local_datetime(&wall) {
            chrono::LocalResult::Single(at) => Some(at.timestamp()),
            chrono::LocalResult::Ambiguous(first, _) => Some(first.timestamp()),
            chrono::LocalResult::None => self.end_of_gap(wall),
        }
    }

    /// The first instant whose wall time is past `wall`, a wall time that does not occur.
    fn end_of_gap(&self, wall: NaiveDateTime) -> Option<i64> {
        // Offsets stay within ±26 h, so the wall time is before `wall` at `lo` and past it at
        // `hi`; and since `wall` never occurs, any point where that flips is a jump over it.
        const SPAN: i64 = 26 * 3600;
        let as_utc = wall.and_utc().timestamp();
        let (mut lo, mut hi) = (as_utc - SPAN, as_utc + SPAN);
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            if self.wall(mid)? > wall {
                hi = mid;
            } else {
                lo = mid;
            }
        }
        Some(hi)
    }

    /// The latest wall time whose instant (as [`Self::instant`] maps it) is at or before `ts`.
    /// Every later wall time maps to an instant after `ts`.
    fn last_wall_at_or_before(&self, ts: i64) -> Option<NaiveDateTime> {
        let wall = self.wall(ts)?;
        match self.zone.from_local_datetime(&wall) {
            // `ts` is the second pass over a wall time (the clock went back at some instant in
            // (first, ts]): every wall time the first pass reached, up to the second before the
            // change, maps to its first occurrence, before `ts`.
            chrono::LocalResult::Ambiguous(first, _) if first.timestamp() < ts => {
                let after = self.offset(ts)?;
                let (mut lo, mut hi) = (first.timestamp(), ts);
                while hi - lo > 1 {
                    let mid = lo + (hi - lo) / 2;
                    if self.offset(mid)? == after {
                        hi = mid;
                    } else {
                        lo = mid;
                    }
                }
                self.wall(hi - 1)
            }
            _ => Some(wall),
        }
    }

    fn wall(&self, ts: i64) -> Option<NaiveDateTime> {
        Some(
            DateTime::from_timestamp(ts, 0)?
                .with_timezone(&self.zone)
                .naive_local(),
        )
    }

    fn offset(&self, ts: i64) -> Option<i64> {
        let utc: DateTime<Utc> = DateTime::from_timestamp(ts, 0)?;
        let local = utc.with_timezone(&self.zone).naive_local();
        Some(local.and_utc().timestamp() - ts)
    }
}

impl fmt::Display for CronSchedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.canonical)
    }
}

impl fmt::Debug for CronSchedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CronSchedule({:?})", self.canonical)
    }
}

#[cfg(test)]
mod tests {
    use crate::scheduling::schedule::Schedule;
    use crate::scheduling::schedule_error::ScheduleError;

    use super::*;

    /// Milliseconds since the epoch of an RFC 3339 time.
    fn at(text: &str) -> u64 {
        DateTime::parse_from_rfc3339(text)
            .unwrap()
            .timestamp_millis() as u64
    }

    /// The next `n` firings after `from`, as RFC 3339 UTC.
    fn firings(s: &Schedule, from: &str, n: usize) -> Vec<String> {
        let mut t = at(from);
        (0..n)
            .map(|_| {
                t = s.next_after(t).unwrap();
                DateTime::from_timestamp_millis(t as i64)
                    .unwrap()
                    .to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
            })
            .collect()
    }

    fn problem(expr: &str) -> String {
        match Schedule::cron(expr) {
            Err(ScheduleError::BadCron { problem, .. }) => problem.to_string(),
            other => panic!("{expr:?}: {other:?}"),
        }
    }

    #[test]
    fn five_fields_six_fields_and_macros_name_the_same_times() {
        let from = "2027-01-01T12:34:56Z";
        let five = firings(&Schedule::cron("0 3 * * *").unwrap(), from, 3);
        assert_eq!(five[0], "2027-01-02T03:00:00Z");
        assert_eq!(
            five,
            firings(&Schedule::cron("0 0 3 * * *").unwrap(), from, 3)
        );
        let daily = firings(&Schedule::cron("@daily").unwrap(), from, 3);
        assert_eq!(
            daily,
            firings(&Schedule::cron("0 0 * * *").unwrap(), from, 3)
        );
        assert_eq!(
            daily,
            firings(&Schedule::cron("@MIDNIGHT").unwrap(), from, 3)
        );
        assert_eq!(
            firings(&Schedule::cron("@hourly").unwrap(), from, 1),
            ["2027-01-01T13:00:00Z"]
        );
        assert_eq!(
            firings(&Schedule::cron("@weekly").unwrap(), from, 1),
            ["2027-01-03T00:00:00Z"] // a Sunday
        );
        assert_eq!(
            firings(&Schedule::cron("@monthly").unwrap(), from, 1),
            ["2027-02-01T00:00:00Z"]
        );
        assert_eq!(
            firings(&Schedule::cron("@yearly").unwrap(), from, 1),
            firings(&Schedule::cron("@annually").unwrap(), from, 1)
        );
        // Seven fields: the year last.
        assert_eq!(
            firings(&Schedule::cron("0 0 0 1 1 * 2029").unwrap(), from, 1),
            ["2029-01-01T00:00:00Z"]
        );
        assert!(matches!(
            Schedule::cron("0 0 0 1 1 * 2001"),
            Err(ScheduleError::NeverFires(_))
        ));
    }

    #[test]
    fn names_steps_ranges_and_lists() {
        let from = "2027-01-01T00:00:00Z"; // a Friday
        let same = |a: &str, b: &str| {
            assert_eq!(
                firings(&Schedule::cron(a).unwrap(), from, 12),
                firings(&Schedule::cron(b).unwrap(), from, 12),
                "{a} vs {b}"
            );
        };
        same("0 9 * JAN,jul mon-FRI", "0 9 * 1,7 1-5");
        same("0 9 * * FRI-SUN", "0 9 * * 5-7");
        same("0 9 * * 7", "0 9 * * 0");
        same("0 9 * * ?", "0 9 * * *");
        same("5/15 * * * *", "5-59/15 * * * *");
        same("*/20 */6 * * *", "0,20,40 0,6,12,18 * * *");
        same("0 0 * * 1/2", "0 0 * * 1,3,5");
        same("0 0 * * 7/3", "0 0 * * 0,3,6");
        // The month's last day, second Tuesday, last Friday.
        assert_eq!(
            firings(&Schedule::cron("0 0 L * *").unwrap(), from, 2),
            ["2027-01-31T00:00:00Z", "2027-02-28T00:00:00Z"]
        );
        assert_eq!(
            firings(&Schedule::cron("0 0 * * TUE#2").unwrap(), from, 1),
            ["2027-01-12T00:00:00Z"]
        );
        same("0 0 * * FRIL", "0 0 * * 5#L");
        assert_eq!(
            firings(&Schedule::cron("0 0 * * 5L").unwrap(), from, 1),
            ["2027-01-29T00:00:00Z"]
        );
    }

    #[test]
    fn day_of_month_and_day_of_week_combine_with_or_when_both_are_restricted() {
        let from = "2027-02-28T12:00:00Z"; // a Sunday
        assert_eq!(
            firings(&Schedule::cron("0 0 1,15 * MON").unwrap(), from, 4),
            [
                "2027-03-01T00:00:00Z", // 1st (a Monday as well)
                "2027-03-08T00:00:00Z", // Monday
                "2027-03-15T00:00:00Z", // 15th (and Monday)
                "2027-03-22T00:00:00Z", // Monday
            ]
        );
        assert_eq!(
            firings(&Schedule::cron("0 0 13 * FRI").unwrap(), from, 2),
            ["2027-03-05T00:00:00Z", "2027-03-12T00:00:00Z"]
        );
        // One of them `*`: only the other counts.
        assert_eq!(
            firings(&Schedule::cron("0 0 13 * *").unwrap(), from, 1),
            ["2027-03-13T00:00:00Z"]
        );
        assert_eq!(
            firings(&Schedule::cron("0 0 * * FRI").unwrap(), from, 1),
            ["2027-03-05T00:00:00Z"]
        );
        // A step is a restriction: `*/10` days or Fridays.
        assert_eq!(
            firings(&Schedule::cron("0 0 */10 * FRI").unwrap(), from, 3),
            [
                "2027-03-01T00:00:00Z",
                "2027-03-05T00:00:00Z",
                "2027-03-11T00:00:00Z"
            ]
        );
    }

    #[test]
    fn a_day_field_that_allows_every_day_counts_as_unrestricted() {
        let from = "2027-02-28T12:00:00Z";
        let mondays = firings(&Schedule::cron("0 0 * * MON").unwrap(), from, 5);
        for every_day in ["1-31", "*/1", "?", "1-15,16-31"] {
            let expr = format!("0 0 {every_day} * MON");
            assert_eq!(
                firings(&Schedule::cron(&expr).unwrap(), from, 5),
                mondays,
                "{expr}"
            );
        }
        let tenths = firings(&Schedule::cron("0 0 */10 * *").unwrap(), from, 5);
        for every_day in ["MON-SUN", "0-6", "0-7", "*/1", "SUN-SAT", "1-7"] {
            let expr = format!("0 0 */10 * {every_day}");
            assert_eq!(
                firings(&Schedule::cron(&expr).unwrap(), from, 5),
                tenths,
                "{expr}"
            );
        }
        // Six weekdays restrict: the either-or rule applies.
        assert_eq!(
            firings(&Schedule::cron("0 0 */10 * MON-SAT").unwrap(), from, 2),
            ["2027-03-01T00:00:00Z", "2027-03-02T00:00:00Z"]
        );
    }

    #[test]
    fn one_value_ranges_are_that_value() {
        let from = "2027-01-01T00:00:00Z";
        let same = |a: &str, b: &str| {
            assert_eq!(
                firings(&Schedule::cron(a).unwrap(), from, 5),
                firings(&Schedule::cron(b).unwrap(), from, 5),
                "{a} vs {b}"
            );
        };
        same("26-26 28-42 13 * * *", "26 28-42 13 * * *");
        same("0 0 * 2-2/6 *", "0 0 * 2 *");
        same("0 0 * * 7-7", "0 0 * * SUN");
    }

    #[test]
    fn no_input_panics() {
        let mut rng = fastrand::Rng::with_seed(27);
        let alphabet: Vec<char> = "0123456789*/-,? L#W@MONJAFRISUTZC_=/65535"
            .chars()
            .collect();
        for _ in 0..20_000 {
            let len = rng.usize(0..40);
            let text: String = (0..len)
                .map(|_| alphabet[rng.usize(0..alphabet.len())])
                .collect();
            if let Ok(s) = Schedule::cron(&text) {
                let _ = s.next_after(rng.u64(0..4_000_000_000_000));
                let _ = s.latest_at_or_before(rng.u64(0..4_000_000_000_000));
            }
        }
        // Field-shaped tokens with numbers anywhere in u16 and beyond.
        let number = |rng: &mut fastrand::Rng| match rng.u8(0..4) {
            0 => rng.u32(0..70_000).to_string(),
            _ => rng.u32(0..62).to_string(),
        };
        for _ in 0..20_000 {
            let fields: Vec<String> = (0..rng.usize(5..=7))
                .map(|_| match rng.u8(0..8) {
                    0 => "*".to_owned(),
                    1 => format!("*/{}", number(&mut rng)),
                    2 => format!("{}-{}", number(&mut rng), number(&mut rng)),
                    3 => format!("{}/{}", number(&mut rng), number(&mut rng)),
                    4 => format!(
                        "{}-{}/{}",
                        number(&mut rng),
                        number(&mut rng),
                        number(&mut rng)
                    ),
                    5 => format!("{}#{}", number(&mut rng), number(&mut rng)),
                    6 => format!("{}L", number(&mut rng)),
                    _ => format!("{},{}", number(&mut rng), number(&mut rng)),
                })
                .collect();
            let text = fields.join(" ");
            if let Ok(s) = Schedule::cron(&text) {
                let t = rng.u64(0..4_000_000_000_000);
                assert!(s.next_after(t).is_none_or(|n| n > t), "{text}");
                assert!(s.latest_at_or_before(t).is_none_or(|l| l <= t), "{text}");
            }
        }
        for edge in [
            "*/65535 * * * *",
            "0 0 * * 7#5",
            "59 23 31 12 * 4999",
            "0 0 L 2 *",
            "0 0 1 1 * 1970",
        ] {
            let _ = Schedule::cron(edge).map(|s| s.next_after(u64::MAX));
        }
    }

    #[test]
    fn errors_name_the_field_and_what_it_takes() {
        let count = problem("0 3 * *");
        assert!(
            count.contains("minute hour day-of-month month day-of-week")
                && count.contains("second minute hour day-of-month month day-of-week")
                && count.ends_with("found 4"),
            "{count}"
        );
        assert!(problem("1 2 3 4 5 6 7 8").ends_with("found 8"));
        assert!(problem("").ends_with("found 0"));
        assert_eq!(
            problem("0 25 * * *"),
            "hour field \"25\": 25 is out of range (allowed: 0-23)"
        );
        assert_eq!(
            problem("60 * * * * *"),
            "second field \"60\": 60 is out of range (allowed: 0-59)"
        );
        assert!(problem("0 0 0 * *").starts_with("day-of-month field \"0\": 0 is out of range"));
        assert!(problem("0 0 * 13 *").contains("(allowed: 1-12 or JAN-DEC)"));
        // A weekday name in the month field is not a month.
        assert!(
            problem("0 0 * MON *")
                .starts_with("month field \"MON\": \"MON\" is not a number or a name")
        );
        assert!(problem("0 0 * * 8").starts_with("day-of-week field \"8\""));
        assert!(problem("0 0 * * FRI-MON").contains("runs backwards"));
        assert!(problem("*/0 * * * *").contains("step \"0\""));
        assert!(problem("1,,2 * * * *").contains("empty list item"));
        assert!(problem("every day").contains("found 2"));
        assert!(problem("0 0 * * MON#6").contains("# takes 1-5 or L"));
        let reboot = problem("@reboot");
        assert!(reboot.starts_with("@reboot names no time"), "{reboot}");
        assert!(problem("@daly").contains("@yearly, @annually, @monthly, @weekly, @daily"));
        // The whole message, as the CLI prints it.
        assert_eq!(
            Schedule::cron("0 3 * * * * * *").unwrap_err().to_string(),
            format!(
                "invalid cron expression \"0 3 * * * * * *\": {}",
                problem("0 3 * * * * * *")
            )
        );
    }

    #[test]
    fn zones_by_iana_name_from_a_prefix_or_beside_the_expression() {
        let berlin = Schedule::cron_in("0 3 * * *", "Europe/Berlin").unwrap();
        let prefixed = Schedule::cron("CRON_TZ=Europe/Berlin 0 3 * * *").unwrap();
        let from = "2027-01-01T00:00:00Z";
        assert_eq!(firings(&berlin, from, 1), ["2027-01-01T02:00:00Z"]);
        assert_eq!(firings(&berlin, from, 5), firings(&prefixed, from, 5));
        let Schedule::Cron(c) = &berlin else { panic!() };
        assert_eq!(c.expr(), "CRON_TZ=Europe/Berlin 0 3 * * *");
        assert_eq!(c.time_zone(), "Europe/Berlin");
        assert_eq!(
            c.local_time(at("2027-07-01T01:00:00Z")).unwrap(),
            "2027-07-01T03:00:00+02:00"
        );
        // The canonical form parses to the same schedule.
        let again = Schedule::cron(c.expr()).unwrap();
        assert_eq!(firings(&again, from, 5), firings(&berlin, from, 5));
        // UTC is the default and is not written out.
        let utc = Schedule::cron_in("0 3 * * *", "UTC").unwrap();
        let Schedule::Cron(u) = &utc else { panic!() };
        assert_eq!((u.expr(), u.time_zone()), ("0 3 * * *", "UTC"));
        assert_eq!(
            Schedule::cron("CRON_TZ=Asia/Kolkata 30 9 * * *")
                .unwrap()
                .next_after(at("2027-01-01T00:00:00Z")),
            Some(at("2027-01-01T04:00:00Z"))
        );
        // The same zone twice is fine, two zones are not.
        assert!(Schedule::cron_in("CRON_TZ=Europe/Berlin 0 3 * * *", "Europe/Berlin").is_ok());
        assert!(
            problem_in("CRON_TZ=Europe/Paris 0 3 * * *", "Europe/Berlin")
                .contains("give one of them")
        );
        assert_eq!(
            Schedule::cron_in("0 3 * * *", "europe/berlin")
                .unwrap_err()
                .to_string(),
            "unknown time zone \"europe/berlin\" (did you mean Europe/Berlin?): give an IANA \
             name such as Europe/Berlin, America/New_York or UTC"
        );
        assert!(matches!(
            Schedule::cron("CRON_TZ=Mars/Olympus 0 3 * * *"),
            Err(ScheduleError::UnknownZone {
                suggestion: None,
                ..
            })
        ));
    }

    fn problem_in(expr: &str, zone: &str) -> String {
        match Schedule::cron_in(expr, zone) {
            Err(ScheduleError::BadCron { problem, .. }) => problem.to_string(),
            other => panic!("{expr:?}: {other:?}"),
        }
    }

    #[test]
    fn a_wall_time_skipped_by_a_change_forward_fires_once_at_the_change() {
        // Berlin, 2027-03-28: 02:00 CET becomes 03:00 CEST at 01:00 UTC.
        let berlin = |e: &str| Schedule::cron_in(e, "Europe/Berlin").unwrap();
        assert_eq!(
            firings(&berlin("30 2 * * *"), "2027-03-27T12:00:00Z", 3),
            [
                "2027-03-28T01:00:00Z", // 03:00 CEST, the change
                "2027-03-29T00:30:00Z",
                "2027-03-30T00:30:00Z",
            ]
        );
        // 02:00, 02:15, 02:30, 02:45 are skipped and fire once, together with 03:00.
        assert_eq!(
            firings(&berlin("*/15 * * * *"), "2027-03-28T00:40:00Z", 4),
            [
                "2027-03-28T00:45:00Z",
                "2027-03-28T01:00:00Z",
                "2027-03-28T01:15:00Z",
                "2027-03-28T01:30:00Z"
            ]
        );
        assert_eq!(
            firings(&berlin("5 * * * *"), "2027-03-27T23:30:00Z", 3),
            [
                "2027-03-28T00:05:00Z", // 01:05 CET
                "2027-03-28T01:00:00Z", // 02:05 skipped: at the change
                "2027-03-28T01:05:00Z", // 03:05 CEST
            ]
        );
        // New York, 2027-03-14: 02:00 EST becomes 03:00 EDT at 07:00 UTC.
        let ny = Schedule::cron_in("30 2 * * *", "America/New_York").unwrap();
        assert_eq!(
            firings(&ny, "2027-03-13T12:00:00Z", 2),
            ["2027-03-14T07:00:00Z", "2027-03-15T06:30:00Z"]
        );
        // Lord Howe, 2027-10-03: 02:00 +10:30 becomes 02:30 +11 (a 30-minute change).
        let howe = |e: &str| Schedule::cron_in(e, "Australia/Lord_Howe").unwrap();
        assert_eq!(
            firings(&howe("15 2 * * *"), "2027-10-02T12:00:00Z", 2),
            ["2027-10-02T15:30:00Z", "2027-10-03T15:15:00Z"]
        );
        assert_eq!(
            firings(&howe("30 2 * * *"), "2027-10-02T12:00:00Z", 2),
            ["2027-10-02T15:30:00Z", "2027-10-03T15:30:00Z"]
        );
    }

    #[test]
    fn a_wall_time_repeated_by_a_change_back_fires_once_at_its_first_occurrence() {
        // Berlin, 2027-10-31: 03:00 CEST becomes 02:00 CET at 01:00 UTC.
        let berlin = |e: &str| Schedule::cron_in(e, "Europe/Berlin").unwrap();
        assert_eq!(
            firings(&berlin("30 2 * * *"), "2027-10-30T12:00:00Z", 2),
            ["2027-10-31T00:30:00Z", "2027-11-01T01:30:00Z"]
        );
        // The repeated hour fires once, the first time round.
        assert_eq!(
            firings(&berlin("*/15 * * * *"), "2027-10-31T00:40:00Z", 3),
            [
                "2027-10-31T00:45:00Z", // 02:45 CEST
                "2027-10-31T02:00:00Z", // 03:00 CET; 02:00-02:45 CET already fired
                "2027-10-31T02:15:00Z",
            ]
        );
        assert_eq!(
            firings(&berlin("0 * * * *"), "2027-10-30T23:30:00Z", 3),
            [
                "2027-10-31T00:00:00Z", // 02:00 CEST
                "2027-10-31T02:00:00Z", // 03:00 CET
                "2027-10-31T03:00:00Z",
            ]
        );
        // New York, 2027-11-07: 02:00 EDT becomes 01:00 EST at 06:00 UTC.
        let ny = Schedule::cron_in("30 1 * * *", "America/New_York").unwrap();
        assert_eq!(
            firings(&ny, "2027-11-06T12:00:00Z", 2),
            ["2027-11-07T05:30:00Z", "2027-11-08T06:30:00Z"]
        );
        // Lord Howe, 2027-04-04: 02:00 +11 becomes 01:30 +10:30.
        let howe = Schedule::cron_in("45 1 * * *", "Australia/Lord_Howe").unwrap();
        assert_eq!(
            firings(&howe, "2027-04-03T12:00:00Z", 2),
            ["2027-04-03T14:45:00Z", "2027-04-04T15:15:00Z"]
        );
    }

    #[test]
    fn next_and_latest_agree_with_the_sequence_of_firings_across_changes() {
        for (zone, expr, from) in [
            ("Europe/Berlin", "*/15 * * * *", "2027-03-27T22:00:00Z"),
            ("Europe/Berlin", "*/15 * * * *", "2027-10-30T22:00:00Z"),
            ("Europe/Berlin", "30 2 * * *", "2027-10-29T22:00:00Z"),
            ("America/New_York", "*/7 1-3 * * *", "2027-11-06T22:00:00Z"),
            (
                "Australia/Lord_Howe",
                "*/10 1,2 * * *",
                "2027-04-03T10:00:00Z",
            ),
            (
                "Australia/Lord_Howe",
                "*/10 1,2 * * *",
                "2027-10-02T10:00:00Z",
            ),
            ("Asia/Kolkata", "*/25 * * * *", "2027-10-02T10:00:00Z"),
        ] {
            let s = Schedule::cron_in(expr, zone).unwrap();
            let start = at(from);
            let mut slots = vec![s.latest_at_or_before(start).unwrap()];
            while *slots.last().unwrap() < start + 3 * 86_400_000 {
                let next = s.next_after(*slots.last().unwrap()).unwrap();
                assert!(next > *slots.last().unwrap());
                slots.push(next);
            }
            // Every 97 s through the window (and each slot and its neighbours).
            let probes = (start..start + 3 * 86_400_000)
                .step_by(97_000)
                .chain(slots.iter().flat_map(|&t| [t - 1, t, t + 1]));
            for t in probes.filter(|&t| t >= slots[0] && t < *slots.last().unwrap()) {
                let i = slots.partition_point(|&f| f <= t);
                assert_eq!(
                    s.latest_at_or_before(t),
                    Some(slots[i - 1]),
                    "{zone} {expr} {t}"
                );
                assert_eq!(s.next_after(t), Some(slots[i]), "{zone} {expr} {t}");
            }
        }
    }

    #[test]
    fn interval_schedules_ignore_daylight_saving() {
        let hourly = Schedule::every(std::time::Duration::from_secs(3600)).unwrap();
        let mut t = at("2027-10-30T22:30:00Z");
        for _ in 0..6 {
            let next = hourly.next_after(t).unwrap();
            assert_eq!(next % 3_600_000, 0);
            assert!(next - t <= 3_600_000);
            t = next;
        }
    }
}
