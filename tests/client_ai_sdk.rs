//! The official `ai` package (the Vercel AI SDK) reads our UI message stream as `useChat` does:
//! `tests/node/ui_message.mjs` fetches each stream with the package's `DefaultChatTransport` (which checks
//! every chunk against the package's own schema and fails on a type it does not know) and builds the
//! assistant message with `readUIMessageStream` (which fails on a chunk out of order). Two majors read every
//! stream: the last 5.x and the current 7.x, since a chunk only one of them knows would break the other.
//!
//! What they read: every golden file (`fixtures/*/ui-message.sse`), and live streams over a real socket
//! (`GET /v1/streams/{id}/events?format=ui-message`) with text deltas, reasoning, a tool call the agent runs
//! and its result, a custom type replaced by a later delta, a transient loading message, and a cancel.
//!
//! Node and the packages are installed by the test when missing (`tests/common/node.rs`); nothing is skipped.

mod common;

use std::collections::BTreeMap;

use common::http::{create_stream, header, post_empty, post_json, snapshot};
use common::server::TestServer;
use serde_json::{Value, json};

/// The two majors of `ai`, as installed (`common::node`).
const PACKAGES: &[(&str, &str)] = &[("ai5", "5"), ("ai", "7")];

/// Runs `tests/node/<script>` with `config` and the `ai` majors to use in it.
async fn run_node(script: &'static str, mut config: Value) -> Vec<Value> {
    config["packages"] = PACKAGES.iter().map(|(alias, _)| json!(alias)).collect();
    common::node::run_script(script, config).await
}

/// Reads `sources` with every major; the results by (major alias, source name).
async fn read_with_ai(sources: Vec<Value>) -> BTreeMap<(String, String), Value> {
    let results = run_node("ui_message.mjs", json!({"sources": sources})).await;
    results
        .into_iter()
        .map(|r| ((r["package"].as_str().unwrap_or("").to_owned(), r["source"].as_str().unwrap_or("").to_owned()), r))
        .collect()
}

/// The message's parts of `kind`.
fn parts<'m>(message: &'m Value, kind: &str) -> Vec<&'m Value> {
    message["parts"].as_array().into_iter().flatten().filter(|p| p["type"] == kind).collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn both_majors_of_the_ai_package_read_every_golden_file() {
    let cases = common::cases();
    let sources = cases
        .iter()
        .map(|case| json!({"name": case, "file": common::fixtures_dir().join(case).join("ui-message.sse")}))
        .collect();
    let results = read_with_ai(sources).await;
    for (alias, _) in PACKAGES {
        for case in &cases {
            let result = &results[&((*alias).to_owned(), case.clone())];
            let chunks = result["chunks"].as_array().cloned().unwrap_or_default();
            assert!(chunks.iter().all(|c| !c.as_str().unwrap_or("").starts_with('!')), "{alias} {case}: {result}");
            let failed = case == "error-mid-stream" || case == "failed";
            if failed {
                assert!(result["error"].is_string(), "{alias} {case}: the error chunk fails the read: {result}");
            } else {
                assert!(result["error"].is_null(), "{alias} {case}: {result}");
                assert_eq!(result["message"]["id"], "msg-golden", "{alias} {case}: {result}");
            }
        }
        let plain = &results[&((*alias).to_owned(), "plain-text".to_owned())]["message"];
        let text: String = parts(plain, "text").iter().filter_map(|p| p["text"].as_str()).collect();
        let input: Value = serde_json::from_slice(&common::read("plain-text", "input.jsonl")).expect("the input");
        assert_eq!(text, input["props"]["content"].as_str().expect("its content"), "{alias}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn both_majors_of_the_ai_package_read_live_streams() {
    let server = TestServer::start().await;
    let client = reqwest::Client::new();
    let id = create_stream(&client, &server).await;
    let messages = server.url(&format!("/v1/streams/{id}/messages"));
    let batch = json!([
        {"type": "thinking", "props": {"content": "Let me look."}, "message_id": "t1"},
        {"type": "loading", "props": {"message": "Searching"}, "message_id": "l1"},
        {"type": "tool_call", "props": {"id": "call_1", "name": "search", "arguments": "{\"q\":"}, "message_id": "c1", "delta": true},
        {"type": "tool_call", "props": {"arguments": "\"paris\"}", "server_side": true}, "message_id": "c1", "delta": true},
        {"type": "tool_result", "props": {"call_id": "call_1", "name": "search", "result": {"hits": 3}}},
        {"type": "progress", "props": {"done": 1, "of": 3}, "message_id": "p1"},
        {"type": "progress", "props": {"done": 3}, "message_id": "p1", "delta": true, "delta_action": "merge", "delta_path": ""},
        {"type": "text", "props": {"content": "Found "}, "message_id": "m1", "delta": true},
        {"type": "text", "props": {"content": "three."}, "message_id": "m1", "delta": true},
    ]);
    let (status, body) = post_json(&client, &messages, &batch).await;
    assert_eq!(status, 200, "{body}");
    let (status, _) = post_empty(&client, &server.url(&format!("/v1/streams/{id}/end"))).await;
    assert_eq!(status, 200);
    let cancelled = create_stream(&client, &server).await;
    let text = json!({"type": "text", "props": {"content": "Half"}, "message_id": "m1", "delta": true});
    let (status, _) = post_json(&client, &server.url(&format!("/v1/streams/{cancelled}/messages")), &text).await;
    assert_eq!(status, 200);
    let (status, _) = post_empty(&client, &server.url(&format!("/v1/streams/{cancelled}/cancel"))).await;
    assert_eq!(status, 202, "a cancel is accepted");

    let events = |id: &str| server.url(&format!("/v1/streams/{id}/events?format=ui-message"));
    let response = client.get(events(&id)).send().await.expect("events");
    assert_eq!(header(&response, "x-vercel-ai-ui-message-stream"), "v1");
    assert_eq!(header(&response, "content-type"), "text/event-stream");
    drop(response);
    let epoch = snapshot(&client, &server, &id).await["epoch"].as_str().expect("an epoch").to_owned();
    let sources =
        vec![json!({"name": "run", "url": events(&id)}), json!({"name": "cancelled", "url": events(&cancelled)})];
    let results = read_with_ai(sources).await;
    server.stop().await.expect("stops");

    for (alias, _) in PACKAGES {
        let run = &results[&((*alias).to_owned(), "run".to_owned())];
        assert!(run["error"].is_null(), "{alias}: {run}");
        let message = &run["message"];
        assert_eq!(message["id"], format!("msg-{epoch}"), "{alias}: the id comes from the epoch, never the stream id");
        assert_eq!(message["role"], "assistant");
        let reasoning = parts(message, "reasoning");
        assert_eq!(reasoning.len(), 1, "{alias}: {message}");
        assert_eq!(reasoning[0]["text"], "Let me look.");
        let text = parts(message, "text");
        assert_eq!(text.len(), 1, "{alias}: {message}");
        assert_eq!(text[0]["text"], "Found three.");
        let tools = parts(message, "dynamic-tool");
        assert_eq!(tools.len(), 1, "{alias}: {message}");
        assert_eq!(tools[0]["toolName"], "search");
        assert_eq!(tools[0]["state"], "output-available");
        assert_eq!(tools[0]["input"], json!({"q": "paris"}));
        assert_eq!(tools[0]["output"], json!({"hits": 3}));
        let progress = parts(message, "data-progress");
        assert_eq!(progress.len(), 1, "{alias}: a later delta replaces the part with its id: {message}");
        assert_eq!(progress[0]["data"], json!({"done": 3, "of": 3}));
        assert!(parts(message, "data-loading").is_empty(), "{alias}: loading is transient: {message}");
        let chunks: Vec<&str> = run["chunks"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
        assert!(chunks.contains(&"data-loading"), "{alias}: it was sent, to onData: {chunks:?}");
        assert_eq!(chunks.first(), Some(&"start"));
        assert_eq!(chunks.last(), Some(&"finish"), "{alias}: {chunks:?}");

        let cancelled = &results[&((*alias).to_owned(), "cancelled".to_owned())];
        assert!(cancelled["error"].is_null(), "{alias}: {cancelled}");
        let chunks: Vec<&str> =
            cancelled["chunks"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
        assert_eq!(chunks.last(), Some(&"abort"), "{alias}: {chunks:?}");
        assert_eq!(parts(&cancelled["message"], "text")[0]["text"], "Half", "{alias}: {cancelled}");
    }
}

/// The text of a message's parts of `kind`, joined.
fn text(message: &Value, kind: &str) -> String {
    parts(message, kind).iter().filter_map(|p| p["text"].as_str()).collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_headless_use_chat_talks_to_the_ui_chat_endpoints() {
    let server = TestServer::start().await;
    let results = run_node("use_chat.mjs", json!({"base": server.url("")})).await;
    let client = reqwest::Client::new();
    let mut cancelled_streams = Vec::new();
    for (alias, _) in PACKAGES {
        let case = |name: &str| {
            let result = results
                .iter()
                .find(|r| r["package"] == *alias && r["case"] == name)
                .unwrap_or_else(|| panic!("{alias} {name} missing"));
            assert!(result["thrown"].is_null(), "{alias} {name}: {result}");
            result
        };
        let answer = |result: &Value| result["messages"][1].clone();

        let result = case("text");
        assert_eq!(result["status"], "ready", "{alias}: {result}");
        assert_eq!(result["requests"][0]["path"], "/v1/ui/chat");
        assert_eq!(result["requests"][0]["status"], 200);
        assert_eq!(answer(result)["role"], "assistant");
        assert_eq!(text(&answer(result), "text"), "hello from a page", "{alias}: {result}");

        let result = case("reasoning");
        let input = String::from_utf8(common::read("thinking-then-text", "input.jsonl")).expect("utf-8");
        let thinking: String = input
            .lines()
            .filter_map(|line| serde_json::from_str::<Value>(line).ok())
            .filter(|m| m["type"] == "thinking")
            .filter_map(|m| m["props"]["content"].as_str().map(str::to_owned))
            .collect();
        assert_eq!(text(&answer(result), "reasoning"), thinking, "{alias}: {result}");
        assert!(!text(&answer(result), "text").is_empty(), "{alias}: {result}");

        let result = case("tool");
        let message = answer(result);
        let tool = parts(&message, "dynamic-tool");
        assert_eq!(tool.len(), 1, "{alias}: {result}");
        assert_eq!(tool[0]["state"], "output-available");
        assert_eq!(tool[0]["output"], json!({"temp_c": 18, "sky": "sunny"}));
        assert_eq!(text(&answer(result), "text"), "Let me check the weather.\nIt is 18 °C and sunny in Paris.");

        let result = case("error");
        assert_eq!(result["status"], "error", "{alias}: {result}");
        assert_eq!(result["error"], "Upstream API timed out after 30s", "{alias}: {result}");

        let result = case("cancel");
        assert_eq!(result["cancelStatus"], 202, "{alias}: {result}");
        assert_ne!(result["status"], "error", "{alias}: a cancel is no error: {result}");
        cancelled_streams.push(result["requests"][0]["stream"].as_str().expect("the stream id header").to_owned());

        let result = case("resume-idle");
        let requests = result["requests"].as_array().expect("requests");
        assert_eq!(requests.len(), 1, "{alias}: {result}");
        assert_eq!(requests[0]["method"], "GET");
        assert_eq!(requests[0]["path"], format!("/v1/ui/chat/{alias}-idle/stream"));
        assert_eq!(requests[0]["status"], 204);
        assert_eq!(result["messages"], json!([]), "{alias}: nothing to resume, nothing shown");

        let result = case("turns");
        let contents = |thread: &Value| -> Vec<(String, String)> {
            let messages = thread["transcript"]["messages"].as_array().cloned().unwrap_or_default();
            let field = |m: &Value, name: &str| m[name].as_str().unwrap_or("").to_owned();
            messages.iter().map(|m| (field(m, "role"), field(m, "content"))).collect()
        };
        let want: Vec<(String, String)> =
            [("user", "first"), ("assistant", "first"), ("user", "second"), ("assistant", "second")]
                .iter()
                .map(|(role, text)| ((*role).to_owned(), (*text).to_owned()))
                .collect();
        assert_eq!(contents(&result["before"]), want, "{alias}: each message once: {result}");
        assert_eq!(contents(&result["after"]), want, "{alias}: the regenerated answer in place of the old: {result}");
        let decisions = result["after"]["decisions"].as_array().cloned().unwrap_or_default();
        assert_eq!(decisions.iter().filter(|d| *d == "rewind").count(), 1, "{alias}: {result}");
        assert_eq!(result["messages"].as_array().map(Vec::len), Some(4), "{alias}: {result}");
        assert_eq!(result["status"], "ready", "{alias}: {result}");

        let result = case("page-tool");
        assert_eq!(result["calls"].as_array().map(Vec::len), Some(1), "{alias}: {result}");
        assert_eq!(result["calls"][0]["name"], "get_weather", "{alias}: {result}");
        assert_eq!(result["calls"][0]["id"], "call_weather_1", "{alias}: {result}");
        let statuses: Vec<&Value> =
            result["requests"].as_array().expect("requests").iter().map(|r| &r["status"]).collect();
        assert_eq!(statuses, [&json!(200), &json!(200)], "{alias}: the turn and the result sent back: {result}");
        let transcript = &result["thread"]["transcript"];
        let roles: Vec<&str> =
            transcript["messages"].as_array().expect("messages").iter().filter_map(|m| m["role"].as_str()).collect();
        assert_eq!(roles, ["user", "assistant", "tool", "assistant"], "{alias}: {result}");
        assert_eq!(transcript["messages"][2]["tool_call_id"], "call_weather_1");
        assert_eq!(transcript["messages"][2]["content"], r#"{"temp_c":18}"#, "{alias}: the page's output: {result}");
        assert_eq!(transcript["pending_tool_calls"], json!([]));
        assert_eq!(result["status"], "ready", "{alias}: {result}");

        let result = case("resume-running");
        let resumed = result["requests"].as_array().expect("requests").iter().find(|r| r["method"] == "GET").cloned();
        assert_eq!(resumed.as_ref().map(|r| r["status"].clone()), Some(json!(200)), "{alias}: {result}");
        let (first, second) = (result["first"]["messages"].clone(), result["messages"].clone());
        let first_answer = first.as_array().and_then(|m| m.last()).cloned().unwrap_or_default();
        let second_answer = second.as_array().and_then(|m| m.last()).cloned().unwrap_or_default();
        assert_eq!(second_answer["role"], "assistant", "{alias}: {result}");
        assert_eq!(second_answer["id"], first_answer["id"], "{alias}: the same message, replayed from its start");
        assert_eq!(second_answer["parts"], first_answer["parts"], "{alias}: and the whole of it");
        assert!(!text(&second_answer, "text").is_empty(), "{alias}: {result}");
    }
    for id in cancelled_streams {
        let status = common::http::snapshot(&client, &server, &id).await["status"].clone();
        assert_eq!(status, "cancelled");
    }
    server.stop().await.expect("stops");
}
