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

use axum::extract::{Path, State};
use axum::http::{HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::Deserialize;
use serde_json::{Map, Value};

use super::endpoint::Content::{EventStream, Foreign};
use super::endpoint::{Endpoint, endpoint, op};
use super::front_door::{FrontDoor, RUN, Run, Threading, chat_request};
use crate::conversation::{UiMessage, to_chat};
use crate::http::app::App;
use crate::http::edge::error::HttpError;
use crate::http::edge::extract::KeyName;
use crate::http::edge::trace::record_stream;
use crate::render::Format;
use crate::thread::check_id;

/// `POST /v1/ui/chat` and its resume, and what the OpenAPI document says of them.
pub(crate) fn endpoints() -> Vec<Endpoint> {
    vec![
        endpoint(
            Method::POST,
            "/v1/ui/chat",
            post(chat),
            op(
                "The AI SDK's useChat turn",
                "front doors",
                Some((
                    Foreign(
                        "useChat's request: {id, messages: UIMessage[], trigger, messageId} and the body option's fields",
                    ),
                    true,
                )),
                vec![(200, RUN, vec![EventStream])],
            ),
        ),
        endpoint(
            Method::GET,
            "/v1/ui/chat/{chat_id}/stream",
            get(resume),
            op(
                "Resume a useChat turn",
                "front doors",
                None,
                vec![(200, RUN, vec![EventStream]), (204, "No turn running", vec![])],
            ),
        ),
    ]
}

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
pub(crate) async fn chat(mut door: FrontDoor) -> Result<Response, HttpError> {
    let UiChatRequest { id, messages, model, extra, .. } = door.json().await?;
    check_id(&id).map_err(|_| {
        let message = "id (the chat's) must be 1 to 256 letters, digits, '_', '-', '.' or ':'";
        HttpError::bad_request(message, Some("id".into()), "invalid_value")
    })?;
    let model = door.model(model)?;
    let (messages, from) = to_chat(&messages)?;
    let run = door.launch(chat_request(model, messages, true, extra, []), ("messages", &from), Threading::Resent(id));
    respond(run.await?)
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
            record_stream(stream.id());
            respond(Run::watched(app, stream, chat))
        }
    }
}

/// The stream from its start as a UI message stream, with its id, read token and thread.
fn respond(run: Run) -> Result<Response, HttpError> {
    let mut response = run.answer(Format::UiMessage)?;
    response.headers_mut().insert("x-vercel-ai-ui-message-stream", HeaderValue::from_static("v1"));
    Ok(response)
}
