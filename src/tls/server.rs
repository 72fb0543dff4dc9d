//! The server side a terminating link shows the engine (`tls: { links: terminate }`): the
//! certificate the drill's CA minted for its brokers (SANs 127.0.0.1, localhost and the
//! scenario's names, so the link on 127.0.0.1 passes the engine's name check), and under mutual
//! TLS a check of the engine's certificate against that same CA; and the expired certificate
//! a link presents for `bad_certificate` with `certificate: expired`.

use std::path::Path;
use std::sync::Arc;

use rustls_pki_types::PrivateKeyDer;
use rustls_pki_types::pem::PemObject;
use tokio_rustls::rustls::server::WebPkiClientVerifier;
use tokio_rustls::rustls::{self, RootCertStore, ServerConfig};

use super::TlsFiles;
use super::client::read_certs;

/// The rustls server configuration of a terminating link, built once per drill from the
/// minted CA's files. `Err` names the file and why, in one line.
pub fn link_server(
    files: &TlsFiles,
    client_certificates: bool,
) -> Result<Arc<ServerConfig>, String> {
    serving(
        files,
        client_certificates,
        &files.server_cert_file,
        &files.server_key_file,
    )
}

/// What a link presents for `bad_certificate` with `certificate: expired`: the broker's
/// certificate from the drill's own CA, with the same names, expired.
pub fn expired(files: &TlsFiles) -> Result<Arc<ServerConfig>, String> {
    serving(
        files,
        false,
        &files.expired_cert_file,
        &files.expired_key_file,
    )
}

fn serving(
    files: &TlsFiles,
    client_certificates: bool,
    cert_file: &Path,
    key_file: &Path,
) -> Result<Arc<ServerConfig>, String> {
    let chain = read_certs(cert_file, "server certificate file")?;
    let key = PrivateKeyDer::from_pem_file(key_file).map_err(|e| {
        format!(
            "server key file {}: no PEM private key: {e}",
            key_file.display()
        )
    })?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS: {e}"))?;
    let builder = if client_certificates {
        let mut roots = RootCertStore::empty();
        for ca in read_certs(&files.ca_file, "CA file")? {
            roots
                .add(ca)
                .map_err(|e| format!("CA file {}: {e}", files.ca_file.display()))?;
        }
        let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
            .build()
            .map_err(|e| format!("TLS client check: {e}"))?;
        builder.with_client_cert_verifier(verifier)
    } else {
        builder.with_no_client_auth()
    };
    let config = builder
        .with_single_cert(chain, key)
        .map_err(|e| format!("server certificate {}: {e}", cert_file.display()))?;
    Ok(Arc::new(config))
}
