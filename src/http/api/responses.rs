//! `POST /v1/responses`: the OpenAI Responses API's request, answered as the API answers: with `stream: true`,
//! the run as Responses stream events; without, the response object once the run has ended.
//!
//! `instructions` and `input` become the one conversation every agent receives (`conversation/responses.rs`);
//! `model` names the agent (the default model when empty); `tools` (function tools) reach the agent in chat
//! completions' form, and the request's other fields as its options, as a chat completion's extra fields do.
//! With `store` (the default, as OpenAI's) the response is kept as a thread of its own named by its id
//! (`thread/kept.rs`): `previous_response_id` continues from a kept response (its conversation and output
//! come before the input), and an `item_reference` input item brings the output of the kept response that
//! made the item; `responses_kept.rs` reads and deletes kept responses. A reference to a response that is
//! not kept (made with `store: false`, deleted, expired, or never made) is a 400 naming the param. With
//! `x-agentmux-thread-id` the run is a turn on that thread instead, which keeps the conversation, and the
//! response is not kept apart. The run gets its own stream (`x-agentmux-stream-id`, `x-agentmux-read-token`),
//! so it can be watched in any other format. Without streaming, a run that failed or was cancelled is answered
//! `200` with the response's `status` `failed` (and its `error`) or `incomplete`, as the API reports a
//! response that did not complete.

use std::sync::Arc;

use axum::http::Method;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use serde::Deserialize;
use serde_json::{Map, Value};

use super::endpoint::Content::{EventStream, Foreign};
use super::endpoint::{Endpoint, endpoint, op};
use super::front_door::{FrontDoor, Threading, aggregate, chat_request, chat_tool};
use crate::adapter::{ResponsesAdapter, ResponsesOptions};
use crate::conversation::{
    ChatMessage, KeptItems, Role, ToolCall, item_references, response_of_item, responses_to_chat_with,
};
use crate::http::app::App;
use crate::http::edge::error::HttpError;
use crate::render::Format;

/// `POST /v1/responses` and the kept responses' endpoints, and what the OpenAPI document says of them.
pub(crate) fn endpoints() -> Vec<Endpoint> {
    let mut endpoints = vec![endpoint(
        Method::POST,
        "/v1/responses",
        post(create),
        op(
            "OpenAI Responses",
            "front doors",
            Some((Foreign("An OpenAI Responses request"), true)),
            vec![(
                200,
                "A response, or its stream events with stream: true",
                vec![Foreign("An OpenAI response"), EventStream],
            )],
        ),
    )];
    endpoints.extend(super::responses_kept::endpoints());
    endpoints
}

/// A Responses request: what agentmux reads of it; the rest goes to the agent as options.
#[derive(Debug, Deserialize)]
struct ResponsesRequest {
    #[serde(default)]
    model: String,
    input: Value,
    #[serde(default)]
    instructions: Option<String>,
    #[serde(default)]
    tools: Vec<Value>,
    #[serde(default)]
    stream: bool,
    #[serde(default)]
    previous_response_id: Option<String>,
    #[serde(default = "stored")]
    store: bool,
    #[serde(flatten)]
    extra: Map<String, Value>,
}

fn stored() -> bool {
    true
}

/// `POST /v1/responses`.
pub(crate) async fn create(mut door: FrontDoor) -> Result<Response, HttpError> {
    let ResponsesRequest { model, input, instructions, tools, stream: streaming, previous_response_id, store, extra } =
        door.json().await?;
    let model = door.model(model)?;
    let (client, owner) = door.asker();
    let named_thread = door.thread_header()?;
    if named_thread.is_some() && previous_response_id.is_some() {
        let message = "a turn on a thread (x-agentmux-thread-id) continues the thread, not a previous response";
        return Err(HttpError::bad_request(message, Some("previous_response_id".into()), "invalid_value"));
    }
    let app = door.app().clone();
    let continued = match &previous_response_id {
        Some(id) => previous(&app, id, owner.as_deref()).await?,
        None => Vec::new(),
    };
    let kept = referenced(&app, &input, owner.as_deref()).await?;
    let (messages, from) = responses_to_chat_with(instructions.as_deref(), &input, &kept)?;
    let input_messages: Vec<Arc<ChatMessage>> = messages.iter().cloned().map(Arc::new).collect();
    let whole: Vec<ChatMessage> = continued.iter().map(|m| ChatMessage::clone(m)).chain(messages).collect();
    let from: Vec<usize> = continued.iter().map(|_| 0).chain(from).collect();
    let functions =
        tools.iter().filter(|tool| tool.get("type").and_then(Value::as_str) == Some("function")).map(|tool| {
            let text = |key: &str| tool.get(key).and_then(Value::as_str);
            chat_tool(
                text("name").unwrap_or(""),
                text("description"),
                Some(tool.get("parameters").cloned().unwrap_or(Value::Null)),
            )
        });
    let request = chat_request(model.clone(), whole, streaming, extra, functions);
    let threading = named_thread.map_or(Threading::None, Threading::Named);
    let keep = store && matches!(threading, Threading::None);
    let run = door.launch(request, ("input", &from), threading).await?;
    if keep {
        let stream = run.stream();
        let id = ResponsesOptions::from(stream.info()).id;
        let asker = (client.as_deref(), owner.as_deref());
        if let Err(error) = app.threads.keep(asker, &id, (continued, input_messages), (&model, stream)).await {
            stream.cancel();
            return Err(error.into());
        }
    }
    run.respond(streaming, Format::Responses, |stream, outcome| {
        let mut adapter = ResponsesAdapter::new(ResponsesOptions::from(stream.info()));
        aggregate(&mut adapter, &stream.history(), outcome);
        Ok(axum::Json(adapter.response()).into_response())
    })
    .await
}

/// The conversation kept response `id` ended with (its own and its output), for a response that continues
/// it: a 400 naming `previous_response_id` when it is not kept, or still running.
async fn previous(app: &App, id: &str, owner: Option<&str>) -> Result<Vec<Arc<ChatMessage>>, HttpError> {
    let not_kept = || {
        let message = format!(
            "no response {id:?} is kept (made with store: false, deleted, expired, or never made): \
             send the whole conversation as input"
        );
        HttpError::bad_request(message, Some("previous_response_id".into()), "previous_response_not_found")
    };
    if !id.starts_with("resp_") {
        return Err(not_kept());
    }
    let kept = app.threads.kept(id, owner).await?.ok_or_else(not_kept)?;
    if kept.running.is_some() {
        let message = format!("the response {id:?} is still in progress: continue from it once it has ended");
        return Err(HttpError::bad_request(message, Some("previous_response_id".into()), "response_in_progress"));
    }
    Ok(kept.conversation)
}

/// What each of `input`'s `item_reference` items stands for, by item id: a 400 naming the item's `id` when
/// it names no kept response's item. A function call (`fc_…`) brings the calls its response handed to the
/// client; a message or reasoning (`msg_…`, `rs_…`) the rest of what it said (its text, and the tools the
/// agent ran itself), so that a client that sends the calls it ran as `function_call` items, as the AI SDK
/// does, and references the text, gives the agent each once.
async fn referenced(app: &App, input: &Value, owner: Option<&str>) -> Result<KeptItems, HttpError> {
    let mut kept = KeptItems::new();
    for (index, item) in item_references(input) {
        let unknown = || {
            let message = format!(
                "no kept response has an item {item:?} (it was made with store: false, deleted, expired, or never made)"
            );
            HttpError::bad_request(message, Some(format!("input[{index}].id")), "item_not_found")
        };
        if kept.contains_key(&item) {
            continue;
        }
        let response = response_of_item(&item).ok_or_else(unknown)?;
        let found = app.threads.kept(&response, owner).await?.ok_or_else(unknown)?;
        let (said, handed) = split_handed_over(&found.output);
        let part = if item.starts_with("fc_") { (format!("{response}/calls"), handed) } else { (response, said) };
        kept.insert(item, part);
    }
    Ok(kept)
}

/// A run's output as what it said (less the calls it handed to the client) and the calls it handed over
/// (those no tool result in the output answers), as chat messages.
fn split_handed_over(output: &[Arc<ChatMessage>]) -> (Vec<ChatMessage>, Vec<ChatMessage>) {
    let answered = |id: &str| output.iter().any(|m| m.tool_call_id.as_deref() == Some(id));
    let mut said = Vec::new();
    let mut handed = Vec::new();
    for message in output {
        let (ran, open): (Vec<ToolCall>, Vec<ToolCall>) =
            message.calls().iter().cloned().partition(|call| answered(&call.id));
        let text = message.content.as_ref().is_some_and(|c| !c.text().is_empty());
        if text || !ran.is_empty() || message.role != Role::Assistant {
            let tool_calls = (!ran.is_empty()).then_some(ran);
            said.push(ChatMessage { tool_calls, ..ChatMessage::clone(message) });
        }
        if !open.is_empty() {
            handed.push(ChatMessage { tool_calls: Some(open), content: None, ..ChatMessage::new(Role::Assistant, "") });
        }
    }
    (said, handed)
}
