//! The HTTP service: the hub and the agents on the network, as `http-api.md` describes.
//!
//! - this file: [`App`] (what every handler shares), [`Settings`] and [`router`];
//! - `server.rs`: [`serve`]: connections (the cap, the socket each holds), and the shutdown in phases;
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
mod extract;
mod format;
mod metrics;
mod responses;
mod server;
mod sse;
mod streams;
mod threads;
mod ui_chat;
mod ws;

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::{MatchedPath, Request, State};
use axum::middleware::{self, Next};
use axum::response::IntoResponse;
use axum::response::Response;
use axum::routing::{get, post};
use tracing::Instrument;

pub use auth::{Access, Credentials, KeyError, KeySpec, budgets, check_key};
pub use browser::Origins;
pub use error::{HttpError, Room};
pub use metrics::Metrics;
pub use server::{runtime, serve};

use crate::agent::Agents;
use crate::hub::Hub;
use crate::store::Store;
use crate::thread::{ThreadConfig, Threads};
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
    /// The `useChat` turns running, for the resume endpoint.
    /// The store, if streams and threads are kept in one.
    store: Option<Arc<Store>>,
    /// Where the service is in its shutdown.
    lifetime: Lifetime,
}

impl App {
    /// An app over `hub` and `agents`, with `settings`, keeping threads in memory only.
    pub fn new(hub: Hub, agents: Arc<Agents>, settings: Settings) -> Self {
        App::with_store(hub, agents, settings, None)
    }

    /// An app whose threads `store` keeps (the hub should keep its streams there too: see
    /// [`crate::store::Store`]).
    pub fn with_store(hub: Hub, agents: Arc<Agents>, settings: Settings, store: Option<Arc<Store>>) -> Self {
        // Tokens outlive a restart with the store's secret; without a store, they last as long as the process.
        let secret = store.as_ref().map_or_else(crate::store::random_secret, |s| s.secret());
        let credentials = Arc::new(Credentials::new(&settings.api_keys, secret));
        let threads = Threads::with_store(hub.clone(), Arc::clone(&agents), settings.threads.clone(), store.clone());
        let metrics = Metrics::new();
        App { hub, agents, threads, settings, credentials, metrics, store, lifetime: Lifetime::default() }
    }

    /// 503 `shutting_down` once the service is stopping: for what would start new work.
    pub(crate) fn refuse_new_work(&self) -> Result<(), HttpError> {
        if self.lifetime.draining.is_cancelled() { Err(HttpError::shutting_down()) } else { Ok(()) }
    }
}

/// Every route.
pub fn router(app: App) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(ready))
        .route("/metrics", get(scrape))
        .route("/v1/version", get(version))
        .route("/v1/models", get(streams::models))
        .route("/v1/chat/completions", post(chat::completions))
        .route("/v1/ui/chat", post(ui_chat::chat))
        .route("/v1/ag-ui", post(ag_ui::run))
        .route("/v1/messages", post(anthropic::messages))
        .route("/v1/responses", post(responses::create))
        .route("/v1/ui/chat/{chat_id}/stream", get(ui_chat::resume))
        .route("/v1/streams", post(streams::create))
        .route("/v1/streams/{id}", get(streams::status))
        .route("/v1/streams/{id}/messages", post(streams::append))
        .route("/v1/streams/{id}/end", post(streams::end))
        .route("/v1/streams/{id}/cancel", post(streams::cancel))
        .route("/v1/streams/{id}/events", get(streams::events))
        .route("/v1/streams/{id}/ws", get(ws::one))
        .route("/v1/ws", get(ws::many))
        .route("/v1/threads", post(threads::create))
        .route("/v1/threads/{id}", get(threads::get).delete(threads::delete))
        .route("/v1/threads/{id}/audit", get(threads::audit))
        .route("/v1/threads/{id}/replay", post(threads::replay))
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
        let duration_ms = started.elapsed().as_secs_f64() * 1e3;
        tracing::info!(status, duration_ms, "access");
        match code {
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
/// then sends new clients elsewhere), 503 `store_failing` while the store cannot write.
async fn ready(State(app): State<App>) -> Result<&'static str, HttpError> {
    app.refuse_new_work()?;
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

/// `GET /v1/version`: `{"name", "version"}`.
async fn version() -> axum::Json<serde_json::Value> {
    axum::Json(serde_json::json!({ "name": env!("CARGO_PKG_NAME"), "version": env!("CARGO_PKG_VERSION") }))
}
