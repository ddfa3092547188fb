//! The witness ledger: one JSON line per run of the witness command.

use std::io::{self, BufRead, Write};
use std::path::Path;

use serde::{Deserialize, Serialize};

/// What became of a run's fenced write.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
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
}

/// One run of the witness, as written to the ledger: one JSON object per line, with these
/// field names (absent options are `null`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LedgerEntry {
    /// The lease (`LEASEHOLD_LEASE`).
    #[serde(default)]
    pub task: String,
    /// The tick's slot (`LEASEHOLD_SLOT`): the firing's scheduled time, ms since the Unix epoch
    /// on the store's clock.
    pub slot: Option<u64>,
    /// The fencing token of the run (`LEASEHOLD_TOKEN`).
    pub token: Option<u64>,
    /// The holder id of the instance that ran it (`LEASEHOLD_HOLDER`).
    #[serde(default)]
    pub holder: String,
    /// What started the run (`LEASEHOLD_TRIGGER`: `timer`, `catch-up`, `manual`, `backfill`); left out of
    /// the line when empty.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub trigger: String,
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
    /// Reads an entry from one ledger line; `None` if the line is not one.
    pub fn parse(line: &str) -> Option<Self> {
        serde_json::from_str(line).ok()
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
    let mut line = serde_json::to_vec(entry)?;
    line.push(b'\n');
    f.write_all(&line)
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

#[cfg(test)]
mod tests {
    use super::*;

    fn entry() -> LedgerEntry {
        LedgerEntry {
            task: "t".into(),
            slot: Some(1_700_000_000_000),
            token: None,
            holder: "r0.0".into(),
            trigger: String::new(),
            pid: 7,
            start_ms: 1,
            end_ms: 2,
            fenced: Fenced::Rejected,
            fence_max: Some(9),
        }
    }

    /// The line as the hand-built JSON wrote it before serde.
    const LINE: &str = r#"{"end_ms":2,"fence_max":9,"fenced":"rejected","holder":"r0.0","pid":7,"slot":1700000000000,"start_ms":1,"task":"t","token":null}"#;

    #[test]
    fn lines_keep_their_shape_and_round_trip() {
        let written: serde_json::Value = serde_json::to_value(entry()).unwrap();
        let before: serde_json::Value = serde_json::from_str(LINE).unwrap();
        assert_eq!(written, before);
        assert_eq!(LedgerEntry::parse(LINE), Some(entry()));
        let line = serde_json::to_string(&entry()).unwrap();
        assert_eq!(LedgerEntry::parse(&line), Some(entry()));
        for (fenced, word) in [
            (Fenced::Accepted, "accepted"),
            (Fenced::Rejected, "rejected"),
            (Fenced::Aborted, "aborted"),
        ] {
            assert_eq!(serde_json::to_value(fenced).unwrap(), word);
            assert_eq!(fenced.as_str(), word);
        }
    }

    #[test]
    fn a_trigger_is_written_when_set() {
        let mut timer = entry();
        timer.trigger = "timer".into();
        let line = serde_json::to_value(&timer).unwrap();
        assert_eq!(line["trigger"], "timer");
        assert_eq!(LedgerEntry::parse(&line.to_string()), Some(timer));
    }

    #[test]
    fn missing_options_and_names_are_tolerated_but_not_missing_times() {
        let e =
            LedgerEntry::parse(r#"{"pid":7,"start_ms":1,"end_ms":2,"fenced":"aborted"}"#).unwrap();
        assert_eq!((e.slot, e.token, e.fence_max), (None, None, None));
        assert_eq!((e.task.as_str(), e.holder.as_str()), ("", ""));
        assert_eq!(
            LedgerEntry::parse(r#"{"pid":7,"end_ms":2,"fenced":"aborted"}"#),
            None
        );
        assert_eq!(
            LedgerEntry::parse(r#"{"pid":7,"start_ms":1,"end_ms":2,"fenced":"maybe"}"#),
            None
        );
        assert_eq!(LedgerEntry::parse("not json"), None);
    }

    #[test]
    fn appended_lines_are_read_back_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ledger.jsonl");
        let mut second = entry();
        second.pid = 8;
        append(&path, &entry()).unwrap();
        append(&path, &second).unwrap();
        std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .and_then(|mut f| f.write_all(b"garbage\n"))
            .unwrap();
        let (entries, bad) = read(&path).unwrap();
        assert_eq!((entries, bad), (vec![entry(), second], 1));
        let text = std::fs::read_to_string(&path).unwrap();
        let first: serde_json::Value = serde_json::from_str(text.lines().next().unwrap()).unwrap();
        assert_eq!(
            first,
            serde_json::from_str::<serde_json::Value>(LINE).unwrap()
        );
    }
}
