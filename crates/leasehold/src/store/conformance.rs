//! The store conformance suite: one set of checks, written once, that every [`Store`](crate::Store) must pass
//! against its real server.
//!
//! A store crate runs it from an integration test with [`conformance_tests!`](crate::conformance_tests):
//!
//! ```text
//! leasehold::conformance_tests!(async { my_store().await });
//! ```
//!
//! The checks here are of the store's own operations; those of a lease guard on the store
//! (`drop_then_reacquire_keeps_the_new_tenure`, `guard_renews_and_hands_over`) are the lease layer's, and [`crate::conformance`] holds both.
//!
//! Every check works on lease names of its own (a random suffix), so the checks can share one
//! server and run in parallel. They use the real clock with short ttls, so a store's own TTL
//! handling is exercised.

// Test support: a failed expectation here is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use crate::store::answers::{Acquisition, Release, Renewal, SlotClaim, TickClaim, TickRequest};
use crate::store::capabilities::Capabilities;
use crate::store::catalog::{CATALOG_RETENTION, Forgetting, Registration, TaskRecord, Versioned};
use crate::store::error::StoreError;
use crate::store::name::{HolderId, LeaseName};
use crate::store::token::FencingToken;
use crate::store::traits::{Catalog, Membership, Purge, Slots};

/// Ttl used by checks that wait for expiry.
pub const SHORT_TTL: Duration = Duration::from_millis(300);
/// Ttl used by checks that must not see expiry.
pub const LONG_TTL: Duration = Duration::from_secs(30);

/// A lease name no other check (or earlier run) uses.
pub fn unique_name(prefix: &str) -> LeaseName {
    LeaseName::new(format!("conf/{prefix}/{:016x}", fastrand::u64(..))).expect("valid name")
}

fn holder(tag: &str) -> HolderId {
    HolderId::new(format!("{tag}-{:08x}", fastrand::u32(..))).expect("valid holder")
}

async fn acquired<S: Slots + Purge + Membership + Catalog>(
    store: &S,
    name: &LeaseName,
    who: &HolderId,
    ttl: Duration,
) -> FencingToken {
    match store
        .acquire(name, who, ttl)
        .await
        .expect("acquire answered")
    {
        Acquisition::Acquired { token } => token,
        busy => panic!("expected {who} to acquire {name}, got {busy:?}"),
    }
}

/// A free lease is acquired; a second holder is told who holds it and for how long.
pub async fn acquire_then_busy<S: Slots + Purge + Membership + Catalog>(store: S) {
    let (name, a, b) = (unique_name("busy"), holder("a"), holder("b"));
    let token = acquired(&store, &name, &a, LONG_TTL).await;
    assert!(token.get() >= 1, "tokens start above zero");
    match store.acquire(&name, &b, LONG_TTL).await.unwrap() {
        Acquisition::Busy { holder, remaining } => {
            assert_eq!(holder, a);
            assert!(
                remaining > LONG_TTL - Duration::from_secs(5) && remaining <= LONG_TTL,
                "{remaining:?}"
            );
        }
        other => panic!("second holder got {other:?}"),
    }
}

/// Re-acquiring by the current holder starts a new tenure: a higher token, and the older
/// tenure's renew and release change nothing (a token names exactly one tenure).
pub async fn reacquire_by_holder_starts_a_new_tenure<S: Slots + Purge + Membership + Catalog>(
    store: S,
) {
    let (name, a) = (unique_name("reacquire"), holder("a"));
    let first = acquired(&store, &name, &a, LONG_TTL).await;
    let second = acquired(&store, &name, &a, LONG_TTL).await;
    assert!(second > first, "re-acquire gave {second} after {first}");
    assert_eq!(
        store.renew(&name, &a, first, LONG_TTL).await.unwrap(),
        Renewal::Lost,
        "the older tenure cannot renew"
    );
    assert_eq!(
        store.release(&name, &a, first).await.unwrap(),
        Release::NotHeld,
        "the older tenure cannot release the newer one"
    );
    let state = store.inspect(&name).await.unwrap().expect("lease exists");
    assert_eq!(state.holder.as_ref(), Some(&a), "{state:?}");
    assert_eq!(state.token, second);
    assert_eq!(
        store.renew(&name, &a, second, LONG_TTL).await.unwrap(),
        Renewal::Renewed
    );
    assert_eq!(
        store.release(&name, &a, second).await.unwrap(),
        Release::Released
    );
}

/// The first token of a name the store has never seen is seeded from the store's clock
/// (ms × 1000), so recreating the store's tables never hands out a lower token than before.
pub async fn new_names_start_tokens_from_the_clock<S: Slots + Purge + Membership + Catalog>(
    store: S,
) {
    let (name, a) = (unique_name("seed"), holder("a"));
    let before = store.now_millis().await.unwrap();
    let token = acquired(&store, &name, &a, LONG_TTL).await;
    // A second of slack for a clock read at a different point of the round trip.
    let floor = before.saturating_sub(1_000) * 1000;
    assert!(
        token.get() > floor,
        "first token {token} is below the store clock's {before} ms × 1000"
    );
}

/// Only the holder with the right token renews; renewal extends the remaining time.
pub async fn renew_only_by_holder_with_token<S: Slots + Purge + Membership + Catalog>(store: S) {
    let (name, a, b) = (unique_name("renew"), holder("a"), holder("b"));
    let token = acquired(&store, &name, &a, SHORT_TTL).await;
    assert_eq!(
        store.renew(&name, &b, token, LONG_TTL).await.unwrap(),
        Renewal::Lost
    );
    assert_eq!(
        store
            .renew(&name, &a, FencingToken(token.get() + 1), LONG_TTL)
            .await
            .unwrap(),
        Renewal::Lost
    );
    assert_eq!(
        store.renew(&name, &a, token, LONG_TTL).await.unwrap(),
        Renewal::Renewed
    );
    let state = store.inspect(&name).await.unwrap().unwrap();
    assert!(
        state.remaining > SHORT_TTL,
        "renewal extended to the new ttl: {state:?}"
    );
    assert_eq!(state.token, token, "renewal keeps the token");
}

/// `renew_many` answers each lease as `renew` would, in order: renewed when `holder` holds it
/// with that token, lost when released, never acquired, held with another token or by another
/// holder; renewed leases are extended.
pub async fn renew_many_answers_each_lease_in_order<S: Slots + Purge + Membership + Catalog>(
    store: S,
) {
    let (a, b) = (holder("a"), holder("b"));
    let names: Vec<LeaseName> = (0..5).map(|i| unique_name(&format!("many{i}"))).collect();
    let t0 = acquired(&store, &names[0], &a, SHORT_TTL).await;
    let t1 = acquired(&store, &names[1], &a, SHORT_TTL).await;
    let t2 = acquired(&store, &names[2], &a, SHORT_TTL).await;
    let t3 = acquired(&store, &names[3], &b, SHORT_TTL).await;
    assert_eq!(
        store.release(&names[1], &a, t1).await.unwrap(),
        Release::Released
    );
    let batch = vec![
        (names[0].clone(), t0),
        (names[1].clone(), t1),
        (names[2].clone(), FencingToken(t2.get() + 1)),
        (names[3].clone(), t3),
        (names[4].clone(), FencingToken(1)),
        (names[2].clone(), t2),
    ];
    let renewals = store.renew_many(&a, &batch, LONG_TTL).await.unwrap();
    use Renewal::{Lost, Renewed};
    assert_eq!(renewals, vec![Renewed, Lost, Lost, Lost, Lost, Renewed]);
    for (name, token) in [(&names[0], t0), (&names[2], t2)] {
        let state = store.inspect(name).await.unwrap().unwrap();
        assert!(state.remaining > SHORT_TTL, "extended: {state:?}");
        assert_eq!(state.token, token);
    }
    let other = store.inspect(&names[3]).await.unwrap().unwrap();
    assert!(
        other.remaining <= SHORT_TTL,
        "b's lease untouched: {other:?}"
    );
    assert!(
        store
            .renew_many(&a, &[], LONG_TTL)
            .await
            .unwrap()
            .is_empty()
    );
}

/// `purge` deletes records free for at least the retention and nothing else; a purged name's
/// next token is still above every earlier one. (Other checks share the server: the retention
/// is longer than any of them keeps a free record it still reads.)
pub async fn purge_removes_only_long_free_records<S: Slots + Purge + Membership + Catalog>(
    store: S,
) {
    const RETENTION: Duration = Duration::from_secs(3);
    let (old, recent, live, a) = (
        unique_name("purge-old"),
        unique_name("purge-recent"),
        unique_name("purge-live"),
        holder("a"),
    );
    let old_token = acquired(&store, &old, &a, SHORT_TTL).await;
    store.release(&old, &a, old_token).await.unwrap();
    let live_token = acquired(&store, &live, &a, LONG_TTL).await;
    tokio::time::sleep(RETENTION + Duration::from_millis(500)).await;
    let recent_token = acquired(&store, &recent, &a, SHORT_TTL).await;
    store.release(&recent, &a, recent_token).await.unwrap();
    match store.purge(RETENTION).await {
        Err(StoreError::Unsupported(_)) => return,
        Ok(n) => assert!(n >= 1, "the old record was purged"),
        Err(e) => panic!("purge failed: {e}"),
    }
    assert!(
        store.inspect(&old).await.unwrap().is_none(),
        "old record gone"
    );
    assert!(
        store.inspect(&recent).await.unwrap().is_some(),
        "recent record kept"
    );
    let state = store.inspect(&live).await.unwrap().unwrap();
    assert_eq!((state.holder, state.token), (Some(a.clone()), live_token));
    let again = acquired(&store, &old, &a, SHORT_TTL).await;
    assert!(again > old_token, "{again} after {old_token}");
}

/// Only the holder with the right token releases; afterwards another holder gets a new token.
pub async fn release_only_by_holder_with_token<S: Slots + Purge + Membership + Catalog>(store: S) {
    let (name, a, b) = (unique_name("release"), holder("a"), holder("b"));
    let token = acquired(&store, &name, &a, LONG_TTL).await;
    assert_eq!(
        store.release(&name, &b, token).await.unwrap(),
        Release::NotHeld
    );
    assert_eq!(
        store
            .release(&name, &a, FencingToken(token.get() + 1))
            .await
            .unwrap(),
        Release::NotHeld
    );
    assert_eq!(
        store.release(&name, &a, token).await.unwrap(),
        Release::Released
    );
    assert_eq!(
        store.release(&name, &a, token).await.unwrap(),
        Release::NotHeld
    );
    assert_eq!(
        store.renew(&name, &a, token, LONG_TTL).await.unwrap(),
        Renewal::Lost
    );
    let next = acquired(&store, &name, &b, LONG_TTL).await;
    assert!(next > token, "{next} must exceed {token}");
}

/// An expired lease goes to the next holder with a higher token; the old holder can neither
/// renew nor release it.
pub async fn expiry_hands_over<S: Slots + Purge + Membership + Catalog>(store: S) {
    let (name, a, b) = (unique_name("expiry"), holder("a"), holder("b"));
    let token = acquired(&store, &name, &a, SHORT_TTL).await;
    tokio::time::sleep(SHORT_TTL + Duration::from_millis(150)).await;
    let state = store.inspect(&name).await.unwrap().unwrap();
    assert_eq!(
        state.holder, None,
        "expired lease shows no holder: {state:?}"
    );
    assert_eq!(state.remaining, Duration::ZERO);
    assert_eq!(state.token, token, "expiry keeps the token");
    let next = acquired(&store, &name, &b, LONG_TTL).await;
    assert!(next > token);
    assert_eq!(
        store.renew(&name, &a, token, LONG_TTL).await.unwrap(),
        Renewal::Lost
    );
    assert_eq!(
        store.release(&name, &a, token).await.unwrap(),
        Release::NotHeld
    );
}

/// An expired lease that nobody took cannot be renewed back to life.
pub async fn renew_after_expiry_is_lost<S: Slots + Purge + Membership + Catalog>(store: S) {
    let (name, a) = (unique_name("late-renew"), holder("a"));
    let token = acquired(&store, &name, &a, SHORT_TTL).await;
    tokio::time::sleep(SHORT_TTL + Duration::from_millis(150)).await;
    assert_eq!(
        store.renew(&name, &a, token, LONG_TTL).await.unwrap(),
        Renewal::Lost
    );
    // Re-acquiring after expiry is a new tenure: a new token.
    let again = acquired(&store, &name, &a, LONG_TTL).await;
    assert!(again > token);
}

/// Tokens strictly increase across releases and expiries, alternating holders.
pub async fn tokens_strictly_increase<S: Slots + Purge + Membership + Catalog>(store: S) {
    let name = unique_name("tokens");
    let holders = [holder("a"), holder("b"), holder("c")];
    let mut last = FencingToken(0);
    for round in 0..12 {
        let who = &holders[round % holders.len()];
        let token = acquired(&store, &name, who, LONG_TTL).await;
        assert!(token > last, "round {round}: {token} after {last}");
        last = token;
        assert_eq!(
            store.release(&name, who, token).await.unwrap(),
            Release::Released
        );
    }
    let who = &holders[0];
    let token = acquired(&store, &name, who, Duration::from_millis(100)).await;
    assert!(token > last);
    tokio::time::sleep(Duration::from_millis(250)).await;
    let after_expiry = acquired(&store, &name, &holders[1], LONG_TTL).await;
    assert!(after_expiry > token);
}

/// Tokens are kept per name: acquiring one name does not move another's counter backwards.
pub async fn tokens_are_per_name<S: Slots + Purge + Membership + Catalog>(store: S) {
    let (x, y, a) = (
        unique_name("per-name-x"),
        unique_name("per-name-y"),
        holder("a"),
    );
    let tx = acquired(&store, &x, &a, LONG_TTL).await;
    store.release(&x, &a, tx).await.unwrap();
    let tx2 = acquired(&store, &x, &a, LONG_TTL).await;
    let _ty = acquired(&store, &y, &a, LONG_TTL).await;
    assert!(tx2 > tx);
    assert_eq!(store.inspect(&x).await.unwrap().unwrap().token, tx2);
}

/// Inspect shows nothing for an unknown name, the holder while held, and keeps the token after
/// release.
pub async fn inspect_reports_state<S: Slots + Purge + Membership + Catalog>(store: S) {
    let (name, a) = (unique_name("inspect"), holder("a"));
    assert_eq!(store.inspect(&name).await.unwrap(), None);
    let token = acquired(&store, &name, &a, LONG_TTL).await;
    let held = store.inspect(&name).await.unwrap().unwrap();
    assert_eq!(held.holder.as_ref(), Some(&a));
    assert_eq!(held.token, token);
    assert!(held.remaining > Duration::ZERO && held.remaining <= LONG_TTL);
    store.release(&name, &a, token).await.unwrap();
    let free = store.inspect(&name).await.unwrap().unwrap();
    assert_eq!(free.holder, None);
    assert_eq!(free.token, token);
    assert_eq!(free.remaining, Duration::ZERO);
}

/// Slot claims only move forward: the first claim of a slot wins, a repeat or an older slot
/// does not, and tasks are independent.
pub async fn slot_claims_move_forward<S: Slots + Purge + Membership + Catalog>(store: S) {
    let (task, other) = (unique_name("slots"), unique_name("slots-other"));
    assert_eq!(
        store.claim_slot(&task, 10).await.unwrap(),
        SlotClaim::Claimed
    );
    assert_eq!(
        store.claim_slot(&task, 10).await.unwrap(),
        SlotClaim::AlreadyRun { last: 10 }
    );
    assert_eq!(
        store.claim_slot(&task, 9).await.unwrap(),
        SlotClaim::AlreadyRun { last: 10 }
    );
    assert_eq!(
        store.claim_slot(&task, 11).await.unwrap(),
        SlotClaim::Claimed
    );
    assert_eq!(
        store.claim_slot(&other, 3).await.unwrap(),
        SlotClaim::Claimed
    );
    assert_eq!(
        store.claim_slot(&task, 1_700_000_000_000).await.unwrap(),
        SlotClaim::Claimed
    );
    assert_eq!(
        store.claim_slot(&task, 1_700_000_000_000).await.unwrap(),
        SlotClaim::AlreadyRun {
            last: 1_700_000_000_000
        }
    );
}

/// Many racers for one free lease: exactly one wins. Many racers for one slot: exactly one claims.
pub async fn concurrent_racers_one_winner<S: Slots + Purge + Membership + Catalog>(store: S) {
    let name = unique_name("race");
    let racers: Vec<_> = (0..16)
        .map(|i| {
            let (store, name) = (store.clone(), name.clone());
            tokio::spawn(async move {
                let who = holder(&format!("r{i}"));
                store.acquire(&name, &who, LONG_TTL).await.unwrap()
            })
        })
        .collect();
    let mut winners = 0;
    for r in racers {
        if matches!(r.await.unwrap(), Acquisition::Acquired { .. }) {
            winners += 1;
        }
    }
    assert_eq!(winners, 1, "exactly one racer acquires");

    let task = unique_name("race-slot");
    let claims: Vec<_> = (0..16)
        .map(|_| {
            let (store, task) = (store.clone(), task.clone());
            tokio::spawn(async move { store.claim_slot(&task, 42).await.unwrap() })
        })
        .collect();
    let mut claimed = 0;
    for c in claims {
        if c.await.unwrap() == SlotClaim::Claimed {
            claimed += 1;
        }
    }
    assert_eq!(claimed, 1, "exactly one racer claims the slot");
}

/// The store's clock is close to wall time and does not go backwards.
pub async fn clock_is_sane<S: Slots + Purge + Membership + Catalog>(store: S) {
    let wall = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    let a = store.now_millis().await.unwrap();
    tokio::time::sleep(Duration::from_millis(20)).await;
    let b = store.now_millis().await.unwrap();
    assert!(a.abs_diff(wall) < 300_000, "store clock {a} vs wall {wall}");
    assert!(b >= a + 10, "store clock advanced: {a} -> {b}");
}

/// Every allowed character and the longest allowed name work as lease names.
pub async fn names_round_trip<S: Slots + Purge + Membership + Catalog>(store: S) {
    let a = holder("a");
    let odd = LeaseName::new(format!("a-b_c.d:e/F9/{:08x}", fastrand::u32(..))).unwrap();
    let long = LeaseName::new(format!("{:016x}{}", fastrand::u64(..), "x".repeat(112))).unwrap();
    for name in [odd, long] {
        let token = acquired(&store, &name, &a, LONG_TTL).await;
        let state = store.inspect(&name).await.unwrap().unwrap();
        assert_eq!(state.holder.as_ref(), Some(&a), "{name}");
        assert_eq!(
            store.release(&name, &a, token).await.unwrap(),
            Release::Released
        );
    }
}

/// Where the store has release notifications, a waiter hears about a release promptly.
pub async fn release_notifies_waiters<S: Slots + Purge + Membership + Catalog>(store: S) {
    let Some(mut sub) = store.subscribe_releases() else {
        return;
    };
    let (name, a) = (unique_name("notify"), holder("a"));
    let token = acquired(&store, &name, &a, LONG_TTL).await;
    // A listener that connects on demand hears releases once it is live.
    tokio::time::timeout(Duration::from_secs(5), sub.live())
        .await
        .expect("release listener live within 5s");
    assert_eq!(
        store.release(&name, &a, token).await.unwrap(),
        Release::Released
    );
    tokio::time::timeout(Duration::from_secs(5), sub.released(&name))
        .await
        .expect("release notification within 5s");
}

/// `last_slot` reads the highest claimed slot; tasks are independent.
pub async fn last_slot_reads_the_highest_claim<S: Slots + Purge + Membership + Catalog>(store: S) {
    let (task, other) = (unique_name("last-slot"), unique_name("last-slot-other"));
    assert_eq!(store.last_slot(&task).await.unwrap(), None);
    store.claim_slot(&task, 1_700_000_000_000).await.unwrap();
    store.claim_slot(&task, 1_600_000_000_000).await.unwrap();
    assert_eq!(
        store.last_slot(&task).await.unwrap(),
        Some(1_700_000_000_000)
    );
    assert_eq!(store.last_slot(&other).await.unwrap(), None);
}

/// History entries are replaced by key, kept newest-first up to the limit, trimmed to `keep`,
/// per task, and come back byte for byte (JSON with quotes, backslashes, non-ASCII, and the
/// size of a record with a full kept output).
pub async fn history_is_bounded_keyed_and_exact<S: Slots + Purge + Membership + Catalog>(store: S) {
    let (task, other) = (unique_name("history"), unique_name("history-other"));
    assert!(store.history(&task, 10).await.unwrap().is_empty());
    let odd = r#"{"error":"exit \"3\" — ünïcode\n"}"#;
    for key in 1..=8u64 {
        let entry = format!("{{\"key\":{key}}}");
        store.record_history(&task, key, &entry, 5).await.unwrap();
    }
    store.record_history(&task, 7, odd, 5).await.unwrap();
    store.record_history(&other, 1, "x", 5).await.unwrap();
    let got = store.history(&task, 10).await.unwrap();
    assert_eq!(
        got,
        vec![
            "{\"key\":8}".to_owned(),
            odd.to_owned(),
            "{\"key\":6}".to_owned(),
            "{\"key\":5}".to_owned(),
            "{\"key\":4}".to_owned(),
        ],
        "newest first, replaced by key, trimmed to 5"
    );
    assert_eq!(store.history(&task, 2).await.unwrap().len(), 2);
    // A key beyond 2^53 keeps its order.
    let big = (1u64 << 53) + 1;
    store.record_history(&task, big, "big", 5).await.unwrap();
    assert_eq!(
        store.history(&task, 1).await.unwrap(),
        vec!["big".to_owned()]
    );
    assert_eq!(
        store.history(&other, 10).await.unwrap(),
        vec!["x".to_owned()]
    );
    // As large as a run record with a full output (`text::OUTPUT`, 64 KiB of what a command
    // printed, control characters escaped six bytes each in its JSON): still byte for byte.
    let output = crate::store::text::OUTPUT;
    let printed = output
        .cut_tail("\u{1b}[31mred\u{1b}[0m \"q\" \\ ünïcode €\r\n\t\0".repeat(output.max / 30));
    let full = format!(
        "{{\"outcome\":\"ok\",\"output\":{}}}",
        serde_json::Value::String(printed)
    );
    assert!(full.len() > output.max * 3 / 2, "{}", full.len());
    store
        .record_history(&task, big + 1, &full, 5)
        .await
        .unwrap();
    assert_eq!(store.history(&task, 1).await.unwrap(), vec![full]);
}

/// `keep` 0 counts as 1 (the rule of `Slots::record_history`): a write never empties a
/// history, and keeps the highest key.
pub async fn history_keep_zero_keeps_one<S: Slots + Purge + Membership + Catalog>(store: S) {
    let task = unique_name("history-keep-zero");
    store.record_history(&task, 5, "five", 3).await.unwrap();
    store.record_history(&task, 7, "seven", 0).await.unwrap();
    assert_eq!(
        store.history(&task, 10).await.unwrap(),
        vec!["seven".to_owned()],
        "keep 0 kept the newest entry only"
    );
    store.record_history(&task, 6, "six", 0).await.unwrap();
    assert_eq!(
        store.history(&task, 10).await.unwrap(),
        vec!["seven".to_owned()],
        "an older key than the one kept is not kept"
    );
}

/// `members` refreshes the caller's entry and answers the live members of that group only,
/// sorted; an entry not refreshed within its ttl drops out, a refreshed one stays, and `leave`
/// removes one at once. (A store without membership answers `Unsupported` and is not checked.)
pub async fn members_expire_refresh_and_leave<S: Slots + Purge + Membership + Catalog>(store: S) {
    let (group, other) = (unique_name("members"), unique_name("members-other"));
    let (a, b, c) = (holder("a"), holder("b"), holder("c"));
    // Long enough that a loaded host's scheduling delays (tens of ms) stay well inside the
    // quarter-ttl margins below.
    let ttl = Duration::from_secs(1);
    let first = match store.members(&group, &a, ttl).await {
        Err(StoreError::Unsupported(_)) => return,
        answer => answer.expect("members answered"),
    };
    assert_eq!(first, vec![a.clone()]);
    store.members(&other, &c, LONG_TTL).await.unwrap();
    let mut both = vec![a.clone(), b.clone()];
    both.sort();
    assert_eq!(store.members(&group, &b, LONG_TTL).await.unwrap(), both);
    // `a` refreshes halfway through its ttl, so it outlives its first expiry.
    tokio::time::sleep(ttl / 2).await;
    assert_eq!(store.members(&group, &a, ttl).await.unwrap(), both);
    tokio::time::sleep(ttl * 3 / 4).await;
    assert_eq!(
        store.members(&group, &b, LONG_TTL).await.unwrap(),
        both,
        "a refreshed entry is still live"
    );
    // Not refreshed for longer than its ttl: gone.
    tokio::time::sleep(ttl + Duration::from_millis(300)).await;
    assert_eq!(
        store.members(&group, &b, LONG_TTL).await.unwrap(),
        vec![b.clone()],
        "an expired entry drops out"
    );
    assert_eq!(
        store.members(&other, &c, LONG_TTL).await.unwrap(),
        vec![c.clone()],
        "groups are independent"
    );
    store.members(&group, &a, LONG_TTL).await.unwrap();
    store.leave(&group, &b).await.unwrap();
    store.leave(&group, &b).await.unwrap();
    assert_eq!(
        store.members(&group, &a, LONG_TTL).await.unwrap(),
        vec![a.clone()],
        "leave removes at once"
    );
    store.leave(&group, &a).await.unwrap();
    store.leave(&other, &c).await.unwrap();
}

/// The tasks of one check, out of every task in the catalog (other checks share the server).
async fn tasks_named<S: Catalog>(
    store: &S,
    names: &[&LeaseName],
    forget: Duration,
) -> Vec<TaskRecord> {
    let all = store.tasks(forget).await.expect("tasks");
    let sorted = all.windows(2).all(|w| w[0].task < w[1].task);
    assert!(sorted, "tasks come sorted by name");
    all.into_iter()
        .filter(|t| names.contains(&&t.task))
        .collect()
}

/// Instances register tasks with a heartbeat: the last definition is kept, expired instances
/// show zero remaining until they are forgotten, leaving removes at once, and a task nobody ran
/// for the retention (and without a control record) drops out.
pub async fn catalog_registers_tasks_with_heartbeats<S: Slots + Purge + Membership + Catalog>(
    store: S,
) {
    if !store.capabilities().contains(Capabilities::CATALOG) {
        return; // checked by capabilities_are_declared_truly
    }
    let (task, other) = (unique_name("cat-task"), unique_name("cat-other"));
    let (a, b) = (holder("a"), holder("b"));
    let forget = Duration::from_millis(900);
    let register = |instance: HolderId, definition: &'static str, ttl: Duration| {
        let (store, task) = (store.clone(), task.clone());
        async move {
            let r = Registration {
                task: &task,
                definition,
                instance: &instance,
                about: "{\"version\":\"test\"}",
                ttl,
                forget_after: forget,
            };
            store.register(&r).await.expect("register")
        }
    };
    assert_eq!(
        register(a.clone(), "{\"v\":1}", LONG_TTL).await,
        None,
        "no control record yet"
    );
    register(b.clone(), "{\"v\":2}", SHORT_TTL).await;
    let listed = tasks_named(&store, &[&task, &other], CATALOG_RETENTION).await;
    assert_eq!(listed.len(), 1, "{listed:?}");
    let t = &listed[0];
    assert_eq!(
        t.definition.as_deref(),
        Some("{\"v\":2}"),
        "the last writer's definition"
    );
    assert_eq!(t.control, None);
    let names: Vec<&HolderId> = t.instances.iter().map(|i| &i.instance).collect();
    let mut expected = vec![&a, &b];
    expected.sort();
    assert_eq!(names, expected, "live instances sorted");
    assert_eq!(t.instances[0].about, "{\"version\":\"test\"}");
    assert!(
        t.instances
            .iter()
            .all(|i| i.remaining > Duration::ZERO && i.remaining <= LONG_TTL)
    );

    // b's heartbeat expires: it is still listed, with nothing remaining, after the live one.
    tokio::time::sleep(SHORT_TTL + Duration::from_millis(200)).await;
    let t = tasks_named(&store, &[&task], CATALOG_RETENTION)
        .await
        .remove(0);
    let seen: Vec<(&HolderId, bool)> = t
        .instances
        .iter()
        .map(|i| (&i.instance, i.remaining.is_zero()))
        .collect();
    assert_eq!(
        seen,
        vec![(&a, false), (&b, true)],
        "expired instances come last"
    );

    // Forgotten once expired for longer than the retention.
    tokio::time::sleep(forget).await;
    register(a.clone(), "{\"v\":3}", SHORT_TTL).await;
    let t = tasks_named(&store, &[&task], forget).await.remove(0);
    let seen: Vec<&HolderId> = t.instances.iter().map(|i| &i.instance).collect();
    assert_eq!(seen, vec![&a], "b forgotten");

    store.unregister(&task, &a).await.expect("unregister");
    store.unregister(&task, &a).await.expect("unregister twice");
    let gone = tasks_named(&store, &[&task], forget).await;
    assert!(gone.iter().all(|t| t.instances.is_empty()), "{gone:?}");
    // Nobody left and no control record: the task drops out.
    let t = tasks_named(&store, &[&task], forget).await;
    assert!(t.is_empty(), "a task nobody runs drops out: {t:?}");
}

/// A task's control record is written by compare-and-set, read with the store's clock in one
/// answer, returned by registration, and keeps a task listed with no instance.
pub async fn control_records_are_compare_and_set<S: Slots + Purge + Membership + Catalog>(
    store: S,
) {
    if !store.capabilities().contains(Capabilities::CATALOG) {
        return; // checked by capabilities_are_declared_truly
    }
    let task = unique_name("cat-control");
    let before = store.now_millis().await.expect("clock");
    let read = store.control(&task).await.expect("control");
    assert_eq!(read.control, None);
    assert!(
        read.now_ms + 5_000 >= before && read.now_ms <= before + 5_000,
        "{read:?} vs {before}"
    );
    assert_eq!(
        store.set_control(&task, None, "one").await.unwrap(),
        Some(1)
    );
    assert_eq!(
        store.set_control(&task, None, "lost race").await.unwrap(),
        None
    );
    assert_eq!(
        store.set_control(&task, Some(2), "stale").await.unwrap(),
        None
    );
    assert_eq!(
        store.set_control(&task, Some(1), "two").await.unwrap(),
        Some(2)
    );
    let read = store.control(&task).await.unwrap();
    let two = Versioned {
        version: 2,
        value: "two".to_owned(),
    };
    assert_eq!(read.control.as_ref(), Some(&two));
    let listed = tasks_named(&store, &[&task], CATALOG_RETENTION).await;
    assert_eq!(
        listed.len(),
        1,
        "a task with only a control record is listed"
    );
    assert_eq!(
        (listed[0].definition.as_ref(), listed[0].control.as_ref()),
        (None, Some(&two))
    );
    let who = holder("a");
    let r = Registration {
        task: &task,
        definition: "{}",
        instance: &who,
        about: "{}",
        ttl: LONG_TTL,
        forget_after: CATALOG_RETENTION,
    };
    assert_eq!(
        store.register(&r).await.unwrap(),
        Some(two),
        "registration answers the control"
    );
    store.unregister(&task, &who).await.unwrap();
}

/// `forget` removes nothing while an instance's heartbeat is live; once none is, it removes the
/// task's definition, instances and control record (its history only when asked), and a task of
/// the same name registered afterwards starts afresh.
pub async fn forget_refuses_live_tasks<S: Slots + Purge + Membership + Catalog>(store: S) {
    if !store.capabilities().contains(Capabilities::CATALOG) {
        return; // checked by capabilities_are_declared_truly
    }
    let (task, a) = (unique_name("cat-forget"), holder("a"));
    let register = || {
        let (store, task, a) = (store.clone(), task.clone(), a.clone());
        async move {
            let r = Registration {
                task: &task,
                definition: "{}",
                instance: &a,
                about: "{}",
                ttl: SHORT_TTL,
                forget_after: CATALOG_RETENTION,
            };
            store.register(&r).await.expect("register")
        }
    };
    assert_eq!(register().await, None);
    assert_eq!(store.set_control(&task, None, "{}").await.unwrap(), Some(1));
    let slots = store.capabilities().contains(Capabilities::SLOTS);
    if slots {
        store.record_history(&task, 1, "one", 10).await.unwrap();
    }
    assert_eq!(
        store.forget(&task, true).await.expect("forget"),
        Forgetting::Live { instances: 1 }
    );
    let listed = tasks_named(&store, &[&task], CATALOG_RETENTION).await;
    assert_eq!(listed.len(), 1, "a refused forget removes nothing");
    assert!(listed[0].control.is_some() && listed[0].definition.is_some());
    if slots {
        assert_eq!(store.history(&task, 10).await.unwrap(), ["one"]);
    }

    tokio::time::sleep(SHORT_TTL + Duration::from_millis(300)).await;
    assert_eq!(
        store.forget(&task, false).await.unwrap(),
        Forgetting::Forgotten
    );
    let listed = tasks_named(&store, &[&task], CATALOG_RETENTION).await;
    assert!(listed.is_empty(), "forgotten: {listed:?}");
    assert_eq!(store.control(&task).await.unwrap().control, None);
    if slots {
        assert_eq!(store.history(&task, 10).await.unwrap(), ["one"], "kept");
    }
    assert_eq!(
        store.forget(&task, true).await.unwrap(),
        Forgetting::Unknown
    );
    if slots {
        assert!(
            store.history(&task, 10).await.unwrap().is_empty(),
            "removed"
        );
    }

    assert_eq!(
        register().await,
        None,
        "registered afresh, with no control record"
    );
    let listed = tasks_named(&store, &[&task], CATALOG_RETENTION).await;
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].instances.len(), 1);
    store.unregister(&task, &a).await.unwrap();
    assert_eq!(
        store.forget(&task, true).await.unwrap(),
        Forgetting::Forgotten
    );
}

/// Every lease record is listed, held or free, with what `inspect` would say.
pub async fn leases_lists_every_record<S: Slots + Purge + Membership + Catalog>(store: S) {
    if !store.capabilities().contains(Capabilities::CATALOG) {
        return; // checked by capabilities_are_declared_truly
    }
    let (held, free, who) = (
        unique_name("list-held"),
        unique_name("list-free"),
        holder("a"),
    );
    let held_token = acquired(&store, &held, &who, LONG_TTL).await;
    let free_token = acquired(&store, &free, &who, LONG_TTL).await;
    store.release(&free, &who, free_token).await.unwrap();
    let all = store.leases(1_000_000).await.expect("leases");
    assert!(
        all.windows(2).all(|w| w[0].name < w[1].name),
        "sorted by name"
    );
    let find = |name: &LeaseName| {
        all.iter()
            .find(|l| &l.name == name)
            .map(|l| l.state.clone())
    };
    let held_state = find(&held).expect("the held lease is listed");
    assert_eq!(
        (held_state.holder, held_state.token),
        (Some(who.clone()), held_token)
    );
    let free_state = find(&free).expect("the free lease is listed");
    assert_eq!((free_state.holder, free_state.token), (None, free_token));
    assert!(store.leases(1).await.unwrap().len() <= 1, "the limit holds");
    store.release(&held, &who, held_token).await.unwrap();
}

/// A tick claims its slot once, only while the store's clock is in it, with a new tenure of
/// the task lease; a busy lease, an older slot and (where the store reads the control record
/// itself) a pause write nothing.
pub async fn tick_claims_within_its_slot<S: Slots + Purge + Membership + Catalog>(store: S) {
    if !store.capabilities().contains(Capabilities::SLOTS) {
        return; // checked by capabilities_are_declared_truly
    }
    let (task, a, b) = (unique_name("tick"), holder("tick-a"), holder("tick-b"));
    let now = store.now_millis().await.unwrap();
    let slot = now - 60_000;
    let tick = |who: &HolderId, slot: u64, next: Option<u64>| {
        let (store, task, who) = (store.clone(), task.clone(), who.clone());
        async move {
            let request = TickRequest::new(&task, &who, LONG_TTL, slot, next);
            store.tick(&request).await.unwrap()
        }
    };

    // Not yet due, and past its next slot: nothing written.
    let early = tick(&a, now + 3_600_000, None).await;
    assert_eq!(early.claim, TickClaim::OutsideSlot);
    assert!(early.now_ms >= now, "{} < {now}", early.now_ms);
    let stale = tick(&a, slot, Some(slot + 1)).await;
    assert_eq!(stale.claim, TickClaim::OutsideSlot);
    assert_eq!(store.last_slot(&task).await.unwrap(), None);
    assert_eq!(
        store.inspect(&task).await.unwrap().and_then(|s| s.holder),
        None
    );

    let TickClaim::Claimed { token } = tick(&a, slot, None).await.claim else {
        panic!("the first tick of a slot claims it");
    };
    let state = store.inspect(&task).await.unwrap().unwrap();
    assert_eq!((state.holder, state.token), (Some(a.clone()), token));
    assert_eq!(store.last_slot(&task).await.unwrap(), Some(slot));

    // Busy while the run holds the lease, already run once it let go.
    match tick(&b, slot, None).await.claim {
        TickClaim::Busy { holder, last, .. } => assert_eq!((holder, last), (a.clone(), Some(slot))),
        other => panic!("a tick while the lease is held answered {other:?}"),
    }
    assert_eq!(
        store.release(&task, &a, token).await.unwrap(),
        Release::Released
    );
    assert_eq!(
        tick(&b, slot, None).await.claim,
        TickClaim::AlreadyRun { last: slot }
    );
    assert_eq!(
        store.inspect(&task).await.unwrap().and_then(|s| s.holder),
        None
    );

    // The next slot: a new tenure with a higher token.
    let TickClaim::Claimed { token: next } = tick(&b, slot + 1, Some(now + 3_600_000)).await.claim
    else {
        panic!("the next slot is claimed");
    };
    assert!(next > token, "{next:?} after {token:?}");
    assert_eq!(store.last_slot(&task).await.unwrap(), Some(slot + 1));
    store.release(&task, &b, next).await.unwrap();

    if store.capabilities().contains(Capabilities::TICK) {
        let pause = crate::store::catalog::Control {
            paused: Some(crate::store::catalog::Pause {
                by: "conformance".to_owned(),
                reason: None,
                at_ms: now,
            }),
            trigger: None,
        };
        let version = store
            .set_control(&task, None, &pause.to_json())
            .await
            .unwrap()
            .unwrap();
        let paused = tick(&a, slot + 2, None).await;
        assert_eq!(paused.claim, TickClaim::Paused);
        assert_eq!(paused.control.map(|c| c.version), Some(version));
        assert_eq!(store.last_slot(&task).await.unwrap(), Some(slot + 1));
        assert_eq!(
            store.inspect(&task).await.unwrap().and_then(|s| s.holder),
            None
        );
        let resumed = crate::store::catalog::Control::default().to_json();
        store
            .set_control(&task, Some(version), &resumed)
            .await
            .unwrap();
        assert!(matches!(
            tick(&a, slot + 2, None).await.claim,
            TickClaim::Claimed { .. }
        ));
    }
}

/// A store's declared capabilities and its answers agree, operation by operation: every
/// operation of a capability it declares answers (against a fresh task, group and instance of
/// this check's own), and every operation of one it does not declare answers
/// [`StoreError::Unsupported`] and writes nothing. (That a declared
/// [`TICK`](Capabilities::TICK) reads the control record is checked by
/// `tick_claims_within_its_slot`.)
pub async fn capabilities_are_declared_truly<S: Slots + Purge + Membership + Catalog>(store: S) {
    let caps = store.capabilities();
    let (task, group, who) = (
        unique_name("caps"),
        unique_name("caps-group"),
        holder("caps"),
    );
    let now = store.now_millis().await.unwrap();
    // Outside its slot: a tick that answers writes nothing.
    let tick = TickRequest::new(&task, &who, LONG_TTL, now + 3_600_000, None);
    let registration = Registration {
        task: &task,
        definition: "{}",
        instance: &who,
        about: "{}",
        ttl: LONG_TTL,
        forget_after: LONG_TTL,
    };
    let answers: [(Capabilities, &str, Result<(), StoreError>); 16] = [
        (
            Capabilities::SLOTS,
            "claim_slot",
            store.claim_slot(&task, 1).await.map(drop),
        ),
        (
            Capabilities::SLOTS,
            "last_slot",
            store.last_slot(&task).await.map(drop),
        ),
        (
            Capabilities::SLOTS,
            "record_history",
            store.record_history(&task, 1, "{}", 1).await,
        ),
        (
            Capabilities::SLOTS,
            "history",
            store.history(&task, 1).await.map(drop),
        ),
        (
            Capabilities::SLOTS,
            "tick",
            store.tick(&tick).await.map(drop),
        ),
        (
            Capabilities::PURGE,
            "purge",
            store.purge(LONG_TTL).await.map(drop),
        ),
        (
            Capabilities::MEMBERSHIP,
            "members",
            store.members(&group, &who, LONG_TTL).await.map(drop),
        ),
        (
            Capabilities::MEMBERSHIP,
            "leave",
            store.leave(&group, &who).await,
        ),
        (
            Capabilities::CATALOG,
            "register",
            store.register(&registration).await.map(drop),
        ),
        (
            Capabilities::CATALOG,
            "unregister",
            store.unregister(&task, &who).await,
        ),
        (
            Capabilities::CATALOG,
            "tasks",
            store.tasks(LONG_TTL).await.map(drop),
        ),
        (
            Capabilities::CATALOG,
            "control",
            store.control(&task).await.map(drop),
        ),
        (
            Capabilities::CATALOG,
            "set_control",
            store.set_control(&task, None, "{}").await.map(drop),
        ),
        (
            Capabilities::CATALOG,
            "leases",
            store.leases(1).await.map(drop),
        ),
        (
            Capabilities::CATALOG,
            "forget",
            store.forget(&task, false).await.map(drop),
        ),
        // Last: the lease a declared tick may not have taken, and nothing an undeclared
        // capability's operation may have left.
        (
            Capabilities::NONE,
            "inspect",
            match store.inspect(&task).await {
                Ok(Some(state)) => Err(StoreError::Corrupt(format!(
                    "{task} was written: {state:?}"
                ))),
                other => other.map(drop),
            },
        ),
    ];
    let described = store.describe();
    for (cap, op, answer) in answers {
        match (caps.contains(cap), &answer) {
            (true, Ok(())) | (false, Err(StoreError::Unsupported(_))) => {}
            (declared, _) => panic!(
                "{described} declares {caps}; {op} ({}) answered {answer:?}",
                match declared {
                    true => format!("{cap}: declared"),
                    false => format!("{cap}: not declared"),
                }
            ),
        }
    }
}

/// `for_each_conformance_check!([path::to::callback] (args))` calls
/// `path::to::callback!(args; check, check, ...)` with the name of every conformance check: the
/// one list the test macro below (and `leasehold-testkit`) expand.
#[doc(hidden)]
#[macro_export]
macro_rules! for_each_conformance_check {
    ([$($callback:tt)*] ($($args:tt)*)) => {
        $($callback)*! {$($args)*;
            acquire_then_busy, reacquire_by_holder_starts_a_new_tenure,
            new_names_start_tokens_from_the_clock, drop_then_reacquire_keeps_the_new_tenure,
            renew_only_by_holder_with_token, renew_many_answers_each_lease_in_order,
            purge_removes_only_long_free_records, release_only_by_holder_with_token,
            expiry_hands_over, renew_after_expiry_is_lost, tokens_strictly_increase,
            tokens_are_per_name, inspect_reports_state, slot_claims_move_forward,
            concurrent_racers_one_winner, clock_is_sane, names_round_trip,
            release_notifies_waiters, guard_renews_and_hands_over,
            last_slot_reads_the_highest_claim, history_is_bounded_keyed_and_exact,
            history_keep_zero_keeps_one, members_expire_refresh_and_leave,
            catalog_registers_tasks_with_heartbeats,
            control_records_are_compare_and_set, forget_refuses_live_tasks,
            leases_lists_every_record,
            tick_claims_within_its_slot, capabilities_are_declared_truly}
    };
}

/// Generates one `#[tokio::test]` per conformance check. `$make` is an expression evaluating to
/// a future that yields a fresh store handle (it is evaluated once per test).
#[macro_export]
macro_rules! conformance_tests {
    ($make:expr) => {
        $crate::for_each_conformance_check!([$crate::__leasehold_conformance_test]($make));
    };
}

/// One test per check, for [`conformance_tests!`].
#[doc(hidden)]
#[macro_export]
macro_rules! __leasehold_conformance_test {
    ($make:expr; $($check:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $check() {
                let store = $make.await;
                $crate::conformance::$check(store).await;
            }
        )*
    };
}
