//! Which [`Format`] a request asks for: the one place queries, WebSocket ops and headers are read for it.
//!
//! Subscriptions (SSE `…/events`, the WebSocket `subscribe` op and `…/ws`) name a format with `format`
//! (`cui` by default, `openai`, `ui-message`, `ag-ui`, `anthropic` or `responses`) and the OpenAI options `include_usage`, `reasoning` and `agent_tools`.
//! Chat completions choose between OpenAI chunks and CUI with `accept` (query) or `x-agentmux-accept`
//! (header), reasoning with `x-agentmux-reasoning`, the agent's own tool calls with `x-agentmux-agent-tools`,
//! and usage with the request's own `stream_options.include_usage`.

use axum::http::HeaderMap;
use serde::Deserialize;

use crate::adapter::{AgentTools, ReasoningField};
use crate::http::edge::error::HttpError;
use crate::render::Format;

/// A subscription's format fields, as a query or a WebSocket op carries them.
#[derive(Debug, Deserialize, Default, Clone)]
pub(crate) struct FormatFields {
    pub(crate) format: Option<String>,
    pub(crate) include_usage: Option<bool>,
    pub(crate) reasoning: Option<String>,
    pub(crate) agent_tools: Option<String>,
}

impl FormatFields {
    /// The format asked for.
    pub(crate) fn format(&self) -> Result<Format, HttpError> {
        let reasoning = reasoning(self.reasoning.as_deref(), "reasoning")?;
        let agent_tools = agent_tools(self.agent_tools.as_deref(), "agent_tools")?;
        let include_usage = self.include_usage.unwrap_or(false);
        match self.format.as_deref() {
            None | Some("cui") => Ok(Format::Cui),
            Some("openai") => Ok(Format::OpenAi { include_usage, reasoning, agent_tools }),
            Some("ui-message") => Ok(Format::UiMessage),
            Some("ag-ui") => Ok(Format::AgUi),
            Some("anthropic") => Ok(Format::Anthropic),
            Some("responses") => Ok(Format::Responses),
            Some(other) => Err(HttpError::bad_request(
                format!("format must be cui, openai, ui-message, ag-ui, anthropic or responses, not {other:?}"),
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
    let agent_tools = agent_tools(header("x-agentmux-agent-tools").as_deref(), "x-agentmux-agent-tools")?;
    Ok(if cui { Format::Cui } else { Format::OpenAi { include_usage, reasoning, agent_tools } })
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

/// How the agent's own tool calls appear, by name (`reasoning`, `hidden`); `param` names the field at fault.
fn agent_tools(name: Option<&str>, param: &str) -> Result<AgentTools, HttpError> {
    match name {
        None | Some("reasoning") => Ok(AgentTools::Reasoning),
        Some("hidden") => Ok(AgentTools::Hidden),
        Some(other) => Err(HttpError::bad_request(
            format!("{param} must be reasoning or hidden, not {other:?}"),
            Some(param.into()),
            "invalid_value",
        )),
    }
}
