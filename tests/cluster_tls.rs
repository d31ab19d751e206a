//! Two agentmux processes serving one stream through a real `redis-server` over TLS (`rediss://`, its
//! certificate signed by a CA the test makes, given with `--redis-ca-file`), all on loopback; and a node given
//! the wrong CA stops at its start with exit 2 and the reason.

mod common;

use common::http::{Sse, post_empty, read_events};
use common::process::{ServerProcess, failed_start};
use common::redis::RedisServer;
use common::tls::TestCa;
use serde_json::json;

fn temp_dir(what: &str) -> std::path::PathBuf {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    std::env::temp_dir().join(format!("agentmux-{what}-{}-{nanos}", std::process::id()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_on_rediss_serve_one_stream() {
    let ca = TestCa::new("agentmux test Redis CA");
    let redis = RedisServer::start_tls(&ca);
    let dir = temp_dir("redis-ca");
    let (ca_file, _, _) = ca.write(&dir);
    let ca_file = ca_file.to_str().expect("a path").to_owned();
    let url = redis.tls_url();
    let node = || ServerProcess::spawn(&["--engine", "redis", "--redis-url", &url, "--redis-ca-file", &ca_file]);
    let (a, b) = (node(), node());
    let client = reqwest::Client::new();

    let (status, created) = post_empty(&client, &a.url("/v1/streams")).await;
    assert_eq!(status, 201, "{created}");
    let id = created["id"].as_str().expect("an id").to_owned();
    let on_b = client.get(b.url(&format!("/v1/streams/{id}/events"))).send().await.expect("subscribe on B");
    assert_eq!(on_b.status(), 200);
    let reading = tokio::spawn(read_events(on_b));
    let body: String = (0..5)
        .map(|i| json!({"type": "text", "message_id": format!("m{i}"), "props": {"content": format!("t{i}")}}))
        .map(|m| m.to_string() + "\n")
        .collect();
    let appended = client
        .post(a.url(&format!("/v1/streams/{id}/messages")))
        .header("content-type", "application/x-ndjson")
        .body(body)
        .send()
        .await
        .expect("append on A");
    assert_eq!(appended.status(), 200);
    let (status, ended) = post_empty(&client, &a.url(&format!("/v1/streams/{id}/end"))).await;
    assert_eq!(status, 200, "{ended}");

    let on_b = reading.await.expect("B's reader");
    let texts: Vec<String> = on_b
        .iter()
        .map(Sse::json)
        .filter(|m| m["type"] == "text")
        .filter_map(|m| m["props"]["content"].as_str().map(str::to_owned))
        .collect();
    assert_eq!(texts, ["t0", "t1", "t2", "t3", "t4"], "B read through Redis over TLS what A wrote");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_node_given_the_wrong_ca_stops_at_its_start() {
    let redis = RedisServer::start_tls(&TestCa::new("agentmux test Redis CA"));
    let dir = temp_dir("redis-wrong-ca");
    let (wrong, _, _) = TestCa::new("some other CA").write(&dir);
    let url = redis.tls_url();
    let ca = wrong.to_str().expect("a path");
    let (code, stderr) = failed_start(&["--engine", "redis", "--redis-url", &url, "--redis-ca-file", ca]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("UnknownIssuer"), "the reason is named: {stderr}");
    let _ = std::fs::remove_dir_all(dir);
}
