//! The provider-neutral transcript (`docs/design.md`, "Transcript"): what a conversation is without any provider's words.
//!
//! A [`TranscriptMessage`] is one of three kinds: `parts` (text and URL-only media), `option_call` (a policy
//! chose an option, with arguments) and `option_result` (what running it gave, or a structured error), paired
//! with its call by `invocation_id`. Who made it is a `policy`, not an overloaded actor; how a provider should
//! see it is only a hint (`role_hint_for_llm`). `step_num` groups the messages of one decision cycle.
//!
//! [`MessageBuilder`] keeps the step (`next_step` advances it, `continue_step` stays in it), makes each call's
//! `invocation_id`, and produces one `parts` message; [`OptionResultBuilder::response_to`] answers a call,
//! copying its id, name and step, and refuses to be pointed at another. [`to_openai`] projects a transcript to
//! chat messages, sending only complete call and result pairs.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::{ChatMessage, Content, Role, ToolCall};

/// How a provider adapter should present a message; a hint, never semantics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RoleHint {
    /// As the user's.
    User,
    /// As the model's.
    Assistant,
    /// As a tool's.
    Tool,
    /// As instructions.
    System,
}

/// What a media part is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Modality {
    /// A picture.
    Image,
    /// Sound.
    Audio,
    /// A video.
    Video,
    /// A document (PDF, text, ...).
    Document,
}

/// A part of a `parts` message.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum Part {
    /// Natural language.
    Text {
        /// The text.
        text: String,
    },
    /// Media, by URL only.
    Media {
        /// What it is.
        modality: Modality,
        /// Where it is.
        url: String,
        /// Its MIME type, best effort.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        mime: Option<String>,
        /// A label for prompts; no meaning.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        prompt_hint: Option<String>,
        /// An id for correlation and replay.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        id: Option<String>,
    },
}

/// A policy's choice of an option.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OptionCall {
    /// Unique per call; its result repeats it.
    pub invocation_id: String,
    /// The option chosen.
    pub option_name: String,
    /// Its arguments.
    pub arguments: Map<String, Value>,
}

/// What running an option gave.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OptionResult {
    /// The call it answers.
    pub invocation_id: String,
    /// The option that ran.
    pub option_name: String,
    /// The result (null on an error).
    pub result: Value,
    /// True when it failed.
    #[serde(default)]
    pub is_error: bool,
    /// The kind of failure.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_type: Option<String>,
    /// The failure, for a person.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_message: Option<String>,
    /// Whether trying again may succeed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retryable: Option<bool>,
}

/// The three kinds of message.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Body {
    /// Text and media.
    Parts {
        /// The parts, in order.
        parts: Vec<Part>,
    },
    /// An option chosen.
    OptionCall(OptionCall),
    /// An option's result.
    OptionResult(OptionResult),
}

/// One message of the transcript.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TranscriptMessage {
    /// The policy that made it: for a call the caller, for a result the option that ran.
    pub policy: String,
    /// How a provider should present it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role_hint_for_llm: Option<RoleHint>,
    /// The decision cycle it belongs to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step_num: Option<u64>,
    /// What it says.
    #[serde(flatten)]
    pub body: Body,
}

/// Why a builder refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TranscriptError {
    /// A result can only answer an `option_call`.
    #[error("a result can only answer an option_call")]
    NotACall,
    /// The result was pointed at another call than the one it answers.
    #[error("this result answers {expected:?}, not {given:?}")]
    Mismatch {
        /// What the call says.
        expected: String,
        /// What was given.
        given: String,
    },
}

/// Builds one `parts` message, and the option calls made in its step.
///
/// ```
/// use agentmux::conversation::{MessageBuilder, OptionResultBuilder};
/// use serde_json::json;
///
/// let mut builder = MessageBuilder::new("planner").next_step(None);
/// let call = builder.add_option_call("search_web", json!({"query": "hobbit movie"}));
/// let result = OptionResultBuilder::response_to(&call).unwrap().success(json!(["a", "b"]));
/// builder.add_image("girl wearing a hat", "https://example.com/1.png");
/// builder.add_text("Take the dress from the second image");
/// let message = builder.to_message();
/// assert_eq!((call.step_num, result.step_num, message.step_num), (Some(1), Some(1), Some(1)));
/// ```
#[derive(Debug, Clone)]
pub struct MessageBuilder {
    policy: String,
    role_hint: Option<RoleHint>,
    step_num: Option<u64>,
    parts: Vec<Part>,
    calls: u64,
    last_option_call: Option<TranscriptMessage>,
}

impl MessageBuilder {
    /// A builder for `policy`, outside any step.
    pub fn new(policy: impl Into<String>) -> Self {
        MessageBuilder {
            policy: policy.into(),
            role_hint: None,
            step_num: None,
            parts: Vec::new(),
            calls: 0,
            last_option_call: None,
        }
    }

    /// In the step after `last` (its `step_num` + 1; the first step, 1, when there is none).
    #[must_use]
    pub fn next_step(mut self, last: Option<&TranscriptMessage>) -> Self {
        self.step_num = Some(last.and_then(|m| m.step_num).map_or(1, |step| step + 1));
        self
    }

    /// In the same step as `last`.
    #[must_use]
    pub fn continue_step(mut self, last: &TranscriptMessage) -> Self {
        self.step_num = last.step_num;
        self
    }

    /// With a hint for provider adapters.
    #[must_use]
    pub fn role_hint(mut self, hint: RoleHint) -> Self {
        self.role_hint = Some(hint);
        self
    }

    /// Adds text.
    pub fn add_text(&mut self, text: impl Into<String>) -> &mut Self {
        self.parts.push(Part::Text { text: text.into() });
        self
    }

    /// Adds an image by URL, with a label for prompts.
    pub fn add_image(&mut self, prompt_hint: impl Into<String>, url: impl Into<String>) -> &mut Self {
        self.add_media(Modality::Image, url, None, Some(prompt_hint.into()))
    }

    /// Adds media by URL.
    pub fn add_media(
        &mut self,
        modality: Modality,
        url: impl Into<String>,
        mime: Option<String>,
        prompt_hint: Option<String>,
    ) -> &mut Self {
        let id = Some(format!("media-{}", self.parts.len() + 1));
        self.parts.push(Part::Media { modality, url: url.into(), mime, prompt_hint, id });
        self
    }

    /// An `option_call` in this step, with a new `invocation_id`; it is also [`Self::last_option_call`].
    pub fn add_option_call(&mut self, option_name: impl Into<String>, arguments: Value) -> TranscriptMessage {
        self.calls += 1;
        let arguments = match arguments {
            Value::Object(map) => map,
            Value::Null => Map::new(),
            other => Map::from_iter([("value".to_owned(), other)]),
        };
        let call = TranscriptMessage {
            policy: self.policy.clone(),
            role_hint_for_llm: Some(RoleHint::Assistant),
            step_num: self.step_num,
            body: Body::OptionCall(OptionCall {
                invocation_id: invocation_id(),
                option_name: option_name.into(),
                arguments,
            }),
        };
        self.last_option_call = Some(call.clone());
        call
    }

    /// The last call made with [`Self::add_option_call`].
    pub fn last_option_call(&self) -> Option<&TranscriptMessage> {
        self.last_option_call.as_ref()
    }

    /// The `parts` message.
    pub fn to_message(&self) -> TranscriptMessage {
        TranscriptMessage {
            policy: self.policy.clone(),
            role_hint_for_llm: self.role_hint,
            step_num: self.step_num,
            body: Body::Parts { parts: self.parts.clone() },
        }
    }
}

/// A unique invocation id: `call_` and 24 random hex digits.
fn invocation_id() -> String {
    use rand::RngCore;
    let mut bytes = [0u8; 12];
    rand::rng().fill_bytes(&mut bytes);
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    format!("call_{hex}")
}

/// Builds the result of one call: its id, option name and step are the call's.
#[derive(Debug, Clone)]
pub struct OptionResultBuilder {
    invocation_id: String,
    option_name: String,
    step_num: Option<u64>,
    policy: String,
}

impl OptionResultBuilder {
    /// A builder for the result of `call`; refused when it is not an `option_call`.
    pub fn response_to(call: &TranscriptMessage) -> Result<Self, TranscriptError> {
        let Body::OptionCall(option) = &call.body else { return Err(TranscriptError::NotACall) };
        Ok(OptionResultBuilder {
            invocation_id: option.invocation_id.clone(),
            option_name: option.option_name.clone(),
            step_num: call.step_num,
            policy: option.option_name.clone(),
        })
    }

    /// Checks the invocation id a caller expects; refused when it is not the call's.
    pub fn invocation_id(self, id: &str) -> Result<Self, TranscriptError> {
        if id != self.invocation_id {
            return Err(TranscriptError::Mismatch { expected: self.invocation_id, given: id.to_owned() });
        }
        Ok(self)
    }

    /// Checks the option name a caller expects; refused when it is not the call's.
    pub fn option_name(self, name: &str) -> Result<Self, TranscriptError> {
        if name != self.option_name {
            return Err(TranscriptError::Mismatch { expected: self.option_name, given: name.to_owned() });
        }
        Ok(self)
    }

    /// The result of a call that succeeded.
    pub fn success(self, result: Value) -> TranscriptMessage {
        self.finish(OptionResult {
            invocation_id: self.invocation_id.clone(),
            option_name: self.option_name.clone(),
            result,
            is_error: false,
            error_type: None,
            error_message: None,
            retryable: None,
        })
    }

    /// The result of a call that failed.
    pub fn error(
        self,
        error_type: impl Into<String>,
        message: impl Into<String>,
        retryable: bool,
    ) -> TranscriptMessage {
        self.finish(OptionResult {
            invocation_id: self.invocation_id.clone(),
            option_name: self.option_name.clone(),
            result: Value::Null,
            is_error: true,
            error_type: Some(error_type.into()),
            error_message: Some(message.into()),
            retryable: Some(retryable),
        })
    }

    fn finish(&self, result: OptionResult) -> TranscriptMessage {
        TranscriptMessage {
            policy: self.policy.clone(),
            role_hint_for_llm: Some(RoleHint::Tool),
            step_num: self.step_num,
            body: Body::OptionResult(result),
        }
    }
}

/// The transcript as OpenAI chat messages: `parts` by their role hint (user by default; text parts as text,
/// images as `image_url` parts, other media as text naming the URL), and each `option_call` with its
/// `option_result` as an assistant tool call and a tool message. A call with no result is left out, and so is
/// a result with no call, so a provider never sees half a pair.
pub fn to_openai(transcript: &[TranscriptMessage]) -> Vec<ChatMessage> {
    let answered =
        |id: &str| transcript.iter().any(|m| matches!(&m.body, Body::OptionResult(r) if r.invocation_id == id));
    let called = |id: &str| transcript.iter().any(|m| matches!(&m.body, Body::OptionCall(c) if c.invocation_id == id));
    let mut out = Vec::new();
    for message in transcript {
        match &message.body {
            Body::Parts { parts } => {
                let role = match message.role_hint_for_llm {
                    Some(RoleHint::Assistant) => Role::Assistant,
                    Some(RoleHint::System) => Role::System,
                    _ => Role::User,
                };
                out.push(ChatMessage { content: Some(content(parts)), ..ChatMessage::new(role, "") });
            }
            Body::OptionCall(call) if answered(&call.invocation_id) => {
                let arguments = Value::Object(call.arguments.clone());
                out.push(ChatMessage::ai("", vec![ToolCall::new(&call.invocation_id, &call.option_name, &arguments)]));
            }
            Body::OptionResult(result) if called(&result.invocation_id) => {
                let output = if result.is_error {
                    serde_json::json!({
                        "error": result.error_type, "message": result.error_message, "retryable": result.retryable
                    })
                    .to_string()
                } else {
                    match &result.result {
                        Value::String(text) => text.clone(),
                        other => other.to_string(),
                    }
                };
                out.push(ChatMessage::tool_result(&result.invocation_id, &result.option_name, output));
            }
            Body::OptionCall(_) | Body::OptionResult(_) => {}
        }
    }
    out
}

/// Chat messages as a transcript: content as `parts` (text, and `image_url` parts as image media; a role's
/// name as its policy and hint), each assistant tool call as an `option_call` (its id the invocation id),
/// each tool message as an `option_result` (named by its call when it gives no name).
pub fn from_chat(messages: &[ChatMessage]) -> Vec<TranscriptMessage> {
    let mut out = Vec::new();
    for message in messages {
        let (policy, hint) = match message.role {
            Role::User => ("user", RoleHint::User),
            Role::System => ("system", RoleHint::System),
            Role::Developer => ("developer", RoleHint::System),
            Role::Assistant => ("assistant", RoleHint::Assistant),
            Role::Tool => ("tool", RoleHint::Tool),
        };
        if message.role == Role::Tool {
            let invocation_id = message.tool_call_id.clone().unwrap_or_default();
            let called = out.iter().find_map(|m: &TranscriptMessage| match &m.body {
                Body::OptionCall(call) if call.invocation_id == invocation_id => Some(call.option_name.clone()),
                _ => None,
            });
            let option_name = message.name.clone().or(called).unwrap_or_default();
            out.push(TranscriptMessage {
                policy: option_name.clone(),
                role_hint_for_llm: Some(RoleHint::Tool),
                step_num: None,
                body: Body::OptionResult(OptionResult {
                    invocation_id,
                    option_name,
                    result: Value::String(message.text()),
                    is_error: false,
                    error_type: None,
                    error_message: None,
                    retryable: None,
                }),
            });
            continue;
        }
        let parts = parts_of(message.content.as_ref());
        if !parts.is_empty() {
            out.push(TranscriptMessage {
                policy: policy.into(),
                role_hint_for_llm: Some(hint),
                step_num: None,
                body: Body::Parts { parts },
            });
        }
        for call in message.calls() {
            let arguments = match call.arguments() {
                Ok(Value::Object(map)) => map,
                Ok(other) => Map::from_iter([("value".to_owned(), other)]),
                Err(_) => Map::from_iter([("raw".to_owned(), Value::String(call.function.arguments.clone()))]),
            };
            out.push(TranscriptMessage {
                policy: policy.into(),
                role_hint_for_llm: Some(RoleHint::Assistant),
                step_num: None,
                body: Body::OptionCall(OptionCall {
                    invocation_id: call.id.clone(),
                    option_name: call.function.name.clone(),
                    arguments,
                }),
            });
        }
    }
    out
}

fn parts_of(content: Option<&Content>) -> Vec<Part> {
    match content {
        None => Vec::new(),
        Some(Content::Text(text)) if text.is_empty() => Vec::new(),
        Some(Content::Text(text)) => vec![Part::Text { text: text.clone() }],
        Some(Content::Parts(parts)) => parts
            .iter()
            .filter_map(|part| match part.get("type").and_then(Value::as_str) {
                Some("text") => part.get("text").and_then(Value::as_str).map(|text| Part::Text { text: text.into() }),
                Some("image_url") => part.pointer("/image_url/url").and_then(Value::as_str).map(|url| Part::Media {
                    modality: Modality::Image,
                    url: url.into(),
                    mime: None,
                    prompt_hint: None,
                    id: None,
                }),
                _ => None,
            })
            .collect(),
    }
}

fn content(parts: &[Part]) -> Content {
    if let [Part::Text { text }] = parts {
        return Content::Text(text.clone());
    }
    Content::Parts(
        parts
            .iter()
            .map(|part| match part {
                Part::Text { text } => serde_json::json!({ "type": "text", "text": text }),
                Part::Media { modality: Modality::Image, url, .. } => {
                    serde_json::json!({ "type": "image_url", "image_url": { "url": url } })
                }
                Part::Media { modality, url, prompt_hint, .. } => {
                    let label = prompt_hint.as_deref().unwrap_or("");
                    let kind = serde_json::to_value(modality).unwrap_or_default();
                    serde_json::json!({ "type": "text", "text": format!("[{} {label}: {url}]", kind.as_str().unwrap_or("media")) })
                }
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn steps_advance_and_continue() {
        let first = MessageBuilder::new("planner").next_step(None).to_message();
        assert_eq!(first.step_num, Some(1));
        let second = MessageBuilder::new("planner").next_step(Some(&first)).to_message();
        assert_eq!(second.step_num, Some(2));
        let same = MessageBuilder::new("critic").continue_step(&second).to_message();
        assert_eq!(same.step_num, Some(2));
        assert_eq!(MessageBuilder::new("p").to_message().step_num, None);
    }

    #[test]
    fn results_pair_with_their_call_and_refuse_another() {
        let mut builder = MessageBuilder::new("planner").next_step(None);
        let one = builder.add_option_call("search_web", json!({"query": "hobbit"}));
        let two = builder.add_option_call("search_web", json!({"query": "dress"}));
        let (Body::OptionCall(a), Body::OptionCall(b)) = (&one.body, &two.body) else { panic!("calls") };
        assert_ne!(a.invocation_id, b.invocation_id, "each call its own id");
        assert_eq!(builder.last_option_call(), Some(&two));
        let result = OptionResultBuilder::response_to(&one).unwrap().success(json!(["x"]));
        let Body::OptionResult(r) = &result.body else { panic!("a result") };
        assert_eq!(
            (r.invocation_id.as_str(), r.option_name.as_str(), result.step_num),
            (a.invocation_id.as_str(), "search_web", Some(1))
        );
        assert_eq!(result.policy, "search_web", "a result's policy is the option that ran");
        let wrong_id = OptionResultBuilder::response_to(&one).unwrap().invocation_id(&b.invocation_id);
        assert!(matches!(wrong_id, Err(TranscriptError::Mismatch { .. })));
        let wrong_name = OptionResultBuilder::response_to(&one).unwrap().option_name("rm");
        assert!(matches!(wrong_name, Err(TranscriptError::Mismatch { .. })));
        assert_eq!(OptionResultBuilder::response_to(&builder.to_message()).err(), Some(TranscriptError::NotACall));
        let failed = OptionResultBuilder::response_to(&two).unwrap().error("timeout", "took too long", true);
        let Body::OptionResult(f) = &failed.body else { panic!("a result") };
        assert!(f.is_error && f.retryable == Some(true) && f.error_type.as_deref() == Some("timeout"));
    }

    #[test]
    fn the_openai_projection_sends_only_complete_pairs() {
        let mut builder = MessageBuilder::new("user").next_step(None).role_hint(RoleHint::User);
        builder.add_image("a hat", "https://example.com/1.png").add_text("what is this?");
        let question = builder.to_message();
        let mut planner = MessageBuilder::new("planner").continue_step(&question);
        let answered = planner.add_option_call("describe", json!({"image": 1}));
        let unanswered = planner.add_option_call("search_web", json!({"query": "hat"}));
        let result = OptionResultBuilder::response_to(&answered).unwrap().success(json!("a red hat"));
        let chat = to_openai(&[question, answered, unanswered, result]);
        assert_eq!(chat.len(), 3, "the unanswered call is left out: {chat:?}");
        assert_eq!(chat[0].role, Role::User);
        assert!(matches!(&chat[0].content, Some(Content::Parts(parts)) if parts.len() == 2));
        assert_eq!(chat[1].calls()[0].name(), "describe");
        assert_eq!((chat[2].role, chat[2].text().as_str()), (Role::Tool, "a red hat"));
        assert!(super::super::validate(&chat).is_ok(), "the projection is a well-formed conversation");
    }

    #[test]
    fn chat_messages_go_there_and_back() {
        let chat = crate::conversation::Messages::new()
            .system("be brief")
            .human("what is in /?")
            .ai("", vec![ToolCall::new("call_1", "ls", &json!({"path": "/"}))])
            .tool("call_1", "ls", "etc usr")
            .ai("etc and usr", vec![])
            .into_vec();
        let transcript = from_chat(&chat);
        assert_eq!(transcript.len(), 5);
        let Body::OptionResult(result) = &transcript[3].body else { panic!("a result") };
        assert_eq!((result.invocation_id.as_str(), result.option_name.as_str()), ("call_1", "ls"));
        let back = to_openai(&transcript);
        assert_eq!(back.iter().map(|m| m.role).collect::<Vec<_>>(), chat.iter().map(|m| m.role).collect::<Vec<_>>());
        assert_eq!(back[2].calls()[0].arguments().ok(), Some(json!({"path": "/"})));
        assert_eq!(back[4].text(), "etc and usr");
    }
}
