//! [`OpenAiOptions`]: what the OpenAI adapters are told beyond the messages, with [`AgentTools`] and
//! [`ReasoningField`], the choices a client's flavour of the API needs.
//!
//! They sit in a file of their own, apart from `mod.rs`, so that the adapters, the Anthropic and Responses
//! adapters built on them, and `progress.rs` read them without importing the module that declares them.

/// What the OpenAI adapters need to know beyond the messages: fixed per stream, so output is deterministic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenAiOptions {
    /// The completion id, the same on every chunk (`chatcmpl-...`).
    pub id: String,
    /// Creation time in seconds since the Unix epoch, the same on every chunk.
    pub created: u64,
    /// The model name to report.
    pub model: String,
    /// Send the usage chunk (`stream_options.include_usage`) when usage is known.
    pub include_usage: bool,
    /// Which field carries reasoning.
    pub reasoning: ReasoningField,
    /// How the calls the agent runs itself appear.
    pub agent_tools: AgentTools,
}

impl OpenAiOptions {
    /// Options with the usage chunk off and reasoning in `reasoning_content`.
    pub fn new(id: impl Into<String>, created: u64, model: impl Into<String>) -> Self {
        OpenAiOptions {
            id: id.into(),
            created,
            model: model.into(),
            include_usage: false,
            reasoning: ReasoningField::default(),
            agent_tools: AgentTools::default(),
        }
    }
}

/// How the tool calls the agent runs itself (`server_side: true`) and their results reach an OpenAI client.
///
/// Never as `tool_calls`: a client's agent loop would run them again. `tool_calls` are only the calls handed
/// to the client, after which the stream ends with `finish_reason: "tool_calls"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AgentTools {
    /// As reasoning: `Calling <name> with <arguments>` as the arguments stream, then `<name> returned
    /// <result>` (or `<name> failed: <message>`).
    #[default]
    Reasoning,
    /// Not at all.
    Hidden,
}

/// The delta field reasoning goes in. Clients differ: DeepSeek-style clients read `reasoning_content`,
/// vLLM-, Ollama- and OpenRouter-style ones read `reasoning`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ReasoningField {
    /// `reasoning_content`.
    #[default]
    ReasoningContent,
    /// `reasoning`.
    Reasoning,
    /// Both, with the same text.
    Both,
}

impl ReasoningField {
    pub(super) fn split(self, text: &str) -> (Option<&str>, Option<&str>) {
        match self {
            ReasoningField::ReasoningContent => (Some(text), None),
            ReasoningField::Reasoning => (None, Some(text)),
            ReasoningField::Both => (Some(text), Some(text)),
        }
    }
}
