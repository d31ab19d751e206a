//! What a browser may do: CORS for the origins an operator lists, and nothing for a page on any other.
//!
//! A web page can make a browser send requests anywhere, a local agentmux included, and some of them (a
//! `POST` with a `text/plain` body, a WebSocket) go out without asking the server first. So, for every
//! request, keys or not:
//!
//! - a request that changes something (any method but `GET`, `HEAD` and `OPTIONS`) or opens a WebSocket, sent
//!   by a page (it has an `Origin`) from an origin that is neither listed with `--cors-origin` nor the
//!   service's own, is refused with 403 `origin_not_allowed` before anything happens;
//! - a request body must say it is JSON (`application/json`, or any `+json` type), or NDJSON where the
//!   endpoint takes it (appending messages): anything else is 415 `unsupported_media_type`. A page can send
//!   such a type only after a CORS preflight, which names its origin.
//!
//! Listed origins get CORS (tower-http's layer): preflights answered, any request header allowed,
//! `Authorization` and `Last-Event-ID` included, and the headers a client needs exposed (the stream id, the
//! read token, the thread id, the epoch, `idempotent-replayed`, `Retry-After`). `--cors-origin '*'` lets any page read (`GET`: events,
//! snapshots) but not write: its preflights for anything else get no CORS headers, and the guard above
//! refuses what a page sends without one. Clients that are not browsers send no `Origin` and meet only the
//! media-type rule. A read from a page on an unlisted origin is served (its browser hides the answer), and
//! the log names each such origin once, so an operator whose page stays empty learns what to list.
//!
//! Without keys the service is open to whoever reaches it, which by default is this machine alone: it
//! listens on loopback. A page elsewhere can still reach it through DNS rebinding (its own name made to
//! resolve to 127.0.0.1): to the browser that page is then the service's own origin, so the rules above let
//! it write and read. What gives it away is the `Host` its browser sends, the page's own name. So without
//! keys a request from a browser (it carries `Origin` or `Sec-Fetch-Site`, which no page can forge or leave
//! out) whose `Host` is not a loopback name (`localhost`, `*.localhost`, `127.0.0.0/8`, `[::1]`) is refused
//! with 421 `misdirected_host`, unless it is a name the operator gave the service (`--public-host`, say the
//! name a local reverse proxy forwards; [`Origins::with_public_hosts`]) or the operator opened the service
//! on purpose (`--insecure-no-auth`, [`Origins::any_host`]). Other clients (SDKs, curl, a proxy of this machine's) are not browsers and are
//! served whatever their `Host`. With keys, a request needs a key or a token whatever its `Host`.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use axum::extract::{Request, State};
use axum::http::header::{CONTENT_TYPE, HOST, ORIGIN};
use axum::http::request::Parts;
use axum::http::{HeaderName, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use tower_http::cors::{AllowHeaders, AllowMethods, AllowOrigin, CorsLayer, ExposeHeaders};

use super::HttpError;

/// The origins `--cors-origin` lists: exact origins (`https://app.example.com`), or `*` for reads from any.
#[derive(Debug, Clone, Default)]
pub struct Origins {
    exact: Vec<HeaderValue>,
    any_reads: bool,
    /// Serve any `Host` without keys (see the module doc); loopback names only otherwise.
    any_host: bool,
    /// Names besides the loopback ones a keyless service is reached by (`--public-host`), lower-case, no port.
    public_hosts: Vec<String>,
    /// Unlisted origins already named in the log (at most [`LOGGED_ORIGINS`]).
    logged: Arc<Mutex<HashSet<HeaderValue>>>,
}

/// How many unlisted origins the log names, each once: a flood of made-up origins cannot grow memory or
/// the log.
const LOGGED_ORIGINS: usize = 64;

impl Origins {
    /// The same, serving requests for any `Host` even without keys: for a service opened on purpose beyond
    /// loopback (`--insecure-no-auth`). Without it, a keyless service answers only loopback names.
    pub fn any_host(mut self) -> Origins {
        self.any_host = true;
        self
    }

    /// The same, also answering pages that reach a keyless service by one of `hosts` (`--public-host`: bare
    /// names, such as `agents.internal`, without a scheme or a port).
    ///
    /// ```
    /// use agentmux::http::Origins;
    ///
    /// assert!(Origins::default().with_public_hosts(&["agents.internal".into()]).is_ok());
    /// assert!(Origins::default().with_public_hosts(&["http://agents.internal".into()]).is_err());
    /// ```
    pub fn with_public_hosts(mut self, hosts: &[String]) -> Result<Origins, String> {
        for host in hosts {
            let name = host.trim().trim_end_matches('.').to_ascii_lowercase();
            let valid = !name.is_empty()
                && name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.'))
                && !name.starts_with(['-', '.']);
            if !valid {
                return Err(format!(
                    "--public-host {host:?} is not a host name (letters, digits, '-' and '.'; no scheme, no port)"
                ));
            }
            self.public_hosts.push(name);
        }
        Ok(self)
    }

    /// From the flag's values: each an exact origin (scheme, host and port, no path), or `*`.
    pub fn new(origins: &[String]) -> Result<Origins, String> {
        let mut parsed = Origins::default();
        for origin in origins {
            let origin = origin.trim().trim_end_matches('/');
            if origin == "*" {
                parsed.any_reads = true;
                continue;
            }
            let valid = url::Url::parse(origin).ok().is_some_and(|u| {
                matches!(u.scheme(), "http" | "https") && u.host().is_some() && u.path() == "/" && u.query().is_none()
            });
            let value = HeaderValue::from_str(origin).ok().filter(|_| valid);
            parsed.exact.push(value.ok_or_else(|| {
                format!("--cors-origin {origin:?} is not an origin (scheme://host[:port], no path) nor `*`")
            })?);
        }
        Ok(parsed)
    }

    fn is_empty(&self) -> bool {
        self.exact.is_empty() && !self.any_reads
    }

    fn listed(&self, origin: &HeaderValue) -> bool {
        self.exact.iter().any(|o| o == origin)
    }

    /// True the first time an unlisted origin is seen (up to [`LOGGED_ORIGINS`] of them).
    fn first_sighting(&self, origin: &HeaderValue) -> bool {
        let mut logged = crate::sync::lock(&self.logged);
        logged.len() < LOGGED_ORIGINS && logged.insert(origin.clone())
    }

    /// The CORS layer for these origins; none when no origin is listed (then no CORS header is sent).
    pub(crate) fn cors(&self) -> Option<CorsLayer> {
        if self.is_empty() {
            return None;
        }
        let origins = self.clone();
        let allow = AllowOrigin::predicate(move |origin: &HeaderValue, parts: &Parts| {
            origins.listed(origin) || (origins.any_reads && reads(parts))
        });
        let exposed = [
            "x-agentmux-stream-id",
            "x-agentmux-read-token",
            "x-agentmux-thread-id",
            "x-agentmux-epoch",
            "retry-after",
            "idempotent-replayed",
        ];
        Some(
            CorsLayer::new()
                .allow_origin(allow)
                .allow_methods(AllowMethods::list([Method::GET, Method::POST, Method::DELETE]))
                .allow_headers(AllowHeaders::mirror_request())
                .expose_headers(ExposeHeaders::list(exposed.map(HeaderName::from_static)))
                .max_age(std::time::Duration::from_secs(600)),
        )
    }
}

/// Whether a request (or the one a preflight asks about) only reads.
fn reads(parts: &Parts) -> bool {
    let method = if parts.method == Method::OPTIONS {
        parts.headers.get("access-control-request-method").and_then(|m| Method::from_bytes(m.as_bytes()).ok())
    } else {
        Some(parts.method.clone())
    };
    matches!(method, Some(Method::GET | Method::HEAD))
}

/// The middleware: refuses a keyless page's request for a name that is not loopback, what a page from another
/// origin may not do, and bodies that are not JSON. `keyed`: the service has API keys.
pub(crate) async fn guard(State((origins, keyed)): State<(Origins, bool)>, request: Request, next: Next) -> Response {
    let headers = request.headers();
    let from_a_page = headers.contains_key(ORIGIN) || headers.contains_key("sec-fetch-site");
    if !keyed && !origins.any_host && from_a_page && !known_host(headers.get(HOST), &origins.public_hosts) {
        return HttpError::new(
            StatusCode::MISDIRECTED_REQUEST,
            "invalid_request_error",
            "this service has no API key and answers loopback names (localhost, 127.0.0.1, [::1]) and the names \
             given with --public-host only",
            None,
            "misdirected_host",
        )
        .into_response();
    }
    if let Err(error) = check(&origins, &request) {
        return error.into_response();
    }
    next.run(request).await
}

/// Whether `Host` names this machine's loopback: `localhost` or a name under it, an address in
/// `127.0.0.0/8`, or `[::1]`, or one of `public` (`--public-host`), with any port. A request without `Host`
/// (HTTP/1.0) came from no browser page.
fn known_host(host: Option<&HeaderValue>, public: &[String]) -> bool {
    let Some(host) = host else { return true };
    let Ok(host) = host.to_str() else { return false };
    let name = match host.strip_prefix('[') {
        Some(bracketed) => bracketed.split_once(']').map_or("", |(address, _)| address),
        None => host
            .rsplit_once(':')
            .map_or(host, |(name, port)| if port.bytes().all(|b| b.is_ascii_digit()) { name } else { host }),
    };
    let name = name.trim_end_matches('.').to_ascii_lowercase();
    public.contains(&name)
        || name == "localhost"
        || name.ends_with(".localhost")
        || name.parse::<std::net::IpAddr>().is_ok_and(|address| address.is_loopback())
}

fn check(origins: &Origins, request: &Request) -> Result<(), HttpError> {
    let headers = request.headers();
    let upgrade = headers.get("upgrade").is_some_and(|u| u.as_bytes().eq_ignore_ascii_case(b"websocket"));
    let changes = !matches!(*request.method(), Method::GET | Method::HEAD | Method::OPTIONS) || upgrade;
    if let Some(origin) = headers.get(ORIGIN)
        && changes
        && !origins.listed(origin)
        && !same_origin(origin, headers.get(HOST))
    {
        return Err(HttpError::new(
            StatusCode::FORBIDDEN,
            "permission_error",
            "a page from this origin may not do this: list it with --cors-origin",
            None,
            "origin_not_allowed",
        ));
    }
    // A read from a page on an unlisted origin is served, but its browser hides the answer from the page
    // (no CORS header): the page just stays empty. The operator gets one line per such origin.
    if let Some(origin) = headers.get(ORIGIN)
        && !changes
        && !origins.listed(origin)
        && !origins.any_reads
        && !same_origin(origin, headers.get(HOST))
        && origins.first_sighting(origin)
    {
        tracing::info!(
            origin = %String::from_utf8_lossy(origin.as_bytes()),
            "a page on an origin not listed with --cors-origin reads from this service: its browser will not \
             show it the answers (list the origin with --cors-origin to let it)"
        );
    }
    if has_body(request) {
        let media = headers.get(CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or_default();
        let essence = media.split(';').next().unwrap_or_default().trim().to_ascii_lowercase();
        let ndjson = request.uri().path().ends_with("/messages")
            && matches!(essence.as_str(), "application/x-ndjson" | "application/jsonl" | "application/json-seq");
        if essence != "application/json" && !essence.ends_with("+json") && !ndjson {
            let shown = if media.is_empty() { "none".to_owned() } else { format!("{media:?}") };
            return Err(HttpError::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "invalid_request_error",
                format!("the body's content-type is {shown}: send `content-type: application/json`"),
                None,
                "unsupported_media_type",
            ));
        }
    }
    Ok(())
}

/// Whether a request carries a body: a non-zero `Content-Length`, or a chunked one.
fn has_body(request: &Request) -> bool {
    let headers = request.headers();
    let length = headers.get("content-length").and_then(|v| v.to_str().ok()).and_then(|v| v.trim().parse::<u64>().ok());
    length.is_some_and(|n| n > 0) || headers.contains_key("transfer-encoding")
}

/// A page served by this service itself: its origin's host and port are the request's `Host`.
fn same_origin(origin: &HeaderValue, host: Option<&HeaderValue>) -> bool {
    let (Some(origin), Some(host)) = (origin.to_str().ok(), host.and_then(|h| h.to_str().ok())) else {
        return false;
    };
    origin.split_once("://").is_some_and(|(_, authority)| authority.eq_ignore_ascii_case(host))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn origins_are_exact_or_a_star() {
        let origins = Origins::new(&["https://app.example.com/".into(), "*".into()]).expect("valid");
        assert!(origins.listed(&HeaderValue::from_static("https://app.example.com")));
        assert!(!origins.listed(&HeaderValue::from_static("https://evil.example.com")));
        assert!(origins.any_reads);
        for bad in ["app.example.com", "https://app.example.com/path", "ftp://x", ""] {
            assert!(Origins::new(&[bad.into()]).is_err(), "{bad}");
        }
    }

    #[test]
    fn an_unlisted_origin_is_named_once_and_only_so_many() {
        let origins = Origins::new(&[]).expect("valid");
        let page = HeaderValue::from_static("http://localhost:3000");
        assert!(origins.first_sighting(&page));
        assert!(!origins.first_sighting(&page), "once");
        for n in 1..LOGGED_ORIGINS {
            let other = HeaderValue::from_str(&format!("http://localhost:{n}")).expect("origin");
            assert!(origins.first_sighting(&other));
        }
        assert!(!origins.first_sighting(&HeaderValue::from_static("http://one-too-many")), "bounded");
    }

    #[test]
    fn the_service_s_own_pages_are_same_origin() {
        for loopback in ["127.0.0.1:8080", "localhost:1", "LOCALHOST", "app.localhost:3000", "[::1]:80", "127.9.9.9"] {
            assert!(super::known_host(Some(&HeaderValue::from_static(loopback)), &[]), "{loopback}");
        }
        for elsewhere in ["rebind.attacker.example:8080", "10.0.0.1:8080", "[2001:db8::1]:80", "localhost.evil.com"] {
            assert!(!super::known_host(Some(&HeaderValue::from_static(elsewhere)), &[]), "{elsewhere}");
        }
        let public = Origins::default().with_public_hosts(&["Agents.Internal".into()]).expect("a name").public_hosts;
        assert!(super::known_host(Some(&HeaderValue::from_static("agents.internal:8443")), &public));
        assert!(super::known_host(Some(&HeaderValue::from_static("AGENTS.internal.")), &public));
        assert!(!super::known_host(Some(&HeaderValue::from_static("rebind.attacker.example")), &public));
        let host = HeaderValue::from_static("127.0.0.1:8080");
        assert!(same_origin(&HeaderValue::from_static("http://127.0.0.1:8080"), Some(&host)));
        assert!(!same_origin(&HeaderValue::from_static("http://127.0.0.1:9999"), Some(&host)));
        assert!(!same_origin(&HeaderValue::from_static("null"), Some(&host)));
    }
}
