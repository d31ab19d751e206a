//! What a finished run adds to its thread: the final state of its text, tool calls and tool results, as
//! assistant and tool messages.
//!
//! The run's stream is read as its reduced state (every message as it ended up, in the order each first
//! appeared), and turned into chat messages the way a chat model would have said them:
//!
//! - `text` joins the assistant message being built (a new one after a tool result);
//! - `tool_call` adds a call to it (calls without an id or a name are skipped: the history must stay valid);
//! - a `tool_result` answering a call of this run (by `call_id`) becomes a tool message answering that call,
//!   after the assistant message that made it; its content is the `result` (a string as it is, other JSON as
//!   its text), or `Error: <message>` for a failure;
//! - a `thinking` message the provider signed (`signature`) or sent redacted (`redacted`) joins the assistant
//!   message as a thinking part, in Anthropic's block shape, because Anthropic wants it back on the next
//!   turn (`agent/upstream/anthropic/`; an OpenAI-compatible upstream is sent the message without it);
//! - everything else (other thinking, loading, media, actions, events, custom types, and what sub-agents said, which
//!   carries a `thread_id`) stays in the stream and is not part of the conversation.
//!
//! A completed run that ended with `finish_reason: "tool_calls"`, or with `stop` right after a call (which
//! OpenAI clients receive as `tool_calls`), handed its unanswered calls to the client: those are the calls
//! the thread waits on (see `docs/decisions.md`, "Tool results and threads").

use serde_json::{Value, json};

use crate::conversation::{ChatMessage, Content, Role, ToolCall};
use crate::output::{EndStatus, FinishReason, Outcome, OutputMessage};

/// A finished run's messages, and the calls it left to the client.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct RunResult {
    pub(crate) messages: Vec<ChatMessage>,
    pub(crate) pending: Vec<ToolCall>,
}

/// The run's result from its stream's reduced messages and outcome.
pub(crate) fn run_result(messages: &[OutputMessage], outcome: &Outcome) -> RunResult {
    let mut said: Vec<ChatMessage> = Vec::new();
    // Whether the last thing said was a call: a completed run that stopped there handed its calls over.
    let mut ended_on_call = false;
    for message in messages.iter().filter(|m| m.thread_id.is_none()) {
        match message.kind.as_str() {
            "text" => {
                let text = message.prop_str("content").unwrap_or("");
                if !text.is_empty() {
                    add_text(assistant(&mut said), text);
                    ended_on_call = false;
                }
            }
            "thinking" => {
                if let Some(part) = thinking_part(message) {
                    assistant(&mut said).push_part(part);
                }
            }
            "tool_call" => {
                let (id, name) = (message.prop_str("id").unwrap_or(""), message.prop_str("name").unwrap_or(""));
                if id.is_empty() || name.is_empty() || call(&said, id).is_some() {
                    continue;
                }
                let mut call = ToolCall::new(id, name, &Value::Null);
                call.function.arguments = message.prop_str("arguments").unwrap_or("").to_owned();
                assistant(&mut said).tool_calls.get_or_insert_with(Vec::new).push(call);
                ended_on_call = true;
            }
            "tool_result" => {
                let Some(id) = message.prop_str("call_id") else { continue };
                let answered = said.iter().any(|m| m.role == Role::Tool && m.tool_call_id.as_deref() == Some(id));
                let Some(name) = call(&said, id).map(|c| c.name().to_owned()).filter(|_| !answered) else {
                    continue;
                };
                let failure = message.props.get("error").filter(|e| !e.is_null());
                let output = match (failure, message.props.get("result")) {
                    (Some(error), _) => {
                        format!("Error: {}", error.get("message").and_then(Value::as_str).unwrap_or("the tool failed"))
                    }
                    (None, Some(Value::String(text))) => text.clone(),
                    (None, Some(other)) => other.to_string(),
                    (None, None) => String::new(),
                };
                said.push(ChatMessage::tool_result(id, name, output));
            }
            "image" | "audio" | "video" | "file" => ended_on_call = false,
            _ => {}
        }
    }
    let handed_over = outcome.status == EndStatus::Completed
        && match outcome.finish_reason.unwrap_or_default() {
            FinishReason::ToolCalls => true,
            FinishReason::Stop => ended_on_call,
            _ => false,
        };
    let pending = if handed_over {
        let answered = |id: &str| said.iter().any(|m| m.tool_call_id.as_deref() == Some(id));
        said.iter().flat_map(ChatMessage::calls).filter(|c| !answered(&c.id)).cloned().collect()
    } else {
        Vec::new()
    };
    RunResult { messages: said, pending }
}

/// The assistant message being built: the last message, or a new one after a tool result.
fn assistant(said: &mut Vec<ChatMessage>) -> &mut ChatMessage {
    if said.last().is_none_or(|m| m.role != Role::Assistant) {
        said.push(ChatMessage::ai("", Vec::new()));
    }
    let last = said.len() - 1;
    &mut said[last]
}

/// A signed or redacted thinking message as the block the provider sent.
fn thinking_part(message: &OutputMessage) -> Option<Value> {
    if let Some(data) = message.prop_str("redacted") {
        return Some(json!({"type": "redacted_thinking", "data": data}));
    }
    let signature = message.prop_str("signature").filter(|s| !s.is_empty())?;
    Some(json!({"type": "thinking", "thinking": message.prop_str("content").unwrap_or(""), "signature": signature}))
}

/// Adds text to an assistant message; separate text messages are separate lines (or parts).
fn add_text(message: &mut ChatMessage, text: &str) {
    match &mut message.content {
        Some(Content::Parts(_)) => message.push_part(json!({"type": "text", "text": text})),
        Some(Content::Text(content)) => {
            if !content.is_empty() && !content.ends_with('\n') {
                content.push('\n');
            }
            content.push_str(text);
        }
        _ => message.content = Some(Content::Text(text.to_owned())),
    }
}

fn call<'a>(said: &'a [ChatMessage], id: &str) -> Option<&'a ToolCall> {
    said.iter().flat_map(ChatMessage::calls).find(|c| c.id == id)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::conversation::{Messages, validate};

    fn parse(lines: &[Value]) -> Vec<OutputMessage> {
        lines.iter().map(|v| serde_json::from_value(v.clone()).unwrap()).collect()
    }

    #[test]
    fn text_calls_and_results_become_assistant_and_tool_messages() {
        let messages = parse(&[
            json!({"type": "thinking", "props": {"content": "hmm"}}),
            json!({"type": "text", "props": {"content": "Let me check."}}),
            json!({"type": "tool_call", "props": {"id": "call_1", "name": "weather", "arguments": "{\"city\":\"Paris\"}"}}),
            json!({"type": "tool_result", "props": {"call_id": "call_1", "name": "weather", "result": {"temp_c": 18}}}),
            json!({"type": "tool_result", "props": {"call_id": "call_9", "result": 1}}),
            json!({"type": "text", "props": {"content": "It is 18 °C."}}),
            json!({"type": "text", "props": {"content": "Sub-agent aside"}, "thread_id": "t1"}),
            json!({"type": "image", "props": {"url": "https://example.com/a.png"}}),
            json!({"type": "text", "props": {"content": "Enjoy."}}),
        ]);
        let result = run_result(&messages, &Outcome::completed());
        let want = Messages::new()
            .ai("Let me check.", vec![ToolCall::new("call_1", "weather", &json!({"city": "Paris"}))])
            .tool("call_1", "weather", r#"{"temp_c":18}"#)
            .ai("It is 18 °C.\nEnjoy.", vec![]);
        assert_eq!(result, RunResult { messages: want.into_vec(), pending: vec![] });
    }

    #[test]
    fn calls_left_to_the_client_are_pending_only_when_the_run_handed_them_over() {
        let messages = parse(&[
            json!({"type": "tool_call", "props": {"id": "call_1", "name": "ls", "arguments": "{}"}}),
            json!({"type": "tool_call", "props": {"id": "call_2", "name": "search", "arguments": "{}"}}),
            json!({"type": "tool_result", "props": {"call_id": "call_1", "error": {"message": "no such dir"}}}),
            json!({"type": "tool_call", "props": {"id": "", "name": "nameless", "arguments": "{}"}}),
        ]);
        let handed = Outcome { finish_reason: Some(FinishReason::ToolCalls), ..Outcome::completed() };
        let result = run_result(&messages, &handed);
        assert_eq!(result.pending.iter().map(|c| c.id.as_str()).collect::<Vec<_>>(), ["call_2"]);
        assert_eq!(result.messages.len(), 2, "{:?}", result.messages);
        assert_eq!(result.messages[1].text(), "Error: no such dir");
        assert!(validate(&result.messages).is_ok());
        // Stopping right after a call hands it over too, as OpenAI clients are told.
        assert_eq!(run_result(&messages, &Outcome::completed()).pending, result.pending);
        assert!(run_result(&messages, &Outcome::cancelled()).pending.is_empty());
        let mut answered = messages.clone();
        answered.push(serde_json::from_value(json!({"type": "text", "props": {"content": "done"}})).unwrap());
        assert!(run_result(&answered, &Outcome::completed()).pending.is_empty());
    }
}
