//! The HTTP/1.1 server under the API: connections served with hyper directly, each bounded in
//! time while it waits for the client (the request's head, its body, the next request) and all
//! of them bounded in number, so clients that connect and send nothing, or send a byte at a
//! time, cannot hold descriptors and memory; and shutdown waits only for requests being
//! handled, at most its grace. (`axum::serve` bounds none of this.)
//!
//! A request being handled has no time limit here: the long-polls (acquire's wait, watch,
//! observe) answer by `max_wait` themselves.

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::http::header::{CONNECTION, CONTENT_TYPE, HeaderValue};
use axum::http::{Request, Response, StatusCode};
use hyper::body::{Body as HttpBody, Frame, Incoming, SizeHint};
use hyper::server::conn::http1;
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use leasehold::CancellationToken;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadBuf};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;
use tokio_util::task::TaskTracker;

/// How the sidecar's HTTP server treats connections: every wait on a client is bounded, and so
/// is the number of connections.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ServeConfig {
    /// The bearer token every request but `/healthz`, `/openapi.json`, `/metrics` and the page's
    /// own files must carry.
    /// Default none (then only loopback and unix sockets may be served).
    pub auth_token: Option<String>,
    /// How long a request's head (request line and headers) may take to arrive: from its first
    /// byte, or for a new connection from when it was accepted. A connection past it is closed.
    /// Default 10 s.
    pub header_read_timeout: Duration,
    /// How long a request's body may take to arrive, from the end of its head. A connection
    /// past it is closed. Default 10 s.
    pub body_read_timeout: Duration,
    /// How long a connection may wait for its next request after a response (keep-alive), or
    /// for its client to read the answers it stopped reading. Responses say so
    /// (`Keep-Alive: timeout=N`), so clients close it first. Default 60 s.
    pub idle_timeout: Duration,
    /// The most connections open at once. At the limit new connections wait in the listen
    /// backlog until one closes, and one log line says so (another when it clears). Keep it
    /// below the process's descriptor limit. Default 1024.
    pub max_connections: usize,
    /// How long shutdown waits for requests being handled (open long-polls answer 410 at once);
    /// connections waiting on their client are closed at once, and whatever is left when the
    /// grace ends. Default 10 s.
    pub shutdown_grace: Duration,
}

impl Default for ServeConfig {
    fn default() -> Self {
        Self {
            auth_token: None,
            header_read_timeout: Duration::from_secs(10),
            body_read_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
            max_connections: 1024,
            shutdown_grace: Duration::from_secs(10),
        }
    }
}

impl ServeConfig {
    /// Requires `Authorization: Bearer TOKEN` on every request but `/healthz`, `/openapi.json`,
    /// `/metrics` and the page's own files.
    pub fn auth_token(mut self, token: impl Into<String>) -> Self {
        self.auth_token = Some(token.into());
        self
    }

    /// Sets [`header_read_timeout`](Self::header_read_timeout).
    pub fn header_read_timeout(mut self, timeout: Duration) -> Self {
        self.header_read_timeout = timeout;
        self
    }

    /// Sets [`body_read_timeout`](Self::body_read_timeout).
    pub fn body_read_timeout(mut self, timeout: Duration) -> Self {
        self.body_read_timeout = timeout;
        self
    }

    /// Sets [`idle_timeout`](Self::idle_timeout).
    pub fn idle_timeout(mut self, timeout: Duration) -> Self {
        self.idle_timeout = timeout;
        self
    }

    /// Sets [`max_connections`](Self::max_connections) (at least 1).
    pub fn max_connections(mut self, max: usize) -> Self {
        self.max_connections = max.max(1);
        self
    }

    /// Sets [`shutdown_grace`](Self::shutdown_grace).
    pub fn shutdown_grace(mut self, grace: Duration) -> Self {
        self.shutdown_grace = grace;
        self
    }
}

/// The largest request head accepted (hyper answers 431 beyond it); also bounds the read
/// buffer each connection keeps.
const MAX_HEAD: usize = 16 * 1024;

/// A listener the server accepts connections from.
pub(crate) trait Accept: Send + Sync + 'static {
    type Io: AsyncRead + AsyncWrite + Unpin + Send + 'static;
    fn accept(&self) -> impl Future<Output = io::Result<Self::Io>> + Send;
}

impl Accept for tokio::net::TcpListener {
    type Io = tokio::net::TcpStream;
    async fn accept(&self) -> io::Result<Self::Io> {
        let (stream, _) = tokio::net::TcpListener::accept(self).await?;
        // Answers are small and written at once: do not hold them back for more.
        let _ = stream.set_nodelay(true);
        Ok(stream)
    }
}

impl Accept for tokio::net::UnixListener {
    type Io = tokio::net::UnixStream;
    async fn accept(&self) -> io::Result<Self::Io> {
        tokio::net::UnixListener::accept(self).await.map(|(s, _)| s)
    }
}

/// Serves `app` on `listener` until `stop` is cancelled, then waits for the connections to
/// end, at most the grace (each enforces it itself).
pub(crate) async fn run(
    listener: impl Accept,
    app: Router,
    config: &ServeConfig,
    stop: CancellationToken,
) {
    let limits = Arc::new(Limits::new(config));
    let slots = Arc::new(Slots::new(config.max_connections));
    let tracker = TaskTracker::new();
    loop {
        let slot = tokio::select! {
            biased;
            () = stop.cancelled() => break,
            slot = slots.take() => slot,
        };
        let io = tokio::select! {
            biased;
            () = stop.cancelled() => break,
            io = accept(&listener) => io,
        };
        tracker.spawn(connection(
            io,
            app.clone(),
            limits.clone(),
            stop.clone(),
            slot,
        ));
    }
    drop(listener);
    tracker.close();
    let backstop = config.shutdown_grace + Duration::from_secs(1);
    if tokio::time::timeout(backstop, tracker.wait())
        .await
        .is_err()
    {
        tracing::warn!("connections still open after the shutdown grace; leaving them");
    }
}

/// The next connection. Errors that concern one client (it hung up before the accept) are
/// skipped; others (out of descriptors or memory) are waited out, 100 ms at a time, rather
/// than retried in a busy loop.
async fn accept<L: Accept>(listener: &L) -> L::Io {
    let mut warned = false;
    loop {
        match listener.accept().await {
            Ok(io) => return io,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::ConnectionAborted
                        | io::ErrorKind::ConnectionReset
                        | io::ErrorKind::Interrupted
                ) => {}
            Err(e) => {
                if !std::mem::replace(&mut warned, true) {
                    tracing::warn!(error = %e, "cannot accept connections (is --max-connections above the descriptor limit?); retrying");
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// The time bounds, and the `Keep-Alive` header that announces the idle one.
struct Limits {
    header: Duration,
    body: Duration,
    idle: Duration,
    grace: Duration,
    keep_alive: HeaderValue,
}

impl Limits {
    fn new(config: &ServeConfig) -> Self {
        Self {
            header: config.header_read_timeout,
            body: config.body_read_timeout,
            idle: config.idle_timeout,
            grace: config.shutdown_grace,
            keep_alive: HeaderValue::from_str(&format!(
                "timeout={}",
                config.idle_timeout.as_secs()
            ))
            .unwrap_or_else(|_| HeaderValue::from_static("timeout=0")),
        }
    }
}

/// The connection slots: a semaphore, and whether the limit was reached (logged once, until
/// the open connections fall to three quarters of it with nobody waiting).
struct Slots {
    free: Arc<Semaphore>,
    max: usize,
    full: AtomicBool,
    /// The accept loop waits for a slot: a slot given back goes to it, so the limit has not
    /// cleared.
    waiting: AtomicBool,
}

impl Slots {
    fn new(max: usize) -> Self {
        Self {
            free: Arc::new(Semaphore::new(max)),
            max,
            full: AtomicBool::new(false),
            waiting: AtomicBool::new(false),
        }
    }

    /// A slot for the next connection, waiting for one to close at the limit.
    async fn take(self: &Arc<Self>) -> Slot {
        let permit = match self.free.clone().try_acquire_owned() {
            Ok(permit) => Some(permit),
            Err(_) => {
                self.waiting.store(true, Ordering::Relaxed);
                if !self.full.swap(true, Ordering::Relaxed) {
                    tracing::warn!(
                        max_connections = self.max,
                        "connection limit reached: new connections wait until one closes"
                    );
                }
                // The semaphore is never closed.
                let permit = self.free.clone().acquire_owned().await.ok();
                self.waiting.store(false, Ordering::Relaxed);
                permit
            }
        };
        Slot {
            _permit: permit,
            slots: self.clone(),
        }
    }
}

/// One connection's slot, given back when the connection ends.
struct Slot {
    _permit: Option<OwnedSemaphorePermit>,
    slots: Arc<Slots>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let slots = &self.slots;
        // This slot's permit is returned right after this function.
        let open = slots.max - slots.free.available_permits() - 1;
        if open <= slots.max * 3 / 4
            && !slots.waiting.load(Ordering::Relaxed)
            && slots.full.swap(false, Ordering::Relaxed)
        {
            tracing::info!(
                open,
                max_connections = slots.max,
                "below the connection limit again"
            );
        }
    }
}

/// What a connection is doing, which decides what it may wait for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Waiting for a request's head (from the connection's start or the request's first byte):
    /// the header timeout.
    Head,
    /// Waiting for a request's body: the body timeout.
    Body,
    /// A request is being handled or answered: no timeout (long-polls bound themselves).
    Busy,
    /// Waiting for the next request after a response: the idle timeout.
    Idle,
}

impl Phase {
    fn as_str(self) -> &'static str {
        match self {
            Self::Head => "request head",
            Self::Body => "request body",
            Self::Busy => "handling",
            Self::Idle => "idle",
        }
    }
}

/// A connection's state, shared by its reader, its service and its watchdog.
struct ConnState {
    inner: Mutex<StateInner>,
    /// Wakes the watchdog when the phase changes.
    changed: Notify,
    /// A request head carried both `Content-Length` and `Transfer-Encoding`.
    ambiguous_length: AtomicBool,
}

struct StateInner {
    phase: Phase,
    since: Instant,
    scan: HeadScan,
}

impl ConnState {
    fn new() -> Self {
        Self {
            inner: Mutex::new(StateInner {
                phase: Phase::Head,
                since: Instant::now(),
                scan: HeadScan::default(),
            }),
            changed: Notify::new(),
            ambiguous_length: AtomicBool::new(false),
        }
    }

    fn lock(&self) -> MutexGuard<'_, StateInner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn phase(&self) -> (Phase, Instant) {
        let inner = self.lock();
        (inner.phase, inner.since)
    }

    /// Moves to `phase`, if the connection is in one of `from`.
    fn enter(&self, phase: Phase, from: &[Phase]) {
        let mut inner = self.lock();
        if from.contains(&inner.phase) && inner.phase != phase {
            inner.phase = phase;
            inner.since = Instant::now();
            drop(inner);
            self.changed.notify_one();
        }
    }

    /// Bytes read from the client: the first of a request starts its head; a head's bytes are
    /// scanned for the length headers.
    fn received(&self, bytes: &[u8]) {
        let mut inner = self.lock();
        if inner.phase == Phase::Idle {
            inner.phase = Phase::Head;
            inner.since = Instant::now();
            inner.scan = HeadScan::default();
            self.changed.notify_one();
        }
        if inner.phase == Phase::Head && inner.scan.feed(bytes) {
            self.ambiguous_length.store(true, Ordering::Relaxed);
        }
    }
}

/// Looks through a request head, as it arrives, for the `Content-Length` and
/// `Transfer-Encoding` headers: hyper takes such a request (chunked wins) and removes the
/// `Content-Length`, so the service could not tell; a proxy in front may have framed it the
/// other way (request smuggling), so it is refused.
#[derive(Default)]
struct HeadScan {
    /// The current line's header name so far, lowercased (when it could still be one of the
    /// two).
    name: [u8; 17],
    len: usize,
    /// Past the name (a `:` or a name too long) on the current line.
    past_name: bool,
    /// The current line has had a character other than CR.
    line_started: bool,
    /// A line (the request line) has been seen.
    any_line: bool,
    /// The blank line that ends the head has been seen.
    done: bool,
    content_length: bool,
    transfer_encoding: bool,
}

impl HeadScan {
    /// Scans `bytes`; true once both headers were seen.
    fn feed(&mut self, bytes: &[u8]) -> bool {
        for &b in bytes {
            if self.done {
                break;
            }
            match b {
                b'\n' => {
                    if !self.line_started && self.any_line {
                        self.done = true;
                    }
                    self.any_line |= self.line_started;
                    self.line_started = false;
                    self.past_name = false;
                    self.len = 0;
                }
                b'\r' => {}
                _ => {
                    self.line_started = true;
                    if self.past_name {
                        continue;
                    }
                    if b == b':' {
                        match &self.name[..self.len] {
                            b"content-length" => self.content_length = true,
                            b"transfer-encoding" => self.transfer_encoding = true,
                            _ => {}
                        }
                        self.past_name = true;
                    } else if self.len < self.name.len() {
                        self.name[self.len] = b.to_ascii_lowercase();
                        self.len += 1;
                    } else {
                        self.past_name = true;
                    }
                }
            }
        }
        self.content_length && self.transfer_encoding
    }
}

/// The client's stream, telling the connection's state what arrives.
struct Watched<I> {
    io: I,
    /// The connection's first byte, read before hyper took the stream over.
    first: Option<u8>,
    state: Arc<ConnState>,
}

impl<I: AsyncRead + Unpin> AsyncRead for Watched<I> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if let Some(byte) = self.first.take() {
            buf.put_slice(&[byte]);
            self.state.received(&[byte]);
            return Poll::Ready(Ok(()));
        }
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.io).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = polled {
            let new = &buf.filled()[before..];
            if !new.is_empty() {
                self.state.received(new);
            }
        }
        polled
    }
}

impl<I: AsyncWrite + Unpin> AsyncWrite for Watched<I> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

/// A request body, telling the connection's state when it has all arrived.
struct RequestBody {
    inner: Incoming,
    state: Arc<ConnState>,
}

impl HttpBody for RequestBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        if matches!(polled, Poll::Ready(None | Some(Err(_)))) || self.inner.is_end_stream() {
            self.state.enter(Phase::Busy, &[Phase::Body]);
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// A response body, telling the connection's state when it has been written (or dropped).
struct ResponseBody {
    inner: Body,
    state: Arc<ConnState>,
}

impl ResponseBody {
    fn finished(&self) {
        self.state.enter(Phase::Idle, &[Phase::Body, Phase::Busy]);
    }
}

impl HttpBody for ResponseBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        if matches!(polled, Poll::Ready(None)) {
            self.finished();
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for ResponseBody {
    fn drop(&mut self) {
        self.finished();
    }
}

/// The API behind one connection: marks the phases and refuses ambiguous lengths.
struct ConnService {
    app: TowerToHyperService<Router>,
    state: Arc<ConnState>,
    limits: Arc<Limits>,
}

type Answer = Pin<Box<dyn Future<Output = Result<Response<ResponseBody>, Infallible>> + Send>>;

impl hyper::service::Service<Request<Incoming>> for ConnService {
    type Response = Response<ResponseBody>;
    type Error = Infallible;
    type Future = Answer;

    fn call(&self, request: Request<Incoming>) -> Answer {
        let state = self.state.clone();
        if state.ambiguous_length.load(Ordering::Relaxed) {
            state.enter(Phase::Busy, &[Phase::Head]);
            let response = ambiguous_length().map(|inner| ResponseBody { inner, state });
            return Box::pin(std::future::ready(Ok(response)));
        }
        let reading = !request.body().is_end_stream();
        state.enter(
            if reading { Phase::Body } else { Phase::Busy },
            &[Phase::Head, Phase::Idle],
        );
        let request = request.map(|inner| {
            Body::new(RequestBody {
                inner,
                state: state.clone(),
            })
        });
        let answer = hyper::service::Service::call(&self.app, request);
        let keep_alive = self.limits.keep_alive.clone();
        Box::pin(async move {
            let mut response = answer.await?;
            response.headers_mut().insert(
                axum::http::header::HeaderName::from_static("keep-alive"),
                keep_alive,
            );
            Ok(response.map(|inner| ResponseBody { inner, state }))
        })
    }
}

/// 400 for a request with both `Content-Length` and `Transfer-Encoding`; the connection closes
/// after it (its framing cannot be trusted).
fn ambiguous_length() -> Response<Body> {
    let body = serde_json::json!({
        "error": "bad-request",
        "message": "a request must not carry both Content-Length and Transfer-Encoding",
    });
    let mut response = Response::new(Body::from(body.to_string()));
    *response.status_mut() = StatusCode::BAD_REQUEST;
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    headers.insert(CONNECTION, HeaderValue::from_static("close"));
    response
}

/// Serves one connection until it ends, times out waiting for its client, or shutdown closes
/// it.
async fn connection<I>(
    io: I,
    app: Router,
    limits: Arc<Limits>,
    stop: CancellationToken,
    _slot: Slot,
) where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let state = Arc::new(ConnState::new());
    // hyper keeps 16 KiB of buffers per connection from its start: a client that has sent
    // nothing yet gets none (so a flood of silent connections costs little memory).
    let mut io = io;
    let mut first = [0u8; 1];
    let read = tokio::select! {
        read = tokio::time::timeout(limits.header, io.read(&mut first)) => read,
        () = stop.cancelled() => return,
    };
    match read {
        Ok(Ok(1)) => {}
        Ok(_) => return,
        Err(_) => {
            tracing::debug!(
                waiting_for = Phase::Head.as_str(),
                "connection timed out; closed"
            );
            return;
        }
    }
    let service = ConnService {
        app: TowerToHyperService::new(app),
        state: state.clone(),
        limits: limits.clone(),
    };
    let io = TokioIo::new(Watched {
        io,
        first: Some(first[0]),
        state: state.clone(),
    });
    let conn = http1::Builder::new()
        .keep_alive(true)
        // The header timeout is kept here, beside the others (hyper's would also be the idle
        // one).
        .header_read_timeout(None)
        .max_buf_size(MAX_HEAD)
        .serve_connection(io, service);
    tokio::pin!(conn);
    // When shutdown began, the end of its grace.
    let mut draining: Option<Instant> = None;
    loop {
        let (phase, since) = state.phase();
        let deadline = match (phase, draining) {
            // Shutting down: only a request being handled is waited for.
            (Phase::Busy, Some(end)) => Some(end),
            (_, Some(_)) => return,
            (Phase::Head, None) => Some(since + limits.header),
            (Phase::Body, None) => Some(since + limits.body),
            (Phase::Idle, None) => Some(since + limits.idle),
            (Phase::Busy, None) => None,
        };
        let changed = state.changed.notified();
        tokio::select! {
            ended = conn.as_mut() => {
                if let Err(e) = ended {
                    tracing::debug!(error = %e, "connection ended with an error");
                }
                return;
            }
            () = changed => {}
            () = sleep_until(deadline) => {
                if state.phase() == (phase, since) {
                    tracing::debug!(waiting_for = phase.as_str(), "connection timed out; closed");
                    return;
                }
            }
            () = stop.cancelled(), if draining.is_none() => {
                conn.as_mut().graceful_shutdown();
                draining = Some(Instant::now() + limits.grace);
            }
        }
    }
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scan(parts: &[&str]) -> bool {
        let mut scan = HeadScan::default();
        parts.iter().any(|p| scan.feed(p.as_bytes()))
    }

    #[test]
    fn both_length_headers_are_found_in_any_case_and_split() {
        assert!(scan(&[
            "POST /x HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n"
        ]));
        assert!(scan(&[
            "POST /x HTTP/1.1\r\ntransfer-ENCODING: chunked\r\n",
            "CONTENT-len",
            "gth:",
            " 5\r\n\r\n"
        ]));
        // Byte by byte.
        let head = "POST / HTTP/1.1\nContent-Length: 3\nTransfer-Encoding: chunked\n\n";
        let bytes: Vec<String> = head.chars().map(String::from).collect();
        let parts: Vec<&str> = bytes.iter().map(String::as_str).collect();
        assert!(scan(&parts));
    }

    #[test]
    fn one_length_header_or_lookalikes_pass() {
        assert!(!scan(&[
            "POST /x HTTP/1.1\r\nContent-Length: 5\r\n\r\nTransfer-Encoding: chunked\r\n"
        ]));
        assert!(!scan(&[
            "POST /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\nX: content-length: 3\r\n\r\n"
        ]));
        assert!(!scan(&[
            "POST /x HTTP/1.1\r\nX-Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n"
        ]));
        assert!(!scan(&[
            "POST http://content-length:5/ HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
        ]));
    }
}
