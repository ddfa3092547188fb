//! The short fault-injection run against every store: kills, pauses past the ttl, graceful
//! stops, and (Redis, PostgreSQL) dropped, blackholed and delayed connections; Redis also a store
//! restart. The harness exits non-zero if any guarantee broke.

use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_leasehold");

fn short_run(store: &str) {
    let out_dir = tempfile::tempdir().unwrap();
    let out = Command::new(BIN)
        .args([
            "chaos",
            "--store",
            store,
            "--duration",
            "90s",
            "--faults",
            "10",
        ])
        .arg("--out")
        .arg(out_dir.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    println!("{stdout}");
    assert!(
        out.status.success(),
        "chaos run failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out_dir.path().join("report.json")).unwrap())
            .unwrap();
    assert_eq!(report["ok"], true, "{report}");
    assert!(
        report["faults"].as_array().map_or(0, Vec::len) >= 10,
        "{report}"
    );
    let svg = std::fs::read_to_string(out_dir.path().join("timeline.svg")).unwrap();
    assert!(svg.starts_with("<svg") || svg.contains("<svg"));
}

#[test]
fn chaos_sqlite() {
    short_run("sqlite");
}

#[test]
fn chaos_redis() {
    short_run("redis");
}

#[test]
fn chaos_postgres() {
    short_run("postgres");
}
