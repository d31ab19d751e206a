//! The HTTP service: the hub and the agents on the network, as `docs/http-api.md` describes.
//!
//! Three wings, and what puts them together:
//!
//! - `app.rs`: [`App`] (what every handler shares) and [`Settings`], a leaf every wing reads;
//! - `api/`: the endpoints, one module per resource or front door, each owning its routes and what the
//!   OpenAPI document says of them; the front doors (chat completions, `useChat`, AG-UI, Anthropic
//!   Messages, OpenAI Responses) share one prologue and epilogue (`api/front_door.rs`);
//! - `edge/`: what every connection and request meets on its way in and every answer on its way out: the
//!   connection cap and each client's share of it, the head limits, CORS and what a page may do, keys and
//!   tokens, forwarding to a stream's writer, the access log and the metrics, [`HttpError`] and its
//!   envelope, the body and the extractors;
//! - `transport/`: how events leave: the event-stream connection served without hyper, the feeds that write
//!   to waiting readers, the SSE relay, the chunked framing, the socket, the WebSocket loop;
//! - `router.rs`: [`router`], every endpoint behind the edge's layers;
//! - `server.rs`: [`serve`]: connections (admitted or refused, the socket each holds), and the shutdown in
//!   phases.
//!
//! Imports run one way: `server.rs` uses the router, the transport and the edge's admission, the router the
//! api and the edge, the api the transport and the edge. The transport uses of the edge only its metrics and
//! the place an admitted connection holds, and the edge none of the others; `app.rs` holds what they share
//! (the transport's feeds and lifetime, the edge's credentials and metrics), and no wing imports `mod.rs`.

mod api;
mod app;
mod edge;
mod router;
mod server;
mod transport;

pub use api::openapi_json;
pub use app::{App, Settings};
pub use edge::{
    Access, Credentials, HttpError, KeyError, KeySpec, Metrics, Origins, Room, budgets, check_key, thread_budgets,
};
pub use router::router;
pub use server::{runtime, serve};
