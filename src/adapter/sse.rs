//! Server-sent event framing shared by the adapters: `id: <n>` (optional), `data: <json>`, a blank line.
//!
//! LF line endings only and one space after the colon, as every SSE client and the OpenAI SDKs expect
//! (`wire-compat.md` §1). JSON never contains a raw line break, so one `data:` line always holds one event.

use bytes::Bytes;
use serde::Serialize;

/// The frame that ends an OpenAI stream.
pub(crate) const DONE: Bytes = Bytes::from_static(b"data: [DONE]\n\n");

/// One SSE event holding `value` as compact JSON, with an `id:` line when `id` is given.
pub(crate) fn event<T: Serialize + ?Sized>(id: Option<u64>, value: &T) -> Bytes {
    let mut buf = Vec::with_capacity(128);
    if let Some(id) = id {
        buf.extend_from_slice(b"id: ");
        buf.extend_from_slice(id.to_string().as_bytes());
        buf.push(b'\n');
    }
    buf.extend_from_slice(b"data: ");
    let start = buf.len();
    if serde_json::to_writer(&mut buf, value).is_err() {
        // Our frame types serialise infallibly (string keys only); keep the frame valid JSON regardless.
        buf.truncate(start);
        buf.extend_from_slice(
            br#"{"error":{"message":"frame could not be serialised","type":"server_error","param":null,"code":null}}"#,
        );
    }
    buf.extend_from_slice(b"\n\n");
    Bytes::from(buf)
}
