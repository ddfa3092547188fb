//! The core's store conformance suite against a 3-member etcd cluster on loopback, started by the
//! test process itself.

mod common;

leasehold::conformance_tests!(async { common::make_store().await });

/// `renew_many` over more leases than one transaction may hold (etcd's `--max-txn-ops` is 128):
/// the chunks are accepted, each lease answers for itself across chunk boundaries, and a lease
/// repeated in the batch is renewed again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renew_many_spans_transactions() {
    use leasehold::store::Renewal;
    use leasehold::{FencingToken, HolderId, LeaseName, Store, store::Acquisition};
    use std::time::Duration;

    let store = common::make_store().await;
    let holder = HolderId::new("a").unwrap();
    let ttl = Duration::from_secs(30);
    let mut batch = Vec::new();
    for i in 0..250 {
        let name = LeaseName::new(format!("span{i}")).unwrap();
        let Acquisition::Acquired { token } = store.acquire(&name, &holder, ttl).await.unwrap()
        else {
            panic!("span{i} is free");
        };
        batch.push((name, token));
    }
    batch[150].1 = FencingToken(batch[150].1.get() + 1);
    batch.push(batch[0].clone());
    let renewals = store.renew_many(&holder, &batch, ttl).await.unwrap();
    let mut expected = vec![Renewal::Renewed; batch.len()];
    expected[150] = Renewal::Lost;
    assert_eq!(renewals, expected);
}
