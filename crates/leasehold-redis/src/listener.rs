//! The release listener: one pub/sub connection per store that feeds a [`ReleaseHub`], and
//! comes back (with backoff) whenever that connection drops or stops answering PINGs.
//!
//! Releases announced while it is reconnecting are missed; waiters then fall back to retrying
//! at the lease's expiry, which is the core's polling fallback.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use futures_util::StreamExt;
use leasehold::store::ReleaseHub;
use redis::aio::PubSub;
use tokio::task::AbortHandle;

use crate::config::RedisConfig;
use crate::conn::SentinelLink;

/// Where the listener subscribes.
#[derive(Clone)]
pub(crate) enum Source {
    /// One of these servers, the next one after each failure: the single server, or a Redis
    /// Cluster's seed nodes (a cluster forwards every `PUBLISH` to all its nodes).
    Nodes(Vec<redis::Client>),
    /// The primary the sentinels name at the time.
    Sentinel(Arc<SentinelLink>),
}

struct Settings {
    source: Source,
    /// Index of the next node of [`Source::Nodes`] to try.
    next: AtomicUsize,
    channel: String,
    hub: ReleaseHub,
    connect_timeout: Duration,
    max_delay: Duration,
    keepalive: Duration,
    url: String,
}

fn settings(
    source: Source,
    channel: String,
    hub: ReleaseHub,
    config: &RedisConfig,
    url: &str,
) -> Settings {
    Settings {
        source,
        next: AtomicUsize::new(0),
        channel,
        hub,
        connect_timeout: config.connect_timeout,
        max_delay: config.max_reconnect_delay,
        keepalive: config.keepalive,
        url: url.to_owned(),
    }
}

/// Keeps trying to subscribe, with backoff, in a background task, and listens once it has; for a
/// store whose server may not be up yet.
pub(crate) fn spawn_lazy(
    source: Source,
    channel: String,
    hub: ReleaseHub,
    config: &RedisConfig,
    url: &str,
) -> AbortHandle {
    let settings = settings(source, channel, hub, config, url);
    tokio::spawn(run(settings, None)).abort_handle()
}

/// Subscribes (waiting up to the connect timeout, so the first release after `connect` is
/// heard), then keeps listening in a background task.
pub(crate) async fn spawn(
    source: Source,
    channel: String,
    hub: ReleaseHub,
    config: &RedisConfig,
    url: &str,
) -> AbortHandle {
    let settings = settings(source, channel, hub, config, url);
    let first = match subscribe(&settings).await {
        Ok(pubsub) => Some(pubsub),
        Err(e) => {
            tracing::warn!(
                url = %settings.url,
                channel = %settings.channel,
                "release notifications unavailable, waiters poll until they come back: {e}"
            );
            None
        }
    };
    tokio::spawn(run(settings, first)).abort_handle()
}

async fn subscribe(s: &Settings) -> Result<PubSub, String> {
    let attempt = async {
        let mut pubsub = match &s.source {
            Source::Nodes(nodes) => {
                let at = s.next.fetch_add(1, Ordering::Relaxed) % nodes.len();
                nodes[at].get_async_pubsub().await?
            }
            Source::Sentinel(link) => link.pubsub().await?,
        };
        pubsub.subscribe(&s.channel).await?;
        Ok::<_, redis::RedisError>(pubsub)
    };
    match tokio::time::timeout(s.connect_timeout, attempt).await {
        Ok(Ok(pubsub)) => Ok(pubsub),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err(format!("no answer within {:?}", s.connect_timeout)),
    }
}

async fn run(s: Settings, mut current: Option<PubSub>) {
    let min_delay = Duration::from_millis(100);
    let mut delay = min_delay;
    let mut failing = current.is_none();
    loop {
        let pubsub = match current.take() {
            Some(pubsub) => pubsub,
            None => match subscribe(&s).await {
                Ok(pubsub) => {
                    if failing {
                        tracing::info!(url = %s.url, "release notifications restored");
                    }
                    failing = false;
                    delay = min_delay;
                    pubsub
                }
                Err(e) => {
                    if !failing {
                        tracing::warn!(url = %s.url, "release notifications lost, reconnecting: {e}");
                        failing = true;
                    } else {
                        tracing::debug!(url = %s.url, "release listener reconnect failed: {e}");
                    }
                    let jitter = fastrand::u64(..=delay.as_millis() as u64 / 2);
                    tokio::time::sleep(delay + Duration::from_millis(jitter)).await;
                    delay = (delay * 2).min(s.max_delay);
                    continue;
                }
            },
        };
        listen(&s, pubsub).await;
        if !failing {
            tracing::warn!(url = %s.url, "release notification connection closed, reconnecting");
            failing = true;
        }
    }
}

/// Forwards messages until the connection closes or a keepalive PING goes unanswered.
async fn listen(s: &Settings, pubsub: PubSub) {
    let (mut sink, mut stream) = pubsub.split();
    let mut keepalive = tokio::time::interval(s.keepalive);
    keepalive.reset();
    loop {
        tokio::select! {
            msg = stream.next() => match msg {
                Some(msg) => {
                    if let Ok(name) = msg.get_payload::<String>() {
                        s.hub.publish(&name);
                    }
                }
                None => return,
            },
            _ = keepalive.tick() => {
                let ping = tokio::time::timeout(s.connect_timeout, sink.ping::<redis::Value>());
                if !matches!(ping.await, Ok(Ok(_))) {
                    return;
                }
            }
        }
    }
}
