//! The request sent upstream: the validated conversation, projected for the provider, with the tools and
//! the client's own options.
//!
//! This is the body of the OpenAI chat dialect (`openai.rs`); `complete_pairs` and the text-mode history are
//! shared with the Anthropic one (`anthropic/request.rs`).
//!
//! - Messages: only complete tool call + result pairs go (`docs/design.md`, "Transcript"): a call nobody answered (a thread
//!   whose client asked something else instead) is left out, and an assistant message left with nothing is
//!   dropped, so the provider never sees half a pair. `complete_pairs` decides this on chat messages, the
//!   one form every inbound format is already converted to; the provider's words come after it.
//! - Tools: every tool of the run (the request's and the registered ones), natively; in text mode, none:
//!   the system prompt carries the structured-output instructions and the tool list instead (`docs/design.md`, "Text-mode tools"),
//!   calls in the history are written as the action JSON the model is asked for, and results as user
//!   messages naming the tool. Thinking blocks an assistant message keeps for Anthropic are left out.
//! - Options: every field of the client's request passes through (temperature, max_tokens, stop, seed,
//!   response_format, reasoning options, vendor extras), except what agentmux owns: `model` (the model name),
//!   `messages`, `stream` and `stream_options` (always streamed, with usage), `tools` (the run's), and
//!   `metadata` (which names agentmux threads).

use std::collections::HashSet;

use serde_json::{Map, Value, json};

use crate::agent::ToolSet;
use crate::conversation::{ChatMessage, Content, Conversation, Role};

/// What agentmux sets itself, never passed through from the client.
const OWNED: &[&str] = &["model", "messages", "stream", "stream_options", "tools", "metadata"];
/// What a text-mode request does not send: the model has no native tools.
const NATIVE_TOOLS: &[&str] = &["tool_choice", "parallel_tool_calls"];

/// The body of `POST {upstream}/chat/completions`.
pub(crate) fn body(conversation: &Conversation, messages: &[ChatMessage], tools: &ToolSet, text_mode: bool) -> Value {
    let mut body = Map::new();
    for (key, value) in conversation.options() {
        let owned = OWNED.contains(&key.as_str()) || (text_mode && NATIVE_TOOLS.contains(&key.as_str()));
        if !owned {
            body.insert(key.clone(), value.clone());
        }
    }
    body.insert("model".into(), conversation.model().into());
    let messages: Vec<ChatMessage> = complete_pairs(messages).into_iter().map(without_thinking).collect();
    let messages = if text_mode { text_mode_messages(&messages, tools) } else { messages };
    body.insert("messages".into(), serde_json::to_value(messages).unwrap_or(Value::Array(Vec::new())));
    body.insert("stream".into(), true.into());
    body.insert("stream_options".into(), json!({"include_usage": true}));
    if !text_mode && !tools.is_empty() {
        body.insert("tools".into(), Value::Array(tools.declarations()));
    }
    Value::Object(body)
}

/// An assistant message without the thinking blocks kept for Anthropic (`anthropic/request.rs`), which no
/// OpenAI-compatible server takes: its text parts become its text again.
fn without_thinking(mut message: ChatMessage) -> ChatMessage {
    if let Some(Content::Parts(parts)) = &message.content
        && parts.iter().any(is_thinking)
    {
        let kept: Vec<Value> = parts.iter().filter(|p| !is_thinking(p)).cloned().collect();
        message.content = if kept.iter().all(|p| p.get("type").and_then(Value::as_str) == Some("text")) {
            let text = Content::Parts(kept).text();
            (!text.is_empty()).then_some(Content::Text(text))
        } else {
            Some(Content::Parts(kept))
        };
    }
    message
}

/// A thinking block an assistant message keeps for the provider (Anthropic's `thinking` with its signature, or
/// `redacted_thinking`; see `model_call.rs`).
pub(crate) fn is_thinking(part: &Value) -> bool {
    matches!(part.get("type").and_then(Value::as_str), Some("thinking" | "redacted_thinking"))
}

/// The messages with every call that has no result, and every result that has no call, left out.
pub(crate) fn complete_pairs(messages: &[ChatMessage]) -> Vec<ChatMessage> {
    let answered: HashSet<&str> =
        messages.iter().filter(|m| m.role == Role::Tool).filter_map(|m| m.tool_call_id.as_deref()).collect();
    let called: HashSet<&str> = messages
        .iter()
        .flat_map(ChatMessage::calls)
        .map(|c| c.id.as_str())
        .filter(|id| answered.contains(id))
        .collect();
    let mut out = Vec::with_capacity(messages.len());
    for message in messages {
        match message.role {
            Role::Tool if !message.tool_call_id.as_deref().is_some_and(|id| called.contains(id)) => continue,
            Role::Assistant if !message.calls().is_empty() => {
                let kept: Vec<_> = message.calls().iter().filter(|c| called.contains(c.id.as_str())).cloned().collect();
                let mut message = message.clone();
                message.tool_calls = (!kept.is_empty()).then_some(kept);
                let said = message.content.as_ref().is_some_and(|c| !c.text().trim().is_empty());
                if message.tool_calls.is_some() || said {
                    out.push(message);
                }
            }
            _ => out.push(message.clone()),
        }
    }
    out
}

/// The instructions a text-mode model gets (`docs/design.md`, "Text-mode tools"), with the run's tools.
fn instructions(tools: &ToolSet) -> String {
    let mut text = String::from(
        "# Tool use: structured output required\n\n\
         Answer in one of three ways:\n\
         1. Plain text, for the user.\n\
         2. To call a tool: ONLY a JSON object, nothing before or after it:\n\
         {\"type\": \"action\", \"tool\": \"<tool name>\", \"args\": {<arguments>}}\n\
         3. If you cannot go on: ONLY {\"type\": \"error\", \"code\": \"<code>\", \"message\": \"<why>\"}\n\n\
         A tool's result comes back in the next user message. Do not invent results.\n\n## Available tools\n",
    );
    for (name, description, parameters) in tools.describe() {
        text.push_str(&format!("\n### {name}\n{description}\nArguments (JSON Schema): {parameters}\n"));
    }
    text
}

/// The history for a text-mode model: the instructions first, calls as action JSON, results as user text.
pub(crate) fn text_mode_messages(messages: &[ChatMessage], tools: &ToolSet) -> Vec<ChatMessage> {
    let mut out = Vec::with_capacity(messages.len() + 1);
    if !tools.is_empty() {
        out.push(ChatMessage::system(instructions(tools)));
    }
    for message in messages {
        match message.role {
            Role::Assistant if !message.calls().is_empty() => {
                let mut said = message.text();
                for call in message.calls() {
                    let args = call.arguments().unwrap_or(Value::Object(Map::new()));
                    let action = json!({"type": "action", "tool": call.name(), "args": args});
                    if !said.is_empty() {
                        said.push('\n');
                    }
                    said.push_str(&action.to_string());
                }
                out.push(ChatMessage::ai(said, Vec::new()));
            }
            Role::Tool => {
                let name = message.name.as_deref().unwrap_or("the tool");
                out.push(ChatMessage::human(format!("Result of {name}: {}", message.text())));
            }
            _ => out.push(message.clone()),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::agent::Tools;
    use crate::conversation::{Messages, ToolCall};

    #[test]
    fn unanswered_calls_are_left_out() {
        let chain = Messages::new()
            .human("q")
            .ai("", vec![ToolCall::new("a", "ls", &json!({})), ToolCall::new("b", "cat", &json!({}))])
            .tool("a", "ls", "x")
            .ai("", vec![ToolCall::new("c", "rm", &json!({}))])
            .human("and?");
        let kept = complete_pairs(&chain.clone().into_vec());
        let want = Messages::new()
            .human("q")
            .ai("", vec![ToolCall::new("a", "ls", &json!({}))])
            .tool("a", "ls", "x")
            .human("and?");
        assert_eq!(kept, want.into_vec());
    }

    #[test]
    fn thinking_kept_for_anthropic_is_not_sent_to_an_openai_server() {
        let mut said = ChatMessage::ai("It is 18 °C.", Vec::new());
        said.push_part(json!({"type": "thinking", "thinking": "hmm", "signature": "sig"}));
        let mut redacted = ChatMessage::ai("", Vec::new());
        redacted.push_part(json!({"type": "redacted_thinking", "data": "x"}));
        redacted.push_part(json!({"type": "text", "text": "Sure."}));
        let chain = Messages::new().human("q").add([said]).human("and?").add([redacted]);
        let conversation = Conversation::user("qwen", "hi");
        let tools = ToolSet::new(Arc::new(Tools::new()), None).unwrap();
        let body = body(&conversation, &chain.clone().into_vec(), &tools, false);
        assert_eq!(body["messages"][1], json!({"role": "assistant", "content": "It is 18 °C."}));
        assert_eq!(body["messages"][3], json!({"role": "assistant", "content": "Sure."}));
    }

    #[test]
    fn options_pass_through_except_what_agentmux_owns() {
        let mut options = Map::new();
        for (k, v) in [
            ("temperature", json!(0.2)),
            ("metadata", json!({"thread_id": "t"})),
            ("stream", json!(false)),
            ("tool_choice", json!("auto")),
            ("chat_template_kwargs", json!({"enable_thinking": true})),
        ] {
            options.insert(k.into(), v);
        }
        let conversation = Conversation::user("qwen", "hi").with_options(options);
        let tools =
            ToolSet::new(Arc::new(Tools::new()), Some(&json!([{"type": "function", "function": {"name": "ls"}}])))
                .unwrap();
        let body = body(&conversation, &conversation.messages().clone().into_vec(), &tools, false);
        assert_eq!(body["model"], "qwen");
        assert_eq!(body["temperature"], 0.2);
        assert_eq!(body["stream"], true);
        assert_eq!(body["stream_options"], json!({"include_usage": true}));
        assert_eq!(body["tool_choice"], "auto");
        assert_eq!(body["chat_template_kwargs"]["enable_thinking"], true);
        assert!(body.get("metadata").is_none());
        assert_eq!(body["tools"][0]["function"]["name"], "ls");
        let text = super::body(&conversation, &conversation.messages().clone().into_vec(), &tools, true);
        assert!(text.get("tools").is_none() && text.get("tool_choice").is_none());
        assert!(text["messages"][0]["content"].as_str().unwrap().contains("### ls"));
    }
}
