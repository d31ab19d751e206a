//! Eviction and `lagged` over HTTP and WebSocket, with the hub's clock moved by hand: `lagged` is only for a
//! reader whose next frames are no longer kept. A reader that was handed the whole of an ended stream
//! (here in one batch) but has not read it yet when the stream is evicted still reads it to a clean end;
//! a reader genuinely behind when its stream is evicted gets its format's `lagged` notice and the stream is
//! gone (404).

mod common;

use std::sync::Arc;
use std::time::Duration;

use agentmux::agent::Agents;
use agentmux::http::Settings;
use agentmux::hub::HubConfig;
use common::doubles::SteppingClock;
use common::http::{PATIENCE, assert_whole_cui, create_stream, end_stream, get_json, parse_sse, post_json, read_body};
use common::server::TestServer;
use futures::StreamExt;
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::Message as WsMessage;

/// How long an ended stream is kept, by the hub's clock.
const RETENTION: Duration = Duration::from_secs(60);

/// A server whose hub runs on `clock` and hands a subscriber everything it is behind in one batch.
async fn server(clock: &Arc<SteppingClock>) -> TestServer {
    let config = HubConfig { batch_bytes: 1 << 30, retention: RETENTION, clock: clock.clone(), ..HubConfig::default() };
    TestServer::with(config, Settings::default(), Agents::builtin()).await
}

/// Appends `batches` POSTs of 20 texts of 12 KB (about 240 KB each) to stream `id`, then ends it; the last
/// sequence.
async fn fill_and_end(client: &reqwest::Client, server: &TestServer, id: &str, batches: usize) -> u64 {
    let filler = "y".repeat(12_000);
    let url = server.url(&format!("/v1/streams/{id}/messages"));
    for batch in 0..batches {
        let body: Vec<Value> = (0..20)
            .map(|i| json!({ "type": "text", "props": { "content": format!("{batch}/{i} {filler}") } }))
            .collect();
        let (status, reply) = post_json(client, &url, &json!(body)).await;
        assert_eq!(status, 200, "{reply}");
    }
    end_stream(client, server, id).await
}

/// Ends the stream's retention by the hub's clock and has a GET evict it.
async fn evict(client: &reqwest::Client, server: &TestServer, clock: &SteppingClock, id: &str) {
    clock.advance(RETENTION.as_millis() as u64 + 1);
    let (status, reply) = get_json(client, &server.url(&format!("/v1/streams/{id}"))).await;
    assert_eq!(status, 404, "the stream is evicted: {reply}");
}

/// A server on a clock moved by hand, and an ended stream of about 12 MB (more than the sockets buffer, so
/// the server's writes of it wait for the reader) in 1,002 entries (fewer than a rendition renders in one
/// go, so one batch holds all of it): the server, its clock, a client, the stream id and its last sequence.
async fn ended_stream() -> (TestServer, Arc<SteppingClock>, reqwest::Client, String, u64) {
    let clock = Arc::new(SteppingClock::new(1_700_000_000_000));
    let server = server(&clock).await;
    let client = reqwest::Client::new();
    let id = create_stream(&client, &server).await;
    let last = fill_and_end(&client, &server, &id, 50).await;
    assert_eq!(last, 1002, "stream_start, 1,000 texts, stream_end");
    (server, clock, client, id, last)
}

/// An SSE body being read. The server takes a subscriber's batch when it polls the body for it, which may be
/// after the client sees the headers (and the CUI format's `retry:` block); once the first event's bytes are
/// in, the server holds the whole stream.
struct Reading {
    body: std::pin::Pin<Box<dyn futures::Stream<Item = reqwest::Result<bytes::Bytes>> + Send>>,
    read: Vec<u8>,
}

impl Reading {
    /// Subscribes at `path` and waits for the first event's bytes.
    async fn start(server: &TestServer, path: &str) -> Reading {
        let response = reqwest::Client::new().get(server.url(path)).send().await.expect("subscribe");
        assert_eq!(response.status(), 200);
        let body = Box::pin(response.bytes_stream());
        let mut reading = Reading { body, read: Vec::new() };
        while !reading.read.windows(5).any(|w| w == b"data:") {
            let chunk = tokio::time::timeout(PATIENCE, reading.body.next()).await.expect("the first event in time");
            reading.read.extend_from_slice(&chunk.expect("the body goes on").expect("body bytes"));
        }
        reading
    }

    /// Reads the rest of the body to its end; all of it.
    async fn read_to_end(mut self) -> Vec<u8> {
        while let Some(chunk) = tokio::time::timeout(PATIENCE, self.body.next()).await.expect("the body ends in time") {
            self.read.extend_from_slice(&chunk.expect("body bytes"));
        }
        self.read
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cui_sse_reader_handed_the_whole_stream_before_its_eviction_ends_at_stream_end() {
    let (server, clock, client, id, last) = ended_stream().await;
    let reading = Reading::start(&server, &format!("/v1/streams/{id}/events")).await;
    evict(&client, &server, &clock, &id).await;

    let body = reading.read_to_end().await;
    let (events, used) = parse_sse(&body);
    assert_eq!(used, body.len());
    let after_end: Vec<&str> =
        events.iter().skip_while(|e| e.id != Some(last)).skip(1).map(|e| e.data.as_str()).collect();
    assert!(after_end.is_empty(), "the body ends after stream_end, but then came {after_end:?}");
    assert_eq!(assert_whole_cui(&events, "completed"), last);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_openai_sse_reader_handed_the_whole_stream_before_its_eviction_ends_at_done() {
    let (server, clock, client, id, _) = ended_stream().await;
    let reading = Reading::start(&server, &format!("/v1/streams/{id}/events?format=openai")).await;
    evict(&client, &server, &clock, &id).await;

    let body = reading.read_to_end().await;
    let (events, used) = parse_sse(&body);
    assert_eq!(used, body.len());
    let done = events.iter().position(|e| e.data == "[DONE]").expect("[DONE]");
    assert_eq!(events[done - 1].json()["choices"][0]["finish_reason"], "stop");
    let after_done: Vec<&str> = events[done + 1..].iter().map(|e| e.data.as_str()).collect();
    assert!(after_done.is_empty(), "nothing after [DONE], but then came {after_done:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_websocket_reader_handed_the_whole_stream_before_its_eviction_closes_with_stream_ended() {
    let (server, clock, client, id, last) = ended_stream().await;
    let url = format!("ws://{}/v1/streams/{id}/ws", server.addr);
    let (mut ws, _) = tokio_tungstenite::connect_async(url.as_str()).await.expect("WebSocket subscriber");
    // The connection takes the stream once the upgrade is done, which the client may see before, and a busy
    // machine may hand it over in more than one batch: evict once every message has reached the client.
    let mut frames = Vec::new();
    while frames.last().is_none_or(|f: &Value| f["seq"] != json!(last)) {
        let frame = tokio::time::timeout(PATIENCE, ws.next()).await.expect("a frame in time");
        let WsMessage::Text(text) = frame.expect("the connection is open").expect("a frame") else {
            panic!("every message of the stream first")
        };
        frames.push(serde_json::from_str::<Value>(text.as_str()).expect("JSON"));
    }
    evict(&client, &server, &clock, &id).await;

    let close = loop {
        let message = tokio::time::timeout(PATIENCE, ws.next()).await.expect("a frame in time");
        match message.expect("the connection is open").expect("a frame") {
            WsMessage::Text(text) => frames.push(serde_json::from_str::<Value>(text.as_str()).expect("JSON")),
            WsMessage::Close(frame) => break frame.expect("a close frame"),
            other => panic!("unexpected {other:?}"),
        }
    };
    let done = frames.iter().position(|f| f.get("done").is_some()).expect("done");
    assert_eq!(frames[done], json!({ "stream": id, "done": true, "status": "completed" }));
    for (index, frame) in frames[..done].iter().enumerate() {
        assert_eq!(frame["seq"], json!(index + 1), "every message before done, in order");
    }
    assert_eq!(done as u64, last);
    assert_eq!(frames[done + 1..], [] as [Value; 0], "nothing after done");
    assert_eq!((u16::from(close.code), close.reason.as_str()), (1000, "stream ended"), "{close:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_behind_when_their_stream_is_evicted_get_lagged() {
    let clock = Arc::new(SteppingClock::new(1_700_000_000_000));
    let config = HubConfig { retention: RETENTION, clock: clock.clone(), ..HubConfig::default() };
    let server = TestServer::with(config, Settings::default(), Agents::builtin()).await;
    let client = reqwest::Client::new();
    let id = create_stream(&client, &server).await;
    // 3,002 entries of 4 KB: a reader that reads nothing is handed at most what the sockets buffer (a few MB),
    // and the rest waits in the hub.
    let url = server.url(&format!("/v1/streams/{id}/messages"));
    let filler = "z".repeat(4000);
    for batch in 0..150 {
        let body: Vec<Value> = (0..20)
            .map(|i| json!({ "type": "text", "props": { "content": format!("{batch}/{i} {filler}") } }))
            .collect();
        let (status, reply) = post_json(&client, &url, &json!(body)).await;
        assert_eq!(status, 200, "{reply}");
    }
    let last = end_stream(&client, &server, &id).await;

    let sse = reqwest::Client::new().get(server.url(&format!("/v1/streams/{id}/events"))).send().await.expect("SSE");
    assert_eq!(sse.status(), 200);
    let ws_url = format!("ws://{}/v1/streams/{id}/ws", server.addr);
    let (mut ws, _) = tokio_tungstenite::connect_async(ws_url.as_str()).await.expect("WebSocket subscriber");
    evict(&client, &server, &clock, &id).await;

    // SSE: events 1..=k without gaps, then the lagged notice without an id, then the end of the body.
    let body = read_body(sse).await;
    let (events, used) = parse_sse(&body);
    assert_eq!(used, body.len());
    let (notice, delivered) = events.split_last().expect("events");
    assert!(!delivered.is_empty() && (delivered.len() as u64) < last, "{} of {last} delivered", delivered.len());
    for (index, event) in delivered.iter().enumerate() {
        assert_eq!(event.id, Some(index as u64 + 1), "nothing skipped before the notice");
    }
    assert_eq!(notice.id, None, "the notice is not part of the log: {}", notice.data);
    let notice = notice.json();
    assert_eq!(
        (notice["type"].as_str(), notice["props"]["code"].as_str()),
        (Some("error"), Some("lagged")),
        "{notice}"
    );
    assert!(notice["props"]["details"]["resume_from"].is_u64(), "{notice}");
    eprintln!("SSE reader behind at eviction: lagged after {} of {last}", delivered.len());

    // WebSocket: frames 1..=k, the lagged error naming the stream, then a normal close saying `lagged`.
    let mut seq = 0u64;
    let (error, close) = loop {
        let message = tokio::time::timeout(PATIENCE, ws.next()).await.expect("a frame in time");
        let WsMessage::Text(text) = message.expect("the connection is open").expect("a frame") else {
            panic!("a text frame before the close");
        };
        let frame: Value = serde_json::from_str(text.as_str()).expect("JSON");
        if frame.get("error").is_some() {
            let close = tokio::time::timeout(PATIENCE, ws.next()).await.expect("the close in time");
            break (frame, close);
        }
        seq += 1;
        assert_eq!(frame["seq"], json!(seq), "nothing skipped before the notice");
    };
    assert!(seq < last, "the WebSocket reader was behind: {seq} of {last}");
    assert_eq!((error["stream"].as_str(), error["error"]["code"].as_str()), (Some(id.as_str()), Some("lagged")));
    match close {
        Some(Ok(WsMessage::Close(Some(frame)))) => {
            assert_eq!((u16::from(frame.code), frame.reason.as_str()), (1000, "lagged"), "{frame:?}");
        }
        other => panic!("expected a close frame after lagged, got {other:?}"),
    }
    eprintln!("WebSocket reader behind at eviction: lagged after {seq} of {last}");

    // The stream is gone.
    let (status, reply) = get_json(&client, &server.url(&format!("/v1/streams/{id}/events"))).await;
    assert_eq!(status, 404, "{reply}");
}
