//! Writes to a stream another node writes (`--engine redis`): appends, ends and cancels go to that node.
//!
//! A stream has one writer, the node that created it (see `crate::cluster`); a producer, a cancel button or
//! a load balancer may reach any node. So on the routes that write, a node that is not the stream's writer
//! sends the request on to the writer's URL (from Redis) as it came (method, path, query, body, and the
//! headers that say who asks, what the body is, and an append's `Idempotency-Key`) and answers with the
//! writer's answer, status, headers a client reads (`idempotent-replayed`, `retry-after`) and error
//! envelope included. A forwarded request carries [`FORWARDED`] and is never sent on again, so two nodes
//! that disagree about the writer cannot pass a request back and forth. A writer that cannot be reached
//! is answered 503 `writer_unreachable`, which a client may retry.
//!
//! A WebSocket's `publish`, `end_message`, `end_block` and `cancel` ops on such a stream go the same way,
//! as the HTTP requests they stand for ([`post_to_writer`], with a publish's `after` and idempotency key):
//! the connection's credential was checked here, and the request carries a write token for that stream
//! alone that lasts a minute (every node signs tokens with the cluster's secret).

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::auth::Access;
use super::error::HttpError;
use super::trace::record_stream;
use crate::http::app::App;
use crate::hub::AppendError;

/// The routes that write to a stream, each with the stream's id as its third path segment.
pub(crate) const WRITES: [&str; 5] = [
    "/v1/streams/{id}/messages",
    "/v1/streams/{id}/messages/{message_id}/end",
    "/v1/streams/{id}/blocks/{block_id}/end",
    "/v1/streams/{id}/end",
    "/v1/streams/{id}/cancel",
];

/// The header a forwarded request carries.
pub(crate) const FORWARDED: &str = "x-agentmux-forwarded";

/// The request headers sent on: what the body is, who asks, and what makes an append safe to retry.
const SENT_ON: [&str; 6] =
    ["content-type", "authorization", "x-api-key", "traceparent", "tracestate", "idempotency-key"];

/// The answer's headers passed back.
const PASSED_BACK: [&str; 5] = ["content-type", "retry-after", "x-should-retry", "x-request-id", "idempotent-replayed"];

/// Serves a write here when this node writes the stream (or no node does: the handler answers 404), and
/// otherwise forwards it to the node that does.
pub(crate) async fn to_writer(State(app): State<App>, request: Request, next: Next) -> Response {
    let Some(cluster) = &app.cluster else { return next.run(request).await };
    if request.headers().contains_key(FORWARDED) {
        return next.run(request).await;
    }
    let Some(id) = request.uri().path().split('/').nth(3).map(str::to_owned) else { return next.run(request).await };
    if app.hub.get(&id).is_some_and(|stream| !stream.is_followed()) {
        return next.run(request).await;
    }
    let url = match cluster.writer_url(&id).await {
        Ok(Some(url)) if url != cluster.url() => url,
        Ok(_) => return next.run(request).await,
        Err(error) => return HttpError::cluster_unavailable(&error).into_response(),
    };
    record_stream(&id);
    match forward(&app, &url, request).await {
        Ok(response) => response,
        Err(error) => error.into_response(),
    }
}

async fn forward(app: &App, writer: &str, request: Request) -> Result<Response, HttpError> {
    let (parts, body) = request.into_parts();
    let target = format!("{writer}{}", parts.uri.path_and_query().map_or(parts.uri.path(), |p| p.as_str()));
    let body = super::body::read(body, &app.settings).await?;
    let mut headers = reqwest::header::HeaderMap::new();
    for name in SENT_ON {
        if let Some(value) = parts.headers.get(name) {
            headers.insert(HeaderName::from_static(name), value.clone());
        }
    }
    headers.insert(HeaderName::from_static(FORWARDED), HeaderValue::from_static("1"));
    let client = app.cluster.as_ref().map(|c| c.http().clone()).unwrap_or_default();
    let answer = client
        .request(parts.method, &target)
        .headers(headers)
        .body(body)
        .send()
        .await
        .map_err(|error| not_reached(writer, &error))?;
    let status = StatusCode::from_u16(answer.status().as_u16()).unwrap_or(StatusCode::BAD_GATEWAY);
    let mut passed = HeaderMap::new();
    for name in PASSED_BACK {
        if let Some(value) = answer.headers().get(name) {
            passed.insert(HeaderName::from_static(name), value.clone());
        }
    }
    let bytes = answer.bytes().await.map_err(|_| unreachable_writer(writer))?;
    Ok((status, passed, Body::from(bytes)).into_response())
}

/// What the writer answered a forwarded op: its JSON, and whether it was a repeat of a conditional append.
pub(crate) struct Forwarded {
    pub(crate) body: serde_json::Value,
    pub(crate) replayed: bool,
}

/// POSTs `body` (JSON) to `/v1/streams/{id}/{action}` (`action` may carry a query: `messages?after=4`) on
/// the node that writes stream `id`, with `key` as its `Idempotency-Key`, for a WebSocket op this node
/// allowed: the writer's answer, or its error envelope as this node's error.
pub(crate) async fn post_to_writer(
    app: &App,
    id: &str,
    action: &str,
    body: Vec<u8>,
    key: Option<&str>,
) -> Result<Forwarded, HttpError> {
    let Some(cluster) = &app.cluster else { return Err(AppendError::Elsewhere.into()) };
    let writer = match cluster.writer_url(id).await {
        Ok(Some(url)) if url != cluster.url() => url,
        Ok(_) => return Err(AppendError::Elsewhere.into()),
        Err(error) => return Err(HttpError::cluster_unavailable(&error)),
    };
    let mut request = cluster
        .http()
        .post(format!("{writer}/v1/streams/{id}/{action}"))
        .header(FORWARDED, "1")
        .header("content-type", "application/json")
        .body(body);
    if let Some(key) = key {
        request = request.header("idempotency-key", key);
    }
    if app.credentials.keyed() {
        let token = app.credentials.token(id, Access::Write, app.credentials.expires_in(60));
        request = request.bearer_auth(token);
    }
    let answer = request.send().await.map_err(|error| not_reached(&writer, &error))?;
    let status = StatusCode::from_u16(answer.status().as_u16()).unwrap_or(StatusCode::BAD_GATEWAY);
    let replayed = answer.headers().get("idempotent-replayed").is_some_and(|v| v.as_bytes() == b"true");
    let body: serde_json::Value = answer.json().await.map_err(|_| unreachable_writer(&writer))?;
    if status.is_success() {
        return Ok(Forwarded { body, replayed });
    }
    let field = |name: &str| body["error"][name].as_str().map(str::to_owned);
    let mut error = HttpError::new(
        status,
        &field("type").unwrap_or_else(|| "server_error".into()),
        field("message").unwrap_or_else(|| format!("the stream's writer answered {status}")),
        field("param"),
        &field("code").unwrap_or_else(|| "writer_error".into()),
    );
    error.error.last_sequence = body["error"]["last_sequence"].as_u64();
    Err(error)
}

/// `id` as one path segment: every byte but the unreserved ones (RFC 3986) percent-encoded.
pub(crate) fn path_segment(id: &str) -> String {
    let mut segment = String::with_capacity(id.len());
    for byte in id.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~') {
            segment.push(char::from(byte));
        } else {
            segment.push_str(&format!("%{byte:02X}"));
        }
    }
    segment
}

/// Logs why the writer was not reached (the innermost cause: "connection refused", not only "error sending
/// request"), and the 503 for it.
fn not_reached(writer: &str, error: &reqwest::Error) -> HttpError {
    let cause = std::iter::successors(std::error::Error::source(error), |e| e.source()).last();
    let cause = cause.map_or_else(|| error.to_string(), ToString::to_string);
    tracing::warn!(writer, cause, "forwarding to the stream's writer failed");
    unreachable_writer(writer)
}

fn unreachable_writer(writer: &str) -> HttpError {
    let mut error = HttpError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "server_error",
        format!("the node that writes this stream ({writer}) could not be reached"),
        None,
        "writer_unreachable",
    );
    error.retry = true;
    error
}
