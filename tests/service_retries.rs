//! Safe retries for producers and ending one message or block, over real sockets (issue 44, item 1).
//!
//! An append with `?after=N`, an `Idempotency-Key`, or both, repeated, appends nothing and answers what the
//! first did (with `idempotent-replayed: true`), also once the stream has ended and also while the first
//! still waits for its commit; a conflict or a gap is 409 with the stream's `last_sequence`; a key reused for
//! another batch is 409; bad values are 400. The WebSocket's `publish` takes the same conditions. Ending a
//! message or a block over HTTP or the WebSocket closes what an outside producer streamed (a tool call's
//! input reaches `tool-input-available` before the stream ends), and a second end ends nothing. With two
//! nodes through Redis, all of it works sent to the node that does not write the stream.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use agentmux::agent::Agents;
use agentmux::http::Settings;
use agentmux::hub::{Entry, Gone, HubConfig, Log, MemoryStorage, Storage, StreamInfo};
use agentmux::output::Outcome;
use common::http::{PATIENCE, create_stream, end_stream, get_json, parse_sse, post_empty, snapshot};
use common::process::ServerProcess;
use common::redis::RedisServer;
use common::server::TestServer;
use futures::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio::sync::watch;
use tokio_tungstenite::tungstenite::Message as WsMessage;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream, connect_async};

/// A conditional append: `POST <base>/v1/streams/{id}/messages[?after=N]` with `Idempotency-Key` when
/// given: the status, the body, and whether the answer says it is a repeat.
async fn append(base: &str, id: &str, after: Option<&str>, key: Option<&str>, body: &Value) -> (u16, Value, bool) {
    let query = after.map_or_else(String::new, |after| format!("?after={after}"));
    let mut request = reqwest::Client::new().post(format!("{base}/v1/streams/{id}/messages{query}")).json(body);
    if let Some(key) = key {
        request = request.header("idempotency-key", key);
    }
    let response = request.send().await.expect("the append is answered");
    let status = response.status().as_u16();
    let replayed = match response.headers().get("idempotent-replayed") {
        None => false,
        Some(value) => {
            assert_eq!(value, "true", "the replay header is true or absent");
            true
        }
    };
    (status, response.json().await.expect("the answer is JSON"), replayed)
}

fn text(content: &str) -> Value {
    json!({ "type": "text", "props": { "content": content } })
}

/// The stream's last sequence as its snapshot says.
async fn last_sequence(server: &TestServer, id: &str) -> u64 {
    snapshot(&reqwest::Client::new(), server, id).await["last_sequence"].as_u64().expect("last_sequence")
}

/// Checks a 409 for an append's condition: the envelope, its `param`, its `code` and `last_sequence`.
#[track_caller]
fn assert_conflict(status: u16, body: &Value, param: &str, code: &str, last: u64) {
    assert_eq!(status, 409, "{body}");
    assert_eq!(body["error"]["param"], param, "{body}");
    assert_eq!(body["error"]["code"], code, "{body}");
    assert_eq!(body["error"]["type"], "invalid_request_error", "{body}");
    assert_eq!(body["error"]["last_sequence"], last, "{body}");
}

#[tokio::test]
async fn a_repeat_with_either_condition_appends_nothing_and_answers_the_first_answer_also_after_the_end() {
    let server = TestServer::start().await;
    let client = reqwest::Client::new();
    let conditions: [(Option<&str>, Option<&str>); 3] =
        [(Some("1"), None), (None, Some("key-1")), (Some("1"), Some("k2"))];
    for (after, key) in conditions {
        let what = format!("after {after:?}, key {key:?}");
        let id = create_stream(&client, &server).await;
        let batch =
            json!([text("one"), { "type": "text", "message_id": "d", "delta": true, "props": { "content": "x" } }]);
        let (status, first, replayed) = append(&server.base, &id, after, key, &batch).await;
        assert_eq!(status, 200, "{what}: {first}");
        assert!(!replayed, "{what}: the first is no repeat");
        // The delta opened a message: its `message_start` has a sequence too, and the last is past both.
        assert_eq!(first["sequences"], json!([2, 4]), "{what}: {first}");
        assert_eq!(first["last_sequence"], 4, "{what}: {first}");

        let (status, again, replayed) = append(&server.base, &id, after, key, &batch).await;
        assert_eq!((status, &again, replayed), (200, &first, true), "{what}: the repeat answers the first answer");
        assert_eq!(last_sequence(&server, &id).await, 4, "{what}: the repeat appended nothing");

        end_stream(&client, &server, &id).await;
        let ended = last_sequence(&server, &id).await;
        let (status, late, replayed) = append(&server.base, &id, after, key, &batch).await;
        assert_eq!((status, &late, replayed), (200, &first, true), "{what}: a repeat after the end");
        assert_eq!(last_sequence(&server, &id).await, ended, "{what}");
        // Anything else after the end is refused as ever.
        let (status, refused, _) = append(&server.base, &id, Some(&ended.to_string()), Some("new"), &batch).await;
        assert_eq!((status, &refused["error"]["code"]), (409, &json!("stream_ended")), "{what}: {refused}");
    }
}

#[tokio::test]
async fn every_append_answers_the_last_sequence_and_after_chains_appends() {
    let server = TestServer::start().await;
    let id = create_stream(&reqwest::Client::new(), &server).await;
    let (status, first, _) = append(&server.base, &id, None, None, &text("plain")).await;
    assert_eq!((status, &first), (200, &json!({ "sequences": [2], "last_sequence": 2 })));
    let mut last = 2;
    for n in 0..3 {
        let delta = json!({ "type": "text", "message_id": "m", "delta": true, "props": { "content": format!("{n}") } });
        let (status, body, _) = append(&server.base, &id, Some(&last.to_string()), None, &delta).await;
        assert_eq!(status, 200, "{body}");
        last = body["last_sequence"].as_u64().expect("last_sequence");
    }
    assert_eq!(last, 6, "a message_start, then three deltas");
    assert_eq!(last_sequence(&server, &id).await, last);
}

#[tokio::test]
async fn a_conflict_and_a_gap_are_409_naming_the_last_sequence_and_a_key_reused_for_another_batch_too() {
    let server = TestServer::start().await;
    let id = create_stream(&reqwest::Client::new(), &server).await;
    let (status, body, _) = append(&server.base, &id, Some("1"), Some("k"), &text("first")).await;
    assert_eq!((status, &body["last_sequence"]), (200, &json!(2)), "{body}");

    // Behind the last (another append landed since) and ahead of it (a gap).
    for after in ["1", "0", "3", "900"] {
        let (status, body, replayed) = append(&server.base, &id, Some(after), None, &text("other")).await;
        assert_conflict(status, &body, "after", "sequence_conflict", 2);
        assert_eq!(body["error"]["message"], format!("the stream's last sequence is 2, not {after}"), "{body}");
        assert!(!replayed);
    }
    // The same key with another batch, or with another `after`.
    let (status, body, _) = append(&server.base, &id, Some("1"), Some("k"), &text("another")).await;
    assert_conflict(status, &body, "Idempotency-Key", "idempotency_key_reused", 2);
    let (status, body, _) = append(&server.base, &id, None, Some("k"), &text("first")).await;
    assert_conflict(status, &body, "Idempotency-Key", "idempotency_key_reused", 2);
    assert_eq!(last_sequence(&server, &id).await, 2, "nothing refused was appended");
}

#[tokio::test]
async fn bad_values_for_after_or_the_key_are_400_naming_them() {
    let server = TestServer::start().await;
    let id = create_stream(&reqwest::Client::new(), &server).await;
    for after in ["abc", "-1", "1.5", "99999999999999999999999"] {
        let (status, body, _) = append(&server.base, &id, Some(after), None, &text("x")).await;
        assert_eq!(
            (status, &body["error"]["code"], &body["error"]["param"]),
            (400, &json!("invalid_value"), &json!("after")),
            "{after}: {body}"
        );
    }
    let long = "k".repeat(257);
    for key in ["", long.as_str(), "has space", "tab\tin"] {
        let (status, body, _) = append(&server.base, &id, None, Some(key), &text("x")).await;
        assert_eq!(
            (status, &body["error"]["code"], &body["error"]["param"]),
            (400, &json!("invalid_value"), &json!("Idempotency-Key")),
            "{key:?}: {body}"
        );
    }
    // Not ASCII: bytes a header may carry, but no key.
    let response = reqwest::Client::new()
        .post(server.url(&format!("/v1/streams/{id}/messages")))
        .header("idempotency-key", reqwest::header::HeaderValue::from_bytes(b"caf\xc3\xa9").expect("a header value"))
        .json(&text("x"))
        .send()
        .await
        .expect("answered");
    assert_eq!(response.status(), 400);
    let body: Value = response.json().await.expect("JSON");
    assert_eq!(body["error"]["param"], "Idempotency-Key", "{body}");
    // The longest key is fine.
    let (status, body, _) = append(&server.base, &id, None, Some(&"k".repeat(256)), &text("x")).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(last_sequence(&server, &id).await, 2, "only the last was appended");
}

/// A storage whose logs hold back what is appended while `holding` is set, as a store holds an append until
/// its commit: whoever waits for an acknowledgement waits until [`Gate::open`].
#[derive(Debug, Default)]
struct Gate {
    holding: AtomicBool,
    logs: Mutex<Vec<Arc<Held>>>,
}

#[derive(Debug)]
struct Held {
    inner: Box<dyn Log>,
    pending: Mutex<Vec<Entry>>,
}

impl Gate {
    /// Lets every held entry through, and later ones straight away.
    fn open(&self) {
        self.holding.store(false, Ordering::SeqCst);
        for log in self.logs.lock().expect("logs").iter() {
            let pending = std::mem::take(&mut *log.pending.lock().expect("pending"));
            if !pending.is_empty() {
                log.inner.append(pending);
            }
        }
    }
}

#[derive(Debug)]
struct GatedStorage(Arc<Gate>);

#[derive(Debug)]
struct GatedLog {
    held: Arc<Held>,
    gate: Arc<Gate>,
}

impl Storage for GatedStorage {
    fn log(&self, info: &StreamInfo, client: Option<&str>) -> Box<dyn Log> {
        let held = Arc::new(Held { inner: MemoryStorage.log(info, client), pending: Mutex::new(Vec::new()) });
        self.0.logs.lock().expect("logs").push(Arc::clone(&held));
        Box::new(GatedLog { held, gate: Arc::clone(&self.0) })
    }

    fn evict(&self, _id: &str) {}
}

impl Log for GatedLog {
    fn append(&self, entries: Vec<Entry>) {
        let mut pending = self.held.pending.lock().expect("pending");
        pending.extend(entries);
        if !self.gate.holding.load(Ordering::SeqCst) {
            self.held.inner.append(std::mem::take(&mut *pending));
        }
    }
    fn read(&self, after: u64, max: usize, into: &mut Vec<Entry>) -> Result<(), Gone> {
        self.held.inner.read(after, max, into)
    }
    fn last_sequence(&self) -> u64 {
        self.held.inner.last_sequence()
    }
    fn is_ended(&self) -> bool {
        self.held.inner.is_ended()
    }
    fn outcome(&self) -> Option<Arc<Outcome>> {
        self.held.inner.outcome()
    }
    fn changes(&self) -> watch::Receiver<u64> {
        self.held.inner.changes()
    }
    fn forget(&self) {
        self.held.inner.forget();
    }
    fn memory_bytes(&self) -> u64 {
        self.held.inner.memory_bytes()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeat_sent_while_the_first_waits_for_its_commit_appends_once_and_answers_the_same() {
    let gate = Arc::new(Gate::default());
    let config = HubConfig { storage: Arc::new(GatedStorage(Arc::clone(&gate))), ..HubConfig::default() };
    let server = TestServer::with(config, Settings::default(), Agents::builtin()).await;
    for (after, key) in [(Some("1"), None), (None, Some("racing"))] {
        let id = create_stream(&reqwest::Client::new(), &server).await;
        gate.holding.store(true, Ordering::SeqCst);
        let base = server.base.clone();
        let (first_id, batch) = (id.clone(), json!([text("a"), text("b")]));
        let first_batch = batch.clone();
        let first = tokio::spawn(async move { append(&base, &first_id, after, key, &first_batch).await });
        // The first is in (the stream's producer counted it) but not kept: its answer waits.
        let stream = server.hub.get(&id).expect("the stream");
        common::wait::eventually("the first append to be staged", PATIENCE, async || stream.last_sequence() == 3).await;
        assert!(!first.is_finished(), "the first waits for its commit");
        let base = server.base.clone();
        let repeat_id = id.clone();
        let repeat = tokio::spawn(async move { append(&base, &repeat_id, after, key, &batch).await });
        // The scenario: the repeat reaches the stream while the first still waits (were it slower, it would
        // meet the first's receipt after the commit, which answers the same).
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        assert!(!repeat.is_finished(), "the repeat waits for the first's commit too");
        assert_eq!(stream.last_sequence(), 3, "the repeat appended nothing");
        gate.open();
        let (first, repeat) = (first.await.expect("first"), repeat.await.expect("repeat"));
        assert_eq!((first.0, first.2), (200, false), "{}", first.1);
        assert_eq!((repeat.0, repeat.2), (200, true), "{}", repeat.1);
        assert_eq!(first.1, json!({ "sequences": [2, 3], "last_sequence": 3 }));
        assert_eq!(repeat.1, first.1, "the repeat's answer is the first's");
        assert_eq!(last_sequence(&server, &id).await, 3);
    }
}

type Ws = WebSocketStream<MaybeTlsStream<tokio::net::TcpStream>>;

async fn ws_connect(addr: &str) -> Ws {
    let url = format!("ws://{addr}/v1/ws");
    connect_async(url.as_str()).await.unwrap_or_else(|e| panic!("connect {url}: {e}")).0
}

/// Sends an op and reads the next JSON text frame (pings skipped).
async fn ws_op(ws: &mut Ws, op: Value) -> Value {
    ws.send(WsMessage::text(op.to_string())).await.expect("send");
    loop {
        match tokio::time::timeout(PATIENCE, ws.next()).await.expect("a frame in time") {
            Some(Ok(WsMessage::Text(text))) => return serde_json::from_str(text.as_str()).expect("JSON"),
            Some(Ok(WsMessage::Ping(_) | WsMessage::Pong(_))) => {}
            other => panic!("expected a text frame, got {other:?}"),
        }
    }
}

#[tokio::test]
async fn a_websocket_publish_takes_after_and_a_key_as_an_append_does() {
    let server = TestServer::start().await;
    let id = create_stream(&reqwest::Client::new(), &server).await;
    let mut ws = ws_connect(&server.addr.to_string()).await;
    let publish = |message: Value, after: Value, key: Value| json!({ "op": "publish", "stream": id, "message": message, "after": after, "idempotency_key": key });
    let first = ws_op(&mut ws, publish(text("hi"), json!(1), json!("ws-1"))).await;
    assert_eq!(first, json!({ "stream": id, "published": 2, "last_sequence": 2 }));
    let again = ws_op(&mut ws, publish(text("hi"), json!(1), json!("ws-1"))).await;
    assert_eq!(again, json!({ "stream": id, "published": 2, "last_sequence": 2, "replayed": true }));
    // Also over HTTP: the same batch, the same key, the same condition.
    let (status, body, replayed) = append(&server.base, &id, Some("1"), Some("ws-1"), &text("hi")).await;
    assert_eq!((status, &body, replayed), (200, &json!({ "sequences": [2], "last_sequence": 2 }), true));

    let conflict = ws_op(&mut ws, publish(text("late"), json!(1), Value::Null)).await;
    assert_eq!(conflict["error"]["code"], "sequence_conflict", "{conflict}");
    assert_eq!(conflict["error"]["param"], "after", "{conflict}");
    assert_eq!(conflict["error"]["last_sequence"], 2, "{conflict}");
    let reused = ws_op(&mut ws, publish(text("other"), Value::Null, json!("ws-1"))).await;
    assert_eq!(reused["error"]["code"], "idempotency_key_reused", "{reused}");
    assert_eq!(reused["error"]["param"], "idempotency_key", "{reused}");
    assert_eq!(reused["error"]["last_sequence"], 2, "{reused}");
    let bad = ws_op(&mut ws, publish(text("x"), Value::Null, json!(""))).await;
    assert_eq!((&bad["error"]["code"], &bad["error"]["param"]), (&json!("invalid_value"), &json!("idempotency_key")));
    let bad = ws_op(&mut ws, publish(text("x"), json!("two"), Value::Null)).await;
    assert_eq!(bad["error"]["code"], "invalid_op", "{bad}");
    // Without a condition, as before, with the last sequence.
    let plain = ws_op(&mut ws, json!({ "op": "publish", "stream": id, "message": text("plain") })).await;
    assert_eq!(plain, json!({ "stream": id, "published": 3, "last_sequence": 3 }));
    assert_eq!(last_sequence(&server, &id).await, 3);
}

/// A tool call streamed in deltas, its arguments whole once the fragments are joined.
fn tool_call_deltas() -> Value {
    json!([
        { "type": "tool_call", "message_id": "tc1", "delta": true, "block_id": "b1",
          "props": { "id": "call_1", "name": "get_weather", "arguments": "" } },
        { "type": "tool_call", "message_id": "tc1", "delta": true, "props": { "arguments": "{\"city\":" } },
        { "type": "tool_call", "message_id": "tc1", "delta": true, "props": { "arguments": " \"Paris\"}" } },
    ])
}

/// Reads `format=ui-message` SSE events of an open stream until one has `type` `wanted`; panics if the
/// stream ends first.
async fn ui_message_until(server_base: &str, id: &str, wanted: &str) -> Vec<Value> {
    let url = format!("{server_base}/v1/streams/{id}/events?format=ui-message");
    let mut response = reqwest::Client::new().get(&url).send().await.expect("subscribe");
    let (mut buffer, mut seen) = (Vec::new(), Vec::new());
    loop {
        let chunk = tokio::time::timeout(PATIENCE, response.chunk()).await.expect("an event in time");
        let chunk = chunk.expect("read").unwrap_or_else(|| panic!("the stream ended before {wanted}: {seen:?}"));
        buffer.extend_from_slice(&chunk);
        let (events, used) = parse_sse(&buffer);
        buffer.drain(..used);
        for event in events {
            if event.data == "[DONE]" {
                panic!("the stream ended before {wanted}: {seen:?}");
            }
            let value = event.json();
            assert_ne!(value["type"], "finish", "the stream is still open: {seen:?}");
            let done = value["type"] == wanted;
            seen.push(value);
            if done {
                return seen;
            }
        }
    }
}

#[tokio::test]
async fn ending_a_streamed_tool_call_shows_its_input_before_the_stream_ends_and_a_second_end_ends_nothing() {
    let server = TestServer::start().await;
    let client = reqwest::Client::new();
    let id = create_stream(&client, &server).await;
    let (status, body, _) = append(&server.base, &id, None, None, &tool_call_deltas()).await;
    assert_eq!(status, 200, "{body}");
    let before = body["last_sequence"].as_u64().expect("last_sequence");

    let end = server.url(&format!("/v1/streams/{id}/messages/tc1/end"));
    let (status, ended) = post_empty(&client, &end).await;
    assert_eq!(status, 200, "{ended}");
    assert_eq!(ended, json!({ "sequences": [before + 1], "last_sequence": before + 1 }), "its message_end");
    let events = ui_message_until(&server.base, &id, "tool-input-available").await;
    let available = events.last().expect("an event");
    assert_eq!(available["toolCallId"], "call_1", "{available}");
    assert_eq!(available["input"], json!({ "city": "Paris" }), "{available}");
    assert_eq!(snapshot(&client, &server, &id).await["status"], "open");

    let (status, again) = post_empty(&client, &end).await;
    assert_eq!((status, &again), (200, &json!({ "sequences": [], "last_sequence": before + 1 })), "a repeat");
    // The block: its open messages' message_end (none now), then its block_end; then nothing.
    let block = server.url(&format!("/v1/streams/{id}/blocks/b1/end"));
    let (status, ended) = post_empty(&client, &block).await;
    assert_eq!((status, &ended), (200, &json!({ "sequences": [before + 2], "last_sequence": before + 2 })));
    let (status, again) = post_empty(&client, &block).await;
    assert_eq!((status, &again["sequences"]), (200, &json!([])), "{again}");
    let (_, log) = get_json(&client, &server.url(&format!("/v1/streams/{id}"))).await;
    assert_eq!(log["last_sequence"], before + 2, "{log}");

    // Unknown streams are 404, ended ones 409.
    let (status, body) = post_empty(&client, &server.url("/v1/streams/nope/messages/tc1/end")).await;
    assert_eq!((status, &body["error"]["code"]), (404, &json!("stream_not_found")), "{body}");
    end_stream(&client, &server, &id).await;
    let (status, body) = post_empty(&client, &end).await;
    assert_eq!((status, &body["error"]["code"]), (409, &json!("stream_ended")), "{body}");
}

#[tokio::test]
async fn the_websocket_ends_a_message_and_a_block_with_the_same_answers() {
    let server = TestServer::start().await;
    let id = create_stream(&reqwest::Client::new(), &server).await;
    let (status, body, _) = append(&server.base, &id, None, None, &tool_call_deltas()).await;
    assert_eq!(status, 200, "{body}");
    let last = body["last_sequence"].as_u64().expect("last_sequence");
    let mut ws = ws_connect(&server.addr.to_string()).await;
    // A block ended while its message is open: the message's end, then the block's.
    let ended = ws_op(&mut ws, json!({ "op": "end_block", "stream": id, "block_id": "b1" })).await;
    assert_eq!(ended, json!({ "stream": id, "sequences": [last + 1, last + 2], "last_sequence": last + 2 }));
    let again = ws_op(&mut ws, json!({ "op": "end_message", "stream": id, "message_id": "tc1" })).await;
    assert_eq!(again, json!({ "stream": id, "sequences": [], "last_sequence": last + 2 }));
    let history = server.hub.get(&id).expect("the stream").history();
    let events: Vec<&str> = history[history.len() - 2..].iter().filter_map(|m| m.prop_str("event")).collect();
    assert_eq!(events, ["message_end", "block_end"]);
    let unknown = ws_op(&mut ws, json!({ "op": "end_message", "stream": "nope", "message_id": "tc1" })).await;
    assert_eq!(unknown["error"]["code"], "stream_not_found", "{unknown}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conditional_appends_and_ends_sent_to_the_node_that_does_not_write_the_stream_reach_its_writer() {
    let redis = RedisServer::start();
    let args = ["--engine", "redis", "--redis-url", &redis.url()];
    let (writer, other) = (ServerProcess::spawn(&args), ServerProcess::spawn(&args));
    let client = reqwest::Client::new();
    let (status, created) = post_empty(&client, &writer.url("/v1/streams")).await;
    assert_eq!(status, 201, "{created}");
    let id = created["id"].as_str().expect("an id").to_owned();

    // HTTP through the other node: the condition and the key go with the request, the replay header back.
    let batch = tool_call_deltas();
    let (status, first, replayed) = append(&other.base, &id, Some("1"), Some("c-1"), &batch).await;
    assert_eq!((status, replayed), (200, false), "{first}");
    let last = first["last_sequence"].as_u64().expect("last_sequence");
    let (status, again, replayed) = append(&other.base, &id, Some("1"), Some("c-1"), &batch).await;
    assert_eq!((status, &again, replayed), (200, &first, true));
    let (status, conflict, _) = append(&other.base, &id, Some("1"), None, &text("other")).await;
    assert_conflict(status, &conflict, "after", "sequence_conflict", last);
    let (status, reused, _) = append(&other.base, &id, None, Some("c-1"), &text("other")).await;
    assert_conflict(status, &reused, "Idempotency-Key", "idempotency_key_reused", last);

    // The WebSocket on the other node.
    let mut ws = ws_connect(&other.addr).await;
    let publish =
        json!({ "op": "publish", "stream": id, "message": text("ws"), "after": last, "idempotency_key": "w" });
    let published = ws_op(&mut ws, publish.clone()).await;
    assert_eq!(published, json!({ "stream": id, "published": last + 1, "last_sequence": last + 1 }));
    let replayed = ws_op(&mut ws, publish.clone()).await;
    assert_eq!(replayed["replayed"], true, "{replayed}");
    let conflict = ws_op(&mut ws, json!({ "op": "publish", "stream": id, "message": text("x"), "after": 1 })).await;
    assert_eq!(
        (&conflict["error"]["code"], &conflict["error"]["last_sequence"]),
        (&json!("sequence_conflict"), &json!(last + 1))
    );

    // The ends: the message over HTTP, the block over the WebSocket, both through the other node.
    let (status, ended) = post_empty(&client, &other.url(&format!("/v1/streams/{id}/messages/tc1/end"))).await;
    assert_eq!((status, &ended), (200, &json!({ "sequences": [last + 2], "last_sequence": last + 2 })), "{ended}");
    let ended = ws_op(&mut ws, json!({ "op": "end_block", "stream": id, "block_id": "b1" })).await;
    assert_eq!(ended, json!({ "stream": id, "sequences": [last + 3], "last_sequence": last + 3 }));
    let (status, snapshot) = get_json(&client, &writer.url(&format!("/v1/streams/{id}"))).await;
    assert_eq!((status, &snapshot["last_sequence"]), (200, &json!(last + 3)), "{snapshot}");

    // Once the stream has ended, a repeat through the other node is still answered by the writer.
    let (status, ended) = post_empty(&client, &writer.url(&format!("/v1/streams/{id}/end"))).await;
    assert_eq!(status, 200, "{ended}");
    let (status, late, replayed) = append(&other.base, &id, Some("1"), Some("c-1"), &batch).await;
    assert_eq!((status, &late, replayed), (200, &first, true));
    let again = ws_op(&mut ws, publish).await;
    assert_eq!(again, json!({ "stream": id, "published": last + 1, "last_sequence": last + 1, "replayed": true }));
}
