//! `leasehold run` under hostile conditions (issue 18), with real processes: the command and
//! everything it started are gone in time whatever happens to `leasehold` (SIGKILL, a dead log
//! pipe, shutdown, a lost lease), and a store that keeps refusing ends the run with exit 78.
//!
//! Every command here is `sh -c` that ignores SIGTERM and starts a grandchild (`sleep`), the
//! case where killing only the direct child leaves work running beside the next holder's.

mod common;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use leasehold_testkit::redis::OwnRedis;

/// A shell command that ignores SIGTERM, writes its pid and its grandchild's to `dir`, and
/// waits for the grandchild (a 60 s sleep).
fn stubborn(dir: &Path) -> Vec<String> {
    let script = format!(
        "trap '' TERM; sleep 60 & echo $! > {dir}/grandchild.tmp; echo $$ > {dir}/shell.tmp; \
         mv {dir}/grandchild.tmp {dir}/grandchild; mv {dir}/shell.tmp {dir}/shell; wait",
        dir = dir.display()
    );
    vec!["sh".into(), "-c".into(), script]
}

fn alive(pid: i32) -> bool {
    // A killed process stays a zombie until whoever adopted it reaps it (the test harness may
    // be a subreaper): it counts as gone.
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        let state = stat.rsplit_once(')').map(|(_, rest)| rest.trim_start());
        !state.is_some_and(|s| s.starts_with('Z') || s.starts_with('X'))
    })
}

/// The pids of the stubborn command's shell and grandchild, once both are running.
fn started(dir: &Path) -> [i32; 2] {
    let start = Instant::now();
    loop {
        let read = |f: &str| {
            std::fs::read_to_string(dir.join(f))
                .ok()
                .and_then(|s| s.trim().parse::<i32>().ok())
        };
        if let (Some(shell), Some(grandchild)) = (read("shell"), read("grandchild")) {
            return [shell, grandchild];
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "the command did not start"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Waits until none of `pids` is alive; panics after `limit`. Returns how long it took.
fn all_gone(pids: &[i32], limit: Duration) -> Duration {
    let start = Instant::now();
    while pids.iter().any(|&p| alive(p)) {
        assert!(
            start.elapsed() < limit,
            "still running {:?} after {limit:?}: {pids:?}",
            start.elapsed()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    start.elapsed()
}

fn kill(child: &Child, sig: &str) {
    Command::new("kill")
        .args([&format!("-{sig}"), &child.id().to_string()])
        .status()
        .unwrap();
}

fn wait_exit(child: &mut Child, limit: Duration) -> (Option<i32>, Duration) {
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return (status.code(), start.elapsed());
        }
        assert!(
            start.elapsed() < limit,
            "leasehold did not exit within {limit:?}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn leasehold(args: &[&str], command: &[String]) -> Command {
    let mut cmd = Command::new(BIN);
    cmd.arg("run")
        .args(args)
        .arg("--")
        .args(command)
        .stdin(Stdio::null())
        .stdout(Stdio::null());
    cmd
}

fn sqlite(dir: &Path) -> String {
    format!("sqlite:{}", path_str(&dir.join("leases.db")))
}

/// `leasehold run ARGS` (with `--every 1s` if `scheduled`) on a SQLite file in a directory of
/// its own, running the stubborn command; returns the directory, the process and the pids of
/// the command and its grandchild once both started.
fn run_stubborn(args: &[&str], scheduled: bool) -> (tempfile::TempDir, Child, [i32; 2]) {
    let dir = temp_dir();
    let url = sqlite(dir.path());
    let mut all = vec!["--store", url.as_str()];
    all.extend(args);
    if scheduled {
        // Stopped on the first SIGTERM, not drained: these tests are about forwarding it.
        all.extend(["--every", "1s", "--drain", "0"]);
    }
    let run = leasehold(&all, &stubborn(dir.path()))
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let pids = started(dir.path());
    (dir, run, pids)
}

/// Issue 18 case 3: `kill -9` of `leasehold` (or the OOM killer) takes the command and its
/// grandchildren with it: nothing runs on unowned beside the next holder's command.
#[test]
fn sigkill_of_leasehold_kills_the_command_and_its_grandchildren() {
    for scheduled in [false, true] {
        let (_dir, mut run, pids) = run_stubborn(&["--lease", "k"], scheduled);
        kill(&run, "KILL");
        let _ = run.wait();
        let took = all_gone(&pids, Duration::from_secs(3));
        println!("scheduled={scheduled}: command gone {took:?} after SIGKILL of leasehold");
    }
}

/// Issue 18 cases 2 and 6: on SIGTERM the command's whole group gets SIGTERM at once and
/// SIGKILL within `--grace`; shutdown takes at most the grace period (not twice it), and a
/// flock whose command had to be stopped exits 143, a scheduled run 0.
#[test]
fn shutdown_stops_the_group_within_the_grace() {
    for scheduled in [false, true] {
        let (_dir, mut run, pids) = run_stubborn(&["--lease", "g", "--grace", "1s"], scheduled);
        kill(&run, "TERM");
        let (code, took) = wait_exit(&mut run, Duration::from_secs(10));
        assert!(
            pids.iter().all(|&p| !alive(p)),
            "scheduled={scheduled}: the group outlived leasehold"
        );
        println!("scheduled={scheduled}: shutdown took {took:?}, exit {code:?}");
        // One grace period plus process start-up and release slack, well below two.
        assert!(took < Duration::from_millis(1800), "shutdown took {took:?}");
        assert_eq!(code, Some(if scheduled { 0 } else { 143 }));
    }
}

/// Issue 18 case 1: `leasehold run … 2>&1 | logger` whose reader has exited. Every log line
/// now fails with EPIPE; before, the first one panicked inside whichever task logged (the
/// signal task: SIGTERM was then ignored and the command ran on).
#[test]
fn a_dead_log_pipe_does_not_disable_shutdown() {
    let dir = temp_dir();
    let url = sqlite(dir.path());
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let mut run = leasehold(
        &[
            "--store", &url, "--lease", "p", "--every", "200ms", "--grace", "1s", "--drain", "0",
        ],
        &stubborn(dir.path()),
    )
    .env("RUST_LOG", "debug")
    .stderr(writer)
    .spawn()
    .unwrap();
    let pids = started(dir.path());
    // Ticks overlap the running command and are logged (into the dead pipe).
    std::thread::sleep(Duration::from_secs(1));
    assert!(
        run.try_wait().unwrap().is_none(),
        "leasehold died of a log write"
    );
    kill(&run, "TERM");
    let (code, _) = wait_exit(&mut run, Duration::from_secs(10));
    assert_eq!(code, Some(0), "a clean shutdown");
    all_gone(&pids, Duration::from_secs(1));
}

/// Issue 11 case 6: when renewals fail, the command's group gets SIGTERM a grace period before
/// the lease's local deadline and SIGKILL before the deadline itself, so it is gone before the
/// store could grant the lease to anyone else (a ttl after the last renewal was sent, at the
/// latest). `leasehold` then exits non-zero, saying the lease was lost.
#[test]
fn a_lost_lease_stops_the_group_before_the_ttl_runs_out() {
    let dir = temp_dir();
    let mut redis = OwnRedis::start(&[]);
    let url = redis.url();
    let log = dir.path().join("leasehold.log");
    let mut run = leasehold(
        &[
            "--store", &url, "--lease", "lost", "--ttl", "3s", "--grace", "1s", "--retry", "100ms",
        ],
        &stubborn(dir.path()),
    )
    .stderr(std::fs::File::create(&log).unwrap())
    .spawn()
    .unwrap();
    let pids = started(dir.path());
    redis.kill();
    let killed = Instant::now();
    // The last renewal was sent at most a renew interval (1 s) before the kill: its ttl ends at
    // most 3 s after it; the group must be gone by then.
    all_gone(&pids, Duration::from_secs(3));
    let took = killed.elapsed();
    let (code, _) = wait_exit(&mut run, Duration::from_secs(10));
    let stderr = std::fs::read_to_string(&log).unwrap();
    println!("group gone {took:?} after the store died; exit {code:?}\n{stderr}");
    assert_eq!(code, Some(1));
    assert!(stderr.contains("lease lost"), "{stderr}");
}

/// Issue 18 case 5: a key of the wrong type where the lease lives is a refusal no retry can fix:
/// a flock exits 78 at once, a scheduled run after a bounded number of tries, with a clear
/// message, instead of idling forever.
#[test]
fn a_permanent_refusal_ends_the_run_with_78() {
    let redis = OwnRedis::start(&[]);
    let url = redis.url();
    for (lease, scheduled) in [("refused-once", false), ("refused-every", true)] {
        let pushed = redis.cli(&["RPUSH", &format!("leasehold:{{{lease}}}:lease"), "x"]);
        assert_eq!(pushed.trim(), "1", "redis-cli RPUSH");
        let mut args = vec!["--store", url.as_str(), "--lease", lease, "--ttl", "1s"];
        if scheduled {
            args.extend(["--every", "200ms"]);
        }
        let mut cmd = leasehold(&args, &["true".to_owned()]);
        let child = cmd.stderr(Stdio::piped()).spawn().unwrap();
        let start = Instant::now();
        let out = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        println!(
            "scheduled={scheduled}: exit {:?} after {:?}",
            out.status.code(),
            start.elapsed()
        );
        assert_eq!(out.status.code(), Some(78), "{stderr}");
        assert!(stderr.contains("holds a list"), "{stderr}");
        assert!(start.elapsed() < Duration::from_secs(30));
    }
}

/// Issue 32 case 2: a flock whose command exits by itself on the SIGTERM that follows a lost
/// lease (`trap 'exit 0' TERM`) is a run cut short, not a success: `leasehold` exits 1 with one
/// error line, whatever the command returned.
#[test]
fn a_lost_lease_fails_the_flock_whatever_the_command_returns() {
    let dir = temp_dir();
    let mut redis = OwnRedis::start(&[]);
    let url = redis.url();
    let log = dir.path().join("leasehold.log");
    let started = dir.path().join("started");
    let script = format!(
        "trap 'exit 0' TERM; touch {}; while :; do sleep 0.05; done",
        started.display()
    );
    let run = leasehold(
        &[
            "--store", &url, "--lease", "trapped", "--ttl", "3s", "--grace", "1s", "--retry",
            "100ms",
        ],
        &["sh".into(), "-c".into(), script],
    )
    .stderr(std::fs::File::create(&log).unwrap())
    .spawn()
    .unwrap();
    let mut run = KillOnDrop(run);
    let start = Instant::now();
    while !started.exists() {
        assert!(start.elapsed() < Duration::from_secs(20), "no start");
        std::thread::sleep(Duration::from_millis(10));
    }
    redis.kill();
    let (code, took) = wait_exit(&mut run.0, Duration::from_secs(10));
    let stderr = std::fs::read_to_string(&log).unwrap();
    println!("exit {code:?} {took:?} after the store died\n{stderr}");
    assert_eq!(code, Some(1), "{stderr}");
    let errors: Vec<&str> = stderr
        .lines()
        .filter(|l| l.to_lowercase().contains("error:") || l.contains("ERROR"))
        .collect();
    assert_eq!(errors.len(), 1, "one error line: {stderr}");
    assert!(
        errors[0].starts_with("leasehold: error: lease lost while the command ran: trapped"),
        "{stderr}"
    );
}

/// Issue 32: stderr a pipe whose reader is alive but never reads (`leasehold run … 2>&1 |
/// (sleep 1000)`). Once the pipe is full every write would block; `leasehold` must still run,
/// stop and exit (log lines are dropped instead).
#[test]
fn a_stalled_log_pipe_never_keeps_leasehold_from_exiting() {
    use std::io::Write;
    let dir = temp_dir();
    let url = sqlite(dir.path());
    let (reader, writer) = std::io::pipe().unwrap();
    // Fill the pipe: this thread blocks once it is full (until `reader` is dropped at the end).
    let mut filler = writer.try_clone().unwrap();
    std::thread::spawn(move || filler.write_all(&vec![b'x'; 1 << 20]));
    std::thread::sleep(Duration::from_millis(200));
    // A scheduled run that logs at every tick, stopped by SIGTERM.
    let run = leasehold(
        &[
            "--store", &url, "--lease", "stalled", "--every", "200ms", "--grace", "1s", "--drain",
            "0",
        ],
        &stubborn(dir.path()),
    )
    .env("LEASEHOLD_LOG", "debug")
    .stderr(writer.try_clone().unwrap())
    .spawn()
    .unwrap();
    let mut run = KillOnDrop(run);
    let pids = started(dir.path());
    std::thread::sleep(Duration::from_secs(1));
    kill(&run.0, "TERM");
    let (code, took) = wait_exit(&mut run.0, Duration::from_secs(10));
    println!("scheduled: exit {code:?} {took:?} after SIGTERM");
    assert_eq!(code, Some(0));
    all_gone(&pids, Duration::from_secs(1));
    // A flock that ends with an error line (the lease is busy: exit 75 and a line) and one
    // whose command exits 3, with debug logging.
    let holder = leasehold(
        &["--store", &url, "--lease", "stalled-busy"],
        &["sleep".into(), "30".into()],
    )
    .stderr(Stdio::null())
    .spawn()
    .unwrap();
    let _holder = KillOnDrop(holder);
    let busy_since = Instant::now();
    let held = || {
        let out = Command::new(BIN)
            .args(["status", "--store", &url, "stalled-busy", "--json"])
            .output()
            .unwrap();
        serde_json::from_slice::<serde_json::Value>(&out.stdout)
            .is_ok_and(|v| v["leases"][0]["held"] == true)
    };
    while !held() {
        assert!(busy_since.elapsed() < Duration::from_secs(10), "no holder");
        std::thread::sleep(Duration::from_millis(20));
    }
    for (lease, command, expected) in [("stalled-busy", "true", 75), ("stalled-flock", "exit 3", 3)]
    {
        let mut run = KillOnDrop(
            leasehold(
                &["--store", &url, "--lease", lease],
                &["sh".into(), "-c".into(), command.into()],
            )
            .env("LEASEHOLD_LOG", "debug")
            .stderr(writer.try_clone().unwrap())
            .spawn()
            .unwrap(),
        );
        let (code, took) = wait_exit(&mut run.0, Duration::from_secs(10));
        println!("{lease}: exit {code:?} after {took:?}");
        assert_eq!(code, Some(expected), "{lease}");
    }
    drop(reader);
}

/// Issue 32: SIGTERM reaches the command through its supervisor; a frozen supervisor cannot pass
/// it on, so `leasehold` SIGKILLs the group (the frozen supervisor with it) when the grace runs
/// out, and shutdown still takes at most the grace period.
#[test]
fn a_frozen_supervisor_is_killed_with_its_group_on_shutdown() {
    let (_dir, run, pids) = run_stubborn(&["--lease", "frozen-supervisor", "--grace", "1s"], false);
    let mut run = KillOnDrop(run);
    let stat = std::fs::read_to_string(format!("/proc/{}/stat", pids[0])).unwrap();
    let supervisor: i32 = stat
        .rsplit_once(')')
        .and_then(|(_, rest)| rest.split_whitespace().nth(1))
        .and_then(|ppid| ppid.parse().ok())
        .unwrap();
    let cmdline = std::fs::read(format!("/proc/{supervisor}/cmdline")).unwrap();
    assert!(
        String::from_utf8_lossy(&cmdline).contains("supervise"),
        "the command's parent is its supervisor"
    );
    Command::new("kill")
        .args(["-STOP", &supervisor.to_string()])
        .status()
        .unwrap();
    kill(&run.0, "TERM");
    let (code, took) = wait_exit(&mut run.0, Duration::from_secs(10));
    println!("exit {code:?} {took:?} after SIGTERM");
    assert!(
        [supervisor, pids[0], pids[1]].iter().all(|&p| !alive(p)),
        "the group outlived leasehold"
    );
    assert!(took < Duration::from_millis(1800), "shutdown took {took:?}");
    assert_eq!(code, Some(143));
}
