//! Passwords in every form the driver accepts reach the server intact and never show: the store
//! describes the server from the driver's parsed settings, not from the text.

mod common;

use std::time::Duration;

use leasehold::{HolderId, LeaseName, Store, store::Acquisition};
use leasehold_postgres::{Error, PgConfig, PgSetupError, PgStore};

/// Passwords with the characters a URL would have escaped, unescaped: the driver ends the
/// credentials at the first `@`, so `/ ? # :` are part of the password.
const SECRETS: &[&str] = &[
    "s3kr1t/pw",
    "s3kr1t?pw",
    "s3kr1t#pw",
    "s3kr1t:pw",
    "s/3?k#r:1t",
];

/// The test server's URL (a postgres:// URL naming a user, trust authentication) with
/// `password` inserted as it is, unescaped.
fn url_with(password: &str) -> String {
    let url = common::url();
    let rest = url
        .strip_prefix("postgres://")
        .expect("LEASEHOLD_TEST_POSTGRES_URL is a postgres:// URL");
    let (user, host) = rest.split_once('@').expect("the URL names a user");
    let user = user.split(':').next().unwrap();
    format!("postgres://{user}:{password}@{host}")
}

/// The secret and every piece of it longer than 2 characters around its special character.
fn pieces(secret: &str) -> Vec<&str> {
    let mut out = vec![secret];
    out.extend(secret.split(['/', '?', '#', ':']).filter(|p| p.len() > 2));
    out
}

fn assert_hidden(secret: &str, shown: &str) {
    for piece in pieces(secret) {
        assert!(!shown.contains(piece), "{piece:?} of {secret:?} in {shown}");
    }
}

async fn works(store: &PgStore) {
    let name = LeaseName::new(format!("pw-{:08x}", fastrand::u32(..))).unwrap();
    let holder = HolderId::new("h").unwrap();
    let got = store
        .acquire(&name, &holder, Duration::from_secs(5))
        .await
        .unwrap();
    assert!(matches!(got, Acquisition::Acquired { .. }), "{got:?}");
}

#[tokio::test]
async fn unescaped_url_passwords_connect_and_never_show() {
    for secret in SECRETS {
        let url = url_with(secret);
        let parsed: leasehold_postgres::tokio_postgres::Config = url.parse().unwrap();
        assert_eq!(parsed.get_password(), Some(secret.as_bytes()), "{url}");
        let config = PgConfig::new(&url).schema(common::schema());
        let server = config.describe();
        assert!(server.starts_with("postgres://"), "{server}");
        // The rest of the URL was read as written: the store reaches the server.
        let store = config.clone().connect().await.unwrap();
        works(&store).await;
        for shown in [
            server.clone(),
            format!("{config:?}"),
            store.describe(),
            format!("{store:?}"),
        ] {
            assert_hidden(secret, &shown);
        }
        assert!(store.describe().contains(&server), "{}", store.describe());
        // Errors about this server: a migration refused (a schema name PostgreSQL reserves).
        let err = PgConfig::new(&url)
            .schema("pg_leasehold")
            .connect()
            .await
            .unwrap_err();
        assert!(matches!(err, Error::Migrate { .. }), "{err:?}");
        assert_hidden(secret, &format!("{err} {err:?}"));
    }
}

#[tokio::test]
async fn an_unescaped_at_in_a_url_password_is_refused_unshown() {
    for secret in ["s3kr1t@pw", "s3@kr1t/pw", "s3@kr1t?x=pw"] {
        let url = url_with(secret);
        let config = PgConfig::new(&url);
        let err = config.clone().connect().await.unwrap_err();
        let Error::Store(PgSetupError::InvalidUrl { reason }) = &err else {
            panic!("{secret}: {err:?}");
        };
        assert!(reason.contains("%40"), "{reason}");
        assert_hidden(
            secret,
            &format!("{err} {err:?} {config:?} {}", config.describe()),
        );
        // Escaped, it works.
        let store = PgConfig::new(url_with(&secret.replace('@', "%40")))
            .schema(common::schema())
            .connect()
            .await
            .unwrap();
        works(&store).await;
        assert_hidden(secret, &store.describe());
    }
}

#[tokio::test]
async fn key_value_passwords_never_show() {
    let url = common::url();
    let parsed: leasehold_postgres::tokio_postgres::Config = url.parse().unwrap();
    let host = match &parsed.get_hosts()[0] {
        leasehold_postgres::tokio_postgres::config::Host::Tcp(h) => h.clone(),
        other => panic!("{other:?}"),
    };
    let port = parsed.get_ports().first().copied().unwrap_or(5432);
    let user = parsed.get_user().unwrap();
    let db = parsed.get_dbname().unwrap();
    for (password, secret) in [
        ("s3kr1t/pw", "s3kr1t/pw"),
        ("'s3kr1t with spaces'", "s3kr1t with spaces"),
        ("'it\\'s s3kr1t'", "it's s3kr1t"),
        ("s3kr1t\\ pw", "s3kr1t pw"),
    ] {
        let conn = format!("host={host} port={port} user={user} dbname={db} password={password}");
        let config = PgConfig::new(&conn).schema(common::schema());
        assert_eq!(
            config.describe(),
            format!("postgres://{user}@{host}:{port}/{db}")
        );
        let store = config.clone().connect().await.unwrap();
        works(&store).await;
        for shown in [
            format!("{config:?}"),
            store.describe(),
            format!("{store:?}"),
        ] {
            assert_hidden(secret, &shown);
            assert!(!shown.contains("s3kr1t"), "{shown}");
        }
    }
}

/// `host=/dir` is a Unix socket directory (here the one the test server listens in). Whether
/// the server lets this user in over the socket depends on its pg_hba.conf (trust here, peer on
/// a fresh Debian install): either way the store reached it, and nothing shows the password.
#[tokio::test]
async fn key_value_unix_socket_directory() {
    let client = common::raw().await;
    let dirs: String = client
        .query_one("SHOW unix_socket_directories", &[])
        .await
        .unwrap()
        .get(0);
    let dir = dirs.split(',').next().unwrap().trim().to_owned();
    let port: String = client.query_one("SHOW port", &[]).await.unwrap().get(0);
    let parsed: leasehold_postgres::tokio_postgres::Config = common::url().parse().unwrap();
    let (user, db) = (parsed.get_user().unwrap(), parsed.get_dbname().unwrap());
    let secret = "s3kr1t over a socket";
    let conn = format!("host={dir} port={port} user={user} dbname={db} password='{secret}'");
    let config = PgConfig::new(&conn)
        .schema(common::schema())
        .connect_timeout(Duration::from_secs(3));
    let encoded = dir.replace('/', "%2F");
    assert_eq!(
        config.describe(),
        format!("postgres://{user}@{encoded}:{port}/{db}")
    );
    match config.clone().connect().await {
        Ok(store) => {
            works(&store).await;
            assert!(store.describe().contains(&encoded), "{}", store.describe());
            assert!(!format!("{} {store:?}", store.describe()).contains("s3kr1t"));
        }
        Err(err) => {
            let all = format!("{err} {err:?}");
            assert!(
                all.contains("authentication"),
                "not the server refusing: {all}"
            );
            assert!(!all.contains("s3kr1t"), "{all}");
        }
    }
}
