//! A fake upstream on `127.0.0.1:0`, OpenAI-compatible and Anthropic alike: it answers `POST
//! /v1/chat/completions` and `POST /v1/messages` with the replies it is given, in order (the last one again
//! once they run out), byte for byte, and serves `GET /v1/models`. It records every request (path, body and
//! headers) and when each answer's body was dropped, which is when the client (agentmux) closed the
//! connection.

use std::convert::Infallible;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{Value, json};

/// One answer.
#[derive(Debug, Clone)]
pub(crate) struct Reply {
    pub(crate) status: u16,
    pub(crate) headers: Vec<(String, String)>,
    /// The body in pieces: SSE events (each with its blank line), or one JSON body.
    pub(crate) events: Vec<String>,
    pub(crate) delay: Duration,
    /// Send this many events, then nothing more, keeping the connection open.
    pub(crate) stall_after: Option<usize>,
}

impl Reply {
    /// `fixtures/upstream/<case>/`: `response.sse` or `response.json`, as `meta.json` says.
    pub(crate) fn fixture(case: &str) -> Reply {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/upstream").join(case);
        let meta: Value = serde_json::from_slice(&std::fs::read(dir.join("meta.json")).expect("meta.json"))
            .expect("meta.json is JSON");
        let headers = meta["headers"]
            .as_object()
            .map(|h| h.iter().map(|(k, v)| (k.clone(), v.as_str().unwrap_or("").to_owned())).collect())
            .unwrap_or_default();
        let events = match std::fs::read_to_string(dir.join("response.sse")) {
            Ok(body) => split_events(&body),
            Err(_) => vec![std::fs::read_to_string(dir.join("response.json")).expect("response.json")],
        };
        Reply {
            status: meta["status"].as_u64().unwrap_or(200) as u16,
            headers,
            events,
            delay: Duration::from_millis(meta["chunk_delay_ms"].as_u64().unwrap_or(0)),
            stall_after: meta["stall_after_events"].as_u64().map(|n| n as usize),
        }
    }

    /// A streamed answer of these chunks (each a `data:` event), then `[DONE]`.
    pub(crate) fn chunks(chunks: &[Value]) -> Reply {
        let mut events: Vec<String> = chunks.iter().map(|c| format!("data: {c}\n\n")).collect();
        events.push("data: [DONE]\n\n".into());
        Reply {
            status: 200,
            headers: vec![("content-type".into(), "text/event-stream".into())],
            events,
            delay: Duration::ZERO,
            stall_after: None,
        }
    }

    /// Content in these fragments, then `finish_reason: stop` and usage.
    pub(crate) fn text(fragments: &[&str]) -> Reply {
        let mut chunks = vec![chunk(json!({"role": "assistant", "content": ""}), None)];
        chunks.extend(fragments.iter().map(|f| chunk(json!({"content": f}), None)));
        chunks.push(chunk(json!({}), Some("stop")));
        chunks.push(json!({"id": "chatcmpl-fake", "object": "chat.completion.chunk", "choices": [],
            "usage": {"prompt_tokens": 10, "completion_tokens": fragments.len(), "total_tokens": 10 + fragments.len()}}));
        Reply::chunks(&chunks)
    }

    /// Tool calls (id, name, arguments), each in two fragments, then `finish_reason: tool_calls`.
    pub(crate) fn tool_calls(calls: &[(&str, &str, &str)]) -> Reply {
        let mut chunks = vec![chunk(json!({"role": "assistant", "content": null}), None)];
        for (index, (id, name, arguments)) in calls.iter().enumerate() {
            let (head, tail) = arguments.split_at(arguments.len() / 2);
            chunks.push(chunk(
                json!({"tool_calls": [{"index": index, "id": id, "type": "function",
                    "function": {"name": name, "arguments": head}}]}),
                None,
            ));
            chunks.push(chunk(json!({"tool_calls": [{"index": index, "function": {"arguments": tail}}]}), None));
        }
        chunks.push(chunk(json!({}), Some("tool_calls")));
        Reply::chunks(&chunks)
    }
}

/// An Anthropic Messages stream of these content blocks (`{"type": "text", "text"}`, `{"type": "tool_use",
/// "id", "name", "input"}`, `{"type": "thinking", "thinking", "signature"}`), each streamed as the API
/// streams it, ending with `stop_reason`.
pub(crate) fn anthropic(blocks: &[Value], stop_reason: &str) -> Reply {
    let event = |name: &str, data: Value| format!("event: {name}\ndata: {data}\n\n");
    let mut events = vec![event(
        "message_start",
        json!({"type": "message_start", "message": {"id": "msg_fake", "type": "message", "role": "assistant",
            "model": "claude-fake", "content": [], "stop_reason": null, "stop_sequence": null,
            "usage": {"input_tokens": 10, "output_tokens": 1}}}),
    )];
    for (index, block) in blocks.iter().enumerate() {
        let (opened, delta) = match block["type"].as_str() {
            Some("text") => (json!({"type": "text", "text": ""}), json!({"type": "text_delta", "text": block["text"]})),
            Some("thinking") => (
                json!({"type": "thinking", "thinking": "", "signature": ""}),
                json!({"type": "thinking_delta", "thinking": block["thinking"]}),
            ),
            _ => {
                let mut opened = block.clone();
                opened["input"] = json!({});
                (opened, json!({"type": "input_json_delta", "partial_json": block["input"].to_string()}))
            }
        };
        events.push(event(
            "content_block_start",
            json!({"type": "content_block_start", "index": index, "content_block": opened}),
        ));
        events
            .push(event("content_block_delta", json!({"type": "content_block_delta", "index": index, "delta": delta})));
        if let Some(signature) = block.get("signature") {
            let delta = json!({"type": "signature_delta", "signature": signature});
            events.push(event(
                "content_block_delta",
                json!({"type": "content_block_delta", "index": index, "delta": delta}),
            ));
        }
        events.push(event("content_block_stop", json!({"type": "content_block_stop", "index": index})));
    }
    events.push(event(
        "message_delta",
        json!({"type": "message_delta", "delta": {"stop_reason": stop_reason, "stop_sequence": null}, "usage": {"output_tokens": 5}}),
    ));
    events.push(event("message_stop", json!({"type": "message_stop"})));
    Reply {
        status: 200,
        headers: vec![("content-type".into(), "text/event-stream; charset=utf-8".into())],
        events,
        delay: Duration::ZERO,
        stall_after: None,
    }
}

/// One `chat.completion.chunk` with this delta.
pub(crate) fn chunk(delta: Value, finish_reason: Option<&str>) -> Value {
    json!({"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 1, "model": "fake",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}]})
}

/// The blank-line-terminated blocks of an SSE body.
fn split_events(body: &str) -> Vec<String> {
    let mut events = Vec::new();
    let mut rest = body;
    while let Some(end) = rest.find("\n\n") {
        events.push(rest[..end + 2].to_owned());
        rest = &rest[end + 2..];
    }
    if !rest.is_empty() {
        events.push(rest.to_owned());
    }
    events
}

/// One request the fake received.
#[derive(Debug, Clone)]
pub(crate) struct Recorded {
    pub(crate) path: String,
    pub(crate) body: Value,
    pub(crate) headers: HeaderMap,
}

impl Recorded {
    /// A header's value, if it came and is text.
    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
}

#[derive(Default)]
struct Shared {
    replies: Vec<Reply>,
    next: usize,
    requests: Vec<Recorded>,
    closed: Vec<Option<Instant>>,
    models: Vec<String>,
}

/// The running fake; stopped when dropped.
pub(crate) struct FakeUpstream {
    /// `http://127.0.0.1:<port>/v1`
    pub(crate) base: String,
    shared: Arc<Mutex<Shared>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for FakeUpstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Records when a body is dropped.
struct Closed(Arc<Mutex<Shared>>, usize);

impl Drop for Closed {
    fn drop(&mut self) {
        if let Ok(mut shared) = self.0.lock() {
            shared.closed[self.1] = Some(Instant::now());
        }
    }
}

impl FakeUpstream {
    /// A fake that answers with `replies` in order.
    pub(crate) async fn start(replies: Vec<Reply>) -> FakeUpstream {
        let shared = Arc::new(Mutex::new(Shared { replies, models: vec!["fake-model".into()], ..Shared::default() }));
        let router = Router::new()
            .route("/v1/chat/completions", post(answer))
            .route("/v1/messages", post(answer))
            .route("/v1/models", get(models))
            .with_state(Arc::clone(&shared));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, router).await;
        });
        FakeUpstream { base: format!("http://{addr}/v1"), shared, task }
    }

    /// The request bodies received, in order.
    pub(crate) fn requests(&self) -> Vec<Value> {
        self.shared.lock().expect("lock").requests.iter().map(|r| r.body.clone()).collect()
    }

    /// The requests received, in order, with their path and headers.
    pub(crate) fn recorded(&self) -> Vec<Recorded> {
        self.shared.lock().expect("lock").requests.clone()
    }

    /// The `authorization` headers received, in order.
    pub(crate) fn authorizations(&self) -> Vec<Option<String>> {
        self.shared
            .lock()
            .expect("lock")
            .requests
            .iter()
            .map(|r| r.header("authorization").map(str::to_owned))
            .collect()
    }

    /// When the body of answer `n` was dropped (the client closed), if it was.
    pub(crate) fn closed(&self, n: usize) -> Option<Instant> {
        self.shared.lock().expect("lock").closed.get(n).copied().flatten()
    }
}

async fn models(State(shared): State<Arc<Mutex<Shared>>>) -> Response {
    let names = shared.lock().map(|s| s.models.clone()).unwrap_or_default();
    let data: Vec<Value> = names.iter().map(|n| json!({"id": n, "object": "model"})).collect();
    axum::Json(json!({"object": "list", "data": data})).into_response()
}

async fn answer(
    State(shared): State<Arc<Mutex<Shared>>>,
    uri: axum::http::Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let request: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let (reply, n) = {
        let mut s = shared.lock().expect("lock");
        s.requests.push(Recorded { path: uri.path().to_owned(), body: request, headers });
        let index = s.next.min(s.replies.len().saturating_sub(1));
        s.next += 1;
        s.closed.push(None);
        (s.replies[index].clone(), s.closed.len() - 1)
    };
    let guard = Closed(Arc::clone(&shared), n);
    let status = StatusCode::from_u16(reply.status).unwrap_or(StatusCode::OK);
    let body = async_stream::stream! {
        let _guard = guard;
        let sent = reply.stall_after.unwrap_or(usize::MAX);
        for (i, event) in reply.events.iter().enumerate() {
            if i == sent {
                break;
            }
            if i > 0 && !reply.delay.is_zero() {
                // The upstream's pace, as the reply scripts it: the scenario, not synchronisation.
                tokio::time::sleep(reply.delay).await;
            }
            yield Ok::<Bytes, Infallible>(Bytes::from(event.clone()));
        }
        if reply.stall_after.is_some() {
            std::future::pending::<()>().await;
        }
    };
    let mut response = Response::new(Body::from_stream(body));
    *response.status_mut() = status;
    for (name, value) in &reply.headers {
        if let (Ok(name), Ok(value)) = (name.parse::<axum::http::HeaderName>(), value.parse()) {
            response.headers_mut().insert(name, value);
        }
    }
    response
}
