//! [`Upgrade`]: a WebSocket upgrade, checked and answered by the service itself (RFC 6455 §4.2), so that the
//! connection that serves it owns its socket (`transport/upgrade.rs`, `transport/ws.rs`).
//!
//! A request that is not an upgrade gets the envelope with `param` naming the header at fault (`connection`,
//! `upgrade`, `sec-websocket-version`, `sec-websocket-key`): 405 (with `Allow: GET`) for another method,
//! 400 for a header, 426 for a connection that cannot be upgraded (HTTP/1.0).

use std::future::Future;

use axum::body::Body;
use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Version, header};
use axum::response::{IntoResponse, Response};
use futures::FutureExt;
use hyper::upgrade::OnUpgrade;

use crate::http::edge::auth::KeySlot;
use crate::http::edge::error::HttpError;
use crate::http::transport::upgrade::{DirectUpgrade, Serve, UpgradedSocket, UpgradesDirectly, accept_key};

/// A WebSocket upgrade. It carries the request's slot of its key's connections (`edge/auth.rs`), which the
/// connection then holds for as long as it is open.
pub(crate) struct Upgrade {
    accept: HeaderValue,
    /// hyper's upgrade, when hyper serves the connection; none when the transport answers it itself.
    hyper: Option<OnUpgrade>,
    slot: Option<KeySlot>,
}

impl Upgrade {
    /// Answers `101` and serves the socket with `serve` once upgraded, holding the request's key slot until
    /// `serve`'s future ends.
    pub(crate) fn on_upgrade<C, F>(self, serve: C) -> Response
    where
        C: FnOnce(UpgradedSocket) -> F + Send + 'static,
        F: Future<Output = ()> + Send + 'static,
    {
        let slot = self.slot;
        let serve: Serve = Box::new(move |socket| {
            // Not an `async` block around `served`: one holds its future twice, as what it captured and as
            // what it awaits.
            Box::pin(serve(socket).map(move |()| drop(slot)))
        });
        let mut response = Response::new(Body::empty());
        *response.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
        let headers = response.headers_mut();
        headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
        headers.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
        headers.insert(header::SEC_WEBSOCKET_ACCEPT, self.accept);
        match self.hyper {
            Some(upgrading) => {
                tokio::spawn(async move {
                    match upgrading.await {
                        Ok(upgraded) => serve(UpgradedSocket::from_hyper(upgraded)).await,
                        Err(error) => tracing::debug!(%error, "the WebSocket upgrade failed"),
                    }
                });
            }
            None => {
                response.extensions_mut().insert(DirectUpgrade::new(serve));
            }
        }
        response
    }
}

/// Whether `name`'s value, as a comma-separated list, has `token` (in any case).
fn lists(headers: &HeaderMap, name: header::HeaderName, token: &str) -> bool {
    headers
        .get_all(name)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .any(|value| value.split(',').any(|item| item.trim().eq_ignore_ascii_case(token)))
}

/// Why a request is not an upgrade: its status, the header at fault, and what is wrong.
fn check(parts: &Parts) -> Result<HeaderValue, (StatusCode, Option<&'static str>, &'static str)> {
    let headers = &parts.headers;
    if parts.method != Method::GET {
        return Err((StatusCode::METHOD_NOT_ALLOWED, None, "the request method must be GET"));
    }
    if !lists(headers, header::CONNECTION, "upgrade") {
        return Err((StatusCode::BAD_REQUEST, Some("connection"), "the Connection header does not include 'upgrade'"));
    }
    if !lists(headers, header::UPGRADE, "websocket") {
        return Err((StatusCode::BAD_REQUEST, Some("upgrade"), "the Upgrade header does not include 'websocket'"));
    }
    let Some(key) = headers.get(header::SEC_WEBSOCKET_KEY) else {
        return Err((StatusCode::BAD_REQUEST, Some("sec-websocket-key"), "the Sec-WebSocket-Key header is missing"));
    };
    if headers.get(header::SEC_WEBSOCKET_VERSION).is_none_or(|version| version.as_bytes() != b"13") {
        let what = "the Sec-WebSocket-Version header is not 13";
        return Err((StatusCode::BAD_REQUEST, Some("sec-websocket-version"), what));
    }
    HeaderValue::from_str(&accept_key(key.as_bytes()))
        .map_err(|_| (StatusCode::BAD_REQUEST, Some("sec-websocket-key"), "the Sec-WebSocket-Key header is not valid"))
}

impl<S: Send + Sync> FromRequestParts<S> for Upgrade {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Response> {
        let slot = parts.extensions.get::<KeySlot>().cloned();
        let checked = check(parts).and_then(|accept| {
            let hyper = parts.extensions.remove::<OnUpgrade>();
            let direct = parts.extensions.get::<UpgradesDirectly>().is_some();
            if hyper.is_none() && (!direct || parts.version != Version::HTTP_11) {
                return Err((StatusCode::UPGRADE_REQUIRED, None, "this connection cannot be upgraded"));
            }
            Ok(Upgrade { accept, hyper, slot })
        });
        checked.map_err(|(status, param, what)| {
            let error = HttpError::new(
                status,
                "invalid_request_error",
                format!("not a WebSocket upgrade: {what}"),
                param.map(str::to_owned),
                "websocket_upgrade",
            );
            let mut response = error.into_response();
            // A `HEAD` reaches a WebSocket route (axum routes it with `GET`), and only `GET` upgrades.
            if status == StatusCode::METHOD_NOT_ALLOWED {
                response.headers_mut().insert(header::ALLOW, HeaderValue::from_static("GET"));
            }
            response
        })
    }
}
