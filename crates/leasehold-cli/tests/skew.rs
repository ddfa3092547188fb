//! Versions side by side (docs/version-skew.md): the previous release, built from
//! the commit CHANGELOG.md names (scripts/previous-release.sh), and this one run one task on one
//! store, replaced one by one in both directions of upgrade. Every slot runs at most once, runs
//! never overlap, tokens only go up, and `status` and `history` work from both releases. A
//! store that needs a newer release than this one is refused with exit 78, nothing written.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use common::*;

/// The previous release's `leasehold`: `LEASEHOLD_PREVIOUS_RELEASE` (scripts/test.sh builds it
/// before the tests run), else built now by scripts/previous-release.sh into a target directory
/// of its own: never the one this build's binary is in, which tests running beside this one use.
fn previous_release() -> PathBuf {
    if let Some(path) = std::env::var_os("LEASEHOLD_PREVIOUS_RELEASE").filter(|p| !p.is_empty()) {
        return path.into();
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/previous-release.sh");
    let out = Command::new("bash")
        .arg(script)
        .env(
            "CARGO_TARGET_DIR",
            Path::new(env!("CARGO_TARGET_TMPDIR")).join("previous-release"),
        )
        .output()
        .expect("run scripts/previous-release.sh");
    assert!(
        out.status.success(),
        "building the previous release failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8(out.stdout).unwrap();
    PathBuf::from(stdout.lines().last().expect("the script prints the binary"))
}

/// The previous release's version, as CHANGELOG.md names it.
fn previous_version() -> String {
    let changelog =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../CHANGELOG.md"))
            .unwrap();
    changelog
        .lines()
        .find_map(|l| {
            let rest = l.strip_prefix("## ")?;
            let (version, commit) = rest.split_once(" — commit ")?;
            (commit.len() == 40).then(|| version.to_owned())
        })
        .expect("CHANGELOG.md names a released commit")
}

fn leasehold(program: &Path, args: &[&str]) -> Output {
    Command::new(program).args(args).output().unwrap()
}

async fn side_by_side(url: &str) {
    let (old, new) = (previous_release(), PathBuf::from(BIN));
    let version = leasehold(&old, &["--version"]);
    assert!(
        String::from_utf8_lossy(&version.stdout).contains(&previous_version()),
        "{} is release {}: {version:?}",
        old.display(),
        previous_version()
    );
    let dir = temp_dir();
    let ledger = ledger_in(dir.path());
    let lease = unique("skew");
    let args = [
        "--store", url, "--lease", &lease, "--every", "1s", "--ttl", "3s",
    ];
    let start = |program: &Path, name: &str| {
        Instance::start_program(program, name, &args, &ledger, "50ms", dir.path(), &[])
    };
    // The previous release first, so the store starts as it leaves it.
    let mut fleet = Vec::new();
    for (program, name) in [
        (&old, "old-1"),
        (&old, "old-2"),
        (&new, "new-1"),
        (&new, "new-2"),
    ] {
        fleet.push(start(program, name));
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    // Upgraded one by one, then downgraded one by one.
    for (leaving, program, joining) in [
        ("old-1", &new, "new-3"),
        ("old-2", &new, "new-4"),
        ("new-1", &old, "old-3"),
        ("new-2", &old, "old-4"),
        ("new-3", &old, "old-5"),
    ] {
        let at = fleet.iter().position(|i| i.name == leaving).unwrap();
        let instance = fleet.swap_remove(at);
        assert_eq!(
            instance.stop(Duration::from_secs(10)),
            0,
            "{leaving} stops cleanly"
        );
        fleet.push(start(program, joining));
        tokio::time::sleep(Duration::from_millis(2500)).await;
    }
    for instance in fleet {
        let name = instance.name.clone();
        assert_eq!(
            instance.stop(Duration::from_secs(10)),
            0,
            "{name} stops cleanly"
        );
    }

    let runs = read_ledger(&ledger);
    // At most once per slot, no overlap, tokens strictly increasing.
    let by_slot = assert_exactly_once(&runs);
    let ran = |prefix: &str| runs.iter().filter(|r| r.holder.starts_with(prefix)).count();
    assert!(
        ran("old-") > 0 && ran("new-") > 0,
        "both releases ran slots: {} old, {} new",
        ran("old-"),
        ran("new-")
    );
    eprintln!(
        "{url}: {} runs ({} by the previous release, {} by this one)",
        runs.len(),
        ran("old-"),
        ran("new-")
    );
    let (first, last) = (
        *by_slot.keys().next().unwrap(),
        *by_slot.keys().last().unwrap(),
    );
    let due = (last - first) / 1000 + 1;
    // Handovers may leave a slot unrun (catch-up skip); a release that ignored the other's
    // leases or claims would show as a duplicate above, one that stalled as many gaps here.
    assert!(
        by_slot.len() as u64 * 10 >= due * 8,
        "{} of {due} slots ran: {:?}",
        by_slot.len(),
        by_slot.keys().collect::<Vec<_>>()
    );

    for program in [&old, &new] {
        for command in ["status", "history"] {
            let out = leasehold(program, &[command, "--store", url, &lease]);
            assert!(
                out.status.success() && !out.stdout.is_empty(),
                "{} {command}: {out:?}",
                program.display()
            );
        }
    }
}

fn redis_url() -> String {
    std::env::var("LEASEHOLD_TEST_REDIS_URL").unwrap_or("redis://127.0.0.1:6379".into())
}

fn postgres_url() -> String {
    std::env::var("LEASEHOLD_TEST_POSTGRES_URL")
        .unwrap_or("postgres://postgres@127.0.0.1:5432/test".into())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_previous_and_this_release_side_by_side() {
    let dir = temp_dir();
    side_by_side(&format!(
        "sqlite:{}",
        path_str(&dir.path().join("leases.db"))
    ))
    .await;
    let conn = rusqlite::Connection::open(dir.path().join("leases.db")).unwrap();
    let version: i64 = conn
        .pragma_query_value(None, "user_version", |r| r.get(0))
        .unwrap();
    assert_eq!(
        version, 4,
        "the file stays at the previous release's version"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_previous_and_this_release_side_by_side() {
    side_by_side(&redis_url()).await;
}

/// The same on Valkey 9 (`LEASEHOLD_TEST_VALKEY_URL`, which the test command sets), where this
/// release renews and releases with native commands and the previous one with scripts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn valkey_previous_and_this_release_side_by_side() {
    let Some(url) = std::env::var("LEASEHOLD_TEST_VALKEY_URL")
        .ok()
        .filter(|u| !u.is_empty())
    else {
        eprintln!("LEASEHOLD_TEST_VALKEY_URL is not set: skipped (scripts/test.sh sets it)");
        return;
    };
    side_by_side(&url).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_previous_and_this_release_side_by_side() {
    side_by_side(&postgres_url()).await;
}

/// A backfill this release ran (its runs kept as `manual` with `"backfill": true`) leaves a
/// history the previous release reads: its `history` shows the runs as manual runs of their
/// slots, and its `status` answers.
#[test]
fn a_backfill_by_this_release_is_read_by_the_previous_one() {
    let old = previous_release();
    let dir = temp_dir();
    let url = format!("sqlite:{}", path_str(&dir.path().join("leases.db")));
    let ledger = ledger_in(dir.path());
    let lease = unique("skew-backfill");
    let args = [
        "--store", &url, "--lease", &lease, "--every", "1s", "--ttl", "3s",
    ];
    let instance = Instance::start("new-1", &args, &ledger, "20ms", dir.path());
    std::thread::sleep(Duration::from_secs(2));
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    let to_ms = (now - 60_000) / 1000 * 1000;
    let range = format!("{}..{to_ms}", to_ms - 2000);
    let asked = leasehold(
        BIN.as_ref(),
        &[
            "trigger",
            "--store",
            &url,
            &lease,
            "--slots",
            &range,
            "--wait=30s",
        ],
    );
    assert!(asked.status.success(), "{asked:?}");
    assert_eq!(instance.stop(Duration::from_secs(10)), 0);
    let task = format!("{lease}:run");
    let history = leasehold(
        &old,
        &[
            "history", "--store", &url, &task, "--json", "--limit", "100",
        ],
    );
    assert!(history.status.success(), "{history:?}");
    let doc: serde_json::Value = serde_json::from_slice(&history.stdout).unwrap();
    let manual: Vec<u64> = doc["runs"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["trigger"] == "manual")
        .filter_map(|r| r["slot"].as_u64().or(r["slot_ms"].as_u64()))
        .collect();
    assert_eq!(manual.len(), 3, "{doc}");
    assert!(
        manual.iter().all(|&s| s <= to_ms && s >= to_ms - 2000),
        "{doc}"
    );
    let status = leasehold(&old, &["status", "--store", &url, &task]);
    assert!(
        status.status.success() && !status.stdout.is_empty(),
        "{status:?}"
    );
}

/// A release below the store's recorded oldest writer (this build, under a record a newer
/// release wrote) refuses: exit 78, one line naming the release to upgrade to, nothing written.
#[test]
fn a_store_that_needs_a_newer_release_is_refused_with_exit_78() {
    let dir = temp_dir();
    let path = dir.path().join("leases.db");
    let url = format!("sqlite:{}", path_str(&path));
    let created = leasehold(
        BIN.as_ref(),
        &["run", "--store", &url, "--lease", "job", "--", "true"],
    );
    assert!(created.status.success(), "{created:?}");
    rusqlite::Connection::open(&path)
        .unwrap()
        .execute(
            "UPDATE meta SET value = '99.0.0' WHERE key = 'min_writer'",
            [],
        )
        .unwrap();
    let before = std::fs::read(&path).unwrap();
    for args in [
        &["status", "--store", &url, "job"][..],
        &["history", "--store", &url, "job"],
        &[
            "run", "--store", &url, "--lease", "job", "--every", "1s", "--", "true",
        ],
        &["run", "--store", &url, "--lease", "job", "--", "true"],
    ] {
        let out = leasehold(BIN.as_ref(), args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(78), "{args:?}: {stderr}");
        assert_eq!(stderr.trim_end().lines().count(), 1, "{args:?}: {stderr}");
        assert!(
            stderr.contains("upgrade leasehold to at least 99.0.0"),
            "{args:?}: {stderr}"
        );
    }
    assert_eq!(std::fs::read(&path).unwrap(), before, "nothing written");
}

/// `leasehold --version` names the release and the commit it was built from (`unknown` only
/// for sources without git metadata, which a checkout is not).
#[test]
fn version_names_the_release_and_its_commit() {
    let out = leasehold(BIN.as_ref(), &["--version"]);
    let line = String::from_utf8(out.stdout).unwrap();
    let rest = line
        .trim_end()
        .strip_prefix(concat!(
            "leasehold ",
            env!("CARGO_PKG_VERSION"),
            " (commit "
        ))
        .and_then(|r| r.strip_suffix(')'))
        .unwrap_or_else(|| panic!("{line:?}"));
    let from_git = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../.git")
        .exists();
    if from_git {
        assert!(
            rest.len() == 40 && rest.chars().all(|c| c.is_ascii_hexdigit()),
            "{line:?}"
        );
    } else {
        assert_eq!(rest, "unknown", "{line:?}");
    }
}

/// The same on a server store, where `run` with a schedule connects in the background: `status`
/// refuses at once, `run` after its refusals in a row, both with exit 78 and the release to
/// upgrade to; the only key on the server stays the newer release's record.
#[test]
fn a_redis_that_needs_a_newer_release_is_refused_with_exit_78() {
    let redis = leasehold_testkit::redis::OwnRedis::start(&[]);
    let record = "leasehold:{#meta}:release";
    redis.cli(&[
        "HSET",
        record,
        "min_writer",
        "99.0.0",
        "schema_version",
        "9",
    ]);
    let url = redis.url();
    for args in [
        &["status", "--store", &url, "job"][..],
        &[
            "run", "--store", &url, "--lease", "job", "--every", "1s", "--", "true",
        ],
    ] {
        let out = leasehold(BIN.as_ref(), args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(78), "{args:?}: {stderr}");
        assert!(
            stderr.contains("upgrade leasehold to at least 99.0.0"),
            "{args:?}: {stderr}"
        );
    }
    assert_eq!(redis.cli(&["KEYS", "*"]).trim(), record, "nothing written");
}
