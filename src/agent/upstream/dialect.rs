//! The seam between the upstream agent and the API an upstream speaks: a [`Dialect`] owns everything that
//! differs from one API to another, so that the tool loop, text mode, cancel and error handling (`mod.rs`,
//! `model_call.rs`) are one mechanism for every kind.
//!
//! A dialect renders the request (its path, its credentials' header, its body from the validated
//! conversation), names where its models are listed, reads its error bodies, and turns its SSE events into
//! the same [`Delta`]s through a [`Decoder`] made for each model call (the decoder holds what one answer's
//! events leave to the next: which content block an index is, the usage so far). Two implementations:
//! `openai.rs` (chat completions: OpenAI and every server compatible with it) and `anthropic/` (the Messages
//! API).

use serde_json::Value;

use super::error::UpstreamError;
use crate::agent::ToolSet;
use crate::conversation::{ChatMessage, Conversation};
use crate::output::Usage;

/// What one SSE event of an answer says, in the words every dialect is read into.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Delta {
    /// Answer text.
    Text(String),
    /// Reasoning text, continuing the thinking block being streamed (a new one after a signature).
    Thinking(String),
    /// The signature that closes the thinking block being streamed; kept so the next turn can send it back.
    Signature(String),
    /// A thinking block the provider sends encrypted (Anthropic's `redacted_thinking`), as its data.
    RedactedThinking(String),
    /// A fragment of the tool call at `index`: its id and name when they first come, then its arguments.
    ToolCall { index: Option<u32>, id: Option<String>, name: Option<String>, arguments: String },
    /// Why the answer stopped, in OpenAI's words (`stop`, `length`, `tool_calls`, `content_filter`).
    Finish(String),
    /// The usage so far: each one replaces the one before.
    Usage(Usage),
}

/// What a decoder makes of one event.
#[derive(Debug, Default)]
pub(crate) struct Decoded {
    pub(crate) deltas: Vec<Delta>,
    /// The answer is complete (`[DONE]`, `message_stop`): nothing after it is read.
    pub(crate) done: bool,
}

/// Reads the events of one answer into deltas.
pub(crate) trait Decoder: Send {
    /// The deltas of one event (`event` is its SSE event name, empty when it has none); an error event
    /// is the error the answer ends with.
    fn decode(&mut self, event: &str, data: &str) -> Result<Decoded, UpstreamError>;
}

/// An upstream API.
pub(crate) trait Dialect: Send + Sync + std::fmt::Debug {
    /// The path of a model call under the base URL (`chat/completions`, `messages`).
    fn call_path(&self) -> &'static str;

    /// The path of the model list under the base URL; its answer holds `data[].id`.
    fn models_path(&self) -> &'static str;

    /// `request` with the credentials as this API takes them, and any header it requires.
    fn authorize(&self, request: reqwest::RequestBuilder, key: Option<&str>) -> reqwest::RequestBuilder;

    /// The body of a model call: the validated conversation's `messages` so far, the run's `tools`, the
    /// client's options; `text_mode` when the model has no native tools.
    fn body(&self, conversation: &Conversation, messages: &[ChatMessage], tools: &ToolSet, text_mode: bool) -> Value;

    /// The message and code of an error body (the body's text when it is not this API's error shape).
    fn describe_error(&self, body: &[u8]) -> (String, Option<String>);

    /// A decoder for one answer.
    fn decoder(&self) -> Box<dyn Decoder>;
}
