//! The upstream over TLS, through the `agentmux` binary and its flags, all on loopback: a fake
//! OpenAI-compatible upstream behind a TLS front whose certificate a CA made by the test signed.
//!
//! With `--upstream-ca-file` naming that CA, streamed text and a tool call come through; without it, the run
//! fails `502 upstream_tls` naming the certificate's reason, and the log names the host, never the key; a
//! plain-HTTP upstream still works; a refused connection is `upstream_connect`; `HTTPS_PROXY` sends the
//! connection through a CONNECT proxy, unless `NO_PROXY` names the host; a CA file that cannot be read or holds
//! no certificate stops the start with exit 2 and the reason. The official `openai` Python client streams text
//! and a tool call through agentmux to the TLS upstream.

mod common;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use common::http::{assert_envelope, read_events};
use common::process::{ServerProcess, failed_start};
use common::python::{cases, ensure_venv, run_script};
use common::tls::{TestCa, tls_front};
use common::upstream::{FakeUpstream, Reply};
use serde_json::{Value, json};

const KEY: &str = "sk-tls-secret-0123456789";

fn temp_dir(what: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("agentmux-{what}-{}-{}", std::process::id(), rand_suffix()))
}

fn rand_suffix() -> u128 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0)
}

/// The fake's plain address.
fn backend(upstream: &FakeUpstream) -> SocketAddr {
    let authority = upstream.base.trim_start_matches("http://").trim_end_matches("/v1");
    authority.parse().expect("the fake's address")
}

/// agentmux in front of `url`, with `extra` flags.
fn agentmux(url: &str, extra: &[&str]) -> ServerProcess {
    let mut args = vec!["--upstream-url", url, "--upstream-models", "m", "--upstream-key", KEY];
    args.extend_from_slice(extra);
    ServerProcess::spawn(&args)
}

async fn chat(node: &ServerProcess, body: Value) -> reqwest::Response {
    reqwest::Client::new().post(node.url("/v1/chat/completions")).json(&body).send().await.expect("POST a chat")
}

/// The text of a streamed OpenAI answer.
async fn streamed_text(response: reqwest::Response) -> String {
    assert_eq!(response.status(), 200);
    read_events(response)
        .await
        .iter()
        .filter(|e| e.data != "[DONE]")
        .filter_map(|e| e.json()["choices"][0]["delta"]["content"].as_str().map(str::to_owned))
        .collect()
}

fn weather_tool() -> Value {
    json!([{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn text_and_a_tool_call_come_through_tls_with_the_ca_and_fail_upstream_tls_without_it() {
    let ca = TestCa::new("agentmux test upstream CA");
    let dir = temp_dir("upstream-tls");
    let (ca_file, _, _) = ca.write(&dir);
    let upstream = FakeUpstream::start(vec![
        Reply::text(&["Hello", " over", " TLS"]),
        Reply::tool_calls(&[("call_w", "get_weather", r#"{"city": "Paris"}"#)]),
    ])
    .await;
    let front = tls_front(&ca, backend(&upstream)).await;
    let url = format!("https://127.0.0.1:{}/v1", front.port());

    let node = agentmux(&url, &["--upstream-ca-file", ca_file.to_str().expect("a path")]);
    let hi = json!({"model": "m", "stream": true, "messages": [{"role": "user", "content": "hi"}]});
    assert_eq!(streamed_text(chat(&node, hi.clone()).await).await, "Hello over TLS");
    let weather = json!({"model": "m", "tools": weather_tool(), "messages": [{"role": "user", "content": "weather?"}]});
    let response = chat(&node, weather).await;
    assert_eq!(response.status(), 200);
    let completion: Value = response.json().await.expect("JSON");
    assert_eq!(completion["choices"][0]["finish_reason"], "tool_calls", "{completion}");
    let call = &completion["choices"][0]["message"]["tool_calls"][0];
    assert_eq!((call["id"].as_str(), call["function"]["name"].as_str()), (Some("call_w"), Some("get_weather")));
    assert_eq!(upstream.requests().len(), 2);
    assert_eq!(upstream.authorizations()[0].as_deref(), Some(format!("Bearer {KEY}").as_str()));

    // The same upstream without the CA: its certificate chains to nothing agentmux trusts.
    let stranger = agentmux(&url, &[]);
    let response = chat(&stranger, hi).await;
    assert_eq!(response.status(), 502);
    let body: Value = response.json().await.expect("an envelope");
    assert_envelope(&body, None, "upstream_tls");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("UnknownIssuer"), "the reason is named: {body}");
    assert!(!body.to_string().contains(KEY), "the key leaked: {body}");
    let log = stranger.log.lock().map(|l| l.clone()).unwrap_or_default();
    let line = log.lines().find(|l| l.contains("upstream_tls")).unwrap_or_else(|| panic!("no log line: {log}"));
    assert!(line.contains("127.0.0.1") && line.contains("UnknownIssuer"), "{line}");
    assert!(!log.contains(KEY), "the key is in the log: {log}");
    assert_eq!(upstream.requests().len(), 2, "nothing reached the upstream");
    let _ = std::fs::remove_dir_all(dir);
}

/// The official `openai` client (`tests/python/openai_tls_upstream.py`) through agentmux to the HTTPS upstream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_official_openai_client_reaches_an_https_upstream_through_agentmux() {
    let python =
        tokio::task::spawn_blocking(ensure_venv).await.unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()));
    let ca = TestCa::new("agentmux test upstream CA");
    let dir = temp_dir("upstream-tls-python");
    let (ca_file, _, _) = ca.write(&dir);
    let upstream = FakeUpstream::start(vec![
        Reply::text(&["Hello", " from", " HTTPS"]),
        Reply::tool_calls(&[("call_p", "get_weather", r#"{"city": "Oslo"}"#)]),
    ])
    .await;
    let front = tls_front(&ca, backend(&upstream)).await;
    let url = format!("https://127.0.0.1:{}/v1", front.port());
    let node = agentmux(&url, &["--upstream-ca-file", ca_file.to_str().expect("a path")]);

    let output = run_script(python, "openai_tls_upstream.py", vec![node.url("/v1"), "m".into()]).await;
    let results = cases(&output);
    assert_eq!(results["stream"]["text"], "Hello from HTTPS", "{results:?}");
    assert_eq!(results["stream"]["finish_reason"], "stop", "{results:?}");
    let call = &results["tool_call"]["calls"][0];
    assert_eq!((call["id"].as_str(), call["name"].as_str()), (Some("call_p"), Some("get_weather")), "{results:?}");
    assert_eq!(call["arguments"], r#"{"city": "Oslo"}"#);
    assert_eq!(results["tool_call"]["finish_reason"], "tool_calls");
    assert!(results["models"]["models"].as_array().is_some_and(|m| m.iter().any(|m| m == "m")), "{results:?}");
    assert_eq!(upstream.requests().len(), 2, "both runs went through the TLS front");
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_http_upstream_still_works_and_a_refused_connection_is_upstream_connect() {
    let upstream = FakeUpstream::start(vec![Reply::text(&["plain", " text"])]).await;
    let node = agentmux(&upstream.base, &[]);
    let hi = json!({"model": "m", "stream": true, "messages": [{"role": "user", "content": "hi"}]});
    assert_eq!(streamed_text(chat(&node, hi.clone()).await).await, "plain text");

    // A port nothing listens on: the connection is refused.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").expect("bind").local_addr().expect("addr").port();
    let nowhere = agentmux(&format!("http://127.0.0.1:{closed}/v1"), &[]);
    let response = chat(&nowhere, hi).await;
    assert_eq!(response.status(), 502);
    let body: Value = response.json().await.expect("an envelope");
    assert_envelope(&body, None, "upstream_connect");
}

/// An HTTP CONNECT proxy on loopback: the address, and the targets it was asked for.
async fn connect_proxy() -> (SocketAddr, Arc<Mutex<Vec<String>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind the proxy");
    let address = listener.local_addr().expect("its address");
    let targets = Arc::new(Mutex::new(Vec::new()));
    let seen = Arc::clone(&targets);
    tokio::spawn(async move {
        while let Ok((mut client, _)) = listener.accept().await {
            let seen = Arc::clone(&seen);
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut byte = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") && head.len() < 8192 {
                    if client.read(&mut byte).await.unwrap_or(0) == 0 {
                        return;
                    }
                    head.push(byte[0]);
                }
                let head = String::from_utf8_lossy(&head).into_owned();
                let mut words = head.split_whitespace();
                let (Some("CONNECT"), Some(target)) = (words.next(), words.next()) else { return };
                seen.lock().expect("targets").push(target.to_owned());
                let Ok(mut upstream) = TcpStream::connect(target).await else { return };
                if client.write_all(b"HTTP/1.1 200 Connection Established\r\n\r\n").await.is_ok() {
                    let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
                }
            });
        }
    });
    (address, targets)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_proxy_is_honoured_and_no_proxy_bypasses_it() {
    let ca = TestCa::new("agentmux test upstream CA");
    let dir = temp_dir("upstream-proxy");
    let (ca_file, _, _) = ca.write(&dir);
    let ca_file = ca_file.to_str().expect("a path").to_owned();
    let upstream = FakeUpstream::start(vec![Reply::text(&["proxied"])]).await;
    let front = tls_front(&ca, backend(&upstream)).await;
    let url = format!("https://127.0.0.1:{}/v1", front.port());
    let (proxy, targets) = connect_proxy().await;
    let proxy_url = format!("http://{proxy}");
    let args = ["--upstream-url", &url, "--upstream-models", "m", "--upstream-ca-file", &ca_file];
    let hi = json!({"model": "m", "stream": true, "messages": [{"role": "user", "content": "hi"}]});

    let proxied = ServerProcess::spawn_with_env(&[("HTTPS_PROXY", &proxy_url), ("NO_PROXY", "")], &args);
    assert_eq!(streamed_text(chat(&proxied, hi.clone()).await).await, "proxied");
    assert_eq!(*targets.lock().expect("targets"), [format!("127.0.0.1:{}", front.port())]);

    let direct = ServerProcess::spawn_with_env(&[("HTTPS_PROXY", &proxy_url), ("NO_PROXY", "127.0.0.1")], &args);
    assert_eq!(streamed_text(chat(&direct, hi).await).await, "proxied");
    assert_eq!(targets.lock().expect("targets").len(), 1, "NO_PROXY: the proxy was not asked");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_ca_file_that_cannot_be_used_stops_the_start() {
    let dir = temp_dir("upstream-ca");
    std::fs::create_dir_all(&dir).expect("a directory");
    let start_with_ca = |ca: &std::path::Path| {
        let ca = ca.to_str().expect("a path");
        failed_start(&["--upstream-url", "https://127.0.0.1:9/v1", "--upstream-models", "m", "--upstream-ca-file", ca])
    };
    let missing = dir.join("missing.pem");
    let (code, stderr) = start_with_ca(&missing);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("--upstream-ca-file") && stderr.contains("missing.pem"), "{stderr}");

    let garbage = dir.join("garbage.pem");
    std::fs::write(&garbage, "not a certificate\n").expect("write");
    let (code, stderr) = start_with_ca(&garbage);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("CA"), "{stderr}");
    let _ = std::fs::remove_dir_all(dir);
}
