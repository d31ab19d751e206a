//! WebSocket encoding of a [`Frame`]: one JSON text message per event, naming its stream, so one
//! connection can carry many streams; each is rendered as a whole WebSocket frame, header included.
//!
//! A server's frames are not masked (RFC 6455 §5.1), so a frame's bytes, header and all, are the same for
//! every subscriber: they are rendered once per stream here, and a connection writes the shared bytes of
//! a batch as they are (`http/transport/ws.rs`), as an SSE connection writes its events. [`header`] is the
//! header of an unfragmented server frame, which the connection also puts before the few frames it makes
//! itself (replies, pings, the close).
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
        let mut out = Vec::with_capacity(HEADER_ROOM + self.head.len() + 64);
        out.resize(HEADER_ROOM, 0);
        out.extend_from_slice(self.head.as_bytes());
        match &frame.payload {
            Payload::End(_) => return None,
            Payload::Error(envelope) => {
                // `{"error":{...}}` without its opening brace continues our object.
                out.push(b',');
                out.extend_from_slice(envelope.get(1..).unwrap_or_default());
                return Some(framed(out));
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
        Some(framed(out))
    }

    /// `{"stream", "done": true, "status"}`.
    pub(super) fn done(&self, outcome: &Outcome) -> Bytes {
        let status = json!(Status::of(Some(outcome)));
        text_frame(format!("{},\"done\":true,\"status\":{status}}}", self.head).as_bytes())
    }

    /// The lagged notice.
    pub(super) fn lagged(&self, error: &ErrorProps, resume_from: u64) -> Bytes {
        let body = json!({ "message": error.message, "code": error.code, "resume_from": resume_from });
        text_frame(format!("{},\"error\":{body}}}", self.head).as_bytes())
    }
}

/// Room left before a payload for its header: the longest (a 64-bit length) is ten bytes.
const HEADER_ROOM: usize = 10;

/// The text frame whose payload is `out` after [`HEADER_ROOM`] bytes: the header is written right before the
/// payload, and the frame is a slice of the buffer, not a copy.
fn framed(mut out: Vec<u8>) -> Bytes {
    let mut head = [0u8; HEADER_ROOM];
    let head = header(TEXT, out.len() - HEADER_ROOM, &mut head);
    let start = HEADER_ROOM - head.len();
    out[start..HEADER_ROOM].copy_from_slice(head);
    Bytes::from(out).slice(start..)
}

/// `payload` as one unmasked text frame.
pub(crate) fn text_frame(payload: &[u8]) -> Bytes {
    frame(TEXT, payload)
}

/// `payload` as one unmasked frame with `opcode` (a text, ping, pong or close frame).
pub(crate) fn frame(opcode: u8, payload: &[u8]) -> Bytes {
    let mut head = [0u8; HEADER_ROOM];
    let head = header(opcode, payload.len(), &mut head);
    let mut out = Vec::with_capacity(head.len() + payload.len());
    out.extend_from_slice(head);
    out.extend_from_slice(payload);
    out.into()
}

/// The opcode of a text frame.
pub(crate) const TEXT: u8 = 0x1;

/// The header of a whole (`FIN`), unmasked frame with `opcode` and `len` bytes of payload, in `out`: two,
/// four or ten bytes, as the length needs (RFC 6455 §5.2).
pub(crate) fn header(opcode: u8, len: usize, out: &mut [u8; HEADER_ROOM]) -> &[u8] {
    out[0] = 0x80 | (opcode & 0x0f);
    if len < 126 {
        out[1] = len as u8;
        &out[..2]
    } else if let Ok(short) = u16::try_from(len) {
        out[1] = 126;
        out[2..4].copy_from_slice(&short.to_be_bytes());
        &out[..4]
    } else {
        out[1] = 127;
        out[2..10].copy_from_slice(&(len as u64).to_be_bytes());
        &out[..10]
    }
}

#[cfg(test)]
mod tests {
    use super::{TEXT, text_frame};

    /// A frame's header says its length in as few bytes as it takes: one up to 125, then two, then eight.
    #[test]
    fn a_frame_header_carries_its_length_in_the_fewest_bytes() {
        for (len, head) in [(0, vec![0x81, 0]), (125, vec![0x81, 125]), (126, vec![0x81, 126, 0, 126])] {
            let frame = text_frame(&vec![b'x'; len]);
            assert_eq!(&frame[..head.len()], &head[..], "{len}");
            assert_eq!(frame.len(), head.len() + len);
        }
        let frame = text_frame(&vec![b'x'; 70_000]);
        assert_eq!(&frame[..10], &[0x80 | TEXT, 127, 0, 0, 0, 0, 0, 1, 0x11, 0x70]);
        assert_eq!(frame.len(), 70_010);
    }
}
