//! [`ChatRequest`]: an OpenAI chat completion request, as agents receive it.
//!
//! Parsing is lenient where clients differ: unknown top-level fields are kept in `extra` (clients send
//! extras such as `reasoning` through `extra_body`), `content` may be a string, an array of parts, or null
//! beside tool calls, and part types agentmux does not know are kept as they are.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// An OpenAI chat completion request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default, schemars::JsonSchema)]
pub struct ChatRequest {
    /// The agent to run; empty means the service's default model.
    #[serde(default)]
    pub model: String,
    /// The conversation so far.
    pub messages: Vec<ChatMessage>,
    /// Stream the response as chunks.
    #[serde(default)]
    pub stream: bool,
    /// Streaming options.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream_options: Option<StreamOptions>,
    /// Every other field, as sent.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// `stream_options`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default, schemars::JsonSchema)]
pub struct StreamOptions {
    /// Send a usage chunk at the end.
    #[serde(default)]
    pub include_usage: bool,
}

/// Who said a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Instructions from the application developer (OpenAI's newer name for system).
    Developer,
    /// Instructions.
    System,
    /// The end user.
    User,
    /// The model or agent.
    Assistant,
    /// A tool's result.
    Tool,
}

/// One message of the conversation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct ChatMessage {
    /// Who said it.
    pub role: Role,
    /// What was said; null on an assistant message that only calls tools.
    #[serde(default)]
    pub content: Option<Content>,
    /// Tool calls of an assistant message.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCall>>,
    /// The call a tool message answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// A participant or tool name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

/// A tool call of an assistant message: `{"id", "type": "function", "function": {"name", "arguments"}}`.
///
/// Missing fields parse as empty, so that validation can name them (`messages[2].tool_calls[0].id`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct ToolCall {
    /// The call's id, which the tool message answering it repeats.
    #[serde(default)]
    pub id: String,
    /// `function`.
    #[serde(rename = "type", default = "function_kind")]
    pub kind: String,
    /// What is called.
    #[serde(default)]
    pub function: FunctionCall,
}

/// The function a tool call names, and its arguments as the JSON text the model wrote.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default, schemars::JsonSchema)]
pub struct FunctionCall {
    /// The tool's name.
    #[serde(default)]
    pub name: String,
    /// The arguments as JSON text (a client that sends an object gets it written as text).
    #[serde(default, deserialize_with = "json_text")]
    pub arguments: String,
}

fn function_kind() -> String {
    "function".into()
}

/// A string as it is; any other JSON as its text.
fn json_text<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<String, D::Error> {
    Ok(match Value::deserialize(deserializer)? {
        Value::String(text) => text,
        Value::Null => String::new(),
        other => other.to_string(),
    })
}

impl ToolCall {
    /// A call of `name` with `arguments`.
    ///
    /// ```
    /// use agentmux::conversation::ToolCall;
    /// let call = ToolCall::new("call_1", "ls", &serde_json::json!({"path": "/workspace"}));
    /// assert_eq!(call.function.arguments, r#"{"path":"/workspace"}"#);
    /// assert_eq!(call.arguments().unwrap()["path"], "/workspace");
    /// ```
    pub fn new(id: impl Into<String>, name: impl Into<String>, arguments: &Value) -> Self {
        ToolCall {
            id: id.into(),
            kind: function_kind(),
            function: FunctionCall { name: name.into(), arguments: arguments.to_string() },
        }
    }

    /// The tool's name.
    pub fn name(&self) -> &str {
        &self.function.name
    }

    /// The arguments, parsed.
    pub fn arguments(&self) -> Result<Value, serde_json::Error> {
        if self.function.arguments.trim().is_empty() {
            return Ok(Value::Object(Map::new()));
        }
        serde_json::from_str(&self.function.arguments)
    }
}

/// Message content: a string, or parts (`text`, `image_url`, `input_audio`, `file`, and any other).
#[derive(Debug, Clone, PartialEq, Serialize, schemars::JsonSchema)]
#[serde(untagged)]
pub enum Content {
    /// Plain text.
    Text(String),
    /// Parts, kept as sent.
    Parts(Vec<Value>),
}

impl<'de> Deserialize<'de> for Content {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        match Value::deserialize(deserializer)? {
            Value::String(text) => Ok(Content::Text(text)),
            Value::Array(parts) => Ok(Content::Parts(parts)),
            other => Err(serde::de::Error::custom(format!(
                "content must be a string, an array of content parts, or null, not {}",
                match other {
                    Value::Object(_) => "an object",
                    Value::Number(_) => "a number",
                    Value::Bool(_) => "a boolean",
                    _ => "this",
                }
            ))),
        }
    }
}

impl Content {
    /// The text of the content: the string, or the `text` parts joined.
    pub fn text(&self) -> String {
        match self {
            Content::Text(text) => text.clone(),
            Content::Parts(parts) => parts
                .iter()
                .filter(|p| p.get("type").and_then(Value::as_str) == Some("text"))
                .filter_map(|p| p.get("text").and_then(Value::as_str))
                .collect::<Vec<_>>()
                .join("\n"),
        }
    }
}

impl ChatMessage {
    /// A message with text content.
    pub fn new(role: Role, text: impl Into<String>) -> Self {
        ChatMessage {
            role,
            content: Some(Content::Text(text.into())),
            tool_calls: None,
            tool_call_id: None,
            name: None,
        }
    }
}
