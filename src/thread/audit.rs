//! [`AuditEntry`]: one line of a thread's audit log (`docs/design.md`, "Audit and replay"), and the [`Decision`] it records.
//!
//! The thread keeps nothing but these entries: its history is the messages of the entries whose decision
//! belongs to the conversation ([`Decision::in_history`]), in order, so the history and the audit log can never
//! disagree. Entries that are not history (a rejected input, a run's end) carry no message or one that was
//! refused, and the metadata of why.

use std::sync::Arc;
use std::time::SystemTime;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::conversation::{ChatMessage, Role};

/// What an entry records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Decision {
    /// A user message the client sent.
    UserInput,
    /// A system or developer message the client sent.
    SystemContext,
    /// Assistant text before more steps of the same run (it called tools later).
    Planning,
    /// An assistant message that calls tools.
    ToolCall,
    /// A tool's result: run by the agent, or by the client for a call the run handed over.
    ToolResult,
    /// The assistant's last text of a run.
    Answer,
    /// A run ended: its status, outcome, usage and duration. No message.
    RunEnd,
    /// Input the service refused: the message at fault, and why. Not part of the history.
    Rejected,
    /// A client that sends its whole history with every turn went back to before the thread's last turns (a
    /// regenerate, or an edit of an earlier message): the history goes on from its first `audit.kept`
    /// messages, and the later ones stay in the log but leave the history. No message.
    Rewind,
}

impl Decision {
    /// True when the entry's message is part of the conversation the next run sees.
    pub fn in_history(self) -> bool {
        !matches!(self, Decision::RunEnd | Decision::Rejected | Decision::Rewind)
    }

    /// The decision for a message the client sent.
    pub(crate) fn for_input(message: &ChatMessage) -> Decision {
        match message.role {
            Role::User => Decision::UserInput,
            Role::Tool => Decision::ToolResult,
            Role::Assistant => Decision::Planning,
            Role::System | Role::Developer => Decision::SystemContext,
        }
    }
}

/// One entry: `{id, timestamp, stream_id, message, decision, audit}`.
///
/// `message` is the chat message (`null` for a run's end); `audit` holds the metadata (model, sizes,
/// durations, the error).
// The message is shared, not owned: a replay's copy of an entry, a read of the thread and the thread itself
// hold the one message (`docs/design.md`, "Reads share what is kept").
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct AuditEntry {
    /// A UUID.
    pub id: String,
    /// When it was recorded, RFC 3339 with milliseconds, UTC.
    pub timestamp: String,
    /// The stream of the run it belongs to; `null` for a rejected input.
    pub stream_id: Option<String>,
    /// The message.
    pub message: Option<Arc<ChatMessage>>,
    /// What it records.
    pub decision: Decision,
    /// Metadata.
    pub audit: Map<String, Value>,
}

impl AuditEntry {
    /// A new entry, stamped now.
    pub(crate) fn new(
        stream_id: Option<&str>,
        message: Option<Arc<ChatMessage>>,
        decision: Decision,
        audit: Map<String, Value>,
    ) -> Self {
        AuditEntry {
            id: uuid::Uuid::new_v4().to_string(),
            timestamp: humantime::format_rfc3339_millis(SystemTime::now()).to_string(),
            stream_id: stream_id.map(str::to_owned),
            message,
            decision,
            audit,
        }
    }

    /// The message, when it belongs to the conversation.
    pub(crate) fn history(&self) -> Option<&Arc<ChatMessage>> {
        self.message.as_ref().filter(|_| self.decision.in_history())
    }

    /// The size of its message as its `audit.bytes` says (every entry of a thread's history says it, from
    /// when the thread took it in); `None` when it does not say.
    pub(crate) fn recorded_size(&self) -> Option<u64> {
        self.message.as_ref().and(self.audit.get("bytes")).and_then(Value::as_u64)
    }

    /// A rewind to the first `kept` messages of the history.
    pub(crate) fn rewind(kept: usize, dropped: usize, audit: Map<String, Value>) -> Self {
        let mut entry = AuditEntry::new(None, None, Decision::Rewind, audit);
        entry.audit.insert("kept".into(), kept.into());
        entry.audit.insert("dropped".into(), dropped.into());
        entry
    }

    /// Roughly what it holds, in bytes: the length of its message's JSON (counted as it is written, not kept).
    pub(crate) fn size(&self) -> u64 {
        let Some(message) = &self.message else { return 0 };
        let mut counted = Counted(0);
        match serde_json::to_writer(&mut counted, message) {
            Ok(()) => counted.0,
            Err(_) => 0,
        }
    }
}

/// A writer that only counts the bytes written to it.
struct Counted(u64);

impl std::io::Write for Counted {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0 += bytes.len() as u64;
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The model as audit metadata.
pub(crate) fn model_audit(model: &str) -> Map<String, Value> {
    Map::from_iter([("model".to_owned(), Value::from(model))])
}

/// The entries whose messages make the history of a log that holds `entries`, oldest first: those that belong
/// to the conversation, less what a later [`Decision::Rewind`] took out.
pub(crate) fn history_of(entries: &[Arc<AuditEntry>]) -> Vec<&Arc<AuditEntry>> {
    let mut history = Vec::new();
    for entry in entries {
        if entry.decision == Decision::Rewind {
            let kept = entry.audit.get("kept").and_then(Value::as_u64).unwrap_or(0);
            history.truncate(usize::try_from(kept).unwrap_or(usize::MAX));
        } else if entry.history().is_some() {
            history.push(entry);
        }
    }
    history
}
