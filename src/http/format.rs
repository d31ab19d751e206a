//! Which [`Format`] a request asks for: the one place queries, WebSocket ops and headers are read for it.
//!
//! Subscriptions (SSE `…/events`, the WebSocket `subscribe` op and `…/ws`) name a format with `format`
//! (`cui` by default, or `openai`) and the OpenAI options `include_usage` and `reasoning`. Chat completions
//! choose between OpenAI chunks and CUI with `accept` (query) or `x-agentmux-accept` (header), reasoning
//! with `x-agentmux-reasoning`, and usage with the request's own `stream_options.include_usage`.

use axum::http::HeaderMap;
use serde::Deserialize;

use super::HttpError;
use crate::adapter::ReasoningField;
use crate::render::Format;

/// A subscription's format fields, as a query or a WebSocket op carries them.
#[derive(Debug, Deserialize, Default, Clone)]
pub(crate) struct FormatFields {
    pub(crate) format: Option<String>,
    pub(crate) include_usage: Option<bool>,
    pub(crate) reasoning: Option<String>,
}

impl FormatFields {
    /// The format asked for.
    pub(crate) fn format(&self) -> Result<Format, HttpError> {
        let reasoning = reasoning(self.reasoning.as_deref(), "reasoning")?;
        let include_usage = self.include_usage.unwrap_or(false);
        match self.format.as_deref() {
            None | Some("cui") => Ok(Format::Cui),
            Some("openai") => Ok(Format::OpenAi { include_usage, reasoning }),
            Some(other) => Err(HttpError::bad_request(
                format!("format must be cui or openai, not {other:?}"),
                Some("format".into()),
                "invalid_value",
            )),
        }
    }
}

/// The format a chat completion answers in: `accept` from the query, else the `x-agentmux-accept` header.
pub(crate) fn chat(accept: Option<&str>, headers: &HeaderMap, include_usage: bool) -> Result<Format, HttpError> {
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).map(str::to_ascii_lowercase);
    let accept = accept.map(str::to_ascii_lowercase).or_else(|| header("x-agentmux-accept"));
    let cui = match accept.as_deref() {
        None | Some("openai" | "standard") => false,
        Some(a) if a == "cui" || a.starts_with("cui-") => true,
        Some(other) => {
            return Err(HttpError::bad_request(
                format!("accept must be openai, standard, cui or cui-<name>, not {other:?}"),
                Some("accept".into()),
                "invalid_value",
            ));
        }
    };
    let reasoning = reasoning(header("x-agentmux-reasoning").as_deref(), "x-agentmux-reasoning")?;
    Ok(if cui { Format::Cui } else { Format::OpenAi { include_usage, reasoning } })
}

/// Where reasoning goes, by name (`reasoning_content`, `reasoning`, `both`); `param` names the field at fault.
fn reasoning(name: Option<&str>, param: &str) -> Result<ReasoningField, HttpError> {
    match name {
        None | Some("reasoning_content") => Ok(ReasoningField::ReasoningContent),
        Some("reasoning") => Ok(ReasoningField::Reasoning),
        Some("both") => Ok(ReasoningField::Both),
        Some(other) => Err(HttpError::bad_request(
            format!("{param} must be reasoning_content, reasoning or both, not {other:?}"),
            Some(param.into()),
            "invalid_value",
        )),
    }
}
