//! The official Anthropic clients read our Anthropic Messages streams. The Node `@anthropic-ai/sdk` (1.x,
//! `tests/node/anthropic.mjs`) reads every golden file (`fixtures/*/anthropic.sse`) with
//! `messages.stream(...).finalMessage()` and calls `POST /v1/messages` over a real socket; the Python
//! `anthropic` package (2.x, `tests/python/anthropic_client.py`) calls it with
//! `messages.stream(...).get_final_message()` and `messages.create`: text, thinking, tool use, usage, an error.
//! Node, Python and the packages are installed when missing (`common/node.rs`, `common/python.rs`).

mod common;

use std::collections::BTreeMap;

use common::server::TestServer;
use serde_json::{Value, json};

async fn run(base: Option<String>, runs: Vec<Value>) -> BTreeMap<String, Value> {
    let results = common::node::run_script("anthropic.mjs", json!({"base": base, "runs": runs})).await;
    results.into_iter().map(|r| (r["name"].as_str().unwrap_or("").to_owned(), r)).collect()
}

/// The text of a message's blocks of `kind` (`text` or `thinking`), joined.
fn text(message: &Value, kind: &str) -> String {
    message["content"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|b| b["type"] == kind)
        .filter_map(|b| b[kind].as_str())
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn the_anthropic_sdk_reads_every_golden_file() {
    let cases = common::cases();
    let runs = cases
        .iter()
        .map(|case| json!({"name": case, "file": common::fixtures_dir().join(case).join("anthropic.sse")}))
        .collect();
    let results = run(None, runs).await;
    for case in &cases {
        let result = &results[case];
        match case.as_str() {
            "error-mid-stream" | "failed" | "cancelled" => {
                assert!(result["error"]["message"].is_string(), "{case}: event: error raises: {result}");
            }
            _ => {
                assert!(result["error"].is_null(), "{case}: {result}");
                assert_eq!(result["message"]["id"], "msg_golden", "{case}: {result}");
                assert_eq!(result["events"].as_array().and_then(|e| e.last()), Some(&json!("message_stop")));
            }
        }
    }
    let tools = &results["two-tool-calls-interleaved"]["message"];
    assert_eq!(tools["stop_reason"], "tool_use", "{tools}");
    let inputs: Vec<&Value> = tools["content"].as_array().into_iter().flatten().map(|b| &b["input"]).collect();
    assert_eq!(inputs, [&json!({"city": "Paris"}), &json!({"tz": "Europe/Paris"})], "{tools}");
    let usage = &results["usage"]["message"]["usage"];
    assert!(usage["output_tokens"].as_u64().is_some_and(|n| n > 0), "{usage}");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_anthropic_sdk_calls_the_messages_endpoint() {
    let server = TestServer::start().await;
    let runs = vec![
        json!({"name": "text", "model": "echo"}),
        json!({"name": "text-whole", "model": "echo", "stream": false}),
        json!({"name": "thinking", "model": "replay/thinking-then-text"}),
        json!({"name": "tools", "model": "replay/two-tool-calls-interleaved"}),
        json!({"name": "error", "model": "replay/error-mid-stream"}),
        json!({"name": "error-whole", "model": "replay/error-mid-stream", "stream": false}),
        json!({"name": "unknown", "model": "no-such-agent"}),
    ];
    let results = run(Some(server.url("")), runs).await;
    server.stop().await.expect("stops");

    for name in ["text", "text-whole"] {
        let message = &results[name]["message"];
        assert_eq!(text(message, "text"), "hello from a client", "{name}: {message}");
        assert_eq!(message["stop_reason"], "end_turn");
        assert_eq!(message["role"], "assistant");
    }
    let thinking = &results["thinking"]["message"];
    assert!(text(thinking, "thinking").contains("haiku"), "{thinking}");
    assert!(!text(thinking, "text").is_empty(), "{thinking}");
    let tools = &results["tools"]["message"];
    assert_eq!(tools["stop_reason"], "tool_use", "{tools}");
    let names: Vec<&str> =
        tools["content"].as_array().into_iter().flatten().filter_map(|b| b["name"].as_str()).collect();
    assert_eq!(names, ["get_weather", "get_time"]);
    assert!(
        results["error"]["error"]["message"].as_str().is_some_and(|m| m.contains("Upstream API timed out")),
        "{}",
        results["error"]
    );
    assert_eq!(results["error-whole"]["error"]["status"], 500, "{}", results["error-whole"]);
    assert_eq!(results["unknown"]["error"]["status"], 404, "{}", results["unknown"]);
}

#[tokio::test(flavor = "multi_thread")]
async fn the_anthropic_python_package_calls_the_messages_endpoint() {
    let python = tokio::task::spawn_blocking(common::python::ensure_venv)
        .await
        .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()));
    let server = TestServer::start().await;
    let output = common::python::run_script(python, "anthropic_client.py", vec![server.url("")]).await;
    server.stop().await.expect("stops");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let cases = common::python::cases(&output);
    for name in ["text", "text_whole"] {
        let message = &cases[name]["message"];
        assert_eq!(text(message, "text"), "hello from python", "{name}: {stdout}");
        assert_eq!(message["stop_reason"], "end_turn");
    }
    assert_eq!(cases["text"]["events"].as_array().and_then(|e| e.last()), Some(&json!("message_stop")), "{stdout}");
    let thinking = &cases["thinking"]["message"];
    assert!(text(thinking, "thinking").contains("haiku"), "{stdout}");
    let tools = &cases["tools"]["message"];
    assert_eq!(tools["stop_reason"], "tool_use", "{stdout}");
    let inputs: Vec<&Value> = tools["content"].as_array().into_iter().flatten().map(|b| &b["input"]).collect();
    assert_eq!(inputs, [&json!({"city": "Paris"}), &json!({"tz": "Europe/Paris"})], "{stdout}");
    assert!(cases["usage"]["message"]["usage"]["output_tokens"].as_u64().is_some_and(|n| n > 0), "{stdout}");
    assert!(
        cases["error"]["error"]["message"].as_str().is_some_and(|m| m.contains("Upstream API timed out")),
        "{stdout}"
    );
    assert_eq!(cases["error_whole"]["error"]["status"], 500, "{stdout}");
}
