//! The release listener: one pub/sub connection per store while a waiter waits, run by a core
//! [`ReleaseFeed`](leasehold::store::ReleaseFeed) on demand that comes back (with backoff)
//! whenever the connection drops or stops answering PINGs, and closes it [`LINGER`] to twice that
//! after the last waiter stopped waiting. A process that holds its leases or does nothing is then
//! not subscribed, and a release wakes only the processes that wait.

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use leasehold::store::{FeedLink, ReleaseFeed, ReleaseSource};
use redis::aio::PubSub;

use crate::config::RedisConfig;
use crate::conn::SentinelLink;

/// How long the listener stays subscribed after the last waiter stopped waiting (at most twice
/// this): long enough that a scheduler waiting slot after slot keeps one connection.
pub(crate) const LINGER: Duration = Duration::from_secs(5);

/// Where the listener subscribes.
#[derive(Clone)]
pub(crate) enum Source {
    /// One of these servers, the next one after each failure: the single server, or a Redis
    /// Cluster's seed nodes (a cluster forwards every `PUBLISH` to all its nodes).
    Nodes(Vec<redis::Client>),
    /// The primary the sentinels name at the time.
    Sentinel(Arc<SentinelLink>),
}

struct Listener {
    source: Source,
    /// Index of the next node of [`Source::Nodes`] to try.
    next: usize,
    channel: String,
    connect_timeout: Duration,
    keepalive: Duration,
}

/// Listens on `channel` in the background while someone subscribes, reconnecting until the
/// feed is dropped.
pub(crate) fn feed(
    source: Source,
    channel: String,
    config: &RedisConfig,
    url: &str,
) -> ReleaseFeed {
    let listener = Listener {
        source,
        next: 0,
        channel,
        connect_timeout: config.connect_timeout,
        keepalive: config.keepalive,
    };
    ReleaseFeed::spawn_on_demand(listener, config.max_reconnect_delay, url.to_owned(), LINGER)
}

impl ReleaseSource for Listener {
    async fn session(&mut self, link: &FeedLink<'_>) -> String {
        let pubsub = match self.subscribe().await {
            Ok(pubsub) => pubsub,
            Err(e) => return e,
        };
        link.listening();
        self.listen(link, pubsub).await
    }
}

impl Listener {
    async fn subscribe(&mut self) -> Result<PubSub, String> {
        let limit = self.connect_timeout;
        let attempt = async {
            let mut pubsub = match &self.source {
                Source::Nodes(nodes) => {
                    let at = self.next % nodes.len();
                    self.next = self.next.wrapping_add(1);
                    nodes[at].get_async_pubsub().await?
                }
                Source::Sentinel(link) => link.pubsub().await?,
            };
            pubsub.subscribe(&self.channel).await?;
            Ok::<_, redis::RedisError>(pubsub)
        };
        match tokio::time::timeout(limit, attempt).await {
            Ok(Ok(pubsub)) => Ok(pubsub),
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err(format!("no answer within {limit:?}")),
        }
    }

    /// Forwards messages until the connection closes or a keepalive PING goes unanswered.
    async fn listen(&self, link: &FeedLink<'_>, pubsub: PubSub) -> String {
        let (mut sink, mut stream) = pubsub.split();
        let mut keepalive = tokio::time::interval(self.keepalive);
        keepalive.reset();
        loop {
            tokio::select! {
                msg = stream.next() => match msg {
                    Some(msg) => {
                        if let Ok(name) = msg.get_payload::<String>() {
                            link.publish(&name);
                        }
                    }
                    None => return "connection closed".to_owned(),
                },
                _ = keepalive.tick() => {
                    let ping = tokio::time::timeout(self.connect_timeout, sink.ping::<redis::Value>());
                    if !matches!(ping.await, Ok(Ok(_))) {
                        return "keepalive PING unanswered".to_owned();
                    }
                }
            }
        }
    }
}
