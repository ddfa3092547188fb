//! The catalog: task definitions, instances, control records and the lease listing.

use leasehold::Catalog;
use leasehold::catalog::{
    CATALOG_RETENTION, ControlRead, Forgetting, LeaseRecord, Registration, TaskRecord, Versioned,
};

use super::*;
use crate::scripts::{
    CONTROL, FORGET, INDEX_TASK, LIST_TASKS, READ_TASK, REGISTER, SET_CONTROL, UNINDEX_TASK,
    UNREGISTER,
};

/// Caps a catalog ttl or retention (about 31 years): the scripts add them to the server's clock
/// in Lua numbers (doubles), which stay exact integers below 2^53.
const MAX_CATALOG_MS: u64 = 1_000_000_000_000;

fn catalog_millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).map_or(MAX_CATALOG_MS, |ms| ms.min(MAX_CATALOG_MS))
}

/// Keys a `SCAN` step asks for: each step is one round trip that walks about this many keys of
/// the database.
const SCAN_COUNT: u64 = 1000;

/// Leases inspected per round trip by [`Catalog::leases`].
const LEASES_PER_BATCH: usize = 500;

/// `text` with the glob characters of `SCAN … MATCH` escaped.
fn glob_literal(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// The lease of a lease or fencing counter key under `prefix`, if `key` is one.
fn lease_of_key(prefix: &str, key: &str) -> Option<LeaseName> {
    let name = key.strip_prefix(prefix)?.strip_prefix(":{")?;
    let name = name
        .strip_suffix(&format!("}}:{LEASE}"))
        .or_else(|| name.strip_suffix(&format!("}}:{FENCE}")))?;
    LeaseName::new(name).ok()
}

/// One page of a `SCAN` reply: its keys go to `keys`; answers the next cursor (`"0"`: done).
fn scan_page(op: Op<'_>, reply: Value, keys: &mut Vec<String>) -> StoreResult<String> {
    let mut reply = items(op, reply)?.into_iter();
    let cursor = text(op, reply.next().as_ref())?;
    for key in items(op, reply.next().unwrap_or(Value::Nil))? {
        // Keys that are not UTF-8 are not leasehold's.
        if let Value::BulkString(bytes) = key
            && let Ok(key) = String::from_utf8(bytes)
        {
            keys.push(key);
        }
    }
    Ok(cursor)
}

impl RedisStore {
    /// The key holding `task`'s catalog record: a hash with the `definition` the last instance
    /// to register wrote, and once a control record was written its `version` and `control`.
    pub fn task_key(&self, task: &LeaseName) -> String {
        key_parts(&self.inner.prefix, task.as_str(), TASK_KIND).concat()
    }

    /// The key holding the instances that registered `task`: a hash of instance id →
    /// `"<heartbeat expiry, ms on the server's clock> <about>"`.
    pub fn instances_key(&self, task: &LeaseName) -> String {
        key_parts(&self.inner.prefix, task.as_str(), INSTANCES).concat()
    }

    /// The key of the catalog's index of task names: a sorted set scored by when each task's
    /// records lapse (ms on the server's clock; `inf` once it has a control record).
    pub fn catalog_index_key(&self) -> String {
        key_parts(&self.inner.prefix, CATALOG, TASKS).concat()
    }

    fn index_key(&self) -> Arg<'_> {
        Arg::Key {
            prefix: &self.inner.prefix,
            name: CATALOG,
            kind: TASKS,
        }
    }

    /// Every key matching `pattern`: `SCAN` to the end on the server, or on a Redis Cluster on
    /// every primary (each has its own slots' keys and its own cursor). One round trip per step,
    /// each within the operation timeout.
    async fn scan(&self, pattern: &str, op: Op<'_>) -> StoreResult<Vec<String>> {
        let scan = |cursor: &str| {
            let mut cmd = redis::cmd("SCAN");
            cmd.arg(cursor)
                .arg("MATCH")
                .arg(pattern)
                .arg("COUNT")
                .arg(SCAN_COUNT);
            cmd
        };
        let step = |reply: redis::RedisResult<Value>| match reply {
            Ok(Value::ServerError(e)) => Err(self.classify(e.into(), op)),
            reply => reply.map_err(|e| self.classify(e, op)),
        };
        let timeout = self.inner.op_timeout;
        let mut keys = Vec::new();
        within(timeout, self.inner.ready(op)).await?;
        let mut conn = self.inner.ready_conn().await;
        if let Conn::Cluster(cluster) = &mut conn.0 {
            let all = RoutingInfo::MultiNode((MultipleNodeRoutingInfo::AllMasters, None));
            let first = step(
                within(timeout, async {
                    Ok(cluster.route_command(scan("0"), all).await)
                })
                .await?,
            )?;
            let Value::Map(per_node) = first else {
                return Err(corrupt(op, format_args!("unexpected SCAN reply {first:?}")));
            };
            for (node, reply) in per_node {
                let node = text(op, Some(&node))?;
                let (host, port) = node
                    .rsplit_once(':')
                    .and_then(|(host, port)| Some((host.to_owned(), port.parse().ok()?)))
                    .ok_or_else(|| corrupt(op, format_args!("node address {node:?}")))?;
                let mut cursor = scan_page(op, step(Ok(reply))?, &mut keys)?;
                while cursor != "0" {
                    let there = RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress {
                        host: host.clone(),
                        port,
                    });
                    let reply = within(timeout, async {
                        Ok(cluster.route_command(scan(&cursor), there).await)
                    })
                    .await?;
                    cursor = scan_page(op, step(reply)?, &mut keys)?;
                }
            }
            return Ok(keys);
        }
        let mut cursor = "0".to_owned();
        loop {
            let reply = within(timeout, async {
                Ok(scan(&cursor).query_async(&mut conn).await)
            })
            .await?;
            cursor = scan_page(op, step(reply)?, &mut keys)?;
            if cursor == "0" {
                return Ok(keys);
            }
        }
    }
}

/// The catalog: per task, two keys under its name's hash tag (`{TASK}:task`, `{TASK}:instances`),
/// and an index of task names under a fixed tag (`{#catalog}:tasks`). On a single server or
/// behind Sentinel every operation is one script (listing: two round trips); on a Redis Cluster,
/// where the index is on another node than the task, `register` sends the index's refresh beside
/// the task's script, `set_control` marks the index first, and listing reads each task on its
/// node, all at once.
impl Catalog for RedisStore {
    async fn register(&self, r: &Registration<'_>) -> StoreResult<Option<Versioned>> {
        let op = Op::new("register", Some(r.task));
        let (ttl, forget) = (catalog_millis(r.ttl), catalog_millis(r.forget_after));
        let args = [
            Arg::Str(r.definition),
            Arg::Str(r.instance.as_str()),
            Arg::Str(r.about),
            Arg::Int(ttl),
            Arg::Int(forget),
            Arg::Str(r.task.as_str()),
        ];
        let (task, instances) = (self.key(r.task, TASK_KIND), self.key(r.task, INSTANCES));
        // Rewriting the definition and the heartbeat is idempotent: retried after a lost reply.
        let reply = if self.is_cluster() {
            let (task_keys, index_keys) = ([task, instances], [self.index_key()]);
            let index_args = [Arg::Str(r.task.as_str()), Arg::Int(ttl + forget)];
            let (reply, indexed) = tokio::join!(
                self.eval(&REGISTER, &task_keys, &args, op, true, None),
                self.eval(&INDEX_TASK, &index_keys, &index_args, op, true, None),
            );
            indexed?;
            reply?
        } else {
            self.eval(
                &REGISTER,
                &[task, instances, self.index_key()],
                &args,
                op,
                true,
                None,
            )
            .await?
        };
        if reply == Value::Nil {
            return Ok(None);
        }
        let reply = items(op, reply)?;
        control_record(op, reply.first(), reply.get(1))
    }

    async fn unregister(&self, task: &LeaseName, instance: &HolderId) -> StoreResult<()> {
        let op = Op::new("unregister", Some(task));
        self.eval(
            &UNREGISTER,
            &[self.key(task, INSTANCES)],
            &[Arg::Str(instance.as_str())],
            op,
            true,
            None,
        )
        .await?;
        Ok(())
    }

    async fn tasks(&self, forget_after: Duration) -> StoreResult<Vec<TaskRecord>> {
        let op = Op::new("tasks", None);
        let listed = self
            .eval(&LIST_TASKS, &[self.index_key()], &[], op, true, None)
            .await?;
        let mut names = items(op, listed)?
            .iter()
            .map(|name| {
                let name = text(op, Some(name))?;
                LeaseName::new(&name).map_err(|_| {
                    corrupt(
                        op,
                        format_args!("the catalog index lists {name:?}, not a task name"),
                    )
                })
            })
            .collect::<StoreResult<Vec<_>>>()?;
        names.sort();
        let calls: Vec<ScriptCall<'_>> = names
            .iter()
            .map(|name| ScriptCall {
                keys: vec![self.key(name, TASK_KIND), self.key(name, INSTANCES)],
                args: Vec::new(),
                op: Op::new("tasks", Some(name)),
            })
            .collect();
        let forget_ms = u64::try_from(forget_after.as_millis()).unwrap_or(u64::MAX);
        let replies = self.eval_each(&READ_TASK, &calls, op, None).await?;
        let mut tasks = Vec::with_capacity(names.len());
        for (name, reply) in names.iter().zip(replies) {
            tasks.extend(task_record(
                Op::new("tasks", Some(name)),
                name,
                reply,
                forget_ms,
            )?);
        }
        Ok(tasks)
    }

    async fn control(&self, task: &LeaseName) -> StoreResult<ControlRead> {
        let op = Op::new("control", Some(task));
        let reply = self
            .eval(&CONTROL, &[self.key(task, TASK_KIND)], &[], op, true, None)
            .await?;
        let reply = items(op, reply)?;
        Ok(ControlRead {
            now_ms: u64::try_from(int(op, reply.first())?).unwrap_or(0),
            control: control_record(op, reply.get(1), reply.get(2))?,
        })
    }

    async fn set_control(
        &self,
        task: &LeaseName,
        expected: Option<u64>,
        value: &str,
    ) -> StoreResult<Option<u64>> {
        let op = Op::new("set_control", Some(task));
        let expected = expected.map(|v| v.to_string()).unwrap_or_default();
        let args = [
            Arg::Str(&expected),
            Arg::Str(value),
            Arg::Str(task.as_str()),
        ];
        // Not retried: after a lost reply a second attempt would answer that the version moved.
        let reply = if self.is_cluster() {
            // Listed first, so a record that is written is listed, whatever happens next.
            self.eval(
                &INDEX_TASK,
                &[self.index_key()],
                &[Arg::Str(task.as_str()), Arg::Str("inf")],
                op,
                true,
                None,
            )
            .await?;
            self.eval(
                &SET_CONTROL,
                &[self.key(task, TASK_KIND)],
                &args,
                op,
                false,
                None,
            )
            .await?
        } else {
            self.eval(
                &SET_CONTROL,
                &[self.key(task, TASK_KIND), self.index_key()],
                &args,
                op,
                false,
                None,
            )
            .await?
        };
        match reply {
            Value::Nil => Ok(None),
            reply => Ok(Some(
                u64::try_from(int(op, Some(&reply))?)
                    .map_err(|_| corrupt(op, "a negative control version"))?,
            )),
        }
    }

    /// One script on a single server. On a Redis Cluster the index is on another node: the
    /// task's keys go in one script, then its index entry; a registration or control record
    /// written between the two is read back and listed again.
    async fn forget(&self, task: &LeaseName, history: bool) -> StoreResult<Forgetting> {
        let op = Op::new("forget", Some(task));
        let mut keys = vec![
            self.key(task, TASK_KIND),
            self.key(task, INSTANCES),
            self.key(task, HISTORY_KIND),
        ];
        let cluster = self.is_cluster();
        if !cluster {
            keys.push(self.index_key());
        }
        let args = [
            Arg::Str(if history { "1" } else { "" }),
            Arg::Str(task.as_str()),
        ];
        // Deleting again after a lost reply deletes nothing more.
        let reply = items(op, self.eval(&FORGET, &keys, &args, op, true, None).await?)?;
        let live = u64::try_from(int(op, reply.first())?).unwrap_or(0);
        if live > 0 {
            return Ok(Forgetting::Live { instances: live });
        }
        let gone = int(op, reply.get(1))? > 0;
        if cluster {
            let index = [self.index_key()];
            let name = [Arg::Str(task.as_str())];
            self.eval(&UNINDEX_TASK, &index, &name, op, true, None)
                .await?;
            let read = [self.key(task, TASK_KIND), self.key(task, INSTANCES)];
            let reply = self.eval(&READ_TASK, &read, &[], op, true, None).await?;
            let retention = catalog_millis(CATALOG_RETENTION);
            if let Some(record) = task_record(op, task, reply, retention)? {
                let keep = match record.control {
                    Some(_) => "inf".to_owned(),
                    None => {
                        let left = record.instances.iter().map(|i| i.remaining).max();
                        (catalog_millis(left.unwrap_or_default()) + retention).to_string()
                    }
                };
                let args = [Arg::Str(task.as_str()), Arg::Str(&keep)];
                self.eval(&INDEX_TASK, &index, &args, op, true, None)
                    .await?;
            }
        }
        Ok(if gone {
            Forgetting::Forgotten
        } else {
            Forgetting::Unknown
        })
    }

    /// `SCAN`s the database (every primary of a cluster) for lease and fencing counter keys
    /// under the prefix, then inspects the names in order, 500 per round trip, until `limit`
    /// are found. Lease records have no index: one would cost every acquisition a second key
    /// (on a cluster a second round trip), and v0.1.0 binaries would not keep it.
    async fn leases(&self, limit: usize) -> StoreResult<Vec<LeaseRecord>> {
        let op = Op::new("leases", None);
        if limit == 0 {
            return Ok(Vec::new());
        }
        let prefix = &self.inner.prefix;
        let pattern = format!("{}:{{*}}:[lf]e[an][sc]e", glob_literal(prefix));
        let names: BTreeSet<LeaseName> = self
            .scan(&pattern, op)
            .await?
            .iter()
            .filter_map(|key| lease_of_key(prefix, key))
            .collect();
        let mut leases = Vec::new();
        let mut rest = names.iter();
        while leases.len() < limit {
            let batch: Vec<&LeaseName> = rest
                .by_ref()
                .take((limit - leases.len()).min(LEASES_PER_BATCH))
                .collect();
            if batch.is_empty() {
                break;
            }
            let calls: Vec<ScriptCall<'_>> = batch
                .iter()
                .map(|name| ScriptCall {
                    keys: vec![self.key(name, LEASE), self.key(name, FENCE)],
                    args: Vec::new(),
                    op: Op::new("inspect", Some(name)),
                })
                .collect();
            let replies = self.eval_each(&INSPECT, &calls, op, None).await?;
            for (name, reply) in batch.into_iter().zip(replies) {
                // Gone since the scan (expired): not listed.
                if let Some(state) = lease_state(Op::new("leases", Some(name)), reply)? {
                    leases.push(LeaseRecord {
                        name: name.clone(),
                        state,
                    });
                }
            }
        }
        Ok(leases)
    }
}
