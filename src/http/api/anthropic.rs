//! `POST /v1/messages`: the Anthropic Messages API's request (any `anthropic-version`, the key as `x-api-key`
//! or a bearer), answered as Anthropic answers: with `stream: true`, the run as Anthropic stream events;
//! without, one `message` once the run has ended.
//!
//! The request's `system` and `messages` become the one conversation every agent receives
//! (`conversation/anthropic.rs`); `model` names the agent (the default model when empty); the request's
//! `tools` reach the agent in OpenAI's form, and its other fields (`max_tokens`, `temperature`, …) as the
//! request's options, as a chat completion's extra fields do. The run gets its own stream
//! (`x-agentmux-stream-id`, `x-agentmux-read-token`), so it can be watched in any other format. A run that
//! failed, or sent an `error` message, is a `500` (`agent_error`) without streaming, and one that was
//! cancelled a `409`, as for a chat completion.

use axum::http::{Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use serde::Deserialize;
use serde_json::{Map, Value};

use super::endpoint::Content::{EventStream, Foreign};
use super::endpoint::{Endpoint, endpoint, op};
use super::front_door::{FrontDoor, OfferedTool, SchemaField, Threading, aggregate, chat_request};
use crate::adapter::{AnthropicAdapter, AnthropicOptions, ApiError};
use crate::conversation::{AnthropicMessage, anthropic_to_chat};
use crate::http::edge::error::HttpError;
use crate::http::edge::shape::ErrorShape;
use crate::output::{EndStatus, ErrorProps};
use crate::render::Format;

/// `POST /v1/messages`, and what the OpenAPI document says of it.
pub(crate) fn endpoints() -> Vec<Endpoint> {
    vec![
        endpoint(
            Method::POST,
            "/v1/messages",
            post(messages),
            op(
                "Anthropic Messages",
                "front doors",
                Some((Foreign("An Anthropic Messages request"), true)),
                vec![(
                    200,
                    "A message, or its stream events with stream: true",
                    vec![Foreign("An Anthropic message"), EventStream],
                )],
            ),
        )
        .with_errors(ErrorShape::Anthropic),
    ]
}

/// A Messages request: what agentmux reads of it; the rest goes to the agent as options.
#[derive(Debug, Deserialize)]
struct MessagesRequest {
    #[serde(default)]
    model: String,
    messages: Vec<AnthropicMessage>,
    #[serde(default)]
    system: Option<Value>,
    #[serde(default)]
    tools: Vec<OfferedTool>,
    #[serde(default)]
    stream: bool,
    #[serde(flatten)]
    extra: Map<String, Value>,
}

/// `POST /v1/messages`.
pub(crate) async fn messages(mut door: FrontDoor) -> Result<Response, HttpError> {
    let MessagesRequest { model, messages, system, tools, stream: streaming, extra } = door.json().await?;
    if messages.is_empty() {
        return Err(HttpError::bad_request("messages must not be empty", Some("messages".into()), "invalid_value"));
    }
    let model = door.model(model)?;
    let (messages, from) = anthropic_to_chat(system.as_ref(), &messages)?;
    let tools = tools.into_iter().map(|tool| tool.with_schema(SchemaField::InputSchema));
    let request = chat_request(model, messages, streaming, extra, tools);
    let threading = door.thread_header()?.map_or(Threading::None, Threading::Named);
    let run = door.launch(request, ("messages", &from), threading).await?;
    run.respond(streaming, Format::Anthropic, |stream, outcome| {
        let history = stream.history();
        let error_message = || history.iter().find(|m| m.kind == "error").and_then(|m| m.props_as::<ErrorProps>());
        let failure = ApiError::for_outcome(outcome)
            .or_else(|| error_message().map(|error| ApiError::agent(&error.message, error.code.as_deref())));
        if let Some(error) = failure {
            let cancelled = outcome.status == EndStatus::Cancelled;
            let status = if cancelled { StatusCode::CONFLICT } else { StatusCode::INTERNAL_SERVER_ERROR };
            return Err(HttpError::ended_run(status, error));
        }
        let mut adapter = AnthropicAdapter::aggregating(AnthropicOptions::from(stream.info()));
        aggregate(&mut adapter, &history, outcome);
        Ok(axum::Json(adapter.message()).into_response())
    })
    .await
}
