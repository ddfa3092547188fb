//! A MariaDB server of a test's own (`leasehold_servers::MariaDb`), for what the shared server
//! cannot show: TLS with certificates of the test's own, a server without TLS.

use std::path::Path;

use leasehold_servers::MariaDb;

/// A loopback `mariadbd` with a data directory of its own in a temp dir, root without a
/// password from 127.0.0.1 and a database `test`; killed on drop.
pub struct OwnMariaDb {
    /// The port it listens on.
    pub port: u16,
    server: MariaDb,
}

impl OwnMariaDb {
    /// Creates the data directory and starts the server with `extra` options (`--ssl-cert=…`),
    /// waiting until it accepts connections.
    pub fn start(extra: &[String]) -> Self {
        let server = MariaDb::builder()
            .args(extra.iter().cloned())
            .start()
            .unwrap_or_else(|e| panic!("{e}"));
        Self {
            port: server.port(),
            server,
        }
    }

    /// `mysql://root@HOST:PORT/test` plus `query` (`?ssl-mode=…`), `host` being `127.0.0.1` or
    /// `localhost`.
    pub fn url(&self, host: &str, query: &str) -> String {
        format!(
            "mysql://root@{host}:{}/{}{query}",
            self.port,
            self.server.database()
        )
    }

    /// The server's directory (its log is `mariadb.log` there).
    pub fn dir(&self) -> &Path {
        self.server.dir()
    }
}
