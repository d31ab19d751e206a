//! Several upstreams in one catalogue, through the `agentmux` binary and its flags, all on loopback: fake
//! OpenAI-compatible upstreams named by `--upstream NAME=URL` and by a config file (`--config`) the test
//! writes, beside the built-in agents.
//!
//! `GET /v1/models` lists them all (`NAME/model`, the aliases); `NAME/model` and aliases route; an alias
//! falls back past an upstream that answers 503, refuses TLS or answers 429 with `retry-after` (which cools it
//! down for later requests), and the stream's end and a thread's audit log name who answered; nothing is
//! retried after the first byte; when every target refused, the client gets the last refusal; a model an
//! upstream did not list is looked up once before the 404; a bad config file stops the start naming the file,
//! the line and the key; made-up model names add no series to the run metrics.

mod common;

use std::path::PathBuf;
use std::time::Duration;

use common::http::{get_json, lifecycle, read_events};
use common::process::{ServerProcess, failed_start};
use common::tls::{TestCa, tls_front};
use common::upstream::{FakeUpstream, Reply, chunk};
use common::wait::eventually;
use serde_json::{Value, json};

/// A temporary directory, removed when dropped.
struct Dir(PathBuf);

impl Dir {
    fn new(what: &str) -> Dir {
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
        let dir = std::env::temp_dir().join(format!("agentmux-{what}-{}-{nanos}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a temporary directory");
        Dir(dir)
    }

    /// Writes `agentmux.toml` with `text`; its path.
    fn config(&self, text: &str) -> String {
        let path = self.0.join("agentmux.toml");
        std::fs::write(&path, text).expect("write the config file");
        path.to_str().expect("a path").to_owned()
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// An answer refused with `status` (and `retry-after`), in OpenAI's error envelope.
fn refusal(status: u16, retry_after: Option<&str>) -> Reply {
    let mut headers = vec![("content-type".to_owned(), "application/json".to_owned())];
    headers.extend(retry_after.map(|after| ("retry-after".to_owned(), after.to_owned())));
    let body = json!({"error": {"message": format!("busy ({status})"), "type": "server_error", "code": null}});
    Reply { status, headers, events: vec![body.to_string()], delay: Duration::ZERO, stall_after: None }
}

/// A fake upstream listing `models`, answering with `replies`.
async fn fake(models: &[&str], replies: Vec<Reply>) -> FakeUpstream {
    let upstream = FakeUpstream::start(replies).await;
    upstream.set_models(models);
    upstream
}

fn ask(model: &str) -> Value {
    json!({"model": model, "messages": [{"role": "user", "content": "hi"}]})
}

async fn chat(node: &ServerProcess, body: &Value, thread: Option<&str>) -> reqwest::Response {
    let mut request = reqwest::Client::new().post(node.url("/v1/chat/completions")).json(body);
    if let Some(thread) = thread {
        request = request.header("x-agentmux-thread-id", thread);
    }
    request.send().await.expect("POST a chat")
}

/// The answer's text and its stream's id, from a 200 that must be one.
async fn answered(response: reqwest::Response) -> (String, String) {
    let status = response.status();
    let id = response.headers().get("x-agentmux-stream-id").and_then(|v| v.to_str().ok()).map(str::to_owned);
    let body: Value = response.json().await.expect("JSON");
    assert_eq!(status, 200, "{body}");
    let text = body["choices"][0]["message"]["content"].as_str().unwrap_or_default().to_owned();
    (text, id.expect("x-agentmux-stream-id"))
}

/// `served_by` of the `stream_end` of stream `id` (null when absent).
async fn served_by(node: &ServerProcess, id: &str) -> Value {
    let response = reqwest::Client::new().get(node.url(&format!("/v1/streams/{id}/events"))).send().await;
    let events = read_events(response.expect("GET the events")).await;
    let end = events.iter().map(|e| e.json()).find(|m| lifecycle(m) == Some("stream_end")).expect("a stream_end");
    end["props"]["data"]["served_by"].clone()
}

/// The model ids `GET /v1/models` lists.
async fn listed(node: &ServerProcess) -> Vec<String> {
    let (status, body) = get_json(&reqwest::Client::new(), &node.url("/v1/models")).await;
    assert_eq!(status, 200, "{body}");
    body["data"].as_array().into_iter().flatten().filter_map(|m| m["id"].as_str().map(str::to_owned)).collect()
}

fn log(node: &ServerProcess) -> String {
    node.log.lock().map(|l| l.clone()).unwrap_or_default()
}

fn host(upstream: &FakeUpstream) -> &str {
    upstream.base.trim_start_matches("http://").trim_end_matches("/v1")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_upstreams_and_the_built_in_agents_make_one_catalogue_routed_by_prefix_and_alias() {
    let a = fake(&["ma"], vec![Reply::text(&["from", " a"])]).await;
    let b = fake(&["mb"], vec![Reply::text(&["from", " b"])]).await;
    let dir = Dir::new("catalogue");
    let config = dir.config(&format!(
        "[upstreams.b]\nurl = \"{}\"\nheaders = {{ \"x-team\" = \"blue\" }}\n\n\
         [aliases]\nfast = \"b/mb\"\nboth = [\"a/ma\", \"b/mb\"]\ntiny = \"echo\"\n",
        b.base
    ));
    let upstream_a = format!("a={}", a.base);
    let node = ServerProcess::spawn_with_env(
        &[("AGENTMUX_UPSTREAM_A_KEY", "sk-a-0123456789")],
        &["--upstream", &upstream_a, "--config", &config],
    );

    let models = listed(&node).await;
    for name in ["demo", "echo", "replay/plain-text", "a/ma", "b/mb", "fast", "both", "tiny"] {
        assert!(models.iter().any(|m| m == name), "{name} is missing from {models:?}");
    }

    // By prefix: the upstream gets its own name for the model, and its own key.
    let (text, id) = answered(chat(&node, &ask("a/ma"), None).await).await;
    assert_eq!(text, "from a");
    assert_eq!(a.requests()[0]["model"], "ma");
    assert_eq!(a.authorizations()[0].as_deref(), Some("Bearer sk-a-0123456789"));
    assert_eq!(served_by(&node, &id).await, json!({"upstream": "a", "model": "ma"}));

    // By alias, to an upstream and to a built-in agent.
    let (text, id) = answered(chat(&node, &ask("fast"), None).await).await;
    assert_eq!(text, "from b");
    assert_eq!(b.requests()[0]["model"], "mb");
    assert_eq!(b.authorizations()[0], None, "b has no key");
    assert_eq!(b.header(0, "x-team").as_deref(), Some("blue"), "the file's headers go with every request");
    assert_eq!(served_by(&node, &id).await, json!({"upstream": "b", "model": "mb"}));
    let (text, id) = answered(chat(&node, &ask("tiny"), None).await).await;
    assert_eq!(text, "hi");
    assert_eq!(served_by(&node, &id).await, json!({"model": "echo"}));

    // A built-in agent keeps its name, and its outcome says nothing of routes.
    let (_, id) = answered(chat(&node, &ask("echo"), None).await).await;
    assert_eq!(served_by(&node, &id).await, Value::Null);

    // No such upstream, and no unnamed one to take the rest: 404.
    let response = chat(&node, &ask("c/mc"), None).await;
    assert_eq!(response.status(), 404);
    assert_eq!((a.requests().len(), b.requests().len()), (1, 1));
}

/// Starts agentmux with upstreams `a` (at `a_url`) and `b`, `a` listing `ma` and `b` `mb`, and the alias
/// `smart` = `["a/ma", "b/mb"]`.
fn smart(dir: &Dir, a_url: &str, b: &FakeUpstream, more: &str) -> ServerProcess {
    let config = dir.config(&format!(
        "[upstreams.a]\nurl = \"{a_url}\"\nmodels = [\"ma\"]\n\n[upstreams.b]\nurl = \"{}\"\n\n\
         [aliases]\nsmart = [\"a/ma\", \"b/mb\"]\n{more}",
        b.base
    ));
    ServerProcess::spawn(&["--config", &config])
}

/// The audit's `run_end` entries of thread `id`, once there are `count`.
async fn run_ends(node: &ServerProcess, id: &str, count: usize) -> Vec<Value> {
    let client = reqwest::Client::new();
    eventually("the runs in the audit log", Duration::from_secs(10), async || {
        let (status, audit) = get_json(&client, &node.url(&format!("/v1/threads/{id}/audit"))).await;
        let ends: Vec<Value> =
            audit["entries"].as_array().into_iter().flatten().filter(|e| e["decision"] == "run_end").cloned().collect();
        (status == 200 && ends.len() >= count).then_some(ends)
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_alias_falls_back_past_a_503_and_the_outcome_and_the_audit_log_say_who_answered() {
    let a = fake(&["ma"], vec![refusal(503, None)]).await;
    let b = fake(&["mb"], vec![Reply::text(&["b", " answers"])]).await;
    let dir = Dir::new("fallback-503");
    let node = smart(&dir, &a.base, &b, "");

    let (text, id) = answered(chat(&node, &ask("smart"), Some("t-smart")).await).await;
    assert_eq!(text, "b answers");
    assert_eq!((a.requests().len(), b.requests().len()), (1, 1));
    assert_eq!(served_by(&node, &id).await, json!({"upstream": "b", "model": "mb"}));
    let ends = run_ends(&node, "t-smart", 1).await;
    assert_eq!(ends[0]["audit"]["served_by"], json!({"upstream": "b", "model": "mb"}), "{}", ends[0]);
    assert_eq!(ends[0]["audit"]["model"], "smart");
    let line = log(&node).lines().find(|l| l.contains("refused before answering")).map(str::to_owned);
    let line = line.unwrap_or_else(|| panic!("no fallback line: {}", log(&node)));
    assert!(line.contains(host(&a)) && line.contains("503") && line.contains("b/mb"), "{line}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_alias_falls_back_past_an_upstream_whose_tls_it_does_not_trust() {
    let ca = TestCa::new("a CA agentmux is not told of");
    let a = fake(&["ma"], vec![Reply::text(&["never"])]).await;
    let backend = host(&a).parse().expect("the fake's address");
    let front = tls_front(&ca, backend).await;
    let b = fake(&["mb"], vec![Reply::text(&["b", " answers"])]).await;
    let dir = Dir::new("fallback-tls");
    let node = smart(&dir, &format!("https://127.0.0.1:{}/v1", front.port()), &b, "");

    let (text, id) = answered(chat(&node, &ask("smart"), Some("t-tls")).await).await;
    assert_eq!(text, "b answers");
    assert!(a.requests().is_empty(), "nothing got through the handshake");
    assert_eq!(served_by(&node, &id).await, json!({"upstream": "b", "model": "mb"}));
    let ends = run_ends(&node, "t-tls", 1).await;
    assert_eq!(ends[0]["audit"]["served_by"]["upstream"], "b");
    let line = log(&node).lines().find(|l| l.contains("refused before answering")).map(str::to_owned);
    let line = line.unwrap_or_else(|| panic!("no fallback line: {}", log(&node)));
    assert!(line.contains("upstream_tls") && line.contains(&format!("127.0.0.1:{}", front.port())), "{line}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_429_with_retry_after_cools_its_target_down_and_when_all_refuse_the_client_gets_the_last_refusal() {
    let a = fake(&["ma"], vec![refusal(429, Some("60"))]).await;
    let b = fake(&["mb"], vec![Reply::text(&["b", " answers"])]).await;
    let c = fake(&["mc"], vec![refusal(429, Some("30"))]).await;
    let dir = Dir::new("fallback-429");
    let more = format!("busy = [\"a/ma\", \"c/mc\"]\n\n[upstreams.c]\nurl = \"{}\"\n", c.base);
    let node = smart(&dir, &a.base, &b, &more);

    let (text, id) = answered(chat(&node, &ask("smart"), None).await).await;
    assert_eq!(text, "b answers");
    assert_eq!(served_by(&node, &id).await, json!({"upstream": "b", "model": "mb"}));
    // a said when to come back: until then, it is not asked.
    let (text, _) = answered(chat(&node, &ask("smart"), None).await).await;
    assert_eq!(text, "b answers");
    assert_eq!((a.requests().len(), b.requests().len()), (1, 2));

    // Every target refuses: the client gets the last refusal, with its retry-after.
    let response = chat(&node, &ask("busy"), None).await;
    assert_eq!(response.status(), 429);
    assert_eq!(response.headers().get("retry-after").and_then(|v| v.to_str().ok()), Some("30"));
    assert_eq!((a.requests().len(), c.requests().len()), (1, 1));
    // Both cooling down: no upstream is asked, the refusal that ends first comes back at once.
    let response = chat(&node, &ask("busy"), None).await;
    assert_eq!(response.status(), 429);
    let after: u64 = response.headers()["retry-after"].to_str().ok().and_then(|v| v.parse().ok()).expect("seconds");
    assert!((1..=30).contains(&after), "{after}");
    assert_eq!((a.requests().len(), c.requests().len()), (1, 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_is_retried_once_a_byte_has_reached_the_client() {
    let mut broken = Reply::chunks(&[
        chunk(json!({"role": "assistant", "content": "partial"}), None),
        json!({"error": {"message": "the model crashed", "code": "server_error"}}),
    ]);
    broken.events.pop();
    let a = fake(&["ma"], vec![broken]).await;
    let b = fake(&["mb"], vec![Reply::text(&["b", " answers"])]).await;
    let dir = Dir::new("no-retry");
    let node = smart(&dir, &a.base, &b, "");

    let mut body = ask("smart");
    body["stream"] = json!(true);
    let response = chat(&node, &body, None).await;
    assert_eq!(response.status(), 200);
    let id = response.headers()["x-agentmux-stream-id"].to_str().expect("an id").to_owned();
    let events: Vec<Value> =
        read_events(response).await.iter().filter(|e| e.data != "[DONE]").map(|e| e.json()).collect();
    let text: String =
        events.iter().filter_map(|e| e["choices"][0]["delta"]["content"].as_str()).collect::<Vec<_>>().concat();
    assert_eq!(text, "partial");
    let failed = events.iter().any(|e| e["error"]["message"].as_str().is_some_and(|m| m.contains("the model crashed")));
    assert!(failed, "the client sees the error: {events:?}");
    assert_eq!((a.requests().len(), b.requests().len()), (1, 0), "b was never asked");
    // The run failed where a answered: its outcome names a.
    assert_eq!(served_by(&node, &id).await, json!({"upstream": "a", "model": "ma"}));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_the_upstream_did_not_list_is_looked_up_once_before_the_404() {
    let a = fake(&["m1"], vec![Reply::text(&["m2", " answers"])]).await;
    let upstream = format!("a={}", a.base);
    let node = ServerProcess::spawn(&["--upstream", &upstream]);
    assert_eq!(a.listings(), 1, "listed once at start");
    assert!(listed(&node).await.contains(&"a/m1".to_owned()));

    a.set_models(&["m1", "m2"]);
    let (text, _) = answered(chat(&node, &ask("a/m2"), None).await).await;
    assert_eq!(text, "m2 answers");
    assert_eq!(a.listings(), 2, "looked up once");
    assert!(listed(&node).await.contains(&"a/m2".to_owned()));

    // Not in the list looked up a moment ago: 404 at once, and no new lookup so soon.
    let response = chat(&node, &ask("a/nope"), None).await;
    assert_eq!(response.status(), 404);
    let body: Value = response.json().await.expect("an envelope");
    assert_eq!(body["error"]["code"], "model_not_found", "{body}");
    assert_eq!((a.listings(), a.requests().len()), (2, 1));
}

#[test]
fn a_bad_config_file_stops_the_start_naming_the_file_the_line_and_what_is_wrong() {
    let dir = Dir::new("config-errors");
    let unknown = dir.config("[upstreams.a]\nurl = \"http://127.0.0.1:9/v1\"\nmodel = [\"m\"]\n");
    let (code, stderr) = failed_start(&["--config", &unknown]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains(&unknown) && stderr.contains("line 3") && stderr.contains("unknown field `model`"),
        "{stderr}"
    );

    let twice = dir.config("[upstreams.a]\nurl = \"http://127.0.0.1:9/v1\"\n");
    let (code, stderr) = failed_start(&["--upstream", "a=http://127.0.0.1:9/v1", "--config", &twice]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("\"a\" is defined twice"), "{stderr}");
    let (code, stderr) =
        failed_start(&["--upstream", "a=http://127.0.0.1:9/v1", "--upstream", "a=http://127.0.0.1:8/v1"]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("\"a\" is defined twice"), "{stderr}");

    let nowhere = dir.config("[aliases]\nfast = \"nowhere/m\"\n");
    let (code, stderr) = failed_start(&["--config", &nowhere]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("\"fast\"") && stderr.contains("nowhere/m"), "{stderr}");

    let unset = dir.config("[upstreams.a]\nurl = \"http://127.0.0.1:9/v1\"\nkey_env = \"AGENTMUX_TEST_UNSET_KEY\"\n");
    let (code, stderr) = failed_start(&["--config", &unset]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("line 1") && stderr.contains("AGENTMUX_TEST_UNSET_KEY is not set"), "{stderr}");
}

/// The `agentmux_runs_total` lines of `/metrics`.
async fn run_series(node: &ServerProcess) -> Vec<String> {
    let text = reqwest::get(node.url("/metrics")).await.expect("scrape").text().await.expect("the exposition");
    text.lines().filter(|l| l.starts_with("agentmux_runs_total{")).map(str::to_owned).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn made_up_model_names_add_no_series_to_the_run_metrics() {
    let upstream = fake(&["known"], vec![Reply::text(&["ok"])]).await;
    let node = ServerProcess::spawn(&["--upstream-url", &upstream.base]);
    for n in 0..12 {
        // The unnamed upstream takes any name: each is a run.
        let (text, _) = answered(chat(&node, &ask(&format!("made-up-{n}")), None).await).await;
        assert_eq!(text, "ok");
    }
    answered(chat(&node, &ask("known"), None).await).await;
    answered(chat(&node, &ask("echo"), None).await).await;
    let series = run_series(&node).await;
    assert!(series.iter().all(|l| !l.contains("made-up")), "{series:?}");
    assert!(series.contains(&"agentmux_runs_total{model=\"other\"} 12".to_owned()), "{series:?}");
    assert!(series.iter().any(|l| l.starts_with("agentmux_runs_total{model=\"known\"} 1")), "{series:?}");
    assert_eq!(series.len(), 3, "{series:?}");
}
