//! The upstream agent against a fake OpenAI-compatible server (`tests/common/upstream.rs`) that plays
//! recorded answers byte for byte: the documented styles of OpenAI, DeepSeek, Ollama, vLLM, OpenRouter and
//! llama.cpp (`fixtures/upstream/<case>/`, real recordings from a local `llama-server` among them), a slow
//! upstream, a stalled one, and 401/429/500 answers. For each, the typed messages agentmux emits and what an
//! OpenAI client receives are pinned in `fixtures/upstream/<case>/agentmux.cui.sse` and
//! `agentmux.openai.sse` (the hub runs on a stepping clock and counting ids, so they are the same on every
//! run; on a mismatch the output is left under `target/golden-actual/upstream/`).
//!
//! Then, over HTTP: statuses before the first byte (named with the run's stream by every front door), the
//! key never leaking, the request sent upstream, a
//! cancel closing the upstream connection within a second, the tool loop with two registered tools (one
//! failing) and its round limit, invalid arguments, a client's tool handed over, and text-mode tool calling.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use agentmux::agent::{Agents, Tool, Tools, UpstreamAgent, UpstreamConfig};
use agentmux::http::Settings;
use agentmux::hub::HubConfig;
use agentmux::output::ToolError;
use agentmux::render::Format;
use common::http::{assert_envelope, get_json, read_events};
use common::recorded::client_tools;
use common::server::TestServer;
use common::upstream::{FakeUpstream, Reply};
use common::wait::eventually;
use serde_json::{Value, json};

const KEY: &str = "sk-test-secret-0123456789";

fn config(upstream: &FakeUpstream) -> UpstreamConfig {
    let mut config = UpstreamConfig::new(upstream.base.clone());
    config.key = Some(KEY.into());
    config.idle_timeout = Duration::from_millis(1500);
    config.first_byte_timeout = Duration::from_secs(5);
    config
}

const CASES: &[&str] = &[
    "openai-text",
    "openai-parallel-tool-calls",
    "deepseek-reasoning",
    "ollama-reasoning",
    "vllm-error-mid-stream",
    "openai-error-mid-stream",
    "openrouter-comments",
    "llama-server-text",
    "llama-server-tool-call",
    "llama-server-real-text",
    "llama-server-real-tool-call",
    "llama-server-real-reasoning",
    "slow-upstream",
    "stalled-upstream",
    "empty-first-delta",
    "error-401",
    "error-429",
    "error-500",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_recorded_upstream_as_typed_messages_and_as_an_openai_client_sees_it() {
    let mut failures = Vec::new();
    for case in CASES {
        let (upstream, stream) = common::recorded::run(case, config, "fake-model", client_tools()).await;
        let formats = [("agentmux.cui.sse", Format::Cui), ("agentmux.openai.sse", Format::OPENAI)];
        common::recorded::compare(case, &stream, &formats, &mut failures).await;
        let sent = &upstream.requests()[0];
        assert_eq!(sent["stream"], true, "{case}");
        assert_eq!(sent["stream_options"], json!({"include_usage": true}), "{case}");
        assert_eq!(upstream.authorizations()[0].as_deref(), Some(format!("Bearer {KEY}").as_str()), "{case}");
    }
    assert!(failures.is_empty(), "differ from their golden files (see target/golden-actual/upstream/): {failures:?}");
}

async fn server_with(agent: UpstreamAgent) -> TestServer {
    let mut agents = Agents::builtin();
    agents.set_upstream(agent);
    TestServer::with(HubConfig::default(), Settings::default(), agents).await
}

async fn chat(server: &TestServer, body: Value) -> reqwest::Response {
    reqwest::Client::new()
        .post(server.url("/v1/chat/completions"))
        .json(&body)
        .send()
        .await
        .expect("POST /v1/chat/completions")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn before_the_first_byte_the_client_gets_the_right_status_and_never_the_key() {
    for (case, status, code) in [
        ("error-429", 429, "rate_limit_exceeded"),
        ("error-401", 502, "upstream_auth"),
        ("error-500", 502, "upstream_error"),
    ] {
        let upstream = FakeUpstream::start(vec![Reply::fixture(case)]).await;
        let server = server_with(UpstreamAgent::new(config(&upstream), Tools::new()).expect("agent")).await;
        for stream in [false, true] {
            let response = chat(
                &server,
                json!({"model": "gpt-x", "stream": stream, "messages": [{"role": "user", "content": "hi"}]}),
            )
            .await;
            assert_eq!(response.status().as_u16(), status, "{case} stream={stream}");
            let retry_after = response.headers().get("retry-after").map(|v| v.to_str().unwrap_or("").to_owned());
            let body: Value = response.json().await.expect("an envelope");
            assert_envelope(&body, None, code);
            assert!(!body.to_string().contains(KEY), "{case}: the key leaked: {body}");
            if case == "error-429" {
                assert_eq!(retry_after.as_deref(), Some("2"), "the upstream's retry-after is kept");
            }
        }
    }
    // Nothing listening: 502 upstream_connect.
    let mut nowhere = UpstreamConfig::new("http://127.0.0.1:9/v1");
    nowhere.key = Some(KEY.into());
    let server = server_with(UpstreamAgent::new(nowhere, Tools::new()).expect("agent")).await;
    let response = chat(&server, json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]})).await;
    assert_eq!(response.status(), 502);
    let body: Value = response.json().await.expect("JSON");
    assert_envelope(&body, None, "upstream_connect");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_request_upstream_is_the_validated_conversation_with_the_clients_options() {
    let upstream = FakeUpstream::start(vec![Reply::text(&["Hello", " there"])]).await;
    let agent = UpstreamAgent::new(config(&upstream), Tools::new()).expect("agent");
    agent.refresh_models().await.expect("the model list");
    let server = server_with(agent).await;
    let (status, models) = get_json(&reqwest::Client::new(), &server.url("/v1/models")).await;
    assert_eq!(status, 200);
    assert!(models["data"].as_array().unwrap().iter().any(|m| m["id"] == "fake-model"), "{models}");
    let response = chat(
        &server,
        json!({"model": "fake-model", "temperature": 0.3, "max_tokens": 50, "seed": 7,
            "metadata": {"thread_id": "t-up"}, "stream": false,
            "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]}),
    )
    .await;
    assert_eq!(response.status(), 200);
    let completion: Value = response.json().await.expect("JSON");
    assert_eq!(completion["choices"][0]["message"]["content"], "Hello there");
    assert_eq!(completion["usage"]["prompt_tokens"], 10);
    let sent = &upstream.requests()[0];
    assert_eq!(sent["model"], "fake-model");
    assert_eq!(
        (sent["temperature"].clone(), sent["max_tokens"].clone(), sent["seed"].clone()),
        (json!(0.3), json!(50), json!(7))
    );
    assert!(sent.get("metadata").is_none(), "agentmux's own field stays home: {sent}");
    assert_eq!(
        sent["messages"],
        json!([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}])
    );
    // A second turn on the thread sends the history.
    let response = chat(
        &server,
        json!({"model": "fake-model", "metadata": {"thread_id": "t-up"}, "messages": [{"role": "user", "content": "again"}]}),
    )
    .await;
    assert_eq!(response.status(), 200);
    let sent = &upstream.requests()[1];
    let roles: Vec<&str> = sent["messages"].as_array().unwrap().iter().map(|m| m["role"].as_str().unwrap()).collect();
    assert_eq!(roles, ["system", "user", "assistant", "user"]);
    assert_eq!(sent["messages"][2]["content"], "Hello there");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_closes_the_upstream_connection_within_a_second() {
    for how in ["disconnect", "cancel"] {
        let upstream = FakeUpstream::start(vec![Reply::fixture("stalled-upstream")]).await;
        let mut patient = config(&upstream);
        patient.idle_timeout = Duration::from_secs(30);
        let server = server_with(UpstreamAgent::new(patient, Tools::new()).expect("agent")).await;
        let mut response = reqwest::Client::new()
            .post(server.url("/v1/chat/completions"))
            .header("x-agentmux-on-disconnect", "cancel")
            .json(&json!({"model": "m", "stream": true, "messages": [{"role": "user", "content": "hi"}]}))
            .send()
            .await
            .expect("POST");
        assert_eq!(response.status(), 200);
        let id = response.headers()["x-agentmux-stream-id"].to_str().unwrap().to_owned();
        let first = response.chunk().await.expect("a chunk").expect("some bytes");
        assert!(!first.is_empty());
        assert!(upstream.closed(0).is_none(), "the upstream is still streaming");
        let asked = Instant::now();
        if how == "disconnect" {
            drop(response);
        } else {
            let cancelled = reqwest::Client::new()
                .post(server.url(&format!("/v1/streams/{id}/cancel")))
                .send()
                .await
                .expect("cancel");
            assert_eq!(cancelled.status(), 202);
        }
        let what = format!("{how}: the upstream connection to close");
        let closed = eventually(&what, Duration::from_secs(3), async || upstream.closed(0)).await;
        assert!(
            closed.duration_since(asked) < Duration::from_secs(1),
            "{how}: closed after {:?}",
            closed.duration_since(asked)
        );
    }
}

/// `add` and `fail`, and how many times each ran.
fn tools(runs: &Arc<AtomicUsize>) -> Tools {
    let mut tools = Tools::new();
    let schema = json!({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        "required": ["a", "b"], "additionalProperties": false});
    let counter = Arc::clone(runs);
    tools.register(
        Tool::new("add", "Adds two integers.", schema, move |args| {
            counter.fetch_add(1, Ordering::SeqCst);
            async move { Ok(json!(args["a"].as_i64().unwrap_or(0) + args["b"].as_i64().unwrap_or(0))) }
        })
        .expect("add"),
    );
    let counter = Arc::clone(runs);
    tools.register(
        Tool::new("fail", "Always fails.", json!({"type": "object"}), move |_| {
            counter.fetch_add(1, Ordering::SeqCst);
            async move { Err(ToolError { message: "the disk is on fire".into(), code: Some("io".into()) }) }
        })
        .expect("fail"),
    );
    tools
}

async fn cui_events(response: reqwest::Response) -> Vec<Value> {
    read_events(response).await.iter().filter(|e| e.data != "[DONE]").map(|e| e.json()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tool_loop_runs_both_tools_streams_both_results_and_asks_again() {
    let runs = Arc::new(AtomicUsize::new(0));
    let calls = Reply::tool_calls(&[("call_a", "add", r#"{"a": 2, "b": 3}"#), ("call_f", "fail", "{}")]);
    let answer = Reply::text(&["The sum is 5", "; the other tool failed."]);
    let upstream = FakeUpstream::start(vec![calls.clone(), answer.clone(), calls, answer]).await;
    let server = server_with(UpstreamAgent::new(config(&upstream), tools(&runs)).expect("agent")).await;
    let body = json!({"model": "m", "stream": true, "messages": [{"role": "user", "content": "add 2 and 3"}]});
    let response = reqwest::Client::new()
        .post(server.url("/v1/chat/completions?accept=cui"))
        .json(&body)
        .send()
        .await
        .expect("POST");
    let events = cui_events(response).await;
    let of = |kind: &str| events.iter().filter(|e| e["type"] == kind).cloned().collect::<Vec<_>>();
    let results = of("tool_result");
    assert_eq!(results.len(), 2, "{events:?}");
    assert_eq!(results[0]["props"], json!({"call_id": "call_a", "name": "add", "result": 5}));
    assert_eq!(results[1]["props"]["error"], json!({"message": "the disk is on fire", "code": "io"}));
    let calls: Vec<Value> = of("tool_call").into_iter().filter(|c| c["props"].get("name").is_some()).collect();
    assert_eq!(calls.len(), 2, "{calls:?}");
    assert!(calls.iter().all(|c| c["props"]["server_side"] == true), "both run on the server: {calls:?}");
    let text: String = of("text").iter().filter_map(|t| t["props"]["content"].as_str()).collect();
    assert_eq!(text, "The sum is 5; the other tool failed.");
    let blocks: Vec<&Value> = events.iter().filter(|e| e["props"]["event"] == "block_start").collect();
    assert_eq!(blocks.len(), 2, "each round is a block");
    assert_eq!(runs.load(Ordering::SeqCst), 2);
    // The model was asked again with both results.
    let second = &upstream.requests()[1]["messages"];
    let tail: Vec<Value> = second.as_array().unwrap()[1..].to_vec();
    assert_eq!(tail[0]["tool_calls"][0]["function"]["name"], "add");
    assert_eq!(tail[1], json!({"role": "tool", "content": "5", "tool_call_id": "call_a", "name": "add"}));
    assert_eq!(tail[2]["content"], "Error: the disk is on fire");

    // An OpenAI client sees no tool_calls: the agent ran them; they are reasoning lines.
    let response =
        chat(&server, json!({"model": "m", "stream": false, "messages": [{"role": "user", "content": "again"}]})).await;
    let completion: Value = response.json().await.expect("JSON");
    let message = &completion["choices"][0]["message"];
    assert!(message.get("tool_calls").is_none(), "{completion}");
    assert_eq!(completion["choices"][0]["finish_reason"], "stop");
    let reasoning = message["reasoning_content"].as_str().unwrap_or("");
    assert!(
        reasoning.contains("add returned 5") && reasoning.contains("fail failed: the disk is on fire"),
        "{reasoning}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rounds_stop_at_the_limit_and_bad_calls_run_nothing() {
    let runs = Arc::new(AtomicUsize::new(0));
    let upstream = FakeUpstream::start(vec![Reply::tool_calls(&[("call_a", "add", r#"{"a": 1, "b": 1}"#)])]).await;
    let mut limited = config(&upstream);
    limited.max_rounds = 3;
    let server = server_with(UpstreamAgent::new(limited, tools(&runs)).expect("agent")).await;
    let response =
        chat(&server, json!({"model": "m", "stream": true, "messages": [{"role": "user", "content": "loop"}]})).await;
    let events = read_events(response).await;
    let last_error = events.iter().rev().find(|e| e.data.contains("\"error\"")).map(|e| e.json());
    assert_eq!(last_error.as_ref().map(|e| e["error"]["code"].clone()), Some(json!("max_tool_rounds")), "{events:?}");
    assert_eq!(upstream.requests().len(), 3);
    assert_eq!(runs.load(Ordering::SeqCst), 3);

    // Unknown tool, and arguments the schema refuses: an error message, and nothing runs.
    for (name, arguments, code, needle) in [
        ("rm", "{}", "tool_not_found", "\"rm\""),
        ("add", r#"{"a": "two", "b": 1}"#, "invalid_args", "/a"),
        ("add", r#"{"a": 1"#, "invalid_args", "not JSON"),
    ] {
        let runs = Arc::new(AtomicUsize::new(0));
        let upstream = FakeUpstream::start(vec![Reply::tool_calls(&[("call_x", name, arguments)])]).await;
        let server = server_with(UpstreamAgent::new(config(&upstream), tools(&runs)).expect("agent")).await;
        let response = reqwest::Client::new()
            .post(server.url("/v1/chat/completions?accept=cui"))
            .json(&json!({"model": "m", "stream": true, "messages": [{"role": "user", "content": "x"}]}))
            .send()
            .await
            .expect("POST");
        let events = cui_events(response).await;
        let error = events.iter().find(|e| e["type"] == "error").unwrap_or_else(|| panic!("{name}: {events:?}"));
        assert_eq!(error["props"]["code"], code, "{name}");
        assert!(error["props"]["message"].as_str().unwrap().contains(needle), "{error}");
        assert_eq!(runs.load(Ordering::SeqCst), 0, "{name}: no tool ran");
        let end = events.iter().find(|e| e["props"]["event"] == "stream_end").expect("stream_end");
        assert_eq!(end["props"]["data"]["status"], "error", "{end}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_to_a_clients_tool_ends_the_run_as_openai_does() {
    let upstream =
        FakeUpstream::start(vec![Reply::tool_calls(&[("call_w", "get_weather", r#"{"city": "Paris"}"#)])]).await;
    let server = server_with(UpstreamAgent::new(config(&upstream), tools(&Arc::default())).expect("agent")).await;
    let response = chat(
        &server,
        json!({"model": "m", "tools": client_tools(), "messages": [{"role": "user", "content": "weather?"}]}),
    )
    .await;
    assert_eq!(response.status(), 200);
    let completion: Value = response.json().await.expect("JSON");
    assert_eq!(completion["choices"][0]["finish_reason"], "tool_calls");
    let call = &completion["choices"][0]["message"]["tool_calls"][0];
    assert_eq!((call["id"].as_str(), call["function"]["name"].as_str()), (Some("call_w"), Some("get_weather")));
    assert_eq!(call["function"]["arguments"], r#"{"city": "Paris"}"#);
    // The request carried both the client's tools and the registered ones.
    let names: Vec<String> = upstream.requests()[0]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["function"]["name"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(names, ["get_weather", "get_time", "add", "fail"]);
    // A client tool may not take a registered tool's name.
    let clash = json!([{"type": "function", "function": {"name": "add"}}]);
    let response =
        chat(&server, json!({"model": "m", "tools": clash, "messages": [{"role": "user", "content": "x"}]})).await;
    assert_eq!(response.status(), 400);
    let body: Value = response.json().await.expect("JSON");
    assert_envelope(&body, Some("tools[0].function.name"), "invalid_value");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn text_mode_models_call_tools_through_their_text() {
    let runs = Arc::new(AtomicUsize::new(0));
    let action = r#"{"type": "action", "tool": "add", "args": {"a": 20, "b": 22}}"#;
    let (head, tail) = action.split_at(17);
    let upstream = FakeUpstream::start(vec![
        Reply::text(&["```json\n", head, tail, "\n```"]),
        Reply::text(&["It is ", "42."]),
        Reply::text(&["{\"type\": \"action\", \"tool\": \"add\", \"args\": [1, 2]}"]),
    ])
    .await;
    let mut text_mode = config(&upstream);
    text_mode.text_mode = vec!["tiny".into()];
    let server = server_with(UpstreamAgent::new(text_mode, tools(&runs)).expect("agent")).await;
    let response = reqwest::Client::new()
        .post(server.url("/v1/chat/completions?accept=cui"))
        .json(&json!({"model": "tiny", "stream": true, "messages": [{"role": "user", "content": "20 + 22?"}]}))
        .send()
        .await
        .expect("POST");
    let events = cui_events(response).await;
    let call = events.iter().find(|e| e["type"] == "tool_call").expect("a tool call");
    assert_eq!(call["props"]["name"], "add");
    assert_eq!(call["props"]["server_side"], true);
    assert_eq!(call["props"]["arguments"], r#"{"a":20,"b":22}"#);
    let result = events.iter().find(|e| e["type"] == "tool_result").expect("its result");
    assert_eq!(result["props"]["result"], 42);
    let text: String =
        events.iter().filter(|e| e["type"] == "text").filter_map(|t| t["props"]["content"].as_str()).collect();
    assert_eq!(text, "It is 42.", "the action itself never reached the client as text");
    let first = &upstream.requests()[0];
    assert!(first.get("tools").is_none(), "no native tools in text mode: {first}");
    let system = first["messages"][0]["content"].as_str().unwrap();
    assert!(system.contains("\"type\": \"action\"") && system.contains("### add"), "{system}");
    let second = &upstream.requests()[1]["messages"];
    let said: Vec<String> =
        second.as_array().unwrap().iter().map(|m| m["content"].as_str().unwrap_or("").to_owned()).collect();
    assert!(said.iter().any(|s| s.contains(r#""tool":"add""#)), "the call as action JSON: {said:?}");
    assert!(said.iter().any(|s| s == "Result of add: 42"), "the result as user text: {said:?}");

    // A reply that tries to be an action but is not one is an error, never silent.
    let response = reqwest::Client::new()
        .post(server.url("/v1/chat/completions?accept=cui"))
        .json(&json!({"model": "tiny", "stream": true, "messages": [{"role": "user", "content": "again"}]}))
        .send()
        .await
        .expect("POST");
    let events = cui_events(response).await;
    let error = events.iter().find(|e| e["type"] == "error").unwrap_or_else(|| panic!("{events:?}"));
    assert_eq!(error["props"]["code"], "parse_error");
}

/// A run the upstream refused before its first byte is answered with the upstream's status by every front
/// door, and that answer names the run (its stream and a read token) as a successful one would: the stream
/// exists, and holds the error. On `/v1/messages` the body is in Anthropic's shape.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_front_door_names_the_run_on_an_error_after_its_stream_exists() {
    let user = json!([{"role": "user", "content": "hi"}]);
    let doors = [
        ("/v1/chat/completions", json!({"model": "m", "stream": true, "messages": user})),
        ("/v1/chat/completions", json!({"model": "m", "messages": user})),
        ("/v1/responses", json!({"model": "m", "input": "hi"})),
        ("/v1/messages", json!({"model": "m", "max_tokens": 64, "messages": user})),
        ("/v1/messages", json!({"model": "m", "max_tokens": 64, "stream": true, "messages": user})),
        (
            "/v1/ui/chat",
            json!({"id": "page-1", "model": "m", "trigger": "submit-message", "messages": [
                {"id": "m1", "role": "user", "parts": [{"type": "text", "text": "hi"}]}]}),
        ),
        (
            "/v1/ag-ui",
            json!({"threadId": "ag-1", "runId": "r", "messages": [{"id": "u1", "role": "user", "content": "hi"}],
                   "tools": [], "context": [], "state": {}, "forwardedProps": {"model": "m"}}),
        ),
    ];
    let upstream = FakeUpstream::start(doors.iter().map(|_| Reply::fixture("error-429")).collect()).await;
    let server = server_with(UpstreamAgent::new(config(&upstream), Tools::new()).expect("agent")).await;
    let client = reqwest::Client::new();
    for (path, body) in doors {
        let response = client.post(server.url(path)).json(&body).send().await.expect("POST");
        assert_eq!(response.status(), 429, "{path} {body}");
        let header = |name: &str| response.headers().get(name).and_then(|v| v.to_str().ok()).map(str::to_owned);
        let (stream, token) = (header("x-agentmux-stream-id"), header("x-agentmux-read-token"));
        let answer: Value = response.json().await.expect("a JSON error");
        let stream = stream.unwrap_or_else(|| panic!("{path}: no x-agentmux-stream-id: {answer}"));
        assert!(token.is_some_and(|t| t.starts_with("amr.")), "{path}: no read token: {answer}");
        let (status, _) = get_json(&client, &server.url(&format!("/v1/streams/{stream}"))).await;
        assert_eq!(status, 200, "{path}: the named stream exists");
        if path == "/v1/messages" {
            assert_eq!(answer["type"], "error", "{answer}");
            assert_eq!(answer["error"]["type"], "rate_limit_error", "{answer}");
        } else {
            assert_envelope(&answer, None, "rate_limit_exceeded");
        }
    }
}
