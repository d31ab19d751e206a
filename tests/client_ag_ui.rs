//! The official `@ag-ui/client` (1.x) reads our AG-UI events: `tests/node/ag_ui.mjs` runs each stream with
//! `HttpAgent.runAgent`, which checks every event against `@ag-ui/core`'s schemas and its verifier (the
//! order, everything closed before the run finishes, nothing after) and applies them to the agent's messages.
//! Every golden file (`fixtures/*/ag-ui.sse`) is read without a warning (the client warns when it strips a
//! field or drops an event it does not know), and live runs of `POST /v1/ag-ui` over a real socket give the
//! right messages: text, reasoning, a tool call the agent runs and its result, calls left to the frontend,
//! activities, steps, an error, a cancel. Node and the package are installed when missing (`common/node.rs`).

mod common;

use std::collections::BTreeMap;

use common::server::TestServer;
use serde_json::{Value, json};

/// The runs' results by name.
async fn run(runs: Vec<Value>) -> BTreeMap<String, Value> {
    let results = common::node::run_script("ag_ui.mjs", json!({"runs": runs})).await;
    results.into_iter().map(|r| (r["name"].as_str().unwrap_or("").to_owned(), r)).collect()
}

/// The agent's messages with `role`.
fn with_role<'m>(result: &'m Value, role: &str) -> Vec<&'m Value> {
    result["messages"].as_array().into_iter().flatten().filter(|m| m["role"] == role).collect()
}

/// The content of its messages with `role`, joined.
fn content(result: &Value, role: &str) -> String {
    with_role(result, role).iter().filter_map(|m| m["content"].as_str()).collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn the_ag_ui_client_reads_every_golden_file() {
    let cases = common::cases();
    let runs = cases
        .iter()
        .map(|case| json!({"name": case, "file": common::fixtures_dir().join(case).join("ag-ui.sse")}))
        .collect();
    let results = run(runs).await;
    for case in &cases {
        let result = &results[case];
        assert!(result["failed"].is_null(), "{case}: the client refused it: {result}");
        assert_eq!(result["printed"], json!([]), "{case}: the client warned: {result}");
        let events = result["events"].as_array().expect("events");
        assert_eq!(events.first(), Some(&json!("RUN_STARTED")), "{case}");
        let last = events.last().and_then(Value::as_str).unwrap_or("");
        match case.as_str() {
            "error-mid-stream" | "failed" => assert_eq!(last, "RUN_ERROR", "{case}: {result}"),
            _ => assert_eq!(last, "RUN_FINISHED", "{case}: {result}"),
        }
    }
    let cancelled = &results["cancelled"];
    assert_eq!(cancelled["outcome"], json!({"type": "cancelled"}), "{cancelled}");
    let pending = &results["two-tool-calls-interleaved"];
    assert_eq!(pending["outcome"]["pendingToolCallIds"], json!(["call_a", "call_b"]), "{pending}");
    let calls = with_role(pending, "assistant")
        .iter()
        .flat_map(|m| m["toolCalls"].as_array().cloned().unwrap_or_default())
        .collect::<Vec<_>>();
    let arguments: Vec<&str> = calls.iter().filter_map(|c| c["function"]["arguments"].as_str()).collect();
    assert_eq!(arguments, ["{\"city\": \"Paris\"}", "{\"tz\": \"Europe/Paris\"}"], "{pending}");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_ag_ui_client_runs_agents_through_the_endpoint() {
    let server = TestServer::start().await;
    let url = server.url("/v1/ag-ui");
    let runs = [
        ("echo", "echo"),
        ("reasoning", "replay/thinking-then-text"),
        ("tool", "replay/tool-call-then-text"),
        ("error", "replay/error-mid-stream"),
        ("custom", "replay/custom-types"),
        ("demo", "demo"),
    ]
    .iter()
    .map(|(name, model)| json!({"name": name, "url": url, "model": model}))
    .collect();
    let results = run(runs).await;
    server.stop().await.expect("stops");
    for (name, result) in &results {
        assert!(result["failed"].is_null(), "{name}: {result}");
        assert_eq!(result["printed"], json!([]), "{name}: the client warned: {result}");
    }

    let echo = &results["echo"];
    assert_eq!(content(echo, "assistant"), "hello from a frontend", "{echo}");
    assert_eq!(with_role(echo, "user").len(), 1, "the input stays: {echo}");

    let reasoning = &results["reasoning"];
    assert!(!content(reasoning, "reasoning").is_empty(), "{reasoning}");
    assert!(!content(reasoning, "assistant").is_empty(), "{reasoning}");

    let tool = &results["tool"];
    let calls: Vec<&Value> =
        with_role(tool, "assistant").iter().filter_map(|m| m["toolCalls"].as_array()).flatten().collect();
    assert_eq!(calls.len(), 1, "{tool}");
    assert_eq!(calls[0]["function"]["name"], "get_weather");
    assert_eq!(calls[0]["function"]["arguments"], "{\"location\":\"Paris\"}");
    let results_of_tools = with_role(tool, "tool");
    assert_eq!(results_of_tools.len(), 1, "{tool}");
    assert_eq!(results_of_tools[0]["toolCallId"], calls[0]["id"]);
    let output: Value = serde_json::from_str(results_of_tools[0]["content"].as_str().expect("content")).expect("JSON");
    assert_eq!(output, json!({"temp_c": 18, "sky": "sunny"}));
    assert_eq!(tool["outcome"], json!({"type": "success"}), "the agent ran its own call: nothing pending");

    let error = &results["error"];
    assert_eq!(error["runError"], json!({"message": "Upstream API timed out after 30s", "code": "upstream_timeout"}));
    assert_eq!(error["events"].as_array().and_then(|e| e.last()), Some(&json!("RUN_ERROR")), "nothing after it");

    let custom = &results["custom"];
    let activities = with_role(custom, "activity");
    let types: Vec<&str> = activities.iter().filter_map(|a| a["activityType"].as_str()).collect();
    assert_eq!(types, ["chart", "form"], "{custom}");
    assert_eq!(activities[0]["content"]["title"], "Q3 revenue");

    let demo = &results["demo"];
    let events: Vec<&str> = demo["events"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
    for event in [
        "STEP_STARTED",
        "STEP_FINISHED",
        "REASONING_MESSAGE_CONTENT",
        "TOOL_CALL_RESULT",
        "ACTIVITY_SNAPSHOT",
        "CUSTOM",
    ] {
        assert!(events.contains(&event), "the demo's {event}: {events:?}");
    }
    assert_eq!(events.last(), Some(&"RUN_FINISHED"));
}
