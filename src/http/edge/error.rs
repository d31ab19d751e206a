//! [`HttpError`]: the one place where errors become HTTP statuses and OpenAI error envelopes (a route that
//! answers in another protocol's shape has the body rendered again at the edge: `shape.rs`).
//!
//! Every refusal is `{"error": {"message", "type", "param", "code"}}` with a 4xx status for anything the
//! client did wrong (`param` names the field: `messages[2].role`, `messages[3].props.url`), so OpenAI SDKs
//! raise the right exception. OpenAI SDKs retry 408, 409, 429 and 5xx twice by default; errors that a retry
//! cannot fix carry `x-should-retry: false`. Refusals for capacity say whether waiting helps: with
//! `retry-after` (seconds) when the service expects room by then, with `x-should-retry: false` when nothing
//! it holds will free room by itself.

use std::time::Duration;

use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

use super::shape::Refused;
use crate::adapter::ApiError;
use crate::agent::StartError;
use crate::conversation::ConversationError;
use crate::hub::{AppendError, BatchError, HubError, SubscribeError};
use crate::output::{Outcome, ValidationError};
use crate::thread::ThreadError;

/// Whether a refused request can succeed if retried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Room {
    /// Room is expected by then.
    Expected(Duration),
    /// Room comes back as other streams end, which cannot be foreseen.
    Unknown,
    /// Nothing will free room by itself.
    Never,
}

/// An error response.
#[derive(Debug, Clone, PartialEq)]
pub struct HttpError {
    /// The status.
    pub status: StatusCode,
    /// The envelope's body (boxed: a `Result` carries its error's whole size).
    pub error: Box<ApiError>,
    /// Whether a client may retry (sets `x-should-retry`).
    pub retry: bool,
    /// When a retry may succeed (sets `retry-after`, in whole seconds rounded up).
    pub retry_after: Option<Duration>,
    /// More headers to answer with (a run's names, once its stream exists); boxed, as most errors have none.
    pub headers: Option<Box<HeaderMap>>,
}

impl HttpError {
    /// An error with every field given.
    pub fn new(status: StatusCode, kind: &str, message: impl Into<String>, param: Option<String>, code: &str) -> Self {
        HttpError {
            status,
            error: Box::new(ApiError {
                message: message.into(),
                kind: kind.into(),
                param,
                code: Some(code.into()),
                last_sequence: None,
            }),
            retry: false,
            retry_after: None,
            headers: None,
        }
    }

    /// An error a run ended with: `error` as it is, with `status`, not retried.
    pub fn ended_run(status: StatusCode, error: ApiError) -> Self {
        HttpError { status, error: Box::new(error), retry: false, retry_after: None, headers: None }
    }

    /// 503 `capacity`: the service is full; `room` says whether and when a retry can help.
    pub fn capacity(message: impl Into<String>, room: Room) -> Self {
        let mut message = message.into();
        match room {
            Room::Expected(after) => message.push_str(&format!("; room is expected in {} s", seconds(after))),
            Room::Unknown => message.push_str("; room comes back as other streams end"),
            Room::Never => message.push_str("; nothing will free room by itself, so a retry will not help"),
        }
        let mut error = HttpError::new(StatusCode::SERVICE_UNAVAILABLE, "server_error", message, None, "capacity");
        error.retry = room != Room::Never;
        if let Room::Expected(after) = room {
            error.retry_after = Some(after);
        }
        error
    }

    /// 429 `code`: a client (an address, or a key) holds its share of the service; `retry_after` is when
    /// room is expected (none: only the client can make room, by ending what it holds).
    pub fn budget(message: impl Into<String>, code: &str, retry_after: Option<Duration>) -> Self {
        let mut message = message.into();
        if let Some(after) = retry_after {
            message.push_str(&format!("; room is expected in {} s", seconds(after)));
        }
        let mut error = HttpError::new(StatusCode::TOO_MANY_REQUESTS, "rate_limit_error", message, None, code);
        error.retry = retry_after.is_some();
        error.retry_after = retry_after;
        error
    }

    /// 503 `shutting_down`: the service is stopping and takes no new work; another instance may.
    pub fn shutting_down() -> Self {
        let mut error = HttpError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "server_error",
            "the service is shutting down and takes no new streams",
            None,
            "shutting_down",
        );
        error.retry = true;
        error
    }

    /// 503 `cluster_unavailable`: Redis, which this node reads other nodes' streams from, did not answer.
    pub fn cluster_unavailable(error: &dyn std::fmt::Display) -> Self {
        let mut error = HttpError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "server_error",
            format!("the stream could not be read from Redis: {error}"),
            None,
            "cluster_unavailable",
        );
        error.retry = true;
        error
    }

    /// 409 `code` for an append whose condition the stream does not meet, naming `param` and the stream's
    /// last sequence.
    pub fn conflict_at(message: String, param: &str, code: &str, last_sequence: u64) -> Self {
        let mut error =
            HttpError::new(StatusCode::CONFLICT, "invalid_request_error", message, Some(param.into()), code);
        error.error.last_sequence = Some(last_sequence);
        error
    }

    /// 400 `invalid_request_error`.
    pub fn bad_request(message: impl Into<String>, param: Option<String>, code: &str) -> Self {
        HttpError::new(StatusCode::BAD_REQUEST, "invalid_request_error", message, param, code)
    }

    /// 404 for a stream that does not exist (or whose retention has passed).
    pub fn unknown_stream(id: &str) -> Self {
        HttpError::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            format!("no stream {id:?} (it never existed, or ended more than the retention time ago)"),
            None,
            "stream_not_found",
        )
    }

    /// 413 for a body over the limit.
    pub fn body_too_large(limit: usize) -> Self {
        HttpError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "invalid_request_error",
            format!("the request body is over the limit of {limit} bytes"),
            None,
            "body_too_large",
        )
    }

    /// The answer to a run that failed before it said anything: the status its error names (`details.status`,
    /// 400 to 599, as an agent sets it through `AgentError::status`; else 500), `retry-after` from
    /// `details.retry_after`, and the error's message and code in the envelope.
    pub fn failed_run(outcome: &Outcome) -> Self {
        let error = outcome.error.clone().unwrap_or_default();
        let detail = |key: &str| error.details.as_ref().and_then(|d| d.get(key)).and_then(serde_json::Value::as_u64);
        let status = detail("status")
            .and_then(|s| u16::try_from(s).ok())
            .and_then(|s| StatusCode::from_u16(s).ok())
            .filter(|s| s.is_client_error() || s.is_server_error())
            .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let kind = match status.as_u16() {
            429 => "rate_limit_error",
            400..=499 => "invalid_request_error",
            _ => "agent_error",
        };
        let code = error.code.as_deref().unwrap_or("agent_error");
        let mut failed = HttpError::new(status, kind, error.message, None, code);
        failed.retry = status == StatusCode::TOO_MANY_REQUESTS || status.is_server_error();
        failed.retry_after = detail("retry_after").map(Duration::from_secs);
        failed
    }

    /// Names the field at fault.
    pub fn with_param(mut self, param: &str) -> Self {
        self.error.param = Some(param.to_owned());
        self
    }

    /// Prefixes `param` with `prefix` (`messages[3]` + `.props.url`).
    pub fn within(mut self, prefix: &str) -> Self {
        self.error.param = Some(match self.error.param.take() {
            Some(param) if !param.is_empty() => format!("{prefix}.{param}"),
            _ => prefix.to_owned(),
        });
        self
    }
}

/// The error code of an error response, kept in its extensions.
#[derive(Debug, Clone)]
pub(crate) struct ErrorCode(pub(crate) String);

impl IntoResponse for HttpError {
    fn into_response(self) -> Response {
        let code = ErrorCode(self.error.code.clone().unwrap_or_default());
        let mut response = (self.status, [("content-type", "application/json")], self.error.to_json()).into_response();
        // For the access log and the refusal counter: why, without parsing the body.
        response.extensions_mut().insert(code);
        // For the edge, which renders it again for a route that answers in another shape.
        response.extensions_mut().insert(Refused(*self.error));
        if let Some(headers) = self.headers {
            response.headers_mut().extend(*headers);
        }
        if !self.retry {
            response.headers_mut().insert("x-should-retry", HeaderValue::from_static("false"));
        }
        if let Some(after) = self.retry_after {
            response.headers_mut().insert("retry-after", HeaderValue::from(seconds(after)));
        }
        response
    }
}

impl From<ValidationError> for HttpError {
    fn from(error: ValidationError) -> Self {
        let param = error.field().map(str::to_owned);
        HttpError::bad_request(error.to_string(), param, error.code())
    }
}

impl From<AppendError> for HttpError {
    fn from(error: AppendError) -> Self {
        let message = error.to_string();
        match error {
            AppendError::Ended => {
                HttpError::new(StatusCode::CONFLICT, "invalid_request_error", message, None, "stream_ended")
            }
            AppendError::Invalid(e) => e.into(),
            AppendError::Delta(e) => HttpError::bad_request(message, Some(e.field().to_owned()), "invalid_delta"),
            AppendError::MessageTooLarge { .. } => HttpError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "invalid_request_error",
                message,
                None,
                "message_too_large",
            ),
            AppendError::TooManyMessages { .. } | AppendError::StreamFull { .. } => {
                HttpError::new(StatusCode::CONFLICT, "invalid_request_error", message, None, "stream_full")
            }
            // Room comes back as other streams end and are evicted, which the append cannot foresee.
            AppendError::HubFull { .. } => HttpError::capacity(message, Room::Unknown),
            // The service forwards a followed stream's writes to its writer; this is the one it could not reach.
            AppendError::Elsewhere => {
                HttpError::new(StatusCode::SERVICE_UNAVAILABLE, "server_error", message, None, "stream_elsewhere")
            }
            // A retry of the same request meets the same refusal: the producer must look at `last_sequence`.
            AppendError::SequenceConflict { last, .. } => {
                HttpError::conflict_at(message, "after", "sequence_conflict", last)
            }
            AppendError::KeyReused { last } => {
                HttpError::conflict_at(message, "Idempotency-Key", "idempotency_key_reused", last)
            }
        }
    }
}

impl From<BatchError> for HttpError {
    fn from(error: BatchError) -> Self {
        let index = error.index;
        match error.error {
            AppendError::Ended
            | AppendError::Elsewhere
            | AppendError::SequenceConflict { .. }
            | AppendError::KeyReused { .. } => error.error.into(),
            other => HttpError::from(other).within(&format!("messages[{index}]")),
        }
    }
}

impl From<HubError> for HttpError {
    fn from(error: HubError) -> Self {
        let message = error.to_string();
        match error {
            HubError::Invalid(error) => error.into(),
            HubError::StreamLimitsTooSmall { .. } => {
                HttpError::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", message, None, "limits_too_small")
            }
            HubError::ClientStreams { retry_after, .. } => HttpError::budget(message, "too_many_streams", retry_after),
            HubError::ClientRate { retry_after, .. } => {
                let mut error = HttpError::new(
                    StatusCode::TOO_MANY_REQUESTS,
                    "rate_limit_error",
                    format!("{message}; retry in {} s", seconds(retry_after)),
                    None,
                    "rate_limit_exceeded",
                );
                error.retry = true;
                error.retry_after = Some(retry_after);
                error
            }
            other => HttpError::capacity(message, other.retry_after().map_or(Room::Never, Room::Expected)),
        }
    }
}

/// Whole seconds, rounded up.
fn seconds(duration: Duration) -> u64 {
    duration.as_millis().div_ceil(1000) as u64
}

impl From<StartError> for HttpError {
    fn from(error: StartError) -> Self {
        match error {
            StartError::UnknownModel(model) => HttpError::new(
                StatusCode::NOT_FOUND,
                "invalid_request_error",
                format!("the model {model:?} does not exist; GET /v1/models lists them"),
                Some("model".into()),
                "model_not_found",
            ),
            StartError::Hub(e) => e.into(),
            StartError::Refused(refusal) => HttpError::bad_request(refusal.message, refusal.param, "invalid_value"),
        }
    }
}

impl From<SubscribeError> for HttpError {
    fn from(error: SubscribeError) -> Self {
        match error {
            SubscribeError::SequenceAhead { .. } => {
                HttpError::bad_request(error.to_string(), Some("from".into()), "sequence_ahead")
            }
            _ => HttpError::capacity(error.to_string(), Room::Unknown),
        }
    }
}

impl From<ConversationError> for HttpError {
    fn from(error: ConversationError) -> Self {
        HttpError::bad_request(error.message, Some(error.param), "invalid_value")
    }
}

impl From<ThreadError> for HttpError {
    fn from(error: ThreadError) -> Self {
        let message = error.to_string();
        let conflict =
            |code| HttpError::new(StatusCode::CONFLICT, "invalid_request_error", message.clone(), None, code);
        match error {
            ThreadError::NotFound(_) => {
                HttpError::new(StatusCode::NOT_FOUND, "invalid_request_error", message, None, "thread_not_found")
            }
            ThreadError::Exists(_) => conflict("thread_exists").with_param("id"),
            ThreadError::InvalidId => HttpError::bad_request(message, Some("thread_id".into()), "invalid_value"),
            // A retry (the SDKs make two, backing off) may find the run ended.
            ThreadError::Busy { .. } => HttpError { retry: true, ..conflict("thread_busy") },
            ThreadError::Invalid(e) => e.into(),
            ThreadError::TooLarge { .. } => {
                HttpError::bad_request(message, Some("messages".into()), "thread_too_large")
            }
            ThreadError::Full { retry_after, .. } | ThreadError::BytesFull { retry_after, .. } => {
                HttpError::capacity(message, retry_after.map_or(Room::Never, Room::Expected))
            }
            ThreadError::ClientThreads { retry_after, .. } => {
                HttpError::budget(message, "too_many_threads", retry_after)
            }
            ThreadError::Upto(_) => HttpError::bad_request(message, Some("upto".into()), "invalid_value"),
            ThreadError::Start(e) => e.into(),
            ThreadError::Unavailable(_) => {
                let mut error = HttpError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "server_error",
                    message,
                    None,
                    "cluster_unavailable",
                );
                error.retry = true;
                error
            }
        }
    }
}
