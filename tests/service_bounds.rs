//! Bounded fields over real sockets ("Holds under abuse", unbounded fields): every name or id a producer or
//! a client gives that is not content (a model name, a message, block or thread id, an event, tool or action
//! name) is at most `NAME_BYTES` long, and over it the request is refused with `400` and the OpenAI error
//! envelope whose `param` names the field, before anything is kept (over WebSocket, a `publish` op's error
//! reply names it the same way).

mod common;

use agentmux::output::NAME_BYTES;
use common::http::{PATIENCE, assert_envelope, create_stream, post_json, snapshot};
use common::server::TestServer;
use futures::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio_tungstenite::connect_async;
use tokio_tungstenite::tungstenite::Message;

/// A name of `bytes` bytes.
fn name(bytes: usize) -> String {
    "n".repeat(bytes)
}

/// Checks a refusal of a name over the limit: `400`, the envelope with `param`, the code OpenAI gives a
/// string too long, and a message that says the limit without echoing the name.
#[track_caller]
fn assert_too_long(status: u16, body: &Value, param: &str) {
    assert_eq!(status, 400, "{body}");
    assert_envelope(body, Some(param), "string_above_max_length");
    assert_eq!(body["error"]["type"], "invalid_request_error", "{body}");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains(&NAME_BYTES.to_string()) && message.len() < 200, "{message}");
}

#[tokio::test]
async fn a_model_name_of_a_mebibyte_is_refused_when_creating_a_stream() {
    let server = TestServer::start().await;
    let client = reqwest::Client::new();
    let url = server.url("/v1/streams");

    let (status, body) = post_json(&client, &url, &json!({ "model": name(1 << 20) })).await;
    assert_too_long(status, &body, "model");
    let (status, body) = post_json(&client, &url, &json!({ "model": name(NAME_BYTES + 1) })).await;
    assert_too_long(status, &body, "model");
    assert_eq!(server.hub.len(), 0, "nothing was created");
    assert_eq!(server.hub.bytes(), 0, "nothing is held");

    let (status, created) = post_json(&client, &url, &json!({ "model": name(NAME_BYTES) })).await;
    assert_eq!(status, 201, "a name at the limit is fine: {created}");
    let id = created["id"].as_str().expect("id");
    let state = snapshot(&client, &server, id).await;
    assert_eq!(state["messages"][0]["props"]["data"]["model"], json!(name(NAME_BYTES)), "{state}");
}

#[tokio::test]
async fn a_model_name_of_a_mebibyte_is_refused_by_chat_completions() {
    let server = TestServer::start().await;
    let client = reqwest::Client::new();
    let url = server.url("/v1/chat/completions");
    for stream in [false, true] {
        let request = json!({
            "model": name(1 << 20),
            "messages": [{ "role": "user", "content": "hi" }],
            "stream": stream,
        });
        let (status, body) = post_json(&client, &url, &request).await;
        assert_too_long(status, &body, "model");
    }
    assert_eq!(server.hub.len(), 0, "no run started");
    // An unknown model within the limit is still a 404 that names it.
    let request = json!({ "model": name(NAME_BYTES), "messages": [{ "role": "user", "content": "hi" }] });
    let (status, body) = post_json(&client, &url, &request).await;
    assert_eq!(status, 404, "{body}");
    assert_envelope(&body, Some("model"), "model_not_found");
}

#[tokio::test]
async fn over_long_names_in_messages_are_refused_with_the_field_and_nothing_is_appended() {
    let server = TestServer::start().await;
    let client = reqwest::Client::new();
    let id = create_stream(&client, &server).await;
    let url = server.url(&format!("/v1/streams/{id}/messages"));
    let before = snapshot(&client, &server, &id).await;
    let bytes = server.hub.bytes();
    let long = name(NAME_BYTES + 1);
    let ok = json!({ "type": "text", "props": { "content": "fine" } });
    let cases = [
        (json!({ "type": "text", "props": { "content": "a" }, "message_id": long }), "messages[0].message_id"),
        (json!([ok, { "type": "event", "props": { "event": long } }]), "messages[1].props.event"),
        (
            json!([ok, ok, { "type": "tool_call", "props": { "id": "call_1", "name": long, "arguments": "{}" } }]),
            "messages[2].props.name",
        ),
        (json!({ "type": "tool_call", "props": { "id": long, "name": "search" } }), "messages[0].props.id"),
        (json!({ "type": "action", "props": { "name": long } }), "messages[0].props.name"),
        (json!({ "type": long, "props": {} }), "messages[0].type"),
        (json!({ "type": "text", "props": { "content": "a" }, "block_id": long }), "messages[0].block_id"),
        (json!({ "type": "text", "props": { "content": "a" }, "thread_id": long }), "messages[0].thread_id"),
        (
            json!({ "type": "text", "props": { "content": "a" }, "metadata": { "trace_id": long } }),
            "messages[0].metadata.trace_id",
        ),
    ];
    for (body, param) in cases {
        let (status, reply) = post_json(&client, &url, &body).await;
        assert_too_long(status, &reply, param);
    }
    assert_eq!(snapshot(&client, &server, &id).await, before, "nothing was appended");
    assert_eq!(server.hub.bytes(), bytes, "nothing more is held");

    // Content is not a name: a long text, tool arguments and keys of free-form data all go in.
    let content = "c".repeat(8 * NAME_BYTES);
    let (status, reply) = post_json(
        &client,
        &url,
        &json!([
            { "type": "text", "props": { "content": content } },
            { "type": "tool_call", "props": { "id": "call_1", "name": "search", "arguments": content } },
            { "type": "event", "props": { "event": "progress", "data": { content.clone(): content } } },
        ]),
    )
    .await;
    assert_eq!(status, 200, "{reply}");
}

#[tokio::test]
async fn an_over_long_name_published_over_websocket_is_refused_with_the_field() {
    let server = TestServer::start().await;
    let client = reqwest::Client::new();
    let id = create_stream(&client, &server).await;
    let before = snapshot(&client, &server, &id).await;
    let url = format!("ws://{}/v1/ws", server.addr);
    let (mut ws, _) = connect_async(url.as_str()).await.expect("connect");
    let message = json!({ "type": "tool_call", "props": { "id": "call_1", "name": name(NAME_BYTES + 1) } });
    let op = json!({ "op": "publish", "stream": id, "message": message });
    ws.send(Message::text(op.to_string())).await.expect("send");
    let reply = loop {
        match tokio::time::timeout(PATIENCE, ws.next()).await.expect("a reply in time") {
            Some(Ok(Message::Text(text))) => break serde_json::from_str::<Value>(text.as_str()).expect("JSON"),
            Some(Ok(_)) => {}
            other => panic!("no reply: {other:?}"),
        }
    };
    assert_eq!(reply["error"]["param"], "message.props.name", "{reply}");
    assert_eq!(reply["error"]["code"], "string_above_max_length", "{reply}");
    assert_eq!(snapshot(&client, &server, &id).await, before, "nothing was appended");
}
