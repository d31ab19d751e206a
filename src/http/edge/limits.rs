//! What every request meets before its handler, and every error response after it.
//!
//! Before: the limits on a request's head (its URI and headers) and its declared size. A body whose
//! `Content-Length` is over the limit is refused with 413 at once, before a byte of it is read, so a client
//! cannot make the service wait for (or drain) 100 GB. The head limits sit below hyper's own (a URI of 64 KiB,
//! about 400 KiB of head, 100 headers; raising hyper's header limit would make it allocate its header table
//! on the heap for every request, 4 KiB more per idle connection), so a request that passes hyper's parser but is over ours gets a 414 or
//! 431 with the envelope rather than hyper's bare status. A request hyper cannot parse at all (not HTTP, or
//! past hyper's limits) gets hyper's bare 400, 414 or 431 and the connection closes: there is no request to
//! shape an answer for.
//!
//! After: the envelope on every error. Handlers and extractors answer with [`HttpError`]; what axum answers
//! by itself (405 for a method a route does not take, a rejection this crate did not wrap) arrives here as
//! text or nothing, and leaves as the OpenAI envelope with the same status and headers (`Allow` stays), so
//! an SDK raises the right exception whatever went wrong. Last, a route that answers errors in another
//! protocol's shape (its [`ErrorShape`], declared with its endpoint) gets the body rendered again in that
//! shape (`shape.rs`), whoever refused: a handler, the auth guard, these limits, axum.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{MatchedPath, Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::HttpError;
use super::shape::{ErrorShape, ErrorShapes, Refused};

/// The longest request target (path and query) taken, in bytes.
pub(crate) const URI_BYTES: usize = 8 << 10;

/// The most bytes of headers taken (names and values).
pub(crate) const HEADER_BYTES: usize = 32 << 10;

/// The most headers taken: below hyper's own limit of 100, so that one more than this gets the envelope.
pub(crate) const HEADERS: usize = 64;

/// What the middleware needs: the body limit, and the error shape of each route.
#[derive(Debug, Clone)]
pub(crate) struct Limits {
    pub(crate) body_limit: usize,
    pub(crate) shapes: Arc<ErrorShapes>,
}

/// The middleware: head limits, the declared size, then the handler, then the envelope on bare errors, then
/// the route's error shape.
pub(crate) async fn guard(State(limits): State<Limits>, request: Request, next: Next) -> Response {
    let shape = limits.shapes.of(request.extensions().get::<MatchedPath>().map(MatchedPath::as_str));
    let response = match check_head(&request, limits.body_limit) {
        Err(error) => error.into_response(),
        Ok(()) => envelope(next.run(request).await).await,
    };
    reshape(response, shape)
}

/// `response` with its error's body in `shape`, when it is an error and the shape is not OpenAI's.
fn reshape(response: Response, shape: ErrorShape) -> Response {
    if shape == ErrorShape::OpenAi {
        return response;
    }
    let Some(Refused(error)) = response.extensions().get::<Refused>().cloned() else { return response };
    let (mut parts, _) = response.into_parts();
    parts.headers.remove(header::CONTENT_LENGTH);
    let body = shape.render(parts.status, &error);
    Response::from_parts(parts, Body::from(body))
}

fn check_head(request: &Request, body_limit: usize) -> Result<(), HttpError> {
    let uri = request.uri().path_and_query().map_or(0, |p| p.as_str().len());
    if uri > URI_BYTES {
        return Err(HttpError::new(
            StatusCode::URI_TOO_LONG,
            "invalid_request_error",
            format!("the request target is {uri} bytes, over the limit of {URI_BYTES}"),
            None,
            "uri_too_long",
        ));
    }
    let headers = request.headers();
    let bytes: usize = headers.iter().map(|(name, value)| name.as_str().len() + value.len()).sum();
    if headers.len() > HEADERS || bytes > HEADER_BYTES {
        return Err(HttpError::new(
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            "invalid_request_error",
            format!(
                "the request has {} headers of {bytes} bytes, over the limit of {HEADERS} headers or {HEADER_BYTES} \
                 bytes",
                headers.len()
            ),
            None,
            "headers_too_large",
        ));
    }
    let declared = headers.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.trim().parse::<u64>().ok());
    if declared.is_some_and(|length| length > body_limit as u64) {
        return Err(HttpError::body_too_large(body_limit));
    }
    Ok(())
}

/// The most of a bare error body kept as the envelope's message.
const MESSAGE_BYTES: usize = 1 << 10;

/// `response` unchanged, unless it is an error without the envelope: then the envelope, same status.
async fn envelope(response: Response) -> Response {
    let status = response.status();
    let is_json = response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|t| t.starts_with("application/json"));
    if !(status.is_client_error() || status.is_server_error()) || is_json {
        return response;
    }
    let (mut parts, body) = response.into_parts();
    let text = match axum::body::to_bytes(body, MESSAGE_BYTES).await {
        Ok(bytes) => String::from_utf8_lossy(&bytes).trim().to_owned(),
        Err(_) => String::new(),
    };
    let (message, code) = describe(status, text);
    let kind = if status.is_server_error() { "server_error" } else { "invalid_request_error" };
    let shaped = HttpError::new(status, kind, message, None, code).into_response();
    let (shaped_parts, shaped_body) = shaped.into_parts();
    for (name, value) in &shaped_parts.headers {
        parts.headers.insert(name, value.clone());
    }
    parts.headers.remove(header::CONTENT_LENGTH);
    if let Some(code) = shaped_parts.extensions.get::<super::error::ErrorCode>() {
        parts.extensions.insert(code.clone());
    }
    if let Some(refused) = shaped_parts.extensions.get::<Refused>() {
        parts.extensions.insert(refused.clone());
    }
    Response::from_parts(parts, Body::new(shaped_body))
}

/// A message and a code for an error axum answered by itself.
fn describe(status: StatusCode, text: String) -> (String, &'static str) {
    let code = match status {
        StatusCode::METHOD_NOT_ALLOWED => "method_not_allowed",
        StatusCode::NOT_FOUND => "not_found",
        StatusCode::UPGRADE_REQUIRED => "upgrade_required",
        StatusCode::PAYLOAD_TOO_LARGE => "body_too_large",
        StatusCode::UNSUPPORTED_MEDIA_TYPE => "unsupported_media_type",
        s if s.is_server_error() => "server_error",
        _ => "invalid_request",
    };
    let message = match (status, text.is_empty()) {
        (StatusCode::METHOD_NOT_ALLOWED, true) => "this endpoint does not take that method (see Allow)".to_owned(),
        (_, true) => status.canonical_reason().unwrap_or("error").to_lowercase(),
        (_, false) => text,
    };
    (message, code)
}
