//! What an OpenAI client has been sent so far, and what is new: the state machine under both OpenAI adapters.
//!
//! [`Progress`] runs the delta reducer over the stream and keeps, per message, what of its projection (see
//! `projection.rs`) has gone out. After each message it compares the message's new projection with what was
//! sent and yields [`Piece`]s: the text that extends what was sent, a tool call's header once its name is
//! known, its argument fragments, an error. The streaming adapter turns pieces into chunks; the non-streaming
//! aggregate only needs the bookkeeping (tool-call indexes, whether tool calls went to the client, the error).
//!
//! Tool calls go out one at a time: a call's header waits until the calls that appeared before it have
//! ended (their `message_end` lifecycle event, a call sent whole, or the stream's end), then it sends its
//! header and its arguments so far, and streams on from there. Clients assemble a call from consecutive
//! deltas, as OpenAI sends them.
//!
//! A chunk stream cannot take text back. When a `replace`, `merge`, `set`, a whole-message resend or a
//! `type_change` leaves a message's content or reasoning no longer starting with what was sent, the whole new
//! text goes out again as a correction (`fresh` on the piece): the Anthropic and Responses adapters show it as
//! a new block or item, the chat chunk stream on a new line after what was sent, so what a client shows last
//! is the corrected text, never the stale one (`docs/clients.md`, "Degradations"). A correction to the empty
//! text waits: the message's next text goes out fresh. A tool call's arguments cannot be sent twice: there
//! nothing is sent until its arguments again extend what was sent. A message that changes channel (a loading
//! message that becomes text) starts afresh in the new channel. An append at a
//! message's main field takes a fast path: the fragment is the new text, no comparison needed, so a long
//! answer streamed in small deltas costs O(fragment) per delta, not O(text).

use std::collections::VecDeque;

use crate::output::{DeltaAction, FinishReason, Outcome, OutputMessage, Reducer, main_field};

use super::options::AgentTools;
use super::projection::{Projection, project};

/// Something to send.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Piece<'a> {
    /// More assistant content; `new_line` asks for a line break before it (see [`Separator`]); `fresh` says
    /// it is a message's whole text, correcting what was sent of it (see the module doc).
    Content { text: &'a str, new_line: bool, fresh: bool },
    /// More reasoning; `new_line` and `fresh` as for content.
    Reasoning { text: &'a str, new_line: bool, fresh: bool },
    /// The first delta of a tool call.
    ToolHeader { index: u32, id: &'a str, name: &'a str },
    /// More of a tool call's arguments.
    ToolArguments { index: u32, arguments: &'a str },
    /// An error; nothing follows it.
    Error { message: &'a str, code: Option<&'a str> },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
enum Channel {
    #[default]
    None,
    Content,
    Reasoning,
    Tool,
}

/// What was sent of one message.
#[derive(Debug, Clone, Default)]
struct Sent {
    channel: Channel,
    /// `None`: what was sent is exactly the projection's text. `Some(text)`: what was sent, which the
    /// projection no longer extends (or, for a tool call whose header is not out yet, the empty string).
    stale: Option<String>,
    /// A tool call's header, once it is out: its index, id and name stand from then on.
    header: Option<Header>,
    /// A tool call that will get no more deltas: sent whole, or its `message_end` seen.
    closed: bool,
    /// A correction to the empty text was not sent yet: the next text goes out `fresh`.
    correction: bool,
}

#[derive(Debug, Clone)]
struct Header {
    index: u32,
    id: String,
    name: String,
}

/// A tool call as sent, for the non-streaming aggregate.
pub(crate) struct SentToolCall<'a> {
    pub(crate) index: u32,
    pub(crate) id: &'a str,
    pub(crate) name: &'a str,
    pub(crate) arguments: &'a str,
}

/// The state machine; see the module doc.
#[derive(Debug, Default)]
pub(crate) struct Progress {
    /// How the agent's own tool calls project.
    agent_tools: AgentTools,
    reducer: Reducer,
    sent: Vec<Sent>,
    next_tool_index: u32,
    /// Tool calls whose header is not out yet or that are still open, in order of first appearance: only
    /// the front one streams, the others wait their turn.
    tool_queue: VecDeque<usize>,
    content: Separator,
    reasoning: Separator,
    /// A tool call went to the client (its header is out): the run handed over, whatever came after.
    handed_tool_calls: bool,
    /// The error that ended the stream: its message and code.
    error: Option<(String, Option<String>)>,
}

impl Progress {
    /// A fresh state machine; `agent_tools` says how the agent's own tool calls project.
    pub(crate) fn new(agent_tools: AgentTools) -> Self {
        Progress { agent_tools, ..Progress::default() }
    }

    /// Applies one message and yields what to send for it. A message the reducer refuses yields nothing:
    /// a stream refuses such messages before they are appended, so only hand-fed adapters meet them.
    pub(crate) fn push(&mut self, message: &OutputMessage, emit: &mut dyn FnMut(Piece<'_>)) {
        if self.error.is_some() {
            return;
        }
        let previous = self.reducer.slot_of(message);
        let fast = previous.and_then(|slot| self.fast_fragment(slot, message));
        let before = match (previous, fast) {
            (Some(slot), None) => projection_text(&self.reducer.messages()[slot], self.agent_tools),
            _ => None,
        };
        let Ok(slot) = self.reducer.apply(message) else {
            return;
        };
        if slot == self.sent.len() {
            self.sent.push(Sent::default());
        }
        let ended = ended_message(message).and_then(|id| self.reducer.slot(id));
        if let Some(ended) = ended.filter(|&slot| self.sent[slot].channel == Channel::Tool) {
            self.sent[ended].closed = true;
            self.advance(emit);
        }
        if matches!(project(&self.reducer.messages()[slot], self.agent_tools), Projection::ToolCall { .. }) {
            let sent = &mut self.sent[slot];
            if sent.channel != Channel::Tool {
                *sent = Sent { channel: Channel::Tool, stale: Some(String::new()), ..Sent::default() };
            }
            sent.closed |= !message.delta;
            if sent.header.is_none() {
                if !self.tool_queue.contains(&slot) {
                    self.tool_queue.push_back(slot);
                }
                // Its header and arguments so far go out when its turn comes, maybe now.
                self.advance(emit);
                return;
            }
        }
        self.render(slot, fast, before.as_deref(), emit);
        self.advance(emit);
    }

    /// Sends what is new in the projection of the message at `slot`.
    fn render(&mut self, slot: usize, fast: Option<&str>, before: Option<&str>, emit: &mut dyn FnMut(Piece<'_>)) {
        let state = &self.reducer.messages()[slot];
        let sent = &mut self.sent[slot];
        let (channel, text, block) = match project(state, self.agent_tools) {
            Projection::Silent => return,
            Projection::Error { message, code } => {
                self.error = Some((message.to_owned(), code.map(str::to_owned)));
                emit(Piece::Error { message, code });
                return;
            }
            Projection::Content { text, block } => (Channel::Content, text, block),
            Projection::Reasoning(text) => (Channel::Reasoning, text, true),
            Projection::ToolCall { arguments, .. } => (Channel::Tool, arguments.into(), false),
        };
        let new = match fast {
            Some(fragment) => fragment,
            None => {
                let sent_text = if sent.channel != channel {
                    ""
                } else if let Some(stale) = &sent.stale {
                    stale.as_str()
                } else {
                    before.unwrap_or("")
                };
                match text.strip_prefix(sent_text) {
                    Some(rest) => {
                        sent.stale = None;
                        rest
                    }
                    // Text taken back: the whole text goes out again as a correction.
                    None if channel != Channel::Tool => {
                        sent.stale = None;
                        sent.correction = true;
                        &*text
                    }
                    None => {
                        sent.stale = Some(sent_text.to_owned());
                        ""
                    }
                }
            }
        };
        sent.channel = channel;
        if new.is_empty() {
            return;
        }
        let fresh = std::mem::take(&mut sent.correction);
        match channel {
            Channel::Content => {
                let new_line = self.content.next(slot, block, fresh, new);
                emit(Piece::Content { text: new, new_line, fresh });
            }
            Channel::Reasoning => {
                let new_line = self.reasoning.next(slot, block, fresh, new);
                emit(Piece::Reasoning { text: new, new_line, fresh });
            }
            Channel::Tool => {
                if let Some(index) = sent.header.as_ref().map(|h| h.index) {
                    emit(Piece::ToolArguments { index, arguments: new });
                }
            }
            Channel::None => {}
        }
    }

    /// Lets the next tool calls take their turn: while the front of the queue is closed, it leaves; a new
    /// front sends its header and its arguments so far (once its name is known).
    fn advance(&mut self, emit: &mut dyn FnMut(Piece<'_>)) {
        while let Some(&front) = self.tool_queue.front() {
            if self.sent[front].header.is_none() {
                match project(&self.reducer.messages()[front], self.agent_tools) {
                    Projection::ToolCall { id, name, arguments } if !name.is_empty() => {
                        let index = self.next_tool_index;
                        self.next_tool_index += 1;
                        let header = Header { index, id: tool_call_id(id, index), name: name.to_owned() };
                        emit(Piece::ToolHeader { index, id: &header.id, name });
                        if !arguments.is_empty() {
                            emit(Piece::ToolArguments { index, arguments });
                        }
                        self.handed_tool_calls = true;
                        let sent = &mut self.sent[front];
                        sent.header = Some(header);
                        sent.stale = None;
                    }
                    // Still waiting for its name.
                    Projection::ToolCall { .. } if !self.sent[front].closed => return,
                    // Never named, or no longer a tool call: it has nothing to send.
                    _ => {}
                }
            }
            if !self.sent[front].closed {
                return;
            }
            self.tool_queue.pop_front();
        }
    }

    /// The stream completed: every tool call still waiting sends, in order.
    pub(crate) fn finish(&mut self, emit: &mut dyn FnMut(Piece<'_>)) {
        for &slot in &self.tool_queue {
            self.sent[slot].closed = true;
        }
        self.advance(emit);
    }

    /// The fragment a delta appends to its message's text, when it is a plain append at the main field of a
    /// message whose text was sent in full: then the fragment is exactly what is new.
    fn fast_fragment<'m>(&self, slot: usize, message: &'m OutputMessage) -> Option<&'m str> {
        let state = &self.reducer.messages()[slot];
        let sent = &self.sent[slot];
        let main = main_field(&state.kind)?;
        let same_place = message.kind == state.kind
            && message.action_or_default() == DeltaAction::Append
            && message.delta_path.as_deref().is_none_or(|p| p == main);
        let in_sync = sent.stale.is_none() && sent.channel != Channel::None;
        let appendable = state.props.get(main).is_none_or(|v| v.is_string() || v.is_null());
        if !(message.delta && same_place && in_sync && appendable) {
            return None;
        }
        message.prop_str(main)
    }

    /// The reducer's view: every message's current state.
    pub(crate) fn reducer(&self) -> &Reducer {
        &self.reducer
    }

    /// The error message that ended the stream (its message and code): nothing is sent after it.
    pub(crate) fn error(&self) -> Option<(&str, Option<&str>)> {
        self.error.as_ref().map(|(message, code)| (message.as_str(), code.as_deref()))
    }

    /// The finish reason of a completed stream: the outcome's, except that `stop` (named or by default)
    /// becomes `tool_calls` when tool calls went to the client, as OpenAI ends every answer that calls tools,
    /// text after the calls or not. (Calls the agent runs itself never go out as `tool_calls`.)
    pub(crate) fn finish_reason(&self, outcome: &Outcome) -> FinishReason {
        match outcome.finish_reason.unwrap_or_default() {
            FinishReason::Stop if self.handed_tool_calls => FinishReason::ToolCalls,
            reason => reason,
        }
    }

    /// The tool calls whose header went out and that are still tool calls, by index: the id and name the
    /// header carried, the arguments as they are now.
    pub(crate) fn tool_calls(&self) -> Vec<SentToolCall<'_>> {
        let mut calls: Vec<SentToolCall<'_>> = self
            .sent
            .iter()
            .zip(self.reducer.messages())
            .filter_map(|(sent, state)| {
                let header = sent.header.as_ref()?;
                match project(state, self.agent_tools) {
                    Projection::ToolCall { arguments, .. } => {
                        Some(SentToolCall { index: header.index, id: &header.id, name: &header.name, arguments })
                    }
                    _ => None,
                }
            })
            .collect();
        calls.sort_by_key(|c| c.index);
        calls
    }
}

/// Decides where a line break goes between the texts of different messages in one channel.
///
/// A break goes in when the text comes from another message than the last text did, one of the two is a
/// block (reasoning messages, media links), and neither the text before ends a line nor the new text starts
/// one; and before a correction (a message's whole text sent again) unless a line ends there. The
/// non-streaming aggregate joins final texts with the same rule, so both read alike.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Separator {
    /// The last text's message, whether it was a block, and whether it ended a line.
    last: Option<(usize, bool, bool)>,
}

impl Separator {
    /// Records `text` from message `slot` (`fresh`: a correction); true when a line break must go before it.
    pub(crate) fn next(&mut self, slot: usize, block: bool, fresh: bool, text: &str) -> bool {
        let new_line = matches!(self.last, Some((last, last_block, ends_line))
            if (fresh || (last != slot && (block || last_block))) && !ends_line)
            && !text.starts_with('\n');
        self.last = Some((slot, block, text.ends_with('\n')));
        new_line
    }
}

/// The message id a `message_end` lifecycle event names.
fn ended_message(message: &OutputMessage) -> Option<&str> {
    if message.kind != "event" || message.prop_str("event") != Some("message_end") {
        return None;
    }
    message.props.get("data")?.get("message_id")?.as_str()
}

/// The text of a projection that the extension rule compares.
fn projection_text(state: &OutputMessage, agent_tools: AgentTools) -> Option<String> {
    match project(state, agent_tools) {
        Projection::Content { text, .. } | Projection::Reasoning(text) => Some(text.into_owned()),
        Projection::ToolCall { arguments: text, .. } => Some(text.to_owned()),
        Projection::Silent | Projection::Error { .. } => None,
    }
}

/// A tool call's id, or `call_<index>` when the producer gave none.
fn tool_call_id(id: &str, index: u32) -> String {
    if id.is_empty() { format!("call_{index}") } else { id.to_owned() }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::output::OutputMessage;

    /// What `progress` sends for `message`: each piece of text, whether after a line break, whether fresh.
    fn texts(progress: &mut Progress, message: &OutputMessage) -> Vec<(String, bool, bool)> {
        let mut out = Vec::new();
        progress.push(message, &mut |piece| {
            if let Piece::Content { text, new_line, fresh } | Piece::Reasoning { text, new_line, fresh } = piece {
                out.push((text.to_owned(), new_line, fresh));
            }
        });
        out
    }

    fn delta(content: &str, action: DeltaAction) -> OutputMessage {
        OutputMessage::text(content).with_message_id("m1").as_delta(action, None)
    }

    #[test]
    fn text_taken_back_goes_out_again_whole_as_a_correction_and_streams_on_from_there() {
        let mut progress = Progress::default();
        assert_eq!(
            texts(&mut progress, &delta("The fare is 41", DeltaAction::Append)),
            [("The fare is 41".into(), false, false)]
        );
        let corrected = texts(&mut progress, &delta("The fare is 42", DeltaAction::Replace));
        assert_eq!(corrected, [("The fare is 42".into(), true, true)], "whole, fresh, on a new line");
        assert_eq!(texts(&mut progress, &delta(" EUR.", DeltaAction::Append)), [(" EUR.".into(), false, false)]);
        let extended = texts(&mut progress, &delta("The fare is 42 EUR. Book now", DeltaAction::Replace));
        assert_eq!(extended, [(" Book now".into(), false, false)], "a replace that extends is a delta");
    }

    #[test]
    fn a_correction_to_the_empty_text_goes_out_with_the_next_text() {
        let mut progress = Progress::default();
        texts(&mut progress, &delta("Wrong", DeltaAction::Append));
        assert_eq!(texts(&mut progress, &delta("", DeltaAction::Replace)), []);
        assert_eq!(texts(&mut progress, &delta("Right", DeltaAction::Append)), [("Right".into(), true, true)]);
        assert_eq!(texts(&mut progress, &delta("!", DeltaAction::Append)), [("!".into(), false, false)]);
    }
}
