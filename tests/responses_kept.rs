//! Responses that are kept (`POST /v1/responses` with `store`, the default), over real sockets against the
//! binary, its model a fake upstream that records what it is asked (so each test sees the whole input every
//! turn gave the model): three turns chained by `previous_response_id` only, on one node, across a restart
//! with the store and across two nodes sharing Redis; `item_reference` items standing for a kept response's
//! output; `GET`, `DELETE` and `input_items`; and the 400s that name the param (`store: false` then a
//! reference, an unknown reference, an input item type agentmux does not take).

mod common;

use std::time::Duration;

use common::http::{assert_envelope, get_json, post_json};
use common::process::ServerProcess;
use common::redis::RedisServer;
use common::upstream::{FakeUpstream, Reply, chunk};
use serde_json::{Value, json};

/// A fake upstream answering "one", "two", "three", ... in order.
async fn upstream() -> FakeUpstream {
    let replies = ["one", "two", "three", "four", "five"].iter().map(|text| Reply::text(&[text])).collect();
    FakeUpstream::start(replies).await
}

/// `POST /v1/responses` with `body`, answered whole.
async fn respond(node: &ServerProcess, body: Value) -> (u16, Value) {
    post_json(&reqwest::Client::new(), &node.url("/v1/responses"), &body).await
}

/// A turn whose input is `text`, continuing `previous` if given: the response's id, once it said `said`.
async fn turn(node: &ServerProcess, text: &str, previous: Option<&str>, said: &str) -> String {
    let mut body = json!({"model": "fake", "input": text});
    if let Some(previous) = previous {
        body["previous_response_id"] = json!(previous);
    }
    let (status, response) = respond(node, body).await;
    assert_eq!(status, 200, "{response}");
    assert_eq!(response["output"][0]["content"][0]["text"], said, "{response}");
    response["id"].as_str().expect("an id").to_owned()
}

/// `(role, content)` of each message the upstream was sent in its `n`th request.
fn asked(upstream: &FakeUpstream, n: usize) -> Vec<(String, String)> {
    let requests = upstream.requests();
    let messages = requests[n]["messages"].as_array().cloned().unwrap_or_default();
    messages
        .iter()
        .map(|m| (m["role"].as_str().unwrap_or("?").to_owned(), m["content"].as_str().unwrap_or("").to_owned()))
        .collect()
}

fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
    list.iter().map(|(r, c)| ((*r).to_owned(), (*c).to_owned())).collect()
}

/// What the third turn of a conversation of three should have given the model.
fn three_turns() -> Vec<(String, String)> {
    pairs(&[
        ("user", "My name is Ada."),
        ("assistant", "one"),
        ("user", "What is my name?"),
        ("assistant", "two"),
        ("user", "Say it again."),
    ])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_turns_chained_by_previous_response_id_give_the_model_the_whole_conversation() {
    let upstream = upstream().await;
    let node = ServerProcess::spawn(&["--upstream-url", &upstream.base]);
    let first = turn(&node, "My name is Ada.", None, "one").await;
    let second = turn(&node, "What is my name?", Some(&first), "two").await;
    turn(&node, "Say it again.", Some(&second), "three").await;
    assert_eq!(
        asked(&upstream, 1),
        pairs(&[("user", "My name is Ada."), ("assistant", "one"), ("user", "What is my name?")])
    );
    assert_eq!(asked(&upstream, 2), three_turns());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conversation_of_kept_responses_goes_on_across_a_restart_with_the_store() {
    let upstream = upstream().await;
    let dir = std::env::temp_dir().join(format!("agentmux-responses-kept-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let path = dir.to_str().expect("UTF-8");
    let args = ["--upstream-url", &upstream.base, "--data-dir", path];
    let mut node = ServerProcess::spawn(&args);
    let first = turn(&node, "My name is Ada.", None, "one").await;
    let second = turn(&node, "What is my name?", Some(&first), "two").await;
    node.terminate();
    let (_, exited) = node.wait_exit(Duration::from_secs(10));
    assert!(exited, "it stops on SIGTERM");
    drop(node);
    let node = ServerProcess::spawn(&args);
    let (status, kept) = get_json(&reqwest::Client::new(), &node.url(&format!("/v1/responses/{second}"))).await;
    assert_eq!((status, kept["id"].as_str()), (200, Some(second.as_str())), "{kept}");
    assert_eq!(kept["output"][0]["content"][0]["text"], "two", "its output is kept: {kept}");
    turn(&node, "Say it again.", Some(&second), "three").await;
    assert_eq!(asked(&upstream, 2), three_turns());
    drop(node);
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conversation_of_kept_responses_goes_on_whichever_node_its_turns_reach() {
    let upstream = upstream().await;
    let redis = RedisServer::start();
    let args = ["--upstream-url", &upstream.base, "--engine", "redis", "--redis-url", &redis.url()];
    let (a, b) = (ServerProcess::spawn(&args), ServerProcess::spawn(&args));
    let first = turn(&a, "My name is Ada.", None, "one").await;
    let second = turn(&b, "What is my name?", Some(&first), "two").await;
    let (status, kept) = get_json(&reqwest::Client::new(), &a.url(&format!("/v1/responses/{second}"))).await;
    assert_eq!((status, &kept["output"][0]["content"][0]["text"]), (200, &json!("two")), "{kept}");
    turn(&a, "Say it again.", Some(&second), "three").await;
    assert_eq!(asked(&upstream, 2), three_turns());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_item_reference_brings_the_output_of_the_response_that_made_the_item() {
    let upstream = upstream().await;
    let node = ServerProcess::spawn(&["--upstream-url", &upstream.base]);
    let (status, first) = respond(&node, json!({"model": "fake", "input": "My name is Ada."})).await;
    assert_eq!(status, 200, "{first}");
    let item = first["output"][0]["id"].as_str().expect("an item id").to_owned();
    assert!(item.starts_with("msg_"), "{first}");
    // As the AI SDK sends an earlier turn when responses are kept.
    let input = json!([
        {"role": "user", "content": [{"type": "input_text", "text": "My name is Ada."}]},
        {"type": "item_reference", "id": item},
        {"role": "user", "content": [{"type": "input_text", "text": "What is my name?"}]},
    ]);
    let (status, second) = respond(&node, json!({"model": "fake", "input": input})).await;
    assert_eq!(status, 200, "{second}");
    assert_eq!(
        asked(&upstream, 1),
        pairs(&[("user", "My name is Ada."), ("assistant", "one"), ("user", "What is my name?")])
    );

    let unknown = json!([{"role": "user", "content": "hi"}, {"type": "item_reference", "id": "msg_0000_0"}]);
    let (status, refused) = respond(&node, json!({"model": "fake", "input": unknown})).await;
    assert_eq!(status, 400, "{refused}");
    assert_envelope(&refused, Some("input[1].id"), "item_not_found");
    assert_eq!(upstream.requests().len(), 2, "a refused request reaches no model");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kept_response_is_read_listed_and_forgotten() {
    let upstream = upstream().await;
    let node = ServerProcess::spawn(&["--upstream-url", &upstream.base]);
    let client = reqwest::Client::new();
    let input = json!([{"role": "user", "content": "My name is Ada."}, {"role": "user", "content": "Hi."}]);
    let body = json!({"model": "fake", "instructions": "Be brief.", "input": input});
    let (status, made) = respond(&node, body).await;
    assert_eq!(status, 200, "{made}");
    let id = made["id"].as_str().expect("an id");

    let (status, kept) = get_json(&client, &node.url(&format!("/v1/responses/{id}"))).await;
    assert_eq!(status, 200, "{kept}");
    for field in ["id", "object", "status", "model"] {
        assert_eq!(kept[field], made[field], "{field}: {kept}");
    }
    assert_eq!(kept["output"], made["output"], "the same items, with the same ids");

    let (status, list) = get_json(&client, &node.url(&format!("/v1/responses/{id}/input_items?order=asc"))).await;
    assert_eq!(status, 200, "{list}");
    assert_eq!(list["object"], "list");
    let texts: Vec<&str> =
        list["data"].as_array().expect("data").iter().filter_map(|i| i["content"][0]["text"].as_str()).collect();
    assert_eq!(texts, ["Be brief.", "My name is Ada.", "Hi."], "{list}");
    assert_eq!(list["first_id"], list["data"][0]["id"]);
    assert_eq!(list["has_more"], false);
    let (_, newest) = get_json(&client, &node.url(&format!("/v1/responses/{id}/input_items?limit=1"))).await;
    assert_eq!((newest["data"][0]["content"][0]["text"].as_str(), &newest["has_more"]), (Some("Hi."), &json!(true)));

    let deleted = client.delete(node.url(&format!("/v1/responses/{id}"))).send().await.expect("delete");
    assert_eq!(deleted.status(), 200);
    let deleted: Value = deleted.json().await.expect("JSON");
    assert_eq!(deleted, json!({"id": id, "object": "response", "deleted": true}));
    let (status, gone) = get_json(&client, &node.url(&format!("/v1/responses/{id}"))).await;
    assert_eq!(status, 404, "{gone}");
    let body = json!({"model": "fake", "input": "Again?", "previous_response_id": id});
    let (status, refused) = respond(&node, body).await;
    assert_eq!(status, 400, "{refused}");
    assert_envelope(&refused, Some("previous_response_id"), "previous_response_not_found");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_false_keeps_nothing_and_a_later_reference_to_it_is_a_400_naming_the_param() {
    let upstream = upstream().await;
    let node = ServerProcess::spawn(&["--upstream-url", &upstream.base]);
    let (status, made) = respond(&node, json!({"model": "fake", "input": "Hi.", "store": false})).await;
    assert_eq!(status, 200, "{made}");
    let id = made["id"].as_str().expect("an id");
    let (status, _) = get_json(&reqwest::Client::new(), &node.url(&format!("/v1/responses/{id}"))).await;
    assert_eq!(status, 404);
    let body = json!({"model": "fake", "input": "Again?", "previous_response_id": id});
    let (status, refused) = respond(&node, body).await;
    assert_eq!(status, 400, "{refused}");
    assert_envelope(&refused, Some("previous_response_id"), "previous_response_not_found");
    let long = format!("resp_{}", "x".repeat(10_000));
    let (status, refused) =
        respond(&node, json!({"model": "fake", "input": "Hi.", "previous_response_id": long})).await;
    assert_eq!(status, 400, "{refused}");
    assert_envelope(&refused, Some("previous_response_id"), "previous_response_not_found");
    let item = made["output"][0]["id"].clone();
    let input = json!([{"role": "user", "content": "Hi."}, {"type": "item_reference", "id": item}]);
    let (status, refused) = respond(&node, json!({"model": "fake", "input": input})).await;
    assert_eq!(status, 400, "{refused}");
    assert_envelope(&refused, Some("input[1].id"), "item_not_found");
    assert!(!upstream.requests()[0].as_object().expect("a request").contains_key("store"), "store is not an option");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_input_item_type_agentmux_does_not_take_is_a_400_naming_its_index() {
    let node = ServerProcess::spawn(&[]);
    let input = json!([
        {"role": "user", "content": "Look."},
        {"type": "message", "role": "user", "content": "And this."},
        {"type": "computer_call", "call_id": "c1", "action": {"type": "screenshot"}},
    ]);
    let (status, refused) = respond(&node, json!({"model": "echo", "input": input})).await;
    assert_eq!(status, 400, "{refused}");
    assert_envelope(&refused, Some("input[2]"), "invalid_value");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kept_response_belongs_to_the_key_that_made_it() {
    let node = ServerProcess::spawn(&["--api-key", "sk-ada", "--api-key", "sk-bob"]);
    let client = reqwest::Client::new();
    let asked = |key: &'static str, request: reqwest::RequestBuilder| async move {
        let response = request.bearer_auth(key).send().await.expect("a response");
        let status = response.status().as_u16();
        (status, response.json::<Value>().await.expect("JSON"))
    };
    let make = client.post(node.url("/v1/responses")).json(&json!({"model": "echo", "input": "mine"}));
    let (status, made) = asked("sk-ada", make).await;
    assert_eq!(status, 200, "{made}");
    let id = made["id"].as_str().expect("an id");
    let path = node.url(&format!("/v1/responses/{id}"));
    assert_eq!(asked("sk-bob", client.get(&path)).await.0, 404);
    assert_eq!(asked("sk-bob", client.get(format!("{path}/input_items"))).await.0, 404);
    assert_eq!(asked("sk-bob", client.delete(&path)).await.0, 404);
    let continued = json!({"model": "echo", "input": "yours?", "previous_response_id": id});
    let (status, refused) = asked("sk-bob", client.post(node.url("/v1/responses")).json(&continued)).await;
    assert_eq!(status, 400, "{refused}");
    assert_envelope(&refused, Some("previous_response_id"), "previous_response_not_found");
    let (status, kept) = asked("sk-ada", client.get(&path)).await;
    assert_eq!((status, kept["output"][0]["content"][0]["text"].as_str()), (200, Some("mine")), "{kept}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_response_reads_as_in_progress_and_streams_from_its_start() {
    let mut slow = Reply::text(&["a", "b", "c", "d"]);
    slow.delay = Duration::from_millis(300);
    let upstream = FakeUpstream::start(vec![slow]).await;
    let node = ServerProcess::spawn(&["--upstream-url", &upstream.base]);
    let client = reqwest::Client::new();
    let request = json!({"model": "fake", "input": "Slowly.", "stream": true});
    let mut running = client.post(node.url("/v1/responses")).json(&request).send().await.expect("a stream");
    assert_eq!(running.status(), 200);
    let first = running.chunk().await.expect("a chunk").expect("the first event");
    let first = String::from_utf8_lossy(&first).into_owned();
    let id = first.split("\"id\":\"").nth(1).and_then(|rest| rest.split('"').next()).expect("the response id");
    assert!(id.starts_with("resp_"), "{first}");

    let (status, now) = get_json(&client, &node.url(&format!("/v1/responses/{id}"))).await;
    assert_eq!((status, now["status"].as_str()), (200, Some("in_progress")), "{now}");
    let watched = client.get(node.url(&format!("/v1/responses/{id}?stream=true"))).send().await.expect("a stream");
    assert_eq!(watched.status(), 200);
    let body = String::from_utf8(common::http::read_body(watched).await).expect("UTF-8");
    let events: Vec<Value> = body
        .lines()
        .filter_map(|line| line.strip_prefix("data: "))
        .map(|data| serde_json::from_str(data).expect("JSON data"))
        .collect();
    let names: Vec<&str> = events.iter().filter_map(|e| e["type"].as_str()).collect();
    assert_eq!(names.first(), Some(&"response.created"), "{names:?}");
    assert_eq!(names.last(), Some(&"response.completed"), "{names:?}");
    let done = events.last().expect("an event");
    assert_eq!(done["response"]["output"][0]["content"][0]["text"], "abcd");

    let (status, ended) = get_json(&client, &node.url(&format!("/v1/responses/{id}"))).await;
    assert_eq!((status, ended["status"].as_str()), (200, Some("completed")), "{ended}");
    assert_eq!(ended["output"], done["response"]["output"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_openai_package_and_the_ai_sdk_hold_a_conversation_on_kept_responses() {
    let upstream = upstream().await;
    let node = ServerProcess::spawn(&["--upstream-url", &upstream.base]);
    let config = json!({"base": node.url("/v1"), "model": "fake"});
    let results = common::node::run_script("responses_kept.mjs", config).await;
    let by_name = |name: &str| results.iter().find(|r| r["name"] == name).cloned().unwrap_or_default();
    assert_eq!(by_name("openai")["texts"], json!(["one", "two", "three"]), "{results:?}");
    assert_eq!(asked(&upstream, 2), three_turns(), "previous_response_id alone carries the conversation");
    assert_eq!(by_name("ai_sdk")["texts"], json!(["four", "five"]), "{results:?}");
    let second = pairs(&[("user", "My name is Ada."), ("assistant", "four"), ("user", "What is my name?")]);
    assert_eq!(asked(&upstream, 4), second, "the AI SDK's item_reference brings the first turn's answer");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_referenced_text_and_the_calls_the_client_sends_back_reach_the_agent_once() {
    let text_then_call = Reply::chunks(&[
        chunk(json!({"role": "assistant", "content": "Let me check."}), None),
        chunk(
            json!({"tool_calls": [{"index": 0, "id": "c1", "type": "function",
                "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}]}),
            None,
        ),
        chunk(json!({}), Some("tool_calls")),
    ]);
    let upstream = FakeUpstream::start(vec![text_then_call, Reply::text(&["18 °C in Paris."])]).await;
    let node = ServerProcess::spawn(&["--upstream-url", &upstream.base]);
    let tools = json!([{"type": "function", "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}]);
    let (status, first) = respond(&node, json!({"model": "fake", "input": "Weather?", "tools": tools})).await;
    assert_eq!(status, 200, "{first}");
    let kinds: Vec<&str> =
        first["output"].as_array().expect("output").iter().filter_map(|i| i["type"].as_str()).collect();
    assert_eq!(kinds, ["message", "function_call"], "{first}");
    // As the AI SDK sends it back: the text as a reference, the call it ran as a function_call, its result.
    let input = json!([
        {"role": "user", "content": "Weather?"},
        {"type": "item_reference", "id": first["output"][0]["id"]},
        {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{\"city\":\"Paris\"}"},
        {"type": "function_call_output", "call_id": "c1", "output": "18"},
    ]);
    let (status, second) = respond(&node, json!({"model": "fake", "input": input, "tools": tools})).await;
    assert_eq!(status, 200, "{second}");
    let sent = &upstream.requests()[1]["messages"];
    let roles: Vec<&str> = sent.as_array().expect("messages").iter().filter_map(|m| m["role"].as_str()).collect();
    assert_eq!(roles, ["user", "assistant", "tool"], "{sent}");
    assert_eq!(sent[1]["content"], "Let me check.", "{sent}");
    assert_eq!(sent[1]["tool_calls"].as_array().map(Vec::len), Some(1), "the call once: {sent}");
}
