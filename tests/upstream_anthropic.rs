//! The Anthropic upstream kind against the fake upstream (`tests/common/upstream.rs`) replaying the documented
//! Messages streams byte for byte (`fixtures/upstream/anthropic-*`): text with a ping, thinking with its
//! signature, redacted thinking, tool use with `input_json_delta`, parallel tool use, an `overloaded_error`
//! in the stream, and 429 / 529 answers.
//!
//! For each case the typed messages agentmux emits and what an OpenAI chat, an Anthropic and a Responses
//! client receive are pinned in `fixtures/upstream/<case>/agentmux.{cui,openai,anthropic,responses}.sse`
//! (stepping clock, counting ids; on a mismatch the output is left under `target/golden-actual/upstream/`).
//! Then, over HTTP: every case through the four front doors, the request's headers and body shape, the tool
//! loop with a registered tool, and a thinking signature sent back in a thread's second turn.

mod common;

use std::path::Path;
use std::time::Duration;

use agentmux::agent::{Agents, Tool, Tools, UpstreamAgent, UpstreamConfig, UpstreamKind};
use agentmux::http::Settings;
use agentmux::hub::HubConfig;
use agentmux::render::Format;
use common::http::{get_json, read_body};
use common::recorded::client_tools;
use common::server::TestServer;
use common::upstream::{FakeUpstream, Reply, anthropic};
use common::wait::eventually;
use serde_json::{Value, json};

const KEY: &str = "sk-ant-test-0123456789";

fn config(upstream: &FakeUpstream) -> UpstreamConfig {
    let mut config = UpstreamConfig::new(upstream.base.clone());
    config.kind = UpstreamKind::Anthropic;
    config.key = Some(KEY.into());
    config.models = Some(vec!["claude-fake".into()]);
    config.idle_timeout = Duration::from_millis(1500);
    config.first_byte_timeout = Duration::from_secs(5);
    config
}

const CASES: &[&str] = &[
    "anthropic-text",
    "anthropic-thinking",
    "anthropic-redacted-thinking",
    "anthropic-tool-use",
    "anthropic-parallel-tool-use",
    "anthropic-error-mid-stream",
    "anthropic-error-429",
    "anthropic-error-529",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_recorded_anthropic_stream_in_every_format() {
    let mut failures = Vec::new();
    for case in CASES {
        let (upstream, stream) = common::recorded::run(case, config, "claude-fake", client_tools()).await;
        let formats = [
            ("agentmux.cui.sse", Format::Cui),
            ("agentmux.openai.sse", Format::OPENAI),
            ("agentmux.anthropic.sse", Format::Anthropic),
            ("agentmux.responses.sse", Format::Responses),
        ];
        common::recorded::compare(case, &stream, &formats, &mut failures).await;
        let sent = &upstream.recorded()[0];
        assert_eq!(sent.path, "/v1/messages", "{case}");
        assert_eq!(sent.header("x-api-key"), Some(KEY), "{case}");
        assert_eq!(sent.header("anthropic-version"), Some("2023-06-01"), "{case}");
        assert_eq!(sent.header("authorization"), None, "{case}: the key goes only as x-api-key");
        assert_eq!(sent.body["stream"], true, "{case}");
    }
    assert!(failures.is_empty(), "differ from their golden files (see target/golden-actual/upstream/): {failures:?}");
}

async fn server_with(agent: UpstreamAgent) -> TestServer {
    let mut agents = Agents::builtin();
    agents.set_upstream(agent);
    TestServer::with(HubConfig::default(), Settings::default(), agents).await
}

/// Posts `body` to `path`; the status, the `retry-after` header and the whole body as text.
async fn post(server: &TestServer, path: &str, headers: &[(&str, &str)], body: Value) -> (u16, Option<String>, String) {
    let mut request = reqwest::Client::new().post(server.url(path)).json(&body);
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let response = request.send().await.unwrap_or_else(|e| panic!("POST {path}: {e}"));
    let status = response.status().as_u16();
    let retry = response.headers().get("retry-after").and_then(|v| v.to_str().ok()).map(str::to_owned);
    let body = String::from_utf8_lossy(&read_body(response).await).into_owned();
    (status, retry, body)
}

/// The request each front door takes for one user message, streamed, with the two tools declared.
fn requests() -> Vec<(&'static str, &'static str, Value)> {
    let question = "What is the weather in Paris?";
    let chat = json!({"model": "claude-fake", "stream": true, "tools": client_tools(),
        "messages": [{"role": "user", "content": question}]});
    let anthropic_tool = |name: &str| json!({"name": name, "input_schema": {"type": "object"}});
    let messages = json!({"model": "claude-fake", "stream": true, "max_tokens": 1024,
        "tools": [anthropic_tool("get_weather"), anthropic_tool("get_time")],
        "messages": [{"role": "user", "content": question}]});
    let responses_tool = |name: &str| json!({"type": "function", "name": name, "parameters": {"type": "object"}});
    let responses = json!({"model": "claude-fake", "stream": true, "input": question,
        "tools": [responses_tool("get_weather"), responses_tool("get_time")]});
    vec![
        ("cui", "/v1/chat/completions?accept=cui", chat.clone()),
        ("openai", "/v1/chat/completions", chat),
        ("anthropic", "/v1/messages", messages),
        ("responses", "/v1/responses", responses),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_case_through_every_front_door() {
    // What each case must show a client, whatever its protocol: these texts (the second field of a tool
    // call's arguments is its JSON, escaped in some formats, so a call is checked by its name).
    let expected: &[(&str, &[&str])] = &[
        ("anthropic-text", &["It is sunny", " in Paris, 18 °C."]),
        ("anthropic-thinking", &["The user asks about Paris.", "Bonjour! ", "Ask me about the weather."]),
        ("anthropic-redacted-thinking", &["I cannot share that reasoning, but the answer is 42."]),
        ("anthropic-tool-use", &["Let me check the weather in Paris.", "get_weather", "Par"]),
        ("anthropic-parallel-tool-use", &["get_weather", "get_time", "Europe/Paris"]),
        ("anthropic-error-mid-stream", &["It is", "the upstream is overloaded: Overloaded"]),
    ];
    for (case, texts) in expected {
        let upstream = FakeUpstream::start(vec![Reply::fixture(case)]).await;
        let server = server_with(UpstreamAgent::new(config(&upstream), Tools::new()).expect("agent")).await;
        for (door, path, body) in requests() {
            let (status, _, text) = post(&server, path, &[], body).await;
            assert_eq!(status, 200, "{case} through {door}: {text}");
            for want in *texts {
                assert!(text.contains(want), "{case} through {door} lacks {want:?}: {text}");
            }
        }
        assert_eq!(upstream.recorded().len(), 4, "{case}: one upstream request per front door");
    }
    // Refusals before the first byte: a 429 keeps its retry-after, a 529 (overloaded) is a 429 too, and
    // each front door says so in its own error shape, naming Anthropic's error type.
    for (case, retry, code) in
        [("anthropic-error-429", Some("7"), "rate_limit_error"), ("anthropic-error-529", None, "overloaded_error")]
    {
        let upstream = FakeUpstream::start(vec![Reply::fixture(case)]).await;
        let server = server_with(UpstreamAgent::new(config(&upstream), Tools::new()).expect("agent")).await;
        for (door, path, body) in requests() {
            let (status, retry_after, text) = post(&server, path, &[], body).await;
            assert_eq!(status, 429, "{case} through {door}: {text}");
            assert_eq!(retry_after.as_deref(), retry, "{case} through {door}");
            assert!(text.contains(code), "{case} through {door}: {text}");
            assert!(!text.contains(KEY), "{case} through {door}: the key leaked: {text}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_request_has_anthropics_shape() {
    let upstream = FakeUpstream::start(vec![Reply::fixture("anthropic-text")]).await;
    // The model list is Anthropic's `GET /v1/models`, read as OpenAI's is (`data[].id`).
    let listing =
        UpstreamAgent::new(UpstreamConfig { models: None, ..config(&upstream) }, Tools::new()).expect("agent");
    assert_eq!(listing.refresh_models().await, Ok(1));
    assert_eq!(listing.models(), ["fake-model"]);
    let server = server_with(UpstreamAgent::new(config(&upstream), Tools::new()).expect("agent")).await;
    let body = json!({"model": "claude-fake", "stream": true, "temperature": 0.3, "stop": "END", "seed": 7,
        "max_completion_tokens": 900, "tools": client_tools(), "tool_choice": "required",
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Weather?"},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "toolu_1", "type": "function",
                "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}]},
            {"role": "tool", "tool_call_id": "toolu_1", "content": "18 °C"},
            {"role": "user", "content": "And tomorrow?"}]});
    let (status, _, text) = post(&server, "/v1/chat/completions", &[], body).await;
    assert_eq!(status, 200, "{text}");
    let sent = upstream.requests().remove(0);
    assert_eq!(sent["system"], "Be brief.");
    assert_eq!(sent["max_tokens"], 900);
    assert_eq!(sent["temperature"], 0.3);
    assert_eq!(sent["stop_sequences"], json!(["END"]));
    assert_eq!(sent["tool_choice"], json!({"type": "any"}));
    assert_eq!(sent["tools"][0], json!({"name": "get_weather", "description": "", "input_schema": {"type": "object"}}));
    assert!(sent.get("seed").is_none() && sent.get("stream_options").is_none(), "only Anthropic's fields: {sent}");
    assert_eq!(
        sent["messages"],
        json!([
            {"role": "user", "content": [{"type": "text", "text": "Weather?"}]},
            {"role": "assistant", "content": [
                {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "18 °C"},
                {"type": "text", "text": "And tomorrow?"}]},
        ])
    );
}

/// `add`, registered in Rust: the service runs it.
fn adder() -> Tools {
    let schema = json!({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        "required": ["a", "b"]});
    let mut tools = Tools::new();
    tools.register(
        Tool::new("add", "Adds two integers.", schema, |args| async move {
            Ok(json!(args["a"].as_i64().unwrap_or(0) + args["b"].as_i64().unwrap_or(0)))
        })
        .expect("add"),
    );
    tools
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tool_loop_runs_a_registered_tool_and_sends_the_result_back_as_a_tool_result() {
    let thinking = json!({"type": "thinking", "thinking": "I should add.", "signature": "sig-round-1"});
    let call = json!({"type": "tool_use", "id": "toolu_add", "name": "add", "input": {"a": 2, "b": 3}});
    let replies = vec![
        anthropic(&[thinking, call], "tool_use"),
        anthropic(&[json!({"type": "text", "text": "2 + 3 = 5"})], "end_turn"),
    ];
    let upstream = FakeUpstream::start(replies).await;
    let server = server_with(UpstreamAgent::new(config(&upstream), adder()).expect("agent")).await;
    let body =
        json!({"model": "claude-fake", "stream": false, "messages": [{"role": "user", "content": "add 2 and 3"}]});
    let (status, _, text) = post(&server, "/v1/chat/completions", &[], body).await;
    assert_eq!(status, 200, "{text}");
    let completion: Value = serde_json::from_str(&text).expect("JSON");
    assert_eq!(completion["choices"][0]["message"]["content"], "2 + 3 = 5", "{completion}");
    assert_eq!(completion["choices"][0]["finish_reason"], "stop");
    let sent = upstream.requests();
    assert_eq!(sent.len(), 2, "asked again with the result");
    assert_eq!(sent[0]["tools"][0]["name"], "add");
    assert_eq!(sent[0]["tools"][0]["input_schema"]["required"], json!(["a", "b"]));
    assert_eq!(
        sent[1]["messages"],
        json!([
            {"role": "user", "content": [{"type": "text", "text": "add 2 and 3"}]},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "I should add.", "signature": "sig-round-1"},
                {"type": "tool_use", "id": "toolu_add", "name": "add", "input": {"a": 2, "b": 3}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_add", "content": "5"}]},
        ]),
        "the thinking block goes back with its signature, the result as a tool_result in a user message"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thinking_signature_goes_back_in_the_threads_second_turn() {
    let upstream = FakeUpstream::start(vec![
        Reply::fixture("anthropic-thinking"),
        Reply::fixture("anthropic-redacted-thinking"),
        Reply::fixture("anthropic-text"),
    ])
    .await;
    let server = server_with(UpstreamAgent::new(config(&upstream), Tools::new()).expect("agent")).await;
    let thread = [("x-agentmux-thread-id", "thinker")];
    let turn =
        |text: &str| json!({"model": "claude-fake", "stream": false, "messages": [{"role": "user", "content": text}]});
    for (n, question) in ["Hello?", "Why?"].iter().enumerate() {
        let (status, _, text) = post(&server, "/v1/chat/completions", &thread, turn(question)).await;
        assert_eq!(status, 200, "{text}");
        let client = reqwest::Client::new();
        eventually("the turn is recorded", Duration::from_secs(5), async || {
            let (_, transcript) = get_json(&client, &server.url("/v1/threads/thinker")).await;
            transcript["messages"].as_array().is_some_and(|m| m.len() == 2 * (n + 1))
        })
        .await;
    }
    let (status, _, text) = post(&server, "/v1/chat/completions", &thread, turn("Thanks")).await;
    assert_eq!(status, 200, "{text}");
    let third = &upstream.requests()[2]["messages"];
    let signature = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/upstream/anthropic-thinking/response.sse"),
    )
    .expect("fixture")
    .split("\"signature\":\"")
    .nth(2)
    .and_then(|rest| rest.split('"').next())
    .map(str::to_owned)
    .expect("the fixture's signature_delta");
    assert_eq!(
        third,
        &json!([
            {"role": "user", "content": [{"type": "text", "text": "Hello?"}]},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "The user asks about Paris. No tool is needed for a greeting.",
                    "signature": signature},
                {"type": "text", "text": "Bonjour! Ask me about the weather."}]},
            {"role": "user", "content": [{"type": "text", "text": "Why?"}]},
            {"role": "assistant", "content": [
                {"type": "redacted_thinking",
                    "data": "EmwKAhgBEgy3va3pzix/LafPsn4aDFIT2Xlxh0L5L8rLVyIwxtE3rAFBa8cr3qpPkNRj2YfWXGmKDxH4mPnZ5sQ7vB0URtRC6"},
                {"type": "text", "text": "I cannot share that reasoning, but the answer is 42."}]},
            {"role": "user", "content": [{"type": "text", "text": "Thanks"}]},
        ])
    );
}
