//! [`OpenAiChat`]: the [`Dialect`] of OpenAI's chat completions, which OpenAI and every server compatible with
//! it speak (vLLM, Ollama, llama.cpp's `llama-server`, DeepSeek, OpenRouter, gateways): `POST
//! {base}/chat/completions`, `GET {base}/models`, the key as `Authorization: Bearer`, errors as `{"error":
//! {"message", "code"}}`. The body is `request.rs`.
//!
//! Reading chunks is lenient where providers differ and strict where it matters: unknown fields (`timings`,
//! `system_fingerprint`, `obfuscation`, `provider`) are ignored; `content: null`, an empty first delta, a
//! `role` repeated on every delta, `choices: []` without usage, usage on the finish chunk or in a chunk of its
//! own, and a `finish_reason` sent twice are all taken as they come. Reasoning is `reasoning_content`
//! (DeepSeek, vLLM, llama.cpp) or `reasoning` (Ollama, OpenRouter). An `error` object in a data event (vLLM,
//! OpenAI) ends the answer with that error, whatever the type of its `code`. `[DONE]`, or the end of the
//! body, ends it.

use serde::Deserialize;
use serde_json::Value;

use super::dialect::{Decoded, Decoder, Delta, Dialect};
use super::error::{self, UpstreamError};
use super::request;
use crate::agent::ToolSet;
use crate::conversation::{ChatMessage, Conversation};
use crate::output::Usage;

/// OpenAI's chat completions.
#[derive(Debug, Clone, Copy)]
pub(crate) struct OpenAiChat;

impl Dialect for OpenAiChat {
    fn call_path(&self) -> &'static str {
        "chat/completions"
    }

    fn models_path(&self) -> &'static str {
        "models"
    }

    fn authorize(&self, request: reqwest::RequestBuilder, key: Option<&str>) -> reqwest::RequestBuilder {
        match key {
            Some(key) => request.bearer_auth(key),
            None => request,
        }
    }

    fn body(&self, conversation: &Conversation, messages: &[ChatMessage], tools: &ToolSet, text_mode: bool) -> Value {
        request::body(conversation, messages, tools, text_mode)
    }

    fn describe_error(&self, body: &[u8]) -> (String, Option<String>) {
        error::describe(body)
    }

    fn decoder(&self) -> Box<dyn Decoder> {
        Box::new(ChunkDecoder)
    }
}

/// Chunks into deltas; a chunk says all it has, so nothing is kept between them.
struct ChunkDecoder;

impl Decoder for ChunkDecoder {
    fn decode(&mut self, _event: &str, data: &str) -> Result<Decoded, UpstreamError> {
        if data == "[DONE]" {
            return Ok(Decoded { deltas: Vec::new(), done: true });
        }
        let chunk: Chunk = serde_json::from_str(data)
            .map_err(|e| UpstreamError::Protocol(format!("{e}: {}", data.chars().take(200).collect::<String>())))?;
        if let Some(error) = chunk.error.as_ref().filter(|e| !e.is_null()) {
            let (message, code) = error::describe_error(error);
            return Err(UpstreamError::InStream { message, code });
        }
        let mut deltas = Vec::new();
        if let Some(usage) = chunk.usage {
            deltas.push(Delta::Usage(Usage::new(usage.prompt_tokens, usage.completion_tokens)));
        }
        for choice in chunk.choices {
            if let Some(reason) = choice.finish_reason.filter(|r| !r.is_empty()) {
                deltas.push(Delta::Finish(reason));
            }
            let Some(delta) = choice.delta else { continue };
            if let Some(reasoning) = delta.reasoning_content.or(delta.reasoning).filter(|r| !r.is_empty()) {
                deltas.push(Delta::Thinking(reasoning));
            }
            if let Some(content) = delta.content.filter(|c| !c.is_empty()) {
                deltas.push(Delta::Text(content));
            }
            for (position, call) in delta.tool_calls.into_iter().flatten().enumerate() {
                let function = call.function.unwrap_or_default();
                deltas.push(Delta::ToolCall {
                    index: Some(call.index.unwrap_or(position as u32)),
                    id: call.id,
                    name: function.name,
                    arguments: function.arguments.unwrap_or_default(),
                });
            }
        }
        Ok(Decoded { deltas, done: false })
    }
}

/// One chunk, as far as agentmux reads it.
#[derive(Debug, Default, Deserialize)]
struct Chunk {
    #[serde(default)]
    choices: Vec<Choice>,
    #[serde(default)]
    usage: Option<WireUsage>,
    #[serde(default)]
    error: Option<Value>,
}

#[derive(Debug, Default, Deserialize)]
struct Choice {
    #[serde(default)]
    delta: Option<WireDelta>,
    #[serde(default)]
    finish_reason: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
struct WireDelta {
    #[serde(default)]
    content: Option<String>,
    #[serde(default)]
    reasoning_content: Option<String>,
    #[serde(default)]
    reasoning: Option<String>,
    #[serde(default)]
    tool_calls: Option<Vec<ToolCallDelta>>,
}

#[derive(Debug, Default, Deserialize)]
struct ToolCallDelta {
    #[serde(default)]
    index: Option<u32>,
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    function: Option<FunctionDelta>,
}

#[derive(Debug, Default, Deserialize)]
struct FunctionDelta {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    arguments: Option<String>,
}

#[derive(Debug, Default, Clone, Copy, Deserialize)]
struct WireUsage {
    #[serde(default)]
    prompt_tokens: u64,
    #[serde(default)]
    completion_tokens: u64,
}
