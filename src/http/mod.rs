//! The HTTP service: the hub and the agents on the network, as `http-api.md` describes.
//!
//! - this file: [`App`] (what every handler shares), [`Settings`], [`router`] and [`serve`] with its graceful
//!   shutdown;
//! - `error.rs`: [`HttpError`], the one mapping from errors to statuses and OpenAI error envelopes;
//! - `body.rs`: body limits and JSON errors that name the field;
//! - `format.rs`: which format a query, a WebSocket op or a chat request's headers ask for;
//! - `chat.rs`: `POST /v1/chat/completions`;
//! - `streams.rs`: the stream endpoints and `GET /v1/models`;
//! - `sse.rs` and `ws.rs`: the SSE and WebSocket transports, both writing a batch of frames at a time.

mod body;
mod chat;
mod error;
mod format;
mod sse;
mod streams;
mod ws;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::Request;
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::{get, post};
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

pub use error::HttpError;

use crate::agent::Agents;
use crate::hub::Hub;
use crate::output::{ErrorProps, Outcome};

/// Transport settings.
#[derive(Debug, Clone)]
pub struct Settings {
    /// A `: ping` after this long without an event (15 s).
    pub keep_alive: Duration,
    /// The largest request body (8 MiB).
    pub body_limit: usize,
    /// The largest WebSocket message or frame from a client (1 MiB).
    pub ws_max_message: usize,
    /// On shutdown, how long open streams get to finish before they are ended with an error (10 s).
    pub shutdown_grace: Duration,
    /// The model a chat request without one gets (`demo`).
    pub default_model: String,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            keep_alive: Duration::from_secs(15),
            body_limit: 8 << 20,
            ws_max_message: 1 << 20,
            shutdown_grace: Duration::from_secs(10),
            default_model: "demo".into(),
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
    /// Transport settings.
    pub settings: Settings,
}

/// Every route.
pub fn router(app: App) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/v1/models", get(streams::models))
        .route("/v1/chat/completions", post(chat::completions))
        .route("/v1/streams", post(streams::create))
        .route("/v1/streams/{id}", get(streams::status))
        .route("/v1/streams/{id}/messages", post(streams::append))
        .route("/v1/streams/{id}/end", post(streams::end))
        .route("/v1/streams/{id}/cancel", post(streams::cancel))
        .route("/v1/streams/{id}/events", get(streams::events))
        .route("/v1/streams/{id}/ws", get(ws::one))
        .route("/v1/ws", get(ws::many))
        .fallback(|| async {
            HttpError::new(
                axum::http::StatusCode::NOT_FOUND,
                "invalid_request_error",
                "no such endpoint",
                None,
                "not_found",
            )
        })
        .layer(middleware::from_fn(trace))
        .with_state(app)
}

/// Serves `app` on `listener` until `shutdown` completes; then stops accepting, gives open streams
/// [`Settings::shutdown_grace`] to finish, and ends the rest with status `error`.
pub async fn serve(
    listener: TcpListener,
    app: App,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let hub = app.hub.clone();
    let grace = app.settings.shutdown_grace;
    let janitor = tokio::spawn({
        let hub = hub.clone();
        async move {
            let mut every = tokio::time::interval(Duration::from_secs(30));
            loop {
                every.tick().await;
                hub.evict_expired();
            }
        }
    });
    let router = router(app);
    let http = connection_builder();
    let connections = TaskTracker::new();
    let stop = CancellationToken::new();
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let tcp = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((tcp, _peer)) => tcp,
                Err(error) => {
                    wait_after_accept_error(error).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        // Events are small and latency matters more than packet count: no Nagle delay behind an
        // unacknowledged write.
        if let Err(error) = tcp.set_nodelay(true) {
            tracing::debug!(%error, "TCP_NODELAY not set");
        }
        let connection =
            http.serve_connection(TokioIo::new(tcp), TowerToHyperService::new(router.clone())).with_upgrades();
        let stop = stop.clone();
        // Once `stop` fires, a connection finishes the response in flight (an SSE stream ends when the
        // shutdown ends its stream) and closes.
        connections.spawn(async move {
            let mut connection = std::pin::pin!(connection);
            let result = tokio::select! {
                result = connection.as_mut() => result,
                () = stop.cancelled() => {
                    connection.as_mut().graceful_shutdown();
                    connection.await
                }
            };
            if let Err(error) = result {
                tracing::debug!(%error, "connection closed with an error");
            }
        });
    }
    drop(listener);
    tracing::info!(open = hub.open_streams().len(), "shutting down: no new connections");
    tokio::spawn(end_open_streams(hub, grace));
    stop.cancel();
    connections.close();
    connections.wait().await;
    janitor.abort();
    Ok(())
}

/// How every connection is served: HTTP/1.1 only, with upgrades for WebSocket.
///
/// hyper's own HTTP/1 connection rather than hyper-util's `auto` one (which would also take HTTP/2 over
/// cleartext, which browsers and the OpenAI SDKs do not use): an idle SSE subscriber is then only hyper's
/// read and write buffers, its task and its response, about 4 KiB less per connection than `auto` kept.
fn connection_builder() -> http1::Builder {
    let mut http = http1::Builder::new();
    // A client gets 30 s to send a request's head (hyper's default, which needs a timer to apply).
    http.timer(TokioTimer::new()).header_read_timeout(Duration::from_secs(30));
    http
}

/// After a failed `accept`: a connection that died in the backlog is skipped; anything else (out of file
/// descriptors, say) would fail again at once, so wait a second rather than spin.
async fn wait_after_accept_error(error: std::io::Error) {
    use std::io::ErrorKind::{ConnectionAborted, ConnectionRefused, ConnectionReset};
    if matches!(error.kind(), ConnectionAborted | ConnectionRefused | ConnectionReset) {
        return;
    }
    tracing::error!(%error, "accept failed; retrying in 1 s");
    tokio::time::sleep(Duration::from_secs(1)).await;
}

/// Waits up to `grace` for open streams to end, then ends the rest with an error.
async fn end_open_streams(hub: Hub, grace: Duration) {
    let deadline = tokio::time::Instant::now() + grace;
    while !hub.open_streams().is_empty() && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for stream in hub.open_streams() {
        stream.cancellation().cancel();
        stream.end(Outcome::failed(ErrorProps {
            message: "the server is shutting down".into(),
            code: Some("shutdown".into()),
            details: None,
        }));
        tracing::warn!(stream = stream.id(), "ended by shutdown");
    }
}

/// Names the stream a request is about in its span (see [`trace`]).
pub(crate) fn record_stream(id: &str) {
    tracing::Span::current().record("stream", id);
}

/// A span per request, with its method and path, and the stream once a handler knows it.
async fn trace(request: Request, next: Next) -> Response {
    let span = tracing::info_span!(
        "request",
        method = %request.method(),
        path = %request.uri().path(),
        stream = tracing::field::Empty
    );
    async move {
        let response = next.run(request).await;
        tracing::debug!(status = response.status().as_u16(), "response");
        response
    }
    .instrument(span)
    .await
}
