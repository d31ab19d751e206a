//! [`AgUiMessage`]: a message of AG-UI's `RunAgentInput`, as the chat messages agents receive.
//!
//! AG-UI messages are close to OpenAI's: a role, `content`, an assistant's `toolCalls` (OpenAI's shape,
//! camelCased), a tool message's `toolCallId`. So [`ag_ui_to_chat`] maps them one to one: `developer`,
//! `system`, `user`, `assistant` and `tool` as they are (a user's `content` may be an array of input parts:
//! `text` parts are its text, and `binary` images with a `url` become `image_url` parts); `reasoning` and
//! `activity` messages are what the frontend showed, not what the model is told, and are left out. Errors
//! name the AG-UI message at fault.

use serde::Deserialize;
use serde_json::{Value, json};

use super::request::{ChatMessage, Content, Role, ToolCall};
use super::validate::ConversationError;

/// One AG-UI message.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AgUiMessage {
    /// The frontend's id for it.
    #[serde(default)]
    pub id: String,
    /// `developer`, `system`, `user`, `assistant`, `tool`, `reasoning` or `activity`.
    pub role: String,
    /// A string, or (for a user) an array of input parts.
    #[serde(default)]
    pub content: Option<Value>,
    /// An assistant's calls.
    #[serde(default)]
    pub tool_calls: Option<Vec<ToolCall>>,
    /// The call a tool message answers.
    #[serde(default)]
    pub tool_call_id: Option<String>,
}

/// The chat messages `messages` amount to, and for each the index of the AG-UI message it came from.
///
/// ```
/// use agentmux::conversation::{AgUiMessage, ag_ui_to_chat};
///
/// let messages: Vec<AgUiMessage> = serde_json::from_value(serde_json::json!([
///     {"id": "u1", "role": "user", "content": "Weather in Paris?"},
///     {"id": "a1", "role": "assistant", "toolCalls": [
///         {"id": "c1", "type": "function", "function": {"name": "weather", "arguments": "{\"city\":\"Paris\"}"}}]},
///     {"id": "t1", "role": "tool", "toolCallId": "c1", "content": "18 °C"},
///     {"id": "r1", "role": "reasoning", "content": "The user wants the weather."}
/// ])).unwrap();
/// let (chat, from) = ag_ui_to_chat(&messages).unwrap();
/// assert_eq!(chat.len(), 3);
/// assert_eq!(from, [0, 1, 2]);
/// ```
pub fn ag_ui_to_chat(messages: &[AgUiMessage]) -> Result<(Vec<ChatMessage>, Vec<usize>), ConversationError> {
    let mut chat = Vec::new();
    let mut from = Vec::new();
    for (index, message) in messages.iter().enumerate() {
        let role = match message.role.as_str() {
            "developer" => Role::Developer,
            "system" => Role::System,
            "user" => Role::User,
            "assistant" => Role::Assistant,
            "tool" => Role::Tool,
            "reasoning" | "activity" => continue,
            other => {
                return Err(ConversationError {
                    param: format!("messages[{index}].role"),
                    message: format!(
                        "role must be developer, system, user, assistant, tool, reasoning or activity, not {other:?}"
                    ),
                    index: Some(index),
                });
            }
        };
        let content = match &message.content {
            None | Some(Value::Null) => None,
            Some(Value::String(text)) => Some(Content::Text(text.clone())),
            Some(Value::Array(parts)) => Some(input_parts(parts)),
            Some(_) => {
                return Err(ConversationError {
                    param: format!("messages[{index}].content"),
                    message: "content must be a string or an array of input parts".into(),
                    index: Some(index),
                });
            }
        };
        chat.push(ChatMessage {
            role,
            content,
            tool_calls: message.tool_calls.clone().filter(|calls| !calls.is_empty()),
            tool_call_id: message.tool_call_id.clone(),
            name: None,
        });
        from.push(index);
    }
    Ok((chat, from))
}

/// AG-UI input parts as chat content parts: `text` as text, images given by URL as `image_url`, and other
/// binary parts named in a text part (chat messages have no other file form).
fn input_parts(parts: &[Value]) -> Content {
    let str_of = |part: &Value, key: &str| part.get(key).and_then(Value::as_str).unwrap_or("").to_owned();
    let content = parts
        .iter()
        .filter_map(|part| match part.get("type").and_then(Value::as_str) {
            Some("text") => Some(json!({"type": "text", "text": str_of(part, "text")})),
            Some("binary") if str_of(part, "mimeType").starts_with("image/") && !str_of(part, "url").is_empty() => {
                Some(json!({"type": "image_url", "image_url": {"url": str_of(part, "url")}}))
            }
            Some("binary") => {
                let name = part.get("filename").and_then(Value::as_str).unwrap_or("a file");
                Some(json!({"type": "text", "text": format!("[{name} ({})]", str_of(part, "mimeType"))}))
            }
            _ => None,
        })
        .collect();
    Content::Parts(content)
}
