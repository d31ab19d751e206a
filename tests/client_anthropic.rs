//! The official Anthropic clients read our Anthropic Messages streams. The Node `@anthropic-ai/sdk` (1.x,
//! `tests/node/anthropic.mjs`) reads every golden file (`fixtures/*/anthropic.sse`) with
//! `messages.stream(...).finalMessage()` and calls `POST /v1/messages` over a real socket; the Python
//! `anthropic` package (2.x, `tests/python/anthropic_client.py`) calls it with
//! `messages.stream(...).get_final_message()` and `messages.create`: text, thinking, tool use, usage, an error.
//! The AI SDK's `@ai-sdk/anthropic` (4.x, `tests/node/ai_sdk_anthropic.mjs`) and the Node SDK read errors in
//! Anthropic's shape, the names of a run on its errors, and `input_tokens`.
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

async fn ai_sdk(base: String, runs: Vec<Value>) -> BTreeMap<String, Value> {
    let results = common::node::run_script("ai_sdk_anthropic.mjs", json!({"base": base, "runs": runs})).await;
    results.into_iter().map(|r| (r["name"].as_str().unwrap_or("").to_owned(), r)).collect()
}

/// Errors on `/v1/messages` come in Anthropic's shape, so both SDKs show Anthropic's error type and the
/// service's (or the agent's) message rather than the status's name; an error given once the run's stream
/// exists names it; and the usage the agent reported reaches `input_tokens`.
#[tokio::test(flavor = "multi_thread")]
async fn the_sdks_read_errors_and_usage_in_anthropic_s_shape() {
    let server = TestServer::start().await;
    let sdk = vec![
        json!({"name": "unknown", "model": "no-such-agent", "stream": false}),
        json!({"name": "failed", "model": "replay/failed", "stream": false}),
        json!({"name": "usage", "model": "replay/usage"}),
        json!({"name": "usage-whole", "model": "replay/usage", "stream": false}),
    ];
    let ai = vec![
        json!({"name": "unknown", "model": "no-such-agent", "stream": false}),
        json!({"name": "failed", "model": "replay/failed", "stream": false}),
        json!({"name": "failed-stream", "model": "replay/failed", "stream": true}),
        json!({"name": "usage", "model": "replay/usage", "stream": true}),
        json!({"name": "usage-whole", "model": "replay/usage", "stream": false}),
    ];
    let (sdk, ai) = tokio::join!(run(Some(server.url("")), sdk), ai_sdk(server.url("/v1"), ai));
    // JSON that does not parse is refused before the handler: still in Anthropic's shape.
    let refused = reqwest::Client::new()
        .post(server.url("/v1/messages"))
        .header("content-type", "application/json")
        .body("{not json")
        .send()
        .await
        .expect("POST /v1/messages");
    let status = refused.status();
    let refused: Value = refused.json().await.expect("a JSON body");
    server.stop().await.expect("stops");

    let unknown = &sdk["unknown"]["error"];
    assert_eq!((&unknown["status"], &unknown["type"]), (&json!(404), &json!("not_found_error")), "{unknown}");
    assert!(unknown["apiMessage"].as_str().is_some_and(|m| m.contains("does not exist")), "{unknown}");
    let failed = &sdk["failed"]["error"];
    assert_eq!((&failed["status"], &failed["type"]), (&json!(500), &json!("api_error")), "{failed}");
    assert_eq!(failed["apiMessage"], "The model is overloaded, try again later", "{failed}");
    assert!(failed["streamId"].is_string() && failed["readToken"].is_string(), "the run is named: {failed}");
    for name in ["usage", "usage-whole"] {
        let usage = &sdk[name]["message"]["usage"];
        assert_eq!((&usage["input_tokens"], &usage["output_tokens"]), (&json!(12), &json!(5)), "{name}: {usage}");
    }

    let unknown = &ai["unknown"]["error"];
    assert_eq!(unknown["status"], 404, "{unknown}");
    assert!(unknown["message"].as_str().is_some_and(|m| m.contains("does not exist")), "{unknown}");
    for name in ["failed", "failed-stream"] {
        let failed = &ai[name]["error"];
        assert_eq!(failed["message"], "The model is overloaded, try again later", "{name}: {failed}");
    }
    assert!(ai["failed"]["error"]["streamId"].is_string(), "{}", ai["failed"]);
    for name in ["usage", "usage-whole"] {
        let usage = &ai[name]["usage"];
        assert_eq!(usage, &json!({"input": 12, "output": 5}), "{name}: {}", ai[name]);
    }

    assert_eq!(status, 400, "{refused}");
    assert_eq!(refused["type"], "error", "{refused}");
    assert_eq!(refused["error"]["type"], "invalid_request_error", "{refused}");
}

/// A turn on a thread whose run still goes is a 409 that names the run in the way (its stream and a read
/// token), so the client can watch it; both SDKs raise it with Anthropic's error type and its message.
#[tokio::test(flavor = "multi_thread")]
async fn a_busy_thread_s_409_names_the_running_stream() {
    let server = TestServer::start().await;
    // The demo paces its output over about two seconds.
    let running = reqwest::Client::new()
        .post(server.url("/v1/messages"))
        .header("x-agentmux-thread-id", "t-busy")
        .json(&json!({"model": "demo", "stream": true, "max_tokens": 64,
            "messages": [{"role": "user", "content": "go"}]}))
        .send()
        .await
        .expect("start the demo");
    assert_eq!(running.status(), 200);
    let stream = running.headers()["x-agentmux-stream-id"].to_str().expect("an id").to_owned();
    let headers = json!({"x-agentmux-thread-id": "t-busy"});
    let busy = |name: &str| json!({"name": name, "model": "echo", "stream": false, "headers": headers});
    let (sdk, ai) =
        tokio::join!(run(Some(server.url("")), vec![busy("busy")]), ai_sdk(server.url("/v1"), vec![busy("busy")]));
    drop(running);
    server.stop().await.expect("stops");

    let error = &sdk["busy"]["error"];
    assert_eq!((&error["status"], &error["type"]), (&json!(409), &json!("invalid_request_error")), "{error}");
    assert!(error["apiMessage"].as_str().is_some_and(|m| m.contains(&stream)), "{error}");
    assert_eq!(error["streamId"], stream.as_str(), "{error}");
    assert!(error["readToken"].as_str().is_some_and(|t| t.starts_with("amr.")), "{error}");
    let error = &ai["busy"]["error"];
    assert_eq!(error["status"], 409, "{error}");
    assert!(error["message"].as_str().is_some_and(|m| m.contains(&stream)), "{error}");
    assert_eq!(error["streamId"], stream.as_str(), "{error}");
    assert!(error["readToken"].is_string(), "{error}");
}
