//! [`ChatRequest`]: an OpenAI chat completion request, as agents receive it.
//!
//! Parsing is lenient where clients differ: unknown top-level fields are kept in `extra` (clients send
//! extras such as `reasoning` through `extra_body`), `content` may be a string, an array of parts, or null
//! beside tool calls, and part types agentmux does not know are kept as they are.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// An OpenAI chat completion request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
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
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct StreamOptions {
    /// Send a usage chunk at the end.
    #[serde(default)]
    pub include_usage: bool,
}

/// Who said a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
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
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatMessage {
    /// Who said it.
    pub role: Role,
    /// What was said; null on an assistant message that only calls tools.
    #[serde(default)]
    pub content: Option<Content>,
    /// Tool calls of an assistant message, as sent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<Value>>,
    /// The call a tool message answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// A participant or tool name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

/// Message content: a string, or parts (`text`, `image_url`, `input_audio`, `file`, and any other).
#[derive(Debug, Clone, PartialEq, Serialize)]
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

impl ChatRequest {
    /// A request for `model` with one user message.
    ///
    /// ```
    /// let request = agentmux::conversation::ChatRequest::user("echo", "hello there");
    /// assert_eq!(request.last_user_text().as_deref(), Some("hello there"));
    /// ```
    pub fn user(model: impl Into<String>, text: impl Into<String>) -> Self {
        ChatRequest { model: model.into(), messages: vec![ChatMessage::new(Role::User, text)], ..Default::default() }
    }

    /// The text of the last user message, if any.
    pub fn last_user_text(&self) -> Option<String> {
        self.messages.iter().rev().find(|m| m.role == Role::User).and_then(|m| m.content.as_ref()).map(Content::text)
    }
}
