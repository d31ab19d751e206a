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

use axum::body::Body;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Map, Value};

use super::chat::{Threading, answer, chat_tool, label, launch, model_or_default, thread_header, until_ended};
use super::extract::{Client, KeyName};
use super::{App, HttpError, body};
use crate::adapter::{Adapter, ResponsesAdapter, ResponsesOptions};
use crate::conversation::{ChatRequest, responses_to_chat};
use crate::render::Format;

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
pub(crate) async fn create(
    State(app): State<App>,
    Client(client): Client,
    KeyName(owner): KeyName,
    headers: HeaderMap,
    request: Body,
) -> Result<Response, HttpError> {
    app.refuse_new_work()?;
    let bytes = body::read(request, &app.settings).await?;
    let ResponsesRequest { model, input, instructions, tools, stream: streaming, previous_response_id, mut extra } =
        body::json(&bytes)?;
    if previous_response_id.is_some() {
        let message = "agentmux keeps no responses to continue from: send the whole conversation as input";
        return Err(HttpError::bad_request(message, Some("previous_response_id".into()), "unsupported_value"));
    }
    let model = model_or_default(&app, model)?;
    let (messages, from) = responses_to_chat(instructions.as_deref(), &input)?;
    let functions: Vec<Value> = tools
        .iter()
        .filter(|tool| tool.get("type").and_then(Value::as_str) == Some("function"))
        .map(|tool| {
            let text = |key: &str| tool.get(key).and_then(Value::as_str);
            chat_tool(
                text("name").unwrap_or(""),
                text("description"),
                Some(tool.get("parameters").cloned().unwrap_or(Value::Null)),
            )
        })
        .collect();
    if !functions.is_empty() {
        extra.insert("tools".into(), Value::Array(functions));
    }
    let request = ChatRequest { model, messages, stream: streaming, stream_options: None, extra };
    let threading = thread_header(&headers)?.map_or(Threading::None, Threading::Named);
    let items = ("input", &from[..]);
    let (stream, on_disconnect) =
        launch(&app, (client.as_deref(), owner), &headers, request, items, &threading).await?;
    if streaming {
        return answer(&app, (&stream, threading.id()), Format::Responses, on_disconnect);
    }
    let outcome = until_ended(&stream, on_disconnect).await;
    let mut adapter = ResponsesAdapter::new(ResponsesOptions::from(stream.info()));
    let mut frames = Vec::new();
    stream.history().iter().for_each(|message| adapter.push(message, &mut frames));
    adapter.finish(&outcome, &mut frames);
    let mut response = axum::Json(adapter.response()).into_response();
    label(&mut response, &app, (&stream, threading.id()));
    Ok(response)
}
