//! The client side of TLS: what the engine's outputs and drill's readers trust (a CA file, and
//! a client certificate for mutual TLS), and a TCP connect followed by the handshake.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use serde::{Deserialize, Serialize};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::rustls::client::WebPkiServerVerifier;
use tokio_rustls::rustls::client::danger::{
    HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier,
};
use tokio_rustls::rustls::{
    self, ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme,
};

use super::Stream;

/// `tls:` of an output in `engine.yaml`: the CA to trust, and a client certificate and key for
/// mutual TLS. File names only; the files are read at each connect's setup, never copied.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TlsConfig {
    /// PEM file of the CA (or CAs) whose certificates the destination may present.
    pub ca_file: PathBuf,
    /// PEM file of this client's certificate (mutual TLS); with `key_file`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cert_file: Option<PathBuf>,
    /// PEM file of this client's private key (mutual TLS); with `cert_file`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_file: Option<PathBuf>,
    /// The name the destination's certificate must carry; default: the address's IP.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_name: Option<String>,
}

impl TlsConfig {
    /// Trusts `ca_file`, no client certificate.
    pub fn trusting(ca_file: &Path) -> TlsConfig {
        TlsConfig {
            ca_file: ca_file.to_path_buf(),
            cert_file: None,
            key_file: None,
            server_name: None,
        }
    }
}

/// A ready client side: the rustls configuration built once from a [`TlsConfig`].
#[derive(Clone)]
pub struct ClientTls {
    config: Arc<ClientConfig>,
    server_name: Option<ServerName<'static>>,
}

impl std::fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientTls")
            .field("server_name", &self.server_name)
            .finish_non_exhaustive()
    }
}

impl ClientTls {
    /// Reads the CA (and client certificate) files. `Err` says which file and why, in one line.
    pub fn new(cfg: &TlsConfig) -> Result<ClientTls, String> {
        let mut roots = RootCertStore::empty();
        let cas = read_certs(&cfg.ca_file, "CA file")?;
        for ca in cas {
            roots.add(ca).map_err(|e| {
                format!(
                    "CA file {}: not a CA certificate rustls can use: {e}",
                    cfg.ca_file.display()
                )
            })?;
        }
        let server_name = match &cfg.server_name {
            Some(n) => Some(
                ServerName::try_from(n.clone()).map_err(|e| format!("server_name `{n}`: {e}"))?,
            ),
            None => None,
        };
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("TLS: {e}"))?;
        let builder = match &server_name {
            // The name to check is the broker's, whatever address a client dials (a link on
            // 127.0.0.1; async-nats checks the host of the URL it was given).
            Some(name) => {
                let inner = WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider)
                    .build()
                    .map_err(|e| format!("TLS: {e}"))?;
                builder
                    .dangerous()
                    .with_custom_certificate_verifier(Arc::new(Named {
                        inner,
                        name: name.clone(),
                    }))
            }
            None => builder.with_root_certificates(roots),
        };
        let config = match (&cfg.cert_file, &cfg.key_file) {
            (None, None) => builder.with_no_client_auth(),
            (Some(cert), Some(key)) => {
                let chain = read_certs(cert, "client certificate file")?;
                let key = PrivateKeyDer::from_pem_file(key).map_err(|e| {
                    format!("client key file {}: no PEM private key: {e}", key.display())
                })?;
                builder
                    .with_client_auth_cert(chain, key)
                    .map_err(|e| format!("client certificate {}: {e}", cert.display()))?
            }
            _ => {
                return Err(
                    "a client certificate needs both `cert_file` and `key_file`".to_string()
                );
            }
        };
        Ok(ClientTls {
            config: Arc::new(config),
            server_name,
        })
    }

    /// The name checked against the destination's certificate when connecting to `addr`.
    fn name_for(&self, addr: SocketAddr) -> ServerName<'static> {
        self.server_name
            .clone()
            .unwrap_or_else(|| ServerName::IpAddress(addr.ip().into()))
    }

    /// The TLS handshake over a connected socket.
    pub async fn handshake(&self, tcp: TcpStream, addr: SocketAddr) -> std::io::Result<Stream> {
        let tls = TlsConnector::from(self.config.clone())
            .connect(self.name_for(addr), tcp)
            .await?;
        Ok(Stream::Tls(Box::new(tls)))
    }

    /// The rustls configuration, for clients that take one (async-nats).
    pub fn rustls(&self) -> Arc<ClientConfig> {
        self.config.clone()
    }
}

/// Checks the broker's certificate against one fixed name (`server_name`) rather than the
/// name the client was given: every check but the name's is webpki's own.
#[derive(Debug)]
struct Named {
    inner: Arc<WebPkiServerVerifier>,
    name: ServerName<'static>,
}

impl ServerCertVerifier for Named {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _dialled: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        self.inner
            .verify_server_cert(end_entity, intermediates, &self.name, ocsp_response, now)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

/// The TLS of a broker the user runs: their CA file, their client certificate, and the key from
/// the environment variable `key_env` (its PEM text, written to `dir` as a file only its owner
/// reads, or the path of a PEM file). Checked now: every file must parse (`Err(Given::Bad)`),
/// the variable must be set (`Err(Given::Unset)`, as for credentials).
pub fn given(
    dir: &Path,
    ca_file: &Path,
    cert_file: Option<&Path>,
    key_env: Option<&str>,
    server_name: &str,
) -> Result<TlsConfig, Given> {
    let key_file = match key_env {
        None => None,
        Some(name) => {
            let value = std::env::var(name).map_err(|_| {
                Given::Unset(format!("`client_key_env: {name}`: the variable `{name}` is not set; set it to the client's private key (PEM text, or the path of a PEM file)"))
            })?;
            if value.trim_start().starts_with("-----BEGIN") {
                let path = dir.join("client-key.pem");
                std::fs::create_dir_all(dir)
                    .and_then(|()| super::ca::secret(&path, &value))
                    .map_err(|e| Given::Bad(format!("{}: {e}", path.display())))?;
                Some(path)
            } else {
                Some(PathBuf::from(value))
            }
        }
    };
    let cfg = TlsConfig {
        ca_file: ca_file.to_path_buf(),
        cert_file: cert_file.map(Path::to_path_buf),
        key_file,
        server_name: (!server_name.is_empty()).then(|| server_name.to_string()),
    };
    ClientTls::new(&cfg).map_err(Given::Bad)?;
    Ok(cfg)
}

/// Why a user's TLS could not be used.
#[derive(Debug)]
pub enum Given {
    /// The key's variable is not set: found at start, like a credential (exit 3).
    Unset(String),
    /// A file that does not parse: bad input (exit 2).
    Bad(String),
}

/// Connects to `addr`; with `tls`, also completes the handshake.
pub async fn connect(addr: SocketAddr, tls: Option<&ClientTls>) -> std::io::Result<Stream> {
    let tcp = TcpStream::connect(addr).await?;
    let _ = tcp.set_nodelay(true);
    match tls {
        Some(tls) => tls.handshake(tcp, addr).await,
        None => Ok(Stream::Plain(tcp)),
    }
}

pub(crate) fn read_certs(path: &Path, what: &str) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| format!("{what} {}: {e}", path.display()))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("{what} {}: does not parse as PEM: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!(
            "{what} {}: holds no PEM certificate",
            path.display()
        ));
    }
    Ok(certs)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tls::DrillCa;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio_rustls::TlsAcceptor;
    use tokio_rustls::rustls::ServerConfig;

    /// A TLS echo server with `ca`'s server certificate; mutual TLS when `clients` is given.
    async fn echo(ca: &DrillCa, clients: Option<&Path>) -> SocketAddr {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap();
        let builder = match clients {
            Some(ca_file) => {
                let mut roots = RootCertStore::empty();
                for c in read_certs(ca_file, "ca").unwrap() {
                    roots.add(c).unwrap();
                }
                let verifier = rustls::server::WebPkiClientVerifier::builder(Arc::new(roots))
                    .build()
                    .unwrap();
                builder.with_client_cert_verifier(verifier)
            }
            None => builder.with_no_client_auth(),
        };
        let config = builder
            .with_single_cert(
                read_certs(&ca.files.server_cert_file, "cert").unwrap(),
                PrivateKeyDer::from_pem_file(&ca.files.server_key_file).unwrap(),
            )
            .unwrap();
        let acceptor = TlsAcceptor::from(Arc::new(config));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    if let Ok(mut s) = acceptor.accept(tcp).await {
                        let mut buf = [0u8; 5];
                        if s.read_exact(&mut buf).await.is_ok() {
                            let _ = s.write_all(&buf).await;
                            let _ = s.flush().await;
                        }
                    }
                });
            }
        });
        addr
    }

    async fn round_trip(addr: SocketAddr, tls: &ClientTls) -> std::io::Result<[u8; 5]> {
        let mut s = connect(addr, Some(tls)).await?;
        s.write_all(b"hello").await?;
        s.flush().await?;
        let mut back = [0u8; 5];
        s.read_exact(&mut back).await?;
        Ok(back)
    }

    #[tokio::test]
    async fn a_client_trusts_its_drills_ca_and_no_other() {
        let dir = tempfile::tempdir().unwrap();
        let ca = DrillCa::mint(&dir.path().join("a"), "a", &[]).unwrap();
        let other = DrillCa::mint(&dir.path().join("b"), "b", &[]).unwrap();
        let addr = echo(&ca, None).await;
        let trusting = ClientTls::new(&TlsConfig::trusting(&ca.files.ca_file)).unwrap();
        assert_eq!(&round_trip(addr, &trusting).await.unwrap(), b"hello");
        // Another drill's CA: the handshake fails, with the reason.
        let wrong = ClientTls::new(&TlsConfig::trusting(&other.files.ca_file)).unwrap();
        let e = round_trip(addr, &wrong).await.unwrap_err();
        assert!(e.to_string().contains("certificate"), "{e}");
        // A name the certificate does not carry.
        let named = ClientTls::new(&TlsConfig {
            server_name: Some("elsewhere.example".to_string()),
            ..TlsConfig::trusting(&ca.files.ca_file)
        })
        .unwrap();
        assert!(round_trip(addr, &named).await.is_err());
    }

    /// A client given `server_name` checks that name whatever it dials: async-nats checks the
    /// host of its URL (127.0.0.1, a link), which a broker's certificate need not carry.
    #[tokio::test]
    async fn server_name_is_checked_whatever_name_the_client_dials() {
        let dir = tempfile::tempdir().unwrap();
        let ca = DrillCa::mint(dir.path(), "n", &["broker.site".to_string()]).unwrap();
        let addr = echo(&ca, None).await;
        let dial = |tls: ClientTls, name: &'static str| async move {
            let tcp = TcpStream::connect(addr).await.unwrap();
            TlsConnector::from(tls.rustls())
                .connect(ServerName::try_from(name).unwrap(), tcp)
                .await
                .map(|_| ())
        };
        let named = |n: &str| {
            ClientTls::new(&TlsConfig {
                server_name: Some(n.to_string()),
                ..TlsConfig::trusting(&ca.files.ca_file)
            })
            .unwrap()
        };
        // Dialled as a name the certificate lacks, checked as one it carries: passes.
        dial(named("broker.site"), "nowhere.example").await.unwrap();
        // Checked as a name it lacks: fails, whatever was dialled.
        assert!(
            dial(named("elsewhere.example"), "broker.site")
                .await
                .is_err()
        );
        // Without server_name, the name dialled is the one checked.
        let plain = ClientTls::new(&TlsConfig::trusting(&ca.files.ca_file)).unwrap();
        assert!(dial(plain.clone(), "nowhere.example").await.is_err());
        dial(plain, "broker.site").await.unwrap();
    }

    #[tokio::test]
    async fn mutual_tls_needs_the_client_certificate() {
        let dir = tempfile::tempdir().unwrap();
        let ca = DrillCa::mint(dir.path(), "m", &[]).unwrap();
        let addr = echo(&ca, Some(&ca.files.ca_file)).await;
        let with_cert = ClientTls::new(&TlsConfig {
            cert_file: Some(ca.files.client_cert_file.clone()),
            key_file: Some(ca.files.client_key_file.clone()),
            ..TlsConfig::trusting(&ca.files.ca_file)
        })
        .unwrap();
        assert_eq!(&round_trip(addr, &with_cert).await.unwrap(), b"hello");
        let without = ClientTls::new(&TlsConfig::trusting(&ca.files.ca_file)).unwrap();
        assert!(round_trip(addr, &without).await.is_err());
    }

    #[test]
    fn files_that_are_not_certificates_say_which_and_why() {
        let dir = tempfile::tempdir().unwrap();
        let junk = dir.path().join("junk.pem");
        std::fs::write(&junk, "not a certificate\n").unwrap();
        let e = ClientTls::new(&TlsConfig::trusting(&junk)).unwrap_err();
        assert!(
            e.contains("junk.pem") && e.contains("no PEM certificate"),
            "{e}"
        );
        let e = ClientTls::new(&TlsConfig::trusting(&dir.path().join("absent.pem"))).unwrap_err();
        assert!(e.contains("absent.pem"), "{e}");
        let ca = DrillCa::mint(dir.path(), "h", &[]).unwrap();
        let e = ClientTls::new(&TlsConfig {
            cert_file: Some(ca.files.client_cert_file.clone()),
            ..TlsConfig::trusting(&ca.files.ca_file)
        })
        .unwrap_err();
        assert!(e.contains("both"), "{e}");
    }
}
