//! What an operator gets, over real sockets: `/metrics` counters that move by exactly what happened,
//! `/readyz` apart from `/healthz`, `/v1/version`, and JSON log lines (an access line per request, with the
//! route template and never a token).

mod common;

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::time::Duration;

use agentmux::agent::Agents;
use agentmux::http::Settings;
use agentmux::hub::HubConfig;
use common::http::read_body;
use common::server::TestServer;
use common::wait::eventually;
use serde_json::{Value, json};

/// Every sample of the exposition: `name{labels}` to its value.
async fn scrape(client: &reqwest::Client, server: &TestServer) -> HashMap<String, f64> {
    let response = client.get(server.url("/metrics")).send().await.expect("scrape");
    assert_eq!(response.status(), 200);
    let text = response.text().await.expect("text");
    assert!(text.trim_end().ends_with("# EOF"), "an OpenMetrics exposition ends with # EOF");
    text.lines()
        .filter(|line| !line.starts_with('#') && !line.is_empty())
        .filter_map(|line| {
            line.rsplit_once(' ').map(|(name, value)| (name.to_owned(), value.parse().unwrap_or(f64::NAN)))
        })
        .collect()
}

fn delta(before: &HashMap<String, f64>, after: &HashMap<String, f64>, sample: &str) -> f64 {
    after.get(sample).copied().unwrap_or(0.0) - before.get(sample).copied().unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_move_by_what_happened() {
    let settings = Settings { shutdown_grace: Duration::ZERO, ..Settings::default() };
    let server = TestServer::with(HubConfig::default(), settings, Agents::builtin()).await;
    let client = reqwest::Client::new();
    let before = scrape(&client, &server).await;

    let created: Value =
        client.post(server.url("/v1/streams")).send().await.expect("create").json().await.expect("json");
    let id = created["id"].as_str().expect("id").to_owned();
    let events = client.get(server.url(&format!("/v1/streams/{id}/events"))).send().await.expect("subscribe");
    let messages = server.url(&format!("/v1/streams/{id}/messages"));
    let batch = json!([{"type": "text", "props": {"content": "a"}}, {"type": "text", "props": {"content": "b"}}]);
    let body = batch.to_string();
    let response = client.post(&messages).header("content-type", "application/json").body(body.clone()).send().await;
    assert_eq!(response.expect("append").status(), 200);
    let one = json!({"type": "text", "props": {"content": "c"}});
    assert_eq!(client.post(&messages).json(&one).send().await.expect("append").status(), 200);
    let refused = client.post(&messages).header("content-type", "text/plain").body("{}").send().await;
    assert_eq!(refused.expect("refused").status(), 415);
    let during = scrape(&client, &server).await;
    assert_eq!(delta(&before, &during, r#"agentmux_subscribers{format="cui",transport="sse"}"#), 1.0);
    assert_eq!(delta(&before, &during, r#"agentmux_streams{status="open"}"#), 1.0);
    assert_eq!(client.post(server.url(&format!("/v1/streams/{id}/end"))).send().await.expect("end").status(), 200);
    let sent = read_body(events).await;
    let chat = json!({"model": "echo", "messages": [{"role": "user", "content": "one two"}]});
    assert_eq!(client.post(server.url("/v1/chat/completions")).json(&chat).send().await.expect("chat").status(), 200);
    // A run's end is counted by a task that waits for it, as the answer does: it may land a moment after.
    let ended = r#"agentmux_runs_ended_total{model="echo",status="completed"}"#;
    let counted = async || Some(scrape(&client, &server).await).filter(|after| delta(&before, after, ended) >= 1.0);
    let after = eventually("the run's end to be counted", Duration::from_secs(5), counted).await;

    let moved = |sample: &str| delta(&before, &after, sample);
    assert_eq!(moved("agentmux_streams_created_total"), 2.0, "the outside producer's stream and the run's");
    assert_eq!(moved(r#"agentmux_streams{status="completed"}"#), 2.0);
    assert_eq!(moved(r#"agentmux_streams{status="open"}"#), 0.0);
    assert_eq!(moved("agentmux_messages_in_total"), 3.0);
    assert_eq!(moved("agentmux_bytes_in_total"), (body.len() + one.to_string().len()) as f64);
    assert_eq!(moved("agentmux_append_duration_seconds_count"), 2.0, "the refused append took no messages");
    let appends = r#"agentmux_http_requests_total{route="/v1/streams/{id}/messages",method="POST",status="200"}"#;
    assert_eq!(moved(appends), 2.0);
    assert_eq!(moved(r#"agentmux_refusals_total{status="415",code="unsupported_media_type"}"#), 1.0);
    assert_eq!(moved(r#"agentmux_subscribers{format="cui",transport="sse"}"#), 0.0, "it left");
    assert_eq!(moved(r#"agentmux_bytes_out_total{transport="sse"}"#), sent.len() as f64, "every byte it got");
    assert_eq!(moved(r#"agentmux_runs_total{model="echo"}"#), 1.0);
    assert_eq!(moved(r#"agentmux_runs_ended_total{model="echo",status="completed"}"#), 1.0);
    let delivered = moved("agentmux_publish_to_deliver_seconds_count");
    assert!(delivered >= 1.0, "the first append is a probe its subscriber counts: {delivered}");
    let mean = moved("agentmux_publish_to_deliver_seconds_sum") / delivered;
    assert!((0.0..5.0).contains(&mean), "on loopback, well under seconds: {mean}");
    assert!(after.keys().all(|k| !k.contains(&id)), "no label holds a stream id");
    assert!(after.get("agentmux_connections").is_some_and(|&n| n >= 1.0));
    server.stop().await.expect("stops");
}

/// Publish-to-deliver counts messages published while the subscriber was there, not a late joiner's replay
/// of what came before it: one probe at most per 100 ms, so appends a moment apart give one sample and an
/// append after a pause another.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publish_to_deliver_counts_what_was_published_to_a_subscriber_not_its_replay() {
    let settings = Settings { shutdown_grace: Duration::ZERO, ..Settings::default() };
    let server = TestServer::with(HubConfig::default(), settings, Agents::builtin()).await;
    let client = reqwest::Client::new();
    let created: Value =
        client.post(server.url("/v1/streams")).send().await.expect("create").json().await.expect("json");
    let id = created["id"].as_str().expect("id").to_owned();
    let messages = server.url(&format!("/v1/streams/{id}/messages"));
    let text = |content: &str| json!({"type": "text", "props": {"content": content}});
    for content in ["before", "joined"] {
        assert_eq!(client.post(&messages).json(&text(content)).send().await.expect("append").status(), 200);
    }
    let before = scrape(&client, &server).await;
    let events = client.get(server.url(&format!("/v1/streams/{id}/events"))).send().await.expect("subscribe");
    // The pause the test is about (longer than the 100 ms between probes): the scenario, not synchronisation.
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert_eq!(client.post(&messages).json(&text("after a pause")).send().await.expect("append").status(), 200);
    assert_eq!(client.post(server.url(&format!("/v1/streams/{id}/end"))).send().await.expect("end").status(), 200);
    let sent = read_body(events).await;
    assert!(String::from_utf8_lossy(&sent).contains("after a pause"));
    let after = scrape(&client, &server).await;
    assert_eq!(delta(&before, &after, "agentmux_publish_to_deliver_seconds_count"), 1.0);
    server.stop().await.expect("stops");
}

/// Each format renders a stream's messages once, however many subscribers read them:
/// `agentmux_messages_rendered_total` moves by the log's length per format, with three subscribers in each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_format_renders_each_message_once_whatever_its_subscribers() {
    let settings = Settings { shutdown_grace: Duration::ZERO, ..Settings::default() };
    let server = TestServer::with(HubConfig::default(), settings, Agents::builtin()).await;
    let client = reqwest::Client::new();
    let before = scrape(&client, &server).await;
    let created: Value =
        client.post(server.url("/v1/streams")).send().await.expect("create").json().await.expect("json");
    let id = created["id"].as_str().expect("id").to_owned();
    let formats = ["cui", "openai", "ui-message", "ag-ui", "anthropic", "responses"];
    let mut readers = Vec::new();
    for format in formats.iter().cycle().take(3 * formats.len()) {
        let url = server.url(&format!("/v1/streams/{id}/events?format={format}"));
        readers.push(client.get(url).send().await.expect("subscribe"));
    }
    let messages = server.url(&format!("/v1/streams/{id}/messages"));
    for word in ["one", "two", "three"] {
        let delta = json!({"type": "text", "props": {"content": word}, "message_id": "m", "delta": true});
        assert_eq!(client.post(&messages).json(&delta).send().await.expect("append").status(), 200);
    }
    assert_eq!(client.post(server.url(&format!("/v1/streams/{id}/end"))).send().await.expect("end").status(), 200);
    let mut bodies = Vec::new();
    for reader in readers {
        bodies.push(String::from_utf8(read_body(reader).await).expect("utf-8"));
    }
    // A CUI event per message of the log, each with its sequence as its id.
    let logged = bodies[0].lines().filter(|line| line.starts_with("id: ")).count();
    assert!(logged >= 5, "the start, three deltas, the end: {}", bodies[0]);
    let after = scrape(&client, &server).await;
    let rendered: Vec<(&String, f64)> = after
        .keys()
        .filter(|k| k.starts_with("agentmux_messages_rendered_total{"))
        .map(|k| (k, delta(&before, &after, k)))
        .collect();
    assert_eq!(rendered.len(), formats.len(), "a rendering per format: {rendered:?}");
    for (render, count) in rendered {
        assert_eq!(count, logged as f64, "{render}: once per message, not once per subscriber");
    }
    server.stop().await.expect("stops");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_turns_away_new_clients_once_the_service_stops() {
    let settings = Settings { shutdown_grace: Duration::from_secs(3), ..Settings::default() };
    let server = TestServer::with(HubConfig::default(), settings, Agents::builtin()).await;
    let client = reqwest::Client::new();
    let (healthz, readyz, version) = (server.url("/healthz"), server.url("/readyz"), server.url("/v1/version"));
    assert_eq!(client.get(&readyz).send().await.expect("readyz").status(), 200);
    let answer: Value = client.get(&version).send().await.expect("version").json().await.expect("json");
    assert_eq!(answer, json!({"name": "agentmux", "version": env!("CARGO_PKG_VERSION")}));
    // An open stream holds the shutdown in its grace.
    assert_eq!(client.post(server.url("/v1/streams")).send().await.expect("create").status(), 201);
    let stopping = tokio::spawn(server.stop());
    let refused = async || Some(client.get(&readyz).send().await.expect("readyz")).filter(|r| r.status() == 503);
    let response = eventually("readyz to say 503", Duration::from_secs(2), refused).await;
    let body: Value = response.json().await.expect("json");
    assert_eq!(body["error"]["code"], "shutting_down");
    assert_eq!(client.get(&healthz).send().await.expect("healthz").status(), 200, "alive while it drains");
    stopping.await.expect("join").expect("stops");
}

/// `--log-format json`: each line one JSON object; a request's access line names its route template,
/// status and duration, and neither its query nor a token.
#[test]
fn json_logs_parse_and_the_access_line_holds_no_token() {
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_agentmux"))
        .args(["serve", "--ephemeral", "--addr", "127.0.0.1:0", "--log-format", "json", "--api-key", "sk-log"])
        .env("RUST_LOG", "info")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start");
    let mut lines = BufReader::new(child.stderr.take().expect("stderr")).lines();
    let mut next_json = || -> Value {
        let line = lines.next().expect("a log line").expect("read");
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"))
    };
    let address = loop {
        let line = next_json();
        if line["fields"]["message"] == "agentmux listening" {
            break line["fields"]["address"].as_str().expect("address").to_owned();
        }
    };
    let token = "amr.x.0.not-a-real-token";
    let mut tcp = std::net::TcpStream::connect(&address).expect("connect");
    let request = format!("GET /v1/streams/x/events?token={token} HTTP/1.1\r\nhost: a\r\nconnection: close\r\n\r\n");
    tcp.write_all(request.as_bytes()).expect("send");
    let mut reply = String::new();
    tcp.read_to_string(&mut reply).expect("read");
    assert!(reply.starts_with("HTTP/1.1 401"), "{reply}");
    let access = loop {
        let line = next_json();
        assert!(!line.to_string().contains("not-a-real-token"), "a token in a log line: {line}");
        if line["fields"]["message"] == "access" {
            break line;
        }
    };
    assert_eq!(access["level"], "INFO");
    assert_eq!(access["fields"]["status"], 401);
    assert!(access["fields"]["duration_ms"].as_f64().is_some());
    assert_eq!(access["span"]["route"], "/v1/streams/{id}/events");
    assert_eq!(access["span"]["method"], "GET");
    let _ = child.kill();
    let _ = child.wait();
}

/// Methods a client makes up, without a key against a keyed service: each is counted, under `other`, and
/// none becomes a series of its own, so the exposition does not grow with what callers invent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn made_up_methods_add_no_series() {
    let settings = Settings { api_keys: vec![agentmux::http::KeySpec::from("sk-operator")], ..Settings::default() };
    let server = TestServer::with(HubConfig::default(), settings, Agents::builtin()).await;
    let client = reqwest::Client::new();
    let scrape_keyed = async || {
        let response = client.get(server.url("/metrics")).bearer_auth("sk-operator").send().await.expect("scrape");
        assert_eq!(response.status(), 200);
        response.text().await.expect("text")
    };
    let before = scrape_keyed().await;
    for round in 0..40 {
        let made_up = format!("X{round}{}", "M".repeat(2000));
        let method = reqwest::Method::from_bytes(made_up.as_bytes()).expect("a token is a method");
        let answer = client.request(method, server.url("/v1/streams")).send().await.expect("an answer");
        assert!(answer.status().is_client_error(), "a made-up method is refused: {}", answer.status());
    }
    let after = scrape_keyed().await;
    assert!(!after.contains("MMMMMMMM"), "a made-up method became a label");
    let series = |text: &str| text.lines().filter(|l| l.starts_with("agentmux_http_requests_total{")).count();
    // At most one new series (`other` with the refusal's route and status), not forty.
    assert!(series(&after) <= series(&before) + 2, "before:\n{before}\nafter:\n{after}");
    let others: f64 = after
        .lines()
        .filter(|l| l.starts_with("agentmux_http_requests_total{") && l.contains(r#"method="other""#))
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum();
    assert_eq!(others, 40.0, "every made-up request is still counted:\n{after}");
}
