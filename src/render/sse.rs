//! Server-sent event encoding of a [`Frame`]: `event: <name>` and `id: <n>` when the frame has them, then
//! `data: <payload>` and a blank line.
//!
//! LF line endings only and one space after the colon, as every SSE client and the OpenAI SDKs expect
//! (`docs/clients.md`, "OpenAI chat, streaming"). JSON never contains a raw line break, so one `data:` line always holds one event.
//! An end marker (`[DONE]`) is written as the data it is.

use bytes::Bytes;

use crate::adapter::{Frame, Payload};

/// `frame` as one SSE event.
///
/// ```
/// use agentmux::adapter::Frame;
/// use agentmux::render::encode_sse;
///
/// assert_eq!(&encode_sse(&Frame::json(Some(3), &[1, 2]))[..], b"id: 3\ndata: [1,2]\n\n");
/// assert_eq!(&encode_sse(&Frame::end("[DONE]"))[..], b"data: [DONE]\n\n");
/// ```
pub fn encode(frame: &Frame) -> Bytes {
    let data: &[u8] = match &frame.payload {
        Payload::Json(json) | Payload::Error(json) => json,
        Payload::End(marker) => marker.as_bytes(),
    };
    let mut id = itoa::Buffer::new();
    let id = frame.id.map(|n| id.format(n).as_bytes());
    let len = frame.event.map_or(0, |event| "event: \n".len() + event.len())
        + id.map_or(0, |id| "id: \n".len() + id.len())
        + "data: \n\n".len()
        + data.len();
    // Exactly its size, so that the bytes take over the allocation as it is.
    let mut buf = Vec::with_capacity(len);
    if let Some(event) = frame.event {
        buf.extend_from_slice(b"event: ");
        buf.extend_from_slice(event.as_bytes());
        buf.push(b'\n');
    }
    if let Some(id) = id {
        buf.extend_from_slice(b"id: ");
        buf.extend_from_slice(id);
        buf.push(b'\n');
    }
    buf.extend_from_slice(b"data: ");
    buf.extend_from_slice(data);
    buf.extend_from_slice(b"\n\n");
    Bytes::from(buf)
}
