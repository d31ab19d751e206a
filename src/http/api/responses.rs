//! `POST /v1/responses`: the OpenAI Responses API's request, answered as the API answers: with `stream: true`,
//! the run as Responses stream events; without, the response object once the run has ended.
//!
//! `instructions` and `input` become the one conversation every agent receives (`conversation/responses.rs`);
//! `model` names the agent (the default model when empty); `tools` (function tools) reach the agent in chat
//! completions' form, and the request's other fields as its options, as a chat completion's extra fields do.
//! agentmux keeps no responses to continue from: a `previous_response_id` is refused (`400`), and a client
//! sends the whole input, as with `store: false`. The run gets its own stream (`x-agentmux-stream-id`,
//! `x-agentmux-read-token`), so it can be watched in any other format. Without streaming, a run that failed or
//! was cancelled is answered `200` with the response's `status` `failed` (and its `error`) or `incomplete`, as
//! the API reports a response that did not complete.

use axum::http::Method;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use serde::Deserialize;
use serde_json::{Map, Value};

use super::endpoint::Content::{EventStream, Foreign};
use super::endpoint::{Endpoint, endpoint, op};
use super::front_door::{FrontDoor, Threading, aggregate, chat_request, chat_tool};
use crate::adapter::{ResponsesAdapter, ResponsesOptions};
use crate::conversation::responses_to_chat;
use crate::http::edge::error::HttpError;
use crate::render::Format;

/// `POST /v1/responses`, and what the OpenAPI document says of it.
pub(crate) fn endpoints() -> Vec<Endpoint> {
    vec![endpoint(
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
    )]
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
    #[serde(flatten)]
    extra: Map<String, Value>,
}

/// `POST /v1/responses`.
pub(crate) async fn create(mut door: FrontDoor) -> Result<Response, HttpError> {
    let ResponsesRequest { model, input, instructions, tools, stream: streaming, previous_response_id, extra } =
        door.json().await?;
    if previous_response_id.is_some() {
        let message = "agentmux keeps no responses to continue from: send the whole conversation as input";
        return Err(HttpError::bad_request(message, Some("previous_response_id".into()), "unsupported_value"));
    }
    let model = door.model(model)?;
    let (messages, from) = responses_to_chat(instructions.as_deref(), &input)?;
    let functions =
        tools.iter().filter(|tool| tool.get("type").and_then(Value::as_str) == Some("function")).map(|tool| {
            let text = |key: &str| tool.get(key).and_then(Value::as_str);
            chat_tool(
                text("name").unwrap_or(""),
                text("description"),
                Some(tool.get("parameters").cloned().unwrap_or(Value::Null)),
            )
        });
    let request = chat_request(model, messages, streaming, extra, functions);
    let threading = door.thread_header()?.map_or(Threading::None, Threading::Named);
    let run = door.launch(request, ("input", &from), threading).await?;
    run.respond(streaming, Format::Responses, |stream, outcome| {
        let mut adapter = ResponsesAdapter::new(ResponsesOptions::from(stream.info()));
        aggregate(&mut adapter, &stream.history(), outcome);
        Ok(axum::Json(adapter.response()).into_response())
    })
    .await
}
