//! The lifecycle events a stream adds by itself, with the peer framework's names.
//!
//! `stream_start` opens every stream and `stream_end` closes it. Around a message that arrives in deltas go
//! `message_start` (before its first chunk) and `message_end` (with its chunk count and duration); around the
//! messages of a block go `block_start` and `block_end`. [`Lifecycle`] only tracks what is open and writes the
//! events; the stream stamps and appends them like any other message, so every subscriber and every format
//! sees them in the same place, and OpenAI clients never (events are silent there).
//!
//! A message or block still open when its block or the stream ends is ended first, innermost first.
//!
//! # Room to close
//!
//! Every event that opens something comes with the widest event that can close it ([`Opening`]): the same
//! event with every number in its data at `u64::MAX`. Its strings are the open message's or block's bounded
//! ids and type (see `NAME_BYTES`), fixed when it opens, so the stream can reserve room for the closing event
//! then (`stream/closing.rs`) and the closing event always fits. `stream_end` likewise has its widest form
//! ([`widest_outcome`]): any finish reason and usage, and an error of up to [`END_ERROR_BYTES`] of message and
//! code.

use std::collections::HashMap;

use indexmap::IndexMap;

use crate::output::{
    BlockEnd, BlockStart, ErrorProps, FinishReason, LifecycleEvent, MessageEnd, MessageStart, NAME_BYTES, Outcome,
    OutputMessage, PromptTokensDetails, StreamEnd, Usage,
};

/// The bytes of an error's message, and of its code, that the room reserved for `stream_end` holds: what an
/// end the stream cannot refuse (a shutdown, a cancel, an agent's error) always keeps. More is kept when the
/// limits leave room for it.
pub(crate) const END_ERROR_BYTES: usize = 64;

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

impl OpenMessage {
    /// Its `message_end` at `now_ms`, and the widest it could have been.
    fn closing(&self, now_ms: u64) -> Closing {
        let event = self.end_event(self.chunks, now_ms.saturating_sub(self.started_ms));
        Closing { event, widest: self.end_event(u64::MAX, u64::MAX) }
    }

    fn end_event(&self, chunk_count: u64, duration_ms: u64) -> OutputMessage {
        let data = MessageEnd { message_id: self.id.clone(), kind: self.kind.clone(), chunk_count, duration_ms };
        let mut end = data.event();
        end.block_id.clone_from(&self.block_id);
        end.thread_id.clone_from(&self.thread_id);
        end
    }
}

impl OpenBlock {
    /// Its `block_end` at `now_ms`, and the widest it could have been.
    fn closing(&self, now_ms: u64) -> Closing {
        let event = self.end_event(self.messages, now_ms.saturating_sub(self.started_ms));
        Closing { event, widest: self.end_event(u64::MAX, u64::MAX) }
    }

    fn end_event(&self, message_count: u64, duration_ms: u64) -> OutputMessage {
        let mut end = BlockEnd { block_id: self.id.clone(), message_count, duration_ms }.event();
        end.block_id = Some(self.id.clone());
        end.thread_id.clone_from(&self.thread_id);
        end
    }
}

/// An event that opens a message or a block, and the widest event that will close it.
#[derive(Debug)]
pub(crate) struct Opening {
    pub(crate) event: OutputMessage,
    pub(crate) widest_end: OutputMessage,
}

/// An event that closes a message or a block, and the widest it could have been (what was reserved for it).
#[derive(Debug)]
pub(crate) struct Closing {
    pub(crate) event: OutputMessage,
    pub(crate) widest: OutputMessage,
}

/// What is open in a stream, by id, in the order it opened (a stream may hold thousands of open messages:
/// a delta finds its own without a scan).
#[derive(Debug, Clone, Default)]
pub(crate) struct Lifecycle {
    messages: IndexMap<String, OpenMessage>,
    blocks: IndexMap<String, OpenBlock>,
}

/// One change [`Lifecycle::before`] made, so a refused batch can be taken back ([`Lifecycle::rollback`])
/// without a copy of everything open.
#[derive(Debug)]
pub(crate) enum Opened {
    /// The open message at this index counted one more chunk.
    Chunk(usize),
    /// A message opened (the last one).
    Message,
    /// The open block at this index counted one more message.
    BlockMessage(usize),
    /// A block opened (the last one).
    Block,
}

impl Lifecycle {
    /// The events that go before `message` (stamped with its ids), which is `new` when it starts a message,
    /// each with the widest event that will close what it opens. What it changes is recorded in `undo`.
    pub(crate) fn before(
        &mut self,
        message: &OutputMessage,
        new: bool,
        now_ms: u64,
        undo: &mut Vec<Opened>,
    ) -> Vec<Opening> {
        let mut events = Vec::new();
        if let (Some(block), true) = (&message.block_id, new) {
            if let Some((index, _, open)) = self.blocks.get_full_mut(block.as_str()) {
                open.messages += 1;
                undo.push(Opened::BlockMessage(index));
            } else {
                let mut start = BlockStart { block_id: block.clone() }.event();
                start.block_id = Some(block.clone());
                start.thread_id.clone_from(&message.thread_id);
                let open = OpenBlock {
                    id: block.clone(),
                    thread_id: message.thread_id.clone(),
                    messages: 1,
                    started_ms: now_ms,
                };
                events.push(Opening { event: start, widest_end: open.end_event(u64::MAX, u64::MAX) });
                self.blocks.insert(block.clone(), open);
                undo.push(Opened::Block);
            }
        }
        let id = message.message_id.as_deref().unwrap_or_default();
        if let Some((index, _, open)) = self.messages.get_full_mut(id) {
            open.chunks += 1;
            undo.push(Opened::Chunk(index));
        } else if message.delta && new {
            let mut start = MessageStart { message_id: id.to_owned(), kind: message.kind.clone() }.event();
            start.block_id.clone_from(&message.block_id);
            start.thread_id.clone_from(&message.thread_id);
            let open = OpenMessage {
                id: id.to_owned(),
                block_id: message.block_id.clone(),
                thread_id: message.thread_id.clone(),
                kind: message.kind.clone(),
                chunks: 1,
                started_ms: now_ms,
            };
            events.push(Opening { event: start, widest_end: open.end_event(u64::MAX, u64::MAX) });
            self.messages.insert(id.to_owned(), open);
            undo.push(Opened::Message);
        }
        events
    }

    /// Takes back what [`Lifecycle::before`] recorded in `undo`, newest first.
    pub(crate) fn rollback(&mut self, undo: Vec<Opened>) {
        for step in undo.into_iter().rev() {
            match step {
                Opened::Chunk(index) => {
                    if let Some((_, open)) = self.messages.get_index_mut(index) {
                        open.chunks -= 1;
                    }
                }
                Opened::Message => {
                    self.messages.pop();
                }
                Opened::BlockMessage(index) => {
                    if let Some((_, open)) = self.blocks.get_index_mut(index) {
                        open.messages -= 1;
                    }
                }
                Opened::Block => {
                    self.blocks.pop();
                }
            }
        }
    }

    /// How many messages and blocks are open: the closing events [`Lifecycle::end_all`] would give.
    pub(crate) fn open(&self) -> usize {
        self.messages.len() + self.blocks.len()
    }

    /// `message_end` for an open message, if it is open.
    pub(crate) fn end_message(&mut self, id: &str, now_ms: u64) -> Option<Closing> {
        self.messages.shift_remove(id).map(|open| open.closing(now_ms))
    }

    /// `message_end` for every open message `which` picks, in the order they opened: one pass over the open
    /// messages, however many there are (ending them one by one would shift the rest each time).
    fn end_messages(&mut self, now_ms: u64, which: impl Fn(&OpenMessage) -> bool) -> Vec<Closing> {
        self.messages.extract_if(.., |_, open| which(open)).map(|(_, open)| open.closing(now_ms)).collect()
    }

    /// `block_end` for an open block, after `message_end` for its open messages.
    pub(crate) fn end_block(&mut self, id: &str, now_ms: u64) -> Vec<Closing> {
        if !self.blocks.contains_key(id) {
            return Vec::new();
        }
        let mut events = self.end_messages(now_ms, |m| m.block_id.as_deref() == Some(id));
        events.extend(self.blocks.shift_remove(id).map(|open| open.closing(now_ms)));
        events
    }

    /// Takes in one stamped entry of a stream's log: what a stream whose producer is gone (the service
    /// restarted, the node writing it died) had open is rebuilt from its log this way, entry by entry, so
    /// that its end closes it as a live end would.
    pub(crate) fn observe(&mut self, entry: &OutputMessage) {
        let started_ms = entry.metadata.as_ref().and_then(|m| m.timestamp).unwrap_or_default();
        if entry.kind == "event" {
            let data = entry.props.get("data");
            let field = |name: &str| data.and_then(|d| d.get(name)).and_then(|v| v.as_str()).map(str::to_owned);
            match entry.prop_str("event") {
                Some("message_start") => {
                    let Some(id) = field("message_id") else { return };
                    let kind = field("type").unwrap_or_default();
                    let (block_id, thread_id) = (entry.block_id.clone(), entry.thread_id.clone());
                    let open = OpenMessage { id: id.clone(), block_id, thread_id, kind, chunks: 0, started_ms };
                    self.messages.insert(id, open);
                }
                Some("message_end") => {
                    if let Some(id) = field("message_id") {
                        self.messages.shift_remove(&id);
                    }
                }
                Some("block_start") => {
                    let Some(id) = field("block_id") else { return };
                    let thread_id = entry.thread_id.clone();
                    self.blocks.insert(id.clone(), OpenBlock { id, thread_id, messages: 0, started_ms });
                }
                Some("block_end") => {
                    if let Some(id) = field("block_id") {
                        self.blocks.shift_remove(&id);
                    }
                }
                _ => {}
            }
            return;
        }
        let id = entry.message_id.as_deref().unwrap_or_default();
        // A message starts when it is not a delta of one already open (as `before` counts it).
        let starts = match self.messages.get_mut(id) {
            Some(open) => {
                open.chunks += 1;
                open.chunks == 1
            }
            None => true,
        };
        if let (Some(block), true) = (&entry.block_id, starts)
            && let Some(open) = self.blocks.get_mut(block.as_str())
        {
            open.messages += 1;
        }
    }

    /// Ends everything still open: messages outside blocks, then blocks from the newest, each after its
    /// messages. One pass over the messages, however many messages and blocks are open.
    pub(crate) fn end_all(&mut self, now_ms: u64) -> Vec<Closing> {
        let mut events = self.end_messages(now_ms, |m| m.block_id.is_none());
        // The rest by block, each block's in the order they opened; messages naming a block that never opened
        // (impossible through `before`) end last.
        let mut by_block: HashMap<String, Vec<OpenMessage>> = HashMap::new();
        let mut blockless = Vec::new();
        for (_, open) in self.messages.drain(..) {
            match open.block_id.as_ref().filter(|block| self.blocks.contains_key(block.as_str())) {
                Some(block) => by_block.entry(block.clone()).or_default().push(open),
                None => blockless.push(open),
            }
        }
        while let Some((id, block)) = self.blocks.pop() {
            events.extend(by_block.remove(&id).into_iter().flatten().map(|open| open.closing(now_ms)));
            events.push(block.closing(now_ms));
        }
        events.extend(blockless.into_iter().map(|open| open.closing(now_ms)));
        events
    }
}

/// `stream_end` for a stream that ended with `outcome` after `duration_ms`.
pub(crate) fn stream_end(outcome: &Outcome, duration_ms: u64) -> OutputMessage {
    let Outcome { status, finish_reason, usage, error } = outcome.clone();
    StreamEnd { status, duration_ms, finish_reason, usage, error }.event()
}

/// The widest outcome an end that cannot be refused keeps whole: the longest status, finish reason and
/// usage, and an error of [`END_ERROR_BYTES`] of message and of code without details.
pub(crate) fn widest_outcome() -> Outcome {
    let most = "x".repeat(END_ERROR_BYTES);
    Outcome {
        finish_reason: Some(FinishReason::ContentFilter),
        usage: Some(Usage {
            prompt_tokens: u64::MAX,
            completion_tokens: u64::MAX,
            total_tokens: u64::MAX,
            prompt_tokens_details: Some(PromptTokensDetails {
                cached_tokens: u64::MAX,
                cache_creation_tokens: Some(u64::MAX),
            }),
        }),
        error: Some(ErrorProps { message: most.clone(), code: Some(most), details: None }),
        ..Outcome::completed()
    }
}

/// Shrinks an outcome until `fits` says it does: its error's details go, then its message and code are cut
/// (at a character boundary) to [`END_ERROR_BYTES`], then to half as much, and so on. An outcome whose
/// error is cut to nothing fits whatever [`widest_outcome`] fits.
pub(crate) fn shrink(outcome: &mut Outcome, fits: impl Fn(&Outcome) -> bool) {
    let mut keep = END_ERROR_BYTES;
    loop {
        if fits(outcome) {
            return;
        }
        let Some(error) = outcome.error.as_mut() else { return };
        if keep == 0 {
            outcome.error = None;
            return;
        }
        error.details = None;
        cut(&mut error.message, keep);
        if let Some(code) = error.code.as_mut() {
            cut(code, keep);
        }
        keep /= 2;
    }
}

/// Cuts an outcome's error code, a name, to [`NAME_BYTES`]: what an end that cannot be refused does with
/// a longer one (a producer's is refused instead).
pub(crate) fn bound_code(outcome: &mut Outcome) {
    if let Some(code) = outcome.error.as_mut().and_then(|e| e.code.as_mut()) {
        cut(code, NAME_BYTES);
    }
}

/// Cuts `text` to at most `bytes`, at a character boundary.
fn cut(text: &mut String, bytes: usize) {
    if text.len() > bytes {
        let mut end = bytes;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
    }
}
