//! The endpoints: one module per resource or front door, each owning its routes and what the OpenAPI
//! document says of them ([`Endpoint`]); this file gathers them, in the order the document lists them.
//!
//! - `operate.rs`: `/healthz`, `/readyz`, `/metrics`, `/v1/version`; `openapi.rs`: the OpenAPI document,
//!   served here as `/openapi.json`;
//! - `ui.rs`: the viewer's page and assets;
//! - the front doors: `chat.rs` (`POST /v1/chat/completions`, and `GET /v1/models`), `ui_chat.rs` (the AI
//!   SDK's `useChat`), `ag_ui.rs` (`POST /v1/ag-ui`), `anthropic.rs` (`POST /v1/messages`), `responses.rs`
//!   (`POST /v1/responses`; the responses it keeps: `responses_kept.rs`), sharing one prologue and epilogue (`front_door.rs`);
//! - `streams.rs`: the stream endpoints; `ws.rs`: the WebSocket ones, and `upgrade.rs` the upgrade they
//!   answer themselves;
//! - `threads.rs`: the thread endpoints (`/v1/threads`, their audit log and replay);
//! - `format.rs`: which format a query, a WebSocket op or a chat request's headers ask for;
//! - `endpoint.rs`: what an endpoint is.
//!
//! Each module begins with its `endpoints()`, what it serves, then the types it reads and its handlers.
//!
//! The endpoints use the edge (`../edge/`) for what every request needs, and the transport
//! (`../transport/`) for the SSE and WebSocket answers; neither uses this wing.

mod ag_ui;
mod anthropic;
mod chat;
mod endpoint;
mod format;
mod front_door;
mod openapi;
mod operate;
mod responses;
mod responses_kept;
mod streams;
mod threads;
mod ui;
mod ui_chat;
mod upgrade;
mod ws;

use axum::http::Method;
use axum::routing::get;

use endpoint::Content::Foreign;
pub(crate) use endpoint::Endpoint;
use endpoint::{endpoint, op};

/// Every endpoint, once: the router and the OpenAPI document are both made from this. The order is the
/// document's (`docs/openapi.json`).
pub(crate) fn endpoints() -> Vec<Endpoint> {
    let mut endpoints = operate::endpoints();
    endpoints.extend(document_endpoint());
    endpoints.extend(ui::endpoints());
    endpoints.extend(operate::version_endpoint());
    endpoints.extend(chat::endpoints());
    endpoints.extend(ui_chat::endpoints());
    endpoints.extend(ag_ui::endpoints());
    endpoints.extend(anthropic::endpoints());
    endpoints.extend(responses::endpoints());
    endpoints.extend(streams::endpoints());
    endpoints.extend(ws::endpoints());
    endpoints.extend(threads::endpoints());
    endpoints
}

/// `GET /openapi.json`, and what the document says of itself.
fn document_endpoint() -> Vec<Endpoint> {
    vec![endpoint(
        Method::GET,
        "/openapi.json",
        get(openapi_document),
        op("This document", "operate", None, vec![(200, "OpenAPI 3.1", vec![Foreign("OpenAPI 3.1 document")])]),
    )]
}

/// `GET /openapi.json`: the OpenAPI document of every endpoint.
async fn openapi_document() -> axum::Json<serde_json::Value> {
    axum::Json(openapi_json())
}

/// The OpenAPI 3.1 document of every endpoint, as `GET /openapi.json` serves it (and `docs/openapi.json`
/// holds it).
pub fn openapi_json() -> serde_json::Value {
    openapi::document(endpoints())
}
