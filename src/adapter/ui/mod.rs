//! [`UiMessageAdapter`]: a stream's messages as the Vercel AI SDK's UI message stream, the chunks `useChat`
//! reads (`docs/clients.md`, "UI message stream").
//!
//! The stream is one assistant message: `start` (with an id made from the stream's epoch, so a replay of the
//! same stream repeats it), then steps (`start-step` … `finish-step`) holding parts, then `finish`, `abort` or
//! `error`, then `data: [DONE]`. Each of our messages becomes the part its type maps to natively where the
//! client has one:
//!
//! - `text` and `thinking`: a text or reasoning part with the message's id (`text-start`, `text-delta`…,
//!   `text-end`); a whole message is started, sent and ended at once, and a delta to it later starts it again.
//! - `tool_call`: `tool-input-start` once its name is known, `tool-input-delta` as its arguments stream, and
//!   `tool-input-available` with the parsed arguments when it ends (`tool-input-error` when they are not
//!   JSON). Every call is `dynamic` (the page did not declare our agent's tools); one the agent runs itself
//!   (`server_side`) is `providerExecuted`. Its `tool_result` is `tool-output-available` (or
//!   `tool-output-error`); a result for a call that was never sent is left out, since the client fails on it.
//! - media: a `file` part with its URL and media type (the `mime` or `format` prop, a `data:` URL's own,
//!   or the file name's extension; `image/*` and the like when nothing says).
//! - `loading`, `action` and `event`: `data-loading`, `data-action`, `data-event` parts, transient (they reach
//!   `onData`, not the stored message); custom types: `data-<type>` parts kept in the message. Each carries the
//!   message's props and its id, so a later delta's state replaces the earlier part rather than adding one.
//! - `error`: an `error` chunk, after which nothing is sent but `[DONE]`.
//!
//! Blocks are steps: a block's start ends the step before it and starts one, its end ends it; a part outside
//! any block opens a step. Ending a step ends the text and reasoning parts still open, because the client
//! forgets them there. The lifecycle's `message_end` ends that message's part.
//!
//! # Degradations
//!
//! A part's text cannot be taken back: a `replace`, `merge`, `set` or resend that leaves a text or reasoning
//! no longer starting with what was sent ends its part and starts a new one (same id: the client keys open
//! parts by id) carrying the whole corrected text, so the message's last part for it is the corrected text
//! while the stale part stays before it (`adapter/sent.rs`), marked, if it was still open, by its end's
//! `providerMetadata`
//! (`{"agentmux": {"superseded": true}}`, which the client keeps on the part) so a page can hide it. A tool call's arguments taken back send nothing
//! until they extend what was sent again; `tool-input-available` carries them whole at the call's end. A
//! tool call's id and name stand once sent, and its arguments once available. A media message's
//! first URL stands. A cancel ends the open parts and sends `abort`; a failure sends `error`.

mod part;

use serde_json::Value;

use super::frame::Frame;
use super::machine::Adapter;
use super::sent::{Before, SentText};
use crate::output::{EndStatus, ErrorProps, FinishReason, Outcome, OutputMessage, Reducer};
use part::{DataPart, Part};

/// The marker that ends a UI message stream.
const DONE: &str = "[DONE]";

/// What the adapter needs beyond the messages: fixed per stream, so output is deterministic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UiMessageOptions {
    /// The assistant message's id, sent in `start`.
    pub message_id: String,
}

/// Renders messages as UI message stream chunks.
///
/// ```
/// use agentmux::adapter::{Adapter, Frame, Payload, UiMessageAdapter, UiMessageOptions};
/// use agentmux::output::{Outcome, OutputMessage};
///
/// let mut adapter = UiMessageAdapter::new(UiMessageOptions { message_id: "msg-1".into() });
/// let mut frames = Vec::new();
/// adapter.push(&OutputMessage::text("Hi"), &mut frames);
/// adapter.finish(&Outcome::completed(), &mut frames);
/// let json: Vec<String> = frames
///     .iter()
///     .map(|frame| match &frame.payload {
///         Payload::Json(json) => String::from_utf8_lossy(json).into_owned(),
///         Payload::End(marker) => marker.to_string(),
///         Payload::Error(_) => unreachable!(),
///     })
///     .collect();
/// assert_eq!(json[0], r#"{"type":"start","messageId":"msg-1"}"#);
/// assert_eq!(json[3], r#"{"type":"text-delta","id":"p0","delta":"Hi"}"#);
/// assert_eq!(json.last().map(String::as_str), Some("[DONE]"));
/// ```
#[derive(Debug)]
pub struct UiMessageAdapter {
    options: UiMessageOptions,
    reducer: Reducer,
    /// What was sent of each message, by the reducer's slot.
    sent: Vec<Sent>,
    started: bool,
    /// A step is open.
    step: bool,
    /// A call the client is to run went out and no output for it came: a natural end is then `tool-calls`,
    /// text after the call or not (as the OpenAI formats end).
    client_tools: bool,
    done: bool,
}

/// What a message's part is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
enum Channel {
    #[default]
    None,
    Text,
    Reasoning,
    Tool,
    Data,
    File,
}

/// What was sent of one message.
#[derive(Debug, Default)]
struct Sent {
    channel: Channel,
    /// A text, reasoning or tool part started and not ended.
    open: bool,
    /// What of its text (or a tool call's arguments) went out.
    text: SentText,
    /// A tool call's id and name, once its `tool-input-start` is out.
    call: Option<(String, String)>,
    provider_executed: bool,
    /// A tool call's arguments went out whole (available or in error): nothing more of them is sent.
    input_done: bool,
    /// A tool call's output, or a media message's file part, went out.
    once: bool,
    /// The part ending now is one a correction replaces: its end says so.
    superseded: bool,
}

impl UiMessageAdapter {
    /// An adapter for one stream.
    pub fn new(options: UiMessageOptions) -> Self {
        UiMessageAdapter {
            options,
            reducer: Reducer::default(),
            sent: Vec::new(),
            started: false,
            step: false,
            client_tools: false,
            done: false,
        }
    }

    fn start(&mut self, frames: &mut Vec<Frame>) {
        if !self.started {
            self.started = true;
            frames.push(Frame::json(None, &Part::Start { message_id: &self.options.message_id }));
        }
    }

    /// Ends every open part, then the step, if one is open.
    fn end_step(&mut self, frames: &mut Vec<Frame>) {
        for slot in 0..self.sent.len() {
            self.end_part(slot, frames);
        }
        if std::mem::take(&mut self.step) {
            frames.push(Frame::json(None, &Part::FinishStep));
        }
    }

    /// Ends the part of the message at `slot`, if it is open: `text-end`, `reasoning-end`, or a tool call's
    /// input made available.
    fn end_part(&mut self, slot: usize, frames: &mut Vec<Frame>) {
        let state = &self.reducer.messages()[slot];
        let sent = &mut self.sent[slot];
        if !std::mem::take(&mut sent.open) {
            return;
        }
        let id = part_id(state, slot);
        match sent.channel {
            Channel::Text => {
                let provider_metadata = part::superseded(std::mem::take(&mut sent.superseded));
                frames.push(Frame::json(None, &Part::TextEnd { id: &id, provider_metadata }));
            }
            Channel::Reasoning => {
                let provider_metadata = part::superseded(std::mem::take(&mut sent.superseded));
                frames.push(Frame::json(None, &Part::ReasoningEnd { id: &id, provider_metadata }));
            }
            Channel::Tool => {
                let Some((call_id, name)) = &sent.call else { return };
                sent.input_done = true;
                let arguments = state.prop_str("arguments").unwrap_or("");
                let parsed = if arguments.trim().is_empty() {
                    Ok(Value::Object(Default::default()))
                } else {
                    serde_json::from_str::<Value>(arguments)
                };
                let (provider_executed, dynamic) = (sent.provider_executed, true);
                let frame = match &parsed {
                    Ok(input) => {
                        let part = Part::ToolInputAvailable {
                            tool_call_id: call_id,
                            tool_name: name,
                            input,
                            provider_executed,
                            dynamic,
                        };
                        Frame::json(None, &part)
                    }
                    Err(error) => {
                        let error_text = format!("the arguments are not JSON: {error}");
                        let part = Part::ToolInputError {
                            tool_call_id: call_id,
                            tool_name: name,
                            input: arguments,
                            provider_executed,
                            dynamic,
                            error_text: &error_text,
                        };
                        Frame::json(None, &part)
                    }
                };
                frames.push(frame);
            }
            Channel::None | Channel::Data | Channel::File => {}
        }
    }

    /// Renders what is new in the message at `slot`; `fast` is an appended fragment known to extend what was
    /// sent, `before` the message's text before this message, `whole` that the message said everything.
    fn render(&mut self, slot: usize, before: &Before<'_>, whole: bool, frames: &mut Vec<Frame>) {
        let state = &self.reducer.messages()[slot];
        let channel = match state.kind.as_str() {
            "text" => Channel::Text,
            "thinking" => Channel::Reasoning,
            "tool_call" => Channel::Tool,
            "image" | "audio" | "video" | "file" => Channel::File,
            "tool_result" => return self.tool_result(slot, frames),
            "error" => {
                let error_text = state.prop_str("message").unwrap_or("the agent failed");
                frames.push(Frame::json(None, &Part::Error { error_text }));
                frames.push(Frame::end(DONE));
                self.done = true;
                return;
            }
            _ => Channel::Data,
        };
        if self.sent[slot].channel != channel {
            // A type change: the old part ends, the new one starts afresh.
            self.end_part(slot, frames);
            self.sent[slot] = Sent { channel, ..Sent::default() };
        }
        match channel {
            Channel::Text | Channel::Reasoning => self.text(slot, before, frames),
            Channel::Tool => self.tool_call(slot, before, frames),
            Channel::File => self.file(slot, frames),
            Channel::Data => self.data(slot, frames),
            Channel::None => {}
        }
        if whole {
            self.end_part(slot, frames);
        }
    }

    fn text(&mut self, slot: usize, before: &Before<'_>, frames: &mut Vec<Frame>) {
        let content = self.reducer.messages()[slot].prop_str("content").unwrap_or("");
        // Where the new text starts in the content: past what was sent, or at 0 for a correction.
        let (from, correction) = self.sent[slot].text.resume(content, before);
        if correction {
            // Text taken back: the part so far ends, and a new part carries the whole corrected text.
            self.sent[slot].superseded = true;
            self.end_part(slot, frames);
            self.sent[slot].superseded = false;
        }
        let state = &self.reducer.messages()[slot];
        let new = state.prop_str("content").unwrap_or("").get(from..).unwrap_or("");
        let sent = &mut self.sent[slot];
        if new.is_empty() && !correction {
            return;
        }
        open_step(&mut self.step, frames);
        let id = part_id(state, slot);
        let reasoning = sent.channel == Channel::Reasoning;
        if !std::mem::replace(&mut sent.open, true) {
            let start = if reasoning { Part::ReasoningStart { id: &id } } else { Part::TextStart { id: &id } };
            frames.push(Frame::json(None, &start));
        }
        if new.is_empty() {
            return;
        }
        let delta = if reasoning {
            Part::ReasoningDelta { id: &id, delta: new }
        } else {
            Part::TextDelta { id: &id, delta: new }
        };
        frames.push(Frame::json(None, &delta));
    }

    fn tool_call(&mut self, slot: usize, before: &Before<'_>, frames: &mut Vec<Frame>) {
        let state = &self.reducer.messages()[slot];
        let sent = &mut self.sent[slot];
        if sent.input_done {
            return;
        }
        if sent.call.is_none() {
            let name = state.prop_str("name").unwrap_or("");
            if name.is_empty() {
                // Its header waits for its name; the arguments so far go out with it.
                return;
            }
            let id =
                state.prop_str("id").filter(|id| !id.is_empty()).map_or_else(|| format!("call_{slot}"), str::to_owned);
            sent.provider_executed = state.props.get("server_side") == Some(&Value::Bool(true));
            sent.open = true;
            // The arguments so far go out after the header.
            sent.text = SentText::default();
            open_step(&mut self.step, frames);
            let part = Part::ToolInputStart {
                tool_call_id: &id,
                tool_name: name,
                provider_executed: sent.provider_executed,
                dynamic: true,
            };
            frames.push(Frame::json(None, &part));
            sent.call = Some((id, name.to_owned()));
            self.client_tools = !sent.provider_executed;
        }
        // Arguments taken back send nothing: `tool-input-available` carries them whole when the call ends.
        let new = sent.text.new_text(state.prop_str("arguments").unwrap_or(""), before).unwrap_or("");
        if let (false, Some((call_id, _))) = (new.is_empty(), &sent.call) {
            frames.push(Frame::json(None, &Part::ToolInputDelta { tool_call_id: call_id, input_text_delta: new }));
        }
    }

    fn tool_result(&mut self, slot: usize, frames: &mut Vec<Frame>) {
        let state = &self.reducer.messages()[slot];
        let call_id = state.prop_str("call_id").unwrap_or("");
        let Some(call) = self.sent.iter().position(|s| s.call.as_ref().is_some_and(|(id, _)| id == call_id)) else {
            return;
        };
        let error = state.props.get("error").and_then(|e| e.get("message")).and_then(Value::as_str);
        let output = state.props.get("result");
        if self.sent[slot].once || (error.is_none() && output.is_none()) {
            return;
        }
        // Its input goes out whole first, if it was still streaming.
        let (call_id, error, output) = (call_id.to_owned(), error.map(str::to_owned), output.cloned());
        self.end_part(call, frames);
        let (provider_executed, dynamic) = (self.sent[call].provider_executed, true);
        let part = match (&error, &output) {
            (Some(error_text), _) => {
                Part::ToolOutputError { tool_call_id: &call_id, error_text, provider_executed, dynamic }
            }
            (None, output) => Part::ToolOutputAvailable {
                tool_call_id: &call_id,
                output: output.as_ref().unwrap_or(&Value::Null),
                provider_executed,
                dynamic,
            },
        };
        frames.push(Frame::json(None, &part));
        self.sent[slot].once = true;
        self.client_tools = false;
    }

    fn file(&mut self, slot: usize, frames: &mut Vec<Frame>) {
        let state = &self.reducer.messages()[slot];
        let url = state.prop_str("url").unwrap_or("");
        if url.is_empty() || self.sent[slot].once {
            return;
        }
        self.sent[slot].once = true;
        open_step(&mut self.step, frames);
        let media_type = media_type(state);
        frames.push(Frame::json(None, &Part::File { url, media_type: &media_type }));
    }

    fn data(&mut self, slot: usize, frames: &mut Vec<Frame>) {
        let state = &self.reducer.messages()[slot];
        let transient = matches!(state.kind.as_str(), "loading" | "action" | "event");
        let kind = format!("data-{}", state.kind);
        let id = part_id(state, slot);
        open_step(&mut self.step, frames);
        frames.push(Frame::json(None, &DataPart { kind: &kind, id: &id, data: &state.props, transient }));
    }

    /// A lifecycle event: what it ends or starts. False for any other message.
    fn lifecycle(&mut self, message: &OutputMessage, frames: &mut Vec<Frame>) -> bool {
        if message.kind != "event" {
            return false;
        }
        match message.prop_str("event") {
            Some("stream_start" | "stream_end" | "message_start") => {}
            Some("message_end") => {
                let id = message.props.get("data").and_then(|d| d.get("message_id")).and_then(Value::as_str);
                if let Some(slot) = id.and_then(|id| self.reducer.slot(id)) {
                    self.end_part(slot, frames);
                }
            }
            Some("block_start") => {
                self.end_step(frames);
                open_step(&mut self.step, frames);
            }
            Some("block_end") => self.end_step(frames),
            _ => return false,
        }
        true
    }
}

impl Adapter for UiMessageAdapter {
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
        match outcome.status {
            EndStatus::Error => {
                let error_text = outcome.error.as_ref().map_or("the agent failed", |e| e.message.as_str());
                frames.push(Frame::json(None, &Part::Error { error_text }));
            }
            EndStatus::Cancelled => {
                self.end_step(frames);
                frames.push(Frame::json(None, &Part::Abort));
            }
            EndStatus::Completed => {
                self.end_step(frames);
                let finish_reason = match outcome.finish_reason.unwrap_or_default() {
                    FinishReason::Stop if self.client_tools => "tool-calls",
                    FinishReason::Stop => "stop",
                    FinishReason::Length => "length",
                    FinishReason::ContentFilter => "content-filter",
                    FinishReason::ToolCalls => "tool-calls",
                };
                frames.push(Frame::json(None, &Part::Finish { finish_reason }));
            }
        }
        frames.push(Frame::end(DONE));
    }

    fn ended(&self) -> bool {
        self.done
    }

    fn interrupt(&self, error: &ErrorProps, frames: &mut Vec<Frame>) {
        frames.push(Frame::json(None, &Part::Error { error_text: &error.message }));
        frames.push(Frame::end(DONE));
    }
}

fn open_step(step: &mut bool, frames: &mut Vec<Frame>) {
    if !std::mem::replace(step, true) {
        frames.push(Frame::json(None, &Part::StartStep));
    }
}

/// A part's id: its message's id, or its place in the stream.
fn part_id(state: &OutputMessage, slot: usize) -> String {
    state.message_id.clone().unwrap_or_else(|| format!("p{slot}"))
}

/// A media message's media type: what its props say, a `data:` URL's own, or its file name's extension;
/// `image/*` (and so on) when nothing says.
fn media_type(state: &OutputMessage) -> String {
    let url = state.prop_str("url").unwrap_or("");
    if let Some(mime) = state.prop_str("mime").filter(|m| m.contains('/')) {
        return mime.to_owned();
    }
    if let Some(data) = url.strip_prefix("data:") {
        let end = data.find([';', ',']).unwrap_or(data.len());
        if data[..end].contains('/') {
            return data[..end].to_owned();
        }
    }
    let family = match state.kind.as_str() {
        "file" => "application",
        kind => kind,
    };
    // A `format` prop names an extension (`mp3`), as does the URL's file name.
    let format = state.prop_str("format").filter(|f| !f.is_empty() && !f.contains('/'));
    let path = url.split(['?', '#']).next().unwrap_or("");
    let extension = format.or_else(|| path.rsplit_once('.').map(|(_, e)| e)).unwrap_or("").to_ascii_lowercase();
    let known = match extension.as_str() {
        "png" => "image/png",
        "jpg" | "jpeg" => "image/jpeg",
        "gif" => "image/gif",
        "webp" => "image/webp",
        "svg" => "image/svg+xml",
        "mp3" | "mpeg" => "audio/mpeg",
        "wav" => "audio/wav",
        "ogg" => "audio/ogg",
        "mp4" => "video/mp4",
        "webm" => "video/webm",
        "pdf" => "application/pdf",
        "json" => "application/json",
        "txt" => "text/plain",
        _ if format.is_some() => return format!("{family}/{extension}"),
        _ if family == "application" => "application/octet-stream",
        _ => return format!("{family}/*"),
    };
    known.to_owned()
}
