//! A small client for etcd's JSON gateway (`POST /v3/kv/txn`, `/v3/kv/range`, `/v3/watch`,
//! `/v3/auth/authenticate`) over HTTP/1.1, with keep-alive connections per member and failover to
//! the next member when one cannot be reached.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::client::conn::http1::{self, SendRequest};
use hyper::header::{AUTHORIZATION, CONTENT_TYPE, HOST};
use hyper::{Request, StatusCode};
use hyper_util::rt::TokioIo;
use serde::Deserialize;
use serde::de::DeserializeOwned;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;

use crate::config::{Endpoint, EtcdConfig, Password};
use crate::error::{Error, RequestError};

type Sender = SendRequest<Full<Bytes>>;

/// The connection pool and failover state shared by every clone of a store.
pub(crate) struct Gateway {
    endpoints: Vec<Endpoint>,
    /// The member the next request goes to first.
    preferred: AtomicUsize,
    /// Idle keep-alive connections, per member.
    idle: Vec<Mutex<Vec<Sender>>>,
    #[cfg(feature = "tls")]
    tls: Option<tokio_rustls::TlsConnector>,
    credentials: Option<(String, Password)>,
    /// The auth token from `/v3/auth/authenticate`, when a user is configured.
    auth_token: Mutex<Option<String>>,
    /// The cluster's last answer to the credentials when it refused them: requests answer it at
    /// once (authenticating is slow on purpose, and a request that timed out waiting for it
    /// would look like an outage), and the credentials are tried again in the background.
    auth_refused: Mutex<Option<Refusal>>,
    /// Held while authenticating, so only one request does at a time.
    authenticating: Arc<tokio::sync::Mutex<()>>,
    connect_timeout: Duration,
}

/// A refusal of the credentials, and when it came.
struct Refusal {
    code: i32,
    message: String,
    at: std::time::Instant,
}

/// How long a refusal of the credentials is answered from memory before they are tried again
/// (in the background).
const RETRY_REFUSED_AUTH: Duration = Duration::from_secs(1);

/// How many idle connections to keep per member.
const MAX_IDLE: usize = 32;

#[derive(Deserialize)]
struct GatewayError {
    #[serde(default)]
    error: Option<String>,
    #[serde(default)]
    message: Option<String>,
    #[serde(default)]
    code: Option<i32>,
}

#[derive(Deserialize)]
struct AuthenticateResponse {
    #[serde(default)]
    token: String,
}

impl Gateway {
    pub(crate) fn new(config: &EtcdConfig) -> Result<Self, Error> {
        #[cfg(feature = "tls")]
        let tls = if config.tls {
            Some(tls::connector(config.tls_ca_pem.as_deref())?)
        } else {
            None
        };
        let credentials = match (&config.user, &config.password) {
            (Some(user), password) => Some((
                user.clone(),
                password.clone().unwrap_or_else(|| Password::new("")),
            )),
            (None, _) => None,
        };
        Ok(Self {
            endpoints: config.endpoints.clone(),
            preferred: AtomicUsize::new(0),
            idle: config
                .endpoints
                .iter()
                .map(|_| Mutex::new(Vec::new()))
                .collect(),
            #[cfg(feature = "tls")]
            tls,
            credentials,
            auth_token: Mutex::new(None),
            auth_refused: Mutex::new(None),
            authenticating: Arc::new(tokio::sync::Mutex::new(())),
            connect_timeout: config.connect_timeout,
        })
    }

    /// Authenticates in the background now, so the first request finds a token, or the
    /// refusal, without waiting for the whole check.
    pub(crate) fn authenticate_soon(self: &Arc<Self>) {
        if self.credentials.is_some() {
            let gateway = self.clone();
            tokio::spawn(async move {
                let _ = gateway.ensure_token().await;
            });
        }
    }

    /// The auth token, authenticating first if there is none (one request at a time). While
    /// the cluster refuses the credentials, its refusal at once, and another try in the
    /// background now and then.
    async fn ensure_token(self: &Arc<Self>) -> Result<Option<String>, RequestError> {
        if self.credentials.is_none() {
            return Ok(None);
        }
        if let Some(token) = self.token() {
            return Ok(Some(token));
        }
        if let Some(refused) = self.refused() {
            return Err(refused);
        }
        let _only = self.authenticating.lock().await;
        if let Some(token) = self.token() {
            return Ok(Some(token));
        }
        if let Some(refused) = self.refused() {
            return Err(refused);
        }
        self.authenticate().await.map(Some)
    }

    /// The recorded refusal of the credentials, starting another try in the background once it
    /// is old enough.
    fn refused(self: &Arc<Self>) -> Option<RequestError> {
        let refused = self
            .auth_refused
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let r = refused.as_ref()?;
        if r.at.elapsed() >= RETRY_REFUSED_AUTH
            && let Ok(only) = self.authenticating.clone().try_lock_owned()
        {
            let gateway = self.clone();
            tokio::spawn(async move {
                let _only = only;
                let _ = gateway.authenticate().await;
            });
        }
        Some(RequestError::Status {
            code: r.code,
            message: r.message.clone(),
        })
    }

    /// POSTs `body` to `path` and decodes the answer, failing over to the next member when one
    /// cannot be connected to, and authenticating (again) when the cluster asks for it.
    pub(crate) async fn call<T: DeserializeOwned>(
        self: &Arc<Self>,
        path: &str,
        body: &serde_json::Value,
    ) -> Result<T, RequestError> {
        let body = Bytes::from(body.to_string());
        let mut authenticated = false;
        loop {
            if self.credentials.is_some() && self.token().is_none() {
                self.ensure_token().await?;
                authenticated = true;
            }
            match self.post(path, body.clone()).await {
                Err(e) if is_auth_expired(&e) && self.credentials.is_some() && !authenticated => {
                    // The token expired (etcd's simple tokens last 5 minutes idle): the request
                    // was refused before it was applied, so sending it again is safe.
                    *self
                        .auth_token
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner) = None;
                }
                Err(e) => return Err(e),
                Ok(bytes) => {
                    return serde_json::from_slice(&bytes)
                        .map_err(|e| RequestError::Decode(e.to_string()));
                }
            }
        }
    }

    fn token(&self) -> Option<String> {
        self.auth_token
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Asks the cluster for a token; records its refusal, or clears the last one. Callers
    /// hold `authenticating`.
    async fn authenticate(&self) -> Result<String, RequestError> {
        let Some((user, password)) = &self.credentials else {
            return Ok(String::new());
        };
        let body = serde_json::json!({ "name": user, "password": password.expose() });
        let answer = self
            .post_with("/v3/auth/authenticate", Bytes::from(body.to_string()), None)
            .await
            .and_then(|bytes| {
                serde_json::from_slice::<AuthenticateResponse>(&bytes)
                    .map_err(|e| RequestError::Decode(e.to_string()))
            });
        let mut refused = self
            .auth_refused
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        match answer {
            Ok(answer) => {
                *refused = None;
                *self
                    .auth_token
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner) = Some(answer.token.clone());
                Ok(answer.token)
            }
            Err(e) => {
                if let RequestError::Status { code, message } = &e
                    && !e.is_transient()
                {
                    *refused = Some(Refusal {
                        code: *code,
                        message: message.clone(),
                        at: std::time::Instant::now(),
                    });
                }
                Err(e)
            }
        }
    }

    async fn post(&self, path: &str, body: Bytes) -> Result<Bytes, RequestError> {
        let token = self.token();
        self.post_with(path, body, token.as_deref()).await
    }

    async fn post_with(
        &self,
        path: &str,
        body: Bytes,
        token: Option<&str>,
    ) -> Result<Bytes, RequestError> {
        let n = self.endpoints.len();
        let start = self.preferred.load(Ordering::Relaxed) % n;
        let mut failures = Failures::default();
        for attempt in 0..n {
            let idx = (start + attempt) % n;
            let (mut sender, reused) = match self.checkout(idx).await {
                Ok(found) => found,
                Err(e) => {
                    failures.unopened(e);
                    continue;
                }
            };
            let request = self.request(idx, path, body.clone(), token);
            match sender.send_request(request).await {
                Ok(response) => {
                    self.preferred.store(idx, Ordering::Relaxed);
                    let status = response.status();
                    let bytes = self.read_body(idx, response.into_body()).await?;
                    self.checkin(idx, sender);
                    if status.is_success() {
                        return Ok(bytes);
                    }
                    return Err(status_error(status, &bytes));
                }
                // A kept-alive connection that had closed before the request went out: nothing
                // was sent, so the next member may have it.
                Err(e) if reused && e.is_canceled() => {
                    failures.other(format!("{}: {e}", self.endpoints[idx]));
                }
                Err(e) => {
                    // Sent, outcome unknown: report it (the caller's retry decides), and start
                    // the next request at another member.
                    self.preferred.store((idx + 1) % n, Ordering::Relaxed);
                    return Err(self.transport(idx, &e));
                }
            }
        }
        self.preferred.store((start + 1) % n, Ordering::Relaxed);
        Err(failures.into_error())
    }

    /// Opens a streaming request (a watch) on a fresh connection, trying the members from `from`
    /// on; returns the member's index and the response body.
    pub(crate) async fn stream(
        self: &Arc<Self>,
        from: usize,
        path: &str,
        body: &serde_json::Value,
    ) -> Result<(usize, Incoming), RequestError> {
        self.ensure_token().await?;
        let body = Bytes::from(body.to_string());
        let token = self.token();
        let n = self.endpoints.len();
        let mut failures = Failures::default();
        for attempt in 0..n {
            let idx = (from + attempt) % n;
            let mut sender = match self.open(idx).await {
                Ok(sender) => sender,
                Err(e) => {
                    failures.unopened(e);
                    continue;
                }
            };
            let request = self.request(idx, path, body.clone(), token.as_deref());
            let response = match sender.send_request(request).await {
                Ok(response) => response,
                Err(e) => {
                    failures.other(format!("{}: {e}", self.endpoints[idx]));
                    continue;
                }
            };
            let status = response.status();
            if !status.is_success() {
                let bytes = self.read_body(idx, response.into_body()).await?;
                let err = status_error(status, &bytes);
                if is_auth_expired(&err) {
                    *self
                        .auth_token
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner) = None;
                }
                return Err(err);
            }
            return Ok((idx, response.into_body()));
        }
        Err(failures.into_error())
    }

    pub(crate) fn endpoint_count(&self) -> usize {
        self.endpoints.len()
    }

    pub(crate) fn endpoint(&self, idx: usize) -> &Endpoint {
        &self.endpoints[idx % self.endpoints.len()]
    }

    fn request(
        &self,
        idx: usize,
        path: &str,
        body: Bytes,
        token: Option<&str>,
    ) -> Request<Full<Bytes>> {
        let mut builder = Request::post(path)
            .header(HOST, self.endpoints[idx].to_string())
            .header(CONTENT_TYPE, "application/json");
        if let Some(token) = token {
            builder = builder.header(AUTHORIZATION, token);
        }
        // Infallible: the method, an absolute path and these header values are valid.
        builder
            .body(Full::new(body))
            .unwrap_or_else(|_| Request::new(Full::new(Bytes::new())))
    }

    async fn read_body(&self, idx: usize, body: Incoming) -> Result<Bytes, RequestError> {
        Ok(body
            .collect()
            .await
            .map_err(|e| self.transport(idx, &e))?
            .to_bytes())
    }

    fn transport(&self, idx: usize, e: &dyn std::fmt::Display) -> RequestError {
        RequestError::Transport {
            endpoint: self.endpoints[idx].to_string(),
            message: e.to_string(),
        }
    }

    async fn checkout(&self, idx: usize) -> Result<(Sender, bool), Unopened> {
        loop {
            let idle = self.idle[idx]
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .pop();
            match idle {
                Some(sender) if sender.is_ready() => return Ok((sender, true)),
                Some(_) => continue,
                None => break,
            }
        }
        self.open(idx).await.map(|sender| (sender, false))
    }

    fn checkin(&self, idx: usize, sender: Sender) {
        if sender.is_ready() {
            let mut idle = self.idle[idx]
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if idle.len() < MAX_IDLE {
                idle.push(sender);
            }
        }
    }

    async fn open(&self, idx: usize) -> Result<Sender, Unopened> {
        let endpoint = &self.endpoints[idx];
        let connect = async {
            let tcp = TcpStream::connect((endpoint.host.as_str(), endpoint.port))
                .await
                .map_err(|e| Unopened::unreachable(e.to_string()))?;
            let _ = tcp.set_nodelay(true);
            #[cfg(feature = "tls")]
            if let Some(tls) = &self.tls {
                let name = rustls::pki_types::ServerName::try_from(endpoint.host.clone())
                    .map_err(|e| Unopened::unreachable(e.to_string()))?;
                let stream = tls.connect(name, tcp).await.map_err(|e| Unopened {
                    certificate: tls::certificate_refused(&e),
                    message: e.to_string(),
                })?;
                return handshake(stream).await.map_err(Unopened::unreachable);
            }
            handshake(tcp).await.map_err(Unopened::unreachable)
        };
        match tokio::time::timeout(self.connect_timeout, connect).await {
            Ok(Ok(sender)) => Ok(sender),
            Ok(Err(e)) => Err(Unopened {
                message: format!("{endpoint}: {}", e.message),
                ..e
            }),
            Err(_) => Err(Unopened::unreachable(format!(
                "{endpoint}: no connection within {:?}",
                self.connect_timeout
            ))),
        }
    }
}

/// Why a connection to a member could not be opened.
struct Unopened {
    message: String,
    /// The member's certificate did not verify, or it refused this client's: a configuration
    /// to fix (the CA, the host name), which retrying does not.
    certificate: bool,
}

impl Unopened {
    fn unreachable(message: String) -> Self {
        Self {
            message,
            certificate: false,
        }
    }
}

/// What went wrong with each member a request was tried on.
#[derive(Default)]
struct Failures {
    messages: Vec<String>,
    certificate: bool,
}

impl Failures {
    fn unopened(&mut self, e: Unopened) {
        self.certificate |= e.certificate;
        self.messages.push(e.message);
    }

    fn other(&mut self, message: String) {
        self.messages.push(message);
    }

    /// No member answered: a certificate refusal from any of them is the configuration's fault
    /// (members share their CA), else an outage.
    fn into_error(self) -> RequestError {
        let messages = self.messages.join("; ");
        match self.certificate {
            true => RequestError::Certificate(messages),
            false => RequestError::Connect(messages),
        }
    }
}

async fn handshake<S>(stream: S) -> Result<Sender, String>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (sender, connection) = http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| e.to_string())?;
    tokio::spawn(async move {
        // Ends when the member closes the connection or every sender is dropped.
        let _ = connection.await;
    });
    Ok(sender)
}

fn status_error(status: StatusCode, bytes: &[u8]) -> RequestError {
    match serde_json::from_slice::<GatewayError>(bytes) {
        Ok(err) => RequestError::Status {
            code: err.code.unwrap_or(2),
            message: err
                .message
                .or(err.error)
                .unwrap_or_else(|| format!("HTTP {status}")),
        },
        Err(_) => RequestError::Status {
            // A proxy's or an overloaded member's plain answer: 5xx is worth a retry.
            code: if status.is_server_error() { 14 } else { 2 },
            message: format!("HTTP {status}"),
        },
    }
}

fn is_auth_expired(e: &RequestError) -> bool {
    matches!(e, RequestError::Status { code, message }
        if *code == 16 || message.contains("invalid auth token"))
}

/// Base64 of bytes, as the gateway wants keys and values.
pub(crate) fn b64(bytes: impl AsRef<[u8]>) -> String {
    B64.encode(bytes)
}

/// Decodes a base64 field of the gateway's JSON.
pub(crate) fn unb64(text: &str) -> Result<Vec<u8>, RequestError> {
    B64.decode(text)
        .map_err(|e| RequestError::Decode(format!("bad base64: {e}")))
}

#[cfg(feature = "tls")]
mod tls {
    use std::sync::Arc;

    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;

    use crate::error::{Error, EtcdSetupError};

    /// A connector that verifies the members' certificates and host names against `ca_pem` or,
    /// without it, the system's root certificates.
    pub(crate) fn connector(ca_pem: Option<&[u8]>) -> Result<tokio_rustls::TlsConnector, Error> {
        let bad =
            |e: &dyn std::fmt::Display| EtcdSetupError::Config(format!("bad CA certificate: {e}"));
        let mut roots = rustls::RootCertStore::empty();
        match ca_pem {
            Some(pem) => {
                for cert in CertificateDer::pem_slice_iter(pem) {
                    roots.add(cert.map_err(|e| bad(&e))?).map_err(|e| bad(&e))?;
                }
            }
            None => {
                for cert in rustls_native_certs::load_native_certs().certs {
                    // Skip the odd unparsable system certificate; the rest still work.
                    let _ = roots.add(cert);
                }
            }
        }
        if roots.is_empty() {
            return Err(EtcdSetupError::Config(
                "no root certificates to verify the members with".to_owned(),
            )
            .into());
        }
        // ring, as for PostgreSQL: its provider, deprecated since rustls 0.23.48 for lacking
        // post-quantum key exchange, is allowed on purpose.
        #[allow(deprecated)]
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| EtcdSetupError::Config(e.to_string()))?
            .with_root_certificates(roots)
            .with_no_client_auth();
        Ok(tokio_rustls::TlsConnector::from(Arc::new(config)))
    }

    /// Whether a failed TLS handshake is a certificate refusal: the member's certificate did
    /// not verify against the roots given (another CA, a name it is not for, expired), or the
    /// member refused this client's (it asks for client certificates).
    pub(crate) fn certificate_refused(e: &std::io::Error) -> bool {
        use rustls::AlertDescription as Alert;
        let Some(e) = e.get_ref().and_then(|e| e.downcast_ref::<rustls::Error>()) else {
            return false;
        };
        matches!(
            e,
            rustls::Error::InvalidCertificate(_)
                | rustls::Error::AlertReceived(
                    Alert::BadCertificate
                        | Alert::UnsupportedCertificate
                        | Alert::CertificateUnknown
                        | Alert::UnknownCA
                        | Alert::CertificateRequired
                )
        )
    }
}
