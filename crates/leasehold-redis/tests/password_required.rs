//! A server that wants a password, reached without one: the driver authenticates only when the
//! URL carries credentials, so such a server first says NOAUTH to a command. `connect` asks at
//! once, so this is a connect error (issue 31: over a unix socket the store connected, its
//! release listener warned, and the first operation failed: two lines on stderr).

use leasehold::{Store, StoreError};
use leasehold_redis::Error;
use leasehold_testkit::redis::OwnRedis;

#[tokio::test]
async fn connecting_without_the_password_a_server_wants_fails_at_connect() {
    let socket = std::env::temp_dir().join(format!(
        "leasehold-noauth-{}-{:08x}.sock",
        std::process::id(),
        fastrand::u32(..)
    ));
    let socket = socket.display();
    let server = OwnRedis::start(&[
        "--requirepass",
        "s3cret",
        "--unixsocket",
        &socket.to_string(),
        "--unixsocketperm",
        "700",
    ]);
    for url in [server.url(), format!("redis+unix://{socket}")] {
        let err = leasehold_redis::connect(&url)
            .await
            .expect_err("connected without the password");
        assert!(
            matches!(
                &err,
                Error::Connect {
                    source: StoreError::Rejected { .. },
                    ..
                }
            ),
            "{url}: {err:?}"
        );
        let cause = std::error::Error::source(&err).and_then(|s| s.source());
        assert!(
            cause.is_some_and(|c| c.to_string().contains("NOAUTH")),
            "{url}: {err:?}"
        );
    }
    for url in [
        format!("redis://:s3cret@127.0.0.1:{}", server.port),
        format!("redis+unix://{socket}?pass=s3cret"),
    ] {
        let store = leasehold_redis::connect(&url).await.unwrap();
        store.now_millis().await.unwrap();
    }
    drop(server);
    let _ = std::fs::remove_file(socket.to_string());
}
