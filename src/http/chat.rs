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

use std::sync::Arc;

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::Value;

use super::auth::Access;
use super::extract::{Client, KeyName, Params};
use super::sse::{self, OnDisconnect};
use super::{App, HttpError, body, format};
use crate::adapter::{OpenAiCompletion, OpenAiOptions, ReasoningField};
use crate::conversation::{ChatRequest, Conversation, ConversationError};
use crate::hub::Stream;
use crate::output::{EndStatus, check_name};
use crate::render::Format;
use crate::thread::{ThreadError, Turn, check_id};

/// The header that names a server-side thread.
const THREAD_HEADER: &str = "x-agentmux-thread-id";

#[derive(Debug, Deserialize, Default)]
pub(crate) struct ChatQuery {
    accept: Option<String>,
}

/// Parses and checks a chat request.
pub(crate) fn parse(bytes: &[u8]) -> Result<ChatRequest, HttpError> {
    let request: ChatRequest = body::json(bytes)?;
    // Before the agent is looked up: an unknown model's error names it, and a name is bounded.
    check_name("model", &request.model)?;
    if request.messages.is_empty() {
        return Err(HttpError::bad_request("messages must not be empty", Some("messages".into()), "invalid_value"));
    }
    Ok(request)
}

/// The thread a request names: the header `x-agentmux-thread-id`, or `metadata.thread_id`; both must agree.
fn thread_of(headers: &HeaderMap, request: &ChatRequest) -> Result<Option<String>, HttpError> {
    let header = thread_header(headers)?;
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

/// The thread the header `x-agentmux-thread-id` names, if it names one.
pub(crate) fn thread_header(headers: &HeaderMap) -> Result<Option<String>, HttpError> {
    let Some(value) = headers.get(THREAD_HEADER) else { return Ok(None) };
    let id = value.to_str().map_err(|_| invalid_thread(THREAD_HEADER))?;
    check_id(id).map_err(|_| invalid_thread(THREAD_HEADER))?;
    Ok(Some(id.to_owned()))
}

/// A thread id that is not one, named by where it came from.
pub(crate) fn invalid_thread(param: &str) -> HttpError {
    HttpError::from(ThreadError::InvalidId).with_param(param)
}

/// What every front door does once its run started: counts and names it, and waits for its first message,
/// so an agent that fails before it says anything (an upstream that refused) is answered with the status its
/// error names, as the upstream would have answered, rather than with a stream holding only an error. The
/// result cancels the run if the client goes away, when its request asked for that with
/// `x-agentmux-on-disconnect: cancel` (also while the first message is awaited).
async fn started(app: &App, model: &str, stream: &Arc<Stream>, headers: &HeaderMap) -> Result<OnDisconnect, HttpError> {
    super::record_stream(stream.id());
    app.metrics.stream_created();
    app.metrics.run(model, Arc::clone(stream));
    let cancel_on_disconnect = headers
        .get("x-agentmux-on-disconnect")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("cancel"));
    let on_disconnect = if cancel_on_disconnect {
        let stream = Arc::clone(stream);
        OnDisconnect::new(move || {
            if stream.cancel() {
                tracing::info!(stream = stream.id(), "client went away; cancelled as it asked");
            }
        })
    } else {
        OnDisconnect::none()
    };
    match stream.first_message().await {
        Some(failed) => Err(HttpError::failed_run(&failed)),
        None => Ok(on_disconnect),
    }
}

pub(crate) async fn completions(
    State(app): State<App>,
    Params(query): Params<ChatQuery>,
    Client(client): Client,
    KeyName(owner): KeyName,
    headers: HeaderMap,
    request: Body,
) -> Result<Response, HttpError> {
    app.refuse_new_work()?;
    // Checked before the body is read, so a bad query fails fast.
    format::chat(query.accept.as_deref(), &headers, false)?;
    let bytes = body::read(request, &app.settings).await?;
    let mut request = parse(&bytes)?;
    if request.model.is_empty() {
        request.model.clone_from(&app.settings.default_model);
    }
    let streaming = request.stream;
    let include_usage = request.stream_options.is_some_and(|o| o.include_usage);
    let format = format::chat(query.accept.as_deref(), &headers, include_usage)?;
    let threading = thread_of(&headers, &request)?.map_or(Threading::None, Threading::Named);
    // Errors name the request's messages as they are.
    let items = ("messages", &[][..]);
    let (stream, on_disconnect) =
        launch(&app, (client.as_deref(), owner), &headers, request, items, &threading).await?;
    let thread = threading.id();
    if streaming {
        return answer(&app, (&stream, thread), format, on_disconnect);
    }
    let outcome = until_ended(&stream, on_disconnect).await;
    let mut response = match format {
        Format::OpenAi { reasoning, .. } => complete(&stream, &outcome, reasoning),
        // A chat answers in OpenAI's format or CUI's (`format::chat`); the others have their own endpoints.
        Format::Cui | Format::UiMessage | Format::AgUi | Format::Anthropic | Format::Responses => {
            axum::Json(stream.snapshot()).into_response()
        }
    };
    label(&mut response, &app, (&stream, thread));
    Ok(response)
}

/// A run's stream from its start in `format`, with its id, its read token and its thread: the streaming
/// answer of every front door.
pub(crate) fn answer(
    app: &App,
    (stream, thread): (&Arc<Stream>, Option<&str>),
    format: Format,
    on_disconnect: OnDisconnect,
) -> Result<Response, HttpError> {
    let subscription = stream.subscribe(format, 0)?;
    let counted = app.metrics.subscriber(format.name(), "sse");
    // The SSE response names the stream itself.
    let mut response =
        sse::response(subscription, stream.id(), app.settings.keep_alive, on_disconnect, false, counted, &app.feeds);
    hand_read_token(&mut response, app, stream);
    name_thread(&mut response, thread);
    Ok(response)
}

/// The agent a front door's request names: a name, or the default model when empty.
pub(crate) fn model_or_default(app: &App, model: String) -> Result<String, HttpError> {
    check_name("model", &model)?;
    Ok(if model.is_empty() { app.settings.default_model.clone() } else { model })
}

/// How a front door's run goes with a server-side thread.
#[derive(Debug, Clone)]
pub(crate) enum Threading {
    /// None: the request's messages are the whole conversation.
    None,
    /// The thread `x-agentmux-thread-id` names; the request's messages are what the client adds to it.
    Named(String),
    /// The thread the client's own id names (an AG-UI `threadId`, a `useChat` chat `id`); the client sends
    /// its whole history every time ([`Turn::resent`]).
    Resent(String),
}

impl Threading {
    /// The thread, if there is one.
    pub(crate) fn id(&self) -> Option<&str> {
        match self {
            Threading::None => None,
            Threading::Named(id) | Threading::Resent(id) => Some(id),
        }
    }
}

/// Starts a front door's run on `request` (whose messages came from the request's `field` items, `from` saying
/// which: errors name those), on its thread if it has one, as [`started`] says: its stream, and what cancels
/// it if the client goes away.
pub(crate) async fn launch(
    app: &App,
    (client, owner): (Option<&str>, Option<String>),
    headers: &HeaderMap,
    request: ChatRequest,
    (field, from): (&str, &[usize]),
    threading: &Threading,
) -> Result<(Arc<Stream>, OnDisconnect), HttpError> {
    let model = request.model.clone();
    let named = |error: ConversationError, offset: usize| {
        let index = error.index.map(|i| i + offset);
        error.renumbered(index).naming_request_items(field, from)
    };
    let stream = match threading {
        Threading::None => {
            let conversation = Conversation::from_request(request).map_err(|e| named(e, 0))?;
            app.agents.start(&app.hub, client, conversation)?
        }
        Threading::Named(thread) | Threading::Resent(thread) => {
            let ChatRequest { model, messages, extra, .. } = request;
            let mut turn = match threading {
                Threading::Resent(_) => Turn::resent(thread.clone(), model, messages, owner),
                _ => Turn { thread: thread.clone(), model, input: messages, owner, ..Turn::default() },
            };
            turn.options = extra;
            // Errors name the input's messages: after what the client sent before it.
            let offset = turn.history.as_ref().map_or(0, Vec::len);
            app.threads.run(client, turn).await.map_err(|error| match error {
                ThreadError::Invalid(error) => HttpError::from(named(error, offset)),
                other => other.into(),
            })?
        }
    };
    // With several nodes, the stream's id goes out (its header) once Redis has the stream, so any node
    // finds it at once (one node finds it in its hub from the start).
    if app.cluster.is_some() {
        stream.readable(1).await;
    }
    // The access line names the route: the front door.
    tracing::info!(model, thread = threading.id(), "run started");
    let on_disconnect = started(app, &model, &stream, headers).await?;
    Ok((stream, on_disconnect))
}

/// A tool a front door's client offers, as the chat completions request an agent receives names it; a tool
/// given no parameters takes none.
pub(crate) fn chat_tool(name: &str, description: Option<&str>, parameters: Option<Value>) -> Value {
    let parameters = parameters.unwrap_or_else(|| serde_json::json!({"type": "object", "properties": {}}));
    serde_json::json!({"type": "function", "function": {"name": name, "description": description, "parameters": parameters}})
}

/// Waits for a run answered whole to end; the client going away meanwhile cancels it when it asked for that.
pub(crate) async fn until_ended(stream: &Stream, on_disconnect: OnDisconnect) -> crate::output::Outcome {
    // Dropped with the caller's future if the client goes away while the agent runs.
    let mut guard = on_disconnect;
    let outcome = stream.ended().await;
    guard.disarm();
    outcome
}

/// A run's answer names its stream and its thread, and carries its read token.
pub(crate) fn label(response: &mut Response, app: &App, (stream, thread): (&Stream, Option<&str>)) {
    if let Ok(id) = HeaderValue::from_str(stream.id()) {
        response.headers_mut().insert("x-agentmux-stream-id", id);
    }
    hand_read_token(response, app, stream);
    name_thread(response, thread);
}

/// The run's read token in `x-agentmux-read-token`, beside its id: the caller may hand it to anyone who
/// should watch the run. Never its write token: the caller did not create the stream, the service did.
fn hand_read_token(response: &mut Response, app: &App, stream: &Stream) {
    let token = app.credentials.token(stream.id(), Access::Read, 0);
    if let Ok(token) = HeaderValue::from_str(&token) {
        response.headers_mut().insert("x-agentmux-read-token", token);
    }
}

/// Names the thread in the response, as the request did.
fn name_thread(response: &mut Response, thread: Option<&str>) {
    if let Some(id) = thread.and_then(|t| HeaderValue::from_str(t).ok()) {
        response.headers_mut().insert(THREAD_HEADER, id);
    }
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
            HttpError { status, error, retry: false, retry_after: None }.into_response()
        }
    }
}
