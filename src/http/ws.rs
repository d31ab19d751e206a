//! WebSocket subscribers: `GET /v1/streams/{id}/ws` for one stream, `GET /v1/ws` for several at once.
//!
//! Both speak one protocol of JSON text frames. From the client: `{"op": "subscribe", "stream", "format"?,
//! "from"?, "include_usage"?, "reasoning"?, "agent_tools"?}`, `{"op": "unsubscribe", "stream"}`, `{"op": "cancel", "stream"}`,
//! `{"op": "publish", "stream", "message"}`. From the server: the stream's WebSocket rendition
//! (`crate::render`: `{"stream", "seq", "message"}` for CUI, `{"stream", "chunk"}` for OpenAI, `{"stream",
//! "error"}`, and `{"stream", "done": true, "status"}` at the end), error replies `{"stream"?, "error":
//! {"message", "code"}}`, and small acknowledgements (`{"stream", "published": seq}`, `{"stream",
//! "subscribed": true}`, ...). A text frame that is not JSON or not a known op gets an error reply (with
//! `param` naming the op's field where one is at fault) and the connection stays open. What cannot be read
//! closes it with the code that fits: 1003 for a binary frame, 1009 for a message over the limit, 1007 for
//! text that is not UTF-8, 1002 for a broken frame; the reason is written for the client. On shutdown a
//! connection sends what its streams still owe (their `done` included) and closes with 1001.
//!
//! With API keys configured, a connection may do what the credential it opened with grants (`auth.rs`): a
//! key, everything; a stream token, that stream only, and `publish` and `cancel` only with its write token.
//! Any other op gets the error reply `permission_denied` and the connection stays open.
//!
//! A connection's subscriptions are cursors into their streams' shared renditions, polled together by the
//! connection's one task: it takes a batch only when the socket has taken the last one, so a connection
//! has at most one batch (up to the hub's batch limit) in flight, however many streams it watches and
//! however slowly it reads, and a reader that is behind costs the server no more than an SSE one. The
//! bytes it writes were encoded once per stream for every WebSocket subscriber of that format; nothing is
//! parsed or re-wrapped here. Client frame and message sizes are bounded; the per-stream endpoint closes
//! with 1000 when its stream ends, or with the reason `lagged` when its history is gone.

use std::pin::Pin;

use axum::Extension;
use axum::extract::State;
use axum::extract::ws::{CloseFrame, Message, Utf8Bytes, WebSocket, WebSocketUpgrade, close_code};
use axum::http::HeaderMap;
use axum::response::Response;
use futures::{SinkExt, StreamExt};
use serde::Deserialize;
use serde_json::{Value, json};
use tokio_stream::StreamMap;
use tracing::Instrument;

use super::auth::{Access, Grant};
use super::extract::{Params, StreamId, Upgrade};
use super::format::FormatFields;
use super::metrics::Counted;
use super::streams::{SubscribeQuery, find};
use super::{App, HttpError, forward};
use crate::hub::{Batch, Subscription};
use crate::output::OutputMessage;
use crate::render::{Encoding, Format, View};

/// A subscription's batches, then `None` once when it ends.
type Feed = Pin<Box<dyn futures::Stream<Item = Option<Batch>> + Send>>;

/// `GET /v1/streams/{id}/ws`.
pub(crate) async fn one(
    State(app): State<App>,
    Extension(grant): Extension<Grant>,
    StreamId(id): StreamId,
    Params(query): Params<SubscribeQuery>,
    headers: HeaderMap,
    Upgrade(upgrade): Upgrade,
) -> Result<Response, HttpError> {
    let stream = find(&app, &id).await?;
    let format = query.format()?;
    let from = query.from(&headers)?;
    let subscription = stream.subscribe(View::new(format, Encoding::WebSocket), from)?;
    let counted = app.metrics.subscriber(format.name(), "websocket");
    let span = tracing::info_span!("ws", stream = stream.id());
    let id = stream.id().to_owned();
    let sockets = app.lifetime.sockets.clone();
    Ok(limits(upgrade, &app).on_upgrade(move |socket| {
        sockets.track_future(connection(app, grant, socket, Some((id, subscription, counted))).instrument(span))
    }))
}

/// `GET /v1/ws`.
pub(crate) async fn many(
    State(app): State<App>,
    Extension(grant): Extension<Grant>,
    Upgrade(upgrade): Upgrade,
) -> Response {
    let span = tracing::info_span!("ws", stream = "*");
    let sockets = app.lifetime.sockets.clone();
    limits(upgrade, &app)
        .on_upgrade(move |socket| sockets.track_future(connection(app, grant, socket, None).instrument(span)))
}

/// Bytes the WebSocket writer gathers before it writes: small messages still go out many to a write, and
/// a connection whose client does not read holds at most this much (and the frame that did not fit) beyond
/// what the kernel took; the rest of its batch stays shared with every other subscriber.
const WRITE_BUFFER: usize = 8 << 10;

/// The reader's buffer: clients send small ops, and a larger message grows it as it needs (tungstenite
/// zero-fills the whole buffer on the first read, so its 128 KiB default would cost every connection that).
const READ_BUFFER: usize = 4 << 10;

fn limits(upgrade: WebSocketUpgrade, app: &App) -> WebSocketUpgrade {
    let max = app.settings.ws_max_message;
    upgrade.max_message_size(max).max_frame_size(max).write_buffer_size(WRITE_BUFFER).read_buffer_size(READ_BUFFER)
}

#[derive(Debug, Deserialize)]
#[serde(tag = "op", rename_all = "lowercase")]
enum Op {
    Subscribe {
        stream: String,
        from: Option<u64>,
        #[serde(flatten)]
        format: FormatFields,
    },
    Unsubscribe {
        stream: String,
    },
    Cancel {
        stream: String,
    },
    Publish {
        stream: String,
        message: Value,
    },
}

/// A subscription as the connection polls it, counted in the metrics while it is polled.
fn feed(subscription: Subscription, mut counted: Counted) -> Feed {
    let batches = subscription.into_stream().map(move |batch| {
        counted.delivered(&batch);
        Some(batch)
    });
    Box::pin(batches.chain(futures::stream::once(async { None })))
}

async fn connection(app: App, grant: Grant, socket: WebSocket, initial: Option<(String, Subscription, Counted)>) {
    let lifetime = app.lifetime.clone();
    let single = initial.as_ref().map(|(id, ..)| id.clone());
    let (mut sink, mut source) = socket.split();
    let mut feeds: StreamMap<String, Feed> = StreamMap::new();
    if let Some((id, subscription, counted)) = initial {
        feeds.insert(id, feed(subscription, counted));
    }
    let mut lagged = false;
    // Once the service closes, client frames are no longer read: what the streams still owe goes out, then
    // the close frame.
    let mut closing = false;
    let close = loop {
        if closing && feeds.is_empty() {
            break Some(close_frame(close_code::AWAY, "the server is shutting down"));
        }
        tokio::select! {
            () = lifetime.gone.cancelled() => return,
            () = lifetime.closing.cancelled(), if !closing => closing = true,
            incoming = source.next(), if !closing => match incoming {
                None => break None,
                Some(Err(error)) => break read_failed(&error),
                Some(Ok(Message::Close(_))) => break None,
                Some(Ok(Message::Text(text))) => {
                    let reply = handle(&app, &grant, text.as_str(), &mut feeds).await;
                    if send(&mut sink, vec![reply]).await.is_err() {
                        break None;
                    }
                }
                Some(Ok(Message::Binary(_))) => {
                    break Some(close_frame(close_code::UNSUPPORTED, "binary frames are not supported; send JSON text"));
                }
                Some(Ok(_)) => {}
            },
            Some((stream, item)) = feeds.next(), if !feeds.is_empty() => match item {
                Some(batch) => {
                    lagged |= batch.lagged;
                    if send(&mut sink, messages(&batch)).await.is_err() {
                        break None;
                    }
                }
                None => {
                    feeds.remove(&stream);
                    if single.as_deref() == Some(stream.as_str()) {
                        break Some(if lagged {
                            close_frame(close_code::NORMAL, "lagged")
                        } else if lifetime.draining.is_cancelled() {
                            close_frame(close_code::AWAY, "the server is shutting down")
                        } else {
                            close_frame(close_code::NORMAL, "stream ended")
                        });
                    }
                }
            },
        }
    };
    let goodbye = async {
        if let Some(frame) = close {
            let _ = sink.send(Message::Close(Some(frame))).await;
        }
        let _ = sink.close().await;
    };
    tokio::select! {
        () = goodbye => {}
        () = lifetime.gone.cancelled() => {}
    }
}

/// The close frame for a client frame that could not be read, by its cause; `None` when the connection
/// itself failed (nothing can be sent on it).
fn read_failed(error: &axum::Error) -> Option<CloseFrame> {
    use tungstenite::error::{CapacityError, Error as WsError};
    tracing::debug!(%error, "websocket read failed");
    let cause = std::error::Error::source(error).and_then(|e| e.downcast_ref::<WsError>());
    match cause {
        Some(WsError::Capacity(CapacityError::MessageTooLong { max_size, .. })) => {
            Some(close_frame(close_code::SIZE, &format!("a message is over the limit of {max_size} bytes")))
        }
        Some(WsError::Capacity(_)) => Some(close_frame(close_code::SIZE, "a frame is over the size limit")),
        Some(WsError::Utf8(_)) => Some(close_frame(close_code::INVALID, "a text frame is not valid UTF-8")),
        Some(WsError::Protocol(_)) => {
            Some(close_frame(close_code::PROTOCOL, "the frame breaks the WebSocket protocol"))
        }
        _ => None,
    }
}

/// A batch's frames as text messages: each frame is one JSON object (see `crate::render`).
fn messages(batch: &Batch) -> Vec<Message> {
    batch.frames().into_iter().filter_map(|frame| Utf8Bytes::try_from(frame).ok().map(Message::Text)).collect()
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

/// Handles one client frame, as far as the connection's credential allows; returns the reply.
async fn handle(app: &App, grant: &Grant, text: &str, feeds: &mut StreamMap<String, Feed>) -> Message {
    let op: Op = match serde_json::from_str(text) {
        Ok(op) => op,
        Err(error) => {
            let code = if serde_json::from_str::<Value>(text).is_ok() { "invalid_op" } else { "invalid_json" };
            return error_message(None, &format!("frame not understood: {error}"), code);
        }
    };
    let (stream, needed) = match &op {
        Op::Subscribe { stream, .. } | Op::Unsubscribe { stream } => (stream, Access::Read),
        Op::Cancel { stream } | Op::Publish { stream, .. } => (stream, Access::Write),
    };
    let allowed = grant.allows(stream, needed);
    // The stream an op acts on, found (or followed from another node) before the op is applied.
    let found = match &op {
        _ if !allowed => None,
        Op::Unsubscribe { .. } => None,
        Op::Subscribe { stream, .. } | Op::Cancel { stream } | Op::Publish { stream, .. } => {
            Some(find_op(app, stream).await)
        }
    };
    let result = match (op, found) {
        (_, None) if !allowed => Err(Grant::refusal()),
        (Op::Unsubscribe { stream }, _) => match feeds.remove(&stream) {
            Some(_) => Ok(json!({ "stream": stream, "unsubscribed": true })),
            None => {
                Err(HttpError::bad_request("not subscribed to this stream", Some("stream".into()), "not_subscribed"))
            }
        },
        (_, None) => Err(Grant::refusal()),
        (_, Some(Err(error))) => Err(error),
        (Op::Subscribe { stream, from, format }, Some(Ok(found))) => (|| {
            if feeds.contains_key(&stream) {
                return Err(HttpError::bad_request(
                    "already subscribed to this stream",
                    Some("stream".into()),
                    "already_subscribed",
                ));
            }
            let format: Format = format.format()?;
            let subscription = found.subscribe(View::new(format, Encoding::WebSocket), from.unwrap_or(0))?;
            let counted = app.metrics.subscriber(format.name(), "websocket");
            feeds.insert(stream.clone(), feed(subscription, counted));
            Ok(json!({ "stream": stream, "subscribed": true }))
        })(),
        (Op::Cancel { stream }, Some(Ok(found))) if found.is_followed() && !found.log().is_ended() => {
            forward::post_to_writer(app, &stream, "cancel", Vec::new())
                .await
                .map(|_| json!({ "stream": stream, "cancelled": true }))
        }
        (Op::Publish { stream, message }, Some(Ok(found))) if found.is_followed() && !found.log().is_ended() => {
            // Checked here first, so a message refused for its shape is refused as it would be on the writer.
            let checked = OutputMessage::from_value(message).map_err(|e| HttpError::from(e).within("message"));
            let body = checked.map(|message| serde_json::to_vec(&message).unwrap_or_default());
            let answer = match body {
                Ok(body) => forward::post_to_writer(app, &stream, "messages", body).await,
                Err(error) => Err(error),
            };
            answer.and_then(|answer| {
                let sequence = answer["sequences"][0].as_u64();
                sequence.map(|sequence| json!({ "stream": stream, "published": sequence })).ok_or_else(|| {
                    HttpError::new(
                        axum::http::StatusCode::BAD_GATEWAY,
                        "server_error",
                        "the stream's writer answered without a sequence",
                        None,
                        "writer_error",
                    )
                })
            })
        }
        (Op::Cancel { stream }, Some(Ok(found))) => {
            if found.cancel() {
                Ok(json!({ "stream": stream, "cancelled": true }))
            } else {
                Err(crate::hub::AppendError::Ended.into())
            }
        }
        (Op::Publish { stream, message }, Some(Ok(found))) => (|| {
            let message = OutputMessage::from_value(message).map_err(|e| HttpError::from(e).within("message"))?;
            let sequence = found.append(message).map_err(|e| HttpError::from(e).within("message"))?;
            app.metrics.published();
            Ok(json!({ "stream": stream, "published": sequence }))
        })(),
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
    Message::Text(reply.to_string().into())
}

/// The stream an op names; an unknown one is refused with `param: "stream"`, the op's field.
async fn find_op(app: &App, stream: &str) -> Result<std::sync::Arc<crate::hub::Stream>, HttpError> {
    find(app, stream).await.map_err(|mut error| {
        error.error.param.get_or_insert_with(|| "stream".into());
        error
    })
}

fn error_message(stream: Option<&str>, message: &str, code: &str) -> Message {
    let mut body = json!({ "error": { "message": message, "code": code } });
    if let Some(stream) = stream {
        body["stream"] = json!(stream);
    }
    Message::Text(body.to_string().into())
}
