//! The TLS server a link stands in with during `bad_certificate`: by default it presents a
//! certificate for 127.0.0.1 and localhost from a CA no drill trusts (minted once per process,
//! in memory), so a client that checks certificates fails its handshake — as with a broker
//! whose certificate was rotated to the wrong one. With `certificate: expired` it presents the
//! drill's own expired broker certificate instead (given by the link). Nothing is forwarded.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
use rustls_pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls::{self, ServerConfig};

/// How long a client may take over its side of the doomed handshake.
const HANDSHAKE: Duration = Duration::from_secs(10);

fn config() -> Option<Arc<ServerConfig>> {
    static CONFIG: OnceLock<Option<Arc<ServerConfig>>> = OnceLock::new();
    CONFIG
        .get_or_init(|| {
            let mut ca = CertificateParams::default();
            ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
            ca.distinguished_name
                .push(rcgen::DnType::CommonName, "not the drill's CA");
            let ca = CertifiedIssuer::self_signed(ca, KeyPair::generate().ok()?).ok()?;
            let server =
                CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".to_string()])
                    .ok()?;
            let key = KeyPair::generate().ok()?;
            let cert = server.signed_by(&key, &ca).ok()?;
            let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
            let provider = Arc::new(rustls::crypto::ring::default_provider());
            let config = ServerConfig::builder_with_provider(provider)
                .with_safe_default_protocol_versions()
                .ok()?
                .with_no_client_auth()
                .with_single_cert(vec![cert.der().clone()], key)
                .ok()?;
            Some(Arc::new(config))
        })
        .clone()
}

/// Answers the client's handshake with the impostor's certificate (or with `config`'s: the
/// drill's expired one), then closes. `true`: the client went as far as the handshake (it
/// failed on the certificate, or gave up).
pub async fn present(client: TcpStream, config: Option<Arc<ServerConfig>>) -> bool {
    let Some(config) = config.or_else(self::config) else {
        return false;
    };
    match tokio::time::timeout(HANDSHAKE, TlsAcceptor::from(config).accept(client)).await {
        // A client that does not check certificates got through: close it all the same.
        Ok(Ok(mut tls)) => {
            let _ = tls.shutdown().await;
            true
        }
        Ok(Err(_)) => true,
        Err(_) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tls::{ClientTls, DrillCa, TlsConfig};

    #[tokio::test]
    async fn a_client_of_the_drills_ca_rejects_the_impostor() {
        let dir = tempfile::tempdir().unwrap();
        let ca = DrillCa::mint(dir.path(), "t", &[]).unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            let (tcp, _) = listener.accept().await.unwrap();
            present(tcp, None).await
        });
        let client = ClientTls::new(&TlsConfig::trusting(&ca.files.ca_file)).unwrap();
        let e = crate::tls::client::connect(addr, Some(&client))
            .await
            .unwrap_err();
        assert!(
            e.to_string().contains("UnknownIssuer") || e.to_string().contains("certificate"),
            "{e}"
        );
        assert!(server.await.unwrap());
    }
}
