//! The etcd store, next to a one-key put (a Raft commit), a one-key transaction (a compare and
//! a put: the kind of request every store operation is) and a one-key linearizable range read
//! (a round trip the leader answers after confirming its leadership with a quorum, no disk
//! write), sent as the store sends its transactions: a POST to etcd's JSON gateway with base64
//! keys, by hyper's HTTP/1.1 client on a kept-alive connection to the member the store talks to
//! first.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::{self, SendRequest};
use hyper::header::{CONTENT_TYPE, HOST};
use hyper::{Request, StatusCode};
use hyper_util::rt::TokioIo;
use leasehold::store::BoxError;
use leasehold_etcd::{Endpoint, EtcdStore};
use serde_json::{Value, json};
use tokio::net::TcpStream;

use crate::common::{self, HeldPlan, OpBench, OpRounds, OpTargets};
use crate::error::{BenchError, Result};
use crate::plan::{Plan, StoreKind, etcd_floor_config};
use crate::report::Report;
use crate::stats::{Figure, Recorder, Round};

const FLOOR: &str = "put";

/// Leases a session holds in the held-lease benchmark, at most: `renew_many` sends 100 leases
/// per transaction (etcd's `--max-txn-ops` is 128), one transaction after another, so a pass
/// over N leases costs N ÷ 100 commits and has to fit in the renewal interval (1 s at the
/// bench's 3 s ttl): 3,000 took about 0.7 s on a 3-member loopback cluster, 10,000 would not fit.
pub(crate) const MAX_HELD: usize = 3_000;

pub(crate) async fn bench(plan: &Plan, report: &mut Report) -> Result<()> {
    let mut config = etcd_floor_config(&plan.etcd_url)?;
    // Every key of this run under a prefix of its own, deleted at the end.
    config.prefix = format!("{}bench-{}/", config.prefix, plan.run_id);
    let described = config.describe();
    let connect = || async {
        config
            .clone()
            .connect()
            .await
            .map_err(|e| BenchError::connect(&described, e))
    };
    let store = connect().await?;
    // The member the store sends its requests to while it answers: the first one.
    let member = &config.endpoints[0];
    let mut gateway = Gateway::open(member)
        .await
        .map_err(|e| BenchError::connect(member.to_string(), e))?;
    let result = async {
        // A second store handle, as another process would have: its own connections and
        // release watch.
        let waiter = connect().await?;
        bench_with(plan, report, &store, &waiter, &mut gateway, &config.prefix).await
    }
    .await;
    let cleaned = gateway.delete_prefix(&config.prefix).await;
    result.and(cleaned)
}

async fn bench_with(
    plan: &Plan,
    report: &mut Report,
    store: &EtcdStore,
    waiter: &EtcdStore,
    gateway: &mut Gateway,
    key_prefix: &str,
) -> Result<()> {
    let floor_key = format!("{key_prefix}floor");
    let prefix = plan.prefix(StoreKind::Etcd);
    let ops = OpBench::new(store.clone(), &prefix, plan.ops)?;
    ops.warm_up().await?;
    gateway.put_round(&floor_key, plan.ops.min(200)).await?;
    gateway.range_round(&floor_key, plan.ops.min(200)).await?;
    gateway.txn_round(&floor_key, plan.ops.min(200)).await?;
    let (mut rounds, mut puts, mut txns, mut ranges) =
        (OpRounds::default(), Vec::new(), Vec::new(), Vec::new());
    for _ in 0..plan.rounds {
        puts.push(gateway.put_round(&floor_key, plan.ops).await?);
        txns.push(gateway.txn_round(&floor_key, plan.ops).await?);
        ranges.push(gateway.range_round(&floor_key, plan.ops).await?);
        ops.round(&mut rounds).await?;
    }

    report.operations.extend(common::floor_rows(
        "etcd",
        &[(FLOOR, &puts), ("txn", &txns), ("range", &ranges)],
    ));
    // Against the transaction floor, 1.5× per transaction the operation needs: one more round
    // trip would miss.
    let txn = (&txns[..], "txn");
    let targets = OpTargets {
        // Two transactions: create-or-read, then the compare-and-set on the revision read.
        acquire: Some(common::p50_within(&rounds.acquire, 3.0, txn)),
        // One transaction: compare the tenure, put.
        renew: Some(common::p50_within(&rounds.renew, 1.5, txn)),
        ..OpTargets::default()
    };
    report
        .operations
        .extend(rounds.rows("etcd", Some((&puts, FLOOR)), targets));
    let server = gateway.describe_server().await?;
    report.notes.push(format!(
        "etcd: floors = a one-key put (a Raft commit), a one-key transaction (compare the key's \
         mod revision, put; a commit like every store operation) and a one-key linearizable \
         range read (the leader confirms its leadership with a quorum; no disk write), each a \
         POST to the JSON gateway (/v3/kv/put, /v3/kv/txn, /v3/kv/range) on a kept-alive HTTP/1.1 connection (hyper) to the \
         member the store talks to first, as the store sends its transactions; acquire of a used \
         name is two transactions (create-or-read, then compare-and-set on the revision read), \
         renew and release one each, and every transaction holding a put is a Raft commit even \
         when its compare fails; {server}; keys under {key_prefix}"
    ));

    let held = HeldPlan {
        held: plan.held.min(MAX_HELD),
        ..HeldPlan::of(plan, "etcd", &prefix, 32)
    };
    report.notes.push(format!(
        "etcd held leases: at most {MAX_HELD} (--held is capped): renew_many sends 100 leases per \
         transaction (each a nested compare-and-put, as renew), the transactions one after \
         another, so a pass costs one commit per 100 held leases"
    ));

    // The release's transaction, the watch event and the waiter's acquire (two transactions);
    // a waiter the watch did not wake would sit out the 30 s ttl.
    let bound = 6.0 * Figure::of(&txns).p50_us.median / 1000.0;
    let graceful = Some((format!("6× txn ({bound:.1} ms)"), bound));
    common::held_and_takeovers(plan, report, &held, store, waiter, graceful).await
}

/// One kept-alive HTTP/1.1 connection to one member's JSON gateway.
struct Gateway {
    sender: SendRequest<Full<Bytes>>,
    host: String,
}

impl Gateway {
    async fn open(member: &Endpoint) -> Result<Self, BoxError> {
        let tcp = TcpStream::connect((member.host.as_str(), member.port)).await?;
        tcp.set_nodelay(true)?;
        let (sender, connection) = http1::handshake(TokioIo::new(tcp)).await?;
        // Ends when the member closes the connection or the sender is dropped.
        tokio::spawn(connection);
        Ok(Self {
            sender,
            host: member.to_string(),
        })
    }

    /// POSTs `body` to `path`; a failure is described as `what`.
    async fn post_for(&mut self, what: &str, path: &str, body: &Value) -> Result<Value> {
        let (status, bytes) = self
            .send(path, body)
            .await
            .map_err(|e| BenchError::floor(what, e))?;
        if !status.is_success() {
            return Err(BenchError::Unexpected(format!(
                "{what}: HTTP {status}: {}",
                String::from_utf8_lossy(&bytes)
            )));
        }
        serde_json::from_slice(&bytes)
            .map_err(|e| BenchError::floor(format!("{what}: the answer"), e))
    }

    async fn post(&mut self, path: &str, body: &Value) -> Result<Value> {
        self.post_for(path, path, body).await
    }

    async fn send(&mut self, path: &str, body: &Value) -> Result<(StatusCode, Bytes), BoxError> {
        self.sender.ready().await?;
        let request = Request::post(path)
            .header(HOST, &self.host)
            .header(CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from(body.to_string())))?;
        let response = self.sender.send_request(request).await?;
        let status = response.status();
        let bytes = response.into_body().collect().await?.to_bytes();
        Ok((status, bytes))
    }

    async fn put_round(&mut self, key: &str, ops: usize) -> Result<Round> {
        let mut rec = Recorder::new(ops);
        for i in 0..ops {
            let body = json!({ "key": B64.encode(key), "value": B64.encode(i.to_string()) });
            rec.start();
            self.post("/v3/kv/put", &body).await?;
            rec.stop();
        }
        Ok(rec.finish())
    }

    async fn txn_round(&mut self, key: &str, ops: usize) -> Result<Round> {
        let mut rec = Recorder::new(ops);
        for i in 0..ops {
            let body = json!({
                "compare": [{
                    "target": "MOD", "key": B64.encode(key), "result": "GREATER", "mod_revision": "0"
                }],
                "success": [{
                    "request_put": { "key": B64.encode(key), "value": B64.encode(i.to_string()) }
                }],
            });
            rec.start();
            let answer = self.post("/v3/kv/txn", &body).await?;
            rec.stop();
            if answer["succeeded"] != true {
                return Err(BenchError::Unexpected(format!("txn on {key}: {answer}")));
            }
        }
        Ok(rec.finish())
    }

    async fn range_round(&mut self, key: &str, ops: usize) -> Result<Round> {
        let body = json!({ "key": B64.encode(key) });
        let mut rec = Recorder::new(ops);
        for _ in 0..ops {
            rec.start();
            let answer = self.post("/v3/kv/range", &body).await?;
            rec.stop();
            if answer["count"] != "1" {
                return Err(BenchError::Unexpected(format!("range of {key}: {answer}")));
            }
        }
        Ok(rec.finish())
    }

    /// The server's version, the cluster's size and whether this member leads.
    async fn describe_server(&mut self) -> Result<String> {
        let status = self.post("/v3/maintenance/status", &json!({})).await?;
        let members = self.post("/v3/cluster/member/list", &json!({})).await?;
        let role = if status["leader"] == status["header"]["member_id"] {
            "the leader"
        } else {
            "a follower (it forwards puts and read-index requests to the leader)"
        };
        Ok(format!(
            "etcd {}, {} members, the client's member {} is {role}",
            status["version"].as_str().unwrap_or("?"),
            members["members"].as_array().map_or(0, Vec::len),
            self.host
        ))
    }

    async fn delete_prefix(&mut self, prefix: &str) -> Result<()> {
        let mut end = prefix.as_bytes().to_vec();
        // The prefix ends in '/': the next byte up ends the range of keys that start with it.
        if let Some(last) = end.last_mut() {
            *last += 1;
        }
        self.post_for(
            &format!("cleanup: delete the keys under {prefix}"),
            "/v3/kv/deleterange",
            &json!({ "key": B64.encode(prefix), "range_end": B64.encode(end) }),
        )
        .await?;
        Ok(())
    }
}
