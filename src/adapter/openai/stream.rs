//! [`OpenAiAdapter`]: messages in, `chat.completion.chunk` frames out.
//!
//! The first frame is the role chunk (`{"role":"assistant","content":""}`), sent with the first message so a
//! client sees the response begin at once, and even for an empty stream. Then one chunk per piece of news
//! (see `progress.rs`), and at the end the closing chunk with `finish_reason`, the usage chunk when asked for
//! and known, and `data: [DONE]`. An error (an `error` message, or a stream that ended cancelled or failed)
//! is `data: {"error": ...}` followed by `data: [DONE]`, and nothing follows it.

use std::borrow::Cow;

use super::options::OpenAiOptions;
use super::progress::{Piece, Progress};
use super::wire::{ApiError, Chunk, ChunkChoice, Delta, FunctionDelta, ToolCallDelta};
use crate::adapter::frame::Frame;
use crate::adapter::machine::Adapter;
use crate::output::{ErrorProps, Outcome, OutputMessage, Usage};

/// The marker that ends an OpenAI chunk stream.
const DONE: &str = "[DONE]";

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
/// assert_eq!(frames.len(), 4); // role, "Hi", finish, [DONE]
/// assert_eq!(frames[3], agentmux::adapter::Frame::end("[DONE]"));
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
        let progress = Progress::new(options.agent_tools);
        OpenAiAdapter { options, progress, role_sent: false, done: false }
    }

    fn role(&mut self, frames: &mut Vec<Frame>) {
        if !self.role_sent {
            self.role_sent = true;
            let delta = Delta { role: Some("assistant"), content: Some(Some("")), ..Delta::default() };
            frames.push(chunk(&self.options, delta, None));
        }
    }

    fn end_with_error(&mut self, error: &ApiError, frames: &mut Vec<Frame>) {
        frames.push(Frame::error(&error.envelope()));
        frames.push(Frame::end(DONE));
        self.done = true;
    }
}

impl Adapter for OpenAiAdapter {
    fn push(&mut self, message: &OutputMessage, frames: &mut Vec<Frame>) {
        if self.done {
            return;
        }
        self.role(frames);
        let options = &self.options;
        let mut ended = false;
        self.progress.push(message, &mut |piece| {
            ended |= matches!(piece, Piece::Error { .. });
            frames.push(render(options, piece));
        });
        if ended {
            frames.push(Frame::end(DONE));
            self.done = true;
        }
    }

    fn finish(&mut self, outcome: &Outcome, frames: &mut Vec<Frame>) {
        if self.done {
            return;
        }
        self.role(frames);
        if let Some(error) = ApiError::for_outcome(outcome) {
            self.end_with_error(&error, frames);
            return;
        }
        let options = &self.options;
        self.progress.finish(&mut |piece| frames.push(render(options, piece)));
        let reason = self.progress.finish_reason(outcome).as_str();
        frames.push(chunk(&self.options, Delta::default(), Some(reason)));
        if let (true, Some(usage)) = (self.options.include_usage, outcome.usage.as_ref()) {
            frames.push(frame(&self.options, &[], Some(usage)));
        }
        frames.push(Frame::end(DONE));
        self.done = true;
    }

    fn ended(&self) -> bool {
        self.done
    }

    fn interrupt(&self, error: &ErrorProps, frames: &mut Vec<Frame>) {
        let error = ApiError {
            message: error.message.clone(),
            kind: "stream_error".into(),
            param: None,
            code: error.code.clone(),
            last_sequence: None,
        };
        frames.push(Frame::error(&error.envelope()));
        frames.push(Frame::end(DONE));
    }
}

/// The frame for one piece of news; for an error, the caller ends the stream after it.
fn render(options: &OpenAiOptions, piece: Piece<'_>) -> Frame {
    match piece {
        Piece::Content { text, new_line, .. } => {
            let text = with_new_line(text, new_line);
            chunk(options, Delta { content: Some(Some(&text)), ..Delta::default() }, None)
        }
        Piece::Reasoning { text, new_line, .. } => {
            let text = with_new_line(text, new_line);
            let (reasoning_content, reasoning) = options.reasoning.split(&text);
            chunk(options, Delta { reasoning_content, reasoning, ..Delta::default() }, None)
        }
        Piece::ToolHeader { index, id, name } => {
            let call = ToolCallDelta {
                index,
                id: Some(id),
                kind: Some("function"),
                function: FunctionDelta { name: Some(name), arguments: "" },
            };
            chunk(options, Delta { content: Some(None), tool_calls: Some([call]), ..Delta::default() }, None)
        }
        Piece::ToolArguments { index, arguments } => {
            let call = ToolCallDelta { index, id: None, kind: None, function: FunctionDelta { name: None, arguments } };
            chunk(options, Delta { tool_calls: Some([call]), ..Delta::default() }, None)
        }
        Piece::Error { message, code } => Frame::error(&ApiError::agent(message, code).envelope()),
    }
}

/// A chunk with one choice.
fn chunk(options: &OpenAiOptions, delta: Delta<'_>, finish_reason: Option<&'static str>) -> Frame {
    frame(options, &[ChunkChoice { index: 0, delta, logprobs: None, finish_reason }], None)
}

/// A chunk with the given choices (none for the usage chunk).
fn frame(options: &OpenAiOptions, choices: &[ChunkChoice<'_>], usage: Option<&Usage>) -> Frame {
    let o = options;
    Frame::json(
        None,
        &Chunk { id: &o.id, object: "chat.completion.chunk", created: o.created, model: &o.model, choices, usage },
    )
}

fn with_new_line(text: &str, new_line: bool) -> Cow<'_, str> {
    if new_line { format!("\n{text}").into() } else { text.into() }
}
