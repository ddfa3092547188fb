//! Reading a crontab file: the lines Vixie cron and supercronic take, each job line a task.
//!
//! A file is read top to bottom:
//! - blank lines and lines whose first non-blank character is `#` are ignored, except a
//!   `# leasehold: key=value …` comment, which sets the options of the job line right below it;
//! - `NAME=value` (spaces around `=` allowed, the value in matching `'` or `"` quotes or bare)
//!   sets an environment variable for the job lines after it, as cron does. `SHELL=` picks the
//!   shell that runs them (default `/bin/sh`); `CRON_TZ=` (else `TZ=`) the time zone their
//!   schedules are in (default UTC; the host's zone is never read);
//! - every other line is a job: a schedule, then the command (the rest of the line, given to
//!   `SHELL -c` as written: `%` is not special, as in supercronic).
//!
//! # Schedules
//! - five fields: `minute hour day-of-month month day-of-week`;
//! - seven fields: `second minute hour day-of-month month day-of-week year`, as supercronic
//!   (its cronexpr library) reads them;
//! - six fields are read two ways: supercronic takes the sixth as the **year**
//!   (`minute … day-of-week year`), `leasehold run --cron` (Quartz, Spring) takes a **second**
//!   first (`second minute … day-of-week`). The sixth field tells them apart where it can: a
//!   year (`2027`, `2027-2030`) can never be a day of the week (0-7, `MON`, `FRI#2`), and the
//!   other way round. A sixth field that is valid both ways (`*`, `*/2`) is refused rather than
//!   guessed: `*/5 * * * * *` runs every five minutes under supercronic and every five seconds
//!   under `leasehold run`. Write seven fields (`*/5 * * * * * *`) for seconds, or five;
//! - `@yearly`, `@annually`, `@monthly`, `@weekly`, `@daily`, `@midnight`, `@hourly`
//!   (`@reboot` is refused: no time that replicas share).
//!
//! Fields take what `leasehold run --cron` takes (names, ranges, steps, `L`, `D#N`, `DL`);
//! `W` is not supported and is refused.
//!
//! # Task names
//! A job's task name is the `name=` of its `# leasehold:` comment, else derived from the line:
//! the first word of the command (its last path part, other characters than
//! `A-Z a-z 0-9 . _ -` made `-`, at most 24 of them) and the first 8 hex digits of the SHA-256 of
//! the schedule (its fields joined by one space) and the command, joined by `-`:
//! `backup.sh-3f9a1c2e`. Editing a line's schedule or command makes another task; its
//! environment, shell, zone and options do not.

use std::fmt;
use std::time::Duration;

use leasehold::{
    CatchUp, LeaseName, NameError, RunPolicy, Schedule, ScheduleError, StoreDownPolicy,
};
use leasehold::{CronField, CronProblem};
use sha2::{Digest, Sha256};

use crate::policies;

/// The shell commands run through unless the file sets `SHELL=`.
pub const DEFAULT_SHELL: &str = "/bin/sh";

/// The keys of a `# leasehold:` comment.
pub const OPTION_KEYS: &str = "name, catch-up, catch-up-window, on-store-down, timeout, retries, retry-backoff, jitter, \
     on-interrupt, overlap";

/// At most this many missed slots run in one catch-up with `catch-up=all` (as `leasehold run`).
pub const CATCH_UP_MAX: usize = 100;

/// How a job's schedule was read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reading {
    /// `@daily` and the like.
    Macro,
    /// minute hour day-of-month month day-of-week.
    Five,
    /// second minute hour day-of-month month day-of-week (the sixth field was a day of week).
    SixSecondsFirst,
    /// minute hour day-of-month month day-of-week year (the sixth field was a year).
    SixYearLast,
    /// second minute hour day-of-month month day-of-week year.
    Seven,
}

impl Reading {
    /// How the fields were read, for `--test`.
    pub fn describe(self) -> &'static str {
        match self {
            Self::Macro => "macro",
            Self::Five => "minute hour day-of-month month day-of-week",
            Self::SixSecondsFirst => "second minute hour day-of-month month day-of-week",
            Self::SixYearLast => "minute hour day-of-month month day-of-week year",
            Self::Seven => "second minute hour day-of-month month day-of-week year",
        }
    }

    /// The fields in order, each as the core's errors name it.
    fn fields(self) -> &'static [CronField] {
        use CronField::*;
        match self {
            Self::Macro => &[],
            Self::Five => &[Minute, Hour, DayOfMonth, Month, DayOfWeek],
            Self::SixSecondsFirst => &[Second, Minute, Hour, DayOfMonth, Month, DayOfWeek],
            Self::SixYearLast => &[Minute, Hour, DayOfMonth, Month, DayOfWeek, Year],
            Self::Seven => &[Second, Minute, Hour, DayOfMonth, Month, DayOfWeek, Year],
        }
    }
}

/// The catch-up option of a line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CatchUpKind {
    Skip,
    Latest,
    All,
}

/// Options for the whole file (from flags), which a line's comment overrides.
#[derive(Debug, Clone, Default)]
pub struct Defaults {
    pub catch_up: Option<CatchUpKind>,
    pub catch_up_window: Option<Duration>,
    pub on_store_down: Option<StoreDownPolicy>,
}

/// One job line, ready to be a task.
#[derive(Debug, Clone)]
pub struct Job {
    pub name: LeaseName,
    /// Whether the name was derived (no `name=`).
    pub derived_name: bool,
    pub schedule: Schedule,
    /// The schedule's fields as written, joined by one space.
    pub schedule_text: String,
    pub reading: Reading,
    /// The IANA zone of the schedule.
    pub zone: String,
    pub command: String,
    pub shell: String,
    /// The file's variables in force at this line, in file order.
    pub env: Vec<(String, String)>,
    pub catch_up: Option<CatchUp>,
    pub on_store_down: Option<StoreDownPolicy>,
    /// Its `timeout=`, `retries=`, `retry-backoff=` and `jitter=`.
    pub run_policy: RunPolicy,
    /// Where the line is.
    pub file: String,
    pub line: usize,
}

impl Job {
    /// Whether `other` would run the same way (for a reload: an unchanged line keeps running).
    pub fn same_as(&self, other: &Job) -> bool {
        self.name == other.name
            && self.schedule_text == other.schedule_text
            && self.reading == other.reading
            && self.zone == other.zone
            && self.command == other.command
            && self.shell == other.shell
            && self.env == other.env
            && self.catch_up == other.catch_up
            && self.on_store_down == other.on_store_down
            && self.run_policy == other.run_policy
    }
}

/// A line that cannot be used: where, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseError {
    pub file: String,
    /// 1-based.
    pub line: usize,
    /// 1-based, in characters.
    pub column: usize,
    /// The line as written.
    pub text: String,
    pub message: String,
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}:{}:{}: {}",
            self.file, self.line, self.column, self.message
        )
    }
}

impl std::error::Error for ParseError {}

impl ParseError {
    /// The line as written (control characters made visible) and a caret under the column,
    /// the caret line keeping the line's tabs so it lines up.
    pub fn excerpt(&self) -> [String; 2] {
        let before: String = self.text.chars().take(self.column - 1).collect();
        let pad: String = before
            .chars()
            .map(|c| if c == '\t' { '\t' } else { ' ' })
            .collect();
        // Control characters other than tabs are shown escaped, so the caret moves with them.
        let shown = |s: &str| leasehold::text::visible(&s.replace('\t', " ")).into_owned();
        let pad_width = shown(&before).chars().count() - before.chars().count();
        let line = self
            .text
            .split('\t')
            .map(|part| leasehold::text::visible(part).into_owned())
            .collect::<Vec<_>>()
            .join("\t");
        [line, format!("{pad}{}^", " ".repeat(pad_width))]
    }
}

/// A word of a line and the byte offset it starts at.
#[derive(Debug, Clone, Copy)]
struct Word<'a> {
    at: usize,
    text: &'a str,
}

fn words(line: &str) -> Vec<Word<'_>> {
    let mut out = Vec::new();
    let mut start = None;
    for (i, c) in line.char_indices() {
        match (c.is_whitespace(), start) {
            (true, Some(s)) => {
                out.push(Word {
                    at: s,
                    text: &line[s..i],
                });
                start = None;
            }
            (false, None) => start = Some(i),
            _ => {}
        }
    }
    if let Some(s) = start {
        out.push(Word {
            at: s,
            text: &line[s..],
        });
    }
    out
}

/// The state of the file at a line: the environment and what it decides.
struct Scope {
    env: Vec<(String, String)>,
}

impl Scope {
    fn get(&self, name: &str) -> Option<&str> {
        self.env
            .iter()
            .rev()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    fn set(&mut self, name: &str, value: String) {
        self.env.retain(|(k, _)| k != name);
        self.env.push((name.to_owned(), value));
    }
}

/// Parses the text of crontab file `file` (the name is only for messages).
pub fn parse(file: &str, text: &str, defaults: &Defaults) -> Result<Vec<Job>, ParseError> {
    let mut scope = Scope { env: Vec::new() };
    let mut jobs: Vec<Job> = Vec::new();
    // The options comment waiting for its job line: its line number, text and options.
    let mut pending: Option<(usize, String, Options<'_>)> = None;
    let lines: Vec<&str> = text.lines().collect();
    for (index, raw) in lines.iter().enumerate() {
        let number = index + 1;
        let line = raw.strip_suffix('\r').unwrap_or(raw);
        let err = |at: usize, message: String| ParseError {
            file: file.to_owned(),
            line: number,
            column: line[..at].chars().count() + 1,
            text: line.to_owned(),
            message,
        };
        let trimmed = line.trim_start();
        let indent = line.len() - trimmed.len();
        let is_job = !(trimmed.is_empty() || trimmed.starts_with('#') || env_line(trimmed));
        if let Some((at, text, _)) = &pending
            && !is_job
        {
            let at_line = *at;
            return Err(ParseError {
                file: file.to_owned(),
                line: at_line,
                column: 1,
                text: text.clone(),
                message: "a `# leasehold:` comment must be right above the job line it is for"
                    .to_owned(),
            });
        }
        if trimmed.is_empty() {
            continue;
        }
        if let Some(rest) = trimmed.strip_prefix('#') {
            let rest_at = indent + 1;
            let body = rest.trim_start();
            if let Some(options) = body.strip_prefix("leasehold:") {
                let options_at = rest_at + (rest.len() - body.len()) + "leasehold:".len();
                let parsed = options_of(options_at, options).map_err(|(at, m)| err(at, m))?;
                pending = Some((number, line.to_owned(), parsed));
            }
            continue;
        }
        if env_line(trimmed) {
            let (name, value) = assignment(trimmed);
            let value_at = indent + trimmed.find('=').map_or(0, |i| i + 1);
            if name == "CRON_TZ" || name == "TZ" {
                Schedule::cron_in("* * * * *", &value).map_err(|e| err(value_at, e.to_string()))?;
            }
            if name == "SHELL" && value.is_empty() {
                return Err(err(value_at, "SHELL= needs a program".to_owned()));
            }
            scope.set(name, value);
            continue;
        }
        let options = pending.take().map(|p| p.2).unwrap_or_default();
        let job = job_line(file, number, line, &scope, &options, defaults)
            .map_err(|(at, m)| err(at, m))?;
        if let Some(twin) = jobs.iter().find(|j| j.name == job.name) {
            let (at, why) = match job.derived_name {
                false => (indent, "this line's name=".to_owned()),
                true => (
                    indent,
                    "this line (the same schedule and command)".to_owned(),
                ),
            };
            return Err(err(
                at,
                format!(
                    "task name {} is taken by line {}: give {why} another `# leasehold: name=…`",
                    job.name, twin.line
                ),
            ));
        }
        jobs.push(job);
    }
    if let Some((at, text, _)) = pending {
        return Err(ParseError {
            file: file.to_owned(),
            line: at,
            column: 1,
            text,
            message: "a `# leasehold:` comment must be right above the job line it is for"
                .to_owned(),
        });
    }
    Ok(jobs)
}

/// Whether a line (without its indent) sets a variable: a name, optional blanks, `=`.
fn env_line(trimmed: &str) -> bool {
    let name_end = trimmed
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .unwrap_or(trimmed.len());
    let first = trimmed.chars().next();
    name_end > 0
        && first.is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && trimmed[name_end..].trim_start().starts_with('=')
}

/// `NAME = value` as cron reads it: blanks around both trimmed, matching quotes removed.
fn assignment(trimmed: &str) -> (&str, String) {
    let (name, value) = trimmed.split_once('=').unwrap_or((trimmed, ""));
    let value = value.trim();
    let unquoted = ['"', '\'']
        .iter()
        .find_map(|q| {
            value
                .strip_prefix(*q)
                .and_then(|v| v.strip_suffix(*q))
                .filter(|_| value.len() >= 2)
        })
        .unwrap_or(value);
    (name.trim(), unquoted.to_owned())
}

type Located = (usize, String);

/// A `# leasehold:` comment's options: where each word is, its key and its value.
type Options<'a> = Vec<(Word<'a>, String, String)>;

/// The `key=value` words of a `# leasehold:` comment starting at byte `at` of `line`.
fn options_of<'a>(at: usize, text: &'a str) -> Result<Options<'a>, Located> {
    let mut out: Options<'a> = Vec::new();
    for word in words(text) {
        let word = Word {
            at: at + word.at,
            text: word.text,
        };
        let Some((key, value)) = word.text.split_once('=') else {
            return Err((
                word.at,
                format!("{:?} is not key=value (keys: {OPTION_KEYS})", word.text),
            ));
        };
        let key = key.to_ascii_lowercase();
        if !OPTION_KEYS.split(", ").any(|k| k == key) {
            return Err((
                word.at,
                format!("unknown key {key:?}; the keys are: {OPTION_KEYS}"),
            ));
        }
        if out.iter().any(|(_, k, _)| *k == key) {
            return Err((word.at, format!("{key}= is given twice")));
        }
        let checked = match key.as_str() {
            "name" => LeaseName::new(value).map(|_| ()).map_err(|e| e.to_string()),
            "on-store-down" => value
                .parse::<StoreDownPolicy>()
                .map(|_| ())
                .map_err(|e| e.to_string()),
            "catch-up" => catch_up_kind(value)
                .map(|_| ())
                .ok_or_else(|| "expected skip, latest or all".to_owned()),
            "timeout" => policies::timeout_arg(value)
                .map(|_| ())
                .map_err(|e| e.to_string()),
            "retries" => policies::retries_arg(value)
                .map(|_| ())
                .map_err(|e| e.to_string()),
            "retry-backoff" => policies::backoff_arg(value)
                .map(|_| ())
                .map_err(|e| e.to_string()),
            "jitter" => policies::jitter_arg(value)
                .map(|_| ())
                .map_err(|e| e.to_string()),
            "on-interrupt" => policies::on_interrupt_arg(value).map(|_| ()),
            "overlap" => policies::overlap_arg(value)
                .map(|_| ())
                .map_err(|e| e.to_string()),
            _ => crate::durations::interval_arg(value).map(|_| ()),
        };
        if let Err(e) = checked {
            return Err((word.at, format!("{key}={value}: {e}")));
        }
        out.push((word, key, value.to_owned()));
    }
    Ok(out)
}

fn catch_up_kind(value: &str) -> Option<CatchUpKind> {
    match value {
        "skip" => Some(CatchUpKind::Skip),
        "latest" => Some(CatchUpKind::Latest),
        "all" => Some(CatchUpKind::All),
        _ => None,
    }
}

/// What a sixth field can be.
#[derive(Debug, PartialEq, Eq)]
enum Sixth {
    Year,
    DayOfWeek,
    Either,
    Neither,
}

fn sixth(word: &str) -> Sixth {
    let fires =
        |r: Result<Schedule, ScheduleError>| matches!(r, Ok(_) | Err(ScheduleError::NeverFires(_)));
    let day = fires(Schedule::cron(&format!("0 0 0 * * {word}")));
    let year = fires(Schedule::cron(&format!("0 0 0 * * * {word}")));
    match (year, day) {
        (true, true) => Sixth::Either,
        (true, false) => Sixth::Year,
        (false, true) => Sixth::DayOfWeek,
        (false, false) => Sixth::Neither,
    }
}

/// The schedule of a job line's words: how it was read and how many words it took.
fn schedule_of(ws: &[Word<'_>], zone: &str) -> Result<(Schedule, Reading, usize), Located> {
    let Some(first) = ws.first() else {
        return Err((0, "empty line".to_owned()));
    };
    let cron = |expr: &str| Schedule::cron_in(expr, zone);
    if first.text.starts_with('@') {
        return cron(first.text)
            .map(|s| (s, Reading::Macro, 1))
            .map_err(|e| (first.at, problem_text(&e)));
    }
    let joined = |n: usize| ws[..n].iter().map(|w| w.text).collect::<Vec<_>>().join(" ");
    // Seven fields: only where the seventh word is a year (else it starts the command).
    if ws.len() > 7
        && matches!(sixth(ws[6].text), Sixth::Year | Sixth::Either)
        && sixth(ws[5].text) != Sixth::Year
    {
        let expr = joined(7);
        if let Ok(s) = cron(&expr) {
            return Ok((s, Reading::Seven, 7));
        }
    }
    if ws.len() > 6 {
        let reading = match sixth(ws[5].text) {
            Sixth::Either => {
                return Err((
                    ws[5].at,
                    format!(
                        "six fields are ambiguous when the sixth ({:?}) could be a year or a \
                         day of the week: supercronic reads `minute hour day-of-month month \
                         day-of-week year`, leasehold run `second minute hour day-of-month \
                         month day-of-week`. Write seven fields (second … day-of-week year, \
                         e.g. `*/5 * * * * * *`) for seconds, or five",
                        ws[5].text
                    ),
                ));
            }
            Sixth::Year => Some(Reading::SixYearLast),
            Sixth::DayOfWeek => Some(Reading::SixSecondsFirst),
            Sixth::Neither => None,
        };
        if let Some(reading) = reading {
            let expr = match reading {
                Reading::SixYearLast => format!("0 {}", joined(6)),
                _ => joined(6),
            };
            return cron(&expr)
                .map(|s| (s, reading, 6))
                .map_err(|e| locate(&e, reading, ws));
        }
    }
    if ws.len() < 5 {
        let end = ws.last().map_or(0, |w| w.at + w.text.len());
        return Err((
            end,
            format!(
                "expected five fields (minute hour day-of-month month day-of-week) and a \
                 command, found {} word{}",
                ws.len(),
                if ws.len() == 1 { "" } else { "s" }
            ),
        ));
    }
    cron(&joined(5))
        .map(|s| (s, Reading::Five, 5))
        .map_err(|e| locate(&e, Reading::Five, ws))
}

/// The core's message without the expression it quotes (the caret shows it).
fn problem_text(e: &ScheduleError) -> String {
    match e {
        ScheduleError::BadCron { problem, .. } => problem.to_string(),
        e => e.to_string(),
    }
}

/// A schedule error at the word of the field it names.
fn locate(e: &ScheduleError, reading: Reading, ws: &[Word<'_>]) -> Located {
    let index = match e {
        ScheduleError::BadCron {
            problem: CronProblem::Field { field, .. },
            ..
        } => reading
            .fields()
            .iter()
            .position(|f| f == field)
            .unwrap_or(0),
        _ => 0,
    };
    let at = ws.get(index).or(ws.first()).map_or(0, |w| w.at);
    (at, problem_text(e))
}

fn job_line(
    file: &str,
    number: usize,
    line: &str,
    scope: &Scope,
    options: &[(Word<'_>, String, String)],
    defaults: &Defaults,
) -> Result<Job, Located> {
    let ws = words(line);
    let zone = scope
        .get("CRON_TZ")
        .or_else(|| scope.get("TZ"))
        .unwrap_or("UTC")
        .to_owned();
    let (schedule, reading, taken) = schedule_of(&ws, &zone)?;
    let Some(command_word) = ws.get(taken) else {
        let end = ws.last().map_or(0, |w| w.at + w.text.len());
        return Err((end, "no command after the schedule".to_owned()));
    };
    let command = line[command_word.at..].trim_end().to_owned();
    let schedule_text = ws[..taken]
        .iter()
        .map(|w| w.text)
        .collect::<Vec<_>>()
        .join(" ");
    let option = |key: &str| options.iter().find(|(_, k, _)| k == key);
    // The values were checked with the comment, where an error points.
    let (name, derived_name) = match option("name").and_then(|(_, _, v)| LeaseName::new(v).ok()) {
        Some(name) => (name, false),
        None => (
            derived_name(&schedule_text, &command).map_err(|e| (command_word.at, e.to_string()))?,
            true,
        ),
    };
    let on_store_down = option("on-store-down")
        .and_then(|(_, _, v)| v.parse::<StoreDownPolicy>().ok())
        .or(defaults.on_store_down);
    let kind = option("catch-up")
        .and_then(|(_, _, v)| catch_up_kind(v))
        .or(defaults.catch_up);
    let window = option("catch-up-window")
        .and_then(|(_, _, v)| crate::durations::interval_arg(v).ok())
        .or(defaults.catch_up_window);
    let window_or_default = window.unwrap_or(Duration::from_secs(3600));
    let catch_up = match kind {
        Some(CatchUpKind::Skip) => Some(CatchUp::Skip),
        Some(CatchUpKind::Latest) => Some(CatchUp::Latest {
            window: window_or_default,
        }),
        Some(CatchUpKind::All) => Some(CatchUp::All {
            window: window_or_default,
            max: CATCH_UP_MAX,
        }),
        // A window alone widens the default policy for cron schedules (latest).
        None => window.map(|window| CatchUp::Latest { window }),
    };
    let run_policy = policies::run_policy(
        option("timeout").and_then(|(_, _, v)| policies::timeout_arg(v).ok()),
        option("retries")
            .and_then(|(_, _, v)| policies::retries_arg(v).ok())
            .unwrap_or(0),
        option("retry-backoff").and_then(|(_, _, v)| policies::backoff_arg(v).ok()),
        option("jitter").and_then(|(_, _, v)| policies::jitter_arg(v).ok()),
    )
    .on_interrupt(
        option("on-interrupt")
            .and_then(|(_, _, v)| policies::on_interrupt_arg(v).ok())
            .unwrap_or_default(),
    )
    .overlap(
        option("overlap")
            .and_then(|(_, _, v)| policies::overlap_arg(v).ok())
            .unwrap_or_default(),
    );
    Ok(Job {
        name,
        derived_name,
        schedule,
        schedule_text,
        reading,
        zone,
        command,
        shell: scope.get("SHELL").unwrap_or(DEFAULT_SHELL).to_owned(),
        env: scope.env.clone(),
        catch_up,
        on_store_down,
        run_policy,
        file: file.to_owned(),
        line: number,
    })
}

/// The derived task name (see the module documentation).
pub fn derived_name(schedule_text: &str, command: &str) -> Result<LeaseName, NameError> {
    let first = command.split_whitespace().next().unwrap_or("job");
    let base = first.rsplit('/').find(|p| !p.is_empty()).unwrap_or("job");
    let mut prefix: String = base
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '-'
            }
        })
        .take(24)
        .collect();
    if prefix.trim_matches('-').is_empty() {
        prefix = "job".to_owned();
    }
    let digest = Sha256::digest(format!("{schedule_text}\n{command}").as_bytes());
    let hex: String = digest[..4].iter().map(|b| format!("{b:02x}")).collect();
    // Only A-Z a-z 0-9 . _ - and at most 24 + 9 bytes: always a valid name.
    LeaseName::new(format!("{prefix}-{hex}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn jobs(text: &str) -> Vec<Job> {
        parse("crontab", text, &Defaults::default()).unwrap()
    }

    fn refused(text: &str) -> ParseError {
        parse("crontab", text, &Defaults::default()).unwrap_err()
    }

    #[test]
    fn five_fields_macros_and_the_command_as_written() {
        let j = jobs(
            "*/5 * * * * echo hi # not a comment to cron, one to the shell\n@daily  /usr/bin/backup --full\n",
        );
        assert_eq!(j.len(), 2);
        assert_eq!(j[0].reading, Reading::Five);
        assert_eq!(j[0].schedule_text, "*/5 * * * *");
        assert_eq!(
            j[0].command,
            "echo hi # not a comment to cron, one to the shell"
        );
        assert_eq!(j[1].reading, Reading::Macro);
        assert_eq!(j[1].command, "/usr/bin/backup --full");
        assert_eq!(j[1].shell, DEFAULT_SHELL);
        assert_eq!(j[1].zone, "UTC");
        assert!(j[1].name.as_str().starts_with("backup-"), "{}", j[1].name);
    }

    #[test]
    fn tabs_comments_blank_lines_and_crlf() {
        let j = jobs("# a comment\n\n   \t\n\t0\t3 * *\t*\trun.sh\r\n  # indented comment\n");
        assert_eq!(j.len(), 1);
        assert_eq!(j[0].schedule_text, "0 3 * * *");
        assert_eq!(j[0].command, "run.sh");
        assert_eq!(j[0].line, 4);
    }

    #[test]
    fn environment_lines_apply_to_the_lines_after_them() {
        let text = "A=1\n* * * * * one\nB = \"two words\"\nA='3'\nSHELL=/bin/bash\nCRON_TZ=Europe/Berlin\n* * * * * two\n";
        let j = jobs(text);
        assert_eq!(j[0].env, vec![("A".into(), "1".into())]);
        assert_eq!(j[0].shell, DEFAULT_SHELL);
        assert_eq!(j[0].zone, "UTC");
        assert_eq!(
            j[1].env,
            vec![
                ("B".into(), "two words".into()),
                ("A".into(), "3".into()),
                ("SHELL".into(), "/bin/bash".into()),
                ("CRON_TZ".into(), "Europe/Berlin".into()),
            ]
        );
        assert_eq!(j[1].shell, "/bin/bash");
        assert_eq!(j[1].zone, "Europe/Berlin");
        // TZ= too, CRON_TZ= first.
        assert_eq!(jobs("TZ=Asia/Tokyo\n0 9 * * * x\n")[0].zone, "Asia/Tokyo");
        assert_eq!(
            jobs("TZ=Asia/Tokyo\nCRON_TZ=UTC\n0 9 * * * x\n")[0].zone,
            "UTC"
        );
    }

    #[test]
    fn six_and_seven_fields_as_supercronic_reads_them() {
        // Seven: seconds first, year last.
        let j = jobs("*/5 * * * * * * tick\n");
        assert_eq!(j[0].reading, Reading::Seven);
        assert_eq!(j[0].command, "tick");
        // Six with a year last (supercronic), six with a weekday last (seconds first).
        let j = jobs("0 3 * * * 2030-2040 yearly-ish\n*/10 * * * * MON-FRI weekdays\n");
        assert_eq!(j[0].reading, Reading::SixYearLast);
        assert_eq!(j[0].command, "yearly-ish");
        assert_eq!(j[1].reading, Reading::SixSecondsFirst);
        assert_eq!(j[1].command, "weekdays");
        // Five fields whose command looks like nothing cron knows.
        assert_eq!(jobs("0 3 * * * echo 2030\n")[0].reading, Reading::Five);
    }

    #[test]
    fn an_ambiguous_sixth_field_is_refused_at_that_field() {
        let e = refused("*/5 * * * * * echo\n");
        assert_eq!((e.line, e.column), (1, 13));
        assert!(e.message.contains("ambiguous"), "{}", e.message);
        assert!(e.message.contains("seven fields"), "{}", e.message);
    }

    #[test]
    fn bad_lines_are_named_with_line_and_column() {
        let e = refused("# ok\n0 3 * * *\n");
        assert_eq!((e.line, e.column), (2, 10));
        assert!(e.message.contains("no command"), "{}", e.message);
        let e = refused("0 25 * * * x\n");
        assert_eq!((e.line, e.column), (1, 3));
        assert!(e.message.contains("hour"), "{}", e.message);
        let e = refused("0 3 * *\n");
        assert!(e.message.contains("expected five fields"), "{}", e.message);
        let e = refused("@reboot x\n");
        assert!(e.message.contains("@reboot"), "{}", e.message);
        let e = refused("@sometimes x\n");
        assert!(e.message.contains("unknown macro"), "{}", e.message);
        let e = refused("0 3 15W * * x\n");
        assert_eq!(e.column, 5);
        let e = refused("CRON_TZ=Mars/Olympus\n");
        assert_eq!(e.column, 9);
        assert!(e.message.contains("unknown time zone"), "{}", e.message);
        // Garbage after the fields is the command; garbage in them is a field.
        let e = refused("0 3 * * x5 cmd\n");
        assert_eq!(e.column, 9);
        let e = refused("@ cmd\n");
        assert!(e.message.contains("unknown macro"), "{}", e.message);
    }

    #[test]
    fn the_caret_lines_up_under_the_column_with_tabs() {
        let e = refused("\t0 3 * * *\n");
        let [line, caret] = e.excerpt();
        assert_eq!(line, "\t0 3 * * *");
        assert_eq!(caret, "\t         ^");
        assert_eq!(e.to_string(), "crontab:1:11: no command after the schedule");
    }

    #[test]
    fn options_comment_names_and_sets_policies() {
        let text = "# leasehold: name=nightly catch-up=all catch-up-window=2h on-store-down=fail-open\n0 3 * * * backup\n";
        let j = jobs(text);
        assert_eq!(j[0].name.as_str(), "nightly");
        assert!(!j[0].derived_name);
        assert_eq!(
            j[0].catch_up,
            Some(CatchUp::All {
                window: Duration::from_secs(7200),
                max: CATCH_UP_MAX
            })
        );
        assert_eq!(j[0].on_store_down, Some(StoreDownPolicy::FailOpen));
        assert_eq!(j[0].run_policy, RunPolicy::default());
        let j = jobs(
            "# leasehold: timeout=10m retries=2 retry-backoff=30s,5m jitter=5m\n0 3 * * * backup\n",
        );
        assert_eq!(j[0].run_policy.jitter, Some(Duration::from_secs(300)));
        assert_eq!(j[0].run_policy.timeout, Some(Duration::from_secs(600)));
        assert_eq!(j[0].run_policy.retries, 2);
        assert_eq!(j[0].run_policy.backoff.base, Duration::from_secs(30));
        assert_eq!(j[0].run_policy.backoff.max, Duration::from_secs(300));
        // The file's defaults, overridden per line.
        let defaults = Defaults {
            catch_up: Some(CatchUpKind::Skip),
            catch_up_window: None,
            on_store_down: Some(StoreDownPolicy::Local),
        };
        let j = parse(
            "f",
            "* * * * * a\n# leasehold: on-store-down=fail-closed\n* * * * * b\n",
            &defaults,
        )
        .unwrap();
        assert_eq!(j[0].catch_up, Some(CatchUp::Skip));
        assert_eq!(j[0].on_store_down, Some(StoreDownPolicy::Local));
        assert_eq!(j[1].on_store_down, Some(StoreDownPolicy::FailClosed));
    }

    #[test]
    fn unknown_option_keys_and_values_are_refused_naming_the_supported_ones() {
        let e = refused("# leasehold: name=a overlap=sometimes\n* * * * * x\n");
        assert_eq!(e.column, 21);
        assert!(
            e.message
                .contains("overlap=sometimes: `sometimes` is not an overlap policy"),
            "{}",
            e.message
        );
        let j = jobs("# leasehold: overlap=buffer-one\n* * * * * x\n");
        assert_eq!(j[0].run_policy.overlap, leasehold::Overlap::BufferOne);
        let j = jobs("* * * * * x\n");
        assert_eq!(j[0].run_policy.overlap, leasehold::Overlap::Skip);
        let e = refused("# leasehold: colour=red\n* * * * * x\n");
        assert!(e.message.contains("unknown key"), "{}", e.message);
        assert!(e.message.contains(OPTION_KEYS), "{}", e.message);
        let e = refused("# leasehold: name=bad*name\n* * * * * x\n");
        assert!(e.message.contains("name=bad*name"), "{}", e.message);
        let e = refused("# leasehold: retry-backoff=1m,10s\n* * * * * x\n");
        assert!(e.message.contains("below the first wait"), "{}", e.message);
        let e = refused("# leasehold: catch-up=sometimes\n* * * * * x\n");
        assert!(e.message.contains("skip, latest or all"), "{}", e.message);
        let e = refused("# leasehold: name=a\n\n* * * * * x\n");
        assert_eq!(e.line, 1);
        assert!(e.message.contains("right above"), "{}", e.message);
    }

    #[test]
    fn derived_names_are_stable_readable_and_distinct() {
        let a = derived_name("0 3 * * *", "/usr/local/bin/backup.sh --full").unwrap();
        assert_eq!(
            a,
            derived_name("0 3 * * *", "/usr/local/bin/backup.sh --full").unwrap()
        );
        assert!(a.as_str().starts_with("backup.sh-"), "{a}");
        assert_eq!(a.as_str().len(), "backup.sh-".len() + 8);
        assert_ne!(
            a,
            derived_name("0 4 * * *", "/usr/local/bin/backup.sh --full").unwrap()
        );
        assert_ne!(
            a,
            derived_name("0 3 * * *", "/usr/local/bin/backup.sh").unwrap()
        );
        // Pinned: the rule is documented, and a change would rename every task.
        assert_eq!(
            derived_name("* * * * *", "echo hi").unwrap().as_str(),
            PINNED
        );
        let odd = derived_name("@daily", "$(weird) stuff").unwrap();
        assert!(odd.as_str().starts_with("--weird-"), "{odd}");
        // Whitespace between fields does not matter; the same line twice is refused.
        let e = refused("* * * * * echo hi\n*  *\t* * * echo hi\n");
        assert!(e.message.contains("taken by line 1"), "{}", e.message);
    }

    const PINNED: &str = "echo-3c185816";
}
