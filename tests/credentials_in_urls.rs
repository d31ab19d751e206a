//! Keys only in headers, over real sockets: with keys configured, an API key in `?token=` is refused (401
//! `api_key_in_url`, saying keys go in `Authorization`) on reads, on both WebSocket endpoints and wherever else
//! it comes, while a stream's read token there still reads (`EventSource` and browser WebSockets cannot set
//! headers). And `token_ttl: 0` on create means no expiry, as `0` does inside the token itself.

mod common;

use std::sync::Arc;
use std::time::Duration;

use agentmux::agent::Agents;
use agentmux::http::{KeySpec, Settings};
use agentmux::hub::HubConfig;
use common::doubles::SteppingClock;
use common::http::{PATIENCE, assert_envelope};
use common::server::TestServer;
use futures::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::{Error as WsError, Message};

const KEY: &str = "sk-url-test";

async fn keyed(config: HubConfig) -> TestServer {
    let settings =
        Settings { api_keys: vec![KeySpec::from(KEY)], shutdown_grace: Duration::ZERO, ..Settings::default() };
    TestServer::with(config, settings, Agents::builtin()).await
}

fn encoded(text: &str) -> String {
    url::form_urlencoded::byte_serialize(text.as_bytes()).collect()
}

/// `POST /v1/streams` with the key and `body`: the answer.
async fn create(client: &reqwest::Client, server: &TestServer, body: Value) -> Value {
    let response = client.post(server.url("/v1/streams")).bearer_auth(KEY).json(&body).send().await.expect("POST");
    assert_eq!(response.status(), 201);
    response.json().await.expect("JSON")
}

/// The status of a WebSocket handshake to `path` (101 when it opened), and the socket if it did.
async fn ws_open(
    server: &TestServer,
    path: &str,
) -> (u16, Option<tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>>) {
    match tokio_tungstenite::connect_async(format!("ws://{}{path}", server.addr)).await {
        Ok((ws, response)) => (response.status().as_u16(), Some(ws)),
        Err(WsError::Http(response)) => (response.status().as_u16(), None),
        Err(error) => panic!("{path}: {error}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_in_the_url_is_refused_and_a_read_token_there_still_reads() {
    let server = keyed(HubConfig::default()).await;
    let client = reqwest::Client::new();
    let created = create(&client, &server, json!({})).await;
    let id = created["id"].as_str().expect("id");
    let read = created["read_token"].as_str().expect("read token");
    let key = encoded(KEY);

    // Reads, the list, and a key in the URL beside a good header: 401, saying where keys go.
    for (path, header) in [
        (format!("/v1/streams/{id}/events?token={key}"), false),
        (format!("/v1/streams/{id}?token={key}"), false),
        (format!("/v1/streams?token={key}"), false),
        (format!("/v1/streams/{id}?token={key}"), true),
    ] {
        let request = client.get(server.url(&path));
        let request = if header { request.bearer_auth(KEY) } else { request };
        let response = request.send().await.expect("GET");
        assert_eq!(response.status(), 401, "{path}");
        assert_eq!(response.headers()["www-authenticate"], "Bearer", "{path}");
        let body: Value = response.json().await.expect("JSON");
        assert_envelope(&body, None, "api_key_in_url");
        let message = body["error"]["message"].as_str().expect("a message");
        assert!(message.contains("Authorization") && !message.contains(KEY), "{message}");
    }
    // Both WebSocket endpoints: refused at the handshake, so no op runs.
    for path in ["/v1/ws".to_owned(), format!("/v1/streams/{id}/ws")] {
        let (status, _) = ws_open(&server, &format!("{path}?token={key}")).await;
        assert_eq!(status, 401, "{path}");
    }

    // The stream's read token in the URL still reads: events, the snapshot, a WebSocket that subscribes.
    let token = encoded(read);
    let response = client.get(server.url(&format!("/v1/streams/{id}/events?token={token}"))).send().await.expect("GET");
    assert_eq!(response.status(), 200);
    drop(response);
    let response = client.get(server.url(&format!("/v1/streams/{id}?token={token}"))).send().await.expect("GET");
    assert_eq!(response.status(), 200);
    let (status, ws) = ws_open(&server, &format!("/v1/ws?token={token}")).await;
    assert_eq!(status, 101);
    let mut ws = ws.expect("open");
    ws.send(Message::text(json!({"op": "subscribe", "stream": id}).to_string())).await.expect("send");
    let frame = tokio::time::timeout(PATIENCE, ws.next()).await.expect("a reply in time");
    let Some(Ok(Message::Text(text))) = frame else { panic!("expected a reply, got {frame:?}") };
    assert_eq!(serde_json::from_str::<Value>(text.as_str()).expect("JSON"), json!({"stream": id, "subscribed": true}));
    server.stop().await.expect("stops");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_ttl_of_0_is_no_expiry() {
    // Tokens expire by the hub's clock: it is moved on rather than waited for.
    let clock = Arc::new(SteppingClock::new(1_700_000_000_000));
    // Never idle: the stream outlives the year the clock moves on.
    let config = HubConfig { clock: clock.clone(), idle_timeout: Duration::ZERO, ..HubConfig::default() };
    let server = keyed(config).await;
    let client = reqwest::Client::new();
    let created = create(&client, &server, json!({"token_ttl": 0})).await;
    assert_eq!(created.get("token_expires_at"), None, "{created}");
    let (id, write) = (created["id"].as_str().expect("id"), created["write_token"].as_str().expect("token"));
    assert!(write.starts_with(&format!("amw.{id}.0.")), "a token without expiry: {write}");
    // A year on, it still writes.
    clock.advance(365 * 24 * 3600 * 1000);
    let response = client
        .post(server.url(&format!("/v1/streams/{id}/messages")))
        .bearer_auth(write)
        .json(&json!({"type": "text", "props": {"content": "later"}}))
        .send()
        .await
        .expect("POST");
    assert_eq!(response.status(), 200);
    // A lifetime other than 0 still expires.
    let created = create(&client, &server, json!({"token_ttl": 60})).await;
    assert!(created["token_expires_at"].as_u64().is_some(), "{created}");
    server.stop().await.expect("stops");
}
