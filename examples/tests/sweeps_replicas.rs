//! Three replicas of the sweeps service, as separate processes, against each store: every tick
//! of both sweeps runs exactly once, and a manual run on a follower runs on that follower.

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_sweeps");

struct Replica {
    name: String,
    port: u16,
    child: Child,
}

impl Drop for Replica {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn http(port: u16, method: &str, path: &str) -> Option<(u16, serde_json::Value)> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    write!(s, "{method} {path} HTTP/1.1\r\nHost: localhost\r\nContent-Length: 0\r\nConnection: close\r\n\r\n").ok()?;
    let mut buf = String::new();
    s.read_to_string(&mut buf).ok()?;
    let code = buf.split_whitespace().nth(1)?.parse().ok()?;
    let body = buf.split("\r\n\r\n").nth(1)?;
    Some((code, serde_json::from_str(body).ok()?))
}

fn start(store: &str, name: &str, ledger: &Path, log_dir: &Path) -> Replica {
    let port = free_port();
    let log = std::fs::File::create(log_dir.join(format!("{name}.log"))).unwrap();
    let child = Command::new(BIN)
        .args([
            "--store",
            store,
            "--every",
            "500ms",
            "--name",
            name,
            "--port",
            &port.to_string(),
        ])
        .arg("--ledger")
        .arg(ledger)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap();
    let r = Replica {
        name: name.to_owned(),
        port,
        child,
    };
    let start = Instant::now();
    while http(port, "GET", "/status").is_none() {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "{name} did not come up"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    r
}

fn exercise(store: &str) {
    let dir = tempfile::tempdir().unwrap();
    let ledger = dir.path().join("ledger.jsonl");
    let replicas: Vec<Replica> = (1..=3)
        .map(|i| start(store, &format!("replica-{i}"), &ledger, dir.path()))
        .collect();
    // At least 20 ticks of the 500 ms sweep (a tick of 300 ms missed slots on a loaded 2-core host).
    std::thread::sleep(Duration::from_millis(500 * 24));
    let follower = replicas
        .iter()
        .find(|r| http(r.port, "GET", "/status").is_some_and(|(_, v)| v["leader"] == false))
        .expect("a follower");
    let follower_name = follower.name.clone();
    let (code, body) = http(follower.port, "POST", "/tasks/repin/run").unwrap();
    assert_eq!(code, 200, "{body}");
    let (code, _) = http(follower.port, "POST", "/tasks/nope/run").unwrap();
    assert_eq!(code, 404);
    for r in &replicas {
        Command::new("kill")
            .args(["-TERM", &r.child.id().to_string()])
            .status()
            .unwrap();
    }
    for mut rep in replicas {
        let deadline = Instant::now() + Duration::from_secs(15);
        while rep.child.try_wait().unwrap().is_none() {
            assert!(Instant::now() < deadline, "{} did not stop", rep.name);
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    let text = std::fs::read_to_string(&ledger).unwrap();
    let runs: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let mut seen = BTreeSet::new();
    let mut expire_slots = Vec::new();
    for r in runs.iter().filter(|r| r["manual"] == false) {
        let key = (
            r["task"].as_str().unwrap().to_owned(),
            r["slot"].as_u64().unwrap(),
        );
        assert!(seen.insert(key.clone()), "{key:?} ran twice");
        if key.0 == "expire" {
            expire_slots.push(key.1);
        }
    }
    expire_slots.sort_unstable();
    assert!(
        expire_slots.len() >= 20,
        "{} expire ticks",
        expire_slots.len()
    );
    assert!(
        // Slots are firing times in ms: one every 500 ms.
        expire_slots.windows(2).all(|w| w[1] == w[0] + 500),
        "missed: {expire_slots:?}"
    );
    assert!(seen.iter().any(|(t, _)| t == "repin"));
    let manual: Vec<_> = runs.iter().filter(|r| r["manual"] == true).collect();
    assert_eq!(manual.len(), 1);
    assert_eq!(
        manual[0]["holder"].as_str(),
        Some(follower_name.as_str()),
        "ran on the follower"
    );
}

#[test]
fn sqlite_replicas() {
    let dir = tempfile::tempdir().unwrap();
    exercise(&format!(
        "sqlite:{}",
        dir.path().join("leases.db").display()
    ));
}

#[test]
fn redis_replicas() {
    exercise(&std::env::var("LEASEHOLD_TEST_REDIS_URL").unwrap_or("redis://127.0.0.1:6379".into()));
}

#[test]
fn postgres_replicas() {
    exercise(
        &std::env::var("LEASEHOLD_TEST_POSTGRES_URL")
            .unwrap_or("postgres://postgres@127.0.0.1:5432/test".into()),
    );
}
