//! Prometheus metrics of `leasehold serve` (`GET /metrics`) and `leasehold run --metrics-listen`:
//! real scrapes of both pass `promtool check metrics`, name only documented metrics and route
//! templates, and docs/alerts.yml passes `promtool check rules` and its unit tests.
//! (scripts/stores.sh installs promtool, from Debian's `prometheus` package.)

mod common;

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::{BIN, path_str, temp_dir};
use leasehold_testkit::free_port;

/// The repository's root.
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// An HTTP/1.1 exchange with `Connection: close`: status, headers and body.
fn http(
    port: u16,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: &str,
) -> (u16, String, String) {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
    let auth = token.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\n{auth}Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let status = response[9..12].parse().unwrap();
    let (head, body) = response.split_once("\r\n\r\n").unwrap();
    (status, head.to_owned(), body.to_owned())
}

fn wait_listening(port: u16) {
    let deadline = Instant::now() + Duration::from_secs(15);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "nothing listens on {port}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Runs `promtool ARGS` with `input` on stdin.
fn promtool(args: &[&str], dir: &Path, input: &str) -> Output {
    let mut child = Command::new("promtool")
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool (scripts/stores.sh installs Debian's prometheus package)");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

fn assert_promtool(args: &[&str], dir: &Path, input: &str) {
    let out = promtool(args, dir, input);
    assert!(
        out.status.success(),
        "promtool {args:?} failed:\n{}{}\n--- input:\n{input}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Metric names of a scrape (`_bucket`, `_sum`, `_count` of histograms folded into the name).
fn scraped_names(scrape: &str) -> BTreeSet<String> {
    scrape
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split(' ').next())
        .map(str::to_owned)
        .collect()
}

/// The metric names docs/metrics.md documents (its tables' first column).
fn documented() -> BTreeSet<String> {
    let docs = std::fs::read_to_string(root().join("docs/metrics.md")).unwrap();
    docs.lines()
        .filter_map(|l| l.strip_prefix("| `"))
        .filter_map(|l| l.split('`').next())
        .map(str::to_owned)
        .collect()
}

fn assert_documented(scrape: &str) {
    let documented = documented();
    let names = scraped_names(scrape);
    assert!(!names.is_empty(), "an empty scrape:\n{scrape}");
    let undocumented: Vec<_> = names.difference(&documented).collect();
    assert!(
        undocumented.is_empty(),
        "not in docs/metrics.md: {undocumented:?}"
    );
}

struct Process(Child);

impl Process {
    /// Starts `leasehold ARGS` quietly and waits until something listens on `port`.
    fn start(args: &mut Command, port: u16) -> Self {
        let child = args
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let process = Self(child);
        wait_listening(port);
        process
    }

    fn sigterm_and_wait(&mut self, limit: Duration) -> i32 {
        let ok = Command::new("kill")
            .args(["-TERM", &self.0.id().to_string()])
            .status()
            .unwrap()
            .success();
        assert!(ok);
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = self.0.try_wait().unwrap() {
                return status.code().unwrap_or(-1);
            }
            assert!(Instant::now() < deadline, "did not exit after SIGTERM");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The names recorded anywhere in the crates' sources (`counter!("leasehold_…"`, and the same
/// for gauges and histograms, possibly across a line break).
fn recorded_in(dir: &Path, names: &mut BTreeSet<String>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            recorded_in(&path, names);
        } else if path.extension().is_some_and(|e| e == "rs") {
            let text = std::fs::read_to_string(&path).unwrap();
            for macro_call in ["counter!(", "gauge!(", "histogram!("] {
                for (at, _) in text.match_indices(macro_call) {
                    let rest = text[at + macro_call.len()..].trim_start();
                    if let Some(name) = rest.strip_prefix("\"leasehold_") {
                        let name = name.split('"').next().unwrap();
                        names.insert(format!("leasehold_{name}"));
                    }
                }
            }
        }
    }
}

#[test]
fn every_metric_the_code_records_is_documented() {
    let mut recorded = BTreeSet::new();
    for entry in std::fs::read_dir(root().join("crates")).unwrap() {
        let src = entry.unwrap().path().join("src");
        if src.is_dir() {
            recorded_in(&src, &mut recorded);
        }
    }
    assert!(
        recorded.contains("leasehold_sidecar_requests_total"),
        "{recorded:?}"
    );
    assert!(recorded.contains("leasehold_ticks_total"), "{recorded:?}");
    let documented = documented();
    let missing: Vec<_> = recorded.difference(&documented).collect();
    assert!(
        missing.is_empty(),
        "recorded but not in docs/metrics.md: {missing:?}"
    );
}

#[test]
fn alert_rules_pass_promtool_and_their_unit_tests() {
    let docs = root().join("docs");
    assert_promtool(&["check", "rules", "alerts.yml"], &docs, "");
    let tests = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests");
    assert_promtool(&["test", "rules", "alerts.test.yml"], &tests, "");
    // The rules name only metrics that exist.
    let rules = std::fs::read_to_string(docs.join("alerts.yml")).unwrap();
    let documented = documented();
    for word in rules.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
        if word.starts_with("leasehold_") {
            assert!(
                documented.contains(word),
                "alerts.yml uses {word}, not in docs/metrics.md"
            );
        }
    }
}

#[test]
fn sidecar_scrape_passes_promtool_without_the_token_and_names_route_templates() {
    let dir = temp_dir();
    let token = "metrics-test-token-0123456789";
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, token).unwrap();
    let port = free_port();
    let mut sidecar = Process::start(
        Command::new(BIN)
            .args(["serve", "--store"])
            .arg(format!("sqlite:{}", path_str(&dir.path().join("s.db"))))
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .arg("--auth-token-file")
            .arg(&token_file),
        port,
    );
    // The API needs the token; the scrape does not.
    let (status, ..) = http(
        port,
        "POST",
        "/v1/leases/m-lease/acquire",
        None,
        r#"{"ttl_ms":5000}"#,
    );
    assert_eq!(status, 401);
    let lease = "m-lease-raw-name-7f3a";
    let (status, _, body) = http(
        port,
        "POST",
        &format!("/v1/leases/{lease}/acquire"),
        Some(token),
        r#"{"ttl_ms":5000}"#,
    );
    assert_eq!(status, 200, "{body}");
    let granted: serde_json::Value = serde_json::from_str(&body).unwrap();
    let lease_token = granted["token"].as_str().unwrap();
    let watch = format!(r#"{{"token":"{lease_token}","wait_ms":50}}"#);
    let (status, ..) = http(
        port,
        "POST",
        &format!("/v1/leases/{lease}/watch"),
        Some(token),
        &watch,
    );
    assert_eq!(status, 200);
    let release = format!(r#"{{"token":"{lease_token}"}}"#);
    let (status, ..) = http(
        port,
        "POST",
        &format!("/v1/leases/{lease}/release"),
        Some(token),
        &release,
    );
    assert_eq!(status, 200);
    let (status, _, body) = http(
        port,
        "POST",
        "/v1/tasks/m-task/ticks",
        Some(token),
        r#"{"every_ms":60000}"#,
    );
    assert_eq!(status, 200, "{body}");
    let (status, ..) = http(port, "GET", &format!("/no/such/{lease}"), Some(token), "");
    assert_eq!(status, 404);

    let (status, head, scrape) = http(port, "GET", "/metrics", None, "");
    assert_eq!(status, 200, "{scrape}");
    assert!(
        head.to_ascii_lowercase()
            .contains("content-type: text/plain; version=0.0.4"),
        "{head}"
    );
    assert_promtool(&["check", "metrics"], dir.path(), &scrape);
    assert_documented(&scrape);
    for line in [
        r#"leasehold_sidecar_requests_total{route="/v1/leases/{name}/acquire",status="200"} 1"#,
        r#"leasehold_sidecar_requests_total{route="/v1/leases/{name}/acquire",status="401"} 1"#,
        r#"leasehold_sidecar_requests_total{route="unmatched",status="404"} 1"#,
        r#"leasehold_sidecar_grants_total{kind="lease"} 1"#,
        r#"leasehold_sidecar_grants_total{kind="run"} 1"#,
        r#"leasehold_sidecar_ends_total{reason="released"} 1"#,
        r#"leasehold_sidecar_held 1"#,
        r#"leasehold_sidecar_request_duration_seconds_count{route="/v1/leases/{name}/watch"} 1"#,
        r#"leasehold_store_operations_total{op="claim_slot",result="claimed"} 1"#,
    ] {
        assert!(
            scrape.lines().any(|l| l == line),
            "no `{line}` in:\n{scrape}"
        );
    }
    assert!(!scrape.contains(lease), "a raw path in a label:\n{scrape}");
    assert!(!scrape.contains(lease_token), "a fencing token in a scrape");
    assert_eq!(sidecar.sigterm_and_wait(Duration::from_secs(15)), 0);
}

#[test]
fn run_metrics_listen_scrape_passes_promtool() {
    let dir = temp_dir();
    let port = free_port();
    let lease = format!("m-run-{}-{port}", std::process::id());
    let mut run = Process::start(
        Command::new(BIN)
            .args(["run", "--lease", &lease, "--every", "1s", "--store"])
            .arg(format!("sqlite:{}", path_str(&dir.path().join("r.db"))))
            .args([
                "--metrics-listen",
                &format!("127.0.0.1:{port}"),
                "--",
                "true",
            ]),
        port,
    );
    let ran = format!(r#"leasehold_ticks_total{{task="{lease}:run",outcome="ran"}}"#);
    let deadline = Instant::now() + Duration::from_secs(20);
    let scrape = loop {
        let (status, _, scrape) = http(port, "GET", "/metrics", None, "");
        assert_eq!(status, 200);
        if scrape.contains(&ran) {
            break scrape;
        }
        assert!(Instant::now() < deadline, "no run counted:\n{scrape}");
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_promtool(&["check", "metrics"], dir.path(), &scrape);
    assert_documented(&scrape);
    let leader = format!(r#"leasehold_leader{{group="{lease}"}} 1"#);
    assert!(
        scrape.lines().any(|l| l == leader),
        "no `{leader}` in:\n{scrape}"
    );
    assert!(
        scrape.contains(r#"leasehold_store_operations_total{op="claim_slot",result="claimed"}"#)
    );
    // Nothing but /metrics on that listener.
    assert_eq!(http(port, "GET", "/healthz", None, "").0, 404);
    assert_eq!(http(port, "POST", "/metrics", None, "").0, 405);
    assert_eq!(run.sigterm_and_wait(Duration::from_secs(15)), 0);
}

#[test]
fn metrics_listen_on_a_taken_address_is_one_error_before_anything_runs() {
    let dir = temp_dir();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap();
    let marker = dir.path().join("ran");
    let out = Command::new(BIN)
        .args(["run", "--lease", "m-taken", "--store"])
        .arg(format!("sqlite:{}", path_str(&dir.path().join("t.db"))))
        .args(["--metrics-listen", &addr.to_string(), "--", "touch"])
        .arg(&marker)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains(&format!("cannot listen for metrics on http://{addr}"))
            && stderr.contains("in use"),
        "{stderr}"
    );
    assert!(!marker.exists(), "the command ran");
}
