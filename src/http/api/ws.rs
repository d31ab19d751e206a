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
//! closes it, and so does the end of the stream a per-stream connection watches, a client silent past the
//! idle timeout, or the shutdown: the loop that relays a connection's subscriptions, pings its client and
//! reads its frames is `transport/ws.rs`'s; this file knows the ops and what they do. A connection opened
//! with a key holds one of the key's `connections=` for as long as it is open (`edge/extract.rs`, `Upgrade`).
//!
//! With API keys configured, a connection may do what the credential it opened with grants
//! (`edge/auth.rs`): a key, everything; a stream token, that stream only, and `publish` and `cancel` only with
//! its write token. Any other op gets the error reply `permission_denied` and the connection stays open.
//! Client frame and message sizes are bounded ([`limits`]).

use axum::Extension;
use axum::extract::State;
use axum::extract::ws::{Message, WebSocket};
use axum::http::{HeaderMap, Method};
use axum::response::Response;
use axum::routing::get;
use serde::Deserialize;
use serde_json::{Value, json};
use tracing::Instrument;

use super::endpoint::{Endpoint, endpoint, op};
use super::format::FormatFields;
use super::streams::{SubscribeQuery, find};
use crate::http::app::App;
use crate::http::edge::auth::{Access, Grant};
use crate::http::edge::error::HttpError;
use crate::http::edge::extract::{Params, StreamId, Upgrade};
#[cfg(feature = "redis")]
use crate::http::edge::forward;
use crate::http::transport::ws::{Batches, Liveness, Subscriptions, WebSocketConnection, batches};
use crate::output::OutputMessage;
use crate::render::{Encoding, Format, View};

/// The WebSocket endpoints, and what the OpenAPI document says of them.
pub(crate) fn endpoints() -> Vec<Endpoint> {
    vec![
        endpoint(
            Method::GET,
            "/v1/streams/{id}/ws",
            get(one),
            op("Subscribe over a WebSocket", "streams", None, vec![(101, "Switching protocols", vec![])]),
        ),
        endpoint(
            Method::GET,
            "/v1/ws",
            get(many),
            op(
                "One WebSocket for many streams, and producers",
                "streams",
                None,
                vec![(101, "Switching protocols", vec![])],
            ),
        ),
    ]
}

/// `GET /v1/streams/{id}/ws`.
pub(crate) async fn one(
    State(app): State<App>,
    Extension(grant): Extension<Grant>,
    StreamId(id): StreamId,
    Params(query): Params<SubscribeQuery>,
    headers: HeaderMap,
    upgrade: Upgrade,
) -> Result<Response, HttpError> {
    let stream = find(&app, &id).await?;
    let format = query.format()?;
    let from = query.from(&headers)?;
    let subscription = stream.subscribe(View::new(format, Encoding::WebSocket), from)?;
    let meter = app.metrics.subscriber(format.name(), "websocket");
    let span = tracing::info_span!("ws", stream = stream.id());
    let single = (stream.id().to_owned(), batches(subscription, meter));
    let sockets = app.lifetime.sockets.clone();
    Ok(limits(upgrade, &app)
        .on_upgrade(move |socket| sockets.track_future(connection(app, grant, socket, Some(single)).instrument(span))))
}

/// `GET /v1/ws`.
pub(crate) async fn many(State(app): State<App>, Extension(grant): Extension<Grant>, upgrade: Upgrade) -> Response {
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

/// The upgrade with the service's limits on client frames and messages, and the socket's buffers.
fn limits(upgrade: Upgrade, app: &App) -> Upgrade {
    let max = app.settings.ws_max_message;
    upgrade.configure(|upgrade| {
        upgrade.max_message_size(max).max_frame_size(max).write_buffer_size(WRITE_BUFFER).read_buffer_size(READ_BUFFER)
    })
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

/// Serves a connection: each client text frame is an op, answered with its reply, until the connection
/// ends (see `transport/ws.rs`).
async fn connection(app: App, grant: Grant, socket: WebSocket, single: Option<(String, Batches)>) {
    let liveness =
        Liveness { ping_interval: app.settings.ws_ping_interval, idle_timeout: app.settings.ws_idle_timeout };
    let mut connection = WebSocketConnection::new(socket, app.lifetime.clone(), liveness, single);
    while let Some(text) = connection.next_text().await {
        let reply = handle(&app, &grant, text.as_str(), connection.subscriptions()).await;
        connection.reply(reply).await;
    }
    connection.close().await;
}

/// Handles one client frame, as far as the connection's credential allows; returns the reply.
async fn handle(app: &App, grant: &Grant, text: &str, subscriptions: &mut Subscriptions) -> Message {
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
        (Op::Unsubscribe { stream }, _) => match subscriptions.remove(&stream) {
            Some(_) => Ok(json!({ "stream": stream, "unsubscribed": true })),
            None => {
                Err(HttpError::bad_request("not subscribed to this stream", Some("stream".into()), "not_subscribed"))
            }
        },
        (_, None) => Err(Grant::refusal()),
        (_, Some(Err(error))) => Err(error),
        (Op::Subscribe { stream, from, format }, Some(Ok(found))) => (|| {
            if subscriptions.contains_key(&stream) {
                return Err(HttpError::bad_request(
                    "already subscribed to this stream",
                    Some("stream".into()),
                    "already_subscribed",
                ));
            }
            let format: Format = format.format()?;
            let subscription = found.subscribe(View::new(format, Encoding::WebSocket), from.unwrap_or(0))?;
            let meter = app.metrics.subscriber(format.name(), "websocket");
            subscriptions.insert(stream.clone(), batches(subscription, meter));
            Ok(json!({ "stream": stream, "subscribed": true }))
        })(),
        #[cfg(feature = "redis")]
        (Op::Cancel { stream }, Some(Ok(found))) if found.is_followed() && !found.log().is_ended() => {
            forward::post_to_writer(app, &stream, "cancel", Vec::new())
                .await
                .map(|_| json!({ "stream": stream, "cancelled": true }))
        }
        #[cfg(feature = "redis")]
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
