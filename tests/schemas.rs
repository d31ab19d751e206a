//! The committed JSON Schemas (`docs/schemas/`) are what the code generates (`agentmux::schema`), byte for
//! byte: regenerate them with `cargo run -- schemas` after changing a type. And they describe what agentmux
//! really sends and takes: every fixture's input, every message of a live stream (its lifecycle events
//! included), and real error bodies all match, and what validation refuses does not.

mod common;

use std::path::Path;

use common::http::read_events;
use common::server::TestServer;
use serde_json::{Value, json};

fn committed(name: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/schemas").join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn validator(name: &str) -> jsonschema::Validator {
    let schema: Value = serde_json::from_str(&committed(name)).expect("a schema is JSON");
    jsonschema::validator_for(&schema).unwrap_or_else(|e| panic!("{name} is not a valid schema: {e}"))
}

fn assert_valid(validator: &jsonschema::Validator, instance: &Value, what: &str) {
    let errors: Vec<String> =
        validator.iter_errors(instance).map(|e| format!("{} at {}", e, e.instance_path())).collect();
    assert!(errors.is_empty(), "{what}: {instance}\n{errors:#?}");
}

#[test]
fn the_committed_schemas_are_what_the_code_generates() {
    let generated = agentmux::schema::schemas();
    let names: Vec<&str> = generated.iter().map(|(name, _)| name.as_str()).collect();
    let mut files: Vec<String> = std::fs::read_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/schemas"))
        .expect("docs/schemas")
        .filter_map(|entry| entry.ok()?.file_name().into_string().ok())
        .collect();
    files.sort();
    let mut sorted = names.clone();
    sorted.sort();
    assert_eq!(files, sorted, "docs/schemas holds exactly the generated schemas");
    for (name, schema) in &generated {
        assert_eq!(
            committed(name),
            agentmux::schema::render(schema),
            "docs/schemas/{name} differs from what the code generates: run `cargo run -- schemas`"
        );
    }
    // Every built-in type has its props in the schema.
    let message: Value = serde_json::from_str(&committed("output-message.schema.json")).expect("json");
    let rules = message["$defs"]["OutputMessage"]["allOf"].as_array().expect("allOf");
    for kind in agentmux::output::builtin_types() {
        let found = rules.iter().any(|rule| rule["if"]["properties"]["type"]["const"] == *kind);
        assert!(found, "no props rule for the built-in type {kind}");
    }
}

#[test]
fn every_fixture_message_matches_the_output_message_schema() {
    let validator = validator("output-message.schema.json");
    let mut checked = 0;
    for case in common::cases() {
        let input = String::from_utf8(common::read(&case, "input.jsonl")).expect("utf-8");
        for line in input.lines().filter(|line| !line.trim().is_empty()) {
            let message: Value = serde_json::from_str(line).expect("a fixture line is JSON");
            assert_valid(&validator, &message, &format!("{case}/input.jsonl"));
            checked += 1;
        }
    }
    assert!(checked > 50, "{checked} messages");
}

#[test]
fn what_validation_refuses_the_schema_refuses_too() {
    let validator = validator("output-message.schema.json");
    let refused = [
        json!({"type": "text", "props": {"content": 42}}),
        json!({"type": "tool_call", "props": {"arguments": "{}"}}),
        json!({"type": "text", "props": {"content": "x"}, "delta": "yes"}),
        json!({"type": "text", "props": {"content": "x"}, "delta": true, "delta_action": "prepend"}),
    ];
    for message in refused {
        assert!(!validator.is_valid(&message), "should not match: {message}");
        let parsed = agentmux::output::OutputMessage::from_json(&message.to_string());
        assert!(parsed.is_err(), "and validation refuses it: {message}");
    }
    // A lifecycle event's data is the stream's: a `stream_end` without its status is not one.
    let end = json!({"type": "event", "props": {"event": "stream_end", "data": {"duration_ms": 3}}});
    assert!(!validator.is_valid(&end), "{end}");
    // A delta carries only part of its props; a custom type's props are anything.
    for message in [
        json!({"type": "tool_call", "props": {"arguments": "{\"ci"}, "message_id": "c", "delta": true}),
        json!({"type": "weather_card", "props": {"city": "Paris", "temp_c": 18}}),
    ] {
        assert_valid(&validator, &message, "accepted");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_stream_and_real_errors_match_the_schemas() {
    let server = TestServer::start().await;
    let client = reqwest::Client::new();
    let created: Value =
        client.post(server.url("/v1/streams")).send().await.expect("create").json().await.expect("json");
    let id = created["id"].as_str().expect("id").to_owned();
    let messages = [
        json!({"type": "text", "props": {"content": "Hel"}, "message_id": "m", "block_id": "b", "delta": true}),
        json!({"type": "text", "props": {"content": "lo"}, "message_id": "m", "block_id": "b", "delta": true}),
        json!({"type": "image", "props": {"url": "https://example.com/a.png"}, "block_id": "b"}),
        json!({"type": "loading", "props": {"message": "thinking"}}),
    ];
    for message in &messages {
        let response = client.post(server.url(&format!("/v1/streams/{id}/messages"))).json(message).send().await;
        assert_eq!(response.expect("append").status(), 200);
    }
    let outcome = json!({"status": "error", "error": {"message": "upstream timed out", "code": "timeout"},
                         "usage": {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}});
    assert_valid(&validator("outcome.schema.json"), &outcome, "an outcome");
    let ended = client.post(server.url(&format!("/v1/streams/{id}/end"))).json(&outcome).send().await;
    assert_eq!(ended.expect("end").status(), 200);
    let events = client.get(server.url(&format!("/v1/streams/{id}/events"))).send().await.expect("events");
    let message_schema = validator("output-message.schema.json");
    let mut names = Vec::new();
    for event in read_events(events).await {
        let message = event.json();
        if let Some(name) = message["props"]["event"].as_str() {
            names.push(name.to_owned());
        }
        assert_valid(&message_schema, &message, "a live message");
    }
    for name in ["stream_start", "block_start", "message_start", "message_end", "block_end", "stream_end"] {
        assert!(names.iter().any(|n| n == name), "{name} in {names:?}");
    }

    let errors = validator("error.schema.json");
    let bad = client.post(server.url("/v1/chat/completions")).body("{").send().await.expect("bad json");
    let missing = client.get(server.url("/v1/streams/nope")).send().await.expect("404");
    let refused =
        client.post(server.url(&format!("/v1/streams/{id}/messages"))).json(&json!({"type": ""})).send().await;
    for response in [bad, missing, refused.expect("refused")] {
        assert!(response.status().is_client_error(), "{}", response.status());
        let body: Value = response.json().await.expect("an error body");
        assert_valid(&errors, &body, "an error body");
    }
    server.stop().await.expect("stops");
}
