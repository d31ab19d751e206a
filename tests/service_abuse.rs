//! One anonymous client against the real server, with small limits: it cannot fill the hub with streams
//! (a per-client budget of streams held; idle streams end, and ended streams are evicted early to make
//! room), hold connections with
//! bodies that never arrive, or keep the service from serving others past the connection cap. Capacity
//! refusals say whether a retry helps.

mod common;

use std::time::{Duration, Instant};

use agentmux::agent::Agents;
use agentmux::http::Settings;
use agentmux::hub::{HubConfig, Limits};
use common::http::{PATIENCE, assert_envelope, create_stream, end_stream, header, post_empty, post_json, snapshot};
use common::server::TestServer;
use common::wait::eventually;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

async fn start(limits: Limits, idle_timeout: Duration, settings: Settings) -> TestServer {
    let config = HubConfig { limits, idle_timeout, ..HubConfig::default() };
    // Streams left open end at once when the test stops the server.
    let settings = Settings { shutdown_grace: Duration::ZERO, ..settings };
    TestServer::with(config, settings, Agents::builtin()).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_client_cannot_open_more_than_its_budget() {
    let limits = Limits { streams_per_client: 3, ..Limits::default() };
    let server = start(limits, Duration::from_secs(600), Settings::default()).await;
    let client = reqwest::Client::new();
    let mut ids = Vec::new();
    for _ in 0..3 {
        ids.push(create_stream(&client, &server).await);
    }
    let refused = client.post(server.url("/v1/streams")).send().await.expect("create");
    assert_eq!(refused.status(), 429);
    assert_eq!(header(&refused, "retry-after"), "600", "by the idle timeout one of them ends by itself");
    assert!(refused.headers().get("x-should-retry").is_none(), "a retry then helps");
    let body: Value = refused.json().await.expect("json");
    assert_envelope(&body, None, "too_many_streams");

    // A chat run is a stream too, and spends the same budget.
    let chat = json!({ "model": "echo", "messages": [{ "role": "user", "content": "hi" }] });
    let (status, body) = post_json(&client, &server.url("/v1/chat/completions"), &chat).await;
    assert_eq!(status, 429, "{body}");

    // Ending one makes room: the ended stream stays readable, and counts until it is evicted, which the
    // client's next stream does.
    end_stream(&client, &server, &ids[0]).await;
    snapshot(&client, &server, &ids[0]).await;
    let (status, body) = post_json(&client, &server.url("/v1/chat/completions"), &chat).await;
    assert_eq!(status, 200, "{body}");
    let gone = client.get(server.url(&format!("/v1/streams/{}", ids[0]))).send().await.expect("read");
    assert_eq!(gone.status(), 404, "evicted for the run");
    let (status, body) = post_empty(&client, &server.url("/v1/streams")).await;
    assert_eq!(status, 201, "the finished run gave its place up: {body}");
    let (status, body) = post_empty(&client, &server.url("/v1/streams")).await;
    assert_eq!(status, 429, "the open ones did not: {body}");
    server.stop().await.expect("stop");

    // Without an idle timeout only the client can make room: no retry helps.
    let limits = Limits { streams_per_client: 1, ..Limits::default() };
    let server = start(limits, Duration::ZERO, Settings::default()).await;
    create_stream(&client, &server).await;
    let refused = client.post(server.url("/v1/streams")).send().await.expect("create");
    assert_eq!(refused.status(), 429);
    assert_eq!(header(&refused, "x-should-retry"), "false", "waiting alone frees nothing of this client's");
    assert!(refused.headers().get("retry-after").is_none());
    server.stop().await.expect("stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_per_minute_budget_says_when_to_retry() {
    let limits = Limits { streams_per_client_per_minute: 2, ..Limits::default() };
    let server = start(limits, Duration::from_secs(600), Settings::default()).await;
    let client = reqwest::Client::new();
    for _ in 0..2 {
        let id = create_stream(&client, &server).await;
        end_stream(&client, &server, &id).await;
    }
    let refused = client.post(server.url("/v1/streams")).send().await.expect("create");
    assert_eq!(refused.status(), 429);
    let after: u64 = header(&refused, "retry-after").parse().expect("retry-after in seconds");
    assert!((1..=60).contains(&after), "retry-after {after}");
    assert!(refused.headers().get("x-should-retry").is_none(), "a retry helps");
    assert_envelope(&refused.json().await.expect("json"), None, "rate_limit_exceeded");
    server.stop().await.expect("stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_hub_says_whether_a_retry_helps() {
    // Full of open streams that never time out: nothing frees room by itself.
    let limits = Limits { streams: 2, ..Limits::default() };
    let server = start(limits.clone(), Duration::ZERO, Settings::default()).await;
    let client = reqwest::Client::new();
    let first = create_stream(&client, &server).await;
    create_stream(&client, &server).await;
    let refused = client.post(server.url("/v1/streams")).send().await.expect("create");
    assert_eq!(refused.status(), 503);
    assert_eq!(header(&refused, "x-should-retry"), "false");
    assert!(refused.headers().get("retry-after").is_none());
    assert_envelope(&refused.json().await.expect("json"), None, "capacity");

    // Once one has ended, it makes room at once: the oldest ended stream goes before its retention is over.
    end_stream(&client, &server, &first).await;
    let (status, body) = post_empty(&client, &server.url("/v1/streams")).await;
    assert_eq!(status, 201, "{body}");
    let gone = client.get(server.url(&format!("/v1/streams/{first}"))).send().await.expect("read");
    assert_eq!(gone.status(), 404, "evicted for the new one");
    server.stop().await.expect("stop");

    // With the idle timeout on, an open stream frees room once it has timed out: ended, it is evicted early
    // for a new one, without waiting for its retention.
    let config = HubConfig {
        limits: limits.clone(),
        idle_timeout: Duration::from_millis(300),
        retention: Duration::from_secs(600),
        ..HubConfig::default()
    };
    let settings = Settings { shutdown_grace: Duration::ZERO, ..Settings::default() };
    let server = TestServer::with(config, settings, Agents::builtin()).await;
    let ids = [create_stream(&client, &server).await, create_stream(&client, &server).await];
    let refused = client.post(server.url("/v1/streams")).send().await.expect("create");
    assert_eq!(refused.status(), 503);
    let after: u64 = header(&refused, "retry-after").parse().expect("retry-after in seconds");
    assert_eq!(after, 1, "the idle timeout, at least a second; not the retention");
    assert!(refused.headers().get("x-should-retry").is_none(), "a retry helps");
    let timed_out = async || {
        for id in &ids {
            if snapshot(&client, &server, id).await["status"] == "open" {
                return false;
            }
        }
        true
    };
    eventually("both streams to time out", PATIENCE, timed_out).await;
    let (status, body) = post_empty(&client, &server.url("/v1/streams")).await;
    assert_eq!(status, 201, "room came as soon as a stream timed out: {body}");
    server.stop().await.expect("stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_stream_ends_with_idle_timeout_and_stays_readable() {
    let server = start(Limits::default(), Duration::from_millis(400), Settings::default()).await;
    let client = reqwest::Client::new();
    let idle = create_stream(&client, &server).await;
    let busy = create_stream(&client, &server).await;
    let events = client.get(server.url(&format!("/v1/streams/{idle}/events"))).send().await.expect("subscribe");
    let started = Instant::now();
    // The busy stream appends every 100 ms for a second (its pace is the scenario): it never reaches the
    // timeout.
    for i in 0..10 {
        let (status, body) = post_json(
            &client,
            &server.url(&format!("/v1/streams/{busy}/messages")),
            &json!({"type": "text", "props": {"content": i.to_string()}}),
        )
        .await;
        assert_eq!(status, 200, "{body}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let body = tokio::time::timeout(Duration::from_secs(5), common::http::read_events(events))
        .await
        .expect("the idle stream ends");
    assert!(started.elapsed() >= Duration::from_millis(300), "not before the timeout");
    let end = body.last().expect("stream_end").json();
    assert_eq!(end["props"]["event"], "stream_end", "{end}");
    assert_eq!(end["props"]["data"]["status"], "error", "{end}");
    assert_eq!(end["props"]["data"]["error"]["code"], "idle_timeout", "{end}");
    assert_eq!(snapshot(&client, &server, &idle).await["status"], "error", "retained like any ended stream");
    assert_eq!(snapshot(&client, &server, &busy).await["status"], "open");
    let (status, body) = post_empty(&client, &server.url(&format!("/v1/streams/{idle}/end"))).await;
    assert_eq!(status, 409, "{body}");
    server.stop().await.expect("stop");
}

/// Opens a connection and sends a request head that promises a body, and one byte of it.
async fn stalled_body(server: &TestServer) -> TcpStream {
    let mut tcp = TcpStream::connect(server.addr).await.expect("connect");
    let head = "POST /v1/streams HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n{";
    tcp.write_all(head.as_bytes()).await.expect("write");
    tcp
}

/// Reads a whole response from a connection the server closes after it.
async fn read_response(tcp: &mut TcpStream, within: Duration) -> String {
    let mut out = Vec::new();
    let read = tokio::time::timeout(within, tcp.read_to_end(&mut out)).await;
    assert!(read.is_ok(), "answered within {within:?}: {}", String::from_utf8_lossy(&out));
    String::from_utf8_lossy(&out).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_bodies_time_out_while_others_are_served() {
    let settings = Settings { body_timeout: Duration::from_secs(3), ..Settings::default() };
    let server = start(Limits::default(), Duration::from_secs(600), settings).await;
    let mut stalled = Vec::new();
    for _ in 0..200 {
        stalled.push(stalled_body(&server).await);
    }
    let client = reqwest::Client::new();
    let asked = Instant::now();
    let health = client.get(server.url("/healthz")).send().await.expect("healthz");
    assert_eq!(health.status(), 200);
    let took = asked.elapsed();
    // Well before the stalled bodies time out: they hold nothing /healthz needs.
    assert!(took < Duration::from_millis(1_500), "/healthz answers at once beside 200 stalled bodies: {took:?}");
    for tcp in &mut stalled {
        let response = read_response(tcp, Duration::from_secs(10)).await;
        assert!(response.starts_with("HTTP/1.1 408"), "{response}");
        assert!(response.contains("\"code\":\"body_timeout\""), "{response}");
    }
    assert_eq!(server.hub.len(), 0, "no stream was made from a partial body");
    server.stop().await.expect("stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_connection_cap_refuses_one_more_and_serves_the_rest() {
    let settings = Settings { max_connections: 4, ..Settings::default() };
    let server = start(Limits::default(), Duration::from_secs(600), settings).await;
    let mut held = Vec::new();
    for _ in 0..4 {
        let mut tcp = TcpStream::connect(server.addr).await.expect("connect");
        tcp.write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n").await.expect("write");
        let mut buf = [0u8; 512];
        let n = tcp.read(&mut buf).await.expect("read");
        assert!(buf[..n].starts_with(b"HTTP/1.1 200"), "{}", String::from_utf8_lossy(&buf[..n]));
        held.push(tcp);
    }
    let mut extra = TcpStream::connect(server.addr).await.expect("the listener still accepts");
    extra.write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n").await.expect("write");
    let response = read_response(&mut extra, Duration::from_secs(5)).await;
    assert!(response.starts_with("HTTP/1.1 503"), "{response}");
    assert!(response.contains("application/json") && response.contains("\"code\":\"capacity\""), "{response}");

    // The four held connections are still served.
    for tcp in &mut held {
        tcp.write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n").await.expect("write");
        let mut buf = [0u8; 512];
        let n = tcp.read(&mut buf).await.expect("read");
        assert!(buf[..n].starts_with(b"HTTP/1.1 200"), "{}", String::from_utf8_lossy(&buf[..n]));
    }
    // One goes away: its place is free again.
    drop(held.pop());
    // A new connection is served once the server has seen that one close (one asked over the cap is refused).
    let served =
        async || reqwest::Client::new().get(server.url("/healthz")).send().await.is_ok_and(|r| r.status() == 200);
    eventually("a new connection to be served in the freed place", PATIENCE, served).await;
    server.stop().await.expect("stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn echo_refuses_what_it_cannot_stream_with_400() {
    let limits = Limits { messages_per_stream: 50, ..Limits::default() };
    let server = start(limits, Duration::from_secs(600), Settings::default()).await;
    let client = reqwest::Client::new();
    let words = "word ".repeat(100);
    for stream in [false, true] {
        let chat = json!({
            "model": "echo",
            "stream": stream,
            "messages": [{ "role": "system", "content": "be brief" }, { "role": "user", "content": words }],
        });
        let (status, body) = post_json(&client, &server.url("/v1/chat/completions"), &chat).await;
        assert_eq!(status, 400, "{body}");
        assert_envelope(&body, Some("messages[1].content"), "invalid_value");
    }
    assert_eq!(server.hub.len(), 0, "no stream was started");
    server.stop().await.expect("stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_raises_its_open_file_limit_and_sizes_the_cap_from_it() {
    let hard = rlimit::getrlimit(rlimit::Resource::NOFILE).expect("getrlimit").1;
    let server = common::process::ServerProcess::spawn_with_open_files(256, &[]);
    let log = server.log.lock().expect("log").clone();
    let line = log.lines().find(|l| l.contains("agentmux listening")).expect("the listening line");
    let field = |name: &str| -> u64 {
        let value = line.split(&format!("{name}=")).nth(1).and_then(|rest| rest.split_whitespace().next());
        value.and_then(|v| v.parse().ok()).unwrap_or_else(|| panic!("{name} in {line}"))
    };
    assert_eq!(field("open_files"), hard, "the soft limit was raised from 256 to the hard one: {line}");
    let cap = field("max_connections");
    assert!(cap < hard && cap >= hard * 8 / 10, "the cap leaves room for everything else: {line}");
    let client = reqwest::Client::new();
    assert_eq!(client.get(server.url("/healthz")).send().await.expect("healthz").status(), 200);
}

/// The stream limits are the operator's to set: a binary started with small ones refuses past them (and a
/// stream keeps its own events' places and room while it does), and one set below what a stream needs does
/// not start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_takes_its_stream_limits_from_its_flags() {
    let server = common::process::ServerProcess::spawn(&[
        "--max-stream-messages",
        "6",
        "--max-message-bytes",
        "4096",
        "--max-stream-bytes",
        "65536",
    ]);
    let client = reqwest::Client::new();
    let create = |client: &reqwest::Client| client.post(server.url("/v1/streams")).send();
    let created: Value = create(&client).await.expect("create").json().await.expect("json");
    let id = created["id"].as_str().expect("id").to_owned();
    let messages = server.url(&format!("/v1/streams/{id}/messages"));
    // stream_start, four messages, and the place kept for stream_end: six.
    for n in 0..4 {
        let body = json!({"type": "text", "props": {"content": format!("m{n}")}});
        let response = client.post(&messages).json(&body).send().await.expect("append");
        assert_eq!(response.status(), 200, "message {n} fits");
    }
    let response = client.post(&messages).json(&json!({"type": "text", "props": {"content": "one more"}})).send();
    let response = response.await.expect("append");
    assert_eq!(response.status(), 409, "a fifth message would leave no place for stream_end");
    let body: Value = response.json().await.expect("json");
    assert_eq!(body["error"]["code"], "stream_full", "{body}");
    assert!(body["error"]["message"].as_str().is_some_and(|m| m.contains('6')), "it names the limit: {body}");
    let end = client.post(server.url(&format!("/v1/streams/{id}/end"))).send().await.expect("end");
    assert_eq!(end.status(), 200, "the stream still ends into its kept place");

    // A message over --max-message-bytes on a fresh stream.
    let created: Value = create(&client).await.expect("create").json().await.expect("json");
    let id = created["id"].as_str().expect("id");
    let big = json!({"type": "text", "props": {"content": "x".repeat(5000)}});
    let response = client.post(server.url(&format!("/v1/streams/{id}/messages"))).json(&big).send();
    let response = response.await.expect("append");
    assert_eq!(response.status(), 413);
    let body: Value = response.json().await.expect("json");
    assert_eq!(body["error"]["code"], "message_too_large", "{body}");

    // Below the least a stream needs: refused at start, saying which flag.
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_agentmux"))
        .args(["serve", "--addr", "127.0.0.1:0", "--ephemeral", "--max-stream-messages", "1"])
        .output()
        .expect("run agentmux");
    assert!(!output.status.success(), "it does not start");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("--max-stream-messages"), "{stderr}");
}
