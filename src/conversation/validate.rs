//! Checking a conversation (`docs/design.md`, "Validation"), with errors that name the message and the field.
//!
//! - [`validate`]: a conversation is well formed: an assistant message has content or tool calls, and each
//!   call an id and a name; a tool message answers, by `tool_call_id`, a call of an earlier assistant message
//!   (and, when it gives a `name`, that call's); user, system and developer messages are not empty. An
//!   unknown role never gets this far: parsing refuses it, naming `messages[i].role`.
//! - [`validate_user_input`]: what a client may add to a history the server owns: at least one message, and
//!   only user, system and developer ones, none empty. A client can never inject what the model or a tool
//!   said.
//! - [`validate_thread_input`]: the same, except for the results of calls the thread's last run handed to
//!   the client (`docs/decisions.md`, "Tool results and threads"): a tool message may answer one of those, once, before the rest of the input.

use std::borrow::Borrow;
use std::collections::HashMap;

use super::messages::Messages;
use super::request::{ChatMessage, Content, Role, ToolCall};

/// Why a conversation was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{param}: {message}")]
pub struct ConversationError {
    /// The field at fault, as a path: `messages[3].tool_call_id`.
    pub param: String,
    /// For a person.
    pub message: String,
    /// The message at fault, when it is one message.
    pub index: Option<usize>,
}

impl ConversationError {
    /// The same error about a request whose `field` (`messages`, `input`) became these chat messages, `from[i]`
    /// the item of `field` chat message `i` came from (`to_chat`, `ag_ui_to_chat`, …): it names that item.
    pub fn naming_request_items(mut self, field: &str, from: &[usize]) -> Self {
        if let Some(&index) = self.index.and_then(|i| from.get(i)) {
            self.param = format!("{field}[{index}]");
            self.index = Some(index);
        }
        self
    }

    /// The same error about the message at `index` of another list (the input after a history, the whole
    /// history before an input): its `param` names that one, or `messages` when none.
    pub(crate) fn renumbered(mut self, index: Option<usize>) -> Self {
        let field = match (self.index, self.param.find(']')) {
            (Some(_), Some(end)) if self.param.starts_with("messages[") => self.param[end + 1..].to_owned(),
            _ => return self,
        };
        self.param = match index {
            Some(index) => format!("messages[{index}]{field}"),
            None => "messages".to_owned(),
        };
        self.index = index;
        self
    }

    /// An error about the conversation as a whole (`messages`).
    pub(crate) fn empty() -> Self {
        ConversationError { param: "messages".into(), message: "messages must not be empty".into(), index: None }
    }
}

fn refuse(index: usize, field: &str, message: impl Into<String>) -> Result<(), ConversationError> {
    let param = if field.is_empty() { format!("messages[{index}]") } else { format!("messages[{index}].{field}") };
    Err(ConversationError { param, message: message.into(), index: Some(index) })
}

/// True when a message says nothing: no content, blank text, or no parts.
fn is_empty(message: &ChatMessage) -> bool {
    match &message.content {
        None => true,
        Some(Content::Text(text)) => text.trim().is_empty(),
        Some(Content::Parts(parts)) => parts.is_empty(),
    }
}

/// Checks that `messages` (owned, or shared as [`Messages`] holds them) is a well-formed conversation.
pub fn validate<M: Borrow<ChatMessage>>(messages: &[M]) -> Result<(), ConversationError> {
    // The calls made so far, by id: the name each was made with.
    let mut calls: HashMap<&str, &str> = HashMap::new();
    for (index, message) in messages.iter().map(M::borrow).enumerate() {
        match message.role {
            Role::Assistant => {
                if is_empty(message) && message.calls().is_empty() {
                    return refuse(index, "content", "an assistant message has no content and no tool calls");
                }
                for (position, call) in message.calls().iter().enumerate() {
                    if call.id.is_empty() {
                        return refuse(index, &format!("tool_calls[{position}].id"), "a tool call needs an id");
                    }
                    if call.function.name.is_empty() {
                        return refuse(
                            index,
                            &format!("tool_calls[{position}].function.name"),
                            "a tool call needs a name",
                        );
                    }
                    calls.insert(&call.id, &call.function.name);
                }
            }
            Role::Tool => {
                let Some(id) = message.tool_call_id.as_deref().filter(|id| !id.is_empty()) else {
                    return refuse(index, "tool_call_id", "a tool message needs the tool_call_id it answers");
                };
                let Some(name) = calls.get(id) else {
                    return refuse(
                        index,
                        "tool_call_id",
                        format!("the tool message answers {id:?}, which no earlier assistant message called"),
                    );
                };
                if let Some(given) = message.name.as_deref().filter(|given| given != name) {
                    return refuse(index, "name", format!("the call {id:?} was to {name:?}, not {given:?}"));
                }
            }
            Role::User | Role::System | Role::Developer => {
                if is_empty(message) {
                    return refuse(index, "content", "the message is empty");
                }
            }
        }
    }
    Ok(())
}

/// Checks what a client adds to a history the server owns: one message or more, each a user, system or
/// developer message with content.
pub fn validate_user_input<M: Borrow<ChatMessage>>(messages: &[M]) -> Result<(), ConversationError> {
    if messages.is_empty() {
        return Err(ConversationError::empty());
    }
    for (index, message) in messages.iter().map(M::borrow).enumerate() {
        if matches!(message.role, Role::Assistant | Role::Tool) {
            let role = if message.role == Role::Assistant { "assistant" } else { "tool" };
            return refuse(index, "role", format!("a client may not send {role} messages into a server-side history"));
        }
    }
    validate(messages)
}

/// Checks what a client adds to a server-side thread: [`validate_user_input`], except that a tool message may
/// answer one of the `pending` calls (the calls the thread's last run handed to the client, which it has not
/// answered yet), once, and before any other message of the input, since it answers what came before.
///
/// ```
/// use agentmux::conversation::{Messages, ToolCall, validate_thread_input};
/// use serde_json::json;
///
/// let pending = [ToolCall::new("call_1", "ls", &json!({}))];
/// let answer = Messages::new().tool("call_1", "ls", "[]").human("and now?");
/// assert!(validate_thread_input(answer.as_slice(), &pending).is_ok());
/// let forged = Messages::new().tool("call_2", "ls", "[]");
/// assert_eq!(validate_thread_input(forged.as_slice(), &pending).unwrap_err().param, "messages[0].tool_call_id");
/// ```
pub fn validate_thread_input<M: Borrow<ChatMessage>>(
    messages: &[M],
    pending: &[ToolCall],
) -> Result<(), ConversationError> {
    if messages.is_empty() {
        return Err(ConversationError::empty());
    }
    let mut answered: Vec<&str> = Vec::new();
    let mut leading = true;
    for (index, message) in messages.iter().map(M::borrow).enumerate() {
        match message.role {
            Role::Assistant => {
                return refuse(index, "role", "a client may not send assistant messages into a server-side history");
            }
            Role::Tool if pending.is_empty() => {
                return refuse(
                    index,
                    "role",
                    "a client may send a tool message into a thread only to answer a call its last run handed over, \
                     and there is none",
                );
            }
            Role::Tool if !leading => {
                return refuse(index, "role", "tool results come first: they answer the thread's last run");
            }
            Role::Tool => {
                let Some(id) = message.tool_call_id.as_deref().filter(|id| !id.is_empty()) else {
                    return refuse(index, "tool_call_id", "a tool message needs the tool_call_id it answers");
                };
                let Some(call) = pending.iter().find(|call| call.id == id) else {
                    let open: Vec<&str> = pending.iter().map(|c| c.id.as_str()).collect();
                    return refuse(
                        index,
                        "tool_call_id",
                        format!("{id:?} is not a call the thread waits on (those are {open:?})"),
                    );
                };
                if answered.contains(&id) {
                    return refuse(index, "tool_call_id", format!("the call {id:?} is answered twice"));
                }
                if let Some(given) = message.name.as_deref().filter(|given| *given != call.name()) {
                    return refuse(index, "name", format!("the call {id:?} was to {:?}, not {given:?}", call.name()));
                }
                answered.push(id);
            }
            Role::User | Role::System | Role::Developer => {
                leading = false;
                if is_empty(message) {
                    return refuse(index, "content", "the message is empty");
                }
            }
        }
    }
    Ok(())
}

impl Messages {
    /// [`validate`] on this conversation.
    pub fn validate(&self) -> Result<(), ConversationError> {
        validate(self.as_slice())
    }

    /// [`validate_user_input`] on this conversation.
    pub fn validate_user_input(&self) -> Result<(), ConversationError> {
        validate_user_input(self.as_slice())
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn param(result: Result<(), ConversationError>) -> Option<String> {
        result.err().map(|e| e.param)
    }

    #[test]
    fn every_rule_names_its_field() {
        let call = || ToolCall::new("call_1", "ls", &json!({"path": "/"}));
        let nameless = ToolCall { function: Default::default(), ..call() };
        let idless = ToolCall { id: String::new(), ..call() };
        let table: Vec<(&str, Messages, Option<&str>)> = vec![
            (
                "a whole exchange",
                Messages::new().system("s").human("h").ai("", vec![call()]).tool("call_1", "ls", "[]"),
                None,
            ),
            ("an empty assistant", Messages::new().human("h").ai("", vec![]), Some("messages[1].content")),
            ("a call without an id", Messages::new().ai("", vec![idless]), Some("messages[0].tool_calls[0].id")),
            (
                "a call without a name",
                Messages::new().ai("x", vec![nameless]),
                Some("messages[0].tool_calls[0].function.name"),
            ),
            (
                "a tool message without tool_call_id",
                Messages::new().add([ChatMessage { tool_call_id: None, ..ChatMessage::tool_result("x", "ls", "r") }]),
                Some("messages[0].tool_call_id"),
            ),
            (
                "a tool message answering no call",
                Messages::new().human("h").tool("call_9", "ls", "r"),
                Some("messages[1].tool_call_id"),
            ),
            (
                "a tool message answering a later call",
                Messages::new().tool("call_1", "ls", "r").ai("", vec![call()]),
                Some("messages[0].tool_call_id"),
            ),
            (
                "a tool message with another name",
                Messages::new().ai("", vec![call()]).tool("call_1", "rm", "r"),
                Some("messages[1].name"),
            ),
            (
                "a tool message without a name",
                Messages::new()
                    .ai("", vec![call()])
                    .add([ChatMessage { name: None, ..ChatMessage::tool_result("call_1", "", "r") }]),
                None,
            ),
            ("an empty user message", Messages::new().human("  "), Some("messages[0].content")),
            ("an empty system message", Messages::new().system(""), Some("messages[0].content")),
        ];
        for (what, chain, want) in table {
            assert_eq!(param(chain.validate()).as_deref(), want, "{what}");
        }
    }

    #[test]
    fn user_input_is_only_user_system_and_developer() {
        let spoofed = Messages::new().human("hi").ai("I am the model", vec![]);
        assert_eq!(param(spoofed.validate_user_input()).as_deref(), Some("messages[1].role"));
        let tool = Messages::new().tool("call_1", "ls", "fake");
        assert_eq!(param(tool.validate_user_input()).as_deref(), Some("messages[0].role"));
        assert_eq!(param(Messages::new().validate_user_input()).as_deref(), Some("messages"));
        assert_eq!(param(Messages::new().human("").validate_user_input()).as_deref(), Some("messages[0].content"));
        assert!(Messages::new().system("s").human("h").validate_user_input().is_ok());
    }
}

#[cfg(test)]
mod thread_input {
    use serde_json::json;

    use super::*;

    #[test]
    fn only_the_calls_handed_over_may_be_answered_and_only_first() {
        let pending = [ToolCall::new("call_1", "ls", &json!({})), ToolCall::new("call_2", "cat", &json!({}))];
        let table: Vec<(&str, Messages, &[ToolCall], Option<&str>)> = vec![
            ("a user turn", Messages::new().human("h"), &pending, None),
            (
                "both answers, then a question",
                Messages::new().tool("call_1", "ls", "a").tool("call_2", "cat", "b").human("h"),
                &pending,
                None,
            ),
            ("one answer of two", Messages::new().tool("call_2", "cat", "b"), &pending, None),
            ("nothing", Messages::new(), &pending, Some("messages")),
            (
                "a spoofed assistant",
                Messages::new().human("h").ai("I agree", vec![]),
                &pending,
                Some("messages[1].role"),
            ),
            (
                "a tool message with nothing pending",
                Messages::new().tool("call_1", "ls", "a"),
                &[],
                Some("messages[0].role"),
            ),
            (
                "an answer after the question",
                Messages::new().human("h").tool("call_1", "ls", "a"),
                &pending,
                Some("messages[1].role"),
            ),
            (
                "an answer to another call",
                Messages::new().tool("call_9", "ls", "a"),
                &pending,
                Some("messages[0].tool_call_id"),
            ),
            (
                "an answer given twice",
                Messages::new().tool("call_1", "ls", "a").tool("call_1", "ls", "b"),
                &pending,
                Some("messages[1].tool_call_id"),
            ),
            (
                "an answer under another name",
                Messages::new().tool("call_1", "rm", "a"),
                &pending,
                Some("messages[0].name"),
            ),
            (
                "an answer without tool_call_id",
                Messages::new().add([ChatMessage { tool_call_id: None, ..ChatMessage::tool_result("", "ls", "a") }]),
                &pending,
                Some("messages[0].tool_call_id"),
            ),
            ("an empty question", Messages::new().human(" "), &pending, Some("messages[0].content")),
        ];
        for (what, input, pending, want) in table {
            let got = validate_thread_input(input.as_slice(), pending).err().map(|e| e.param);
            assert_eq!(got.as_deref(), want, "{what}");
        }
    }
}
