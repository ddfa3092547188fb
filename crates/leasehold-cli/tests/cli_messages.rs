//! What the command line says when it is used wrongly, or when its reader goes away: clap's
//! messages keep what they name (issue 31: `status` without names printed "the following
//! required arguments were not provided:" and nothing after it), on one line; a closed stdout
//! (`leasehold history … | head -1`) ends the command quietly instead of panicking.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

/// Runs `leasehold ARGS` and returns its one stderr line; fails unless it exits 2 with exactly
/// one line that contains every one of `names` and points at `help`.
fn usage_line(args: &[&str], names: &[&str], help: &str) -> String {
    let dir = temp_dir();
    let out = Command::new(BIN)
        .args(args)
        .current_dir(dir.path())
        .env_remove("LEASEHOLD_STORE")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(
        lines.len(),
        1,
        "{args:?} printed {} lines: {stderr}",
        lines.len()
    );
    for name in names {
        assert!(lines[0].contains(name), "{args:?}: {stderr} lacks {name:?}");
    }
    assert!(
        lines[0].ends_with(&format!("(see {help})")),
        "{args:?}: {stderr} does not point at {help:?}"
    );
    lines[0].to_owned()
}

#[test]
fn missing_arguments_are_named_for_every_subcommand() {
    let cases: &[(&[&str], &[&str], &str)] = &[
        (
            &["run"],
            &["--lease <LEASE>", "<COMMAND>"],
            "leasehold run --help",
        ),
        (
            &["run", "--lease", "a", "--every", "1s"],
            &["<COMMAND>"],
            "leasehold run --help",
        ),
        (
            &["run", "--", "true"],
            &["--lease <LEASE>"],
            "leasehold run --help",
        ),
        (&["history"], &["<TASK>"], "leasehold history --help"),
        (
            &["history", "--store"],
            &["--store <STORE>"],
            "leasehold history --help",
        ),
        (
            &["status", "--store"],
            &["--store <STORE>"],
            "leasehold status --help",
        ),
        (
            &["serve", "--listen"],
            &["--listen <LISTEN>"],
            "leasehold serve --help",
        ),
        (
            &["demo", "--ttl"],
            &["--ttl <TTL>"],
            "leasehold demo --help",
        ),
        (
            &["witness"],
            &["--ledger <LEDGER>", "--fence <FENCE>"],
            "leasehold witness --help",
        ),
        (&["supervise"], &["<COMMAND>"], "leasehold supervise --help"),
        (&["next"], &["--cron <CRON>"], "leasehold next --help"),
        (
            &["next", "--cron"],
            &["--cron <CRON>"],
            "leasehold next --help",
        ),
        (
            &[],
            &["a command is required: run, status"],
            "leasehold --help",
        ),
    ];
    for (args, names, help) in cases {
        let line = usage_line(args, names, help);
        assert!(
            line.contains("not provided") || line.contains("required"),
            "{line}"
        );
    }
    #[cfg(feature = "chaos")]
    usage_line(&["chaos"], &["--store <STORE>"], "leasehold chaos --help");
}

#[test]
fn other_clap_errors_keep_their_detail_on_one_line() {
    usage_line(
        &[
            "run", "--lease", "a", "--every", "1s", "--bogus", "--", "true",
        ],
        &[
            "'--bogus'",
            "tip: to pass '--bogus' as a value, use '-- --bogus'",
        ],
        "leasehold run --help",
    );
    usage_line(
        &["run", "--lease", "a", "--ttl", "abc", "--", "true"],
        &["'abc'", "--ttl <TTL>", "invalid duration"],
        "leasehold run --help",
    );
    usage_line(&["bogus"], &["'bogus'"], "leasehold --help");
    usage_line(
        &["status", "--json=3", "a"],
        &["'3'", "--json"],
        "leasehold status --help",
    );
}

/// `trigger NAME --wait 20s` (issue 43): `--wait` takes its duration only after an `=` (so
/// `trigger --wait NAME` never reads the name as one); the error says to write `--wait=20s`,
/// whichever side of the name the duration is on. A word that is no duration gets no such tip.
#[test]
fn a_wait_duration_without_equals_points_to_the_equals_form() {
    for args in [
        &[
            "trigger",
            "--store",
            "sqlite:t.db",
            "sweep",
            "--wait",
            "20s",
        ][..],
        &[
            "trigger",
            "--store",
            "sqlite:t.db",
            "--wait",
            "20s",
            "sweep",
        ],
        &["trigger", "sweep", "--wait", "20s", "--by", "ops"],
    ] {
        let line = usage_line(
            args,
            &["unexpected argument", "write --wait=20s"],
            "leasehold trigger --help",
        );
        assert_eq!(line.matches("--wait=20s").count(), 1, "{line}");
    }
    let line = usage_line(
        &["trigger", "sweep", "--wait", "soon"],
        &["'soon'"],
        "leasehold trigger --help",
    );
    assert!(!line.contains("--wait="), "{line}");
}

/// `leasehold history … | head -1`, `status … | head -1`, `next … | head -1`: the reader has
/// gone, so the command stops without a word (no panic, no backtrace) and exits 0.
#[test]
fn a_closed_stdout_ends_status_history_and_next_quietly() {
    let dir = temp_dir();
    let store = format!("sqlite:{}", dir.path().join("s.db").display());
    let made = Command::new(BIN)
        .args(["run", "--store", &store, "--lease", "t", "--", "true"])
        .output()
        .unwrap();
    assert!(made.status.success(), "{made:?}");
    for args in [
        vec!["history", "--store", &store, "t"],
        vec!["status", "--store", &store, "t"],
        vec!["next", "--cron", "0 3 * * *", "-n", "50"],
    ] {
        let out = Command::new(BIN)
            .args(&args)
            .stdout(closed_pipe())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{args:?}: {stderr}");
        assert!(stderr.is_empty(), "{args:?}: {stderr}");
    }
}

/// `leasehold demo | head`: once the reader is gone, the demo stops its instances and exits 0;
/// nothing is left running.
#[test]
fn a_closed_stdout_ends_the_demo_and_its_instances() {
    let dir = temp_dir();
    let mut demo = Command::new(BIN)
        .args(["demo", "--dir"])
        .arg(dir.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Read until the instances run (a timestamped line), then go, as `head` does.
    let mut reader = BufReader::new(demo.stdout.take().unwrap());
    let mut line = String::new();
    while !line.starts_with('[') {
        line.clear();
        assert_ne!(
            reader.read_line(&mut line).unwrap(),
            0,
            "the demo ended early"
        );
    }
    drop(reader);
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = demo.try_wait().unwrap() {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "the demo went on with a closed stdout"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    let stderr = std::io::read_to_string(demo.stderr.take().unwrap()).unwrap();
    assert_eq!(status.code(), Some(0), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    // Every instance wrote its log in the demo's directory; none of them runs any more.
    let ps = Command::new("ps").args(["-eo", "args"]).output().unwrap();
    let dir_text = dir.path().display().to_string();
    let left: Vec<String> = String::from_utf8_lossy(&ps.stdout)
        .lines()
        .filter(|l| l.contains(&dir_text) && l.contains(" run "))
        .map(str::to_owned)
        .collect();
    assert!(left.is_empty(), "instances left running: {left:?}");
}

/// The read end of a pipe that is already closed.
fn closed_pipe() -> Stdio {
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    writer.into()
}

/// A Redis that wants a password, over a unix socket without one: one line (it was the release
/// listener's warning and then the operation's error), exit 78: a refusal, not an outage
/// (issue 32).
#[test]
fn a_redis_that_wants_a_password_is_one_line() {
    let dir = temp_dir();
    let socket = dir.path().join("redis.sock").display().to_string();
    let _server = leasehold_testkit::redis::OwnRedis::start(&[
        "--requirepass",
        "s3cret",
        "--unixsocket",
        &socket,
        "--unixsocketperm",
        "700",
    ]);
    let url = format!("redis+unix://{socket}");
    for args in [
        vec!["status", "--store", &url, "a"],
        vec!["history", "--store", &url, "a"],
        vec!["run", "--store", &url, "--lease", "a", "--", "true"],
    ] {
        let out = Command::new(BIN).args(&args).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(78), "{args:?}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "{args:?}: {stderr}");
        assert!(stderr.contains("NOAUTH"), "{args:?}: {stderr}");
    }
}

/// The libpq `key=value` form the PostgreSQL README documents is a store URL like the others
/// (issue 31: it was `unknown store URL scheme ""`): a flock runs on it, status and history read
/// through it.
#[test]
fn a_key_value_connection_string_is_a_postgres_store() {
    let url = std::env::var("LEASEHOLD_TEST_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned());
    // postgres://USER@HOST:PORT/DB, as the test environment gives it.
    let rest = url.split_once("://").unwrap().1;
    let (user, rest) = rest.split_once('@').unwrap();
    let (host_port, db) = rest.split_once('/').unwrap();
    let (host, port) = host_port.split_once(':').unwrap_or((host_port, "5432"));
    let conninfo = format!("host={host} port={port} user={user} dbname={db}");
    let lease = format!("conninfo-{}", std::process::id());
    for args in [
        vec!["run", "--store", &conninfo, "--lease", &lease, "--", "true"],
        vec!["status", "--store", &conninfo, &lease],
        vec!["history", "--store", &conninfo, &lease],
    ] {
        let out = Command::new(BIN).args(&args).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{args:?}: {stderr}");
    }
}
