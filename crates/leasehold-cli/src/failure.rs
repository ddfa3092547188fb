//! How a command ends: the exit statuses, the failures that map to them and their one-line
//! message, and the exit itself once stderr has taken the last lines.

use std::process::ExitCode;
use std::time::Duration;

use crate::logging;

/// Exit status when the lease is held by someone else (`run` without a schedule).
pub const EXIT_BUSY: u8 = 75;
/// Exit status when the store cannot be reached (and the policy does not allow running anyway).
pub const EXIT_STORE_DOWN: u8 = 69;
/// Exit status of `pause`, `resume`, `trigger` for a task the store's catalog does not have
/// (sysexits' EX_NOINPUT).
pub const EXIT_UNKNOWN_TASK: u8 = 66;
/// Exit status of `status`, `history`, `pause`, `resume` and `trigger` when their SQLite store
/// does not exist (sysexits' EX_NOINPUT, as an unknown task: what was named is not there). Only
/// `run`, `serve` and `demo` create a store, so a mistyped path fails instead of answering from
/// a new, empty file (which made `pause` and `trigger` exit 66 for an unknown task before).
pub const EXIT_NO_STORE: u8 = 66;
/// Exit status of `trigger` when no instance runs the task: nobody would take it (EX_NOHOST).
pub const EXIT_NO_INSTANCE: u8 = 68;
/// Exit status of `forget` while an instance still runs the task: nothing was removed
/// (sysexits' EX_NOPERM: not while it runs).
pub const EXIT_TASK_LIVE: u8 = 77;
/// Exit status of `trigger --wait` when the run did not end in time (as `timeout`'s).
pub const EXIT_NOT_ENDED: u8 = 124;
/// Exit status for bad input.
pub const EXIT_USAGE: u8 = 2;
/// Exit status when the store keeps refusing the lease (a key of the wrong type, no permission,
/// scripts disabled): retrying cannot fix it, so `run` gives up (sysexits' EX_CONFIG).
pub const EXIT_REFUSED: u8 = 78;

/// An error with the exit status it maps to, and what the user can do about it.
#[derive(Debug)]
pub struct Failure {
    /// The exit status.
    pub code: u8,
    /// What went wrong.
    pub error: anyhow::Error,
    /// What the user can do about it, printed after the cause.
    pub next_step: Option<String>,
}

impl Failure {
    /// `error` with exit status `code`.
    pub fn with_code(code: u8, error: impl Into<anyhow::Error>) -> Self {
        Self {
            code,
            error: error.into(),
            next_step: None,
        }
    }

    /// Bad input: exit 2.
    pub fn usage(error: impl Into<anyhow::Error>) -> Self {
        Self::with_code(EXIT_USAGE, error)
    }

    /// The same failure, telling the user what to do about it (printed after the cause).
    pub fn next_step(mut self, what: impl Into<String>) -> Self {
        self.next_step = Some(what.into());
        self
    }

    /// A store that could not be used: exit 69 if retrying may help (unreachable, too slow),
    /// else 78 (it refuses: credentials, permissions, a key of the wrong type).
    pub fn store(error: impl Into<anyhow::Error>, transient: bool) -> Self {
        let code = match transient {
            true => EXIT_STORE_DOWN,
            false => EXIT_REFUSED,
        };
        Self::with_code(code, error)
    }

    /// A store URL that could not be opened: exit 2 for a URL that can never work (unknown
    /// scheme, unparsable), else as [`store`](Self::store). The one mapping of open errors.
    pub fn open(error: leasehold_connect::OpenError) -> Self {
        use leasehold_connect::OpenError;
        const FIX_URL: &str = "--store or LEASEHOLD_STORE";
        if error.is_bad_url() {
            return Self::usage(error).next_step(format!("fix the URL in {FIX_URL}"));
        }
        if error.is_not_found() || error.is_not_a_store() {
            let code = match error.is_not_found() {
                true => EXIT_NO_STORE,
                false => EXIT_REFUSED,
            };
            // The store's own message names the file; "cannot open the sqlite store" adds
            // nothing to it.
            let cause = std::error::Error::source(&error)
                .map_or_else(|| error.to_string(), ToString::to_string);
            return Self::with_code(code, anyhow::anyhow!(cause)).next_step(format!(
                "check {FIX_URL} (only leasehold run, serve and demo create a store)"
            ));
        }
        let next_step = match &error {
            OpenError::Unavailable { .. } => Some(format!(
                "start the server, or correct the host and port in {FIX_URL}"
            )),
            OpenError::NoDatabase {
                store, database, ..
            } => Some(create_database(store, database)),
            OpenError::Denied { store, .. } if *store != "sqlite" => Some(format!(
                "check the user, password and TLS settings in {FIX_URL}, and that the server \
                 lets that user in"
            )),
            _ => None,
        };
        let transient = error.is_transient();
        Self {
            next_step,
            ..Self::store(error, transient)
        }
    }

    /// An operation the store could not answer, as [`store`](Self::store), with `context`
    /// (what was being done) in front of the store's own message.
    pub fn store_op(error: leasehold::StoreError, context: String) -> Self {
        let transient = error.is_transient();
        Self::store(anyhow::Error::new(error).context(context), transient)
    }
}

impl From<anyhow::Error> for Failure {
    fn from(error: anyhow::Error) -> Self {
        Self::with_code(1, error)
    }
}

/// What creates `database` on a `store` server: the store makes its tables, never its
/// database. The name is the URL's, shown as [`visible`](leasehold::store::text::visible) text.
fn create_database(store: &str, database: &str) -> String {
    let name = leasehold::store::text::visible(database);
    match store {
        "mysql" => format!("create it with: mysql -e 'CREATE DATABASE `{name}`'"),
        "postgres" => format!("create it with: createdb '{name}'"),
        _ => format!("create the database {name:?} on the server"),
    }
}

/// The one form of every error the command prints: one line, the error and its causes each
/// once ([`one_line`]), then what to do about it when that is known.
pub fn report(error: &anyhow::Error, next_step: Option<&str>) -> String {
    let line = one_line(error);
    match next_step {
        Some(step) => format!("{line}; {step}"),
        None => line,
    }
}

/// An error and its causes on one line, each cause once: a cause whose text is already in the
/// line (a message quoting its driver's error, a driver repeating itself), or that only wraps
/// such a text in its driver's labels (`Server error: \`ERROR 1045 (28000): …'`, `db error`),
/// is left out, and a store address the line already names is not repeated.
pub fn one_line(error: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in error.chain() {
        let text = cause.to_string().replace('\n', " ");
        let text = without_known_addresses(text.trim(), &line);
        let labels_its_source = is_label(&text)
            && cause
                .source()
                .is_some_and(|s| only_wraps(&s.to_string(), &line));
        if text.is_empty() || only_wraps(&text, &line) || labels_its_source {
            continue;
        }
        if !line.is_empty() {
            line.push_str(": ");
        }
        line.push_str(&text);
    }
    line
}

/// A driver's label (`Server error`, `ERROR 1045 (28000)`, `db error`): a few words.
fn is_label(text: &str) -> bool {
    text.split_whitespace().count() <= 3
}

/// Whether `text` is in `line`, or is labels (`Server error: \`ERROR 1045 (28000): …'`) around
/// a message `line` already holds.
fn only_wraps(text: &str, line: &str) -> bool {
    let unquoted = |t: &str| t.trim_matches(['`', '\'', '"', ' ']).to_owned();
    let mut labels = 0;
    for (at, sep) in text.match_indices(": ") {
        if !is_label(&text[labels..at]) {
            return false;
        }
        labels = at + sep.len();
        let tail = unquoted(&text[labels..]);
        // A tail of a few characters (`YES)`) could be in the line by chance.
        if tail.len() >= 8 && line.contains(&tail) {
            return true;
        }
    }
    line.contains(&unquoted(text))
}

/// `text` without the store addresses (`redis://host:port/0`) `line` already names, nor the
/// `at` before them: `connect at redis://h:1/0: refused` after `could not connect to
/// redis://h:1/0` is `connect: refused`.
fn without_known_addresses(text: &str, line: &str) -> String {
    let mut words: Vec<String> = Vec::new();
    for word in text.split(' ') {
        let address = word.trim_end_matches([':', ',', ';']);
        if address.contains("://") && line.contains(address) {
            if words.last().is_some_and(|w| w == "at") {
                words.pop();
            }
            // The punctuation after the address stays, on the word before it.
            match words.last_mut() {
                Some(last) => last.push_str(&word[address.len()..]),
                None => words.push(word[address.len()..].to_owned()),
            }
            continue;
        }
        words.push(word.to_owned());
    }
    words.join(" ")
}

/// Starts a tokio runtime (with its I/O and timers) from `builder`; if it cannot, says so on
/// stderr and returns the exit status.
pub fn start_runtime(
    builder: &mut tokio::runtime::Builder,
) -> Result<tokio::runtime::Runtime, ExitCode> {
    builder.enable_all().build().map_err(|e| {
        logging::error_line(&format!("cannot start the runtime: {e}"));
        exit(1)
    })
}

/// Exits with `code` once stderr has taken the last lines, or after half a second if it does not
/// take them (a reader that stopped reading must not keep the process alive).
pub fn exit(code: u8) -> ExitCode {
    logging::drain(Duration::from_millis(500));
    ExitCode::from(code)
}
