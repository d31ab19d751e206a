//! The edge: what every request meets on its way in and every answer on its way out, whichever endpoint
//! serves it. Nothing here knows an endpoint; `api/` uses these, and the router (`router.rs`) puts the layers
//! around every route.
//!
//! - `admission.rs`: whether a new connection is served: its place under the cap and its client's share;
//! - `limits.rs`: the head limits and the declared body size (before), the envelope on whatever axum
//!   answered by itself (after);
//! - `browser.rs`: CORS, and what a page from another origin may not do;
//! - `auth.rs`: API keys and stream tokens (who may do what);
//! - `forward.rs`: on a node of a cluster, writes to a stream another node writes go there;
//! - `trace.rs`: a span per request, the access log line, the request counted;
//! - `metrics.rs`: [`Metrics`], what `GET /metrics` shows;
//! - `error.rs`: [`HttpError`], the one mapping from errors to statuses and OpenAI error envelopes;
//! - `body.rs`: body limits and JSON errors that name the field;
//! - `extract.rs`: the path, query, client and WebSocket-upgrade extractors, refusing with the envelope.

pub(crate) mod admission;
pub(crate) mod auth;
pub(crate) mod body;
pub(crate) mod browser;
pub(crate) mod error;
pub(crate) mod extract;
#[cfg(feature = "redis")]
pub(crate) mod forward;
pub(crate) mod limits;
pub(crate) mod metrics;
pub(crate) mod trace;

pub use auth::{Access, Credentials, KeyError, KeySpec, budgets, check_key, thread_budgets};
pub use browser::Origins;
pub use error::{HttpError, Room};
pub use metrics::Metrics;
