//! The OpenAPI 3.1 document (`GET /openapi.json`, committed as `docs/openapi.json`), made from the same list
//! the router is built from (`endpoints()`, which `mod.rs` gathers): each endpoint's path, method and
//! handler, and beside them what the document says of it (`endpoint.rs`). Its security comes from the
//! function the auth guard asks (`edge/auth.rs`, `needs`), and its schemas from the Rust types
//! (`crate::schema`), so the document cannot say something the service does not do. `tests/openapi.rs`
//! checks the committed file against this and has a real OpenAPI validator accept it.

use axum::http::Method;
use schemars::generate::SchemaGenerator;
use serde_json::{Map, Value, json};

use super::endpoint::{Content, Endpoint};
use crate::http::edge::auth::{Access, Needs, needs};
use crate::http::edge::shape::ErrorShape;

/// What the document says of an error in Anthropic's shape.
const ANTHROPIC_ERROR: &str = "An Anthropic error: {\"type\": \"error\", \"error\": {\"type\", \"message\"}}";

/// The document of `endpoints`.
pub(crate) fn document(endpoints: Vec<Endpoint>) -> Value {
    let mut generator = crate::schema::generator("/components/schemas");
    let error = json!({"application/json": {"schema": crate::schema::error(&mut generator).to_value()}});
    let mut paths = Map::new();
    for endpoint in endpoints {
        let (method, path, operation, errors) = (endpoint.method, endpoint.path, endpoint.operation, endpoint.errors);
        let mut item = json!({
            "operationId": operation_id(&method, path),
            "summary": operation.summary,
            "tags": [operation.tag],
        });
        let parameters: Vec<Value> = path
            .split('/')
            .filter_map(|segment| segment.strip_prefix('{')?.strip_suffix('}'))
            .map(|name| json!({"name": name, "in": "path", "required": true, "schema": {"type": "string"}}))
            .collect();
        if !parameters.is_empty() {
            item["parameters"] = Value::Array(parameters);
        }
        if let Some((content, required)) = operation.request {
            item["requestBody"] = json!({"required": required, "content": media(&[content], &mut generator)});
        }
        let mut responses = Map::new();
        for (status, description, contents) in &operation.answers {
            let mut response = json!({"description": description});
            if !contents.is_empty() {
                response["content"] = media(contents, &mut generator);
            }
            responses.insert(status.to_string(), response);
        }
        let default = match errors {
            ErrorShape::OpenAi => json!({"description": "An error, in OpenAI's envelope", "content": error}),
            ErrorShape::Anthropic => json!({
                "description": "An error, in Anthropic's shape",
                "content": media(&[Content::Foreign(ANTHROPIC_ERROR)], &mut generator),
            }),
        };
        responses.insert("default".into(), default);
        item["responses"] = Value::Object(responses);
        item["security"] = security(needs(path));
        let entry = paths.entry(path.to_owned()).or_insert_with(|| json!({}));
        entry[method.as_str().to_ascii_lowercase()] = item;
    }
    json!({
        "openapi": "3.1.0",
        "info": {
            "title": "agentmux",
            "version": env!("CARGO_PKG_VERSION"),
            "description": "Carries the output of LLM agents to every client that watches it: typed messages over \
                            SSE and WebSocket, OpenAI chat completions, the AI SDK's UI message stream, AG-UI, \
                            Anthropic Messages and OpenAI Responses. See docs/http-api.md.",
        },
        "paths": paths,
        "components": {
            "schemas": generator.take_definitions(true),
            "securitySchemes": {
                "key": {"type": "http", "scheme": "bearer", "description": "An API key, or a stream's read or \
                        write token where the stream's endpoints take one (needed only when the service has keys)"},
                "x-api-key": {"type": "apiKey", "in": "header", "name": "x-api-key", "description": "An API key, \
                              as Anthropic's clients send it"},
                "token": {"type": "apiKey", "in": "query", "name": "token", "description": "A stream's read \
                          token, for a browser's EventSource, which cannot set headers"},
            },
        },
    })
}

/// `createStream`-like ids: the method and the path's words.
fn operation_id(method: &Method, path: &str) -> String {
    let mut id = method.as_str().to_ascii_lowercase();
    for word in path.split(['/', '-', '_', '.']).filter(|w| !w.is_empty() && *w != "v1") {
        let word = word.trim_start_matches('{').trim_end_matches('}');
        let mut chars = word.chars();
        if let Some(first) = chars.next() {
            id.push(first.to_ascii_uppercase());
            id.extend(chars);
        }
    }
    id
}

fn media(contents: &[Content], generator: &mut SchemaGenerator) -> Value {
    let mut media = Map::new();
    for content in contents {
        let (kind, schema) = match content {
            Content::Json(schema) => ("application/json", schema(generator).to_value()),
            Content::Foreign(what) => ("application/json", json!({"type": "object", "description": what})),
            Content::EventStream => ("text/event-stream", json!({"type": "string"})),
            Content::Text => ("text/plain", json!({"type": "string"})),
            Content::Html => ("text/html", json!({"type": "string"})),
        };
        media.insert(kind.into(), json!({"schema": schema}));
    }
    Value::Object(media)
}

/// What the auth guard asks of a route, as OpenAPI's alternatives (an empty one: nothing).
fn security(needs: Needs) -> Value {
    match needs {
        Needs::Nothing => json!([]),
        Needs::Stream(Access::Read) => json!([{"key": []}, {"x-api-key": []}, {"token": []}, {}]),
        Needs::Stream(Access::Write) | Needs::Any | Needs::Key => json!([{"key": []}, {"x-api-key": []}, {}]),
    }
}
