//! [`Conversation`]: what an agent receives: a validated conversation, the model it is for, the request's
//! options, and the thread it belongs to.
//!
//! An agent never sees the request as parsed: whatever reaches it has passed [`super::validate`], so it can
//! rely on every tool message answering an earlier call and every call having an id and a name, and it can
//! project the messages to any provider. The fields are private so that nothing builds an unchecked one;
//! [`Conversation::new`] and [`Conversation::from_request`] are the ways in. The options are the request's
//! other fields as sent (`tools`, `temperature`, `metadata`, ...); what only the transport uses (`stream`,
//! `stream_options`) is not among them.

use serde_json::{Map, Value};

use super::messages::Messages;
use super::request::{ChatRequest, Role};
use super::validate::{ConversationError, validate};

/// A validated conversation for one model.
///
/// ```
/// use agentmux::conversation::{Conversation, Messages, ToolCall};
/// use serde_json::json;
///
/// let chain = Messages::new().human("list /").ai("", vec![ToolCall::new("call_1", "ls", &json!({"path": "/"}))]);
/// let conversation = Conversation::new("echo", chain.clone()).unwrap();
/// assert_eq!(conversation.messages().len(), 2);
///
/// // A tool message that answers no call is refused, naming the field.
/// let bad = chain.tool("call_9", "ls", "[]");
/// assert_eq!(Conversation::new("echo", bad).unwrap_err().param, "messages[2].tool_call_id");
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct Conversation {
    model: String,
    messages: Messages,
    options: Map<String, Value>,
    thread: Option<String>,
}

impl Conversation {
    /// Checks `messages` (one or more, well formed) and makes the conversation for `model`.
    pub fn new(model: impl Into<String>, messages: impl Into<Messages>) -> Result<Self, ConversationError> {
        let messages = messages.into();
        if messages.is_empty() {
            return Err(ConversationError::empty());
        }
        validate(messages.as_slice())?;
        Ok(Conversation { model: model.into(), messages, options: Map::new(), thread: None })
    }

    /// The conversation a chat request carries, with its other fields as options.
    ///
    /// ```
    /// use agentmux::conversation::{ChatRequest, Conversation};
    ///
    /// let request: ChatRequest = serde_json::from_str(
    ///     r#"{"model": "echo", "stream": true, "temperature": 0.2, "messages": [{"role": "user", "content": "hi"}]}"#,
    /// ).unwrap();
    /// let conversation = Conversation::from_request(request).unwrap();
    /// assert_eq!(conversation.option("temperature"), Some(&serde_json::json!(0.2)));
    /// assert_eq!(conversation.option("stream"), None);
    /// ```
    pub fn from_request(request: ChatRequest) -> Result<Self, ConversationError> {
        Ok(Conversation::new(request.model, request.messages)?.with_options(request.extra))
    }

    /// A conversation of one user message, for trying an agent out.
    ///
    /// ```
    /// let conversation = agentmux::conversation::Conversation::user("echo", "hello there");
    /// assert_eq!(conversation.last_user_text().as_deref(), Some("hello there"));
    /// ```
    pub fn user(model: impl Into<String>, text: impl Into<String>) -> Self {
        Conversation { model: model.into(), messages: Messages::new().human(text), options: Map::new(), thread: None }
    }

    /// Sets the options (the request's other fields).
    pub fn with_options(mut self, options: Map<String, Value>) -> Self {
        self.options = options;
        self
    }

    /// Names the server-side thread this conversation continues.
    pub fn with_thread(mut self, thread: impl Into<String>) -> Self {
        self.thread = Some(thread.into());
        self
    }

    /// The same conversation for another model: what a route hands the agent it chose (`gpt-4o` for
    /// `openai/gpt-4o`, an alias's target).
    pub(crate) fn for_model(mut self, model: impl Into<String>) -> Self {
        self.model = model.into();
        self
    }

    /// The agent it is for.
    pub fn model(&self) -> &str {
        &self.model
    }

    /// The messages, oldest first: for a thread, its stored history followed by the new input.
    pub fn messages(&self) -> &Messages {
        &self.messages
    }

    /// The request's other fields, as sent.
    pub fn options(&self) -> &Map<String, Value> {
        &self.options
    }

    /// One option.
    pub fn option(&self, name: &str) -> Option<&Value> {
        self.options.get(name)
    }

    /// The server-side thread, when the conversation continues one.
    pub fn thread(&self) -> Option<&str> {
        self.thread.as_deref()
    }

    /// The text of the last user message, if any.
    pub fn last_user_text(&self) -> Option<String> {
        self.messages.as_slice().iter().rev().find(|m| m.role == Role::User).map(|m| m.text())
    }

    /// How many words the messages hold: the prompt size the built-in agents report, having no tokenizer.
    pub fn words(&self) -> usize {
        self.messages
            .as_slice()
            .iter()
            .filter_map(|m| m.content.as_ref())
            .map(|c| c.text().split_whitespace().count())
            .sum()
    }
}
