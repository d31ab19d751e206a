//! `POST /v1/ag-ui`: what `@ag-ui/client`'s `HttpAgent` posts (`RunAgentInput`), answered with the run as
//! AG-UI events.
//!
//! The input's messages become the one conversation every agent receives (`conversation/ag_ui.rs`); the
//! agent is the one `forwardedProps.model` names (a frontend passes it through `runAgent`'s
//! `forwardedProps`), or `?model=` on the URL (for a frontend that cannot set it), or the default model. The
//! frontend's tools go to the agent as the request's `tools`, in OpenAI's form, and its `context`, `state` and
//! other `forwardedProps` as options of those names, as a chat completion's extra fields do. The run is a
//! turn on the server-side thread `threadId` names, created on first use (`docs/decisions.md`, "Tool results and threads"); a frontend sends
//! its whole history every time, so the thread takes what follows its last assistant message, starts from
//! its history when it has none yet, and rewinds when the frontend went back (see
//! [`crate::thread::Turn::history`]). The run gets its own stream, as a chat completion's does
//! (`x-agentmux-stream-id`, `x-agentmux-read-token`), so it can be watched in any other format; the answer
//! is that stream in the `ag-ui` format from its start (`front_door.rs`).

use axum::http::Method;
use axum::response::Response;
use axum::routing::post;
use serde::Deserialize;
use serde_json::{Map, Value};

use super::endpoint::Content::{EventStream, Foreign};
use super::endpoint::{Endpoint, endpoint, op};
use super::front_door::{
    FrontDoor, OfferedTool, RUN, SchemaField, Threading, chat_request, invalid_thread, offer_tools,
};
use crate::conversation::{AgUiMessage, ag_ui_to_chat};
use crate::http::edge::error::HttpError;
use crate::http::edge::extract::Params;
use crate::render::Format;
use crate::thread::check_id;

/// `POST /v1/ag-ui`, and what the OpenAPI document says of it.
pub(crate) fn endpoints() -> Vec<Endpoint> {
    vec![endpoint(
        Method::POST,
        "/v1/ag-ui",
        post(run),
        op(
            "An AG-UI run",
            "front doors",
            Some((Foreign("AG-UI RunAgentInput"), true)),
            vec![(200, RUN, vec![EventStream])],
        ),
    )]
}

/// `RunAgentInput`: only what agentmux uses is read (`threadId` names the server-side thread; `runId` names
/// the frontend's run, and the events carry the stream's own, which the client does not compare).
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct RunAgentInput {
    #[serde(default)]
    thread_id: Option<String>,
    messages: Vec<AgUiMessage>,
    /// `{name, description, parameters}` each.
    #[serde(default)]
    tools: Vec<OfferedTool>,
    #[serde(default)]
    context: Option<Value>,
    #[serde(default)]
    state: Option<Value>,
    #[serde(default)]
    forwarded_props: Option<Map<String, Value>>,
}

/// `?model=`.
#[derive(Debug, Deserialize, Default)]
pub(crate) struct AgUiQuery {
    model: Option<String>,
}

/// `POST /v1/ag-ui`.
pub(crate) async fn run(Params(query): Params<AgUiQuery>, mut door: FrontDoor) -> Result<Response, HttpError> {
    let input: RunAgentInput = door.json().await?;
    let mut forwarded = input.forwarded_props.unwrap_or_default();
    let model = match forwarded.remove("model") {
        Some(Value::String(model)) => model,
        None | Some(Value::Null) => query.model.unwrap_or_default(),
        Some(_) => {
            let message = "forwardedProps.model must be a string: the agent to run";
            return Err(HttpError::bad_request(message, Some("forwardedProps.model".into()), "invalid_value"));
        }
    };
    let model = door.model(model)?;
    let (messages, from) = ag_ui_to_chat(&input.messages)?;
    let mut extra = Map::new();
    offer_tools(&mut extra, input.tools.into_iter().map(|tool| tool.with_schema(SchemaField::Parameters)));
    for (name, value) in [("context", input.context), ("state", input.state)] {
        if let Some(value) = value.filter(|v| !v.is_null()) {
            extra.insert(name.into(), value);
        }
    }
    if !forwarded.is_empty() {
        extra.insert("forwarded_props".into(), Value::Object(forwarded));
    }
    let threading = match input.thread_id.filter(|id| !id.is_empty()) {
        Some(id) => {
            check_id(&id).map_err(|_| invalid_thread("threadId"))?;
            Threading::Resent(id)
        }
        None => Threading::None,
    };
    let run = door.launch(chat_request(model, messages, true, extra, []), ("messages", &from), threading).await?;
    run.answer(Format::AgUi)
}
