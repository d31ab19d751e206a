//! [`Endpoint`]: one route, what handles it, and what the OpenAPI document says of it. Each module of
//! `api/` gives its own (its `endpoints()`); `mod.rs` gathers them, and the router (`router.rs`) and the
//! OpenAPI document (`openapi.rs`) are both made from that one list, so neither can name an endpoint the
//! other does not.

use axum::http::Method;
use axum::routing::MethodRouter;
use schemars::Schema;
use schemars::generate::SchemaGenerator;

use crate::http::app::App;
use crate::http::edge::shape::ErrorShape;

/// A schema, as a function that defines it in the document's generator and returns the reference to it.
pub(crate) type SchemaOf = fn(&mut SchemaGenerator) -> Schema;

/// What an endpoint takes or answers, as the document describes it.
#[derive(Clone, Copy)]
pub(crate) enum Content {
    /// A JSON body of this schema.
    Json(SchemaOf),
    /// A JSON object another protocol defines, named here.
    Foreign(&'static str),
    /// Server-sent events.
    EventStream,
    /// Plain text (or a script or a style sheet).
    Text,
    /// A page.
    Html,
}

/// What the document says of one operation.
pub(crate) struct Operation {
    pub(crate) summary: &'static str,
    pub(crate) tag: &'static str,
    /// The request body, and whether it must be there.
    pub(crate) request: Option<(Content, bool)>,
    /// The answers on success: status, what it is, and its forms (one per media type).
    pub(crate) answers: Vec<(u16, &'static str, Vec<Content>)>,
}

/// One endpoint: where it is, what handles it, and what the OpenAPI document says of it.
pub(crate) struct Endpoint {
    pub(crate) method: Method,
    pub(crate) path: &'static str,
    pub(crate) handler: MethodRouter<App>,
    pub(crate) operation: Operation,
    /// The shape its errors are answered in (OpenAI's envelope unless it says otherwise).
    pub(crate) errors: ErrorShape,
}

/// An endpoint.
pub(crate) fn endpoint(
    method: Method,
    path: &'static str,
    handler: MethodRouter<App>,
    operation: Operation,
) -> Endpoint {
    Endpoint { method, path, handler, operation, errors: ErrorShape::OpenAi }
}

impl Endpoint {
    /// The endpoint, answering its errors in `shape`.
    pub(crate) fn with_errors(self, shape: ErrorShape) -> Endpoint {
        Endpoint { errors: shape, ..self }
    }
}

/// An operation: its summary, its tag, its request body (and whether it must be there), its answers.
pub(crate) fn op(
    summary: &'static str,
    tag: &'static str,
    request: Option<(Content, bool)>,
    answers: Vec<(u16, &'static str, Vec<Content>)>,
) -> Operation {
    Operation { summary, tag, request, answers }
}
