//! [`RedisStore`]: the [`Store`] implementation.

use std::collections::BTreeSet;
use std::fmt;
use std::sync::{Arc, PoisonError, RwLock, Weak};
use std::time::Duration;

use leasehold::skew;
use leasehold::store::Operation as Op;
use leasehold::{
    FencingToken, HolderId, LeaseName, LeaseState, Release, Store, StoreError,
    store::{Acquisition, ReleaseFeed, ReleaseSubscription, Renewal, StoreResult, within},
};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::{ClusterClient, ClusterConfig};
use redis::cluster_routing::{MultipleNodeRoutingInfo, RoutingInfo, SingleNodeRoutingInfo};
use redis::sentinel::{SentinelClient, SentinelNodeConnectionInfo, SentinelServerType};
use redis::{AsyncConnectionConfig, ErrorKind, RedisError, ServerErrorKind, Value};
use tokio::sync::watch;

use crate::call::{
    Arg, CATALOG, FENCE, HISTORY as HISTORY_KIND, INSTANCES, LEASE, MEMBERS as MEMBERS_KIND, SLOT,
    TASK as TASK_KIND, TASKS, key_parts, plain_cmd, script_cmd,
};
use crate::config::{DEFAULT_PREFIX, RedisConfig, Target};
use crate::conn::{Conn, RedisConnection, SentinelLink};
use crate::error::{Error, RedisSetupError, Result};
use crate::listener::{self, Source};
use crate::native::{self, Features, NativeRelease};
use crate::scripts::{ACQUIRE, INSPECT, LuaScript, RELEASE, RENEW};

mod catalog;
mod replies;
mod slots;

use replies::*;

/// Leases in Redis: each operation is one Lua script (EVALSHA, falling back to EVAL), atomic on
/// the server and timed by the server's clock (`PX`, `PEXPIRE`, `PTTL`, `TIME`).
///
/// Keys, with the default prefix `leasehold`: `leasehold:{NAME}:lease` (holder and token, with
/// the lease's expiry), `leasehold:{NAME}:fence` (the fencing counter, expiring a
/// [`retention`](crate::RedisConfig::retention) after the name's last acquisition) and
/// `leasehold:{TASK}:slot` (the last claimed slot) and `leasehold:{TASK}:history` (the run
/// history, a sorted set; see [`history_key`](Self::history_key)), `leasehold:{GROUP}:members`
/// (a spread group's membership: holder ids scored by expiry), and for the catalog
/// `leasehold:{TASK}:task`, `leasehold:{TASK}:instances` and the index `leasehold:{#catalog}:tasks`
/// (see [`task_key`](Self::task_key)). The braces are a hash tag, so a lease's keys live in one
/// Redis Cluster slot. Releases are announced on the channel `leasehold:released`.
///
/// Cheap to clone: clones share one multiplexed connection (reconnected automatically after it
/// drops; behind Sentinel, to the primary the sentinels name; on a Redis Cluster, one per node)
/// and one release listener.
#[derive(Clone)]
pub struct RedisStore {
    inner: Arc<Inner>,
}

struct Inner {
    /// Replaced only by a lazily connecting store whose first connection failed for a reason
    /// other than I/O (see [`warm_up`]); the manager itself reconnects after I/O errors.
    conn: RwLock<Conn>,
    prefix: String,
    channel: String,
    /// The limit of an operation without a ttl, and the most one with a ttl gets.
    op_timeout: Duration,
    /// Whether an operation with a ttl gets a third of it ([`RedisConfig::op_timeout`] unset).
    op_timeout_from_ttl: bool,
    retention: Duration,
    /// The URL without its password.
    url: String,
    /// Present when notifications are on.
    releases: Option<ReleaseFeed>,
    /// What connecting has learnt (always [`Access::Known`] for a store from `connect`).
    access: watch::Receiver<Access>,
    /// Which native compare-and-set commands the server has (see [`native`]).
    server: native::Server,
}

impl Inner {
    fn new(
        config: &RedisConfig,
        setup: &Setup,
        conn: Conn,
        access: watch::Receiver<Access>,
        server: native::Server,
    ) -> Self {
        let channel = format!("{}:released", setup.prefix);
        let releases = config
            .notifications
            .then(|| listener::feed(setup.source.clone(), channel.clone(), config, &setup.url));
        Self {
            conn: RwLock::new(conn),
            prefix: setup.prefix.clone(),
            channel,
            op_timeout: config.max_op_timeout(),
            op_timeout_from_ttl: config.op_timeout.is_none(),
            retention: config.retention,
            url: setup.url.clone(),
            releases,
            access,
            server,
        }
    }
}

/// What a lazily connecting store's background connection attempts have learnt. Operations
/// wait for the first attempt to end, so that their first answer already tells a refusal from
/// an outage: some clients (a Redis Cluster's) answer later commands "no connection" whatever
/// the reason was.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Access {
    /// The first attempt has not ended.
    Connecting,
    /// Connected, or not reachable (operations say so themselves).
    Known,
    /// The server refused the credentials, as operations report it.
    Refused(String),
    /// The keys need a newer release: every operation is refused, for good.
    TooOld(skew::TooOld),
}

/// How the store reaches its data.
enum Backend {
    Single {
        client: redis::Client,
        manager_config: ConnectionManagerConfig,
    },
    Sentinel(Arc<SentinelLink>),
    Cluster {
        client: ClusterClient,
        config: ClusterConfig,
    },
}

/// What connecting needs, checked and built from a config before any connection is made.
struct Setup {
    backend: Backend,
    /// Where release notifications are heard.
    source: Source,
    /// The URL without its password.
    url: String,
    /// The key prefix: the URL's `prefix=` or the config's.
    prefix: String,
}

impl Setup {
    fn new(config: &RedisConfig) -> Result<Self> {
        config.validate()?;
        let url = config.describe();
        let invalid = |e: RedisError| RedisSetupError::InvalidUrl {
            url: url.clone(),
            reason: e.to_string(),
        };
        let target = config.target()?;
        let prefix = config.key_prefix(&target)?;
        if config.tls_ca_pem.is_some() && !matches!(target, Target::Single) {
            return Err(RedisSetupError::Config(
                "tls_ca_pem is for rediss:// urls: Sentinel and Cluster urls have no TLS support yet"
                    .into(),
            ).into());
        }
        match target {
            Target::Single => {}
            Target::Sentinel(target) => {
                let sentinels =
                    crate::url::node_infos(&target.sentinels, &target.sentinel_credentials)
                        .map_err(invalid)?;
                let primary = SentinelNodeConnectionInfo::default()
                    .set_redis_connection_info(target.credentials.redis_info(target.db));
                let sentinel = SentinelClient::build(
                    sentinels,
                    target.master.clone(),
                    Some(primary),
                    SentinelServerType::Master,
                )
                .map_err(invalid)?;
                let link = Arc::new(SentinelLink::new(
                    sentinel,
                    AsyncConnectionConfig::new()
                        .set_connection_timeout(Some(config.connect_timeout))
                        .set_response_timeout(Some(config.max_op_timeout())),
                ));
                return Ok(Self {
                    backend: Backend::Sentinel(link.clone()),
                    source: Source::Sentinel(link),
                    url,
                    prefix,
                });
            }
            Target::Cluster(target) => {
                let nodes =
                    crate::url::node_infos(&target.nodes, &target.credentials).map_err(invalid)?;
                let pubsub_nodes = nodes
                    .iter()
                    .map(|node| redis::Client::open(node.clone()))
                    .collect::<redis::RedisResult<Vec<_>>>()
                    .map_err(invalid)?;
                // One retry: a redirect (MOVED/ASK, after a resharding or failover) needs it; more
                // would resend a release or slot claim whose reply was lost more often.
                let client = ClusterClient::builder(nodes)
                    .retries(1)
                    .build()
                    .map_err(invalid)?;
                return Ok(Self {
                    backend: Backend::Cluster {
                        client,
                        config: ClusterConfig::new()
                            .set_connection_timeout(config.connect_timeout)
                            .set_response_timeout(config.max_op_timeout()),
                    },
                    source: Source::Nodes(pubsub_nodes),
                    url,
                    prefix,
                });
            }
        }
        crate::config::check_database(&config.url)?;
        let client = open_client(config).map_err(invalid)?;
        #[cfg(feature = "tls")]
        if config.url.starts_with("rediss") {
            // Pick ring explicitly, in case another crate in the program enabled a second
            // provider (then rustls cannot choose one by itself). Fails only if one is set.
            // rustls 0.23.48 deprecates ring's provider for lacking post-quantum key exchange;
            // ring (no C toolchain, unlike aws-lc-rs) is kept on purpose, so it is allowed.
            #[allow(deprecated)]
            let _ = rustls::crypto::ring::default_provider().install_default();
        }
        // The driver's own response timeout (500 ms by default) would fail every operation
        // slower than that as Unavailable long before op_timeout: it is op_timeout, so the one
        // bound on an operation is op_timeout, end to end, reported as Timeout.
        let manager_config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(config.connect_timeout))
            .set_response_timeout(Some(config.max_op_timeout()))
            .set_number_of_retries(1)
            .set_max_delay(Duration::from_millis(500));
        Ok(Self {
            source: Source::Nodes(vec![client.clone()]),
            backend: Backend::Single {
                client,
                manager_config,
            },
            url,
            prefix,
        })
    }

    /// A connection that connects on first use.
    fn lazy_conn(&self) -> Result<Conn> {
        match &self.backend {
            Backend::Single {
                client,
                manager_config,
            } => ConnectionManager::new_lazy_with_config(client.clone(), manager_config.clone())
                .map(Conn::Single)
                .map_err(|e| {
                    RedisSetupError::InvalidUrl {
                        url: self.url.clone(),
                        reason: e.to_string(),
                    }
                    .into()
                }),
            Backend::Sentinel(link) => Ok(Conn::Sentinel(link.clone())),
            Backend::Cluster { client, config } => Ok(Conn::Cluster(
                client.get_pending_async_connection_with_config(config.clone()),
            )),
        }
    }

    /// A connection, once it is established and the server has accepted its credentials.
    async fn connect(&self) -> redis::RedisResult<Conn> {
        let conn = match &self.backend {
            Backend::Single {
                client,
                manager_config,
            } => ConnectionManager::new_with_config(client.clone(), manager_config.clone())
                .await
                .map(Conn::Single)?,
            Backend::Sentinel(link) => {
                link.connection().await?;
                Conn::Sentinel(link.clone())
            }
            Backend::Cluster { client, config } => client
                .get_async_connection_with_config(config.clone())
                .await
                .map(Conn::Cluster)?,
        };
        // The driver authenticates only when the URL carries credentials, so a server that
        // wants them answers NOAUTH only to the first command: ask now, so that is a connect
        // error rather than a release listener's warning followed by the first operation's
        // error.
        ping(&mut RedisConnection(conn.clone())).await?;
        Ok(conn)
    }
}

impl RedisStore {
    pub(crate) fn open_lazy(config: RedisConfig) -> Result<Self> {
        let setup = Setup::new(&config)?;
        if tokio::runtime::Handle::try_current().is_err() {
            return Err(RedisSetupError::Config(
                "a lazily connecting redis store must be created within a tokio runtime".into(),
            )
            .into());
        }
        let conn = setup.lazy_conn()?;
        tracing::debug!(url = %setup.url, prefix = %setup.prefix, "connecting to redis in the background");
        let (access_tx, access) = watch::channel(Access::Connecting);
        let store = Self {
            inner: Arc::new(Inner::new(
                &config,
                &setup,
                conn,
                access,
                native::Server::default(),
            )),
        };
        tokio::spawn(warm_up(
            Arc::downgrade(&store.inner),
            access_tx,
            setup,
            config.connect_timeout,
            config.max_reconnect_delay,
        ));
        Ok(store)
    }

    pub(crate) async fn connect(config: RedisConfig) -> Result<Self> {
        let setup = Setup::new(&config)?;
        let prefix = setup.prefix.clone();
        let url = setup.url.clone();
        let connect_err = |source| Error::Connect {
            store: url.clone(),
            source,
        };
        let op = Op::new("connect", None);
        let conn = tokio::time::timeout(config.connect_timeout * 3, setup.connect())
            .await
            .map_err(|_| connect_err(StoreError::Timeout(config.connect_timeout)))?
            .map_err(|e| connect_err(classify(e, op, &prefix, &url)))?;
        check_release(&mut RedisConnection(conn.clone()), &prefix)
            .await
            .map_err(|e| connect_err(classify(e, op, &prefix, &url)))?
            .map_err(|source| Error::TooOld {
                store: url.clone(),
                source,
            })?;

        // Nothing to wait for: the listener subscribes when a waiter first waits.
        tracing::debug!(url = %url, prefix = %prefix, "connected to redis");
        let server = native::Server::default();
        if !conn.is_cluster() {
            server.detect(&mut RedisConnection(conn.clone())).await;
        }
        let access = watch::channel(Access::Known).1;
        Ok(Self {
            inner: Arc::new(Inner::new(&config, &setup, conn, access, server)),
        })
    }

    /// The key prefix in use.
    pub fn prefix(&self) -> &str {
        &self.inner.prefix
    }

    /// The key holding `name`'s lease (holder and token, with the lease's expiry).
    pub fn lease_key(&self, name: &LeaseName) -> String {
        key_parts(&self.inner.prefix, name.as_str(), LEASE).concat()
    }

    /// The key holding `name`'s fencing counter (expiring a
    /// [`retention`](crate::RedisConfig::retention) after the name's last acquisition).
    pub fn fence_key(&self, name: &LeaseName) -> String {
        key_parts(&self.inner.prefix, name.as_str(), FENCE).concat()
    }

    /// The key holding the last slot claimed for `task`.
    pub fn slot_key(&self, task: &LeaseName) -> String {
        key_parts(&self.inner.prefix, task.as_str(), SLOT).concat()
    }

    /// The key holding `task`'s run history: a sorted set whose members all have score 0 and
    /// read `<key>:<entry>`, the key as 20 zero-padded decimal digits. Members of equal score sort
    /// by their bytes, so the set's order is the keys' order over the whole `u64` range (a score,
    /// a double, would be exact only up to 2^53).
    pub fn history_key(&self, task: &LeaseName) -> String {
        key_parts(&self.inner.prefix, task.as_str(), HISTORY_KIND).concat()
    }

    /// The key holding `group`'s membership: a sorted set of holder ids, each scored by its
    /// expiry in ms on the server's clock.
    pub fn members_key(&self, group: &LeaseName) -> String {
        key_parts(&self.inner.prefix, group.as_str(), MEMBERS_KIND).concat()
    }

    /// One of `name`'s keys, as a script argument.
    fn key<'a>(&'a self, name: &'a LeaseName, kind: &'static str) -> Arg<'a> {
        Arg::Key {
            prefix: &self.inner.prefix,
            name: name.as_str(),
            kind,
        }
    }

    /// `SET lease tenure IFEQ tenure PX ttl`: the native renewal (see [`native`]).
    fn renew_cmd(
        &self,
        name: &LeaseName,
        holder_id: &HolderId,
        token: FencingToken,
        ttl: Duration,
    ) -> redis::Cmd {
        let tenure = Arg::Tenure(token, holder_id);
        plain_cmd(&[
            Arg::Str("SET"),
            self.key(name, LEASE),
            tenure,
            Arg::Str("IFEQ"),
            tenure,
            Arg::Str("PX"),
            ttl_millis(ttl),
        ])
    }

    /// The pub/sub channel on which releases are announced (the payload is the lease name).
    pub fn release_channel(&self) -> &str {
        &self.inner.channel
    }

    /// A handle on the shared connection, for commands of your own: to the server, to the
    /// current primary behind Sentinel, or, on a Redis Cluster, routed to the node owning each
    /// command's keys. (For a store from [`connect_lazy`](crate::connect_lazy) that has not
    /// connected yet, its commands fail until the server answers.)
    pub fn connection(&self) -> RedisConnection {
        self.inner.conn()
    }

    /// The time limit of an operation on a lease of `ttl` (`None`: no ttl); see
    /// [`RedisConfig::op_timeout`].
    fn limit(&self, ttl: Option<Duration>) -> Duration {
        match ttl {
            Some(ttl) if self.inner.op_timeout_from_ttl => {
                (ttl / 3).clamp(Duration::from_millis(1), self.inner.op_timeout)
            }
            _ => self.inner.op_timeout,
        }
    }

    /// Runs `script` (EVALSHA, then EVAL if the server does not have it) within the time limit
    /// of an operation on a lease of `ttl` ([`limit`](Self::limit)). An `idempotent` operation is
    /// retried once on a fresh connection if the connection broke under it; the others (release,
    /// claim_slot) are not, since a lost reply would turn a success into a misleading
    /// `NotHeld`/`AlreadyRun`.
    async fn eval(
        &self,
        script: &LuaScript,
        keys: &[Arg<'_>],
        args: &[Arg<'_>],
        op: Op<'_>,
        idempotent: bool,
        ttl: Option<Duration>,
    ) -> StoreResult<Value> {
        let attempt = async {
            self.inner.ready(op).await?;
            let mut retried = false;
            loop {
                match self.eval_once(script, keys, args).await {
                    Err(e) if idempotent && !retried && e.is_unrecoverable_error() => {
                        tracing::debug!(error = %e, "{op}: connection broke, retrying once");
                        retried = true;
                    }
                    result => return result.map_err(|e| self.classify(e, op)),
                }
            }
        };
        within(self.limit(ttl), attempt).await
    }

    async fn eval_once(
        &self,
        script: &LuaScript,
        keys: &[Arg<'_>],
        args: &[Arg<'_>],
    ) -> redis::RedisResult<Value> {
        let mut conn = self.inner.ready_conn().await;
        match script_cmd(script, true, keys, args)
            .query_async(&mut conn)
            .await
        {
            Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                script_cmd(script, false, keys, args)
                    .query_async(&mut conn)
                    .await
            }
            result => result,
        }
    }

    /// Runs `script` once per call, answering in the calls' order: one pipeline (one round trip)
    /// on a single server or behind Sentinel; on a Redis Cluster, which refuses a pipeline whose
    /// keys span slots, one script per call, all at once. For operations that may be repeated
    /// (renewals, reads): on a cluster each call is retried as [`eval`](Self::eval) retries.
    async fn eval_each(
        &self,
        script: &LuaScript,
        calls: &[ScriptCall<'_>],
        op: Op<'_>,
        ttl: Option<Duration>,
    ) -> StoreResult<Vec<Value>> {
        if calls.is_empty() {
            return Ok(Vec::new());
        }
        if self.is_cluster() {
            let each = calls
                .iter()
                .map(|call| self.eval(script, &call.keys, &call.args, call.op, true, ttl));
            return futures_util::future::join_all(each)
                .await
                .into_iter()
                .collect();
        }
        let pipeline = |by_hash: bool| {
            let mut pipe = redis::Pipeline::with_capacity(calls.len());
            for call in calls {
                pipe.add_command(script_cmd(script, by_hash, &call.keys, &call.args));
            }
            pipe
        };
        let attempt = async {
            self.inner.ready(op).await?;
            let mut conn = self.inner.ready_conn().await;
            let replies: Vec<Value> = match pipeline(true).query_async(&mut conn).await {
                Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                    pipeline(false).query_async(&mut conn).await
                }
                result => result,
            }
            .map_err(|e| self.classify(e, op))?;
            if replies.len() != calls.len() {
                return Err(corrupt(
                    op,
                    format_args!("{} replies for {} scripts", replies.len(), calls.len()),
                ));
            }
            Ok(replies)
        };
        within(self.limit(ttl), attempt).await
    }

    fn is_cluster(&self) -> bool {
        self.inner.conn().0.is_cluster()
    }

    /// What the server offers, asking it first if this connection has not been asked. A Redis
    /// Cluster's nodes are not asked (they may differ): it keeps the scripts.
    async fn features(&self) -> Features {
        let known = self.inner.server.features();
        if known.known() || self.is_cluster() {
            return known;
        }
        let mut conn = self.inner.ready_conn().await;
        self.inner.server.detect(&mut conn).await
    }

    /// Sends the native commands `build` makes for what the server offers (see [`native`];
    /// `None`: it has none for this operation) within the time limit of an operation on
    /// a lease of `ttl`, retrying an `idempotent` one as [`eval`](Self::eval) does. `Ok(None)`:
    /// no native commands, or the server refused them before changing anything: the caller
    /// runs the script instead
    /// (which reports a key of another type as it always has); a server that lacks the command
    /// gets the scripts from here on.
    async fn native(
        &self,
        build: impl FnOnce(Features) -> Option<redis::Pipeline>,
        op: Op<'_>,
        idempotent: bool,
        ttl: Option<Duration>,
    ) -> StoreResult<Option<Vec<Value>>> {
        let attempt = async {
            self.inner.ready(op).await?;
            let Some(pipe) = build(self.features().await) else {
                return Ok(None);
            };
            let mut retried = false;
            loop {
                let mut conn = self.inner.ready_conn().await;
                match pipe.query_async::<Vec<Value>>(&mut conn).await {
                    Ok(replies) => return Ok(Some(replies)),
                    Err(e) if idempotent && !retried && e.is_unrecoverable_error() => {
                        tracing::debug!(error = %e, "{op}: connection broke, retrying once");
                        retried = true;
                    }
                    Err(e) if native::is_refusal(&e) => {
                        if native::is_unsupported(&e) {
                            tracing::debug!(error = %e, "{op}: native command refused; scripts from here on");
                            self.inner.server.scripts_only();
                        }
                        return Ok(None);
                    }
                    Err(e) => return Err(self.classify(e, op)),
                }
            }
        };
        within(self.limit(ttl), attempt).await
    }

    fn classify(&self, e: RedisError, op: Op<'_>) -> StoreError {
        if e.is_io_error() || e.is_unrecoverable_error() || e.is_connection_dropped() {
            // The connection comes back, perhaps to another server: ask it again.
            self.inner.server.forget();
        }
        let error = if e.is_timeout() {
            // The driver's response timeout, which is op_timeout.
            StoreError::Timeout(self.inner.op_timeout)
        } else {
            classify(e, op, &self.inner.prefix, &self.inner.url)
        };
        match &*self.inner.access.borrow() {
            // The driver's own error ("no connections") would only mislead.
            Access::Refused(refusal) if error.is_transient() => StoreError::Rejected {
                message: format!("{op}: {refusal}"),
                source: None,
            },
            _ => error,
        }
    }
}

impl Inner {
    /// Waits for a lazily connecting store's first attempt; then refuses every operation if
    /// the keys need a newer release, before anything is written.
    async fn ready(&self, op: Op<'_>) -> StoreResult<()> {
        let mut access = self.access.clone();
        let _ = access.wait_for(|a| *a != Access::Connecting).await;
        match &*access.borrow() {
            Access::TooOld(too_old) => Err(StoreError::rejected(
                format!("{op}: {too_old}"),
                too_old.clone(),
            )),
            _ => Ok(()),
        }
    }

    /// The connection, once a lazily connecting store's first attempt has ended.
    async fn ready_conn(&self) -> RedisConnection {
        let mut access = self.access.clone();
        let _ = access.wait_for(|a| *a != Access::Connecting).await;
        self.conn()
    }

    fn conn(&self) -> RedisConnection {
        RedisConnection(
            self.conn
                .read()
                .unwrap_or_else(PoisonError::into_inner)
                .clone(),
        )
    }
}

/// Brings a lazily connecting store's connection up without waiting for a first operation:
/// PINGs, with backoff, until the server answers, then leaves reconnecting to the connection
/// manager. Ends when the store is dropped. One warning while the server is unreachable, one
/// notice when it answers.
async fn warm_up(
    inner: Weak<Inner>,
    access: watch::Sender<Access>,
    setup: Setup,
    connect_timeout: Duration,
    max_delay: Duration,
) {
    let min_delay = Duration::from_millis(100);
    let mut delay = min_delay;
    let mut warned = false;
    loop {
        let Some(store) = inner.upgrade() else {
            return;
        };
        let mut conn = store.conn();
        drop(store);
        let attempt = async {
            if let Backend::Cluster { .. } = setup.backend {
                // A pending cluster connection answers "no connections" whatever kept it from
                // the nodes; a connection of its own reports why (refused credentials, say).
                let fresh = setup.connect().await?;
                if let Some(store) = inner.upgrade() {
                    *store.conn.write().unwrap_or_else(PoisonError::into_inner) = fresh;
                }
                Ok(())
            } else {
                // Each PING waits for the manager's current connection attempt, so one slow
                // attempt is not abandoned: a PING that times out is simply followed by another.
                ping(&mut conn).await
            }
        };
        let failure = match tokio::time::timeout(connect_timeout, attempt).await {
            Ok(Ok(())) => None,
            Ok(Err(e)) => {
                access.send_replace(if is_auth_failure(&e) {
                    Access::Refused(credentials_refused(&setup.url))
                } else {
                    Access::Known
                });
                if !e.is_io_error() {
                    // The manager keeps a failed connection attempt (refused credentials, say)
                    // and reconnects only after I/O errors: start over with a fresh one, so a
                    // fix on the server side is picked up.
                    if let (Some(store), Ok(fresh)) = (inner.upgrade(), setup.lazy_conn()) {
                        *store.conn.write().unwrap_or_else(PoisonError::into_inner) = fresh;
                    }
                }
                Some(e.to_string())
            }
            Err(_) => {
                access.send_replace(Access::Known);
                Some(format!("no answer within {connect_timeout:?}"))
            }
        };
        let failure = match failure {
            Some(failure) => Some(failure),
            None => match inner.upgrade() {
                None => return,
                Some(store) => {
                    let (mut conn, prefix) = (store.conn(), store.prefix.clone());
                    drop(store);
                    match tokio::time::timeout(connect_timeout, check_release(&mut conn, &prefix))
                        .await
                    {
                        Ok(Ok(Ok(()))) => None,
                        Ok(Ok(Err(too_old))) => {
                            tracing::error!(url = %setup.url, error = %too_old, "every operation will be refused");
                            access.send_replace(Access::TooOld(too_old));
                            return;
                        }
                        Ok(Err(e)) => Some(e.to_string()),
                        Err(_) => Some(format!("no answer within {connect_timeout:?}")),
                    }
                }
            },
        };
        let Some(failure) = failure else {
            access.send_replace(Access::Known);
            if warned {
                tracing::info!(url = %setup.url, "connected to redis");
            } else {
                tracing::debug!(url = %setup.url, "connected to redis");
            }
            return;
        };
        if !warned {
            tracing::warn!(
                url = %setup.url,
                "redis cannot be used yet (unreachable or refusing), operations fail until it \
                 answers; retrying: {failure}"
            );
            warned = true;
        } else {
            tracing::debug!(url = %setup.url, "redis still cannot be used: {failure}");
        }
        let jitter = fastrand::u64(..=delay.as_millis() as u64 / 2);
        tokio::time::sleep(delay + Duration::from_millis(jitter)).await;
        delay = (delay * 2).min(max_delay);
    }
}

fn open_client(config: &RedisConfig) -> redis::RedisResult<redis::Client> {
    match &config.tls_ca_pem {
        None => redis::Client::open(config.url.as_str()),
        #[cfg(feature = "tls")]
        Some(pem) => redis::Client::build_with_tls(
            config.url.as_str(),
            redis::TlsCertificates {
                client_tls: None,
                root_cert: Some(pem.clone()),
            },
        ),
        #[cfg(not(feature = "tls"))]
        Some(_) => Err(redis::RedisError::from((
            ErrorKind::InvalidClientConfig,
            "tls_ca_pem needs the `tls` feature of leasehold-redis",
        ))),
    }
}

/// Maps a driver error to the core's [`StoreError`], with a message a person can act on.
fn classify(e: RedisError, op: Op<'_>, prefix: &str, url: &str) -> StoreError {
    let detail = e.detail().unwrap_or_default().to_owned();
    let code = e.code().unwrap_or_default().to_owned();
    let unavailable = |e: RedisError| StoreError::unavailable(format!("{op} at {url}: {e}"), e);
    if is_auth_failure(&e) {
        return StoreError::rejected(format!("{op}: {}", credentials_refused(url)), e);
    }
    match e.kind() {
        ErrorKind::Io | ErrorKind::Client | ErrorKind::ClusterConnectionNotFound => unavailable(e),
        // Also what a wrong primary name gives; it is retried like a failover in progress.
        ErrorKind::MasterNameNotFoundBySentinel | ErrorKind::EmptySentinelList => {
            StoreError::unavailable(
                format!(
                    "{op} at {url}: no sentinel names a reachable primary by that name (a \
                     failover in progress, or a wrong name): {e}"
                ),
                e,
            )
        }
        ErrorKind::Server(
            ServerErrorKind::BusyLoading
            | ServerErrorKind::TryAgain
            | ServerErrorKind::ClusterDown
            | ServerErrorKind::MasterDown
            | ServerErrorKind::ReadOnly,
        ) => unavailable(e),
        ErrorKind::Server(ServerErrorKind::NoPerm) if detail.contains("'eval") => {
            StoreError::rejected(
                format!(
                    "{op}: scripts are not allowed for this redis user ({detail}); leasehold \
                     runs every operation as a Lua script, so grant +@scripting \
                     (or at least +eval +evalsha)"
                ),
                e,
            )
        }
        ErrorKind::Server(ServerErrorKind::NoPerm) => StoreError::rejected(
            format!(
                "{op}: the redis user lacks a permission ({detail}); it needs the scripting \
                 commands (+eval +evalsha, or +@scripting), +time, +scan (to list leases), \
                 read/write on keys '{prefix}:*' and publish/subscribe on channel \
                 '{prefix}:released'"
            ),
            e,
        ),
        ErrorKind::Server(ServerErrorKind::NoScript) => StoreError::rejected(
            format!("{op}: the server does not run scripts (NOSCRIPT even after EVAL): {e}"),
            e,
        ),
        // Through a cluster url, a redirect the client had no retry left to follow: the slot
        // moved (a failover, a resharding) and the next attempt goes to its new owner.
        ErrorKind::Server(ServerErrorKind::Moved | ServerErrorKind::Ask)
            if url.starts_with(crate::url::CLUSTER_SCHEME) =>
        {
            unavailable(e)
        }
        ErrorKind::Server(ServerErrorKind::Moved | ServerErrorKind::Ask) => StoreError::rejected(
            format!("{op}: {url} is a Redis Cluster node that redirected the request ({e})"),
            e,
        ),
        ErrorKind::Parse | ErrorKind::UnexpectedReturnType => {
            StoreError::Corrupt(format!("{op}: unexpected reply from redis: {e}"))
        }
        _ => match code.as_str() {
            "WRONGTYPE" => StoreError::rejected(
                format!(
                    "{op}: {}; delete that key or choose another key prefix",
                    if detail.starts_with("key ") {
                        detail.clone()
                    } else {
                        format!("a key holds the wrong type of value ({detail})")
                    }
                ),
                e,
            ),
            "LEASEHOLD_CORRUPT" => StoreError::Corrupt(format!("{op}: {detail}")),
            "ERR" if detail.contains("can't run this command") => StoreError::rejected(
                format!(
                    "{op}: the redis user may not run a command the script uses ({detail}); \
                     see the leasehold-redis README for the ACL it needs"
                ),
                e,
            ),
            "ERR" if detail.contains("unknown command") || detail.contains("disabled") => {
                StoreError::rejected(
                    format!("{op}: scripts are not allowed on this server ({detail})"),
                    e,
                )
            }
            _ => StoreError::rejected(format!("{op}: redis refused: {e}"), e),
        },
    }
}

/// The hash that records the keys' schema version and the oldest release that may still write
/// to them (see [`leasehold::skew`]): `PREFIX:{#meta}:release`, under a tag of its own like the
/// catalog's index.
const META: &str = "#meta";
const RELEASE_KIND: &str = "release";
/// The keys' schema version: 1 was release 0.1.0's keys, 2 added the catalog's and this hash.
pub(crate) const KEYS_VERSION: i64 = 2;

/// Refuses (`Ok(Err)`) keys that need a newer release, before anything is written; otherwise
/// records this release's schema version and oldest writer where they are missing or lower.
/// A user whose ACL predates the record (no hash commands) is let through unchecked, as it is
/// to the catalog.
async fn check_release(
    conn: &mut RedisConnection,
    prefix: &str,
) -> redis::RedisResult<std::result::Result<(), skew::TooOld>> {
    let key = key_parts(prefix, META, RELEASE_KIND).concat();
    let no_perm = |e: &RedisError| e.kind() == ErrorKind::Server(ServerErrorKind::NoPerm);
    let read: redis::RedisResult<(Option<String>, Option<String>)> = redis::cmd("HMGET")
        .arg(&key)
        .arg(skew::SCHEMA_VERSION_KEY)
        .arg(skew::MIN_WRITER_KEY)
        .query_async(conn)
        .await;
    let (version, min_writer) = match read {
        Err(e) if no_perm(&e) => return Ok(Ok(())),
        read => read?,
    };
    if let Some(min_writer) = &min_writer
        && let Err(too_old) = skew::check_writer(min_writer)
    {
        return Ok(Err(too_old));
    }
    let mut write = redis::cmd("HSET");
    write.arg(&key);
    let mut fields = 0;
    if version
        .and_then(|v| v.parse::<i64>().ok())
        .is_none_or(|v| v < KEYS_VERSION)
    {
        write.arg(skew::SCHEMA_VERSION_KEY).arg(KEYS_VERSION);
        fields += 1;
    }
    if let Some(raised) = skew::raised_min_writer(min_writer.as_deref()) {
        write.arg(skew::MIN_WRITER_KEY).arg(raised);
        fields += 1;
    }
    if fields > 0 {
        match write.query_async::<Value>(conn).await {
            Err(e) if no_perm(&e) => {}
            written => {
                written?;
            }
        }
    }
    Ok(Ok(()))
}

/// PING, answered by a server that accepts this connection's credentials. A user without
/// permission to run PING is connected all the same.
async fn ping(conn: &mut RedisConnection) -> redis::RedisResult<()> {
    match redis::cmd("PING").query_async::<Value>(conn).await {
        Err(e) if e.kind() != ErrorKind::Server(ServerErrorKind::NoPerm) => Err(e),
        _ => Ok(()),
    }
}

/// What a refusal of the credentials says.
fn credentials_refused(url: &str) -> String {
    let sentinels = if url.starts_with(crate::url::SENTINEL_SCHEME) {
        ", and sentinel_password for the sentinels"
    } else {
        ""
    };
    format!("redis refused the credentials (check the user and password in the url{sentinels})")
}

/// Whether `e` is the server refusing the credentials: wrong, missing (`NOAUTH`), or a user
/// that may not log in. A Redis Cluster client reports it inside an I/O error ("failed to
/// create initial connections") whose detail quotes the node's refusal, so the text is read
/// too; retrying such an error cannot help, whatever its kind.
fn is_auth_failure(e: &RedisError) -> bool {
    const REFUSALS: [&str; 3] = ["AuthenticationFailed", "NOAUTH", "WRONGPASS"];
    match e.kind() {
        ErrorKind::AuthenticationFailed => true,
        ErrorKind::Io | ErrorKind::Client | ErrorKind::ClusterConnectionNotFound => e
            .detail()
            .is_some_and(|detail| REFUSALS.iter().any(|r| detail.contains(r))),
        _ => e.code().is_some_and(|code| REFUSALS[1..].contains(&code)),
    }
}

// No purge: every record expires by itself on the server (a lease when its ttl runs out, its
// fencing counter a retention later). A tick is one script.
leasehold::declare_capabilities!(RedisStore: SLOTS | MEMBERSHIP | CATALOG | TICK);

impl Store for RedisStore {
    async fn acquire(
        &self,
        name: &LeaseName,
        holder_id: &HolderId,
        ttl: Duration,
    ) -> StoreResult<Acquisition> {
        let op = Op::new("acquire", Some(name));
        let reply = self
            .eval(
                &ACQUIRE,
                &[self.key(name, LEASE), self.key(name, FENCE)],
                &[
                    Arg::Str(holder_id.as_str()),
                    ttl_millis(ttl),
                    ttl_millis(self.inner.retention.max(ttl)),
                ],
                op,
                true,
                Some(ttl),
            )
            .await?;
        // A grant is the token alone; busy is `{0, holder, pttl}`.
        if !matches!(reply, Value::Array(_)) {
            return Ok(Acquisition::Acquired {
                token: token(op, Some(&reply))?,
            });
        }
        let reply = items(op, reply)?;
        Ok(Acquisition::Busy {
            holder: holder(op, reply.get(1))?,
            remaining: remaining(op, reply.get(2))?,
        })
    }

    async fn renew(
        &self,
        name: &LeaseName,
        holder_id: &HolderId,
        token: FencingToken,
        ttl: Duration,
    ) -> StoreResult<Renewal> {
        let op = Op::new("renew", Some(name));
        let native = |features: Features| {
            features.set_ifeq().then(|| {
                let mut pipe = redis::Pipeline::with_capacity(1);
                pipe.add_command(self.renew_cmd(name, holder_id, token, ttl));
                pipe
            })
        };
        if let Some(replies) = self.native(native, op, true, Some(ttl)).await? {
            return renewal(op, replies.first());
        }
        let reply = self
            .eval(
                &RENEW,
                &[self.key(name, LEASE)],
                &[Arg::Tenure(token, holder_id), ttl_millis(ttl)],
                op,
                true,
                Some(ttl),
            )
            .await?;
        Ok(match int(op, Some(&reply))? {
            1 => Renewal::Renewed,
            _ => Renewal::Lost,
        })
    }

    async fn release(
        &self,
        name: &LeaseName,
        holder_id: &HolderId,
        token: FencingToken,
    ) -> StoreResult<Release> {
        let op = Op::new("release", Some(name));
        let native = |features: Features| {
            let how = features.release()?;
            let (key, tenure) = (self.key(name, LEASE), Arg::Tenure(token, holder_id));
            let delete = match how {
                NativeRelease::DelIfEq => plain_cmd(&[Arg::Str("DELIFEQ"), key, tenure]),
                NativeRelease::DelEx => {
                    plain_cmd(&[Arg::Str("DELEX"), key, Arg::Str("IFEQ"), tenure])
                }
            };
            let mut pipe = redis::Pipeline::with_capacity(2);
            pipe.add_command(delete);
            pipe.add_command(plain_cmd(&[
                Arg::Str("PUBLISH"),
                Arg::Str(&self.inner.channel),
                Arg::Str(name.as_str()),
            ]));
            Some(pipe)
        };
        if let Some(replies) = self.native(native, op, false, None).await? {
            return Ok(match int(op, replies.first())? {
                1 => Release::Released,
                _ => Release::NotHeld,
            });
        }
        let reply = self
            .eval(
                &RELEASE,
                &[self.key(name, LEASE)],
                &[
                    Arg::Tenure(token, holder_id),
                    Arg::Str(&self.inner.channel),
                    Arg::Str(name.as_str()),
                ],
                op,
                false,
                None,
            )
            .await?;
        Ok(match int(op, Some(&reply))? {
            1 => Release::Released,
            _ => Release::NotHeld,
        })
    }

    async fn inspect(&self, name: &LeaseName) -> StoreResult<Option<LeaseState>> {
        let op = Op::new("inspect", Some(name));
        let reply = self
            .eval(
                &INSPECT,
                &[self.key(name, LEASE), self.key(name, FENCE)],
                &[],
                op,
                true,
                None,
            )
            .await?;
        lease_state(op, reply)
    }

    async fn now_millis(&self) -> StoreResult<u64> {
        let op = Op::new("time", None);
        let attempt = async {
            self.inner.ready(op).await?;
            let mut conn = self.inner.ready_conn().await;
            let (secs, micros): (u64, u64) = redis::cmd("TIME")
                .query_async(&mut conn)
                .await
                .map_err(|e| self.classify(e, op))?;
            Ok(secs * 1000 + micros / 1000)
        };
        within(self.inner.op_timeout, attempt).await
    }

    fn subscribe_releases(&self) -> Option<ReleaseSubscription> {
        self.inner.releases.as_ref().map(ReleaseFeed::subscribe)
    }

    fn describe(&self) -> String {
        if self.inner.prefix == DEFAULT_PREFIX {
            self.inner.url.clone()
        } else {
            format!("{} (prefix {})", self.inner.url, self.inner.prefix)
        }
    }

    /// One pipeline of renewals (native `SET … IFEQ`, or scripts): one round trip for the
    /// batch (on a Redis Cluster, one renew script per lease, all at once).
    async fn renew_many(
        &self,
        holder_id: &HolderId,
        leases: &[(LeaseName, FencingToken)],
        ttl: Duration,
    ) -> StoreResult<Vec<Renewal>> {
        let op = Op::new("renew_many", None);
        if !leases.is_empty() {
            let native = |features: Features| {
                features.set_ifeq().then(|| {
                    let mut pipe = redis::Pipeline::with_capacity(leases.len());
                    for (name, token) in leases {
                        pipe.add_command(self.renew_cmd(name, holder_id, *token, ttl));
                    }
                    pipe
                })
            };
            if let Some(replies) = self.native(native, op, true, Some(ttl)).await? {
                if replies.len() != leases.len() {
                    return Err(corrupt(
                        op,
                        format_args!("{} replies for {} renewals", replies.len(), leases.len()),
                    ));
                }
                return replies.iter().map(|r| renewal(op, Some(r))).collect();
            }
        }
        let ttl_arg = ttl_millis(ttl);
        let calls: Vec<ScriptCall<'_>> = leases
            .iter()
            .map(|(name, token)| ScriptCall {
                keys: vec![self.key(name, LEASE)],
                args: vec![Arg::Tenure(*token, holder_id), ttl_arg],
                op: Op::new("renew", Some(name)),
            })
            .collect();
        self.eval_each(&RENEW, &calls, op, Some(ttl))
            .await?
            .iter()
            .map(|reply| {
                Ok(match int(op, Some(reply))? {
                    1 => Renewal::Renewed,
                    _ => Renewal::Lost,
                })
            })
            .collect()
    }
}

impl fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisStore")
            .field("url", &self.inner.url)
            .field("prefix", &self.inner.prefix)
            .field("op_timeout", &self.inner.op_timeout)
            .field("notifications", &self.inner.releases.is_some())
            .finish()
    }
}

/// One script call of a batch ([`RedisStore::eval_each`]).
struct ScriptCall<'a> {
    keys: Vec<Arg<'a>>,
    args: Vec<Arg<'a>>,
    /// What the call is about, for its errors where it is sent on its own (a Redis Cluster).
    op: Op<'a>,
}

/// Opening a store from its settings: here rather than in `config`, which is plain data.
impl RedisConfig {
    /// Checks the settings, connects, and (with [`notifications`](Self::notifications)) starts
    /// listening for releases.
    pub async fn connect(self) -> Result<RedisStore> {
        RedisStore::connect(self).await
    }

    /// Checks the settings and returns a store at once, without waiting for the server: it
    /// connects (and, with [`notifications`](Self::notifications), subscribes) in the
    /// background, retrying with backoff until the server answers, and reconnects after the
    /// connection drops. Until then every operation fails with
    /// [`StoreError::Unavailable`](leasehold::StoreError::Unavailable) (or `Timeout` if the server
    /// does not answer at all), so a scheduler or a waiter can start while its store is down.
    ///
    /// Fails only on a URL or setting that can never work ([`RedisSetupError::InvalidUrl`],
    /// [`RedisSetupError::Config`]), or when called outside a Tokio runtime ([`RedisSetupError::Config`]); never
    /// with [`Error::Connect`].
    pub fn connect_lazy(self) -> Result<RedisStore> {
        RedisStore::open_lazy(self)
    }
}
