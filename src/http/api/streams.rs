//! The stream endpoints: list, create, append, end (a stream, one message, one block), cancel, status, and
//! SSE subscribe.
//!
//! Appending takes one JSON object, a JSON array, or NDJSON (`application/x-ndjson`, one message per line);
//! every message is validated and the batch goes in whole or not at all, so an error names the message
//! (`messages[3].props.url`, and for NDJSON its line). An append may carry a condition that makes it safe
//! to retry (`?after=N`, `Idempotency-Key`): the stream checks it under its producer's lock and answers a
//! repeat with the first answer (`crate::hub::Condition`). Ending a message or a block is how an outside
//! producer closes what it streamed (a tool call's input, say) before the stream's end. Subscribing resumes after the `Last-Event-ID` header
//! (what a browser's `EventSource` sends when it reconnects), else after `from`. Resuming at the end of an
//! ended stream answers 204, which tells `EventSource` to stop reconnecting. Every answer to a subscription
//! (SSE, its 204, the WebSocket upgrade) names the stream's epoch in `x-agentmux-epoch` ([`EPOCH`]): a resumed
//! connection in a format that carries no epoch (every one but CUI's `stream_start`) still tells a reader
//! whether it is the history it was reading.

use std::sync::Arc;

use axum::Json;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use schemars::Schema;
use schemars::generate::SchemaGenerator;
use serde::Deserialize;
use serde_json::{Value, json};

use super::endpoint::Content::{EventStream, Foreign, Json as JsonOf};
use super::endpoint::{Endpoint, SchemaOf, endpoint, op};
use super::format::FormatFields;
use crate::http::app::App;
use crate::http::edge::auth::Access;
use crate::http::edge::body;
use crate::http::edge::error::HttpError;
use crate::http::edge::extract::{Client, Params, StreamId, StreamPart};
use crate::http::edge::trace::record_stream;
use crate::http::transport::sse::{self, OnDisconnect};
use crate::hub::{Appended, Condition, KEY_BYTES, NOT_KEPT, Part, Status, Stream};
use crate::output::{Outcome, OutputMessage};
use crate::render::Format;

/// The stream endpoints, and what the OpenAPI document says of them.
pub(crate) fn endpoints() -> Vec<Endpoint> {
    let snapshot: SchemaOf = |g| g.subschema_for::<crate::hub::Snapshot>();
    let mut endpoints = vec![
        endpoint(
            Method::GET,
            "/v1/streams",
            get(list),
            op(
                "The streams held, newest first, a page at a time (?limit=1..500, ?after=<next>)",
                "streams",
                None,
                vec![(
                    200,
                    "{object: list, data: [{id, status, epoch, model, created_ms, last_sequence}], has_more, next}",
                    vec![Foreign("A page of streams")],
                )],
            ),
        ),
        endpoint(
            Method::POST,
            "/v1/streams",
            post(create),
            op(
                "Create a stream for an outside producer",
                "streams",
                Some((JsonOf(|g| g.subschema_for::<CreateBody>()), false)),
                vec![(
                    201,
                    "{id, epoch, read_token, write_token, token_expires_at?}",
                    vec![Foreign("The stream and its tokens")],
                )],
            ),
        ),
        endpoint(
            Method::GET,
            "/v1/streams/{id}",
            get(status),
            op(
                "A stream's snapshot: every message with its deltas applied",
                "streams",
                None,
                vec![(200, "The snapshot", vec![JsonOf(snapshot)])],
            ),
        ),
    ];
    endpoints.extend(writes());
    endpoints.push(endpoint(
        Method::GET,
        "/v1/streams/{id}/events",
        get(events),
        op(
            "Subscribe: the stream in a format (?format=cui|openai|ui-message|ag-ui|anthropic|responses), resumable",
            "streams",
            None,
            vec![
                (
                    200,
                    "Server-sent events; each CUI event's data is an OutputMessage; x-agentmux-epoch names the \
                     stream's epoch",
                    vec![EventStream],
                ),
                (204, "Nothing to send: resumed at the end of an ended stream (with x-agentmux-epoch)", vec![]),
            ],
        ),
    ));
    endpoints
}

/// The endpoints that write to a stream: append, end one message or block, end, cancel.
fn writes() -> Vec<Endpoint> {
    let outcome: SchemaOf = |g| g.subschema_for::<crate::output::Outcome>();
    vec![
        endpoint(
            Method::POST,
            "/v1/streams/{id}/messages",
            post(append),
            op(
                "Append messages (JSON, an array, or NDJSON); answered once they are kept; safe to retry with \
                 ?after=<sequence> or an Idempotency-Key header",
                "streams",
                Some((JsonOf(messages), true)),
                vec![(
                    200,
                    "{sequences, last_sequence}; a repeat of a conditional append (?after=N, Idempotency-Key) \
                     answers the first's, with idempotent-replayed: true",
                    vec![Foreign("The sequences the messages got, and the stream's last sequence")],
                )],
            ),
        ),
        endpoint(
            Method::POST,
            "/v1/streams/{id}/messages/{message_id}/end",
            post(end_message),
            op(
                "End one open message (its message_end); a message not open ends nothing",
                "streams",
                None,
                vec![(200, "{sequences, last_sequence}", vec![Foreign("The closing events' sequences")])],
            ),
        ),
        endpoint(
            Method::POST,
            "/v1/streams/{id}/blocks/{block_id}/end",
            post(end_block),
            op(
                "End one open block (its open messages' message_end, then block_end)",
                "streams",
                None,
                vec![(200, "{sequences, last_sequence}", vec![Foreign("The closing events' sequences")])],
            ),
        ),
        endpoint(
            Method::POST,
            "/v1/streams/{id}/end",
            post(end),
            op(
                "End a stream with its outcome",
                "streams",
                Some((JsonOf(outcome), false)),
                vec![(200, "{id, status, last_sequence}", vec![Foreign("The ended stream")])],
            ),
        ),
        endpoint(
            Method::POST,
            "/v1/streams/{id}/cancel",
            post(cancel),
            op(
                "Cancel the run behind a stream",
                "streams",
                None,
                vec![(202, "Cancelled", vec![Foreign("The stream")])],
            ),
        ),
    ]
}

/// The stream named in the path.
pub(crate) async fn find(app: &App, id: &str) -> Result<Arc<Stream>, HttpError> {
    record_stream(id);
    if let Some(stream) = app.hub.get(id) {
        return Ok(stream);
    }
    // With several nodes, a stream another node writes is followed here.
    #[cfg(feature = "redis")]
    if let Some(cluster) = &app.cluster {
        return match cluster.follow(&app.hub, id).await {
            Ok(Some(stream)) => Ok(stream),
            Ok(None) => Err(HttpError::unknown_stream(id)),
            Err(error) => Err(HttpError::cluster_unavailable(&error)),
        };
    }
    Err(HttpError::unknown_stream(id))
}

#[derive(Debug, Deserialize, Default, schemars::JsonSchema)]
#[schemars(rename = "CreateStream")]
pub(crate) struct CreateBody {
    model: Option<String>,
    /// Seconds the stream's tokens are good for (none, or 0: as long as the stream).
    token_ttl: Option<u64>,
}

/// `GET /v1/streams` query: `limit` (1 to 500, default 50) and `after`, the `next` of the page before.
#[derive(Debug, Deserialize, Default)]
pub(crate) struct ListQuery {
    limit: Option<usize>,
    after: Option<String>,
}

/// The most streams a page lists.
const PAGE_LIMIT: usize = 500;

/// `GET /v1/streams`: the streams held (open, or ended within their retention), newest first, a page at a
/// time: `{"object": "list", "data": [{id, status, epoch, model, created_ms, last_sequence}], "has_more",
/// "next"}`; `next` (when more follow) is the `after` of the next page. Any key reads any stream, so the
/// list is every stream; it needs a key where keys are configured.
pub(crate) async fn list(State(app): State<App>, Params(query): Params<ListQuery>) -> Result<Response, HttpError> {
    let limit = query.limit.unwrap_or(50);
    if !(1..=PAGE_LIMIT).contains(&limit) {
        let message = format!("limit must be 1 to {PAGE_LIMIT}");
        return Err(HttpError::bad_request(message, Some("limit".into()), "invalid_value"));
    }
    let after = match query.after.as_deref() {
        None | Some("") => None,
        Some(cursor) => {
            let parsed = cursor.split_once('.').and_then(|(ms, id)| Some((ms.parse::<u64>().ok()?, id)));
            let invalid =
                || HttpError::bad_request("after is the next of a page before", Some("after".into()), "invalid_value");
            Some(parsed.ok_or_else(invalid)?)
        }
    };
    let (page, more) = app.hub.page(after, limit);
    let next = more.then(|| page.last().map(|s| format!("{}.{}", s.info().created_ms, s.id()))).flatten();
    let data: Vec<Value> = page
        .iter()
        .map(|s| {
            let info = s.info();
            json!({"id": s.id(), "status": s.status(), "epoch": info.epoch, "model": info.model,
                   "created_ms": info.created_ms, "last_sequence": s.last_sequence()})
        })
        .collect();
    Ok(Json(json!({"object": "list", "data": data, "has_more": more, "next": next})).into_response())
}

/// `POST /v1/streams`: `201 {"id", "epoch", "read_token", "write_token"}` (and `token_expires_at`, Unix
/// seconds, when the body asked for a `token_ttl` other than 0).
pub(crate) async fn create(
    State(app): State<App>,
    Client(client): Client,
    request: Body,
) -> Result<Response, HttpError> {
    app.refuse_new_work()?;
    let bytes = body::read(request, &app.settings).await?;
    let create: CreateBody = body::json_or(&bytes, CreateBody::default)?;
    let stream = app.hub.create_for(client.as_deref(), create.model.as_deref().unwrap_or("agentmux"))?;
    record_stream(stream.id());
    // Answered once the stream is kept (its `stream_start` committed): with Redis, every node knows it then.
    if !stream.readable(stream.last_sequence()).await {
        return Err(not_kept(&stream).await);
    }
    app.metrics.stream_created();
    tracing::info!(stream = stream.id(), "stream created for an outside producer");
    // 0 is "no expiry", as in the token itself, not a token that expires at once.
    let expires = match create.token_ttl {
        None | Some(0) => 0,
        Some(ttl) => app.credentials.expires_in(ttl),
    };
    let token = |access| app.credentials.token(stream.id(), access, expires);
    let mut answer = json!({
        "id": stream.id(),
        "epoch": stream.epoch(),
        "read_token": token(Access::Read),
        "write_token": token(Access::Write),
    });
    if expires != 0 {
        answer["token_expires_at"] = json!(expires);
    }
    Ok((StatusCode::CREATED, Json(answer)).into_response())
}

/// `POST /v1/streams/{id}/messages` query: `durable=false` answers once appended, without waiting for the
/// store; `after=N` appends only when the stream's last sequence is N (see [`Condition`]).
#[derive(Debug, Deserialize, Default)]
pub(crate) struct AppendQuery {
    durable: Option<bool>,
    after: Option<u64>,
}

/// The header that makes an append safe to retry, as `after` does.
pub(crate) const IDEMPOTENCY_KEY: &str = "idempotency-key";

/// The header on the answer to a repeat.
pub(crate) const REPLAYED: &str = "idempotent-replayed";

/// The header naming the stream's epoch on every answer to a subscription.
pub(crate) const EPOCH: &str = "x-agentmux-epoch";

/// `response` with the stream's epoch in [`EPOCH`].
pub(crate) fn with_epoch(mut response: Response, stream: &Stream) -> Response {
    if let Ok(epoch) = HeaderValue::from_str(stream.epoch()) {
        response.headers_mut().insert(EPOCH, epoch);
    }
    response
}

/// `POST /v1/streams/{id}/messages`: `{"sequences": [..], "last_sequence": N}`. With `?after=N` or an
/// `Idempotency-Key`, a repeat of an append that landed appends nothing and answers the first's answer with
/// `idempotent-replayed: true`.
pub(crate) async fn append(
    State(app): State<App>,
    StreamId(id): StreamId,
    Params(query): Params<AppendQuery>,
    headers: HeaderMap,
    request: Body,
) -> Result<Response, HttpError> {
    let started = std::time::Instant::now();
    let condition = Condition { after: query.after, key: idempotency_key(&headers)? };
    let stream = find(&app, &id).await?;
    let bytes = body::read(request, &app.settings).await?;
    let ndjson = headers
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|t| t.contains("ndjson") || t.contains("jsonl") || t.contains("json-seq"));
    let messages = if ndjson { ndjson_messages(&bytes)? } else { json_messages(&bytes)? };
    // The answer is the acknowledgement: it waits until the messages are kept (committed, with a store),
    // unless the producer said it need not (readers still receive them only once they are kept).
    let appended = if query.durable.unwrap_or(true) {
        let (appended, kept) = stream.append_if_kept(messages, &condition).await?;
        if !kept {
            return Err(not_kept(&stream).await);
        }
        appended
    } else {
        stream.append_if(messages, &condition)?
    };
    if !appended.replayed {
        app.metrics.appended(appended.sequences.len(), bytes.len(), started.elapsed().as_secs_f64());
        // A producer far ahead of the readers that keep up is answered once their pass has ended
        // (`transport/feed.rs`): it posts its next burst no sooner, instead of running ahead of them.
        app.feeds.paced(&stream).await;
    }
    Ok(appended_answer(&appended))
}

/// The `Idempotency-Key` header, when given: 1 to 256 visible ASCII characters.
fn idempotency_key(headers: &HeaderMap) -> Result<Option<String>, HttpError> {
    let Some(value) = headers.get(IDEMPOTENCY_KEY) else { return Ok(None) };
    match value.to_str() {
        Ok(key) if Condition::valid_key(key) => Ok(Some(key.to_owned())),
        _ => Err(HttpError::bad_request(
            format!("Idempotency-Key must be 1 to {KEY_BYTES} visible ASCII characters"),
            Some("Idempotency-Key".into()),
            "invalid_value",
        )),
    }
}

/// `{"sequences", "last_sequence"}`, with `idempotent-replayed: true` for a repeat.
fn appended_answer(appended: &Appended) -> Response {
    let mut response =
        Json(json!({ "sequences": appended.sequences, "last_sequence": appended.last_sequence })).into_response();
    if appended.replayed {
        response.headers_mut().insert(REPLAYED, HeaderValue::from_static("true"));
    }
    response
}

/// `POST /v1/streams/{id}/messages/{message_id}/end`: the message's `message_end` when it is open, answered
/// once kept: `{"sequences", "last_sequence"}` (`sequences` empty when it was not open, so a repeat is
/// harmless).
pub(crate) async fn end_message(
    State(app): State<App>,
    StreamPart(id, message_id): StreamPart,
) -> Result<Response, HttpError> {
    end_part(&app, &id, Part::Message(&message_id)).await
}

/// `POST /v1/streams/{id}/blocks/{block_id}/end`: the `message_end` of the block's open messages, then its
/// `block_end`, as [`end_message`] answers.
pub(crate) async fn end_block(
    State(app): State<App>,
    StreamPart(id, block_id): StreamPart,
) -> Result<Response, HttpError> {
    end_part(&app, &id, Part::Block(&block_id)).await
}

async fn end_part(app: &App, id: &str, part: Part<'_>) -> Result<Response, HttpError> {
    let stream = find(app, id).await?;
    let ended = ended_part(&stream, part).await?;
    Ok(appended_answer(&ended))
}

/// Ends a message or a block of `stream` and waits until what that appended is kept: the closing events'
/// sequences and the stream's last sequence.
pub(crate) async fn ended_part(stream: &Stream, part: Part<'_>) -> Result<Appended, HttpError> {
    let ended = stream.end_part(part)?;
    if let Some(&last) = ended.sequences.last()
        && !stream.readable(last).await
    {
        return Err(not_kept(stream).await);
    }
    Ok(ended)
}

fn json_messages(bytes: &[u8]) -> Result<Vec<OutputMessage>, HttpError> {
    let value: Value = body::json(bytes)?;
    let items = match value {
        Value::Array(items) => items,
        object @ Value::Object(_) => vec![object],
        _ => {
            return Err(HttpError::bad_request(
                "the body must be a message object, an array of messages, or NDJSON",
                None,
                "invalid_value",
            ));
        }
    };
    items
        .into_iter()
        .enumerate()
        .map(|(i, item)| {
            OutputMessage::from_value(item).map_err(|e| HttpError::from(e).within(&format!("messages[{i}]")))
        })
        .collect()
}

fn ndjson_messages(bytes: &[u8]) -> Result<Vec<OutputMessage>, HttpError> {
    let text = std::str::from_utf8(bytes)
        .map_err(|e| HttpError::bad_request(format!("the body is not UTF-8: {e}"), None, "invalid_json"))?;
    // One message a line: room for them all at once rather than growing a vector of large values.
    let mut messages = Vec::with_capacity(bytes.iter().filter(|&&b| b == b'\n').count() + 1);
    for (index, (line, text)) in text.lines().enumerate().filter(|(_, line)| !line.trim().is_empty()).enumerate() {
        let message = OutputMessage::from_json(text).map_err(|e| {
            let mut error = HttpError::from(e).within(&format!("messages[{index}]"));
            // The parser counts within the line: its "at line 1 column 7" is this line's column 7.
            let within = error.error.message.replace(" at line 1 column ", " at column ");
            error.error.message = format!("line {}: {within}", line + 1);
            error
        })?;
        messages.push(message);
    }
    Ok(messages)
}

/// `POST /v1/streams/{id}/end` with an [`Outcome`] (empty body: completed), refused (the stream left open)
/// when it does not fit: an error `code` over the name limit, a `stream_end` over the message size limit,
/// or more than the stream's or the hub's limits leave room for.
pub(crate) async fn end(State(app): State<App>, StreamId(id): StreamId, request: Body) -> Result<Response, HttpError> {
    let stream = find(&app, &id).await?;
    let bytes = body::read(request, &app.settings).await?;
    let outcome: Outcome = body::json_or(&bytes, Outcome::completed)?;
    // An outcome that does not fit is refused, and the stream stays open for an end with less.
    stream.try_end(outcome)?;
    stream.ended().await;
    if !stream.log().keeps() {
        return Err(not_kept(&stream).await);
    }
    Ok(Json(json!({ "id": stream.id(), "status": stream.status(), "last_sequence": stream.last_sequence() }))
        .into_response())
}

/// The store could not keep the stream's messages: the stream has ended with an error (its readers learn
/// it, see `Stream::readable`), and the producer gets 503 `store_unavailable` rather than an acknowledgement.
pub(crate) async fn not_kept(stream: &crate::hub::Stream) -> HttpError {
    // Answered once readers can see the end.
    let _ = tokio::time::timeout(std::time::Duration::from_secs(5), stream.ended()).await;
    HttpError::new(StatusCode::SERVICE_UNAVAILABLE, "server_error", NOT_KEPT, None, "store_unavailable")
}

/// `POST /v1/streams/{id}/cancel`: `202`.
pub(crate) async fn cancel(State(app): State<App>, StreamId(id): StreamId) -> Result<Response, HttpError> {
    let stream = find(&app, &id).await?;
    if !stream.cancel() {
        return Err(crate::hub::AppendError::Ended.into());
    }
    tracing::info!(stream = stream.id(), "cancelled on request");
    Ok((StatusCode::ACCEPTED, Json(json!({ "id": stream.id(), "status": stream.status() }))).into_response())
}

/// `GET /v1/streams/{id}`: the snapshot.
pub(crate) async fn status(State(app): State<App>, StreamId(id): StreamId) -> Result<Response, HttpError> {
    Ok(Json(find(&app, &id).await?.snapshot()).into_response())
}

/// A subscription's query: the format fields and `from`.
#[derive(Debug, Deserialize, Default)]
pub(crate) struct SubscribeQuery {
    format: Option<String>,
    include_usage: Option<bool>,
    reasoning: Option<String>,
    agent_tools: Option<String>,
    from: Option<u64>,
}

impl SubscribeQuery {
    /// The format asked for (`cui` by default).
    pub(crate) fn format(&self) -> Result<Format, HttpError> {
        let fields = FormatFields {
            format: self.format.clone(),
            include_usage: self.include_usage,
            reasoning: self.reasoning.clone(),
            agent_tools: self.agent_tools.clone(),
        };
        fields.format()
    }

    /// Where to resume: the `Last-Event-ID` header, else `from`, else the start. The header wins because a
    /// browser's `EventSource` sends it on every reconnect to the URL it was opened with: a `from` in that
    /// URL must not replay what the browser already has (Mercure's rule).
    pub(crate) fn from(&self, headers: &HeaderMap) -> Result<u64, HttpError> {
        let invalid = |message: String| HttpError::bad_request(message, Some("Last-Event-ID".into()), "invalid_value");
        match headers.get("last-event-id").map(|v| v.to_str().map(str::trim)) {
            None | Some(Ok("")) => Ok(self.from.unwrap_or(0)),
            Some(Ok(id)) => {
                id.parse().map_err(|_| invalid(format!("Last-Event-ID must be a sequence number, not {id:?}")))
            }
            Some(Err(_)) => Err(invalid("Last-Event-ID is not text".into())),
        }
    }

    /// True when the request resumes (by the header or `from`) rather than starting from the beginning.
    fn resumes(&self, headers: &HeaderMap) -> bool {
        self.from.is_some() || self.resumes_by_header(headers)
    }

    /// True when the `Last-Event-ID` header says where to resume.
    fn resumes_by_header(&self, headers: &HeaderMap) -> bool {
        headers.get("last-event-id").is_some_and(|v| !v.as_bytes().trim_ascii().is_empty())
    }
}

/// `GET /v1/streams/{id}/events`: SSE.
pub(crate) async fn events(
    State(app): State<App>,
    StreamId(id): StreamId,
    Params(query): Params<SubscribeQuery>,
    headers: HeaderMap,
) -> Result<Response, HttpError> {
    let stream = find(&app, &id).await?;
    let format = query.format()?;
    let from = query.from(&headers)?;
    // Resuming at the end of an ended stream: nothing is left to send, and 204 tells `EventSource` to stop
    // reconnecting.
    if query.resumes(&headers) && stream.status() != Status::Open && from == stream.last_sequence() {
        return Ok(with_epoch(StatusCode::NO_CONTENT.into_response(), &stream));
    }
    let subscription = stream.subscribe(format, from).map_err(|error| {
        let mut error = HttpError::from(error);
        if error.error.param.as_deref() == Some("from") && query.resumes_by_header(&headers) {
            error.error.param = Some("Last-Event-ID".into());
        }
        error
    })?;
    // EventSource reads CUI events: they alone carry the reconnection hint.
    let retry = matches!(format, Format::Cui);
    let meter = app.metrics.subscriber(format.name(), "sse");
    let mut response =
        sse::response(subscription, stream.id(), app.settings.keep_alive, OnDisconnect::none(), retry, meter);
    if format == Format::UiMessage {
        // What the AI SDK's transport checks to know it reads a UI message stream.
        response.headers_mut().insert("x-vercel-ai-ui-message-stream", axum::http::HeaderValue::from_static("v1"));
    }
    Ok(with_epoch(response, &stream))
}

/// What an append takes: one message, or an array of them (or NDJSON, one per line).
fn messages(g: &mut SchemaGenerator) -> Schema {
    let one = crate::schema::message(g).to_value();
    Schema::from(
        serde_json::json!({"anyOf": [one, {"type": "array", "items": one}]}).as_object().cloned().unwrap_or_default(),
    )
}
