//! The HTTP service: the hub and the agents on the network, as `docs/http-api.md` describes.
//!
//! - this file: [`App`] (what every handler shares), [`Settings`] and [`router`];
//! - `server.rs`: [`serve`]: connections (the cap, the socket each holds), and the shutdown in phases;
//! - `event_connection.rs`: a connection whose first request is a GET of an event stream, served without
//!   hyper (so a waiting subscriber holds none of hyper's buffers); every other connection goes to hyper;
//! - `edge.rs`: what every request meets first (head limits, the declared body size) and every error
//!   response last (the envelope on whatever axum answered by itself);
//! - `extract.rs`: the path, query and WebSocket-upgrade extractors, refusing with the envelope;
//! - `error.rs`: [`HttpError`], the one mapping from errors to statuses and OpenAI error envelopes;
//! - `body.rs`: body limits and JSON errors that name the field;
//! - `format.rs`: which format a query, a WebSocket op or a chat request's headers ask for;
//! - `chat.rs`: `POST /v1/chat/completions`; `ui_chat.rs`: the AI SDK's `useChat` endpoints; `ag_ui.rs`:
//!   `POST /v1/ag-ui`; `anthropic.rs`: `POST /v1/messages`; `responses.rs`: `POST /v1/responses`;
//! - `streams.rs`: the stream endpoints and `GET /v1/models`;
//! - `threads.rs`: the thread endpoints (`/v1/threads`, their audit log and replay);
//! - `auth.rs`: API keys and stream tokens (who may do what);
//! - `browser.rs`: CORS, and what a page from another origin may not do;
//! - `sse.rs` and `ws.rs`: the SSE and WebSocket transports, both writing a batch of frames at a time.

mod ag_ui;
mod anthropic;
mod auth;
mod body;
mod browser;
mod chat;
mod edge;
mod error;
mod event_connection;
mod extract;
mod feed;
mod format;
mod forward;
mod metrics;
mod openapi;
mod repoll;
mod responses;
mod server;
mod socket;
mod sse;
mod streams;
mod threads;
mod ui;
mod ui_chat;
mod watched;
mod ws;

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::{MatchedPath, Request, State};
use axum::http::Method;
use axum::middleware::{self, Next};
use axum::response::IntoResponse;
use axum::response::Response;
use axum::routing::{MethodRouter, delete, get, post};
use tracing::Instrument;

pub use auth::{Access, Credentials, KeyError, KeySpec, budgets, check_key};
pub use browser::Origins;
pub use error::{HttpError, Room};
pub use metrics::Metrics;
pub use server::{runtime, serve};

use crate::agent::Agents;
use crate::hub::Hub;
use crate::store::Store;
use crate::thread::{MemoryThreadStorage, ThreadConfig, ThreadStorage, Threads};
use openapi::Operation;
use schemars::Schema;
use server::Lifetime;

/// Transport settings.
#[derive(Debug, Clone)]
pub struct Settings {
    /// A `: ping` after this long without an event (15 s).
    pub keep_alive: Duration,
    /// The largest request body (8 MiB); a declared `Content-Length` over it is refused at once.
    pub body_limit: usize,
    /// How long a request body may take to arrive (30 s).
    pub body_timeout: Duration,
    /// The most connections served at once (4,096 here; the binary sizes it from its open-file limit). One
    /// past it is answered 503 `capacity` and closed, while the others keep being served.
    pub max_connections: usize,
    /// The largest WebSocket message or frame from a client (1 MiB).
    pub ws_max_message: usize,
    /// On shutdown, how long open streams get to finish before they are ended with an error (10 s).
    pub shutdown_grace: Duration,
    /// On shutdown, after the grace, how long connections get to send what they still owe before they are
    /// dropped (5 s).
    pub shutdown_drain: Duration,
    /// The model a chat request without one gets (`demo`).
    pub default_model: String,
    /// The limits of server-side threads.
    pub threads: ThreadConfig,
    /// The API keys (none: no credential is needed; see `auth.rs`).
    pub api_keys: Vec<KeySpec>,
    /// The origins whose pages may use the service from a browser (see `browser.rs`).
    pub cors_origins: Origins,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            keep_alive: Duration::from_secs(15),
            body_limit: 8 << 20,
            body_timeout: Duration::from_secs(30),
            max_connections: 4096,
            ws_max_message: 1 << 20,
            shutdown_grace: Duration::from_secs(10),
            shutdown_drain: Duration::from_secs(5),
            default_model: "demo".into(),
            threads: ThreadConfig::default(),
            api_keys: Vec::new(),
            cors_origins: Origins::default(),
        }
    }
}

/// What every handler shares; cheap to clone.
#[derive(Debug, Clone)]
pub struct App {
    /// The streams.
    pub hub: Hub,
    /// The agents, by model name.
    pub agents: Arc<Agents>,
    /// The server-side threads.
    pub threads: Threads,
    /// Transport settings.
    pub settings: Settings,
    /// The keys and the secret stream tokens are signed with.
    pub credentials: Arc<Credentials>,
    /// What `GET /metrics` shows.
    pub metrics: Metrics,
    /// The store, if streams and threads are kept in one.
    store: Option<Arc<Store>>,
    /// The other nodes, through Redis (`--engine redis`): streams this hub does not hold are followed.
    cluster: Option<crate::cluster::Cluster>,
    /// Where the service is in its shutdown.
    lifetime: Lifetime,
    /// The writers of waiting event connections (`feed.rs`).
    feeds: feed::Feeds,
}

impl App {
    /// An app over `hub` and `agents`, with `settings`, keeping threads in memory only.
    pub fn new(hub: Hub, agents: Arc<Agents>, settings: Settings) -> Self {
        App::with_store(hub, agents, settings, None)
    }

    /// An app whose threads `store` keeps (the hub should keep its streams there too: see
    /// [`crate::store::Store`]). The threads it kept from before a restart come back with
    /// [`Store::restore_threads`], as its streams do with [`Store::restore`].
    pub fn with_store(hub: Hub, agents: Arc<Agents>, settings: Settings, store: Option<Arc<Store>>) -> Self {
        // Tokens outlive a restart with the store's secret; without a store, they last as long as the process.
        let secret = store.as_ref().map_or_else(crate::hub::random_secret, |s| s.secret());
        let credentials = Arc::new(Credentials::new(&settings.api_keys, secret, Arc::clone(&hub.config().clock)));
        let storage: Arc<dyn ThreadStorage> = match &store {
            Some(store) => Arc::clone(store) as Arc<dyn ThreadStorage>,
            None => Arc::new(MemoryThreadStorage),
        };
        let threads = Threads::with_storage(hub.clone(), Arc::clone(&agents), settings.threads.clone(), storage);
        let metrics = Metrics::new();
        App {
            hub,
            agents,
            threads,
            settings,
            credentials,
            metrics,
            store,
            cluster: None,
            lifetime: Lifetime::default(),
            feeds: feed::Feeds::default(),
        }
    }

    /// The same app, serving the streams of the other nodes of `cluster` too (`--engine redis`).
    pub fn with_cluster(mut self, cluster: crate::cluster::Cluster) -> Self {
        // A token one node gave is good on every node.
        let clock = Arc::clone(&self.hub.config().clock);
        self.credentials = Arc::new(Credentials::new(&self.settings.api_keys, cluster.secret(), clock));
        // A conversation goes on whichever node its next turn reaches.
        let storage = Arc::new(cluster.threads(self.settings.threads.ttl));
        self.threads =
            Threads::with_storage(self.hub.clone(), Arc::clone(&self.agents), self.settings.threads.clone(), storage);
        self.cluster = Some(cluster);
        self
    }

    /// 503 `shutting_down` once the service is stopping: for what would start new work.
    pub(crate) fn refuse_new_work(&self) -> Result<(), HttpError> {
        if self.lifetime.draining.is_cancelled() { Err(HttpError::shutting_down()) } else { Ok(()) }
    }
}

/// One endpoint: where it is, what handles it, and what the OpenAPI document says of it (`openapi.rs`).
pub(crate) struct Endpoint {
    pub(crate) method: Method,
    pub(crate) path: &'static str,
    handler: MethodRouter<App>,
    pub(crate) operation: Operation,
}

/// Every endpoint, once: the router and the OpenAPI document are both made from this.
pub(crate) fn endpoints() -> Vec<Endpoint> {
    use openapi::Content::{EventStream, Foreign, Html, Json, Text};
    let endpoint = |method: Method, path, handler, operation| Endpoint { method, path, handler, operation };
    let op = |summary, tag, request, answers| Operation { summary, tag, request, answers };
    let chat_request: openapi::SchemaOf = |g| g.subschema_for::<crate::conversation::ChatRequest>();
    let snapshot: openapi::SchemaOf = |g| g.subschema_for::<crate::hub::Snapshot>();
    let transcript: openapi::SchemaOf = |g| g.subschema_for::<crate::thread::Transcript>();
    let audit: openapi::SchemaOf = |g| {
        let entries = g.subschema_for::<Vec<crate::thread::AuditEntry>>().to_value();
        let object = serde_json::json!({"type": "object", "required": ["thread_id", "object", "entries"], "properties": {
            "thread_id": {"type": "string"}, "object": {"const": "thread.audit"}, "entries": entries}});
        Schema::from(object.as_object().cloned().unwrap_or_default())
    };
    let outcome: openapi::SchemaOf = |g| g.subschema_for::<crate::output::Outcome>();
    // One message, or an array of them (or NDJSON, one per line).
    let messages: openapi::SchemaOf = |g| {
        let one = crate::schema::message(g).to_value();
        Schema::from(
            serde_json::json!({"anyOf": [one, {"type": "array", "items": one}]})
                .as_object()
                .cloned()
                .unwrap_or_default(),
        )
    };
    const RUN: &str = "The run's stream from its start, in the front door's own format (see docs/http-api.md)";
    vec![
        endpoint(
            Method::GET,
            "/healthz",
            get(|| async { "ok" }),
            op("The process answers", "operate", None, vec![(200, "ok", vec![Text])]),
        ),
        endpoint(
            Method::GET,
            "/readyz",
            get(ready),
            op("The service takes work", "operate", None, vec![(200, "ready", vec![Text])]),
        ),
        endpoint(
            Method::GET,
            "/metrics",
            get(scrape),
            op("Prometheus metrics", "operate", None, vec![(200, "OpenMetrics text", vec![Text])]),
        ),
        endpoint(
            Method::GET,
            "/openapi.json",
            get(openapi_document),
            op("This document", "operate", None, vec![(200, "OpenAPI 3.1", vec![Foreign("OpenAPI 3.1 document")])]),
        ),
        endpoint(
            Method::GET,
            "/ui",
            get(ui::page),
            op("The viewer: the streams", "viewer", None, vec![(200, "The page", vec![Html])]),
        ),
        endpoint(
            Method::GET,
            "/ui/streams/{id}",
            get(ui::page),
            op(
                "The viewer: one run live (?token= for a read token)",
                "viewer",
                None,
                vec![(200, "The page", vec![Html])],
            ),
        ),
        endpoint(
            Method::GET,
            "/ui/assets/viewer.js",
            get(ui::script),
            op("The viewer's script", "viewer", None, vec![(200, "JavaScript", vec![Text])]),
        ),
        endpoint(
            Method::GET,
            "/ui/assets/client.js",
            get(ui::client),
            op(
                "The TypeScript client as one ES module, for a page to import",
                "viewer",
                None,
                vec![(200, "JavaScript", vec![Text])],
            ),
        ),
        endpoint(
            Method::GET,
            "/ui/assets/viewer.css",
            get(ui::style),
            op("The viewer's style", "viewer", None, vec![(200, "CSS", vec![Text])]),
        ),
        endpoint(
            Method::GET,
            "/v1/version",
            get(version),
            op(
                "The service's name and version",
                "operate",
                None,
                vec![(200, "{name, version}", vec![Foreign("{name, version}")])],
            ),
        ),
        endpoint(
            Method::GET,
            "/v1/models",
            get(streams::models),
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
            post(chat::completions),
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
        endpoint(
            Method::POST,
            "/v1/ui/chat",
            post(ui_chat::chat),
            op(
                "The AI SDK's useChat turn",
                "front doors",
                Some((
                    Foreign(
                        "useChat's request: {id, messages: UIMessage[], trigger, messageId} and the body option's fields",
                    ),
                    true,
                )),
                vec![(200, RUN, vec![EventStream])],
            ),
        ),
        endpoint(
            Method::GET,
            "/v1/ui/chat/{chat_id}/stream",
            get(ui_chat::resume),
            op(
                "Resume a useChat turn",
                "front doors",
                None,
                vec![(200, RUN, vec![EventStream]), (204, "No turn running", vec![])],
            ),
        ),
        endpoint(
            Method::POST,
            "/v1/ag-ui",
            post(ag_ui::run),
            op(
                "An AG-UI run",
                "front doors",
                Some((Foreign("AG-UI RunAgentInput"), true)),
                vec![(200, RUN, vec![EventStream])],
            ),
        ),
        endpoint(
            Method::POST,
            "/v1/messages",
            post(anthropic::messages),
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
        ),
        endpoint(
            Method::POST,
            "/v1/responses",
            post(responses::create),
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
        ),
        endpoint(
            Method::GET,
            "/v1/streams",
            get(streams::list),
            op(
                "The streams held, newest first, a page at a time (?limit=1..500, ?after=<next>)",
                "streams",
                None,
                vec![(
                    200,
                    "{object: list, data: [{id, status, epoch, model, created_ms, last_sequence}], has_more, next}",
                    vec![Foreign("A page of streams")],
                )],
            ),
        ),
        endpoint(
            Method::POST,
            "/v1/streams",
            post(streams::create),
            op(
                "Create a stream for an outside producer",
                "streams",
                Some((Json(|g| g.subschema_for::<streams::CreateBody>()), false)),
                vec![(
                    201,
                    "{id, epoch, read_token, write_token, token_expires_at?}",
                    vec![Foreign("The stream and its tokens")],
                )],
            ),
        ),
        endpoint(
            Method::GET,
            "/v1/streams/{id}",
            get(streams::status),
            op(
                "A stream's snapshot: every message with its deltas applied",
                "streams",
                None,
                vec![(200, "The snapshot", vec![Json(snapshot)])],
            ),
        ),
        endpoint(
            Method::POST,
            "/v1/streams/{id}/messages",
            post(streams::append),
            op(
                "Append messages (JSON, an array, or NDJSON); answered once they are kept",
                "streams",
                Some((Json(messages), true)),
                vec![(200, "{sequences}", vec![Foreign("The sequences the messages got")])],
            ),
        ),
        endpoint(
            Method::POST,
            "/v1/streams/{id}/end",
            post(streams::end),
            op(
                "End a stream with its outcome",
                "streams",
                Some((Json(outcome), false)),
                vec![(200, "{id, status, last_sequence}", vec![Foreign("The ended stream")])],
            ),
        ),
        endpoint(
            Method::POST,
            "/v1/streams/{id}/cancel",
            post(streams::cancel),
            op(
                "Cancel the run behind a stream",
                "streams",
                None,
                vec![(202, "Cancelled", vec![Foreign("The stream")])],
            ),
        ),
        endpoint(
            Method::GET,
            "/v1/streams/{id}/events",
            get(streams::events),
            op(
                "Subscribe: the stream in a format (?format=cui|openai|ui-message|ag-ui|anthropic|responses), resumable",
                "streams",
                None,
                vec![
                    (200, "Server-sent events; each CUI event's data is an OutputMessage", vec![EventStream]),
                    (204, "Nothing to send: resumed at the end of an ended stream", vec![]),
                ],
            ),
        ),
        endpoint(
            Method::GET,
            "/v1/streams/{id}/ws",
            get(ws::one),
            op("Subscribe over a WebSocket", "streams", None, vec![(101, "Switching protocols", vec![])]),
        ),
        endpoint(
            Method::GET,
            "/v1/ws",
            get(ws::many),
            op(
                "One WebSocket for many streams, and producers",
                "streams",
                None,
                vec![(101, "Switching protocols", vec![])],
            ),
        ),
        endpoint(
            Method::POST,
            "/v1/threads",
            post(threads::create),
            op(
                "Create a server-side thread",
                "threads",
                Some((Json(|g| g.subschema_for::<threads::CreateBody>()), false)),
                vec![(201, "Its transcript", vec![Json(transcript)])],
            ),
        ),
        endpoint(
            Method::GET,
            "/v1/threads/{id}",
            get(threads::get),
            op("A thread's transcript", "threads", None, vec![(200, "The transcript", vec![Json(transcript)])]),
        ),
        endpoint(
            Method::DELETE,
            "/v1/threads/{id}",
            delete(threads::delete),
            op(
                "Delete a thread",
                "threads",
                None,
                vec![(200, "{id, object: thread.deleted, deleted: true}", vec![Foreign("The deleted thread")])],
            ),
        ),
        endpoint(
            Method::GET,
            "/v1/threads/{id}/audit",
            get(threads::audit),
            op("A thread's audit log", "threads", None, vec![(200, "The audit log", vec![Json(audit)])]),
        ),
        endpoint(
            Method::POST,
            "/v1/threads/{id}/replay",
            post(threads::replay),
            op(
                "Replay a thread's history on another model",
                "threads",
                Some((Json(|g| g.subschema_for::<threads::ReplayBody>()), true)),
                vec![(201, "The new thread and its run's stream", vec![Foreign("The replay")])],
            ),
        ),
    ]
}

/// Every route.
pub fn router(app: App) -> Router {
    let mut router = Router::new();
    for endpoint in endpoints() {
        let mut handler = endpoint.handler;
        if app.cluster.is_some() && forward::WRITES.contains(&endpoint.path) {
            handler = handler.route_layer(middleware::from_fn_with_state(app.clone(), forward::to_writer));
        }
        router = router.route(endpoint.path, handler);
    }
    router
        .fallback(|| async {
            HttpError::new(
                axum::http::StatusCode::NOT_FOUND,
                "invalid_request_error",
                "no such endpoint",
                None,
                "not_found",
            )
        })
        .route_layer(middleware::from_fn_with_state(Arc::clone(&app.credentials), auth::guard))
        .layer(middleware::from_fn_with_state(app.settings.cors_origins.clone(), browser::guard))
        .layer(middleware::from_fn_with_state(app.settings.body_limit, edge::guard))
        .layer(middleware::from_fn_with_state(app.metrics.clone(), trace))
        .layer(tower::util::option_layer(app.settings.cors_origins.cors()))
        .with_state(app)
}

/// Names the stream a request is about in its span (see [`trace`]).
pub(crate) fn record_stream(id: &str) {
    tracing::Span::current().record("stream", id);
}

/// A span per request, with its method and path, and the stream once a handler knows it; then the access log
/// line (method, route template, status, duration, the stream: never a query, so never a token) and the
/// request counted. A 4xx's reason is logged at debug, a 5xx's at error.
async fn trace(State(metrics): State<Metrics>, request: Request, next: Next) -> Response {
    let method = request.method().clone();
    let route = request.extensions().get::<MatchedPath>().map_or("(none)", |p| p.as_str()).to_owned();
    let span = tracing::info_span!("request", %method, route, stream = tracing::field::Empty);
    let started = std::time::Instant::now();
    async move {
        let response = next.run(request).await;
        let status = response.status().as_u16();
        let code = response.extensions().get::<error::ErrorCode>().map(|c| c.0.as_str());
        // To the microsecond, so the line shows 0.489 rather than 0.48924500000000004.
        let duration_ms = started.elapsed().as_micros() as f64 / 1e3;
        tracing::info!(status, duration_ms, "access");
        match code {
            // A readiness probe's 503 is its answer, not a failure: a balancer probes every second.
            Some(code) if status >= 500 && route == "/readyz" => tracing::debug!(status, code, "not ready"),
            Some(code) if status >= 500 => tracing::error!(status, code, "request failed"),
            Some(code) => tracing::debug!(status, code, "request refused"),
            None => {}
        }
        metrics.request(&route, method.as_str(), status, code);
        response
    }
    .instrument(span)
    .await
}

/// `GET /readyz`: 200 while the service takes new work, 503 `shutting_down` once it stops (a load balancer
/// then sends new clients elsewhere), 503 `store_failing` while the store cannot write, 503
/// `cluster_unavailable` while this node cannot reach Redis.
async fn ready(State(app): State<App>) -> Result<&'static str, HttpError> {
    app.refuse_new_work()?;
    if app.cluster.as_ref().is_some_and(|cluster| !cluster.reaches_redis()) {
        return Err(HttpError::new(
            axum::http::StatusCode::SERVICE_UNAVAILABLE,
            "server_error",
            "this node cannot reach Redis",
            None,
            "cluster_unavailable",
        ));
    }
    if app.store.as_ref().is_some_and(|store| store.failing()) {
        return Err(HttpError::new(
            axum::http::StatusCode::SERVICE_UNAVAILABLE,
            "server_error",
            "the store cannot write",
            None,
            "store_failing",
        ));
    }
    Ok("ready")
}

/// `GET /metrics`: the Prometheus text exposition (see `metrics.rs`).
async fn scrape(State(app): State<App>) -> Response {
    let text = app.metrics.render(&app.hub);
    ([(axum::http::header::CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")], text)
        .into_response()
}

/// `GET /openapi.json`: the OpenAPI document of every endpoint.
async fn openapi_document() -> axum::Json<serde_json::Value> {
    axum::Json(openapi_json())
}

/// The OpenAPI 3.1 document of every endpoint, as `GET /openapi.json` serves it (and `docs/openapi.json`
/// holds it).
pub fn openapi_json() -> serde_json::Value {
    openapi::document()
}

/// `GET /v1/version`: `{"name", "version"}`.
async fn version() -> axum::Json<serde_json::Value> {
    axum::Json(serde_json::json!({ "name": env!("CARGO_PKG_NAME"), "version": env!("CARGO_PKG_VERSION") }))
}
