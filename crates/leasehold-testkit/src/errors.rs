//! Errors as a user meets them: the one line the `leasehold` command prints, everything a
//! password could hide in, and a store that a too-old release must refuse.

use std::time::Duration;

use leasehold::{HolderId, LeaseName, Store};

/// The error and its causes on one line, as the `leasehold` command prints it: each cause
/// whose text is not already in the line, after `: `.
pub fn one_line(e: &dyn std::error::Error) -> String {
    let mut line = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let text = c.to_string();
        if !line.contains(&text) {
            line.push_str(&format!(": {text}"));
        }
        cause = c.source();
    }
    line
}

/// Display, Debug and every source of `e`, joined: where a test looks for what must not be
/// shown (a password).
pub fn everything_about(e: &dyn std::error::Error) -> String {
    let mut out = format!("{e} | {e:?}");
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(&format!(" | {s} | {s:?}"));
        source = s.source();
    }
    out
}

/// Panics unless `store` (opened lazily on data a newer release wrote) refuses an acquire and
/// an inspect for good, saying to upgrade to `required`.
pub async fn refuses_as_too_old(store: &impl Store, required: &str) {
    let (name, who) = (
        LeaseName::new("job").expect("a lease name"),
        HolderId::new("old").expect("a holder id"),
    );
    let acquired = store.acquire(&name, &who, Duration::from_secs(5)).await;
    let inspected = store.inspect(&name).await.map(|_| ());
    for refused in [acquired.map(|_| ()), inspected] {
        let refused = refused.expect_err("refused");
        assert!(!refused.is_transient(), "{refused:?}");
        assert!(
            refused
                .to_string()
                .contains(&format!("upgrade leasehold to at least {required}")),
            "{refused}"
        );
    }
}
