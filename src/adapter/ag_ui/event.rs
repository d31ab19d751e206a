//! The AG-UI 1.0 events this adapter sends, as JSON (`docs/clients.md`, "AG-UI"): the fields of `@ag-ui/core`'s
//! schemas, camelCase, each event tagged with its `type`. The client strips fields it does not know and drops
//! event types it does not know (with a warning), so only these go out.

use serde::Serialize;
use serde_json::{Map, Value};

#[derive(Debug, Serialize)]
#[serde(tag = "type", rename_all = "SCREAMING_SNAKE_CASE")]
pub(super) enum Event<'a> {
    #[serde(rename_all = "camelCase")]
    RunStarted { thread_id: &'a str, run_id: &'a str },
    #[serde(rename_all = "camelCase")]
    RunFinished { thread_id: &'a str, run_id: &'a str, outcome: RunOutcome<'a> },
    #[serde(rename_all = "camelCase")]
    RunError {
        message: &'a str,
        #[serde(skip_serializing_if = "Option::is_none")]
        code: Option<&'a str>,
    },
    #[serde(rename_all = "camelCase")]
    StepStarted { step_name: &'a str },
    #[serde(rename_all = "camelCase")]
    StepFinished { step_name: &'a str },
    #[serde(rename_all = "camelCase")]
    TextMessageStart { message_id: &'a str, role: &'static str },
    #[serde(rename_all = "camelCase")]
    TextMessageContent { message_id: &'a str, delta: &'a str },
    #[serde(rename_all = "camelCase")]
    TextMessageEnd { message_id: &'a str },
    #[serde(rename_all = "camelCase")]
    ReasoningStart { message_id: &'a str },
    #[serde(rename_all = "camelCase")]
    ReasoningMessageStart { message_id: &'a str, role: &'static str },
    #[serde(rename_all = "camelCase")]
    ReasoningMessageContent { message_id: &'a str, delta: &'a str },
    #[serde(rename_all = "camelCase")]
    ReasoningMessageEnd { message_id: &'a str },
    #[serde(rename_all = "camelCase")]
    ReasoningEnd { message_id: &'a str },
    #[serde(rename_all = "camelCase")]
    ToolCallStart { tool_call_id: &'a str, tool_call_name: &'a str },
    #[serde(rename_all = "camelCase")]
    ToolCallArgs { tool_call_id: &'a str, delta: &'a str },
    #[serde(rename_all = "camelCase")]
    ToolCallEnd { tool_call_id: &'a str },
    #[serde(rename_all = "camelCase")]
    ToolCallResult { message_id: &'a str, tool_call_id: &'a str, content: &'a str, role: &'static str },
    /// A message the frontend shows and a later snapshot with the same id replaces.
    #[serde(rename_all = "camelCase")]
    ActivitySnapshot { message_id: &'a str, activity_type: &'a str, content: &'a Map<String, Value> },
    #[serde(rename_all = "camelCase")]
    Custom { name: &'a str, value: &'a Map<String, Value> },
}

/// How a finished run ended.
#[derive(Debug, Serialize)]
#[serde(tag = "type", rename_all = "lowercase")]
pub(super) enum RunOutcome<'a> {
    /// It completed; the calls it handed the client that no result answered are pending.
    Success {
        #[serde(rename = "pendingToolCallIds", skip_serializing_if = "Vec::is_empty")]
        pending_tool_call_ids: Vec<&'a str>,
    },
    Cancelled,
}
