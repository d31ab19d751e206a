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

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Map, Value};

use super::chat::{Threading, answer, chat_tool, label, launch, model_or_default, thread_header, until_ended};
use super::extract::{Client, KeyName};
use super::{App, HttpError, body};
use crate::adapter::{Adapter, AnthropicAdapter, AnthropicOptions, ApiError};
use crate::conversation::{AnthropicMessage, ChatRequest, anthropic_to_chat};
use crate::output::{EndStatus, ErrorProps};
use crate::render::Format;

/// A Messages request: what agentmux reads of it; the rest goes to the agent as options.
#[derive(Debug, Deserialize)]
struct MessagesRequest {
    #[serde(default)]
    model: String,
    messages: Vec<AnthropicMessage>,
    #[serde(default)]
    system: Option<Value>,
    #[serde(default)]
    tools: Vec<Tool>,
    #[serde(default)]
    stream: bool,
    #[serde(flatten)]
    extra: Map<String, Value>,
}

/// A tool the client offers.
#[derive(Debug, Deserialize)]
struct Tool {
    name: String,
    #[serde(default)]
    description: Option<String>,
    #[serde(default)]
    input_schema: Option<Value>,
}

/// `POST /v1/messages`.
pub(crate) async fn messages(
    State(app): State<App>,
    Client(client): Client,
    KeyName(owner): KeyName,
    headers: HeaderMap,
    request: Body,
) -> Result<Response, HttpError> {
    app.refuse_new_work()?;
    let bytes = body::read(request, &app.settings).await?;
    let MessagesRequest { model, messages, system, tools, stream: streaming, mut extra } = body::json(&bytes)?;
    if messages.is_empty() {
        return Err(HttpError::bad_request("messages must not be empty", Some("messages".into()), "invalid_value"));
    }
    let model = model_or_default(&app, model)?;
    let (messages, from) = anthropic_to_chat(system.as_ref(), &messages)?;
    if !tools.is_empty() {
        let tools = tools.into_iter().map(|t| chat_tool(&t.name, t.description.as_deref(), t.input_schema));
        extra.insert("tools".into(), tools.collect());
    }
    let request = ChatRequest { model, messages, stream: streaming, stream_options: None, extra };
    let threading = thread_header(&headers)?.map_or(Threading::None, Threading::Named);
    let items = ("messages", &from[..]);
    let (stream, on_disconnect) =
        launch(&app, (client.as_deref(), owner), &headers, request, items, &threading).await?;
    if streaming {
        return answer(&app, (&stream, threading.id()), Format::Anthropic, on_disconnect);
    }
    let outcome = until_ended(&stream, on_disconnect).await;
    let history = stream.history();
    let error_message = || history.iter().find(|m| m.kind == "error").and_then(|m| m.props_as::<ErrorProps>());
    let failure = ApiError::for_outcome(&outcome)
        .or_else(|| error_message().map(|error| ApiError::agent(&error.message, error.code.as_deref())));
    if let Some(error) = failure {
        let cancelled = outcome.status == EndStatus::Cancelled;
        let status = if cancelled { StatusCode::CONFLICT } else { StatusCode::INTERNAL_SERVER_ERROR };
        return Ok(HttpError { status, error, retry: false, retry_after: None }.into_response());
    }
    let mut adapter = AnthropicAdapter::aggregating(AnthropicOptions::from(stream.info()));
    let mut frames = Vec::new();
    history.iter().for_each(|message| adapter.push(message, &mut frames));
    adapter.finish(&outcome, &mut frames);
    let mut response = axum::Json(adapter.message()).into_response();
    label(&mut response, &app, (&stream, threading.id()));
    Ok(response)
}
