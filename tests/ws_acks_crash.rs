//! A WebSocket `publish` acknowledgement means kept, as an HTTP append's answer does: over the real binary
//! with the store, a client pipelines publishes on `/v1/ws` (500 unanswered at a time, half a KB each) and
//! records every `published` reply; the process is killed (`kill -9`) right after the 3,000th, then restarted
//! on the same directory. Every acknowledged sequence is there, holding the message that was acknowledged under it
//! (before acknowledgements waited for the commit, the last ones were missing in about half the runs, their
//! sequences taken by the `stream_end` the restart gives the stream).
//! A few runs, since a crash catches the writer at a different point each time.

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use common::http::parse_sse;
use common::process::ServerProcess;
use futures::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::Message;

const RUNS: usize = 6;
const IN_FLIGHT: usize = 500;
const KILL_AFTER: usize = 3_000;

/// What a run acknowledged and what the restarted process holds, by sequence.
struct Run {
    acknowledged: BTreeMap<u64, String>,
    kept: BTreeMap<u64, Value>,
}

/// Publishes until `KILL_AFTER` acknowledgements, kills the process at once, restarts it on `dir`.
async fn crash_after_acknowledgements(dir: &Path) -> Run {
    let dir = dir.to_str().expect("a UTF-8 path");
    let mut server = ServerProcess::spawn(&["--data-dir", dir]);
    let client = reqwest::Client::new();
    let created: Value = client.post(server.url("/v1/streams")).send().await.expect("POST").json().await.expect("JSON");
    let id = created["id"].as_str().expect("an id").to_owned();
    let (mut ws, _) = tokio_tungstenite::connect_async(format!("ws://{}/v1/ws", server.addr)).await.expect("ws");
    let padding = "p".repeat(500);
    let mut contents = Vec::new();
    let mut acknowledged = BTreeMap::new();
    while acknowledged.len() < KILL_AFTER {
        // Replies come in the order of the publishes: the n-th answers the n-th.
        while contents.len() - acknowledged.len() < IN_FLIGHT {
            let content = format!("{} {padding}", contents.len());
            let op = json!({"op": "publish", "stream": id, "message": {"type": "text", "props": {"content": content}}});
            ws.feed(Message::text(op.to_string())).await.expect("send");
            contents.push(content);
        }
        ws.flush().await.expect("flush");
        let frame = tokio::time::timeout(Duration::from_secs(10), ws.next()).await.expect("a reply in time");
        let Some(Ok(Message::Text(text))) = frame else { panic!("expected a reply, got {frame:?}") };
        let reply: Value = serde_json::from_str(text.as_str()).expect("JSON");
        let sequence = reply["published"].as_u64().unwrap_or_else(|| panic!("not an acknowledgement: {reply}"));
        acknowledged.insert(sequence, contents[acknowledged.len()].clone());
    }
    server.kill();
    drop(ws);

    let server = ServerProcess::spawn(&["--data-dir", dir]);
    let response = client.get(server.url(&format!("/v1/streams/{id}/events"))).send().await.expect("GET");
    assert_eq!(response.status(), 200, "the stream is kept");
    let body = tokio::time::timeout(Duration::from_secs(20), response.bytes()).await.expect("ends").expect("body");
    let (events, _) = parse_sse(&body);
    let kept = events.iter().filter_map(|event| Some((event.id?, event.json()))).collect();
    Run { acknowledged, kept }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_publish_acknowledged_over_a_websocket_is_there_after_kill_9() {
    let mut missing_per_run = Vec::new();
    for run in 0..RUNS {
        let dir = std::env::temp_dir().join(format!("agentmux-ws-acks-{}-{run}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let Run { acknowledged, kept } = crash_after_acknowledgements(&dir).await;
        let _ = std::fs::remove_dir_all(&dir);
        // Missing, or another message under its sequence (the end a restart gives the stream, say).
        let missing = acknowledged
            .iter()
            .filter(|(sequence, content)| kept.get(sequence).is_none_or(|m| m["props"]["content"] != content.as_str()))
            .count();
        missing_per_run.push(missing);
    }
    assert!(
        missing_per_run.iter().all(|&m| m == 0),
        "acknowledged but not kept after kill -9, per run: {missing_per_run:?}"
    );
}
