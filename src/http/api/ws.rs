//! WebSocket subscribers: `GET /v1/streams/{id}/ws` for one stream (its upgrade answer names the stream's
//! epoch in `x-agentmux-epoch`, as an SSE answer does), `GET /v1/ws` for several at once.
//!
//! Both speak one protocol of JSON text frames. From the client: `{"op": "subscribe", "stream", "format"?,
//! "from"?, "include_usage"?, "reasoning"?, "agent_tools"?}`, `{"op": "unsubscribe", "stream"}`, `{"op":
//! "cancel", "stream"}`, `{"op": "publish", "stream", "message", "after"?, "idempotency_key"?}` (a
//! conditional publish is safe to retry, as an HTTP append with `?after` and `Idempotency-Key` is),
//! `{"op": "end_message", "stream", "message_id"}` and `{"op": "end_block", "stream", "block_id"}`. From the
//! server: the stream's WebSocket rendition (`crate::render`: `{"stream", "seq", "message"}` for CUI,
//! `{"stream", "chunk"}` for OpenAI, `{"stream", "error"}`, and `{"stream", "done": true, "status"}` at the
//! end), error replies `{"stream"?, "error": {"message", "code", "param"?, "last_sequence"?}}`, and small
//! acknowledgements (`{"stream", "published": seq, "last_sequence", "replayed"?}`, `{"stream", "sequences",
//! "last_sequence"}` for an end, `{"stream", "subscribed": true}`, ...), in the order of the frames they
//! answer. `published` means kept, as an HTTP append's answer does: it comes once the message is committed
//! (with the store; taken by Redis with `--engine redis`; at once in memory), without holding back the
//! frames behind it, so pipelined publishes are acknowledged as their commits land; an end's reply too. A
//! text frame that is not JSON or not a known op gets an error reply (with `param` naming the op's field
//! where one is at fault) and the connection stays open. What cannot be read closes it, and so does the end
//! of the stream a per-stream connection watches, a client silent past the idle timeout, or the shutdown:
//! the loop that relays a connection's subscriptions, pings its client and reads its frames is
//! `transport/ws.rs`'s; this file knows the ops and what they do. A connection opened with a key holds one
//! of the key's `connections=` for as long as it is open (`upgrade.rs`, `Upgrade`).
//!
//! With API keys configured, a connection may do what the credential it opened with grants
//! (`edge/auth.rs`): a key, everything; a stream token, that stream only, and `publish`, the ends and
//! `cancel` only with its write token. Any other op gets the error reply `permission_denied` and the connection stays open.
//! Client frame and message sizes are bounded ([`limits`]).

use std::sync::Arc;

use axum::Extension;
use axum::extract::State;
use axum::http::{HeaderMap, Method};
use axum::response::Response;
use axum::routing::get;
use serde::Deserialize;
use serde_json::{Value, json};
use tracing::Instrument;

use super::endpoint::{Endpoint, endpoint, op};
use super::format::FormatFields;
use super::streams::{SubscribeQuery, find, not_kept, with_epoch};
use super::upgrade::Upgrade;
use crate::http::app::App;
use crate::http::edge::auth::{Access, Grant};
use crate::http::edge::error::HttpError;
use crate::http::edge::extract::{Params, StreamId};
#[cfg(feature = "redis")]
use crate::http::edge::forward;
use crate::http::transport::feed::Feeds;
use crate::http::transport::upgrade::UpgradedSocket;
use crate::http::transport::ws::{Liveness, Reply, WebSocketConnection, WsRelay, batches};
use crate::hub::{AppendError, Appended, Condition, KEY_BYTES, Part, Stream};
use crate::output::OutputMessage;
use crate::render::ws::text_frame;
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
    // At debug level: a span lives as long as the connection, and an enabled one costs each connection
    // about 0.6 KiB (its fields formatted, its extensions).
    let span = tracing::debug_span!("ws", stream = stream.id());
    let single = (stream.id().to_owned(), WsRelay::new(subscription, meter));
    let sockets = app.lifetime.sockets.clone();
    let response = upgrade.on_upgrade(move |socket| {
        let connection = open(&app, socket, Some(single));
        sockets.track_future(serve(app.shared(), grant, connection).instrument(span))
    });
    Ok(with_epoch(response, &stream))
}

/// `GET /v1/ws`.
pub(crate) async fn many(State(app): State<App>, Extension(grant): Extension<Grant>, upgrade: Upgrade) -> Response {
    let span = tracing::debug_span!("ws", stream = "*");
    let sockets = app.lifetime.sockets.clone();
    upgrade.on_upgrade(move |socket| {
        let connection = open(&app, socket, None);
        sockets.track_future(serve(app.shared(), grant, connection).instrument(span))
    })
}

#[derive(Debug, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
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
        /// The message must follow this sequence (see `crate::hub::Condition`).
        after: Option<u64>,
        idempotency_key: Option<String>,
    },
    EndMessage {
        stream: String,
        message_id: String,
    },
    EndBlock {
        stream: String,
        block_id: String,
    },
}

/// The connection on an upgraded `socket`, with the service's settings; `single` when it was opened on one
/// stream.
fn open(app: &App, socket: UpgradedSocket, single: Option<(String, WsRelay)>) -> WebSocketConnection {
    let liveness =
        Liveness { ping_interval: app.settings.ws_ping_interval, idle_timeout: app.settings.ws_idle_timeout };
    let (lifetime, max, feeds) = (app.lifetime.clone(), app.settings.ws_max_message, app.feeds.clone());
    WebSocketConnection::new(socket, lifetime, liveness, max, feeds, single)
}

/// Serves a connection: each client text frame is an op, answered with its reply, until the connection
/// ends (see `transport/ws.rs`). The connection is made before (`open`): what an async function is given
/// stays in its future for as long as it runs, so a socket and a subscription given here would be held twice.
async fn serve(app: Arc<App>, grant: Grant, mut connection: WebSocketConnection) {
    // The op's future and the close's are boxed: held only while they run, so a connection that waits (nearly
    // all of them, nearly always) holds no room for them in its task.
    while let Some(text) = connection.next_text().await {
        let reply = match Box::pin(handle(&app, &grant, &text, &mut connection)).await {
            Ok(Answer::Now(reply)) => Box::pin(std::future::ready(text_of(&reply))),
            Ok(Answer::Kept { stream, appended, on, published }) => {
                kept(stream, appended, on, published, app.feeds.clone())
            }
            Err(error) => Box::pin(std::future::ready(text_of(&error_reply(error)))),
        };
        connection.reply(reply);
    }
    Box::pin(connection.close()).await;
}

/// What an op answers: its reply now, or a publish's or an end's acknowledged once what it appended is kept.
enum Answer {
    Now(Value),
    Kept { stream: String, appended: Appended, on: Arc<Stream>, published: bool },
}

/// The reply to a publish (`{"stream", "published": seq, "last_sequence"}`, with `"replayed": true` for a
/// repeat) or to an end (`{"stream", "sequences", "last_sequence"}`) once what it appended is kept, as an
/// HTTP append's answer is (see `Stream::kept`): in memory at once, with the store once committed, with
/// Redis once it took it. What could not be kept is the error reply `store_unavailable`, once its stream
/// has ended. Like an HTTP append's answer, it also waits while the stream is far ahead of its readers
/// (`Feeds::paced`): a client that pipelines publishes is held by the bound on replies waiting, so it
/// publishes no faster than the pass over its readers that keep up.
fn kept(stream: String, appended: Appended, on: Arc<Stream>, published: bool, feeds: Feeds) -> Reply {
    Box::pin(async move {
        let last = appended.sequences.last().copied();
        if !appended.replayed {
            feeds.paced(&on).await;
        }
        let reply = if on.kept(last.unwrap_or(0)).await {
            appended_reply(stream, &appended, published)
        } else {
            let mut reply = error_reply(not_kept(&on).await);
            reply["stream"] = json!(stream);
            reply
        };
        text_of(&reply)
    })
}

/// The reply to a publish or an end, as [`kept`] describes it.
fn appended_reply(stream: String, appended: &Appended, published: bool) -> Value {
    let mut reply = if published {
        json!({ "stream": stream, "published": appended.sequences.first(), "last_sequence": appended.last_sequence })
    } else {
        json!({ "stream": stream, "sequences": appended.sequences, "last_sequence": appended.last_sequence })
    };
    if appended.replayed {
        reply["replayed"] = json!(true);
    }
    reply
}

/// Handles one client frame, as far as the connection's credential allows; returns the answer.
async fn handle(
    app: &App,
    grant: &Grant,
    text: &str,
    connection: &mut WebSocketConnection,
) -> Result<Answer, HttpError> {
    let op: Op = serde_json::from_str(text).map_err(|error| {
        let code = if serde_json::from_str::<Value>(text).is_ok() { "invalid_op" } else { "invalid_json" };
        HttpError::bad_request(format!("frame not understood: {error}"), None, code)
    })?;
    let (stream, needed) = match &op {
        Op::Subscribe { stream, .. } | Op::Unsubscribe { stream } => (stream, Access::Read),
        Op::Cancel { stream }
        | Op::Publish { stream, .. }
        | Op::EndMessage { stream, .. }
        | Op::EndBlock { stream, .. } => (stream, Access::Write),
    };
    if !grant.allows(stream, needed) {
        return Err(Grant::refusal());
    }
    // The stream an op acts on is found (or followed from another node) before the op is applied.
    match op {
        Op::Subscribe { stream, from, format } => {
            let found = find_op(app, &stream).await?;
            // Its reply comes after every reply owed before it, and before anything the subscription sends.
            connection.settle().await;
            subscribe(app, connection, stream, from, format, &found)
        }
        Op::Unsubscribe { stream } => match connection.unwatch(&stream) {
            true => Ok(Answer::Now(json!({ "stream": stream, "unsubscribed": true }))),
            false => {
                Err(HttpError::bad_request("not subscribed to this stream", Some("stream".into()), "not_subscribed"))
            }
        },
        Op::Cancel { stream } => {
            let found = find_op(app, &stream).await?;
            #[cfg(feature = "redis")]
            if found.is_followed() && !found.log().is_ended() {
                forward::post_to_writer(app, &stream, "cancel", Vec::new(), None).await?;
                return Ok(Answer::Now(json!({ "stream": stream, "cancelled": true })));
            }
            if !found.cancel() {
                return Err(crate::hub::AppendError::Ended.into());
            }
            Ok(Answer::Now(json!({ "stream": stream, "cancelled": true })))
        }
        Op::Publish { stream, message, after, idempotency_key } => {
            let found = find_op(app, &stream).await?;
            let message = OutputMessage::from_value(message).map_err(|e| HttpError::from(e).within("message"))?;
            let condition = Condition { after, key: op_key(idempotency_key)? };
            // A conditional publish goes to the writer even once the stream has ended: a repeat is answered there.
            #[cfg(feature = "redis")]
            if found.is_followed() && (!found.log().is_ended() || !condition.is_none()) {
                return publish_elsewhere(app, stream, &message, &condition).await;
            }
            let appended = found.append_if(vec![message], &condition).map_err(|e| publish_refusal(e.error))?;
            if !appended.replayed {
                app.metrics.published();
            }
            Ok(Answer::Kept { stream, appended, on: found, published: true })
        }
        Op::EndMessage { stream, message_id } => end_part(app, stream, Part::Message(&message_id)).await,
        Op::EndBlock { stream, block_id } => end_part(app, stream, Part::Block(&block_id)).await,
    }
}

/// A publish's `idempotency_key`, checked as the HTTP header is.
fn op_key(key: Option<String>) -> Result<Option<String>, HttpError> {
    match key {
        Some(key) if !Condition::valid_key(&key) => Err(HttpError::bad_request(
            format!("idempotency_key must be 1 to {KEY_BYTES} visible ASCII characters"),
            Some("idempotency_key".into()),
            "invalid_value",
        )),
        key => Ok(key),
    }
}

/// A refused publish: the message's fault names `message`, a condition's names its field.
fn publish_refusal(error: AppendError) -> HttpError {
    match error {
        AppendError::SequenceConflict { .. } => HttpError::from(error),
        AppendError::KeyReused { .. } => HttpError::from(error).with_param("idempotency_key"),
        other => HttpError::from(other).within("message"),
    }
}

/// `end_message` and `end_block`: what the HTTP routes do, answered once kept (or by the stream's writer).
async fn end_part(app: &App, stream: String, part: Part<'_>) -> Result<Answer, HttpError> {
    let found = find_op(app, &stream).await?;
    #[cfg(feature = "redis")]
    if found.is_followed() && !found.log().is_ended() {
        let action = match part {
            Part::Message(id) => format!("messages/{}/end", forward::path_segment(id)),
            Part::Block(id) => format!("blocks/{}/end", forward::path_segment(id)),
        };
        let answer = forward::post_to_writer(app, &stream, &action, Vec::new(), None).await?.body;
        return Ok(Answer::Now(json!({ "stream": stream, "sequences": answer["sequences"],
                                      "last_sequence": answer["last_sequence"] })));
    }
    let appended = found.end_part(part)?;
    Ok(Answer::Kept { stream, appended, on: found, published: false })
}

/// `subscribe`: the stream in a format, from a point, unless the connection has it already.
fn subscribe(
    app: &App,
    connection: &mut WebSocketConnection,
    stream: String,
    from: Option<u64>,
    format: FormatFields,
    found: &Arc<Stream>,
) -> Result<Answer, HttpError> {
    if connection.watches(&stream) {
        return Err(HttpError::bad_request(
            "already subscribed to this stream",
            Some("stream".into()),
            "already_subscribed",
        ));
    }
    let format: Format = format.format()?;
    let subscription = found.subscribe(View::new(format, Encoding::WebSocket), from.unwrap_or(0))?;
    let meter = app.metrics.subscriber(format.name(), "websocket");
    connection.watch(stream.clone(), batches(subscription, meter));
    Ok(Answer::Now(json!({ "stream": stream, "subscribed": true })))
}

/// `publish` to a stream another node writes: forwarded to its writer with its condition, which answers
/// once it is kept.
#[cfg(feature = "redis")]
/// The message was checked here first, so a message refused for its shape is refused as it would be there.
async fn publish_elsewhere(
    app: &App,
    stream: String,
    message: &OutputMessage,
    condition: &Condition,
) -> Result<Answer, HttpError> {
    let body = serde_json::to_vec(message).unwrap_or_default();
    let action = match condition.after {
        Some(after) => format!("messages?after={after}"),
        None => "messages".to_owned(),
    };
    let answer =
        forward::post_to_writer(app, &stream, &action, body, condition.key.as_deref()).await.map_err(|error| {
            match error.error.code.as_deref() {
                Some("idempotency_key_reused") => error.with_param("idempotency_key"),
                _ => error,
            }
        })?;
    let sequence = answer.body["sequences"][0].as_u64().ok_or_else(|| {
        HttpError::new(
            axum::http::StatusCode::BAD_GATEWAY,
            "server_error",
            "the stream's writer answered without a sequence",
            None,
            "writer_error",
        )
    })?;
    let mut reply = json!({ "stream": stream, "published": sequence, "last_sequence": answer.body["last_sequence"] });
    if answer.replayed {
        reply["replayed"] = json!(true);
    }
    Ok(Answer::Now(reply))
}

/// The error reply `{"error": {"message", "code", "param"?}}`.
fn error_reply(error: HttpError) -> Value {
    let mut body = json!({ "error": { "message": error.error.message, "code": error.error.code } });
    if let Some(param) = error.error.param {
        body["error"]["param"] = json!(param);
    }
    if let Some(last) = error.error.last_sequence {
        body["error"]["last_sequence"] = json!(last);
    }
    body
}

/// A reply as the text frame it goes out in.
fn text_of(reply: &Value) -> bytes::Bytes {
    text_frame(reply.to_string().as_bytes())
}

/// The stream an op names; an unknown one is refused with `param: "stream"`, the op's field.
async fn find_op(app: &App, stream: &str) -> Result<Arc<Stream>, HttpError> {
    find(app, stream).await.map_err(|mut error| {
        error.error.param.get_or_insert_with(|| "stream".into());
        error
    })
}
