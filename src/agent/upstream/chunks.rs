//! Reading an upstream's answer: the SSE body (parsed by a well-kept SSE crate) as [`Chunk`]s, within the
//! first-byte and idle timeouts.
//!
//! Parsing is lenient where providers differ and strict where it matters. Comments (`: OPENROUTER
//! PROCESSING`, `: keep-alive`) are skipped by the SSE parser; unknown fields (`timings`,
//! `system_fingerprint`, `obfuscation`, `provider`) are ignored; `content: null`, an empty first delta, a
//! `role` repeated on every delta, `choices: []` without usage, usage on the finish chunk or in a chunk of its
//! own, and a `finish_reason` sent twice are all taken as they come. An `error` object in a data event
//! (vLLM, OpenAI) ends the answer with that error, whatever the type of its `code`. `[DONE]`, or the end of
//! the body, ends it.

use std::pin::Pin;
use std::time::Duration;

use eventsource_stream::{Event, EventStreamError, Eventsource};
use futures::{Stream, StreamExt};
use serde::Deserialize;
use serde_json::Value;

use super::error::UpstreamError;

/// One chunk, as far as agentmux reads it.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct Chunk {
    #[serde(default)]
    pub(crate) choices: Vec<Choice>,
    #[serde(default)]
    pub(crate) usage: Option<WireUsage>,
    #[serde(default)]
    error: Option<Value>,
}

#[derive(Debug, Default, Deserialize)]
pub(crate) struct Choice {
    #[serde(default)]
    pub(crate) delta: Option<Delta>,
    #[serde(default)]
    pub(crate) finish_reason: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
pub(crate) struct Delta {
    #[serde(default)]
    pub(crate) content: Option<String>,
    #[serde(default)]
    pub(crate) reasoning_content: Option<String>,
    #[serde(default)]
    pub(crate) reasoning: Option<String>,
    #[serde(default)]
    pub(crate) tool_calls: Option<Vec<ToolCallDelta>>,
}

#[derive(Debug, Default, Deserialize)]
pub(crate) struct ToolCallDelta {
    #[serde(default)]
    pub(crate) index: Option<u32>,
    #[serde(default)]
    pub(crate) id: Option<String>,
    #[serde(default)]
    pub(crate) function: Option<FunctionDelta>,
}

#[derive(Debug, Default, Deserialize)]
pub(crate) struct FunctionDelta {
    #[serde(default)]
    pub(crate) name: Option<String>,
    #[serde(default)]
    pub(crate) arguments: Option<String>,
}

#[derive(Debug, Default, Clone, Copy, Deserialize)]
pub(crate) struct WireUsage {
    #[serde(default)]
    pub(crate) prompt_tokens: u64,
    #[serde(default)]
    pub(crate) completion_tokens: u64,
}

type Events = Pin<Box<dyn Stream<Item = Result<Event, EventStreamError<reqwest::Error>>> + Send>>;

/// The chunks of one answer.
pub(crate) struct Chunks {
    events: Events,
    first_byte: Duration,
    idle: Duration,
    started: bool,
    done: bool,
}

impl Chunks {
    /// Reads `response`'s body: the first event within `first_byte`, each next one within `idle`.
    pub(crate) fn new(response: reqwest::Response, first_byte: Duration, idle: Duration) -> Self {
        Chunks {
            events: Box::pin(response.bytes_stream().eventsource()),
            first_byte,
            idle,
            started: false,
            done: false,
        }
    }

    /// The next chunk; `None` at `[DONE]` or the end of the body.
    pub(crate) async fn next(&mut self) -> Result<Option<Chunk>, UpstreamError> {
        loop {
            if self.done {
                return Ok(None);
            }
            let (wait, what) = if self.started { (self.idle, "idle") } else { (self.first_byte, "first-byte") };
            let event = match tokio::time::timeout(wait, self.events.next()).await {
                Err(_) => return Err(UpstreamError::Timeout { what, after: wait }),
                Ok(None) => {
                    self.done = true;
                    return Ok(None);
                }
                Ok(Some(Err(error))) => return Err(UpstreamError::Connect(error.to_string())),
                Ok(Some(Ok(event))) => event,
            };
            self.started = true;
            let data = event.data.trim();
            if data.is_empty() {
                continue;
            }
            if data == "[DONE]" {
                self.done = true;
                return Ok(None);
            }
            let chunk: Chunk = serde_json::from_str(data)
                .map_err(|e| UpstreamError::Protocol(format!("{e}: {}", data.chars().take(200).collect::<String>())))?;
            if let Some(error) = chunk.error.as_ref().filter(|e| !e.is_null()) {
                let (message, code) = super::error::describe_error(error);
                self.done = true;
                return Err(UpstreamError::InStream { message, code });
            }
            return Ok(Some(chunk));
        }
    }
}
