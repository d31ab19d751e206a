//! The HTTP client agentmux dials its upstream with: rustls (no system OpenSSL), trusting the bundled web PKI
//! roots, the system's own roots and the operator's private CA, through the proxy the environment names.
//!
//! The roots are given to reqwest's own rustls verifier (`tls_certs_merge`), which adds the system's roots
//! (`/etc/ssl/certs` and the like) to them: a machine without a CA bundle still reaches a public upstream, and
//! a private CA (`--upstream-ca-file`) is trusted beside them, not instead of them. reqwest reads `HTTPS_PROXY`,
//! `HTTP_PROXY`, `ALL_PROXY` and `NO_PROXY` (and their lower-case forms) itself; nothing here changes that.

use std::time::Duration;

/// The client for an upstream, connecting within `connect_timeout` and trusting `ca_pem` (PEM) beside the
/// usual roots; a CA that is not PEM certificates is an error naming why.
pub(crate) fn http_client(connect_timeout: Duration, ca_pem: Option<&[u8]>) -> Result<reqwest::Client, String> {
    reqwest::Client::builder()
        .connect_timeout(connect_timeout)
        .tls_certs_merge(roots(ca_pem)?)
        .build()
        .map_err(|e| format!("cannot make an HTTP client: {e}"))
}

/// The bundled web PKI roots and the certificates of `ca_pem`.
fn roots(ca_pem: Option<&[u8]>) -> Result<Vec<reqwest::Certificate>, String> {
    let mut roots: Vec<reqwest::Certificate> = webpki_root_certs::TLS_SERVER_ROOT_CERTS
        .iter()
        .filter_map(|der| reqwest::Certificate::from_der(der.as_ref()).ok())
        .collect();
    if let Some(pem) = ca_pem {
        roots.extend(ca_certificates(pem)?);
    }
    Ok(roots)
}

/// The certificates of a PEM CA file: at least one, each one parsable.
pub(crate) fn ca_certificates(pem: &[u8]) -> Result<Vec<reqwest::Certificate>, String> {
    let certificates = reqwest::Certificate::from_pem_bundle(pem)
        .map_err(|e| format!("the upstream CA is not PEM certificates: {e}"))?;
    if certificates.is_empty() {
        return Err("the upstream CA holds no PEM certificate".to_owned());
    }
    Ok(certificates)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ca_that_is_not_pem_is_refused() {
        assert!(ca_certificates(b"not a certificate").is_err());
        assert!(ca_certificates(b"").is_err());
        assert!(roots(None).is_ok_and(|roots| roots.len() > 50));
    }
}
