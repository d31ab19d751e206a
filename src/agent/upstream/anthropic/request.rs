//! The body of `POST {base}/messages`: the validated conversation as Anthropic's Messages API takes it.
//!
//! - `system`: the system and developer messages, joined by a blank line, as one top-level field.
//! - `messages`: content blocks. Only complete call + result pairs go (the rule of `request.rs`); in text
//!   mode the history is first written as text (`request.rs` too). A user message's text is a `text` block
//!   and its `image_url` parts `image` blocks (a data URL as `base64`, any other as `url`); other parts go as
//!   they are (an Anthropic client's own blocks). An assistant message is its kept thinking blocks first (a
//!   signed `thinking` or a `redacted_thinking`, as the provider sent them; Anthropic wants them back with
//!   tool use and for continuity), then its text, then a `tool_use` per call (`input`: the arguments as
//!   JSON). A tool message is a `tool_result` in a user message, `is_error` when agentmux wrote it as a
//!   failure (`Error: <message>`, the only mark a chat history has). Consecutive messages of one role are
//!   merged into one, as Anthropic requires; empty text is left out (Anthropic refuses it).
//! - `tools`: `{name, description, input_schema}`, none in text mode. `tool_choice`: OpenAI's `auto`,
//!   `required` (`any`), `none` and `{"type": "function", ...}` (`tool`) are mapped, Anthropic's own shape
//!   passes; `parallel_tool_calls: false` is `disable_parallel_tool_use`.
//! - Options: Anthropic refuses fields it does not know, so only its own pass: `max_tokens` (else
//!   `max_completion_tokens`, else [`DEFAULT_MAX_TOKENS`]: Anthropic requires it), `temperature`, `top_p`,
//!   `top_k`, `stop` or `stop_sequences` (as `stop_sequences`), `thinking`, `service_tier`. A client's
//!   `reasoning_effort` (or `reasoning.effort`) turns thinking on (see [`budget`]).

use serde_json::{Map, Value, json};

use crate::agent::ToolSet;
use crate::agent::upstream::request::{complete_pairs, is_thinking, text_mode_messages};
use crate::conversation::{ChatMessage, Content, Conversation, Role};

/// `max_tokens` when the client sets none (Anthropic requires one).
pub(crate) const DEFAULT_MAX_TOKENS: u64 = 4096;
/// Options Anthropic takes as they are.
const PASSED: &[&str] = &["temperature", "top_p", "top_k", "thinking", "service_tier"];

/// The body of a model call.
pub(crate) fn body(conversation: &Conversation, messages: &[ChatMessage], tools: &ToolSet, text_mode: bool) -> Value {
    let option = |name: &str| conversation.option(name).filter(|v| !v.is_null());
    let mut body = Map::new();
    body.insert("model".into(), conversation.model().into());
    let mut max_tokens =
        option("max_tokens").or(option("max_completion_tokens")).and_then(Value::as_u64).unwrap_or(DEFAULT_MAX_TOKENS);
    for name in PASSED {
        if let Some(value) = option(name) {
            body.insert((*name).into(), value.clone());
        }
    }
    if let Some(stop) = option("stop_sequences").or(option("stop")) {
        let stop = if stop.is_string() { json!([stop]) } else { stop.clone() };
        body.insert("stop_sequences".into(), stop);
    }
    let effort = option("reasoning_effort").or(option("reasoning").and_then(|r| r.get("effort")));
    if let Some(budget) = effort.and_then(Value::as_str).and_then(budget).filter(|_| !body.contains_key("thinking")) {
        // Anthropic counts thinking within max_tokens, which must stay above the budget.
        let explicit = option("max_tokens").or(option("max_completion_tokens")).is_some();
        let budget = if explicit { budget.min(max_tokens.saturating_sub(1)).max(1024) } else { budget };
        if !explicit {
            max_tokens = max_tokens.max(budget + DEFAULT_MAX_TOKENS);
        }
        body.insert("thinking".into(), json!({"type": "enabled", "budget_tokens": budget}));
    }
    body.insert("max_tokens".into(), max_tokens.into());
    let messages = complete_pairs(messages);
    let messages = if text_mode { text_mode_messages(&messages, tools) } else { messages };
    let (system, messages) = render(&messages);
    if !system.is_empty() {
        body.insert("system".into(), system.into());
    }
    body.insert("messages".into(), Value::Array(messages));
    if !text_mode && !tools.is_empty() {
        let tools = tools.describe().into_iter().map(|(name, description, parameters)| {
            // Anthropic requires an object schema to say so.
            let mut schema = if parameters.is_object() { parameters } else { json!({}) };
            if schema.get("type").is_none() {
                schema["type"] = "object".into();
            }
            json!({"name": name, "description": description, "input_schema": schema})
        });
        body.insert("tools".into(), Value::Array(tools.collect()));
        if let Some(choice) = tool_choice(option("tool_choice"), option("parallel_tool_calls")) {
            body.insert("tool_choice".into(), choice);
        }
    }
    body.insert("stream".into(), true.into());
    Value::Object(body)
}

/// The thinking budget for a reasoning effort: `minimal` and `low` 1,024 tokens (Anthropic's least), `medium`
/// 4,096, `high` 16,384. Without a `max_tokens` from the client, `max_tokens` is the budget plus
/// [`DEFAULT_MAX_TOKENS`] for the answer; with one, the budget is kept under it (and at least 1,024).
pub(crate) fn budget(effort: &str) -> Option<u64> {
    match effort {
        "minimal" | "low" => Some(1024),
        "medium" => Some(4096),
        "high" => Some(16_384),
        _ => None,
    }
}

/// Anthropic's `tool_choice` for the client's (OpenAI's or Anthropic's shape) and its `parallel_tool_calls`.
fn tool_choice(choice: Option<&Value>, parallel: Option<&Value>) -> Option<Value> {
    let mut choice = match choice {
        None => json!({"type": "auto"}),
        Some(Value::String(word)) => match word.as_str() {
            "required" | "any" => json!({"type": "any"}),
            "none" => json!({"type": "none"}),
            _ => json!({"type": "auto"}),
        },
        Some(Value::Object(object)) => match object.get("function").and_then(|f| f.get("name")) {
            Some(name) => json!({"type": "tool", "name": name}),
            None => Value::Object(object.clone()),
        },
        Some(_) => return None,
    };
    if parallel == Some(&Value::Bool(false)) && choice["type"] != "none" {
        choice["disable_parallel_tool_use"] = true.into();
    }
    (choice != json!({"type": "auto"})).then_some(choice)
}

/// The system text and the messages as Anthropic's, same-role neighbours merged.
fn render(messages: &[ChatMessage]) -> (String, Vec<Value>) {
    let mut system: Vec<String> = Vec::new();
    let mut out: Vec<(&'static str, Vec<Value>)> = Vec::new();
    for message in messages {
        let (role, blocks) = match message.role {
            Role::System | Role::Developer => {
                system.push(message.text());
                continue;
            }
            Role::User => ("user", user_blocks(message.content.as_ref())),
            Role::Assistant => ("assistant", assistant_blocks(message)),
            Role::Tool => ("user", vec![tool_result(message)]),
        };
        if blocks.is_empty() {
            continue;
        }
        match out.last_mut() {
            Some((last, content)) if *last == role => content.extend(blocks),
            _ => out.push((role, blocks)),
        }
    }
    let system = system.into_iter().filter(|s| !s.trim().is_empty()).collect::<Vec<_>>().join("\n\n");
    let messages = out.into_iter().map(|(role, content)| json!({"role": role, "content": content})).collect();
    (system, messages)
}

fn text_block(text: &str) -> Option<Value> {
    (!text.is_empty()).then(|| json!({"type": "text", "text": text}))
}

fn user_blocks(content: Option<&Content>) -> Vec<Value> {
    match content {
        None => Vec::new(),
        Some(Content::Text(text)) => text_block(text).into_iter().collect(),
        Some(Content::Parts(parts)) => parts.iter().filter_map(part).collect(),
    }
}

/// A user message's part as a content block.
fn part(part: &Value) -> Option<Value> {
    match part.get("type").and_then(Value::as_str) {
        Some("text") => text_block(part.get("text").and_then(Value::as_str).unwrap_or("")),
        Some("image_url") => {
            let url = part.get("image_url").and_then(|i| i.get("url")).and_then(Value::as_str)?;
            let source = match url.strip_prefix("data:").and_then(|rest| rest.split_once(";base64,")) {
                Some((media_type, data)) => json!({"type": "base64", "media_type": media_type, "data": data}),
                None => json!({"type": "url", "url": url}),
            };
            Some(json!({"type": "image", "source": source}))
        }
        _ => Some(part.clone()),
    }
}

fn assistant_blocks(message: &ChatMessage) -> Vec<Value> {
    let mut blocks: Vec<Value> = match &message.content {
        Some(Content::Parts(parts)) => parts.iter().filter(|p| is_thinking(p)).cloned().collect(),
        _ => Vec::new(),
    };
    blocks.extend(text_block(&message.text()));
    for call in message.calls() {
        let input = call.arguments().ok().filter(Value::is_object).unwrap_or_else(|| json!({}));
        blocks.push(json!({"type": "tool_use", "id": call.id, "name": call.name(), "input": input}));
    }
    blocks
}

fn tool_result(message: &ChatMessage) -> Value {
    let text = message.text();
    let mut block = json!({"type": "tool_result", "tool_use_id": message.tool_call_id.as_deref().unwrap_or("")});
    if !text.is_empty() {
        block["content"] = text.as_str().into();
    }
    if text.starts_with("Error: ") {
        block["is_error"] = true.into();
    }
    block
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::agent::Tools;
    use crate::conversation::{Messages, ToolCall};

    fn options(pairs: &[(&str, Value)]) -> Map<String, Value> {
        pairs.iter().map(|(k, v)| ((*k).to_owned(), v.clone())).collect()
    }

    #[test]
    fn system_is_top_level_results_are_user_blocks_and_neighbours_merge() {
        let mut thinking = ChatMessage::ai("", vec![ToolCall::new("toolu_1", "ls", &json!({"path": "/"}))]);
        thinking.push_part(json!({"type": "thinking", "thinking": "hmm", "signature": "sig"}));
        let chain = Messages::new()
            .system("Be brief.")
            .add([ChatMessage::new(Role::Developer, "Use tools.")])
            .human("list /")
            .human("now")
            .add([thinking])
            .tool("toolu_1", "ls", "Error: denied");
        let conversation = Conversation::user("claude", "x").with_options(options(&[
            ("stop", json!("END")),
            ("seed", json!(1)),
            ("temperature", json!(0.5)),
        ]));
        let tools =
            ToolSet::new(Arc::new(Tools::new()), Some(&json!([{"type": "function", "function": {"name": "ls"}}])))
                .unwrap();
        let body = body(&conversation, &chain.clone().into_vec(), &tools, false);
        assert_eq!(body["system"], "Be brief.\n\nUse tools.");
        assert_eq!(body["max_tokens"], DEFAULT_MAX_TOKENS);
        assert_eq!(body["stop_sequences"], json!(["END"]));
        assert_eq!(body["temperature"], 0.5);
        assert!(body.get("seed").is_none() && body.get("tool_choice").is_none());
        assert_eq!(body["tools"], json!([{"name": "ls", "description": "", "input_schema": {"type": "object"}}]));
        assert_eq!(
            body["messages"],
            json!([
                {"role": "user", "content": [{"type": "text", "text": "list /"}, {"type": "text", "text": "now"}]},
                {"role": "assistant", "content": [
                    {"type": "thinking", "thinking": "hmm", "signature": "sig"},
                    {"type": "tool_use", "id": "toolu_1", "name": "ls", "input": {"path": "/"}}]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": "Error: denied", "is_error": true}]},
            ])
        );
    }

    #[test]
    fn reasoning_effort_turns_thinking_on_within_max_tokens() {
        let tools = ToolSet::new(Arc::new(Tools::new()), None).unwrap();
        let run = |pairs: &[(&str, Value)]| {
            let conversation = Conversation::user("claude", "x").with_options(options(pairs));
            body(&conversation, &conversation.messages().clone().into_vec(), &tools, false)
        };
        let high = run(&[("reasoning_effort", json!("high"))]);
        assert_eq!(high["thinking"], json!({"type": "enabled", "budget_tokens": 16_384}));
        assert_eq!(high["max_tokens"], 16_384 + DEFAULT_MAX_TOKENS);
        let capped = run(&[("reasoning_effort", json!("medium")), ("max_completion_tokens", json!(3000))]);
        assert_eq!(
            (capped["thinking"]["budget_tokens"].as_u64(), capped["max_tokens"].as_u64()),
            (Some(2999), Some(3000))
        );
        assert!(run(&[]).get("thinking").is_none());
        assert_eq!(
            tool_choice(Some(&json!("required")), Some(&json!(false))),
            Some(json!({"type": "any", "disable_parallel_tool_use": true}))
        );
        assert_eq!(
            tool_choice(Some(&json!({"type": "function", "function": {"name": "ls"}})), None),
            Some(json!({"type": "tool", "name": "ls"}))
        );
    }
}
