//! `leasehold status`: who holds which lease.

use anyhow::anyhow;
use clap::Args;
use leasehold::{LeaseName, Store};

use crate::Failure;

#[derive(Args)]
pub struct StatusArgs {
    /// Store URL [default: $LEASEHOLD_STORE, else sqlite:leasehold.db]
    #[arg(long)]
    store: Option<String>,
    /// Lease names to show (a scheduled job `NAME` also has `NAME:run`, held while it runs).
    #[arg(required = true)]
    names: Vec<String>,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

pub async fn status(args: StatusArgs) -> Result<u8, Failure> {
    let names = args
        .names
        .iter()
        .map(LeaseName::new)
        .collect::<Result<Vec<_>, _>>()
        .map_err(Failure::usage)?;
    let url = leasehold_connect::store_url(args.store);
    let store = leasehold_connect::open_store(&url)
        .await
        .map_err(|e| match e {
            leasehold_connect::OpenError::UnknownScheme { .. } => Failure::usage(e),
            _ => Failure::store(e),
        })?;
    let mut rows = Vec::new();
    for name in &names {
        let state = store
            .inspect(name)
            .await
            .map_err(|e| Failure::store(anyhow!("cannot read lease {name}: {e}")))?;
        rows.push((name, state));
    }
    if args.json {
        let leases: Vec<_> = rows
            .iter()
            .map(|(name, state)| match state {
                Some(s) => serde_json::json!({
                    "name": name.as_str(),
                    "held": s.holder.is_some(),
                    "holder": s.holder.as_ref().map(|h| h.as_str()),
                    "token": s.token.get(),
                    "remaining_ms": s.remaining.as_millis() as u64,
                }),
                None => serde_json::json!({
                    "name": name.as_str(), "held": false, "holder": null, "token": null, "remaining_ms": 0,
                }),
            })
            .collect();
        let doc = serde_json::json!({ "store": store.describe(), "leases": leases });
        println!("{doc}");
        return Ok(0);
    }
    println!("store: {}", store.describe());
    let width = names
        .iter()
        .map(|n| n.as_str().len())
        .max()
        .unwrap_or(4)
        .max(5);
    println!(
        "{:<width$}  {:<7}  {:>20}  {:>10}  HOLDER",
        "LEASE", "STATE", "TOKEN", "REMAINING"
    );
    for (name, state) in rows {
        match state {
            Some(s) => {
                let (st, holder) = match &s.holder {
                    Some(h) => ("held", h.as_str().to_owned()),
                    None => ("free", "-".to_owned()),
                };
                println!(
                    "{:<width$}  {st:<7}  {:>20}  {:>10}  {holder}",
                    name.as_str(),
                    s.token.get(),
                    format!("{:.1?}", s.remaining),
                );
            }
            None => println!(
                "{:<width$}  {:<7}  {:>20}  {:>10}  -",
                name.as_str(),
                "never",
                "-",
                "-"
            ),
        }
    }
    Ok(0)
}
