//! The commands that read or control a store never create one (issue 36, item 9): on a SQLite
//! path with no file, `status`, `history`, `pause`, `resume` and `trigger` exit 66 with one line
//! naming the file, and leave nothing behind (they used to create an empty 57 KB store and
//! answer "never", "no runs recorded" or "no task" as if it were the fleet); on a file that is
//! not a leasehold store they exit 78 and leave it as it was. `next` opens no store at all.
//! `run`, `serve` and `demo` create the file.

mod common;

use std::path::Path;
use std::process::{Command, Output};

use common::sidecar::{Sidecar, http};
use common::{BIN, path_str, temp_dir};

/// `leasehold ARGS` in `dir`, without `LEASEHOLD_STORE` unless `env_store` gives one.
fn leasehold_in(dir: &Path, args: &[&str], env_store: Option<&str>) -> Output {
    let mut command = Command::new(BIN);
    command
        .args(args)
        .current_dir(dir)
        .env_remove("LEASEHOLD_STORE");
    if let Some(url) = env_store {
        command.env("LEASEHOLD_STORE", url);
    }
    command.output().unwrap()
}

/// The names in `dir`, sorted.
fn files_in(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// Nothing was created in `dir`.
fn assert_empty(dir: &Path) {
    let files = files_in(dir);
    assert!(files.is_empty(), "{files:?}");
}

/// Every read command with `store` given as `--store` (or, with `None`, left to
/// `LEASEHOLD_STORE` or the default); `--svg` writes into `dir`.
fn read_commands(store: Option<&str>, dir: &Path) -> Vec<Vec<String>> {
    let svg = path_str(&dir.join("picture.svg"));
    let commands: [&[&str]; 11] = [
        &["status"],
        &["status", "--json"],
        &["status", "sweep"],
        &["history", "sweep"],
        &["history", "sweep", "--json"],
        &["history", "sweep", "--svg", &svg],
        &["pause", "sweep", "--reason", "typo"],
        &["resume", "sweep"],
        &["trigger", "sweep"],
        &["trigger", "sweep", "--wait=1s"],
        &["trigger", "--wait", "sweep"],
    ];
    commands
        .iter()
        .map(|args| {
            let mut v: Vec<String> = args.iter().map(|a| a.to_string()).collect();
            if let Some(url) = store {
                v.splice(1..1, ["--store".to_owned(), url.to_owned()]);
            }
            v
        })
        .collect()
}

/// Runs `args` in `dir` and checks it fails with `code` and one stderr line that starts with
/// `line` (and says what to do), printing nothing on stdout.
fn fails_with(dir: &Path, args: &[String], env_store: Option<&str>, code: i32, line: &str) {
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = leasehold_in(dir, &refs, env_store);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(code), "{args:?}: {stderr}");
    assert!(out.stdout.is_empty(), "{args:?}: {out:?}");
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "{args:?}: {stderr}");
    assert!(
        lines[0].starts_with(&format!("leasehold: error: {line}")),
        "{args:?}: {stderr}"
    );
    assert!(
        lines[0].ends_with(
            "; check --store or LEASEHOLD_STORE (only leasehold run, serve and demo create a store)"
        ),
        "{args:?}: {stderr}"
    );
}

#[test]
fn a_missing_sqlite_file_exits_66_and_is_not_created() {
    let dir = temp_dir();
    let typo = dir.path().join("typo.db");
    let url = format!("sqlite:{}", path_str(&typo));
    let missing = format!("sqlite database {} does not exist", typo.display());
    for args in read_commands(Some(&url), dir.path()) {
        fails_with(dir.path(), &args, None, 66, &missing);
    }
    // The same through LEASEHOLD_STORE, and a directory that does not exist either.
    for args in read_commands(None, dir.path()) {
        fails_with(dir.path(), &args, Some(&url), 66, &missing);
    }
    let in_no_dir = dir.path().join("no-such-dir").join("leases.db");
    let url = format!("sqlite:{}", path_str(&in_no_dir));
    let status = ["status".to_owned(), "--store".to_owned(), url];
    let missing = format!("sqlite database {} does not exist", in_no_dir.display());
    fails_with(dir.path(), &status, None, 66, &missing);
    assert_empty(dir.path());
}

/// With neither `--store` nor `LEASEHOLD_STORE`, the default `sqlite:leasehold.db` in the
/// working directory, named from the root.
#[test]
fn the_default_store_is_not_created_either() {
    let dir = temp_dir();
    let default = dir.path().join("leasehold.db");
    let missing = format!("sqlite database {} does not exist", default.display());
    for args in read_commands(None, dir.path()) {
        fails_with(dir.path(), &args, None, 66, &missing);
    }
    assert_empty(dir.path());
}

/// An empty file, another application's database and a text file: exit 78, each byte kept,
/// no `-wal` or `-shm` beside them.
#[test]
fn a_file_that_is_not_a_store_exits_78_and_is_left_as_it_was() {
    let dir = temp_dir();
    let empty = dir.path().join("empty.db");
    std::fs::write(&empty, b"").unwrap();
    let other = dir.path().join("app.db");
    rusqlite::Connection::open(&other)
        .unwrap()
        .execute_batch("CREATE TABLE users (name TEXT); INSERT INTO users VALUES ('ada');")
        .unwrap();
    let text = dir.path().join("notes.txt");
    std::fs::write(&text, "shopping list: milk, eggs ".repeat(40)).unwrap();
    let before = files_in(dir.path());
    for (path, found) in [
        (&empty, "the file is empty"),
        (&other, "it is a SQLite database without leasehold's tables"),
        (&text, "it is not a SQLite database"),
    ] {
        let bytes = std::fs::read(path).unwrap();
        let url = format!("sqlite:{}", path_str(path));
        let line = format!("{} is not a leasehold store: {found}", path.display());
        for args in read_commands(Some(&url), dir.path()) {
            fails_with(dir.path(), &args, None, 78, &line);
        }
        assert_eq!(std::fs::read(path).unwrap(), bytes, "{}", path.display());
    }
    assert_eq!(files_in(dir.path()), before);
}

/// `next` reads no store, whatever `LEASEHOLD_STORE` says.
#[test]
fn next_opens_no_store() {
    let dir = temp_dir();
    for env_store in [None, Some("sqlite:typo.db")] {
        let out = leasehold_in(
            dir.path(),
            &["next", "--cron", "0 3 * * *", "-n", "2"],
            env_store,
        );
        assert!(out.status.success(), "{out:?}");
        assert!(String::from_utf8_lossy(&out.stdout).contains("03:00:00"));
    }
    assert_empty(dir.path());
}

/// `run` and `serve` create their store (they write to it), after which the read commands
/// answer from it; the sidecar's read endpoints read the store it created.
#[test]
fn run_and_serve_create_the_store_the_read_commands_then_read() {
    let dir = temp_dir();
    let by_run = dir.path().join("by-run.db");
    let url = format!("sqlite:{}", path_str(&by_run));
    let out = leasehold_in(
        dir.path(),
        &["run", "--store", &url, "--lease", "once", "--", "true"],
        None,
    );
    assert!(out.status.success(), "{out:?}");
    assert!(by_run.is_file());
    let status = leasehold_in(dir.path(), &["status", "--store", &url, "once"], None);
    assert!(status.status.success(), "{status:?}");
    assert!(String::from_utf8_lossy(&status.stdout).contains("once"));

    let by_serve = dir.path().join("by-serve.db");
    let url = format!("sqlite:{}", path_str(&by_serve));
    let sidecar = Sidecar::start(&url, "side");
    assert!(by_serve.is_file());
    let (code, tasks) = http(sidecar.port, "GET", "/v1/tasks", None);
    assert_eq!(code, 200, "{tasks}");
    let status = leasehold_in(dir.path(), &["status", "--store", &url], None);
    assert!(status.status.success(), "{status:?}");
}
