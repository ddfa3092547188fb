//! `leasehold run --output-tail`: a command that prints far more than the tail keeps, a URL with
//! a password and the store's own password: its run's history record keeps only the end,
//! bounded, with the passwords taken out, and `history --output` shows it escaped; the command's
//! output still reaches `leasehold`'s stdout and stderr whole. On SQLite, Redis and PostgreSQL.

mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

/// The password of a URL the command prints (not the store's).
const PRINTED_PASSWORD: &str = "App-Pw-9x";

/// A script printing about 8 KiB of numbered lines on stdout, a line on stderr, a URL with a
/// password, `secret` as free text, and a last line holding an escape sequence; it then fails.
/// (Stdout and stderr are two pipes, interleaved as read: where the stderr line lands in the
/// tail depends on when each was read, so the test looks for it only in the passthrough.)
fn script(secret: &str) -> String {
    format!(
        "i=0; while [ $i -lt 300 ]; do echo \"line $i of the filler text\"; i=$((i+1)); done; \
         echo 'a warning on stderr' >&2; \
         echo \"connecting to mysql://app:{PRINTED_PASSWORD}@10.0.0.1/db\"; \
         echo \"store password is {secret}.\"; printf 'the \\033[2Jend\\n'; exit 3"
    )
}

/// A lease name of this run's own: leases and history outlive a run on a shared server.
fn lease_name() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    format!("tail-{:08x}", nanos ^ std::process::id())
}

/// The first failed run of `lease` in its history, waited for (at most 60 s).
fn first_failed_run(url: &str, lease: &str) -> serde_json::Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        // Until the runner has created it, the store (a SQLite file) may not be there.
        let out = leasehold(&["history", "--store", url, lease, "--json"]);
        if out.status.success() {
            let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
            let runs = doc["runs"].as_array().unwrap();
            if let Some(run) = runs.iter().find(|r| r["outcome"] == "failed") {
                return run.clone();
            }
        }
        assert!(
            Instant::now() < deadline,
            "no run ended within 60 s: {out:?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Runs `leasehold ARGS REST` (its output discarded) until `task` has a failed run, and answers
/// that run's record.
fn first_failed_run_of(url: &str, task: &str, args: &[&str], rest: &[&str]) -> serde_json::Value {
    let child = Command::new(BIN)
        .args(args)
        .args(rest)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let _child = KillOnDrop(child);
    first_failed_run(url, task)
}

/// Runs the script every second with a 1 KiB tail against `url` until a run of it has ended
/// in the history; checks that run's record, `history --output`, and the passthrough.
/// `secret`: the store URL's password, if it has one (else a stand-in printed all the same).
fn the_tail_is_kept_bounded_and_redacted(url: &str, secret: Option<&str>) {
    let dir = temp_dir();
    let lease = lease_name();
    let printed_secret = secret.unwrap_or("not-a-secret");
    let (out, err) = (dir.path().join("out"), dir.path().join("err"));
    let child = Command::new(BIN)
        .args(["run", "--store", url, "--lease", &lease, "--every", "1s"])
        .args(["--ttl", "5s", "--output-tail", "1", "--", "sh", "-c"])
        .arg(script(printed_secret))
        .current_dir(dir.path())
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out).unwrap())
        .stderr(std::fs::File::create(&err).unwrap())
        .spawn()
        .unwrap();
    let mut child = KillOnDrop(child);
    let record = first_failed_run(url, &lease);
    let _ = Command::new("kill")
        .args(["-TERM", &child.0.id().to_string()])
        .status();
    let _ = child.0.wait();

    let kept = record["output"].as_str().expect("the run's output");
    assert!(kept.len() <= 1024, "{} bytes: {kept:?}", kept.len());
    assert!(kept.len() > 900, "{} bytes: {kept:?}", kept.len());
    let stdout_part = kept.replacen("a warning on stderr\n", "", 1);
    assert!(stdout_part.ends_with(".\nthe \u{1b}[2Jend\n"), "{kept:?}");
    assert!(kept.contains("line 299 of the filler text\n"), "{kept:?}");
    assert!(
        !kept.contains("line 0 of"),
        "only the end is kept: {kept:?}"
    );
    assert!(
        kept.contains("connecting to mysql://app:***@10.0.0.1/db\n"),
        "{kept:?}"
    );
    assert!(!kept.contains(PRINTED_PASSWORD), "{kept:?}");
    match secret {
        Some(secret) => {
            assert!(kept.contains("store password is ***."), "{kept:?}");
            assert!(!kept.contains(secret), "{kept:?}");
        }
        None => assert!(kept.contains("store password is not-a-secret."), "{kept:?}"),
    }

    // The table: each line of the output under the run's row, escaped.
    let shown = leasehold(&["history", "--store", url, &lease, "--output"]);
    assert!(shown.status.success(), "{shown:?}");
    let shown = String::from_utf8(shown.stdout).unwrap();
    assert!(shown.contains("\n    | the \\x1b[2Jend\n"), "{shown}");
    assert!(
        shown.contains("\n    | line 299 of the filler text\n"),
        "{shown}"
    );
    assert!(
        !shown.contains('\u{1b}') && !shown.contains(PRINTED_PASSWORD),
        "{shown}"
    );
    let plain = leasehold(&["history", "--store", url, &lease]);
    assert!(!String::from_utf8_lossy(&plain.stdout).contains("    | "));

    // The command's own output went through whole, as it printed it.
    let out = std::fs::read_to_string(&out).unwrap();
    assert!(out.starts_with("line 0 of the filler text\n"), "{out:.200}");
    assert!(
        out.contains("line 299 of the filler text\nconnecting to "),
        "{out}"
    );
    assert!(out.contains("the \u{1b}[2Jend\n"));
    assert!(out.contains(&format!("mysql://app:{PRINTED_PASSWORD}@10.0.0.1/db")));
    let err = std::fs::read_to_string(&err).unwrap();
    assert!(err.contains("a warning on stderr\n"), "{err}");
}

#[test]
fn sqlite_keeps_a_bounded_redacted_tail() {
    let dir = temp_dir();
    let url = format!("sqlite:{}", path_str(&dir.path().join("tail.db")));
    the_tail_is_kept_bounded_and_redacted(&url, None);
}

#[test]
fn redis_keeps_a_bounded_redacted_tail() {
    let url = std::env::var("LEASEHOLD_TEST_REDIS_URL").unwrap_or("redis://127.0.0.1:6379".into());
    the_tail_is_kept_bounded_and_redacted(&url, None);
}

/// The store URL carries a password (the loopback server trusts the user, so any password
/// connects), which the command prints: taken out of the tail.
#[test]
fn postgres_keeps_a_bounded_redacted_tail_without_the_stores_password() {
    let url = std::env::var("LEASEHOLD_TEST_POSTGRES_URL")
        .unwrap_or("postgres://postgres@127.0.0.1:5432/test".into());
    let secret = "Pg-Tail-S3cret";
    let with_password = match url.split_once("://") {
        Some((scheme, rest)) => match rest.split_once('@') {
            Some((user, host)) => format!(
                "{scheme}://{}:{secret}@{host}",
                user.split(':').next().unwrap()
            ),
            None => format!("{scheme}://postgres:{secret}@{rest}"),
        },
        None => panic!("not a URL: {url}"),
    };
    the_tail_is_kept_bounded_and_redacted(&with_password, Some(secret));
}

/// `--output-tail 0` keeps nothing, and the command's output is this process's own.
#[test]
fn output_tail_zero_keeps_nothing() {
    let dir = temp_dir();
    let url = format!("sqlite:{}", path_str(&dir.path().join("tail.db")));
    let lease = lease_name();
    let record = first_failed_run_of(
        &url,
        &lease,
        &[
            "run",
            "--store",
            &url,
            "--lease",
            &lease,
            "--every",
            "1s",
            "--output-tail",
            "0",
        ],
        &["--", "sh", "-c", "echo hello; exit 1"],
    );
    assert!(record.get("output").is_none(), "{record}");
    let bad = leasehold(&[
        "run",
        "--lease",
        "x",
        "--every",
        "1s",
        "--output-tail",
        "65",
        "--",
        "true",
    ]);
    assert_eq!(code(&bad), 2, "{bad:?}");
}

/// `leasehold crontab --output-tail` keeps each line's output the same way (the same command
/// task underneath): bounded, the URL's password out, shown under the run.
#[test]
fn crontab_lines_keep_their_output_tail() {
    let dir = temp_dir();
    let url = format!("sqlite:{}", path_str(&dir.path().join("tail.db")));
    let task = lease_name();
    let file = dir.path().join("crontab");
    std::fs::write(
        &file,
        format!(
            "SHELL=/bin/sh\n\
             # leasehold: name={task}\n\
             * * * * * * * i=0; while [ $i -lt 300 ]; do echo \"filler $i\"; i=$((i+1)); done; \
             echo redis://:{PRINTED_PASSWORD}@h:6379/0; exit 4\n"
        ),
    )
    .unwrap();
    let record = first_failed_run_of(
        &url,
        &task,
        &["crontab", "--store", &url, "--output-tail", "1"],
        &[&path_str(&file)],
    );
    let kept = record["output"].as_str().expect("the run's output");
    assert!(kept.len() <= 1024 && kept.len() > 900, "{kept:?}");
    assert!(
        kept.ends_with("filler 299\nredis://:***@h:6379/0\n"),
        "{kept:?}"
    );
    assert!(!kept.contains("filler 0\n"), "{kept:?}");
}
