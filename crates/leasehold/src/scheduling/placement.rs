//! Spreading a scheduler's tasks over the live instances: a membership kept in the store, and
//! rendezvous (highest-random-weight) hashing of each task over it.
//!
//! Placement only decides which instance *contends* for a task's ticks; the task lease and the
//! forward-only slot claim still gate every run, so two instances that both believe they own a
//! task while their views of the membership differ still run each slot at most once.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::store::error::StoreError;
use crate::store::name::{HolderId, LeaseName};
use crate::store::traits::Membership;

/// What this instance knows of the membership.
#[derive(Debug, Clone)]
pub(super) enum View {
    /// No answer yet, a store without membership, or no answer for a ttl: every instance
    /// contends for every task, as without placement.
    Everyone,
    /// The live members, sorted.
    Members {
        /// Changes whenever the member list does.
        generation: u64,
        members: Arc<[HolderId]>,
        /// The list before the last change, and when it changed: for one heartbeat interval
        /// after a change an instance also contends for the tasks it owned before, so a task
        /// whose new owner has not seen the change yet is not left unrun meanwhile.
        previous: Option<(Arc<[HolderId]>, Instant)>,
    },
}

/// A scheduler's membership in its spread group.
pub(crate) struct Placement {
    pub(super) group: LeaseName,
    holder: HolderId,
    /// Entries expire this long after their last heartbeat, on the store's clock.
    ttl: Duration,
    view: watch::Sender<View>,
    /// Whether a fallback to "everyone contends" was logged (once per cause).
    warned: AtomicBool,
}

impl Placement {
    pub(super) fn new(group: LeaseName, holder: HolderId, ttl: Duration) -> Self {
        Self {
            group,
            holder,
            ttl,
            view: watch::Sender::new(View::Everyone),
            warned: AtomicBool::new(false),
        }
    }

    /// The heartbeat period: a third of the ttl, so two heartbeats may fail before an entry
    /// expires.
    fn interval(&self) -> Duration {
        self.ttl / 3
    }

    pub(super) fn watch(&self) -> watch::Receiver<View> {
        self.view.subscribe()
    }

    /// The live members, `None` while every instance contends for every task.
    pub(super) fn members(&self) -> Option<Vec<HolderId>> {
        match &*self.view.borrow() {
            View::Everyone => None,
            View::Members { members, .. } => Some(members.to_vec()),
        }
    }

    /// Whether this instance contends for `task`'s ticks: `Some(generation)` when it owns the
    /// task in the current view (or owned it in the previous one, within an interval of the
    /// change), `Some(0)` while everyone contends, `None` when another member owns it.
    pub(crate) fn owns(&self, task: &LeaseName) -> Option<u64> {
        match &*self.view.borrow() {
            View::Everyone => Some(0),
            View::Members {
                generation,
                members,
                previous,
            } => {
                let mine = |members: &[HolderId]| owner(members, task) == Some(&self.holder);
                let handing_over = previous.as_ref().is_some_and(|(before, changed)| {
                    changed.elapsed() < self.interval() && mine(before)
                });
                (mine(members) || handing_over).then_some(*generation)
            }
        }
    }

    /// Whether `task` is this instance's in the current view (`None` while everyone contends).
    pub(super) fn owned(&self, task: &LeaseName) -> Option<bool> {
        match &*self.view.borrow() {
            View::Everyone => None,
            View::Members { members, .. } => Some(owner(members, task) == Some(&self.holder)),
        }
    }

    fn fall_back(&self, why: &str) {
        self.view.send_if_modified(|view| {
            let was_members = matches!(view, View::Members { .. });
            *view = View::Everyone;
            was_members
        });
        if !self.warned.swap(true, Ordering::Relaxed) {
            tracing::warn!(group = %self.group, why, "task placement off: every instance contends for every task's ticks");
        }
    }

    fn adopt(&self, members: Vec<HolderId>) {
        let members: Arc<[HolderId]> = members.into();
        let changed = self.view.send_if_modified(|view| {
            let (generation, previous) = match view {
                View::Members {
                    members: current,
                    generation,
                    ..
                } if *current == members => return false,
                View::Members {
                    members: current,
                    generation,
                    ..
                } => (*generation + 1, Some((current.clone(), Instant::now()))),
                View::Everyone => (1, None),
            };
            *view = View::Members {
                generation,
                members: members.clone(),
                previous,
            };
            true
        });
        if changed {
            tracing::info!(group = %self.group, members = members.len(), "task placement: membership changed");
        }
        if self.warned.swap(false, Ordering::Relaxed) {
            tracing::info!(group = %self.group, "task placement on again");
        }
    }

    /// Refreshes this instance's entry every interval and keeps the view, until `stop`; then
    /// leaves the group so the others take its tasks over at once.
    pub(super) async fn heartbeat<S: Membership>(
        self: Arc<Self>,
        store: S,
        stop: CancellationToken,
    ) {
        let interval = self.interval();
        let mut last_answer = Instant::now();
        loop {
            let sent = Instant::now();
            let answer =
                tokio::time::timeout(interval, store.members(&self.group, &self.holder, self.ttl))
                    .await
                    .unwrap_or(Err(StoreError::Timeout(interval)));
            match answer {
                Ok(members) if members.contains(&self.holder) => {
                    last_answer = sent;
                    self.adopt(members);
                }
                Ok(_) => self.fall_back("the store's member list does not include this instance"),
                Err(StoreError::Unsupported(_)) => {
                    self.fall_back("the store keeps no membership");
                    return;
                }
                // Our entry may have expired by now, and the others taken our tasks over.
                Err(e) if sent.duration_since(last_answer) >= self.ttl => {
                    self.fall_back(&format!("no membership answer for a ttl: {e}"));
                }
                Err(e) => {
                    tracing::debug!(group = %self.group, error = %e, "membership heartbeat failed")
                }
            }
            tokio::select! {
                () = stop.cancelled() => break,
                () = tokio::time::sleep_until(sent + interval) => {}
            }
        }
        match tokio::time::timeout(interval, store.leave(&self.group, &self.holder)).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                tracing::debug!(group = %self.group, error = %e, "leaving the group failed; the entry expires instead")
            }
            Err(_) => {
                tracing::debug!(group = %self.group, "leaving the group timed out; the entry expires instead")
            }
        }
    }
}

/// The member with the highest weight for `task`, ties to the lower id.
fn owner<'a>(members: &'a [HolderId], task: &LeaseName) -> Option<&'a HolderId> {
    members.iter().max_by(|a, b| {
        weight(a, task)
            .cmp(&weight(b, task))
            .then_with(|| b.as_str().cmp(a.as_str()))
    })
}

/// A stable hash of (member, task): every instance (and every version) must compute the same
/// weights.
fn weight(member: &HolderId, task: &LeaseName) -> u64 {
    crate::scheduling::policy::stable_hash(
        member
            .as_str()
            .bytes()
            .chain([0xff])
            .chain(task.as_str().bytes()),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(n: usize) -> Vec<HolderId> {
        (0..n)
            .map(|i| HolderId::new(format!("host:{}:{i:032x}", 1000 + i)).unwrap())
            .collect()
    }

    fn tasks(n: usize) -> Vec<LeaseName> {
        (0..n)
            .map(|i| LeaseName::new(format!("task-{i}")).unwrap())
            .collect()
    }

    #[test]
    fn weights_are_stable_across_processes() {
        // Computed independently (Python); a change here would move tasks between instances
        // running different versions.
        let (m, t) = (HolderId::new("a").unwrap(), LeaseName::new("t").unwrap());
        assert_eq!(weight(&m, &t), 0xacda_4c47_9cbe_b101);
    }

    #[test]
    fn hundred_tasks_spread_over_ten_members() {
        let (members, tasks) = (ids(10), tasks(100));
        let mut per = vec![0usize; members.len()];
        for t in &tasks {
            let o = owner(&members, t).unwrap();
            per[members.iter().position(|m| m == o).unwrap()] += 1;
        }
        let max = *per.iter().max().unwrap();
        assert!(max <= 20, "max {max} over mean 10: {per:?}");
        assert!(per.iter().all(|&n| n > 0), "{per:?}");
    }

    #[test]
    fn removing_a_member_moves_only_its_tasks() {
        let (members, tasks) = (ids(10), tasks(100));
        let gone = members[3].clone();
        let rest: Vec<HolderId> = members.iter().filter(|m| **m != gone).cloned().collect();
        for t in &tasks {
            let before = owner(&members, t).unwrap();
            let after = owner(&rest, t).unwrap();
            if *before != gone {
                assert_eq!(before, after, "{t} moved though its owner stayed");
            }
        }
        assert_eq!(owner(&[], &tasks[0]), None);
    }
}
