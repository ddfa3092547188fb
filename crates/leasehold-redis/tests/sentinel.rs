//! `redis+sentinel://` against a Sentinel group of the test's own (primary, replica, three
//! sentinels, quorum 2): the conformance suite, and a SIGKILLed primary.

mod common;

use std::time::{Duration, Instant};

use leasehold::{
    HolderId, Lease, LeaseConfig, LeaseName, Release, Store, TryAcquire, store::Acquisition,
};
use leasehold_redis::{RedisConfig, RedisStore};
use leasehold_testkit::ha::SentinelGroup;
use leasehold_testkit::redis::cli;

async fn connect(group: &SentinelGroup, prefix: &str) -> RedisStore {
    RedisConfig::new(group.url())
        .prefix(prefix)
        .connect()
        .await
        .expect("connect through the sentinels")
}

/// The whole suite through the sentinels, on database 2 of the primary (`?db=2`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_suite_passes_behind_sentinel() {
    let group = SentinelGroup::start();
    let prefix = common::test_prefix();
    let url = format!("{}?db=2", group.url());
    let store = RedisConfig::new(&url)
        .prefix(&prefix)
        .connect()
        .await
        .unwrap();
    let described = Store::describe(&store);
    assert!(
        described.starts_with("redis+sentinel://127.0.0.1:") && described.contains("?db=2"),
        "{described}"
    );
    leasehold_testkit::conformance::run_all(|_| std::future::ready(store.clone())).await;
    let pattern = format!("{prefix}:*");
    let in_db = |db: &str| {
        cli(group.primary, &["-n", db, "--scan", "--pattern", &pattern])
            .lines()
            .count()
    };
    assert!(in_db("2") > 0, "the suite's keys are in database 2");
    assert_eq!(in_db("0"), 0, "and none in database 0");
    common::lazy_store_connects(&group.url()).await;
}

/// The primary is SIGKILLed while a guard holds a lease (written, and replicated, before the
/// kill) and a writer acquires fresh names as fast as it can. Measured: how long acquire stays
/// unavailable, whether the guard renews on the promoted replica, and which acknowledged writes
/// the promoted replica lacks (asynchronous replication's window).
/// A Sentinel group, two stores on it (one key prefix) and a lease `name` (ttl 3 s) on the first.
async fn group_with_two_stores(
    name: &str,
) -> (SentinelGroup, RedisStore, RedisStore, Lease<RedisStore>) {
    let group = SentinelGroup::start();
    let prefix = common::test_prefix();
    let (a, b) = (
        connect(&group, &prefix).await,
        connect(&group, &prefix).await,
    );
    let config = LeaseConfig::new(Duration::from_secs(3));
    let lease = Lease::new(a.clone(), LeaseName::new(name).unwrap(), config).unwrap();
    (group, a, b, lease)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn primary_killed_failover_keeps_the_guard_exclusive() {
    let (mut group, store_a, store_b, lease) = group_with_two_stores("failover/guarded").await;
    // Each store's listener subscribes while someone waits: both wait for a release throughout.
    let _waiting_a = store_a.subscribe_releases().unwrap();
    let mut released = store_b.subscribe_releases().unwrap();
    let (name, ttl) = (lease.name().clone(), lease.config().ttl);
    let TryAcquire::Acquired(guard) = lease.try_acquire().await.unwrap() else {
        panic!("free lease not acquired");
    };
    let before = guard.token();

    // The writer: distinct names, one acquisition after another, each acknowledgement timed.
    let writer = {
        let store = store_a.clone();
        tokio::spawn(async move {
            let who = HolderId::new("writer").unwrap();
            let mut acked = Vec::new();
            let started = Instant::now();
            for i in 0.. {
                let n = LeaseName::new(format!("failover/w{i}")).unwrap();
                match store.acquire(&n, &who, Duration::from_secs(60)).await {
                    Ok(Acquisition::Acquired { token }) => acked.push((n, token, Instant::now())),
                    Ok(busy) => panic!("fresh name busy: {busy:?}"),
                    Err(_) => break,
                }
                if started.elapsed() > Duration::from_secs(10) {
                    break;
                }
            }
            acked
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let old_primary = group.primary;
    group.kill_primary();
    let killed = Instant::now();
    let acked = writer.await.unwrap();
    assert!(!acked.is_empty(), "the writer wrote before the kill");

    // A contender asks for the guarded lease until the store answers again.
    let contender = HolderId::new("contender").unwrap();
    let (answer, back_after) =
        common::first_answer_after(killed, &store_b, &name, &contender, ttl).await;
    // The first sentinel asked may learn of the switch a moment after the one that made it.
    let deadline = Instant::now() + Duration::from_secs(10);
    while group.named_primary() == Some(old_primary) {
        assert!(
            Instant::now() < deadline,
            "the sentinels still name the killed primary"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let promoted = group.named_primary().expect("a sentinel names a primary");
    assert_eq!(promoted, group.replica, "the replica was promoted");
    println!("acquire answered again {back_after:?} after the kill: {answer:?}");
    match answer {
        // The guarded lease was replicated long before the kill: the contender sees it held,
        // and the guard, still believing it holds it, is right.
        Acquisition::Busy { holder, .. } => assert_eq!(&holder, lease.holder()),
        Acquisition::Acquired { token } => {
            assert!(
                !guard.is_held(),
                "two holders at once: the contender got {token} while the guard held {before}"
            );
        }
    }

    // The guard renews on the promoted replica: still held two ttls after the kill, and the
    // store shows its tenure with a freshly extended expiry.
    tokio::time::sleep((ttl * 2).saturating_sub(killed.elapsed())).await;
    assert!(
        guard.is_held(),
        "guard renewed on the promoted replica: {:?}",
        guard.loss_reason()
    );
    let state = store_b.inspect(&name).await.unwrap().unwrap();
    assert_eq!(
        (state.holder.as_ref(), state.token),
        (Some(lease.holder()), before)
    );
    assert!(state.remaining > ttl / 2, "renewed: {:?}", state.remaining);

    // Asynchronous replication's window: acknowledged acquisitions the new primary lacks.
    let mut lost = Vec::new();
    for (n, token, at) in &acked {
        if store_b.inspect(n).await.unwrap().is_none() {
            lost.push((n.clone(), *token, killed.duration_since(*at)));
        }
    }
    let window = lost.iter().map(|(_, _, before)| *before).max();
    println!(
        "{} acquisitions acknowledged before the kill, {} lost in the failover{}",
        acked.len(),
        lost.len(),
        window.map_or(String::new(), |w| format!(
            ", acknowledged at most {w:?} before the kill"
        ))
    );
    // Only the last moments before the kill can be lost; what was older had been replicated.
    assert!(
        window.is_none_or(|w| w < Duration::from_secs(1)),
        "writes lost from {window:?} before the kill"
    );
    for (n, token, _) in &lost {
        // A lost acquisition's name is free on the new primary; its next token is compared
        // with the lost one (a lost counter increment can hand out a token again).
        if let Ok(Acquisition::Acquired { token: again }) =
            store_b.acquire(n, &contender, Duration::from_secs(1)).await
        {
            println!("lost {n} with token {token}; reacquired with token {again}");
        }
    }

    // Release notifications come back through the new primary.
    let channel = store_b.release_channel().to_owned();
    let deadline = Instant::now() + Duration::from_secs(15);
    while !cli(promoted, &["PUBSUB", "NUMSUB", &channel]).ends_with("2\n") {
        assert!(
            Instant::now() < deadline,
            "both listeners resubscribed on the new primary"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(guard.release().await.unwrap(), Release::Released);
    tokio::time::timeout(Duration::from_secs(2), released.released(&name))
        .await
        .expect("release heard through the new primary");
    let Acquisition::Acquired { token: after } =
        store_b.acquire(&name, &contender, ttl).await.unwrap()
    else {
        panic!("released lease not acquired");
    };
    assert!(
        after > before,
        "token after failover {after} above {before}"
    );
}

/// Asynchronous replication's window, forced: the replica is frozen and its link closed while a
/// guard acquires, so the acquisition never reaches it; then the primary is SIGKILLed and the replica thawed and
/// promoted. The new primary does not know the lease: a contender acquires it while the guard
/// still believes it holds it, until the guard's next renewal (or its local deadline) tells it
/// otherwise. Measured: that overlap; and the contender's token must be above the guard's although
/// the fencing counter's last increment was lost too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failover_to_a_lagging_replica_overlaps_until_the_guard_hears_of_it() {
    let (mut group, store_a, store_b, lease) = group_with_two_stores("failover/lagging").await;
    let (name, ttl) = (lease.name().clone(), lease.config().ttl);
    // A first tenure, replicated, so the fencing counter exists on the replica.
    let TryAcquire::Acquired(first) = lease.try_acquire().await.unwrap() else {
        panic!("free lease not acquired");
    };
    let first_token = first.token();
    first.release().await.unwrap();
    let fence = store_a.fence_key(&name);
    let deadline = Instant::now() + Duration::from_secs(5);
    while cli(group.replica, &["GET", &fence]).trim() != first_token.to_string() {
        assert!(Instant::now() < deadline, "the counter reached the replica");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // Frozen, the replica cannot reconnect; its link closed by the primary, no write made after
    // this reaches it (what was already in its socket buffer would).
    group.freeze_replica();
    let dropped = cli(group.primary, &["CLIENT", "KILL", "TYPE", "replica"]);
    assert_eq!(dropped.trim(), "1", "the replica's link was closed");
    let TryAcquire::Acquired(guard) = lease.try_acquire().await.unwrap() else {
        panic!("free lease not acquired");
    };
    let held = guard.token();
    group.kill_primary();
    let killed = Instant::now();
    group.thaw_replica();

    let contender = HolderId::new("contender").unwrap();
    let (Acquisition::Acquired { token }, acquired_after) =
        common::first_answer_after(killed, &store_b, &name, &contender, ttl).await
    else {
        panic!("the lagging replica knew the lease");
    };
    let guard_still_held = guard.is_held();
    let reason = tokio::time::timeout(ttl * 2, guard.lost())
        .await
        .expect("the guard learns it lost the lease");
    let lost_after = killed.elapsed();
    let overlap = lost_after.saturating_sub(acquired_after);
    println!(
        "contender acquired {acquired_after:?} after the kill with token {token} (the guard's: \
         {held}, the last replicated: {first_token}); guard held then: {guard_still_held}; guard \
         lost it ({reason:?}) {lost_after:?} after the kill: overlap {overlap:?}"
    );
    // Bounded by the guard's own deadline: a ttl after its last renewal, which preceded the kill.
    assert!(overlap < ttl, "overlap {overlap:?} beyond the ttl");
    // The counter's last increment was lost with the acquisition, but a token is never below
    // the new primary's clock: the contender's token is above the guard's, so a fenced resource
    // rejects the guard's writes once the contender has written.
    assert!(
        token > held,
        "contender's token {token} not above the guard's {held}"
    );
}

/// Sentinels that require a password (`requirepass`): `?sentinel_password=` gets through to them
/// and the store works through them, without it the connect is refused naming the cause, and no
/// output shows the password.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinels_with_a_password() {
    let group = tokio::task::spawn_blocking(|| SentinelGroup::start_with(Some("s3ntinel-Secret")))
        .await
        .unwrap();
    let url = format!("{}?sentinel_password=s3ntinel-Secret", group.url());
    let store = RedisConfig::new(&url)
        .prefix(common::test_prefix())
        .connect()
        .await
        .expect("the sentinels accept the password");
    assert!(!Store::describe(&store).contains("Secret"));
    let (name, who) = (
        LeaseName::new("sentinel-auth").unwrap(),
        HolderId::new("h").unwrap(),
    );
    let Acquisition::Acquired { token } = store
        .acquire(&name, &who, Duration::from_secs(5))
        .await
        .unwrap()
    else {
        panic!("a free lease");
    };
    assert_eq!(
        store.release(&name, &who, token).await.unwrap(),
        Release::Released
    );

    for wrong in [
        group.url(),
        format!("{}?sentinel_password=wrong-Secret", group.url()),
    ] {
        let err = RedisConfig::new(&wrong).connect().await.unwrap_err();
        let shown = format!("{err} {err:?}");
        println!("refused: {err}");
        assert!(!shown.contains("Secret"), "{shown}");
        assert!(
            shown.contains("NOAUTH")
                || shown.contains("WRONGPASS")
                || shown.to_lowercase().contains("auth"),
            "the refusal names authentication: {shown}"
        );
    }
}
