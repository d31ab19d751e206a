//! A whole node started in-process through the library's [`Node`], as an application embedding agentmux
//! would: the embedded store in a temporary directory, served on `127.0.0.1:0`, shut down, and opened again
//! from the same directory; and a node mounted in an axum server of the application's own, whose
//! maintenance still ends idle streams and whose WebSockets are served (the service answers the upgrade
//! itself, and takes the socket back from hyper's upgrade whichever server accepted it).

mod common;

use std::sync::Arc;
use std::time::Duration;

use agentmux::node::{Engine, Node, NodeConfig};
use common::doubles::SteppingClock;
use common::http::{get_json, post_json, read_body, read_events};
use futures::StreamExt;
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::Message;

/// A data directory of this test's own, removed when dropped.
struct DataDir(std::path::PathBuf);

impl DataDir {
    fn new(name: &str) -> DataDir {
        let dir = std::env::temp_dir().join(format!("agentmux-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        DataDir(dir)
    }
}

impl Drop for DataDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Serves `node` on `127.0.0.1:0`; returns its base URL and a sender that shuts it down.
async fn serve(node: Node) -> (String, tokio::sync::oneshot::Sender<()>, tokio::task::JoinHandle<std::io::Result<()>>) {
    let listener = agentmux::node::listen("127.0.0.1:0").await.expect("listen on loopback");
    let base = format!("http://{}", listener.local_addr().expect("bound address"));
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(node.serve(listener, async move {
        let _ = stopped.await;
    }));
    (base, stop, task)
}

#[tokio::test]
async fn a_node_with_a_store_serves_and_comes_back_after_a_restart() {
    let dir = DataDir::new("library-node");
    let client = reqwest::Client::new();

    let node = Node::open(NodeConfig::new(Engine::Store(dir.0.clone()))).await.expect("the node opens");
    assert_eq!(node.restart().streams, 0, "a new directory holds nothing");
    let (base, stop, task) = serve(node).await;

    // A producer's stream, and a thread with one turn on the echo agent.
    let (status, created) = post_json(&client, &format!("{base}/v1/streams"), &json!({})).await;
    assert_eq!(status, 201, "{created}");
    let id = created["id"].as_str().expect("a stream id").to_owned();
    let message = json!({"type": "text", "props": {"content": "kept across a restart"}});
    let (status, appended) = post_json(&client, &format!("{base}/v1/streams/{id}/messages"), &message).await;
    assert_eq!(status, 200, "{appended}");
    let (status, ended) =
        post_json(&client, &format!("{base}/v1/streams/{id}/end"), &json!({"status": "completed"})).await;
    assert_eq!((status, ended["status"].as_str()), (200, Some("completed")), "{ended}");
    let (status, thread) = post_json(&client, &format!("{base}/v1/threads"), &json!({"id": "kept"})).await;
    assert_eq!(status, 201, "{thread}");
    let turn = json!({"model": "echo", "messages": [{"role": "user", "content": "remember me"}]});
    let reply = client
        .post(format!("{base}/v1/chat/completions"))
        .header("x-agentmux-thread-id", "kept")
        .json(&turn)
        .send()
        .await
        .expect("a turn on the thread");
    assert_eq!(reply.status(), 200);
    let reply: serde_json::Value = reply.json().await.expect("a chat.completion");
    assert_eq!(reply["choices"][0]["message"]["content"], "remember me");

    stop.send(()).expect("the node is serving");
    task.await.expect("the serving task").expect("served and shut down cleanly");

    // The same directory, a new node: both streams (the producer's and the turn's run) and the thread are
    // back, nothing was left open.
    let node = Node::open(NodeConfig::new(Engine::Store(dir.0.clone()))).await.expect("the node opens again");
    let restart = node.restart();
    assert_eq!((restart.streams, restart.interrupted, restart.threads), (2, 0, 1), "{restart:?}");
    let (base, stop, task) = serve(node).await;
    let events =
        read_events(client.get(format!("{base}/v1/streams/{id}/events")).send().await.expect("the stream's events"))
            .await;
    let contents: Vec<_> = events.iter().filter_map(|e| e.json().get("props")?.get("content").cloned()).collect();
    assert_eq!(contents, [json!("kept across a restart")]);
    let (status, transcript) = get_json(&client, &format!("{base}/v1/threads/kept")).await;
    assert_eq!(status, 200, "{transcript}");
    let said: Vec<_> =
        transcript["messages"].as_array().expect("messages").iter().map(|m| m["content"].clone()).collect();
    assert_eq!(said, [json!("remember me"), json!("remember me")], "{transcript}");
    stop.send(()).expect("the node is serving");
    task.await.expect("the serving task").expect("served and shut down cleanly");
}

#[tokio::test]
async fn a_node_mounted_in_another_server_still_ends_idle_streams() {
    // The hub's clock is the test's: idle time passes when the test says so, not by waiting for it.
    let clock = Arc::new(SteppingClock::new(1_700_000_000_000));
    let mut config = NodeConfig::new(Engine::Memory);
    config.hub.clock = clock.clone();
    config.hub.idle_timeout = Duration::from_secs(60);
    let node = Node::open(config).await.expect("the node opens");

    // The application's own server, with the node's routes under it.
    let app = axum::Router::new().route("/own", axum::routing::get(|| async { "mine" })).merge(node.router());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("listen on loopback");
    let base = format!("http://{}", listener.local_addr().expect("bound address"));
    let server = tokio::spawn(async move {
        axum::serve(listener, app.into_make_service_with_connect_info::<std::net::SocketAddr>()).await
    });
    let client = reqwest::Client::new();
    assert_eq!(
        client.get(format!("{base}/own")).send().await.expect("own route").text().await.ok().as_deref(),
        Some("mine")
    );

    let (status, created) = post_json(&client, &format!("{base}/v1/streams"), &json!({})).await;
    assert_eq!(status, 201, "{created}");
    let id = created["id"].as_str().expect("a stream id").to_owned();
    clock.advance(61_000);
    // Nobody calls: the node's own maintenance ends the stream.
    common::wait::eventually("the idle stream to end", Duration::from_secs(10), async || {
        get_json(&client, &format!("{base}/v1/streams/{id}")).await.1["status"] != "open"
    })
    .await;
    let events = read_body(client.get(format!("{base}/v1/streams/{id}/events")).send().await.expect("events")).await;
    let events = String::from_utf8_lossy(&events);
    assert!(events.contains(r#""code":"idle_timeout""#), "{events}");
    server.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_mounted_in_another_server_serves_its_websockets() {
    let node = Node::open(NodeConfig::new(Engine::Memory)).await.expect("the node opens");
    let app = axum::Router::new().merge(node.router());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("listen on loopback");
    let addr = listener.local_addr().expect("bound address");
    let server = tokio::spawn(async move {
        axum::serve(listener, app.into_make_service_with_connect_info::<std::net::SocketAddr>()).await
    });
    let client = reqwest::Client::new();
    let (status, created) = post_json(&client, &format!("http://{addr}/v1/streams"), &json!({})).await;
    assert_eq!(status, 201, "{created}");
    let id = created["id"].as_str().expect("a stream id").to_owned();
    let (mut ws, _) =
        tokio_tungstenite::connect_async(format!("ws://{addr}/v1/streams/{id}/ws")).await.expect("upgraded");
    let message = json!({ "type": "text", "props": { "content": "through their server" } });
    let (status, reply) = post_json(&client, &format!("http://{addr}/v1/streams/{id}/messages"), &message).await;
    assert_eq!(status, 200, "{reply}");
    let read = async {
        while let Some(frame) = ws.next().await {
            if let Message::Text(text) = frame.expect("a frame") {
                let value: Value = serde_json::from_str(&text).expect("JSON");
                if value["message"]["props"]["content"] == "through their server" {
                    return;
                }
            }
        }
        panic!("the socket closed before the message came");
    };
    tokio::time::timeout(Duration::from_secs(10), read).await.expect("the message in time");
    server.abort();
}
