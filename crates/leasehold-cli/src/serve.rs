//! `leasehold serve`: the sidecar, an HTTP API for leases, leadership and gated ticks (see the
//! leasehold-serve crate and its OpenAPI document).

use std::path::PathBuf;
use std::time::Duration;

use anyhow::anyhow;
use clap::Args;
use leasehold::store::Metered;
use leasehold::{BoxStore, StoreDownPolicy};
use leasehold_serve::{AllowedHost, Listen, ServeConfig, Sidecar, SidecarConfig};

use crate::failure::Failure;

#[derive(Args)]
pub struct ServeArgs {
    /// Store URL [default: $LEASEHOLD_STORE, else sqlite:leasehold.db]
    #[arg(long)]
    store: Option<String>,
    /// Where to listen: IP:PORT, or unix:/path/to.sock. An address other hosts can reach needs
    /// --auth-token-file.
    #[arg(long, default_value = "127.0.0.1:7070")]
    listen: Listen,
    /// A file holding the bearer token every request (but /healthz, /openapi.json, /metrics and
    /// the page's own files) must carry; the page at / asks for it.
    #[arg(long)]
    auth_token_file: Option<PathBuf>,
    /// Without a token the sidecar answers only requests whose Host is a loopback address,
    /// localhost or *.localhost, whatever the route (else another site's page could read and
    /// drive it through a DNS name of its own pointing at 127.0.0.1); also answer under NAME,
    /// any port (a name or IP address, e.g. one /etc/hosts maps to 127.0.0.1). Repeatable.
    #[arg(long, value_name = "NAME", conflicts_with = "auth_token_file")]
    allow_host: Vec<AllowedHost>,
    /// What a tick does while the store cannot answer, unless the tick says: fail-closed (skip),
    /// fail-open or local (run without coordination).
    #[arg(long, default_value = "fail-closed")]
    on_store_down: StoreDownPolicy,
    /// The longest a request waits (acquire's wait_ms, watch, observe); keep it below the idle
    /// timeout of any proxy between the application and the sidecar.
    #[arg(long, default_value = "5m", value_parser = crate::durations::duration_arg)]
    max_wait: Duration,
    /// The holder id prefix of this sidecar's leases [default: HOSTNAME-PID]
    #[arg(long)]
    holder: Option<String>,
    /// How many run-history entries the store keeps for each task ticked through this sidecar
    /// (runs and missed slots, newest first), 1 to 1000.
    #[arg(long, value_name = "N", default_value_t = leasehold::history::DEFAULT_HISTORY_LIMIT, value_parser = crate::service::history_entries)]
    history: usize,
    /// How long a request's head may take to arrive (from its first byte, or from the
    /// connection's start); a connection past it is closed.
    #[arg(long, default_value = "10s", value_parser = positive_duration)]
    header_read_timeout: Duration,
    /// How long a request's body may take to arrive after its head; a connection past it is
    /// closed.
    #[arg(long, default_value = "10s", value_parser = positive_duration)]
    body_read_timeout: Duration,
    /// How long a connection may wait for its next request after a response.
    #[arg(long, default_value = "60s", value_parser = positive_duration)]
    idle_timeout: Duration,
    /// The most connections open at once; more wait until one closes. The descriptor limit
    /// is raised to fit it if it can be, else the limit is lowered (with a warning).
    #[arg(long, default_value_t = 1024, value_parser = clap::value_parser!(u32).range(1..))]
    max_connections: u32,
    /// How long shutdown waits for requests being handled before closing their connections.
    #[arg(long, default_value = "10s", value_parser = crate::durations::duration_arg)]
    shutdown_grace: Duration,
    /// Worker threads answering requests. One is fastest on a small machine (a request and
    /// its store connection do not wake each other's thread); give more where one sidecar
    /// serves many applications on a machine with cores to spare.
    #[arg(long, default_value_t = leasehold_serve::DEFAULT_THREADS, value_parser = threads)]
    pub(crate) threads: usize,
}

/// `--threads`: 1 to 256.
fn threads(text: &str) -> Result<usize, String> {
    match text.parse::<usize>() {
        Ok(n @ 1..=256) => Ok(n),
        Ok(_) => Err("must be between 1 and 256".to_owned()),
        Err(e) => Err(e.to_string()),
    }
}

/// A timeout flag: above zero, at most a day.
fn positive_duration(text: &str) -> Result<Duration, String> {
    match crate::durations::duration_arg(text)? {
        Duration::ZERO => Err("must be above zero".to_owned()),
        d => Ok(d),
    }
}

/// Descriptors kept beside the connections: the store's, the listener, logs.
const SPARE_DESCRIPTORS: u64 = 64;

/// Fits the descriptor limit to `max` connections: raises the soft limit (up to the hard one)
/// when it is too low, or else lowers `max` to what fits, saying so. Past the descriptor limit
/// accepting fails, and every client (health checks included) is refused until some close.
fn fit_descriptors(max: u32) -> usize {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let wanted = u64::from(max) + SPARE_DESCRIPTORS;
    let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) else {
        return max as usize;
    };
    if soft >= wanted {
        return max as usize;
    }
    let raised = wanted.min(hard);
    let soft = if setrlimit(Resource::RLIMIT_NOFILE, raised, hard).is_ok() {
        raised
    } else {
        soft
    };
    if soft >= wanted {
        return max as usize;
    }
    let fits = soft.saturating_sub(SPARE_DESCRIPTORS).max(1);
    tracing::warn!(
        descriptor_limit = soft,
        "--max-connections {max} does not fit the descriptor limit; serving at most {fits} connections"
    );
    usize::try_from(fits).unwrap_or(1)
}

fn auth_token(path: &PathBuf) -> Result<String, Failure> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        Failure::usage(anyhow!(
            "cannot read the auth token file {}: {e}",
            path.display()
        ))
    })?;
    let token = text.trim();
    if token.len() < 16 || token.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(Failure::usage(anyhow!(
            "the auth token in {} must be one line of at least 16 characters without spaces",
            path.display()
        )));
    }
    Ok(token.to_owned())
}

pub async fn serve(args: ServeArgs) -> Result<u8, Failure> {
    let token = args.auth_token_file.as_ref().map(auth_token).transpose()?;
    if !args.listen.is_local() && token.is_none() {
        return Err(Failure::usage(anyhow!(
            "{} is reachable from other hosts: give --auth-token-file, or listen on loopback",
            args.listen
        )));
    }
    if matches!(args.listen, Listen::Unix(_)) && !args.allow_host.is_empty() {
        return Err(Failure::usage(anyhow!(
            "--allow-host is for TCP addresses: a unix socket's clients are not checked by name"
        )));
    }
    crate::service::warn_if_no_store(args.store.as_deref());
    let metrics = crate::service::install_metrics()?;
    let url = leasehold_connect::store_url(args.store);
    let store = leasehold_connect::open_store_lazy(&url)
        .await
        .map_err(Failure::open)?;
    // Every store call counted and timed, for GET /metrics.
    let store = BoxStore::new(Metered::new(store));
    let mut config = SidecarConfig::default()
        .on_store_down(args.on_store_down)
        .max_wait(args.max_wait)
        .history_limit(args.history)
        .metrics(metrics);
    for host in args.allow_host {
        config = config.allow_host(host);
    }
    if let Some(holder) = args.holder {
        if leasehold::HolderId::new(format!("{holder}#0")).is_err() || holder.len() > 150 {
            return Err(Failure::usage(anyhow!(
                "--holder must be 1 to 150 bytes without whitespace, control or bidi characters"
            )));
        }
        config = config.holder(holder);
    }
    let mut serving = ServeConfig::default()
        .header_read_timeout(args.header_read_timeout)
        .body_read_timeout(args.body_read_timeout)
        .idle_timeout(args.idle_timeout)
        .max_connections(fit_descriptors(args.max_connections))
        .shutdown_grace(args.shutdown_grace);
    if let Some(token) = token {
        serving = serving.auth_token(token);
    }
    tracing::info!(listen = %args.listen, store = %leasehold::Store::describe(&store), "sidecar serving");
    let sidecar = Sidecar::new(store, config);
    crate::trim::spawn_periodic();
    leasehold_serve::serve(
        sidecar,
        &args.listen,
        serving,
        crate::service::termination(),
    )
    .await
    .map_err(|e| {
        Failure::usage(anyhow::Error::new(e).context(format!("cannot serve on {}", args.listen)))
    })?;
    tracing::info!("sidecar stopped; leases released");
    Ok(0)
}
