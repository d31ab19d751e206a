//! [`AgUiAdapter`]: a stream's messages as AG-UI 1.0 events, what `@ag-ui/client`'s `HttpAgent` reads
//! (`docs/clients.md`, "AG-UI").
//!
//! A stream is one run: `RUN_STARTED` first, then its events, then `RUN_FINISHED` (with `outcome` `success`,
//! listing the calls handed to the client that no result answered, or `cancelled`) or `RUN_ERROR`, after
//! which nothing is sent. There is no `[DONE]` (the client parses every frame as JSON). The run's ids are made
//! from the stream's epoch (`thread-<epoch>`, `run-<epoch>`): the client never compares them with its own.
//! Each of our messages becomes what AG-UI has for it:
//!
//! - `text`: `TEXT_MESSAGE_START` (role `assistant`), `TEXT_MESSAGE_CONTENT`…, `TEXT_MESSAGE_END`;
//!   `thinking`: `REASONING_START`, `REASONING_MESSAGE_START` (role `reasoning`), `…_CONTENT`…,
//!   `REASONING_MESSAGE_END`, `REASONING_END`. A whole message starts and ends at once; a streaming one ends at
//!   its `message_end` or the end of the run; a delta after its end starts it again (the client appends).
//! - `tool_call`: `TOOL_CALL_START` once its name is known, `TOOL_CALL_ARGS` as its arguments stream,
//!   `TOOL_CALL_END`; its `tool_result`: `TOOL_CALL_RESULT` with the result as JSON text (or the error's
//!   message), left out for a call that was never sent.
//! - `loading`, media and custom types: `ACTIVITY_SNAPSHOT` (`activityType` the message's type, `content` its
//!   props), again with the new state whenever a delta changes it, which replaces the activity.
//! - `action` and `event`: `CUSTOM` with the type as `name` and the props as `value`.
//! - `error`: `RUN_ERROR` with its message and code, and nothing after it.
//! - Blocks: `STEP_STARTED` and `STEP_FINISHED` named by the block id.
//!
//! Every message, reasoning, tool call and step still open is closed before `RUN_FINISHED`, as the client's
//! verifier requires. A message whose type changes continues under a new AG-UI id (`<id>~<n>`), since an
//! AG-UI message keeps its role. Text cannot be taken back (`adapter/sent.rs`): a text or reasoning whose
//! text no longer starts with what was sent (a `replace`, `merge`, `set`, resend) ends, and its whole
//! corrected text goes out as a new message under the next id (`<id>~<n>`), after the stale one. Not a
//! `MESSAGES_SNAPSHOT`: `@ag-ui/client` drops every message a snapshot leaves out, the user's among them, and
//! the adapter does not hold the conversation. A tool call's arguments taken back send nothing until they
//! extend what was sent again.

mod event;

use serde_json::Value;

use super::frame::Frame;
use super::machine::Adapter;
use super::sent::{Before, SentText};
use crate::output::{EndStatus, ErrorProps, Outcome, OutputMessage, Reducer};
use event::{Event, RunOutcome};

/// What the adapter needs beyond the messages: fixed per stream, so output is deterministic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgUiOptions {
    /// The thread id `RUN_STARTED` and `RUN_FINISHED` carry.
    pub thread_id: String,
    /// The run id they carry.
    pub run_id: String,
}

/// Renders messages as AG-UI events.
///
/// ```
/// use agentmux::adapter::{Adapter, AgUiAdapter, AgUiOptions, Payload};
/// use agentmux::output::{Outcome, OutputMessage};
///
/// let mut adapter = AgUiAdapter::new(AgUiOptions { thread_id: "t".into(), run_id: "r".into() });
/// let mut frames = Vec::new();
/// adapter.push(&OutputMessage::text("Hi"), &mut frames);
/// adapter.finish(&Outcome::completed(), &mut frames);
/// let types: Vec<String> = frames
///     .iter()
///     .map(|frame| match &frame.payload {
///         Payload::Json(json) => serde_json::from_slice::<serde_json::Value>(json).unwrap()["type"].to_string(),
///         _ => unreachable!("AG-UI has no end marker"),
///     })
///     .collect();
/// assert_eq!(
///     types,
///     ["\"RUN_STARTED\"", "\"TEXT_MESSAGE_START\"", "\"TEXT_MESSAGE_CONTENT\"", "\"TEXT_MESSAGE_END\"", "\"RUN_FINISHED\""]
/// );
/// ```
#[derive(Debug)]
pub struct AgUiAdapter {
    options: AgUiOptions,
    reducer: Reducer,
    /// What was sent of each message, by the reducer's slot.
    sent: Vec<Sent>,
    started: bool,
    /// The steps open, by name, in the order they started.
    steps: Vec<String>,
    done: bool,
}

/// What a message became.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
enum Channel {
    #[default]
    None,
    Text,
    Reasoning,
    Tool,
    Activity,
    Custom,
}

/// What was sent of one message.
#[derive(Debug, Default)]
struct Sent {
    channel: Channel,
    /// How many times its type changed or its text was corrected: its AG-UI id changes with it.
    generation: u32,
    /// A text, reasoning or tool call started and not ended.
    open: bool,
    text: SentText,
    /// A tool call's id and name, once `TOOL_CALL_START` is out.
    call: Option<(String, String)>,
    /// A tool call the client is to run (not the agent's own), and whether a result answered it.
    for_client: bool,
    answered: bool,
    /// A `tool_result` went out.
    once: bool,
}

impl AgUiAdapter {
    /// An adapter for one stream.
    pub fn new(options: AgUiOptions) -> Self {
        AgUiAdapter {
            options,
            reducer: Reducer::default(),
            sent: Vec::new(),
            started: false,
            steps: Vec::new(),
            done: false,
        }
    }

    fn start(&mut self, frames: &mut Vec<Frame>) {
        if !self.started {
            self.started = true;
            let o = &self.options;
            frames.push(Frame::json(None, &Event::RunStarted { thread_id: &o.thread_id, run_id: &o.run_id }));
        }
    }

    /// The AG-UI id of the message at `slot`.
    fn id(&self, slot: usize) -> String {
        let state = &self.reducer.messages()[slot];
        let base = state.message_id.clone().unwrap_or_else(|| format!("p{slot}"));
        match self.sent[slot].generation {
            0 => base,
            n => format!("{base}~{n}"),
        }
    }

    /// Ends the text, reasoning or tool call of the message at `slot`, if it is open.
    fn end(&mut self, slot: usize, frames: &mut Vec<Frame>) {
        if !std::mem::take(&mut self.sent[slot].open) {
            return;
        }
        let id = self.id(slot);
        match self.sent[slot].channel {
            Channel::Text => frames.push(Frame::json(None, &Event::TextMessageEnd { message_id: &id })),
            Channel::Reasoning => {
                frames.push(Frame::json(None, &Event::ReasoningMessageEnd { message_id: &id }));
                frames.push(Frame::json(None, &Event::ReasoningEnd { message_id: &id }));
            }
            Channel::Tool => {
                if let Some((call_id, _)) = &self.sent[slot].call {
                    frames.push(Frame::json(None, &Event::ToolCallEnd { tool_call_id: call_id }));
                }
            }
            Channel::None | Channel::Activity | Channel::Custom => {}
        }
    }

    fn render(&mut self, slot: usize, before: &Before<'_>, whole: bool, frames: &mut Vec<Frame>) {
        let state = &self.reducer.messages()[slot];
        let channel = match state.kind.as_str() {
            "text" => Channel::Text,
            "thinking" => Channel::Reasoning,
            "tool_call" => Channel::Tool,
            "action" | "event" => Channel::Custom,
            "tool_result" => return self.tool_result(slot, frames),
            "error" => {
                let message = state.prop_str("message").unwrap_or("the agent failed");
                frames.push(Frame::json(None, &Event::RunError { message, code: state.prop_str("code") }));
                self.done = true;
                return;
            }
            _ => Channel::Activity,
        };
        let sent = &self.sent[slot];
        if sent.channel != channel {
            // A new type: the old one ends, and the message goes on under a new id.
            let generation = sent.generation + u32::from(sent.channel != Channel::None);
            self.end(slot, frames);
            self.sent[slot] = Sent { channel, generation, ..Sent::default() };
        }
        match channel {
            Channel::Text | Channel::Reasoning => self.text(slot, before, frames),
            Channel::Tool => self.tool_call(slot, before, frames),
            Channel::Activity | Channel::Custom => self.snapshot(slot, channel, frames),
            Channel::None => {}
        }
        if whole {
            self.end(slot, frames);
        }
    }

    fn text(&mut self, slot: usize, before: &Before<'_>, frames: &mut Vec<Frame>) {
        let content = self.reducer.messages()[slot].prop_str("content").unwrap_or("");
        // Where the new text starts in the content: past what was sent, or at 0 for a correction.
        let (from, correction) = self.sent[slot].text.resume(content, before);
        if correction {
            // Text taken back: the message so far ends, and a new one (a new id) carries the whole text.
            self.end(slot, frames);
            self.sent[slot].generation += 1;
        }
        let id = self.id(slot);
        let state = &self.reducer.messages()[slot];
        let new = state.prop_str("content").unwrap_or("").get(from..).unwrap_or("");
        let sent = &mut self.sent[slot];
        if new.is_empty() && !correction {
            return;
        }
        let reasoning = sent.channel == Channel::Reasoning;
        if !std::mem::replace(&mut sent.open, true) {
            if reasoning {
                frames.push(Frame::json(None, &Event::ReasoningStart { message_id: &id }));
                frames.push(Frame::json(None, &Event::ReasoningMessageStart { message_id: &id, role: "reasoning" }));
            } else {
                frames.push(Frame::json(None, &Event::TextMessageStart { message_id: &id, role: "assistant" }));
            }
        }
        if new.is_empty() {
            return;
        }
        let event = if reasoning {
            Event::ReasoningMessageContent { message_id: &id, delta: new }
        } else {
            Event::TextMessageContent { message_id: &id, delta: new }
        };
        frames.push(Frame::json(None, &event));
    }

    fn tool_call(&mut self, slot: usize, before: &Before<'_>, frames: &mut Vec<Frame>) {
        let state = &self.reducer.messages()[slot];
        let sent = &mut self.sent[slot];
        if sent.call.is_none() {
            let name = state.prop_str("name").unwrap_or("");
            if name.is_empty() {
                // Its start waits for its name; the arguments so far go out with it.
                return;
            }
            let id =
                state.prop_str("id").filter(|id| !id.is_empty()).map_or_else(|| format!("call_{slot}"), str::to_owned);
            frames.push(Frame::json(None, &Event::ToolCallStart { tool_call_id: &id, tool_call_name: name }));
            sent.for_client = state.props.get("server_side") != Some(&Value::Bool(true));
            sent.open = true;
            sent.text = SentText::default();
            sent.call = Some((id, name.to_owned()));
        }
        if !sent.open {
            // Its arguments were ended: what comes later cannot be added.
            return;
        }
        // Arguments taken back send nothing (a call cannot start twice) until they extend what was sent.
        let new = sent.text.new_text(state.prop_str("arguments").unwrap_or(""), before).unwrap_or("");
        if let (false, Some((call_id, _))) = (new.is_empty(), &sent.call) {
            frames.push(Frame::json(None, &Event::ToolCallArgs { tool_call_id: call_id, delta: new }));
        }
    }

    fn tool_result(&mut self, slot: usize, frames: &mut Vec<Frame>) {
        let state = &self.reducer.messages()[slot];
        let call_id = state.prop_str("call_id").unwrap_or("");
        let Some(call) = self.sent.iter().position(|s| s.call.as_ref().is_some_and(|(id, _)| id == call_id)) else {
            return;
        };
        let content = match (state.props.get("error").and_then(|e| e.get("message")), state.props.get("result")) {
            (Some(Value::String(message)), _) => message.clone(),
            (_, Some(Value::String(text))) => text.clone(),
            (_, Some(result)) => result.to_string(),
            _ => return,
        };
        if self.sent[slot].once {
            return;
        }
        let call_id = call_id.to_owned();
        self.end(call, frames);
        self.sent[call].answered = true;
        self.sent[slot].once = true;
        let message_id = format!("{call_id}-result");
        frames.push(Frame::json(
            None,
            &Event::ToolCallResult { message_id: &message_id, tool_call_id: &call_id, content: &content, role: "tool" },
        ));
    }

    fn snapshot(&mut self, slot: usize, channel: Channel, frames: &mut Vec<Frame>) {
        let id = self.id(slot);
        let state = &self.reducer.messages()[slot];
        let event = match channel {
            Channel::Custom => Event::Custom { name: &state.kind, value: &state.props },
            _ => Event::ActivitySnapshot { message_id: &id, activity_type: &state.kind, content: &state.props },
        };
        frames.push(Frame::json(None, &event));
    }

    /// Ends everything open: messages, reasoning, tool calls, then steps, innermost first.
    fn end_all(&mut self, frames: &mut Vec<Frame>) {
        for slot in 0..self.sent.len() {
            self.end(slot, frames);
        }
        while let Some(step) = self.steps.pop() {
            frames.push(Frame::json(None, &Event::StepFinished { step_name: &step }));
        }
    }

    /// A lifecycle event: what it ends or starts. False for any other message.
    fn lifecycle(&mut self, message: &OutputMessage, frames: &mut Vec<Frame>) -> bool {
        if message.kind != "event" {
            return false;
        }
        let named = |key: &str| message.props.get("data").and_then(|d| d.get(key)).and_then(Value::as_str);
        match message.prop_str("event") {
            Some("stream_start" | "stream_end" | "message_start") => {}
            Some("message_end") => {
                if let Some(slot) = named("message_id").and_then(|id| self.reducer.slot(id)) {
                    self.end(slot, frames);
                }
            }
            Some("block_start") => {
                if let Some(block) = named("block_id").filter(|b| !self.steps.iter().any(|s| s == b)) {
                    frames.push(Frame::json(None, &Event::StepStarted { step_name: block }));
                    self.steps.push(block.to_owned());
                }
            }
            Some("block_end") => {
                if let Some(at) = named("block_id").and_then(|b| self.steps.iter().position(|s| s == b)) {
                    let step = self.steps.remove(at);
                    frames.push(Frame::json(None, &Event::StepFinished { step_name: &step }));
                }
            }
            _ => return false,
        }
        true
    }
}

impl Adapter for AgUiAdapter {
    fn push(&mut self, message: &OutputMessage, frames: &mut Vec<Frame>) {
        if self.done {
            return;
        }
        self.start(frames);
        if self.lifecycle(message, frames) {
            return;
        }
        let before = match self.reducer.slot_of(message) {
            Some(slot) => self.sent[slot].text.before(Some(&self.reducer.messages()[slot]), message),
            None => Before::Text(None),
        };
        let Ok(slot) = self.reducer.apply(message) else {
            return;
        };
        if slot == self.sent.len() {
            self.sent.push(Sent::default());
        }
        self.render(slot, &before, !message.delta, frames);
    }

    fn finish(&mut self, outcome: &Outcome, frames: &mut Vec<Frame>) {
        if self.done {
            return;
        }
        self.start(frames);
        self.done = true;
        if outcome.status == EndStatus::Error {
            let error = outcome.error.as_ref();
            let message = error.map_or("the agent failed", |e| e.message.as_str());
            frames.push(Frame::json(None, &Event::RunError { message, code: error.and_then(|e| e.code.as_deref()) }));
            return;
        }
        self.end_all(frames);
        let outcome = if outcome.status == EndStatus::Cancelled {
            RunOutcome::Cancelled
        } else {
            let pending = self.sent.iter().filter(|s| s.for_client && !s.answered);
            RunOutcome::Success {
                pending_tool_call_ids: pending.filter_map(|s| s.call.as_ref()).map(|(id, _)| id.as_str()).collect(),
            }
        };
        let o = &self.options;
        frames.push(Frame::json(None, &Event::RunFinished { thread_id: &o.thread_id, run_id: &o.run_id, outcome }));
    }

    fn ended(&self) -> bool {
        self.done
    }

    fn interrupt(&self, error: &ErrorProps, frames: &mut Vec<Frame>) {
        let message = &error.message;
        frames.push(Frame::json(None, &Event::RunError { message, code: error.code.as_deref() }));
    }
}
