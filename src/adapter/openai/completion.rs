//! [`OpenAiCompletion`]: the same messages aggregated into one non-streaming `chat.completion`.
//!
//! It runs the streaming adapter's state machine (`progress.rs`) without writing chunks, then builds the
//! response from the final state: `content` is the projections of the content messages (text, media links)
//! joined in order of first appearance, `reasoning_content` likewise from thinking and loading, `tool_calls`
//! the calls whose header the stream would have sent, with their final arguments. For an append-only stream
//! this is exactly what a streaming client accumulates; where deltas took text back, it is the final text.
//! An error message or a stream that did not complete yields the error instead.

use bytes::Bytes;

use super::options::OpenAiOptions;
use super::progress::{Progress, Separator};
use super::projection::{Projection, project};
use super::wire::{ApiError, Completion, CompletionChoice, Function, ResponseMessage, ToolCall};
use crate::output::{FinishReason, Outcome, OutputMessage};

/// Aggregates messages into one `chat.completion` body.
///
/// ```
/// use agentmux::adapter::{OpenAiCompletion, OpenAiOptions};
/// use agentmux::output::{Outcome, OutputMessage};
///
/// let mut completion = OpenAiCompletion::new(OpenAiOptions::new("chatcmpl-1", 1700000000, "demo"));
/// completion.push(&OutputMessage::text("Hello"));
/// let body = completion.finish(&Outcome::completed()).unwrap();
/// assert!(std::str::from_utf8(&body).unwrap().contains(r#""content":"Hello""#));
///
/// let mut failed = OpenAiCompletion::new(OpenAiOptions::new("chatcmpl-2", 1700000000, "demo"));
/// failed.push(&OutputMessage::error("upstream timed out"));
/// assert_eq!(failed.finish(&Outcome::completed()).unwrap_err().message, "upstream timed out");
/// ```
#[derive(Debug)]
pub struct OpenAiCompletion {
    options: OpenAiOptions,
    progress: Progress,
}

impl OpenAiCompletion {
    /// An aggregate for one stream.
    pub fn new(options: OpenAiOptions) -> Self {
        let progress = Progress::new(options.agent_tools);
        OpenAiCompletion { options, progress }
    }

    /// Takes in one message.
    pub fn push(&mut self, message: &OutputMessage) {
        self.progress.push(message, &mut |_| {});
    }

    /// The response body, or the error the stream ended with.
    pub fn finish(&mut self, outcome: &Outcome) -> Result<Bytes, ApiError> {
        if let Some((message, code)) = self.progress.error() {
            return Err(ApiError::agent(message, code));
        }
        if let Some(error) = ApiError::for_outcome(outcome) {
            return Err(error);
        }
        self.progress.finish(&mut |_| {});
        let (mut content, mut content_separator) = (String::new(), Separator::default());
        let (mut reasoning, mut reasoning_separator) = (String::new(), Separator::default());
        for (slot, state) in self.progress.reducer().messages().iter().enumerate() {
            let (text, block, out, separator) = match project(state, self.options.agent_tools) {
                Projection::Content { text, block } => (text, block, &mut content, &mut content_separator),
                Projection::Reasoning(text) => (text, true, &mut reasoning, &mut reasoning_separator),
                _ => continue,
            };
            if text.is_empty() {
                continue;
            }
            if separator.next(slot, block, false, &text) {
                out.push('\n');
            }
            out.push_str(&text);
        }
        let sent_calls = self.progress.tool_calls();
        let tool_calls: Vec<ToolCall<'_>> = sent_calls
            .iter()
            .map(|c| ToolCall {
                id: c.id,
                kind: "function",
                function: Function { name: c.name, arguments: c.arguments },
            })
            .collect();
        let reasoning = (!reasoning.is_empty()).then_some(reasoning.as_str());
        let (reasoning_content, reasoning) = match reasoning {
            Some(text) => self.options.reasoning.split(text),
            None => (None, None),
        };
        let message = ResponseMessage {
            role: "assistant",
            content: (!content.is_empty() || tool_calls.is_empty()).then_some(content.as_str()),
            reasoning_content,
            reasoning,
            tool_calls: &tool_calls,
            refusal: None,
        };
        // A call that stopped being a tool call (a type_change) is not in the final state.
        let finish_reason = match self.progress.finish_reason(outcome) {
            FinishReason::ToolCalls if tool_calls.is_empty() => FinishReason::Stop,
            reason => reason,
        };
        let o = &self.options;
        let body = Completion {
            id: &o.id,
            object: "chat.completion",
            created: o.created,
            model: &o.model,
            choices: [CompletionChoice { index: 0, message, logprobs: None, finish_reason: finish_reason.as_str() }],
            usage: outcome.usage.as_ref(),
        };
        serde_json::to_vec(&body).map(Bytes::from).map_err(|e| ApiError {
            message: format!("the response could not be serialised: {e}"),
            kind: "server_error".into(),
            param: None,
            code: None,
            last_sequence: None,
        })
    }
}
