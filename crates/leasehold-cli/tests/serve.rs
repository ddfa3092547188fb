//! `leasehold serve` as a process on the real Redis: gated ticks across two sidecars, handover
//! on SIGTERM, unix sockets, the names it answers under without a token, and the refusals of
//! unsafe or bad flags.

mod common;

use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::sidecar::{Sidecar, exchange, http};
use common::{BIN, temp_dir, unique};
use serde_json::{Value, json};

fn redis_url() -> String {
    std::env::var("LEASEHOLD_TEST_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into())
}

#[test]
fn two_sidecars_on_redis_run_each_slot_once_and_hand_over_on_sigterm() {
    let store = redis_url();
    let mut a = Sidecar::start(&store, "a");
    let b = Sidecar::start(&store, "b");
    let task = unique("serve-task");
    let tick = json!({"every_ms": 500, "ttl_ms": 5000});
    let mut runs: Vec<(u64, &str)> = Vec::new();
    let until = Instant::now() + Duration::from_secs(4);
    while Instant::now() < until {
        for (name, sidecar) in [("a", &a), ("b", &b)] {
            let (status, answer) = sidecar.post(&format!("/v1/tasks/{task}/ticks"), tick.clone());
            assert_eq!(status, 200, "{answer}");
            if answer["run"] == true {
                let slot = answer["slot"].as_u64().unwrap();
                runs.push((slot, name));
                let (status, done) = sidecar.post(
                    &format!("/v1/tasks/{task}/ticks/{slot}/done"),
                    json!({"token": answer["token"], "outcome": "ok"}),
                );
                assert_eq!((status, done["released"].clone()), (200, json!(true)));
            }
        }
        std::thread::sleep(Duration::from_millis(60));
    }
    let mut slots: Vec<u64> = runs.iter().map(|r| r.0).collect();
    let n = slots.len();
    slots.dedup();
    assert_eq!(slots.len(), n, "a slot ran twice: {runs:?}");
    assert!(
        n >= 6,
        "only {n} slots ran in 4 s of 500 ms slots: {runs:?}"
    );

    // a holds a lease; b waits for it; SIGTERM of a releases it and b has it at once.
    let lease = unique("serve-lease");
    let (_, held) = a.post(
        &format!("/v1/leases/{lease}/acquire"),
        json!({"ttl_ms": 20000, "keepalive_ms": 60000}),
    );
    assert_eq!(held["acquired"], true, "{held}");
    let waiter = {
        let port = b.port;
        let lease = lease.clone();
        std::thread::spawn(move || {
            http(
                port,
                "POST",
                &format!("/v1/leases/{lease}/acquire"),
                Some(json!({"ttl_ms": 20000, "wait_ms": 30000})),
            )
        })
    };
    std::thread::sleep(Duration::from_millis(500));
    let stopped = Instant::now();
    a.sigterm();
    assert_eq!(a.wait(Duration::from_secs(10)), 0);
    let (_, got) = waiter.join().unwrap();
    let handover = stopped.elapsed();
    assert_eq!(got["acquired"], true, "{got}");
    assert!(token(&got) > token(&held));
    // Released on shutdown, not left to its 20 s ttl.
    assert!(
        handover < Duration::from_secs(5),
        "handover took {handover:?}"
    );
}

fn token(v: &Value) -> u64 {
    v["token"].as_str().unwrap().parse().unwrap()
}

#[test]
fn a_unix_socket_serves_the_same_api() {
    let dir = temp_dir();
    let socket = dir.path().join("sidecar.sock");
    let store = format!("sqlite:{}", dir.path().join("s.db").display());
    let mut child = Command::new(BIN)
        // More than the one default thread: the API is the same.
        .args(["serve", "--store", &store, "--threads", "3"])
        .arg("--listen")
        .arg(format!("unix:{}", socket.display()))
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let connect = || std::os::unix::net::UnixStream::connect(&socket);
    while connect().is_err() {
        assert!(Instant::now() < deadline, "no socket");
        std::thread::sleep(Duration::from_millis(20));
    }
    // Any Host: no browser reaches a unix socket, and its clients name it as they like.
    let (status, health) = exchange(connect().unwrap(), "sidecar", "GET", "/healthz", None);
    assert_eq!((status, health["status"].clone()), (200, json!("ok")));
    let (status, granted) = exchange(
        connect().unwrap(),
        "evil.example",
        "POST",
        "/v1/leases/u/acquire",
        Some(json!({"ttl_ms": 3000})),
    );
    assert_eq!((status, granted["acquired"].clone()), (200, json!(true)));
    let _ = child.kill();
    let _ = child.wait();
}

fn refused(args: &[&str]) -> String {
    let out = Command::new(BIN).arg("serve").args(args).output().unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn unsafe_or_bad_flags_are_refused() {
    let dir = temp_dir();
    let store = format!("sqlite:{}", dir.path().join("s.db").display());
    let err = refused(&["--store", &store, "--listen", "0.0.0.0:0"]);
    assert!(err.contains("--auth-token-file"), "{err}");
    let short = dir.path().join("token");
    std::fs::write(&short, "abc\n").unwrap();
    let err = refused(&[
        "--store",
        &store,
        "--listen",
        "0.0.0.0:0",
        "--auth-token-file",
        short.to_str().unwrap(),
    ]);
    assert!(err.contains("at least 16"), "{err}");
    let err = refused(&["--store", &store, "--listen", "localhost:7070"]);
    assert!(err.contains("IP:PORT"), "{err}");
    let err = refused(&["--store", &store, "--holder", "has space"]);
    assert!(err.contains("--holder"), "{err}");
    for threads in ["0", "257", "two"] {
        let err = refused(&["--store", &store, "--threads", threads]);
        assert!(err.contains("--threads"), "{threads}: {err}");
    }
    for host in ["http://sidecar", "sidecar:7070", "*.example", "a b"] {
        let err = refused(&["--store", &store, "--allow-host", host]);
        assert!(
            err.contains("--allow-host") && err.contains("without scheme or port"),
            "{host}: {err}"
        );
    }
    let token = dir.path().join("good-token");
    std::fs::write(&token, "0123456789abcdef0123\n").unwrap();
    let err = refused(&[
        "--store",
        &store,
        "--allow-host",
        "sidecar",
        "--auth-token-file",
        token.to_str().unwrap(),
    ]);
    assert!(err.contains("cannot be used with"), "{err}");
    let socket = format!("unix:{}", dir.path().join("s.sock").display());
    let err = refused(&[
        "--store",
        &store,
        "--listen",
        &socket,
        "--allow-host",
        "sidecar",
    ]);
    assert!(err.contains("--allow-host is for TCP"), "{err}");
}

/// Without a token the sidecar answers a request only under a loopback name or one given with
/// --allow-host, whatever the route and method (DNS rebinding: a web page reaching it under a
/// name of its own that resolves to 127.0.0.1 must not read or drive it).
#[test]
fn names_that_are_not_loopback_or_allowed_are_refused() {
    let dir = temp_dir();
    let store = format!("sqlite:{}", dir.path().join("s.db").display());
    let sidecar = Sidecar::start_with(
        &store,
        "hosts",
        &["--allow-host", "Sidecar.Test", "--allow-host", "10.1.2.3"],
    );
    let ask = |host: &str, method: &str, path: &str, body: Option<Value>| {
        let conn = TcpStream::connect(("127.0.0.1", sidecar.port)).unwrap();
        exchange(conn, host, method, path, body)
    };
    let tick = || Some(json!({"every_ms": 60000}));
    let port = sidecar.port;
    for host in [
        format!("evil.example:{port}"),
        "sidecar.test.evil".into(),
        "10.1.2.4".into(),
    ] {
        let (status, body) = ask(&host, "POST", "/v1/tasks/sweep/ticks", tick());
        assert_eq!(
            (status, body["error"].clone()),
            (403, json!("host-not-allowed")),
            "{host}"
        );
        let (status, _) = ask(&host, "GET", "/healthz", None);
        assert_eq!(status, 403, "{host}");
    }
    // Nothing was registered by the refused ticks.
    let (_, tasks) = ask("localhost", "GET", "/v1/tasks", None);
    assert_eq!(tasks["tasks"], json!([]), "{tasks}");
    for host in [
        format!("sidecar.test:{port}"),
        "SIDECAR.TEST".into(),
        "10.1.2.3:1".into(),
    ] {
        let (status, body) = ask(&host, "POST", "/v1/tasks/sweep/ticks", tick());
        assert_eq!(status, 200, "{host}: {body}");
    }
}
