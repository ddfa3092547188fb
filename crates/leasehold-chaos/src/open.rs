//! Opening the store the harness watches (directly, not through the fault proxy).
//!
//! Until `leasehold-connect` is in the workspace this opens `redis://` URLs only; with it, the
//! body becomes `leasehold_connect::open_store(url).await.map_err(anyhow::Error::from)` (and the
//! Cargo.toml line `leasehold-redis` becomes `leasehold-connect = { workspace = true }`).

use leasehold::BoxStore;

pub(crate) async fn open_store(url: &str) -> anyhow::Result<BoxStore> {
    if url.starts_with("redis://") {
        let store = leasehold_redis::connect(url).await?;
        return Ok(BoxStore::new(store));
    }
    anyhow::bail!(
        "this build of leasehold-chaos opens only redis:// stores to watch the lease \
         (it needs leasehold-connect for {})",
        leasehold::store::redact_url(url)
    )
}
