//! The server's bounds on connections (issue 32 item 4), in process on loopback with real
//! sockets and short timeouts: every wait on a client ends at its timeout, a request being
//! handled (a long-poll) is not cut off, both length headers together are refused, the
//! connection limit holds new connections back, and shutdown does not wait for slow clients.

use std::time::Duration;

use leasehold::{BoxStore, CancellationToken, MemoryStore};
use leasehold_serve::{Listen, ServeConfig, Sidecar, SidecarConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::task::JoinHandle;
use tokio::time::Instant;

const HEADER: Duration = Duration::from_millis(400);
const BODY: Duration = Duration::from_millis(400);
const IDLE: Duration = Duration::from_millis(800);

struct Server {
    port: u16,
    stop: CancellationToken,
    task: JoinHandle<std::io::Result<()>>,
}

impl Server {
    async fn start(config: ServeConfig) -> Self {
        let port = leasehold_testkit::free_port();
        let sidecar = Sidecar::new(
            BoxStore::new(MemoryStore::new()),
            SidecarConfig::default().holder("conn-test"),
        );
        let listen: Listen = format!("127.0.0.1:{port}").parse().unwrap();
        let stop = CancellationToken::new();
        let shutdown = stop.clone().cancelled_owned();
        let task = tokio::spawn(async move {
            leasehold_serve::serve(sidecar, &listen, config, shutdown).await
        });
        let deadline = Instant::now() + Duration::from_secs(5);
        while TcpStream::connect(("127.0.0.1", port)).await.is_err() {
            assert!(Instant::now() < deadline, "the server did not listen");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        Self { port, stop, task }
    }

    async fn quick() -> Self {
        Self::start(
            ServeConfig::default()
                .header_read_timeout(HEADER)
                .body_read_timeout(BODY)
                .idle_timeout(IDLE),
        )
        .await
    }

    async fn connect(&self) -> TcpStream {
        TcpStream::connect(("127.0.0.1", self.port)).await.unwrap()
    }
}

/// Reads until the server closes the connection (or 10 s pass); returns what came and when
/// the close was seen.
async fn until_closed(conn: &mut TcpStream) -> (String, Instant) {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match tokio::time::timeout_at(deadline, conn.read(&mut buf)).await {
            Err(_) => panic!(
                "not closed within 10 s; got {:?}",
                String::from_utf8_lossy(&got)
            ),
            Ok(Ok(0) | Err(_)) => {
                return (String::from_utf8_lossy(&got).into_owned(), Instant::now());
            }
            Ok(Ok(n)) => got.extend_from_slice(&buf[..n]),
        }
    }
}

/// Reads one response with a `content-length` body; returns its head and body.
async fn response(conn: &mut TcpStream) -> (String, String) {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let n = tokio::time::timeout(Duration::from_secs(10), conn.read(&mut buf))
            .await
            .expect("a response within 10 s")
            .unwrap();
        assert!(
            n > 0,
            "closed before a response: {:?}",
            String::from_utf8_lossy(&got)
        );
        got.extend_from_slice(&buf[..n]);
        let text = String::from_utf8_lossy(&got).into_owned();
        if let Some((head, body)) = text.split_once("\r\n\r\n") {
            let length = head
                .lines()
                .find_map(|l| {
                    l.to_ascii_lowercase()
                        .strip_prefix("content-length: ")
                        .map(str::to_owned)
                })
                .and_then(|v| v.trim().parse::<usize>().ok())
                .unwrap_or(0);
            if body.len() >= length {
                return (head.to_owned(), body.to_owned());
            }
        }
    }
}

async fn post(conn: &mut TcpStream, path: &str, body: &str) {
    conn.write_all(
        format!(
            "POST {path} HTTP/1.1\r\nHost: localhost\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .as_bytes(),
    )
    .await
    .unwrap();
}

fn between(took: Duration, low: Duration, high: Duration, what: &str) {
    println!("{what}: {took:?}");
    assert!(
        took >= low && took <= high,
        "{what}: {took:?} not in {low:?}..{high:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_that_sends_nothing_is_closed_at_the_header_timeout() {
    let server = Server::quick().await;
    let start = Instant::now();
    let mut conn = server.connect().await;
    let (got, closed) = until_closed(&mut conn).await;
    assert!(got.is_empty(), "{got}");
    between(
        closed - start,
        HEADER,
        HEADER * 3,
        "silent connection closed after",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_head_sent_byte_by_byte_is_closed_at_the_header_timeout() {
    let server = Server::quick().await;
    let start = Instant::now();
    let mut conn = server.connect().await;
    let head = b"GET /healthz HTTP/1.1\r\nHost: a-long-host-name-sent-slowly.example\r\n\r\n";
    let (mut reader, mut writer) = conn.split();
    let sender = async {
        for byte in head {
            if writer.write_all(&[*byte]).await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    let mut buf = [0u8; 64];
    let closed = tokio::select! {
        () = sender => panic!("the whole head went through"),
        read = reader.read(&mut buf) => {
            assert!(matches!(read, Ok(0) | Err(_)), "{read:?}");
            Instant::now()
        }
    };
    between(closed - start, HEADER, HEADER * 3, "slow head closed after");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kept_alive_connection_serves_again_then_is_closed_at_the_idle_timeout() {
    let server = Server::quick().await;
    let mut conn = server.connect().await;
    let mut answered = Instant::now();
    for _ in 0..2 {
        let sent = Instant::now();
        conn.write_all(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
            .await
            .unwrap();
        let (head, body) = response(&mut conn).await;
        // The server counts idle time from its answer, between these two.
        answered = sent;
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        assert!(
            head.to_ascii_lowercase().contains("keep-alive: timeout="),
            "{head}"
        );
        assert!(body.contains("\"status\":\"ok\""), "{body}");
        // Well within the idle timeout (and longer than the header timeout: idle is not a head).
        tokio::time::sleep(IDLE / 2 + Duration::from_millis(50)).await;
    }
    let (got, closed) = until_closed(&mut conn).await;
    assert!(got.is_empty(), "{got}");
    between(
        closed - answered,
        IDLE,
        IDLE * 2,
        "idle connection closed after",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_body_is_closed_at_the_body_timeout() {
    let server = Server::quick().await;
    let mut conn = server.connect().await;
    conn.write_all(
        b"POST /v1/leases/slow/acquire HTTP/1.1\r\nHost: localhost\r\nContent-Length: 40\r\n\r\n{\"ttl",
    )
    .await
    .unwrap();
    let sent = Instant::now();
    let (got, closed) = until_closed(&mut conn).await;
    assert!(got.is_empty(), "{got}");
    between(closed - sent, BODY, BODY * 3, "slow body closed after");
}

/// A client that sends requests and never reads the answers (they pile up in the socket buffers
/// until the server's writes stall) is closed too: at the idle timeout after the server handed
/// over its last answer, instead of holding the connection as long as it likes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_never_reads_its_answers_is_closed() {
    let server = Server::quick().await;
    let mut conn = server.connect().await;
    let request = b"GET /openapi.json HTTP/1.1\r\nHost: localhost\r\n\r\n".repeat(3000);
    let start = Instant::now();
    // Some of it may not be taken once the server stops reading.
    let _ = tokio::time::timeout(Duration::from_secs(2), conn.write_all(&request)).await;
    // Not reading, well past the idle timeout.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (got, _) = until_closed(&mut conn).await;
    let answers = got.matches("HTTP/1.1 200").count();
    println!(
        "never-reading client: closed; {answers} of 3000 answers read before the reset ({} KiB)",
        got.len() >> 10
    );
    assert!(answers < 3000, "every answer went out: nothing stalled");
    assert!(start.elapsed() < Duration::from_secs(8));
}

/// A request being handled has no timeout of the server's: an acquire that waits for a busy
/// lease answers after its wait, well past every timeout, on the same connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_poll_outlives_every_timeout() {
    let server = Server::quick().await;
    let mut holder = server.connect().await;
    let body = r#"{"ttl_ms": 10000}"#;
    holder
        .write_all(
            format!(
                "POST /v1/leases/busy/acquire HTTP/1.1\r\nHost: localhost\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            )
            .as_bytes(),
        )
        .await
        .unwrap();
    let (_, granted) = response(&mut holder).await;
    assert!(granted.contains("\"acquired\":true"), "{granted}");

    let mut waiter = server.connect().await;
    let body = r#"{"ttl_ms": 10000, "wait_ms": 2000}"#;
    let sent = Instant::now();
    waiter
        .write_all(
            format!(
                "POST /v1/leases/busy/acquire HTTP/1.1\r\nHost: localhost\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            )
            .as_bytes(),
        )
        .await
        .unwrap();
    let (head, answer) = response(&mut waiter).await;
    let took = sent.elapsed();
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(answer.contains("\"acquired\":false"), "{answer}");
    between(
        took,
        Duration::from_millis(1900),
        Duration::from_secs(5),
        "long-poll answered after",
    );
    // And the connection is still usable.
    waiter
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .await
        .unwrap();
    let (head, _) = response(&mut waiter).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_length_headers_are_refused_and_the_connection_closed() {
    let server = Server::quick().await;
    for head in [
        "Content-Length: 5\r\nTransfer-Encoding: chunked",
        "transfer-encoding: chunked\r\ncontent-length: 5",
    ] {
        let mut conn = server.connect().await;
        conn.write_all(
            format!(
                "POST /v1/leases/x/acquire HTTP/1.1\r\nHost: localhost\r\n{head}\r\n\r\n0\r\n\r\nGET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n"
            )
            .as_bytes(),
        )
        .await
        .unwrap();
        let (got, _) = until_closed(&mut conn).await;
        assert!(got.starts_with("HTTP/1.1 400"), "{got}");
        assert!(
            got.contains("Content-Length and Transfer-Encoding"),
            "{got}"
        );
        // The request after it on the same connection was not served.
        assert_eq!(got.matches("HTTP/1.1").count(), 1, "{got}");
    }
    // One of them alone is fine.
    let mut conn = server.connect().await;
    conn.write_all(
        b"POST /v1/leases/chunked/acquire HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: chunked\r\n\r\n11\r\n{\"ttl_ms\": 10000}\r\n0\r\n\r\n",
    )
    .await
    .unwrap();
    let (head, body) = response(&mut conn).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head} {body}");
}

/// At the limit a new connection waits (in the listen backlog) and is served once another
/// closes: here when the silent ones reach the header timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_the_connection_limit_new_connections_wait_for_a_free_slot() {
    let server = Server::start(
        ServeConfig::default()
            .header_read_timeout(Duration::from_secs(1))
            .max_connections(3),
    )
    .await;
    // The server's own readiness probe took a slot for a moment; let it go.
    tokio::time::sleep(Duration::from_millis(50)).await;
    let start = Instant::now();
    let mut silent = Vec::new();
    for _ in 0..3 {
        silent.push(server.connect().await);
    }
    let mut late = server.connect().await;
    late.write_all(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .await
        .unwrap();
    let (head, _) = response(&mut late).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    between(
        start.elapsed(),
        Duration::from_millis(900),
        Duration::from_secs(3),
        "fourth connection served after",
    );
}

/// On shutdown, connections waiting on their client (a half-sent head, a half-sent body, an
/// idle one) are closed at once and a request being handled gets the grace: the server is
/// gone within it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_does_not_wait_for_slow_clients() {
    let grace = Duration::from_secs(2);
    let server = Server::start(
        ServeConfig::default()
            .header_read_timeout(Duration::from_secs(30))
            .body_read_timeout(Duration::from_secs(30))
            .shutdown_grace(grace),
    )
    .await;
    let mut half_head = server.connect().await;
    half_head
        .write_all(b"GET /healthz HTTP/1.1\r\nHo")
        .await
        .unwrap();
    let mut half_body = server.connect().await;
    half_body
        .write_all(
            b"POST /v1/leases/x/acquire HTTP/1.1\r\nHost: localhost\r\nContent-Length: 40\r\n\r\n{",
        )
        .await
        .unwrap();
    // A long-poll being handled: a watch on a held lease.
    let mut holder = server.connect().await;
    post(
        &mut holder,
        "/v1/leases/held/acquire",
        r#"{"ttl_ms": 10000}"#,
    )
    .await;
    let (_, granted) = response(&mut holder).await;
    let token = granted
        .split("\"token\":\"")
        .nth(1)
        .and_then(|t| t.split('"').next())
        .expect("a token")
        .to_owned();
    let mut watcher = server.connect().await;
    post(
        &mut watcher,
        "/v1/leases/held/watch",
        &format!(r#"{{"token": "{token}", "wait_ms": 20000}}"#),
    )
    .await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let start = Instant::now();
    server.stop.cancel();
    // It is answered (the lease is released on shutdown), not cut off.
    let (head, body) = response(&mut watcher).await;
    println!(
        "watch answered {:?} after shutdown: {head} {body}",
        start.elapsed()
    );
    assert!(head.starts_with("HTTP/1.1 "), "{head}");
    let (_, closed) = until_closed(&mut half_head).await;
    println!("half-sent head closed {:?} after shutdown", closed - start);
    assert!(closed - start < Duration::from_millis(500));
    let (_, closed) = until_closed(&mut half_body).await;
    assert!(closed - start < Duration::from_millis(500));
    tokio::time::timeout(grace + Duration::from_secs(1), server.task)
        .await
        .expect("serve returned within the grace")
        .unwrap()
        .unwrap();
    println!("serve returned {:?} after shutdown", start.elapsed());
}
