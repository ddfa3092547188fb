//! The witness ledger: one JSON line per run of the witness command.

use std::io::{self, BufRead, Write};
use std::path::Path;

use serde_json::{Value, json};

/// What became of a run's fenced write.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Fenced {
    /// The token was at least the highest one written so far: the write landed.
    Accepted,
    /// The token was below the highest one written so far: a stale holder, refused.
    Rejected,
    /// The run was told to stop (SIGTERM) before its write; nothing was written.
    Aborted,
}

impl Fenced {
    /// The word used in the ledger and the report.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Accepted => "accepted",
            Self::Rejected => "rejected",
            Self::Aborted => "aborted",
        }
    }

    fn parse(s: &str) -> Option<Self> {
        match s {
            "accepted" => Some(Self::Accepted),
            "rejected" => Some(Self::Rejected),
            "aborted" => Some(Self::Aborted),
            _ => None,
        }
    }
}

/// One run of the witness, as written to the ledger.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LedgerEntry {
    /// The lease (`LEASEHOLD_LEASE`).
    pub task: String,
    /// The tick's slot (`LEASEHOLD_SLOT`): the firing's scheduled time, ms since the Unix epoch
    /// on the store's clock.
    pub slot: Option<u64>,
    /// The fencing token of the run (`LEASEHOLD_TOKEN`).
    pub token: Option<u64>,
    /// The holder id of the instance that ran it (`LEASEHOLD_HOLDER`).
    pub holder: String,
    /// The witness process id.
    pub pid: u32,
    /// When the run started, ms since the Unix epoch.
    pub start_ms: u64,
    /// When the run made its write (or stopped), ms since the Unix epoch.
    pub end_ms: u64,
    /// What became of the write.
    pub fenced: Fenced,
    /// The highest token in the fence when this write was decided.
    pub fence_max: Option<u64>,
}

impl LedgerEntry {
    /// The entry as one JSON object.
    pub fn to_json(&self) -> Value {
        json!({
            "task": self.task,
            "slot": self.slot,
            "token": self.token,
            "holder": self.holder,
            "pid": self.pid,
            "start_ms": self.start_ms,
            "end_ms": self.end_ms,
            "fenced": self.fenced.as_str(),
            "fence_max": self.fence_max,
        })
    }

    /// Reads an entry from one ledger line; `None` if the line is not one.
    pub fn parse(line: &str) -> Option<Self> {
        let v: Value = serde_json::from_str(line).ok()?;
        let u = |k: &str| v.get(k).and_then(Value::as_u64);
        let s = |k: &str| {
            v.get(k)
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned()
        };
        Some(Self {
            task: s("task"),
            slot: u("slot"),
            token: u("token"),
            holder: s("holder"),
            pid: u32::try_from(u("pid")?).ok()?,
            start_ms: u("start_ms")?,
            end_ms: u("end_ms")?,
            fenced: Fenced::parse(v.get("fenced")?.as_str()?)?,
            fence_max: u("fence_max"),
        })
    }

    /// Whether the runs' `[start, end]` intervals overlap (touching ends do not).
    pub fn overlaps(&self, other: &Self) -> bool {
        self.start_ms < other.end_ms && other.start_ms < self.end_ms
    }
}

/// Appends one entry as one line (one `write` to an `O_APPEND` file, so lines never interleave).
pub fn append(ledger: &Path, entry: &LedgerEntry) -> io::Result<()> {
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(ledger)?;
    f.write_all(format!("{}\n", entry.to_json()).as_bytes())
}

/// Reads every entry of a ledger, in the order they were written; a missing file is empty.
/// Returns the entries and the number of lines that could not be read.
pub fn read(ledger: &Path) -> io::Result<(Vec<LedgerEntry>, usize)> {
    let f = match std::fs::File::open(ledger) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok((Vec::new(), 0)),
        Err(e) => return Err(e),
    };
    let mut entries = Vec::new();
    let mut bad = 0;
    for line in io::BufReader::new(f).lines() {
        let line = line?;
        if line.trim().is_empty() {
            continue;
        }
        match LedgerEntry::parse(&line) {
            Some(e) => entries.push(e),
            None => bad += 1,
        }
    }
    Ok((entries, bad))
}
