//! `leasehold crontab --test`: each line's task name, schedule, zone and next firings.

use leasehold::Schedule;

use super::CrontabArgs;
use super::parse::Job;
use crate::failure::Failure;
use crate::history;
use crate::output::outln;

/// A firing: ms since the epoch, in UTC, and in the line's zone.
fn firings(job: &Job, after: u64, n: u16) -> Vec<(u64, String, String)> {
    let mut at = after;
    let mut out = Vec::new();
    for _ in 0..n {
        let Some(next) = job.schedule.next_after(at) else {
            break;
        };
        let local = match &job.schedule {
            Schedule::Cron(cron) => cron.local_time(next).unwrap_or_default(),
            _ => history::time(next),
        };
        out.push((next, history::time(next), local));
        at = next;
    }
    out
}

pub fn print(jobs: &[Job], args: &CrontabArgs) -> Result<u8, Failure> {
    let after = args.after.unwrap_or_else(history::local_now_ms);
    if args.json {
        let jobs: Vec<_> = jobs
            .iter()
            .map(|job| {
                let firings: Vec<_> = firings(job, after, args.n)
                    .into_iter()
                    .map(|(ms, utc, local)| {
                        serde_json::json!({"slot_ms": ms, "utc": utc, "local": local})
                    })
                    .collect();
                serde_json::json!({
                    "name": job.name.as_str(),
                    "derived_name": job.derived_name,
                    "schedule": job.schedule_text,
                    "fields": job.reading.describe(),
                    "time_zone": job.zone,
                    "command": job.command,
                    "shell": job.shell,
                    "file": job.file,
                    "line": job.line,
                    "firings": firings,
                })
            })
            .collect();
        crate::output::json(&serde_json::json!({ "jobs": jobs }))?;
        return Ok(0);
    }
    for job in jobs {
        let named = if job.derived_name { " (derived)" } else { "" };
        outln!("{}:{}: task {}{named}", job.file, job.line, job.name)?;
        outln!(
            "  schedule {:?} ({}) in {}",
            job.schedule_text,
            job.reading.describe(),
            job.zone
        )?;
        outln!("  command  {}", job.command)?;
        for (_, utc, local) in firings(job, after, args.n) {
            outln!("  next     {local:<32}  {utc}")?;
        }
    }
    outln!(
        "{} line{} OK",
        jobs.len(),
        if jobs.len() == 1 { "" } else { "s" }
    )?;
    Ok(0)
}
