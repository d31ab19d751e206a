//! The JSON shapes of OpenAI's chat completion API that the adapters write, field for field.
//!
//! Field order follows OpenAI's own responses. Borrowed strings keep serialising a chunk free of copies.
//! `docs/clients.md` (its two "OpenAI chat" sections) lists what clients insist on; the notes below say
//! which rule each field serves.

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::output::{EndStatus, Outcome, Usage};

/// One `chat.completion.chunk`.
#[derive(Serialize)]
pub(crate) struct Chunk<'a> {
    pub(crate) id: &'a str,
    pub(crate) object: &'static str,
    /// Seconds: async-openai reads a `u32`.
    pub(crate) created: u64,
    pub(crate) model: &'a str,
    /// Empty (never absent or null) on the usage chunk.
    pub(crate) choices: &'a [ChunkChoice<'a>],
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) usage: Option<&'a Usage>,
}

/// The one choice of a chunk.
#[derive(Serialize)]
pub(crate) struct ChunkChoice<'a> {
    pub(crate) index: u32,
    pub(crate) delta: Delta<'a>,
    pub(crate) logprobs: Option<()>,
    /// `null` until the closing chunk; never `""`.
    pub(crate) finish_reason: Option<&'static str>,
}

/// A delta: each field only when it has something to say.
#[derive(Serialize, Default)]
pub(crate) struct Delta<'a> {
    /// Only in the first chunk: clients concatenate repeated roles.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) role: Option<&'static str>,
    /// `Some(None)` writes `"content": null`, as OpenAI does beside a tool call's first delta.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) content: Option<Option<&'a str>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) reasoning_content: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) reasoning: Option<&'a str>,
    /// One entry per chunk: two entries with one index split the arguments in openai-python.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) tool_calls: Option<[ToolCallDelta<'a>; 1]>,
}

/// A tool call's delta: `index` always; `id`, `type` and `name` only in its first delta.
#[derive(Serialize)]
pub(crate) struct ToolCallDelta<'a> {
    pub(crate) index: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) id: Option<&'a str>,
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    pub(crate) kind: Option<&'static str>,
    pub(crate) function: FunctionDelta<'a>,
}

/// A tool call's function delta; the first carries `arguments: ""`.
#[derive(Serialize)]
pub(crate) struct FunctionDelta<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) name: Option<&'a str>,
    pub(crate) arguments: &'a str,
}

/// A non-streaming `chat.completion`.
#[derive(Serialize)]
pub(crate) struct Completion<'a> {
    pub(crate) id: &'a str,
    pub(crate) object: &'static str,
    pub(crate) created: u64,
    pub(crate) model: &'a str,
    pub(crate) choices: [CompletionChoice<'a>; 1],
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) usage: Option<&'a Usage>,
}

/// Its one choice; `finish_reason` is required here.
#[derive(Serialize)]
pub(crate) struct CompletionChoice<'a> {
    pub(crate) index: u32,
    pub(crate) message: ResponseMessage<'a>,
    pub(crate) logprobs: Option<()>,
    pub(crate) finish_reason: &'static str,
}

/// The assistant message of a completion.
#[derive(Serialize)]
pub(crate) struct ResponseMessage<'a> {
    pub(crate) role: &'static str,
    /// `null` when the reply is only tool calls.
    pub(crate) content: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) reasoning_content: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) reasoning: Option<&'a str>,
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    pub(crate) tool_calls: &'a [ToolCall<'a>],
    pub(crate) refusal: Option<()>,
}

/// A complete tool call.
#[derive(Serialize)]
pub(crate) struct ToolCall<'a> {
    pub(crate) id: &'a str,
    #[serde(rename = "type")]
    pub(crate) kind: &'static str,
    pub(crate) function: Function<'a>,
}

/// A complete function call.
#[derive(Serialize)]
pub(crate) struct Function<'a> {
    pub(crate) name: &'a str,
    pub(crate) arguments: &'a str,
}

/// OpenAI's error object: the body of `{"error": ...}`, in a stream or as a response.
///
/// `code` stays a string or null (async-openai reads `Option<String>`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct ApiError {
    /// For a person.
    pub message: String,
    /// The error's class, e.g. `invalid_request_error`, `agent_error`.
    #[serde(rename = "type")]
    pub kind: String,
    /// The request field at fault, if any.
    pub param: Option<String>,
    /// A stable code for programs.
    pub code: Option<String>,
    /// The stream's last sequence, on a refused append that was to follow another
    /// (`sequence_conflict`, `idempotency_key_reused`): what the producer's next append follows.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_sequence: Option<u64>,
}

/// `{"error": {...}}`: every HTTP error's body, and an OpenAI-format stream's error event.
#[derive(Serialize, schemars::JsonSchema)]
#[schemars(rename = "ErrorEnvelope")]
pub(crate) struct Envelope<'a> {
    pub(crate) error: &'a ApiError,
}

impl ApiError {
    /// An error an agent reported (an `error` message, or a stream that ended with status `error`).
    pub fn agent(message: &str, code: Option<&str>) -> Self {
        let message = if message.is_empty() { "the agent reported an error" } else { message };
        ApiError {
            message: message.to_owned(),
            kind: "agent_error".into(),
            param: None,
            code: code.map(str::to_owned),
            last_sequence: None,
        }
    }

    /// The error a stream's outcome stands for, if it did not complete.
    pub fn for_outcome(outcome: &Outcome) -> Option<Self> {
        match outcome.status {
            EndStatus::Completed => None,
            EndStatus::Cancelled => Some(ApiError {
                message: "the stream was cancelled".into(),
                kind: "cancelled".into(),
                param: None,
                code: Some("cancelled".into()),
                last_sequence: None,
            }),
            EndStatus::Error => {
                let error = outcome.error.as_ref();
                Some(ApiError::agent(error.map_or("", |e| e.message.as_str()), error.and_then(|e| e.code.as_deref())))
            }
        }
    }

    /// `{"error": {...}}` as compact JSON.
    pub fn to_json(&self) -> Bytes {
        Bytes::from(serde_json::to_vec(&Envelope { error: self }).unwrap_or_default())
    }

    pub(crate) fn envelope(&self) -> impl Serialize + '_ {
        Envelope { error: self }
    }
}
