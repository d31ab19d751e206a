//! Corrections reach the formats that cannot take text back: a text replaced mid-stream (`delta_action:
//! replace`, the `replace-and-merge` case: "The cheapest fare is 41" becomes "… 42 EUR.") ends, for the
//! official clients of the UI message stream (`ai`, both majors), AG-UI (`@ag-ui/client`) and Anthropic
//! (`@anthropic-ai/sdk`), with the service's own text (its snapshot, the reducer's result), never the stale
//! one. Live over real sockets against the server, and for every golden case read from its golden files.

mod common;

use std::collections::BTreeMap;

use agentmux::output::Reducer;
use common::http::{create_stream, post_empty, post_json, snapshot};
use common::server::TestServer;
use serde_json::{Value, json};

const CASE: &str = "replace-and-merge";

/// The text messages of a list of messages (a snapshot's, or a reducer's as JSON): id and content, in order.
fn texts(messages: &[Value]) -> Vec<(Option<String>, String)> {
    messages
        .iter()
        .filter(|m| m["type"] == "text")
        .map(|m| (m["message_id"].as_str().map(str::to_owned), m["props"]["content"].as_str().unwrap_or("").to_owned()))
        .filter(|(_, content)| !content.is_empty())
        .collect()
}

/// The reducer's text messages after every message of a golden case.
fn reduced_texts(case: &str) -> Vec<(Option<String>, String)> {
    let mut reducer = Reducer::default();
    for message in common::messages(case) {
        reducer.apply(&message).unwrap_or_else(|e| panic!("{case}: {e}"));
    }
    let messages: Vec<Value> =
        reducer.messages().iter().map(|m| serde_json::to_value(m).expect("a message as JSON")).collect();
    texts(&messages)
}

/// By name: what a script under `tests/node/` printed for each of its runs.
fn by_name(results: Vec<Value>, key: &str) -> BTreeMap<String, Value> {
    results.into_iter().map(|r| (r[key].as_str().unwrap_or("").to_owned(), r)).collect()
}

/// The text an AG-UI client holds for message `id`: its last assistant message under that id or a later one
/// of the same message (`<id>~<n>`).
fn ag_ui_text<'r>(result: &'r Value, id: &str) -> Option<&'r str> {
    let next = format!("{id}~");
    result["messages"]
        .as_array()?
        .iter()
        .filter(|m| m["role"] == "assistant" && m["id"].as_str().is_some_and(|m| m == id || m.starts_with(&next)))
        .filter_map(|m| m["content"].as_str())
        .next_back()
}

/// The texts of an Anthropic message's text blocks, joined.
fn anthropic_text(message: &Value) -> String {
    message["content"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|b| b["type"] == "text")
        .filter_map(|b| b["text"].as_str())
        .collect()
}

/// The last text part of a UI message.
fn last_ui_text(message: &Value) -> Option<&str> {
    message["parts"].as_array()?.iter().filter(|p| p["type"] == "text").filter_map(|p| p["text"].as_str()).next_back()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_replaced_text_ends_corrected_in_the_ui_ag_ui_and_anthropic_clients() {
    let server = TestServer::start().await;
    let client = reqwest::Client::new();
    let id = create_stream(&client, &server).await;
    let input = String::from_utf8(common::read(CASE, "input.jsonl")).expect("utf-8");
    let batch: Vec<Value> =
        input.lines().filter(|l| !l.trim().is_empty()).map(|l| serde_json::from_str(l).expect("JSON")).collect();
    let (status, body) = post_json(&client, &server.url(&format!("/v1/streams/{id}/messages")), &json!(batch)).await;
    assert_eq!(status, 200, "{body}");
    let (status, _) = post_empty(&client, &server.url(&format!("/v1/streams/{id}/end"))).await;
    assert_eq!(status, 200);
    let snapshot = snapshot(&client, &server, &id).await;
    let expected = texts(snapshot["messages"].as_array().expect("the snapshot's messages"));
    let (_, last) = expected.last().cloned().expect("a text");
    assert_eq!(last, "The cheapest fare is 42 EUR.", "the service's own text: {snapshot}");

    let events = server.url(&format!("/v1/streams/{id}/events?format=ui-message"));
    let ui = common::node::run_script(
        "ui_message.mjs",
        json!({"packages": ["ai5", "ai"], "sources": [{"name": "live", "url": events}]}),
    )
    .await;
    let ag_ui = common::node::run_script(
        "ag_ui.mjs",
        json!({"runs": [{"name": "live", "url": server.url("/v1/ag-ui"), "model": format!("replay/{CASE}")}]}),
    )
    .await;
    let anthropic = common::node::run_script(
        "anthropic.mjs",
        json!({"base": server.url(""), "runs": [{"name": "live", "model": format!("replay/{CASE}")}]}),
    )
    .await;
    server.stop().await.expect("stops");

    assert_eq!(ui.len(), 2, "{ui:?}");
    for result in &ui {
        assert!(result["error"].is_null(), "{result}");
        assert_eq!(last_ui_text(&result["message"]), Some(last.as_str()), "{result}");
        // The stale part stays, marked so that a page can hide it; the corrected one is not marked.
        let marks: Vec<(&str, bool)> = result["message"]["parts"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|p| p["type"] == "text")
            .map(|p| (p["text"].as_str().unwrap_or(""), p["providerMetadata"]["agentmux"]["superseded"] == true))
            .collect();
        let stale = ("The cheapest fare is 41", true);
        assert_eq!(marks[1..], [stale, (last.as_str(), false)], "{result}");
    }
    let ag_ui = &by_name(ag_ui, "name")["live"];
    assert!(ag_ui["failed"].is_null(), "{ag_ui}");
    assert_eq!(ag_ui["printed"], json!([]), "the client warned: {ag_ui}");
    for (id, text) in &expected {
        let id = id.as_deref().expect("the case names its messages");
        assert_eq!(ag_ui_text(ag_ui, id), Some(text.as_str()), "{id}: {ag_ui}");
    }
    let anthropic = &by_name(anthropic, "name")["live"];
    assert!(anthropic["error"].is_null(), "{anthropic}");
    let blocks = anthropic["message"]["content"].as_array().cloned().unwrap_or_default();
    let last_block = blocks.iter().rev().find(|b| b["type"] == "text").and_then(|b| b["text"].as_str());
    assert_eq!(last_block, Some(last.as_str()), "the last block is the corrected text: {anthropic}");
}

#[tokio::test(flavor = "multi_thread")]
async fn every_golden_case_ends_with_the_reducers_text_in_the_append_only_clients() {
    let cases = common::cases();
    let files = |file: &str| -> Vec<Value> {
        cases.iter().map(|case| json!({"name": case, "file": common::fixtures_dir().join(case).join(file)})).collect()
    };
    let ui =
        common::node::run_script("ui_message.mjs", json!({"packages": ["ai"], "sources": files("ui-message.sse")}));
    let ui = by_name(ui.await, "source");
    let ag_ui = by_name(common::node::run_script("ag_ui.mjs", json!({"runs": files("ag-ui.sse")})).await, "name");
    let anthropic =
        by_name(common::node::run_script("anthropic.mjs", json!({"runs": files("anthropic.sse")})).await, "name");
    let mut checked = 0;
    for case in &cases {
        let expected = reduced_texts(case);
        let Some((_, last)) = expected.last() else { continue };
        if !ui[case]["error"].is_null() {
            // The error chunk fails the read: no message to compare.
            continue;
        }
        checked += 1;
        let message = &ui[case]["message"];
        assert!(last_ui_text(message).is_some_and(|t| t.ends_with(last.as_str())), "{case}: {message}");
        for (id, text) in expected.iter().filter_map(|(id, text)| Some((id.as_deref()?, text))) {
            assert_eq!(ag_ui_text(&ag_ui[case], id), Some(text.as_str()), "{case} {id}: {}", ag_ui[case]);
        }
        if anthropic[case]["error"].is_null() {
            let text = anthropic_text(&anthropic[case]["message"]);
            // Media go into the text after it (as Markdown links): the text holds the last text whole.
            assert!(text.contains(last.as_str()), "{case}: {text:?} does not hold {last:?}");
        }
    }
    assert!(checked > 5, "most cases have a text: {checked}");
}
