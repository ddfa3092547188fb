//! `leasehold next`: the next firings of a cron expression, to check it before deploying it.

use std::time::UNIX_EPOCH;

use anyhow::anyhow;
use clap::Args;
use leasehold::Schedule;

use crate::failure::Failure;
use crate::history;
use crate::output::outln;

#[derive(Args)]
pub struct NextArgs {
    /// The cron expression, as `leasehold run --cron` takes it: five fields, or six with
    /// seconds first, or a macro such as @daily.
    #[arg(long)]
    cron: String,
    /// The IANA time zone its times are in, e.g. Europe/Berlin [default: UTC, or the
    /// expression's CRON_TZ= prefix]
    #[arg(long)]
    tz: Option<String>,
    /// How many firings to show.
    #[arg(short = 'n', default_value_t = 5, value_parser = clap::value_parser!(u16).range(1..=1000))]
    n: u16,
    /// Start after this time instead of now: RFC 3339 in UTC, e.g. 2027-03-27T12:00:00Z.
    #[arg(long, value_parser = from_arg)]
    after: Option<u64>,
    /// Print JSON: {"cron", "time_zone", "firings": [{"slot_ms", "utc", "local"}]}.
    #[arg(long)]
    json: bool,
}

pub fn from_arg(text: &str) -> Result<u64, String> {
    let at = humantime::parse_rfc3339_weak(text.trim())
        .map_err(|e| format!("invalid time {text:?} (e.g. 2027-03-27T12:00:00Z): {e}"))?;
    at.duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .map_err(|_| format!("{text:?} is before 1970"))
}

pub fn next(args: NextArgs) -> Result<u8, Failure> {
    let schedule = match &args.tz {
        Some(zone) => Schedule::cron_in(&args.cron, zone),
        None => Schedule::cron(&args.cron),
    }
    .map_err(Failure::usage)?;
    let Schedule::Cron(cron) = &schedule else {
        return Err(Failure::usage(anyhow!("not a cron schedule")));
    };
    let start = args.after.unwrap_or_else(history::local_now_ms);
    let mut at = start;
    let mut firings = Vec::new();
    for _ in 0..args.n {
        let Some(next) = schedule.next_after(at) else {
            break;
        };
        firings.push((
            next,
            history::time(next),
            cron.local_time(next).unwrap_or_default(),
        ));
        at = next;
    }
    if args.json {
        let firings: Vec<_> = firings
            .iter()
            .map(|(ms, utc, local)| serde_json::json!({"slot_ms": ms, "utc": utc, "local": local}))
            .collect();
        let doc = serde_json::json!({
            "cron": cron.expr(), "time_zone": cron.time_zone(), "firings": firings,
        });
        crate::output::json(&doc)?;
        return Ok(0);
    }
    // The expression as written (the zone is said beside it, whether given by --tz or by a
    // CRON_TZ= prefix of the expression).
    outln!(
        "cron {:?} in {}, after {}",
        args.cron.trim(),
        cron.time_zone(),
        history::time(start)
    )?;
    let zone = format!("LOCAL ({})", cron.time_zone());
    outln!("{zone:<32}  UTC")?;
    for (_, utc, local) in &firings {
        outln!("{local:<32}  {utc}")?;
    }
    if firings.len() < usize::from(args.n) {
        outln!("(no firing after these)")?;
    }
    Ok(0)
}
