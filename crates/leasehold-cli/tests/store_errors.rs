//! Store errors as a user sees them (issue 43 item 4), against the real servers and closed
//! ports on loopback: one line, the cause once, then what to do, and the exit codes unchanged
//! (69 down, 78 refused, 2 a bad URL).

mod common;

use common::{code, leasehold};
use leasehold_testkit::free_port;

fn mysql_url() -> String {
    std::env::var("LEASEHOLD_TEST_MYSQL_URL")
        .unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".to_owned())
}

fn postgres_url() -> String {
    std::env::var("LEASEHOLD_TEST_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned())
}

/// `url` with its database (the path after the host) replaced by `database`.
fn with_database(url: &str, database: &str) -> String {
    let (server, _) = url.rsplit_once('/').expect("a URL with a database");
    format!("{server}/{database}")
}

/// `host:port` of a `scheme://[user@]host:port/db` URL.
fn host_of(url: &str) -> String {
    let rest = url.split_once("://").expect("a URL").1;
    let rest = rest.rsplit_once('@').map_or(rest, |(_, r)| r);
    rest.split('/').next().unwrap().to_owned()
}

/// Runs `leasehold ARGS` and returns its exit code and its one stderr line, which must start
/// with `leasehold: error: `.
fn user_sees(args: &[&str]) -> (i32, String) {
    let out = leasehold(args);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "{args:?} printed: {stderr}");
    assert!(lines[0].starts_with("leasehold: error: "), "{stderr}");
    (code(&out), lines[0].to_owned())
}

/// `leasehold run` without a schedule opens its store at once.
fn flock(store: &str) -> (i32, String) {
    user_sees(&["run", "--lease", "a", "--store", store, "--", "true"])
}

/// The line's cause (before the `; `) and what to do (after it).
fn cause_and_step(line: &str) -> (&str, &str) {
    line.rsplit_once("; ")
        .unwrap_or_else(|| panic!("no next step in {line:?}"))
}

#[test]
fn mysql_access_denied_says_it_once_and_what_to_check() {
    let store = format!("mysql://lh_nobody:s3cretpw@{}/test", host_of(&mysql_url()));
    let (code, line) = flock(&store);
    assert_eq!(code, 78, "{line}");
    assert_eq!(line.matches("Access denied").count(), 1, "{line}");
    assert!(
        !line.contains("Server error") && !line.contains("s3cretpw"),
        "{line}"
    );
    let (_, step) = cause_and_step(&line);
    assert!(step.starts_with("check the user, password"), "{line}");
}

#[test]
fn mysql_on_a_closed_port_says_connection_refused_once() {
    let store = format!("mysql://root@127.0.0.1:{}/test", free_port());
    let (code, line) = flock(&store);
    assert_eq!(code, 69, "{line}");
    assert_eq!(line.matches("Input/output error").count(), 1, "{line}");
    assert_eq!(line.matches("Connection refused").count(), 1, "{line}");
    let (_, step) = cause_and_step(&line);
    assert!(step.contains("start the server"), "{line}");
    assert!(step.contains("host and port"), "{line}");
}

#[test]
fn redis_database_that_is_not_a_number_is_named() {
    for args in [
        &[
            "run",
            "--lease",
            "a",
            "--store",
            "redis://127.0.0.1:1/13x",
            "--",
            "true",
        ][..],
        &["status", "--store", "redis://:s3cretpw@127.0.0.1:1/13x"][..],
    ] {
        let (code, line) = user_sees(args);
        assert_eq!(code, 2, "{line}");
        assert!(
            line.contains("the database \"13x\" is not a number"),
            "{line}"
        );
        assert!(line.contains("redis://127.0.0.1:1"), "{line}");
        assert!(!line.contains("InvalidClientConfig"), "{line}");
        assert!(
            !line.contains("unparsable") && !line.contains("s3cretpw"),
            "{line}"
        );
        let (_, step) = cause_and_step(&line);
        assert!(step.starts_with("fix the URL in --store"), "{line}");
    }
}

#[test]
fn a_missing_database_says_how_to_create_it() {
    let cases = [
        (
            with_database(&mysql_url(), "lh_no_such_database"),
            "Unknown database",
            "create it with: mysql -e 'CREATE DATABASE `lh_no_such_database`'",
        ),
        (
            with_database(&postgres_url(), "lh_no_such_database"),
            "FATAL",
            "create it with: createdb 'lh_no_such_database'",
        ),
    ];
    for (store, server_words, create) in cases {
        let (code, line) = flock(&store);
        assert_eq!(code, 78, "{line}");
        // Ours, then the server's, each once; no driver label repeating the server's words.
        assert!(
            line.contains("database \"lh_no_such_database\" does not exist on"),
            "{line}"
        );
        assert!(line.matches(server_words).count() <= 1, "{line}");
        assert!(
            !line.contains("Server error") && !line.contains("db error"),
            "{line}"
        );
        let (_, step) = cause_and_step(&line);
        assert_eq!(step, create, "{line}");
    }
}

/// Redis down: the URL once, then what to do, for a command that opens its store at once
/// (`run` without a schedule) and one that reads it (`status`).
#[test]
fn redis_down_names_the_url_once_and_what_to_do() {
    let port = free_port();
    let store = format!("redis://127.0.0.1:{port}");
    for args in [
        &["run", "--lease", "a", "--store", &store, "--", "true"][..],
        &["status", "--store", &store][..],
    ] {
        let (code, line) = user_sees(args);
        assert_eq!(code, 69, "{line}");
        let shown = format!("redis://127.0.0.1:{port}/0");
        assert_eq!(line.matches(&shown).count(), 1, "{line}");
        assert_eq!(line.matches("Connection refused").count(), 1, "{line}");
        let (_, step) = cause_and_step(&line);
        assert_eq!(
            step, "start the server, or correct the host and port in --store or LEASEHOLD_STORE",
            "{line}"
        );
    }
}

/// Issue 43 item 3: a scheduled run whose store never answers (a typo in its port) gives up
/// after --connect-timeout with exit 69 and one line saying so and what to do, instead of
/// retrying forever; `forever` keeps the old behaviour.
#[test]
fn a_scheduled_run_that_never_connects_gives_up_after_its_connect_timeout() {
    let store = format!("redis://127.0.0.1:{}", free_port());
    let args = [
        "run",
        "--lease",
        "a",
        "--every",
        "1s",
        "--retry",
        "200ms",
        "--store",
        &store,
        "--connect-timeout",
        "2s",
        "--",
        "true",
    ];
    let started = std::time::Instant::now();
    let out = leasehold(&args);
    let took = started.elapsed();
    assert_eq!(code(&out), 69);
    assert!(took >= std::time::Duration::from_secs(2), "{took:?}");
    assert!(took < std::time::Duration::from_secs(15), "{took:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let last = stderr.lines().last().unwrap_or_default();
    assert!(
        last.starts_with("leasehold: error: never connected to redis://127.0.0.1:"),
        "{stderr}"
    );
    assert!(last.contains("within --connect-timeout 2s"), "{last}");
    assert_eq!(last.matches(&format!("{store}/0")).count(), 1, "{last}");
    assert!(
        last.ends_with("(--connect-timeout forever keeps retrying)"),
        "{last}"
    );

    // `forever`: still running after the same time.
    let mut forever = std::process::Command::new(env!("CARGO_BIN_EXE_leasehold"))
        .args(&args[..9])
        .args(["--connect-timeout", "forever", "--", "true"])
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_secs(4));
    assert!(
        forever.try_wait().unwrap().is_none(),
        "exited while retrying"
    );
    forever.kill().unwrap();
    forever.wait().unwrap();
}
