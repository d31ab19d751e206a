//! The extractors handlers use for the path and the query, refusing bad input with the envelope.
//!
//! axum's own `Path` and `Query` answer a bad value with `text/plain` and no field name. These wrap the same
//! parsing and answer 400 with the OpenAI envelope and `param` naming what is wrong: the path segment (`id`,
//! when it is not UTF-8; a message's or block's id after a stream's too) or the query parameter (`from`, for `from=-1`, `from=abc` or a sequence past
//! `u64`). A parameter the handler reads, given twice, is refused rather than silently resolved one way or the
//! other (`duplicate_parameter`); parameters a handler does not know are ignored, however often they are
//! given, as a cache-busting `_=` must be.

use std::net::SocketAddr;

use axum::extract::rejection::PathRejection;
use axum::extract::{ConnectInfo, FromRequestParts};
use axum::http::request::Parts;
use serde::de::DeserializeOwned;

use super::HttpError;
use super::admission::ClientAddress;

/// The `{id}` of a stream path.
#[derive(Debug)]
pub(crate) struct StreamId(pub(crate) String);

/// The `{id}` of a stream path and the id after it: `/v1/streams/{id}/messages/{message_id}/end`.
#[derive(Debug)]
pub(crate) struct StreamPart(pub(crate) String, pub(crate) String);

impl<S: Send + Sync> FromRequestParts<S> for StreamPart {
    type Rejection = HttpError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, HttpError> {
        match axum::extract::Path::<(String, String)>::from_request_parts(parts, state).await {
            Ok(axum::extract::Path((id, part))) => Ok(StreamPart(id, part)),
            Err(rejection) => Err(path_error(&rejection, "stream")),
        }
    }
}

/// The `{id}` of a thread path.
#[derive(Debug)]
pub(crate) struct ThreadId(pub(crate) String);

impl<S: Send + Sync> FromRequestParts<S> for StreamId {
    type Rejection = HttpError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, HttpError> {
        path_id(parts, state, "stream").await.map(StreamId)
    }
}

impl<S: Send + Sync> FromRequestParts<S> for ThreadId {
    type Rejection = HttpError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, HttpError> {
        path_id(parts, state, "thread").await.map(ThreadId)
    }
}

async fn path_id<S: Send + Sync>(parts: &mut Parts, state: &S, what: &str) -> Result<String, HttpError> {
    match axum::extract::Path::<String>::from_request_parts(parts, state).await {
        Ok(axum::extract::Path(id)) => Ok(id),
        Err(rejection) => Err(path_error(&rejection, what)),
    }
}

fn path_error(rejection: &PathRejection, what: &str) -> HttpError {
    HttpError::bad_request(
        format!("the {what} id in the path is not valid: {}", rejection.body_text()),
        Some("id".into()),
        "invalid_value",
    )
}

/// The client a request comes from, by whose budget it creates streams: with keys configured, the key it
/// came with (by name: `key:<name>`); otherwise the peer's [`ClientAddress`] (its IP address, or for IPv6 its
/// /64 network), the client whose share of connections it holds too. A request that did not come through
/// [`crate::http::serve`] has none.
#[derive(Debug)]
pub(crate) struct Client(pub(crate) Option<String>);

impl<S: Send + Sync> FromRequestParts<S> for Client {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        if let Some(key) = parts.extensions.get::<super::auth::Grant>().and_then(|grant| grant.client()) {
            return Ok(Client(Some(key)));
        }
        let peer = parts.extensions.get::<ConnectInfo<SocketAddr>>().map(|ConnectInfo(peer)| peer.ip());
        Ok(Client(peer.map(|ip| ClientAddress::of(ip).to_string())))
    }
}

/// The API key a request came with, by name, when the service has keys: what owns the threads it creates
/// (see `auth.rs`). `None` without keys, and for a stream token.
#[derive(Debug)]
pub(crate) struct KeyName(pub(crate) Option<String>);

impl<S: Send + Sync> FromRequestParts<S> for KeyName {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        Ok(KeyName(parts.extensions.get::<super::auth::Grant>().and_then(|grant| grant.client())))
    }
}

/// A query string parsed into `T`, with errors that name the parameter.
#[derive(Debug)]
pub(crate) struct Params<T>(pub(crate) T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequestParts<S> for Params<T> {
    type Rejection = HttpError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, HttpError> {
        parse(parts.uri.query().unwrap_or("")).map(Params)
    }
}

/// Parses a query string into `T`.
pub(crate) fn parse<T: DeserializeOwned>(query: &str) -> Result<T, HttpError> {
    let deserializer = serde_urlencoded::Deserializer::new(url::form_urlencoded::parse(query.as_bytes()));
    serde_path_to_error::deserialize(deserializer).map_err(|error| {
        let param = error.path().to_string();
        let reason = error.into_inner();
        // A parameter `T` has, given twice: serde refuses it before it reads the second value. A parameter `T`
        // does not have is ignored however often it is given.
        let text = reason.to_string();
        if let Some(name) = text.strip_prefix("duplicate field `").and_then(|rest| rest.split('`').next()) {
            return HttpError::bad_request(
                format!("the query parameter {name:?} is given more than once"),
                Some(name.to_owned()),
                "duplicate_parameter",
            );
        }
        let value = url::form_urlencoded::parse(query.as_bytes())
            .find(|(name, _)| *name == param)
            .map(|(_, value)| value.into_owned())
            .unwrap_or_default();
        let param = (!param.is_empty() && param != ".").then_some(param);
        let message = match &param {
            Some(param) => format!("the query parameter {param} cannot be {value:?}: {reason}"),
            None => format!("the query string is not valid: {reason}"),
        };
        HttpError::bad_request(message, param, "invalid_value")
    })
}

#[cfg(test)]
mod tests {
    use serde::Deserialize;

    use super::*;

    #[derive(Debug, Deserialize)]
    struct Query {
        from: Option<u64>,
        #[allow(dead_code)]
        format: Option<String>,
    }

    fn param(query: &str) -> Option<String> {
        parse::<Query>(query).err().and_then(|e| e.error.param)
    }

    #[test]
    fn names_the_parameter_at_fault() {
        assert_eq!(param("from=-1"), Some("from".into()));
        assert_eq!(param("from=abc&format=cui"), Some("from".into()));
        assert_eq!(param("from=18446744073709551616"), Some("from".into()));
        assert_eq!(param("from=1&from=2"), Some("from".into()));
        assert_eq!(param("format=cui&format=cui"), Some("format".into()));
        assert_eq!(param("from=1&fr%6Fm=2"), Some("from".into()));
        let code = |query: &str| parse::<Query>(query).err().and_then(|e| e.error.code);
        assert_eq!(code("from=1&from=2"), Some("duplicate_parameter".into()));
        assert_eq!(code("from=abc"), Some("invalid_value".into()));
    }

    #[test]
    fn takes_good_values_and_ignores_unknown_ones() {
        assert_eq!(parse::<Query>("from=18446744073709551615&_=123").ok().and_then(|q| q.from), Some(u64::MAX));
        assert_eq!(parse::<Query>("").ok().and_then(|q| q.from), None);
        // Only a parameter the handler reads is ambiguous when repeated; others stay ignored.
        assert_eq!(parse::<Query>("_=1&_=2&from=3&x&x").ok().and_then(|q| q.from), Some(3));
    }
}
