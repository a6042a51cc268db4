//! TLS for the mirror channel (rustls): the primary's acceptor, the mirror's connector.

use anyhow::{anyhow, bail, Context, Result};
use std::sync::Arc;

/// A TLS acceptor from the primary's PEM certificate chain and private key.
pub fn acceptor(
    cert: &std::path::Path,
    key: &std::path::Path,
) -> Result<tokio_rustls::TlsAcceptor> {
    use tokio_rustls::rustls::pki_types::pem::PemObject;
    use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .with_context(|| format!("reading tls_cert {}", cert.display()))?
        .collect::<std::result::Result<_, _>>()
        .with_context(|| format!("tls_cert {} is not PEM certificates", cert.display()))?;
    if certs.is_empty() {
        bail!("tls_cert {} holds no certificate", cert.display());
    }
    let key = PrivateKeyDer::from_pem_file(key)
        .with_context(|| format!("reading tls_key {} (a PEM private key)", key.display()))?;
    let cfg = tokio_rustls::rustls::ServerConfig::builder()
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .context("tls_cert and tls_key do not form a usable pair")?;
    Ok(tokio_rustls::TlsAcceptor::from(Arc::new(cfg)))
}

/// A TLS connector that trusts only the CA in `ca` (PEM) and expects `server_name`.
pub fn connector(
    ca: &std::path::Path,
    server_name: &str,
) -> Result<(
    tokio_rustls::TlsConnector,
    tokio_rustls::rustls::pki_types::ServerName<'static>,
)> {
    use tokio_rustls::rustls::pki_types::pem::PemObject;
    use tokio_rustls::rustls::pki_types::{CertificateDer, ServerName};
    let mut roots = tokio_rustls::rustls::RootCertStore::empty();
    for c in CertificateDer::pem_file_iter(ca)
        .with_context(|| format!("reading tls_ca {}", ca.display()))?
    {
        roots
            .add(c.with_context(|| format!("tls_ca {} is not PEM certificates", ca.display()))?)
            .with_context(|| format!("tls_ca {}", ca.display()))?;
    }
    if roots.is_empty() {
        bail!("tls_ca {} holds no certificate", ca.display());
    }
    let cfg = tokio_rustls::rustls::ClientConfig::builder()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let name = ServerName::try_from(server_name.to_string())
        .map_err(|_| anyhow!("tls_server_name {server_name:?} is not a valid DNS name or IP"))?;
    Ok((tokio_rustls::TlsConnector::from(Arc::new(cfg)), name))
}
