//! A store that refuses the credentials or the file is a refusal on every store kind, never
//! "store down" (issue 32 item 3), with real processes: `leasehold run` without a schedule
//! exits 78 with one stderr line, and a scheduled run with `--on-store-down fail-open` gives up
//! with 78 without ever running its command (before, a wrong PostgreSQL or Redis Cluster
//! password was an outage retried forever, and fail-open ran every tick uncoordinated).
//!
//! The MySQL case is a user MariaDB does not let in (access denied). The PostgreSQL
//! server of the tests trusts loopback (any password is accepted), so the
//! PostgreSQL cases are a role that does not exist on it (`28000`) and a stand-in that refuses
//! the password (`28P01`). The SQLite case is a file the process may not write (read-only,
//! run as `nobody` when the tests run as root, whom file modes do not stop).

mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use leasehold_etcd::testing::EtcdCluster;
use leasehold_testkit::ha::{Cluster, SentinelGroup};
use leasehold_testkit::postgres::PasswordRefusingPostgres;
use leasehold_testkit::redis::OwnRedis;

const SECRET: &str = "r1ght-Secret";
const WRONG: &str = "wr0ng-Secret";

/// `scheme://:PASSWORD@rest` (or `scheme://USER:PASSWORD@rest` with a user).
fn with_password(url: &str, user: &str, password: &str) -> String {
    let (scheme, rest) = url.split_once("://").expect("a url");
    format!("{scheme}://{user}:{password}@{rest}")
}

fn running_as_root() -> bool {
    std::fs::read_to_string("/proc/self/status").is_ok_and(|s| {
        s.lines()
            .find_map(|l| l.strip_prefix("Uid:"))
            .and_then(|ids| ids.split_whitespace().nth(1))
            == Some("0")
    })
}

/// `leasehold run --store URL ARGS -- touch MARKER`, as `nobody` if `unprivileged` and this
/// process is root.
fn leasehold(url: &str, args: &[&str], marker: &Path, unprivileged: bool) -> Command {
    let mut cmd = if unprivileged && running_as_root() {
        let mut c = Command::new("setpriv");
        c.args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "--",
            BIN,
        ]);
        c
    } else {
        Command::new(BIN)
    };
    cmd.args(["run", "--store", url])
        .args(args)
        .args(["--", "touch"])
        .arg(marker)
        .env("LEASEHOLD_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    cmd
}

/// A directory anyone may write to (the command's marker goes there).
fn open_dir() -> tempfile::TempDir {
    use std::os::unix::fs::PermissionsExt;
    let dir = temp_dir();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    dir
}

/// `url` is refused: a flock exits 78 with one stderr line saying `says`, and a scheduled
/// fail-open run exits 78 within 30 s; neither runs its command. No output shows the password.
fn refused(what: &str, url: &str, says: &str, unprivileged: bool) {
    let dir = open_dir();
    let marker = dir.path().join("ran");
    let lease = format!("refused-{:08x}", fastrand_u32());

    let started = Instant::now();
    let out = leasehold(
        url,
        &["--lease", &lease, "--on-store-down", "fail-open"],
        &marker,
        unprivileged,
    )
    .output()
    .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!(
        "{what}: flock exit {:?} after {:?}: {stderr}",
        out.status.code(),
        started.elapsed()
    );
    assert_eq!(out.status.code(), Some(78), "{what}: {stderr}");
    assert_eq!(stderr.lines().count(), 1, "{what}: one line: {stderr}");
    assert!(stderr.starts_with("leasehold: error: "), "{what}: {stderr}");
    assert!(stderr.contains(says), "{what}: {stderr}");
    assert!(!stderr.contains("Secret"), "{what}: {stderr}");
    assert!(!marker.exists(), "{what}: the flock ran its command");

    let started = Instant::now();
    let mut run = leasehold(
        url,
        &[
            "--lease",
            &lease,
            "--every",
            "200ms",
            // The store's first answer must come within the renew interval (a third of the
            // ttl) to be told from an outage; etcd checks a password with bcrypt, slowly.
            "--ttl",
            "3s",
            "--on-store-down",
            "fail-open",
        ],
        &marker,
        unprivileged,
    )
    .spawn()
    .unwrap();
    let code = loop {
        if let Some(status) = run.try_wait().unwrap() {
            break status.code();
        }
        if started.elapsed() > Duration::from_secs(30) {
            let _ = run.kill();
            let _ = run.wait();
            panic!("{what}: a scheduled run did not give up within 30 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let out = run.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let last = stderr.lines().last().unwrap_or_default();
    println!(
        "{what}: scheduled exit {code:?} after {:?}: {last}",
        started.elapsed()
    );
    assert_eq!(code, Some(78), "{what}: {stderr}");
    assert!(last.starts_with("leasehold: error: "), "{what}: {stderr}");
    assert!(!stderr.contains("Secret"), "{what}: {stderr}");
    assert!(
        !marker.exists(),
        "{what}: fail-open ran the command against a refusing store: {stderr}"
    );
}

fn fastrand_u32() -> u32 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos()
        ^ std::process::id().rotate_left(16)
}

#[test]
fn redis_wrong_or_missing_password() {
    let redis = OwnRedis::start(&["--requirepass", SECRET]);
    let says = "redis refused the credentials";
    refused(
        "redis, wrong password",
        &with_password(&redis.url(), "", WRONG),
        says,
        false,
    );
    refused("redis, no password (NOAUTH)", &redis.url(), says, false);
}

#[test]
fn redis_cluster_wrong_password() {
    let cluster = Cluster::start_with(Some(SECRET));
    refused(
        "redis cluster, wrong password",
        &with_password(&cluster.url(), "", WRONG),
        "redis refused the credentials",
        false,
    );
}

#[test]
fn redis_sentinel_wrong_password() {
    let group = SentinelGroup::start_with_passwords(None, Some(SECRET));
    refused(
        "sentinel, wrong primary password",
        &with_password(&group.url(), "", WRONG),
        "redis refused the credentials",
        false,
    );
}

#[test]
fn postgres_wrong_password_and_unknown_role() {
    let server = PasswordRefusingPostgres::start();
    refused(
        "postgres, wrong password",
        &server.url("app", Some(WRONG)),
        "28P01",
        false,
    );
    let url = std::env::var("LEASEHOLD_TEST_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    let host = url.split_once('@').expect("a url with a user").1;
    refused(
        "postgres, unknown role",
        &format!("postgres://lh_no_such_role:{WRONG}@{host}"),
        "28000",
        false,
    );
}

/// A user MariaDB does not let in (access denied: 1045 for a wrong password, 1698 here for a
/// user it does not know).
#[test]
fn mysql_wrong_password() {
    let url = std::env::var("LEASEHOLD_TEST_MYSQL_URL")
        .unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".into());
    let host = url.split_once('@').expect("a url with a user").1;
    refused(
        "mysql, wrong password",
        &format!("mysql://lh_no_such_user:{WRONG}@{host}"),
        "Access denied",
        false,
    );
}

#[test]
fn etcd_wrong_password() {
    let cluster = EtcdCluster::start(1);
    cluster.etcdctl(None, &["user", "add", &format!("root:{SECRET}")]);
    cluster.etcdctl(None, &["user", "grant-role", "root", "root"]);
    cluster.etcdctl(None, &["auth", "enable"]);
    refused(
        "etcd, wrong password",
        &with_password(&cluster.url(), "root", WRONG),
        "authentication failed",
        false,
    );
}

#[test]
fn sqlite_read_only_file() {
    use std::os::unix::fs::PermissionsExt;
    let dir = temp_dir();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let path = dir.path().join("leases.db");
    std::fs::write(&path, "").unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o444)).unwrap();
    refused(
        "sqlite, read-only file",
        &format!("sqlite:{}", path_str(&path)),
        "Permission denied",
        true,
    );
}
