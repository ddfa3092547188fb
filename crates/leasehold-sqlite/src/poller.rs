//! Release notifications across processes: processes sharing a file cannot message each other,
//! so every release appends a row to the `releases` log in its own transaction, and a poller per
//! store handle watches `PRAGMA data_version` (a cheap read that changes whenever another
//! connection commits) and publishes the new rows to a [`ReleaseHub`].

use std::collections::HashSet;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use leasehold::store::ReleaseHub;
use rusqlite::Connection;
use tokio_util::sync::CancellationToken;

use crate::config::SqliteConfig;
use crate::schema;

/// Sequence numbers of releases this handle already published itself, so the poller does not
/// announce them a second time.
pub(crate) type LocalReleases = Arc<Mutex<HashSet<i64>>>;

/// The poller's own connection (so it never waits for the operations' connection) and what it
/// has seen.
pub(crate) struct Poller {
    conn: Connection,
    data_version: i64,
    last_seq: i64,
}

impl Poller {
    /// Opens the poller's connection and notes the current end of the release log: releases
    /// committed from now on are published.
    pub(crate) fn open(path: &Path, config: &SqliteConfig) -> rusqlite::Result<Self> {
        let conn = crate::schema::open_connection(path, config)?;
        let data_version = data_version(&conn)?;
        let last_seq = conn.query_row(schema::LAST_RELEASE, [], |r| r.get(0))?;
        Ok(Self {
            conn,
            data_version,
            last_seq,
        })
    }

    /// The releases committed since the last call, oldest first.
    fn poll(&mut self) -> rusqlite::Result<Vec<(i64, String)>> {
        // Read the version before the rows: a commit in between changes the version again, so
        // it is picked up on the next poll.
        let version = data_version(&self.conn)?;
        if version == self.data_version {
            return Ok(Vec::new());
        }
        let mut stmt = self.conn.prepare_cached(schema::RELEASES_AFTER)?;
        let rows = stmt
            .query_map([self.last_seq], |r| Ok((r.get(0)?, r.get(1)?)))?
            .collect::<rusqlite::Result<Vec<(i64, String)>>>()?;
        if let Some((seq, _)) = rows.last() {
            self.last_seq = *seq;
        }
        self.data_version = version;
        Ok(rows)
    }
}

fn data_version(conn: &Connection) -> rusqlite::Result<i64> {
    conn.pragma_query_value(None, "data_version", |r| r.get(0))
}

/// Polls every `interval` until `stop` is cancelled (when the last store handle is dropped).
pub(crate) async fn run(
    mut poller: Poller,
    hub: ReleaseHub,
    local: LocalReleases,
    interval: Duration,
    stop: CancellationToken,
) {
    let mut ticks = tokio::time::interval(interval);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut failing = false;
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            _ = ticks.tick() => {}
        }
        let joined = tokio::task::spawn_blocking(move || {
            let rows = poller.poll();
            (poller, rows)
        })
        .await;
        let rows = match joined {
            Ok((p, rows)) => {
                poller = p;
                rows
            }
            // Cancelled: the runtime is shutting down (a process that exits), nothing to say.
            Err(e) if e.is_cancelled() => return,
            Err(e) => {
                tracing::error!(error = %e, "sqlite release poller stopped");
                return;
            }
        };
        match rows {
            Ok(rows) => {
                if failing {
                    tracing::info!("sqlite release poller recovered");
                    failing = false;
                }
                if rows.is_empty() {
                    continue;
                }
                let mut local = local.lock().unwrap_or_else(|p| p.into_inner());
                for (seq, name) in &rows {
                    if !local.remove(seq) {
                        hub.publish(name);
                    }
                }
                let last = poller.last_seq;
                local.retain(|seq| *seq > last);
            }
            Err(e) => {
                if !failing {
                    tracing::warn!(error = %e, "sqlite release poller failed; retrying");
                    failing = true;
                }
            }
        }
    }
}
