//! Tasks spread over replicas (`Scheduler::spread`), measured with real processes: how evenly
//! the tasks land, and how long a SIGKILLed replica's tasks take to run elsewhere.
//!
//! ```sh
//! # 100 tasks on 10 replicas sharing a Redis; SIGKILL one and time the takeover
//! cargo run --release -p leasehold-examples --bin spread -- bench --store redis://127.0.0.1:6379
//! ```
//!
//! `bench` starts the replicas as child processes of its own binary (`spread replica ...`), reads
//! what each prints (the tasks it owns, the members it sees, each run), and prints the figures.
//! It exits non-zero if a slot ran twice, a task never settled on one owner, or the killed
//! replica's tasks did not move. A replica exits when its stdin closes, so none outlives `bench`.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use leasehold::{
    HolderId, LeaseConfig, LeaseName, Schedule, Scheduler, StoreDownPolicy, Task, TaskContext,
};

#[derive(clap::Parser)]
enum Mode {
    /// Start replicas, wait until the tasks are spread, SIGKILL one, print the figures.
    Bench(BenchOptions),
    /// One replica (started by `bench`): prints `owned`, `members` and `ran` lines.
    Replica(ReplicaOptions),
}

#[derive(clap::Args, Clone)]
struct Common {
    /// Store URL [default: $LEASEHOLD_STORE, else sqlite:leasehold.db].
    #[arg(long)]
    store: Option<String>,
    /// How many tasks.
    #[arg(long, default_value_t = 100)]
    tasks: usize,
    /// Each task's interval.
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    every: Duration,
    /// Lease and membership ttl: a killed replica drops out this long after its last heartbeat.
    #[arg(long, default_value = "3s", value_parser = humantime::parse_duration)]
    ttl: Duration,
    /// Names the group and the tasks, so runs do not meet earlier ones in the store.
    #[arg(long)]
    run: Option<String>,
}

#[derive(clap::Args)]
struct BenchOptions {
    #[command(flatten)]
    common: Common,
    /// How many replicas.
    #[arg(long, default_value_t = 10)]
    replicas: usize,
    /// How long to watch the spread tasks run before the kill.
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    watch: Duration,
}

#[derive(clap::Args)]
struct ReplicaOptions {
    #[command(flatten)]
    common: Common,
    /// This replica's holder id.
    #[arg(long)]
    name: String,
}

fn task_name(run: &str, i: usize) -> String {
    format!("{run}-task-{i:03}")
}

fn say(line: String) {
    let mut out = std::io::stdout().lock();
    // The bench reads these lines; if it is gone, so is the point of running.
    if writeln!(out, "{line}").and_then(|()| out.flush()).is_err() {
        std::process::exit(0);
    }
}

async fn replica(o: ReplicaOptions) -> Result<(), Box<dyn std::error::Error>> {
    let run = o.common.run.unwrap_or_else(|| "spread".to_owned());
    let store =
        leasehold_connect::open_store(&leasehold_connect::store_url(o.common.store)).await?;
    let mut scheduler = Scheduler::new(store)
        .holder(HolderId::new(&o.name)?)
        .spread(LeaseName::new(format!("{run}-group"))?)
        .lease_config(LeaseConfig::new(o.common.ttl))
        .on_store_down(StoreDownPolicy::FailClosed)
        .grace_period(Duration::from_secs(1));
    for i in 0..o.common.tasks {
        let task = Task::new(
            LeaseName::new(task_name(&run, i))?,
            Schedule::every(o.common.every)?,
            move |ctx: TaskContext| async move {
                say(format!(
                    "ran {i} {} {} {}",
                    ctx.slot.unwrap_or(0),
                    ctx.trigger.as_str(),
                    ctx.attempt
                ));
                Ok::<(), std::io::Error>(())
            },
        );
        scheduler = scheduler.task(task);
    }
    // Stop when the bench closes our stdin (or dies).
    let stdin_closed = async {
        let _ = tokio::task::spawn_blocking(|| {
            let mut sink = Vec::new();
            let _ = std::io::Read::read_to_end(&mut std::io::stdin(), &mut sink);
        })
        .await;
    };
    let handle = scheduler.start(stdin_closed)?;
    let (mut owned_before, mut members_before) = (None, None);
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    loop {
        tokio::select! {
            () = handle.wait() => return Ok(()),
            _ = tick.tick() => {}
        }
        let status = handle.status();
        let owned: Vec<String> = status
            .tasks
            .iter()
            .filter(|t| t.owned == Some(true))
            .filter_map(|t| t.name.as_str().rsplit('-').next().map(str::to_owned))
            .collect();
        if owned_before.as_ref() != Some(&owned) {
            say(format!("owned {}", owned.join(",")));
            owned_before = Some(owned);
        }
        let members = status.members.map_or(0, |m| m.len());
        if members_before != Some(members) {
            say(format!("members {members}"));
            members_before = Some(members);
        }
    }
}

/// A line a replica printed, and when it arrived.
struct Line {
    replica: usize,
    at: Instant,
    text: String,
}

/// What the bench knows of each replica, from its lines.
#[derive(Default)]
struct Seen {
    owned: Vec<BTreeSet<usize>>,
    members: Vec<usize>,
    /// (task, slot) -> the runs of it.
    runs: BTreeMap<(usize, u64), Vec<SlotRun>>,
}

/// One run of a slot: the replica that ran it, its trigger and attempt.
struct SlotRun {
    replica: usize,
    trigger: String,
    attempt: u32,
}

impl Seen {
    fn take(&mut self, line: &Line) {
        let mut words = line.text.split(' ');
        match (words.next(), words.next(), words.next(), words.next()) {
            (Some("owned"), list, _, _) => {
                self.owned[line.replica] = list
                    .unwrap_or("")
                    .split(',')
                    .filter_map(|t| t.parse().ok())
                    .collect();
            }
            (Some("members"), Some(n), _, _) => {
                self.members[line.replica] = n.parse().unwrap_or(0);
            }
            (Some("ran"), Some(task), Some(slot), Some(trigger)) => {
                let attempt = words.next().and_then(|a| a.parse().ok()).unwrap_or(1);
                if let (Ok(task), Ok(slot)) = (task.parse(), slot.parse()) {
                    self.runs.entry((task, slot)).or_default().push(SlotRun {
                        replica: line.replica,
                        trigger: trigger.to_owned(),
                        attempt,
                    });
                }
            }
            _ => {}
        }
    }

    /// Every task owned by exactly one of `alive`, each of which sees `alive.len()` members.
    fn settled(&self, alive: &[usize], tasks: usize) -> bool {
        let mut count = vec![0; tasks];
        for &r in alive {
            if self.members[r] != alive.len() {
                return false;
            }
            for &t in &self.owned[r] {
                if let Some(c) = count.get_mut(t) {
                    *c += 1;
                }
            }
        }
        count.iter().all(|&c| c == 1)
    }
}

struct Replicas(Vec<Child>);

impl Drop for Replicas {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn millis(d: Duration) -> String {
    format!("{:.0} ms", d.as_secs_f64() * 1000.0)
}

fn bench(o: BenchOptions) -> Result<bool, Box<dyn std::error::Error>> {
    let c = &o.common;
    let run = c
        .run
        .clone()
        .unwrap_or_else(|| format!("spread{:08x}", fastrand_u32()));
    let store = leasehold_connect::store_url(c.store.clone());
    let exe = std::env::current_exe()?;
    let (tx, rx) = mpsc::channel::<Line>();
    let mut children = Replicas(Vec::new());
    for r in 0..o.replicas {
        let mut child = Command::new(&exe)
            .args(["replica", "--store", &store, "--run", &run, "--name"])
            .arg(format!("{run}-r{r}"))
            .args(["--tasks", &c.tasks.to_string()])
            .args(["--every", &humantime::format_duration(c.every).to_string()])
            .args(["--ttl", &humantime::format_duration(c.ttl).to_string()])
            .env("LEASEHOLD_LOG", "warn")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()?;
        let out = child.stdout.take().ok_or("no stdout")?;
        let tx = tx.clone();
        std::thread::spawn(move || {
            for text in BufReader::new(out).lines().map_while(Result::ok) {
                let line = Line {
                    replica: r,
                    at: Instant::now(),
                    text,
                };
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        children.0.push(child);
    }
    drop(tx);
    let mut seen = Seen {
        owned: vec![BTreeSet::new(); o.replicas],
        members: vec![0; o.replicas],
        ..Seen::default()
    };
    let started = Instant::now();
    let alive: Vec<usize> = (0..o.replicas).collect();
    // Settle: every replica sees every other and each task has one owner.
    let limit = started + c.ttl * 4 + Duration::from_secs(20);
    while !seen.settled(&alive, c.tasks) {
        let Ok(line) = rx.recv_timeout(limit.saturating_duration_since(Instant::now())) else {
            println!(
                "FAIL: the tasks did not settle on one owner each within {limit:?}",
                limit = limit - started
            );
            return Ok(false);
        };
        seen.take(&line);
    }
    println!(
        "{} replicas, {} tasks every {}, ttl {}, store {}",
        o.replicas,
        c.tasks,
        humantime::format_duration(c.every),
        humantime::format_duration(c.ttl),
        store
    );
    println!(
        "settled (every replica sees {} members, each task one owner) {} after start",
        o.replicas,
        millis(started.elapsed())
    );
    let per: Vec<usize> = seen.owned.iter().map(BTreeSet::len).collect();
    let (min, max) = (
        per.iter().min().copied().unwrap_or(0),
        per.iter().max().copied().unwrap_or(0),
    );
    let mean = c.tasks as f64 / o.replicas as f64;
    println!(
        "tasks per replica: min {min}, max {max}, mean {mean:.1}; max/mean {:.2} (target <= 2: {})",
        max as f64 / mean,
        if max as f64 <= 2.0 * mean {
            "pass"
        } else {
            "miss"
        }
    );
    println!("  per replica: {per:?}");
    // For one heartbeat interval after its view changes a replica also contends for the tasks
    // it owned before (so a task whose new owner lags is not left unrun); watch after that.
    let handover = Instant::now() + c.ttl / 3;
    while let Ok(line) = rx.recv_timeout(handover.saturating_duration_since(Instant::now())) {
        seen.take(&line);
    }
    // Watch the runs: each should come from its task's owner.
    let watch_from = Instant::now();
    let owners: HashMap<usize, usize> = seen
        .owned
        .iter()
        .enumerate()
        .flat_map(|(r, ts)| ts.iter().map(move |&t| (t, r)))
        .collect();
    let mut foreign = 0;
    while watch_from.elapsed() < o.watch {
        if let Ok(line) = rx.recv_timeout(Duration::from_millis(50)) {
            seen.take(&line);
            let task = line
                .text
                .strip_prefix("ran ")
                .and_then(|s| s.split(' ').next());
            if let Some(t) = task
                && t.parse().ok().and_then(|t: usize| owners.get(&t)) != Some(&line.replica)
            {
                foreign += 1;
            }
        }
    }
    println!(
        "runs in a {} watch by a replica not owning the task: {foreign}",
        humantime::format_duration(o.watch)
    );
    // SIGKILL the replica owning the most tasks.
    let victim = (0..o.replicas).max_by_key(|&r| per[r]).unwrap_or(0);
    let moved: BTreeSet<usize> = seen.owned[victim].clone();
    let killed = Instant::now();
    children.0[victim].kill()?;
    let alive: Vec<usize> = (0..o.replicas).filter(|&r| r != victim).collect();
    let mut view_changed = None;
    let mut first_run: HashMap<usize, Duration> = HashMap::new();
    let limit = killed + c.ttl * 3 + c.every * 2 + Duration::from_secs(5);
    while first_run.len() < moved.len() || view_changed.is_none() {
        let Ok(line) = rx.recv_timeout(limit.saturating_duration_since(Instant::now())) else {
            break;
        };
        seen.take(&line);
        if line.replica == victim {
            continue;
        }
        if view_changed.is_none() && alive.iter().all(|&r| seen.members[r] == alive.len()) {
            view_changed = Some(line.at - killed);
        }
        let mut words = line.text.split(' ');
        if let (Some("ran"), Some(Ok(task))) = (words.next(), words.next().map(str::parse::<usize>))
            && moved.contains(&task)
        {
            first_run.entry(task).or_insert(line.at - killed);
        }
    }
    // A little longer, so duplicates of the slots around the takeover would show.
    let tail = Instant::now() + c.every * 2;
    while let Ok(line) = rx.recv_timeout(tail.saturating_duration_since(Instant::now())) {
        seen.take(&line);
    }
    let takeover_max = first_run.values().max().copied();
    let takeover_min = first_run.values().min().copied();
    println!(
        "SIGKILL of replica {victim} (owning {} tasks):",
        moved.len()
    );
    match view_changed {
        Some(d) => println!(
            "  every survivor sees {} members after {}",
            alive.len(),
            millis(d)
        ),
        None => println!("  survivors did not all see the member drop out"),
    }
    match (takeover_min, takeover_max) {
        (Some(lo), Some(hi)) if first_run.len() == moved.len() => println!(
            "  its {} tasks ran elsewhere after {} (first) to {} (last); bound ttl + ttl/3 + interval = {}",
            moved.len(),
            millis(lo),
            millis(hi),
            millis(c.ttl + c.ttl / 3 + c.every)
        ),
        _ => println!(
            "  only {} of its {} tasks ran elsewhere",
            first_run.len(),
            moved.len()
        ),
    }
    // A slot whose run the SIGKILL cut off (started on the victim, its end never recorded) is
    // run again by the next holder as attempt 2, trigger retry: at least once for cut-off runs.
    // Any other second run of a slot is a duplicate.
    let rerun = |runs: &[SlotRun]| {
        let [first, again] = runs else { return false };
        first.replica == victim
            && again.replica != victim
            && again.trigger == "retry"
            && again.attempt > 1
    };
    let duplicates = seen
        .runs
        .values()
        .filter(|r| r.len() > 1 && !rerun(r))
        .count();
    let reruns = seen.runs.values().filter(|r| rerun(r)).count();
    println!(
        "slots run twice: {duplicates} (of {} slots run; cut off by the SIGKILL and run again: {reruns})",
        seen.runs.len()
    );
    let ok = duplicates == 0 && first_run.len() == moved.len() && view_changed.is_some();
    println!("{}", if ok { "ok" } else { "FAIL" });
    drop(children);
    Ok(ok)
}

/// A run id that differs between runs.
fn fastrand_u32() -> u32 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    nanos ^ std::process::id().rotate_left(16)
}

fn main() -> std::process::ExitCode {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("LEASEHOLD_LOG")
                .unwrap_or_else(|_| "info".into()),
        )
        .init();
    let result = match <Mode as clap::Parser>::parse() {
        Mode::Bench(o) => bench(o),
        Mode::Replica(o) => tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .map_err(Into::into)
            .and_then(|rt| rt.block_on(replica(o)).map(|()| true)),
    };
    match result {
        Ok(true) => std::process::ExitCode::SUCCESS,
        Ok(false) => std::process::ExitCode::FAILURE,
        Err(e) => {
            eprintln!("spread: {e}");
            std::process::ExitCode::from(2)
        }
    }
}
