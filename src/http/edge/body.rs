//! Reading request bodies: the size limit (413 with the envelope, not a bare status), the time limit (408:
//! a body trickled in a byte every few seconds is not held for ever), and JSON errors that name the field
//! (`messages[2].role`), for every endpoint that takes JSON.

use axum::body::{Body, Bytes};
use serde::de::DeserializeOwned;

use super::error::HttpError;
use crate::http::app::Settings;

/// The body, or 413 when it is over [`Settings::body_limit`], 408 when it has not all arrived within
/// [`Settings::body_timeout`], or 400 when it cannot be read.
pub(crate) async fn read(body: Body, settings: &Settings) -> Result<Bytes, HttpError> {
    let limit = settings.body_limit;
    let read = tokio::time::timeout(settings.body_timeout, axum::body::to_bytes(body, limit));
    match read.await {
        Err(_elapsed) => {
            let mut error = HttpError::new(
                axum::http::StatusCode::REQUEST_TIMEOUT,
                "invalid_request_error",
                format!("the request body did not arrive within {} s", settings.body_timeout.as_secs_f64()),
                None,
                "body_timeout",
            );
            // A slow network is what a retry can fix.
            error.retry = true;
            Err(error)
        }
        Ok(Ok(bytes)) => Ok(bytes),
        Ok(Err(error)) => {
            let over = std::error::Error::source(&error)
                .is_some_and(|e| e.downcast_ref::<http_body_util::LengthLimitError>().is_some())
                || error.to_string().contains("length limit");
            if over {
                Err(HttpError::body_too_large(limit))
            } else {
                Err(HttpError::bad_request(format!("the request body could not be read: {error}"), None, "bad_body"))
            }
        }
    }
}

/// Parses JSON into `T`; a syntax error is 400 `invalid_json`, a wrong field is 400 with `param` naming it.
///
/// A body that parses is read once, plainly; only one that does not is read again through
/// `serde_path_to_error`, for the path its error names. Tracking the path costs every request (a string for
/// each key on the way), and only a refusal needs it.
pub(crate) fn json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, HttpError> {
    let mut deserializer = serde_json::Deserializer::from_slice(bytes);
    match T::deserialize(&mut deserializer) {
        Ok(value) => {
            deserializer
                .end()
                .map_err(|e| HttpError::bad_request(format!("invalid JSON: {e}"), None, "invalid_json"))?;
            Ok(value)
        }
        Err(_) => json_refused(bytes),
    }
}

/// [`json`] for a body that did not parse: read again with its path tracked, for the error that names it.
fn json_refused<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, HttpError> {
    let mut deserializer = serde_json::Deserializer::from_slice(bytes);
    let value: T = serde_path_to_error::deserialize(&mut deserializer).map_err(|error| {
        let path = error.path().to_string();
        let inner = error.into_inner();
        let text = inner.to_string();
        let text = text.split(" at line ").next().unwrap_or(&text).to_owned();
        // serde_json reports some type errors (a number where an enum's string goes) as syntax errors:
        // only JSON that does not parse at all is invalid JSON.
        if !inner.is_data() && serde_json::from_slice::<serde::de::IgnoredAny>(bytes).is_err() {
            return HttpError::bad_request(format!("invalid JSON: {inner}"), None, "invalid_json");
        }
        let text = if inner.is_data() { text } else { "has the wrong type".to_owned() };
        // serde reports a missing field at the object that lacks it; name the field itself.
        let missing = text.strip_prefix("missing field `").and_then(|rest| rest.split('`').next());
        let param = match (path.as_str(), missing) {
            ("." | "", Some(field)) => Some(field.to_owned()),
            (path, Some(field)) => Some(format!("{path}.{field}")),
            ("." | "", None) => None,
            (path, None) => Some(path.to_owned()),
        };
        let message = match &param {
            Some(param) if missing.is_none() => format!("{param}: {text}"),
            _ => text,
        };
        HttpError::bad_request(message, param, "invalid_value")
    })?;
    deserializer.end().map_err(|e| HttpError::bad_request(format!("invalid JSON: {e}"), None, "invalid_json"))?;
    Ok(value)
}

/// Parses JSON into `T`, as [`json`] does; a body of white space only (or none) is `empty()`.
pub(crate) fn json_or<T: DeserializeOwned>(bytes: &[u8], empty: impl FnOnce() -> T) -> Result<T, HttpError> {
    if bytes.iter().all(u8::is_ascii_whitespace) { Ok(empty()) } else { json(bytes) }
}
