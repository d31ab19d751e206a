//! [`UiMessage`]: the AI SDK's `UIMessage`, what a `useChat` page sends, as the chat messages agents receive.
//!
//! A page owns its history and sends all of it with every turn. Each `UIMessage` is a role and a list of
//! parts; [`to_chat`] turns them into the chat messages the one validation and every agent already take:
//!
//! - `system` and `user`: their `text` parts joined; a user's image `file` parts become `image_url` parts
//!   beside the text, and its other files a line naming them (chat messages have no other file form).
//! - `assistant`: one assistant message per step (`step-start` parts split them), its text, and a tool call
//!   for each tool part (`tool-<name>` or `dynamic-tool`) whose input is known, followed by a `tool` message
//!   for each whose output is known (`output-available`, or `output-error` with its error text). A call the
//!   page is still to answer stays a call without a result, as in any chat history.
//! - `reasoning`, `data-*`, `source-*` and an assistant's files are what the page shows, not what the model
//!   is told: they are left out.
//!
//! Errors name the `UIMessage` at fault (`messages[2].role`) rather than the chat message it became.

use serde::Deserialize;
use serde_json::{Value, json};

use super::request::{ChatMessage, Content, Role, ToolCall};
use super::validate::ConversationError;

/// One `UIMessage`: its parts are kept as JSON, since a page may send part types this version does not know
/// (they are left out).
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct UiMessage {
    /// The page's id for it.
    #[serde(default)]
    pub id: String,
    /// `system`, `user` or `assistant`.
    pub role: String,
    /// Its parts, in order.
    #[serde(default)]
    pub parts: Vec<Value>,
}

/// The chat messages `messages` amount to, and for each the index of the `UIMessage` it came from.
///
/// ```
/// use agentmux::conversation::{UiMessage, to_chat};
///
/// let messages: Vec<UiMessage> = serde_json::from_value(serde_json::json!([
///     {"id": "u1", "role": "user", "parts": [{"type": "text", "text": "Weather in Paris?"}]},
///     {"id": "a1", "role": "assistant", "parts": [
///         {"type": "step-start"},
///         {"type": "dynamic-tool", "toolName": "weather", "toolCallId": "c1", "state": "output-available",
///          "input": {"city": "Paris"}, "output": {"temp_c": 18}},
///         {"type": "step-start"},
///         {"type": "text", "text": "18 °C."}
///     ]}
/// ])).unwrap();
/// let (chat, from) = to_chat(&messages).unwrap();
/// assert_eq!(chat.len(), 4); // user, assistant with the call, its result, assistant with the text
/// assert_eq!(from, [0, 1, 1, 1]);
/// ```
pub fn to_chat(messages: &[UiMessage]) -> Result<(Vec<ChatMessage>, Vec<usize>), ConversationError> {
    let mut chat = Vec::new();
    let mut from = Vec::new();
    for (index, message) in messages.iter().enumerate() {
        let before = chat.len();
        match message.role.as_str() {
            "system" => chat.push(ChatMessage::new(Role::System, text_of(&message.parts))),
            "user" => chat.push(user(&message.parts)),
            "assistant" => assistant(&message.parts, &mut chat),
            other => {
                return Err(ConversationError {
                    param: format!("messages[{index}].role"),
                    message: format!("role must be system, user or assistant, not {other:?}"),
                    index: Some(index),
                });
            }
        }
        from.resize(from.len() + chat.len() - before, index);
    }
    Ok((chat, from))
}

/// A part's type.
fn kind(part: &Value) -> &str {
    part.get("type").and_then(Value::as_str).unwrap_or("")
}

fn str_of<'p>(part: &'p Value, key: &str) -> &'p str {
    part.get(key).and_then(Value::as_str).unwrap_or("")
}

/// The text parts, joined as the page shows them.
fn text_of(parts: &[Value]) -> String {
    parts.iter().filter(|p| kind(p) == "text").map(|p| str_of(p, "text")).collect()
}

fn user(parts: &[Value]) -> ChatMessage {
    let files: Vec<&Value> = parts.iter().filter(|p| kind(p) == "file").collect();
    let mut text = text_of(parts);
    if files.is_empty() {
        return ChatMessage::new(Role::User, text);
    }
    let mut images = Vec::new();
    for file in files {
        let (url, media_type) = (str_of(file, "url"), str_of(file, "mediaType"));
        if media_type.starts_with("image/") {
            images.push(json!({"type": "image_url", "image_url": {"url": url}}));
        } else {
            let name = file.get("filename").and_then(Value::as_str).unwrap_or(url);
            text.push_str(&format!("\n[file {name} ({media_type})]"));
        }
    }
    let mut content = vec![json!({"type": "text", "text": text})];
    content.extend(images);
    ChatMessage { content: Some(Content::Parts(content)), ..ChatMessage::new(Role::User, "") }
}

/// An assistant `UIMessage`: a chat message per step, each followed by the results its calls have.
fn assistant(parts: &[Value], chat: &mut Vec<ChatMessage>) {
    let mut step = Step::default();
    for part in parts {
        match kind(part) {
            "step-start" => step.flush(chat),
            "text" => step.text.push_str(str_of(part, "text")),
            tool if tool == "dynamic-tool" || tool.starts_with("tool-") => step.tool(part),
            _ => {}
        }
    }
    step.flush(chat);
}

/// One step of an assistant message, being gathered.
#[derive(Default)]
struct Step {
    text: String,
    calls: Vec<ToolCall>,
    results: Vec<ChatMessage>,
}

impl Step {
    fn tool(&mut self, part: &Value) {
        let state = str_of(part, "state");
        if !matches!(state, "input-available" | "output-available" | "output-error") {
            return;
        }
        let name = match kind(part) {
            "dynamic-tool" => str_of(part, "toolName"),
            tool => tool.trim_start_matches("tool-"),
        };
        let id = str_of(part, "toolCallId");
        let no_input = Value::Object(Default::default());
        let input = part.get("input").filter(|input| !input.is_null()).unwrap_or(&no_input);
        self.calls.push(ToolCall::new(id, name, input));
        let result = match (state, part.get("output")) {
            ("output-available", Some(Value::String(text))) => text.clone(),
            ("output-available", Some(output)) => output.to_string(),
            ("output-available", None) => "null".to_owned(),
            ("output-error", _) => str_of(part, "errorText").to_owned(),
            _ => return,
        };
        self.results.push(ChatMessage { tool_call_id: Some(id.to_owned()), ..ChatMessage::new(Role::Tool, result) });
    }

    /// The step as chat messages, if it holds anything; then a fresh one.
    fn flush(&mut self, chat: &mut Vec<ChatMessage>) {
        let step = std::mem::take(self);
        if step.text.is_empty() && step.calls.is_empty() {
            return;
        }
        let content = (!step.text.is_empty()).then_some(Content::Text(step.text));
        let tool_calls = (!step.calls.is_empty()).then_some(step.calls);
        chat.push(ChatMessage { content, tool_calls, ..ChatMessage::new(Role::Assistant, "") });
        chat.extend(step.results);
    }
}
