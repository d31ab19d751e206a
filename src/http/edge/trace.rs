//! [`trace`]: a span per request and the access log line, and [`record_stream`], which names in that span
//! the stream a handler found.

use axum::extract::{MatchedPath, Request, State};
use axum::middleware::Next;
use axum::response::Response;
use tracing::Instrument;

use super::error::ErrorCode;
use super::metrics::Metrics;

/// Names the stream a request is about in its span (see [`trace`]).
pub(crate) fn record_stream(id: &str) {
    tracing::Span::current().record("stream", id);
}

/// A span per request, with its method and path, and the stream once a handler knows it; then the access log
/// line (method, route template, status, duration, the stream: never a query, so never a token) and the
/// request counted. A 4xx's reason is logged at debug, a 5xx's at error.
pub(crate) async fn trace(State(metrics): State<Metrics>, request: Request, next: Next) -> Response {
    let method = request.method().clone();
    let route = request.extensions().get::<MatchedPath>().map_or("(none)", |p| p.as_str()).to_owned();
    let span = tracing::info_span!("request", %method, route, stream = tracing::field::Empty);
    let started = std::time::Instant::now();
    async move {
        let response = next.run(request).await;
        let status = response.status().as_u16();
        let code = response.extensions().get::<ErrorCode>().map(|c| c.0.as_str());
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
