//! Every bad input is one line on stderr and a non-zero exit, never a panic.

use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_leasehold");

fn fails_in_one_line(args: &[&str], expect: &str) {
    fails_in_one_line_in(tempfile::tempdir().unwrap().path(), args, expect);
}

/// [`fails_in_one_line`] in `dir`.
fn fails_in_one_line_in(dir: &std::path::Path, args: &[&str], expect: &str) {
    let out = Command::new(BIN)
        .args(args)
        .current_dir(dir)
        .env_remove("LEASEHOLD_STORE")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{args:?} succeeded");
    assert_ne!(out.status.code(), Some(101), "{args:?} panicked: {stderr}");
    assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(
        lines.len(),
        1,
        "{args:?} printed {} lines: {stderr}",
        lines.len()
    );
    assert!(
        lines[0].starts_with("leasehold: error: "),
        "{args:?}: {stderr}"
    );
    assert!(
        lines[0].contains(expect),
        "{args:?}: {stderr} lacks {expect:?}"
    );
}

/// `leasehold run --every 1s EXTRA -- true`, on a SQLite file unless EXTRA names a store.
fn run(extra: &[&str]) -> Vec<String> {
    let mut v: Vec<String> = ["run", "--every", "1s"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    if !extra.contains(&"--store") {
        v.extend(["--store".to_owned(), "sqlite:t.db".to_owned()]);
    }
    v.extend(extra.iter().map(|s| s.to_string()));
    v.extend(["--", "true"].iter().map(|s| s.to_string()));
    v
}

fn check(extra: &[&str], expect: &str) {
    let args = run(extra);
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    fails_in_one_line(&refs, expect);
}

#[test]
fn empty_lease_name() {
    check(&["--lease", ""], "lease name is empty");
}

#[test]
fn over_long_lease_name() {
    check(
        &["--lease", &"x".repeat(200)],
        "200 bytes long, the limit is 128",
    );
}

#[test]
fn ill_formed_lease_name() {
    check(&["--lease", "has space"], "use only letters, digits");
}

#[test]
fn zero_ttl() {
    check(
        &["--lease", "a", "--ttl", "0s"],
        "ttl must be greater than zero",
    );
}

#[test]
fn renew_not_below_ttl() {
    check(
        &["--lease", "a", "--ttl", "3s", "--renew", "3s"],
        "must be greater than zero and less than the ttl",
    );
}

#[test]
fn retry_above_renew() {
    check(
        &[
            "--lease", "a", "--ttl", "3s", "--renew", "1s", "--retry", "2s",
        ],
        "retry interval",
    );
}

#[test]
fn unknown_url_scheme() {
    check(
        &[
            "--lease",
            "a",
            "--store",
            "mssql://root:hunter2@localhost/db",
        ],
        "unknown store URL scheme",
    );
    // And the password is not echoed.
    let out = Command::new(BIN)
        .args(run(&[
            "--lease",
            "a",
            "--store",
            "mssql://root:hunter2@localhost/db",
        ]))
        .output()
        .unwrap();
    assert!(!String::from_utf8_lossy(&out.stderr).contains("hunter2"));
}

/// MySQL refusals through the CLI (a flock opens its store at once): a wrong password, a
/// missing database and a bad `ssl-mode` are each one line naming the cause, without the
/// password.
#[test]
fn mysql_refusals() {
    let url = std::env::var("LEASEHOLD_TEST_MYSQL_URL")
        .unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".to_owned());
    let host = url
        .strip_prefix("mysql://")
        .and_then(|rest| rest.split_once('@').map_or(Some(rest), |(_, h)| Some(h)))
        .and_then(|h| h.split_once('/').map(|(h, _)| h))
        .expect("a mysql://[user@]host/db test URL")
        .to_owned();
    for (store, expect) in [
        (
            format!("mysql://lh_nobody:s3cretpw@{host}/test"),
            "Access denied",
        ),
        (
            format!("{}/lh_no_such_database", url.rsplit_once('/').unwrap().0),
            "Unknown database",
        ),
        (
            format!("mysql://root:s3cretpw@{host}/test?ssl-mode=preferred"),
            "ssl-mode=preferred",
        ),
    ] {
        let args = ["run", "--lease", "a", "--store", &store, "--", "true"];
        fails_in_one_line(&args, expect);
        let out = Command::new(BIN).args(args).output().unwrap();
        assert!(!String::from_utf8_lossy(&out.stderr).contains("s3cretpw"));
    }
}

#[test]
fn unreachable_store() {
    // A flock needs its store now; a scheduled run would wait for it (tests/store_down.rs).
    let args = [
        "run",
        "--lease",
        "a",
        "--store",
        "redis://:s3cretpw@127.0.0.1:1",
        "--",
        "true",
    ];
    fails_in_one_line(&args, "cannot open the redis store");
    let out = Command::new(BIN).args(args).output().unwrap();
    assert_eq!(out.status.code(), Some(69));
    // The cause is named, once.
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.matches("Connection refused").count(), 1, "{stderr}");
    assert!(!String::from_utf8_lossy(&out.stderr).contains("s3cretpw"));
}

/// A store URL the store cannot parse is bad input (exit 2, like an unknown scheme), not a
/// store that is down (69), whichever command is given it; its cause is named once.
#[test]
fn unparsable_store_urls_are_bad_input() {
    for url in [
        "redis://h:notaport",
        "redis+sentinel://h:26379",
        "postgres://h:notaport/db",
        "etcd://",
        "sqlite:",
    ] {
        let commands: [&[&str]; 5] = [
            &["run", "--lease", "a", "--store", url, "--", "true"],
            &[
                "run", "--lease", "a", "--every", "1s", "--store", url, "--", "true",
            ],
            &["status", "--store", url, "a"],
            &["history", "--store", url, "a"],
            &["serve", "--listen", "127.0.0.1:0", "--store", url],
        ];
        for args in commands {
            fails_in_one_line(args, "cannot open the");
            let out = Command::new(BIN).args(args).output().unwrap();
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
            // No part of the message is said twice.
            let parts: Vec<&str> = stderr.trim().split(": ").collect();
            for (i, part) in parts.iter().enumerate() {
                assert!(
                    part.len() < 12 || !parts[i + 1..].iter().any(|p| p.contains(part)),
                    "{args:?}: {part:?} repeated in {stderr}"
                );
            }
        }
    }
}

#[test]
fn bad_duration() {
    check(&["--lease", "a", "--ttl", "ten"], "invalid duration");
}

#[test]
fn bad_cron() {
    fails_in_one_line(
        &[
            "run",
            "--store",
            "sqlite:t.db",
            "--lease",
            "a",
            "--cron",
            "every day",
            "--",
            "true",
        ],
        "invalid cron expression",
    );
}

#[test]
fn bad_policy() {
    check(
        &["--lease", "a", "--on-store-down", "maybe"],
        "unknown store-down policy",
    );
}

#[test]
fn missing_command() {
    fails_in_one_line(&["run", "--lease", "a", "--every", "1s"], "required");
}

/// A directory holding the store `sqlite:t.db`, made by a flock (the read commands do not
/// create one).
fn with_a_store() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let made = Command::new(BIN)
        .args([
            "run",
            "--store",
            "sqlite:t.db",
            "--lease",
            "seed",
            "--",
            "true",
        ])
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert!(made.status.success(), "{made:?}");
    dir
}

/// Without names, status lists the store's catalog (issue 25): an empty one says so.
#[test]
fn status_without_names_lists_the_catalog() {
    let dir = with_a_store();
    let out = Command::new(BIN)
        .args(["status", "--store", "sqlite:t.db"])
        .current_dir(dir.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    assert!(stdout.contains("no tasks in the catalog"), "{stdout}");
}

#[test]
fn control_without_a_task_name() {
    for command in ["pause", "resume", "trigger"] {
        fails_in_one_line(&[command, "--store", "sqlite:t.db"], "<NAME>");
    }
    fails_in_one_line(
        &["trigger", "--store", "sqlite:t.db", "x", "--wait=2d"],
        "above the maximum",
    );
    // A bare --wait before the name does not take the name for a duration.
    fails_in_one_line_in(
        with_a_store().path(),
        &["trigger", "--store", "sqlite:t.db", "--wait", "x"],
        "no task x",
    );
}

/// Issue 18 case 7: durations beyond a sane bound are usage errors, not a panic or a timer
/// that never fires.
#[test]
fn durations_out_of_bounds() {
    check(
        &["--lease", "a", "--ttl", "99999999999999999h"],
        "invalid value",
    );
    check(&["--lease", "a", "--ttl", "2d"], "above the maximum");
    let huge_every = ["run", "--lease", "a", "--every", "400d", "--", "true"];
    fails_in_one_line(&huge_every, "above the maximum");
}

/// `--grace` is the lease's stop margin: it must leave time to renew.
#[test]
fn grace_too_large_for_the_ttl() {
    check(
        &["--lease", "a", "--ttl", "5s", "--grace", "4s"],
        "--grace 4s leaves no time to renew",
    );
}

#[test]
fn catch_up_without_a_schedule() {
    let args = ["run", "--lease", "a", "--catch-up", "all", "--", "true"];
    fails_in_one_line(&args, "--catch-up needs a schedule");
}

#[test]
fn drain_without_a_schedule() {
    let args = ["run", "--lease", "a", "--drain", "5s", "--", "true"];
    fails_in_one_line(&args, "--drain needs a schedule");
}

/// `args` fails in one line naming `expect`, with the usage status (2) every bad flag gets.
#[cfg(any(feature = "bench", feature = "chaos"))]
fn usage_exit(args: &[&str], expect: &str) {
    fails_in_one_line(args, expect);
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(BIN)
        .args(args)
        .current_dir(dir.path())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
}

/// `leasehold bench` refuses flags it cannot use with exit 2 (it exited 1, as for a store that
/// could not be measured), before measuring anything.
#[cfg(feature = "bench")]
#[test]
fn bench_flags_it_cannot_use_exit_2() {
    usage_exit(
        &["bench", "--stores", "memory", "--rounds", "0"],
        "--rounds must be at least 1",
    );
    usage_exit(
        &[
            "bench",
            "--stores",
            "memory,etcd",
            "--etcd-url",
            "etcds://127.0.0.1:1",
        ],
        "plain HTTP without authentication",
    );
}

/// `leasehold chaos` refuses flags it cannot use with exit 2 (it exited 1, as for a run whose
/// guarantees did not hold).
#[cfg(feature = "chaos")]
#[test]
fn chaos_flags_it_cannot_use_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run");
    let out = out.to_str().unwrap();
    let chaos = |extra: &[&'static str]| {
        let mut args = vec!["chaos", "--out", out];
        args.extend_from_slice(extra);
        args
    };
    usage_exit(
        &chaos(&["--store", "sqlite", "--replicas", "1"]),
        "--replicas must be at least 2",
    );
    usage_exit(
        &chaos(&["--store", "sqlite", "--duration", "5s"]),
        "--duration must be at least 10s",
    );
    usage_exit(
        &chaos(&[
            "--store",
            "postgres",
            "--postgres-url",
            "postgres://u@192.0.2.1/db",
        ]),
        "not a loopback address",
    );
}
