//! The in-process store: leases shared by the tasks of one process.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::time::Instant;

use crate::store::answers::{
    Acquisition, LeaseState, Release, Renewal, SlotClaim, TickAnswer, TickRequest,
};
use crate::store::catalog::{
    ControlRead, Forgetting, InstanceRecord, LeaseRecord, Registration, TaskRecord, Versioned,
};
use crate::store::compose::compose_tick;
use crate::store::error::StoreResult;
use crate::store::name::{HolderId, LeaseName};
use crate::store::notify::{ReleaseHub, ReleaseSubscription};
use crate::store::token::FencingToken;
use crate::store::traits::{Catalog, Membership, Purge, Slots, Store};

/// Leases kept in this process's memory: for single-process services, tests and examples.
///
/// Its clock is tokio's, so tests on a paused clock (`start_paused = true`) control expiry
/// exactly. It cannot coordinate separate processes; use the SQLite store for that on one host,
/// or Redis/PostgreSQL across hosts.
#[derive(Clone, Default)]
pub struct MemoryStore {
    inner: Arc<Inner>,
}

#[derive(Default)]
struct Inner {
    state: Mutex<State>,
    releases: ReleaseHub,
}

struct State {
    leases: HashMap<LeaseName, Entry>,
    slots: HashMap<LeaseName, u64>,
    history: HashMap<LeaseName, std::collections::BTreeMap<u64, String>>,
    /// Per group: each member's expiry.
    members: HashMap<LeaseName, HashMap<HolderId, Instant>>,
    catalog: HashMap<LeaseName, CatalogEntry>,
    /// Wall-clock time at `origin`, so `now_millis` advances with tokio's (maybe paused) clock.
    origin: Instant,
    origin_millis: u64,
}

impl Default for State {
    fn default() -> Self {
        Self {
            leases: HashMap::new(),
            slots: HashMap::new(),
            history: HashMap::new(),
            members: HashMap::new(),
            catalog: HashMap::new(),
            origin: Instant::now(),
            origin_millis: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64),
        }
    }
}

impl State {
    fn now_millis(&self, now: Instant) -> u64 {
        self.origin_millis + now.duration_since(self.origin).as_millis() as u64
    }
}

#[derive(Default)]
struct CatalogEntry {
    definition: Option<String>,
    /// Per instance: what it said about itself, and its heartbeat's expiry.
    instances: HashMap<HolderId, (String, Instant)>,
    control: Option<Versioned>,
}

impl CatalogEntry {
    fn forget(&mut self, now: Instant, forget_after: Duration) {
        self.instances
            .retain(|_, (_, expires)| *expires + forget_after > now);
    }
}

struct Entry {
    holder: Option<HolderId>,
    token: FencingToken,
    expires_at: Instant,
}

impl Entry {
    fn state(&self, now: Instant) -> LeaseState {
        let holder = self.live_holder(now).cloned();
        LeaseState {
            remaining: match holder {
                Some(_) => self.expires_at - now,
                None => Duration::ZERO,
            },
            holder,
            token: self.token,
        }
    }

    fn live_holder(&self, now: Instant) -> Option<&HolderId> {
        self.holder.as_ref().filter(|_| self.expires_at > now)
    }
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock cannot leave a half-written entry (every update is a
        // single assignment), so a poisoned lock is still consistent.
        self.inner
            .state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl std::fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("MemoryStore")
    }
}

impl Store for MemoryStore {
    fn acquire(
        &self,
        name: &LeaseName,
        holder: &HolderId,
        ttl: Duration,
    ) -> impl Future<Output = StoreResult<Acquisition>> + Send {
        let now = Instant::now();
        let mut state = self.state();
        // A new name's counter starts from the clock (ms × 1000), as in every store.
        let seed = FencingToken(state.now_millis(now).saturating_mul(1000));
        let entry = state.leases.entry(name.clone()).or_insert(Entry {
            holder: None,
            token: seed,
            expires_at: now,
        });
        let answer = match entry.live_holder(now) {
            Some(current) if current != holder => Acquisition::Busy {
                holder: current.clone(),
                remaining: entry.expires_at - now,
            },
            // Free, expired, or ours: a new tenure either way.
            _ => {
                entry.token = FencingToken(entry.token.0 + 1);
                entry.holder = Some(holder.clone());
                entry.expires_at = now + ttl;
                Acquisition::Acquired { token: entry.token }
            }
        };
        std::future::ready(Ok(answer))
    }

    fn renew(
        &self,
        name: &LeaseName,
        holder: &HolderId,
        token: FencingToken,
        ttl: Duration,
    ) -> impl Future<Output = StoreResult<Renewal>> + Send {
        let now = Instant::now();
        let mut state = self.state();
        let answer = match state.leases.get_mut(name) {
            Some(e) if e.token == token && e.live_holder(now) == Some(holder) => {
                e.expires_at = now + ttl;
                Renewal::Renewed
            }
            _ => Renewal::Lost,
        };
        std::future::ready(Ok(answer))
    }

    fn release(
        &self,
        name: &LeaseName,
        holder: &HolderId,
        token: FencingToken,
    ) -> impl Future<Output = StoreResult<Release>> + Send {
        let now = Instant::now();
        let mut state = self.state();
        let answer = match state.leases.get_mut(name) {
            Some(e) if e.token == token && e.live_holder(now) == Some(holder) => {
                e.holder = None;
                e.expires_at = now;
                Release::Released
            }
            _ => Release::NotHeld,
        };
        drop(state);
        if answer == Release::Released {
            self.inner.releases.publish(name.as_str());
        }
        std::future::ready(Ok(answer))
    }

    fn inspect(
        &self,
        name: &LeaseName,
    ) -> impl Future<Output = StoreResult<Option<LeaseState>>> + Send {
        let now = Instant::now();
        let state = self.state();
        let answer = state.leases.get(name).map(|e| e.state(now));
        std::future::ready(Ok(answer))
    }

    fn now_millis(&self) -> impl Future<Output = StoreResult<u64>> + Send {
        std::future::ready(Ok(self.state().now_millis(Instant::now())))
    }

    fn subscribe_releases(&self) -> Option<ReleaseSubscription> {
        Some(self.inner.releases.subscribe())
    }

    fn describe(&self) -> String {
        "memory".to_owned()
    }
}

declare_capabilities!(MemoryStore: SLOTS | PURGE | MEMBERSHIP | CATALOG | TICK);

impl Slots for MemoryStore {
    /// The clock and the control record as the gate reads them, then the calls of the default.
    async fn tick(&self, request: &TickRequest<'_>) -> StoreResult<TickAnswer> {
        let read = self.control(request.task).await?;
        compose_tick(self, request, Some(read)).await
    }

    fn claim_slot(
        &self,
        task: &LeaseName,
        slot: u64,
    ) -> impl Future<Output = StoreResult<SlotClaim>> + Send {
        let mut state = self.state();
        let answer = match state.slots.get(task) {
            Some(&last) if last >= slot => SlotClaim::AlreadyRun { last },
            _ => {
                state.slots.insert(task.clone(), slot);
                SlotClaim::Claimed
            }
        };
        std::future::ready(Ok(answer))
    }

    fn last_slot(&self, task: &LeaseName) -> impl Future<Output = StoreResult<Option<u64>>> + Send {
        std::future::ready(Ok(self.state().slots.get(task).copied()))
    }

    fn record_history(
        &self,
        task: &LeaseName,
        key: u64,
        entry: &str,
        keep: usize,
    ) -> impl Future<Output = StoreResult<()>> + Send {
        let mut state = self.state();
        let entries = state.history.entry(task.clone()).or_default();
        entries.insert(key, entry.to_owned());
        while entries.len() > keep.max(1) {
            entries.pop_first();
        }
        std::future::ready(Ok(()))
    }

    fn history(
        &self,
        task: &LeaseName,
        limit: usize,
    ) -> impl Future<Output = StoreResult<Vec<String>>> + Send {
        let state = self.state();
        let entries = state.history.get(task).map_or_else(Vec::new, |h| {
            h.values().rev().take(limit).cloned().collect()
        });
        std::future::ready(Ok(entries))
    }
}

impl Purge for MemoryStore {
    fn purge(&self, retention: Duration) -> impl Future<Output = StoreResult<u64>> + Send {
        let now = Instant::now();
        let mut state = self.state();
        let before = state.leases.len();
        state
            .leases
            .retain(|_, e| e.live_holder(now).is_some() || e.expires_at + retention > now);
        std::future::ready(Ok((before - state.leases.len()) as u64))
    }
}

impl Membership for MemoryStore {
    fn members(
        &self,
        group: &LeaseName,
        member: &HolderId,
        ttl: Duration,
    ) -> impl Future<Output = StoreResult<Vec<HolderId>>> + Send {
        let now = Instant::now();
        let mut state = self.state();
        let entries = state.members.entry(group.clone()).or_default();
        entries.insert(member.clone(), now + ttl);
        entries.retain(|_, expires| *expires > now);
        let mut live: Vec<HolderId> = entries.keys().cloned().collect();
        live.sort();
        std::future::ready(Ok(live))
    }

    fn leave(
        &self,
        group: &LeaseName,
        member: &HolderId,
    ) -> impl Future<Output = StoreResult<()>> + Send {
        if let Some(entries) = self.state().members.get_mut(group) {
            entries.remove(member);
        }
        std::future::ready(Ok(()))
    }
}

impl Catalog for MemoryStore {
    fn register(
        &self,
        r: &Registration<'_>,
    ) -> impl Future<Output = StoreResult<Option<Versioned>>> + Send {
        let now = Instant::now();
        let mut state = self.state();
        let entry = state.catalog.entry(r.task.clone()).or_default();
        entry.definition = Some(r.definition.to_owned());
        entry
            .instances
            .insert(r.instance.clone(), (r.about.to_owned(), now + r.ttl));
        entry.forget(now, r.forget_after);
        std::future::ready(Ok(entry.control.clone()))
    }

    fn unregister(
        &self,
        task: &LeaseName,
        instance: &HolderId,
    ) -> impl Future<Output = StoreResult<()>> + Send {
        if let Some(entry) = self.state().catalog.get_mut(task) {
            entry.instances.remove(instance);
        }
        std::future::ready(Ok(()))
    }

    fn tasks(
        &self,
        forget_after: Duration,
    ) -> impl Future<Output = StoreResult<Vec<TaskRecord>>> + Send {
        let now = Instant::now();
        let mut state = self.state();
        state.catalog.retain(|_, entry| {
            entry.forget(now, forget_after);
            entry.control.is_some() || !entry.instances.is_empty()
        });
        let mut tasks: Vec<TaskRecord> = state
            .catalog
            .iter()
            .map(|(task, entry)| {
                let mut instances: Vec<InstanceRecord> = entry
                    .instances
                    .iter()
                    .map(|(instance, (about, expires))| InstanceRecord {
                        instance: instance.clone(),
                        about: about.clone(),
                        remaining: expires.saturating_duration_since(now),
                    })
                    .collect();
                instances.sort_by(|a, b| {
                    (a.remaining.is_zero(), &a.instance).cmp(&(b.remaining.is_zero(), &b.instance))
                });
                TaskRecord {
                    task: task.clone(),
                    definition: entry.definition.clone(),
                    instances,
                    control: entry.control.clone(),
                }
            })
            .collect();
        tasks.sort_by(|a, b| a.task.cmp(&b.task));
        std::future::ready(Ok(tasks))
    }

    fn control(&self, task: &LeaseName) -> impl Future<Output = StoreResult<ControlRead>> + Send {
        let state = self.state();
        std::future::ready(Ok(ControlRead {
            now_ms: state.now_millis(Instant::now()),
            control: state.catalog.get(task).and_then(|e| e.control.clone()),
        }))
    }

    fn set_control(
        &self,
        task: &LeaseName,
        expected: Option<u64>,
        value: &str,
    ) -> impl Future<Output = StoreResult<Option<u64>>> + Send {
        let mut state = self.state();
        let entry = state.catalog.entry(task.clone()).or_default();
        let current = entry.control.as_ref().map(|c| c.version);
        let answer = (current == expected).then(|| {
            let version = current.unwrap_or(0) + 1;
            entry.control = Some(Versioned {
                version,
                value: value.to_owned(),
            });
            version
        });
        std::future::ready(Ok(answer))
    }

    /// Under the state's lock: nothing registers in between.
    fn forget(
        &self,
        task: &LeaseName,
        history: bool,
    ) -> impl Future<Output = StoreResult<Forgetting>> + Send {
        let now = Instant::now();
        let mut state = self.state();
        let live = state.catalog.get(task).map_or(0, |entry| {
            entry
                .instances
                .values()
                .filter(|(_, expires)| *expires > now)
                .count()
        });
        let answer = if live > 0 {
            Forgetting::Live {
                instances: live as u64,
            }
        } else {
            if history {
                state.history.remove(task);
            }
            match state.catalog.remove(task) {
                Some(_) => Forgetting::Forgotten,
                None => Forgetting::Unknown,
            }
        };
        std::future::ready(Ok(answer))
    }

    fn leases(&self, limit: usize) -> impl Future<Output = StoreResult<Vec<LeaseRecord>>> + Send {
        let now = Instant::now();
        let state = self.state();
        let mut leases: Vec<LeaseRecord> = state
            .leases
            .iter()
            .map(|(name, e)| LeaseRecord {
                name: name.clone(),
                state: e.state(now),
            })
            .collect();
        leases.sort_by(|a, b| a.name.cmp(&b.name));
        leases.truncate(limit);
        std::future::ready(Ok(leases))
    }
}

#[cfg(test)]
mod conformance {
    use super::MemoryStore;

    crate::conformance_tests!(async { MemoryStore::new() });

    /// Every wrapper at once around the memory store: each forwards every operation, and says
    /// what the store inside answers.
    mod wrapped {
        use std::time::Duration;

        use crate::store::boxed::BoxStore;
        use crate::store::faults::FaultyStore;
        use crate::store::memory::MemoryStore;
        use crate::store::metered::Metered;
        use crate::store::timeout::Timeout;

        crate::conformance_tests!(async {
            let faulty = FaultyStore::wrap(MemoryStore::new());
            BoxStore::new(Timeout::new(Metered::new(faulty), Duration::from_secs(5)))
        });
    }
}
