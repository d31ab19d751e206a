//! [`ErrorShape`]: the form of an error's body, which the front door that answers chooses, so that each
//! protocol's own clients read the error as their SDK expects.
//!
//! Every refusal starts as an [`HttpError`](super::HttpError), which answers in OpenAI's envelope and keeps
//! its [`ApiError`] in the response's extensions ([`Refused`]). The edge's last step (`limits.rs`, which
//! already wraps every route, auth and the body limits included) asks the [`ErrorShapes`] of the route the
//! request matched and, for a route that answers in another shape, renders the body again from that
//! [`ApiError`]. So a refusal raised before a handler runs (a missing key, a body over the limit, JSON that
//! does not parse) has the same shape as one the handler raised, and no handler renders a body itself.
//!
//! Anthropic's shape is `{"type": "error", "error": {"type", "message"}}`; the Anthropic SDKs (and
//! `@ai-sdk/anthropic`) read `error.type` and `error.message`. Its types follow the status, as Anthropic
//! answers them: 400 `invalid_request_error`, 401 `authentication_error`, 403 `permission_error`, 404
//! `not_found_error`, 413 `request_too_large`, 429 `rate_limit_error`, 503 and 529 `overloaded_error`, 504
//! `timeout_error`, any other 4xx `invalid_request_error` and 5xx `api_error`. agentmux's own `code` goes
//! in `details.error_code`, where both SDKs read Anthropic's (`error.errorCode` in `@anthropic-ai/sdk`).
//! Anthropic has no `param`: the field at fault leads the message (`messages[2].role: ...`), as
//! Anthropic's own messages name theirs.

use std::collections::HashMap;

use axum::body::Bytes;
use axum::http::StatusCode;
use serde_json::json;

use crate::adapter::ApiError;

/// The form of an error's body.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum ErrorShape {
    /// `{"error": {"message", "type", "param", "code"}}`.
    #[default]
    OpenAi,
    /// `{"type": "error", "error": {"type", "message"}}`.
    Anthropic,
}

/// The error an [`HttpError`](super::HttpError) response stands for, kept in its extensions so that the
/// edge can render it again in the route's shape.
#[derive(Debug, Clone)]
pub(crate) struct Refused(pub(crate) ApiError);

/// The shape of each route (its matched template) that does not answer in OpenAI's envelope.
#[derive(Debug, Clone, Default)]
pub(crate) struct ErrorShapes(HashMap<&'static str, ErrorShape>);

impl ErrorShapes {
    /// The shapes of `routes`: (route template, shape).
    pub(crate) fn new(routes: impl IntoIterator<Item = (&'static str, ErrorShape)>) -> Self {
        ErrorShapes(routes.into_iter().filter(|(_, shape)| *shape != ErrorShape::OpenAi).collect())
    }

    /// The shape of the route `route` (a matched template; none for a request no route matched).
    pub(crate) fn of(&self, route: Option<&str>) -> ErrorShape {
        route.and_then(|route| self.0.get(route)).copied().unwrap_or_default()
    }
}

impl ErrorShape {
    /// `error`, answered with `status`, as this shape's body.
    pub(crate) fn render(self, status: StatusCode, error: &ApiError) -> Bytes {
        match self {
            ErrorShape::OpenAi => error.to_json(),
            ErrorShape::Anthropic => {
                let message = match error.param.as_deref() {
                    Some(param) if !param.is_empty() && !error.message.starts_with(param) => {
                        format!("{param}: {}", error.message)
                    }
                    _ => error.message.clone(),
                };
                let mut body = json!({"type": "error", "error": {"type": anthropic_type(status), "message": message}});
                if let Some(code) = &error.code {
                    body["error"]["details"] = json!({"error_code": code});
                }
                Bytes::from(body.to_string())
            }
        }
    }
}

/// Anthropic's error type for `status`.
fn anthropic_type(status: StatusCode) -> &'static str {
    match status.as_u16() {
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        503 | 529 => "overloaded_error",
        504 => "timeout_error",
        400..=499 => "invalid_request_error",
        _ => "api_error",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn error(param: Option<&str>) -> ApiError {
        ApiError {
            message: "no such model".into(),
            kind: "invalid_request_error".into(),
            param: param.map(str::to_owned),
            code: Some("model_not_found".into()),
            last_sequence: None,
        }
    }

    #[test]
    fn anthropic_names_the_type_by_status_and_the_field_in_the_message() {
        let body = ErrorShape::Anthropic.render(StatusCode::NOT_FOUND, &error(Some("model")));
        let body: serde_json::Value = serde_json::from_slice(&body).expect("JSON");
        let expected = json!({"type": "error", "error": {
            "type": "not_found_error", "message": "model: no such model", "details": {"error_code": "model_not_found"},
        }});
        assert_eq!(body, expected);
        let kinds: Vec<&str> = [400, 401, 403, 409, 413, 429, 500, 503]
            .into_iter()
            .map(|s| anthropic_type(StatusCode::from_u16(s).expect("a status")))
            .collect();
        assert_eq!(
            kinds,
            [
                "invalid_request_error",
                "authentication_error",
                "permission_error",
                "invalid_request_error",
                "request_too_large",
                "rate_limit_error",
                "api_error",
                "overloaded_error"
            ]
        );
    }

    #[test]
    fn routes_without_a_shape_answer_in_openai_s_envelope() {
        let shapes =
            ErrorShapes::new([("/v1/messages", ErrorShape::Anthropic), ("/v1/chat/completions", ErrorShape::OpenAi)]);
        assert_eq!(shapes.of(Some("/v1/messages")), ErrorShape::Anthropic);
        assert_eq!(shapes.of(Some("/v1/chat/completions")), ErrorShape::OpenAi);
        assert_eq!(shapes.of(None), ErrorShape::OpenAi);
        let body = ErrorShape::OpenAi.render(StatusCode::NOT_FOUND, &error(None));
        assert_eq!(body, error(None).to_json());
    }
}
