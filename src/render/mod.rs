//! Render: a format (which adapter) and an encoding (which transport frames it) together, as the hub's
//! [`Render`] seam asks for.
//!
//! - [`Format`]: what a subscriber reads, with the options that change a byte of the output: the typed
//!   messages (CUI), OpenAI chat chunks, the AI SDK's UI message stream, AG-UI events, Anthropic Messages
//!   events or OpenAI Responses events (one adapter of `crate::adapter` each).
//! - [`Encoding`]: how its frames travel: SSE events (`sse.rs`) or WebSocket text messages (`ws.rs`), each a
//!   whole WebSocket frame, header included.
//! - [`View`]: the two together; a stream keeps one rendition per distinct view, so every subscriber of a
//!   view shares the same encoded bytes, whatever the transport.
//!
//! Adapters produce [`Frame`]s that know no transport; this module is where they become bytes, once per
//! view. A transport writes the bytes it is handed and never parses them.

mod sse;
pub(crate) mod ws;

use std::sync::Arc;

use bytes::Bytes;

use crate::adapter::{
    Adapter, AgUiAdapter, AgUiOptions, AgentTools, AnthropicAdapter, AnthropicOptions, CuiAdapter, Frame,
    OpenAiAdapter, OpenAiOptions, ReasoningField, ResponsesAdapter, ResponsesOptions, UiMessageAdapter,
    UiMessageOptions,
};
use crate::hub::{Entry, Gone, Render, Renderer, StreamInfo};
use crate::output::{ErrorProps, OutputMessage};

pub use sse::encode as encode_sse;

/// A wire format a subscriber reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Format {
    /// The typed messages.
    #[default]
    Cui,
    /// OpenAI `chat.completion.chunk` deltas.
    OpenAi {
        /// Send the usage chunk at the end when usage is known.
        include_usage: bool,
        /// Where reasoning goes.
        reasoning: ReasoningField,
        /// How the agent's own tool calls appear.
        agent_tools: AgentTools,
    },
    /// The Vercel AI SDK's UI message stream.
    UiMessage,
    /// AG-UI events.
    AgUi,
    /// Anthropic Messages stream events.
    Anthropic,
    /// OpenAI Responses stream events.
    Responses,
}

impl Format {
    /// Its name: `cui`, `openai`, `ui-message`, `ag-ui`, `anthropic` or `responses` (what `?format=` takes).
    pub fn name(&self) -> &'static str {
        match self {
            Format::Cui => "cui",
            Format::OpenAi { .. } => "openai",
            Format::UiMessage => "ui-message",
            Format::AgUi => "ag-ui",
            Format::Anthropic => "anthropic",
            Format::Responses => "responses",
        }
    }

    /// OpenAI chunks with the defaults: no usage chunk, reasoning in `reasoning_content`, the agent's own tool
    /// calls as reasoning.
    pub const OPENAI: Format = Format::OpenAi {
        include_usage: false,
        reasoning: ReasoningField::ReasoningContent,
        agent_tools: AgentTools::Reasoning,
    };

    /// A fresh adapter for this format over the stream `info` describes.
    pub fn adapter(self, info: &StreamInfo) -> Box<dyn Adapter + Send> {
        match self {
            Format::Cui => Box::new(CuiAdapter),
            Format::OpenAi { include_usage, reasoning, agent_tools } => {
                let mut options = OpenAiOptions::from(info);
                options.include_usage = include_usage;
                options.reasoning = reasoning;
                options.agent_tools = agent_tools;
                Box::new(OpenAiAdapter::new(options))
            }
            Format::UiMessage => Box::new(UiMessageAdapter::new(UiMessageOptions::from(info))),
            Format::AgUi => Box::new(AgUiAdapter::new(AgUiOptions::from(info))),
            Format::Anthropic => Box::new(AnthropicAdapter::new(AnthropicOptions::from(info))),
            Format::Responses => Box::new(ResponsesAdapter::new(ResponsesOptions::from(info))),
        }
    }

    /// A short name that tells every option apart: `cui`, `openai+usage/reasoning`.
    fn key(self) -> String {
        match self {
            Format::Cui => "cui".into(),
            Format::UiMessage => "ui-message".into(),
            Format::AgUi => "ag-ui".into(),
            Format::Anthropic => "anthropic".into(),
            Format::Responses => "responses".into(),
            Format::OpenAi { include_usage, reasoning, agent_tools } => {
                let reasoning = match reasoning {
                    ReasoningField::ReasoningContent => "reasoning_content",
                    ReasoningField::Reasoning => "reasoning",
                    ReasoningField::Both => "both",
                };
                let tools = match agent_tools {
                    AgentTools::Reasoning => "",
                    AgentTools::Hidden => "/agent-tools-hidden",
                };
                format!("openai{}/{reasoning}{tools}", if include_usage { "+usage" } else { "" })
            }
        }
    }
}

/// The completion id, creation time and model OpenAI renderings of a stream carry. The id is made from the
/// stream's epoch, which every reader sees anyway, never from its id: whoever reads a response must not learn
/// the id, which on a service without keys is the right to write into the run.
impl From<&StreamInfo> for OpenAiOptions {
    fn from(info: &StreamInfo) -> Self {
        OpenAiOptions::new(format!("chatcmpl-{}", info.epoch), info.created_ms / 1000, info.model.clone())
    }
}

/// The assistant message id a UI message stream starts with: made from the epoch, like the OpenAI completion
/// id, so a replay of the same run repeats it.
impl From<&StreamInfo> for UiMessageOptions {
    fn from(info: &StreamInfo) -> Self {
        UiMessageOptions { message_id: format!("msg-{}", info.epoch) }
    }
}

/// The thread and run ids an AG-UI rendering carries: made from the epoch, never from the stream id.
impl From<&StreamInfo> for AgUiOptions {
    fn from(info: &StreamInfo) -> Self {
        AgUiOptions { thread_id: format!("thread-{}", info.epoch), run_id: format!("run-{}", info.epoch) }
    }
}

/// The message id and model an Anthropic rendering carries: the id made from the epoch.
impl From<&StreamInfo> for AnthropicOptions {
    fn from(info: &StreamInfo) -> Self {
        AnthropicOptions { id: format!("msg_{}", info.epoch), model: info.model.clone() }
    }
}

/// The response id, creation time and model a Responses rendering carries: the id made from the epoch.
impl From<&StreamInfo> for ResponsesOptions {
    fn from(info: &StreamInfo) -> Self {
        ResponsesOptions {
            id: format!("resp_{}", info.epoch),
            created_at: info.created_ms / 1000,
            model: info.model.clone(),
        }
    }
}

/// How frames travel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Encoding {
    /// Server-sent events.
    #[default]
    Sse,
    /// WebSocket text messages, one JSON object each, naming their stream; each is rendered as a whole
    /// unmasked WebSocket frame, its header included, ready to be written to a client's socket as it is.
    WebSocket,
}

/// A format and an encoding: what a subscription renders; see the module doc.
#[derive(Debug, Clone)]
pub struct View {
    format: Format,
    encoding: Encoding,
    key: String,
}

impl View {
    /// `format` in `encoding`.
    pub fn new(format: Format, encoding: Encoding) -> Self {
        let key = format!("{}@{}", format.key(), if encoding == Encoding::Sse { "sse" } else { "ws" });
        View { format, encoding, key }
    }

    /// Its format.
    pub fn format(&self) -> Format {
        self.format
    }
}

impl Render for View {
    fn key(&self) -> &str {
        &self.key
    }

    fn renderer(&self, stream: &StreamInfo) -> Box<dyn Renderer> {
        let adapter = self.format.adapter(stream);
        let stateful = self.format != Format::Cui;
        let wrap = ws::Wrap::new(&stream.id, self.format);
        Box::new(ViewRenderer { adapter, encoding: self.encoding, wrap, stateful, held: 0, frames: Vec::new() })
    }
}

/// A format on its own is read over SSE.
impl From<Format> for Arc<dyn Render> {
    fn from(format: Format) -> Self {
        Arc::new(View::new(format, Encoding::Sse))
    }
}

impl From<View> for Arc<dyn Render> {
    fn from(view: View) -> Self {
        Arc::new(view)
    }
}

struct ViewRenderer {
    adapter: Box<dyn Adapter + Send>,
    encoding: Encoding,
    wrap: ws::Wrap,
    /// The adapter keeps state that grows with the stream (the OpenAI adapter reduces deltas).
    stateful: bool,
    held: u64,
    frames: Vec<Frame>,
}

impl ViewRenderer {
    fn encode(&mut self, out: &mut Vec<Bytes>) {
        for frame in self.frames.drain(..) {
            match self.encoding {
                Encoding::Sse => out.push(sse::encode(&frame)),
                Encoding::WebSocket => out.extend(self.wrap.frame(&frame)),
            }
        }
    }
}

/// What a delta can add to the message it continues: its values (a string's text, anything else as JSON).
fn delta_bytes(message: &OutputMessage) -> u64 {
    message
        .props
        .values()
        .map(|value| match value {
            serde_json::Value::String(text) => text.len() as u64,
            other => serde_json::to_string(&other).map_or(0, |json| json.len() as u64),
        })
        .sum()
}

impl Renderer for ViewRenderer {
    fn render(&mut self, entry: &Entry, out: &mut Vec<Bytes>) {
        match entry {
            Entry::Message { message, bytes, json } => {
                match json {
                    Some(json) => self.adapter.push_logged(message, json, &mut self.frames),
                    None => self.adapter.push(message, &mut self.frames),
                }
                if self.stateful {
                    // An upper bound: its reducer holds at most every message it was given, and a delta adds
                    // at most its values to the message it continues.
                    self.held += if message.delta { delta_bytes(message).min(*bytes) } else { *bytes };
                }
                self.encode(out);
            }
            Entry::End(outcome) => {
                self.adapter.finish(outcome, &mut self.frames);
                self.encode(out);
                if self.encoding == Encoding::WebSocket {
                    out.push(self.wrap.done(outcome));
                }
            }
        }
    }

    /// Over SSE, when the adapter has ended (an OpenAI stream after its error and `[DONE]`). Over WebSocket
    /// only at the end of the stream, which says `done` in its own message.
    fn ended(&self) -> bool {
        self.encoding == Encoding::Sse && self.adapter.ended()
    }

    fn interrupt(&self, gone: &Gone, out: &mut Vec<Bytes>) {
        // The text is part of the contract (`docs/http-api.md`, "Slow readers and `lagged`"): the UI message
        // stream's notice has no code, so clients (`clients/python`'s watcher) tell it by this text.
        let error = ErrorProps {
            message: format!(
                "the history this subscriber needs is no longer kept here; resume after sequence {}",
                gone.resume_from()
            ),
            code: Some("lagged".into()),
            details: Some(serde_json::json!({ "resume_from": gone.resume_from() })),
        };
        match self.encoding {
            Encoding::Sse => {
                let mut frames = Vec::new();
                self.adapter.interrupt(&error, &mut frames);
                out.extend(frames.iter().map(sse::encode));
            }
            Encoding::WebSocket => out.push(self.wrap.lagged(&error, gone.resume_from())),
        }
    }

    fn held_bytes(&self) -> u64 {
        self.held
    }
}
