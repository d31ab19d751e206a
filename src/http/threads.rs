//! The thread endpoints: `POST /v1/threads`, `GET` and `DELETE /v1/threads/{id}`,
//! `GET /v1/threads/{id}/audit` and `POST /v1/threads/{id}/replay`.
//!
//! Turns on a thread go through `POST /v1/chat/completions` with `x-agentmux-thread-id` (see `chat.rs`);
//! these endpoints create a thread ahead (optionally under an id of the client's, with user, system and
//! developer messages), read its transcript and audit log, delete it, and fork it into a replay on another
//! model, whose run is watched like any stream.

use axum::Json;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Map, Value, json};

use super::extract::{Client, KeyName, ThreadId};
use super::{App, HttpError, body};
use crate::conversation::ChatMessage;
use crate::thread::ThreadError;

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
    KeyName(owner): KeyName,
    request: Body,
) -> Result<Response, HttpError> {
    app.refuse_new_work()?;
    let bytes = body::read(request, &app.settings).await?;
    let create: CreateBody =
        if bytes.iter().all(u8::is_ascii_whitespace) { CreateBody::default() } else { body::json(&bytes)? };
    let transcript =
        app.threads.create(create.id.as_deref(), create.messages, owner.as_deref()).await.map_err(|e| match e {
            ThreadError::InvalidId => HttpError::from(e).with_param("id"),
            other => other.into(),
        })?;
    tracing::info!(thread = transcript.id, "thread created");
    Ok((StatusCode::CREATED, Json(transcript)).into_response())
}

pub(crate) async fn get(
    State(app): State<App>,
    KeyName(owner): KeyName,
    ThreadId(id): ThreadId,
) -> Result<Response, HttpError> {
    let transcript = app.threads.get(&id, owner.as_deref()).await?.ok_or(ThreadError::NotFound(id))?;
    Ok(Json(transcript).into_response())
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
    Ok(Json(json!({"thread_id": id, "object": "thread.audit", "entries": entries})).into_response())
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
    super::record_stream(started.stream.id());
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
