//! Leadership of groups campaigned for on behalf of callers that tick in them.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::lease::config::{ConfigError, LeaseConfig};
use crate::lease::guard::Lease;
use crate::lease::leader::{Leader, LeaderHandle, LeaderState};
use crate::scheduling::presence::idle_expiry;
use crate::store::name::{HolderId, LeaseName};
use crate::store::traits::Store;

/// How long a new campaign may take to settle before a tick answers not-leader.
const FIRST_ELECTION: Duration = Duration::from_secs(1);

/// Leadership of groups held on behalf of callers that tick in them (the sidecar's
/// applications): a group is campaigned for from the first tick that names it and kept while
/// ticks in it keep arriving, for twice the longest interval between slots seen plus the lease's
/// ttl. A caller that stops ticking (hung, or shut down) so lets the group pass to an instance
/// whose caller is alive.
pub struct Campaigns<S> {
    store: S,
    holder: HolderId,
    stop: CancellationToken,
    groups: Mutex<HashMap<LeaseName, Arc<Campaign>>>,
}

/// One group's campaign, kept by [`Campaigns`].
pub struct Campaign {
    leader: LeaderHandle,
    group: LeaseName,
    started: Instant,
    settle: Duration,
    /// The last tick and the idle time after which the campaign stops.
    activity: Mutex<(Instant, Duration)>,
    stop: CancellationToken,
}

impl Campaign {
    /// Whether this instance leads the group now (a campaign that just started is given up to a
    /// second, or its ttl, to settle), with the leadership's expiring signal.
    pub(crate) async fn leads(&self) -> Option<CancellationToken> {
        let mut states = self.leader.watch();
        let settle = self.started + self.settle;
        loop {
            let state = states.borrow_and_update().clone();
            match state {
                LeaderState::Campaigning if Instant::now() < settle => {}
                state => return state.term_signal(),
            }
            if tokio::time::timeout_at(settle, states.changed())
                .await
                .is_err()
            {
                return states.borrow().term_signal();
            }
        }
    }

    async fn expire_when_idle(self: Arc<Self>) {
        loop {
            let (last, idle) = *lock(&self.activity);
            tokio::select! {
                () = self.stop.cancelled() => return,
                () = tokio::time::sleep_until(last + idle) => {}
            }
            let (last, idle) = *lock(&self.activity);
            if last + idle <= Instant::now() {
                tracing::info!(group = %self.group, "no ticks in the group lately; stepping down");
                self.stop.cancel();
                return;
            }
        }
    }
}

impl<S: Store> Campaigns<S> {
    /// Campaigns on `store` as `holder`, all ending when `stop` fires.
    pub fn new(store: S, holder: HolderId, stop: CancellationToken) -> Self {
        Self {
            store,
            holder,
            stop,
            groups: Mutex::default(),
        }
    }

    /// The campaign for `group`, started (with lease timing `config`) if none is going, and
    /// kept going for `interval` (the caller's interval between slots) more.
    pub fn campaign(
        &self,
        group: &LeaseName,
        config: LeaseConfig,
        interval: Duration,
    ) -> Result<Arc<Campaign>, ConfigError> {
        let idle = idle_expiry(interval, config.ttl);
        let mut groups = lock(&self.groups);
        if let Some(g) = groups.get(group)
            && !g.stop.is_cancelled()
        {
            let mut activity = lock(&g.activity);
            *activity = (Instant::now(), activity.1.max(idle));
            return Ok(g.clone());
        }
        let stop = self.stop.child_token();
        let lease = Lease::held_as(
            self.store.clone(),
            group.clone(),
            config,
            self.holder.clone(),
        )?;
        let shutdown = stop.clone().cancelled_owned();
        let campaign = Arc::new(Campaign {
            leader: Leader::new(lease).start(shutdown),
            group: group.clone(),
            started: Instant::now(),
            settle: FIRST_ELECTION.min(config.ttl),
            activity: Mutex::new((Instant::now(), idle)),
            stop,
        });
        groups.insert(group.clone(), campaign.clone());
        tokio::spawn(campaign.clone().expire_when_idle());
        Ok(campaign)
    }

    /// Forgets the groups given up (no tick in them for their idle time): their campaigns have
    /// stopped, and what they held (the leader's series among it) goes with them.
    pub fn forget_stopped(&self) {
        let mut groups = lock(&self.groups);
        groups.retain(|_, g| !g.stop.is_cancelled());
        if groups.capacity() > 2 * groups.len() + 64 {
            groups.shrink_to_fit();
        }
    }

    /// How many groups are kept (campaigning, leading, or given up and not yet forgotten).
    pub fn len(&self) -> usize {
        lock(&self.groups).len()
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Steps down from every group (releasing its lease), waiting at most `limit`.
    pub async fn shut_down(&self, limit: Duration) {
        let groups: Vec<_> = lock(&self.groups).drain().map(|(_, g)| g).collect();
        for g in &groups {
            g.stop.cancel();
        }
        let stopped = async {
            for g in &groups {
                let mut states = g.leader.watch();
                let _ = states
                    .wait_for(|s| matches!(s, LeaderState::Stopped | LeaderState::Failed { .. }))
                    .await;
            }
        };
        let _ = tokio::time::timeout(limit, stopped).await;
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}
