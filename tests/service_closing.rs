//! A stream's own events are never the way past a limit, over real sockets ("Holds under abuse",
//! unbounded fields): a stream filled to its limit of messages, of bytes, or a hub filled to its byte limit
//! by streams left with open messages and blocks, still ends with `message_end` and `block_end` for
//! everything open and `stream_end`, and is then still within every limit; an outcome a producer sends is
//! bounded (refused with the envelope, the stream left open for an end with less), and an agent's outcome
//! that does not fit is shrunk rather than refused.

mod common;

use agentmux::agent::{Agent, AgentError, Agents, Output};
use agentmux::conversation::Conversation;
use agentmux::http::Settings;
use agentmux::hub::{HubConfig, Limits};
use agentmux::output::Outcome;
use common::http::{assert_envelope, create_stream, end_stream, lifecycle, post_empty, post_json};
use common::server::TestServer;
use serde_json::{Value, json};

/// A server whose hub has these limits.
async fn server(limits: Limits) -> TestServer {
    TestServer::with(HubConfig { limits, ..HubConfig::default() }, Settings::default(), Agents::builtin()).await
}

/// A new message streamed in deltas, in block `block`: it opens the message (and the block, the first time),
/// so the stream must keep room for its `message_end` (and `block_end`).
fn open_message(n: usize, block: &str) -> Value {
    json!({ "type": "text", "props": { "content": format!("chunk {n} ") }, "message_id": format!("d{n}"),
        "delta": true, "block_id": block })
}

/// Appends `message(n)` for n = 0, 1, ... until the stream refuses one; returns how many went in and the
/// refusal.
async fn fill(
    client: &reqwest::Client,
    server: &TestServer,
    id: &str,
    message: impl Fn(usize) -> Value,
) -> (usize, Value) {
    let url = server.url(&format!("/v1/streams/{id}/messages"));
    for n in 0..10_000 {
        let (status, reply) = post_json(client, &url, &message(n)).await;
        if status != 200 {
            return (n, json!({ "status": status, "reply": reply }));
        }
    }
    panic!("the stream never filled up")
}

/// The stream's log as the hub keeps it, as JSON.
fn log(server: &TestServer, id: &str) -> Vec<Value> {
    let stream = server.hub.get(id).unwrap_or_else(|| panic!("stream {id} is kept"));
    stream.history().iter().map(|m| serde_json::to_value(m).expect("a message is JSON")).collect()
}

/// Checks that a log ends the way an ended stream must: a `message_end` for every `message_start` and a
/// `block_end` for every `block_start`, then `stream_end` last with `status`.
#[track_caller]
fn assert_closed(log: &[Value], status: &str) {
    let count = |name: &str| log.iter().filter(|m| lifecycle(m) == Some(name)).count();
    assert_eq!(count("message_start"), count("message_end"), "every message opened is ended");
    assert_eq!(count("block_start"), count("block_end"), "every block opened is ended");
    let last = log.last().expect("a log");
    assert_eq!(lifecycle(last), Some("stream_end"), "{last}");
    assert_eq!(last["props"]["data"]["status"], status, "{last}");
}

fn json_len(log: &[Value]) -> u64 {
    log.iter().map(|m| m.to_string().len() as u64).sum()
}

#[tokio::test]
async fn a_stream_at_its_limit_of_messages_still_ends_within_it() {
    let limit = 12;
    let server = server(Limits { messages_per_stream: limit, ..Limits::default() }).await;
    let client = reqwest::Client::new();
    for ending in ["end", "cancel"] {
        let id = create_stream(&client, &server).await;
        // Open messages until one more would leave no place for the events that close them...
        let (opened, refusal) = fill(&client, &server, &id, |n| open_message(n, "b1")).await;
        assert_eq!(refusal["status"], 409, "{refusal}");
        assert_envelope(&refusal["reply"], Some("messages[0]"), "stream_full");
        assert!(opened >= 2, "messages were opened: {opened}");
        // ... then whole messages, which need no closing event, take the places left.
        let (whole, refusal) =
            fill(&client, &server, &id, |n| json!({ "type": "text", "props": { "content": format!("{n}") } })).await;
        assert_eq!(refusal["status"], 409, "{refusal}");
        assert!(whole >= 1, "places were left: {whole}");
        let url = server.url(&format!("/v1/streams/{id}/{ending}"));
        let (status, reply) = post_empty(&client, &url).await;
        assert!(status == 200 || status == 202, "{ending}: {status} {reply}");
        let log = log(&server, &id);
        assert_closed(&log, if ending == "end" { "completed" } else { "cancelled" });
        assert_eq!(log.len(), limit, "{ending}: every place is taken, and no more than the limit");
    }
}

#[tokio::test]
async fn a_stream_at_its_byte_limit_still_ends_within_it() {
    let limit = 8 << 10;
    let server = server(Limits { stream_bytes: limit, ..Limits::default() }).await;
    let client = reqwest::Client::new();
    let id = create_stream(&client, &server).await;
    let (accepted, refusal) = fill(&client, &server, &id, |n| open_message(n, &format!("b{}", n / 3))).await;
    assert_eq!(refusal["status"], 409, "{refusal}");
    assert_envelope(&refusal["reply"], Some("messages[0]"), "stream_full");
    assert!(accepted >= 5, "messages went in: {accepted}");
    end_stream(&client, &server, &id).await;
    let log = log(&server, &id);
    assert_closed(&log, "completed");
    assert!(json_len(&log) <= limit, "{} bytes, over the limit of {limit}", json_len(&log));
}

#[tokio::test]
async fn a_full_hub_ends_every_stream_left_open_without_passing_its_limit() {
    let limit: u64 = 192 << 10;
    let server = server(Limits { hub_bytes: limit, ..Limits::default() }).await;
    let client = reqwest::Client::new();
    let mut streams = Vec::new();
    // Streams with open messages and blocks until the hub refuses a new stream.
    'fill: loop {
        let (status, created) = post_json(&client, &server.url("/v1/streams"), &json!({ "model": "m" })).await;
        if status != 201 {
            assert_eq!(status, 503, "{created}");
            assert_envelope(&created, None, "capacity");
            break;
        }
        let id = created["id"].as_str().expect("id").to_owned();
        let url = server.url(&format!("/v1/streams/{id}/messages"));
        streams.push(id);
        for n in 0..8 {
            let (status, reply) = post_json(&client, &url, &open_message(n, &format!("b{}", n % 4))).await;
            if status != 200 {
                assert_eq!(status, 503, "{reply}");
                assert_envelope(&reply, Some("messages[0]"), "capacity");
                continue 'fill;
            }
        }
        assert!(streams.len() < 1_000, "the hub never filled up");
    }
    assert!(streams.len() >= 10, "several streams: {}", streams.len());
    assert!(server.hub.bytes() <= limit, "full: {} of {limit}", server.hub.bytes());
    for id in &streams {
        end_stream(&client, &server, id).await;
        assert!(server.hub.bytes() <= limit, "after ending {id}: {} bytes, over {limit}", server.hub.bytes());
    }
    for id in &streams {
        assert_closed(&log(&server, id), "completed");
    }
}

#[tokio::test]
async fn an_outcome_that_does_not_fit_is_refused_and_the_stream_stays_open() {
    let server = server(Limits { hub_bytes: 64 << 10, ..Limits::default() }).await;
    let client = reqwest::Client::new();
    let id = create_stream(&client, &server).await;
    let url = server.url(&format!("/v1/streams/{id}/end"));
    let failed = |message: String, code: String, details: Value| json!({ "status": "error", "error": { "message": message, "code": code, "details": details } });
    // Over the message size limit (1 MiB): 413, and nothing changes.
    let (status, reply) = post_json(&client, &url, &failed("m".repeat(2 << 20), "boom".into(), Value::Null)).await;
    assert_eq!(status, 413, "{reply}");
    assert_envelope(&reply, None, "message_too_large");
    // A code is a name.
    let (status, reply) = post_json(&client, &url, &failed("m".into(), "c".repeat(1 << 20), Value::Null)).await;
    assert_eq!(status, 400, "{reply}");
    assert_envelope(&reply, Some("error.code"), "string_above_max_length");
    // Within the message size, but more than the hub has room for: 503, retryable.
    let details = json!({ "trace": "t".repeat(200 << 10) });
    let (status, reply) = post_json(&client, &url, &failed("m".into(), "boom".into(), details)).await;
    assert_eq!(status, 503, "{reply}");
    assert_envelope(&reply, None, "capacity");
    assert_eq!(log(&server, &id).len(), 1, "the stream is as it was: its stream_start");
    assert!(server.hub.bytes() <= 64 << 10);

    // The same end with less goes in, whole.
    let details = json!({ "trace": "t".repeat(4 << 10) });
    let (status, reply) = post_json(&client, &url, &failed("m".into(), "boom".into(), details.clone())).await;
    assert_eq!(status, 200, "{reply}");
    assert_eq!(reply["status"], "error", "{reply}");
    let log = log(&server, &id);
    assert_closed(&log, "error");
    let error = &log[log.len() - 1]["props"]["data"]["error"];
    assert_eq!(error, &json!({ "message": "m", "code": "boom", "details": details }));
}

/// Fails with a message of a mebibyte and more, with details.
struct Verbose;

impl Agent for Verbose {
    async fn run(&self, _conversation: Conversation, output: Output) -> Result<Outcome, AgentError> {
        let mut text = output.stream_text();
        text.append("partial")?;
        Err(AgentError::new(format!("failed: {}", "é".repeat(1 << 20))).with_code("verbose_failure"))
    }
}

#[tokio::test]
async fn an_agent_s_outcome_too_large_for_its_stream_is_shrunk_not_refused() {
    let mut agents = Agents::builtin();
    agents.register("verbose", Verbose);
    let server = TestServer::with(HubConfig::default(), Settings::default(), agents).await;
    let client = reqwest::Client::new();
    let request = json!({ "model": "verbose", "messages": [{ "role": "user", "content": "go" }] });
    let response = client.post(server.url("/v1/chat/completions")).json(&request).send().await.expect("chat");
    assert_eq!(response.status(), 500);
    let id = common::http::header(&response, "x-agentmux-stream-id").to_owned();
    let body: Value = response.json().await.expect("JSON");
    let message = body["error"]["message"].as_str().expect("a message");
    let head: String = message.chars().take(80).collect();
    assert!(
        message.starts_with("failed: é") && message.len() <= 64,
        "cut to 64 bytes: {} bytes, {head:?}",
        message.len()
    );
    assert_eq!(body["error"]["code"], "verbose_failure", "{body}");
    let log = log(&server, &id);
    assert_closed(&log, "error");
    assert!(log.iter().all(|m| m.to_string().len() < 1 << 10), "no event carries the mebibyte");
    let stream = server.hub.get(&id).expect("kept");
    let outcome = stream.outcome().expect("ended");
    assert_eq!(outcome.error.map(|e| e.message), Some(message.to_owned()), "the outcome is the one sent");
    // The agent's text was streamed in deltas, so its message was open: it was ended too.
    assert!(log.iter().any(|m| lifecycle(m) == Some("message_end")));
}
