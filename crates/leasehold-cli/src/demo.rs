//! `leasehold demo`: three instances on one SQLite file, a kill, a graceful stop, a summary.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, anyhow};
use clap::Args;
use leasehold::{LeaseName, Store};
use leasehold_witness::procs::{self, Replica};
use leasehold_witness::{Fenced, ledger};
use nix::sys::signal::Signal;
use tokio::process::Command;
use tokio::time::Instant;

use crate::failure::Failure;
use crate::output::outln;

#[derive(Args)]
pub struct DemoArgs {
    /// Number of instances: at least 3, since one is killed and one stopped and a third must
    /// take over.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u16).range(3..=9))]
    instances: u16,
    /// Tick interval.
    #[arg(long, default_value = "1s", value_parser = crate::durations::duration_arg)]
    every: Duration,
    /// Lease ttl (how long a killed leader blocks the others).
    #[arg(long, default_value = "3s", value_parser = crate::durations::duration_arg)]
    ttl: Duration,
    /// Ticks to watch in each phase.
    #[arg(long, default_value_t = 4)]
    ticks: u32,
    /// Keep the SQLite file, ledger and logs in this directory instead of a temporary one
    /// (which is removed when the demo ends).
    #[arg(long)]
    dir: Option<PathBuf>,
}

const LEASE: &str = "demo-sweep";
/// The lease each run holds (a `leasehold run` task's), whose tokens the ledger shows.
const RUN_LEASE: &str = "demo-sweep:run";

/// What the demo has seen so far.
#[derive(Default)]
struct Observed {
    /// slot → instances that ran it.
    runs: BTreeMap<u64, Vec<String>>,
    /// Ledger entries already shown.
    ledger_seen: usize,
    leader: Option<String>,
    /// The last token a shown run had.
    last_token: Option<u64>,
    /// The token of the run the SIGKILL cut short, until a later run's token is shown.
    killed_token: Option<u64>,
    /// Slots run again because their run was cut off.
    run_again: Vec<u64>,
}

struct Demo {
    dir: PathBuf,
    instances: Vec<Replica>,
    store: leasehold::BoxStore,
    seen: Observed,
    started: Instant,
}

fn stamp(started: Instant) -> String {
    format!("[{:>5.1}s]", started.elapsed().as_secs_f64())
}

impl Demo {
    /// Starts instance `idx`: `leasehold run` with the witness as its command, in the demo's
    /// process group (so Ctrl-C reaches the instances too).
    fn spawn(&mut self, idx: usize, every: Duration, ttl: Duration) -> anyhow::Result<()> {
        let exe = std::env::current_exe().context("cannot find the leasehold binary")?;
        let name = format!("instance-{}", idx + 1);
        let log = self.dir.join(format!("{name}.log"));
        let db = self.dir.join("demo.db");
        let mut command = Command::new(&exe);
        command
            .arg("run")
            .arg("--store")
            .arg(format!("sqlite:{}", db.display()))
            .args(["--lease", LEASE, "--holder", &name])
            .arg("--every")
            .arg(format!("{}ms", every.as_millis()))
            .arg("--ttl")
            .arg(format!("{}ms", ttl.as_millis()))
            .arg("--")
            .arg(&exe)
            .arg("witness")
            .arg("--ledger")
            .arg(self.dir.join("ledger.jsonl"))
            .arg("--fence")
            .arg(self.dir.join("fence"))
            .args(["--work", "100ms"]);
        let replica = Replica::spawn(idx, 0, name, command, &log)
            .with_context(|| format!("cannot start an instance (log {})", log.display()))?;
        self.instances.push(replica);
        Ok(())
    }

    /// Reads new ledger entries and the current leader, printing what changed.
    async fn observe(&mut self) -> anyhow::Result<()> {
        // A line being written is not read yet (it does not parse): it is read next time.
        let (entries, _) =
            ledger::read(&self.dir.join("ledger.jsonl")).context("cannot read the ledger")?;
        for entry in entries.iter().skip(self.seen.ledger_seen) {
            // Stopped before its write: it did nothing.
            if entry.fenced == Fenced::Aborted {
                continue;
            }
            let slot = entry
                .slot
                .ok_or_else(|| anyhow!("ledger entry without a slot"))?;
            let holder = &entry.holder;
            let token = entry.token.unwrap_or(0);
            let ran = self.seen.runs.entry(slot).or_default();
            ran.push(holder.clone());
            let dup = if ran.len() > 1 { "   << DUPLICATE" } else { "" };
            let stale = if entry.fenced == Fenced::Rejected {
                "   << STALE TOKEN, write refused"
            } else {
                ""
            };
            let again = if entry.trigger == "retry" {
                self.seen.run_again.push(slot);
                "   (run again: its run was cut off)"
            } else {
                ""
            };
            outln!(
                "{} tick {slot}: ran on {holder} (fencing token {token}){again}{dup}{stale}",
                stamp(self.started)
            )?;
            self.explain_skipped_token(token)?;
            self.seen.last_token = Some(token);
        }
        self.seen.ledger_seen = self.seen.ledger_seen.max(entries.len());
        let state = self.store.inspect(&LeaseName::new(LEASE)?).await?;
        let leader = state.and_then(|s| s.holder).map(|h| h.to_string());
        if leader != self.seen.leader {
            match &leader {
                Some(l) => outln!("{} leader is now {l}", stamp(self.started))?,
                None => outln!("{} no leader", stamp(self.started))?,
            }
            self.seen.leader = leader;
        }
        Ok(())
    }

    /// Where the shown tokens jump over the killed run's, says why, once.
    fn explain_skipped_token(&mut self, token: u64) -> anyhow::Result<()> {
        let Some(killed) = self.seen.killed_token else {
            return Ok(());
        };
        if token <= killed {
            return Ok(());
        }
        self.seen.killed_token = None;
        if self.seen.last_token.is_some_and(|last| last < killed) {
            outln!(
                "{} >>> the tokens skip {killed}: the SIGKILL cut that run short before its write, and no token is handed out twice",
                stamp(self.started)
            )?;
        }
        Ok(())
    }

    /// Waits (at most `limit`) until `leader` is running a tick, so the kill cuts a run short;
    /// the run's fencing token, `None` if no run began in time.
    async fn wait_for_run(&mut self, leader: &str, limit: Duration) -> anyhow::Result<Option<u64>> {
        let run_lease = LeaseName::new(RUN_LEASE)?;
        let end = Instant::now() + limit;
        while Instant::now() < end {
            self.observe().await?;
            if let Some(state) = self.store.inspect(&run_lease).await?
                && state.holder.is_some_and(|h| h.as_str() == leader)
            {
                return Ok(Some(state.token.get()));
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        Ok(None)
    }

    async fn watch_for(&mut self, d: Duration) -> anyhow::Result<()> {
        let end = Instant::now() + d;
        while Instant::now() < end {
            self.observe().await?;
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        Ok(())
    }

    async fn wait_for_leader(
        &mut self,
        not: Option<&str>,
        limit: Duration,
    ) -> anyhow::Result<(String, Duration)> {
        let start = Instant::now();
        loop {
            self.observe().await?;
            if let Some(l) = &self.seen.leader
                && Some(l.as_str()) != not
            {
                return Ok((l.clone(), start.elapsed()));
            }
            if start.elapsed() > limit {
                return Err(anyhow!("no new leader within {limit:?}"));
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }

    fn signal(&mut self, name: &str, sig: Signal) -> anyhow::Result<()> {
        let replica = self
            .instances
            .iter_mut()
            .find(|r| r.holder == name)
            .ok_or_else(|| anyhow!("unknown instance {name}"))?;
        if !replica.alive() || !procs::signal(replica.pid, sig) {
            return Err(anyhow!("{name} is not running"));
        }
        Ok(())
    }

    /// SIGTERM to every instance; one that has not exited 5 s later is killed with its command.
    async fn stop_all(&mut self) {
        for replica in &mut self.instances {
            if replica.alive() {
                procs::signal(replica.pid, Signal::SIGTERM);
            }
        }
        for replica in &mut self.instances {
            if !replica.wait(Duration::from_secs(5)).await {
                replica.kill_all();
            }
        }
    }
}

pub async fn demo(args: DemoArgs) -> Result<u8, Failure> {
    let tmp;
    let (dir, kept): (PathBuf, bool) = match &args.dir {
        Some(d) => {
            std::fs::create_dir_all(d).with_context(|| format!("cannot create {}", d.display()))?;
            (d.clone(), true)
        }
        None => {
            tmp = tempfile::tempdir().context("cannot create a temporary directory")?;
            (tmp.path().to_owned(), false)
        }
    };
    let result = run_demo(&args, &dir, kept).await;
    result.map_err(Failure::from)
}

async fn run_demo(args: &DemoArgs, dir: &Path, kept: bool) -> anyhow::Result<u8> {
    let db = dir.join("demo.db");
    let store = leasehold_connect::open_store(&format!("sqlite:{}", db.display())).await?;
    outln!(
        "leasehold demo: {} instances of `leasehold run --every {:?} --ttl {:?}` share one SQLite file.",
        args.instances,
        args.every,
        args.ttl
    )?;
    outln!(
        "Each tick must run on exactly one instance; the command each runs appends to a ledger."
    )?;
    match kept {
        true => outln!("files: {} (kept)", dir.display())?,
        false => outln!(
            "files: {} (removed when the demo ends; `leasehold demo --dir DIR` keeps them)",
            dir.display()
        )?,
    }
    outln!("")?;
    let mut demo = Demo {
        dir: dir.to_owned(),
        instances: Vec::new(),
        store,
        seen: Observed::default(),
        started: Instant::now(),
    };
    for i in 0..args.instances as usize {
        demo.spawn(i, args.every, args.ttl)?;
    }
    let outcome = phases(args, &mut demo).await;
    demo.stop_all().await;
    demo.observe().await?;
    let (kill_takeover, handoff) = outcome?;

    let runs = &demo.seen.runs;
    let executions: usize = runs.values().map(Vec::len).sum();
    let duplicates = runs.values().filter(|r| r.len() > 1).count();
    let (first, last) = (
        runs.keys().next().copied().unwrap_or(0),
        runs.keys().last().copied().unwrap_or(0),
    );
    // Slots are firing times in ms, one every `--every`.
    let step = u64::try_from(args.every.as_millis())
        .unwrap_or(u64::MAX)
        .max(1);
    let due = if runs.is_empty() {
        0
    } else {
        ((last - first) / step + 1) as usize
    };
    let missed = due.saturating_sub(runs.len());
    let mut per_instance: BTreeMap<&str, usize> = BTreeMap::new();
    for holder in runs.values().flatten() {
        *per_instance.entry(holder.as_str()).or_default() += 1;
    }
    outln!("")?;
    outln!("summary")?;
    outln!("  ticks run            {}", runs.len())?;
    outln!("  executions           {executions}")?;
    outln!("  duplicate ticks      {duplicates}   (must be 0)")?;
    outln!(
        "  run again            {}   (slots cut off by the SIGKILL, run again by the next leader)",
        demo.seen.run_again.len()
    )?;
    outln!(
        "  missed ticks         {missed}   (those that fell while the killed leader's lease ran out)"
    )?;
    for (who, n) in per_instance {
        outln!("  runs on {who:<12} {n}")?;
    }
    outln!(
        "  takeover after SIGKILL          {:>7.0} ms   (bounded by the ttl, {:?})",
        kill_takeover.as_secs_f64() * 1e3,
        args.ttl
    )?;
    outln!(
        "  handoff after graceful stop     {:>7.0} ms   (release, then notification)",
        handoff.as_secs_f64() * 1e3
    )?;
    if duplicates > 0 {
        outln!("")?;
        outln!("FAILED: a tick ran more than once")?;
        return Ok(1);
    }
    Ok(0)
}

async fn phases(args: &DemoArgs, demo: &mut Demo) -> anyhow::Result<(Duration, Duration)> {
    let phase = args.every * args.ticks;
    let (leader, _) = demo.wait_for_leader(None, args.ttl * 3).await?;
    demo.watch_for(phase).await?;

    let leader = demo.seen.leader.clone().unwrap_or(leader);
    // In the middle of a run, as a crash would come: that run never writes.
    let killed = demo.wait_for_run(&leader, args.every * 2).await?;
    demo.signal(&leader, Signal::SIGKILL)?;
    let during = match killed {
        Some(token) => format!(" during its run (fencing token {token})"),
        None => String::new(),
    };
    outln!(
        "{} >>> SIGKILL {leader} (the leader){during}: it cannot release; the others wait for its lease to expire",
        stamp(demo.started)
    )?;
    demo.seen.killed_token = killed;
    let (next, kill_takeover) = demo.wait_for_leader(Some(&leader), args.ttl * 3).await?;
    outln!(
        "{} >>> {next} took over {:.0} ms after the kill",
        stamp(demo.started),
        kill_takeover.as_secs_f64() * 1e3
    )?;
    demo.watch_for(phase).await?;

    let leader = demo.seen.leader.clone().unwrap_or(next);
    outln!(
        "{} >>> SIGTERM {leader}: it takes no new tick, lets a run in progress finish (--drain), releases the lease and exits",
        stamp(demo.started)
    )?;
    let stop_at = Instant::now();
    demo.signal(&leader, Signal::SIGTERM)?;
    let (next, _) = demo.wait_for_leader(Some(&leader), args.ttl * 3).await?;
    let handoff = stop_at.elapsed();
    outln!(
        "{} >>> {next} took over {:.0} ms after the stop",
        stamp(demo.started),
        handoff.as_secs_f64() * 1e3
    )?;
    demo.watch_for(phase).await?;
    Ok((kill_takeover, handoff))
}
