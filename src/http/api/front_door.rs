//! [`FrontDoor`]: what the five front doors (`chat.rs`, `ui_chat.rs`, `ag_ui.rs`, `anthropic.rs`,
//! `responses.rs`) share: one prologue (refuse new work, read the body, parse it) and one epilogue (start
//! the run, answer with its stream or, without streaming, with what it came to). A door reads its own
//! request into the one conversation every agent receives, and answers in its own format; everything
//! around that is here, so a seventh protocol is one more door, not a copy of one.
//!
//! Every refusal is an [`HttpError`], so it leaves with the envelope and the code the door always gave.
//!
//! Once the run is started, the door yields before anything else, so the run's task (just spawned onto the
//! same worker) sends its upstream request first; the door's bookkeeping and its wait for the first
//! message then run while the upstream answers, not ahead of it.
//!
//! A run gets its own stream (`x-agentmux-stream-id`), so any other client can watch it through the stream
//! endpoints; its answer carries the stream's read token (`x-agentmux-read-token`) and names its thread
//! (`x-agentmux-thread-id`) when it has one: every answer once the stream exists, an error too (a run that
//! failed before it said anything, a failed or cancelled run answered whole) and a `409 thread_busy`, which
//! names the run in the way, through [`names`]. A client that goes away does not stop the run unless it sent
//! `x-agentmux-on-disconnect: cancel`.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::{HeaderMap, HeaderValue};
use axum::response::Response;
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

use crate::adapter::Adapter;
use crate::conversation::{ChatMessage, ChatRequest, Conversation, ConversationError};
use crate::http::app::App;
use crate::http::edge::auth::Access;
use crate::http::edge::body;
use crate::http::edge::error::HttpError;
use crate::http::edge::extract::{Client, KeyName};
use crate::http::edge::trace::record_stream;
use crate::http::transport::sse::{self, OnDisconnect};
use crate::hub::Stream;
use crate::output::{Outcome, OutputMessage, check_name};
use crate::render::Format;
use crate::thread::{ThreadError, Turn, check_id};

/// The header that names a server-side thread.
pub(crate) const THREAD_HEADER: &str = "x-agentmux-thread-id";

/// What the OpenAPI document says a streaming front door answers with.
pub(crate) const RUN: &str = "The run's stream from its start, in the front door's own format (see docs/http-api.md)";

/// A front door's request, taken as its handler's last extractor: refused with 503 `shutting_down` once the
/// service takes no new work, and otherwise holding who asks, the headers and the body, still unread (a
/// door may check its query first, so that a bad one fails before the body is read).
pub(crate) struct FrontDoor {
    app: App,
    /// The client whose budget the run spends.
    client: Option<String>,
    /// The key that owns the run's thread.
    owner: Option<String>,
    headers: HeaderMap,
    /// Taken by [`FrontDoor::json`].
    body: Option<Body>,
}

impl FromRequest<App> for FrontDoor {
    type Rejection = HttpError;

    async fn from_request(request: Request, app: &App) -> Result<Self, HttpError> {
        app.refuse_new_work()?;
        let (mut parts, body) = request.into_parts();
        let Ok(Client(client)) = Client::from_request_parts(&mut parts, app).await;
        let Ok(KeyName(owner)) = KeyName::from_request_parts(&mut parts, app).await;
        Ok(FrontDoor { app: app.clone(), client, owner, headers: parts.headers, body: Some(body) })
    }
}

impl FrontDoor {
    /// The request's headers.
    pub(crate) fn headers(&self) -> &HeaderMap {
        &self.headers
    }

    /// Who asks: the client whose budget the run spends, and the key (by name) that owns what it keeps.
    pub(crate) fn asker(&self) -> (Option<String>, Option<String>) {
        (self.client.clone(), self.owner.clone())
    }

    /// The app, for what a door reads of its settings.
    pub(crate) fn app(&self) -> &App {
        &self.app
    }

    /// The body, read within the service's limits and parsed as `T`, with errors that name the field.
    pub(crate) async fn json<T: DeserializeOwned>(&mut self) -> Result<T, HttpError> {
        let bytes = body::read(self.body.take().unwrap_or_default(), &self.app.settings).await?;
        body::json(&bytes)
    }

    /// The agent a request names: a name, or the default model when empty.
    pub(crate) fn model(&self, model: String) -> Result<String, HttpError> {
        check_name("model", &model)?;
        Ok(if model.is_empty() { self.app.settings.default_model.clone() } else { model })
    }

    /// The thread the header `x-agentmux-thread-id` names, if it names one.
    pub(crate) fn thread_header(&self) -> Result<Option<String>, HttpError> {
        let Some(value) = self.headers.get(THREAD_HEADER) else { return Ok(None) };
        let id = value.to_str().map_err(|_| invalid_thread(THREAD_HEADER))?;
        check_id(id).map_err(|_| invalid_thread(THREAD_HEADER))?;
        Ok(Some(id.to_owned()))
    }

    /// Starts the run of `request` (whose messages came from the request's `field` items, `from` saying
    /// which: errors name those), on its thread if it has one, as [`started`] says.
    pub(crate) async fn launch(
        self,
        request: ChatRequest,
        (field, from): (&str, &[usize]),
        threading: Threading,
    ) -> Result<Run, HttpError> {
        let FrontDoor { app, client, owner, headers, .. } = self;
        let model = request.model.clone();
        let named = |error: ConversationError, offset: usize| {
            let index = error.index.map(|i| i + offset);
            error.renumbered(index).naming_request_items(field, from)
        };
        let stream = match &threading {
            Threading::None => {
                let conversation = Conversation::from_request(request).map_err(|e| named(e, 0))?;
                app.agents.start(&app.hub, client.as_deref(), conversation)?
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
                app.threads.run(client.as_deref(), turn).await.map_err(|error| match error {
                    ThreadError::Invalid(error) => HttpError::from(named(error, offset)),
                    // The run in the way has a stream: named as its own answer was, so the client can watch it.
                    ThreadError::Busy { ref stream, .. } if !stream.is_empty() => {
                        let names = names(&app, stream, Some(thread));
                        with_names(error.into(), names)
                    }
                    other => other.into(),
                })?
            }
        };
        // The run's task goes first: it was just spawned onto this worker, and what is left here (counting,
        // naming and logging the run, making its answer) can be done while its upstream request is in flight
        // rather than before it is sent. Yielding leaves the run in the worker's next slot, where no later
        // spawn on this worker can push it back or let the other worker steal it.
        tokio::task::yield_now().await;
        // With several nodes, the stream's id goes out (its header) once Redis has the stream, so any node
        // finds it at once (one node finds it in its hub from the start).
        #[cfg(feature = "redis")]
        if app.cluster.is_some() {
            stream.readable(1).await;
        }
        // The access line names the route: the front door.
        tracing::info!(model, thread = threading.id(), "run started");
        let thread = threading.id().map(str::to_owned);
        let on_disconnect = started(&app, &model, &stream, &headers)
            .await
            .map_err(|error| with_names(error, names(&app, stream.id(), thread.as_deref())))?;
        Ok(Run { app, stream, thread, on_disconnect })
    }
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

/// A thread id that is not one, named by where it came from.
pub(crate) fn invalid_thread(param: &str) -> HttpError {
    HttpError::from(ThreadError::InvalidId).with_param(param)
}

/// What every front door does once its run started: counts and names it, and waits for its first message,
/// so an agent that fails before it says anything (an upstream that refused) is answered with the status its
/// error names, as the upstream would have answered, rather than with a stream holding only an error. The
/// wait ends when the message is appended, not committed ([`Stream::first_message`]): with the store, the
/// response and its subscription are made while the message commits, and the subscription sends it once
/// committed; only a run that ended is looked at once its end is committed. The
/// result cancels the run if the client goes away, when its request asked for that with
/// `x-agentmux-on-disconnect: cancel` (also while the first message is awaited).
async fn started(app: &App, model: &str, stream: &Arc<Stream>, headers: &HeaderMap) -> Result<OnDisconnect, HttpError> {
    record_stream(stream.id());
    app.metrics.stream_created();
    app.metrics.run(app.agents.label(model), stream);
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

/// A chat request for a front door's run, with `tools` (each as [`chat_tool`] makes it) among its options
/// when it has any.
pub(crate) fn chat_request(
    model: String,
    messages: Vec<ChatMessage>,
    stream: bool,
    mut extra: Map<String, Value>,
    tools: impl IntoIterator<Item = Value>,
) -> ChatRequest {
    offer_tools(&mut extra, tools);
    ChatRequest { model, messages, stream, stream_options: None, extra }
}

/// Adds `tools` to a request's options as `tools`, unless there are none.
pub(crate) fn offer_tools(extra: &mut Map<String, Value>, tools: impl IntoIterator<Item = Value>) {
    let tools: Vec<Value> = tools.into_iter().collect();
    if !tools.is_empty() {
        extra.insert("tools".into(), Value::Array(tools));
    }
}

/// A tool a front door's client offers: its name, what it does, and the schema of its input, which AG-UI
/// calls `parameters` and Anthropic `input_schema` (each door reads its own: [`OfferedTool::with_schema`]).
#[derive(Debug, Deserialize)]
pub(crate) struct OfferedTool {
    name: String,
    #[serde(default)]
    description: Option<String>,
    #[serde(default)]
    parameters: Option<Value>,
    #[serde(default)]
    input_schema: Option<Value>,
}

/// Which field of an [`OfferedTool`] holds its input's schema.
#[derive(Debug, Clone, Copy)]
pub(crate) enum SchemaField {
    /// `parameters` (AG-UI).
    Parameters,
    /// `input_schema` (Anthropic).
    InputSchema,
}

impl OfferedTool {
    /// The tool as [`chat_tool`] makes it, its input's schema read from `field` (the other is ignored).
    pub(crate) fn with_schema(self, field: SchemaField) -> Value {
        let schema = match field {
            SchemaField::Parameters => self.parameters,
            SchemaField::InputSchema => self.input_schema,
        };
        chat_tool(&self.name, self.description.as_deref(), schema)
    }
}

/// A tool a front door's client offers, as the chat completions request an agent receives names it; a tool
/// given no parameters takes none.
pub(crate) fn chat_tool(name: &str, description: Option<&str>, parameters: Option<Value>) -> Value {
    let parameters = parameters.unwrap_or_else(|| serde_json::json!({"type": "object", "properties": {}}));
    serde_json::json!({"type": "function", "function": {"name": name, "description": description, "parameters": parameters}})
}

/// Runs a stream's whole `history` and its `outcome` through `adapter`, for an answer made whole from it.
pub(crate) fn aggregate(adapter: &mut impl Adapter, history: &[OutputMessage], outcome: &Outcome) {
    let mut frames = Vec::new();
    history.iter().for_each(|message| adapter.push(message, &mut frames));
    adapter.finish(outcome, &mut frames);
}

/// A run a front door started (or, for a `useChat` resume, found running): what its answer is made from.
pub(crate) struct Run {
    app: App,
    stream: Arc<Stream>,
    thread: Option<String>,
    /// What cancels the run if the client goes away, when it asked for that.
    on_disconnect: OnDisconnect,
}

impl Run {
    /// A run already going on `thread`, which this request only watches.
    pub(crate) fn watched(app: App, stream: Arc<Stream>, thread: String) -> Run {
        Run { app, stream, thread: Some(thread), on_disconnect: OnDisconnect::none() }
    }

    /// The run's stream.
    pub(crate) fn stream(&self) -> &Arc<Stream> {
        &self.stream
    }

    /// The run's stream from its start in `format`, with its id, its read token and its thread: the
    /// streaming answer of every front door.
    pub(crate) fn answer(self, format: Format) -> Result<Response, HttpError> {
        let Run { app, stream, thread, on_disconnect } = self;
        let names = names(&app, stream.id(), thread.as_deref());
        let subscription = stream.subscribe(format, 0).map_err(|error| with_names(error.into(), names.clone()))?;
        let meter = app.metrics.subscriber(format.name(), "sse");
        let mut response =
            sse::response(subscription, stream.id(), app.settings.keep_alive, on_disconnect, false, meter);
        response.headers_mut().extend(names);
        Ok(response)
    }

    /// With `streaming`, the [`Run::answer`] in `format`; without, `whole`'s answer once the run has ended, named
    /// as a run's answer is (an `Err` from `whole` too: the run's failure, answered with its names). The client
    /// going away while the run goes on cancels it when it asked for that.
    pub(crate) async fn respond(
        self,
        streaming: bool,
        format: Format,
        whole: impl FnOnce(&Stream, &Outcome) -> Result<Response, HttpError>,
    ) -> Result<Response, HttpError> {
        if streaming {
            return self.answer(format);
        }
        let Run { app, stream, thread, on_disconnect } = self;
        // Dropped with the handler's future if the client goes away while the agent runs.
        let mut guard = on_disconnect;
        let outcome = stream.ended().await;
        guard.disarm();
        let names = names(&app, stream.id(), thread.as_deref());
        let mut response = whole(&stream, &outcome).map_err(|error| with_names(error, names.clone()))?;
        response.headers_mut().extend(names);
        Ok(response)
    }
}

/// The headers that name a run: its stream's id, the stream's read token (the caller may hand it to anyone
/// who should watch the run; never its write token: the caller did not create the stream, the service did),
/// and its thread when it has one, as the request named it.
fn names(app: &App, stream: &str, thread: Option<&str>) -> HeaderMap {
    let mut names = HeaderMap::new();
    if let Ok(id) = HeaderValue::from_str(stream) {
        names.insert("x-agentmux-stream-id", id);
    }
    let token = app.credentials.token(stream, Access::Read, 0);
    if let Ok(token) = HeaderValue::from_str(&token) {
        names.insert("x-agentmux-read-token", token);
    }
    if let Some(id) = thread.and_then(|t| HeaderValue::from_str(t).ok()) {
        names.insert(THREAD_HEADER, id);
    }
    names
}

/// `error`, answered with the run's `names`.
fn with_names(mut error: HttpError, names: HeaderMap) -> HttpError {
    error.headers.get_or_insert_default().extend(names);
    error
}
