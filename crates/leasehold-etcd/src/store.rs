//! [`EtcdStore`]: the [`Store`] implementation.

use std::collections::BTreeMap;
use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use leasehold::catalog::{
    ControlRead, Forgetting, InstanceRecord, LeaseRecord, Registration, TaskRecord, Versioned,
};
use leasehold::skew;
use leasehold::store::Operation as Op;
use leasehold::{
    Catalog, FencingToken, HolderId, LeaseName, LeaseState, Membership, Purge, Release, Slots,
    Store, StoreError,
    store::{
        Acquisition, ReleaseFeed, ReleaseSubscription, Renewal, SlotClaim, StoreResult, within,
    },
};
use serde_json::json;

use crate::config::EtcdConfig;
use crate::error::{Error, RequestError, Result};
use crate::gateway::{Gateway, b64, unb64};
use crate::observed::Observations;
use crate::record::Record;
use crate::watch;
use crate::wire::{
    KeyValue, RangeResponse, TxnResponse, absent, delete, delete_range, get, get_prefixed,
    modified_at, nested, prefix_end, put, txn, value_is, version_is,
};

/// The keys' schema version (`PREFIX meta/schema_version`): 1 was release 0.1.0's keys, 2 added
/// the catalog's and the meta keys.
pub(crate) const KEYS_VERSION: i64 = 2;

/// How often an acquire re-reads a record that changed under it before giving up.
const MAX_ACQUIRE_ATTEMPTS: usize = 16;
/// Nested transactions per transaction in `renew_many` and `purge`: etcd's default
/// `--max-txn-ops` (128) bounds each level, and a nested one's budget is what its parent left.
const TXN_BATCH: usize = 100;

/// Leases in etcd v3: compare-and-set transactions on one key per lease, fencing tokens kept in
/// the key's value, expiry measured by each client's monotonic clock from when it saw the key's
/// current revision, and releases announced by a watch. See the crate documentation for the
/// design and what it assumes.
///
/// Cheap to clone: clones share the connections, the release watch and the expiry
/// observations.
#[derive(Clone)]
pub struct EtcdStore {
    inner: Arc<Inner>,
}

struct Inner {
    gateway: Arc<Gateway>,
    prefix: String,
    op_timeout: Duration,
    described: String,
    /// The release watch, when notifications are on.
    releases: Option<ReleaseFeed>,
    /// Per lease key: the revision this process last saw and when it first saw it.
    observed: Arc<Observations>,
    /// Whether this release may write to the keys, once a member has said (see
    /// [`Inner::check_release`]).
    release: tokio::sync::OnceCell<std::result::Result<(), skew::TooOld>>,
}

impl fmt::Debug for EtcdStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("EtcdStore")
            .field(&self.inner.described)
            .finish()
    }
}

fn wall_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

fn slot_text(slot: u64) -> Vec<u8> {
    format!("{slot:020}").into_bytes()
}

fn parse_slot(value: &str) -> StoreResult<u64> {
    let bytes = unb64(value).map_err(|e| StoreError::Corrupt(e.to_string()))?;
    std::str::from_utf8(&bytes)
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| StoreError::Corrupt("slot value is not a number".into()))
}

impl EtcdStore {
    pub(crate) async fn connect(config: EtcdConfig) -> Result<Self> {
        let op_timeout = config.op_timeout;
        let inner = Inner::new(&config)?;
        // One read under the prefix: reachability, credentials and read permission at once.
        // Before the release watch starts, so a refusal is reported once, here.
        let probe =
            json!({ "key": b64(inner.lease_key_prefix()), "limit": "1", "keys_only": true });
        let answer = tokio::time::timeout(
            op_timeout,
            inner.gateway.call::<RangeResponse>("/v3/kv/range", &probe),
        )
        .await;
        let failed = |source| Error::Connect {
            store: inner.described.clone(),
            source,
        };
        match answer {
            Err(_) => return Err(failed(StoreError::Timeout(op_timeout))),
            Ok(Err(e)) => return Err(failed(e.into_store_error("connect"))),
            Ok(Ok(_)) => {}
        }
        match tokio::time::timeout(op_timeout, inner.check_release()).await {
            Err(_) => return Err(failed(StoreError::Timeout(op_timeout))),
            Ok(Err(e)) => return Err(failed(e)),
            Ok(Ok(Err(source))) => {
                return Err(Error::TooOld {
                    store: inner.described.clone(),
                    source,
                });
            }
            Ok(Ok(Ok(()))) => {}
        }
        let store = Self::watching(inner, &config);
        if let Some(releases) = &store.inner.releases {
            // Usually established at once; if not, it keeps trying in the background.
            releases.first_attempt(op_timeout).await;
        }
        Ok(store)
    }

    /// The store without a first round trip: connections are opened by the first operation
    /// (each fails with [`StoreError::Unavailable`] while no member answers) and the release
    /// watch is established in the background. Must be called within a tokio runtime.
    pub(crate) fn open(config: EtcdConfig) -> Result<Self> {
        let inner = Inner::new(&config)?;
        // So the first operation finds a token, or the refusal, already.
        inner.gateway.authenticate_soon();
        Ok(Self::watching(inner, &config))
    }

    /// The store, with its release watch started if notifications are on.
    fn watching(mut inner: Inner, config: &EtcdConfig) -> Self {
        if config.notifications {
            inner.releases = Some(watch::feed(
                inner.gateway.clone(),
                inner.lease_key_prefix(),
                inner.observed.clone(),
                config.max_reconnect_delay,
                inner.described.clone(),
            ));
        }
        Self {
            inner: Arc::new(inner),
        }
    }

    /// The key of a lease: `PREFIX` `lease/` `NAME`.
    pub fn lease_key(&self, name: &LeaseName) -> Vec<u8> {
        self.inner.lease_key(name)
    }

    /// The key of a task's last claimed slot: `PREFIX` `slot/` `TASK` (20 decimal digits).
    pub fn slot_key(&self, task: &LeaseName) -> Vec<u8> {
        format!("{}slot/{task}", self.inner.prefix).into_bytes()
    }

    /// The prefix of a task's history keys: `PREFIX` `hist/` `TASK` `\0`, followed by the
    /// entry's key as 20 decimal digits.
    pub fn history_prefix(&self, task: &LeaseName) -> Vec<u8> {
        format!("{}hist/{task}\0", self.inner.prefix).into_bytes()
    }

    /// Runs one attempt of an operation within the op timeout.
    async fn run<T>(&self, work: impl Future<Output = StoreResult<T>>) -> StoreResult<T> {
        within(self.inner.op_timeout, work).await
    }

    /// Runs an operation that may be repeated without changing its outcome (a renewal, a read)
    /// in attempts of a third of the op timeout, until one answers or the op timeout is spent.
    /// A write sent while the cluster elects a leader is not answered until etcd's own request
    /// timeout (seconds); a fresh attempt goes through as soon as the new leader is in. (Its own
    /// loop, not [`within`]: it answers the last attempt's error when the time is spent.)
    async fn run_repeatable<T, F, Fut>(&self, work: F) -> StoreResult<T>
    where
        F: Fn() -> Fut,
        Fut: Future<Output = StoreResult<T>>,
    {
        let op_timeout = self.inner.op_timeout;
        let deadline = Instant::now() + op_timeout;
        let attempt = (op_timeout / 3).max(Duration::from_millis(250));
        let mut last = StoreError::Timeout(op_timeout);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(last);
            }
            match tokio::time::timeout(attempt.min(left), work()).await {
                Ok(Ok(answer)) => return Ok(answer),
                Ok(Err(e)) if !e.is_transient() => return Err(e),
                Ok(Err(e)) => {
                    last = e;
                    let pause = Duration::from_millis(50).min(left);
                    tokio::time::sleep(pause).await;
                }
                Err(_) => last = StoreError::Timeout(op_timeout),
            }
        }
    }

    async fn txn(&self, op: Op<'_>, request: serde_json::Value) -> StoreResult<TxnResponse> {
        self.inner.may_write(op).await?;
        self.inner
            .gateway
            .call("/v3/kv/txn", &request)
            .await
            .map_err(|e: RequestError| e.into_store_error(op))
    }

    async fn range(&self, op: Op<'_>, request: serde_json::Value) -> StoreResult<RangeResponse> {
        self.inner.may_write(op).await?;
        self.inner
            .gateway
            .call("/v3/kv/range", &request)
            .await
            .map_err(|e: RequestError| e.into_store_error(op))
    }

    async fn acquire_once(
        &self,
        op: Op<'_>,
        name: &LeaseName,
        holder: &HolderId,
        ttl: Duration,
    ) -> StoreResult<Acquisition> {
        let key = self.lease_key(name);
        // None: not read yet or absent; the create path is tried first.
        let mut current: Option<KeyValue> = None;
        for _ in 0..MAX_ACQUIRE_ATTEMPTS {
            let (token, compare) = match &current {
                None => {
                    // A name never seen: its first token comes from the clock.
                    (wall_ms().saturating_mul(1000) + 1, absent(&key))
                }
                Some(kv) => {
                    let record = decode_kv(kv)?;
                    if let Record::Held {
                        holder: other, ttl, ..
                    } = &record
                        && other != holder.as_str()
                        && let Some(remaining) =
                            self.inner
                                .remaining(&key, kv.mod_revision, record.token(), *ttl)
                    {
                        let holder = HolderId::new(other)
                            .map_err(|e| StoreError::Corrupt(format!("holder of {name}: {e}")))?;
                        return Ok(Acquisition::Busy { holder, remaining });
                    }
                    let next = record.token().checked_add(1).ok_or_else(|| {
                        StoreError::Corrupt(format!("token of {name} is at its maximum"))
                    })?;
                    (next, modified_at(&key, kv.mod_revision))
                }
            };
            let answer = self
                .txn(
                    op,
                    txn(
                        vec![compare],
                        vec![put(&key, &Record::held(token, holder.as_str(), ttl))],
                        vec![get(&key)],
                    ),
                )
                .await?;
            if answer.succeeded {
                self.inner
                    .observed
                    .write(&key, answer.header.revision, token, ttl);
                return Ok(Acquisition::Acquired {
                    token: FencingToken(token),
                });
            }
            current = answer.range(0).and_then(|r| r.kvs.first()).cloned();
        }
        Err(StoreError::Unavailable {
            message: format!(
                "{op}: the lease record kept changing under {MAX_ACQUIRE_ATTEMPTS} attempts"
            ),
            source: None,
        })
    }

    async fn renew_once(
        &self,
        op: Op<'_>,
        name: &LeaseName,
        holder: &HolderId,
        token: FencingToken,
        ttl: Duration,
    ) -> StoreResult<Renewal> {
        let key = self.lease_key(name);
        if self.inner.observed.expired(&key, token.get()) {
            return Ok(Renewal::Lost);
        }
        let answer = self
            .txn(
                op,
                txn(
                    in_tenure(&key, token, holder),
                    vec![put(&key, &Record::held(token.get(), holder.as_str(), ttl))],
                    vec![],
                ),
            )
            .await?;
        if answer.succeeded {
            self.inner
                .observed
                .write(&key, answer.header.revision, token.get(), ttl);
            Ok(Renewal::Renewed)
        } else {
            Ok(Renewal::Lost)
        }
    }

    /// Renews one chunk of distinct keys in one transaction: per lease a nested transaction
    /// with `renew`'s compare and put, so each answers on its own.
    async fn renew_chunk(
        &self,
        op: Op<'_>,
        holder: &HolderId,
        chunk: &[(usize, Vec<u8>, FencingToken)],
        ttl: Duration,
    ) -> StoreResult<Vec<Renewal>> {
        let ops = chunk
            .iter()
            .map(|(_, key, token)| {
                let record = Record::held(token.get(), holder.as_str(), ttl);
                nested(txn(
                    in_tenure(key, *token, holder),
                    vec![put(key, &record)],
                    vec![],
                ))
            })
            .collect();
        let answer = self.txn(op, txn(vec![], ops, vec![])).await?;
        let mut renewals = Vec::with_capacity(chunk.len());
        for (i, (_, key, token)) in chunk.iter().enumerate() {
            let inner = answer
                .txn(i)
                .ok_or_else(|| StoreError::Corrupt(format!("{op}: no nested answer {i}")))?;
            renewals.push(if inner.succeeded {
                self.inner
                    .observed
                    .write(key, answer.header.revision, token.get(), ttl);
                Renewal::Renewed
            } else {
                Renewal::Lost
            });
        }
        Ok(renewals)
    }

    /// `renew_many`: [`TXN_BATCH`] leases per transaction, the transactions one after another,
    /// each its own repeatable attempt within the op timeout.
    async fn renew_many_chunked(
        &self,
        op: Op<'_>,
        holder: &HolderId,
        leases: &[(LeaseName, FencingToken)],
        ttl: Duration,
    ) -> StoreResult<Vec<Renewal>> {
        let mut renewals = vec![Renewal::Lost; leases.len()];
        // Chunks in the order given; a key seen again starts a new chunk (etcd refuses two puts
        // of one key in a transaction), so a repeated lease is answered after its earlier entry.
        let mut chunks: Vec<Vec<(usize, Vec<u8>, FencingToken)>> = vec![Vec::new()];
        for (i, (name, token)) in leases.iter().enumerate() {
            let key = self.lease_key(name);
            // As `renew`: a tenure this process saw expire is lost without asking.
            if self.inner.observed.expired(&key, token.get()) {
                continue;
            }
            let last = chunks.last().map_or(&[][..], Vec::as_slice);
            if last.len() == TXN_BATCH || last.iter().any(|(_, k, _)| *k == key) {
                chunks.push(Vec::new());
            }
            if let Some(last) = chunks.last_mut() {
                last.push((i, key, *token));
            }
        }
        for chunk in chunks.iter().filter(|c| !c.is_empty()) {
            let answers = self
                .run_repeatable(|| self.renew_chunk(op, holder, chunk, ttl))
                .await?;
            for ((i, _, _), answer) in chunk.iter().zip(answers) {
                renewals[*i] = answer;
            }
        }
        Ok(renewals)
    }

    /// The key of `member`'s entry in `group`: `PREFIX` `member/` `GROUP` `\0` `MEMBER`.
    fn member_key(&self, group: &LeaseName, member: &str) -> Vec<u8> {
        let mut key = self.members_prefix(group);
        key.extend_from_slice(member.as_bytes());
        key
    }

    fn members_prefix(&self, group: &LeaseName) -> Vec<u8> {
        format!("{}member/{group}\0", self.inner.prefix).into_bytes()
    }

    async fn members_once(
        &self,
        op: Op<'_>,
        group: &LeaseName,
        member: &HolderId,
        ttl: Duration,
    ) -> StoreResult<Vec<HolderId>> {
        let prefix = self.members_prefix(group);
        let now = wall_ms();
        let ttl_ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX);
        let expiry = slot_text(now.saturating_add(ttl_ms));
        // The refresh and the group's entries in one transaction.
        let answer = self
            .txn(
                op,
                txn(
                    vec![],
                    vec![
                        put(&self.member_key(group, member.as_str()), &expiry),
                        get_prefixed(&prefix),
                    ],
                    vec![],
                ),
            )
            .await?;
        let entries = answer
            .range(1)
            .ok_or_else(|| StoreError::Corrupt(format!("{op}: no range answer")))?;
        let mut live = Vec::new();
        let mut expired = Vec::new();
        for kv in &entries.kvs {
            let key = unb64(&kv.key).map_err(|e| StoreError::Corrupt(e.to_string()))?;
            let name = std::str::from_utf8(&key[prefix.len().min(key.len())..])
                .ok()
                .and_then(|m| HolderId::new(m).ok())
                .ok_or_else(|| {
                    StoreError::Corrupt(format!("{op}: a member key is not a holder id"))
                })?;
            let expiry = parse_slot(&kv.value).map_err(|_| {
                StoreError::Corrupt(format!("{op}: the entry of {name} is not an expiry in ms"))
            })?;
            if expiry > now {
                live.push(name);
            } else {
                expired.push((key, kv.mod_revision));
            }
        }
        // Expired entries go in a second round trip, each only if not refreshed since.
        self.delete_unchanged(op, &expired).await?;
        live.sort();
        Ok(live)
    }

    async fn leave_once(
        &self,
        op: Op<'_>,
        group: &LeaseName,
        member: &HolderId,
    ) -> StoreResult<()> {
        let key = self.member_key(group, member.as_str());
        self.txn(op, txn(vec![], vec![delete(&key)], vec![]))
            .await?;
        Ok(())
    }

    /// Deletes each key only if it is still at the revision read, [`TXN_BATCH`] per round trip;
    /// answers the keys deleted.
    async fn delete_unchanged<'k>(
        &self,
        op: Op<'_>,
        keys: &'k [(Vec<u8>, u64)],
    ) -> StoreResult<Vec<&'k [u8]>> {
        let mut deleted = Vec::new();
        for batch in keys.chunks(TXN_BATCH) {
            let ops = batch
                .iter()
                .map(|(key, revision)| {
                    nested(txn(
                        vec![modified_at(key, *revision)],
                        vec![delete(key)],
                        vec![],
                    ))
                })
                .collect();
            let answer = self.txn(op, txn(vec![], ops, vec![])).await?;
            for (i, (key, _)) in batch.iter().enumerate() {
                if answer.txn(i).is_some_and(|t| t.succeeded) {
                    deleted.push(key.as_slice());
                }
            }
        }
        Ok(deleted)
    }

    async fn release_once(
        &self,
        op: Op<'_>,
        name: &LeaseName,
        holder: &HolderId,
        token: FencingToken,
    ) -> StoreResult<Release> {
        let key = self.lease_key(name);
        let answer = self
            .txn(
                op,
                txn(
                    in_tenure(&key, token, holder),
                    vec![put(&key, &Record::free(token.get(), wall_ms()))],
                    vec![],
                ),
            )
            .await?;
        if answer.succeeded {
            self.inner.observed.forget(&key);
            Ok(Release::Released)
        } else {
            Ok(Release::NotHeld)
        }
    }

    async fn inspect_once(&self, op: Op<'_>, name: &LeaseName) -> StoreResult<Option<LeaseState>> {
        let key = self.lease_key(name);
        let answer = self.range(op, json!({ "key": b64(&key) })).await?;
        let Some(kv) = answer.kvs.first() else {
            return Ok(None);
        };
        self.inner.lease_state(name, &key, kv).map(Some)
    }

    async fn claim_slot_once(
        &self,
        op: Op<'_>,
        task: &LeaseName,
        slot: u64,
    ) -> StoreResult<SlotClaim> {
        let key = self.slot_key(task);
        let value = slot_text(slot);
        // One round trip: create the key, else move it forward, else read it.
        let answer = self
            .txn(
                op,
                txn(
                    vec![absent(&key)],
                    vec![put(&key, &value)],
                    vec![nested(txn(
                        vec![value_is(&key, "LESS", &value)],
                        vec![put(&key, &value)],
                        vec![get(&key)],
                    ))],
                ),
            )
            .await?;
        if answer.succeeded {
            return Ok(SlotClaim::Claimed);
        }
        let inner = answer
            .txn(0)
            .ok_or_else(|| StoreError::Corrupt("claim_slot: no nested answer".into()))?;
        if inner.succeeded {
            return Ok(SlotClaim::Claimed);
        }
        let last = inner
            .range(0)
            .and_then(|r| r.kvs.first())
            .ok_or_else(|| StoreError::Corrupt("claim_slot: no slot read back".into()))?;
        Ok(SlotClaim::AlreadyRun {
            last: parse_slot(&last.value)?,
        })
    }

    async fn last_slot_once(&self, op: Op<'_>, task: &LeaseName) -> StoreResult<Option<u64>> {
        let answer = self
            .range(op, json!({ "key": b64(self.slot_key(task)) }))
            .await?;
        answer
            .kvs
            .first()
            .map(|kv| parse_slot(&kv.value))
            .transpose()
    }

    async fn record_history_once(
        &self,
        op: Op<'_>,
        task: &LeaseName,
        key: u64,
        entry: &str,
        keep: usize,
    ) -> StoreResult<()> {
        let prefix = self.history_prefix(task);
        let end = prefix_end(&prefix);
        let mut entry_key = prefix.clone();
        entry_key.extend_from_slice(&slot_text(key));
        // `keep` 0 counts as 1 (the trait's rule).
        let keep = keep.max(1);
        // The put, and the `keep` highest keys after it with the total count.
        let answer = self
            .txn(
                op,
                txn(
                    vec![],
                    vec![
                        put(&entry_key, entry.as_bytes()),
                        json!({ "request_range": {
                            "key": b64(&prefix), "range_end": b64(&end), "keys_only": true,
                            "sort_order": "DESCEND", "sort_target": "KEY", "limit": keep.to_string(),
                        } }),
                    ],
                    vec![],
                ),
            )
            .await?;
        let kept = answer
            .range(1)
            .ok_or_else(|| StoreError::Corrupt("record_history: no range answer".into()))?;
        if kept.count as usize > keep
            && let Some(lowest) = kept.kvs.last()
        {
            // A second round trip only when over the bound: drop every key below the lowest kept.
            let lowest = unb64(&lowest.key).map_err(|e| StoreError::Corrupt(e.to_string()))?;
            self.txn(
                op,
                txn(vec![], vec![delete_range(&prefix, &lowest)], vec![]),
            )
            .await?;
        }
        Ok(())
    }

    async fn history_once(
        &self,
        op: Op<'_>,
        task: &LeaseName,
        limit: usize,
    ) -> StoreResult<Vec<String>> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let prefix = self.history_prefix(task);
        let answer = self
            .range(
                op,
                json!({
                    "key": b64(&prefix), "range_end": b64(prefix_end(&prefix)),
                    "sort_order": "DESCEND", "sort_target": "KEY", "limit": limit.to_string(),
                }),
            )
            .await?;
        answer
            .kvs
            .iter()
            .map(|kv| {
                let bytes = unb64(&kv.value).map_err(|e| StoreError::Corrupt(e.to_string()))?;
                String::from_utf8(bytes)
                    .map_err(|_| StoreError::Corrupt("history entry is not UTF-8".into()))
            })
            .collect()
    }

    async fn purge_once(&self, op: Op<'_>, retention: Duration) -> StoreResult<u64> {
        let prefix = self.inner.lease_key_prefix();
        let end = prefix_end(&prefix);
        let cutoff =
            wall_ms().saturating_sub(u64::try_from(retention.as_millis()).unwrap_or(u64::MAX));
        let mut doomed: Vec<(Vec<u8>, u64)> = Vec::new();
        let mut from = prefix.clone();
        loop {
            let page = self
                .range(
                    op,
                    json!({ "key": b64(&from), "range_end": b64(&end), "limit": "500" }),
                )
                .await?;
            for kv in &page.kvs {
                let key = unb64(&kv.key).map_err(|e| StoreError::Corrupt(e.to_string()))?;
                let old = match decode_kv(kv) {
                    Ok(Record::Free { freed_at_ms, .. }) => freed_at_ms <= cutoff,
                    Ok(Record::Held { token, ttl, .. }) => self
                        .inner
                        .free_for(&key, kv.mod_revision, token, ttl)
                        .is_some_and(|free| free >= retention),
                    Err(_) => false,
                };
                if old {
                    doomed.push((key.clone(), kv.mod_revision));
                }
                from = key;
            }
            if !page.more || page.kvs.is_empty() {
                break;
            }
            from.push(0);
        }
        let purged = self.delete_unchanged(op, &doomed).await?;
        for key in &purged {
            self.inner.observed.forget(key);
        }
        Ok(purged.len() as u64)
    }
}

/// Ms of a duration, saturating.
fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// A catalog key's name part (after its kind's prefix) as a task name.
fn task_of(op: Op<'_>, text: &[u8]) -> StoreResult<LeaseName> {
    std::str::from_utf8(text)
        .ok()
        .and_then(|t| LeaseName::new(t).ok())
        .ok_or_else(|| StoreError::Corrupt(format!("{op}: a catalog key names no task")))
}

fn utf8(op: Op<'_>, what: &str, value: &str) -> StoreResult<String> {
    let bytes = unb64(value).map_err(|e| StoreError::Corrupt(e.to_string()))?;
    String::from_utf8(bytes).map_err(|_| StoreError::Corrupt(format!("{op}: {what} is not UTF-8")))
}

/// A control key's record: its value, and the key's etcd version as the record's.
fn versioned(op: Op<'_>, kv: &KeyValue) -> StoreResult<Versioned> {
    Ok(Versioned {
        version: kv.version,
        value: utf8(op, "a control record", &kv.value)?,
    })
}

/// How many times `forget` reads a task's records again after they changed under it.
const FORGET_ATTEMPTS: usize = 5;

/// An instance entry's value: the heartbeat's expiry (20 digits, wall-clock ms) and the
/// instance's about.
fn instance_value(expiry_ms: u64, about: &str) -> Vec<u8> {
    format!("{expiry_ms:020} {about}").into_bytes()
}

fn parse_instance(op: Op<'_>, kv: &KeyValue) -> StoreResult<(u64, String)> {
    let text = utf8(op, "an instance entry", &kv.value)?;
    text.split_once(' ')
        .filter(|(expiry, _)| expiry.len() == 20)
        .and_then(|(expiry, about)| Some((expiry.parse().ok()?, about.to_owned())))
        .ok_or_else(|| {
            StoreError::Corrupt(format!("{op}: an instance entry is not \"EXPIRY ABOUT\""))
        })
}

/// One task's records as `tasks` gathers them.
#[derive(Default)]
struct Gathered {
    /// The definition, with its key and revision (deleted when the task is left out).
    definition: Option<(String, Vec<u8>, u64)>,
    control: Option<Versioned>,
    instances: Vec<InstanceRecord>,
}

impl EtcdStore {
    /// The key of a task's definition in the catalog: `PREFIX` `task/` `TASK`.
    pub fn task_key(&self, task: &LeaseName) -> Vec<u8> {
        format!("{}task/{task}", self.inner.prefix).into_bytes()
    }

    /// The key of a task's control record: `PREFIX` `control/` `TASK`. The record's version is
    /// the key's etcd version (1 when created, +1 with every write).
    pub fn control_key(&self, task: &LeaseName) -> Vec<u8> {
        format!("{}control/{task}", self.inner.prefix).into_bytes()
    }

    /// The key of an instance's registration of a task: `PREFIX` `instance/` `TASK` `\0`
    /// `INSTANCE`, holding the heartbeat's expiry (20 digits of ms on the writer's wall clock),
    /// a space, and what the instance said about itself.
    pub fn instance_key(&self, task: &LeaseName, instance: &HolderId) -> Vec<u8> {
        let mut key = self.instances_prefix(task);
        key.extend_from_slice(instance.as_str().as_bytes());
        key
    }

    fn instances_prefix(&self, task: &LeaseName) -> Vec<u8> {
        format!("{}instance/{task}\0", self.inner.prefix).into_bytes()
    }

    fn kind_prefix(&self, kind: &str) -> Vec<u8> {
        format!("{}{kind}/", self.inner.prefix).into_bytes()
    }

    /// One transaction: the definition and the heartbeat written, the control record and the
    /// task's instances read; a second only to delete instances forgotten (each under a compare
    /// on the revision read).
    async fn register_once(
        &self,
        op: Op<'_>,
        r: &Registration<'_>,
    ) -> StoreResult<Option<Versioned>> {
        let now = wall_ms();
        let instance_key = self.instance_key(r.task, r.instance);
        let answer = self
            .txn(
                op,
                txn(
                    vec![],
                    vec![
                        put(&self.task_key(r.task), r.definition.as_bytes()),
                        put(
                            &instance_key,
                            &instance_value(now.saturating_add(millis(r.ttl)), r.about),
                        ),
                        get(&self.control_key(r.task)),
                        get_prefixed(&self.instances_prefix(r.task)),
                    ],
                    vec![],
                ),
            )
            .await?;
        let control = answer
            .range(2)
            .and_then(|range| range.kvs.first())
            .map(|kv| versioned(op, kv))
            .transpose()?;
        let instances = answer
            .range(3)
            .ok_or_else(|| StoreError::Corrupt(format!("{op}: no range answer")))?;
        let forget = millis(r.forget_after);
        let mut forgotten = Vec::new();
        for kv in &instances.kvs {
            let key = unb64(&kv.key).map_err(|e| StoreError::Corrupt(e.to_string()))?;
            let (expiry, _) = parse_instance(op, kv)?;
            if key != instance_key && expiry.saturating_add(forget) <= now {
                forgotten.push((key, kv.mod_revision));
            }
        }
        self.delete_unchanged(op, &forgotten).await?;
        Ok(control)
    }

    async fn unregister_once(
        &self,
        op: Op<'_>,
        task: &LeaseName,
        instance: &HolderId,
    ) -> StoreResult<()> {
        let key = self.instance_key(task, instance);
        self.txn(op, txn(vec![], vec![delete(&key)], vec![]))
            .await?;
        Ok(())
    }

    /// One transaction reads the three kinds of catalog keys; a second, only when there is
    /// any, deletes the instances forgotten and the definitions of the tasks left out (each
    /// under a compare on the revision read, so a registration in between keeps its records).
    async fn tasks_once(&self, op: Op<'_>, forget_after: Duration) -> StoreResult<Vec<TaskRecord>> {
        let now = wall_ms();
        let forget = millis(forget_after);
        let kinds = [
            self.kind_prefix("task"),
            self.kind_prefix("control"),
            self.kind_prefix("instance"),
        ];
        let answer = self
            .txn(
                op,
                txn(
                    vec![],
                    kinds.iter().map(|k| get_prefixed(k)).collect(),
                    vec![],
                ),
            )
            .await?;
        let range = |i: usize| {
            answer
                .range(i)
                .ok_or_else(|| StoreError::Corrupt(format!("{op}: no range answer")))
        };
        let mut tasks: BTreeMap<LeaseName, Gathered> = BTreeMap::new();
        let mut doomed: Vec<(Vec<u8>, u64)> = Vec::new();
        for kv in &range(0)?.kvs {
            let key = unb64(&kv.key).map_err(|e| StoreError::Corrupt(e.to_string()))?;
            let task = task_of(op, &key[kinds[0].len().min(key.len())..])?;
            let definition = utf8(op, "a task definition", &kv.value)?;
            tasks.entry(task).or_default().definition = Some((definition, key, kv.mod_revision));
        }
        for kv in &range(1)?.kvs {
            let key = unb64(&kv.key).map_err(|e| StoreError::Corrupt(e.to_string()))?;
            let task = task_of(op, &key[kinds[1].len().min(key.len())..])?;
            tasks.entry(task).or_default().control = Some(versioned(op, kv)?);
        }
        for kv in &range(2)?.kvs {
            let key = unb64(&kv.key).map_err(|e| StoreError::Corrupt(e.to_string()))?;
            let rest = &key[kinds[2].len().min(key.len())..];
            let split = rest.iter().position(|b| *b == 0).ok_or_else(|| {
                StoreError::Corrupt(format!("{op}: an instance key names no instance"))
            })?;
            let task = task_of(op, &rest[..split])?;
            let instance = std::str::from_utf8(&rest[split + 1..])
                .ok()
                .and_then(|i| HolderId::new(i).ok())
                .ok_or_else(|| {
                    StoreError::Corrupt(format!(
                        "{op}: an instance key of {task} names no holder id"
                    ))
                })?;
            let (expiry, about) = parse_instance(op, kv)?;
            if expiry.saturating_add(forget) <= now {
                doomed.push((key, kv.mod_revision));
                continue;
            }
            tasks
                .entry(task)
                .or_default()
                .instances
                .push(InstanceRecord {
                    instance,
                    about,
                    remaining: Duration::from_millis(expiry.saturating_sub(now)),
                });
        }
        let mut listed = Vec::with_capacity(tasks.len());
        for (task, mut gathered) in tasks {
            if gathered.control.is_none() && gathered.instances.is_empty() {
                doomed.extend(
                    gathered
                        .definition
                        .map(|(_, key, revision)| (key, revision)),
                );
                continue;
            }
            gathered.instances.sort_by(|a, b| {
                (a.remaining.is_zero(), &a.instance).cmp(&(b.remaining.is_zero(), &b.instance))
            });
            listed.push(TaskRecord {
                task,
                definition: gathered.definition.map(|(definition, _, _)| definition),
                instances: gathered.instances,
                control: gathered.control,
            });
        }
        self.delete_unchanged(op, &doomed).await?;
        Ok(listed)
    }

    async fn control_once(&self, op: Op<'_>, task: &LeaseName) -> StoreResult<ControlRead> {
        let answer = self
            .range(op, json!({ "key": b64(self.control_key(task)) }))
            .await?;
        Ok(ControlRead {
            now_ms: wall_ms(),
            control: answer.kvs.first().map(|kv| versioned(op, kv)).transpose()?,
        })
    }

    /// One transaction reads the task's definition, control record and instances; with none
    /// live, a second deletes them (and the history when asked) under a compare on the
    /// revisions read. Every registration rewrites the definition in the transaction that
    /// writes its heartbeat, so one that lands in between fails the compare, and the reading
    /// starts again: it is seen live.
    async fn forget_once(
        &self,
        op: Op<'_>,
        task: &LeaseName,
        history: bool,
    ) -> StoreResult<Forgetting> {
        let (task_key, control_key) = (self.task_key(task), self.control_key(task));
        let instances = self.instances_prefix(task);
        for _ in 0..FORGET_ATTEMPTS {
            let read = vec![get(&task_key), get(&control_key), get_prefixed(&instances)];
            let answer = self.txn(op, txn(vec![], read, vec![])).await?;
            let range = |i: usize| {
                answer
                    .range(i)
                    .ok_or_else(|| StoreError::Corrupt(format!("{op}: no range answer")))
            };
            let now = wall_ms();
            let mut live = 0;
            for kv in &range(2)?.kvs {
                if parse_instance(op, kv)?.0 > now {
                    live += 1;
                }
            }
            if live > 0 {
                return Ok(Forgetting::Live { instances: live });
            }
            let unchanged = |key: &[u8], i: usize| -> StoreResult<_> {
                Ok(match range(i)?.kvs.first() {
                    Some(kv) => modified_at(key, kv.mod_revision),
                    None => absent(key),
                })
            };
            let compare = vec![unchanged(&task_key, 0)?, unchanged(&control_key, 1)?];
            let mut deletes = vec![
                delete(&task_key),
                delete(&control_key),
                delete_range(&instances, &prefix_end(&instances)),
            ];
            if history {
                let prefix = self.history_prefix(task);
                deletes.push(delete_range(&prefix, &prefix_end(&prefix)));
            }
            if self.txn(op, txn(compare, deletes, vec![])).await?.succeeded {
                let found = (0..3).any(|i| range(i).is_ok_and(|r| !r.kvs.is_empty()));
                return Ok(if found {
                    Forgetting::Forgotten
                } else {
                    Forgetting::Unknown
                });
            }
        }
        Err(StoreError::Unavailable {
            message: format!(
                "{op}: the task's records changed at each of {FORGET_ATTEMPTS} attempts"
            ),
            source: None,
        })
    }

    /// One transaction: the put under a compare on the key's version (0: absent).
    async fn set_control_once(
        &self,
        op: Op<'_>,
        task: &LeaseName,
        expected: Option<u64>,
        value: &str,
    ) -> StoreResult<Option<u64>> {
        let expected = match expected {
            // No record has version 0: etcd's version 0 is "absent", which `None` asks for.
            Some(0) => return Ok(None),
            other => other.unwrap_or(0),
        };
        let key = self.control_key(task);
        let answer = self
            .txn(
                op,
                txn(
                    vec![version_is(&key, expected)],
                    vec![put(&key, value.as_bytes())],
                    vec![],
                ),
            )
            .await?;
        Ok(answer.succeeded.then(|| expected.saturating_add(1)))
    }

    /// One range read of the lease records, in key (so name) order, at most `limit`.
    async fn leases_once(&self, op: Op<'_>, limit: usize) -> StoreResult<Vec<LeaseRecord>> {
        // etcd reads a limit of 0 as none.
        if limit == 0 {
            return Ok(Vec::new());
        }
        let prefix = self.inner.lease_key_prefix();
        let limit = limit.min(i64::MAX as usize);
        let answer = self
            .range(
                op,
                json!({
                    "key": b64(&prefix), "range_end": b64(prefix_end(&prefix)),
                    "limit": limit.to_string(),
                }),
            )
            .await?;
        answer
            .kvs
            .iter()
            .map(|kv| {
                let key = unb64(&kv.key).map_err(|e| StoreError::Corrupt(e.to_string()))?;
                let name = std::str::from_utf8(&key[prefix.len().min(key.len())..])
                    .ok()
                    .and_then(|n| LeaseName::new(n).ok())
                    .ok_or_else(|| {
                        StoreError::Corrupt(format!("{op}: a lease key names no lease"))
                    })?;
                let state = self.inner.lease_state(&name, &key, kv)?;
                Ok(LeaseRecord { name, state })
            })
            .collect()
    }
}

/// The compares "the value of `key` belongs to the tenure `(token, holder)`".
fn in_tenure(key: &[u8], token: FencingToken, holder: &HolderId) -> Vec<serde_json::Value> {
    let tenure = Record::tenure(token.get(), holder.as_str());
    vec![
        value_is(key, "GREATER", &tenure),
        value_is(key, "LESS", &prefix_end(&tenure)),
    ]
}

fn free_state(token: FencingToken) -> LeaseState {
    LeaseState {
        holder: None,
        token,
        remaining: Duration::ZERO,
    }
}

fn decode_kv(kv: &KeyValue) -> StoreResult<Record> {
    let value = unb64(&kv.value).map_err(|e| StoreError::Corrupt(e.to_string()))?;
    Record::decode(&value)
}

impl Inner {
    /// Checks the settings; no connection yet, no release watch.
    fn new(config: &EtcdConfig) -> Result<Self> {
        config.validate()?;
        Ok(Self {
            gateway: Arc::new(Gateway::new(config)?),
            prefix: config.prefix.clone(),
            op_timeout: config.op_timeout,
            described: config.describe(),
            releases: None,
            observed: Arc::default(),
            release: tokio::sync::OnceCell::new(),
        })
    }

    /// The keys that record their schema version and the oldest release that may still write
    /// to them: `PREFIX meta/schema_version`, `PREFIX meta/min_writer` (see [`leasehold::skew`]).
    fn meta_key(&self, what: &str) -> Vec<u8> {
        format!("{}meta/{what}", self.prefix).into_bytes()
    }

    /// Whether this release may write to the keys, asked of a member once per store (before
    /// its first operation; a failure to ask is not remembered). Where it may, records this
    /// release's schema version and oldest writer where they are missing or lower, each by a
    /// compare on the revision read, so a concurrent writer's record is never overwritten.
    async fn check_release(&self) -> StoreResult<std::result::Result<(), skew::TooOld>> {
        let verdict = self
            .release
            .get_or_try_init(|| async {
                let op = Op::new("release check", None);
                let (version_key, writer_key) = (
                    self.meta_key(skew::SCHEMA_VERSION_KEY),
                    self.meta_key(skew::MIN_WRITER_KEY),
                );
                let read = txn(vec![], vec![get(&version_key), get(&writer_key)], vec![]);
                let answer: TxnResponse = self
                    .gateway
                    .call("/v3/kv/txn", &read)
                    .await
                    .map_err(|e: RequestError| e.into_store_error(op))?;
                let found = |i: usize| -> StoreResult<Option<(String, u64)>> {
                    let Some(kv) = answer.range(i).and_then(|r| r.kvs.first()) else {
                        return Ok(None);
                    };
                    let bytes = unb64(&kv.value).map_err(|e| StoreError::Corrupt(e.to_string()))?;
                    Ok(Some((
                        String::from_utf8_lossy(&bytes).into_owned(),
                        kv.mod_revision,
                    )))
                };
                let (version, min_writer) = (found(0)?, found(1)?);
                if let Some((recorded, _)) = &min_writer
                    && let Err(too_old) = skew::check_writer(recorded)
                {
                    return Ok(Err(too_old));
                }
                let (mut compare, mut writes) = (Vec::new(), Vec::new());
                let was = |key: &[u8], found: &Option<(String, u64)>| match found {
                    Some((_, revision)) => modified_at(key, *revision),
                    None => absent(key),
                };
                let version_behind = version
                    .as_ref()
                    .and_then(|(v, _)| v.parse::<i64>().ok())
                    .is_none_or(|v| v < KEYS_VERSION);
                if version_behind {
                    compare.push(was(&version_key, &version));
                    writes.push(put(&version_key, KEYS_VERSION.to_string().as_bytes()));
                }
                if let Some(raised) =
                    skew::raised_min_writer(min_writer.as_ref().map(|(v, _)| v.as_str()))
                {
                    compare.push(was(&writer_key, &min_writer));
                    writes.push(put(&writer_key, raised.as_bytes()));
                }
                if !writes.is_empty() {
                    self.gateway
                        .call::<TxnResponse>("/v3/kv/txn", &txn(compare, writes, vec![]))
                        .await
                        .map_err(|e: RequestError| e.into_store_error(op))?;
                }
                Ok(Ok(()))
            })
            .await?;
        Ok(verdict.clone())
    }

    /// [`check_release`](Self::check_release) as an operation's error.
    async fn may_write(&self, op: Op<'_>) -> StoreResult<()> {
        self.check_release()
            .await?
            .map_err(|too_old| StoreError::rejected(format!("{op}: {too_old}"), too_old))
    }

    /// What `inspect` answers for the lease record `kv` of `name` at `key`.
    fn lease_state(&self, name: &LeaseName, key: &[u8], kv: &KeyValue) -> StoreResult<LeaseState> {
        Ok(match decode_kv(kv)? {
            Record::Held { holder, ttl, token } => {
                match self.remaining(key, kv.mod_revision, token, ttl) {
                    Some(remaining) => {
                        LeaseState {
                            holder: Some(HolderId::new(&holder).map_err(|e| {
                                StoreError::Corrupt(format!("holder of {name}: {e}"))
                            })?),
                            token: FencingToken(token),
                            remaining,
                        }
                    }
                    None => free_state(FencingToken(token)),
                }
            }
            Record::Free { token, .. } => free_state(FencingToken(token)),
        })
    }

    fn lease_key_prefix(&self) -> Vec<u8> {
        format!("{}lease/", self.prefix).into_bytes()
    }

    fn lease_key(&self, name: &LeaseName) -> Vec<u8> {
        format!("{}lease/{name}", self.prefix).into_bytes()
    }

    /// Time left of the tenure at `revision` as this process sees it, `None` once expired.
    fn remaining(&self, key: &[u8], revision: u64, token: u64, ttl: Duration) -> Option<Duration> {
        let elapsed = self.observed.seen(key, revision, token, ttl);
        ttl.checked_sub(elapsed).filter(|left| !left.is_zero())
    }

    /// How long the tenure at `revision` has been expired for this process, `None` while live.
    fn free_for(&self, key: &[u8], revision: u64, token: u64, ttl: Duration) -> Option<Duration> {
        self.observed
            .seen(key, revision, token, ttl)
            .checked_sub(ttl)
    }
}

impl Store for EtcdStore {
    fn acquire(
        &self,
        name: &LeaseName,
        holder: &HolderId,
        ttl: Duration,
    ) -> impl Future<Output = StoreResult<Acquisition>> + Send {
        let op = Op::new("acquire", Some(name));
        self.run(self.acquire_once(op, name, holder, ttl))
    }

    fn renew(
        &self,
        name: &LeaseName,
        holder: &HolderId,
        token: FencingToken,
        ttl: Duration,
    ) -> impl Future<Output = StoreResult<Renewal>> + Send {
        let op = Op::new("renew", Some(name));
        self.run_repeatable(move || self.renew_once(op, name, holder, token, ttl))
    }

    fn release(
        &self,
        name: &LeaseName,
        holder: &HolderId,
        token: FencingToken,
    ) -> impl Future<Output = StoreResult<Release>> + Send {
        let op = Op::new("release", Some(name));
        self.run(self.release_once(op, name, holder, token))
    }

    fn inspect(
        &self,
        name: &LeaseName,
    ) -> impl Future<Output = StoreResult<Option<LeaseState>>> + Send {
        let op = Op::new("inspect", Some(name));
        self.run_repeatable(move || self.inspect_once(op, name))
    }

    fn now_millis(&self) -> impl Future<Output = StoreResult<u64>> + Send {
        std::future::ready(Ok(wall_ms()))
    }

    fn subscribe_releases(&self) -> Option<ReleaseSubscription> {
        self.inner.releases.as_ref().map(ReleaseFeed::subscribe)
    }

    fn describe(&self) -> String {
        self.inner.described.clone()
    }

    fn renew_many(
        &self,
        holder: &HolderId,
        leases: &[(LeaseName, FencingToken)],
        ttl: Duration,
    ) -> impl Future<Output = StoreResult<Vec<Renewal>>> + Send {
        self.renew_many_chunked(Op::new("renew_many", None), holder, leases, ttl)
    }
}

leasehold::declare_capabilities!(EtcdStore: SLOTS | PURGE | MEMBERSHIP | CATALOG);

impl Slots for EtcdStore {
    fn claim_slot(
        &self,
        task: &LeaseName,
        slot: u64,
    ) -> impl Future<Output = StoreResult<SlotClaim>> + Send {
        let op = Op::new("claim_slot", Some(task));
        self.run(self.claim_slot_once(op, task, slot))
    }

    fn last_slot(&self, task: &LeaseName) -> impl Future<Output = StoreResult<Option<u64>>> + Send {
        let op = Op::new("last_slot", Some(task));
        self.run_repeatable(move || self.last_slot_once(op, task))
    }

    fn record_history(
        &self,
        task: &LeaseName,
        key: u64,
        entry: &str,
        keep: usize,
    ) -> impl Future<Output = StoreResult<()>> + Send {
        let op = Op::new("record_history", Some(task));
        self.run_repeatable(move || self.record_history_once(op, task, key, entry, keep))
    }

    fn history(
        &self,
        task: &LeaseName,
        limit: usize,
    ) -> impl Future<Output = StoreResult<Vec<String>>> + Send {
        let op = Op::new("history", Some(task));
        self.run_repeatable(move || self.history_once(op, task, limit))
    }
}

impl Purge for EtcdStore {
    fn purge(&self, retention: Duration) -> impl Future<Output = StoreResult<u64>> + Send {
        let op = Op::new("purge", None);
        self.run_repeatable(move || self.purge_once(op, retention))
    }
}

impl Membership for EtcdStore {
    fn members(
        &self,
        group: &LeaseName,
        member: &HolderId,
        ttl: Duration,
    ) -> impl Future<Output = StoreResult<Vec<HolderId>>> + Send {
        let op = Op::new("members", Some(group));
        self.run_repeatable(move || self.members_once(op, group, member, ttl))
    }

    fn leave(
        &self,
        group: &LeaseName,
        member: &HolderId,
    ) -> impl Future<Output = StoreResult<()>> + Send {
        let op = Op::new("leave", Some(group));
        self.run_repeatable(move || self.leave_once(op, group, member))
    }
}

impl Catalog for EtcdStore {
    fn register(
        &self,
        registration: &Registration<'_>,
    ) -> impl Future<Output = StoreResult<Option<Versioned>>> + Send {
        let op = Op::new("register", Some(registration.task));
        // Rewriting the definition and the heartbeat is idempotent: repeatable.
        self.run_repeatable(move || self.register_once(op, registration))
    }

    fn unregister(
        &self,
        task: &LeaseName,
        instance: &HolderId,
    ) -> impl Future<Output = StoreResult<()>> + Send {
        let op = Op::new("unregister", Some(task));
        self.run_repeatable(move || self.unregister_once(op, task, instance))
    }

    fn tasks(
        &self,
        forget_after: Duration,
    ) -> impl Future<Output = StoreResult<Vec<TaskRecord>>> + Send {
        let op = Op::new("tasks", None);
        self.run_repeatable(move || self.tasks_once(op, forget_after))
    }

    fn control(&self, task: &LeaseName) -> impl Future<Output = StoreResult<ControlRead>> + Send {
        let op = Op::new("control", Some(task));
        self.run_repeatable(move || self.control_once(op, task))
    }

    fn set_control(
        &self,
        task: &LeaseName,
        expected: Option<u64>,
        value: &str,
    ) -> impl Future<Output = StoreResult<Option<u64>>> + Send {
        let op = Op::new("set_control", Some(task));
        // One attempt: after a lost answer a second would find the version moved.
        self.run(self.set_control_once(op, task, expected, value))
    }

    fn forget(
        &self,
        task: &LeaseName,
        history: bool,
    ) -> impl Future<Output = StoreResult<Forgetting>> + Send {
        let op = Op::new("forget", Some(task));
        // Deleting again after a lost answer deletes nothing more: repeatable.
        self.run_repeatable(move || self.forget_once(op, task, history))
    }

    fn leases(&self, limit: usize) -> impl Future<Output = StoreResult<Vec<LeaseRecord>>> + Send {
        let op = Op::new("leases", None);
        self.run_repeatable(move || self.leases_once(op, limit))
    }
}

/// Opening a store from its settings: here rather than in `config`, which is plain data.
impl EtcdConfig {
    /// Connects: checks that a member answers (and accepts the credentials), starts the release
    /// watch, and returns the store.
    pub async fn connect(self) -> Result<EtcdStore> {
        EtcdStore::connect(self).await
    }

    /// The store at once, without waiting for a member: the first operations fail with
    /// [`StoreError::Unavailable`](leasehold::StoreError::Unavailable) until one answers, and the
    /// release watch is established in the background, so a service can start while etcd is
    /// down. Fails only on settings that can never work. Call it within a tokio runtime.
    pub fn connect_lazy(self) -> Result<EtcdStore> {
        EtcdStore::open(self)
    }
}
