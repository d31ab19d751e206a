//! The lifecycle events (`stream_start`, `stream_end`, `message_start`, `message_end`, `block_start`,
//! `block_end`) are the stream's own: a producer cannot append one, by an HTTP append, a WebSocket `publish`
//! or a Rust agent's `Output`, whole, as a delta, by `type_change`, or spelt by appending to an event's name.
//! Each is refused with `param` naming the field, nothing of it is appended, and a CUI reader that follows the
//! stream from its start sees exactly one `stream_end`, the real one, last.

mod common;

use std::time::Duration;

use agentmux::agent::Output;
use agentmux::hub::AppendError;
use agentmux::output::OutputMessage;
use common::http::{
    PATIENCE, assert_envelope, assert_whole_cui, create_stream, end_stream, lifecycle, post_json, read_events,
    sequences,
};
use common::server::TestServer;
use futures::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::Message;

const NAMES: [&str; 6] = ["stream_start", "stream_end", "message_start", "message_end", "block_start", "block_end"];

/// The ways a producer's message could be a lifecycle event named `name`, each with the field refused.
fn forgeries(name: &str) -> Vec<(Value, &'static str)> {
    vec![
        (
            json!({"type": "event", "props": {"event": name, "data": {"status": "completed", "duration_ms": 1}}}),
            "props.event",
        ),
        (
            json!({"type": "event", "props": {"event": name}, "message_id": "e", "delta": true,
            "delta_path": "event", "delta_action": "set"}),
            "props.event",
        ),
        (
            json!({"type": "event", "props": {"event": name}, "message_id": "t", "delta": true, "type_change": true,
            "delta_path": "", "delta_action": "replace"}),
            "props.event",
        ),
        (
            json!({"type": "event", "props": {"event": "_end"}, "message_id": "e", "delta": true,
            "delta_path": "event"}),
            "delta_action",
        ),
    ]
}

async fn ws_reply(
    ws: &mut tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>,
) -> Value {
    loop {
        match tokio::time::timeout(PATIENCE, ws.next()).await.expect("a reply in time") {
            Some(Ok(Message::Text(text))) => return serde_json::from_str(text.as_str()).expect("JSON"),
            Some(Ok(Message::Ping(_) | Message::Pong(_))) => {}
            other => panic!("expected a text frame, got {other:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_producer_path_appends_a_lifecycle_event_and_readers_see_only_the_real_end() {
    let server = TestServer::start().await;
    let client = reqwest::Client::new();
    let id = create_stream(&client, &server).await;
    let messages = server.url(&format!("/v1/streams/{id}/messages"));
    // A CUI reader from the start, following live.
    let reader = client.get(server.url(&format!("/v1/streams/{id}/events"))).send().await.expect("GET events");
    assert_eq!(reader.status(), 200);
    // The messages the forgeries would continue: an event (`e`) and a text (`t`).
    let (status, reply) = post_json(
        &client,
        &messages,
        &json!([{"type": "event", "props": {"event": "stream"}, "message_id": "e"},
                {"type": "text", "props": {"content": "hello"}, "message_id": "t"}]),
    )
    .await;
    assert_eq!(status, 200, "{reply}");
    let mut kept = sequences(&reply);

    let (mut ws, _) = tokio_tungstenite::connect_async(format!("ws://{}/v1/ws", server.addr)).await.expect("ws");
    let output = Output::new(server.hub.get(&id).expect("the stream"));
    for name in NAMES {
        for (forgery, field) in forgeries(name) {
            // HTTP, alone and second in a batch (which goes in whole or not at all).
            let (status, body) = post_json(&client, &messages, &forgery).await;
            assert_eq!(status, 400, "{forgery}: {body}");
            assert_envelope(&body, Some(&format!("messages[0].{field}")), "invalid_message");
            let batch = json!([{"type": "text", "props": {"content": "lost with the batch"}}, forgery]);
            let (status, body) = post_json(&client, &messages, &batch).await;
            assert_eq!(status, 400, "{forgery}: {body}");
            assert_eq!(body["error"]["param"], format!("messages[1].{field}"), "{body}");
            // The WebSocket: an error reply naming the field; the connection goes on.
            let publish = json!({"op": "publish", "stream": id, "message": forgery});
            ws.send(Message::text(publish.to_string())).await.expect("send");
            let reply = ws_reply(&mut ws).await;
            assert_eq!(reply["error"]["code"], "invalid_message", "{forgery}: {reply}");
            assert_eq!(reply["error"]["param"], format!("message.{field}"), "{reply}");
            // A Rust agent's output: an error.
            let message: OutputMessage = serde_json::from_value(forgery.clone()).expect("a message");
            match output.send(message) {
                Err(AppendError::Invalid(error)) => assert_eq!(error.field(), Some(field), "{error}"),
                other => panic!("{forgery}: {other:?}"),
            }
        }
        // `Output::event` names it directly.
        assert!(matches!(output.event(name, Value::Null), Err(AppendError::Invalid(_))), "{name}");
    }
    // The stream goes on: its producers append and publish as before.
    let publish = json!({"op": "publish", "stream": id, "message": {"type": "event", "props": {"event": "progress"}}});
    ws.send(Message::text(publish.to_string())).await.expect("send");
    kept.push(ws_reply(&mut ws).await["published"].as_u64().expect("published"));
    kept.push(output.text("still going").expect("append"));
    let last = end_stream(&client, &server, &id).await;

    let events = tokio::time::timeout(Duration::from_secs(10), read_events(reader)).await.expect("the reader ends");
    assert_eq!(assert_whole_cui(&events, "completed"), last);
    let named: Vec<Option<String>> = events.iter().map(|e| lifecycle(&e.json()).map(str::to_owned)).collect();
    assert_eq!(named.iter().filter(|n| n.as_deref() == Some("stream_end")).count(), 1, "{named:?}");
    assert_eq!(named.iter().filter(|n| n.as_deref() == Some("stream_start")).count(), 1, "{named:?}");
    assert!(events.iter().all(|e| !e.data.contains("lost with the batch")), "a refused batch appends nothing");
    let ids: Vec<u64> = events.iter().filter_map(|e| e.id).collect();
    assert!(kept.iter().all(|s| ids.contains(s)), "{kept:?} in {ids:?}");
    // Of the producer's, only the messages it was acknowledged: stream_start, the two, the two after, the end.
    assert_eq!(events.len(), 6, "{named:?}");
}

/// The error code `lagged` is the service's notice to a reader whose history is gone, and the formats without
/// sequences carry it only by that code: a producer's `error` message with it (whole, a delta, a code spelt by
/// appending) and an end whose outcome has it are refused, over HTTP and the WebSocket, and nothing is appended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_producer_sends_the_lagged_code_that_readers_trust() {
    let server = TestServer::start().await;
    let client = reqwest::Client::new();
    let id = create_stream(&client, &server).await;
    let messages = server.url(&format!("/v1/streams/{id}/messages"));
    let (status, reply) = post_json(
        &client,
        &messages,
        &json!({"type": "error", "props": {"message": "x", "code": "lag"}, "message_id": "e"}),
    )
    .await;
    assert_eq!(status, 200, "{reply}");
    let forgeries = [
        (json!({"type": "error", "props": {"message": "gone", "code": "lagged"}}), "messages[0].props.code"),
        (
            json!({"type": "error", "props": {"code": "lagged"}, "message_id": "e", "delta": true,
            "delta_path": "code", "delta_action": "set"}),
            "messages[0].props.code",
        ),
        (
            json!({"type": "error", "props": {"code": "ged"}, "message_id": "e", "delta": true, "delta_path": "code"}),
            "messages[0].delta_action",
        ),
    ];
    for (forgery, param) in &forgeries {
        let (status, body) = post_json(&client, &messages, forgery).await;
        assert_eq!(status, 400, "{forgery} -> {body}");
        assert_envelope(&body, Some(param), "invalid_message");
    }
    let (mut ws, _) = tokio_tungstenite::connect_async(format!("ws://{}/v1/ws", server.addr)).await.expect("ws");
    let publish = json!({"op": "publish", "stream": id, "message": forgeries[0].0});
    ws.send(Message::text(publish.to_string())).await.expect("send publish");
    let reply = ws_reply(&mut ws).await;
    assert_eq!(reply["error"]["code"], "invalid_message", "{reply}");
    assert_eq!(reply["error"]["param"], "message.props.code", "{reply}");
    let end = client
        .post(server.url(&format!("/v1/streams/{id}/end")))
        .json(&json!({"status": "error", "error": {"message": "gone", "code": "lagged"}}))
        .send()
        .await
        .expect("POST end");
    assert_eq!(end.status(), 400);
    let body: Value = end.json().await.expect("JSON");
    assert_envelope(&body, Some("error.code"), "invalid_message");
    // Nothing of them was appended: the error as first sent, and the stream still open for a real end.
    let snapshot: Value = client
        .get(server.url(&format!("/v1/streams/{id}")))
        .send()
        .await
        .expect("GET snapshot")
        .json()
        .await
        .expect("JSON");
    assert_eq!(snapshot["status"], "open", "{snapshot}");
    let error = snapshot["messages"].as_array().and_then(|m| m.iter().find(|m| m["type"] == "error")).cloned();
    assert_eq!(error.map(|e| e["props"]["code"].clone()), Some(json!("lag")), "{snapshot}");
    end_stream(&client, &server, &id).await;
}
