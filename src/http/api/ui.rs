//! The viewer: `GET /ui` lists the streams, `GET /ui/streams/{id}` (`?token=` for a read token) shows one run
//! live, beside its frames in any other format. The page's script and style are built from
//! `clients/viewer` (its sources, the TypeScript client, and the Markdown and sanitizing packages it pins)
//! and embedded here, so the binary needs no Node and the page loads nothing from another host; a test
//! checks that building the sources gives the committed files. The same build gives the TypeScript client as
//! one module (`/ui/assets/client.js`), which a page imports without a build step of its own.
//!
//! Agent output is untrusted: the page renders it inert (Markdown through DOMPurify, media and links only to
//! http(s) or a data URL of the media's kind, everything else as text), and every answer here carries a
//! Content-Security-Policy that allows only this origin's script and style, no inline script, and loads
//! nothing but media from elsewhere. The pages themselves hold no data and need no credential; the API
//! calls they make do (the page asks for a key where keys are configured and keeps it in the tab's session
//! storage, never in a URL).

use axum::http::Method;
use axum::http::header::{CACHE_CONTROL, CONTENT_TYPE, HeaderName};
use axum::response::{IntoResponse, Response};
use axum::routing::get;

use super::endpoint::Content::{Html, Text};
use super::endpoint::{Endpoint, endpoint, op};

/// The viewer's page and assets, and what the OpenAPI document says of them.
pub(crate) fn endpoints() -> Vec<Endpoint> {
    vec![
        endpoint(
            Method::GET,
            "/ui",
            get(page),
            op("The viewer: the streams", "viewer", None, vec![(200, "The page", vec![Html])]),
        ),
        endpoint(
            Method::GET,
            "/ui/streams/{id}",
            get(page),
            op(
                "The viewer: one run live (?token= for a read token)",
                "viewer",
                None,
                vec![(200, "The page", vec![Html])],
            ),
        ),
        endpoint(
            Method::GET,
            "/ui/assets/viewer.js",
            get(script),
            op("The viewer's script", "viewer", None, vec![(200, "JavaScript", vec![Text])]),
        ),
        endpoint(
            Method::GET,
            "/ui/assets/client.js",
            get(client),
            op(
                "The TypeScript client as one ES module, for a page to import",
                "viewer",
                None,
                vec![(200, "JavaScript", vec![Text])],
            ),
        ),
        endpoint(
            Method::GET,
            "/ui/assets/viewer.css",
            get(style),
            op("The viewer's style", "viewer", None, vec![(200, "CSS", vec![Text])]),
        ),
    ]
}

const PAGE: &str = include_str!("ui/index.html");
const SCRIPT: &str = include_str!("ui/viewer.js");
const STYLE: &str = include_str!("ui/viewer.css");
const CLIENT: &str = include_str!("ui/client.js");

/// Scripts and styles from this origin only, never inline; API calls to this origin; images and media
/// wherever an agent put them (http(s) and data URLs); nothing else, and never in a frame.
pub(crate) const POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; \
     img-src 'self' http: https: data:; media-src 'self' http: https: data:; form-action 'none'; base-uri 'none'; \
     frame-ancestors 'none'";

/// `GET /ui` and `GET /ui/streams/{id}`: the one page, which reads its path.
pub(crate) async fn page() -> Response {
    answer("text/html; charset=utf-8", PAGE)
}

/// `GET /ui/assets/viewer.js`.
pub(crate) async fn script() -> Response {
    answer("text/javascript; charset=utf-8", SCRIPT)
}

/// `GET /ui/assets/client.js`: the TypeScript client (`clients/typescript`) as one ES module, for a page to
/// import without a build of its own (from another origin, one listed with `--cors-origin`).
pub(crate) async fn client() -> Response {
    answer("text/javascript; charset=utf-8", CLIENT)
}

/// `GET /ui/assets/viewer.css`.
pub(crate) async fn style() -> Response {
    answer("text/css; charset=utf-8", STYLE)
}

fn answer(content_type: &'static str, body: &'static str) -> Response {
    let headers = [
        (CONTENT_TYPE, content_type),
        (HeaderName::from_static("content-security-policy"), POLICY),
        (HeaderName::from_static("x-content-type-options"), "nosniff"),
        (HeaderName::from_static("referrer-policy"), "no-referrer"),
        // Built into the binary: a new one comes with a new binary.
        (CACHE_CONTROL, "no-cache"),
    ];
    (headers, body).into_response()
}
