//! The official `openai` Python package against a real server: `tests/python/openai_client.py` runs every
//! case (text, reasoning, parallel tool calls raw and through the `.stream()` helper, an error mid-stream, the
//! usage chunk, error statuses, a two-turn server-side thread read back) and prints one JSON line per case.
//!
//! The package lives in the tests' virtualenv (`tests/common/python.rs`), made the first time; nothing here is
//! skipped.

mod common;

use std::collections::BTreeMap;
use std::time::Instant;

use common::python::{ensure_venv, run_script};
use common::server::TestServer;

/// Every case the script runs, in its order.
const CASES: &[&str] = &[
    "text_stream_echo",
    "text_nonstream_echo",
    "text_stream_plain_text",
    "text_nonstream_plain_text",
    "reasoning_stream",
    "reasoning_nonstream",
    "tool_calls_stream_raw",
    "tool_calls_stream_helper",
    "tool_calls_stream_helper_strict",
    "tool_calls_nonstream",
    "error_mid_stream",
    "usage_stream",
    "usage_stream_last_chunk",
    "nonstream_error",
    "stream_error_at_end",
    "unknown_model",
    "thread_two_turns",
];

#[tokio::test(flavor = "multi_thread")]
async fn official_openai_python_client() {
    let started = Instant::now();
    let python =
        tokio::task::spawn_blocking(ensure_venv).await.unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()));
    let setup = started.elapsed();

    let server = TestServer::start().await;
    let ran = Instant::now();
    let output = run_script(python, "openai_client.py", vec![server.url("/v1")]).await;
    let script_time = ran.elapsed();
    server.stop().await.expect("server stops");

    let stdout = String::from_utf8_lossy(&output.stdout);
    let mut results: BTreeMap<String, serde_json::Value> = BTreeMap::new();
    let mut versions = None;
    for line in stdout.lines().filter(|line| !line.trim().is_empty()) {
        let value: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("not a JSON line from the script ({e}): {line}"));
        if value.get("openai").is_some() {
            versions = Some(value);
            continue;
        }
        let case = value["case"].as_str().unwrap_or_else(|| panic!("a line without case: {line}")).to_owned();
        assert!(results.insert(case.clone(), value).is_none(), "case {case} reported twice");
    }
    let versions = versions.unwrap_or_else(|| panic!("the script did not print its versions\n--- stdout\n{stdout}"));
    eprintln!(
        "openai {} (python {})",
        versions["openai"].as_str().unwrap_or("?"),
        versions["python"].as_str().unwrap_or("?")
    );
    let missing: Vec<_> = CASES.iter().filter(|case| !results.contains_key(**case)).collect();
    assert!(missing.is_empty(), "cases missing from the script's output: {missing:?}\n--- stdout\n{stdout}");
    let unknown: Vec<_> = results.keys().filter(|case| !CASES.contains(&case.as_str())).collect();
    assert!(unknown.is_empty(), "cases the test does not know: {unknown:?}");
    for case in CASES {
        let result = &results[*case];
        match result["status"].as_str() {
            Some("ok") => eprintln!("ok      {case}"),
            other => panic!("case {case}: status {other:?}: {result}"),
        }
    }
    eprintln!("venv setup {setup:.1?}, script {script_time:.1?}");
}

/// The official client against a server with API keys (`tests/python/openai_keys.py`): with the key it
/// streams a chat and lists the models; with a wrong key, or none, it raises `AuthenticationError` (401).
#[tokio::test(flavor = "multi_thread")]
async fn official_openai_python_client_with_api_keys() {
    let python =
        tokio::task::spawn_blocking(ensure_venv).await.unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()));
    let key = "sk-python-test";
    let settings = agentmux::http::Settings { api_keys: vec![key.into()], ..agentmux::http::Settings::default() };
    let server =
        TestServer::with(agentmux::hub::HubConfig::default(), settings, agentmux::agent::Agents::builtin()).await;
    let output = run_script(python, "openai_keys.py", vec![server.url("/v1"), key.to_owned()]).await;
    server.stop().await.expect("server stops");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let cases = common::python::cases(&output);
    assert!(cases["with_key"]["models"].as_array().is_some_and(|m| !m.is_empty()), "{stdout}");
    assert_eq!(cases["wrong_key"]["status_code"], 401, "{stdout}");
    assert_eq!(cases["wrong_key"]["code"], "invalid_api_key", "{stdout}");
    assert_eq!(cases["no_key"]["status_code"], 401, "{stdout}");
    assert_eq!(cases["no_key"]["code"], "missing_credentials", "no Authorization reached the server: {stdout}");
}
