//! Configuration and connection errors: typed, one line, quick, and never showing a password.

mod common;

use std::time::{Duration, Instant};

use leasehold::Store;
use leasehold_postgres::{Error, Fence, PgConfig, PgSetupError};
use leasehold_testkit::errors::{everything_about, one_line};

/// Nothing listens here.
const DEAD: &str = "127.0.0.1:1";
const SECRET: &str = "s3kr1tpw";

fn assert_one_line(message: &str) {
    assert!(!message.contains('\n'), "not one line: {message:?}");
    assert!(!message.is_empty());
}

#[tokio::test]
async fn invalid_identifiers_are_typed_one_line_errors_before_any_connection() {
    let bad = [
        "",
        "1leases",
        "lease-table",
        "lease\"s",
        "leases; DROP TABLE x",
        "bad\nname",
        "ümlaut",
        &"x".repeat(64),
    ];
    for value in bad {
        for what in [
            "schema",
            "lease_table",
            "slot_table",
            "tasks_table",
            "instances_table",
        ] {
            let config = PgConfig::new(format!("postgres://u@{DEAD}/db"));
            let config = match what {
                "schema" => config.schema(value),
                "lease_table" => config.lease_table(value),
                "tasks_table" => config.tasks_table(value),
                "instances_table" => config.instances_table(value),
                _ => config.slot_table(value),
            };
            let started = Instant::now();
            let err = config.connect().await.unwrap_err();
            assert!(started.elapsed() < Duration::from_millis(500));
            match &err {
                Error::Store(PgSetupError::InvalidIdentifier { what: w, value: v }) => {
                    assert_eq!(*w, what);
                    assert_eq!(v, value);
                }
                other => panic!("{what}={value:?}: {other:?}"),
            }
            let message = err.to_string();
            assert_one_line(&message);
            assert!(message.contains(what), "{message}");
        }
    }
    // 63 bytes is the longest identifier PostgreSQL keeps whole (the default channel,
    // `schema.lease_table`, would then be too long: name one).
    let longest = "x".repeat(63);
    let config = PgConfig::new("postgres://h/db")
        .schema(&longest)
        .channel("releases");
    assert!(config.validate().is_ok());
    assert!(matches!(
        Fence::new("leasehold", "fence-table"),
        Err(Error::Store(PgSetupError::InvalidIdentifier {
            what: "fence_table",
            ..
        }))
    ));
}

#[tokio::test]
async fn out_of_range_settings_are_config_errors() {
    let base = || PgConfig::new(format!("postgres://u@{DEAD}/db"));
    let cases = [
        base().lease_table("same").slot_table("same"),
        base().tasks_table("members"),
        base().instances_table("tasks"),
        base().pool_size(0),
        base().op_timeout(Duration::ZERO),
        base().connect_timeout(Duration::ZERO),
        base().channel("x".repeat(64)),
        base().channel(""),
        base().application_name("a".repeat(57)),
    ];
    for config in cases {
        let err = config.clone().connect().await.unwrap_err();
        assert!(
            matches!(err, Error::Store(PgSetupError::Config(_))),
            "{config:?}: {err:?}"
        );
        assert_one_line(&err.to_string());
    }
    let err = base().schema("s".repeat(60)).connect().await.unwrap_err();
    assert!(
        matches!(err, Error::Store(PgSetupError::Config(_))),
        "default channel too long: {err:?}"
    );
}

#[tokio::test]
async fn unreachable_server_is_a_connect_error_within_the_timeout() {
    let url = format!("postgres://u:{SECRET}@{DEAD}/db");
    let started = Instant::now();
    let err = PgConfig::new(&url)
        .connect_timeout(Duration::from_secs(1))
        .connect()
        .await
        .unwrap_err();
    let took = started.elapsed();
    assert!(matches!(err, Error::Connect { .. }), "{err:?}");
    assert!(took < Duration::from_secs(3), "took {took:?}");
    let line = one_line(&err);
    assert_one_line(&line);
    assert!(err.to_string().contains(DEAD), "{err}");
    // The reason is in the source chain, which the command prints on the same line.
    assert!(line.contains("refused"), "{line}");
    assert!(err.is_transient(), "{line}");
    let all = everything_about(&err);
    assert!(!all.contains(SECRET), "{all}");
    // The convenience function gives the same error.
    let err = leasehold_postgres::connect(&url).await.unwrap_err();
    assert!(matches!(err, Error::Connect { .. }), "{err:?}");
    assert!(!everything_about(&err).contains(SECRET));
}

/// A server that accepts TCP connections and never says a word: the connect timeout still
/// applies (it covers the startup handshake, not just the TCP connect).
#[tokio::test]
async fn silent_server_is_a_connect_error_within_the_timeout() {
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = silent.local_addr().unwrap();
    let started = Instant::now();
    let err = PgConfig::new(format!("postgres://u:{SECRET}@{addr}/db"))
        .connect_timeout(Duration::from_secs(1))
        .connect()
        .await
        .unwrap_err();
    let took = started.elapsed();
    assert!(matches!(err, Error::Connect { .. }), "{err:?}");
    let line = one_line(&err);
    assert!(line.contains("within 1s"), "{line}");
    assert!(took < Duration::from_secs(4), "took {took:?}");
    assert_one_line(&line);
    assert!(err.is_transient(), "{line}");
    assert!(!everything_about(&err).contains(SECRET));
    drop(silent);
}

/// URLs in every form the driver accepts a password in. The store shows only what the driver
/// parsed, without the password, whatever characters it has.
fn urls_with_secrets() -> Vec<String> {
    vec![
        format!("postgres://u:{SECRET}@{DEAD}/db"),
        format!("postgresql://u:{SECRET}@{DEAD}/db?sslmode=disable"),
        format!("postgres://u:{SECRET}@{DEAD}"),
        format!("postgres://u@{DEAD}/db?password={SECRET}"),
        format!("postgres://u@{DEAD}/db?connect_timeout=1&password={SECRET}"),
        format!("postgres://u@{DEAD}/db?pass%77ord={SECRET}"),
        // Characters a URL should have escaped; the driver takes everything up to the first
        // `@` as user:password.
        format!("postgres://u:{SECRET}/x@{DEAD}/db"),
        format!("postgres://u:{SECRET}?x@{DEAD}/db"),
        format!("postgres://u:{SECRET}#x@{DEAD}/db"),
        format!("postgres://u:{SECRET}%2Fx@{DEAD}/db"),
        format!("postgres://u:{SECRET}:x@{DEAD}/db"),
        format!("postgres://u:{SECRET}/?#:x@{DEAD}/db"),
        format!("postgres://u:{SECRET}%40x@{DEAD}/db"),
        format!("host=127.0.0.1 port=1 user=u password={SECRET} dbname=db"),
        format!("host=127.0.0.1 port=1 user=u password = {SECRET} dbname=db"),
        format!("host=127.0.0.1 port=1 user=u password='{SECRET} with spaces' dbname=db"),
        format!("host=127.0.0.1 port=1 password='it\\'s {SECRET}' dbname=db"),
        format!("host=127.0.0.1 port=1 password={SECRET}\\ tail dbname=db"),
    ]
}

#[tokio::test]
async fn passwords_never_appear_in_config_or_errors() {
    for url in urls_with_secrets() {
        let config = PgConfig::new(&url).connect_timeout(Duration::from_secs(1));
        assert!(
            config.describe().contains(DEAD),
            "{url}: {}",
            config.describe()
        );
        for shown in [format!("{config:?}"), config.describe()] {
            assert!(!shown.contains(SECRET), "{url}: {shown}");
            assert!(!shown.contains("with spaces"), "{url}: {shown}");
            assert!(!shown.contains("tail"), "{url}: {shown}");
        }
        let err = config.connect().await.unwrap_err();
        assert!(matches!(err, Error::Connect { .. }), "{url}: {err:?}");
        let all = everything_about(&err);
        assert!(!all.contains(SECRET), "{url}: {all}");
        assert_one_line(&err.to_string());
    }
}

#[tokio::test]
async fn passwords_never_appear_in_url_errors() {
    for url in [
        format!("postgres://u:{SECRET}@127.0.0.1:notaport/db"),
        format!("postgres://u:{SECRET}@{DEAD}/db?sslmode=sometimes"),
        format!("postgres://u:{SECRET}@{DEAD}/db?nosuchoption=1"),
        format!("host=127.0.0.1 password='{SECRET} unterminated"),
        format!("host=127.0.0.1 password {SECRET}"),
        // The driver ends the credentials at the first `@`: the rest of the password would be
        // the host, database or parameters (refused, not shown).
        format!("postgres://u:{SECRET}@x@{DEAD}/db"),
        format!("postgres://u:a@{SECRET}/x@{DEAD}/db"),
        format!("postgres://u:a@{SECRET}?application_name=x@{DEAD}/db"),
        format!("postgres://localhost/db?password={SECRET}@x"),
        // An unquoted space or `&` in a password: its tail reads as an unknown option.
        format!("host=127.0.0.1 password=a {SECRET}=x"),
        format!("postgres://u@{DEAD}/db?password=a&{SECRET}=x"),
    ] {
        let err = PgConfig::new(&url).connect().await.unwrap_err();
        assert!(
            matches!(err, Error::Store(PgSetupError::InvalidUrl { .. })),
            "{url}: {err:?}"
        );
        assert!(PgConfig::new(&url).describe().contains("invalid url"));
        if url.contains("notaport") {
            assert!(err.to_string().contains("`port`"), "{err}");
        }
        let all = everything_about(&err);
        assert!(!all.contains(SECRET), "{url}: {all}");
        assert_one_line(&err.to_string());
    }
}

/// The test server's URL with a password in it (trust authentication ignores it); if the URL
/// already has one, that is the secret to look for.
fn url_with_password() -> (String, String) {
    let url = common::url();
    let config: leasehold_postgres::tokio_postgres::Config = url.parse().unwrap();
    if let Some(pw) = config.get_password() {
        return (url.clone(), String::from_utf8_lossy(pw).into_owned());
    }
    let rest = url
        .strip_prefix("postgres://")
        .expect("LEASEHOLD_TEST_POSTGRES_URL is a postgres:// URL");
    let (user, host) = rest.split_once('@').expect("the URL names a user");
    (
        format!("postgres://{user}:{SECRET}@{host}"),
        SECRET.to_owned(),
    )
}

#[tokio::test]
async fn connected_store_never_shows_the_password() {
    let (url, secret) = url_with_password();
    let store = PgConfig::new(&url)
        .schema(common::schema())
        .connect()
        .await
        .unwrap();
    for shown in [store.describe(), format!("{store:?}")] {
        assert!(!shown.contains(&secret), "{shown}");
        assert!(shown.contains("postgres://"), "{shown}");
    }
    // A store error (here: migration off and no tables) names the operation, not the URL.
    let schema = common::fresh_schema();
    let bare = PgConfig::new(&url)
        .schema(&schema)
        .migrate(false)
        .notifications(false)
        .connect()
        .await
        .unwrap();
    let name = leasehold::LeaseName::new("no-table").unwrap();
    let holder = leasehold::HolderId::new("h").unwrap();
    let err = bare
        .acquire(&name, &holder, Duration::from_secs(1))
        .await
        .unwrap_err();
    assert!(
        matches!(err, leasehold::StoreError::Rejected { .. }),
        "{err:?}"
    );
    let all = everything_about(&err);
    assert!(!all.contains(&secret), "{all}");
    assert!(err.to_string().contains("acquire of no-table"), "{err}");
    assert_one_line(&err.to_string());
}
