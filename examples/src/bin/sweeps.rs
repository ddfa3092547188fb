//! A service with two sweeps that must each run on one replica per tick.
//!
//! ```sh
//! # three replicas on one machine, sharing a SQLite file (or pass --store redis://… / postgres://…)
//! cargo run -p leasehold-examples --bin sweeps -- --port 8081 &
//! cargo run -p leasehold-examples --bin sweeps -- --port 8082 &
//! cargo run -p leasehold-examples --bin sweeps -- --port 8083 &
//! curl -X POST localhost:8082/tasks/repin/run   # a manual run, here, whoever leads
//! curl localhost:8081/status
//! ```
//!
//! Flags: see `--help`.

use std::io::Write;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::{Json, Router};
use leasehold::{
    HolderId, LeaseConfig, LeaseName, RunResult, Schedule, Scheduler, SchedulerError,
    SchedulerHandle, Task, TaskContext,
};

/// A service with two sweeps that must each run on one replica per tick.
#[derive(clap::Parser)]
struct Options {
    /// Store URL [default: $LEASEHOLD_STORE, else sqlite:leasehold.db].
    #[arg(long)]
    store: Option<String>,
    /// HTTP port on 127.0.0.1.
    #[arg(long, default_value_t = 8080)]
    port: u16,
    /// The expire sweep's interval (the re-pin sweep runs at 1.5×), e.g. 10s or 300ms.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    every: Duration,
    /// Append one JSON line per run to this file (for tests).
    #[arg(long)]
    ledger: Option<std::path::PathBuf>,
    /// This replica's holder id.
    #[arg(long)]
    name: Option<String>,
}

/// One sweep: here it only logs and, for tests, appends to the ledger.
fn sweep(name: &'static str, every: Duration, ledger: Option<Arc<std::path::PathBuf>>) -> Task {
    let schedule = Schedule::every(every).expect("a positive interval");
    Task::new(
        LeaseName::new(name).expect("valid name"),
        schedule,
        move |ctx: TaskContext| {
            let ledger = ledger.clone();
            async move {
                tracing::info!(task = %ctx.task, slot = ?ctx.slot, token = ?ctx.token, trigger = ?ctx.trigger, "sweeping");
                // Real work goes here, checking ctx.cancel between batches and sending ctx.token
                // with every write so a stale holder's write is refused.
                tokio::time::sleep(Duration::from_millis(20)).await;
                if let Some(path) = ledger {
                    let line = serde_json::json!({
                        "task": ctx.task.as_str(), "slot": ctx.slot, "token": ctx.token.map(|t| t.get()),
                        "holder": ctx.holder.as_str(), "manual": ctx.trigger == leasehold::Trigger::Manual,
                    });
                    let mut f = std::fs::OpenOptions::new()
                        .create(true)
                        .append(true)
                        .open(&*path)?;
                    f.write_all(format!("{line}\n").as_bytes())?;
                }
                Ok::<(), std::io::Error>(())
            }
        },
    )
}

async fn run_task(
    State(s): State<SchedulerHandle>,
    Path(name): Path<String>,
) -> (StatusCode, Json<serde_json::Value>) {
    match s.run_now(&name).await {
        Ok(RunResult::Succeeded) => (
            StatusCode::OK,
            Json(
                serde_json::json!({ "task": name, "result": "succeeded", "holder": s.status().holder.as_str() }),
            ),
        ),
        Ok(other) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            Json(serde_json::json!({ "task": name, "result": format!("{other:?}") })),
        ),
        Err(e @ SchedulerError::UnknownTask(_)) => (
            StatusCode::NOT_FOUND,
            Json(serde_json::json!({ "error": e.to_string() })),
        ),
        Err(e) => (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(serde_json::json!({ "error": e.to_string() })),
        ),
    }
}

async fn status(State(s): State<SchedulerHandle>) -> Json<serde_json::Value> {
    let st = s.status();
    let tasks: Vec<_> = st.tasks.iter().map(|t| serde_json::json!({
        "name": t.name.as_str(), "schedule": t.schedule, "policy": t.policy.as_str(),
        "ticks": t.ticks, "runs": t.runs, "failures": t.failures, "running": t.running,
        "last": t.last.map(|(o, slot)| serde_json::json!({ "outcome": o.as_str(), "slot": slot })),
    })).collect();
    Json(
        serde_json::json!({ "store": st.store, "holder": st.holder.as_str(), "leader": st.leader, "tasks": tasks }),
    )
}

async fn terminated() {
    use tokio::signal::unix::{SignalKind, signal};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => tokio::select! {
            _ = term.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        },
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("LEASEHOLD_LOG")
                .unwrap_or_else(|_| "info".into()),
        )
        .init();
    let o = <Options as clap::Parser>::parse();
    // Connects in the background: the service starts while its store is down.
    let store = leasehold_connect::open_store_lazy(&leasehold_connect::store_url(o.store)).await?;
    let ledger = o.ledger.map(Arc::new);
    let mut scheduler = Scheduler::new(store)
        .leader_group(LeaseName::new("sweepers")?)
        .lease_config(LeaseConfig::new((o.every * 3).max(Duration::from_secs(1))))
        .grace_period(Duration::from_secs(5))
        .task(sweep("expire", o.every, ledger.clone()))
        .task(sweep("repin", o.every * 3 / 2, ledger));
    if let Some(name) = o.name {
        scheduler = scheduler.holder(HolderId::new(name)?);
    }
    let handle = scheduler.start(terminated())?;
    let app = Router::new()
        .route("/tasks/{name}/run", post(run_task))
        .route("/status", get(status))
        .with_state(handle.clone());
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", o.port)).await?;
    tracing::info!(port = o.port, "listening");
    let server_handle = handle.clone();
    axum::serve(listener, app)
        .with_graceful_shutdown(async move { server_handle.wait().await })
        .await?;
    handle.wait().await;
    Ok(())
}
