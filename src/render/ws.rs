//! WebSocket encoding of a [`Frame`]: one JSON text message per event, naming its stream, so one
//! connection can carry many streams.
//!
//! `{"stream", "seq", "message"}` for a CUI message (no `seq` when it has no id), `{"stream", "chunk"}` for
//! any other format's event (an `event` name goes in `"event"`), `{"stream", "error": {...}}` for an error
//! envelope, nothing for an end marker (the end is said by `{"stream", "done": true, "status"}`), and
//! `{"stream", "error": {"message", "code": "lagged", "resume_from"}}` for a subscriber whose history is
//! gone. Payloads are our own compact JSON, spliced in whole, never parsed.

use bytes::Bytes;
use serde_json::json;

use super::Format;
use crate::adapter::{Frame, Payload};
use crate::hub::Status;
use crate::output::{ErrorProps, Outcome};

/// What every message of one stream's WebSocket rendering starts with.
pub(super) struct Wrap {
    /// `{"stream":"<id>"`
    head: String,
    /// The key a data payload goes under.
    key: &'static str,
}

impl Wrap {
    pub(super) fn new(stream: &str, format: Format) -> Self {
        let quoted = serde_json::to_string(stream).unwrap_or_else(|_| "\"\"".into());
        let key = if format == Format::Cui { "message" } else { "chunk" };
        Wrap { head: format!("{{\"stream\":{quoted}"), key }
    }

    /// The WebSocket message for `frame`, if it has one.
    pub(super) fn frame(&self, frame: &Frame) -> Option<Bytes> {
        let mut out = Vec::with_capacity(self.head.len() + 64);
        out.extend_from_slice(self.head.as_bytes());
        match &frame.payload {
            Payload::End(_) => return None,
            Payload::Error(envelope) => {
                // `{"error":{...}}` without its opening brace continues our object.
                out.push(b',');
                out.extend_from_slice(envelope.get(1..).unwrap_or_default());
                return Some(out.into());
            }
            Payload::Json(json) => {
                if let Some(event) = frame.event {
                    out.extend_from_slice(b",\"event\":");
                    out.extend_from_slice(json!(event).to_string().as_bytes());
                }
                if let Some(id) = frame.id {
                    out.extend_from_slice(b",\"seq\":");
                    out.extend_from_slice(id.to_string().as_bytes());
                }
                out.extend_from_slice(b",\"");
                out.extend_from_slice(self.key.as_bytes());
                out.extend_from_slice(b"\":");
                out.extend_from_slice(json);
            }
        }
        out.push(b'}');
        Some(out.into())
    }

    /// `{"stream", "done": true, "status"}`.
    pub(super) fn done(&self, outcome: &Outcome) -> Bytes {
        let status = json!(Status::of(Some(outcome)));
        format!("{},\"done\":true,\"status\":{status}}}", self.head).into()
    }

    /// The lagged notice.
    pub(super) fn lagged(&self, error: &ErrorProps, resume_from: u64) -> Bytes {
        let body = json!({ "message": error.message, "code": error.code, "resume_from": resume_from });
        format!("{},\"error\":{body}}}", self.head).into()
    }
}
