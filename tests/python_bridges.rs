//! The Python package's framework bridges (`clients/python/src/agentmux/bridges`), each driving its real
//! framework against the real binary, watched live by other clients at the same time:
//!
//! - the OpenAI Agents SDK (`tests/python/bridge_openai_agents.py`): two agents whose models are agentmux's own
//!   built-in replays over `/v1/chat/completions`, a handoff and a function tool, published through
//!   `publish_run`, watched by the `ai` package, `@ag-ui/client` and the `openai` Node clients
//!   (`tests/node/watch_bridge.mjs`);
//! - LangGraph (`tests/python/bridge_langgraph.py`): a tool loop with a fake chat model from `langchain_core`,
//!   published through `AsyncAgentmuxCallbackHandler`, watched as CUI (read here) and by the same Node clients
//!   (the OpenAI format among them).
//!
//! Each script creates its stream and waits on stdin; the watchers connect first (the metrics count them), so
//! each sees the run as it is published, not replayed from the log.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use common::http::{Sse, parse_sse, snapshot};
use common::server::TestServer;
use futures::StreamExt;
use serde_json::{Value, json};

/// How long a script may take, framework imports included.
const SCRIPT_TIMEOUT: Duration = Duration::from_secs(120);
/// How long the watchers may take to connect: the first run installs the Node clients (npm).
const WATCHERS_TIMEOUT: Duration = Duration::from_secs(600);

/// A script started with its stream created: its first line, and a way to let it go on and collect it.
struct Waiting {
    first_line: Value,
    go: mpsc::Sender<()>,
    done: tokio::task::JoinHandle<Output>,
}

/// Starts `tests/python/<name>` in the package's venv and returns once it printed its first line.
async fn start_script(name: &'static str, base: String) -> Waiting {
    // The venv first (pip, the first time: minutes), outside the script's own time limit.
    let python = tokio::task::spawn_blocking(common::python_package::ensure_venv).await.expect("the venv");
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/python").join(name);
    let (line_tx, line_rx) = tokio::sync::oneshot::channel::<String>();
    let (go, go_rx) = mpsc::channel::<()>();
    let done = tokio::task::spawn_blocking(move || {
        let mut child = Command::new(python)
            .arg(&script)
            .arg(&base)
            .env("PYTHONDONTWRITEBYTECODE", "1")
            .env("PYTHONUNBUFFERED", "1")
            .env("NO_PROXY", "127.0.0.1,localhost")
            .env("no_proxy", "127.0.0.1,localhost")
            .env_remove("OPENAI_BASE_URL")
            .env_remove("OPENAI_API_KEY")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("start {name}: {e}"));
        let mut stderr = child.stderr.take().expect("stderr");
        let errors = std::thread::spawn(move || {
            let mut text = String::new();
            let _ = std::io::Read::read_to_string(&mut stderr, &mut text);
            text
        });
        let mut stdout = BufReader::new(child.stdout.take().expect("stdout"));
        let mut first = String::new();
        let _ = stdout.read_line(&mut first);
        let _ = line_tx.send(first);
        let mut stdin = child.stdin.take().expect("stdin");
        if go_rx.recv_timeout(WATCHERS_TIMEOUT + SCRIPT_TIMEOUT).is_ok() {
            let _ = stdin.write_all(b"go\n");
        }
        drop(stdin);
        let mut rest = Vec::new();
        let _ = std::io::Read::read_to_end(&mut stdout, &mut rest);
        let status = child.wait().expect("wait for the script");
        Output { status, stdout: rest, stderr: errors.join().unwrap_or_default().into_bytes() }
    });
    let first = tokio::time::timeout(SCRIPT_TIMEOUT, line_rx).await.expect("the script starts in time");
    let first = first.unwrap_or_default();
    let first_line = serde_json::from_str(&first)
        .unwrap_or_else(|_| panic!("{name} printed no stream id ({first:?}); its stderr comes with the failure below"));
    Waiting { first_line, go, done }
}

impl Waiting {
    /// Lets the script run, and returns its last line (JSON) once it succeeded.
    async fn finish(self, name: &str) -> Value {
        let _ = self.go.send(());
        let output =
            tokio::time::timeout(SCRIPT_TIMEOUT, self.done).await.expect("the script ends in time").expect("ran");
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(
            output.status.success(),
            "{name} failed ({})\n--- stdout\n{stdout}\n--- stderr\n{}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
        let last = stdout.lines().last().unwrap_or_default();
        serde_json::from_str(last).unwrap_or_else(|e| panic!("{name}'s last line is not JSON ({e}): {stdout}"))
    }
}

/// Subscribers connected now, over every format and transport.
async fn subscribers(client: &reqwest::Client, server: &TestServer) -> f64 {
    let text = client.get(server.url("/metrics")).send().await.expect("scrape").text().await.expect("text");
    text.lines()
        .filter(|line| line.starts_with("agentmux_subscribers{"))
        .filter_map(|line| line.rsplit_once(' ').and_then(|(_, n)| n.parse::<f64>().ok()))
        .sum()
}

/// A stream's CUI events, read to the end (the run may take a while to start: no per-chunk patience).
async fn read_cui(client: reqwest::Client, url: String) -> Vec<Sse> {
    let response = client.get(url).send().await.expect("the CUI events");
    assert_eq!(response.status(), 200);
    let mut body = response.bytes_stream();
    let mut all = Vec::new();
    while let Some(chunk) = tokio::time::timeout(SCRIPT_TIMEOUT, body.next()).await.expect("the events end in time") {
        all.extend_from_slice(&chunk.expect("body bytes"));
    }
    parse_sse(&all).0
}

/// The watchers' results (`watch_bridge.mjs`), asserting none of them failed.
fn watched(results: &[Value]) -> &Value {
    let results = &results[0];
    for format in ["ui-message", "ag-ui", "openai"] {
        assert!(results[format]["error"].is_null(), "{format} failed: {}", results[format]["error"]);
    }
    results
}

/// The AG-UI `CUSTOM` events an `event` message named `name` became.
fn custom_events<'a>(seen: &'a Value, name: &str) -> Vec<&'a Value> {
    seen["custom"].as_array().into_iter().flatten().filter(|c| c["value"]["event"] == name).collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn an_openai_agents_run_is_published_through_the_bridge_and_watched_live_by_three_clients() {
    let server = TestServer::start().await;
    let client = reqwest::Client::new();
    let script = start_script("bridge_openai_agents.py", server.base.clone()).await;
    let id = script.first_line["stream"].as_str().expect("a stream id").to_owned();
    let events = server.url(&format!("/v1/streams/{id}/events"));
    let watchers = tokio::spawn(common::node::run_script("watch_bridge.mjs", json!({"events": events})));
    let connected = async || subscribers(&client, &server).await >= 3.0;
    common::wait::eventually("the three watchers to connect", WATCHERS_TIMEOUT, connected).await;

    let last = script.finish("bridge_openai_agents.py").await;
    assert_eq!(last["final_output"], "Sunny in Paris, 21 °C", "the function tool's output ends the run");
    let results = watchers.await.expect("the watchers ran");
    let state = snapshot(&client, &server, &id).await;
    server.stop().await.expect("stops");
    let seen = watched(&results);
    let text = "Let me look that up.Waiting for your tool to answer.";
    let arguments = json!({"location": "Paris", "unit": "celsius"});

    // The AI SDK: the text, the function tool's call with its parsed arguments and output, the handoff's
    // call answered by the handoff, and one step per model turn.
    let ui = &seen["ui-message"];
    assert_eq!(ui["text"], text, "{ui}");
    let tools = ui["tools"].as_array().expect("tool parts");
    let tool = |id: &str| tools.iter().find(|t| t["id"] == id).unwrap_or_else(|| panic!("no call {id}: {ui}"));
    assert_eq!(tool("call_weather_1")["name"], "get_weather");
    assert_eq!(tool("call_weather_1")["input"], arguments);
    assert_eq!(tool("call_weather_1")["output"], "Sunny in Paris, 21 °C");
    assert_eq!(tool("call_weather_1")["state"], "output-available");
    assert_eq!(tool("call_7")["input"], json!({"location": "Oslo"}), "the handoff's call");
    assert_eq!(tool("call_7")["output"], r#"{"assistant": "Weather"}"#);
    assert_eq!(ui["steps"], 2, "one step per model turn: {ui}");

    // AG-UI: the same text and calls, the results as tool messages, the turns as steps named after their
    // agent, the handoff and the agent changes as custom events.
    let ag = &seen["ag-ui"];
    assert_eq!(ag["text"], text, "{ag}");
    assert!(ag["finished"].as_bool().unwrap_or(false), "{ag}");
    let calls = ag["toolCalls"].as_array().expect("tool calls");
    let call = calls.iter().find(|c| c["id"] == "call_weather_1").unwrap_or_else(|| panic!("{ag}"));
    assert_eq!(call["name"], "get_weather");
    let sent: Value = serde_json::from_str(call["arguments"].as_str().expect("arguments")).expect("JSON arguments");
    assert_eq!(sent, arguments);
    let results_of = ag["toolResults"].as_array().expect("tool results");
    let result = results_of.iter().find(|r| r["toolCallId"] == "call_weather_1").unwrap_or_else(|| panic!("{ag}"));
    assert_eq!(result["content"], "Sunny in Paris, 21 °C");
    assert_eq!(ag["steps"], json!(["Triage:1", "Weather:2"]), "{ag}");
    let handoff = custom_events(ag, "handoff");
    assert_eq!(handoff.len(), 1, "{ag}");
    assert_eq!(handoff[0]["value"]["data"], json!({"from": "Triage", "to": "Weather"}));
    let agents: Vec<&Value> =
        custom_events(ag, "agent_updated").into_iter().map(|c| &c["value"]["data"]["agent"]).collect();
    assert_eq!(agents, [&json!("Triage"), &json!("Weather")], "{ag}");

    // OpenAI chat: the text as content; the calls the agent ran itself as reasoning lines, never as
    // `tool_calls` its own loop would run again.
    let openai = &seen["openai"];
    assert_eq!(openai["text"], text, "{openai}");
    let reasoning = openai["reasoning"].as_str().expect("reasoning");
    assert!(
        reasoning.contains("Calling get_weather with {\"location\": \"Paris\", \"unit\": \"celsius\"}"),
        "{openai}"
    );
    assert!(reasoning.contains("get_weather returned"), "{openai}");
    assert_eq!(openai["finishReason"], "stop");

    assert_eq!(state["status"], "completed", "{state}");
}

/// The CUI messages of `events` that are not lifecycle events, with each message's deltas joined: (type,
/// block id, props) in order of first appearance.
fn reduced(events: &[Sse]) -> Vec<(String, Value, Value)> {
    let mut messages: Vec<(String, String, Value, Value)> = Vec::new();
    for message in events.iter().map(Sse::json) {
        if message["type"] == "event" && common::http::lifecycle(&message).is_some() {
            continue;
        }
        let id = message["message_id"].as_str().unwrap_or_default().to_owned();
        match messages.iter_mut().find(|(seen, ..)| *seen == id) {
            Some((_, _, _, props)) => {
                for (field, fragment) in message["props"].as_object().into_iter().flatten() {
                    let joined = format!("{}{}", props[field].as_str().unwrap_or(""), fragment.as_str().unwrap_or(""));
                    props[field] = json!(joined);
                }
            }
            None => messages.push((
                id,
                message["type"].as_str().unwrap_or_default().to_owned(),
                message["block_id"].clone(),
                message["props"].clone(),
            )),
        }
    }
    messages.into_iter().map(|(_, kind, block, props)| (kind, block, props)).collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_langgraph_run_is_published_through_the_callback_handler_and_watched_as_cui_and_openai() {
    let server = TestServer::start().await;
    let client = reqwest::Client::new();
    let script = start_script("bridge_langgraph.py", server.base.clone()).await;
    let id = script.first_line["stream"].as_str().expect("a stream id").to_owned();
    let events = server.url(&format!("/v1/streams/{id}/events"));
    let cui = tokio::spawn(read_cui(client.clone(), events.clone()));
    let watchers = tokio::spawn(common::node::run_script("watch_bridge.mjs", json!({"events": events})));
    let connected = async || subscribers(&client, &server).await >= 4.0;
    common::wait::eventually("the four watchers to connect", WATCHERS_TIMEOUT, connected).await;

    let last = script.finish("bridge_langgraph.py").await;
    assert_eq!(last["answer"], "It is sunny in Oslo.");
    let cui = cui.await.expect("the CUI reader ran");
    let results = watchers.await.expect("the watchers ran");
    server.stop().await.expect("stops");

    // CUI: every message in its node's block, in order: the first model call's text and streamed tool call,
    // the tool node's result, the second call's reasoning and answer; blocks open and close per node run,
    // and the stream ends with the model calls' usage.
    let messages = reduced(&cui);
    let expected = vec![
        ("text".to_owned(), json!("agent:1"), json!({"content": "Let me check the weather."})),
        (
            "tool_call".to_owned(),
            json!("agent:1"),
            json!({"id": "call_oslo", "name": "get_weather", "arguments": "{\"city\": \"Oslo\"}", "server_side": true}),
        ),
        (
            "tool_result".to_owned(),
            json!("tools:2"),
            json!({"call_id": "call_oslo", "name": "get_weather", "result": "Sunny in Oslo, 21 °C"}),
        ),
        ("thinking".to_owned(), json!("agent:3"), json!({"content": "The tool says sunny."})),
        ("text".to_owned(), json!("agent:3"), json!({"content": "It is sunny in Oslo."})),
    ];
    assert_eq!(messages, expected);
    let lifecycle: Vec<(String, Value)> = cui
        .iter()
        .map(Sse::json)
        .filter(|m| matches!(common::http::lifecycle(m), Some("block_start" | "block_end")))
        .map(|m| (m["props"]["event"].as_str().unwrap_or_default().to_owned(), m["props"]["data"]["block_id"].clone()))
        .collect();
    let blocks = ["agent:1", "tools:2", "agent:3"];
    let want: Vec<(String, Value)> = blocks
        .iter()
        .flat_map(|b| [("block_start".to_owned(), json!(b)), ("block_end".to_owned(), json!(b))])
        .collect();
    assert_eq!(lifecycle, want, "one block per node run, each ended when its node ends");
    let end = cui.last().expect("events").json();
    assert_eq!(common::http::lifecycle(&end), Some("stream_end"));
    assert_eq!(end["props"]["data"]["status"], "completed");
    assert_eq!(
        end["props"]["data"]["usage"],
        json!({"prompt_tokens": 20, "completion_tokens": 10, "total_tokens": 30})
    );

    // OpenAI chat (and the other Node clients): the answer's text, the agent's tool call and its result as
    // reasoning lines, the model's reasoning.
    let seen = watched(&results);
    let openai = &seen["openai"];
    assert_eq!(openai["text"], "Let me check the weather.It is sunny in Oslo.", "{openai}");
    let reasoning = openai["reasoning"].as_str().expect("reasoning");
    assert!(reasoning.contains("Calling get_weather with {\"city\": \"Oslo\"}"), "{openai}");
    assert!(reasoning.contains("get_weather returned"), "{openai}");
    assert!(reasoning.contains("The tool says sunny."), "{openai}");
    assert_eq!(openai["finishReason"], "stop");
    assert_eq!(seen["ag-ui"]["steps"], json!(blocks), "{}", seen["ag-ui"]);
    assert_eq!(seen["ui-message"]["text"], "Let me check the weather.It is sunny in Oslo.");
}
