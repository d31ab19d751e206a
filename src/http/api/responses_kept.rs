//! The kept responses (`POST /v1/responses` with `store`, `thread/kept.rs`): `GET /v1/responses/{id}` (the
//! response object: while it runs, as it stands with status `in_progress`, and with `?stream=true` its
//! event stream from the start, as OpenAI streams a background response; once it ended, as it ended),
//! `DELETE /v1/responses/{id}` (forgets it) and `GET /v1/responses/{id}/input_items` (its own input, as
//! OpenAI lists it: `{"object": "list", "data", "first_id", "last_id", "has_more"}`, newest first unless
//! `order=asc`, `limit` items from after the item `after`). With keys, a response belongs to the key that
//! made it; another key, and an id no response has, get 404.
//!
//! A response that ended is shown again from what its thread kept, through the same adapter its stream
//! went through, so its items have the ids the stream gave them (reasoning is not kept, so a response that
//! reasoned shows its other items only).

use axum::Json;
use axum::extract::State;
use axum::http::{Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing;
use serde::Deserialize;
use serde_json::{Value, json};

use super::endpoint::Content::{EventStream, Foreign};
use super::endpoint::{Endpoint, endpoint, op};
use super::front_door::Run;
use crate::adapter::{Adapter, ResponsesAdapter, ResponsesOptions};
use crate::conversation::{ChatMessage, Role};
use crate::http::app::App;
use crate::http::edge::error::HttpError;
use crate::http::edge::extract::{KeyName, Params, ThreadId};
use crate::output::{Outcome, OutputMessage};
use crate::render::Format;
use crate::thread::KeptResponse;

/// The kept responses' endpoints, and what the OpenAPI document says of them.
pub(super) fn endpoints() -> Vec<Endpoint> {
    vec![
        endpoint(
            Method::GET,
            "/v1/responses/{id}",
            routing::get(get),
            op(
                "A kept response",
                "front doors",
                None,
                vec![(
                    200,
                    "The response object, or with stream=true the events of one still running",
                    vec![Foreign("An OpenAI response"), EventStream],
                )],
            ),
        ),
        endpoint(
            Method::DELETE,
            "/v1/responses/{id}",
            routing::delete(delete),
            op(
                "Forget a kept response",
                "front doors",
                None,
                vec![(200, "{id, object: response, deleted: true}", vec![Foreign("The deleted response")])],
            ),
        ),
        endpoint(
            Method::GET,
            "/v1/responses/{id}/input_items",
            routing::get(input_items),
            op(
                "A kept response's input items",
                "front doors",
                None,
                vec![(
                    200,
                    "{object: list, data, first_id, last_id, has_more}",
                    vec![Foreign("A list of input items")],
                )],
            ),
        ),
    ]
}

/// `GET /v1/responses/{id}`'s query.
#[derive(Debug, Deserialize, Default)]
struct GetQuery {
    #[serde(default)]
    stream: bool,
}

/// Response `id` as kept for `owner`, or 404.
async fn find(app: &App, id: &str, owner: Option<&str>) -> Result<KeptResponse, HttpError> {
    let kept = match id.starts_with("resp_") {
        true => app.threads.kept(id, owner).await?,
        false => None,
    };
    kept.ok_or_else(|| {
        let message = format!("no response {id:?} is kept");
        HttpError::new(StatusCode::NOT_FOUND, "invalid_request_error", message, None, "response_not_found")
    })
}

async fn get(
    State(app): State<App>,
    KeyName(owner): KeyName,
    ThreadId(id): ThreadId,
    Params(query): Params<GetQuery>,
) -> Result<Response, HttpError> {
    let kept = find(&app, &id, owner.as_deref()).await?;
    if let Some(stream) = kept.running {
        if query.stream {
            return Run::watched(app, stream, id).answer(Format::Responses);
        }
        let mut adapter = ResponsesAdapter::new(ResponsesOptions::from(stream.info()));
        let mut frames = Vec::new();
        stream.history().iter().for_each(|message| adapter.push(message, &mut frames));
        return Ok(Json(adapter.response()).into_response());
    }
    if query.stream {
        let message = format!("the response {id:?} has ended: its stream is no longer served; GET it without stream");
        return Err(HttpError::bad_request(message, Some("stream".into()), "invalid_value"));
    }
    let options = ResponsesOptions { id, created_at: kept.created_at, model: kept.model };
    let mut adapter = ResponsesAdapter::new(options);
    let mut frames = Vec::new();
    for (index, message) in kept.output.iter().enumerate() {
        for part in said(message, index) {
            adapter.push(&part, &mut frames);
        }
    }
    adapter.finish(&kept.outcome.unwrap_or_else(Outcome::completed), &mut frames);
    Ok(Json(adapter.response()).into_response())
}

/// What an assistant message of a run's output said, as the messages its stream carried: its text, then its
/// calls (a tool's result is not an output item).
fn said(message: &ChatMessage, index: usize) -> Vec<OutputMessage> {
    if message.role != Role::Assistant {
        return Vec::new();
    }
    let text = message.content.as_ref().map(|c| c.text()).unwrap_or_default();
    let text = (!text.is_empty()).then(|| OutputMessage::text(text).with_message_id(format!("kept{index}")));
    let calls = message.calls().iter().map(|call| {
        OutputMessage::tool_call(&call.id, call.name(), &call.function.arguments)
            .with_message_id(format!("kept{index}-{}", call.id))
    });
    text.into_iter().chain(calls).collect()
}

async fn delete(
    State(app): State<App>,
    KeyName(owner): KeyName,
    ThreadId(id): ThreadId,
) -> Result<Response, HttpError> {
    find(&app, &id, owner.as_deref()).await?;
    if !app.threads.delete(&id, owner.as_deref()).await? {
        find(&app, &id, owner.as_deref()).await?;
    }
    Ok(Json(json!({"id": id, "object": "response", "deleted": true})).into_response())
}

/// `GET /v1/responses/{id}/input_items`' query, as OpenAI's.
#[derive(Debug, Deserialize)]
struct ItemsQuery {
    #[serde(default = "twenty")]
    limit: usize,
    #[serde(default)]
    order: Order,
    #[serde(default)]
    after: Option<String>,
}

fn twenty() -> usize {
    20
}

#[derive(Debug, Deserialize, Default, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
enum Order {
    Asc,
    #[default]
    Desc,
}

async fn input_items(
    State(app): State<App>,
    KeyName(owner): KeyName,
    ThreadId(id): ThreadId,
    Params(query): Params<ItemsQuery>,
) -> Result<Response, HttpError> {
    if !(1..=100).contains(&query.limit) {
        let message = format!("limit must be from 1 to 100, not {}", query.limit);
        return Err(HttpError::bad_request(message, Some("limit".into()), "invalid_value"));
    }
    let kept = find(&app, &id, owner.as_deref()).await?;
    let mut items: Vec<Value> = kept.input.iter().flat_map(|(id, message)| input_item(id, message)).collect();
    if query.order == Order::Desc {
        items.reverse();
    }
    if let Some(after) = &query.after {
        let Some(at) = items.iter().position(|item| item["id"] == after.as_str()) else {
            let message = format!("the response {id:?} has no input item {after:?}");
            return Err(HttpError::bad_request(message, Some("after".into()), "invalid_value"));
        };
        items.drain(..=at);
    }
    let has_more = items.len() > query.limit;
    items.truncate(query.limit);
    let first_id = items.first().map(|item| item["id"].clone()).unwrap_or(Value::Null);
    let last_id = items.last().map(|item| item["id"].clone()).unwrap_or(Value::Null);
    let list = json!({"object": "list", "data": items, "first_id": first_id, "last_id": last_id, "has_more": has_more});
    Ok(Json(list).into_response())
}

/// A message of a response's input as the input items OpenAI lists, each named by its entry's id (`msg_…`;
/// a call of an assistant message by its call, `fc_…`; a tool's result, `fco_…`).
fn input_item(id: &str, message: &ChatMessage) -> Vec<Value> {
    let text = message.content.as_ref().map(|c| c.text()).unwrap_or_default();
    let id = id.replace('-', "");
    let role = match message.role {
        Role::Tool => {
            let call_id = message.tool_call_id.as_deref().unwrap_or("");
            return vec![
                json!({"id": format!("fco_{id}"), "type": "function_call_output", "call_id": call_id, "output": text, "status": "completed"}),
            ];
        }
        Role::User => "user",
        Role::System => "system",
        Role::Developer => "developer",
        Role::Assistant => "assistant",
    };
    let part = if message.role == Role::Assistant { "output_text" } else { "input_text" };
    let said = (!text.is_empty() || message.calls().is_empty()).then(|| {
        json!({"id": format!("msg_{id}"), "type": "message", "role": role, "status": "completed",
            "content": [{"type": part, "text": text}]})
    });
    let calls = message.calls().iter().map(|call| {
        json!({"id": format!("fc_{id}_{}", call.id), "type": "function_call", "call_id": call.id,
            "name": call.name(), "arguments": call.function.arguments, "status": "completed"})
    });
    said.into_iter().chain(calls).collect()
}
