//! The resource side of fencing: [`Fence::check`] in the writer's own transaction rejects a
//! holder whose lease was taken over, even when its write arrives late.

mod common;

use std::time::Duration;

use leasehold::{
    FencingToken, HolderId, LeaseName, Store,
    store::{Acquisition, Renewal},
};
use leasehold_postgres::tokio_postgres::Client;
use leasehold_postgres::{Error, Fence, FenceError, PgSetupError};
use tokio::sync::OnceCell;

/// The fence on this binary's schema, its table created, plus a resource table to write to.
async fn fence() -> &'static Fence {
    static FENCE: OnceCell<Fence> = OnceCell::const_new();
    FENCE
        .get_or_init(|| async {
            let fence = Fence::new(common::schema(), "fences").unwrap();
            let mut client = common::raw().await;
            fence.migrate(&mut client).await.unwrap();
            client
                .batch_execute(&format!(
                    "CREATE TABLE IF NOT EXISTS \"{0}\".accounts (id text PRIMARY KEY, owner text NOT NULL);
                     CREATE TABLE IF NOT EXISTS \"{0}\".writes (seq bigserial PRIMARY KEY, resource text NOT NULL, token bigint NOT NULL);",
                    common::schema()
                ))
                .await
                .unwrap();
            fence
        })
        .await
}

fn resource(tag: &str) -> String {
    format!("{tag}-{:08x}", fastrand::u32(..))
}

fn holder(tag: &str) -> HolderId {
    HolderId::new(format!("{tag}-{:08x}", fastrand::u32(..))).unwrap()
}

/// In one transaction: the fence check for `token`, then set the account's owner. Commits if
/// the check passes, rolls back otherwise.
async fn fenced_write(
    client: &mut Client,
    fence: &Fence,
    account: &str,
    owner: &str,
    token: FencingToken,
) -> Result<(), FenceError> {
    let tx = client.transaction().await?;
    fence.check(&tx, account, token).await?;
    tx.execute(
        &format!(
            "INSERT INTO \"{}\".accounts (id, owner) VALUES ($1, $2)
             ON CONFLICT (id) DO UPDATE SET owner = EXCLUDED.owner",
            common::schema()
        ),
        &[&account, &owner],
    )
    .await?;
    tx.commit().await?;
    Ok(())
}

async fn owner_of(client: &Client, account: &str) -> Option<String> {
    client
        .query_opt(
            &format!(
                "SELECT owner FROM \"{}\".accounts WHERE id = $1",
                common::schema()
            ),
            &[&account],
        )
        .await
        .unwrap()
        .map(|row| row.get(0))
}

async fn max_token(client: &Client, fence: &Fence, resource: &str) -> Option<i64> {
    client
        .query_opt(
            &format!(
                "SELECT max_token FROM \"{}\".\"{}\" WHERE resource = $1",
                fence.schema(),
                fence.table()
            ),
            &[&resource],
        )
        .await
        .unwrap()
        .map(|row| row.get(0))
}

fn acquired(a: Acquisition) -> FencingToken {
    match a {
        Acquisition::Acquired { token } => token,
        other => panic!("expected Acquired, got {other:?}"),
    }
}

/// A takes token t and stops renewing (a pause); B acquires t+1 after A's ttl and writes; A's
/// late write — with the write run *before* the check, in the same transaction — is refused and
/// rolled back, and the resource keeps B's value.
#[tokio::test]
async fn paused_holder_write_is_rejected_after_takeover() {
    let fence = fence().await;
    let store = common::store().await;
    let name = LeaseName::new(resource("fenced-job")).unwrap();
    let account = resource("account");
    let (a, b) = (holder("a"), holder("b"));
    let ttl = Duration::from_millis(800);
    let mut ca = common::raw().await;
    let mut cb = common::raw().await;

    let t = acquired(store.acquire(&name, &a, ttl).await.unwrap());
    fenced_write(&mut ca, fence, &account, "a", t)
        .await
        .unwrap();

    // A pauses past its ttl; B takes over.
    tokio::time::sleep(ttl + Duration::from_millis(300)).await;
    let t_b = acquired(store.acquire(&name, &b, ttl).await.unwrap());
    assert_eq!(t_b.get(), t.get() + 1);
    fenced_write(&mut cb, fence, &account, "b", t_b)
        .await
        .unwrap();

    // A resumes and writes, not knowing it lost the lease.
    let tx = ca.transaction().await.unwrap();
    tx.execute(
        &format!(
            "UPDATE \"{}\".accounts SET owner = 'a-late' WHERE id = $1",
            common::schema()
        ),
        &[&account],
    )
    .await
    .unwrap();
    match fence.check(&tx, &account, t).await {
        Err(FenceError::Stale {
            resource,
            token,
            current,
        }) => {
            assert_eq!(resource, account);
            assert_eq!(token, t);
            assert_eq!(current, t_b);
        }
        other => panic!("late write not fenced: {other:?}"),
    }
    tx.rollback().await.unwrap();
    assert_eq!(owner_of(&cb, &account).await.as_deref(), Some("b"));
    assert_eq!(
        max_token(&cb, fence, &account).await,
        Some(t_b.get() as i64)
    );

    // The error reads as one line and names the resource.
    let err = fenced_write(&mut ca, fence, &account, "a-again", t)
        .await
        .unwrap_err();
    let message = err.to_string();
    assert!(
        !message.contains('\n') && message.contains(&account),
        "{message}"
    );

    // And the store agrees that A's tenure is over.
    assert_eq!(store.renew(&name, &a, t, ttl).await.unwrap(), Renewal::Lost);
}

#[tokio::test]
async fn equal_token_passes_again_and_again() {
    let fence = fence().await;
    let account = resource("equal");
    let mut client = common::raw().await;
    for owner in ["first", "second", "third"] {
        fenced_write(&mut client, fence, &account, owner, FencingToken(7))
            .await
            .unwrap();
    }
    assert_eq!(owner_of(&client, &account).await.as_deref(), Some("third"));
    assert_eq!(max_token(&client, fence, &account).await, Some(7));
    // Higher moves the fence, lower is refused after that.
    fenced_write(&mut client, fence, &account, "eighth", FencingToken(8))
        .await
        .unwrap();
    assert!(matches!(
        fenced_write(&mut client, fence, &account, "seventh", FencingToken(7)).await,
        Err(FenceError::Stale {
            current: FencingToken(8),
            ..
        })
    ));
}

/// Writer 1 checks token 10 and holds its transaction open; writer 2 with token 9 waits for it,
/// then fails. With the tokens the other way round the higher one waits and then passes; and a
/// rolled-back higher token fences nobody out.
#[tokio::test]
async fn concurrent_writers_with_different_tokens_serialize() {
    let fence = fence().await;
    for (first, second, commit_first, second_passes) in [
        (10, 9, true, false),
        (9, 10, true, true),
        (10, 9, false, true),
    ] {
        let account = resource("concurrent");
        let mut c1 = common::raw().await;
        let mut c2 = common::raw().await;
        let tx1 = c1.transaction().await.unwrap();
        fence
            .check(&tx1, &account, FencingToken(first))
            .await
            .unwrap();

        let account2 = account.clone();
        let mut second_write = tokio::spawn(async move {
            fenced_write(&mut c2, fence, &account2, "second", FencingToken(second)).await
        });
        // The second writer is blocked on the first one's fence row.
        let early = tokio::time::timeout(Duration::from_millis(400), &mut second_write).await;
        assert!(early.is_err(), "second writer did not wait: {early:?}");
        tx1.execute(
            &format!(
                "INSERT INTO \"{}\".accounts (id, owner) VALUES ($1, 'first')",
                common::schema()
            ),
            &[&account],
        )
        .await
        .unwrap();
        if commit_first {
            tx1.commit().await.unwrap();
        } else {
            tx1.rollback().await.unwrap();
        }
        let result = tokio::time::timeout(Duration::from_secs(10), second_write)
            .await
            .expect("second writer finishes once the first one ends")
            .unwrap();
        let client = common::raw().await;
        if second_passes {
            result.unwrap();
            assert_eq!(owner_of(&client, &account).await.as_deref(), Some("second"));
            assert_eq!(
                max_token(&client, fence, &account).await,
                Some(second as i64)
            );
        } else {
            match result {
                Err(FenceError::Stale { current, token, .. }) => {
                    assert_eq!(current, FencingToken(first));
                    assert_eq!(token, FencingToken(second));
                }
                other => panic!("lower token not refused: {other:?}"),
            }
            assert_eq!(owner_of(&client, &account).await.as_deref(), Some("first"));
        }
    }
}

/// Many writers with distinct tokens race on one resource; the writes that commit do so in
/// token order (a lower token never commits after a higher one), and the highest always does.
#[tokio::test]
async fn racing_writers_commit_in_token_order() {
    let fence = fence().await;
    let account = resource("race");
    let mut tokens: Vec<u64> = (1..=12).collect();
    fastrand::shuffle(&mut tokens);
    let writers = tokens.iter().map(|&t| {
        let account = account.clone();
        tokio::spawn(async move {
            let mut client = common::raw().await;
            let tx = client.transaction().await?;
            fence.check(&tx, &account, FencingToken(t)).await?;
            tx.execute(
                &format!(
                    "INSERT INTO \"{}\".writes (resource, token) VALUES ($1, $2)",
                    common::schema()
                ),
                &[&account, &(t as i64)],
            )
            .await?;
            tokio::time::sleep(Duration::from_millis(fastrand::u64(0..20))).await;
            tx.commit().await?;
            Ok::<_, FenceError>(t)
        })
    });
    let results = futures_util::future::join_all(writers).await;
    let committed: Vec<u64> = results
        .into_iter()
        .filter_map(|r| r.unwrap().ok())
        .collect();
    assert!(committed.contains(&12), "{committed:?}");

    let client = common::raw().await;
    let order: Vec<i64> = client
        .query(
            &format!(
                "SELECT token FROM \"{}\".writes WHERE resource = $1 ORDER BY seq",
                common::schema()
            ),
            &[&account],
        )
        .await
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect();
    assert_eq!(order.len(), committed.len());
    assert!(order.windows(2).all(|w| w[0] < w[1]), "{order:?}");
    assert_eq!(max_token(&client, fence, &account).await, Some(12));
}

#[tokio::test]
async fn tokens_above_i64_max_are_out_of_range() {
    let fence = fence().await;
    let account = resource("range");
    let mut client = common::raw().await;
    for t in [i64::MAX as u64 + 1, u64::MAX] {
        match fenced_write(&mut client, fence, &account, "x", FencingToken(t)).await {
            Err(FenceError::OutOfRange(token)) => assert_eq!(token, FencingToken(t)),
            other => panic!("{t}: {other:?}"),
        }
    }
    assert_eq!(max_token(&client, fence, &account).await, None);
    fenced_write(
        &mut client,
        fence,
        &account,
        "max",
        FencingToken(i64::MAX as u64),
    )
    .await
    .unwrap();
    assert_eq!(max_token(&client, fence, &account).await, Some(i64::MAX));
}

/// Migrating again — one after another, many at once, or by hand with `create_table_sql` — keeps
/// the table and its rows.
#[tokio::test]
async fn fence_migration_is_idempotent() {
    let schema = common::fresh_schema();
    let fence = Fence::new(&schema, "fence_marks").unwrap();
    let mut client = common::raw().await;
    fence.migrate(&mut client).await.unwrap();
    fence.migrate(&mut client).await.unwrap();
    fence.check(&client, "kept", FencingToken(5)).await.unwrap();

    let racers = (0..4).map(|_| {
        let fence = fence.clone();
        async move {
            let mut client = common::raw().await;
            fence.migrate(&mut client).await
        }
    });
    for result in futures_util::future::join_all(racers).await {
        result.unwrap();
    }
    client
        .batch_execute(&fence.create_table_sql())
        .await
        .unwrap();
    client
        .batch_execute(&fence.create_table_sql())
        .await
        .unwrap();
    assert_eq!(max_token(&client, &fence, "kept").await, Some(5));
    assert!(matches!(
        fence.check(&client, "kept", FencingToken(4)).await,
        Err(FenceError::Stale {
            current: FencingToken(5),
            ..
        })
    ));
    common::drop_schema(&schema).await;
}

#[test]
fn fence_names_must_be_plain_identifiers() {
    assert!(matches!(
        Fence::new("ok", "bad-name"),
        Err(Error::Store(PgSetupError::InvalidIdentifier {
            what: "fence_table",
            ..
        }))
    ));
    assert!(matches!(
        Fence::new("1schema", "fences"),
        Err(Error::Store(PgSetupError::InvalidIdentifier {
            what: "schema",
            ..
        }))
    ));
    let default = Fence::default();
    assert_eq!((default.schema(), default.table()), ("leasehold", "fences"));
}
