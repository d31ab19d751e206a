//! Small requests do not take large memory (issue 42, item 8), against the real binary: a thread of ten
//! megabytes built through the API, then forty parallel reads of its transcript and its audit log, and seventy
//! replays of it. Each read answers the same bytes as a single read, and the server's resident memory
//! (`VmRSS` in `/proc/<pid>/status`, sampled throughout) grows by a small part of what a copy per request
//! takes: the reads write out the messages the thread holds, and the replays share them.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use common::process::ServerProcess;
use futures::future::join_all;
use serde_json::{Value, json};

/// The bytes of each user message's text.
const MESSAGE_BYTES: usize = 256 << 10;
/// Messages the thread is created with, then messages of one turn (two requests under the body limit).
const CREATED: usize = 24;
const TURN: usize = 16;
/// What a copy of the thread per request would take past the bound: ten megabytes per request, forty
/// requests. The bound is a small part of that, with room for the allocator's own slack.
const GROWTH_BOUND_KB: u64 = 150 << 10;

/// A user message of [`MESSAGE_BYTES`], numbered, with text JSON escapes (quotes, a newline, non-ASCII).
fn message(number: usize) -> Value {
    let mut text = format!("message {number}: \"quoted\", caf\u{e9}\n");
    while text.len() < MESSAGE_BYTES {
        text.push_str("lorem ipsum dolor sit amet ");
    }
    json!({"role": "user", "content": text})
}

/// What `/proc/<pid>/status` says of `field` (`VmRSS`, `VmHWM`), in kB.
fn status_kb(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("/proc/<pid>/status");
    let line = status.lines().find(|l| l.starts_with(field)).unwrap_or_else(|| panic!("no {field}: {status}"));
    line.split_whitespace().nth(1).and_then(|kb| kb.parse().ok()).unwrap_or_else(|| panic!("{line}"))
}

/// Samples the server's `VmRSS` every few milliseconds while `work` runs: what it was before, and its peak.
async fn rss_during<T>(pid: u32, work: impl Future<Output = T>) -> (u64, u64, T) {
    let before = status_kb(pid, "VmRSS");
    let done = Arc::new(AtomicBool::new(false));
    let sampler = std::thread::spawn({
        let done = Arc::clone(&done);
        move || {
            let mut peak = 0;
            while !done.load(Ordering::Relaxed) {
                peak = peak.max(status_kb(pid, "VmRSS"));
                std::thread::sleep(Duration::from_millis(2));
            }
            peak.max(status_kb(pid, "VmRSS"))
        }
    });
    let output = work.await;
    done.store(true, Ordering::Relaxed);
    let peak = sampler.join().expect("the sampler");
    (before, peak, output)
}

/// The server with thread `big` of about ten megabytes of messages: made with [`CREATED`] messages, then a
/// turn of [`TURN`] more answered by a short canned reply.
async fn server_with_a_large_thread(client: &reqwest::Client) -> ServerProcess {
    let server = ServerProcess::spawn(&[]);
    let messages: Vec<Value> = (0..CREATED).map(message).collect();
    let created = client
        .post(server.url("/v1/threads"))
        .json(&json!({"id": "big", "messages": messages}))
        .send()
        .await
        .expect("POST /v1/threads");
    assert_eq!(created.status(), 201, "{}", created.text().await.unwrap_or_default());
    let messages: Vec<Value> = (CREATED..CREATED + TURN).map(message).collect();
    let turn = client
        .post(server.url("/v1/chat/completions"))
        .header("x-agentmux-thread-id", "big")
        .json(&json!({"model": "replay/plain-text", "messages": messages}))
        .send()
        .await
        .expect("a turn");
    assert_eq!(turn.status(), 200, "{}", turn.text().await.unwrap_or_default());
    server
}

async fn read(client: &reqwest::Client, url: &str) -> Vec<u8> {
    let response = client.get(url).send().await.unwrap_or_else(|e| panic!("GET {url}: {e}"));
    assert_eq!(response.status(), 200, "GET {url}");
    assert_eq!(response.headers()["content-type"], "application/json");
    response.bytes().await.unwrap_or_else(|e| panic!("GET {url}: {e}")).to_vec()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forty_parallel_reads_of_a_large_thread_and_its_audit_answer_alike_without_a_copy_each() {
    let client = reqwest::Client::new();
    let server = server_with_a_large_thread(&client).await;
    let (transcript_url, audit_url) = (server.url("/v1/threads/big"), server.url("/v1/threads/big/audit"));
    let transcript = read(&client, &transcript_url).await;
    let audit = read(&client, &audit_url).await;
    let parsed: Value = serde_json::from_slice(&transcript).expect("the transcript is JSON");
    let messages = parsed["messages"].as_array().expect("messages");
    assert_eq!(messages.len(), CREATED + TURN + 1, "the inputs and the run's answer");
    assert_eq!(messages[CREATED + 3], message(CREATED + 3), "a message reads back as sent");
    assert!(transcript.len() > (CREATED + TURN) * MESSAGE_BYTES, "{} bytes", transcript.len());
    let log: Value = serde_json::from_slice(&audit).expect("the audit log is JSON");
    assert_eq!((&log["thread_id"], &log["object"]), (&json!("big"), &json!("thread.audit")));
    assert_eq!(log["entries"][5]["message"], message(5));

    let reads = (0..40).map(|i| {
        let (client, url) = (client.clone(), if i % 2 == 0 { &transcript_url } else { &audit_url });
        async move { (i, read(&client, url).await) }
    });
    let (before, peak, bodies) = rss_during(server.pid(), join_all(reads)).await;
    for (i, body) in bodies {
        let (want, what) = if i % 2 == 0 { (&transcript, "transcript") } else { (&audit, "audit log") };
        assert!(body == *want, "read {i} of the {what} differs from a single read ({} bytes)", body.len());
    }
    let growth = peak.saturating_sub(before);
    eprintln!("40 reads: VmRSS {before} kB before, {peak} kB at the peak");
    assert!(
        growth < GROWTH_BOUND_KB,
        "40 parallel reads of a {} kB thread took the server from {before} kB to {peak} kB",
        transcript.len() >> 10
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seventy_replays_of_a_large_thread_share_its_messages() {
    let client = reqwest::Client::new();
    let server = server_with_a_large_thread(&client).await;
    let source: Value = serde_json::from_slice(&read(&client, &server.url("/v1/threads/big")).await).expect("JSON");

    let replays = async {
        let mut replayed = Vec::new();
        for batch in 0..7 {
            let requests = (0..10).map(|i| {
                let client = client.clone();
                let url = server.url("/v1/threads/big/replay");
                async move {
                    let response =
                        client.post(&url).json(&json!({"model": "replay/plain-text"})).send().await.expect("replay");
                    let status = response.status();
                    let body: Value = response.json().await.expect("JSON");
                    assert_eq!(status, 201, "replay {} of batch {batch}: {body}", i);
                    body["thread_id"].as_str().expect("thread_id").to_owned()
                }
            });
            replayed.extend(join_all(requests).await);
        }
        replayed
    };
    let (before, peak, replayed) = rss_during(server.pid(), replays).await;
    assert_eq!(replayed.len(), 70);
    // Every run has ended and been recorded: a read waits for that.
    let last = read(&client, &server.url(&format!("/v1/threads/{}", replayed[69]))).await;
    let last: Value = serde_json::from_slice(&last).expect("JSON");
    let source_messages = source["messages"].as_array().expect("messages");
    let replayed_messages = last["messages"].as_array().expect("messages");
    assert_eq!(
        replayed_messages[..CREATED + TURN],
        source_messages[..CREATED + TURN],
        "the replay holds the source's history up to its last input"
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    let held = status_kb(server.pid(), "VmRSS");
    eprintln!("70 replays: VmRSS {before} kB before, {peak} kB at the peak, {held} kB after");
    assert!(
        peak.saturating_sub(before) < GROWTH_BOUND_KB && held.saturating_sub(before) < GROWTH_BOUND_KB,
        "70 replays of a {} message thread took the server from {before} kB to a peak of {peak} kB, holding \
         {held} kB after",
        source_messages.len()
    );
}
