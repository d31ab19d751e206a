//! The Redis client of a node, over TLS when the URL says `rediss://`.
//!
//! The redis crate's rustls backend does the TLS; without a CA of our own it trusts the system's roots, with
//! one (`--redis-ca-file`, the usual case for a Redis with a private certificate) it trusts that CA alone. The
//! CA is checked here, before any connection, so that a file that holds no certificate is a startup error
//! that says so rather than a handshake that fails for want of a root.

use redis::{ConnectionInfo, RedisError, RedisResult, TlsCertificates};
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;

/// A client for `info`, trusting the certificates of `ca_pem` (PEM) when there are some.
pub(crate) fn redis_client(info: ConnectionInfo, ca_pem: Option<&[u8]>) -> RedisResult<redis::Client> {
    let Some(pem) = ca_pem else {
        return redis::Client::open(info);
    };
    let certificates = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| refused(format!("it is not PEM certificates: {e}")))?;
    if certificates.is_empty() {
        return Err(refused("it holds no PEM certificate".to_owned()));
    }
    redis::Client::build_with_tls(info, TlsCertificates { client_tls: None, root_cert: Some(pem.to_vec()) })
}

fn refused(why: String) -> RedisError {
    RedisError::from((redis::ErrorKind::Client, "the Redis CA cannot be used", why))
}

#[cfg(test)]
mod tests {
    use redis::IntoConnectionInfo;

    use super::*;

    #[test]
    fn a_ca_without_certificates_is_refused() {
        let info = || "rediss://127.0.0.1:6380".into_connection_info().ok();
        let error = info().and_then(|info| redis_client(info, Some(b"nothing here")).err());
        let error = error.map(|e| e.to_string()).unwrap_or_default();
        assert!(error.contains("no PEM certificate"), "{error}");
        assert!(info().is_some_and(|info| redis_client(info, None).is_ok()));
    }
}
