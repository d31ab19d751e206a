//! The thread endpoints: `POST /v1/threads`, `GET` and `DELETE /v1/threads/{id}`,
//! `GET /v1/threads/{id}/audit` and `POST /v1/threads/{id}/replay`.
//!
//! Turns on a thread go through `POST /v1/chat/completions` with `x-agentmux-thread-id` (see `chat.rs` and
//! `front_door.rs`); these endpoints create a thread ahead (optionally under an id of the client's, with
//! user, system and developer messages), read its transcript and audit log, delete it, and fork it into a
//! replay on another model, whose run is watched like any stream.

use axum::Json;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing;
use schemars::Schema;
use serde::Deserialize;
use serde_json::{Map, Value, json};

use super::endpoint::Content::{Foreign, Json as JsonOf};
use super::endpoint::{Endpoint, SchemaOf, endpoint, op};
use crate::conversation::ChatMessage;
use crate::http::app::App;
use crate::http::edge::body;
use crate::http::edge::error::HttpError;
use crate::http::edge::extract::{Client, KeyName, ThreadId};
use crate::http::edge::trace::record_stream;
use crate::http::transport::streamed_json::StreamedJson;
use crate::thread::ThreadError;

/// The thread endpoints, and what the OpenAPI document says of them.
pub(crate) fn endpoints() -> Vec<Endpoint> {
    let transcript: SchemaOf = |g| g.subschema_for::<crate::thread::Transcript>();
    let audit_log: SchemaOf = |g| {
        let entries = g.subschema_for::<Vec<crate::thread::AuditEntry>>().to_value();
        let object = serde_json::json!({"type": "object", "required": ["thread_id", "object", "entries"], "properties": {
            "thread_id": {"type": "string"}, "object": {"const": "thread.audit"}, "entries": entries}});
        Schema::from(object.as_object().cloned().unwrap_or_default())
    };
    vec![
        endpoint(
            Method::POST,
            "/v1/threads",
            routing::post(create),
            op(
                "Create a server-side thread",
                "threads",
                Some((JsonOf(|g| g.subschema_for::<CreateBody>()), false)),
                vec![(201, "Its transcript", vec![JsonOf(transcript)])],
            ),
        ),
        endpoint(
            Method::GET,
            "/v1/threads/{id}",
            routing::get(get),
            op("A thread's transcript", "threads", None, vec![(200, "The transcript", vec![JsonOf(transcript)])]),
        ),
        endpoint(
            Method::DELETE,
            "/v1/threads/{id}",
            routing::delete(delete),
            op(
                "Delete a thread",
                "threads",
                None,
                vec![(200, "{id, object: thread.deleted, deleted: true}", vec![Foreign("The deleted thread")])],
            ),
        ),
        endpoint(
            Method::GET,
            "/v1/threads/{id}/audit",
            routing::get(audit),
            op("A thread's audit log", "threads", None, vec![(200, "The audit log", vec![JsonOf(audit_log)])]),
        ),
        endpoint(
            Method::POST,
            "/v1/threads/{id}/replay",
            routing::post(replay),
            op(
                "Replay a thread's history on another model",
                "threads",
                Some((JsonOf(|g| g.subschema_for::<ReplayBody>()), true)),
                vec![(201, "The new thread and its run's stream", vec![Foreign("The replay")])],
            ),
        ),
    ]
}

/// `POST /v1/threads`: `{"id"?, "messages"?}`, both optional; an empty body makes an empty thread.
#[derive(Debug, Deserialize, Default, schemars::JsonSchema)]
#[schemars(rename = "CreateThread")]
pub(crate) struct CreateBody {
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    messages: Vec<ChatMessage>,
    /// Kept for clients that send it; not used.
    #[serde(default, rename = "metadata")]
    _metadata: Option<Map<String, Value>>,
}

pub(crate) async fn create(
    State(app): State<App>,
    Client(client): Client,
    KeyName(owner): KeyName,
    request: Body,
) -> Result<Response, HttpError> {
    app.refuse_new_work()?;
    let bytes = body::read(request, &app.settings).await?;
    let create: CreateBody = body::json_or(&bytes, CreateBody::default)?;
    let transcript =
        app.threads.create(client.as_deref(), create.id.as_deref(), create.messages, owner.as_deref()).await.map_err(
            |e| match e {
                ThreadError::InvalidId => HttpError::from(e).with_param("id"),
                other => other.into(),
            },
        )?;
    tracing::info!(thread = transcript.id, "thread created");
    Ok((StatusCode::CREATED, Json(transcript)).into_response())
}

/// `GET /v1/threads/{id}`: the transcript, its messages written out as the client takes them (shared with the
/// thread, not copied per request).
pub(crate) async fn get(
    State(app): State<App>,
    KeyName(owner): KeyName,
    ThreadId(id): ThreadId,
) -> Result<Response, HttpError> {
    let mut transcript = app.threads.get(&id, owner.as_deref()).await?.ok_or(ThreadError::NotFound(id))?;
    let messages = std::mem::take(&mut transcript.messages);
    Ok(StreamedJson::around(&transcript, "messages", messages).map_err(unwritable)?.into_response())
}

pub(crate) async fn delete(
    State(app): State<App>,
    KeyName(owner): KeyName,
    ThreadId(id): ThreadId,
) -> Result<Response, HttpError> {
    if !app.threads.delete(&id, owner.as_deref()).await? {
        return Err(ThreadError::NotFound(id).into());
    }
    Ok(Json(json!({"id": id, "object": "thread.deleted", "deleted": true})).into_response())
}

/// `GET /v1/threads/{id}/audit`: `{"thread_id", "object": "thread.audit", "entries": [..]}`.
pub(crate) async fn audit(
    State(app): State<App>,
    KeyName(owner): KeyName,
    ThreadId(id): ThreadId,
) -> Result<Response, HttpError> {
    let entries = app.threads.audit(&id, owner.as_deref()).await?.ok_or_else(|| ThreadError::NotFound(id.clone()))?;
    let log = json!({"thread_id": id, "object": "thread.audit", "entries": []});
    Ok(StreamedJson::around(&log, "entries", entries).map_err(unwritable)?.into_response())
}

/// A transcript or log that cannot be written as JSON (never, with the service's own types).
fn unwritable(error: serde_json::Error) -> HttpError {
    tracing::error!(%error, "a thread's JSON could not be written");
    HttpError::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", error.to_string(), None, "internal_error")
}

/// `POST /v1/threads/{id}/replay`: `{"model", "upto"?}`.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[schemars(rename = "ReplayThread")]
pub(crate) struct ReplayBody {
    model: String,
    #[serde(default)]
    upto: Option<String>,
}

pub(crate) async fn replay(
    State(app): State<App>,
    ThreadId(id): ThreadId,
    Client(client): Client,
    KeyName(owner): KeyName,
    request: Body,
) -> Result<Response, HttpError> {
    app.refuse_new_work()?;
    let bytes = body::read(request, &app.settings).await?;
    let replay: ReplayBody = body::json(&bytes)?;
    crate::output::check_name("model", &replay.model)?;
    let started =
        app.threads.replay(client.as_deref(), owner.as_deref(), &id, &replay.model, replay.upto.as_deref()).await?;
    record_stream(started.stream.id());
    tracing::info!(from = id, thread = started.thread, model = replay.model, "thread replayed");
    let body = json!({
        "object": "thread.replay",
        "thread_id": started.thread,
        "stream_id": started.stream.id(),
        "model": replay.model,
        "source_thread_id": id,
        "upto": started.upto,
    });
    let mut response = (StatusCode::CREATED, Json(body)).into_response();
    for (name, value) in [("x-agentmux-stream-id", started.stream.id()), ("x-agentmux-thread-id", &started.thread)] {
        if let Ok(value) = HeaderValue::from_str(value) {
            response.headers_mut().insert(name, value);
        }
    }
    Ok(response)
}
