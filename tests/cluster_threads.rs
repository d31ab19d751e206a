//! Threads and their audit log shared by several agentmux processes through a real `redis-server`
//! (`--engine redis`): a conversation goes on whichever node its turns reach, one run at a time across all
//! of them, and a run whose node dies is recorded by another.

mod common;

use std::time::Duration;

use common::http::{get_json, post_json, read_body};
use common::process::ServerProcess;
use common::redis::RedisServer;
use serde_json::{Value, json};

fn node(redis: &RedisServer) -> ServerProcess {
    ServerProcess::spawn(&["--engine", "redis", "--redis-url", &redis.url()])
}

/// A turn on `thread` at `node`: `model` answers `content`; the response, not yet read.
async fn turn(
    client: &reqwest::Client,
    node: &ServerProcess,
    thread: &str,
    model: &str,
    content: &str,
    stream: bool,
) -> reqwest::Response {
    let request = json!({"model": model, "messages": [{"role": "user", "content": content}], "stream": stream});
    client
        .post(node.url("/v1/chat/completions"))
        .header("x-agentmux-thread-id", thread)
        .json(&request)
        .send()
        .await
        .expect("a turn")
}

/// An `echo` turn answered whole: echo says `content` back.
async fn echo_turn(client: &reqwest::Client, node: &ServerProcess, thread: &str, content: &str) {
    let response = turn(client, node, thread, "echo", content, false).await;
    let status = response.status().as_u16();
    let body: Value = response.json().await.expect("JSON");
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["choices"][0]["message"]["content"], content);
}

/// `(role, content)` of each message of thread `id` as `node` shows it.
async fn messages(client: &reqwest::Client, node: &ServerProcess, id: &str) -> Vec<(String, String)> {
    let (status, thread) = get_json(client, &node.url(&format!("/v1/threads/{id}"))).await;
    assert_eq!(status, 200, "{thread}");
    let listed = thread["messages"].as_array().cloned().unwrap_or_default();
    listed
        .iter()
        .map(|m| (m["role"].as_str().unwrap_or("?").to_owned(), m["content"].as_str().unwrap_or("").to_owned()))
        .collect()
}

async fn audit(client: &reqwest::Client, node: &ServerProcess, id: &str) -> Vec<Value> {
    let (status, audit) = get_json(client, &node.url(&format!("/v1/threads/{id}/audit"))).await;
    assert_eq!(status, 200, "{audit}");
    audit["entries"].as_array().cloned().unwrap_or_default()
}

fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
    list.iter().map(|(r, c)| ((*r).to_owned(), (*c).to_owned())).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conversation_goes_on_whichever_node_its_turns_reach() {
    let redis = RedisServer::start();
    let (a, b, c) = (node(&redis), node(&redis), node(&redis));
    let client = reqwest::Client::new();
    let system = json!({"id": "t-shared", "messages": [{"role": "system", "content": "Be brief."}]});
    let (status, created) = post_json(&client, &a.url("/v1/threads"), &system).await;
    assert_eq!(status, 201, "{created}");
    let (status, again) = post_json(&client, &c.url("/v1/threads"), &json!({"id": "t-shared"})).await;
    assert_eq!((status, again["error"]["code"].as_str()), (409, Some("thread_exists")), "{again}");

    echo_turn(&client, &a, "t-shared", "first question").await;
    echo_turn(&client, &b, "t-shared", "second question").await;
    echo_turn(&client, &a, "t-shared", "third question").await;
    let expected = pairs(&[
        ("system", "Be brief."),
        ("user", "first question"),
        ("assistant", "first question"),
        ("user", "second question"),
        ("assistant", "second question"),
        ("user", "third question"),
        ("assistant", "third question"),
    ]);
    for node in [&a, &b, &c] {
        assert_eq!(messages(&client, node, "t-shared").await, expected, "the thread on {}", node.base);
    }
    // One audit log, the same on every node: each turn's input, answer and end, in order.
    let on_a = audit(&client, &a, "t-shared").await;
    assert_eq!(audit(&client, &b, "t-shared").await, on_a);
    assert_eq!(audit(&client, &c, "t-shared").await, on_a);
    let decisions: Vec<&str> = on_a.iter().filter_map(|e| e["decision"].as_str()).collect();
    assert_eq!(
        decisions,
        [
            "system_context",
            "user_input",
            "answer",
            "run_end",
            "user_input",
            "answer",
            "run_end",
            "user_input",
            "answer",
            "run_end"
        ]
    );

    // A replay asked of C forks the thread there; B reads the fork.
    let (status, replay) = post_json(&client, &c.url("/v1/threads/t-shared/replay"), &json!({"model": "echo"})).await;
    assert_eq!(status, 201, "{replay}");
    let fork = replay["thread_id"].as_str().expect("the fork's id").to_owned();
    let stream = replay["stream_id"].as_str().expect("its run").to_owned();
    read_body(client.get(b.url(&format!("/v1/streams/{stream}/events"))).send().await.expect("the replay's run")).await;
    let mut forked = expected[..6].to_vec();
    forked.push(("assistant".into(), "third question".into()));
    assert_eq!(messages(&client, &b, &fork).await, forked);

    // Deleted on B, gone everywhere; made again under the same id, it is a new thread on every node.
    let deleted = client.delete(b.url("/v1/threads/t-shared")).send().await.expect("delete");
    assert_eq!(deleted.status(), 200);
    for node in [&a, &b, &c] {
        let (status, gone) = get_json(&client, &node.url("/v1/threads/t-shared")).await;
        assert_eq!((status, gone["error"]["code"].as_str()), (404, Some("thread_not_found")), "{gone}");
    }
    echo_turn(&client, &c, "t-shared", "anew").await;
    assert_eq!(messages(&client, &a, "t-shared").await, pairs(&[("user", "anew"), ("assistant", "anew")]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_run_at_a_time_per_thread_across_nodes() {
    let redis = RedisServer::start();
    let (a, b) = (node(&redis), node(&redis));
    let client = reqwest::Client::new();
    for round in 0..4 {
        // Two turns at once on two nodes: one runs, the other is told the thread is busy.
        let thread = format!("t-race-{round}");
        let (on_a, on_b) = tokio::join!(
            turn(&client, &a, &thread, "demo", "from A", true),
            turn(&client, &b, &thread, "demo", "from B", true),
        );
        let (running, busy) = match (on_a.status().as_u16(), on_b.status().as_u16()) {
            (200, 409) => (on_a, on_b),
            (409, 200) => (on_b, on_a),
            other => panic!("one turn runs and one is busy, not {other:?}"),
        };
        let stream = running.headers()["x-agentmux-stream-id"].to_str().expect("an id").to_owned();
        let refusal: Value = busy.json().await.expect("JSON");
        assert_eq!(refusal["error"]["code"], "thread_busy", "{refusal}");
        assert!(refusal["error"]["message"].as_str().is_some_and(|m| m.contains(&stream)), "names the run: {refusal}");
        read_body(running).await;

        // Only the run that went is in the thread, whole.
        let entries = audit(&client, &b, &thread).await;
        let inputs: Vec<&Value> = entries.iter().filter(|e| e["decision"] == "user_input").collect();
        assert_eq!(inputs.len(), 1, "one input recorded: {entries:?}");
        assert_eq!(inputs[0]["stream_id"], json!(stream));
        let end = entries.last().expect("entries");
        assert_eq!((end["decision"].as_str(), end["audit"]["status"].as_str()), (Some("run_end"), Some("completed")));
        assert_eq!(entries.iter().filter(|e| e["decision"] == "run_end").count(), 1, "recorded once: {entries:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_whose_node_dies_is_recorded_by_another_and_the_conversation_goes_on() {
    let redis = RedisServer::start();
    let (mut a, b) = (node(&redis), node(&redis));
    let client = reqwest::Client::new();
    echo_turn(&client, &a, "t-dies", "before").await;
    let mut running = turn(&client, &a, "t-dies", "demo", "a long one", true).await;
    assert_eq!(running.status(), 200);
    let stream = running.headers()["x-agentmux-stream-id"].to_str().expect("an id").to_owned();
    running.chunk().await.expect("the run's first bytes");
    let (_, thread) = get_json(&client, &b.url("/v1/threads/t-dies")).await;
    assert_eq!(thread["running"], json!(stream), "B sees the run going on: {thread}");

    a.kill();
    drop(running);
    // The run ends `interrupted` once A's lease lapses (seconds), and B records it.
    let recorded = async || {
        let (status, thread) = get_json(&client, &b.url("/v1/threads/t-dies")).await;
        assert_eq!(status, 200, "{thread}");
        thread["running"].is_null().then_some(thread)
    };
    let thread = common::wait::eventually("B to record the run's end", Duration::from_secs(30), recorded).await;
    assert_eq!(thread["messages"][2]["content"], "a long one", "{thread}");
    let entries = audit(&client, &b, "t-dies").await;
    let end = entries.last().expect("entries");
    assert_eq!(end["decision"], "run_end", "{end}");
    assert_eq!(end["stream_id"], json!(stream));
    assert_eq!(
        (end["audit"]["status"].as_str(), end["audit"]["error"]["code"].as_str()),
        (Some("error"), Some("interrupted")),
        "{end}"
    );

    echo_turn(&client, &b, "t-dies", "after").await;
    let last = messages(&client, &b, "t-dies").await;
    assert_eq!(last.last(), Some(&("assistant".to_owned(), "after".to_owned())));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_right_after_a_run_ended_on_another_node_goes_on() {
    let redis = RedisServer::start();
    let (a, b) = (node(&redis), node(&redis));
    let client = reqwest::Client::new();
    let mut expected = Vec::new();
    for i in 0..8 {
        // The client reads the run's end on one node and asks the other at once: that node's copy of the
        // run may not have the end yet, but Redis does, so the turn waits the moment it takes, never 409.
        let node = if i % 2 == 0 { &a } else { &b };
        let content = format!("turn {i}");
        let response = turn(&client, node, "t-quick", "echo", &content, true).await;
        assert_eq!(response.status(), 200, "turn {i} on {}", node.base);
        let body = read_body(response).await;
        assert!(body.ends_with(b"data: [DONE]\n\n"));
        expected.push(("user".to_owned(), content.clone()));
        expected.push(("assistant".to_owned(), content));
    }
    assert_eq!(messages(&client, &a, "t-quick").await, expected);
    assert_eq!(messages(&client, &b, "t-quick").await, expected);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_whose_node_died_unwatched_does_not_hold_up_the_next_turn() {
    let redis = RedisServer::start();
    let (mut a, b) = (node(&redis), node(&redis));
    let client = reqwest::Client::new();
    let mut running = turn(&client, &a, "t-unwatched", "demo", "a long one", true).await;
    assert_eq!(running.status(), 200);
    let stream = running.headers()["x-agentmux-stream-id"].to_str().expect("an id").to_owned();
    running.chunk().await.expect("the run's first bytes");
    a.kill();
    drop(running);
    // Past A's lease (5 s) and the time B must have renewed its own before it judges others' (6 s): no node
    // has read the thread since the run started, and the first turn on it goes on, not 409 naming a run of
    // a node that is gone.
    tokio::time::sleep(Duration::from_secs(7)).await;
    echo_turn(&client, &b, "t-unwatched", "after").await;
    let entries = audit(&client, &b, "t-unwatched").await;
    let ends: Vec<&Value> = entries.iter().filter(|e| e["decision"] == "run_end").collect();
    assert_eq!(ends.len(), 2, "{entries:?}");
    assert_eq!(
        (ends[0]["stream_id"].as_str(), ends[0]["audit"]["error"]["code"].as_str()),
        (Some(stream.as_str()), Some("interrupted"))
    );
    assert_eq!(ends[1]["audit"]["status"], "completed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn threads_while_redis_is_away_are_a_clear_retryable_error_and_come_back_whole() {
    let mut redis = RedisServer::start();
    let (a, b) = (node(&redis), node(&redis));
    let client = reqwest::Client::new();
    echo_turn(&client, &a, "t-away", "kept").await;
    let (status, created) = common::http::post_empty(&client, &b.url("/v1/streams")).await;
    assert_eq!(status, 201, "{created}");
    let written_on_b = created["id"].as_str().expect("an id").to_owned();

    redis.stop();
    for path in ["/v1/threads/t-away", "/v1/threads/t-away/audit"] {
        let response = client.get(a.url(path)).send().await.expect("an answer");
        assert_eq!(response.status(), 503, "{path}");
        assert_ne!(response.headers().get("x-should-retry").and_then(|v| v.to_str().ok()), Some("false"));
        let body: Value = response.json().await.expect("the error envelope");
        assert_eq!(body["error"]["code"], "cluster_unavailable", "{body}");
    }
    let refused = turn(&client, &a, "t-away", "echo", "lost?", false).await;
    assert_eq!(refused.status(), 503);

    // Away longer than a connection manager's own reconnect attempts last (about 10 s).
    tokio::time::sleep(Duration::from_secs(14)).await;
    redis.start_again();
    let back =
        async || Some(get_json(&client, &a.url("/v1/threads/t-away")).await).filter(|(status, _)| *status == 200);
    let (_, thread) = common::wait::eventually("the thread to be back with Redis", Duration::from_secs(20), back).await;
    assert_eq!(
        thread["messages"],
        json!([{"role": "user", "content": "kept"}, {"role": "assistant", "content": "kept"}])
    );
    echo_turn(&client, &a, "t-away", "again").await;
    // Following a stream written on another node subscribes to its notices: that connection is back too.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (status, snapshot) = get_json(&client, &a.url(&format!("/v1/streams/{written_on_b}"))).await;
    assert_eq!(status, 200, "the first lookup after the outage: {snapshot}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_handed_over_on_one_node_is_answered_on_another_once() {
    let redis = RedisServer::start();
    let (a, b, c) = (node(&redis), node(&redis), node(&redis));
    let client = reqwest::Client::new();
    // This fixture ends on a call to `get_weather`: the client is to run it.
    let handed = turn(&client, &a, "t-tools", "replay/tool-call-fragments", "weather?", false).await;
    assert_eq!(handed.status(), 200);
    let (_, waiting) = get_json(&client, &c.url("/v1/threads/t-tools")).await;
    assert_eq!(waiting["pending_tool_calls"][0]["id"], "call_weather_1", "{waiting}");

    let answer = json!({"model": "echo", "messages": [{"role": "tool", "tool_call_id": "call_weather_1", "content": "{\"temp_c\": 18}"}]});
    let post = |node: &ServerProcess| {
        client.post(node.url("/v1/chat/completions")).header("x-agentmux-thread-id", "t-tools").json(&answer).send()
    };
    let answered = post(&b).await.expect("the result");
    assert_eq!(answered.status(), 200);
    let again = post(&c).await.expect("the result again");
    assert_eq!(again.status(), 400, "answered already, on another node");
    let after = messages(&client, &a, "t-tools").await;
    let roles: Vec<&str> = after.iter().map(|(role, _)| role.as_str()).collect();
    assert_eq!(roles, ["user", "assistant", "tool", "assistant"]);
    let decisions: Vec<String> =
        audit(&client, &b, "t-tools").await.iter().filter_map(|e| e["decision"].as_str().map(str::to_owned)).collect();
    assert_eq!(decisions, ["user_input", "tool_call", "run_end", "tool_result", "answer", "run_end", "rejected"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_full_of_copies_lets_the_least_used_go_and_serves_every_thread() {
    let redis = RedisServer::start();
    let small = |redis: &RedisServer| {
        ServerProcess::spawn(&["--engine", "redis", "--redis-url", &redis.url(), "--max-threads", "3"])
    };
    let (a, b) = (small(&redis), small(&redis));
    let client = reqwest::Client::new();
    // Twice as many threads as a node keeps copies of, made and used on both nodes in turn: Redis holds
    // them all, and a node lets its least used copies go rather than refuse.
    for i in 0..6 {
        let node = if i % 2 == 0 { &a } else { &b };
        let (status, created) =
            post_json(&client, &node.url("/v1/threads"), &json!({"id": format!("t-many-{i}")})).await;
        assert_eq!(status, 201, "{created}");
    }
    for i in 0..6 {
        for node in [&a, &b] {
            echo_turn(&client, node, &format!("t-many-{i}"), &format!("on {}", node.base)).await;
        }
    }
    for i in 0..6 {
        for node in [&b, &a] {
            let listed = messages(&client, node, &format!("t-many-{i}")).await;
            assert_eq!(listed.len(), 4, "thread {i} whole on {}: {listed:?}", node.base);
        }
    }
}
