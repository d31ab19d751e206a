//! [`Frame`]: one event of a format, before any transport has framed it.
//!
//! An adapter says what each event is (its name where the format names events, its id where the format
//! resumes by id, its JSON payload, or the format's end marker) and nothing of how it travels: SSE writes
//! `event:`/`id:`/`data:` lines, WebSocket wraps the payload in one JSON text message (see `crate::render`).
//! So a transport never has to parse another transport's bytes to learn what an event was.

use bytes::Bytes;
use serde::Serialize;

/// One event of a format; see the module doc.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    /// The event's name, for formats that name their events.
    pub event: Option<&'static str>,
    /// The id a client resumes after (the stream's sequence), for formats that carry one.
    pub id: Option<u64>,
    /// What the event holds.
    pub payload: Payload,
}

/// What an event holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Payload {
    /// One JSON value, compact: a message, a chunk.
    Json(Bytes),
    /// A JSON error envelope (`{"error": {...}}`) after which the format sends nothing more but its end.
    Error(Bytes),
    /// The format's end marker (OpenAI's `[DONE]`): written as it is where the transport carries it, left
    /// out where the transport tells the end its own way.
    End(&'static str),
}

impl Frame {
    /// A JSON event, with an id when given.
    pub fn json<T: Serialize + ?Sized>(id: Option<u64>, value: &T) -> Self {
        Frame { event: None, id, payload: Payload::Json(to_json(value)) }
    }

    /// A JSON event with a name (for formats whose clients read `event:` lines).
    pub fn named<T: Serialize + ?Sized>(event: &'static str, value: &T) -> Self {
        Frame { event: Some(event), id: None, payload: Payload::Json(to_json(value)) }
    }

    /// An error envelope.
    pub fn error<T: Serialize + ?Sized>(envelope: &T) -> Self {
        Frame { event: None, id: None, payload: Payload::Error(to_json(envelope)) }
    }

    /// The format's end marker.
    pub fn end(marker: &'static str) -> Self {
        Frame { event: None, id: None, payload: Payload::End(marker) }
    }
}

/// `value` as compact JSON.
fn to_json<T: Serialize + ?Sized>(value: &T) -> Bytes {
    // Room for most messages and chunks in one go: a frame is short-lived (copied into its rendition).
    let mut buf = Vec::with_capacity(256);
    match serde_json::to_writer(&mut buf, value) {
        Ok(()) => Bytes::from(buf),
        // Our frame types serialise infallibly (string keys only); keep the frame valid JSON regardless.
        Err(_) => Bytes::from_static(
            br#"{"error":{"message":"frame could not be serialised","type":"server_error","param":null,"code":null}}"#,
        ),
    }
}
