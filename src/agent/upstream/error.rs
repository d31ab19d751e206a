//! What goes wrong talking to an upstream, and what the client is told.
//!
//! Before the upstream has sent a byte of its answer, a failure becomes the HTTP status the client gets
//! (through [`AgentError::status`]): a 429 stays a 429 with its `retry-after`, and so does Anthropic's 529
//! (overloaded, or an `overloaded_error` event before any content); a 400 stays a 400 with the
//! upstream's message; a 404 is `model_not_found`; a 401 or 403 (the upstream refused agentmux's
//! credentials, which are not the client's) is a 502; a 5xx is a 502; a timeout a 504. A request that never
//! reached the upstream is a 502 naming the step that failed (`upstream_dns`, `upstream_connect`,
//! `upstream_tls` with the certificate's reason; see `dial.rs`), or a 504 `upstream_timeout`. After the first byte,
//! the same errors end the stream with an `error`. The upstream's key never appears in a message: every text
//! that comes from the upstream is scrubbed of it.

use std::time::Duration;

use serde_json::Value;

use crate::agent::AgentError;

/// A failure of one upstream request.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum UpstreamError {
    /// The request never reached the upstream: `step` failed, for the reason `why`.
    Dial { step: DialStep, why: String },
    /// The connection broke, or failed in a way no step names.
    Connect(String),
    /// Nothing within the first-byte or the idle timeout.
    Timeout { what: &'static str, after: Duration },
    /// An HTTP error status before the stream.
    Status { status: u16, message: String, code: Option<String>, retry_after: Option<Duration> },
    /// An `error` event inside the stream.
    InStream { message: String, code: Option<String> },
    /// Something that is not the protocol (an event that is not JSON).
    Protocol(String),
}

/// The step of reaching the upstream that failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DialStep {
    /// Its host name did not resolve.
    Dns,
    /// No TCP connection (refused, reset, unreachable).
    Connect,
    /// The TLS handshake failed (a certificate not trusted or not for the host, a server that speaks no TLS).
    Tls,
}

impl DialStep {
    /// The code a client gets.
    pub(crate) fn code(self) -> &'static str {
        match self {
            DialStep::Dns => "upstream_dns",
            DialStep::Connect => "upstream_connect",
            DialStep::Tls => "upstream_tls",
        }
    }

    fn what(self) -> &'static str {
        match self {
            DialStep::Dns => "its host name did not resolve",
            DialStep::Connect => "no connection",
            DialStep::Tls => "the TLS handshake failed",
        }
    }
}

impl UpstreamError {
    /// The error the run ends with; `key` is scrubbed from every message.
    pub(crate) fn into_agent_error(self, key: Option<&str>) -> AgentError {
        let scrub = |text: String| match key.filter(|k| !k.is_empty()) {
            Some(key) => text.replace(key, "***"),
            None => text,
        };
        match self {
            UpstreamError::Dial { step, why } => {
                AgentError::new(scrub(format!("the upstream could not be reached: {}: {why}", step.what())))
                    .with_code(step.code())
                    .with_status(502)
            }
            UpstreamError::Connect(why) => AgentError::new(scrub(format!("the upstream could not be reached: {why}")))
                .with_code("upstream_unavailable")
                .with_status(502),
            UpstreamError::Timeout { what, after } => {
                AgentError::new(format!("the upstream sent nothing within the {what} timeout of {after:?}"))
                    .with_code("upstream_timeout")
                    .with_status(504)
            }
            UpstreamError::Status { status, message, code, retry_after } => {
                let message = scrub(message);
                let (status, code, message) = match status {
                    401 | 403 => (
                        502,
                        "upstream_auth".to_owned(),
                        format!("the upstream refused agentmux's credentials (HTTP {status})"),
                    ),
                    404 => (404, "model_not_found".to_owned(), format!("the upstream: {message}")),
                    429 => (
                        429,
                        code.unwrap_or_else(|| "rate_limit_exceeded".into()),
                        format!("the upstream is rate limiting: {message}"),
                    ),
                    // Anthropic's "overloaded": a refusal to retry later, as a 429 is.
                    529 => (
                        429,
                        code.unwrap_or_else(|| "overloaded_error".into()),
                        format!("the upstream is overloaded: {message}"),
                    ),
                    400..=499 => (
                        status,
                        code.unwrap_or_else(|| "upstream_bad_request".into()),
                        format!("the upstream refused the request (HTTP {status}): {message}"),
                    ),
                    _ => (502, "upstream_error".to_owned(), format!("the upstream failed (HTTP {status}): {message}")),
                };
                let mut error = AgentError::new(message).with_code(code).with_status(status);
                error.retry_after = retry_after;
                error
            }
            UpstreamError::InStream { message, code } => {
                AgentError::new(scrub(format!("the upstream failed: {message}")))
                    .with_code(code.unwrap_or_else(|| "upstream_error".into()))
                    .with_status(502)
            }
            UpstreamError::Protocol(why) => {
                AgentError::new(scrub(format!("the upstream's answer is not the stream its API sends: {why}")))
                    .with_code("upstream_protocol")
                    .with_status(502)
            }
        }
    }
}

/// The message and code of an OpenAI error body (`{"error": {"message", "code"}}`), or the body's text.
pub(crate) fn describe(body: &[u8]) -> (String, Option<String>) {
    let parsed: Option<Value> = serde_json::from_slice(body).ok();
    match parsed.as_ref().and_then(|v| v.get("error")) {
        Some(error) => describe_error(error),
        None => (String::from_utf8_lossy(body).chars().take(500).collect(), None),
    }
}

/// The message and code of an error object (`{"message", "code"}`), or of an error given as a bare string. A
/// number in `code` (vLLM puts the HTTP status there) is not a code.
pub(crate) fn describe_error(error: &Value) -> (String, Option<String>) {
    let message = error
        .get("message")
        .and_then(Value::as_str)
        .or_else(|| error.as_str())
        .map(str::to_owned)
        .unwrap_or_else(|| error.to_string().chars().take(500).collect());
    let code = error.get("code").and_then(Value::as_str).filter(|c| !c.is_empty()).map(str::to_owned);
    (message, code)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_and_the_key() {
        let status = |status| UpstreamError::Status {
            status,
            message: "bad key sk-secret".into(),
            code: None,
            retry_after: None,
        };
        let auth = status(401).into_agent_error(Some("sk-secret"));
        assert_eq!((auth.status, auth.code.as_deref()), (Some(502), Some("upstream_auth")));
        assert!(!auth.message.contains("sk-secret"));
        let bad = status(400).into_agent_error(Some("sk-secret"));
        assert_eq!(bad.status, Some(400));
        assert!(bad.message.contains("***") && !bad.message.contains("sk-secret"), "{}", bad.message);
        assert_eq!(status(503).into_agent_error(None).status, Some(502));
        assert_eq!(describe(br#"{"error": {"message": "m", "code": 500}}"#), ("m".into(), None));
        assert_eq!(
            describe(br#"{"error": {"message": "m", "code": "overloaded"}}"#),
            ("m".into(), Some("overloaded".into()))
        );
        assert_eq!(describe(b"plain").0, "plain");
    }

    #[test]
    fn dial_steps() {
        let tls = UpstreamError::Dial { step: DialStep::Tls, why: "invalid peer certificate: UnknownIssuer".into() }
            .into_agent_error(Some("sk-secret"));
        assert_eq!((tls.status, tls.code.as_deref()), (Some(502), Some("upstream_tls")));
        assert!(tls.message.contains("UnknownIssuer"), "{}", tls.message);
        let dns = UpstreamError::Dial { step: DialStep::Dns, why: "x".into() }.into_agent_error(None);
        assert_eq!(dns.code.as_deref(), Some("upstream_dns"));
        let timeout = UpstreamError::Timeout { what: "connect", after: Duration::from_secs(1) }.into_agent_error(None);
        assert_eq!((timeout.status, timeout.code.as_deref()), (Some(504), Some("upstream_timeout")));
    }
}
