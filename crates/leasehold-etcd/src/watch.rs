//! The release watch: one streaming `/v3/watch` on the lease keys per store, run by a core
//! [`ReleaseFeed`](leasehold::store::ReleaseFeed), feeding it releases and the store's
//! [`Observations`] renewals and acquisitions; re-established on another member when its member
//! goes away.

use std::sync::Arc;
use std::time::Duration;

use http_body_util::BodyExt;
use leasehold::store::{FeedLink, ReleaseFeed, ReleaseSource};
use serde_json::json;

use crate::gateway::{Gateway, b64, unb64};
use crate::observed::Observations;
use crate::record::Record;
use crate::wire::{WatchLine, WatchResponse, prefix_end};

struct Watch {
    gateway: Arc<Gateway>,
    lease_prefix: Vec<u8>,
    observed: Arc<Observations>,
    /// The revision to resume from after a reconnect (0: from now), so no release between two
    /// watches is missed.
    next_revision: u64,
    /// The member to try first.
    from: usize,
}

/// Starts the watch on keys under `lease_prefix`; see [`ReleaseFeed::first_attempt`] to wait
/// until it is established on a member.
pub(crate) fn feed(
    gateway: Arc<Gateway>,
    lease_prefix: Vec<u8>,
    observed: Arc<Observations>,
    max_delay: Duration,
    describe: String,
) -> ReleaseFeed {
    let watch = Watch {
        gateway,
        lease_prefix,
        observed,
        next_revision: 0,
        from: 0,
    };
    ReleaseFeed::spawn(watch, max_delay, describe)
}

impl ReleaseSource for Watch {
    async fn session(&mut self, link: &FeedLink<'_>) -> String {
        let reason = self.stream(link).await;
        // The next session starts on the next member.
        self.from = (self.from + 1) % self.gateway.endpoint_count();
        reason
    }
}

impl Watch {
    /// One watch: established, then its lines handled until it ends. Returns why it ended.
    async fn stream(&mut self, link: &FeedLink<'_>) -> String {
        let mut create = json!({
            "key": b64(&self.lease_prefix),
            "range_end": b64(prefix_end(&self.lease_prefix)),
        });
        if self.next_revision > 0 {
            create["start_revision"] = json!(self.next_revision.to_string());
        }
        let (idx, mut body) = match self
            .gateway
            .stream(self.from, "/v3/watch", &json!({ "create_request": create }))
            .await
        {
            Ok(answer) => answer,
            Err(e) => return format!("watch not established: {e}"),
        };
        self.from = idx;
        let mut buf: Vec<u8> = Vec::new();
        loop {
            let frame = match body.frame().await {
                Some(Ok(frame)) => frame,
                Some(Err(e)) => {
                    return format!("watch on {} broke: {e}", self.gateway.endpoint(idx));
                }
                None => return "watch closed".to_owned(),
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
                    return format!("watch error: {error}");
                }
                if let Some(result) = line.result
                    && let Some(reason) = self.handle(link, &result)
                {
                    return reason;
                }
            }
        }
    }

    /// Handles one watch answer; `Some(reason)` when the watch must end.
    fn handle(&mut self, link: &FeedLink<'_>, result: &WatchResponse) -> Option<String> {
        if result.created {
            link.listening();
        }
        if result.compact_revision > 0 {
            // The revisions to resume from are gone: start from now. Waiters whose release fell
            // in the gap retry at the lease's expiry.
            self.next_revision = 0;
            return Some("the revision to resume from was compacted".to_owned());
        }
        for event in &result.events {
            if event.kind.as_deref() == Some("DELETE") {
                continue;
            }
            let (Ok(key), Ok(value)) = (unb64(&event.kv.key), unb64(&event.kv.value)) else {
                continue;
            };
            match Record::decode(&value) {
                Ok(Record::Free { .. }) => {
                    if let Some(name) = key.strip_prefix(self.lease_prefix.as_slice())
                        && let Ok(name) = std::str::from_utf8(name)
                    {
                        link.publish(name);
                    }
                }
                Ok(Record::Held { token, ttl, .. }) => {
                    self.observed.put(&key, event.kv.mod_revision, token, ttl);
                }
                Err(_) => {}
            }
        }
        if result.header.revision > 0 {
            self.next_revision = self.next_revision.max(result.header.revision + 1);
        }
        result.canceled.then(|| "watch canceled".to_owned())
    }
}
