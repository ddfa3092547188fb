//! Opening the store the harness watches (directly, not through the fault proxy).

use leasehold::BoxStore;

pub(crate) async fn open_store(url: &str) -> anyhow::Result<BoxStore> {
    Ok(leasehold_connect::open_store(url).await?)
}
