//! The OpenAPI document: `docs/openapi.json` is what the code generates (`agentmux schemas` writes it),
//! the service serves the same at `GET /openapi.json`, a real validator (`openapi-spec-validator`, installed
//! by the test) accepts it as OpenAPI 3.1, and it names every route the service answers.

mod common;

use std::path::Path;

use common::server::TestServer;
use serde_json::Value;

fn committed() -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/openapi.json");
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_committed_document_is_served_valid_and_current() {
    let generated = agentmux::schema::render(&agentmux::http::openapi_json());
    assert_eq!(
        committed(),
        generated,
        "docs/openapi.json differs from what the code generates: run `cargo run -- schemas`"
    );

    let server = TestServer::start().await;
    let response = reqwest::get(server.url("/openapi.json")).await.expect("GET /openapi.json");
    assert_eq!(response.status(), 200);
    let served: Value = response.json().await.expect("json");
    let document: Value = serde_json::from_str(&committed()).expect("json");
    assert_eq!(served, document, "the service serves the committed document");

    // Every path it names is routed (a request to it is not the fallback's 404 `not_found`).
    let client = reqwest::Client::new();
    let paths = document["paths"].as_object().expect("paths");
    for (path, item) in paths {
        let concrete = path.replace("{id}", "x").replace("{chat_id}", "x");
        for method in item.as_object().expect("a path item").keys() {
            let method: reqwest::Method = method.to_uppercase().parse().expect("a method");
            let response = client.request(method.clone(), server.url(&concrete)).send().await.expect("a response");
            let body: Value = response.json().await.unwrap_or(Value::Null);
            assert_ne!(body["error"]["code"], "not_found", "{method} {path} is not routed");
        }
    }
    server.stop().await.expect("stops");

    let python = tokio::task::spawn_blocking(common::python::ensure_venv).await.expect("venv");
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/openapi.json").display().to_string();
    let output = common::python::run_script(python, "validate_openapi.py", vec![path]).await;
    let cases = common::python::cases(&output);
    assert_eq!(cases["valid"]["openapi"], "3.1.0", "{cases:?}");
    assert_eq!(cases["valid"]["paths"].as_u64(), Some(paths.len() as u64));
}
