//! One run watched at once in every format, each through the client library made for it
//! (`tests/node/watch_all.mjs`: the `ai` package, `@ag-ui/client`, `@anthropic-ai/sdk`, the `openai`
//! package's Responses and chat completions streams, and the typed messages as plain SSE), plus a WebSocket
//! subscriber reading the Anthropic format: all are connected before the producer writes anything, and every
//! one of them assembles the same text.

mod common;

use std::time::Duration;

use common::http::{create_stream, post_empty, post_json};
use common::server::TestServer;
use futures::StreamExt;
use serde_json::{Value, json};
use tokio_tungstenite::connect_async;
use tokio_tungstenite::tungstenite::Message;

/// Subscribers connected now, in every format and transport.
async fn subscribers(client: &reqwest::Client, server: &TestServer) -> f64 {
    let text = client.get(server.url("/metrics")).send().await.expect("scrape").text().await.expect("text");
    text.lines()
        .filter(|line| line.starts_with("agentmux_subscribers{"))
        .filter_map(|line| line.rsplit_once(' ').and_then(|(_, n)| n.parse::<f64>().ok()))
        .sum()
}

#[tokio::test(flavor = "multi_thread")]
async fn one_run_watched_in_every_format_at_once_reads_the_same_everywhere() {
    let server = TestServer::start().await;
    let client = reqwest::Client::new();
    let id = create_stream(&client, &server).await;
    let events = server.url(&format!("/v1/streams/{id}/events"));
    let watchers = tokio::spawn(common::node::run_script("watch_all.mjs", json!({"events": events})));
    let ws_url = format!("ws://{}/v1/streams/{id}/ws?format=anthropic", server.addr);
    let (mut ws, _) = connect_async(ws_url.as_str()).await.expect("the WebSocket");

    // Every watcher connected (six over SSE, one WebSocket) before anything is written.
    let connected = async || subscribers(&client, &server).await >= 7.0;
    common::wait::eventually("every watcher to connect", Duration::from_secs(120), connected).await;
    let messages = server.url(&format!("/v1/streams/{id}/messages"));
    let batch = json!([
        {"type": "thinking", "props": {"content": "One run, every client."}, "message_id": "t1"},
        {"type": "text", "props": {"content": "Hello "}, "message_id": "m1", "delta": true},
        {"type": "loading", "props": {"message": "still going"}, "message_id": "l1"},
        {"type": "text", "props": {"content": "every "}, "message_id": "m1", "delta": true},
    ]);
    assert_eq!(post_json(&client, &messages, &batch).await.0, 200);
    let last = json!({"type": "text", "props": {"content": "format."}, "message_id": "m1", "delta": true});
    assert_eq!(post_json(&client, &messages, &last).await.0, 200);
    assert_eq!(post_empty(&client, &server.url(&format!("/v1/streams/{id}/end"))).await.0, 200);

    let mut ws_text = String::new();
    while let Some(Ok(frame)) = tokio::time::timeout(Duration::from_secs(30), ws.next()).await.expect("in time") {
        let Message::Text(text) = frame else { continue };
        let value: Value = serde_json::from_str(text.as_str()).expect("JSON");
        if value["chunk"]["delta"]["type"] == "text_delta" {
            ws_text.push_str(value["chunk"]["delta"]["text"].as_str().unwrap_or(""));
        }
    }
    let results = watchers.await.expect("the watchers ran");
    server.stop().await.expect("stops");
    let results = &results[0];
    for format in ["ui-message", "ag-ui", "anthropic", "responses", "openai", "cui"] {
        assert_eq!(results[format]["text"], "Hello every format.", "{format}: {}", results[format]);
    }
    assert_eq!(ws_text, "Hello every format.", "the WebSocket's Anthropic chunks");
}
