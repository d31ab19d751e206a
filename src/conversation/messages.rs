//! [`Messages`]: a conversation as a chain of [`ChatMessage`]s, with the constructors, fluent builder,
//! accessors, filters, token estimate and pretty printer of the design's message model (`docs/design.md`, "Conversations").
//!
//! The chain holds each message behind an [`Arc`], so that a conversation made from what a server-side
//! thread keeps shares the thread's messages instead of copying them (a run on a 15 MB thread would otherwise
//! hold a copy of it for as long as it runs; `docs/design.md`, "Reads share what is kept"). A request's
//! messages become a chain and back without copying their text. Checking a chain is `validate.rs`.

use std::fmt;
use std::sync::Arc;

use super::request::{ChatMessage, Content, Role, ToolCall};

impl ChatMessage {
    /// A user message.
    pub fn human(content: impl Into<String>) -> Self {
        ChatMessage::new(Role::User, content)
    }

    /// A system message.
    pub fn system(content: impl Into<String>) -> Self {
        ChatMessage::new(Role::System, content)
    }

    /// An assistant message with text (empty: none) and tool calls.
    pub fn ai(content: impl Into<String>, tool_calls: Vec<ToolCall>) -> Self {
        let content: String = content.into();
        ChatMessage {
            role: Role::Assistant,
            content: (!content.is_empty()).then_some(Content::Text(content)),
            tool_calls: (!tool_calls.is_empty()).then_some(tool_calls),
            tool_call_id: None,
            name: None,
        }
    }

    /// A tool's result, answering the call `tool_call_id` of the tool `name`.
    pub fn tool_result(tool_call_id: impl Into<String>, name: impl Into<String>, output: impl Into<String>) -> Self {
        ChatMessage {
            role: Role::Tool,
            content: Some(Content::Text(output.into())),
            tool_calls: None,
            tool_call_id: Some(tool_call_id.into()),
            name: Some(name.into()),
        }
    }

    /// The text of its content (empty when it has none).
    pub fn text(&self) -> String {
        self.content.as_ref().map(Content::text).unwrap_or_default()
    }

    /// Adds a content part (a thinking block kept for the provider, say), its text so far becoming a `text`
    /// part before it.
    pub(crate) fn push_part(&mut self, part: serde_json::Value) {
        let parts = match self.content.take() {
            None => Vec::new(),
            Some(Content::Text(text)) if text.is_empty() => Vec::new(),
            Some(Content::Text(text)) => vec![serde_json::json!({"type": "text", "text": text})],
            Some(Content::Parts(parts)) => parts,
        };
        let mut parts = parts;
        parts.push(part);
        self.content = Some(Content::Parts(parts));
    }

    /// Its tool calls (none for anything but an assistant message that calls tools).
    pub fn calls(&self) -> &[ToolCall] {
        self.tool_calls.as_deref().unwrap_or_default()
    }
}

/// A conversation, oldest message first.
///
/// ```
/// use agentmux::conversation::{Messages, Role, ToolCall};
/// use serde_json::json;
///
/// let chain = Messages::new()
///     .system("You are helpful.")
///     .human("What is 2+2?")
///     .ai("Let me calculate.", vec![ToolCall::new("call_1", "calculate", &json!({"expr": "2+2"}))])
///     .tool("call_1", "calculate", "4")
///     .ai("2+2 = 4", vec![]);
/// assert_eq!(chain.len(), 5);
/// assert_eq!(chain.last_content(), "2+2 = 4");
/// assert_eq!(chain.by_role(Role::Assistant).len(), 2);
/// assert!(chain.validate().is_ok());
/// assert!(chain.to_string().contains("  → tool_call: calculate(id=call_1, args={\"expr\":\"2+2\"})"));
/// ```
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Messages(Vec<Arc<ChatMessage>>);

impl Messages {
    /// An empty conversation.
    pub fn new() -> Self {
        Messages(Vec::new())
    }

    /// Adds a system message.
    #[must_use]
    pub fn system(self, content: impl Into<String>) -> Self {
        self.add([ChatMessage::system(content)])
    }

    /// Adds a user message.
    #[must_use]
    pub fn human(self, content: impl Into<String>) -> Self {
        self.add([ChatMessage::human(content)])
    }

    /// Adds an assistant message.
    #[must_use]
    pub fn ai(self, content: impl Into<String>, tool_calls: Vec<ToolCall>) -> Self {
        self.add([ChatMessage::ai(content, tool_calls)])
    }

    /// Adds a tool's result.
    #[must_use]
    pub fn tool(self, tool_call_id: impl Into<String>, name: impl Into<String>, output: impl Into<String>) -> Self {
        self.add([ChatMessage::tool_result(tool_call_id, name, output)])
    }

    /// Adds messages.
    // The design's name (`docs/design.md`, "Conversations"); it takes any number of messages, which `std::ops::Add` could not say.
    #[allow(clippy::should_implement_trait)]
    #[must_use]
    pub fn add(mut self, messages: impl IntoIterator<Item = ChatMessage>) -> Self {
        self.0.extend(messages.into_iter().map(Arc::new));
        self
    }

    /// This conversation followed by `other`.
    #[must_use]
    pub fn concat(mut self, other: Messages) -> Self {
        self.0.extend(other.0);
        self
    }

    /// How many messages.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// True when it has none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The last message.
    pub fn last(&self) -> Option<&ChatMessage> {
        self.0.last().map(|message| &**message)
    }

    /// The text of the last message (empty when there is none).
    pub fn last_content(&self) -> String {
        self.last().map(ChatMessage::text).unwrap_or_default()
    }

    /// The messages with this role, in order.
    pub fn by_role(&self, role: Role) -> Messages {
        Messages(self.0.iter().filter(|m| m.role == role).cloned().collect())
    }

    /// A rough token count: four characters of content or tool-call arguments a token (the design's heuristic,
    /// for deciding when a history is long, not for billing).
    pub fn estimate_tokens(&self) -> usize {
        let chars: usize = self
            .0
            .iter()
            .map(|m| {
                let arguments: usize = m.calls().iter().map(|c| c.function.arguments.chars().count()).sum();
                m.text().chars().count() + arguments
            })
            .sum();
        chars / 4
    }

    /// The messages, each shared with whoever else holds it (a thread, another conversation).
    pub fn as_slice(&self) -> &[Arc<ChatMessage>] {
        &self.0
    }

    /// The messages, owned: each one copied only if something else still holds it.
    pub fn into_vec(self) -> Vec<ChatMessage> {
        self.0.into_iter().map(Arc::unwrap_or_clone).collect()
    }
}

impl From<Vec<ChatMessage>> for Messages {
    fn from(messages: Vec<ChatMessage>) -> Self {
        messages.into_iter().collect()
    }
}

impl From<Vec<Arc<ChatMessage>>> for Messages {
    fn from(messages: Vec<Arc<ChatMessage>>) -> Self {
        Messages(messages)
    }
}

impl FromIterator<ChatMessage> for Messages {
    fn from_iter<I: IntoIterator<Item = ChatMessage>>(messages: I) -> Self {
        Messages(messages.into_iter().map(Arc::new).collect())
    }
}

impl FromIterator<Arc<ChatMessage>> for Messages {
    fn from_iter<I: IntoIterator<Item = Arc<ChatMessage>>>(messages: I) -> Self {
        Messages(messages.into_iter().collect())
    }
}

/// The pretty printer: `[System]`, `[Human]`, `[AI]`, `[Tool: name (call_id=..)]`, each followed by the text,
/// tool calls as `  → tool_call: name(id=.., args=..)`, a blank line between messages.
impl fmt::Display for Messages {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (index, message) in self.0.iter().enumerate() {
            if index > 0 {
                writeln!(f)?;
            }
            match message.role {
                Role::System => writeln!(f, "[System]")?,
                Role::Developer => writeln!(f, "[Developer]")?,
                Role::User => writeln!(f, "[Human]")?,
                Role::Assistant => writeln!(f, "[AI]")?,
                Role::Tool => writeln!(
                    f,
                    "[Tool: {} (call_id={})]",
                    message.name.as_deref().unwrap_or("?"),
                    message.tool_call_id.as_deref().unwrap_or("?")
                )?,
            }
            let text = message.text();
            if !text.is_empty() {
                writeln!(f, "{text}")?;
            }
            for call in message.calls() {
                writeln!(f, "  → tool_call: {}(id={}, args={})", call.name(), call.id, call.function.arguments)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn prints_the_seed_example() {
        let chain = Messages::new()
            .system("You are helpful.")
            .human("What is 2+2?")
            .ai("Let me calculate.", vec![ToolCall::new("call_1", "calculate", &json!({"expr": "2+2"}))])
            .tool("call_1", "calculate", "4")
            .ai("2+2 = 4", vec![]);
        let want = "[System]\nYou are helpful.\n\n[Human]\nWhat is 2+2?\n\n[AI]\nLet me calculate.\n  → tool_call: \
                    calculate(id=call_1, args={\"expr\":\"2+2\"})\n\n[Tool: calculate (call_id=call_1)]\n4\n\n[AI]\n2+2 = \
                    4\n";
        assert_eq!(chain.to_string(), want);
        assert_eq!(chain.by_role(Role::User).last_content(), "What is 2+2?");
        assert_eq!(chain.by_role(Role::Tool).len(), 1);
        // 71 characters of text and 14 of arguments.
        assert_eq!(chain.estimate_tokens(), (16 + 12 + 17 + 1 + 7 + 14) / 4);
        let merged = chain.clone().concat(Messages::new().human("thanks"));
        assert_eq!((merged.len(), merged.last_content().as_str()), (6, "thanks"));
        assert!(Messages::new().last().is_none() && Messages::new().last_content().is_empty());
    }
}
