//! When this process saw each lease key at its current revision: the instant expiry is timed
//! from. Shared by a store's clones and its release watch, which sees every renewal as it is
//! committed, so a process that watches counts from each renewal rather than from its next read.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

/// Observations kept before the cache is cleared (clearing only makes expiry later: safe).
const MAX_OBSERVATIONS: usize = 100_000;

/// When this process first saw a lease key at a revision (or, for its own writes, got the
/// answer). A tenure is expired for this process once its ttl has passed since then on the
/// monotonic clock with the key unchanged: the holder's own deadline, measured from before it
/// sent that write, has passed by then too, whatever the wall clocks say.
#[derive(Debug, Clone, Copy)]
struct Observation {
    revision: u64,
    at: Instant,
    token: u64,
    ttl: Duration,
}

/// Per lease key, the latest revision this process saw and when it first saw it.
#[derive(Debug, Default)]
pub(crate) struct Observations(Mutex<HashMap<Vec<u8>, Observation>>);

impl Observations {
    fn lock(&self) -> MutexGuard<'_, HashMap<Vec<u8>, Observation>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn insert(&self, key: &[u8], revision: u64, token: u64, ttl: Duration) {
        let mut observed = self.lock();
        if observed.len() >= MAX_OBSERVATIONS {
            observed.clear();
        }
        let at = Instant::now();
        observed.insert(
            key.to_vec(),
            Observation {
                revision,
                at,
                token,
                ttl,
            },
        );
    }

    /// How long this process has seen `key` at `revision`, starting the count now if it had
    /// not seen that revision.
    pub(crate) fn seen(&self, key: &[u8], revision: u64, token: u64, ttl: Duration) -> Duration {
        match self.lock().get(key) {
            Some(o) if o.revision == revision => return o.at.elapsed(),
            // An answer older than what another task saw since: count from now (later expiry).
            Some(o) if o.revision > revision => return Duration::ZERO,
            _ => {}
        }
        self.insert(key, revision, token, ttl);
        Duration::ZERO
    }

    /// Records this process's own write of `key` at `revision`, timed from now (the answer).
    pub(crate) fn write(&self, key: &[u8], revision: u64, token: u64, ttl: Duration) {
        self.insert(key, revision, token, ttl);
    }

    /// Records a held record the watch delivered at `revision`, unless this process saw that
    /// revision or a later one already (an earlier sight counts from earlier).
    pub(crate) fn put(&self, key: &[u8], revision: u64, token: u64, ttl: Duration) {
        if self.lock().get(key).is_some_and(|o| o.revision >= revision) {
            return;
        }
        self.insert(key, revision, token, ttl);
    }

    /// Whether this process saw the tenure `token` of `key` last written a ttl or more ago.
    pub(crate) fn expired(&self, key: &[u8], token: u64) -> bool {
        self.lock()
            .get(key)
            .is_some_and(|o| o.token == token && o.at.elapsed() >= o.ttl)
    }

    pub(crate) fn forget(&self, key: &[u8]) {
        self.lock().remove(key);
    }
}
