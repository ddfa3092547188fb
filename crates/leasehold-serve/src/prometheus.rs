//! `GET /metrics` in the Prometheus text format: the engine's metrics (docs/metrics.md) and the
//! sidecar's own, through the `metrics` facade and the recorder of [`crate::series`] (whose
//! series about a task or group end with it, and whose task and group names are capped).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::{MatchedPath, Request, State};
use axum::http::header::CONTENT_TYPE;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use metrics::Unit;
use tokio::time::Instant;

use leasehold::CancellationToken;

use crate::hosts::{HostRule, check_host};
use crate::listen::{Listen, bind_unix};
use crate::series::{MAX_NAMES, Series, SeriesRecorder};
use crate::server::{self, ServeConfig};

/// Histogram buckets, in seconds: from a store's sub-millisecond answer to a 5-minute long-poll.
const BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
    120.0, 300.0,
];

/// How often the series of given-up tasks and groups are removed between scrapes, so memory
/// stays bounded when nobody scrapes.
const UPKEEP: Duration = Duration::from_secs(5);

/// The Prometheus text format's content type.
const TEXT_FORMAT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// The route label of requests no route matched (a raw path would make the label unbounded).
const UNMATCHED: &str = "unmatched";

/// The process's Prometheus recorder: what `GET /metrics` renders. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Metrics {
    series: Arc<Series>,
}

/// Why [`Metrics::install`] failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MetricsError {
    /// The recorder could not be installed: another one is (there is one per process).
    #[error("cannot install the Prometheus recorder: the process has a metrics recorder already")]
    Install,
    /// Not called within a tokio runtime, which runs the recorder's upkeep.
    #[error("the metrics recorder needs a tokio runtime for its upkeep")]
    NoRuntime,
}

impl Metrics {
    /// Installs a Prometheus recorder as the process's [`metrics`] recorder, with the help text
    /// of the engine's and the sidecar's metrics, and starts its upkeep on the current tokio
    /// runtime. Once per process.
    pub fn install() -> Result<Self, MetricsError> {
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| MetricsError::NoRuntime)?;
        let series = Arc::new(Series::new(BUCKETS, MAX_NAMES));
        metrics::set_global_recorder(SeriesRecorder(series.clone()))
            .map_err(|_| MetricsError::Install)?;
        leasehold::describe_metrics();
        describe_sidecar_metrics();
        let upkeep = Arc::downgrade(&series);
        runtime.spawn(async move {
            loop {
                tokio::time::sleep(UPKEEP).await;
                match upkeep.upgrade() {
                    Some(series) => series.sweep(),
                    None => break,
                }
            }
        });
        Ok(Self { series })
    }

    /// Every metric recorded so far, in the Prometheus text format, without the series of
    /// tasks and groups given up.
    pub fn render(&self) -> String {
        self.series.sweep();
        self.series.render()
    }

    /// A router that serves `GET /metrics` and nothing else (404 for any other path).
    pub fn router(&self) -> Router {
        Router::new()
            .route("/metrics", get(scrape))
            .with_state(self.clone())
    }

    /// Binds `listen` for a listener that serves only `GET /metrics` (see
    /// [`MetricsListener::serve`]); fails at once if the address is taken. On a loopback
    /// address it answers only requests whose `Host` is a loopback address or `localhost` (as
    /// [`Sidecar::router`](crate::Sidecar::router) without a token).
    pub async fn listen(&self, listen: &Listen) -> std::io::Result<MetricsListener> {
        let bound = match listen {
            Listen::Tcp(addr) => Bound::Tcp(tokio::net::TcpListener::bind(addr).await?),
            Listen::Unix(path) => Bound::Unix(bind_unix(path)?),
        };
        Ok(MetricsListener {
            metrics: self.clone(),
            bound,
        })
    }
}

/// A bound address that serves `GET /metrics`: [`Metrics::listen`].
#[derive(Debug)]
pub struct MetricsListener {
    metrics: Metrics,
    bound: Bound,
}

#[derive(Debug)]
enum Bound {
    Tcp(tokio::net::TcpListener),
    Unix(tokio::net::UnixListener),
}

impl MetricsListener {
    /// Serves scrapes until `shutdown` completes, on the sidecar's HTTP server: every wait on a
    /// client bounded and at most [`ServeConfig::max_connections`] connections, as for the API.
    pub async fn serve(self, shutdown: impl Future<Output = ()> + Send + 'static) {
        let app = self.metrics.router();
        let config = ServeConfig::default();
        let stop = CancellationToken::new();
        let on_shutdown = stop.clone();
        tokio::spawn(async move {
            shutdown.await;
            on_shutdown.cancel();
        });
        match self.bound {
            Bound::Tcp(listener) => {
                // On loopback, only under a loopback name, as the sidecar without a token: a
                // web page could otherwise read the task names through DNS rebinding.
                let local = listener.local_addr().is_ok_and(|a| a.ip().is_loopback());
                let hosts = Arc::new(HostRule::new(local, Vec::new()));
                let app = app.layer(axum::middleware::from_fn_with_state(hosts, check_host));
                server::run(listener, app, &config, stop).await;
            }
            Bound::Unix(listener) => server::run(listener, app, &config, stop).await,
        }
    }
}

pub(crate) async fn scrape(State(metrics): State<Metrics>) -> Response {
    ([(CONTENT_TYPE, TEXT_FORMAT)], metrics.render()).into_response()
}

/// Counts every request by its route template (`/v1/leases/{name}/acquire`, never the raw path)
/// and status, and times it: on the long-polls (acquire with `wait_ms`, watch, observe) the time
/// is the wait.
pub(crate) async fn count_request(request: Request, next: Next) -> Response {
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map_or(UNMATCHED.to_owned(), |p| p.as_str().to_owned());
    let started = Instant::now();
    let response = next.run(request).await;
    metrics::histogram!("leasehold_sidecar_request_duration_seconds", "route" => route.clone())
        .record(started.elapsed().as_secs_f64());
    metrics::counter!(
        "leasehold_sidecar_requests_total",
        "route" => route,
        "status" => response.status().as_str().to_owned()
    )
    .increment(1);
    response
}

/// The help text of the sidecar's own metrics.
fn describe_sidecar_metrics() {
    metrics::describe_counter!(
        "leasehold_sidecar_requests_total",
        "HTTP requests by route template and status code."
    );
    metrics::describe_histogram!(
        "leasehold_sidecar_request_duration_seconds",
        Unit::Seconds,
        "Time from a request's arrival to its answer by route template; on the long-polls \
         (acquire with wait_ms, campaign, watch, observe) this is the wait."
    );
    metrics::describe_counter!(
        "leasehold_sidecar_grants_total",
        "Leases (acquire, campaign) and runs (a tick that said run) granted to applications."
    );
    metrics::describe_counter!(
        "leasehold_sidecar_ends_total",
        "Leases and runs held for applications that ended, by why."
    );
    metrics::describe_gauge!(
        "leasehold_sidecar_held",
        "Leases and runs held for applications now."
    );
    metrics::describe_counter!(
        crate::series::DROPPED,
        "Series about a task or group not kept because as many task and group names as the cap \
         allows had series."
    );
}
