//! `POST /v1/chat/completions`: start the agent the model names, then answer as OpenAI does.
//!
//! The request is parsed leniently where OpenAI clients vary (unknown fields kept, content as a string or
//! parts, `content: null` beside tool calls) and strictly where it matters: a missing or wrong-typed field,
//! an unknown role, a tool message without `tool_call_id`, an empty `messages`, a `model` over
//! [`crate::output::NAME_BYTES`] and an unknown model are 4xx errors whose `param` names the field. The run gets its own stream (`x-agentmux-stream-id`), so any other
//! client can watch it through the stream endpoints. With `stream: true` the response is the stream's SSE
//! rendition from the start (OpenAI chunks, or the typed messages with `accept=cui`); without, the handler
//! waits for the end and answers with one `chat.completion` (or, for CUI, the stream's snapshot). A client
//! that goes away does not stop the agent unless it sent `x-agentmux-on-disconnect: cancel`.

use axum::extract::State;
use axum::http::{Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::Deserialize;
use serde_json::{Value, json};

use super::endpoint::Content::{EventStream, Foreign, Json};
use super::endpoint::{Endpoint, SchemaOf, endpoint, op};
use super::format;
use super::front_door::{FrontDoor, THREAD_HEADER, Threading, invalid_thread};
use crate::adapter::{OpenAiCompletion, OpenAiOptions, ReasoningField};
use crate::conversation::ChatRequest;
use crate::http::app::App;
use crate::http::edge::error::HttpError;
use crate::http::edge::extract::Params;
use crate::hub::Stream;
use crate::output::{EndStatus, check_name};
use crate::render::Format;
use crate::thread::check_id;

/// `GET /v1/models` and `POST /v1/chat/completions`, and what the OpenAPI document says of them.
pub(crate) fn endpoints() -> Vec<Endpoint> {
    let chat_request: SchemaOf = |g| g.subschema_for::<crate::conversation::ChatRequest>();
    vec![
        endpoint(
            Method::GET,
            "/v1/models",
            get(models),
            op(
                "The agents, as OpenAI models",
                "chat",
                None,
                vec![(200, "OpenAI's model list", vec![Foreign("OpenAI model list")])],
            ),
        ),
        endpoint(
            Method::POST,
            "/v1/chat/completions",
            post(completions),
            op(
                "Run the agent a model names, answered as OpenAI does",
                "chat",
                Some((Json(chat_request), true)),
                vec![(
                    200,
                    "A chat.completion, or its chunks as SSE with stream: true (or CUI messages with accept=cui)",
                    vec![Foreign("chat.completion (stream: false)"), EventStream],
                )],
            ),
        ),
    ]
}

#[derive(Debug, Deserialize, Default)]
pub(crate) struct ChatQuery {
    accept: Option<String>,
}

/// Checks a chat request.
fn parse(request: ChatRequest) -> Result<ChatRequest, HttpError> {
    // Before the agent is looked up: an unknown model's error names it, and a name is bounded.
    check_name("model", &request.model)?;
    if request.messages.is_empty() {
        return Err(HttpError::bad_request("messages must not be empty", Some("messages".into()), "invalid_value"));
    }
    Ok(request)
}

/// The thread a request names: the header `x-agentmux-thread-id`, or `metadata.thread_id`; both must agree.
fn thread_of(door: &FrontDoor, request: &ChatRequest) -> Result<Option<String>, HttpError> {
    let header = door.thread_header()?;
    let metadata = match request.extra.get("metadata").and_then(|m| m.get("thread_id")) {
        None | Some(Value::Null) => None,
        Some(Value::String(id)) => Some(id.clone()),
        Some(_) => return Err(invalid_thread("metadata.thread_id")),
    };
    if let Some(id) = &metadata {
        check_id(id).map_err(|_| invalid_thread("metadata.thread_id"))?;
    }
    match (header, metadata) {
        (Some(header), Some(metadata)) if header != metadata => Err(HttpError::bad_request(
            format!("the header {THREAD_HEADER} names {header:?} and metadata.thread_id {metadata:?}"),
            Some("metadata.thread_id".into()),
            "invalid_value",
        )),
        (header, metadata) => Ok(header.or(metadata)),
    }
}

/// `POST /v1/chat/completions`.
pub(crate) async fn completions(Params(query): Params<ChatQuery>, mut door: FrontDoor) -> Result<Response, HttpError> {
    // Checked before the body is read, so a bad query fails fast.
    format::chat(query.accept.as_deref(), door.headers(), false)?;
    let mut request = parse(door.json().await?)?;
    if request.model.is_empty() {
        request.model.clone_from(&door.app().settings.default_model);
    }
    let streaming = request.stream;
    let include_usage = request.stream_options.is_some_and(|o| o.include_usage);
    let format = format::chat(query.accept.as_deref(), door.headers(), include_usage)?;
    let threading = thread_of(&door, &request)?.map_or(Threading::None, Threading::Named);
    // Errors name the request's messages as they are.
    let run = door.launch(request, ("messages", &[]), threading).await?;
    run.respond(streaming, format, |stream, outcome| {
        Ok(match format {
            Format::OpenAi { reasoning, .. } => complete(stream, outcome, reasoning),
            // A chat answers in OpenAI's format or CUI's (`format::chat`); the others have their own endpoints.
            Format::Cui | Format::UiMessage | Format::AgUi | Format::Anthropic | Format::Responses => {
                axum::Json(stream.snapshot()).into_response()
            }
        })
    })
    .await
}

/// `GET /v1/models`: the agents, in OpenAI's list format.
pub(crate) async fn models(State(app): State<App>) -> Response {
    let data: Vec<Value> = app
        .agents
        .names()
        .into_iter()
        .map(|name| json!({ "id": name, "object": "model", "created": 0, "owned_by": "agentmux" }))
        .collect();
    axum::Json(json!({ "object": "list", "data": data })).into_response()
}

/// The non-streaming answer: one `chat.completion`, or the error the run ended with.
fn complete(stream: &Stream, outcome: &crate::output::Outcome, reasoning: ReasoningField) -> Response {
    let mut options = OpenAiOptions::from(stream.info());
    options.reasoning = reasoning;
    let mut completion = OpenAiCompletion::new(options);
    stream.history().iter().for_each(|message| completion.push(message));
    match completion.finish(outcome) {
        Ok(body) => ([("content-type", "application/json")], body).into_response(),
        Err(error) => {
            let status = if outcome.status == EndStatus::Cancelled {
                StatusCode::CONFLICT
            } else {
                StatusCode::INTERNAL_SERVER_ERROR
            };
            HttpError::ended_run(status, error).into_response()
        }
    }
}
