//! A stand-in for a PostgreSQL server that checks passwords, for tests on a machine whose
//! server trusts every loopback connection (and so accepts any password).

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// Speaks the start of PostgreSQL's protocol on a loopback port: asks each connection for a
/// cleartext password and refuses whatever comes with `28P01 invalid_password`, as a server
/// with `password`, `md5` or `scram-sha-256` authentication refuses a wrong one. A client
/// without a password gives up before sending one. Stops on drop.
pub struct PasswordRefusingPostgres {
    /// The port it listens on.
    pub port: u16,
    stop: Arc<AtomicBool>,
}

impl PasswordRefusingPostgres {
    /// Starts it on a free loopback port.
    pub fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("a free loopback port");
        let port = listener.local_addr().expect("a bound listener").port();
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                if stopped.load(Ordering::SeqCst) {
                    return;
                }
                if let Ok(conn) = conn {
                    std::thread::spawn(move || refuse(conn));
                }
            }
        });
        Self { port, stop }
    }

    /// `postgres://USER[:PASSWORD]@127.0.0.1:PORT/test`.
    pub fn url(&self, user: &str, password: Option<&str>) -> String {
        let password = password.map_or_else(String::new, |p| format!(":{p}"));
        format!("postgres://{user}{password}@127.0.0.1:{}/test", self.port)
    }
}

impl Drop for PasswordRefusingPostgres {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wakes the accept loop so it sees the flag.
        let _ = TcpStream::connect(("127.0.0.1", self.port));
    }
}

/// Reads one length-prefixed message (after a type byte if `typed`).
fn read_message(conn: &mut TcpStream, typed: bool) -> std::io::Result<()> {
    if typed {
        conn.read_exact(&mut [0; 1])?;
    }
    let mut len = [0; 4];
    conn.read_exact(&mut len)?;
    let mut body = vec![0; (u32::from_be_bytes(len) as usize).saturating_sub(4)];
    conn.read_exact(&mut body)
}

fn refuse(mut conn: TcpStream) -> std::io::Result<()> {
    // The startup message, then AuthenticationCleartextPassword.
    read_message(&mut conn, false)?;
    conn.write_all(b"R\0\0\0\x08\0\0\0\x03")?;
    // The password message, then an ErrorResponse.
    read_message(&mut conn, true)?;
    let mut fields = Vec::new();
    for (code, value) in [
        (b'S', "FATAL"),
        (b'V', "FATAL"),
        (b'C', "28P01"),
        (b'M', "password authentication failed for user"),
    ] {
        fields.push(code);
        fields.extend_from_slice(value.as_bytes());
        fields.push(0);
    }
    fields.push(0);
    let mut reply = vec![b'E'];
    reply.extend_from_slice(&(fields.len() as u32 + 4).to_be_bytes());
    reply.extend_from_slice(&fields);
    conn.write_all(&reply)
}
