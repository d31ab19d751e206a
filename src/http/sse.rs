//! Server-sent event responses from a [`Subscription`]: one body chunk per batch, `: ping` in silences.
//!
//! Each batch the hub hands out (every frame a subscriber is behind, up to the batch limit) becomes one body
//! chunk, so hyper sends it in one write. After `keep_alive` without a batch (zero: never) a `: ping` comment goes out,
//! which every SSE client and OpenAI SDK ignores. The body ends when the subscription does: after
//! `data: [DONE]` for OpenAI, after `stream_end` or a `lagged` notice for CUI. `Cache-Control: no-cache` and
//! `X-Accel-Buffering: no` keep proxies from holding the events back.

use std::convert::Infallible;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{HeaderValue, header};
use axum::response::Response;
use bytes::BytesMut;

use crate::hub::{Batch, Subscription};

const PING: Bytes = Bytes::from_static(b": ping\n\n");

/// Runs when the response body is dropped before the subscription ended: the client went away.
pub(crate) struct OnDisconnect(Option<Box<dyn FnOnce() + Send>>);

impl OnDisconnect {
    pub(crate) fn new(action: impl FnOnce() + Send + 'static) -> Self {
        OnDisconnect(Some(Box::new(action)))
    }

    pub(crate) fn none() -> Self {
        OnDisconnect(None)
    }

    pub(crate) fn disarm(&mut self) {
        self.0 = None;
    }
}

impl Drop for OnDisconnect {
    fn drop(&mut self) {
        if let Some(action) = self.0.take() {
            action();
        }
    }
}

/// One batch as one chunk.
pub(crate) fn join(batch: Batch) -> Bytes {
    match <[Bytes; 1]>::try_from(batch.frames) {
        Ok([frame]) => frame,
        Err(frames) => {
            let mut out = BytesMut::with_capacity(frames.iter().map(Bytes::len).sum());
            frames.iter().for_each(|frame| out.extend_from_slice(frame));
            out.freeze()
        }
    }
}

/// An SSE response that relays `subscription`, with `stream_id` in `x-agentmux-stream-id`.
pub(crate) fn response(
    subscription: Subscription,
    stream_id: &str,
    keep_alive: Duration,
    on_disconnect: OnDisconnect,
) -> Response {
    let body =
        futures::stream::unfold((subscription, on_disconnect), move |(mut subscription, mut guard)| async move {
            // A zero keep-alive turns pings off.
            let next = if keep_alive.is_zero() {
                Ok(subscription.next().await)
            } else {
                tokio::time::timeout(keep_alive, subscription.next()).await
            };
            match next {
                Ok(Some(batch)) => Some((Ok::<_, Infallible>(join(batch)), (subscription, guard))),
                Ok(None) => {
                    guard.disarm();
                    None
                }
                Err(_) => Some((Ok(PING), (subscription, guard))),
            }
        });
    let mut response = Response::new(Body::from_stream(body));
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    headers.insert("x-accel-buffering", HeaderValue::from_static("no"));
    if let Ok(id) = HeaderValue::from_str(stream_id) {
        headers.insert("x-agentmux-stream-id", id);
    }
    response
}
