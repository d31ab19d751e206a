//! An OpenAI Responses request's `instructions` and `input`, as the chat messages agents receive.
//!
//! [`responses_to_chat`] maps them: `instructions` as a system message; a string `input` as one user
//! message; input items in order: messages (`user`, `system`, `developer`, `assistant`; content as a string or
//! parts: `input_text` and `output_text` are text, `input_image` an `image_url` part, files named in the
//! text), `function_call` items as tool calls of an assistant message (consecutive calls share one), and
//! `function_call_output` items as `tool` messages. Reasoning items are the model's own and are left out.
//! An `item_reference` stands for what the kept response that made the item said (agentmux's output item
//! ids, `msg_…`, `fc_…`, `rs_…`, say which response: [`response_of_item`]); the caller looks those up and
//! hands them in as [`KeptItems`], each with the part of the response it brings, and several references to
//! one part bring it once, where the first of them stands. Any other item type is refused, never skipped. Errors name
//! the input item at fault (`input[2].role`, `input[3].id`).

use std::collections::HashMap;

use serde_json::{Value, json};

use super::request::{ChatMessage, Content, Role, ToolCall};
use super::validate::ConversationError;

/// The chat messages `instructions` and `input` amount to, and for each the index of the input item it came
/// from (instructions count as the first item's).
///
/// ```
/// use agentmux::conversation::responses_to_chat;
///
/// let input = serde_json::json!([
///     {"role": "user", "content": "Weather in Paris?"},
///     {"type": "function_call", "call_id": "c1", "name": "weather", "arguments": "{\"city\":\"Paris\"}"},
///     {"type": "function_call_output", "call_id": "c1", "output": "18 °C"}
/// ]);
/// let (chat, from) = responses_to_chat(Some("Be brief."), &input).unwrap();
/// assert_eq!(chat.len(), 4); // system, user, assistant with the call, its output
/// assert_eq!(from, [0, 0, 1, 2]);
/// ```
pub fn responses_to_chat(
    instructions: Option<&str>,
    input: &Value,
) -> Result<(Vec<ChatMessage>, Vec<usize>), ConversationError> {
    responses_to_chat_with(instructions, input, &KeptItems::new())
}

/// What `item_reference` items stand for: by item id, the part of a kept response's output it brings (a
/// name for that part: several references to it bring it once) and that part as chat messages.
pub type KeptItems = HashMap<String, (String, Vec<ChatMessage>)>;

/// The response (`resp_…`) that made an output item of agentmux's (`msg_<r>_<n>`, `fc_<r>_<n>`,
/// `rs_<r>_<n>` are items of `resp_<r>`), or `None` for an id agentmux does not give.
///
/// ```
/// use agentmux::conversation::response_of_item;
///
/// assert_eq!(response_of_item("msg_0a1b_2").as_deref(), Some("resp_0a1b"));
/// assert_eq!(response_of_item("item_7"), None);
/// ```
pub fn response_of_item(id: &str) -> Option<String> {
    let (_, rest) = ["msg_", "fc_", "rs_"].iter().find_map(|p| id.strip_prefix(p).map(|rest| (p, rest)))?;
    let (response, index) = rest.rsplit_once('_')?;
    let valid = !response.is_empty() && !index.is_empty() && index.bytes().all(|b| b.is_ascii_digit());
    valid.then(|| format!("resp_{response}"))
}

/// The ids `input`'s `item_reference` items name, with each item's index.
pub fn item_references(input: &Value) -> Vec<(usize, String)> {
    let Value::Array(items) = input else { return Vec::new() };
    items
        .iter()
        .enumerate()
        .filter(|(_, item)| item.get("type").and_then(Value::as_str) == Some("item_reference"))
        .map(|(index, item)| (index, item.get("id").and_then(Value::as_str).unwrap_or("").to_owned()))
        .collect()
}

/// [`responses_to_chat`], with the output of the kept responses `input`'s `item_reference` items name.
pub fn responses_to_chat_with(
    instructions: Option<&str>,
    input: &Value,
    kept: &KeptItems,
) -> Result<(Vec<ChatMessage>, Vec<usize>), ConversationError> {
    let mut chat = Vec::new();
    let mut from = Vec::new();
    if let Some(instructions) = instructions.filter(|i| !i.is_empty()) {
        chat.push(ChatMessage::new(Role::System, instructions));
        from.push(0);
    }
    let items = match input {
        Value::String(text) => vec![json!({"role": "user", "content": text})],
        Value::Array(items) => items.clone(),
        _ => {
            return Err(ConversationError {
                param: "input".into(),
                message: "input must be a string or an array of input items".into(),
                index: None,
            });
        }
    };
    let mut referenced: Vec<&str> = Vec::new();
    for (index, item) in items.iter().enumerate() {
        let field = |key: &str| item.get(key).and_then(Value::as_str).unwrap_or("");
        match field("type") {
            "function_call" => {
                let arguments = serde_json::from_str::<Value>(field("arguments")).unwrap_or_else(|_| json!({}));
                let call = ToolCall::new(field("call_id"), field("name"), &arguments);
                match chat.last_mut() {
                    Some(ChatMessage { role: Role::Assistant, tool_calls, .. }) => {
                        tool_calls.get_or_insert_with(Vec::new).push(call)
                    }
                    _ => {
                        chat.push(ChatMessage {
                            tool_calls: Some(vec![call]),
                            content: None,
                            ..ChatMessage::new(Role::Assistant, "")
                        });
                        from.push(index);
                    }
                }
            }
            "function_call_output" => {
                let output = match item.get("output") {
                    Some(Value::String(text)) => text.clone(),
                    Some(other) => other.to_string(),
                    None => String::new(),
                };
                chat.push(ChatMessage {
                    tool_call_id: Some(field("call_id").to_owned()),
                    ..ChatMessage::new(Role::Tool, output)
                });
                from.push(index);
            }
            "" | "message" => {
                chat.push(message(item, index)?);
                from.push(index);
            }
            "item_reference" => {
                let Some((part, output)) = kept.get(field("id")) else {
                    return Err(ConversationError {
                        param: format!("input[{index}].id"),
                        message: format!("no kept response has an item {:?}", field("id")),
                        index: Some(index),
                    });
                };
                if !referenced.contains(&part.as_str()) {
                    referenced.push(part);
                    chat.extend(output.iter().cloned());
                    from.extend(output.iter().map(|_| index));
                }
            }
            "reasoning" => {}
            other => {
                return Err(ConversationError {
                    param: format!("input[{index}]"),
                    message: format!(
                        "input item type {other:?} is not taken: message, function_call, function_call_output, \
                         reasoning and item_reference are"
                    ),
                    index: Some(index),
                });
            }
        }
    }
    Ok((chat, from))
}

/// A message item (the `index`th) as a chat message.
fn message(item: &Value, index: usize) -> Result<ChatMessage, ConversationError> {
    let role = match item.get("role").and_then(Value::as_str).unwrap_or("") {
        "user" => Role::User,
        "system" => Role::System,
        "developer" => Role::Developer,
        "assistant" => Role::Assistant,
        other => {
            return Err(ConversationError {
                param: format!("input[{index}].role"),
                message: format!("role must be user, system, developer or assistant, not {other:?}"),
                index: Some(index),
            });
        }
    };
    Ok(ChatMessage { content: Some(content(item.get("content"))), ..ChatMessage::new(role, "") })
}

/// A message item's content: a string, or its parts as chat content.
fn content(content: Option<&Value>) -> Content {
    let parts = match content {
        Some(Value::String(text)) => return Content::Text(text.clone()),
        Some(Value::Array(parts)) => parts,
        _ => return Content::Text(String::new()),
    };
    let str_of = |part: &Value, key: &str| part.get(key).and_then(Value::as_str).unwrap_or("").to_owned();
    let converted: Vec<Value> = parts
        .iter()
        .filter_map(|part| match part.get("type").and_then(Value::as_str) {
            Some("input_text" | "output_text" | "text") => Some(json!({"type": "text", "text": str_of(part, "text")})),
            Some("input_image") => Some(json!({"type": "image_url", "image_url": {"url": str_of(part, "image_url")}})),
            Some("input_file") => {
                let name = part.get("filename").and_then(Value::as_str).unwrap_or("a file");
                Some(json!({"type": "text", "text": format!("[{name}]")}))
            }
            _ => None,
        })
        .collect();
    if converted.iter().all(|p| p["type"] == "text") {
        Content::Text(converted.iter().filter_map(|p| p["text"].as_str()).collect::<Vec<_>>().join("\n"))
    } else {
        Content::Parts(converted)
    }
}
