//! [`HttpError`]: the one place where errors become HTTP statuses and OpenAI error envelopes.
//!
//! Every refusal is `{"error": {"message", "type", "param", "code"}}` with a 4xx status for anything the
//! client did wrong (`param` names the field: `messages[2].role`, `messages[3].props.url`), so OpenAI SDKs
//! raise the right exception. OpenAI SDKs retry 408, 409, 429 and 5xx twice by default; errors that a retry
//! cannot fix carry `x-should-retry: false`.

use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

use crate::adapter::ApiError;
use crate::agent::StartError;
use crate::hub::{AppendError, BatchError, HubError, SubscribeError};
use crate::output::ValidationError;

/// An error response.
#[derive(Debug, Clone, PartialEq)]
pub struct HttpError {
    /// The status.
    pub status: StatusCode,
    /// The envelope's body.
    pub error: ApiError,
    /// Whether a client may retry (sets `x-should-retry`).
    pub retry: bool,
}

impl HttpError {
    /// An error with every field given.
    pub fn new(status: StatusCode, kind: &str, message: impl Into<String>, param: Option<String>, code: &str) -> Self {
        HttpError {
            status,
            error: ApiError { message: message.into(), kind: kind.into(), param, code: Some(code.into()) },
            retry: false,
        }
    }

    /// 503 `capacity`: the service is full; a retry may succeed once something ends or is evicted.
    pub fn capacity(message: impl Into<String>) -> Self {
        let mut error = HttpError::new(StatusCode::SERVICE_UNAVAILABLE, "server_error", message, None, "capacity");
        error.retry = true;
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

    /// Prefixes `param` with `prefix` (`messages[3]` + `.props.url`).
    pub fn within(mut self, prefix: &str) -> Self {
        self.error.param = Some(match self.error.param.take() {
            Some(param) if !param.is_empty() => format!("{prefix}.{param}"),
            _ => prefix.to_owned(),
        });
        self
    }
}

impl IntoResponse for HttpError {
    fn into_response(self) -> Response {
        let mut response = (self.status, [("content-type", "application/json")], self.error.to_json()).into_response();
        if !self.retry {
            response.headers_mut().insert("x-should-retry", HeaderValue::from_static("false"));
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
            AppendError::HubFull { .. } => HttpError::capacity(message),
        }
    }
}

impl From<BatchError> for HttpError {
    fn from(error: BatchError) -> Self {
        let index = error.index;
        match error.error {
            AppendError::Ended => error.error.into(),
            other => HttpError::from(other).within(&format!("messages[{index}]")),
        }
    }
}

impl From<HubError> for HttpError {
    fn from(error: HubError) -> Self {
        match error {
            HubError::Invalid(error) => error.into(),
            HubError::StreamLimitsTooSmall { .. } => HttpError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "server_error",
                error.to_string(),
                None,
                "limits_too_small",
            ),
            _ => HttpError::capacity(error.to_string()),
        }
    }
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
        }
    }
}

impl From<SubscribeError> for HttpError {
    fn from(error: SubscribeError) -> Self {
        match error {
            SubscribeError::SequenceAhead { .. } => {
                HttpError::bad_request(error.to_string(), Some("from".into()), "sequence_ahead")
            }
            _ => HttpError::capacity(error.to_string()),
        }
    }
}
