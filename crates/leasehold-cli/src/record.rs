//! `leasehold record FILE`: the witness a demo or test runs as its command.

use std::io::Write;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use clap::Args;

use crate::Failure;

#[derive(Args)]
pub struct RecordArgs {
    /// The ledger file (JSON lines, appended).
    file: std::path::PathBuf,
    /// How long the "work" takes.
    #[arg(long, default_value = "0ms", value_parser = crate::duration_arg)]
    sleep: Duration,
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

pub async fn record(args: RecordArgs) -> Result<u8, Failure> {
    let var = |k: &str| std::env::var(k).unwrap_or_default();
    let start = now_ms();
    tokio::time::sleep(args.sleep).await;
    let line = serde_json::json!({
        "lease": var("LEASEHOLD_LEASE"),
        "holder": var("LEASEHOLD_HOLDER"),
        "token": var("LEASEHOLD_TOKEN").parse::<u64>().ok(),
        "slot": var("LEASEHOLD_SLOT").parse::<u64>().ok(),
        "trigger": var("LEASEHOLD_TRIGGER"),
        "pid": std::process::id(),
        "start_ms": start,
        "end_ms": now_ms(),
    });
    // One write of one line to an O_APPEND file: lines from concurrent writers never interleave.
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&args.file)
        .with_context(|| format!("cannot open ledger {}", args.file.display()))?;
    f.write_all(format!("{line}\n").as_bytes())
        .context("cannot write ledger")?;
    Ok(0)
}
