//! Tokens of a name the table has never seen start from the server's clock, so dropping and
//! recreating the tables (an operator "resetting" leases, a restored backup) never hands out a
//! token below one handed out before: a stale holder's fenced write stays refused.

mod common;

use std::time::Duration;

use leasehold::{FencingToken, HolderId, LeaseName, Store, store::Acquisition};
use leasehold_postgres::PgConfig;

fn token(a: Acquisition) -> FencingToken {
    match a {
        Acquisition::Acquired { token } => token,
        other => panic!("expected Acquired, got {other:?}"),
    }
}

#[tokio::test]
async fn recreated_tables_never_hand_out_a_lower_token() {
    let schema = common::fresh_schema();
    let config = || PgConfig::new(common::url()).schema(schema.clone());
    let name = LeaseName::new("reset").unwrap();
    let me = HolderId::new("me").unwrap();
    let ttl = Duration::from_secs(60);

    let store = config().connect().await.unwrap();
    let mut before = token(store.acquire(&name, &me, ttl).await.unwrap());
    for _ in 0..3 {
        let next = token(store.acquire(&name, &me, ttl).await.unwrap());
        assert!(
            next > before,
            "every acquire is a new tenure: {next} after {before}"
        );
        before = next;
    }
    drop(store);
    common::drop_schema(&schema).await;
    tokio::time::sleep(Duration::from_millis(2)).await;

    let store = config().connect().await.unwrap();
    let after = token(store.acquire(&name, &me, ttl).await.unwrap());
    common::drop_schema(&schema).await;
    assert!(after > before, "{after} after {before}");
}
