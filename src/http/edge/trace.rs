//! [`trace`]: a span per request and the access log line, and [`record_stream`], which names in that span
//! the stream a handler found.
//!
//! Every label here comes from a set the service bounds, never from what a client sent as it sent it: the
//! route is the matched template (or `(none)`), the method one of HTTP's nine (or `other`: hyper accepts
//! any token as a method, thousands of bytes long), the status a number, the code one of the service's own.
//! A label a client could choose would make every made-up value a new series, kept for good: memory anyone
//! who can reach the port could fill, without a key, since refusals are counted too.

use axum::extract::{MatchedPath, Request, State};
use axum::http::Method;
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
    let method = method_label(request.method());
    let route = request.extensions().get::<MatchedPath>().map_or("(none)", |p| p.as_str()).to_owned();
    let span = tracing::info_span!("request", method, route, stream = tracing::field::Empty);
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
        metrics.request(&route, method, status, code);
        response
    }
    .instrument(span)
    .await
}

/// The method as a label: one of HTTP's nine methods, or `other` for any extension method a client made up.
fn method_label(method: &Method) -> &'static str {
    const KNOWN: [(Method, &str); 9] = [
        (Method::GET, "GET"),
        (Method::HEAD, "HEAD"),
        (Method::POST, "POST"),
        (Method::PUT, "PUT"),
        (Method::DELETE, "DELETE"),
        (Method::CONNECT, "CONNECT"),
        (Method::OPTIONS, "OPTIONS"),
        (Method::TRACE, "TRACE"),
        (Method::PATCH, "PATCH"),
    ];
    KNOWN.iter().find(|(known, _)| known == method).map_or("other", |(_, label)| label)
}
