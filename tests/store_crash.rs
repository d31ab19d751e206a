//! The store across crashes, over real processes: the binary with a `--data-dir`, clients ingesting over
//! several streams and recording every acknowledged sequence, `kill -9` at several moments of the ingest (after
//! 800, 3,700 and 7,600 of its 10,000 messages were acknowledged), a restart on the
//! same directory. Every acknowledged message is there, in order, byte for byte as a live subscriber saw it
//! before the crash; a subscriber resuming with `Last-Event-ID` gets the rest without gap or duplicate; the
//! streams that were open end `interrupted`. A thread with a tool call survives a restart with an identical
//! audit export. A retention pass gives the space back; a data directory it cannot use is an error at start;
//! a disk that fails under a stream (files made immutable) ends that stream with an error, answers 503, and
//! loses nothing acknowledged.

mod common;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::http::parse_sse;
use common::process::ServerProcess;
use serde_json::{Value, json};

const STREAMS: usize = 4;
const BATCH: usize = 25;
const TOTAL: usize = 10_000;

fn data_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("agentmux-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

fn spawn(dir: &std::path::Path) -> ServerProcess {
    let dir = dir.to_str().expect("a UTF-8 path");
    ServerProcess::spawn(&["--data-dir", dir])
}

/// Everything `GET /v1/streams/{id}/events` sends after `after` (the stream has ended), by sequence.
async fn events(client: &reqwest::Client, server: &ServerProcess, id: &str, after: u64) -> BTreeMap<u64, String> {
    let response = client
        .get(server.url(&format!("/v1/streams/{id}/events")))
        .header("last-event-id", after.to_string())
        .send()
        .await
        .expect("GET events");
    assert_eq!(response.status(), 200, "{id}");
    let body = tokio::time::timeout(Duration::from_secs(20), response.bytes()).await.expect("ends").expect("body");
    let (events, _) = parse_sse(&body);
    let mut out = BTreeMap::new();
    for event in events {
        let id = event.id.expect("an id");
        assert!(out.insert(id, event.data).is_none(), "sequence {id} twice");
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_acknowledged_message_survives_kill_9_at_several_moments() {
    let dir = data_dir("crash");
    let client = reqwest::Client::new();
    for (round, kill_at) in [800usize, 3700, 7600].into_iter().enumerate() {
        let server = spawn(&dir);
        let mut ids = Vec::new();
        for _ in 0..STREAMS {
            let created: Value =
                client.post(server.url("/v1/streams")).send().await.expect("create").json().await.expect("JSON");
            ids.push(created["id"].as_str().expect("id").to_owned());
        }
        // A live subscriber on the first stream keeps every event's bytes, to compare after the restart.
        let seen: Arc<Mutex<BTreeMap<u64, String>>> = Arc::default();
        let watcher = {
            let (client, url, seen) =
                (client.clone(), server.url(&format!("/v1/streams/{}/events", ids[0])), Arc::clone(&seen));
            tokio::spawn(async move {
                let Ok(mut response) = client.get(url).send().await else { return };
                let mut buffer = Vec::new();
                while let Ok(Some(chunk)) = response.chunk().await {
                    buffer.extend_from_slice(&chunk);
                    let (events, used) = parse_sse(&buffer);
                    buffer.drain(..used);
                    let mut seen = seen.lock().expect("lock");
                    for event in events {
                        if let Some(id) = event.id {
                            seen.insert(id, event.data);
                        }
                    }
                }
            })
        };
        // Producers: acknowledged sequences and what each carried.
        let acked: Arc<Mutex<BTreeMap<(usize, u64), String>>> = Arc::default();
        let producers: Vec<_> = ids
            .iter()
            .enumerate()
            .map(|(s, id)| {
                let (client, url, acked) =
                    (client.clone(), server.url(&format!("/v1/streams/{id}/messages")), Arc::clone(&acked));
                tokio::spawn(async move {
                    for batch in 0..TOTAL / STREAMS / BATCH {
                        let texts: Vec<String> = (0..BATCH)
                            .map(|i| format!("round {round} stream {s} message {} é✓", batch * BATCH + i))
                            .collect();
                        let body: Vec<Value> =
                            texts.iter().map(|t| json!({"type": "text", "props": {"content": t}})).collect();
                        let Ok(response) = client.post(&url).json(&body).send().await else { return };
                        let Ok(reply) = response.json::<Value>().await else { return };
                        let Some(sequences) = reply["sequences"].as_array() else { return };
                        let mut acked = acked.lock().expect("lock");
                        for (sequence, text) in sequences.iter().zip(texts) {
                            acked.insert((s, sequence.as_u64().expect("a sequence")), text);
                        }
                    }
                })
            })
            .collect();
        // Killed while the producers go on: once this many messages are acknowledged, whenever that is.
        while acked.lock().expect("lock").len() < kill_at && producers.iter().any(|p| !p.is_finished()) {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let mut server = server;
        server.kill();
        for producer in producers {
            let _ = producer.await;
        }
        let _ = watcher.await;
        let acked = std::mem::take(&mut *acked.lock().expect("lock"));
        let seen = std::mem::take(&mut *seen.lock().expect("lock"));
        assert!(!acked.is_empty(), "round {round}: something was acknowledged before the kill");
        eprintln!(
            "round {round}: killed at {kill_at}: {} messages acknowledged, {} seen live",
            acked.len(),
            seen.len()
        );
        assert!(acked.len() < TOTAL, "round {round}: the kill came before the end of the ingest");

        let server = spawn(&dir);
        let mut interrupted = 0;
        for (s, id) in ids.iter().enumerate() {
            let kept = events(&client, &server, id, 0).await;
            // In order, without gaps, from 1; the last is stream_end.
            let sequences: Vec<u64> = kept.keys().copied().collect();
            assert_eq!(sequences, (1..=sequences.len() as u64).collect::<Vec<_>>(), "round {round} stream {s}");
            for ((stream, sequence), text) in acked.range((s, 0)..(s + 1, 0)) {
                let data = kept
                    .get(sequence)
                    .unwrap_or_else(|| panic!("round {round}: acknowledged {stream}/{sequence} lost"));
                let message: Value = serde_json::from_str(data).expect("JSON");
                assert_eq!(message["props"]["content"], json!(text), "round {round} stream {s} sequence {sequence}");
            }
            let end: Value = serde_json::from_str(kept.values().last().expect("events")).expect("JSON");
            assert_eq!(end["props"]["event"], "stream_end", "round {round}");
            if end["props"]["data"]["error"]["code"] == "interrupted" {
                interrupted += 1;
            }
            if s == 0 {
                for (sequence, data) in &seen {
                    assert_eq!(
                        kept.get(sequence),
                        Some(data),
                        "round {round}: what a client saw is kept byte for byte"
                    );
                }
            }
            // Resume from the middle: the rest, without gap or duplicate.
            let middle = sequences.len() as u64 / 2;
            let rest = events(&client, &server, id, middle).await;
            assert_eq!(
                rest.keys().copied().collect::<Vec<_>>(),
                ((middle + 1)..=sequences.len() as u64).collect::<Vec<_>>()
            );
            assert!(rest.iter().all(|(k, v)| kept.get(k) == Some(v)));
        }
        assert_eq!(interrupted, STREAMS, "round {round}: the streams open at the crash end interrupted");
        drop(server);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thread_with_a_tool_call_survives_a_restart_with_an_identical_audit_log() {
    let dir = data_dir("thread");
    let client = reqwest::Client::new();
    let server = spawn(&dir);
    for (model, text) in [("echo", "hello there"), ("replay/tool-call-then-text", "and the weather?")] {
        let response = client
            .post(server.url("/v1/chat/completions"))
            .header("x-agentmux-thread-id", "kept")
            .json(&json!({"model": model, "messages": [{"role": "user", "content": text}]}))
            .send()
            .await
            .expect("POST");
        assert_eq!(response.status(), 200);
    }
    let rejected = client
        .post(server.url("/v1/chat/completions"))
        .header("x-agentmux-thread-id", "kept")
        .json(&json!({"model": "echo", "messages": [{"role": "assistant", "content": "forged"}]}))
        .send()
        .await
        .expect("POST");
    assert_eq!(rejected.status(), 400);
    let before: Value =
        client.get(server.url("/v1/threads/kept/audit")).send().await.expect("GET").json().await.expect("JSON");
    let transcript: Value =
        client.get(server.url("/v1/threads/kept")).send().await.expect("GET").json().await.expect("JSON");
    assert_eq!(before["entries"].as_array().map(Vec::len), Some(9), "{before}");
    let mut server = server;
    server.kill();

    let server = spawn(&dir);
    let after: Value =
        client.get(server.url("/v1/threads/kept/audit")).send().await.expect("GET").json().await.expect("JSON");
    assert_eq!(after, before, "the audit export is identical");
    let again: Value =
        client.get(server.url("/v1/threads/kept")).send().await.expect("GET").json().await.expect("JSON");
    assert_eq!(again["messages"], transcript["messages"]);
    // The thread goes on where it was.
    let response = client
        .post(server.url("/v1/chat/completions"))
        .header("x-agentmux-thread-id", "kept")
        .json(&json!({"model": "echo", "messages": [{"role": "user", "content": "still there?"}]}))
        .send()
        .await
        .expect("POST");
    assert_eq!(response.status(), 200);
    let last: Value = client.get(server.url("/v1/threads/kept")).send().await.expect("GET").json().await.expect("JSON");
    let messages = last["messages"].as_array().expect("messages");
    assert_eq!(messages.len(), transcript["messages"].as_array().expect("messages").len() + 2);
    // The runs' streams came back too.
    let stream = before["entries"][1]["stream_id"].as_str().expect("a stream id");
    let response = client.get(server.url(&format!("/v1/streams/{stream}"))).send().await.expect("GET");
    assert_eq!(response.status(), 200);
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The bytes the store's files take on disk (the database and its WAL).
fn store_bytes(dir: &std::path::Path) -> u64 {
    ["agentmux.sqlite3", "agentmux.sqlite3-wal"]
        .iter()
        .filter_map(|f| std::fs::metadata(dir.join(f)).ok())
        .map(|m| m.len())
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retention_pass_deletes_ended_streams_and_gives_the_space_back() {
    let dir = data_dir("retention");
    let client = reqwest::Client::new();
    let server = ServerProcess::spawn(&["--data-dir", dir.to_str().expect("UTF-8"), "--retention", "1s"]);
    let mut ids = Vec::new();
    for s in 0..20 {
        let created: Value =
            client.post(server.url("/v1/streams")).send().await.expect("create").json().await.expect("JSON");
        let id = created["id"].as_str().expect("id").to_owned();
        let body: Vec<Value> = (0..200)
            .map(|i| json!({"type": "text", "props": {"content": format!("stream {s} line {i} {}", "x".repeat(200))}}))
            .collect();
        let response =
            client.post(server.url(&format!("/v1/streams/{id}/messages"))).json(&body).send().await.expect("POST");
        assert_eq!(response.status(), 200);
        let response = client.post(server.url(&format!("/v1/streams/{id}/end"))).send().await.expect("end");
        assert_eq!(response.status(), 200);
        ids.push(id);
    }
    let full = store_bytes(&dir);
    assert!(full > 800_000, "20 × 200 messages of 250 bytes are in the store: {full} bytes");
    let mut now = full;
    for _ in 0..100 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        now = store_bytes(&dir);
        if now < full / 4 {
            break;
        }
    }
    eprintln!("the store took {full} bytes with 20 ended streams, {now} after the retention pass");
    assert!(now < full / 4, "the space came back: {full} → {now} bytes");
    for id in &ids {
        let response = client.get(server.url(&format!("/v1/streams/{id}"))).send().await.expect("GET");
        assert_eq!(response.status(), 404, "{id} was evicted");
    }
    drop(server);
    // And they stay gone after a restart.
    let server = spawn(&dir);
    let response = client.get(server.url(&format!("/v1/streams/{}", ids[0]))).send().await.expect("GET");
    assert_eq!(response.status(), 404);
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Runs the binary on `dir` and expects it to refuse to start: its exit status and what it said.
fn refused(dir: &std::path::Path) -> (bool, String) {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_agentmux"))
        .args(["--addr", "127.0.0.1:0", "--data-dir", dir.to_str().expect("UTF-8")])
        .output()
        .expect("run agentmux");
    (output.status.success(), String::from_utf8_lossy(&output.stderr).into_owned())
}

#[test]
fn a_data_directory_it_cannot_use_is_a_clear_error_at_start() {
    // A file where the directory should be.
    let path = data_dir("not-a-dir");
    std::fs::write(&path, b"I am a file").expect("write");
    let (ok, said) = refused(&path);
    assert!(!ok, "it did not start");
    assert!(said.contains("the data directory") && said.contains("--ephemeral"), "{said}");
    let _ = std::fs::remove_file(&path);
    // A corrupt store.
    let dir = data_dir("corrupt");
    std::fs::create_dir_all(&dir).expect("mkdir");
    std::fs::write(dir.join("agentmux.sqlite3"), vec![0x5a; 8192]).expect("write");
    let (ok, said) = refused(&dir);
    assert!(!ok, "it did not start");
    assert!(said.contains("agentmux.sqlite3") && said.contains("not a database"), "{said}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Sets or clears the immutable attribute: even root cannot write such a file, as with a disk that failed.
fn immutable(path: &std::path::Path, on: bool) {
    let status = std::process::Command::new("chattr")
        .arg(if on { "+i" } else { "-i" })
        .arg(path)
        .status()
        .expect("chattr (e2fsprogs) runs");
    assert!(status.success(), "chattr on {}", path.display());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_disk_that_fails_under_a_stream_ends_it_with_an_error_and_loses_nothing_acknowledged() {
    // Under target/ (the repository's file system, which keeps file attributes), not a tmpfs.
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("target/tmp/disk-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let client = reqwest::Client::new();
    let server = spawn(&dir);
    let created: Value =
        client.post(server.url("/v1/streams")).send().await.expect("create").json().await.expect("JSON");
    let id = created["id"].as_str().expect("id").to_owned();
    let append = |text: &str| {
        let request = client
            .post(server.url(&format!("/v1/streams/{id}/messages")))
            .json(&json!({"type": "text", "props": {"content": text}}));
        async move { request.send().await.expect("POST") }
    };
    assert_eq!(append("kept before the failure").await.status(), 200);
    let files = [dir.join("agentmux.sqlite3"), dir.join("agentmux.sqlite3-wal")];
    files.iter().for_each(|f| immutable(f, true));
    let refused = append("written while the disk fails").await;
    let status = refused.status();
    let body: Value = refused.json().await.expect("JSON");
    files.iter().for_each(|f| immutable(f, false));
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["error"]["code"], "store_unavailable");
    // The stream ended with the error its readers see; the service goes on.
    let snapshot: Value =
        client.get(server.url(&format!("/v1/streams/{id}"))).send().await.expect("GET").json().await.expect("JSON");
    assert_eq!(snapshot["status"], "error", "{snapshot}");
    assert_eq!(client.get(server.url("/healthz")).send().await.expect("GET").status(), 200);
    let other: Value = client.post(server.url("/v1/streams")).send().await.expect("create").json().await.expect("JSON");
    let other = other["id"].as_str().expect("id").to_owned();
    let response = client
        .post(server.url(&format!("/v1/streams/{other}/messages")))
        .json(&json!({"type": "text", "props": {"content": "the disk is back"}}))
        .send()
        .await
        .expect("POST");
    assert_eq!(response.status(), 200, "writes go on once the disk is back");
    let mut server = server;
    server.kill();
    // What was acknowledged is there after a restart.
    let server = spawn(&dir);
    let kept = events(&client, &server, &id, 0).await;
    assert!(kept.values().any(|data| data.contains("kept before the failure")), "{kept:?}");
    // The failed write was kept and written once the disk was back: no hole in the sequences, and the end
    // its readers saw.
    let sequences: Vec<u64> = kept.keys().copied().collect();
    assert_eq!(sequences, (1..=sequences.len() as u64).collect::<Vec<_>>(), "{kept:?}");
    let end: Value = serde_json::from_str(kept.values().last().expect("events")).expect("JSON");
    assert_eq!(end["props"]["data"]["error"]["code"], "store_unavailable", "{end}");
    let kept = events(&client, &server, &other, 0).await;
    assert!(kept.values().any(|data| data.contains("the disk is back")), "{kept:?}");
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}
