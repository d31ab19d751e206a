//! [`AnthropicMessage`]: a message of an Anthropic Messages request, as the chat messages agents receive.
//!
//! [`anthropic_to_chat`] maps the request's `system` and `messages` onto chat messages: `system` (a string
//! or text blocks) as a system message; a user message's `tool_result` blocks as `tool` messages (first, as
//! Anthropic puts them first), then its text, with `image` blocks (base64 or URL sources) as `image_url`
//! parts and other documents named in the text; an assistant message's text and its `tool_use` blocks as
//! tool calls. Thinking blocks are the model's own and are left out. Errors name the request's message.

use serde::Deserialize;
use serde_json::{Value, json};

use super::request::{ChatMessage, Content, Role, ToolCall};
use super::validate::ConversationError;

/// One message of a Messages request.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct AnthropicMessage {
    /// `user` or `assistant`.
    pub role: String,
    /// A string or content blocks.
    pub content: Value,
}

/// The chat messages the request's `system` and `messages` amount to, and for each the index of the request
/// message it came from (the system message counts as the first's).
///
/// ```
/// use agentmux::conversation::{AnthropicMessage, anthropic_to_chat};
///
/// let messages: Vec<AnthropicMessage> = serde_json::from_value(serde_json::json!([
///     {"role": "user", "content": "Weather in Paris?"},
///     {"role": "assistant", "content": [
///         {"type": "tool_use", "id": "t1", "name": "weather", "input": {"city": "Paris"}}]},
///     {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "18 °C"}]}
/// ])).unwrap();
/// let system = serde_json::json!("Be brief.");
/// let (chat, from) = anthropic_to_chat(Some(&system), &messages).unwrap();
/// assert_eq!(chat.len(), 4); // system, user, assistant with the call, its result
/// assert_eq!(from, [0, 0, 1, 2]);
/// ```
pub fn anthropic_to_chat(
    system: Option<&Value>,
    messages: &[AnthropicMessage],
) -> Result<(Vec<ChatMessage>, Vec<usize>), ConversationError> {
    let mut chat = Vec::new();
    let mut from = Vec::new();
    if let Some(system) = system.filter(|s| !s.is_null()) {
        chat.push(ChatMessage::new(Role::System, text_of(system)));
        from.push(0);
    }
    for (index, message) in messages.iter().enumerate() {
        let before = chat.len();
        let blocks: Vec<Value> = match &message.content {
            Value::String(text) => vec![json!({"type": "text", "text": text})],
            Value::Array(blocks) => blocks.clone(),
            _ => {
                return Err(ConversationError {
                    param: format!("messages[{index}].content"),
                    message: "content must be a string or an array of content blocks".into(),
                    index: Some(index),
                });
            }
        };
        match message.role.as_str() {
            "user" => user(&blocks, &mut chat),
            "assistant" => assistant(&blocks, &mut chat),
            other => {
                return Err(ConversationError {
                    param: format!("messages[{index}].role"),
                    message: format!("role must be user or assistant, not {other:?}"),
                    index: Some(index),
                });
            }
        }
        from.resize(from.len() + chat.len() - before, index);
    }
    Ok((chat, from))
}

fn kind(block: &Value) -> &str {
    block.get("type").and_then(Value::as_str).unwrap_or("")
}

/// A string, or the text of text blocks.
fn text_of(content: &Value) -> String {
    match content {
        Value::String(text) => text.clone(),
        Value::Array(blocks) => blocks
            .iter()
            .filter(|b| kind(b) == "text")
            .filter_map(|b| b.get("text").and_then(Value::as_str))
            .collect::<Vec<_>>()
            .join("\n"),
        _ => String::new(),
    }
}

fn user(blocks: &[Value], chat: &mut Vec<ChatMessage>) {
    let mut parts = Vec::new();
    for block in blocks {
        match kind(block) {
            "tool_result" => {
                let id = block.get("tool_use_id").and_then(Value::as_str).unwrap_or("");
                let content = block.get("content").map(text_of).unwrap_or_default();
                let message =
                    ChatMessage { tool_call_id: Some(id.to_owned()), ..ChatMessage::new(Role::Tool, content) };
                chat.push(message);
            }
            "text" => {
                parts.push(json!({"type": "text", "text": block.get("text").and_then(Value::as_str).unwrap_or("")}))
            }
            "image" => {
                let source = block.get("source").cloned().unwrap_or_default();
                let field = |key: &str| source.get(key).and_then(Value::as_str).unwrap_or("").to_owned();
                let url = match field("type").as_str() {
                    "base64" => format!("data:{};base64,{}", field("media_type"), field("data")),
                    _ => field("url"),
                };
                parts.push(json!({"type": "image_url", "image_url": {"url": url}}));
            }
            "document" => {
                let title = block.get("title").and_then(Value::as_str).unwrap_or("a document");
                parts.push(json!({"type": "text", "text": format!("[{title}]")}));
            }
            _ => {}
        }
    }
    if parts.is_empty() {
        return;
    }
    let only_text = parts.iter().all(|p| kind(p) == "text");
    let content = if only_text {
        Content::Text(parts.iter().filter_map(|p| p.get("text").and_then(Value::as_str)).collect::<Vec<_>>().join("\n"))
    } else {
        Content::Parts(parts)
    };
    chat.push(ChatMessage { content: Some(content), ..ChatMessage::new(Role::User, "") });
}

fn assistant(blocks: &[Value], chat: &mut Vec<ChatMessage>) {
    let text = text_of(&Value::Array(blocks.to_vec()));
    let calls: Vec<ToolCall> = blocks
        .iter()
        .filter(|b| kind(b) == "tool_use")
        .map(|b| {
            let field = |key: &str| b.get(key).and_then(Value::as_str).unwrap_or("");
            ToolCall::new(field("id"), field("name"), b.get("input").unwrap_or(&json!({})))
        })
        .collect();
    if text.is_empty() && calls.is_empty() {
        return;
    }
    chat.push(ChatMessage {
        content: (!text.is_empty()).then_some(Content::Text(text)),
        tool_calls: (!calls.is_empty()).then_some(calls),
        ..ChatMessage::new(Role::Assistant, "")
    });
}
