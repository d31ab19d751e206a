//! HTTP and SSE helpers for the tests that talk to a [`TestServer`] over real sockets: requests that
//! return status and JSON, the OpenAI error envelope, a strict SSE parser and the CUI stream checks.

use std::time::Duration;

use futures::StreamExt;
use serde_json::{Value, json};

use super::server::TestServer;

/// The longest any single read or wait may take before the test fails instead of hanging.
pub(crate) const PATIENCE: Duration = Duration::from_secs(10);

/// One complete SSE event: its `id:` (if any), its `data:` and its exact bytes.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Sse {
    pub(crate) id: Option<u64>,
    pub(crate) data: String,
    pub(crate) raw: Vec<u8>,
}

impl Sse {
    /// The data as JSON; panics with the data when it is not.
    pub(crate) fn json(&self) -> Value {
        serde_json::from_str(&self.data).unwrap_or_else(|e| panic!("event data is not JSON ({e}): {}", self.data))
    }
}

/// The complete events at the start of `bytes` (comment-only events such as `: ping` skipped), and how many
/// bytes they took. Only `id:`, `data:`, `retry:` (alone, the reconnection hint) and comment lines are
/// allowed, one `data:` line per event.
pub(crate) fn parse_sse(bytes: &[u8]) -> (Vec<Sse>, usize) {
    let mut events = Vec::new();
    let mut start = 0;
    while let Some(end) = bytes[start..].windows(2).position(|w| w == b"\n\n").map(|p| start + p + 2) {
        let raw = &bytes[start..end];
        let text = std::str::from_utf8(raw).expect("SSE is UTF-8");
        let mut id = None;
        let mut data = None;
        for line in text.lines() {
            if let Some(value) = line.strip_prefix("id: ") {
                id = Some(value.parse().unwrap_or_else(|_| panic!("id is a sequence: {line}")));
            } else if let Some(value) = line.strip_prefix("data: ") {
                assert!(data.is_none(), "one data line per event: {text}");
                data = Some(value.to_owned());
            } else {
                let hint = line.strip_prefix("retry: ").is_some_and(|ms| ms.parse::<u64>().is_ok());
                assert!(line.is_empty() || line.starts_with(':') || hint, "only id, data and comment lines: {text:?}");
            }
        }
        if let Some(data) = data {
            events.push(Sse { id, data, raw: raw.to_vec() });
        }
        start = end;
    }
    (events, start)
}

/// Reads a response body to its end.
pub(crate) async fn read_body(response: reqwest::Response) -> Vec<u8> {
    let mut body = response.bytes_stream();
    let mut all = Vec::new();
    loop {
        match tokio::time::timeout(PATIENCE, body.next()).await.expect("the body ends in time") {
            Some(chunk) => all.extend_from_slice(&chunk.expect("body bytes")),
            None => return all,
        }
    }
}

/// Reads an SSE body to its end and parses it; the body must end on an event boundary.
pub(crate) async fn read_events(response: reqwest::Response) -> Vec<Sse> {
    let body = read_body(response).await;
    let (events, used) = parse_sse(&body);
    assert_eq!(used, body.len(), "the body ends on an event boundary: {}", String::from_utf8_lossy(&body));
    events
}

/// A response header as text; panics when it is missing.
pub(crate) fn header<'r>(response: &'r reqwest::Response, name: &str) -> &'r str {
    response.headers().get(name).unwrap_or_else(|| panic!("header {name} is present")).to_str().expect("header is text")
}

/// A 200 SSE response with the headers every SSE response has.
#[track_caller]
pub(crate) fn assert_sse_headers(response: &reqwest::Response) {
    assert_eq!(response.status(), 200);
    assert_eq!(header(response, "content-type"), "text/event-stream");
    assert_eq!(header(response, "cache-control"), "no-cache");
    assert_eq!(header(response, "x-accel-buffering"), "no");
}

/// `GET url`: status and JSON body.
pub(crate) async fn get_json(client: &reqwest::Client, url: &str) -> (u16, Value) {
    let response = client.get(url).send().await.unwrap_or_else(|e| panic!("GET {url}: {e}"));
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or_else(|e| panic!("GET {url}: the body is JSON: {e}")))
}

/// `POST url` with a JSON body: status and JSON body.
pub(crate) async fn post_json(client: &reqwest::Client, url: &str, body: &Value) -> (u16, Value) {
    let response = client.post(url).json(body).send().await.unwrap_or_else(|e| panic!("POST {url}: {e}"));
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or_else(|e| panic!("POST {url}: the body is JSON: {e}")))
}

/// `POST url` with an empty body: status and JSON body.
pub(crate) async fn post_empty(client: &reqwest::Client, url: &str) -> (u16, Value) {
    let response = client
        .post(url)
        .header("content-type", "application/json")
        .send()
        .await
        .unwrap_or_else(|e| panic!("POST {url}: {e}"));
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or_else(|e| panic!("POST {url}: the body is JSON: {e}")))
}

/// `POST /v1/streams`: a new open stream's id.
pub(crate) async fn create_stream(client: &reqwest::Client, server: &TestServer) -> String {
    let (status, created) = post_empty(client, &server.url("/v1/streams")).await;
    assert_eq!(status, 201, "{created}");
    created["id"].as_str().unwrap_or_else(|| panic!("the new stream's id: {created}")).to_owned()
}

/// `POST <base>/v1/streams` with `key` as a bearer: the answer (`id`, `read_token`, `write_token`, ...).
pub(crate) async fn create_with_key(client: &reqwest::Client, base: &str, key: &str) -> Value {
    let response = client.post(format!("{base}/v1/streams")).bearer_auth(key).json(&json!({})).send().await;
    let response = response.unwrap_or_else(|e| panic!("create a stream: {e}"));
    assert_eq!(response.status(), 201, "create a stream with a key");
    response.json().await.unwrap_or_else(|e| panic!("the created stream is JSON: {e}"))
}

/// `POST /v1/streams/{id}/end` (completed); the last sequence.
pub(crate) async fn end_stream(client: &reqwest::Client, server: &TestServer, id: &str) -> u64 {
    let (status, ended) = post_empty(client, &server.url(&format!("/v1/streams/{id}/end"))).await;
    assert_eq!(status, 200, "{ended}");
    ended["last_sequence"].as_u64().unwrap_or_else(|| panic!("last_sequence: {ended}"))
}

/// `GET /v1/streams/{id}`, which must answer 200.
pub(crate) async fn snapshot(client: &reqwest::Client, server: &TestServer, id: &str) -> Value {
    let (status, body) = get_json(client, &server.url(&format!("/v1/streams/{id}"))).await;
    assert_eq!(status, 200, "{body}");
    body
}

/// The `sequences` of a 200 append reply.
pub(crate) fn sequences(reply: &Value) -> Vec<u64> {
    reply["sequences"]
        .as_array()
        .unwrap_or_else(|| panic!("sequences: {reply}"))
        .iter()
        .map(|s| s.as_u64().unwrap_or_else(|| panic!("a sequence: {reply}")))
        .collect()
}

/// Checks the OpenAI error envelope: exactly `message`, `type`, `param` and `code`, with these values.
#[track_caller]
pub(crate) fn assert_envelope(body: &Value, param: Option<&str>, code: &str) {
    let error = body["error"].as_object().unwrap_or_else(|| panic!("an error envelope: {body}"));
    let mut keys: Vec<&str> = error.keys().map(String::as_str).collect();
    keys.sort_unstable();
    assert_eq!(keys, ["code", "message", "param", "type"], "{body}");
    assert!(error["message"].as_str().is_some_and(|m| !m.is_empty()), "{body}");
    assert!(error["type"].is_string(), "{body}");
    assert_eq!(error["param"], param.map_or(Value::Null, |p| json!(p)), "{body}");
    assert_eq!(error["code"], json!(code), "{body}");
}

/// The name of a lifecycle event (`stream_start`, `message_start`, ...), if the event is one.
pub(crate) fn lifecycle(message: &Value) -> Option<&str> {
    if message["type"] == "event" { message["props"]["event"].as_str() } else { None }
}

/// Checks that `events` are one whole CUI stream: ids 1..=last without gaps, each matching the message's
/// `metadata.sequence`, from `stream_start` to a `stream_end` with `status`; returns the last sequence.
#[track_caller]
pub(crate) fn assert_whole_cui(events: &[Sse], status: &str) -> u64 {
    assert!(!events.is_empty(), "no events");
    for (index, event) in events.iter().enumerate() {
        let expected = index as u64 + 1;
        assert_eq!(event.id, Some(expected), "ids go 1, 2, 3 ... without gaps: {}", event.data);
        assert_eq!(event.json()["metadata"]["sequence"], json!(expected), "{}", event.data);
    }
    assert_eq!(lifecycle(&events[0].json()), Some("stream_start"));
    let last = events.last().expect("one event").json();
    assert_eq!(lifecycle(&last), Some("stream_end"), "{last}");
    assert_eq!(last["props"]["data"]["status"], json!(status), "{last}");
    events.len() as u64
}
