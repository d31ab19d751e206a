//! The relay upstream's TLS: a CA made at start (rcgen) and a certificate it signed for `127.0.0.1`, so the
//! upstream can also be reached over HTTPS and agentmux trusts it with `--upstream-ca-file`. The relay then
//! measures, beside the plain upstream, what TLS to the upstream adds (its handshake once per pooled
//! connection, and decrypting every chunk).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair, KeyUsagePurpose};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls::ServerConfig;
use tokio_rustls::rustls::crypto::aws_lc_rs;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

/// A new CA, written to `dir/ca.pem` (its path returned), and an acceptor with a certificate it signed for
/// `127.0.0.1` and `localhost`.
pub(crate) fn acceptor(dir: &Path) -> Result<(TlsAcceptor, PathBuf), String> {
    let fail = |what: &str, e: &dyn std::fmt::Display| format!("relay TLS: {what}: {e}");
    let mut params = CertificateParams::new(Vec::<String>::new()).map_err(|e| fail("CA params", &e))?;
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, "agentmux relay bench CA");
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let ca_key = KeyPair::generate().map_err(|e| fail("a CA key", &e))?;
    let ca = CertifiedIssuer::self_signed(params, ca_key).map_err(|e| fail("the CA", &e))?;
    let key = KeyPair::generate().map_err(|e| fail("a server key", &e))?;
    let server = CertificateParams::new(vec!["127.0.0.1".to_owned(), "localhost".to_owned()])
        .map_err(|e| fail("server params", &e))?
        .signed_by(&key, &ca)
        .map_err(|e| fail("the server certificate", &e))?;
    std::fs::create_dir_all(dir).map_err(|e| fail("its directory", &e))?;
    let ca_file = dir.join("ca.pem");
    std::fs::write(&ca_file, ca.pem()).map_err(|e| fail("writing ca.pem", &e))?;
    let chain = vec![CertificateDer::from(server.der().to_vec())];
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
    let config = ServerConfig::builder_with_provider(Arc::new(aws_lc_rs::default_provider()))
        .with_safe_default_protocol_versions()
        .map_err(|e| fail("TLS versions", &e))?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .map_err(|e| fail("the server config", &e))?;
    Ok((TlsAcceptor::from(Arc::new(config)), ca_file))
}
