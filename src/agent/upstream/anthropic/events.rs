//! The events of a streamed Messages answer as [`Delta`]s.
//!
//! `message_start` carries the input usage (`input_tokens`, `cache_creation_input_tokens`,
//! `cache_read_input_tokens`); each content block is `content_block_start` (`text`, `thinking`,
//! `redacted_thinking` with its `data`, `tool_use` with its `id` and `name`), its `content_block_delta`s
//! (`text_delta`, `thinking_delta`, `signature_delta`, `input_json_delta` with `partial_json`), then
//! `content_block_stop`; `message_delta` carries the `stop_reason` and the output usage; `message_stop`
//! ends the answer. `ping` and unknown events (Anthropic adds some) say nothing. An `error` event ends the
//! answer: `overloaded_error` as a 529 and `rate_limit_error` as a 429, so that before the client has a byte
//! the run is refused as any rate-limited upstream's is (a fallback moves on); others as an error in the
//! stream.
//!
//! Usage: Anthropic counts cached input apart from `input_tokens`; agentmux's `prompt_tokens` is all of the
//! input (as OpenAI's is), with the cache reads and writes in `prompt_tokens_details`.

use std::collections::HashMap;

use serde_json::Value;

use crate::agent::upstream::dialect::{Decoded, Decoder, Delta};
use crate::agent::upstream::error::UpstreamError;
use crate::output::{PromptTokensDetails, Usage};

/// What the events so far said that later ones build on.
#[derive(Debug, Default)]
pub(crate) struct EventDecoder {
    /// The tool-use blocks by their index (the only blocks whose deltas need their start).
    tool_blocks: HashMap<u64, u32>,
    input: u64,
    cache_creation: Option<u64>,
    cache_read: Option<u64>,
    output: u64,
}

impl Decoder for EventDecoder {
    fn decode(&mut self, _event: &str, data: &str) -> Result<Decoded, UpstreamError> {
        let event: Value = serde_json::from_str(data)
            .map_err(|e| UpstreamError::Protocol(format!("{e}: {}", data.chars().take(200).collect::<String>())))?;
        let mut deltas = Vec::new();
        let mut done = false;
        match event.get("type").and_then(Value::as_str).unwrap_or("") {
            "message_start" => {
                self.usage(event.get("message").and_then(|m| m.get("usage")));
                deltas.push(Delta::Usage(self.total()));
            }
            "content_block_start" => {
                let index = event.get("index").and_then(Value::as_u64).unwrap_or(0);
                deltas.extend(self.start(index, event.get("content_block").unwrap_or(&Value::Null)));
            }
            "content_block_delta" => {
                let index = event.get("index").and_then(Value::as_u64).unwrap_or(0);
                deltas.extend(self.delta(index, event.get("delta").unwrap_or(&Value::Null)));
            }
            "message_delta" => {
                self.usage(event.get("usage"));
                deltas.push(Delta::Usage(self.total()));
                if let Some(reason) = event.get("delta").and_then(|d| d.get("stop_reason")).and_then(Value::as_str) {
                    deltas.push(Delta::Finish(finish_reason(reason).into()));
                }
            }
            "message_stop" => done = true,
            "error" => return Err(error_event(event.get("error").unwrap_or(&Value::Null))),
            _ => {}
        }
        Ok(Decoded { deltas, done })
    }
}

impl EventDecoder {
    fn start(&mut self, index: u64, block: &Value) -> Option<Delta> {
        let text = |key: &str| block.get(key).and_then(Value::as_str).unwrap_or("").to_owned();
        match block.get("type").and_then(Value::as_str)? {
            "text" => Some(Delta::Text(text("text"))).filter(|d| d != &Delta::Text(String::new())),
            "thinking" => Some(Delta::Thinking(text("thinking"))).filter(|d| d != &Delta::Thinking(String::new())),
            "redacted_thinking" => Some(Delta::RedactedThinking(text("data"))),
            "tool_use" => {
                let position = self.tool_blocks.len() as u32;
                self.tool_blocks.insert(index, position);
                Some(Delta::ToolCall {
                    index: Some(position),
                    id: Some(text("id")),
                    name: Some(text("name")),
                    arguments: String::new(),
                })
            }
            _ => None,
        }
    }

    fn delta(&mut self, index: u64, delta: &Value) -> Option<Delta> {
        let text = |key: &str| delta.get(key).and_then(Value::as_str).map(str::to_owned);
        match delta.get("type").and_then(Value::as_str)? {
            "text_delta" => text("text").map(Delta::Text),
            "thinking_delta" => text("thinking").map(Delta::Thinking),
            "signature_delta" => text("signature").map(Delta::Signature),
            "input_json_delta" => Some(Delta::ToolCall {
                index: Some(*self.tool_blocks.get(&index)?),
                id: None,
                name: None,
                arguments: text("partial_json")?,
            }),
            _ => None,
        }
    }

    /// Takes the counts a usage object has (`message_delta`'s are cumulative).
    fn usage(&mut self, usage: Option<&Value>) {
        let Some(usage) = usage else { return };
        let count = |key: &str| usage.get(key).and_then(Value::as_u64);
        self.input = count("input_tokens").unwrap_or(self.input);
        self.output = count("output_tokens").unwrap_or(self.output);
        self.cache_creation = count("cache_creation_input_tokens").or(self.cache_creation);
        self.cache_read = count("cache_read_input_tokens").or(self.cache_read);
    }

    fn total(&self) -> Usage {
        let (creation, read) = (self.cache_creation.unwrap_or(0), self.cache_read.unwrap_or(0));
        let mut usage = Usage::new(self.input + creation + read, self.output);
        if self.cache_creation.is_some() || self.cache_read.is_some() {
            usage.prompt_tokens_details =
                Some(PromptTokensDetails { cached_tokens: read, cache_creation_tokens: self.cache_creation });
        }
        usage
    }
}

/// A `stop_reason` in OpenAI's words: `max_tokens` is `length`, `tool_use` is `tool_calls`, `refusal` is
/// `content_filter`, and every other (`end_turn`, `stop_sequence`, `pause_turn`) a natural stop.
pub(crate) fn finish_reason(reason: &str) -> &'static str {
    match reason {
        "max_tokens" | "model_context_window_exceeded" => "length",
        "tool_use" => "tool_calls",
        "refusal" => "content_filter",
        _ => "stop",
    }
}

/// An `error` object (`{"type", "message"}`) as the failure it is.
pub(crate) fn error_event(error: &Value) -> UpstreamError {
    let (message, code) = super::describe_error(error);
    match code.as_deref() {
        Some("overloaded_error") => UpstreamError::Status { status: 529, message, code, retry_after: None },
        Some("rate_limit_error") => UpstreamError::Status { status: 429, message, code, retry_after: None },
        _ => UpstreamError::InStream { message, code },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode(decoder: &mut EventDecoder, data: &str) -> Vec<Delta> {
        decoder.decode("", data).unwrap().deltas
    }

    #[test]
    fn blocks_usage_and_stop_reason() {
        let mut d = EventDecoder::default();
        let usage = decode(
            &mut d,
            r#"{"type":"message_start","message":{"usage":{"input_tokens":10,"cache_read_input_tokens":90,"output_tokens":1}}}"#,
        );
        assert_eq!(
            usage[0],
            Delta::Usage(Usage {
                prompt_tokens_details: Some(PromptTokensDetails { cached_tokens: 90, cache_creation_tokens: None }),
                ..Usage::new(100, 1)
            })
        );
        assert!(
            decode(&mut d, r#"{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}"#)
                .is_empty()
        );
        assert_eq!(
            decode(
                &mut d,
                r#"{"type":"content_block_start","index":1,"content_block":{"type":"tool_use","id":"toolu_1","name":"ls","input":{}}}"#
            ),
            [Delta::ToolCall {
                index: Some(0),
                id: Some("toolu_1".into()),
                name: Some("ls".into()),
                arguments: String::new()
            }]
        );
        assert_eq!(
            decode(
                &mut d,
                r#"{"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":"{\"a"}}"#
            ),
            [Delta::ToolCall { index: Some(0), id: None, name: None, arguments: "{\"a".into() }]
        );
        let end = decode(
            &mut d,
            r#"{"type":"message_delta","delta":{"stop_reason":"tool_use"},"usage":{"output_tokens":7}}"#,
        );
        assert_eq!(end[1], Delta::Finish("tool_calls".into()));
        assert!(d.decode("", r#"{"type":"message_stop"}"#).unwrap().done);
        let overloaded = d.decode("", r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#);
        assert!(matches!(overloaded, Err(UpstreamError::Status { status: 529, .. })), "{overloaded:?}");
    }
}
