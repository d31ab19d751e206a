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
//!   which version it is (`/metrics` needs a key: a scraper sends it as a bearer).
//!
//! A credential comes as `Authorization: Bearer <key or token>`, or for reads as `?token=` (a browser's
//! `EventSource` cannot set headers). A token is told from a key by its form: `amr.` (read) or `amw.`
//! (write), the stream's id, its expiry (Unix seconds, 0 for none), and an HMAC-SHA256 of those under the
//! service's secret (kept in the store, so tokens outlive a restart; a new one per process with
//! `--ephemeral`). So a token grants one stream, one kind of access, until its expiry; it cannot be guessed,
//! nor made from the id without the secret, and checking it needs no table of tokens. Keys are kept only as
//! SHA-256 digests, compared as such.
//!
//! Refusals use the OpenAI error envelope: 401 (with `WWW-Authenticate: Bearer`) for a missing, unknown,
//! forged or expired credential, which the OpenAI SDKs raise as `AuthenticationError`; 403 for a genuine
//! token that does not grant this (a read token used to write, another stream's token). Neither names the
//! credential, and no log line does.

use std::collections::HashSet;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::extract::{MatchedPath, Request, State};
use axum::http::StatusCode;
use axum::http::header::{AUTHORIZATION, WWW_AUTHENTICATE};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

use super::{App, HttpError};

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

/// The service's keys and the secret its tokens are signed with.
#[derive(Clone)]
pub struct Credentials {
    keys: HashSet<[u8; 32]>,
    secret: [u8; 32],
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

pub(crate) fn now_s() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// Why a credential was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Refusal {
    Missing,
    UnknownKey,
    Forged,
    Expired,
    /// A genuine token that does not grant this.
    NotGranted,
}

impl Credentials {
    /// `keys` (each as [`check_key`] allows; none: the service is open to whoever reaches it) and the
    /// secret tokens are signed with.
    pub fn new(keys: &[String], secret: [u8; 32]) -> Credentials {
        Credentials { keys: keys.iter().map(|k| digest(k.trim())).collect(), secret }
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
            return if self.keys.contains(&digest(credential)) {
                Ok(Grant::Everything)
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
        if expires != 0 && expires <= now_s() {
            return Err(Refusal::Expired);
        }
        Ok(Grant::Stream { id: stream.to_owned(), access })
    }

    /// Whether `credential` is a key, or a token granting `access` to `stream` (none: a key is needed).
    fn check(&self, credential: Option<&str>, stream: Option<(&str, Access)>) -> Result<Grant, Refusal> {
        let grant = self.grant(credential)?;
        let allowed = match stream {
            Some((id, access)) => grant.allows(id, access),
            None => grant == Grant::Everything,
        };
        if allowed { Ok(grant) } else { Err(Refusal::NotGranted) }
    }
}

/// What a request's credential lets it do; the guard puts it in the request's extensions, for handlers
/// that act on streams a request names in its body (the WebSocket ops).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Grant {
    /// A key, or no keys configured.
    Everything,
    /// A token: `access` to stream `id` (write access reads too).
    Stream { id: String, access: Access },
}

impl Grant {
    /// Whether this grants `access` to stream `stream`.
    pub(crate) fn allows(&self, stream: &str, access: Access) -> bool {
        match self {
            Grant::Everything => true,
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
enum Needs {
    /// Nothing.
    Nothing,
    /// This access to the stream in the path.
    Stream(Access),
    /// Any credential: the handler checks what it grants against each stream it acts on.
    Any,
    /// A key.
    Key,
}

fn needs(route: &str) -> Needs {
    match route {
        "/healthz" | "/readyz" | "/v1/version" => Needs::Nothing,
        "/v1/streams/{id}" | "/v1/streams/{id}/events" | "/v1/streams/{id}/ws" => Needs::Stream(Access::Read),
        "/v1/streams/{id}/messages" | "/v1/streams/{id}/end" | "/v1/streams/{id}/cancel" => {
            Needs::Stream(Access::Write)
        }
        "/v1/ws" => Needs::Any,
        _ => Needs::Key,
    }
}

/// The middleware: lets a request through with what its credential grants (everything when the service has
/// no keys), or refuses it.
pub(crate) async fn guard(State(app): State<App>, mut request: Request, next: Next) -> Response {
    let credentials = &app.credentials;
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
    // `?token=` on reads only: a browser's EventSource and WebSocket cannot set headers.
    let reads = matches!(needs, Needs::Stream(Access::Read) | Needs::Any);
    let query_token = reads.then(|| request.uri().query()).flatten().and_then(|q| {
        url::form_urlencoded::parse(q.as_bytes()).find(|(k, _)| k == "token").map(|(_, v)| v.into_owned())
    });
    let credential = bearer.map(str::to_owned).or(query_token);
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
            request.extensions_mut().insert(grant);
            next.run(request).await
        }
        Err(refusal) => {
            tracing::debug!(route, ?refusal, "refused: credentials");
            refused(refusal)
        }
    }
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
        Credentials::new(&["sk-one".to_owned()], [7; 32])
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
        let other = Credentials::new(&[], [8; 32]).token("s1", Access::Read, 0);
        assert_eq!(c.check(Some(&other), Some(("s1", Access::Read))), Err(Refusal::Forged), "another secret");
        assert_eq!(c.check(Some("amr.s1.0.x!"), Some(("s1", Access::Read))), Err(Refusal::Forged));
        let expired = c.token("s1", Access::Read, 1);
        assert_eq!(c.check(Some(&expired), Some(("s1", Access::Read))), Err(Refusal::Expired));
        let later = c.token("s1", Access::Read, now_s() + 60);
        assert!(c.check(Some(&later), Some(("s1", Access::Read))).is_ok());
        assert_eq!(c.check(Some("sk-one"), None), Ok(Grant::Everything));
        assert_eq!(c.check(Some("sk-two"), None), Err(Refusal::UnknownKey));
        assert_eq!(c.check(None, Some(("s1", Access::Read))), Err(Refusal::Missing));
    }

    #[test]
    fn keys_that_read_as_tokens_are_refused() {
        assert_eq!(check_key("amr.x"), Err(KeyError::LooksLikeToken));
        assert_eq!(check_key("  "), Err(KeyError::Empty));
        assert_eq!(check_key("sk-live-1"), Ok(()));
    }
}
