//! `POST /v1/chat/completions`: start the agent the model names, then answer as OpenAI does.
//!
//! The request is parsed leniently where OpenAI clients vary (unknown fields kept, content as a string or
//! parts, `content: null` beside tool calls) and strictly where it matters: a missing or wrong-typed field,
//! an unknown role, a tool message without `tool_call_id`, an empty `messages` and an unknown model are 4xx
//! errors whose `param` names the field. The run gets its own stream (`x-agentmux-stream-id`), so any other
//! client can watch it through the stream endpoints. With `stream: true` the response is the stream's SSE
//! rendition from the start (OpenAI chunks, or the typed messages with `accept=cui`); without, the handler
//! waits for the end and answers with one `chat.completion` (or, for CUI, the stream's snapshot). A client
//! that goes away does not stop the agent unless it sent `x-agentmux-on-disconnect: cancel`.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;

use super::sse::{self, OnDisconnect};
use super::{App, HttpError, body};
use crate::adapter::{OpenAiCompletion, ReasoningField};
use crate::conversation::{ChatRequest, Role};
use crate::hub::{Format, Stream};
use crate::output::EndStatus;

#[derive(Debug, Deserialize, Default)]
pub(crate) struct ChatQuery {
    accept: Option<String>,
}

/// Which rendering the client asked for, from the query or the headers.
struct Wants {
    cui: bool,
    reasoning: ReasoningField,
    cancel_on_disconnect: bool,
}

impl Wants {
    fn from(query: &ChatQuery, headers: &HeaderMap) -> Result<Self, HttpError> {
        let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).map(str::to_ascii_lowercase);
        let accept = query.accept.clone().or_else(|| header("x-agentmux-accept"));
        let cui = match accept.as_deref() {
            None | Some("openai" | "standard") => false,
            Some(a) if a == "cui" || a.starts_with("cui-") => true,
            Some(other) => {
                return Err(HttpError::bad_request(
                    format!("accept must be openai or cui, not {other:?}"),
                    Some("accept".into()),
                    "invalid_value",
                ));
            }
        };
        let reasoning =
            super::streams::parse_reasoning(header("x-agentmux-reasoning").as_deref(), "x-agentmux-reasoning")?;
        let cancel_on_disconnect = header("x-agentmux-on-disconnect").as_deref() == Some("cancel");
        Ok(Wants { cui, reasoning, cancel_on_disconnect })
    }
}

/// Parses and checks a chat request.
pub(crate) fn parse(bytes: &[u8]) -> Result<ChatRequest, HttpError> {
    let request: ChatRequest = body::json(bytes)?;
    if request.messages.is_empty() {
        return Err(HttpError::bad_request("messages must not be empty", Some("messages".into()), "invalid_value"));
    }
    for (index, message) in request.messages.iter().enumerate() {
        if message.role == Role::Tool && message.tool_call_id.is_none() {
            return Err(HttpError::bad_request(
                "a tool message needs the tool_call_id it answers",
                Some(format!("messages[{index}].tool_call_id")),
                "invalid_value",
            ));
        }
    }
    Ok(request)
}

pub(crate) async fn completions(
    State(app): State<App>,
    Query(query): Query<ChatQuery>,
    headers: HeaderMap,
    request: Body,
) -> Result<Response, HttpError> {
    let wants = Wants::from(&query, &headers)?;
    let bytes = body::read(request, app.settings.body_limit).await?;
    let mut request = parse(&bytes)?;
    if request.model.is_empty() {
        request.model.clone_from(&app.settings.default_model);
    }
    let streaming = request.stream;
    let include_usage = request.stream_options.is_some_and(|o| o.include_usage);
    let model = request.model.clone();
    let stream = app.agents.start(&app.hub, request)?;
    super::record_stream(stream.id());
    tracing::info!(model, streaming, "chat completion started");
    let on_disconnect = if wants.cancel_on_disconnect {
        let stream = Arc::clone(&stream);
        OnDisconnect::new(move || {
            if stream.cancel() {
                tracing::info!(stream = stream.id(), "client went away; cancelled as it asked");
            }
        })
    } else {
        OnDisconnect::none()
    };
    if streaming {
        let format = if wants.cui { Format::Cui } else { Format::OpenAi { include_usage, reasoning: wants.reasoning } };
        let subscription = stream.subscribe(format, 0)?;
        return Ok(sse::response(subscription, stream.id(), app.settings.keep_alive, on_disconnect));
    }
    // Dropped with this future if the client goes away while the agent runs.
    let mut guard = on_disconnect;
    let outcome = stream.ended().await;
    guard.disarm();
    let mut response = if wants.cui {
        axum::Json(stream.snapshot()).into_response()
    } else {
        complete(&stream, &outcome, wants.reasoning)
    };
    if let Ok(id) = HeaderValue::from_str(stream.id()) {
        response.headers_mut().insert("x-agentmux-stream-id", id);
    }
    Ok(response)
}

/// The non-streaming answer: one `chat.completion`, or the error the run ended with.
fn complete(stream: &Stream, outcome: &crate::output::Outcome, reasoning: ReasoningField) -> Response {
    let mut options = stream.openai_options().clone();
    options.reasoning = reasoning;
    let mut completion = OpenAiCompletion::new(options);
    stream.log().iter().for_each(|message| completion.push(message));
    match completion.finish(outcome) {
        Ok(body) => ([("content-type", "application/json")], body).into_response(),
        Err(error) => {
            let status = if outcome.status == EndStatus::Cancelled {
                StatusCode::CONFLICT
            } else {
                StatusCode::INTERNAL_SERVER_ERROR
            };
            HttpError { status, error, retry: false }.into_response()
        }
    }
}
