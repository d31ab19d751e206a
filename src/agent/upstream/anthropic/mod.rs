//! [`Anthropic`]: the [`Dialect`] of Anthropic's Messages API (`kind = "anthropic"`): `POST {base}/messages`,
//! `GET {base}/models?limit=1000` (its `data[].id`, as OpenAI's; 1,000 is the most one page holds), the key
//! as `x-api-key` with `anthropic-version: 2023-06-01`, errors as `{"type": "error", "error": {"type",
//! "message"}}` (the error's `type`, `rate_limit_error` or `overloaded_error`, is the code a client gets).
//!
//! - `request.rs`: the body (system top-level, content blocks, tools, `max_tokens`, thinking);
//! - `events.rs`: the streamed events as the deltas every dialect is read into.
//!
//! An HTTP 529 (overloaded) is taken as a 429 is (see `error.rs`): a refusal a client may retry, with its
//! `retry-after`.

mod events;
mod request;

use serde_json::Value;

use super::dialect::{Decoder, Dialect};
use crate::agent::ToolSet;
use crate::conversation::{ChatMessage, Conversation};

/// The API version agentmux speaks (Anthropic's stable one).
const VERSION: &str = "2023-06-01";

/// Anthropic's Messages API.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Anthropic;

impl Dialect for Anthropic {
    fn call_path(&self) -> &'static str {
        "messages"
    }

    fn models_path(&self) -> &'static str {
        "models?limit=1000"
    }

    fn authorize(&self, request: reqwest::RequestBuilder, key: Option<&str>) -> reqwest::RequestBuilder {
        let request = request.header("anthropic-version", VERSION);
        match key {
            Some(key) => request.header("x-api-key", key),
            None => request,
        }
    }

    fn body(&self, conversation: &Conversation, messages: &[ChatMessage], tools: &ToolSet, text_mode: bool) -> Value {
        request::body(conversation, messages, tools, text_mode)
    }

    fn describe_error(&self, body: &[u8]) -> (String, Option<String>) {
        let parsed: Option<Value> = serde_json::from_slice(body).ok();
        match parsed.as_ref().and_then(|v| v.get("error")) {
            Some(error) => describe_error(error),
            None => (String::from_utf8_lossy(body).chars().take(500).collect(), None),
        }
    }

    fn decoder(&self) -> Box<dyn Decoder> {
        Box::new(events::EventDecoder::default())
    }
}

/// The message and code (its `type`) of an error object.
fn describe_error(error: &Value) -> (String, Option<String>) {
    let message = error.get("message").and_then(Value::as_str).map_or_else(|| error.to_string(), str::to_owned);
    let code = error.get("type").and_then(Value::as_str).filter(|c| !c.is_empty()).map(str::to_owned);
    (message, code)
}
