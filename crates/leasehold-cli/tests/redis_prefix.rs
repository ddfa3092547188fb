//! A Redis key prefix from the command line (issue 43): `?prefix=` in the store URL reaches
//! every command that opens a store, through `--store` or `LEASEHOLD_STORE`, so two
//! applications on one Redis database are kept apart by prefix, not only by database number.
//! On the shared local Redis.

mod common;

use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::{BIN, KillOnDrop};
use serde_json::Value;

fn redis_url() -> String {
    std::env::var("LEASEHOLD_TEST_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into())
}

/// A key prefix of this test run's.
fn prefix(app: &str) -> String {
    format!(
        "{app}-{}-{}:",
        std::process::id(),
        leasehold_testkit::free_port()
    )
}

/// The shared Redis under `prefix`.
fn store(prefix: &str) -> String {
    let url = redis_url();
    let joiner = if url.contains('?') { '&' } else { '?' };
    format!("{url}{joiner}prefix={prefix}")
}

fn leasehold(args: &[&str], env_store: Option<&str>) -> Output {
    let mut command = Command::new(BIN);
    command.args(args).env_remove("LEASEHOLD_STORE");
    if let Some(url) = env_store {
        command.env("LEASEHOLD_STORE", url);
    }
    command.output().unwrap()
}

fn json(args: &[&str]) -> Value {
    let out = leasehold(args, None);
    assert!(out.status.success(), "{args:?}: {out:?}");
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The names of the tasks `status --json` lists for `url`.
fn tasks(url: &str) -> Vec<String> {
    json(&["status", "--store", url, "--json"])["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap().to_owned())
        .collect()
}

#[test]
fn two_prefixes_on_one_redis_database_are_two_applications() {
    let (prefix1, prefix2) = (prefix("app1"), prefix("app2"));
    let (app1, app2) = (store(&prefix1), store(&prefix2));
    // app1 holds `shared` (a flock) and runs `sweep` every second.
    let _holder = KillOnDrop(
        Command::new(BIN)
            .args([
                "run", "--store", &app1, "--lease", "shared", "--", "sleep", "30",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let _sweep = KillOnDrop(
        Command::new(BIN)
            .args(["run", "--lease", "sweep", "--every", "1s", "--", "true"])
            .env("LEASEHOLD_STORE", &app1)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    while !(json(&["status", "--store", &app1, "shared", "--json"])["leases"][0]["held"] == true
        && tasks(&app1).contains(&"sweep:run".to_owned()))
    {
        assert!(
            Instant::now() < deadline,
            "app1 never held shared and ran sweep"
        );
        std::thread::sleep(Duration::from_millis(100));
    }

    // Another prefix: its own `shared`, free; no task of app1's.
    let app2_status = json(&["status", "--store", &app2, "shared", "--json"]);
    assert_eq!(app2_status["leases"][0]["held"], false, "{app2_status}");
    let described = app2_status["store"].as_str().unwrap();
    assert!(
        described.ends_with(&format!("(prefix {prefix2})")),
        "{described}"
    );
    let ran = leasehold(
        &["run", "--store", &app2, "--lease", "shared", "--", "true"],
        None,
    );
    assert_eq!(ran.status.code(), Some(0), "{ran:?}");
    assert!(tasks(&app2).is_empty(), "{:?}", tasks(&app2));
    let out = leasehold(&["pause", "--store", &app2, "sweep"], None);
    assert_eq!(out.status.code(), Some(66), "{out:?}");

    // The same prefix, through --store or LEASEHOLD_STORE: the same leases and tasks.
    let busy = leasehold(
        &["run", "--store", &app1, "--lease", "shared", "--", "true"],
        None,
    );
    assert_eq!(busy.status.code(), Some(75), "{busy:?}");
    let busy = leasehold(&["run", "--lease", "shared", "--", "true"], Some(&app1));
    assert_eq!(busy.status.code(), Some(75), "{busy:?}");
    let paused = leasehold(&["pause", "sweep", "--by", "ops"], Some(&app1));
    assert_eq!(paused.status.code(), Some(0), "{paused:?}");
    let history = leasehold(&["history", "--store", &app1, "sweep", "--json"], None);
    assert!(history.status.success(), "{history:?}");
}
