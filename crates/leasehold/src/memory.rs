//! The in-process store: leases shared by the tasks of one process.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::time::Instant;

use crate::notify::{ReleaseHub, ReleaseSubscription};
use crate::store_api::{
    Acquisition, Capabilities, LeaseState, Membership, Purge, Release, Renewal, SlotClaim, Slots,
    Store, StoreResult,
};
use crate::{FencingToken, HolderId, LeaseName};

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

struct Entry {
    holder: Option<HolderId>,
    token: FencingToken,
    expires_at: Instant,
}

impl Entry {
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
        let answer = state.leases.get(name).map(|e| {
            let holder = e.live_holder(now).cloned();
            LeaseState {
                remaining: if holder.is_some() {
                    e.expires_at - now
                } else {
                    Duration::ZERO
                },
                holder,
                token: e.token,
            }
        });
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

    fn capabilities(&self) -> Capabilities {
        Capabilities::ALL
    }
}

impl Slots for MemoryStore {
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

#[cfg(test)]
mod conformance {
    use super::MemoryStore;

    crate::conformance_tests!(async { MemoryStore::new() });
}
