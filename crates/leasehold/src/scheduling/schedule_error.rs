//! What can be wrong with a schedule, and with a cron expression field by field.

#[cfg(feature = "cron")]
use std::fmt;

/// A schedule that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ScheduleError {
    /// The interval was below 1 ms.
    #[error("interval must be at least 1ms")]
    ZeroInterval,
    /// The cron expression did not parse.
    #[cfg(feature = "cron")]
    #[error("invalid cron expression {expr:?}: {problem}")]
    BadCron {
        /// The expression.
        expr: String,
        /// What is wrong with it.
        problem: CronProblem,
    },
    /// The cron expression has no future occurrence.
    #[cfg(feature = "cron")]
    #[error("cron expression {0:?} never fires again")]
    NeverFires(String),
    /// The time zone is not in the IANA database.
    #[cfg(feature = "cron")]
    #[error(
        "unknown time zone {zone:?}{}: give an IANA name such as Europe/Berlin, \
         America/New_York or UTC",
        suggestion.as_ref().map(|s| format!(" (did you mean {s}?)")).unwrap_or_default()
    )]
    UnknownZone {
        /// The name given.
        zone: String,
        /// A zone whose name differs only in case.
        suggestion: Option<String>,
    },
}

#[cfg(feature = "cron")]
/// What is wrong with a cron expression.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum CronProblem {
    /// Not five or six (or seven) fields.
    FieldCount {
        /// How many fields there were.
        found: usize,
    },
    /// A field that does not parse or names a value outside its range.
    Field {
        /// Which field.
        field: CronField,
        /// The field's text.
        text: String,
        /// What is wrong with it.
        detail: String,
    },
    /// `@reboot`, which names no time.
    Reboot,
    /// An `@` word that is not one of the macros.
    UnknownMacro(String),
    /// Refused by the evaluator after the checks here passed (its own words).
    Other(String),
    /// A `CRON_TZ=` prefix naming another zone than the one given beside the expression.
    TwoZones {
        /// The prefix's zone.
        prefix: String,
        /// The zone given beside the expression.
        given: String,
    },
}

#[cfg(feature = "cron")]
impl fmt::Display for CronProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::FieldCount { found } => write!(
                f,
                "expected 5 fields (minute hour day-of-month month day-of-week) or 6 with \
                 seconds first (second minute hour day-of-month month day-of-week), found {found}"
            ),
            Self::Field {
                field,
                text,
                detail,
            } => write!(
                f,
                "{} field {text:?}: {detail} (allowed: {})",
                field.name(),
                field.allowed()
            ),
            Self::Reboot => f.write_str(
                "@reboot names no time that replicas share (it would fire whenever any one \
                 of them starts), so it has no slot to run once; run the command at start-up \
                 instead, under a lease if only one replica may run it",
            ),
            Self::UnknownMacro(word) => write!(
                f,
                "unknown macro {word:?}: the macros are @yearly, @annually, @monthly, @weekly, \
                 @daily, @midnight and @hourly"
            ),
            Self::Other(said) => f.write_str(said),
            Self::TwoZones { prefix, given } => write!(
                f,
                "the expression says CRON_TZ={prefix} but the time zone given is {given}; \
                 give one of them"
            ),
        }
    }
}

/// A field of a cron expression.
#[cfg(feature = "cron")]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum CronField {
    /// The first of six fields.
    Second,
    /// Minute of the hour.
    Minute,
    /// Hour of the day.
    Hour,
    /// Day of the month.
    DayOfMonth,
    /// Month of the year.
    Month,
    /// Day of the week.
    DayOfWeek,
    /// An optional seventh field after day-of-week.
    Year,
}

#[cfg(feature = "cron")]
impl CronField {
    /// The field's name as the error messages and the docs write it.
    pub fn name(self) -> &'static str {
        match self {
            Self::Second => "second",
            Self::Minute => "minute",
            Self::Hour => "hour",
            Self::DayOfMonth => "day-of-month",
            Self::Month => "month",
            Self::DayOfWeek => "day-of-week",
            Self::Year => "year",
        }
    }

    /// The values the field takes.
    pub fn allowed(self) -> &'static str {
        match self {
            Self::Second | Self::Minute => "0-59",
            Self::Hour => "0-23",
            Self::DayOfMonth => "1-31, or L for the month's last day",
            Self::Month => "1-12 or JAN-DEC",
            Self::DayOfWeek => {
                "0-7 or SUN-SAT (0 and 7 are Sunday); D#N for the month's N-th (1-5) weekday D, \
                 DL for its last"
            }
            Self::Year => "1970-4999",
        }
    }

    pub(crate) fn range(self) -> (u16, u16) {
        match self {
            Self::Second | Self::Minute => (0, 59),
            Self::Hour => (0, 23),
            Self::DayOfMonth => (1, 31),
            Self::Month => (1, 12),
            Self::DayOfWeek => (0, 7),
            Self::Year => (1970, 4999),
        }
    }

    pub(crate) fn names(self) -> &'static [&'static str] {
        match self {
            Self::Month => &[
                "JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC",
            ],
            Self::DayOfWeek => &["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"],
            _ => &[],
        }
    }
}
