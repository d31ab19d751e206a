//! WebSocket subscribers: `GET /v1/streams/{id}/ws` for one stream, `GET /v1/ws` for several at once.
//!
//! Both speak one protocol of JSON text frames. From the client: `{"op": "subscribe", "stream", "format"?,
//! "from"?}`, `{"op": "unsubscribe", "stream"}`, `{"op": "cancel", "stream"}`, `{"op": "publish", "stream",
//! "message"}`. From the server: `{"stream", "seq", "message"}` (CUI), `{"stream", "chunk"}` (OpenAI),
//! `{"stream", "done": true, "status"}` when a stream ends, `{"stream"?, "error": {"message", "code"}}`, and
//! small acknowledgements (`{"stream", "published": seq}`, `{"stream", "subscribed": true}`, ...). A frame
//! that is not JSON or not a known op gets an error and the connection stays open.
//!
//! Each subscription runs in its own task that pulls batches from the hub and hands them to the one
//! writer through a bounded channel; the writer feeds a batch's messages and flushes once. A slow socket
//! therefore stops the pulls, the hub's byte bound turns that into a `lagged` error for that subscription,
//! and nobody else waits. The server's frames are re-wrapped from the SSE renditions (the JSON is sliced,
//! not parsed), so WebSocket subscribers share the rendering with SSE ones. Frame and message sizes are
//! bounded; the per-stream endpoint closes with a reason when its stream ends or its subscriber lags.

use std::collections::HashMap;
use std::sync::Arc;

use axum::extract::ws::{CloseFrame, Message, Utf8Bytes, WebSocket, WebSocketUpgrade, close_code};
use axum::extract::{Path, Query, State};
use axum::response::Response;
use bytes::Bytes;
use futures::{SinkExt, StreamExt};
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tracing::Instrument;

use super::streams::{SubscribeQuery, find, parse_format};
use super::{App, HttpError};
use crate::hub::{Format, Stream, Subscription};
use crate::output::OutputMessage;

/// What the writer sends.
enum Outgoing {
    /// Messages to feed, then one flush.
    Batch(Vec<Message>),
    /// A subscription ended: for the per-stream endpoint, close with this reason.
    Ended { stream: String, reason: &'static str },
}

/// `GET /v1/streams/{id}/ws`.
pub(crate) async fn one(
    State(app): State<App>,
    Path(id): Path<String>,
    Query(query): Query<SubscribeQuery>,
    upgrade: WebSocketUpgrade,
) -> Result<Response, HttpError> {
    let stream = find(&app, &id)?;
    let format = query.format()?;
    let from = query.from(&Default::default())?;
    let subscription = stream.subscribe(format, from)?;
    let span = tracing::info_span!("ws", stream = stream.id());
    Ok(limits(upgrade, &app)
        .on_upgrade(move |socket| connection(app, socket, Some((stream, subscription, format))).instrument(span)))
}

/// `GET /v1/ws`.
pub(crate) async fn many(State(app): State<App>, upgrade: WebSocketUpgrade) -> Response {
    let span = tracing::info_span!("ws", stream = "*");
    limits(upgrade, &app).on_upgrade(move |socket| connection(app, socket, None).instrument(span))
}

fn limits(upgrade: WebSocketUpgrade, app: &App) -> WebSocketUpgrade {
    let max = app.settings.ws_max_message;
    upgrade.max_message_size(max).max_frame_size(max)
}

#[derive(Debug, Deserialize)]
#[serde(tag = "op", rename_all = "lowercase")]
enum Op {
    Subscribe { stream: String, format: Option<String>, from: Option<u64>, include_usage: Option<bool> },
    Unsubscribe { stream: String },
    Cancel { stream: String },
    Publish { stream: String, message: Value },
}

async fn connection(app: App, socket: WebSocket, initial: Option<(Arc<Stream>, Subscription, Format)>) {
    let single = initial.as_ref().map(|(stream, _, _)| stream.id().to_owned());
    let (mut sink, mut source) = socket.split();
    let (tx, mut rx) = mpsc::channel::<Outgoing>(64);
    let mut subscriptions: HashMap<String, JoinHandle<()>> = HashMap::new();
    if let Some((stream, subscription, format)) = initial {
        subscriptions.insert(stream.id().to_owned(), tokio::spawn(forward(stream, subscription, format, tx.clone())));
    }
    let close = loop {
        tokio::select! {
            incoming = source.next() => match incoming {
                None => break None,
                Some(Err(error)) => {
                    tracing::debug!(%error, "websocket read failed");
                    break Some(close_frame(close_code::SIZE, &format!("read failed: {error}")));
                }
                Some(Ok(Message::Close(_))) => break None,
                Some(Ok(Message::Text(text))) => {
                    let replies = handle(&app, text.as_str(), &mut subscriptions, &tx);
                    if send(&mut sink, replies).await.is_err() {
                        break None;
                    }
                }
                Some(Ok(Message::Binary(_))) => {
                    let reply = error_message(None, "binary frames are not supported; send JSON text", "unsupported");
                    if send(&mut sink, vec![reply]).await.is_err() {
                        break None;
                    }
                }
                Some(Ok(_)) => {}
            },
            outgoing = rx.recv() => match outgoing {
                Some(Outgoing::Batch(messages)) => {
                    if send(&mut sink, messages).await.is_err() {
                        break None;
                    }
                }
                Some(Outgoing::Ended { stream, reason }) => {
                    subscriptions.remove(&stream);
                    if single.as_deref() == Some(stream.as_str()) {
                        break Some(close_frame(close_code::NORMAL, reason));
                    }
                }
                None => break None,
            },
        }
    };
    subscriptions.values().for_each(JoinHandle::abort);
    if let Some(frame) = close {
        let _ = sink.send(Message::Close(Some(frame))).await;
    }
    let _ = sink.close().await;
}

fn close_frame(code: u16, reason: &str) -> CloseFrame {
    // A close reason is at most 123 bytes.
    let mut end = reason.len().min(120);
    while !reason.is_char_boundary(end) {
        end -= 1;
    }
    CloseFrame { code, reason: Utf8Bytes::from(&reason[..end]) }
}

async fn send(
    sink: &mut futures::stream::SplitSink<WebSocket, Message>,
    messages: Vec<Message>,
) -> Result<(), axum::Error> {
    for message in messages {
        sink.feed(message).await?;
    }
    sink.flush().await
}

/// Handles one client frame; returns the replies to send at once.
fn handle(
    app: &App,
    text: &str,
    subscriptions: &mut HashMap<String, JoinHandle<()>>,
    tx: &mpsc::Sender<Outgoing>,
) -> Vec<Message> {
    let op: Op = match serde_json::from_str(text) {
        Ok(op) => op,
        Err(error) => {
            let code = if serde_json::from_str::<Value>(text).is_ok() { "invalid_op" } else { "invalid_json" };
            return vec![error_message(None, &format!("frame not understood: {error}"), code)];
        }
    };
    let result = match op {
        Op::Subscribe { stream, format, from, include_usage } => (|| {
            let found = find(app, &stream)?;
            if subscriptions.get(&stream).is_some_and(|task| !task.is_finished()) {
                return Err(HttpError::bad_request(
                    "already subscribed to this stream",
                    Some("stream".into()),
                    "already_subscribed",
                ));
            }
            let format = parse_format(format.as_deref(), include_usage.unwrap_or(false), None)?;
            let subscription = found.subscribe(format, from.unwrap_or(0))?;
            subscriptions.insert(stream.clone(), tokio::spawn(forward(found, subscription, format, tx.clone())));
            Ok(json!({ "stream": stream, "subscribed": true }))
        })(),
        Op::Unsubscribe { stream } => match subscriptions.remove(&stream) {
            Some(task) => {
                task.abort();
                Ok(json!({ "stream": stream, "unsubscribed": true }))
            }
            None => {
                Err(HttpError::bad_request("not subscribed to this stream", Some("stream".into()), "not_subscribed"))
            }
        },
        Op::Cancel { stream } => find(app, &stream).and_then(|found| {
            if found.cancel() {
                Ok(json!({ "stream": stream, "cancelled": true }))
            } else {
                Err(crate::hub::AppendError::Ended.into())
            }
        }),
        Op::Publish { stream, message } => find(app, &stream).and_then(|found| {
            let message = OutputMessage::from_value(message).map_err(|e| HttpError::from(e).within("message"))?;
            let sequence = found.append(message).map_err(|e| HttpError::from(e).within("message"))?;
            Ok(json!({ "stream": stream, "published": sequence }))
        }),
    };
    let reply = match result {
        Ok(reply) => reply,
        Err(error) => {
            let mut body = json!({ "error": { "message": error.error.message, "code": error.error.code } });
            if let Some(param) = error.error.param {
                body["error"]["param"] = json!(param);
            }
            body
        }
    };
    vec![Message::Text(reply.to_string().into())]
}

fn error_message(stream: Option<&str>, message: &str, code: &str) -> Message {
    let mut body = json!({ "error": { "message": message, "code": code } });
    if let Some(stream) = stream {
        body["stream"] = json!(stream);
    }
    Message::Text(body.to_string().into())
}

/// Pulls a subscription's batches and hands them to the writer as WebSocket messages.
async fn forward(stream: Arc<Stream>, mut subscription: Subscription, format: Format, tx: mpsc::Sender<Outgoing>) {
    let id = stream.id().to_owned();
    let quoted = serde_json::to_string(&id).unwrap_or_else(|_| "\"\"".into());
    while let Some(batch) = subscription.next().await {
        if batch.lagged {
            let message =
                format!("this subscriber fell too far behind; subscribe again with from={}", batch.last_sequence);
            let body = json!({ "stream": id, "error": { "message": message, "code": "lagged", "resume_from": batch.last_sequence } });
            let _ = tx.send(Outgoing::Batch(vec![Message::Text(body.to_string().into())])).await;
            let _ = tx.send(Outgoing::Ended { stream: id, reason: "lagged" }).await;
            return;
        }
        let messages = batch.frames().iter().filter_map(|frame| rewrap(&quoted, format, frame)).collect();
        if tx.send(Outgoing::Batch(messages)).await.is_err() {
            return;
        }
    }
    let done = json!({ "stream": id, "done": true, "status": stream.status() });
    let _ = tx.send(Outgoing::Batch(vec![Message::Text(done.to_string().into())])).await;
    let _ = tx.send(Outgoing::Ended { stream: id, reason: "stream ended" }).await;
}

/// An SSE frame as a WebSocket message: `{"stream","seq","message"}`, `{"stream","chunk"}`, or
/// `{"stream","error"}`; `[DONE]` has none (the `done` message follows when the subscription ends).
fn rewrap(quoted_stream: &str, format: Format, frame: &Bytes) -> Option<Message> {
    let text = std::str::from_utf8(frame).ok()?;
    let mut sequence = None;
    let mut data = None;
    for line in text.lines() {
        if let Some(id) = line.strip_prefix("id: ") {
            sequence = id.parse::<u64>().ok();
        } else if let Some(payload) = line.strip_prefix("data: ") {
            data = Some(payload);
        }
    }
    let data = data?;
    let wrapped = if data == "[DONE]" {
        return None;
    } else if data.starts_with("{\"error\":") {
        format!("{{\"stream\":{quoted_stream},{}", &data[1..])
    } else if format == Format::Cui {
        match sequence {
            Some(sequence) => format!("{{\"stream\":{quoted_stream},\"seq\":{sequence},\"message\":{data}}}"),
            None => format!("{{\"stream\":{quoted_stream},\"message\":{data}}}"),
        }
    } else {
        format!("{{\"stream\":{quoted_stream},\"chunk\":{data}}}")
    };
    Some(Message::Text(wrapped.into()))
}
