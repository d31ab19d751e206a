//! `POST /v1/ui/chat` and `GET /v1/ui/chat/{chat_id}/stream`: the two requests a `useChat` page makes with
//! the AI SDK's default transport (`api: "<agentmux>/v1/ui/chat"`), answered with the UI message stream.
//!
//! The POST carries the page's whole history as `UIMessage`s (`{id, messages, trigger, messageId}`, plus a
//! `model` the page adds through `useChat`'s `body` option to pick the agent; the default model otherwise).
//! It becomes the one conversation every agent receives (`conversation/ui.rs`) and a turn on the server-side
//! thread the chat's `id` names, created on first use (`docs/decisions.md`, "Tool results and threads"): the thread takes what follows the
//! page's last assistant message (its new message, or its results for the calls the last run handed over),
//! starts from the page's history when it has none yet, and rewinds when the page went back (a regenerate, an
//! edited message): see [`crate::thread::Turn::history`]. The run gets its own stream, as a chat completion's
//! does, and the answer is that stream in the `ui-message` format from its start.
//!
//! The GET is what `useChat({resume: true})` calls when the page loads: `204` when the chat's thread has no
//! turn running (so the page shows what it has), otherwise the running turn replayed from its start (the same
//! `messageId`, which the client rebuilds its message from) and then live. A page that reloads mid-answer so
//! picks it up where it is; this is why a run does not stop when its page goes away, unless the request asked
//! with `x-agentmux-on-disconnect: cancel` (a page stops a run with `POST /v1/streams/{id}/cancel`, the id in
//! `x-agentmux-stream-id`).
//!
//! With keys, a chat's thread belongs to the key that started it: another key's turn on it is 404, and its
//! resume `204`.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Map, Value};

use super::chat::{Threading, answer, launch, model_or_default};
use super::extract::{Client, KeyName};
use super::sse::OnDisconnect;
use super::{App, HttpError, body};
use crate::conversation::{ChatRequest, UiMessage, to_chat};
use crate::hub::Stream;
use crate::render::Format;
use crate::thread::check_id;

/// What `useChat`'s default transport posts.
#[derive(Debug, Deserialize)]
struct UiChatRequest {
    /// The chat's id.
    id: String,
    messages: Vec<UiMessage>,
    /// The agent, from the page's `body` option; the default model when absent.
    #[serde(default)]
    model: String,
    /// `submit-message` or `regenerate-message`, and the message to regenerate: either way the history is
    /// what the page sent, so neither changes the run (and neither goes to the agent with the options).
    #[serde(default)]
    _trigger: Option<Value>,
    #[serde(default, rename = "messageId")]
    _message_id: Option<Value>,
    /// Everything else the page sent (its `body` option): passed to the agent as the request's options.
    #[serde(flatten)]
    extra: Map<String, Value>,
}

/// `POST /v1/ui/chat`.
pub(crate) async fn chat(
    State(app): State<App>,
    Client(client): Client,
    KeyName(owner): KeyName,
    headers: HeaderMap,
    request: Body,
) -> Result<Response, HttpError> {
    app.refuse_new_work()?;
    let bytes = body::read(request, &app.settings).await?;
    let UiChatRequest { id, messages, model, extra, .. } = body::json(&bytes)?;
    check_id(&id).map_err(|_| {
        let message = "id (the chat's) must be 1 to 256 letters, digits, '_', '-', '.' or ':'";
        HttpError::bad_request(message, Some("id".into()), "invalid_value")
    })?;
    let model = model_or_default(&app, model)?;
    let (messages, from) = to_chat(&messages)?;
    let request = ChatRequest { model, messages, stream: true, stream_options: None, extra };
    let threading = Threading::Resent(id);
    let items = ("messages", &from[..]);
    let (stream, on_disconnect) =
        launch(&app, (client.as_deref(), owner), &headers, request, items, &threading).await?;
    respond(&app, (&stream, threading.id()), on_disconnect)
}

/// `GET /v1/ui/chat/{chat_id}/stream`.
pub(crate) async fn resume(
    State(app): State<App>,
    KeyName(owner): KeyName,
    Path(chat): Path<String>,
) -> Result<Response, HttpError> {
    match app.threads.running(&chat, owner.as_deref()).await? {
        None => Ok(StatusCode::NO_CONTENT.into_response()),
        Some(stream) => {
            super::record_stream(stream.id());
            respond(&app, (&stream, Some(&chat)), OnDisconnect::none())
        }
    }
}

/// The stream from its start as a UI message stream, with its id, read token and thread.
fn respond(app: &App, run: (&Arc<Stream>, Option<&str>), on_disconnect: OnDisconnect) -> Result<Response, HttpError> {
    let mut response = answer(app, run, Format::UiMessage, on_disconnect)?;
    response.headers_mut().insert("x-vercel-ai-ui-message-stream", HeaderValue::from_static("v1"));
    Ok(response)
}
