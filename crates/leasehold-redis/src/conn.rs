//! [`RedisConnection`]: the store's connection to one server, to the primary behind Sentinel, or
//! to a Redis Cluster, with one command interface for all three.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};

use redis::aio::{ConnectionLike, ConnectionManager, MultiplexedConnection, PubSub};
use redis::cluster_async::ClusterConnection;
use redis::sentinel::SentinelClient;
use redis::{
    AsyncConnectionConfig, Cmd, ErrorKind, RedisFuture, RedisResult, ServerErrorKind, Value,
};

/// A handle on a store's shared connection (see
/// [`RedisStore::connection`](crate::RedisStore::connection)); cheap to clone, and usable with
/// `query_async` like any connection of the `redis` crate.
#[derive(Clone)]
pub struct RedisConnection(pub(crate) Conn);

#[derive(Clone)]
pub(crate) enum Conn {
    /// One server; the manager reconnects after I/O errors.
    Single(ConnectionManager),
    /// The primary that the sentinels name, looked up again after the connection fails.
    Sentinel(std::sync::Arc<SentinelLink>),
    /// A Redis Cluster: each command goes to the node owning its keys' slot.
    Cluster(ClusterConnection),
}

impl Conn {
    pub(crate) fn is_cluster(&self) -> bool {
        matches!(self, Self::Cluster(_))
    }
}

/// The primary of a Sentinel-monitored group. The connection is dropped after an error that may
/// mean the primary changed (I/O, timeout, `READONLY` from a demoted primary, `MASTERDOWN`), and
/// the next command asks the sentinels again, so commands follow a failover once the sentinels
/// have promoted a replica; until then they fail as unavailable.
pub(crate) struct SentinelLink {
    sentinel: tokio::sync::Mutex<SentinelClient>,
    /// The primary's connection and its generation (so a late error does not drop a newer one).
    current: Mutex<Option<(MultiplexedConnection, u64)>>,
    generation: AtomicU64,
    config: AsyncConnectionConfig,
}

impl SentinelLink {
    pub(crate) fn new(sentinel: SentinelClient, config: AsyncConnectionConfig) -> Self {
        Self {
            sentinel: tokio::sync::Mutex::new(sentinel),
            current: Mutex::new(None),
            generation: AtomicU64::new(0),
            config,
        }
    }

    fn current(&self) -> Option<(MultiplexedConnection, u64)> {
        self.current
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The primary's connection, asking the sentinels for the primary (one lookup at a time)
    /// if there is none.
    pub(crate) async fn connection(&self) -> RedisResult<(MultiplexedConnection, u64)> {
        if let Some(current) = self.current() {
            return Ok(current);
        }
        let mut sentinel = self.sentinel.lock().await;
        if let Some(current) = self.current() {
            return Ok(current);
        }
        // The lookup connects to the primary it names and checks its ROLE.
        let client = sentinel.async_get_client().await?;
        let conn = client
            .get_multiplexed_async_connection_with_config(&self.config)
            .await?;
        let generation = self.generation.fetch_add(1, Ordering::Relaxed) + 1;
        tracing::debug!(
            primary = ?client.get_connection_info().addr(),
            "connected to the primary named by the sentinels"
        );
        *self.current.lock().unwrap_or_else(PoisonError::into_inner) =
            Some((conn.clone(), generation));
        Ok((conn, generation))
    }

    /// A pub/sub connection to the current primary.
    pub(crate) async fn pubsub(&self) -> RedisResult<PubSub> {
        let client = self.sentinel.lock().await.async_get_client().await?;
        client.get_async_pubsub().await
    }

    /// Drops connection `generation` after an error that may mean the primary changed.
    fn after<T>(&self, result: &RedisResult<T>, generation: u64) {
        let Err(e) = result else { return };
        let moved = e.is_io_error()
            || e.is_timeout()
            || e.is_connection_dropped()
            || e.is_unrecoverable_error()
            || matches!(
                e.kind(),
                ErrorKind::Server(ServerErrorKind::ReadOnly | ServerErrorKind::MasterDown)
            );
        if moved {
            let mut current = self.current.lock().unwrap_or_else(PoisonError::into_inner);
            if current.as_ref().is_some_and(|(_, g)| *g == generation) {
                tracing::debug!("primary connection failed ({e}); asking the sentinels again");
                *current = None;
            }
        }
    }
}

impl ConnectionLike for RedisConnection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match &mut self.0 {
            Conn::Single(c) => c.req_packed_command(cmd),
            Conn::Cluster(c) => c.req_packed_command(cmd),
            Conn::Sentinel(link) => Box::pin(async move {
                let (mut conn, generation) = link.connection().await?;
                let result = conn.req_packed_command(cmd).await;
                link.after(&result, generation);
                result
            }),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match &mut self.0 {
            Conn::Single(c) => c.req_packed_commands(pipeline, offset, count),
            Conn::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
            Conn::Sentinel(link) => Box::pin(async move {
                let (mut conn, generation) = link.connection().await?;
                let result = conn.req_packed_commands(pipeline, offset, count).await;
                link.after(&result, generation);
                result
            }),
        }
    }

    fn get_db(&self) -> i64 {
        match &self.0 {
            Conn::Single(c) => c.get_db(),
            Conn::Cluster(c) => c.get_db(),
            Conn::Sentinel(link) => link.current().map_or(0, |(c, _)| c.get_db()),
        }
    }
}
