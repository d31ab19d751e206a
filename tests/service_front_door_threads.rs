//! Threads behind every front door (`docs/decisions.md`, "Tool results and threads"): an AG-UI `threadId` and a `useChat` chat `id` name
//! server-side threads, created on first use. Those clients send their whole history with every run, so a
//! thread takes only what follows the client's last assistant message, starts from the client's history when
//! it has none, and rewinds (an audit entry, the later messages kept in the log) when the client went back.
//! The Anthropic and Responses endpoints take `x-agentmux-thread-id` as the chat endpoint does: their
//! messages are then what is new. With keys a thread is the key's: another key's turn gets 404.
//! (`tests/client_ai_sdk.rs` drives the same with the real `ai` package: several turns, a regenerate, a tool
//! the page runs.)

mod common;

use std::time::Duration;

use agentmux::agent::Agents;
use agentmux::http::{KeySpec, Settings, budgets};
use agentmux::hub::HubConfig;
use common::http::{assert_envelope, get_json, read_body};
use common::server::TestServer;
use serde_json::{Value, json};

/// Posts `body` to `path` (with `headers`) and reads the whole answer: status, `x-agentmux-thread-id`, body.
async fn post(server: &TestServer, path: &str, headers: &[(&str, &str)], body: Value) -> (u16, Option<String>, String) {
    let mut request = reqwest::Client::new().post(server.url(path)).json(&body);
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let response = request.send().await.expect("a response");
    let status = response.status().as_u16();
    let thread = response.headers().get("x-agentmux-thread-id").and_then(|v| v.to_str().ok()).map(str::to_owned);
    let body = String::from_utf8(read_body(response).await).expect("utf-8");
    (status, thread, body)
}

async fn transcript(server: &TestServer, thread: &str) -> Value {
    let (status, body) = get_json(&reqwest::Client::new(), &server.url(&format!("/v1/threads/{thread}"))).await;
    assert_eq!(status, 200, "{body}");
    body
}

/// The thread's messages as (role, text) pairs; a call as `call:<name>`.
async fn said(server: &TestServer, thread: &str) -> Vec<(String, String)> {
    let transcript = transcript(server, thread).await;
    let messages = transcript["messages"].as_array().cloned().unwrap_or_default();
    messages
        .iter()
        .map(|m| {
            let role = m["role"].as_str().unwrap_or("").to_owned();
            let text = match (&m["content"], m["tool_calls"][0]["function"]["name"].as_str()) {
                (_, Some(name)) => format!("call:{name}"),
                (Value::String(text), None) => text.clone(),
                (other, None) => other.to_string(),
            };
            (role, text)
        })
        .collect()
}

fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
    list.iter().map(|(role, text)| ((*role).to_owned(), (*text).to_owned())).collect()
}

async fn decisions(server: &TestServer, thread: &str) -> Vec<String> {
    let path = format!("/v1/threads/{thread}/audit");
    let (status, body) = get_json(&reqwest::Client::new(), &server.url(&path)).await;
    assert_eq!(status, 200, "{body}");
    let entries = body["entries"].as_array().cloned().unwrap_or_default();
    entries.iter().map(|e| e["decision"].as_str().unwrap_or("").to_owned()).collect()
}

/// An AG-UI run's input on `thread` with `messages`, answered by `echo`.
fn ag_ui(thread: &str, messages: Value) -> Value {
    json!({"threadId": thread, "runId": "r", "messages": messages, "tools": [], "context": [], "state": {},
           "forwardedProps": {"model": "echo"}})
}

fn ag_user(id: &str, text: &str) -> Value {
    json!({"id": id, "role": "user", "content": text})
}

fn ag_assistant(id: &str, text: &str) -> Value {
    json!({"id": id, "role": "assistant", "content": text})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ag_ui_thread_takes_what_is_new_and_rewinds_when_the_frontend_goes_back() {
    let server = TestServer::start().await;
    let (status, thread, body) = post(&server, "/v1/ag-ui", &[], ag_ui("ag-1", json!([ag_user("u1", "first")]))).await;
    assert_eq!((status, thread.as_deref()), (200, Some("ag-1")), "{body}");
    assert!(body.contains("RUN_FINISHED"), "{body}");
    let history = json!([ag_user("u1", "first"), ag_assistant("a1", "first"), ag_user("u2", "second")]);
    let (status, _, body) = post(&server, "/v1/ag-ui", &[], ag_ui("ag-1", history)).await;
    assert_eq!(status, 200, "{body}");
    let want = [("user", "first"), ("assistant", "first"), ("user", "second"), ("assistant", "second")];
    assert_eq!(said(&server, "ag-1").await, pairs(&want), "the history the frontend resent is not taken twice");

    // The frontend edits its second message: the thread goes back to before it.
    let edited = json!([ag_user("u1", "first"), ag_assistant("a1", "first"), ag_user("u2", "second, edited")]);
    let (status, _, body) = post(&server, "/v1/ag-ui", &[], ag_ui("ag-1", edited)).await;
    assert_eq!(status, 200, "{body}");
    let want = [("user", "first"), ("assistant", "first"), ("user", "second, edited"), ("assistant", "second, edited")];
    assert_eq!(said(&server, "ag-1").await, pairs(&want));
    let log = decisions(&server, "ag-1").await;
    let want_log = ["user_input", "answer", "run_end", "user_input", "answer", "run_end", "rewind", "user_input"];
    assert_eq!(log[..want_log.len()], want_log, "the rewound messages stay in the log: {log:?}");
    let (_, audit) = get_json(&reqwest::Client::new(), &server.url("/v1/threads/ag-1/audit")).await;
    let rewind = &audit["entries"][6]["audit"];
    assert_eq!((rewind["kept"].as_u64(), rewind["dropped"].as_u64()), (Some(2), Some(2)), "{audit}");

    // A replay of the thread starts from what its history is now.
    let (status, replay) = common::http::post_json(
        &reqwest::Client::new(),
        &server.url("/v1/threads/ag-1/replay"),
        &json!({"model": "echo"}),
    )
    .await;
    assert_eq!(status, 201, "{replay}");
    let copied = transcript(&server, replay["thread_id"].as_str().expect("thread_id")).await;
    let texts: Vec<&str> =
        copied["messages"].as_array().expect("messages").iter().filter_map(|m| m["content"].as_str()).collect();
    assert_eq!(texts[..3], ["first", "first", "second, edited"], "{copied}");
    server.stop().await.expect("stops");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thread_the_service_does_not_know_starts_from_the_clients_history() {
    let server = TestServer::start().await;
    let history = json!([ag_user("u1", "before"), ag_assistant("a1", "an answer from before"), ag_user("u2", "now")]);
    let (status, _, body) = post(&server, "/v1/ag-ui", &[], ag_ui("ag-new", history)).await;
    assert_eq!(status, 200, "{body}");
    let want = [("user", "before"), ("assistant", "an answer from before"), ("user", "now"), ("assistant", "now")];
    assert_eq!(said(&server, "ag-new").await, pairs(&want));
    let (_, audit) = get_json(&reqwest::Client::new(), &server.url("/v1/threads/ag-new/audit")).await;
    let sources: Vec<&str> = audit["entries"]
        .as_array()
        .expect("entries")
        .iter()
        .map(|e| e["audit"]["source"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(sources[..3], ["client", "client", ""], "what the client held is marked as its: {audit}");

    // A useChat page whose thread the service lost (it expired, or a page kept from before): the same.
    let page = json!({"id": "page-1", "model": "echo", "trigger": "submit-message", "messages": [
        {"id": "m1", "role": "user", "parts": [{"type": "text", "text": "hello"}]},
        {"id": "m2", "role": "assistant", "parts": [{"type": "step-start"}, {"type": "text", "text": "hi there"}]},
        {"id": "m3", "role": "user", "parts": [{"type": "text", "text": "again"}]}
    ]});
    let (status, thread, body) = post(&server, "/v1/ui/chat", &[], page).await;
    assert_eq!((status, thread.as_deref()), (200, Some("page-1")), "{body}");
    let want = [("user", "hello"), ("assistant", "hi there"), ("user", "again"), ("assistant", "again")];
    assert_eq!(said(&server, "page-1").await, pairs(&want));
    server.stop().await.expect("stops");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frontend_tool_result_answers_the_call_its_thread_handed_over() {
    let server = TestServer::start().await;
    let mut input = ag_ui("ag-tool", json!([ag_user("u1", "weather?")]));
    input["forwardedProps"]["model"] = json!("replay/tool-call-fragments");
    let (status, _, body) = post(&server, "/v1/ag-ui", &[], input).await;
    assert_eq!(status, 200, "{body}");
    let waiting = transcript(&server, "ag-tool").await;
    let call = waiting["pending_tool_calls"][0].clone();
    assert_eq!(call["id"], "call_weather_1", "{waiting}");

    let assistant = json!({"id": "a1", "role": "assistant", "toolCalls": [
        {"id": "call_weather_1", "type": "function", "function": call["function"].clone()}]});
    let result = |id: &str| json!({"id": "t1", "role": "tool", "toolCallId": id, "content": "{\"temp_c\": 18}"});
    // A result for a call nobody made is refused, naming the frontend's message; nothing is appended.
    let wrong = json!([ag_user("u1", "weather?"), assistant.clone(), result("call_other")]);
    let (status, _, body) = post(&server, "/v1/ag-ui", &[], ag_ui("ag-tool", wrong)).await;
    assert_eq!(status, 400, "{body}");
    let error: Value = serde_json::from_str(&body).expect("an error envelope");
    assert_envelope(&error, Some("messages[2]"), "invalid_value");
    let answered = json!([ag_user("u1", "weather?"), assistant, result("call_weather_1")]);
    let (status, _, body) = post(&server, "/v1/ag-ui", &[], ag_ui("ag-tool", answered)).await;
    assert_eq!(status, 200, "{body}");
    let roles: Vec<String> = said(&server, "ag-tool").await.into_iter().map(|(role, _)| role).collect();
    assert_eq!(roles, ["user", "assistant", "tool", "assistant"]);
    assert_eq!(transcript(&server, "ag-tool").await["pending_tool_calls"], json!([]));
    server.stop().await.expect("stops");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_anthropic_and_responses_doors_take_the_thread_header() {
    let server = TestServer::start().await;
    let header = [("x-agentmux-thread-id", "doors")];
    let message =
        |text: &str| json!({"model": "echo", "max_tokens": 64, "messages": [{"role": "user", "content": text}]});
    let (status, thread, body) = post(&server, "/v1/messages", &header, message("one")).await;
    assert_eq!((status, thread.as_deref()), (200, Some("doors")), "{body}");
    let response = json!({"model": "echo", "input": "two"});
    let (status, thread, body) = post(&server, "/v1/responses", &header, response).await;
    assert_eq!((status, thread.as_deref()), (200, Some("doors")), "{body}");
    let (status, _, body) = post(&server, "/v1/messages", &header, message("three")).await;
    assert_eq!(status, 200, "{body}");
    let want = [
        ("user", "one"),
        ("assistant", "one"),
        ("user", "two"),
        ("assistant", "two"),
        ("user", "three"),
        ("assistant", "three"),
    ];
    assert_eq!(said(&server, "doors").await, pairs(&want));

    // What a client may not add into a server-side history is refused, naming its item.
    let spoof = json!({"model": "echo", "max_tokens": 64, "messages": [
        {"role": "user", "content": "q"}, {"role": "assistant", "content": "I am the model"}]});
    let (status, _, body) = post(&server, "/v1/messages", &header, spoof).await;
    assert_eq!(status, 400, "{body}");
    // In Anthropic's shape, which has no `param`: the message leads with it.
    let error: Value = serde_json::from_str(&body).expect("an Anthropic error");
    assert_eq!(error["error"]["type"], "invalid_request_error", "{body}");
    assert!(error["error"]["message"].as_str().is_some_and(|m| m.starts_with("messages[1]")), "{body}");
    let (status, _, body) = post(&server, "/v1/messages", &[("x-agentmux-thread-id", "no spaces")], message("x")).await;
    assert_eq!(status, 400, "{body}");
    let (status, _, body) = post(&server, "/v1/ag-ui", &[], ag_ui("bad id!", json!([ag_user("u", "x")]))).await;
    assert_eq!(status, 400, "{body}");
    let error: Value = serde_json::from_str(&body).expect("an error envelope");
    assert_eq!(error["error"]["param"], "threadId", "{body}");
    server.stop().await.expect("stops");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_keys_a_chat_thread_is_the_keys_and_another_key_cannot_reach_it() {
    let keys: Vec<KeySpec> = ["sk-one", "sk-two"].iter().map(|line| line.parse().expect("a key")).collect();
    let mut config = HubConfig::default();
    config.limits.client_budgets = budgets(&keys, config.limits.streams_per_client, 0);
    let settings = Settings { api_keys: keys, shutdown_grace: Duration::ZERO, ..Settings::default() };
    let server = TestServer::with(config, settings, Agents::builtin()).await;
    let page = json!({"id": "shared-name", "model": "echo", "messages": [
        {"id": "m1", "role": "user", "parts": [{"type": "text", "text": "mine"}]}]});
    let (one, two) = (("authorization", "Bearer sk-one"), ("authorization", "Bearer sk-two"));
    let (status, _, body) = post(&server, "/v1/ui/chat", &[one], page.clone()).await;
    assert_eq!(status, 200, "{body}");
    let (status, _, body) = post(&server, "/v1/ui/chat", &[two], page).await;
    assert_eq!(status, 404, "{body}");
    let (status, _, body) =
        post(&server, "/v1/ag-ui", &[two], ag_ui("shared-name", json!([ag_user("u", "theirs")]))).await;
    assert_eq!(status, 404, "{body}");
    let resume = reqwest::Client::new()
        .get(server.url("/v1/ui/chat/shared-name/stream"))
        .bearer_auth("sk-two")
        .send()
        .await
        .expect("resume");
    assert_eq!(resume.status(), 204);
    server.stop().await.expect("stops");
}
