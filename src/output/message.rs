//! [`OutputMessage`]: one typed message, as a producer sends it and as a CUI client receives it.
//!
//! The JSON shape follows the peer framework's message (see `docs/clients.md`, "CUI"), so a CUI frontend written
//! for it reads ours unchanged. `props` is kept as a JSON object rather than a typed enum: custom types must
//! round-trip untouched, a delta carries only the part of the props it changes, and the CUI adapter passes the
//! message through as it is. Typed access goes through [`OutputMessage::props_as`] and the constructors.
//! Optional fields are omitted from JSON when absent, and `delta` / `type_change` when false.
//!
//! Parsing a producer's message ([`OutputMessage::from_json`], [`OutputMessage::from_value`]) and
//! [`OutputMessage::validate`] are defined in `validate.rs`, which reads this type: this file needs nothing
//! of validation, so the two do not import each other.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::props::{
    ActionProps, AudioProps, BuiltinProps, ErrorProps, EventProps, FileProps, ImageProps, LoadingProps, TextProps,
    ThinkingProps, ToolCallProps, ToolError, ToolResultProps, VideoProps,
};

/// One typed output message.
///
/// ```
/// use agentmux::output::{DeltaAction, OutputMessage};
///
/// let first = OutputMessage::text("Hel").with_message_id("m1").as_delta(DeltaAction::Append, None);
/// assert_eq!(
///     serde_json::to_string(&first).unwrap(),
///     r#"{"type":"text","props":{"content":"Hel"},"message_id":"m1","delta":true,"delta_action":"append"}"#
/// );
/// let parsed = OutputMessage::from_json(r#"{"type":"image","props":{"url":"ftp://x"}}"#);
/// assert_eq!(parsed.unwrap_err().field(), Some("props.url"));
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default, schemars::JsonSchema)]
pub struct OutputMessage {
    /// The message type: a built-in one (`text`, `tool_call`, ...) or any custom name.
    #[serde(rename = "type", default)]
    pub kind: String,
    /// The type's props. For a delta, only what the delta carries.
    #[serde(default, deserialize_with = "exact_props")]
    pub props: Map<String, Value>,
    /// Groups the chunks of one message; deltas with the same id update the same message.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message_id: Option<String>,
    /// Identifies this one chunk.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chunk_id: Option<String>,
    /// Groups messages into a block (one step of the agent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub block_id: Option<String>,
    /// Groups messages of one sub-agent thread.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thread_id: Option<String>,
    /// True when this message updates an earlier one with the same `message_id`.
    #[serde(default, skip_serializing_if = "is_false")]
    pub delta: bool,
    /// Where in `props` the delta applies (`content`, `payload.progress`); defaults to the type's main field.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delta_path: Option<String>,
    /// How the delta applies; `append` when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delta_action: Option<DeltaAction>,
    /// True when this delta changes the message's type to its own `type`.
    #[serde(default, skip_serializing_if = "is_false")]
    pub type_change: bool,
    /// Stamped by the stream: sequence number and time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Metadata>,
}

/// How a delta changes the value at its `delta_path`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum DeltaAction {
    /// Concatenate a string, or extend an array.
    #[default]
    Append,
    /// Replace the value at the path.
    Replace,
    /// Merge an object into the object at the path (top-level keys of the delta win).
    Merge,
    /// Set the value at the path, creating the objects on the way.
    Set,
}

impl DeltaAction {
    /// The action's JSON name.
    pub fn as_str(self) -> &'static str {
        match self {
            DeltaAction::Append => "append",
            DeltaAction::Replace => "replace",
            DeltaAction::Merge => "merge",
            DeltaAction::Set => "set",
        }
    }
}

/// What the stream stamps on a message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default, schemars::JsonSchema)]
pub struct Metadata {
    /// Position in the stream, from 1, without gaps.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sequence: Option<u64>,
    /// Milliseconds since the Unix epoch when the stream accepted the message.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timestamp: Option<u64>,
    /// A producer's trace id, passed through.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace_id: Option<String>,
}

fn is_false(b: &bool) -> bool {
    !*b
}

/// Props read into a map of exactly their size. serde_json's own reading grows a map from empty, and its
/// first insert reserves room for three entries (about 200 bytes more than one needs), which a stream's log
/// then keeps for every message it holds. The same map otherwise: a key seen twice keeps its first place
/// and its last value.
fn exact_props<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<Map<String, Value>, D::Error> {
    struct Exact;
    impl<'de> serde::de::Visitor<'de> for Exact {
        type Value = Map<String, Value>;

        fn expecting(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            formatter.write_str("a map")
        }

        fn visit_map<A: serde::de::MapAccess<'de>>(self, mut access: A) -> Result<Self::Value, A::Error> {
            let mut entries: smallvec::SmallVec<[(String, Value); 4]> = smallvec::SmallVec::new();
            while let Some(entry) = access.next_entry()? {
                entries.push(entry);
            }
            let mut props = Map::with_capacity(entries.len());
            props.extend(entries);
            Ok(props)
        }
    }
    deserializer.deserialize_map(Exact)
}

impl OutputMessage {
    /// A message of any type, built-in or custom, with the given props.
    pub fn new(kind: impl Into<String>, props: Map<String, Value>) -> Self {
        OutputMessage { kind: kind.into(), props, ..Default::default() }
    }

    /// A built-in message from its typed props.
    pub fn builtin<P: BuiltinProps>(props: P) -> Self {
        let props = match serde_json::to_value(props) {
            Ok(Value::Object(map)) => map,
            // Props structs serialise to objects by construction; anything else is impossible.
            _ => Map::new(),
        };
        OutputMessage::new(P::TYPE, props)
    }

    /// `text` with its content (Markdown).
    pub fn text(content: impl Into<String>) -> Self {
        Self::builtin(TextProps { content: content.into() })
    }

    /// `thinking` with its content.
    pub fn thinking(content: impl Into<String>) -> Self {
        Self::builtin(ThinkingProps { content: content.into() })
    }

    /// `loading` with its message.
    pub fn loading(message: impl Into<String>) -> Self {
        Self::builtin(LoadingProps { message: message.into(), done: None })
    }

    /// `tool_call`; `arguments` is JSON text.
    pub fn tool_call(id: impl Into<String>, name: impl Into<String>, arguments: impl Into<String>) -> Self {
        Self::builtin(ToolCallProps {
            id: id.into(),
            name: name.into(),
            arguments: arguments.into(),
            server_side: false,
        })
    }

    /// `tool_result`: what the tool `name` returned for the call `call_id`.
    pub fn tool_result(call_id: impl Into<String>, name: impl Into<String>, result: Value) -> Self {
        Self::builtin(ToolResultProps { call_id: call_id.into(), name: name.into(), result: Some(result), error: None })
    }

    /// `tool_result` for a call that failed.
    pub fn tool_failure(call_id: impl Into<String>, name: impl Into<String>, error: ToolError) -> Self {
        Self::builtin(ToolResultProps { call_id: call_id.into(), name: name.into(), result: None, error: Some(error) })
    }

    /// `error` with its message.
    pub fn error(message: impl Into<String>) -> Self {
        Self::builtin(ErrorProps { message: message.into(), ..Default::default() })
    }

    /// `image` at a URL (http(s) or `data:`).
    pub fn image(url: impl Into<String>) -> Self {
        Self::builtin(ImageProps { url: url.into(), ..Default::default() })
    }

    /// `audio` at a URL.
    pub fn audio(url: impl Into<String>) -> Self {
        Self::builtin(AudioProps { url: url.into(), ..Default::default() })
    }

    /// `video` at a URL.
    pub fn video(url: impl Into<String>) -> Self {
        Self::builtin(VideoProps { url: url.into(), ..Default::default() })
    }

    /// `file` (a document) at a URL.
    pub fn file(url: impl Into<String>) -> Self {
        Self::builtin(FileProps { url: url.into(), ..Default::default() })
    }

    /// `action` with its name (silent in OpenAI clients).
    pub fn action(name: impl Into<String>) -> Self {
        Self::builtin(ActionProps { name: name.into(), payload: None })
    }

    /// `event` with its name (silent in OpenAI clients).
    pub fn event(event: impl Into<String>) -> Self {
        Self::builtin(EventProps { event: event.into(), message: None, data: None })
    }

    /// Sets `message_id`.
    pub fn with_message_id(mut self, id: impl Into<String>) -> Self {
        self.message_id = Some(id.into());
        self
    }

    /// Sets `block_id`.
    pub fn with_block_id(mut self, id: impl Into<String>) -> Self {
        self.block_id = Some(id.into());
        self
    }

    /// Sets `thread_id`.
    pub fn with_thread_id(mut self, id: impl Into<String>) -> Self {
        self.thread_id = Some(id.into());
        self
    }

    /// Sets one prop.
    pub fn with_prop(mut self, key: impl Into<String>, value: impl Into<Value>) -> Self {
        self.props.insert(key.into(), value.into());
        self
    }

    /// Marks the message as a delta with the given action and path (`None`: the type's main field).
    pub fn as_delta(mut self, action: DeltaAction, path: Option<&str>) -> Self {
        self.delta = true;
        self.delta_action = Some(action);
        self.delta_path = path.map(str::to_owned);
        self
    }

    /// The delta action, `append` when absent.
    pub fn action_or_default(&self) -> DeltaAction {
        self.delta_action.unwrap_or_default()
    }

    /// The props as a built-in type's typed props, when they fit it.
    pub fn props_as<P: BuiltinProps>(&self) -> Option<P> {
        if self.kind != P::TYPE {
            return None;
        }
        serde_json::from_value(Value::Object(self.props.clone())).ok()
    }

    /// A string prop, if present and a string.
    pub fn prop_str(&self, key: &str) -> Option<&str> {
        self.props.get(key).and_then(Value::as_str)
    }

    /// The stamped sequence number, if any.
    pub fn sequence(&self) -> Option<u64> {
        self.metadata.as_ref().and_then(|m| m.sequence)
    }

    /// This message as the start of a message's state: the delta fields cleared.
    pub(crate) fn to_state(&self) -> OutputMessage {
        OutputMessage {
            kind: self.kind.clone(),
            props: self.props.clone(),
            message_id: self.message_id.clone(),
            chunk_id: None,
            block_id: self.block_id.clone(),
            thread_id: self.thread_id.clone(),
            delta: false,
            delta_path: None,
            delta_action: None,
            type_change: false,
            metadata: self.metadata.clone(),
        }
    }
}

impl<P: BuiltinProps> From<P> for OutputMessage {
    fn from(props: P) -> Self {
        OutputMessage::builtin(props)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Props read to their exact size are the map serde_json reads: a key seen twice keeps its first
    /// place and its last value, nested values untouched; props that are not an object name `props`.
    #[test]
    fn props_read_to_their_size_are_the_map_serde_json_reads() {
        for props in [r#"{}"#, r#"{"b":1,"a":{"y":[1,2],"x":null},"b":"last"}"#, r#"{"content":"tok "}"#] {
            let text = format!(r#"{{"type":"custom","props":{props}}}"#);
            let message = OutputMessage::from_json(&text).expect("parses");
            let expected: Map<String, Value> = serde_json::from_str(props).expect("a map");
            assert_eq!(message.props, expected, "{props}");
            assert_eq!(message.props.keys().collect::<Vec<_>>(), expected.keys().collect::<Vec<_>>(), "{props}");
            assert_eq!(OutputMessage::from_value(serde_json::from_str(&text).expect("json")).expect("parses"), message);
        }
        for bad in [r#""text""#, "[]", "3"] {
            let error = OutputMessage::from_json(&format!(r#"{{"type":"text","props":{bad}}}"#)).expect_err(bad);
            assert_eq!(error.field(), Some("props"), "{bad}: {error}");
        }
    }
}
