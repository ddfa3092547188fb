//! The grants the README lists are enough: a role with USAGE on the schema and row privileges on
//! the tables (no CREATE anywhere) runs every operation of every capability, the release
//! listener and the fence, with the migration left on. Without the tables it gets a typed
//! migration error.

mod common;

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use leasehold::catalog::{CATALOG_RETENTION, Registration};
use leasehold::{
    Capabilities, Catalog, FencingToken, HolderId, Lease, LeaseConfig, LeaseName, Membership,
    Purge, Release, Slots, Store,
    store::{Acquisition, Renewal, SlotClaim},
};
use leasehold_postgres::tokio_postgres::{self, NoTls};
use leasehold_postgres::{Error, Fence, PgConfig};

const ROLE_PREFIX: &str = "lh_test_role_";
const PASSWORD: &str = "lh-test-role-pw";

fn unix_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// The test server's URL with `role` (and its password) as the user.
fn url_as(role: &str) -> String {
    let url = common::url();
    let rest = url
        .strip_prefix("postgres://")
        .or_else(|| url.strip_prefix("postgresql://"))
        .expect("LEASEHOLD_TEST_POSTGRES_URL is a postgres:// URL");
    let host = rest.split_once('@').map_or(rest, |(_, host)| host);
    format!("postgres://{role}:{PASSWORD}@{host}")
}

/// Drops test roles older than an hour (from runs that did not clean up).
async fn drop_stale_roles(admin: &tokio_postgres::Client) {
    let rows = admin
        .query(
            "SELECT rolname FROM pg_roles WHERE rolname LIKE 'lh\\_test\\_role\\_%'",
            &[],
        )
        .await
        .unwrap();
    for row in rows {
        let role: String = row.get(0);
        let stamp = role
            .strip_prefix(ROLE_PREFIX)
            .and_then(|s| s.split('_').next())
            .and_then(|s| s.parse::<u64>().ok());
        if stamp.is_some_and(|t| t < unix_secs().saturating_sub(3600)) {
            let _ = admin
                .batch_execute(&format!("DROP OWNED BY \"{role}\"; DROP ROLE \"{role}\""))
                .await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn least_privileged_role_runs_everything_with_migration_on() {
    let admin = common::raw().await;
    drop_stale_roles(&admin).await;
    let role = format!("{ROLE_PREFIX}{}_{:08x}", unix_secs(), fastrand::u32(..));
    let schema = common::fresh_schema();

    // The administrator creates the tables and grants the role what the README lists.
    let owner_store = PgConfig::new(common::url())
        .schema(&schema)
        .notifications(false)
        .connect()
        .await
        .unwrap();
    let fence = Fence::new(&schema, "fences").unwrap();
    fence.migrate(&mut common::raw().await).await.unwrap();
    drop(owner_store);
    admin
        .batch_execute(&format!(
            "CREATE ROLE \"{role}\" LOGIN PASSWORD '{PASSWORD}';
             GRANT USAGE ON SCHEMA \"{schema}\" TO \"{role}\";
             GRANT SELECT, INSERT, UPDATE ON \"{schema}\".slots, \"{schema}\".fences
                   TO \"{role}\";
             GRANT SELECT, INSERT, UPDATE, DELETE ON \"{schema}\".leases,
                   \"{schema}\".history, \"{schema}\".members, \"{schema}\".tasks,
                   \"{schema}\".task_instances TO \"{role}\";
             GRANT SELECT ON \"{schema}\".meta TO \"{role}\";"
        ))
        .await
        .unwrap();

    let body = tokio::spawn({
        let (role, schema) = (role.clone(), schema.clone());
        async move { exercise(&role, &schema).await }
    })
    .await;

    common::drop_schema(&schema).await;
    admin
        .batch_execute(&format!("DROP OWNED BY \"{role}\"; DROP ROLE \"{role}\""))
        .await
        .unwrap();
    if let Err(e) = body {
        std::panic::resume_unwind(e.into_panic());
    }
}

async fn exercise(role: &str, schema: &str) {
    let url = url_as(role);
    // The role cannot create anything: a store on a schema that does not exist yet fails with
    // a typed, one-line migration error.
    let missing = format!("{schema}_missing");
    let err = PgConfig::new(&url)
        .schema(&missing)
        .connect()
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Migrate { .. }), "{err:?}");
    assert!(!err.is_transient(), "{err:?}");
    // As the command prints it: the error, then its cause.
    let message = format!("{err}: {}", std::error::Error::source(&err).unwrap());
    assert!(
        !message.contains('\n') && !message.contains(PASSWORD),
        "{message}"
    );
    assert!(message.contains("permission denied"), "{message}");
    // Nor tables in the schema it may use.
    let err = PgConfig::new(&url)
        .schema(schema)
        .lease_table("other_leases")
        .connect()
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Migrate { .. }), "{err:?}");

    // The tables exist: the migration creates nothing and connect succeeds.
    let store = PgConfig::new(&url).schema(schema).connect().await.unwrap();
    let name = LeaseName::new("least-privilege").unwrap();
    let a = HolderId::new("a").unwrap();
    let ttl = Duration::from_secs(5);
    let token = match store.acquire(&name, &a, ttl).await.unwrap() {
        Acquisition::Acquired { token } => token,
        busy => panic!("{busy:?}"),
    };
    assert_eq!(
        store.renew(&name, &a, token, ttl).await.unwrap(),
        Renewal::Renewed
    );
    assert_eq!(store.inspect(&name).await.unwrap().unwrap().token, token);
    assert_eq!(
        store.claim_slot(&name, 7).await.unwrap(),
        SlotClaim::Claimed
    );
    assert!(store.now_millis().await.unwrap() > 0);
    assert_eq!(store.capabilities(), Capabilities::ALL);
    store
        .record_history(&name, 7, "{}", 1)
        .await
        .expect("record_history");
    store.history(&name, 1).await.expect("history");
    store.purge(ttl).await.expect("purge");
    store.members(&name, &a, ttl).await.expect("members");
    store.leave(&name, &a).await.expect("leave");
    let registration = Registration {
        task: &name,
        definition: "{}",
        instance: &a,
        about: "{}",
        ttl,
        forget_after: CATALOG_RETENTION,
    };
    store.register(&registration).await.expect("register");
    assert_eq!(
        store
            .set_control(&name, None, "{}")
            .await
            .expect("create control"),
        Some(1)
    );
    assert_eq!(
        store
            .set_control(&name, Some(1), "{}")
            .await
            .expect("update control"),
        Some(2)
    );
    store.control(&name).await.expect("control");
    assert_eq!(
        store.tasks(CATALOG_RETENTION).await.expect("tasks").len(),
        1
    );
    store
        .tasks(Duration::ZERO)
        .await
        .expect("tasks, forgetting");
    store.unregister(&name, &a).await.expect("unregister");
    assert_eq!(store.leases(10).await.expect("leases").len(), 1);

    // LISTEN and pg_notify need no grant: a waiter wakes on the release.
    let waiter = Lease::new(store.clone(), name.clone(), LeaseConfig::new(ttl)).unwrap();
    let waiting = tokio::spawn(async move {
        let guard = waiter.acquire().await.unwrap();
        let at = Instant::now();
        guard.release().await.unwrap();
        at
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let released = Instant::now();
    assert_eq!(
        store.release(&name, &a, token).await.unwrap(),
        Release::Released
    );
    let woke = tokio::time::timeout(ttl, waiting).await.unwrap().unwrap();
    assert!(
        woke.saturating_duration_since(released) < Duration::from_millis(1500),
        "woke {:?} after the release",
        woke.saturating_duration_since(released)
    );

    // The fence: the migration is a no-op, the check needs SELECT, INSERT, UPDATE.
    let (mut client, connection) = tokio_postgres::connect(&url, NoTls).await.unwrap();
    tokio::spawn(connection);
    let fence = Fence::new(schema, "fences").unwrap();
    fence.migrate(&mut client).await.unwrap();
    let tx = client.transaction().await.unwrap();
    fence
        .check(&tx, "least-privilege", FencingToken(3))
        .await
        .unwrap();
    tx.commit().await.unwrap();
    fence
        .check(&client, "least-privilege", FencingToken(3))
        .await
        .unwrap();
}
