//! [`StreamedJson`]: a JSON answer whose one long array is written out as the client takes it, from items the
//! answer shares with what the service keeps (a thread's messages, its audit entries), never from a copy.
//!
//! Written whole, a read of a large thread copies it per request twice over (the items, then their JSON in
//! one buffer): forty parallel reads of a 15 MB thread took the service to 905 MB (issue 42). Here a request
//! holds its list of shared items (a pointer each) and one chunk of JSON at a time: the body is a stream that
//! hyper polls for its next chunk only once it has room for it, so a slow reader holds no more than a fast
//! one. A chunk is at least [`CHUNK_BYTES`] of whole items, or one item however large (a message is bounded
//! by the body limit it came in under, or by the stream that produced it).
//!
//! The bytes are exactly those `serde_json::to_vec` writes of the whole value: the value is written once
//! with the array empty, and the items go between its brackets.

use axum::body::Body;
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use serde::Serialize;

/// The least JSON a chunk holds before it is handed to hyper (its last whole item may take it past).
const CHUNK_BYTES: usize = 64 << 10;

/// A JSON value with one array field written out item by item; the response is `200 application/json`.
pub(crate) struct StreamedJson<T> {
    /// The value's JSON up to the array's `[`.
    head: Vec<u8>,
    items: Vec<T>,
    /// The value's JSON from the array's `]` on.
    tail: Vec<u8>,
}

impl<T: Serialize + Send + 'static> StreamedJson<T> {
    /// `value`, whose field `field` is an empty array, with `items` in that array. The field is found as the
    /// first `"field":[]` in the value's JSON: the caller's value has no string before it that holds the same
    /// text (its fields before the array are ids, names and numbers).
    pub(crate) fn around(value: &impl Serialize, field: &str, items: Vec<T>) -> Result<Self, serde_json::Error> {
        let json = serde_json::to_vec(value)?;
        let marker = format!("{}:[]", serde_json::to_string(field)?);
        let at = json
            .windows(marker.len())
            .position(|window| window == marker.as_bytes())
            .ok_or_else(|| serde::ser::Error::custom(format!("the value has no empty array {field:?}")))?;
        let open = at + marker.len() - 1;
        Ok(StreamedJson { head: json[..open].to_vec(), items, tail: json[open..].to_vec() })
    }
}

impl<T: Serialize + Send + 'static> IntoResponse for StreamedJson<T> {
    fn into_response(self) -> Response {
        let chunks =
            Chunks { head: Some(self.head), items: self.items.into_iter(), first: true, tail: Some(self.tail) };
        let mut response = Response::new(Body::from_stream(futures::stream::iter(chunks)));
        response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
        response
    }
}

/// The chunks of a [`StreamedJson`], each written when hyper asks for it.
struct Chunks<T> {
    head: Option<Vec<u8>>,
    items: std::vec::IntoIter<T>,
    /// No item written yet (no comma before the next).
    first: bool,
    tail: Option<Vec<u8>>,
}

impl<T: Serialize> Iterator for Chunks<T> {
    /// An item that cannot be written ends the body there, and hyper drops the connection: the client sees a
    /// body cut short, never JSON that says less than the thread holds. (The service's own types always write.)
    type Item = Result<Bytes, serde_json::Error>;

    fn next(&mut self) -> Option<Self::Item> {
        let mut chunk = self.head.take().unwrap_or_default();
        while chunk.len() < CHUNK_BYTES {
            let Some(item) = self.items.next() else {
                chunk.extend(self.tail.take().unwrap_or_default());
                break;
            };
            if !std::mem::take(&mut self.first) {
                chunk.push(b',');
            }
            if let Err(error) = serde_json::to_writer(&mut chunk, &item) {
                self.tail = None;
                self.items = Vec::new().into_iter();
                return Some(Err(error));
            }
        }
        (!chunk.is_empty()).then(|| Ok(Bytes::from(chunk)))
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    async fn body_of<T: Serialize + Send + 'static>(streamed: StreamedJson<T>) -> Vec<u8> {
        let response = streamed.into_response();
        axum::body::to_bytes(response.into_body(), usize::MAX).await.expect("the body").to_vec()
    }

    #[tokio::test]
    async fn the_bytes_are_those_of_the_whole_value_written_at_once() {
        let big = "x".repeat(CHUNK_BYTES / 3);
        for count in [0, 1, 2, 7] {
            let items: Vec<serde_json::Value> =
                (0..count).map(|i| json!({"role": "user", "content": format!("{i} {big} \"quoted\"")})).collect();
            let whole = json!({"id": "t_1", "messages": items.clone(), "running": null, "pending": []});
            let empty = json!({"id": "t_1", "messages": [], "running": null, "pending": []});
            let streamed = StreamedJson::around(&empty, "messages", items).expect("found");
            assert_eq!(body_of(streamed).await, serde_json::to_vec(&whole).expect("json"), "{count} items");
        }
    }

    #[test]
    fn a_value_without_the_empty_array_is_an_error() {
        let value = json!({"id": "t_1", "messages": [1]});
        assert!(StreamedJson::<u8>::around(&value, "messages", Vec::new()).is_err());
        assert!(StreamedJson::<u8>::around(&value, "entries", Vec::new()).is_err());
    }

    #[test]
    fn chunks_hold_whole_items_and_at_least_the_chunk_size_but_the_last() {
        let items: Vec<String> = (0..100).map(|i| format!("{i:0>1000}")).collect();
        let chunks =
            Chunks { head: Some(b"[".to_vec()), items: items.into_iter(), first: true, tail: Some(b"]".to_vec()) };
        let sizes: Vec<usize> = chunks.map(|c| c.expect("written").len()).collect();
        assert!(sizes.len() > 1, "{sizes:?}");
        assert!(sizes[..sizes.len() - 1].iter().all(|n| (CHUNK_BYTES..CHUNK_BYTES + 1100).contains(n)), "{sizes:?}");
    }
}
