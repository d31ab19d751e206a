//! The chunks of the AI SDK's UI message stream, as JSON: only the fields every supported major version of
//! the `ai` package accepts (`docs/clients.md`, "UI message stream"). The client validates each chunk against a union of
//! schemas and fails on a type it does not know, so nothing here is sent that an older client would refuse:
//! no `abort.reason`, no approval parts, no `finishReason` beyond the values all versions share.

use serde::Serialize;
use serde_json::{Map, Value};

/// One chunk of a fixed type.
#[derive(Debug, Serialize)]
#[serde(tag = "type", rename_all = "kebab-case")]
pub(super) enum Part<'a> {
    /// The assistant message begins; its id is what a resumed stream repeats.
    Start {
        #[serde(rename = "messageId")]
        message_id: &'a str,
    },
    StartStep,
    FinishStep,
    TextStart {
        id: &'a str,
    },
    TextDelta {
        id: &'a str,
        delta: &'a str,
    },
    TextEnd {
        id: &'a str,
        /// `{"agentmux": {"superseded": true}}` on a part a correction replaced (see [`superseded`]).
        #[serde(rename = "providerMetadata", skip_serializing_if = "Option::is_none")]
        provider_metadata: Option<Value>,
    },
    ReasoningStart {
        id: &'a str,
    },
    ReasoningDelta {
        id: &'a str,
        delta: &'a str,
    },
    ReasoningEnd {
        id: &'a str,
        /// As for [`Part::TextEnd`].
        #[serde(rename = "providerMetadata", skip_serializing_if = "Option::is_none")]
        provider_metadata: Option<Value>,
    },
    #[serde(rename_all = "camelCase")]
    ToolInputStart {
        tool_call_id: &'a str,
        tool_name: &'a str,
        #[serde(skip_serializing_if = "is_false")]
        provider_executed: bool,
        dynamic: bool,
    },
    #[serde(rename_all = "camelCase")]
    ToolInputDelta {
        tool_call_id: &'a str,
        input_text_delta: &'a str,
    },
    #[serde(rename_all = "camelCase")]
    ToolInputAvailable {
        tool_call_id: &'a str,
        tool_name: &'a str,
        input: &'a Value,
        #[serde(skip_serializing_if = "is_false")]
        provider_executed: bool,
        dynamic: bool,
    },
    /// Arguments that are not JSON: the call as it came, and why it cannot run.
    #[serde(rename_all = "camelCase")]
    ToolInputError {
        tool_call_id: &'a str,
        tool_name: &'a str,
        input: &'a str,
        #[serde(skip_serializing_if = "is_false")]
        provider_executed: bool,
        dynamic: bool,
        error_text: &'a str,
    },
    #[serde(rename_all = "camelCase")]
    ToolOutputAvailable {
        tool_call_id: &'a str,
        output: &'a Value,
        #[serde(skip_serializing_if = "is_false")]
        provider_executed: bool,
        dynamic: bool,
    },
    #[serde(rename_all = "camelCase")]
    ToolOutputError {
        tool_call_id: &'a str,
        error_text: &'a str,
        #[serde(skip_serializing_if = "is_false")]
        provider_executed: bool,
        dynamic: bool,
    },
    #[serde(rename_all = "camelCase")]
    File {
        url: &'a str,
        media_type: &'a str,
    },
    #[serde(rename_all = "camelCase")]
    Error {
        error_text: &'a str,
    },
    #[serde(rename_all = "camelCase")]
    Finish {
        finish_reason: &'static str,
    },
    Abort,
}

/// A `data-<name>` chunk: its type is made from the name, so it cannot be a variant of [`Part`].
#[derive(Debug, Serialize)]
pub(super) struct DataPart<'a> {
    #[serde(rename = "type")]
    pub(super) kind: &'a str,
    /// A later chunk with the same type and id replaces this one in the client's message.
    pub(super) id: &'a str,
    pub(super) data: &'a Map<String, Value>,
    /// Reaches the client's `onData` only, not the stored message.
    #[serde(skip_serializing_if = "is_false")]
    pub(super) transient: bool,
}

fn is_false(b: &bool) -> bool {
    !*b
}

/// The `providerMetadata` of a part's end: for a part whose text a correction took back, a mark the page can
/// hide it by (`part.providerMetadata?.agentmux?.superseded`); the client keeps it on the part.
pub(super) fn superseded(superseded: bool) -> Option<Value> {
    superseded.then(|| serde_json::json!({"agentmux": {"superseded": true}}))
}
