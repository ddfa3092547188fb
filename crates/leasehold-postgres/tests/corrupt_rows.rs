//! A lease row edited by hand to an expiry leasehold never writes (`infinity`, `-infinity`) is
//! reported as corrupt data naming the lease and its table (issue 31: the server's "cannot
//! subtract infinite timestamps" came back instead, naming neither).

mod common;

use std::time::Duration;

use leasehold::{HolderId, LeaseName, Store, StoreError, store::Acquisition};
use leasehold_postgres::PgConfig;

#[tokio::test]
async fn an_infinite_expiry_is_corrupt_data_naming_the_row() {
    let schema = common::fresh_schema();
    let store = PgConfig::new(common::url())
        .schema(schema.clone())
        .connect()
        .await
        .unwrap();
    let (name, other) = (
        LeaseName::new("forever").unwrap(),
        HolderId::new("other").unwrap(),
    );
    let me = HolderId::new("me").unwrap();
    let ttl = Duration::from_secs(30);
    assert!(matches!(
        store.acquire(&name, &other, ttl).await.unwrap(),
        Acquisition::Acquired { .. }
    ));
    let client = common::raw().await;
    for expiry in ["infinity", "-infinity"] {
        client
            .execute(
                &format!(
                    "UPDATE {schema}.leases SET holder = 'other', expires_at = '{expiry}' \
                     WHERE name = 'forever'"
                ),
                &[],
            )
            .await
            .unwrap();
        let inspected = store.inspect(&name).await;
        let acquired = store.acquire(&name, &me, ttl).await;
        let mut errors = vec![inspected.map(|_| ()).unwrap_err()];
        // `-infinity` has expired for ever: that acquire takes the lease.
        if expiry == "infinity" {
            errors.push(acquired.map(|_| ()).unwrap_err());
        }
        for err in errors {
            assert!(matches!(err, StoreError::Corrupt(_)), "{expiry}: {err:?}");
            let text = err.to_string();
            assert!(
                text.contains("forever") && text.contains(&format!("{schema}.leases")),
                "{expiry}: {text}"
            );
            assert!(text.contains("infinite expires_at"), "{expiry}: {text}");
        }
    }
    common::drop_schema(&schema).await;
}
