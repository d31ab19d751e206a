//! The lifecycle events a stream adds by itself, with the peer framework's names.
//!
//! `stream_start` opens every stream and `stream_end` closes it. Around a message that arrives in deltas go
//! `message_start` (before its first chunk) and `message_end` (with its chunk count and duration); around the
//! messages of a block go `block_start` and `block_end`. [`Lifecycle`] only tracks what is open and writes the
//! events; the stream stamps and appends them like any other message, so every subscriber and every format
//! sees them in the same place, and OpenAI clients never (events are silent there).
//!
//! A message or block still open when its block or the stream ends is ended first, innermost first.

use serde_json::{Map, Value, json};

use crate::output::{EventProps, OutputMessage};

#[derive(Debug, Clone)]
struct OpenMessage {
    id: String,
    block_id: Option<String>,
    thread_id: Option<String>,
    kind: String,
    chunks: u64,
    started_ms: u64,
}

#[derive(Debug, Clone)]
struct OpenBlock {
    id: String,
    thread_id: Option<String>,
    messages: u64,
    started_ms: u64,
}

/// What is open in a stream.
#[derive(Debug, Clone, Default)]
pub(crate) struct Lifecycle {
    messages: Vec<OpenMessage>,
    blocks: Vec<OpenBlock>,
}

/// An `event` message with the given name and data.
pub(crate) fn event(name: &str, data: Map<String, Value>) -> OutputMessage {
    OutputMessage::builtin(EventProps { event: name.to_owned(), message: None, data: Some(data) })
}

/// A JSON object's map (empty for anything else).
pub(crate) fn object(value: Value) -> Map<String, Value> {
    match value {
        Value::Object(map) => map,
        _ => Map::new(),
    }
}

impl Lifecycle {
    /// The events that go before `message` (stamped with its ids), which is `new` when it starts a message.
    pub(crate) fn before(&mut self, message: &OutputMessage, new: bool, now_ms: u64) -> Vec<OutputMessage> {
        let mut events = Vec::new();
        if let (Some(block), true) = (&message.block_id, new) {
            match self.blocks.iter_mut().find(|b| &b.id == block) {
                Some(open) => open.messages += 1,
                None => {
                    let mut start = event("block_start", object(json!({ "block_id": block })));
                    start.block_id = Some(block.clone());
                    start.thread_id.clone_from(&message.thread_id);
                    events.push(start);
                    self.blocks.push(OpenBlock {
                        id: block.clone(),
                        thread_id: message.thread_id.clone(),
                        messages: 1,
                        started_ms: now_ms,
                    });
                }
            }
        }
        let id = message.message_id.clone().unwrap_or_default();
        if let Some(open) = self.messages.iter_mut().find(|m| m.id == id) {
            open.chunks += 1;
        } else if message.delta && new {
            let mut start = event("message_start", object(json!({ "message_id": id, "type": message.kind })));
            start.block_id.clone_from(&message.block_id);
            start.thread_id.clone_from(&message.thread_id);
            events.push(start);
            self.messages.push(OpenMessage {
                id,
                block_id: message.block_id.clone(),
                thread_id: message.thread_id.clone(),
                kind: message.kind.clone(),
                chunks: 1,
                started_ms: now_ms,
            });
        }
        events
    }

    /// `message_end` for an open message, if it is open.
    pub(crate) fn end_message(&mut self, id: &str, now_ms: u64) -> Option<OutputMessage> {
        let index = self.messages.iter().position(|m| m.id == id)?;
        let open = self.messages.remove(index);
        let mut end = event(
            "message_end",
            object(json!({
                "message_id": open.id,
                "type": open.kind,
                "chunk_count": open.chunks,
                "duration_ms": now_ms.saturating_sub(open.started_ms),
            })),
        );
        end.block_id = open.block_id;
        end.thread_id = open.thread_id;
        Some(end)
    }

    /// `block_end` for an open block, after `message_end` for its open messages.
    pub(crate) fn end_block(&mut self, id: &str, now_ms: u64) -> Vec<OutputMessage> {
        let Some(index) = self.blocks.iter().position(|b| b.id == id) else {
            return Vec::new();
        };
        let in_block: Vec<String> =
            self.messages.iter().filter(|m| m.block_id.as_deref() == Some(id)).map(|m| m.id.clone()).collect();
        let mut events: Vec<OutputMessage> = in_block.iter().filter_map(|m| self.end_message(m, now_ms)).collect();
        let open = self.blocks.remove(index);
        let mut end = event(
            "block_end",
            object(json!({
                "block_id": open.id,
                "message_count": open.messages,
                "duration_ms": now_ms.saturating_sub(open.started_ms),
            })),
        );
        end.block_id = Some(open.id);
        end.thread_id = open.thread_id;
        events.push(end);
        events
    }

    /// Ends everything still open: messages outside blocks, then blocks from the newest.
    pub(crate) fn end_all(&mut self, now_ms: u64) -> Vec<OutputMessage> {
        let loose: Vec<String> = self.messages.iter().filter(|m| m.block_id.is_none()).map(|m| m.id.clone()).collect();
        let mut events: Vec<OutputMessage> = loose.iter().filter_map(|m| self.end_message(m, now_ms)).collect();
        while let Some(block) = self.blocks.last().map(|b| b.id.clone()) {
            events.extend(self.end_block(&block, now_ms));
        }
        // Messages naming a block that never opened (impossible through `before`) end last.
        let rest: Vec<String> = self.messages.iter().map(|m| m.id.clone()).collect();
        events.extend(rest.iter().filter_map(|m| self.end_message(m, now_ms)));
        events
    }
}
