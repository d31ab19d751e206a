//! Who may do what: API keys, and each stream's read and write tokens.
//!
//! Without keys (the default, on loopback only: see `main.rs`) a stream's id is enough to do anything with
//! it, as it always was; tokens are still issued, and a request that carries one is served the same, so a
//! client written for a keyed deployment runs unchanged against a local one. With keys (`--api-key`), every
//! request needs one, except:
//!
//! - reading a stream (its status, its events, its WebSocket) with its **read token** (or its write token);
//! - appending to, ending or cancelling a stream with its **write token**;
//! - `/healthz`, `/readyz` and `/v1/version`, which say only that the process answers, takes work, and
//!   which version it is (`/metrics` needs a key: a scraper sends it as a bearer); and the viewer's page and
//!   assets (`/ui`), which hold no data: what the page reads needs a credential.
//!
//! A credential comes as `Authorization: Bearer <key or token>` (or `x-api-key: <key or token>`, as
//! Anthropic's clients send it), or for reads as `?token=` (a browser's `EventSource` cannot set headers),
//! which takes a stream's token only: a key in a URL, where access logs, proxies and browser histories keep
//! it, is refused (401 `api_key_in_url`) rather than used. A token is told from a key by its form: `amr.` (read) or `amw.`
//! (write), the stream's id, its expiry (Unix seconds, 0 for none), and an HMAC-SHA256 of those under the
//! service's secret (kept in the store, so tokens outlive a restart; a new one per process with
//! `--ephemeral`). So a token grants one stream, one kind of access, until its expiry; it cannot be guessed,
//! nor made from the id without the secret, and checking it needs no table of tokens. Keys are kept only as
//! SHA-256 digests, compared as such. Expiries are given and checked by the hub's [`Clock`] (which
//! [`Credentials`] holds), so a test moves a token past its expiry by moving that clock, not by waiting.
//!
//! Refusals use the OpenAI error envelope (Anthropic's shape on `/v1/messages`, see `shape.rs`): 401 (with
//! `WWW-Authenticate: Bearer`) for a missing, unknown, forged or expired credential, which the OpenAI SDKs raise as
//! `AuthenticationError`; 403 for a genuine token that does not grant this (a read token used to write, another
//! stream's token). Neither names the credential, and no log line does.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::extract::{MatchedPath, Request, State};
use axum::http::StatusCode;
use axum::http::header::{AUTHORIZATION, WWW_AUTHENTICATE};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

use super::HttpError;
use crate::hub::Clock;

/// The prefixes that make a bearer credential a token rather than a key.
const READ_PREFIX: &str = "amr";
const WRITE_PREFIX: &str = "amw";

/// What a request does to a stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Reads it: its status, its events, its WebSocket.
    Read,
    /// Writes it: appends, ends, cancels.
    Write,
}

impl Access {
    fn prefix(self) -> &'static str {
        match self {
            Access::Read => READ_PREFIX,
            Access::Write => WRITE_PREFIX,
        }
    }
}

/// One API key and what it may use: a line of a keys file, `<key> [name=N] [streams=N]
/// [streams_per_minute=N] [threads=N] [connections=N]`, or just the key (`--api-key`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeySpec {
    /// The key itself.
    pub key: String,
    /// Its name in logs, metrics and the hub's budgets (default: `key-` and 8 hex digits of its digest).
    pub name: String,
    /// Streams it may hold at once, open or ended until evicted (default: the per-client limit).
    pub streams: Option<usize>,
    /// Streams (runs included) it may create in a minute (default: the per-client limit).
    pub streams_per_minute: Option<u32>,
    /// Threads it may keep at once (default: the per-client limit).
    pub threads: Option<usize>,
    /// Requests it may have in flight at once, event streams and WebSockets included for as long as they are
    /// open (default: no limit).
    pub connections: Option<usize>,
}

impl From<&str> for KeySpec {
    fn from(key: &str) -> Self {
        let hex: String = digest(key)[..4].iter().map(|b| format!("{b:02x}")).collect();
        KeySpec {
            key: key.to_owned(),
            name: format!("key-{hex}"),
            streams: None,
            streams_per_minute: None,
            threads: None,
            connections: None,
        }
    }
}

impl std::str::FromStr for KeySpec {
    type Err = String;

    /// A keys file's line: the key, then `name=`, `streams=`, `streams_per_minute=`, `threads=`,
    /// `connections=`.
    fn from_str(line: &str) -> Result<Self, String> {
        let mut words = line.split_whitespace();
        let key = words.next().ok_or("an empty line")?;
        check_key(key).map_err(|e| e.to_string())?;
        let mut spec = KeySpec::from(key);
        for word in words {
            let (field, value) = word.split_once('=').ok_or_else(|| format!("`{word}` is not field=value"))?;
            let number = || value.parse::<u64>().map_err(|_| format!("`{word}`: not a whole number"));
            match field {
                "name" if !value.is_empty() => spec.name = value.to_owned(),
                "streams" => spec.streams = Some(number()? as usize),
                "streams_per_minute" => spec.streams_per_minute = Some(u32::try_from(number()?).unwrap_or(u32::MAX)),
                "threads" => spec.threads = Some(number()? as usize),
                "connections" => spec.connections = Some(number()? as usize),
                _ => {
                    return Err(format!(
                        "`{word}`: the fields are name, streams, streams_per_minute, threads, connections"
                    ));
                }
            }
        }
        Ok(spec)
    }
}

/// The hub's budgets for the keys that have one of their own (by `key:<name>`, the client the HTTP layer
/// names a keyed request's streams after); `streams` and `streams_per_minute` fill in what a key leaves out.
pub fn budgets(keys: &[KeySpec], streams: usize, streams_per_minute: u32) -> HashMap<String, crate::hub::Budget> {
    keys.iter()
        .filter(|k| k.streams.is_some() || k.streams_per_minute.is_some())
        .map(|k| {
            let budget = crate::hub::Budget {
                streams: k.streams.unwrap_or(streams),
                streams_per_minute: k.streams_per_minute.unwrap_or(streams_per_minute),
            };
            (format!("key:{}", k.name), budget)
        })
        .collect()
}

/// The thread registry's budgets for the keys that have one of their own (by `key:<name>`, as [`budgets`]);
/// the others keep the per-client limit.
pub fn thread_budgets(keys: &[KeySpec]) -> HashMap<String, usize> {
    keys.iter().filter_map(|k| Some((format!("key:{}", k.name), k.threads?))).collect()
}

/// A configured key as the service holds it: its name, its connection limit and how many it has open.
#[derive(Debug)]
pub(crate) struct Key {
    pub(crate) name: String,
    connections: Option<usize>,
    open: AtomicUsize,
}

/// The service's keys, the secret its tokens are signed with, and the clock their expiries are read by.
#[derive(Clone)]
pub struct Credentials {
    keys: HashMap<[u8; 32], Arc<Key>>,
    secret: [u8; 32],
    clock: Arc<dyn Clock>,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials").field("keys", &self.keys.len()).finish_non_exhaustive()
    }
}

/// Why a key could not be taken.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum KeyError {
    /// An empty key (a blank line of a keys file is skipped, not an error).
    #[error("an API key may not be empty")]
    Empty,
    /// A key that reads as a token.
    #[error("an API key may not start with `amr.` or `amw.`: those are stream tokens")]
    LooksLikeToken,
}

/// Checks one API key's form: not empty, and not one a token could be mistaken for.
pub fn check_key(key: &str) -> Result<(), KeyError> {
    if key.trim().is_empty() {
        Err(KeyError::Empty)
    } else if token_kind(key).is_some() {
        Err(KeyError::LooksLikeToken)
    } else {
        Ok(())
    }
}

fn token_kind(credential: &str) -> Option<Access> {
    match credential.split_once('.') {
        Some((READ_PREFIX, _)) => Some(Access::Read),
        Some((WRITE_PREFIX, _)) => Some(Access::Write),
        _ => None,
    }
}

fn digest(text: &str) -> [u8; 32] {
    Sha256::digest(text.as_bytes()).into()
}

/// Why a credential was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Refusal {
    Missing,
    UnknownKey,
    Forged,
    Expired,
    /// Not a token in `?token=`: a key, which goes in a header only.
    KeyInUrl,
    /// A genuine token that does not grant this.
    NotGranted,
}

impl Credentials {
    /// `keys` (each as [`check_key`] allows; none: the service is open to whoever reaches it), the secret
    /// tokens are signed with, and the clock their expiries are given and checked by (the hub's).
    pub fn new(keys: &[KeySpec], secret: [u8; 32], clock: Arc<dyn Clock>) -> Credentials {
        let keys = keys
            .iter()
            .map(|spec| {
                let key = Key { name: spec.name.clone(), connections: spec.connections, open: AtomicUsize::new(0) };
                (digest(spec.key.trim()), Arc::new(key))
            })
            .collect();
        Credentials { keys, secret, clock }
    }

    /// The expiry of a token good for `seconds` from now (Unix seconds, by the clock).
    pub(crate) fn expires_in(&self, seconds: u64) -> u64 {
        self.now_s().saturating_add(seconds)
    }

    fn now_s(&self) -> u64 {
        self.clock.now_ms() / 1000
    }

    /// True when keys are configured, so requests need a credential.
    pub fn keyed(&self) -> bool {
        !self.keys.is_empty()
    }

    /// A token granting `access` to stream `stream` until `expires_s` (Unix seconds; 0: no expiry).
    pub fn token(&self, stream: &str, access: Access, expires_s: u64) -> String {
        let body = format!("{}.{stream}.{expires_s}", access.prefix());
        let mac = URL_SAFE_NO_PAD.encode(self.mac(&body).finalize().into_bytes());
        format!("{body}.{mac}")
    }

    fn mac(&self, body: &str) -> Hmac<Sha256> {
        let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(&self.secret).expect("an HMAC takes a key of any length");
        mac.update(body.as_bytes());
        mac
    }

    /// What `credential` grants: everything for a key, one stream for a genuine token still good.
    fn grant(&self, credential: Option<&str>) -> Result<Grant, Refusal> {
        let credential = credential.ok_or(Refusal::Missing)?;
        let Some(access) = token_kind(credential) else {
            return if let Some(key) = self.keys.get(&digest(credential)) {
                Ok(Grant::Key(Arc::clone(key)))
            } else {
                Err(Refusal::UnknownKey)
            };
        };
        let (body, mac) = credential.rsplit_once('.').ok_or(Refusal::Forged)?;
        let mac = URL_SAFE_NO_PAD.decode(mac).map_err(|_| Refusal::Forged)?;
        self.mac(body).verify_slice(&mac).map_err(|_| Refusal::Forged)?;
        // Genuine from here on: the service made it.
        let (rest, expires) = body.rsplit_once('.').ok_or(Refusal::Forged)?;
        let stream = rest.split_once('.').map(|(_, id)| id).ok_or(Refusal::Forged)?;
        let expires: u64 = expires.parse().map_err(|_| Refusal::Forged)?;
        // The clock is read only for a token that can expire: a test's stepping clock must not tick for nothing.
        if expires != 0 && expires <= self.now_s() {
            return Err(Refusal::Expired);
        }
        Ok(Grant::Stream { id: stream.to_owned(), access })
    }

    /// Whether `credential` is a key, or a token granting `access` to `stream` (none: a key is needed).
    fn check(&self, credential: Option<&str>, stream: Option<(&str, Access)>) -> Result<Grant, Refusal> {
        let grant = self.grant(credential)?;
        let allowed = match stream {
            Some((id, access)) => grant.allows(id, access),
            None => matches!(grant, Grant::Everything | Grant::Key(_)),
        };
        if allowed { Ok(grant) } else { Err(Refusal::NotGranted) }
    }
}

/// What a request's credential lets it do; the guard puts it in the request's extensions, for handlers
/// that act on streams a request names in its body (the WebSocket ops).
#[derive(Debug, Clone)]
pub(crate) enum Grant {
    /// No keys configured.
    Everything,
    /// A key: everything, within the key's budget.
    Key(Arc<Key>),
    /// A token: `access` to stream `id` (write access reads too).
    Stream { id: String, access: Access },
}

impl PartialEq for Grant {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (Grant::Everything, Grant::Everything) => true,
            (Grant::Key(a), Grant::Key(b)) => a.name == b.name,
            (Grant::Stream { id: a, access: x }, Grant::Stream { id: b, access: y }) => a == b && x == y,
            _ => false,
        }
    }
}

impl Grant {
    /// The client whose budget this request's streams count against: its key, by name (`None`: the peer's
    /// address decides, as without keys).
    pub(crate) fn client(&self) -> Option<String> {
        match self {
            Grant::Key(key) => Some(format!("key:{}", key.name)),
            _ => None,
        }
    }

    /// Whether this grants `access` to stream `stream`.
    pub(crate) fn allows(&self, stream: &str, access: Access) -> bool {
        match self {
            Grant::Everything | Grant::Key(_) => true,
            Grant::Stream { id, access: granted } => id == stream && (*granted == access || *granted == Access::Write),
        }
    }

    /// 403 `permission_denied`, for an op this does not allow.
    pub(crate) fn refusal() -> HttpError {
        let (status, kind, message, code) = refusal_parts(Refusal::NotGranted);
        HttpError::new(status, kind, message, None, code)
    }
}

/// What a route needs, by its template.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Needs {
    /// Nothing.
    Nothing,
    /// This access to the stream in the path.
    Stream(Access),
    /// Any credential: the handler checks what it grants against each stream it acts on.
    Any,
    /// A key.
    Key,
}

pub(crate) fn needs(route: &str) -> Needs {
    match route {
        // The viewer's page and assets hold no data; what they read needs a credential.
        "/healthz"
        | "/readyz"
        | "/v1/version"
        | "/ui"
        | "/ui/streams/{id}"
        | "/ui/assets/viewer.js"
        | "/ui/assets/viewer.css"
        | "/ui/assets/client.js" => Needs::Nothing,
        "/v1/streams/{id}" | "/v1/streams/{id}/events" | "/v1/streams/{id}/ws" => Needs::Stream(Access::Read),
        "/v1/streams/{id}/messages"
        | "/v1/streams/{id}/messages/{message_id}/end"
        | "/v1/streams/{id}/blocks/{block_id}/end"
        | "/v1/streams/{id}/end"
        | "/v1/streams/{id}/cancel" => Needs::Stream(Access::Write),
        "/v1/ws" => Needs::Any,
        _ => Needs::Key,
    }
}

/// The middleware: lets a request through with what its credential grants (everything when the service has
/// no keys), or refuses it.
pub(crate) async fn guard(State(credentials): State<Arc<Credentials>>, mut request: Request, next: Next) -> Response {
    let route = request.extensions().get::<MatchedPath>().map(|p| p.as_str().to_owned()).unwrap_or_default();
    let needs = needs(&route);
    if !credentials.keyed() || needs == Needs::Nothing {
        request.extensions_mut().insert(Grant::Everything);
        return next.run(request).await;
    }
    let bearer = request
        .headers()
        .get(AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer ").or_else(|| v.strip_prefix("bearer ")))
        .map(str::trim);
    // Anthropic's clients send their key as `x-api-key`.
    let api_key = request.headers().get("x-api-key").and_then(|v| v.to_str().ok()).map(str::trim);
    let bearer = bearer.or(api_key);
    // `?token=` on reads only: a browser's EventSource and WebSocket cannot set headers. A stream's token
    // only: a key in a URL is refused wherever it comes, not ignored.
    let query_token = request.uri().query().and_then(|q| {
        url::form_urlencoded::parse(q.as_bytes()).find(|(k, _)| k == "token").map(|(_, v)| v.into_owned())
    });
    if query_token.as_deref().is_some_and(|token| token_kind(token).is_none()) {
        tracing::debug!(route, "refused: a key in the URL");
        return refused(Refusal::KeyInUrl);
    }
    let reads = matches!(needs, Needs::Stream(Access::Read) | Needs::Any);
    let credential = bearer.map(str::to_owned).or(query_token.filter(|_| reads));
    let checked = match needs {
        // The stream is the path's third segment in every stream route (`/v1/streams/{id}...`).
        Needs::Stream(access) => {
            let stream = request.uri().path().split('/').nth(3).unwrap_or_default().to_owned();
            credentials.check(credential.as_deref(), Some((&stream, access)))
        }
        Needs::Any => credentials.grant(credential.as_deref()),
        Needs::Key | Needs::Nothing => credentials.check(credential.as_deref(), None),
    };
    match checked {
        Ok(grant) => {
            // A key with a connection limit holds a slot until its response's body is done, and a WebSocket
            // for as long as it is open: the upgrade takes the request's copy (`extract.rs`).
            let slot = match &grant {
                Grant::Key(key) => match Slot::take(key) {
                    Ok(slot) => slot.map(|slot| KeySlot { _slot: Arc::new(slot) }),
                    Err(limit) => return too_many(&key.name, limit),
                },
                _ => None,
            };
            request.extensions_mut().insert(grant);
            if let Some(slot) = &slot {
                request.extensions_mut().insert(slot.clone());
            }
            let response = next.run(request).await;
            match slot {
                Some(slot) => response.map(|body| axum::body::Body::new(SlotHoldingBody { body, _slot: slot })),
                None => response,
            }
        }
        Err(refusal) => {
            tracing::debug!(route, ?refusal, "refused: credentials");
            refused(refusal)
        }
    }
}

/// One of a key's connections, given back when dropped.
#[derive(Debug)]
struct Slot(Arc<Key>);

/// A request's slot of its key's connections, shared by whatever the request's work lives in: its response's
/// body and, for a WebSocket, the upgraded connection. The slot is given back when the last of them ends.
#[derive(Debug, Clone)]
pub(crate) struct KeySlot {
    _slot: Arc<Slot>,
}

impl Slot {
    /// A slot of `key`'s, if it has a limit (`None`: it has none); `Err(limit)` when all are taken.
    fn take(key: &Arc<Key>) -> Result<Option<Slot>, usize> {
        let Some(limit) = key.connections else { return Ok(None) };
        if key.open.fetch_add(1, Ordering::AcqRel) >= limit {
            key.open.fetch_sub(1, Ordering::AcqRel);
            return Err(limit);
        }
        Ok(Some(Slot(Arc::clone(key))))
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A response body that holds its key's slot until it is done (a stream's events, for as long as they flow).
struct SlotHoldingBody {
    body: axum::body::Body,
    _slot: KeySlot,
}

impl http_body::Body for SlotHoldingBody {
    type Data = axum::body::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        std::pin::Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

/// 429 for a key at its connection limit.
fn too_many(name: &str, limit: usize) -> Response {
    tracing::debug!(key = name, limit, "refused: the key's connections");
    let message = format!(
        "this key has its limit of {limit} requests in flight (event streams and WebSockets included); retry when \
         one ends"
    );
    let mut error = HttpError::new(StatusCode::TOO_MANY_REQUESTS, "rate_limit_error", message, None, "key_connections");
    error.retry = true;
    error.retry_after = Some(std::time::Duration::from_secs(1));
    error.into_response()
}

fn refusal_parts(refusal: Refusal) -> (StatusCode, &'static str, &'static str, &'static str) {
    let (status, code, message) = match refusal {
        Refusal::Missing => (
            StatusCode::UNAUTHORIZED,
            "missing_credentials",
            "this service needs an API key or a stream token: send `Authorization: Bearer <key or token>`",
        ),
        Refusal::UnknownKey => {
            (StatusCode::UNAUTHORIZED, "invalid_api_key", "the API key is not one this service knows")
        }
        Refusal::Forged => (StatusCode::UNAUTHORIZED, "invalid_token", "the token is not one this service issued"),
        Refusal::Expired => (StatusCode::UNAUTHORIZED, "token_expired", "the token has expired"),
        Refusal::KeyInUrl => (
            StatusCode::UNAUTHORIZED,
            "api_key_in_url",
            "API keys go in the `Authorization: Bearer <key>` header (or `x-api-key`), never in the URL, which \
             logs and browser histories keep: `?token=` takes only a stream's read or write token",
        ),
        Refusal::NotGranted => (
            StatusCode::FORBIDDEN,
            "permission_denied",
            "the credential does not grant this: a read token only reads, a token serves only its own stream, \
             and everything else needs an API key",
        ),
    };
    let kind = if status == StatusCode::UNAUTHORIZED { "authentication_error" } else { "permission_error" };
    (status, kind, message, code)
}

fn refused(refusal: Refusal) -> Response {
    let (status, kind, message, code) = refusal_parts(refusal);
    let mut response = HttpError::new(status, kind, message, None, code).into_response();
    if status == StatusCode::UNAUTHORIZED {
        response.headers_mut().insert(WWW_AUTHENTICATE, axum::http::HeaderValue::from_static("Bearer"));
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    fn credentials() -> Credentials {
        Credentials::new(&[KeySpec::from("sk-one")], [7; 32], Arc::new(crate::hub::SystemClock))
    }

    #[test]
    fn a_token_grants_its_stream_and_access_only() {
        let c = credentials();
        let read = c.token("s1", Access::Read, 0);
        let write = c.token("s1", Access::Write, 0);
        assert!(read.starts_with("amr.s1.0.") && write.starts_with("amw.s1.0."));
        let granted = |access| Ok(Grant::Stream { id: "s1".into(), access });
        assert_eq!(c.check(Some(&read), Some(("s1", Access::Read))), granted(Access::Read));
        assert_eq!(c.check(Some(&write), Some(("s1", Access::Read))), granted(Access::Write), "a writer may read");
        assert_eq!(c.check(Some(&write), Some(("s1", Access::Write))), granted(Access::Write));
        assert_eq!(c.check(Some(&read), Some(("s1", Access::Write))), Err(Refusal::NotGranted));
        assert_eq!(c.check(Some(&read), Some(("s2", Access::Read))), Err(Refusal::NotGranted));
        assert_eq!(c.check(Some(&read), None), Err(Refusal::NotGranted), "a token is no key");
    }

    #[test]
    fn forged_expired_and_unknown_credentials_are_refused() {
        let c = credentials();
        let read = c.token("s1", Access::Read, 0);
        // Another stream's id, or write access, under the same MAC.
        assert_eq!(c.check(Some(&read.replacen("s1", "s2", 1)), Some(("s2", Access::Read))), Err(Refusal::Forged));
        assert_eq!(c.check(Some(&read.replacen("amr", "amw", 1)), Some(("s1", Access::Write))), Err(Refusal::Forged));
        let other = Credentials::new(&[], [8; 32], Arc::new(crate::hub::SystemClock)).token("s1", Access::Read, 0);
        assert_eq!(c.check(Some(&other), Some(("s1", Access::Read))), Err(Refusal::Forged), "another secret");
        assert_eq!(c.check(Some("amr.s1.0.x!"), Some(("s1", Access::Read))), Err(Refusal::Forged));
        let expired = c.token("s1", Access::Read, 1);
        assert_eq!(c.check(Some(&expired), Some(("s1", Access::Read))), Err(Refusal::Expired));
        let later = c.token("s1", Access::Read, c.expires_in(60));
        assert!(c.check(Some(&later), Some(("s1", Access::Read))).is_ok());
        assert_eq!(
            c.check(Some("sk-one"), None).map(|g| g.client()),
            Ok(Some(KeySpec::from("sk-one").name).map(|n| format!("key:{n}")))
        );
        assert_eq!(c.check(Some("sk-two"), None), Err(Refusal::UnknownKey));
        assert_eq!(c.check(None, Some(("s1", Access::Read))), Err(Refusal::Missing));
    }

    #[test]
    fn a_keys_file_line_names_a_key_and_its_budget() {
        let spec: KeySpec = "sk-a name=team-a streams=5 streams_per_minute=60 connections=3".parse().expect("valid");
        assert_eq!((spec.key.as_str(), spec.name.as_str()), ("sk-a", "team-a"));
        assert_eq!((spec.streams, spec.streams_per_minute, spec.connections), (Some(5), Some(60), Some(3)));
        assert!(KeySpec::from("sk-a").name.starts_with("key-"), "a default name that is not the key");
        assert!(!KeySpec::from("sk-a").name.contains("sk-a"));
        for bad in ["sk-a streams=x", "sk-a colour=blue", "sk-a streams", "amr.x"] {
            assert!(bad.parse::<KeySpec>().is_err(), "{bad}");
        }
    }

    #[test]
    fn keys_that_read_as_tokens_are_refused() {
        assert_eq!(check_key("amr.x"), Err(KeyError::LooksLikeToken));
        assert_eq!(check_key("  "), Err(KeyError::Empty));
        assert_eq!(check_key("sk-live-1"), Ok(()));
    }
}
