//! TLS for the tests: a CA made on the spot (rcgen) with a certificate for `127.0.0.1` and `localhost`, and a
//! TLS front on a loopback port that hands each connection, decrypted, to a plain one (so the fake upstream
//! serves HTTPS unchanged).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair, KeyUsagePurpose};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls::ServerConfig;
use tokio_rustls::rustls::crypto::aws_lc_rs;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// A CA and a server certificate it signed, all PEM.
pub(crate) struct TestCa {
    pub(crate) ca_pem: String,
    pub(crate) cert_pem: String,
    pub(crate) key_pem: String,
}

impl TestCa {
    /// A new CA named `name`, and a certificate for `127.0.0.1` and `localhost`.
    pub(crate) fn new(name: &str) -> TestCa {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let ca = CertifiedIssuer::self_signed(params, KeyPair::generate().expect("a CA key")).expect("the CA");
        let key = KeyPair::generate().expect("a server key");
        let server = CertificateParams::new(vec!["127.0.0.1".to_owned(), "localhost".to_owned()])
            .expect("server params")
            .signed_by(&key, &ca)
            .expect("the server certificate");
        TestCa { ca_pem: ca.pem(), cert_pem: server.pem(), key_pem: key.serialize_pem() }
    }

    /// Writes `ca.pem`, `cert.pem` and `key.pem` into `dir`; their paths in that order.
    pub(crate) fn write(&self, dir: &Path) -> (PathBuf, PathBuf, PathBuf) {
        std::fs::create_dir_all(dir).expect("a directory for the certificates");
        let paths = (dir.join("ca.pem"), dir.join("cert.pem"), dir.join("key.pem"));
        std::fs::write(&paths.0, &self.ca_pem).expect("write ca.pem");
        std::fs::write(&paths.1, &self.cert_pem).expect("write cert.pem");
        std::fs::write(&paths.2, &self.key_pem).expect("write key.pem");
        paths
    }

    fn server_config(&self) -> ServerConfig {
        let chain = vec![CertificateDer::from_pem_slice(self.cert_pem.as_bytes()).expect("the certificate")];
        let key = PrivateKeyDer::from_pem_slice(self.key_pem.as_bytes()).expect("the key");
        ServerConfig::builder_with_provider(Arc::new(aws_lc_rs::default_provider()))
            .with_safe_default_protocol_versions()
            .expect("TLS versions")
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .expect("a server config")
    }
}

/// TLS with `ca`'s server certificate on `127.0.0.1:<port>`, each connection passed on to `backend`; the
/// address. Runs until the test's runtime ends.
pub(crate) async fn tls_front(ca: &TestCa, backend: SocketAddr) -> SocketAddr {
    let acceptor = TlsAcceptor::from(Arc::new(ca.server_config()));
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind the TLS front");
    let address = listener.local_addr().expect("its address");
    tokio::spawn(async move {
        while let Ok((socket, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                // A client that refuses the certificate ends the handshake: nothing to pass on.
                let Ok(mut tls) = acceptor.accept(socket).await else { return };
                let Ok(mut plain) = TcpStream::connect(backend).await else { return };
                let _ = tokio::io::copy_bidirectional(&mut tls, &mut plain).await;
            });
        }
    });
    address
}
