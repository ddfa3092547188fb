//! The leasehold sidecar: leases, group leadership and gated timer ticks over HTTP, for
//! applications in any language. `leasehold serve` runs it; this crate is the server.
//!
//! Run one sidecar beside each instance of the application, every sidecar on the same store.
//! The application keeps its own timer and asks its sidecar before each run:
//!
//! ```text
//! POST /v1/tasks/expire-gigs/ticks   {"every_ms": 60000}
//!   -> {"run": true, "slot": 1767225600000, "token": "1767225512345001", "valid_for_ms": 23980, ...}
//!   or {"run": false, "slot": 1767225600000, "reason": "already-run"}
//! POST /v1/tasks/expire-gigs/ticks/1767225600000/done   {"token": "1767225512345001", "outcome": "ok"}
//! ```
//!
//! The whole API, with what each answer means, is the OpenAPI document served at
//! `GET /openapi.json` ([`OPENAPI`]). Two rules carry the guarantees:
//!
//! - **The application's liveness is part of the lease.** A lease or run is renewed in the store
//!   only while the application calls `keepalive` (or `watch`) at least once per `keepalive_ms`;
//!   a hung application loses it then, and cannot block the others.
//! - **Every grant says for how long the application may act** (`valid_for_ms`, from when the
//!   request arrived): the earlier of the lease's deadline less its stop margin and the
//!   application's keepalive deadline. A loss is learnt from `watch` (a long-poll) the moment it
//!   happens.
//!
//! ```no_run
//! # async fn demo() -> std::io::Result<()> {
//! use leasehold::{BoxStore, MemoryStore};
//! use leasehold_serve::{Listen, ServeConfig, Sidecar, SidecarConfig};
//!
//! let sidecar = Sidecar::new(BoxStore::new(MemoryStore::new()), SidecarConfig::default());
//! let listen: Listen = "127.0.0.1:7070".parse().expect("an address");
//! let shutdown = async { let _ = tokio::signal::ctrl_c().await; };
//! leasehold_serve::serve(sidecar, &listen, ServeConfig::default(), shutdown).await
//! # }
//! ```
//!
//! ## The fleet
//!
//! Every sidecar also answers for the whole store (`leasehold::overview` computes it, so
//! `leasehold status` shows the same): `GET /v1/tasks` lists the tasks of the store's catalog
//! (library schedulers, `leasehold run`, sidecar ticks) with their state, instances, last run,
//! next slot and misses of the last 24 hours; `GET /v1/tasks/{task}` adds the history;
//! `GET /v1/leases` lists the leases. `POST /v1/tasks/{task}/pause`, `/resume` and `/trigger`
//! act on every instance of the task through the store (`leasehold::fleet::Fleet`), and
//! `/backfill` (`{"from_ms", "to_ms"}`) asks for the task's past slots in that range without an
//! ok run (`leasehold trigger --slots`). Errors are typed: `unknown-task` 404, `no-instance` 409
//! (a trigger nobody would take), `no-backfill` and `trigger-waiting` 409, `no-catalog` 501.
//!
//! Ticks register their task in the catalog (source `sidecar`, with its schedule and policy,
//! and as an instance the application replica the tick names in `instance`, `via` this sidecar,
//! or this sidecar itself for a tick that names none) for as long as they keep coming: twice
//! the interval plus the ttl, for each instance on its own. Run and lease holders start with
//! the instance (`INSTANCE@SIDECAR#N`). A paused task's ticks answer `run: false, reason: "paused"`; a trigger is taken by the
//! task's next tick on an instance that may run it, which answers `run: true, trigger:
//! "manual"` (the application hears of it only when it ticks). A grant that does not follow the
//! previous firing granted by this sidecar records the slots in between that nobody ran as
//! missed, so a crash or an outage shows in `leasehold history`.
//!
//! ## Connections
//!
//! The server (HTTP/1.1, [`serve`]) bounds every wait on a client, so clients that connect and
//! send nothing, or send a byte at a time, cannot exhaust its descriptors or memory
//! ([`ServeConfig`], `leasehold serve` flags in brackets):
//!
//! | bound | default | closes a connection that |
//! |---|---|---|
//! | header read timeout (`--header-read-timeout`) | 10 s | has not sent a complete request head this long after it connected, or after the head's first byte |
//! | body read timeout (`--body-read-timeout`) | 10 s | has not sent the whole body this long after the head |
//! | idle timeout (`--idle-timeout`) | 60 s | has sent no new request this long after a response (responses carry `Keep-Alive: timeout=N`), or has stopped reading its answers this long |
//! | connection limit (`--max-connections`) | 1024 | — new connections wait in the listen backlog while this many are open; one log line when the limit is reached, one when it clears |
//! | shutdown grace (`--shutdown-grace`) | 10 s | — on shutdown, connections waiting on their client close at once, requests being handled get this long (open long-polls answer 410 at once) |
//!
//! A request being handled has no time limit of the server's: the long-polls bound themselves
//! by `max_wait`. A request with both `Content-Length` and `Transfer-Encoding` is refused
//! (400, connection closed): a proxy in front might have framed it differently.
//!
//! ## Where it answers
//!
//! Without a token, every request (any route, method or headers) must name the sidecar in its
//! `Host` by a loopback address, `localhost`, a `*.localhost` name or one of
//! [`SidecarConfig::allowed_hosts`] (`leasehold serve --allow-host`); others get 403
//! `host-not-allowed`, so a web page cannot reach it through a DNS name of its own rebound to
//! 127.0.0.1. See [`Sidecar::router`] for requests without `Host`, tokens and unix sockets.
//!
//! Names in paths are one segment each (`/` as `%2F`), and a `%2E` left after decoding is a dot
//! (names never hold `%`): a name that is `.` or `..`, which clients resolve away even as `%2E`,
//! is sent as `%252E` / `%252E%252E`. So every valid name can be addressed.
//!
//! ## The page
//!
//! `GET /` is a live page of the fleet for a person: the tasks of the store's catalog (state,
//! leader or owner, last run, next due slot, missed slots of the last 24 h and why, instances),
//! leader groups and leases (holder, fencing token, time left), and per task (`/tasks/NAME`, each
//! `/`-separated part of the name a segment, `.` and `..` parts written as above) its run history as the timeline picture `leasehold history --svg` draws (served at
//! `GET /v1/tasks/{task}/history.svg`) above the runs, newest first, with Pause, Resume and
//! Trigger buttons that ask for confirmation. It reads the fleet endpoints once a second rather
//! than over server-sent events: `EventSource` cannot send the bearer token, and a poll is a
//! short request the connection bounds above already fit. Its HTML, CSS and JavaScript are
//! embedded in the binary and fetch nothing from elsewhere. They carry no data, so they are
//! served without the token; with one set, the page asks for it, keeps it in the tab's
//! `sessionStorage` and says so on a 401. A browser's request for an unknown path (or a task
//! the catalog does not know) gets a 404 page; other clients get the API's JSON 404.
//!
//! ## Metrics
//!
//! Given a [`Metrics`] recorder ([`SidecarConfig::metrics`]; `leasehold serve` always gives
//! one), `GET /metrics` answers in the Prometheus text format without the token: the engine's
//! metrics, the store calls' (wrap the store in `leasehold::store::Metered`) and the sidecar's
//! own, requests by route template and status, their durations (the waits, on the
//! long-polls), grants and their ends. docs/metrics.md in the repository lists them all.
//! [`Metrics::listen`] serves them alone on a listener of their own (`leasehold run
//! --metrics-listen`).
// Library code reports failures as values; tests may unwrap.
#![cfg_attr(
    not(test),
    deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)
)]

mod assets;
mod error;
mod fleet;
mod held;
mod hosts;
mod leases;
mod listen;
mod owed;
mod page;
mod prometheus;
mod series;
mod server;
mod sidecar;
mod ticks;

pub use hosts::{AllowedHost, BadHost};
pub use listen::{BadListen, Listen};
pub use server::ServeConfig;
pub use sidecar::{Kept, Sidecar, SidecarConfig};

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::HeaderMap;
use axum::http::header::{AUTHORIZATION, CONTENT_TYPE, HOST, ORIGIN};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use leasehold::{BoxStore, CancellationToken, Purge, Store};
use serde::Serialize;

use crate::error::{ApiError, MAX_BODY, MAX_DONE_BODY};
pub use crate::prometheus::{Metrics, MetricsError, MetricsListener};

/// Worker threads of `leasehold serve`'s runtime unless `--threads` says otherwise. One thread
/// serves the API fastest on a small machine: with two, a request and the store connection it
/// waits for keep waking each other's thread (measured on 2 cores with Redis and 64 ticking
/// connections: 36,000 decisions/s on one thread against 29,000-35,000 on two, and lower
/// latency for a single client). Give it more where one sidecar serves many applications on a
/// machine with cores to spare.
pub const DEFAULT_THREADS: usize = 1;

/// The API's OpenAPI 3 document, as served at `GET /openapi.json`.
pub const OPENAPI: &str = include_str!("../openapi.json");

/// The HTTP API over a sidecar's state: here, above the handlers it routes to.
impl Sidecar {
    /// The HTTP API and the live page. With `auth_token`, every request but `/healthz`,
    /// `/openapi.json`, `/metrics` and the page's own files (`/`, `/tasks/NAME`, `/assets/…`,
    /// which carry no data) must carry `Authorization: Bearer TOKEN`. (The token grants taking and
    /// releasing leases; a scraper needs none of that, and metrics carry counts and task names,
    /// never holders, tokens or store credentials.)
    ///
    /// Without `auth_token`, every request (any route, method and headers) whose `Host` is not
    /// a loopback address, `localhost`, a `*.localhost` name or one of
    /// [`SidecarConfig::allowed_hosts`] is refused with 403 (`host-not-allowed`): else a web
    /// page could read and drive the sidecar through a DNS name of its own that resolves to
    /// 127.0.0.1 (DNS rebinding). A request without `Host` (HTTP/1.0) is served: browsers always
    /// send one. [`serve`] on a unix socket leaves this check out (no browser connects there, and
    /// clients put anything in `Host`).
    pub fn router(&self, auth_token: Option<String>) -> Router {
        self.app(auth_token, true)
    }

    /// The router, with the `Host` check (without a token) or without it (a unix socket).
    fn app(&self, auth_token: Option<String>, host_check: bool) -> Router {
        let hosts = hosts::HostRule::new(
            host_check && auth_token.is_none(),
            self.0.allowed_hosts.clone(),
        );
        let api = Router::new()
            .route("/v1/tasks", get(fleet::tasks))
            .route("/v1/tasks/{task}", get(fleet::task))
            .route("/v1/tasks/{task}/pause", post(fleet::pause))
            .route("/v1/tasks/{task}/resume", post(fleet::resume))
            .route("/v1/tasks/{task}/trigger", post(fleet::trigger))
            .route("/v1/tasks/{task}/backfill", post(fleet::backfill))
            .route("/v1/tasks/{task}/forget", post(fleet::forget))
            .route("/v1/leases", get(fleet::leases))
            .route("/v1/leases/{name}", get(leases::state))
            .route("/v1/leases/{name}/acquire", post(leases::acquire))
            .route("/v1/leases/{name}/keepalive", post(leases::keepalive_lease))
            .route("/v1/leases/{name}/watch", post(leases::watch))
            .route("/v1/leases/{name}/release", post(leases::release))
            .route("/v1/groups/{group}", get(leases::leader))
            .route("/v1/groups/{group}/campaign", post(leases::campaign))
            .route("/v1/groups/{group}/observe", post(leases::observe))
            .route("/v1/tasks/{task}/ticks", post(ticks::tick))
            .route(
                "/v1/tasks/{task}/ticks/{slot}/done",
                post(ticks::done).layer(DefaultBodyLimit::max(MAX_DONE_BODY)),
            )
            .route("/v1/tasks/{task}/history.svg", get(page::history_svg))
            .route_layer(axum::middleware::from_fn_with_state(
                Arc::new(auth_token),
                authorize,
            ));
        Router::new()
            .route("/healthz", get(health))
            .route("/openapi.json", get(openapi))
            .route("/metrics", get(sidecar_scrape))
            .route("/", get(assets::index))
            .route("/tasks/{*task}", get(page::task_page))
            .route("/assets/page.js", get(assets::script))
            .route("/assets/page.css", get(assets::style))
            .merge(api)
            .fallback(not_found)
            .method_not_allowed_fallback(method_not_allowed)
            .layer(axum::middleware::from_fn_with_state(
                Arc::new(hosts),
                hosts::check_host,
            ))
            .layer(axum::middleware::from_fn(prometheus::count_request))
            .layer(DefaultBodyLimit::max(MAX_BODY))
            .with_state(self.clone())
    }
}

async fn authorize(
    State(token): State<Arc<Option<String>>>,
    request: Request,
    next: Next,
) -> Response {
    if let Some(why) = cross_site(request.headers()) {
        return ApiError::cross_site(why).into_response();
    }
    if let Some(token) = token.as_deref() {
        let given = request
            .headers()
            .get(AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .unwrap_or("");
        if !same(given.as_bytes(), token.as_bytes()) {
            return ApiError::unauthorized().into_response();
        }
    }
    next.run(request).await
}

/// Why a request a browser sent on behalf of another site is refused, if it is one. Any page a
/// browser on this machine opens can post to a loopback sidecar (a form needs no preflight).
/// Browsers say where such requests come from: `Origin` must be the sidecar itself, under the
/// name it was reached by (which `hosts` has checked). Clients that are not browsers send no
/// `Origin`.
fn cross_site(headers: &HeaderMap) -> Option<String> {
    let text = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    if text("sec-fetch-site") == Some("cross-site") {
        return Some("requests from another site's pages are refused".into());
    }
    let origin = text(ORIGIN.as_str())?;
    let authority = origin
        .strip_prefix("http://")
        .or_else(|| origin.strip_prefix("https://"));
    let host = text(HOST.as_str()).unwrap_or("");
    match authority {
        Some(a) if a.eq_ignore_ascii_case(host) => None,
        _ => Some(format!(
            "requests from another site's pages are refused (Origin {origin} is not this sidecar)"
        )),
    }
}

/// Compares without stopping at the first difference, so timing does not reveal the token.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[derive(Serialize)]
struct Health {
    status: &'static str,
    store: String,
    store_reachable: Option<bool>,
    held: u64,
}

async fn health(State(sidecar): State<Sidecar>) -> axum::Json<Health> {
    axum::Json(Health {
        status: "ok",
        store: sidecar.0.store.describe(),
        store_reachable: sidecar.store_reachable(),
        held: sidecar.held(),
    })
}

/// The sidecar's `GET /metrics`: 404 for a sidecar without a recorder.
async fn sidecar_scrape(State(sidecar): State<Sidecar>) -> Response {
    let Some(metrics) = sidecar.0.metrics.clone() else {
        return ApiError::not_found().into_response();
    };
    metrics::gauge!("leasehold_sidecar_held").set(sidecar.held() as f64);
    prometheus::scrape(State(metrics)).await
}

async fn openapi() -> Response {
    ([(CONTENT_TYPE, "application/json")], OPENAPI).into_response()
}

/// A browser's navigation to an unknown path gets the page's 404; anything else the API's.
async fn not_found(request: Request) -> Response {
    if assets::wants_html(&request) {
        assets::not_found_page()
    } else {
        ApiError::not_found().into_response()
    }
}

async fn method_not_allowed() -> ApiError {
    ApiError::method_not_allowed()
}

/// Serves `sidecar` on `listen` until `shutdown` completes, then stops taking connections,
/// waits for the requests being handled (at most `config`'s grace), releases what it holds for
/// applications and returns. Connections are bounded as [`ServeConfig`] says.
///
/// Binding beyond loopback without an auth token is refused: anyone who can reach the sidecar
/// could take and release leases.
pub async fn serve(
    sidecar: Sidecar,
    listen: &Listen,
    config: ServeConfig,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    if !listen.is_local() && config.auth_token.is_none() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            format!(
                "{listen} is reachable from other hosts: give an auth token file, or listen on loopback"
            ),
        ));
    }
    let app = sidecar.app(config.auth_token.clone(), matches!(listen, Listen::Tcp(_)));
    let stop = sidecar.0.stop.clone();
    let on_shutdown = stop.clone();
    let watch = async move {
        shutdown.await;
        // Open watches answer (410) at once rather than holding shutdown up.
        on_shutdown.cancel();
        std::future::pending::<()>().await;
    };
    let serving = async {
        match listen {
            Listen::Tcp(addr) => {
                let listener = tokio::net::TcpListener::bind(addr).await?;
                tokio::spawn(purge_hourly(sidecar.0.store.clone(), stop.clone()));
                server::run(listener, app, &config, stop).await;
            }
            Listen::Unix(path) => {
                let listener = listen::bind_unix(path)?;
                tokio::spawn(purge_hourly(sidecar.0.store.clone(), stop.clone()));
                server::run(listener, app, &config, stop).await;
            }
        }
        Ok::<(), std::io::Error>(())
    };
    tokio::select! {
        served = serving => served?,
        () = watch => {}
    }
    sidecar.shut_down(Duration::from_secs(10)).await;
    Ok(())
}

/// Applications name leases freely (a lease per job): the records of names free for a day are
/// purged every hour (see `Store::purge` for why fencing stays safe).
async fn purge_hourly(store: BoxStore, stop: CancellationToken) {
    let retention = leasehold::DEFAULT_SESSION_RETENTION;
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(Duration::from_secs(3600)) => {}
        }
        match store.purge(retention).await {
            Ok(n) => tracing::debug!(purged = n, "free lease records purged"),
            Err(leasehold::StoreError::Unsupported(_)) => return,
            Err(e) => tracing::debug!(error = %e, "purge failed; trying again in an hour"),
        }
    }
}
