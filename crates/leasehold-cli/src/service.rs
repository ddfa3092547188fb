//! What the long-running commands (`run` with a schedule, `crontab`, `serve`) set up alike: the
//! warning when no store is given, the metrics recorder and its endpoint, the signals that end
//! them, and the `--history` setting.

use anyhow::anyhow;
use leasehold_serve::{Listen, Metrics};

use crate::failure::Failure;

/// Warns loudly when neither `--store` nor `LEASEHOLD_STORE` is given.
pub fn warn_if_no_store(store: Option<&str>) {
    if leasehold_connect::configured_store_url(store.map(str::to_owned)).is_none() {
        let dir = std::env::current_dir().map_or_else(|_| ".".into(), |d| d.display().to_string());
        tracing::warn!(
            "no --store and no LEASEHOLD_STORE: using {} in {dir}, which coordinates only processes \
             on this host started in this directory; give every instance the same --store",
            leasehold_connect::DEFAULT_STORE
        );
    }
}

/// Installs the process's Prometheus recorder.
pub fn install_metrics() -> Result<Metrics, Failure> {
    Metrics::install().map_err(|e| Failure::from(anyhow::Error::new(e)))
}

/// `--metrics-listen`: binds at once (a taken address is one clear error before anything runs),
/// then serves scrapes for as long as the process runs, through the command's shutdown too.
pub async fn serve_metrics(listen: &Listen) -> Result<(), Failure> {
    let metrics = install_metrics()?;
    let listener = metrics
        .listen(listen)
        .await
        .map_err(|e| Failure::usage(anyhow!("cannot listen for metrics on {listen}: {e}")))?;
    tracing::info!(listen = %listen, "serving metrics at /metrics");
    tokio::spawn(listener.serve(std::future::pending()));
    Ok(())
}

/// Completes on the first SIGTERM or SIGINT.
pub async fn termination() {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        tracing::error!("cannot install signal handlers; stop with SIGKILL");
        return std::future::pending().await;
    };
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM: shutting down"),
        _ = int.recv() => tracing::info!("SIGINT: shutting down"),
    }
}

/// `--history`: 1 to [`MAX_HISTORY_SETTING`](leasehold::history::MAX_HISTORY_SETTING).
pub fn history_entries(text: &str) -> Result<usize, String> {
    let max = leasehold::history::MAX_HISTORY_SETTING;
    match text.parse::<usize>() {
        Ok(n) if (1..=max).contains(&n) => Ok(n),
        _ => Err(format!("must be a number of entries from 1 to {max}")),
    }
}
