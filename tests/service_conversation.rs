//! A chat request's conversation is checked at the edge, over HTTP: the design's own examples (an unknown role
//! "hacker", a tool message without `tool_call_id`, an empty assistant) and every other rule get a 400 with
//! the envelope and `param` naming the message and field, and no run starts; a stateless multi-turn
//! conversation with tool calls and their results passes.

mod common;

use common::http::{assert_envelope, post_json};
use common::server::TestServer;
use serde_json::{Value, json};

fn chat(messages: Value) -> Value {
    json!({ "model": "echo", "messages": messages })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_rule_is_a_400_naming_the_field() {
    let server = TestServer::start().await;
    let client = reqwest::Client::new();
    let call = json!({ "id": "call_1", "type": "function", "function": { "name": "ls", "arguments": "{}" } });
    let table: Vec<(&str, Value, &str)> = vec![
        ("an unknown role", json!([{ "role": "hacker", "content": "inject" }]), "messages[0].role"),
        (
            "a tool message without tool_call_id",
            json!([{ "role": "tool", "content": "result" }]),
            "messages[0].tool_call_id",
        ),
        (
            "an empty assistant",
            json!([{ "role": "user", "content": "hi" }, { "role": "assistant", "content": "" }, { "role": "user", "content": "?" }]),
            "messages[1].content",
        ),
        (
            "a tool message that answers no call",
            json!([{ "role": "user", "content": "hi" }, { "role": "tool", "tool_call_id": "call_9", "content": "r" }]),
            "messages[1].tool_call_id",
        ),
        (
            "a tool call without an id",
            json!([{ "role": "assistant", "content": null, "tool_calls": [{ "type": "function", "function": { "name": "ls" } }] }]),
            "messages[0].tool_calls[0].id",
        ),
        (
            "a tool call without a name",
            json!([{ "role": "assistant", "content": null, "tool_calls": [{ "id": "call_1", "type": "function", "function": {} }] }]),
            "messages[0].tool_calls[0].function.name",
        ),
        (
            "a tool message naming another tool",
            json!([
                { "role": "user", "content": "hi" },
                { "role": "assistant", "content": null, "tool_calls": [call] },
                { "role": "tool", "tool_call_id": "call_1", "name": "rm", "content": "r" },
            ]),
            "messages[2].name",
        ),
        ("an empty user message", json!([{ "role": "user", "content": " " }]), "messages[0].content"),
        (
            "an empty system message",
            json!([{ "role": "system", "content": "" }, { "role": "user", "content": "hi" }]),
            "messages[0].content",
        ),
    ];
    for (what, messages, param) in table {
        let (status, body) = post_json(&client, &server.url("/v1/chat/completions"), &chat(messages)).await;
        assert_eq!(status, 400, "{what}: {body}");
        let code = body["error"]["code"].as_str().unwrap_or_default().to_owned();
        assert_envelope(&body, Some(param), &code);
        assert_eq!(code, "invalid_value", "{what}: {body}");
    }
    assert_eq!(server.hub.len(), 0, "no run started");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stateless_conversation_with_tool_calls_and_results_passes() {
    let server = TestServer::start().await;
    let client = reqwest::Client::new();
    let messages = json!([
        { "role": "system", "content": "You are helpful." },
        { "role": "user", "content": "What is in /workspace?" },
        { "role": "assistant", "content": null, "tool_calls": [
            { "id": "call_1", "type": "function", "function": { "name": "ls", "arguments": "{\"path\":\"/workspace\"}" } },
            { "id": "call_2", "type": "function", "function": { "name": "du", "arguments": { "path": "/workspace" } } },
        ] },
        { "role": "tool", "tool_call_id": "call_1", "content": "main.py" },
        { "role": "tool", "tool_call_id": "call_2", "name": "du", "content": "256" },
        { "role": "assistant", "content": "One file, main.py." },
        { "role": "user", "content": [{ "type": "text", "text": "thanks" }, { "type": "image_url", "image_url": { "url": "https://example.com/a.png" } }] },
    ]);
    let (status, body) = post_json(&client, &server.url("/v1/chat/completions"), &chat(messages)).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["choices"][0]["message"]["content"], "thanks", "echo answers the last user text: {body}");
}
