//! [`OpenAiAdapter`]: messages in, `chat.completion.chunk` SSE frames out.
//!
//! The first frame is the role chunk (`{"role":"assistant","content":""}`), sent with the first message so a
//! client sees the response begin at once, and even for an empty stream. Then one chunk per piece of news
//! (see `progress.rs`), and at the end the closing chunk with `finish_reason`, the usage chunk when asked for
//! and known, and `data: [DONE]`. An error (an `error` message, or a stream that ended cancelled or failed)
//! is `data: {"error": ...}` followed by `data: [DONE]`, and nothing follows it.

use bytes::Bytes;

use super::progress::{Piece, Progress};
use super::wire::{ApiError, Chunk, ChunkChoice, Delta, FunctionDelta, ToolCallDelta};
use super::{OpenAiOptions, ReasoningField};
use crate::adapter::{Adapter, sse};
use crate::output::{Outcome, OutputMessage};

/// Renders messages as OpenAI chunks.
///
/// ```
/// use agentmux::adapter::{Adapter, OpenAiAdapter, OpenAiOptions};
/// use agentmux::output::{Outcome, OutputMessage};
///
/// let mut adapter = OpenAiAdapter::new(OpenAiOptions::new("chatcmpl-1", 1700000000, "demo"));
/// let mut frames = Vec::new();
/// adapter.push(&OutputMessage::text("Hi"), &mut frames);
/// adapter.push(&OutputMessage::action("open_panel"), &mut frames);
/// adapter.finish(&Outcome::completed(), &mut frames);
/// let body: Vec<u8> = frames.concat();
/// let body = String::from_utf8(body).unwrap();
/// assert_eq!(body.matches("data: ").count(), 4); // role, "Hi", finish, [DONE]
/// assert!(body.contains(r#""delta":{"content":"Hi"}"#));
/// assert!(body.ends_with("data: [DONE]\n\n"));
/// ```
#[derive(Debug)]
pub struct OpenAiAdapter {
    options: OpenAiOptions,
    progress: Progress,
    role_sent: bool,
    done: bool,
}

impl OpenAiAdapter {
    /// An adapter for one stream.
    pub fn new(options: OpenAiOptions) -> Self {
        OpenAiAdapter { options, progress: Progress::default(), role_sent: false, done: false }
    }

    fn chunk(&self, delta: Delta<'_>, finish_reason: Option<&'static str>) -> Bytes {
        let choices = [ChunkChoice { index: 0, delta, logprobs: None, finish_reason }];
        self.frame(&choices, None)
    }

    fn frame(&self, choices: &[ChunkChoice<'_>], usage: Option<&crate::output::Usage>) -> Bytes {
        let o = &self.options;
        let chunk =
            Chunk { id: &o.id, object: "chat.completion.chunk", created: o.created, model: &o.model, choices, usage };
        sse::event(None, &chunk)
    }

    fn role(&mut self, frames: &mut Vec<Bytes>) {
        if !self.role_sent {
            self.role_sent = true;
            frames
                .push(self.chunk(Delta { role: Some("assistant"), content: Some(Some("")), ..Delta::default() }, None));
        }
    }

    fn error(&mut self, error: &ApiError, frames: &mut Vec<Bytes>) {
        self.done = true;
        frames.push(sse::event(None, &error.envelope()));
        frames.push(sse::DONE);
    }

    fn piece(&self, piece: Piece<'_>, reasoning: ReasoningField) -> Bytes {
        match piece {
            Piece::Content { text, new_line } => {
                let text = with_new_line(text, new_line);
                self.chunk(Delta { content: Some(Some(&text)), ..Delta::default() }, None)
            }
            Piece::Reasoning { text, new_line } => {
                let text = with_new_line(text, new_line);
                let (reasoning_content, reasoning) = reasoning.split(&text);
                self.chunk(Delta { reasoning_content, reasoning, ..Delta::default() }, None)
            }
            Piece::ToolHeader { index, id, name } => {
                let call = ToolCallDelta {
                    index,
                    id: Some(id),
                    kind: Some("function"),
                    function: FunctionDelta { name: Some(name), arguments: "" },
                };
                self.chunk(Delta { content: Some(None), tool_calls: Some([call]), ..Delta::default() }, None)
            }
            Piece::ToolArguments { index, arguments } => {
                let call =
                    ToolCallDelta { index, id: None, kind: None, function: FunctionDelta { name: None, arguments } };
                self.chunk(Delta { tool_calls: Some([call]), ..Delta::default() }, None)
            }
            Piece::Error { .. } => Bytes::new(),
        }
    }
}

impl Adapter for OpenAiAdapter {
    fn push(&mut self, message: &OutputMessage, frames: &mut Vec<Bytes>) {
        if self.done {
            return;
        }
        self.role(frames);
        let mut progress = std::mem::take(&mut self.progress);
        let mut error = None;
        let reasoning = self.options.reasoning;
        progress.push(message, &mut |piece| match piece {
            Piece::Error { message, code } => error = Some(ApiError::agent(message, code)),
            piece => frames.push(self.piece(piece, reasoning)),
        });
        self.progress = progress;
        if let Some(error) = error {
            self.error(&error, frames);
        }
    }

    fn finish(&mut self, outcome: &Outcome, frames: &mut Vec<Bytes>) {
        if self.done {
            return;
        }
        self.role(frames);
        if let Some(error) = ApiError::for_outcome(outcome) {
            self.error(&error, frames);
            return;
        }
        self.done = true;
        let reason = self.progress.finish_reason(outcome).as_str();
        frames.push(self.chunk(Delta::default(), Some(reason)));
        if let (true, Some(usage)) = (self.options.include_usage, outcome.usage.as_ref()) {
            frames.push(self.frame(&[], Some(usage)));
        }
        frames.push(sse::DONE);
    }
}

fn with_new_line(text: &str, new_line: bool) -> std::borrow::Cow<'_, str> {
    if new_line { format!("\n{text}").into() } else { text.into() }
}
