//! What an operator and a load balancer ask: `GET /healthz` (the process answers), `GET /readyz` (the service
//! takes work), `GET /metrics` (Prometheus), and `GET /v1/version`.

use axum::extract::State;
use axum::http::Method;
use axum::response::{IntoResponse, Response};
use axum::routing::get;

use super::endpoint::Content::{Foreign, Text};
use super::endpoint::{Endpoint, endpoint, op};
use crate::http::app::App;
use crate::http::edge::error::HttpError;

/// `GET /healthz`, `/readyz` and `/metrics`, and what the OpenAPI document says of them.
pub(crate) fn endpoints() -> Vec<Endpoint> {
    vec![
        endpoint(
            Method::GET,
            "/healthz",
            get(|| async { "ok" }),
            op("The process answers", "operate", None, vec![(200, "ok", vec![Text])]),
        ),
        endpoint(
            Method::GET,
            "/readyz",
            get(ready),
            op("The service takes work", "operate", None, vec![(200, "ready", vec![Text])]),
        ),
        endpoint(
            Method::GET,
            "/metrics",
            get(scrape),
            op("Prometheus metrics", "operate", None, vec![(200, "OpenMetrics text", vec![Text])]),
        ),
    ]
}

/// `GET /v1/version`, and what the OpenAPI document says of it.
pub(crate) fn version_endpoint() -> Vec<Endpoint> {
    vec![endpoint(
        Method::GET,
        "/v1/version",
        get(version),
        op(
            "The service's name and version",
            "operate",
            None,
            vec![(200, "{name, version}", vec![Foreign("{name, version}")])],
        ),
    )]
}

/// `GET /readyz`: 200 while the service takes new work, 503 `shutting_down` once it stops (a load balancer
/// then sends new clients elsewhere), 503 `store_failing` while the store cannot write, 503
/// `cluster_unavailable` while this node cannot reach Redis.
async fn ready(State(app): State<App>) -> Result<&'static str, HttpError> {
    app.refuse_new_work()?;
    #[cfg(feature = "redis")]
    if app.cluster.as_ref().is_some_and(|cluster| !cluster.reaches_redis()) {
        return Err(HttpError::new(
            axum::http::StatusCode::SERVICE_UNAVAILABLE,
            "server_error",
            "this node cannot reach Redis",
            None,
            "cluster_unavailable",
        ));
    }
    #[cfg(feature = "store")]
    if app.store.as_ref().is_some_and(|store| store.failing()) {
        return Err(HttpError::new(
            axum::http::StatusCode::SERVICE_UNAVAILABLE,
            "server_error",
            "the store cannot write",
            None,
            "store_failing",
        ));
    }
    Ok("ready")
}

/// `GET /metrics`: the Prometheus text exposition (see `edge/metrics.rs`).
async fn scrape(State(app): State<App>) -> Response {
    let text = app.metrics.render(&app.hub);
    ([(axum::http::header::CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")], text)
        .into_response()
}

/// `GET /v1/version`: `{"name", "version"}`.
async fn version() -> axum::Json<serde_json::Value> {
    axum::Json(serde_json::json!({ "name": env!("CARGO_PKG_NAME"), "version": env!("CARGO_PKG_VERSION") }))
}
