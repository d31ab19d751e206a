//! Which step of reaching the upstream failed: the name (`upstream_dns`), the connection (`upstream_connect`),
//! the TLS handshake (`upstream_tls`, with the certificate's reason) or the connect timeout
//! (`upstream_timeout`).
//!
//! reqwest's error says only "error sending request"; what happened is in its chain of causes: a
//! `rustls::Error` for the handshake, an `io::Error` for the socket, hyper-util's connect error for the name.
//! The chain is walked by type; an `io::Error` hides the error it wraps from `source()`, so the walk looks
//! inside it. hyper-util's connect error has no public kind, only its text: "dns error" is the one thing read
//! from a message.

use std::error::Error as StdError;
use std::io;
use std::time::Duration;

use super::error::{DialStep, UpstreamError};

/// The failure a request that never got an answer ends with; `connect_timeout` is the one in force.
pub(crate) fn dial_error(error: &reqwest::Error, connect_timeout: Duration) -> UpstreamError {
    let causes: Vec<&(dyn StdError + 'static)> = causes(error).collect();
    if let Some(tls) = causes.iter().find_map(|e| e.downcast_ref::<rustls::Error>()) {
        return UpstreamError::Dial { step: DialStep::Tls, why: tls.to_string() };
    }
    let timed_out =
        causes.iter().any(|e| e.downcast_ref::<io::Error>().is_some_and(|e| e.kind() == io::ErrorKind::TimedOut));
    if error.is_timeout() || timed_out {
        return UpstreamError::Timeout { what: "connect", after: connect_timeout };
    }
    let innermost = causes.last().map(ToString::to_string).unwrap_or_default();
    if causes.iter().any(|e| e.to_string().starts_with("dns error")) {
        return UpstreamError::Dial { step: DialStep::Dns, why: innermost };
    }
    if error.is_connect() {
        return UpstreamError::Dial { step: DialStep::Connect, why: innermost };
    }
    UpstreamError::Connect(without_url(error))
}

/// `error` and its causes, outermost first, each `io::Error`'s wrapped error included.
fn causes<'a>(error: &'a (dyn StdError + 'static)) -> impl Iterator<Item = &'a (dyn StdError + 'static)> {
    std::iter::successors(Some(error), |&e: &&'a (dyn StdError + 'static)| {
        match e.downcast_ref::<io::Error>().and_then(io::Error::get_ref) {
            Some(inner) => Some(inner as &(dyn StdError + 'static)),
            None => e.source(),
        }
    })
}

/// reqwest's text for `error` with the URL (which may carry a query) as "the upstream".
pub(crate) fn without_url(error: &reqwest::Error) -> String {
    let mut text = error.to_string();
    if let Some(url) = error.url() {
        text = text.replace(url.as_str(), "the upstream");
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct Outer(io::Error);

    impl std::fmt::Display for Outer {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("outer")
        }
    }

    impl StdError for Outer {
        fn source(&self) -> Option<&(dyn StdError + 'static)> {
            Some(&self.0)
        }
    }

    #[test]
    fn the_walk_looks_inside_io_errors() {
        let rustls = rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer);
        let outer = Outer(io::Error::new(io::ErrorKind::InvalidData, rustls));
        let found = causes(&outer).find_map(|e| e.downcast_ref::<rustls::Error>()).map(ToString::to_string);
        assert_eq!(found.as_deref(), Some("invalid peer certificate: UnknownIssuer"));
    }
}
