//! The API's error answers: a status and a JSON body naming what went wrong (and the field at
//! fault, for bad requests), and the parsing of request bodies into them.

use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use serde::de::DeserializeOwned;

/// Why a lease or run is not held, as a lost answer says it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum EndReason {
    /// The application released it (or ended the run), or the sidecar shut down.
    Released,
    /// The store gave it to someone else, or said it is no longer ours.
    TakenOver,
    /// No renewal was confirmed in time (store slow or unreachable): the sidecar stopped it
    /// before the store could give it to anyone else.
    Expired,
    /// The application did not call within its keepalive interval.
    AppSilent,
    /// The run reached its `timeout_ms` (a tick's run only).
    TimedOut,
    /// This sidecar never granted it, or forgot it long ago.
    Unknown,
}

impl EndReason {
    fn message(self) -> &'static str {
        match self {
            Self::Released => "the lease was released",
            Self::TakenOver => "the store no longer has the lease as ours (taken over)",
            Self::Expired => {
                "renewal was not confirmed in time; the lease was given up before it could expire"
            }
            Self::AppSilent => "the application did not call keepalive within keepalive_ms",
            Self::TimedOut => "the run reached its timeout_ms: it is recorded timed-out",
            Self::Unknown => "this sidecar holds no lease with that name and token",
        }
    }

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Released => "released",
            Self::TakenOver => "taken-over",
            Self::Expired => "expired",
            Self::AppSilent => "app-silent",
            Self::TimedOut => "timed-out",
            Self::Unknown => "unknown",
        }
    }
}

/// An error answer.
#[derive(Debug, Serialize)]
pub(crate) struct ApiError {
    #[serde(skip)]
    status: StatusCode,
    error: &'static str,
    message: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    field: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<EndReason>,
}

impl ApiError {
    fn new(status: StatusCode, error: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            error,
            message: message.into(),
            field: None,
            reason: None,
        }
    }

    /// A bad value in `field`.
    pub(crate) fn field(field: &str, message: impl Into<String>) -> Self {
        let mut e = Self::new(StatusCode::BAD_REQUEST, "bad-request", message);
        e.field = Some(field.to_owned());
        e
    }

    pub(crate) fn lost(reason: EndReason) -> Self {
        let mut e = Self::new(StatusCode::GONE, "lost", reason.message());
        e.reason = Some(reason);
        e
    }

    pub(crate) fn store_down(message: impl Into<String>) -> Self {
        Self::new(StatusCode::SERVICE_UNAVAILABLE, "store-down", message)
    }

    pub(crate) fn store_refused(message: impl Into<String>) -> Self {
        Self::new(StatusCode::SERVICE_UNAVAILABLE, "store-refused", message)
    }

    pub(crate) fn unauthorized() -> Self {
        Self::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "missing or wrong bearer token (Authorization: Bearer TOKEN)",
        )
    }

    pub(crate) fn cross_site(why: String) -> Self {
        Self::new(StatusCode::FORBIDDEN, "cross-site", why)
    }

    pub(crate) fn host_not_allowed(why: String) -> Self {
        Self::new(StatusCode::FORBIDDEN, "host-not-allowed", why)
    }

    pub(crate) fn not_found() -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            "not-found",
            "no such endpoint; see /openapi.json",
        )
    }

    pub(crate) fn method_not_allowed() -> Self {
        Self::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "method-not-allowed",
            "method not allowed on this endpoint; see /openapi.json",
        )
    }

    pub(crate) fn is_bad_request(&self) -> bool {
        self.status == StatusCode::BAD_REQUEST
    }

    /// A fleet operation's failure: a `by` or `reason` the text rule refuses 400 naming the
    /// field, an unknown task 404, a trigger nobody would take or a contended control record
    /// 409, a store without a catalog 501, the store's own as [`store`](Self::store).
    pub(crate) fn fleet(e: &leasehold::fleet::FleetError) -> Self {
        use leasehold::fleet::FleetError;
        let (status, code) = match e {
            FleetError::Text(text) => return Self::field(text.field(), text.to_string()),
            FleetError::UnknownTask(_) => (StatusCode::NOT_FOUND, "unknown-task"),
            FleetError::NoInstance(_) => (StatusCode::CONFLICT, "no-instance"),
            FleetError::Contended(_) => (StatusCode::CONFLICT, "contended"),
            FleetError::Live { .. } => (StatusCode::CONFLICT, "task-live"),
            FleetError::BadRange { .. } | FleetError::FutureRange { .. } => {
                return Self::field("to_ms", e.to_string());
            }
            FleetError::TooManySlots { .. } => return Self::field("from_ms", e.to_string()),
            FleetError::NoBackfill { .. } => (StatusCode::CONFLICT, "no-backfill"),
            FleetError::TriggerWaiting { .. } => (StatusCode::CONFLICT, "trigger-waiting"),
            FleetError::NoCatalog(_) => (StatusCode::NOT_IMPLEMENTED, "no-catalog"),
            FleetError::Store(e) if e.is_transient() => {
                (StatusCode::SERVICE_UNAVAILABLE, "store-down")
            }
            _ => (StatusCode::SERVICE_UNAVAILABLE, "store-refused"),
        };
        Self::new(status, code, e.to_string())
    }

    /// A store error: unreachable or slow is `store-down`, a refusal `store-refused`.
    pub(crate) fn store(e: &leasehold::LeaseError) -> Self {
        if e.is_transient() {
            Self::store_down(e.to_string())
        } else {
            Self::store_refused(e.to_string())
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, Json(&self)).into_response()
    }
}

/// The largest request body accepted.
/// The largest request body accepted: room for every valid body even with every character of
/// its longest string escaped as a surrogate pair (`\uXXXX\uXXXX`).
pub(crate) const MAX_BODY: usize = 64 * 1024;

/// The largest `done` body: room for an output of `leasehold::text::OUTPUT`'s limit (64 KiB,
/// kept whole) with every byte escaped (`\u0000`, six bytes), and the other fields.
pub(crate) const MAX_DONE_BODY: usize = 6 * 64 * 1024 + MAX_BODY;

/// For optional fields that may be left out but are not nullable: `null` is refused (serde's
/// `Option` would take it as absent), so the API accepts exactly what its document says.
pub(crate) fn not_null<'de, D, T>(d: D) -> Result<Option<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: serde::Deserialize<'de>,
{
    T::deserialize(d).map(Some)
}

/// Parses a JSON request body, naming the field at fault when it does not fit. Takes the raw
/// bytes rather than axum's `Json` so that every failure (size, syntax, type, unknown field) is
/// one of our JSON errors, and no content type is demanded.
pub(crate) fn parse<T: DeserializeOwned>(
    body: Result<Bytes, BytesRejection>,
) -> Result<T, ApiError> {
    let bytes = body.map_err(|rejection| {
        if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "too-large",
                format!("the body is over {MAX_BODY} bytes ({MAX_DONE_BODY} for done)"),
            )
        } else {
            ApiError::field("body", rejection.body_text())
        }
    })?;
    let mut de = serde_json::Deserializer::from_slice(&bytes);
    let value = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        // serde_path_to_error says "?" where the JSON itself is malformed.
        let field = if path == "." || path == "?" {
            unknown_field(&inner.to_string()).unwrap_or_else(|| "body".to_owned())
        } else {
            path
        };
        ApiError::field(&field, format!("{field}: {inner}"))
    })?;
    de.end()
        .map_err(|e| ApiError::field("body", format!("trailing data after the JSON: {e}")))?;
    Ok(value)
}

/// The field named by serde's "unknown field `x`" or "missing field `x`" messages.
fn unknown_field(message: &str) -> Option<String> {
    let rest = message
        .strip_prefix("unknown field `")
        .or_else(|| message.strip_prefix("missing field `"))?;
    rest.split('`').next().map(str::to_owned)
}

/// Checks that `value` lies in `range`, naming `field` if not.
pub(crate) fn in_range(
    field: &str,
    value: u64,
    range: std::ops::RangeInclusive<u64>,
) -> Result<u64, ApiError> {
    if range.contains(&value) {
        Ok(value)
    } else {
        Err(ApiError::field(
            field,
            format!(
                "{field} must be between {} and {}, not {value}",
                range.start(),
                range.end()
            ),
        ))
    }
}
