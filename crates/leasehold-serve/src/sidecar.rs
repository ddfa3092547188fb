//! A sidecar's state: what it holds for applications, and how it behaves. Below the handlers
//! that serve it and the router that routes to them.

use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::time::Duration;

use leasehold::fleet::Fleet;
use leasehold::gate::Campaigns;
use leasehold::history::{DEFAULT_HISTORY_LIMIT, HistoryWriter};
use leasehold::lifecycle::TickedTasks;
use leasehold::presence::Presence;
use leasehold::{BoxStore, CancellationToken, HolderId, StoreDownPolicy};

use crate::held::Registry;
use crate::hosts::AllowedHost;
use crate::prometheus::Metrics;

/// How long a history write may take before it is given up.
const HISTORY_WRITE_LIMIT: Duration = Duration::from_secs(5);

/// The holder id of a sidecar's campaigns for tick groups.
fn group_holder(holder: &str) -> HolderId {
    HolderId::new(format!("{holder}#group")).unwrap_or_else(|_| HolderId::generate())
}

/// The instance id a sidecar registers its ticked tasks under in the catalog.
fn catalog_instance(holder: &str) -> HolderId {
    HolderId::new(holder).unwrap_or_else(|_| HolderId::generate())
}

/// How a sidecar behaves.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct SidecarConfig {
    /// The holder id leases are taken under; each grant adds `#N`. Default `HOSTNAME-PID`.
    pub holder: String,
    /// What a tick does while the store cannot answer, unless the tick says.
    pub on_store_down: StoreDownPolicy,
    /// The longest any request waits (acquire's `wait_ms`, watch, observe): a long-poll
    /// answers by then, below the idle timeout of a proxy in between. Default 5 minutes.
    pub max_wait: Duration,
    /// The recorder `GET /metrics` renders; without one that path answers 404. Default none.
    pub metrics: Option<Metrics>,
    /// Names (or addresses) the sidecar also answers under without a token, besides the
    /// loopback ones (see [`Sidecar::router`]). Default none.
    pub allowed_hosts: Vec<AllowedHost>,
    /// How many run-history entries the store keeps per task ticked through the sidecar.
    /// Default [`DEFAULT_HISTORY_LIMIT`] (100).
    pub history_limit: usize,
}

impl Default for SidecarConfig {
    fn default() -> Self {
        Self {
            holder: format!("{}-{}", leasehold::host_name(), std::process::id()),
            on_store_down: StoreDownPolicy::FailClosed,
            max_wait: Duration::from_secs(300),
            metrics: None,
            allowed_hosts: Vec::new(),
            history_limit: DEFAULT_HISTORY_LIMIT,
        }
    }
}

impl SidecarConfig {
    /// Sets the holder id prefix.
    pub fn holder(mut self, holder: impl Into<String>) -> Self {
        self.holder = holder.into();
        self
    }

    /// Keeps `entries` run-history entries per task (at least one).
    pub fn history_limit(mut self, entries: usize) -> Self {
        self.history_limit = entries.max(1);
        self
    }

    /// Caps every wait a request asks for.
    pub fn max_wait(mut self, max_wait: Duration) -> Self {
        self.max_wait = max_wait;
        self
    }

    /// Serves `metrics` at `GET /metrics`.
    pub fn metrics(mut self, metrics: Metrics) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// Sets the default store-down policy of ticks.
    pub fn on_store_down(mut self, policy: StoreDownPolicy) -> Self {
        self.on_store_down = policy;
        self
    }

    /// Also answers under `host` without a token (`leasehold serve --allow-host`).
    pub fn allow_host(mut self, host: AllowedHost) -> Self {
        self.allowed_hosts.push(host);
        self
    }
}

/// A sidecar's state: what it holds for applications. Cheap to clone.
#[derive(Clone)]
pub struct Sidecar(pub(crate) Arc<Shared>);

pub(crate) struct Shared {
    pub(crate) store: BoxStore,
    /// The catalog and control the fleet endpoints read and write.
    pub(crate) fleet: Fleet<BoxStore>,
    pub(crate) holder: String,
    pub(crate) seq: AtomicU64,
    pub(crate) on_store_down: StoreDownPolicy,
    pub(crate) max_wait: Duration,
    pub(crate) metrics: Option<Metrics>,
    pub(crate) allowed_hosts: Vec<AllowedHost>,
    pub(crate) registry: Arc<Registry>,
    /// Leadership of the groups applications tick in.
    pub(crate) campaigns: Campaigns<BoxStore>,
    /// Where runs and misses are recorded.
    pub(crate) history: HistoryWriter,
    /// The ticked tasks' registrations in the store's catalog.
    pub(crate) presence: Arc<Presence<BoxStore>>,
    /// The ticked tasks' lives between ticks (and the store's clock as the last tick read it).
    pub(crate) ticked: TickedTasks,
    /// `STORE_UNKNOWN`, `STORE_UP` or `STORE_DOWN`, as the last request that asked found it.
    pub(crate) store_state: AtomicU8,
    pub(crate) stop: CancellationToken,
}

const STORE_UNKNOWN: u8 = 0;
const STORE_UP: u8 = 1;
const STORE_DOWN: u8 = 2;

impl Shared {
    /// A holder id of its own for one grant, so two grants of one sidecar never share a
    /// tenure (a re-acquire by the same holder would end the older one).
    pub(crate) fn holder_id(&self, label: Option<&str>) -> HolderId {
        let n = self.seq.fetch_add(1, Ordering::Relaxed);
        let id = match label {
            Some(label) => format!("{label}@{}#{n}", self.holder),
            None => format!("{}#{n}", self.holder),
        };
        HolderId::new(id).unwrap_or_else(|_| self.fallback_holder(n))
    }

    fn fallback_holder(&self, n: u64) -> HolderId {
        HolderId::new(format!("sidecar-{}#{n}", std::process::id()))
            .unwrap_or_else(|_| HolderId::generate())
    }

    /// Notes whether the store answered (`failed` is true for an unreachable store).
    pub(crate) fn saw_store(&self, failed: bool) {
        let state = if failed { STORE_DOWN } else { STORE_UP };
        self.store_state.store(state, Ordering::Relaxed);
    }
}

impl Sidecar {
    /// A sidecar on `store`.
    pub fn new(store: BoxStore, config: SidecarConfig) -> Self {
        let stop = CancellationToken::new();
        let history =
            HistoryWriter::spawn(store.clone(), config.history_limit, HISTORY_WRITE_LIMIT);
        let group_holder = group_holder(&config.holder);
        let sidecar = Self(Arc::new(Shared {
            registry: Arc::new(Registry::new(history.clone(), stop.clone())),
            campaigns: Campaigns::new(store.clone(), group_holder, stop.clone()),
            presence: Arc::new(Presence::new(
                store.clone(),
                catalog_instance(&config.holder),
                stop.clone(),
            )),
            ticked: TickedTasks::new(catalog_instance(&config.holder), history.clone()),
            history,
            fleet: Fleet::new(store.clone()),
            store,
            holder: config.holder,
            seq: AtomicU64::new(0),
            on_store_down: config.on_store_down,
            max_wait: config.max_wait,
            metrics: config.metrics,
            allowed_hosts: config.allowed_hosts,
            store_state: AtomicU8::new(STORE_UNKNOWN),
            stop: stop.clone(),
        }));
        tokio::spawn(forget_given_up(Arc::downgrade(&sidecar.0), stop));
        sidecar
    }

    /// Releases every lease and run held for applications and steps down from every group,
    /// waiting at most `limit`. Later calls about them answer 410 (released).
    pub async fn shut_down(&self, limit: Duration) {
        self.0.stop.cancel();
        let registry = self.0.registry.shut_down(limit);
        let groups = self.0.campaigns.shut_down(limit);
        let catalog = self.0.presence.shut_down(limit);
        tokio::join!(registry, groups, catalog);
    }

    /// Leases and runs held for applications now.
    pub fn held(&self) -> u64 {
        self.0.registry.live()
    }

    /// How many names the sidecar keeps something for now: once the names that went through it
    /// are given up (released, idle past their expiry) and their ends forgotten, it is back
    /// to what it kept before them.
    pub fn kept(&self) -> Kept {
        let (leases, ended) = self.0.registry.kept();
        Kept {
            leases,
            ended,
            ticked: self.0.ticked.len(),
            registered: self.0.presence.len(),
            groups: self.0.campaigns.len(),
        }
    }

    /// Whether the store answered the last request that asked it; `None` before any did.
    pub(crate) fn store_reachable(&self) -> Option<bool> {
        match self.0.store_state.load(Ordering::Relaxed) {
            STORE_UP => Some(true),
            STORE_DOWN => Some(false),
            _ => None,
        }
    }
}

/// What [`Sidecar::kept`] counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Kept {
    /// Leases and runs held for applications.
    pub leases: usize,
    /// Ends of leases and runs remembered (for 2 minutes, at most 10,000), so a late call about
    /// one is told why it ended.
    pub ended: usize,
    /// Tasks ticked lately (until idle past their expiry).
    pub ticked: usize,
    /// Tasks registered in the store's catalog.
    pub registered: usize,
    /// Groups campaigned for on behalf of ticks.
    pub groups: usize,
}

/// How often the tasks and groups given up (idle past their expiry) and the ends of leases
/// are forgotten when no request comes that would.
const FORGET_EVERY: Duration = Duration::from_secs(1);

/// Forgets what the sidecar kept for tasks, groups and leases given up, every [`FORGET_EVERY`],
/// so a sidecar that one-off names went through comes back to its size before them.
async fn forget_given_up(shared: std::sync::Weak<Shared>, stop: CancellationToken) {
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(FORGET_EVERY) => {}
        }
        let Some(shared) = shared.upgrade() else {
            return;
        };
        shared.ticked.forget_idle();
        shared.campaigns.forget_stopped();
        shared.registry.forget_ended();
    }
}
