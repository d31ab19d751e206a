//! Graceful shutdown over a real socket: new connections stop, open streams get the grace period, and
//! those still open then end with status `error` and a reason every subscriber sees.

mod common;

use std::time::{Duration, Instant};

use agentmux::agent::Agents;
use agentmux::http::Settings;
use agentmux::hub::HubConfig;
use common::server::TestServer;
use futures::StreamExt;

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
    let first = body.next().await.expect("stream_start").expect("bytes");
    assert!(std::str::from_utf8(&first).expect("utf-8").contains("stream_start"));

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
