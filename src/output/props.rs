//! The built-in message types and their typed props.
//!
//! Each struct is the props of one built-in type, with the JSON names the peer framework uses (`docs/design.md`, "Typed output")
//! plus `file`, the document modality of its "Transcript". They are for building and reading messages; the
//! message itself keeps props as a JSON object (see `message.rs`), and `validate.rs` checks a producer's
//! props against the same fields. A test keeps the two in step.

use serde::{Deserialize, Serialize, de::DeserializeOwned};
use serde_json::{Map, Value};

/// Props of a built-in type.
pub trait BuiltinProps: Serialize + DeserializeOwned {
    /// The `type` these props belong to.
    const TYPE: &'static str;
}

/// The built-in type names, in the order the docs list them.
pub fn builtin_types() -> &'static [&'static str] {
    &[
        "text",
        "thinking",
        "loading",
        "tool_call",
        "tool_result",
        "error",
        "image",
        "audio",
        "video",
        "file",
        "action",
        "event",
    ]
}

/// True for the built-in types; any other type is a custom type.
///
/// ```
/// assert!(agentmux::output::is_builtin_type("tool_call"));
/// assert!(!agentmux::output::is_builtin_type("chart"));
/// ```
pub fn is_builtin_type(kind: &str) -> bool {
    builtin_types().contains(&kind)
}

/// The prop a delta without `delta_path` applies to: `content` for text and thinking, `message` for loading,
/// `arguments` for tool_call. Other types have none, and such a delta applies to the props as a whole.
pub fn main_field(kind: &str) -> Option<&'static str> {
    match kind {
        "text" | "thinking" => Some("content"),
        "loading" => Some("message"),
        "tool_call" => Some("arguments"),
        _ => None,
    }
}

/// `text`: plain text or Markdown.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default, schemars::JsonSchema)]
pub struct TextProps {
    /// The text.
    pub content: String,
}

/// `thinking`: the model's reasoning.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default, schemars::JsonSchema)]
pub struct ThinkingProps {
    /// The reasoning text.
    pub content: String,
}

/// `loading`: a progress indicator (searching, fetching ...).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default, schemars::JsonSchema)]
pub struct LoadingProps {
    /// What is happening.
    pub message: String,
    /// True once the work it announced has finished.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub done: Option<bool>,
}

/// `tool_call`: a call of a tool the model chose.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default, schemars::JsonSchema)]
pub struct ToolCallProps {
    /// The call's id, which its result will name.
    pub id: String,
    /// The tool's name.
    pub name: String,
    /// The arguments as JSON text; streamed in fragments.
    #[serde(default)]
    pub arguments: String,
    /// True when the agent runs the tool itself (a `tool_result` answers it in the same stream); false (the
    /// default) when the call is handed to the client, as OpenAI hands tool calls over.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub server_side: bool,
}

/// `tool_result`: what a tool the agent ran returned, answering the `tool_call` whose `id` is `call_id`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default, schemars::JsonSchema)]
pub struct ToolResultProps {
    /// The `id` of the call it answers.
    pub call_id: String,
    /// The tool's name.
    #[serde(default)]
    pub name: String,
    /// What the tool returned, when it succeeded: any JSON.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<Value>,
    /// Why it failed, when it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<ToolError>,
}

/// Why a tool failed: `{"message", "code"?}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default, schemars::JsonSchema)]
pub struct ToolError {
    /// For a person (and the model).
    pub message: String,
    /// For programs: `tool_not_found`, `invalid_args`, `timeout`, or the tool's own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<String>,
}

/// `error`: something went wrong.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default, schemars::JsonSchema)]
pub struct ErrorProps {
    /// What went wrong, for a person.
    pub message: String,
    /// A stable code for programs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<String>,
    /// More detail: text or any JSON.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub details: Option<Value>,
}

/// `image`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default, schemars::JsonSchema)]
pub struct ImageProps {
    /// http(s) or `data:` URL.
    pub url: String,
    /// Alternative text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alt: Option<String>,
    /// Width in pixels.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub width: Option<u64>,
    /// Height in pixels.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub height: Option<u64>,
    /// OpenAI's detail level: `auto`, `low` or `high`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

/// `audio`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default, schemars::JsonSchema)]
pub struct AudioProps {
    /// http(s) or `data:` URL.
    pub url: String,
    /// `mp3`, `wav`, `ogg` ...
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub format: Option<String>,
    /// Seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration: Option<f64>,
    /// What is said.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transcript: Option<String>,
    /// Start playing at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub autoplay: Option<bool>,
    /// Show player controls.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub controls: Option<bool>,
}

/// `video`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default, schemars::JsonSchema)]
pub struct VideoProps {
    /// http(s) or `data:` URL.
    pub url: String,
    /// `mp4`, `webm` ...
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub format: Option<String>,
    /// Seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration: Option<f64>,
    /// Poster image URL.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thumbnail: Option<String>,
    /// Width in pixels.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub width: Option<u64>,
    /// Height in pixels.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub height: Option<u64>,
    /// Start playing at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub autoplay: Option<bool>,
    /// Show player controls.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub controls: Option<bool>,
    /// Play in a loop.
    #[serde(default, rename = "loop", skip_serializing_if = "Option::is_none")]
    pub looped: Option<bool>,
}

/// `file`: a document (PDF, spreadsheet ...).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default, schemars::JsonSchema)]
pub struct FileProps {
    /// http(s) or `data:` URL.
    pub url: String,
    /// File name to show.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// MIME type, best effort.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mime: Option<String>,
    /// Size in bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<u64>,
}

/// `action`: a command for the client's UI (open a panel, navigate); silent in OpenAI clients.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default, schemars::JsonSchema)]
pub struct ActionProps {
    /// The action's name.
    pub name: String,
    /// Its parameters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub payload: Option<Map<String, Value>>,
}

/// `event`: a lifecycle event; silent in OpenAI clients.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default, schemars::JsonSchema)]
pub struct EventProps {
    /// The event's name (`stream_start`, `message_end` ...).
    pub event: String,
    /// For a person.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Event data.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<Map<String, Value>>,
}

macro_rules! builtin {
    ($($props:ty => $name:literal),* $(,)?) => {
        $(impl BuiltinProps for $props { const TYPE: &'static str = $name; })*
    };
}

builtin! {
    TextProps => "text",
    ThinkingProps => "thinking",
    LoadingProps => "loading",
    ToolCallProps => "tool_call",
    ToolResultProps => "tool_result",
    ErrorProps => "error",
    ImageProps => "image",
    AudioProps => "audio",
    VideoProps => "video",
    FileProps => "file",
    ActionProps => "action",
    EventProps => "event",
}
