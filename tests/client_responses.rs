//! The official OpenAI clients read our Responses streams. The Node `openai` package (7.x,
//! `tests/node/responses.mjs`, which throws on an event type it does not know) reads every golden file
//! (`fixtures/*/responses.sse`) with `responses.stream(...).finalResponse()` and calls `POST /v1/responses`
//! over a real socket; the Python `openai` package (`tests/python/responses_client.py`) calls it with
//! `responses.stream(...).get_final_response()` and `responses.create`: text, reasoning, function calls, a
//! failure. The AI SDK's OpenAI provider (`@ai-sdk/openai`, `tests/node/ai_sdk_openai.mjs`) raises the agent's
//! message for a failed response, streamed or not, and an error for a cancelled one (never a short answer).
//! Node, Python and the packages are installed when missing (`common/node.rs`, `common/python.rs`).

mod common;

use std::collections::BTreeMap;

use common::server::TestServer;
use serde_json::{Value, json};

async fn run(base: Option<String>, runs: Vec<Value>) -> BTreeMap<String, Value> {
    let results = common::node::run_script("responses.mjs", json!({"base": base, "runs": runs})).await;
    results.into_iter().map(|r| (r["name"].as_str().unwrap_or("").to_owned(), r)).collect()
}

/// The output items of `kind`.
fn items<'r>(response: &'r Value, kind: &str) -> Vec<&'r Value> {
    response["output"].as_array().into_iter().flatten().filter(|item| item["type"] == kind).collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn the_node_openai_package_reads_every_golden_responses_file() {
    let cases = common::cases();
    let runs = cases
        .iter()
        .map(|case| json!({"name": case, "file": common::fixtures_dir().join(case).join("responses.sse")}))
        .collect();
    let results = run(None, runs).await;
    for case in &cases {
        let result = &results[case];
        match case.as_str() {
            // A cancel is an error the client raises, not a short answer (issue 43, item 2).
            "error-mid-stream" | "failed" | "cancelled" => {
                assert!(result["error"].is_string(), "{case}: a failure throws: {result}")
            }
            // Not completed: `finalResponse()` wants `response.completed`, but every event parsed.
            "finish-length" => {
                let last = result["events"].as_array().and_then(|e| e.last()).cloned();
                assert_eq!(last, Some(json!("response.incomplete")), "{case}: {result}");
            }
            _ => {
                assert!(result["error"].is_null(), "{case}: {result}");
                assert_eq!(result["response"]["id"], "resp_golden", "{case}: {result}");
                assert_eq!(result["response"]["status"], "completed");
            }
        }
    }
    let calls = items(&results["two-tool-calls-interleaved"]["response"], "function_call").len();
    assert_eq!(calls, 2, "{}", results["two-tool-calls-interleaved"]);
    let plain = &results["plain-text"];
    let input: Value = serde_json::from_slice(&common::read("plain-text", "input.jsonl")).expect("the input");
    assert_eq!(plain["outputText"], input["props"]["content"], "{plain}");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_node_openai_package_calls_the_responses_endpoint() {
    let server = TestServer::start().await;
    let runs = vec![
        json!({"name": "text", "model": "echo"}),
        json!({"name": "reasoning", "model": "replay/thinking-then-text"}),
        json!({"name": "function_calls", "model": "replay/two-tool-calls-interleaved"}),
        json!({"name": "failure", "model": "replay/error-mid-stream"}),
    ];
    let results = run(Some(server.url("/v1")), runs).await;
    server.stop().await.expect("stops");
    assert_eq!(results["text"]["outputText"], "hello from node", "{}", results["text"]);
    let reasoning = &results["reasoning"]["response"];
    assert_eq!(items(reasoning, "reasoning").len(), 1, "{reasoning}");
    assert!(!results["reasoning"]["outputText"].as_str().unwrap_or("").is_empty());
    let calls = items(&results["function_calls"]["response"], "function_call");
    let names: Vec<&str> = calls.iter().filter_map(|c| c["name"].as_str()).collect();
    assert_eq!(names, ["get_weather", "get_time"], "{}", results["function_calls"]);
    assert!(
        results["failure"]["error"].as_str().is_some_and(|e| e.contains("Upstream API timed out")),
        "{}",
        results["failure"]
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn the_python_openai_package_calls_the_responses_endpoint() {
    let python = tokio::task::spawn_blocking(common::python::ensure_venv)
        .await
        .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()));
    let server = TestServer::start().await;
    let output = common::python::run_script(python, "responses_client.py", vec![server.url("/v1")]).await;
    server.stop().await.expect("stops");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let cases = common::python::cases(&output);
    for name in ["text", "text_whole"] {
        assert_eq!(cases[name]["output_text"], "hello from python", "{name}: {stdout}");
        assert_eq!(cases[name]["response"]["status"], "completed");
    }
    let events = cases["text"]["events"].as_array().cloned().unwrap_or_default();
    assert_eq!(events.first(), Some(&json!("response.created")), "{stdout}");
    assert_eq!(events.last(), Some(&json!("response.completed")), "{stdout}");
    assert_eq!(items(&cases["reasoning"]["response"], "reasoning").len(), 1, "{stdout}");
    let calls = items(&cases["function_calls"]["response"], "function_call");
    let arguments: Vec<Value> =
        calls.iter().filter_map(|c| c["arguments"].as_str()).map(|a| serde_json::from_str(a).expect("JSON")).collect();
    assert_eq!(arguments, [json!({"city": "Paris"}), json!({"tz": "Europe/Paris"})], "{stdout}");
    assert!(
        cases["failure"]["error"]["message"].as_str().is_some_and(|m| m.contains("Upstream API timed out")),
        "{stdout}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn the_ai_sdk_openai_provider_raises_on_a_failed_or_cancelled_response() {
    let server = TestServer::start().await;
    let runs = vec![
        json!({"name": "text", "model": "echo", "stream": false}),
        json!({"name": "text_streamed", "model": "echo", "stream": true}),
        json!({"name": "failed", "model": "replay/failed", "stream": false}),
        json!({"name": "failed_streamed", "model": "replay/failed", "stream": true}),
        json!({"name": "cancelled", "model": "replay/cancelled", "stream": false}),
        json!({"name": "cancelled_streamed", "model": "replay/cancelled", "stream": true}),
    ];
    let results = common::node::run_script("ai_sdk_openai.mjs", json!({"base": server.url("/v1"), "runs": runs})).await;
    server.stop().await.expect("stops");
    let results: BTreeMap<String, Value> =
        results.into_iter().map(|r| (r["name"].as_str().unwrap_or("").to_owned(), r)).collect();
    for name in ["text", "text_streamed"] {
        let result = &results[name];
        assert_eq!(result["text"], "hello from the AI SDK", "{name}: {result}");
        assert!(result["error"].is_null(), "{name}: {result}");
    }
    for name in ["failed", "failed_streamed"] {
        let error = results[name]["error"].as_str().unwrap_or_default();
        assert!(error.contains("The model is overloaded"), "{name}: the agent's message is shown: {}", results[name]);
    }
    for name in ["cancelled", "cancelled_streamed"] {
        let error = results[name]["error"].as_str().unwrap_or_default();
        assert!(error.contains("cancelled"), "{name}: a cancel is an error, not a short answer: {}", results[name]);
    }
}
