//! [`AnthropicAdapter`]: a stream's messages as an Anthropic Messages stream (`docs/clients.md`, "Anthropic Messages"), the events
//! the `anthropic` SDKs read, each with its `event:` line (both SDKs skip a frame without one).
//!
//! Anthropic's stream holds what OpenAI's chunk stream holds: text, thinking, and tool calls that arrive one
//! after another. So this adapter shares the OpenAI adapters' state machine (`openai/progress.rs`: the
//! reducer, what was sent, tool calls taking turns, the agent's own tool calls as reasoning lines, media as
//! Markdown links in the text, action and event types not sent) and only lays its pieces out as content
//! blocks: `message_start` (with `content: []`), then blocks one at a time (`content_block_start`,
//! `content_block_delta`…, `content_block_stop`: a text block for content, a thinking block for reasoning, a
//! `tool_use` block per call handed to the client), then `message_delta` with the `stop_reason` (`end_turn`,
//! `max_tokens`, `tool_use`, `refusal` for a content filter) and the outcome's usage (`output_tokens`, which
//! both SDKs need, and `input_tokens` with the cache's counts, which both take from `message_delta` too: the
//! prompt's size is known only once the run ends, so `message_start` says 0), and `message_stop`. A new
//! kind of content closes the open block and opens the next; text after a tool call opens a new text block.
//! A block's text cannot be taken back: a correction (a message whose text no longer starts with what was
//! sent, `progress.rs`) opens a new block carrying the message's whole corrected text.
//!
//! An `error` message, a failed or cancelled stream, and a reader whose history is gone end with `event:
//! error` (`{"type": "error", "error": {"type", "message"}}`, the type `api_error`, `cancelled` or
//! `lagged`), which the SDKs raise; Anthropic has no cancel of its own. Thinking blocks carry an empty
//! `signature`: they are not Anthropic's, and cannot be checked as such.
//!
//! [`AnthropicAdapter::message`] is the same content as one non-streaming `message`.

use serde_json::{Map, Value, json};

use super::frame::Frame;
use super::machine::Adapter;
use super::openai::AgentTools;
use super::openai::progress::{Piece, Progress};
use crate::output::{EndStatus, ErrorProps, FinishReason, Outcome, OutputMessage, Usage};

/// What the adapter needs beyond the messages: fixed per stream, so output is deterministic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AnthropicOptions {
    /// The message id (`msg_...`).
    pub id: String,
    /// The model to report.
    pub model: String,
}

/// Renders messages as Anthropic stream events.
///
/// ```
/// use agentmux::adapter::{Adapter, AnthropicAdapter, AnthropicOptions};
/// use agentmux::output::{Outcome, OutputMessage};
///
/// let mut adapter = AnthropicAdapter::aggregating(AnthropicOptions { id: "msg_1".into(), model: "demo".into() });
/// let mut frames = Vec::new();
/// adapter.push(&OutputMessage::text("Hi"), &mut frames);
/// adapter.finish(&Outcome::completed(), &mut frames);
/// let events: Vec<_> = frames.iter().filter_map(|f| f.event).collect();
/// assert_eq!(
///     events,
///     ["message_start", "content_block_start", "content_block_delta", "content_block_stop", "message_delta", "message_stop"]
/// );
/// assert_eq!(adapter.message()["content"][0]["text"], "Hi");
/// ```
#[derive(Debug)]
pub struct AnthropicAdapter {
    progress: Progress,
    blocks: Blocks,
}

/// The content blocks as they go out.
#[derive(Debug)]
struct Blocks {
    options: AnthropicOptions,
    started: bool,
    /// The block open now: its index.
    open: Option<usize>,
    /// Every block so far; with their text (a tool call's input as the JSON text so far) only when
    /// `aggregating`, for [`AnthropicAdapter::message`]: a stream's rendition need not hold it twice.
    content: Vec<Block>,
    aggregating: bool,
    /// The block of each tool call, by the tool call's index.
    tools: Vec<usize>,
    stop_reason: Option<&'static str>,
    /// The usage `message_delta` said, for [`AnthropicAdapter::message`].
    usage: Value,
    done: bool,
}

#[derive(Debug)]
enum Block {
    Text(String),
    Thinking(String),
    ToolUse { id: String, name: String, input: String },
}

impl AnthropicAdapter {
    /// An adapter for one stream.
    pub fn new(options: AnthropicOptions) -> Self {
        Self::with(options, false)
    }

    /// An adapter that also keeps every block's content, for [`AnthropicAdapter::message`].
    pub fn aggregating(options: AnthropicOptions) -> Self {
        Self::with(options, true)
    }

    fn with(options: AnthropicOptions, aggregating: bool) -> Self {
        let blocks = Blocks {
            options,
            started: false,
            open: None,
            content: Vec::new(),
            aggregating,
            tools: Vec::new(),
            stop_reason: None,
            usage: json!({"input_tokens": 0, "output_tokens": 0}),
            done: false,
        };
        AnthropicAdapter { progress: Progress::new(AgentTools::Reasoning), blocks }
    }

    /// The non-streaming `message` with what was rendered so far (whole once the stream has finished); an
    /// adapter made with [`AnthropicAdapter::aggregating`] only has the blocks' content.
    pub fn message(&self) -> Value {
        let content: Vec<Value> = self.blocks.content.iter().map(Block::whole).collect();
        // The message always says its input, 0 when the agent did not.
        let mut usage = json!({"input_tokens": 0});
        if let (Some(usage), Some(said)) = (usage.as_object_mut(), self.blocks.usage.as_object()) {
            usage.extend(said.clone());
        }
        self.blocks.envelope(content, self.blocks.stop_reason, usage)
    }
}

impl Block {
    /// As `content_block_start` opens it: empty.
    fn empty(&self) -> Value {
        match self {
            Block::Text(_) => json!({"type": "text", "text": ""}),
            Block::Thinking(_) => json!({"type": "thinking", "thinking": "", "signature": ""}),
            Block::ToolUse { id, name, .. } => json!({"type": "tool_use", "id": id, "name": name, "input": {}}),
        }
    }

    /// As the final message holds it.
    fn whole(&self) -> Value {
        match self {
            Block::Text(text) => json!({"type": "text", "text": text}),
            Block::Thinking(thinking) => json!({"type": "thinking", "thinking": thinking, "signature": ""}),
            Block::ToolUse { id, name, input } => {
                let input = serde_json::from_str::<Value>(input).unwrap_or_else(|_| Value::Object(Map::new()));
                json!({"type": "tool_use", "id": id, "name": name, "input": input})
            }
        }
    }
}

/// `usage` in Anthropic's words (`output_tokens` alone when the agent said none): its `input_tokens` are
/// the prompt's tokens the cache did not serve, so the cache's reads and writes (`cache_read_input_tokens`,
/// `cache_creation_input_tokens`, when the model said them) come off the prompt's count, which holds them
/// all (as the Anthropic upstream adds them up).
fn anthropic_usage(usage: Option<&Usage>) -> Value {
    let Some(usage) = usage else { return json!({"output_tokens": 0}) };
    let details = usage.prompt_tokens_details;
    let read = details.map_or(0, |d| d.cached_tokens);
    let creation = details.and_then(|d| d.cache_creation_tokens);
    let input = usage.prompt_tokens.saturating_sub(read).saturating_sub(creation.unwrap_or(0));
    let mut json = json!({"input_tokens": input, "output_tokens": usage.completion_tokens});
    if details.is_some() {
        json["cache_read_input_tokens"] = read.into();
    }
    if let Some(creation) = creation {
        json["cache_creation_input_tokens"] = creation.into();
    }
    json
}

impl Blocks {
    fn envelope(&self, content: Vec<Value>, stop_reason: Option<&str>, usage: Value) -> Value {
        let o = &self.options;
        json!({
            "id": o.id, "type": "message", "role": "assistant", "model": o.model, "content": content,
            "stop_reason": stop_reason, "stop_sequence": null, "usage": usage,
        })
    }

    fn start(&mut self, frames: &mut Vec<Frame>) {
        if !std::mem::replace(&mut self.started, true) {
            let message = self.envelope(Vec::new(), None, json!({"input_tokens": 0, "output_tokens": 0}));
            frames.push(Frame::named("message_start", &json!({"type": "message_start", "message": message})));
        }
    }

    fn stop(&mut self, frames: &mut Vec<Frame>) {
        if let Some(index) = self.open.take() {
            frames.push(Frame::named("content_block_stop", &json!({"type": "content_block_stop", "index": index})));
        }
    }

    /// Opens `block` as the next one, closing the open one.
    fn open(&mut self, block: Block, frames: &mut Vec<Frame>) -> usize {
        self.stop(frames);
        let index = self.content.len();
        let start = json!({"type": "content_block_start", "index": index, "content_block": block.empty()});
        frames.push(Frame::named("content_block_start", &start));
        self.content.push(block);
        self.open = Some(index);
        index
    }

    fn delta(index: usize, delta: Value, frames: &mut Vec<Frame>) {
        frames.push(Frame::named(
            "content_block_delta",
            &json!({"type": "content_block_delta", "index": index, "delta": delta}),
        ));
    }

    fn piece(&mut self, piece: Piece<'_>, frames: &mut Vec<Frame>) {
        match piece {
            Piece::Content { text, new_line, fresh } | Piece::Reasoning { text, new_line, fresh } => {
                let thinking = matches!(piece, Piece::Reasoning { .. });
                // A correction opens a block of its own, which needs no line break first.
                let text = if new_line && !fresh { format!("\n{text}") } else { text.to_owned() };
                let index = match self.open.map(|index| (index, &self.content[index])) {
                    Some((index, Block::Text(_))) if !thinking && !fresh => index,
                    Some((index, Block::Thinking(_))) if thinking && !fresh => index,
                    _ if thinking => self.open(Block::Thinking(String::new()), frames),
                    _ => self.open(Block::Text(String::new()), frames),
                };
                let delta = if thinking {
                    json!({"type": "thinking_delta", "thinking": text})
                } else {
                    json!({"type": "text_delta", "text": text})
                };
                Blocks::delta(index, delta, frames);
                if let (true, Some(Block::Text(all) | Block::Thinking(all))) =
                    (self.aggregating, self.content.get_mut(index))
                {
                    all.push_str(&text);
                }
            }
            Piece::ToolHeader { index, id, name } => {
                let block = self
                    .open(Block::ToolUse { id: id.to_owned(), name: name.to_owned(), input: String::new() }, frames);
                let at = index as usize;
                if self.tools.len() <= at {
                    self.tools.resize(at + 1, block);
                }
                self.tools[at] = block;
            }
            Piece::ToolArguments { index, arguments } => {
                // Calls take turns (`progress.rs`), so this is the open block but for text between a call's
                // header and the rest of its arguments, which the SDKs still add to the call's block.
                let Some(&block) = self.tools.get(index as usize) else { return };
                Blocks::delta(block, json!({"type": "input_json_delta", "partial_json": arguments}), frames);
                if let (true, Some(Block::ToolUse { input, .. })) = (self.aggregating, self.content.get_mut(block)) {
                    input.push_str(arguments);
                }
            }
            Piece::Error { message, .. } => self.error("api_error", message, frames),
        }
    }

    /// Ends the stream with `event: error`.
    fn error(&mut self, kind: &str, message: &str, frames: &mut Vec<Frame>) {
        self.stop(frames);
        frames.push(Frame::named("error", &json!({"type": "error", "error": {"type": kind, "message": message}})));
        self.done = true;
    }
}

impl Adapter for AnthropicAdapter {
    fn push(&mut self, message: &OutputMessage, frames: &mut Vec<Frame>) {
        if self.blocks.done {
            return;
        }
        self.blocks.start(frames);
        let blocks = &mut self.blocks;
        self.progress.push(message, &mut |piece| blocks.piece(piece, frames));
    }

    fn finish(&mut self, outcome: &Outcome, frames: &mut Vec<Frame>) {
        if self.blocks.done {
            return;
        }
        self.blocks.start(frames);
        match outcome.status {
            EndStatus::Error => {
                let message = outcome.error.as_ref().map_or("the agent failed", |e| e.message.as_str());
                return self.blocks.error("api_error", message, frames);
            }
            EndStatus::Cancelled => return self.blocks.error("cancelled", "the stream was cancelled", frames),
            EndStatus::Completed => {}
        }
        let blocks = &mut self.blocks;
        self.progress.finish(&mut |piece| blocks.piece(piece, frames));
        let stop_reason = match self.progress.finish_reason(outcome) {
            FinishReason::Stop => "end_turn",
            FinishReason::Length => "max_tokens",
            FinishReason::ToolCalls => "tool_use",
            FinishReason::ContentFilter => "refusal",
        };
        let usage = anthropic_usage(outcome.usage.as_ref());
        let blocks = &mut self.blocks;
        blocks.stop(frames);
        (blocks.stop_reason, blocks.usage, blocks.done) = (Some(stop_reason), usage.clone(), true);
        let delta = json!({
            "type": "message_delta",
            "delta": {"stop_reason": stop_reason, "stop_sequence": null},
            "usage": usage,
        });
        frames.push(Frame::named("message_delta", &delta));
        frames.push(Frame::named("message_stop", &json!({"type": "message_stop"})));
    }

    fn ended(&self) -> bool {
        self.blocks.done
    }

    fn interrupt(&self, error: &ErrorProps, frames: &mut Vec<Frame>) {
        let body = json!({"type": "error", "error": {"type": "lagged", "message": error.message}});
        frames.push(Frame::named("error", &body));
    }
}
