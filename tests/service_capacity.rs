//! The hub's byte limit over HTTP (issue 9, defect 1): with the hub full, a new delta message on a fresh
//! stream is refused with `503 capacity`, and so is every retry, without a panic or a dropped connection and
//! without changing the stream (no `message_start` nobody received, no bytes kept); once the stream that
//! filled the hub has ended and been evicted (by the hub's own clock, moved by hand), the same request
//! succeeds once, and the stream's CUI and OpenAI subscribers read exactly its log, whose reduction is the
//! snapshot.

mod common;

use std::sync::Arc;
use std::time::Duration;

use agentmux::agent::Agents;
use agentmux::http::Settings;
use agentmux::hub::{HubConfig, Limits};
use agentmux::output::{OutputMessage, Reducer};
use common::doubles::SteppingClock;
use common::http::{
    assert_envelope, assert_sse_headers, assert_whole_cui, create_stream, end_stream, get_json, header, lifecycle,
    parse_sse, post_json, read_body, read_events, sequences, snapshot,
};
use common::server::TestServer;
use serde_json::{Value, json};

/// The hub's byte limit in this test.
const HUB_BYTES: u64 = 64 << 10;
/// How long an ended stream is kept, by the hub's clock.
const RETENTION: Duration = Duration::from_secs(60);

/// The request of the issue: one new message, streamed in deltas, that the hub has no room for.
fn refused_message() -> Value {
    json!({ "type": "text", "props": { "content": "x" }, "message_id": "m1", "delta": true })
}

/// Appends single text messages of `size` characters to `url` until the hub refuses one with `503 capacity`;
/// returns how many went in.
async fn fill(client: &reqwest::Client, url: &str, size: usize) -> usize {
    let content = "f".repeat(size);
    for accepted in 0..=(HUB_BYTES as usize) {
        let (status, reply) = post_json(client, url, &json!({ "type": "text", "props": { "content": content } })).await;
        match status {
            200 => {}
            503 => {
                assert_envelope(&reply, Some("messages[0]"), "capacity");
                return accepted;
            }
            other => panic!("filling with {size}-character texts: {other} {reply}"),
        }
    }
    panic!("the hub never filled up with {size}-character texts")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_append_leaves_the_stream_as_it_was_and_succeeds_once_space_is_freed() {
    let clock = Arc::new(SteppingClock::new(1_700_000_000_000));
    let config = HubConfig {
        limits: Limits { hub_bytes: HUB_BYTES, ..Limits::default() },
        retention: RETENTION,
        clock: clock.clone(),
        ..HubConfig::default()
    };
    let server = TestServer::with(config, Settings::default(), Agents::builtin()).await;
    let client = reqwest::Client::new();

    // The fresh stream first (creating one needs room for its stream_start), then one that fills the hub:
    // big messages, then smaller and smaller ones, until not even a one-character text fits.
    let fresh = create_stream(&client, &server).await;
    let filler = create_stream(&client, &server).await;
    let filler_url = server.url(&format!("/v1/streams/{filler}/messages"));
    let mut filled = 0;
    for size in [2000, 200, 1] {
        filled += fill(&client, &filler_url, size).await;
    }
    assert!(filled > 10, "the filler stream holds {filled} messages");
    // The first snapshot makes the stream's reduction of its log, which counts (never refused); the count
    // is taken after it, so every later snapshot reads an unchanged hub.
    let before = snapshot(&client, &server, &fresh).await;
    let full = server.hub.bytes();
    assert!(full <= HUB_BYTES + 1_000, "the hub holds {full} bytes: its limit of {HUB_BYTES}, and a snapshot");
    assert_eq!(before["last_sequence"], 1, "the fresh stream holds its stream_start: {before}");

    // The new delta message on the fresh stream: 503 capacity, and the same for every retry, on the same
    // connection; nothing of it is kept.
    let fresh_url = server.url(&format!("/v1/streams/{fresh}/messages"));
    for attempt in 1..=3 {
        let response = client
            .post(&fresh_url)
            .json(&refused_message())
            .send()
            .await
            .unwrap_or_else(|e| panic!("attempt {attempt}: the server answers a refused append: {e}"));
        assert_eq!(response.status(), 503, "attempt {attempt}");
        assert!(
            response.headers().get("x-should-retry").is_none_or(|v| v != "false"),
            "capacity is retryable: {:?}",
            response.headers()
        );
        assert_eq!(header(&response, "content-type"), "application/json");
        let reply: Value = response.json().await.expect("the refusal is JSON");
        assert_envelope(&reply, Some("messages[0]"), "capacity");
        assert_eq!(reply["error"]["type"], "server_error", "{reply}");
        assert_eq!(snapshot(&client, &server, &fresh).await, before, "attempt {attempt}: the stream is unchanged");
        assert_eq!(server.hub.bytes(), full, "attempt {attempt}: a refused append keeps no bytes");
    }

    // Free the space: end the filler stream and let its retention pass by the hub's clock; the next GET
    // evicts it.
    end_stream(&client, &server, &filler).await;
    clock.advance(RETENTION.as_millis() as u64 + 1);
    let (status, gone) = get_json(&client, &server.url(&format!("/v1/streams/{filler}"))).await;
    assert_eq!(status, 404, "the filler stream is evicted: {gone}");
    assert!(server.hub.bytes() < full / 2, "eviction gave its bytes back: {} of {full}", server.hub.bytes());
    assert_eq!(snapshot(&client, &server, &fresh).await, before, "the fresh stream is still as it was");

    // The same request now succeeds, once: its message_start, then the message.
    let (status, reply) = post_json(&client, &fresh_url, &refused_message()).await;
    assert_eq!(status, 200, "{reply}");
    assert_eq!(sequences(&reply), [3], "after stream_start (1) and the message_start (2): {reply}");
    let last = end_stream(&client, &server, &fresh).await;
    let state = snapshot(&client, &server, &fresh).await;
    assert_eq!(state["status"], "completed", "{state}");
    assert_eq!(state["last_sequence"], last, "{state}");

    // A CUI subscriber from the start reads exactly the stream's log: the message once, its lifecycle around it.
    let response = client.get(server.url(&format!("/v1/streams/{fresh}/events"))).send().await.expect("subscribe");
    assert_sse_headers(&response);
    let events = read_events(response).await;
    assert_eq!(assert_whole_cui(&events, "completed"), last);
    let received: Vec<OutputMessage> = events
        .iter()
        .map(|event| serde_json::from_str(&event.data).unwrap_or_else(|e| panic!("a message ({e}): {}", event.data)))
        .collect();
    let stream = server.hub.get(&fresh).expect("the fresh stream is still in the hub");
    assert_eq!(received, stream.history(), "the subscriber reads the stream's log, message for message");
    let shape: Vec<String> = events
        .iter()
        .map(|event| {
            let message = event.json();
            lifecycle(&message).map_or_else(|| format!("{}:{}", message["type"], message["message_id"]), str::to_owned)
        })
        .collect();
    assert_eq!(
        shape,
        ["stream_start", "message_start", r#""text":"m1""#, "message_end", "stream_end"],
        "the refused attempts left nothing behind"
    );

    // What the subscriber received, reduced, is the snapshot.
    let mut reducer = Reducer::default();
    for message in &received {
        reducer.apply(message).unwrap_or_else(|e| panic!("the log reduces ({e}): {message:?}"));
    }
    let snapshot_messages: Vec<OutputMessage> =
        serde_json::from_value(state["messages"].clone()).expect("the snapshot's messages are messages");
    assert_eq!(reducer.messages(), snapshot_messages.as_slice(), "the snapshot is the subscriber's reduction");
    let texts: Vec<&Value> = state["messages"]
        .as_array()
        .expect("messages")
        .iter()
        .filter(|m| m["message_id"] == "m1")
        .map(|m| &m["props"]["content"])
        .collect();
    assert_eq!(texts, [&json!("x")], "one m1, with its one delta: {state}");

    // An OpenAI subscriber gets the same text.
    let response =
        client.get(server.url(&format!("/v1/streams/{fresh}/events?format=openai"))).send().await.expect("openai");
    assert_sse_headers(&response);
    let body = read_body(response).await;
    let (chunks, used) = parse_sse(&body);
    assert_eq!(used, body.len());
    let (done, chunks) = chunks.split_last().expect("chunks");
    assert_eq!(done.data, "[DONE]");
    let content: String =
        chunks.iter().filter_map(|c| c.json()["choices"][0]["delta"]["content"].as_str().map(str::to_owned)).collect();
    assert_eq!(content, "x", "the OpenAI rendering of the same log");
}
