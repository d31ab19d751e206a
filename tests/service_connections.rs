//! Connections per client and per key, and idle and slow connections, over real sockets ("Holds against a
//! determined attacker", items 6 and 9).
//!
//! One address (127.0.0.1) holds its share of connections with slow request heads, idle WebSockets or SSE
//! readers; past its share it is refused (`429 client_connections`), and a second address (127.0.0.2: the
//! loopback is all of 127/8) is still served. A key with `connections=2` holds two, WebSockets counted as
//! event streams are: a third WebSocket is refused 429 before the upgrade. A WebSocket client that answers
//! nothing is closed with 1008 within the idle timeout, one that answers pings is not; a slow head and an
//! idle keep-alive connection are closed after the head timeout.

mod common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use agentmux::agent::Agents;
use agentmux::http::{KeySpec, Settings, budgets};
use agentmux::hub::HubConfig;
use common::http::{PATIENCE, assert_envelope, create_stream};
use common::server::TestServer;
use common::wait::eventually;
use futures::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

/// The address the attacking client connects from (the tests' default one).
const FIRST: &str = "127.0.0.1";
/// Another address on the loopback.
const SECOND: &str = "127.0.0.2";

/// A WebSocket upgrade's head, for `path` (a fixed key: the test reads the answer's status only).
fn upgrade(path: &str, extra: &str) -> String {
    format!(
        "GET {path} HTTP/1.1\r\nhost: x\r\nconnection: upgrade\r\nupgrade: websocket\r\nsec-websocket-version: \
         13\r\nsec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\n{extra}\r\n"
    )
}

/// A connection to `server` from `from` (an address of the loopback).
async fn connect_from(from: &str, server: SocketAddr) -> TcpStream {
    let socket = TcpSocket::new_v4().expect("a socket");
    socket.bind(format!("{from}:0").parse().expect("an address")).expect("bound to the loopback address");
    socket.connect(server).await.expect("connected")
}

/// Reads until a response head is whole (or the connection closes, or `within` passes); returns it.
async fn read_head(tcp: &mut TcpStream, within: Duration) -> String {
    String::from_utf8_lossy(&read_head_bytes(tcp, within).await).into_owned()
}

/// [`read_head`], as bytes, with whatever came after the head in the same reads.
async fn read_head_bytes(tcp: &mut TcpStream, within: Duration) -> Vec<u8> {
    let mut head = Vec::new();
    let read = async {
        let mut buf = [0u8; 1024];
        while !head.windows(4).any(|w| w == b"\r\n\r\n") {
            match tcp.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => head.extend_from_slice(&buf[..n]),
            }
        }
    };
    let _ = tokio::time::timeout(within, read).await;
    head
}

/// Everything the server sends until it closes the connection (within `within`, or the test fails).
async fn read_to_close(tcp: &mut TcpStream, within: Duration) -> String {
    let mut out = Vec::new();
    let read = tokio::time::timeout(within, tcp.read_to_end(&mut out)).await;
    assert!(read.is_ok(), "closed within {within:?}: {}", String::from_utf8_lossy(&out));
    String::from_utf8_lossy(&out).into_owned()
}

/// `GET /healthz` on a new connection from `from`: the response, whole.
async fn health_from(from: &str, server: SocketAddr) -> String {
    let mut tcp = connect_from(from, server).await;
    tcp.write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n").await.expect("write");
    read_to_close(&mut tcp, PATIENCE).await
}

/// A server that serves `max` connections, `share` of them per client address.
async fn capped(max: usize, share: usize) -> TestServer {
    let settings = Settings {
        max_connections: max,
        connections_per_client: Some(share),
        head_timeout: Duration::from_secs(60),
        ..Settings::default()
    };
    TestServer::with(HubConfig::default(), settings, Agents::builtin()).await
}

/// What the first address holds its connections with.
#[derive(Debug, Clone, Copy)]
enum Hold {
    /// A request head that never ends.
    SlowHead,
    /// A WebSocket that says nothing.
    IdleWebSocket,
    /// An SSE reader of a stream that says nothing.
    SseReader,
}

/// The first address opens as many connections of `hold` as the whole cap: its share is served, the rest
/// refused with `429 client_connections` and `retry-after`; the second address is served meanwhile.
async fn one_address_holds_its_share_only(hold: Hold) {
    let (max, share) = (8, 4);
    let server = capped(max, share).await;
    let id = create_stream(&reqwest::Client::new(), &server).await;
    let request = match hold {
        Hold::SlowHead => "GET /healthz HTTP/1.1\r\nhost: x\r\nx-slow: ".to_owned(),
        Hold::IdleWebSocket => upgrade("/v1/ws", ""),
        Hold::SseReader => format!("GET /v1/streams/{id}/events HTTP/1.1\r\nhost: x\r\n\r\n"),
    };
    let mut held = Vec::new();
    for _ in 0..max {
        let mut tcp = connect_from(FIRST, server.addr).await;
        tcp.write_all(request.as_bytes()).await.expect("write");
        held.push(tcp);
    }
    // The share is served (a slow head is not answered at all); every connection past it is refused.
    for (n, tcp) in held.iter_mut().enumerate() {
        let within = if n < share { Duration::from_millis(300) } else { PATIENCE };
        let head = read_head(tcp, within).await;
        match (n < share, hold) {
            (true, Hold::SlowHead) => assert_eq!(head, "", "a slow head waits"),
            (true, Hold::IdleWebSocket) => assert!(head.starts_with("HTTP/1.1 101"), "{head}"),
            (true, Hold::SseReader) => assert!(head.starts_with("HTTP/1.1 200"), "{head}"),
            // A slow head past the share is closed unanswered once its time to send a head is up.
            (false, Hold::SlowHead) => assert!(head.is_empty() || head.starts_with("HTTP/1.1 429"), "{head}"),
            (false, _) => {
                assert!(head.starts_with("HTTP/1.1 429"), "connection {n} is past the share: {head}");
                assert!(head.contains("retry-after: 1"), "{head}");
            }
        }
    }
    let refused = health_from(FIRST, server.addr).await;
    assert!(refused.starts_with("HTTP/1.1 429"), "{refused}");
    assert!(refused.contains("\"code\":\"client_connections\"") && refused.contains("retry-after"), "{refused}");
    assert!(refused.contains(&format!("limit of {share} connections")), "the message names the limit: {refused}");
    let served = health_from(SECOND, server.addr).await;
    assert!(served.starts_with("HTTP/1.1 200"), "another address is served beside {hold:?}: {served}");

    // The first address's place comes back when one of its connections closes.
    held.truncate(share - 1);
    let health = async || health_from(FIRST, server.addr).await.starts_with("HTTP/1.1 200");
    eventually("the first address to be served once one of its connections closed", PATIENCE, health).await;
    drop(held);
    server.stop().await.expect("stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_heads_from_one_address_hold_its_share_only() {
    one_address_holds_its_share_only(Hold::SlowHead).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_websockets_from_one_address_hold_its_share_only() {
    one_address_holds_its_share_only(Hold::IdleWebSocket).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sse_readers_from_one_address_hold_its_share_only() {
    one_address_holds_its_share_only(Hold::SseReader).await;
}

/// A key with `connections=2` holds two WebSockets, or a WebSocket and an event stream; a third is refused
/// `429 key_connections` before the upgrade; another key is served; a WebSocket that closes gives its slot
/// back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keys_connections_count_its_websockets() {
    let keys: Vec<KeySpec> =
        ["sk-small name=small connections=2", "sk-other"].iter().map(|l| l.parse().expect("a keys line")).collect();
    let mut config = HubConfig::default();
    config.limits.client_budgets = budgets(&keys, config.limits.streams_per_client, 0);
    let settings = Settings { api_keys: keys, shutdown_grace: Duration::ZERO, ..Settings::default() };
    let server = TestServer::with(config, settings, Agents::builtin()).await;
    let ws = |key: &'static str| {
        let mut request = format!("ws://{}/v1/ws", server.addr).into_client_request().expect("a request");
        request.headers_mut().insert("authorization", format!("Bearer {key}").parse().expect("a header"));
        tokio_tungstenite::connect_async(request)
    };
    let (mut first, _) = ws("sk-small").await.expect("the first of 2");
    let (second, _) = ws("sk-small").await.expect("the second of 2");
    let refused = ws("sk-small").await.expect_err("a third WebSocket is refused");
    let tokio_tungstenite::tungstenite::Error::Http(response) = refused else { panic!("an HTTP refusal: {refused}") };
    assert_eq!(response.status(), 429);
    assert_eq!(response.headers().get("retry-after").and_then(|v| v.to_str().ok()), Some("1"));
    let body: Value = serde_json::from_slice(response.body().as_deref().unwrap_or_default()).expect("the envelope");
    assert_envelope(&body, None, "key_connections");
    assert!(ws("sk-other").await.is_ok(), "another key is not held up");

    // The WebSockets work meanwhile, and one closed gives its slot back.
    first.send(Message::text(json!({"op": "subscribe", "stream": "nope"}).to_string())).await.expect("send");
    let reply = first.next().await.expect("a reply").expect("a frame");
    assert!(reply.to_text().expect("text").contains("not_found"), "{reply}");
    drop(second);
    let again = async || ws("sk-small").await.is_ok();
    eventually("a WebSocket's slot to come back when it closes", PATIENCE, again).await;

    // An event stream counts beside a WebSocket: with one of each, a third connection is refused.
    let id = reqwest::Client::new()
        .post(server.url("/v1/streams"))
        .bearer_auth("sk-other")
        .json(&json!({}))
        .send()
        .await
        .expect("create")
        .json::<Value>()
        .await
        .expect("json")["id"]
        .as_str()
        .expect("id")
        .to_owned();
    let events = reqwest::Client::new().get(server.url(&format!("/v1/streams/{id}/events"))).bearer_auth("sk-small");
    let watching = events.send().await.expect("watch");
    assert_eq!(watching.status(), 200);
    let held = async || ws("sk-small").await.is_err();
    eventually("the slot taken again by the last WebSocket", PATIENCE, held).await;
    drop((first, watching));
    server.stop().await.expect("stop");
}

/// A server that pings every 200 ms and gives up on a WebSocket silent for 1 s.
async fn pinging() -> TestServer {
    let settings = Settings {
        ws_ping_interval: Duration::from_millis(200),
        ws_idle_timeout: Duration::from_secs(1),
        ..Settings::default()
    };
    TestServer::with(HubConfig::default(), settings, Agents::builtin()).await
}

/// A WebSocket client that reads but never answers (no pong) is pinged, then closed with 1008 within the idle
/// timeout, and its connection closed; the reason says why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_websocket_that_answers_nothing_is_closed_with_1008() {
    let server = pinging().await;
    let mut tcp = TcpStream::connect(server.addr).await.expect("connect");
    tcp.write_all(upgrade("/v1/ws", "").as_bytes()).await.expect("write");
    let opened = Instant::now();
    let mut bytes = read_head_bytes(&mut tcp, PATIENCE).await;
    assert!(bytes.starts_with(b"HTTP/1.1 101"), "{}", String::from_utf8_lossy(&bytes));
    let mut rest = Vec::new();
    let read = tokio::time::timeout(PATIENCE, tcp.read_to_end(&mut rest)).await;
    assert!(read.is_ok(), "the connection closed");
    let closed = opened.elapsed();
    bytes.extend_from_slice(&rest);
    let end = bytes.windows(4).position(|w| w == b"\r\n\r\n").expect("a head") + 4;
    let bytes = &bytes[end..];
    // Server frames are unmasked: opcode, a length under 126, the payload.
    let mut frames = Vec::new();
    let mut at = 0;
    while at + 2 <= bytes.len() {
        let (opcode, length) = (bytes[at] & 0x0f, usize::from(bytes[at + 1] & 0x7f));
        frames.push((opcode, bytes[at + 2..(at + 2 + length).min(bytes.len())].to_vec()));
        at += 2 + length;
    }
    assert!(frames.iter().any(|(opcode, _)| *opcode == 0x9), "pinged first: {frames:?}");
    let (opcode, payload) = frames.last().expect("a close frame");
    assert_eq!(*opcode, 0x8, "the last frame is a close: {frames:?}");
    assert_eq!(u16::from_be_bytes([payload[0], payload[1]]), 1008, "policy violation");
    let reason = String::from_utf8_lossy(&payload[2..]);
    assert!(reason.contains("answer pings"), "{reason}");
    assert!(closed >= Duration::from_millis(900) && closed < Duration::from_secs(4), "closed after {closed:?}");
    server.stop().await.expect("stop");
}

/// A WebSocket client that answers pings (as every client library does while it reads) stays open past the
/// idle timeout, and its ops are served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_websocket_that_answers_pings_stays_open() {
    let server = pinging().await;
    let (mut ws, _) = tokio_tungstenite::connect_async(format!("ws://{}/v1/ws", server.addr)).await.expect("connect");
    let mut pings = 0;
    let listen = async {
        while let Some(message) = ws.next().await {
            match message.expect("a frame") {
                Message::Ping(_) => pings += 1,
                other => panic!("only pings in a silence: {other:?}"),
            }
        }
        panic!("the connection closed");
    };
    // The scenario: three idle timeouts of silence, pings answered.
    let _ = tokio::time::timeout(Duration::from_secs(3), listen).await;
    assert!(pings >= 5, "pinged every 200 ms: {pings}");
    ws.send(Message::text(json!({"op": "unsubscribe", "stream": "s"}).to_string())).await.expect("send");
    let reply = loop {
        match ws.next().await.expect("a frame").expect("a frame") {
            Message::Text(text) => break text,
            _ => continue,
        }
    };
    assert!(reply.contains("not_subscribed"), "{reply}");
    server.stop().await.expect("stop");
}

/// A request head that does not arrive whole, and a keep-alive connection that sends no next request, are
/// closed once the head timeout is up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_heads_and_idle_keep_alive_close_after_the_head_timeout() {
    let settings = Settings { head_timeout: Duration::from_millis(500), ..Settings::default() };
    let server = TestServer::with(HubConfig::default(), settings, Agents::builtin()).await;
    let mut slow = TcpStream::connect(server.addr).await.expect("connect");
    slow.write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\n").await.expect("write");
    let mut idle = TcpStream::connect(server.addr).await.expect("connect");
    idle.write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n").await.expect("write");
    let head = read_head(&mut idle, PATIENCE).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let started = Instant::now();
    let (slow_answer, idle_answer) = tokio::join!(
        read_to_close(&mut slow, Duration::from_secs(3)),
        read_to_close(&mut idle, Duration::from_secs(3))
    );
    assert!(!slow_answer.contains("200"), "a slow head is not served: {slow_answer}");
    assert!(!idle_answer.contains("HTTP/1.1"), "nothing more on the idle connection: {idle_answer}");
    assert!(started.elapsed() < Duration::from_secs(2), "closed after {:?}", started.elapsed());
    server.stop().await.expect("stop");
}
