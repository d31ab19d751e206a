//! The data of the lifecycle events a stream adds by itself: `event` messages named as in the peer
//! framework, whose `props.data` is one of these. The hub writes them from these types (`hub/lifecycle.rs`)
//! and the published schemas are generated from them (`crate::schema`), so the two cannot drift. Their names
//! are the stream's alone: validation refuses a producer's message that would be one (`validate.rs`).
//!
//! ```
//! use agentmux::output::{LifecycleEvent, StreamStart};
//!
//! let start = StreamStart { stream_id: "s".into(), epoch: "e".into(), model: "demo".into() };
//! let message = start.event();
//! assert_eq!(message.kind, "event");
//! assert_eq!(message.props["event"], "stream_start");
//! assert_eq!(message.props["data"]["model"], "demo");
//! ```

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::message::OutputMessage;
use super::outcome::{EndStatus, FinishReason, Usage};
use super::props::{BuiltinProps, ErrorProps, EventProps};

/// One lifecycle event's data: its name, and the `event` message that carries it.
pub trait LifecycleEvent: Serialize + JsonSchema {
    /// The event's name, `props.event`.
    const NAME: &'static str;

    /// The `event` message with this as its data.
    ///
    /// Its props are made here as [`EventProps`] would serialise (`event`, then `data`), not by serialising
    /// an `EventProps` holding the data again: every stream and every streamed message makes some, and the
    /// second pass copied the whole data once more.
    fn event(&self) -> OutputMessage {
        // A struct of strings and numbers serialises to an object.
        let data = match serde_json::to_value(self) {
            Ok(Value::Object(data)) => data,
            _ => Map::new(),
        };
        let mut props = Map::with_capacity(2);
        props.insert("event".to_owned(), Value::String(Self::NAME.to_owned()));
        props.insert("data".to_owned(), Value::Object(data));
        OutputMessage::new(<EventProps as BuiltinProps>::TYPE, props)
    }
}

/// `stream_start`: the first message of every stream.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct StreamStart {
    /// The stream.
    pub stream_id: String,
    /// Its epoch: a reader that resumes checks it is still the same history.
    pub epoch: String,
    /// The agent (model) that runs it, or what its producer named.
    pub model: String,
}

/// `stream_end`: the last message of every stream, with its outcome.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct StreamEnd {
    /// How it ended.
    pub status: EndStatus,
    /// From its start to its end.
    pub duration_ms: u64,
    /// Why a completed stream stopped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finish_reason: Option<FinishReason>,
    /// Token usage, when the agent knew it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    /// What went wrong, for status `error`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<ErrorProps>,
    /// Which upstream and model answered, when the catalogue chose ([`super::Outcome::served_by`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub served_by: Option<super::ServedBy>,
}

/// `message_start`: before the first chunk of a message that arrives in deltas.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct MessageStart {
    /// The message.
    pub message_id: String,
    /// Its type.
    #[serde(rename = "type")]
    pub kind: String,
}

/// `message_end`: after its last chunk (when its block or the stream ends, or the producer ends it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct MessageEnd {
    /// The message.
    pub message_id: String,
    /// Its type.
    #[serde(rename = "type")]
    pub kind: String,
    /// Its chunks.
    pub chunk_count: u64,
    /// From its first chunk to its end.
    pub duration_ms: u64,
}

/// `block_start`: before the first message of a block.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct BlockStart {
    /// The block.
    pub block_id: String,
}

/// `block_end`: after its last message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct BlockEnd {
    /// The block.
    pub block_id: String,
    /// Its messages.
    pub message_count: u64,
    /// From its first message to its end.
    pub duration_ms: u64,
}

macro_rules! named {
    ($($data:ty => $name:literal),* $(,)?) => {
        $(impl LifecycleEvent for $data { const NAME: &'static str = $name; })*
    };
}

named! {
    StreamStart => "stream_start",
    StreamEnd => "stream_end",
    MessageStart => "message_start",
    MessageEnd => "message_end",
    BlockStart => "block_start",
    BlockEnd => "block_end",
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Validation keeps these names for the stream (its list cannot name this file: `outcome.rs`, which this
    /// file reads, reads validation).
    #[test]
    fn validation_reserves_every_lifecycle_name() {
        let names = [
            StreamStart::NAME,
            StreamEnd::NAME,
            MessageStart::NAME,
            MessageEnd::NAME,
            BlockStart::NAME,
            BlockEnd::NAME,
        ];
        assert_eq!(names, crate::output::validate::LIFECYCLE_NAMES);
    }

    /// The message made by hand is the one `EventProps` makes, to the byte.
    #[test]
    fn an_event_is_what_its_event_props_make() {
        fn same<E: LifecycleEvent>(event: E) {
            let data = serde_json::to_value(&event).unwrap().as_object().cloned();
            let props = EventProps { event: E::NAME.to_owned(), message: None, data };
            let (made, through) = (event.event(), OutputMessage::builtin(props));
            assert_eq!(serde_json::to_string(&made).unwrap(), serde_json::to_string(&through).unwrap());
            assert_eq!(made, through);
        }
        same(StreamStart { stream_id: "s_1".into(), epoch: "e".into(), model: "demo".into() });
        same(MessageStart { message_id: "m_1".into(), kind: "text".into() });
        same(MessageEnd { message_id: "m_1".into(), kind: "text".into(), chunk_count: 3, duration_ms: 7 });
        same(BlockStart { block_id: "b".into() });
        same(BlockEnd { block_id: "b".into(), message_count: 2, duration_ms: 9 });
        same(StreamEnd {
            status: EndStatus::Error,
            duration_ms: 5,
            finish_reason: None,
            usage: None,
            error: Some(ErrorProps { message: "no".into(), code: Some("x".into()), details: None }),
            served_by: None,
        });
    }
}
