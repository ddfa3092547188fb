//! `leasehold serve`: the sidecar, an HTTP API for leases, leadership and gated ticks (see the
//! leasehold-serve crate and its OpenAPI document).

use std::path::PathBuf;

use anyhow::anyhow;
use clap::Args;
use leasehold::store::Metered;
use leasehold::{BoxStore, StoreDownPolicy};
use leasehold_serve::{Listen, Sidecar, SidecarConfig};

use crate::Failure;

#[derive(Args)]
pub struct ServeArgs {
    /// Store URL [default: $LEASEHOLD_STORE, else sqlite:leasehold.db]
    #[arg(long)]
    store: Option<String>,
    /// Where to listen: IP:PORT, or unix:/path/to.sock. An address other hosts can reach needs
    /// --auth-token-file.
    #[arg(long, default_value = "127.0.0.1:7070")]
    listen: Listen,
    /// A file holding the bearer token every request (but /healthz, /openapi.json and /metrics)
    /// must carry.
    #[arg(long)]
    auth_token_file: Option<PathBuf>,
    /// What a tick does while the store cannot answer, unless the tick says: fail-closed (skip),
    /// fail-open or local (run without coordination).
    #[arg(long, default_value = "fail-closed")]
    on_store_down: StoreDownPolicy,
    /// The longest a request waits (acquire's wait_ms, watch, observe); keep it below the idle
    /// timeout of any proxy between the application and the sidecar.
    #[arg(long, default_value = "5m", value_parser = crate::duration_arg)]
    max_wait: std::time::Duration,
    /// The holder id prefix of this sidecar's leases [default: HOSTNAME-PID]
    #[arg(long)]
    holder: Option<String>,
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
    crate::run::warn_if_no_store(args.store.as_deref());
    let metrics = crate::run::install_metrics()?;
    let url = leasehold_connect::store_url(args.store);
    let store = leasehold_connect::open_store_lazy(&url)
        .await
        .map_err(crate::run::open_failure)?;
    // Every store call counted and timed, for GET /metrics.
    let store = BoxStore::new(Metered::new(store));
    let mut config = SidecarConfig::default()
        .on_store_down(args.on_store_down)
        .max_wait(args.max_wait)
        .metrics(metrics);
    if let Some(holder) = args.holder {
        if leasehold::HolderId::new(format!("{holder}#0")).is_err() || holder.len() > 150 {
            return Err(Failure::usage(anyhow!(
                "--holder must be 1 to 150 bytes without whitespace or control characters"
            )));
        }
        config = config.holder(holder);
    }
    tracing::info!(listen = %args.listen, store = %leasehold::Store::describe(&store), "sidecar serving");
    let sidecar = Sidecar::new(store, config);
    leasehold_serve::serve(sidecar, &args.listen, token, crate::run::termination())
        .await
        .map_err(|e| Failure::usage(anyhow!("cannot serve on {}: {e}", args.listen)))?;
    tracing::info!("sidecar stopped; leases released");
    Ok(0)
}
