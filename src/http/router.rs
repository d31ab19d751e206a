//! [`router`]: every endpoint `api/` gathers, each behind the layers of `edge/` that every request meets.
//!
//! From the outside in: the access log and the request counted (`edge/trace.rs`), CORS for the listed origins, the
//! head limits and the envelope on every error, in the shape each endpoint declares (`edge/limits.rs`), what a page
//! from another origin may not do (`edge/browser.rs`), the credential (`edge/auth.rs`); on a node of a cluster, a
//! write to a stream another node writes goes there (`edge/forward.rs`) before any handler sees it.

use std::sync::Arc;

use axum::Router;
use axum::middleware;

use super::api::endpoints;
use super::app::App;
#[cfg(feature = "redis")]
use super::edge::forward;
use super::edge::limits::Limits;
use super::edge::shape::ErrorShapes;
use super::edge::{HttpError, auth, browser, limits, trace};

/// Every route.
pub fn router(app: App) -> Router {
    let mut router = Router::new();
    let endpoints = endpoints();
    let shapes = Arc::new(ErrorShapes::new(endpoints.iter().map(|e| (e.path, e.errors))));
    for endpoint in endpoints {
        #[cfg_attr(not(feature = "redis"), expect(unused_mut))]
        let mut handler = endpoint.handler;
        // With several nodes, a write to a stream another node writes goes to that node.
        #[cfg(feature = "redis")]
        if app.cluster.is_some() && forward::WRITES.contains(&endpoint.path) {
            handler = handler.route_layer(middleware::from_fn_with_state(app.clone(), forward::to_writer));
        }
        router = router.route(endpoint.path, handler);
    }
    router
        .fallback(|| async {
            HttpError::new(
                axum::http::StatusCode::NOT_FOUND,
                "invalid_request_error",
                "no such endpoint",
                None,
                "not_found",
            )
        })
        .route_layer(middleware::from_fn_with_state(Arc::clone(&app.credentials), auth::guard))
        .layer(middleware::from_fn_with_state(
            (app.settings.cors_origins.clone(), app.credentials.keyed()),
            browser::guard,
        ))
        .layer(middleware::from_fn_with_state(Limits { body_limit: app.settings.body_limit, shapes }, limits::guard))
        .layer(middleware::from_fn_with_state(app.metrics.clone(), trace::trace))
        .layer(tower::util::option_layer(app.settings.cors_origins.cors()))
        .with_state(app)
}
