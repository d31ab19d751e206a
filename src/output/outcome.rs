//! How a stream ended: [`Outcome`], the last input every adapter gets.
//!
//! Its JSON form is the body of `POST /v1/streams/{id}/end` and of a fixture's `outcome.json`:
//! `{"status": "completed" | "cancelled" | "error", "finish_reason"?, "usage"?, "error"?, "served_by"?}`. A
//! completed stream may say why it stopped (`length`, `content_filter`); the OpenAI adapter turns `stop` into
//! `tool_calls` by itself when the last thing the agent did was call tools. `served_by` names the upstream and
//! model that answered a run the catalogue routed (`NAME/model` or an alias); it is absent otherwise, so the
//! outcome of a built-in agent reads as it always did.

use serde::{Deserialize, Serialize};

use super::props::ErrorProps;
use super::validate::{LAGGED, ValidationError, check_name};

/// The end of a stream.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default, schemars::JsonSchema)]
pub struct Outcome {
    /// How it ended.
    pub status: EndStatus,
    /// Why a completed stream stopped; `stop` when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finish_reason: Option<FinishReason>,
    /// Token usage, when the agent knows it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    /// What went wrong, for status `error`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<ErrorProps>,
    /// Which upstream and model answered (for a failed run, whose failure ended it), when the catalogue chose
    /// (a `NAME/model` or an alias).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub served_by: Option<ServedBy>,
}

/// The upstream and model that answered a run the catalogue routed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct ServedBy {
    /// The upstream's name (`openai` of `openai/gpt-4o`); absent for a registered agent or the unnamed upstream.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upstream: Option<String>,
    /// The model as that upstream (or registered agent) knows it (`gpt-4o`).
    pub model: String,
}

impl Outcome {
    /// Completed normally.
    pub fn completed() -> Self {
        Outcome::default()
    }

    /// Cancelled on request.
    pub fn cancelled() -> Self {
        Outcome { status: EndStatus::Cancelled, ..Outcome::default() }
    }

    /// Failed with an error.
    pub fn failed(error: ErrorProps) -> Self {
        Outcome { status: EndStatus::Error, error: Some(error), ..Outcome::default() }
    }

    /// Adds token usage.
    pub fn with_usage(mut self, usage: Usage) -> Self {
        self.usage = Some(usage);
        self
    }

    /// Checks an outcome a producer sends: its error's `code` is a name, at most
    /// [`super::NAME_BYTES`] long (the field is `error.code`). Its size is the stream's to check.
    pub fn validate(&self) -> Result<(), ValidationError> {
        match self.error.as_ref().and_then(|e| e.code.as_deref()) {
            // The readers' `lagged` notice is the stream's own (`validate.rs`, "Lifecycle events").
            Some(LAGGED) => Err(ValidationError::Reserved { field: "error.code".into(), found: LAGGED.into() }),
            Some(code) => check_name("error.code", code),
            None => Ok(()),
        }
    }
}

/// A stream's status once it has ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum EndStatus {
    /// The agent finished.
    #[default]
    Completed,
    /// Someone asked it to stop.
    Cancelled,
    /// It failed.
    Error,
}

/// Why a completed stream stopped, in OpenAI's words.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    /// A natural end.
    #[default]
    Stop,
    /// The token limit was reached.
    Length,
    /// Content was withheld by a filter.
    ContentFilter,
    /// The last step called tools.
    ToolCalls,
}

impl FinishReason {
    /// OpenAI's name for it.
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::ContentFilter => "content_filter",
            FinishReason::ToolCalls => "tool_calls",
        }
    }
}

/// Token counts, all three as OpenAI clients require, and the prompt's cache use when the model reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default, schemars::JsonSchema)]
pub struct Usage {
    /// Tokens in the prompt, cached ones included.
    pub prompt_tokens: u64,
    /// Tokens generated.
    pub completion_tokens: u64,
    /// The sum.
    pub total_tokens: u64,
    /// How much of the prompt was read from or written to the provider's cache (OpenAI's field name); absent
    /// when the model did not say.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_tokens_details: Option<PromptTokensDetails>,
}

/// The prompt's cache use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default, schemars::JsonSchema)]
pub struct PromptTokensDetails {
    /// Prompt tokens read from the cache.
    pub cached_tokens: u64,
    /// Prompt tokens written to the cache (Anthropic's `cache_creation_input_tokens`), when said.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_creation_tokens: Option<u64>,
}

impl Usage {
    /// Usage from the two counts; the total is their sum.
    pub fn new(prompt_tokens: u64, completion_tokens: u64) -> Self {
        Usage {
            prompt_tokens,
            completion_tokens,
            total_tokens: prompt_tokens + completion_tokens,
            prompt_tokens_details: None,
        }
    }

    /// This usage and `more` added up (two model calls of one run); cache details where either has them.
    #[must_use]
    pub fn plus(self, more: Usage) -> Usage {
        let details = match (self.prompt_tokens_details, more.prompt_tokens_details) {
            (Some(a), Some(b)) => Some(PromptTokensDetails {
                cached_tokens: a.cached_tokens + b.cached_tokens,
                cache_creation_tokens: match (a.cache_creation_tokens, b.cache_creation_tokens) {
                    (Some(x), Some(y)) => Some(x + y),
                    (x, y) => x.or(y),
                },
            }),
            (a, b) => a.or(b),
        };
        Usage {
            prompt_tokens_details: details,
            ..Usage::new(self.prompt_tokens + more.prompt_tokens, self.completion_tokens + more.completion_tokens)
        }
    }
}
