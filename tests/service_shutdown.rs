//! Graceful shutdown over a real socket: new connections stop, open streams get the grace period (their
//! producers can still append and end them), those still open then end with status `error` and a reason
//! every subscriber sees, WebSocket clients get `done` and a close frame, and the process exits by the grace
//! plus the drain whatever its clients do. The SIGTERM tests run the binary itself.

mod common;

use std::time::{Duration, Instant};

use agentmux::agent::Agents;
use agentmux::http::Settings;
use agentmux::hub::HubConfig;
use common::http::{PATIENCE, assert_envelope, post_empty, post_json, read_events};
use common::process::ServerProcess;
use common::server::TestServer;
use common::wait::eventually;
use futures::{SinkExt, StreamExt};
use serde_json::json;
use tokio::io::AsyncWriteExt;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_ends_open_streams_with_a_reason_and_stops() {
    let settings = Settings { shutdown_grace: Duration::from_millis(300), ..Settings::default() };
    let server = TestServer::with(HubConfig::default(), settings, Agents::builtin()).await;
    let client = reqwest::Client::new();
    let created: serde_json::Value =
        client.post(server.url("/v1/streams")).send().await.expect("create").json().await.expect("json");
    let id = created["id"].as_str().expect("id").to_owned();
    let response = client.get(server.url(&format!("/v1/streams/{id}/events"))).send().await.expect("subscribe");
    assert_eq!(response.status(), 200);
    let mut body = response.bytes_stream();
    let mut first = Vec::new();
    while !String::from_utf8_lossy(&first).contains("stream_start") {
        first.extend_from_slice(&body.next().await.expect("stream_start").expect("bytes"));
    }

    let addr = server.addr;
    let started = Instant::now();
    let stopping = tokio::spawn(server.stop());
    let mut rest = Vec::new();
    while let Some(chunk) = body.next().await {
        rest.extend_from_slice(&chunk.expect("bytes"));
    }
    let rest = String::from_utf8(rest).expect("utf-8");
    assert!(rest.contains("\"event\":\"stream_end\""), "{rest}");
    assert!(rest.contains("\"status\":\"error\"") && rest.contains("the server is shutting down"), "{rest}");
    assert!(started.elapsed() >= Duration::from_millis(250), "the open stream had its grace period");
    tokio::time::timeout(Duration::from_secs(10), stopping).await.expect("stops").expect("join").expect("serve");
    assert!(tokio::net::TcpStream::connect(addr).await.is_err(), "no new connections after shutdown");
}

/// Reads WebSocket messages until the server closes; the texts and the close frame.
async fn read_until_close(
    ws: &mut tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>,
) -> (Vec<String>, Option<CloseFrame>) {
    let mut texts = Vec::new();
    while let Some(message) = ws.next().await {
        match message {
            Ok(Message::Text(text)) => texts.push(text.to_string()),
            Ok(Message::Close(frame)) => return (texts, frame),
            Ok(_) => {}
            Err(error) => panic!("the socket failed before its close frame: {error}; got {texts:?}"),
        }
    }
    panic!("the socket ended without a close frame; got {texts:?}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_gives_websocket_clients_done_and_a_close_frame() {
    let mut server = ServerProcess::spawn(&["--shutdown-grace", "300ms", "--shutdown-drain", "1s"]);
    let client = reqwest::Client::new();
    let (status, created) = post_empty(&client, &server.url("/v1/streams")).await;
    assert_eq!(status, 201, "{created}");
    let id = created["id"].as_str().expect("id").to_owned();

    let (mut one, _) =
        tokio_tungstenite::connect_async(format!("ws://{}/v1/streams/{id}/ws", server.addr)).await.expect("ws one");
    let (mut many, _) = tokio_tungstenite::connect_async(format!("ws://{}/v1/ws", server.addr)).await.expect("ws many");
    let subscribe = json!({ "op": "subscribe", "stream": id, "format": "openai" }).to_string();
    many.send(Message::Text(subscribe.into())).await.expect("subscribe");
    let (mut idle, _) = tokio_tungstenite::connect_async(format!("ws://{}/v1/ws", server.addr)).await.expect("ws idle");
    // Both subscriptions are live before the signal.
    let first = one.next().await.expect("stream_start").expect("frame");
    assert!(first.to_text().expect("text").contains("stream_start"), "{first:?}");
    let ack = many.next().await.expect("ack").expect("frame");
    assert!(ack.to_text().expect("text").contains("subscribed"), "{ack:?}");

    server.terminate();
    let (texts, close) = read_until_close(&mut one).await;
    let all = texts.join("\n");
    assert!(all.contains("stream_end") && all.contains("\"code\":\"shutdown\""), "{all}");
    assert!(texts.last().is_some_and(|t| t.contains("\"done\":true")), "{all}");
    assert_eq!(close.as_ref().map(|c| u16::from(c.code)), Some(1001), "{close:?}");

    let (texts, close) = read_until_close(&mut many).await;
    let all = texts.join("\n");
    assert!(all.contains("\"error\"") && all.contains("\"done\":true"), "{all}");
    assert_eq!(close.as_ref().map(|c| u16::from(c.code)), Some(1001), "{close:?}");
    let (_, close) = read_until_close(&mut idle).await;
    assert_eq!(close.as_ref().map(|c| u16::from(c.code)), Some(1001), "{close:?}");

    let (took, clean) = server.wait_exit(Duration::from_secs(10));
    assert!(clean, "exit status 0");
    assert!(took < Duration::from_secs(3), "exited within the grace and the drain: {took:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn producers_end_their_streams_during_the_grace() {
    let mut server = ServerProcess::spawn(&["--shutdown-grace", "20s", "--shutdown-drain", "1s"]);
    let client = reqwest::Client::new();
    let (status, created) = post_empty(&client, &server.url("/v1/streams")).await;
    assert_eq!(status, 201, "{created}");
    let id = created["id"].as_str().expect("id").to_owned();
    let watcher = reqwest::Client::new();
    let events = watcher.get(server.url(&format!("/v1/streams/{id}/events"))).send().await.expect("subscribe");

    server.terminate();
    // The shutdown has begun once the service says it takes no new work (asked on a connection of its own).
    let draining = async || {
        let ready = reqwest::Client::new().get(server.url("/readyz")).send().await;
        ready.is_ok_and(|ready| ready.status() == 503)
    };
    eventually("the shutdown to begin", PATIENCE, draining).await;
    let message = json!({ "type": "text", "props": { "content": "last words" } });
    let (status, body) = post_json(&client, &server.url(&format!("/v1/streams/{id}/messages")), &message).await;
    assert_eq!(status, 200, "the producer still appends during the grace: {body}");
    let (status, body) = post_empty(&client, &server.url("/v1/streams")).await;
    assert_eq!(status, 503, "{body}");
    assert_envelope(&body, None, "shutting_down");
    // Its client's pool may open a new connection to do it.
    let fresh = reqwest::Client::new();
    let (status, body) = post_empty(&fresh, &server.url(&format!("/v1/streams/{id}/end"))).await;
    assert_eq!(status, 200, "and ends its stream: {body}");

    let events = read_events(events).await;
    let end = events.last().expect("stream_end").json();
    assert_eq!(end["props"]["data"]["status"], "completed", "{end}");
    assert!(events.iter().any(|e| e.data.contains("last words")));
    // Nothing is open any more: no need to wait for the rest of the grace.
    let (took, clean) = server.wait_exit(Duration::from_secs(10));
    assert!(clean && took < Duration::from_secs(3), "{took:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_clients_do_not_keep_the_process_alive() {
    let mut server = ServerProcess::spawn(&[
        "--shutdown-grace",
        "500ms",
        "--shutdown-drain",
        "1s",
        "--body-timeout",
        "1h",
        "--keep-alive",
        "0s",
    ]);
    let client = reqwest::Client::new();
    let (status, created) = post_empty(&client, &server.url("/v1/streams")).await;
    assert_eq!(status, 201, "{created}");
    let id = created["id"].as_str().expect("id").to_owned();

    // A subscriber that never reads, behind a stream that fills its socket.
    let mut reader = tokio::net::TcpStream::connect(&server.addr).await.expect("connect");
    let head = format!("GET /v1/streams/{id}/events HTTP/1.1\r\nhost: x\r\n\r\n");
    reader.write_all(head.as_bytes()).await.expect("write");
    let big = json!({ "type": "text", "props": { "content": "x".repeat(200_000) } });
    for _ in 0..40 {
        let (status, body) = post_json(&client, &server.url(&format!("/v1/streams/{id}/messages")), &big).await;
        assert_eq!(status, 200, "{body}");
    }
    // A request whose body never arrives.
    let mut stalled = tokio::net::TcpStream::connect(&server.addr).await.expect("connect");
    let head = "POST /v1/streams HTTP/1.1\r\nhost: x\r\ncontent-length: 100\r\n\r\n{";
    stalled.write_all(head.as_bytes()).await.expect("write");
    // The client stalls a moment mid-body before the shutdown: the scenario, not synchronisation.
    tokio::time::sleep(Duration::from_millis(100)).await;

    server.terminate();
    let (took, _) = server.wait_exit(Duration::from_secs(10));
    assert!(took < Duration::from_millis(3_500), "exited by the grace plus the drain: {took:?}");
    drop((reader, stalled));
}
