//! The release watch: one streaming `/v3/watch` on the lease keys per store, feeding a
//! [`ReleaseHub`] with releases and the store's [`Observations`] with renewals and acquisitions;
//! re-established on another member when its member goes away.

use std::sync::Arc;
use std::time::Duration;

use http_body_util::BodyExt;
use leasehold::store::ReleaseHub;
use serde_json::json;
use tokio::sync::oneshot;
use tokio::task::AbortHandle;

use crate::gateway::{Gateway, b64, unb64};
use crate::observed::Observations;
use crate::record::Record;
use crate::wire::{WatchLine, prefix_end};

/// Starts the watch on keys under `lease_prefix`. The receiver fires once the first watch is
/// established on a member.
pub(crate) fn spawn(
    gateway: Arc<Gateway>,
    lease_prefix: Vec<u8>,
    hub: ReleaseHub,
    observed: Arc<Observations>,
    max_delay: Duration,
) -> (AbortHandle, oneshot::Receiver<()>) {
    let (ready, ready_rx) = oneshot::channel();
    let task = tokio::spawn(run(gateway, lease_prefix, hub, observed, max_delay, ready));
    (task.abort_handle(), ready_rx)
}

async fn run(
    gateway: Arc<Gateway>,
    lease_prefix: Vec<u8>,
    hub: ReleaseHub,
    observed: Arc<Observations>,
    max_delay: Duration,
    ready: oneshot::Sender<()>,
) {
    let mut ready = Some(ready);
    // The revision to resume from after a reconnect (0: from now), so no release between two
    // watches is missed.
    let mut next_revision = 0u64;
    let mut from = 0usize;
    let mut delay = Duration::from_millis(50);
    loop {
        let mut create = json!({
            "key": b64(&lease_prefix),
            "range_end": b64(prefix_end(&lease_prefix)),
        });
        if next_revision > 0 {
            create["start_revision"] = json!(next_revision.to_string());
        }
        match gateway
            .stream(from, "/v3/watch", &json!({ "create_request": create }))
            .await
        {
            Ok((idx, mut body)) => {
                from = idx;
                let mut buf: Vec<u8> = Vec::new();
                'stream: loop {
                    let frame = match body.frame().await {
                        Some(Ok(frame)) => frame,
                        Some(Err(e)) => {
                            tracing::debug!(member = %gateway.endpoint(idx), "release watch broke: {e}");
                            break;
                        }
                        None => break,
                    };
                    let Some(data) = frame.data_ref() else {
                        continue;
                    };
                    buf.extend_from_slice(data);
                    while let Some(end) = buf.iter().position(|b| *b == b'\n') {
                        let line: Vec<u8> = buf.drain(..=end).collect();
                        let Ok(line) = serde_json::from_slice::<WatchLine>(&line) else {
                            continue;
                        };
                        if let Some(error) = line.error {
                            tracing::debug!("release watch error: {error}");
                            break 'stream;
                        }
                        let Some(result) = line.result else {
                            continue;
                        };
                        if result.created {
                            delay = Duration::from_millis(50);
                            if let Some(ready) = ready.take() {
                                let _ = ready.send(());
                            }
                        }
                        if result.compact_revision > 0 {
                            // The revisions to resume from are gone: start from now. Waiters
                            // whose release fell in the gap retry at the lease's expiry.
                            next_revision = 0;
                            break 'stream;
                        }
                        for event in &result.events {
                            if event.kind.as_deref() == Some("DELETE") {
                                continue;
                            }
                            let (Ok(key), Ok(value)) =
                                (unb64(&event.kv.key), unb64(&event.kv.value))
                            else {
                                continue;
                            };
                            match Record::decode(&value) {
                                Ok(Record::Free { .. }) => {
                                    if let Some(name) = key.strip_prefix(lease_prefix.as_slice())
                                        && let Ok(name) = std::str::from_utf8(name)
                                    {
                                        hub.publish(name);
                                    }
                                }
                                Ok(Record::Held { token, ttl, .. }) => {
                                    observed.put(&key, event.kv.mod_revision, token, ttl);
                                }
                                Err(_) => {}
                            }
                        }
                        if result.header.revision > 0 {
                            next_revision = next_revision.max(result.header.revision + 1);
                        }
                        if result.canceled {
                            break 'stream;
                        }
                    }
                }
            }
            Err(e) => tracing::debug!("release watch not established: {e}"),
        }
        from = (from + 1) % gateway.endpoint_count();
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(max_delay);
    }
}
